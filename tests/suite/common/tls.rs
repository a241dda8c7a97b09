//! Certificates made for the tests by [`rcgen`]: a CA with a server and a
//! client certificate ([`write_certificates`]), for any TLS server the tests
//! start (Redis, ratelimitd, an xDS server), the files of Envoy Gateway's
//! certificate secrets ([`write_envoy_gateway_certificates`]), and the
//! single self-signed certificate of envoyproxy/ratelimit's Redis TLS
//! recipe.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The PEM files of a TLS server and its clients: a CA, the server's
/// certificate and a client certificate, each signed by the CA, and their
/// keys.
#[derive(Debug, Clone)]
pub(crate) struct TlsFiles {
    pub(crate) ca_cert: PathBuf,
    pub(crate) server_cert: PathBuf,
    pub(crate) server_key: PathBuf,
    pub(crate) client_cert: PathBuf,
    pub(crate) client_key: PathBuf,
}

impl TlsFiles {
    /// envoyproxy/ratelimit's Redis TLS recipe: `dir/cert.pem` (from
    /// [`self_signed_ca_certificate`]) is the CA, the server's and the
    /// client's certificate at once, and `dir/key.pem` the key of each.
    pub(crate) fn pinned(dir: &Path) -> Self {
        let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
        Self {
            ca_cert: cert.clone(),
            server_cert: cert.clone(),
            server_key: key.clone(),
            client_cert: cert,
            client_key: key,
        }
    }
}

/// The subject alternative name of [`write_certificates`]' client
/// certificate.
pub(crate) const CLIENT_SAN: &str = "client.ratelimitd.test";

/// Makes a new CA, a server certificate for `127.0.0.1` and `localhost`,
/// and a client certificate, both signed by that CA, and writes them and
/// their keys as PEM files into `dir` (created if missing): `ca.pem`,
/// `server.pem`, `server.key`, `client.pem`, `client.key`. Each call makes
/// a CA of its own, so two calls give certificates that do not trust each
/// other. Usable for any TLS server in the tests, not only Redis.
pub(crate) fn write_certificates(dir: &Path) -> TlsFiles {
    std::fs::create_dir_all(dir).unwrap_or_else(|err| panic!("create {}: {err}", dir.display()));
    let ca_key = KeyPair::generate().expect("generate the test CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ratelimitd test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .expect("self-sign the test CA");
    let ca = Issuer::new(ca_params, ca_key);

    let leaf = |name: &str, alt_names: &[&str], purpose: ExtendedKeyUsagePurpose| {
        let key = KeyPair::generate().expect("generate a test certificate key");
        let alt_names: Vec<String> = alt_names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(alt_names).expect("certificate parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![purpose];
        let cert = params
            .signed_by(&key, &ca)
            .expect("sign a test certificate with the test CA");
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(
        "127.0.0.1",
        &["127.0.0.1", "localhost"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = leaf(
        "ratelimitd test client",
        &[CLIENT_SAN],
        ExtendedKeyUsagePurpose::ClientAuth,
    );

    let write = |name: &str, pem: &str| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap_or_else(|err| panic!("write {}: {err}", path.display()));
        path
    };
    TlsFiles {
        ca_cert: write("ca.pem", &ca_cert.pem()),
        server_cert: write("server.pem", &server_cert),
        server_key: write("server.key", &server_key),
        client_cert: write("client.pem", &client_cert),
        client_key: write("client.key", &client_key),
    }
}

/// A self-signed certificate that says CA:TRUE, for `localhost` (what
/// envoyproxy/ratelimit's `openssl req -x509 ... -subj /CN=localhost
/// -addext subjectAltName=DNS:localhost` makes): its PEM certificate and
/// key.
pub(crate) fn self_signed_ca_certificate() -> (String, String) {
    let key = KeyPair::generate().expect("generate a key");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("parameters");
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).expect("self-sign");
    (cert.pem(), key.serialize_pem())
}

/// The certificate files of an Envoy Gateway installation, as its
/// `certgen` makes them: one CA, and for each of Envoy Gateway (its xDS
/// server), Envoy and the rate limit service a certificate signed by it,
/// with no extended key usage (each serves and is presented as a client
/// alike).
#[derive(Debug, Clone)]
pub(crate) struct EnvoyGatewayCertificates {
    /// The `envoy-rate-limit` secret as mounted at `/certs`: `ca.crt`,
    /// `tls.crt`, `tls.key`.
    pub(crate) rate_limit_dir: PathBuf,
    pub(crate) ca_cert: PathBuf,
    /// Envoy Gateway's xDS server's certificate and key, for `localhost`
    /// (the name its host mode uses).
    pub(crate) envoy_gateway_cert: PathBuf,
    pub(crate) envoy_gateway_key: PathBuf,
    /// Envoy's (the `envoy` secret), which it presents to the rate limit
    /// service.
    pub(crate) envoy_cert: PathBuf,
    pub(crate) envoy_key: PathBuf,
}

/// Writes [`EnvoyGatewayCertificates`] into `dir`: the rate limit
/// service's as `dir/envoy-rate-limit/{ca.crt,tls.crt,tls.key}`, named
/// as `certgen` names it (`envoy`, `*.envoy-gateway-system`), and the
/// others beside it.
pub(crate) fn write_envoy_gateway_certificates(dir: &Path) -> EnvoyGatewayCertificates {
    let rate_limit_dir = dir.join("envoy-rate-limit");
    std::fs::create_dir_all(&rate_limit_dir)
        .unwrap_or_else(|err| panic!("create {}: {err}", rate_limit_dir.display()));
    let ca_key = KeyPair::generate().expect("generate the test CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "envoy-gateway");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .expect("self-sign the test CA");
    let ca = Issuer::new(ca_params, ca_key);
    let write = |path: PathBuf, pem: &str| {
        std::fs::write(&path, pem).unwrap_or_else(|err| panic!("write {}: {err}", path.display()));
        path
    };
    let leaf = |common_name: &str, alt_name: &str, cert: PathBuf, key_path: PathBuf| {
        let key = KeyPair::generate().expect("generate a test certificate key");
        let mut params =
            CertificateParams::new(vec![alt_name.to_owned()]).expect("certificate parameters");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::DataEncipherment,
            KeyUsagePurpose::KeyEncipherment,
            KeyUsagePurpose::ContentCommitment,
        ];
        let signed = params
            .signed_by(&key, &ca)
            .expect("sign a test certificate with the test CA");
        (
            write(cert, &signed.pem()),
            write(key_path, &key.serialize_pem()),
        )
    };
    let ca_path = write(rate_limit_dir.join("ca.crt"), &ca_cert.pem());
    leaf(
        "envoy",
        "*.envoy-gateway-system",
        rate_limit_dir.join("tls.crt"),
        rate_limit_dir.join("tls.key"),
    );
    let (envoy_gateway_cert, envoy_gateway_key) = leaf(
        "envoy-gateway",
        "localhost",
        dir.join("envoy-gateway.crt"),
        dir.join("envoy-gateway.key"),
    );
    let (envoy_cert, envoy_key) = leaf(
        "envoy",
        "*.envoy-gateway-system",
        dir.join("envoy.crt"),
        dir.join("envoy.key"),
    );
    EnvoyGatewayCertificates {
        rate_limit_dir,
        ca_cert: ca_path,
        envoy_gateway_cert,
        envoy_gateway_key,
        envoy_cert,
        envoy_key,
    }
}

//! TLS to a standalone Redis whose server certificate is itself one the
//! client trusts: a certificate in `--redis-tls-ca`, or, without it, in the
//! system's trust store (as rustls-native-certs loads it: `SSL_CERT_FILE`
//! and `SSL_CERT_DIR` when set, else the platform's). That is what
//! envoyproxy/ratelimit's own recipe makes (one self-signed `openssl req
//! -x509` certificate, which says CA:TRUE, used as the server's
//! certificate and given as the CA file, or added to the system's store
//! as its CI does). Go accepts a server certificate that is in its trust
//! pool whatever its CA flag; webpki refuses a CA certificate used as an
//! end entity (`CaUsedAsEndEntity`). Here the standard webpki verification
//! runs first and decides every ordinary chain; only when it fails with
//! exactly `CaUsedAsEndEntity`, for a server that presents no intermediate
//! and a certificate byte-for-byte equal to one in the trust store in
//! force, is that certificate accepted, after its name is checked against
//! the URL's host. (webpki checks the validity period before the CA flag,
//! so a trusted certificate that is expired or not yet valid fails with
//! that error instead and is refused.) redis-rs takes no verifier of ours,
//! so these connections are opened here and handed to redis-rs as a
//! stream.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisError};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::tls::verifier::{check_name, webpki_signature_checks};

/// The certificates a connection trusts.
#[derive(Debug, Clone, Copy)]
pub(super) enum Trust<'a> {
    /// `--redis-tls-ca`'s, as PEM.
    Given(&'a [u8]),
    /// The system's.
    System,
}

impl Trust<'_> {
    /// The trust store, and the certificates in it that a server may
    /// present as its own.
    fn load(self) -> Result<(RootCertStore, Vec<CertificateDer<'static>>), RedisError> {
        let mut roots = RootCertStore::empty();
        match self {
            Self::Given(ca) => {
                let given = CertificateDer::pem_slice_iter(ca)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|err| invalid(format!("--redis-tls-ca: {err}")))?;
                for certificate in &given {
                    roots
                        .add(certificate.clone())
                        .map_err(|err| invalid(format!("--redis-tls-ca: {err}")))?;
                }
                Ok((roots, given))
            }
            Self::System => {
                const STORE: &str = "the system's trusted certificates (SSL_CERT_FILE, \
                                     SSL_CERT_DIR, or the platform's store)";
                let loaded = rustls_native_certs::load_native_certs();
                if let Some(err) = loaded.errors.first() {
                    return Err(invalid(format!("{STORE}: {err}")));
                }
                let (added, _unreadable) = roots.add_parsable_certificates(loaded.certs.clone());
                if added == 0 {
                    return Err(invalid(format!("{STORE}: none found; give --redis-tls-ca")));
                }
                Ok((roots, loaded.certs))
            }
        }
    }
}

/// A client configuration error about TLS, saying `what`.
fn invalid(what: String) -> RedisError {
    RedisError::from((redis::ErrorKind::InvalidClientConfig, "TLS", what))
}

/// Opens TLS connections to one Redis with the pinning verifier.
pub(super) struct PinnedTls {
    connector: TlsConnector,
    host: String,
    port: u16,
    info: ConnectionInfo,
    config: AsyncConnectionConfig,
    connect_timeout: Duration,
}

impl PinnedTls {
    /// For a `rediss://` `info` trusting `trust`, and maybe a client
    /// certificate and key (PEM); `None` when `info` is not TLS.
    pub(super) fn new(
        info: ConnectionInfo,
        trust: Trust<'_>,
        client: Option<(&[u8], &[u8])>,
        config: AsyncConnectionConfig,
        connect_timeout: Duration,
    ) -> Result<Option<Self>, RedisError> {
        // `#insecure` URLs keep redis-rs's own (unverified) TLS.
        let ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            ..
        } = info.addr().clone()
        else {
            return Ok(None);
        };
        let (roots, pinned) = trust.load()?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|err| invalid(format!("the trusted certificates: {err}")))?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|err| invalid(err.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinningVerifier { webpki, pinned }));
        let tls = match client {
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|err| invalid(format!("--redis-tls-cert: {err}")))?;
                let key = PrivateKeyDer::from_pem_slice(key)
                    .map_err(|err| invalid(format!("--redis-tls-key: {err}")))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|err| invalid(format!("--redis-tls-cert: {err}")))?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Some(Self {
            connector: TlsConnector::from(Arc::new(tls)),
            host,
            port,
            info,
            config,
            connect_timeout,
        }))
    }

    /// A new connection, logged in and on its database.
    pub(super) async fn connect(&self) -> Result<MultiplexedConnection, RedisError> {
        let connect = async {
            let name = ServerName::try_from(self.host.clone()).map_err(|err| {
                RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "TLS",
                    err.to_string(),
                ))
            })?;
            let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
            tcp.set_nodelay(true)?;
            let stream = self.connector.connect(name, tcp).await?;
            let (connection, driver) = MultiplexedConnection::new_with_config(
                self.info.redis_settings(),
                stream,
                self.config.clone(),
            )
            .await?;
            tokio::spawn(driver);
            Ok(connection)
        };
        tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))?
    }
}

/// webpki's verification, then the exception for a trusted certificate
/// presented as the server's own (see the module).
#[derive(Debug)]
struct PinningVerifier {
    webpki: Arc<WebPkiServerVerifier>,
    pinned: Vec<CertificateDer<'static>>,
}

impl ServerCertVerifier for PinningVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let err = match self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => return Ok(verified),
            Err(err) => err,
        };
        let ca_as_end_entity = matches!(
            &err,
            rustls::Error::InvalidCertificate(CertificateError::Other(other))
                if matches!(other.0.downcast_ref::<webpki::Error>(), Some(webpki::Error::CaUsedAsEndEntity))
        );
        let pinned = intermediates.is_empty()
            && self
                .pinned
                .iter()
                .any(|certificate| certificate.as_ref() == end_entity.as_ref());
        if !(ca_as_end_entity && pinned) {
            return Err(err);
        }
        check_name(end_entity, server_name)?;
        Ok(ServerCertVerified::assertion())
    }

    webpki_signature_checks!(webpki);
}

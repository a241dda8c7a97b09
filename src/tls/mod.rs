//! TLS for gRPC clients, terminated by our own accept loop: the server
//! certificate and key are read again whenever their files change (checked
//! every `--tls-reload-interval`; a pair that does not load keeps the one
//! in use, logged), and with `--tls-client-ca` clients must present a
//! certificate that CA signed, naming `--tls-client-san` when that is set
//! (envoyproxy/ratelimit's GRPC_CLIENT_TLS_SAN).

mod options;

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};
use tokio_rustls::TlsAcceptor;
use tracing::{error, info};

pub use self::options::TlsOptions;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("TLS: cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A file holds no usable certificate or key.
    #[error("TLS: {path}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Where the server's TLS material is, and what clients must show.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
    /// PEM CA whose client certificates are required (unset: no client certificates).
    pub client_ca: Option<PathBuf>,
    /// A name the client certificate must carry.
    pub client_san: Option<String>,
    /// How often the files are checked for changes.
    pub reload_interval: Duration,
}

/// The server's TLS: an acceptor whose certificate follows its files.
pub struct ServerTls {
    acceptor: TlsAcceptor,
    certificate: Arc<ReloadingCertificate>,
    /// The bytes the certificate in use was made from.
    loaded: Files,
    settings: TlsSettings,
}

impl ServerTls {
    /// Reads and checks every file; an error names the file.
    pub fn load(settings: TlsSettings) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (files, key) = read_pair(&settings.cert, &settings.key, &provider)?;
        let certificate = Arc::new(ReloadingCertificate {
            current: RwLock::new(Arc::new(key)),
        });
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|err| invalid(&settings.cert, err))?;
        let builder = match &settings.client_ca {
            Some(ca_path) => {
                let ca = read(ca_path)?;
                let mut roots = RootCertStore::empty();
                for certificate in CertificateDer::pem_slice_iter(&ca) {
                    let certificate = certificate.map_err(|err| invalid(ca_path, err))?;
                    roots
                        .add(certificate)
                        .map_err(|err| invalid(ca_path, err))?;
                }
                let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .map_err(|err| invalid(ca_path, err))?;
                let san = settings
                    .client_san
                    .as_ref()
                    .map(|san| {
                        ServerName::try_from(san.clone())
                            .map_err(|err| invalid(Path::new("--tls-client-san"), err))
                    })
                    .transpose()?;
                builder.with_client_cert_verifier(Arc::new(SanVerifier { webpki, san }))
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder.with_cert_resolver(certificate.clone());
        // gRPC is HTTP/2 only.
        config.alpn_protocols = vec![b"h2".to_vec()];
        info!(
            mutual = settings.client_ca.is_some(),
            client_san = settings.client_san.as_deref(),
            "serving gRPC over TLS"
        );
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            certificate,
            loaded: files,
            settings,
        })
    }

    /// The acceptor for new connections, with the certificate in use now.
    pub fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }

    /// Looks at the certificate files every reload interval, for ever, and
    /// swaps in a changed pair that loads. Runs as a task.
    pub fn watch(&self) -> impl Future<Output = ()> + Send + 'static {
        let certificate = self.certificate.clone();
        let settings = self.settings.clone();
        let mut in_use = self.loaded.clone();
        async move {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut tick = tokio::time::interval(settings.reload_interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            let mut failed: Option<Files> = None;
            loop {
                tick.tick().await;
                let Ok(files) = Files::read(&settings.cert, &settings.key) else {
                    // Mid-replacement, or gone: the pair in use stays.
                    continue;
                };
                if files == in_use || failed.as_ref() == Some(&files) {
                    continue;
                }
                match certified_key(&files, &settings.cert, &settings.key, &provider) {
                    Ok(key) => {
                        certificate.replace(key);
                        in_use = files;
                        failed = None;
                        info!(cert = %settings.cert.display(), "reloaded the gRPC server certificate");
                    }
                    Err(err) => {
                        error!(%err, "the new gRPC server certificate does not load; the one in use stays");
                        failed = Some(files);
                    }
                }
            }
        }
    }
}

/// The bytes of a certificate file and its key file.
#[derive(Clone, PartialEq, Eq)]
struct Files {
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl Files {
    fn read(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        Ok(Self {
            cert: read(cert)?,
            key: read(key)?,
        })
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn invalid(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::Invalid {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn read_pair(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<(Files, CertifiedKey), TlsError> {
    let files = Files::read(cert, key)?;
    let certified = certified_key(&files, cert, key, provider)?;
    Ok((files, certified))
}

/// The chain and key in `files` (read from `cert_path` and `key_path`),
/// checked to belong together.
fn certified_key(
    files: &Files,
    cert_path: &Path,
    key_path: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsError> {
    let chain = CertificateDer::pem_slice_iter(&files.cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| invalid(cert_path, err))?;
    if chain.is_empty() {
        return Err(invalid(cert_path, "no certificate in it"));
    }
    let key = PrivateKeyDer::from_pem_slice(&files.key).map_err(|err| invalid(key_path, err))?;
    CertifiedKey::from_der(chain, key, provider).map_err(|err| invalid(key_path, err))
}

/// The certificate in use, replaced whole on reload.
#[derive(Debug)]
struct ReloadingCertificate {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ReloadingCertificate {
    fn replace(&self, key: CertifiedKey) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(key);
    }
}

impl std::fmt::Debug for Files {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key bytes never go to a log.
        f.write_str("Files")
    }
}

impl ResolvesServerCert for ReloadingCertificate {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

/// webpki's client verification, then the required name, if any.
#[derive(Debug)]
struct SanVerifier {
    webpki: Arc<dyn ClientCertVerifier>,
    san: Option<ServerName<'static>>,
}

impl ClientCertVerifier for SanVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .webpki
            .verify_client_cert(end_entity, intermediates, now)?;
        if let Some(san) = &self.san {
            let certificate = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
                rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
            })?;
            certificate
                .verify_is_valid_for_subject_name(san)
                .map_err(|_| {
                    rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName)
                })?;
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.webpki.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.webpki.supported_verify_schemes()
    }
}

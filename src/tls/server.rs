//! The gRPC listener's TLS: an acceptor whose certificate follows its
//! files, and the task that looks at them.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;
use tracing::{error, info};

use super::certificate::{
    Files, ReloadingCertificate, TlsError, certified_key, invalid, read_pair,
};
use super::client_auth::client_verifier;

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
pub(crate) struct ServerTls {
    acceptor: TlsAcceptor,
    certificate: Arc<ReloadingCertificate>,
    /// The bytes the certificate in use was made from.
    loaded: Files,
    settings: TlsSettings,
}

impl ServerTls {
    /// Reads and checks every file; an error names the file.
    pub(crate) fn load(settings: TlsSettings) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (files, key) = read_pair(&settings.cert, &settings.key, &provider)?;
        let certificate = Arc::new(ReloadingCertificate::new(key));
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|err| invalid(&settings.cert, err))?;
        let builder = match &settings.client_ca {
            Some(ca_path) => builder.with_client_cert_verifier(client_verifier(
                ca_path,
                settings.client_san.as_deref(),
                provider,
            )?),
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
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }

    /// Looks at the certificate files every reload interval, for ever, and
    /// swaps in a changed pair that loads. Runs as a task.
    pub(crate) fn watch(&self) -> impl Future<Output = ()> + Send + 'static {
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

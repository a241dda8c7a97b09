//! The gRPC listener's TLS options (`--tls-*`): a certificate and key,
//! reloaded when they change, and with a client CA, mutual TLS.

use std::path::PathBuf;
use std::time::Duration;

use super::server::TlsSettings;
use crate::options::positive_duration;

/// TLS for clients of the gRPC listener.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Listener and TLS")]
pub struct TlsOptions {
    /// PEM certificate chain for serving gRPC over TLS (with --tls-key).
    #[arg(long, env = "RATELIMITD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key for --tls-cert.
    #[arg(long, env = "RATELIMITD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA certificates: clients must present a certificate signed by one
    /// (mutual TLS). Needs --tls-cert.
    #[arg(long, env = "RATELIMITD_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,

    /// With --tls-client-ca: a name (DNS or IP) the client's certificate
    /// must carry among its subject alternative names.
    #[arg(long, env = "RATELIMITD_TLS_CLIENT_SAN", requires = "tls_client_ca")]
    pub tls_client_san: Option<String>,

    /// How often to look whether --tls-cert or --tls-key changed on disk;
    /// a changed pair that loads serves new connections.
    #[arg(long, env = "RATELIMITD_TLS_RELOAD_INTERVAL", default_value = "1s",
          value_parser = positive_duration)]
    pub tls_reload_interval: Duration,
}

impl TlsOptions {
    /// The TLS these options name, if any (clap has made sure a key goes
    /// with the certificate; the files are read by `ServerTls::load`,
    /// which reads them again when they change).
    pub fn settings(&self) -> Option<TlsSettings> {
        let (Some(cert), Some(key)) = (&self.tls_cert, &self.tls_key) else {
            return None;
        };
        Some(TlsSettings {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: self.tls_client_ca.clone(),
            client_san: self.tls_client_san.clone(),
            reload_interval: self.tls_reload_interval,
        })
    }
}

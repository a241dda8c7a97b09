//! TLS to a standalone Redis whose server certificate is itself listed in
//! `--redis-tls-ca`: a pinned certificate, as envoyproxy/ratelimit's own
//! test recipe makes (one self-signed `openssl req -x509` certificate,
//! which says CA:TRUE, used as both the CA file and the server's
//! certificate). Go accepts a server certificate that is in its trust pool
//! whatever its CA flag; webpki refuses a CA certificate used as an end
//! entity (`CaUsedAsEndEntity`). Here the standard webpki verification
//! runs first and decides every ordinary chain; only when it fails with
//! exactly `CaUsedAsEndEntity`, for a server that presents no intermediate
//! and a certificate byte-for-byte equal to one in the CA file, is that
//! certificate accepted, after its name is checked against the URL's host.
//! (webpki checks the validity period before the CA flag, so a pinned
//! certificate that is expired or not yet valid fails with that error
//! instead and is refused.) redis-rs takes no verifier of ours, so these
//! connections are opened here and handed to redis-rs as a stream.

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
    /// For a `rediss://` `info` with CA certificates `ca` (PEM) and maybe a
    /// client certificate and key (PEM); `None` when `info` is not TLS.
    pub(super) fn new(
        info: ConnectionInfo,
        ca: &[u8],
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
        let invalid =
            |what: String| RedisError::from((redis::ErrorKind::InvalidClientConfig, "TLS", what));
        let pinned = CertificateDer::pem_slice_iter(ca)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| invalid(format!("--redis-tls-ca: {err}")))?;
        let mut roots = RootCertStore::empty();
        for certificate in &pinned {
            roots
                .add(certificate.clone())
                .map_err(|err| invalid(format!("--redis-tls-ca: {err}")))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|err| invalid(format!("--redis-tls-ca: {err}")))?;
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

/// webpki's verification, then the pinned exception (see the module).
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

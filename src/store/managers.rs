//! deadpool managers for Redis Cluster and Sentinel connections that carry
//! ratelimitd's TLS settings. deadpool-redis's own managers build their
//! clients from URLs alone, which drops a private CA and a client
//! certificate (the cluster client takes them only from its builder's
//! `certs`, the sentinel client only from its builder), so TLS to a Cluster
//! or a Sentinel group needs these.

use redis::aio::MultiplexedConnection;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, RedisError, TlsCertificates, TlsMode};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleResult};

/// Checks a pooled connection before reuse.
async fn ping(connection: &mut impl redis::aio::ConnectionLike) -> RecycleResult<RedisError> {
    redis::cmd("PING").query_async::<String>(connection).await?;
    Ok(())
}

/// Connections to a Redis Cluster.
pub struct ClusterManager {
    client: ClusterClient,
}

impl ClusterManager {
    pub fn new(
        nodes: Vec<ConnectionInfo>,
        certificates: Option<TlsCertificates>,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, RedisError> {
        let mut builder = ClusterClientBuilder::new(nodes)
            .connection_timeout(connect_timeout)
            .response_timeout(response_timeout);
        if let Some(certificates) = certificates {
            builder = builder.certs(certificates);
        }
        Ok(Self {
            client: builder.build()?,
        })
    }
}

impl managed::Manager for ClusterManager {
    type Type = ClusterConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<ClusterConnection, RedisError> {
        self.client.get_async_connection().await
    }

    async fn recycle(
        &self,
        connection: &mut ClusterConnection,
        _: &Metrics,
    ) -> RecycleResult<RedisError> {
        ping(connection).await
    }
}

/// Connections to the primary a group of Sentinels names; each new
/// connection asks the sentinels again, so a failover is followed.
pub struct SentinelManager {
    // `SentinelClient::get_async_connection` needs `&mut`.
    client: tokio::sync::Mutex<SentinelClient>,
}

impl SentinelManager {
    /// `sentinels` carry the credentials and TLS mode used both for the
    /// sentinels and for the primary (the first sentinel's).
    pub fn new(
        sentinels: Vec<ConnectionInfo>,
        master: &str,
        certificates: Option<TlsCertificates>,
    ) -> Result<Self, RedisError> {
        let first = sentinels.first().cloned().ok_or_else(|| {
            RedisError::from((redis::ErrorKind::InvalidClientConfig, "no sentinel URL"))
        })?;
        let tls_mode = match first.addr() {
            ConnectionAddr::TcpTls { insecure: true, .. } => Some(TlsMode::Insecure),
            ConnectionAddr::TcpTls { .. } => Some(TlsMode::Secure),
            _ => None,
        };
        let addresses = sentinels.iter().map(|info| info.addr().clone());
        let settings = first.redis_settings();
        let mut builder =
            SentinelClientBuilder::new(addresses, master, SentinelServerType::Master)?
                .set_client_to_redis_db(settings.db());
        if let Some(username) = settings.username() {
            builder = builder
                .set_client_to_sentinel_username(username)
                .set_client_to_redis_username(username);
        }
        if let Some(password) = settings.password() {
            builder = builder
                .set_client_to_sentinel_password(password)
                .set_client_to_redis_password(password);
        }
        if let Some(tls_mode) = tls_mode {
            builder = builder
                .set_client_to_sentinel_tls_mode(tls_mode)
                .set_client_to_redis_tls_mode(tls_mode);
        }
        if let Some(certificates) = certificates {
            builder = builder
                .set_client_to_sentinel_certificates(certificates.clone())
                .set_client_to_redis_certificates(certificates);
        }
        Ok(Self {
            client: tokio::sync::Mutex::new(builder.build()?),
        })
    }
}

impl managed::Manager for SentinelManager {
    type Type = MultiplexedConnection;
    type Error = RedisError;

    async fn create(&self) -> Result<MultiplexedConnection, RedisError> {
        self.client.lock().await.get_async_connection().await
    }

    async fn recycle(
        &self,
        connection: &mut MultiplexedConnection,
        _: &Metrics,
    ) -> RecycleResult<RedisError> {
        ping(connection).await
    }
}

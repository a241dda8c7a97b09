//! The deadpool manager behind the Redis store, how it opens a connection
//! for each topology, and the pooled connection it makes: a multiplexed
//! connection that calls share.
//!
//! Sharing: a call takes a connection from the pool, clones its handle and
//! gives it back at once, so concurrent calls pipeline on a few connections
//! (one write and one read carry many commands, on both sides) instead of
//! each holding a connection of its own for a round trip. A call that fails
//! marks the connection broken, and the pool replaces it at its next
//! checkout. A connection is PINGed before reuse only after it has sat idle
//! (a Redis restarted while nothing was asked); one in steady use never is,
//! which saves deadpool-redis's PING (and UNWATCH) per checkout: two of
//! every three commands Redis ran per decision.
//!
//! deadpool-redis's own managers build Cluster and Sentinel clients from
//! URLs alone, which drops a private CA and a client certificate (the
//! cluster client takes them only from its builder's `certs`, the sentinel
//! client only from its builder), so those two are built here too. What
//! differs between the topologies is only how a connection is opened
//! ([`Open`]); one manager ([`Connections`]) pools them all alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool::managed::{self, Metrics, RecycleError, RecycleResult};
use redis::aio::MultiplexedConnection;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, ConnectionInfo, RedisError, TlsCertificates, TlsMode};

use super::pinned_tls::PinnedTls;
use super::redis_settings::Credentials;
use crate::stats::{self, PoolStats};

/// Idle longer than this, a pooled connection is PINGed before reuse.
const IDLE_BEFORE_PING: Duration = Duration::from_secs(1);

/// A pooled connection that calls share through clones of its handle.
pub(super) struct Shared<C> {
    connection: C,
    broken: Arc<AtomicBool>,
    /// upstream's pool statistics, told when it closes.
    stats: PoolStats,
}

impl<C> Drop for Shared<C> {
    fn drop(&mut self) {
        self.stats.closed();
    }
}

/// Marks the connection a handle came from as broken.
pub(super) struct Breakage(Arc<AtomicBool>);

impl Breakage {
    pub(super) fn mark(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl<C: Clone + redis::aio::ConnectionLike + Send> Shared<C> {
    fn new(connection: C) -> Self {
        let stats = stats::pool();
        stats.opened();
        Self {
            connection,
            broken: Arc::new(AtomicBool::new(false)),
            stats,
        }
    }

    /// A handle onto the connection, and the means to report it broken.
    pub(super) fn handle(&self) -> (C, Breakage) {
        (self.connection.clone(), Breakage(Arc::clone(&self.broken)))
    }

    /// The check before reuse: not broken, and answering if it sat idle.
    async fn recycle(&mut self, metrics: &Metrics) -> RecycleResult<RedisError> {
        if self.broken.load(Ordering::Relaxed) {
            return Err(RecycleError::message("a call on it failed"));
        }
        if metrics.last_used() > IDLE_BEFORE_PING {
            // Boxed as `create` is: rare, and kept out of every checkout.
            Box::pin(redis::cmd("PING").query_async::<String>(&mut self.connection)).await?;
        }
        Ok(())
    }
}

/// How one topology opens a new connection.
pub(super) trait Open: Send + Sync {
    /// The connection, which calls share through clones of its handle.
    type Connection: Clone + redis::aio::ConnectionLike + Send;

    /// A new connection, logged in and on its database.
    fn open(&self) -> impl Future<Output = Result<Self::Connection, RedisError>> + Send;
}

/// deadpool's manager of the connections `O` opens.
pub(super) struct Connections<O>(pub(super) O);

impl<O: Open> managed::Manager for Connections<O> {
    type Type = Shared<O::Connection>;
    type Error = RedisError;

    async fn create(&self) -> Result<Self::Type, RedisError> {
        // Boxed: deadpool's checkout future holds this one, and every
        // decision's future holds a checkout, so an unboxed connect
        // (kilobytes, the Sentinel one over 20) would be copied with each
        // decision although it runs only now and then.
        Box::pin(self.0.open()).await.map(Shared::new)
    }

    async fn recycle(
        &self,
        shared: &mut Self::Type,
        metrics: &Metrics,
    ) -> RecycleResult<RedisError> {
        shared.recycle(metrics).await
    }
}

/// Connections to one Redis server: deadpool-redis's manager opens them,
/// or, over TLS (verified), [`PinnedTls`] does.
pub(super) enum Standalone {
    Plain(deadpool_redis::Manager),
    Pinned(PinnedTls),
}

impl Standalone {
    pub(super) fn new(
        info: ConnectionInfo,
        config: redis::AsyncConnectionConfig,
        pinned: Option<PinnedTls>,
    ) -> Result<Self, RedisError> {
        Ok(match pinned {
            Some(pinned) => Self::Pinned(pinned),
            None => Self::Plain(deadpool_redis::Manager::new_with_config(info, config)?),
        })
    }
}

impl Open for Standalone {
    type Connection = MultiplexedConnection;

    async fn open(&self) -> Result<MultiplexedConnection, RedisError> {
        match self {
            Self::Plain(connections) => managed::Manager::create(connections).await,
            Self::Pinned(pinned) => pinned.connect().await,
        }
    }
}

/// Connections to a Redis Cluster.
pub(super) struct Cluster {
    client: ClusterClient,
}

impl Cluster {
    pub(super) fn new(
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

impl Open for Cluster {
    type Connection = ClusterConnection;

    async fn open(&self) -> Result<ClusterConnection, RedisError> {
        self.client.get_async_connection().await
    }
}

/// Connections to the primary a group of Sentinels names; each new
/// connection asks the sentinels again, so a failover is followed.
pub(super) struct SentinelPrimary {
    // `SentinelClient::get_async_connection` needs `&mut`.
    client: tokio::sync::Mutex<SentinelClient>,
}

impl SentinelPrimary {
    /// `sentinels` carry the TLS mode used both for the sentinels and for
    /// the primary, and the credentials and database of the primary and
    /// its replicas (the first sentinel's). The sentinels themselves are
    /// given `sentinel_credentials`, or none: as envoyproxy/ratelimit does
    /// (REDIS_AUTH for the data nodes, REDIS_SENTINEL_AUTH for the
    /// sentinels), so a primary's password never goes to sentinels that
    /// have none, which would refuse it.
    pub(super) fn new(
        sentinels: Vec<ConnectionInfo>,
        master: &str,
        sentinel_credentials: Option<&Credentials>,
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
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = settings.password() {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(own) = sentinel_credentials {
            if let Some(username) = &own.user {
                builder = builder.set_client_to_sentinel_username(username);
            }
            if let Some(password) = &own.password {
                builder = builder.set_client_to_sentinel_password(password);
            }
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

impl Open for SentinelPrimary {
    type Connection = MultiplexedConnection;

    async fn open(&self) -> Result<MultiplexedConnection, RedisError> {
        self.client.lock().await.get_async_connection().await
    }
}

//! The Redis store: runs one algorithm's Lua script per decision through a
//! deadpool pool of multiplexed connections, bounded by a command timeout,
//! and classifies what goes wrong where it enters.
//!
//! Scripts are called by SHA (`EVALSHA`); redis-rs answers a `NOSCRIPT` (after
//! a Redis restart or `SCRIPT FLUSH`) by loading the script and calling it
//! again, so that recovery needs nothing here.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::{Manager, Pool, PoolError, Runtime};
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, RedisError, RetryMethod, ScriptInvocation,
    TlsCertificates,
};

use super::breaker::CircuitBreaker;
use crate::error::StoreError;

/// How to reach Redis and how long to wait for it.
#[derive(Debug, Clone)]
pub struct RedisSettings {
    pub url: String,
    pub pool_size: usize,
    pub connect_timeout: Duration,
    /// The longest one decision may take, from asking the pool for a
    /// connection to reading the script's reply.
    pub command_timeout: Duration,
    /// Failures in a row that open the circuit breaker.
    pub breaker_threshold: u32,
    /// For `rediss://`: certificates other than the system's.
    pub tls: RedisTls,
}

/// TLS material for a `rediss://` Redis, as PEM bytes.
#[derive(Clone, Default)]
pub struct RedisTls {
    /// CA certificates to trust instead of the system's.
    pub ca: Option<Vec<u8>>,
    /// A client certificate and its key, for Redis's `tls-auth-clients`.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Key material stays out of logs.
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

/// A pool of connections to one Redis server, behind a circuit breaker.
#[derive(Clone)]
pub struct RedisStore {
    pool: Pool,
    command_timeout: Duration,
    breaker: Arc<CircuitBreaker>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("pool", &self.pool.status())
            .field("command_timeout", &self.command_timeout)
            .finish()
    }
}

impl RedisStore {
    /// Builds the pool; connections open lazily, so this succeeds while Redis
    /// is down (health reports it until it is up).
    pub fn new(settings: &RedisSettings) -> Result<Self, StoreError> {
        let connection = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.command_timeout));
        let misconfigured = |err: RedisError| StoreError::Config(err.to_string());
        let manager = if settings.tls.ca.is_some() || settings.tls.client.is_some() {
            let certificates = TlsCertificates {
                client_tls: settings
                    .tls
                    .client
                    .clone()
                    .map(|(client_cert, client_key)| ClientTlsConfig {
                        client_cert,
                        client_key,
                    }),
                root_cert: settings.tls.ca.clone(),
            };
            let client = redis::Client::build_with_tls(settings.url.as_str(), certificates)
                .map_err(misconfigured)?;
            Manager::new_with_config(client.get_connection_info().clone(), connection)
        } else {
            Manager::new_with_config(settings.url.as_str(), connection)
        }
        .map_err(misconfigured)?;
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size)
            .wait_timeout(Some(settings.command_timeout))
            .create_timeout(Some(settings.connect_timeout))
            .recycle_timeout(Some(settings.command_timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|err| StoreError::Config(err.to_string()))?;
        Ok(Self {
            pool,
            command_timeout: settings.command_timeout,
            breaker: Arc::new(CircuitBreaker::new(settings.breaker_threshold)),
        })
    }

    /// Runs a prepared script call (by SHA, loading the script on
    /// `NOSCRIPT`) and reads its reply: a list of integers. Fails at once
    /// while the circuit breaker is open.
    pub async fn run_script(
        &self,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<Vec<i64>, StoreError> {
        if !self.breaker.allows() {
            return Err(StoreError::CircuitOpen);
        }
        self.bounded(async {
            let mut connection = self.pool.get().await.map_err(classify_pool)?;
            invocation
                .invoke_async(&mut connection)
                .await
                .map_err(classify)
        })
        .await
    }

    /// Asks Redis for `PING`, whatever the breaker says: the health check's
    /// probe, whose answer also closes (or opens) the breaker.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.bounded(async {
            let mut connection = self.pool.get().await.map_err(classify_pool)?;
            // Through `query_async`, so that an error reply (NOAUTH,
            // LOADING...) is an error, not a value.
            redis::cmd("PING")
                .query_async::<String>(&mut connection)
                .await
                .map_err(classify)?;
            Ok(())
        })
        .await
    }

    /// Runs `work` within the command timeout and tells the breaker how it
    /// went. A connection whose call is cut off is dropped with it; the pool
    /// checks connections before reuse.
    async fn bounded<T>(
        &self,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = tokio::time::timeout(self.command_timeout, work)
            .await
            .map_err(|_| StoreError::Timeout(self.command_timeout))
            .and_then(|result| result);
        match &result {
            Err(err) if err.is_transient() => self.breaker.record_failure(),
            _ => self.breaker.record_success(),
        }
        result
    }
}

/// Redis errors that a later call may not meet (connection lost, loading,
/// failover) are `Unavailable`; the rest mean a bug or a misconfiguration.
fn classify(err: RedisError) -> StoreError {
    if err.is_timeout() {
        return StoreError::Unavailable(format!("redis timed out: {err}"));
    }
    match err.retry_method() {
        RetryMethod::NoRetry => StoreError::Reply(err.to_string()),
        _ => StoreError::Unavailable(err.to_string()),
    }
}

fn classify_pool(err: PoolError) -> StoreError {
    match err {
        PoolError::Backend(err) => classify(err),
        PoolError::Timeout(kind) => {
            StoreError::Unavailable(format!("redis pool timed out ({kind:?})"))
        }
        other => StoreError::Unavailable(other.to_string()),
    }
}

//! The Redis store: runs one decision's Lua script through a deadpool pool
//! of shared, multiplexed connections (see `managers`) to a standalone
//! Redis, a Redis Cluster, or the primary a set of Sentinels names, bounded
//! by a command timeout, and classifies what goes wrong where it enters.
//! A circuit breaker stands in front: one for the whole Redis, or on a
//! Cluster one per primary (`nodes`), so that a failed node's keys stop
//! waiting while every other node's are still decided.
//!
//! Scripts are called by SHA (`EVALSHA`); redis-rs answers a `NOSCRIPT` (after
//! a Redis restart or `SCRIPT FLUSH`) by loading the script and calling it
//! again, so that recovery needs nothing here.

use std::sync::Arc;
use std::time::Duration;

use deadpool::managed::Pool;
use deadpool_redis::Runtime;
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, ConnectionInfo, FromRedisValue, IntoConnectionInfo,
    RedisError, ScriptInvocation, TlsCertificates, Value,
};
use tokio::sync::OwnedSemaphorePermit;
use tracing::{debug, warn};

use super::batch::{self, Batchable, Outcome, Pending, ScriptReply};
use super::breaker::CircuitBreaker;
use super::managers::{Cluster, Connections, Open, SentinelPrimary, Standalone};
use super::nodes::{ClusterNodes, Node, Nodes};
use super::pinned_tls::{PinnedTls, Trust};
use super::redis_errors::{classify, classify_pool, refused_unrun, script_failed};
use super::redis_settings::{RedisSettings, Topology};
use crate::error::StoreError;
use crate::metrics;
use crate::worker::PerThread;

/// Runs `$call` (a future using `$connection`, a shared handle from
/// whichever pool `$pools` holds; the pool has its connection back before
/// the call starts) and returns its `Result<_, RedisError>`. A connection
/// whose call failed is marked broken and replaced rather than reused
/// (after a failover the old primary may still answer PING, as a replica
/// that refuses every write). Pool errors return early, classified.
macro_rules! on_shared_connection {
    ($pools:expr, |$connection:ident| $call:expr) => {
        match $pools.get() {
            Pools::Standalone(pool) => on_shared_connection!(@on pool, $connection, $call),
            Pools::Cluster(pool) => on_shared_connection!(@on pool, $connection, $call),
            Pools::Sentinel(pool) => on_shared_connection!(@on pool, $connection, $call),
        }
    };
    (@on $pool:ident, $connection:ident, $call:expr) => {{
        let (mut $connection, breakage) = $pool.get().await.map_err(classify_pool)?.handle();
        let reply = $call.await;
        if reply.is_err() {
            breakage.mark();
        }
        reply
    }};
}

/// The label of the main Redis (see [`RedisStore::labelled`]).
pub const MAIN: &str = "main";

/// The label of the per-second Redis.
pub const PER_SECOND: &str = "per_second";

/// The pool for each topology.
#[derive(Clone)]
enum Pools {
    Standalone(Pool<Connections<Standalone>>),
    Cluster(Pool<Connections<Cluster>>),
    Sentinel(Pool<Connections<SentinelPrimary>>),
}

impl Pools {
    /// One pool for `settings`: connections open lazily, so this succeeds
    /// while Redis is down.
    fn new(settings: &RedisSettings) -> Result<Self, StoreError> {
        let misconfigured = |err: RedisError| StoreError::config(err);
        let urls = connection_infos(settings).map_err(misconfigured)?;
        let Some(first) = urls.first().cloned() else {
            return Err(StoreError::config("no Redis URL"));
        };
        // The connections' own reply timeout is a backstop, twice the
        // command timeout: the store's timeout (`bounded`, which covers the
        // whole call) is the one that answers, with its own message. Equal,
        // the two would race now that a checkout takes no time.
        let reply_backstop = settings.command_timeout.saturating_mul(2);
        Ok(match &settings.topology {
            Topology::Standalone => {
                let connection = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(settings.connect_timeout))
                    .set_response_timeout(Some(reply_backstop));
                // TLS is opened here so that a server certificate that is
                // itself trusted is accepted (pinned_tls.rs).
                let trust = match &settings.tls.ca {
                    Some(ca) => Trust::Given(ca),
                    None => Trust::System,
                };
                let client = settings
                    .tls
                    .client
                    .as_ref()
                    .map(|(cert, key)| (cert.as_slice(), key.as_slice()));
                let pinned = PinnedTls::new(
                    first.clone(),
                    trust,
                    client,
                    connection.clone(),
                    settings.connect_timeout,
                )
                .map_err(misconfigured)?;
                let standalone =
                    Standalone::new(first.clone(), connection, pinned).map_err(misconfigured)?;
                Pools::Standalone(bounded_pool(standalone, settings)?)
            }
            Topology::Cluster => {
                let cluster = Cluster::new(
                    plain_connection_infos(settings).map_err(misconfigured)?,
                    certificates(settings),
                    settings.connect_timeout,
                    reply_backstop,
                )
                .map_err(misconfigured)?;
                Pools::Cluster(bounded_pool(cluster, settings)?)
            }
            Topology::Sentinel => {
                let primary = SentinelPrimary::new(
                    plain_connection_infos(settings).map_err(misconfigured)?,
                    &settings.sentinel.master,
                    settings.sentinel.credentials.as_ref(),
                    certificates(settings),
                )
                .map_err(misconfigured)?;
                Pools::Sentinel(bounded_pool(primary, settings)?)
            }
        })
    }

    /// The pool's size and connections available.
    fn status(&self) -> deadpool::Status {
        match self {
            Self::Standalone(pool) => pool.status(),
            Self::Cluster(pool) => pool.status(),
            Self::Sentinel(pool) => pool.status(),
        }
    }
}

/// A pool of connections to Redis, behind a circuit breaker.
#[derive(Clone)]
pub struct RedisStore {
    pools: Arc<PerThread<Pools>>,
    command_timeout: Duration,
    /// The breakers and batch queues in front of its node or nodes.
    nodes: Arc<Nodes>,
    /// Which Redis it is, for metrics and logs: `main` or `per_second`.
    label: &'static str,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.pool_status();
        f.debug_struct("RedisStore")
            .field("label", &self.label)
            .field("pool", &status)
            .field("command_timeout", &self.command_timeout)
            .finish()
    }
}

impl RedisStore {
    /// Builds the pool; connections open lazily, so this succeeds while Redis
    /// is down (health reports it until it is up).
    pub fn new(settings: &RedisSettings) -> Result<Self, StoreError> {
        // Each worker thread its own pool: its connections are then read and
        // written by that thread alone.
        let pools = Arc::new(PerThread::try_new(|| Pools::new(settings))?);
        metrics::redis_store(MAIN);
        // A node's breaker tries a call every command timeout: so at most
        // about one call at a time waits on a node that is down.
        let nodes = match pools.get() {
            Pools::Cluster(_) => Nodes::PerPrimary(ClusterNodes::new(
                settings.breaker_threshold,
                settings.command_timeout,
                settings.batch_calls,
            )),
            _ => Nodes::one(settings.breaker_threshold, settings.batch_calls),
        };
        Ok(Self {
            pools,
            command_timeout: settings.command_timeout,
            nodes: Arc::new(nodes),
            label: MAIN,
        })
    }

    /// The same store, named `label` in metrics and logs (`main` unless
    /// said otherwise).
    pub fn labelled(self, label: &'static str) -> Self {
        metrics::redis_store(label);
        Self { label, ..self }
    }

    /// Its name in metrics and logs.
    pub fn label(&self) -> &'static str {
        self.label
    }

    /// Runs a prepared script call (by SHA, loading the script on
    /// `NOSCRIPT`) and reads its reply: a list of integers. `key` is one of
    /// its keys (on a Cluster, all of them are in its slot). Fails at once
    /// while the circuit breaker in front of that key is open.
    pub async fn run_script<T: FromRedisValue>(
        &self,
        key: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> Result<T, StoreError> {
        let node = self.nodes.for_key(key);
        if !node.breaker.allows() {
            metrics::redis_command(self.label, Duration::ZERO, Err(&StoreError::CircuitOpen));
            return Err(StoreError::CircuitOpen);
        }
        let started = std::time::Instant::now();
        let reply = self
            .bounded(&node.breaker, async {
                on_shared_connection!(&self.pools, |connection| invocation
                    .invoke_async::<T>(&mut connection))
                .map_err(classify)
            })
            .await;
        metrics::redis_command(self.label, started.elapsed(), reply.as_ref().map(drop));
        reply
    }

    /// Runs `call` as [`RedisStore::run_script`] runs it alone, in a batch
    /// with the calls waiting for the same Redis node (see `batch`): the
    /// same reply, the same errors. `key` is one of its keys.
    pub async fn run_batched(&self, key: &str, call: Batchable) -> Result<ScriptReply, StoreError> {
        if !self.nodes.batch() {
            return self.run_alone(key, call).await;
        }
        let node = self.nodes.for_key(key);
        if !node.breaker.allows() {
            metrics::redis_command(self.label, Duration::ZERO, Err(&StoreError::CircuitOpen));
            return Err(StoreError::CircuitOpen);
        }
        let (outcome, slot) = node.batchers.get().enqueue(call);
        if let Some(slot) = slot {
            // A task of its own, so that a caller that gives up does not
            // take the other callers' batch with it.
            tokio::spawn(self.clone().drive(node, slot));
        }
        let outcome = match tokio::time::timeout(self.command_timeout, outcome).await {
            Err(_) => return Err(StoreError::deadline(self.command_timeout)),
            Ok(Err(_)) => return Err(StoreError::BatchLost),
            Ok(Ok(outcome)) => outcome,
        };
        match outcome {
            Outcome::Reply(reply) => Ok(reply),
            Outcome::Failed(err) => Err(err),
            Outcome::OnItsOwn(call) => self.run_alone(key, call).await,
        }
    }

    /// `call` on its own, as [`RedisStore::run_script`] runs a script.
    /// (Boxed: the compiler then proves it `Send` once, here, rather than
    /// inside every caller's future, which would take it too deep.)
    fn run_alone<'a>(
        &'a self,
        key: &'a str,
        call: Batchable,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<ScriptReply, StoreError>> + Send + 'a>> {
        Box::pin(async move {
            let node = self.nodes.for_key(key);
            if !node.breaker.allows() {
                metrics::redis_command(self.label, Duration::ZERO, Err(&StoreError::CircuitOpen));
                return Err(StoreError::CircuitOpen);
            }
            let started = std::time::Instant::now();
            let call = call.alone();
            let reply = self
                .bounded(&node.breaker, async {
                    on_shared_connection!(&self.pools, |connection| call
                        .invoke_async(&mut connection))
                    .map_err(classify)
                })
                .await;
            metrics::redis_command(self.label, started.elapsed(), reply.as_ref().map(drop));
            reply.map(ScriptReply::Whole)
        })
    }

    /// Sends the calls queued for `node`, batch after batch, while there
    /// are any. (Boxed: the compiler then proves it `Send` once, here,
    /// rather than inside every caller's future.)
    fn drive(
        self,
        node: Arc<Node>,
        mut slot: OwnedSemaphorePermit,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            loop {
                // On the thread that queued the call: its queue.
                let batcher = node.batchers.get();
                let batch = batcher.take();
                if batch.is_empty() {
                    drop(slot);
                    match batcher.lead_again() {
                        Some(again) => slot = again,
                        None => return,
                    }
                    continue;
                }
                self.run_batch(&node.breaker, batch).await;
            }
        })
    }

    /// Runs a batch of one: the call alone, as the single script.
    async fn run_one(&self, breaker: &CircuitBreaker, pending: Pending) {
        let started = std::time::Instant::now();
        let call = pending.call().alone();
        let reply = self
            .bounded(breaker, async {
                on_shared_connection!(&self.pools, |connection| call.invoke_async(&mut connection))
                    .map_err(classify)
            })
            .await;
        metrics::redis_command(self.label, started.elapsed(), reply.as_ref().map(drop));
        pending.answer(match reply {
            Ok(value) => Outcome::Reply(ScriptReply::Whole(value)),
            Err(err) => Outcome::Failed(err),
        });
    }

    /// Runs one batch, of the calls queued behind `breaker`, and hands
    /// each caller its outcome.
    async fn run_batch(&self, breaker: &CircuitBreaker, mut batch: Vec<Pending>) {
        metrics::redis_batch(self.label, batch.len());
        if batch.len() == 1 {
            if let Some(pending) = batch.pop() {
                self.run_one(breaker, pending).await;
            }
            return;
        }
        let started = std::time::Instant::now();
        let Some(invocation) = batch::invocation(&batch, self.is_cluster()) else {
            // Nothing to route a Cluster's batch by: each call on its own.
            batch.into_iter().for_each(Pending::on_its_own);
            return;
        };
        let reply = self
            .within_timeout(async {
                Ok(on_shared_connection!(&self.pools, |connection| invocation
                    .invoke_async(&mut connection)))
            })
            .await;
        let reply = match reply {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(err)) if refused_unrun(&err) => {
                // Redis refused the batch before running it (a failover's
                // READONLY, LOADING, BUSY, OOM...): nothing of it was
                // written, so each call goes out on its own, meeting the
                // refusal (or not) as it would have alone. A node that
                // fails the script itself (one before Redis 7 cannot
                // compile it) would fail every batch: it gets none.
                debug!(%err, "batch refused; its calls go out one by one");
                if let Nodes::PerPrimary(nodes) = &*self.nodes
                    && script_failed(&err)
                {
                    warn!(
                        %err,
                        "a Redis Cluster node cannot run the batch script (it needs Redis 7 or \
                         later); decisions go out one script call each"
                    );
                    nodes.stop_batching();
                }
                batch.into_iter().for_each(Pending::on_its_own);
                return;
            }
            Ok(Err(err)) => Err(classify(err)),
            Err(err) => Err(err),
        };
        metrics::redis_command(self.label, started.elapsed(), reply.as_ref().map(drop));
        batch::answer_all(batch, reply, breaker, classify);
    }

    /// Reports the pool's connections in use and idle to the metrics.
    pub fn report_pool(&self) {
        let status = self.pool_status();
        metrics::redis_pool(
            self.label,
            status.size.saturating_sub(status.available),
            status.available,
        );
    }

    /// Is this a Redis Cluster, where keys live on different nodes?
    pub fn is_cluster(&self) -> bool {
        matches!(self.pools.get(), Pools::Cluster(_))
    }

    /// Every thread's pool's connections, in one.
    fn pool_status(&self) -> deadpool::Status {
        self.pools.iter().map(Pools::status).fold(
            deadpool::Status {
                max_size: 0,
                size: 0,
                available: 0,
                waiting: 0,
            },
            |all, one| deadpool::Status {
                max_size: all.max_size + one.max_size,
                size: all.size + one.size,
                available: all.available + one.available,
                waiting: all.waiting + one.waiting,
            },
        )
    }

    /// Deletes `key` (`DEL`; on a Cluster, on the node serving its slot),
    /// whatever the breakers say: an operator's reset, not a decision.
    /// Whether the key was there.
    pub async fn delete(&self, key: &str) -> Result<bool, StoreError> {
        let mut delete = redis::cmd("DEL");
        delete.arg(key);
        let started = std::time::Instant::now();
        let deleted = self
            .within_timeout(async {
                on_shared_connection!(&self.pools, |connection| delete
                    .query_async::<i64>(&mut connection))
                .map_err(classify)
            })
            .await;
        metrics::redis_command(self.label, started.elapsed(), deleted.as_ref().map(drop));
        deleted.map(|count| count > 0)
    }

    /// Opens the calling thread's first connection ahead of its first call,
    /// so that the call does not spend its command timeout connecting (on
    /// Sentinel, asking where the primary is first). A failure is left to
    /// the calls and the health probe to meet.
    pub async fn warm(&self) {
        let opened = match self.pools.get() {
            Pools::Standalone(pool) => pool.get().await.map(drop),
            Pools::Cluster(pool) => pool.get().await.map(drop),
            Pools::Sentinel(pool) => pool.get().await.map(drop),
        };
        if let Err(err) = opened {
            debug!(%err, "no Redis connection opened ahead of the first call");
        }
    }

    /// Asks Redis for `PING`, whatever the breakers say: the health
    /// check's probe, whose answer also closes (or opens) the breaker. On a
    /// Cluster the `PING` goes to every primary, and closes every node's
    /// breaker when all answer; a failure there opens none (each node's
    /// own calls tell which node fails). A Cluster is first asked who
    /// serves which slots, for the breakers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        if let Nodes::PerPrimary(nodes) = &*self.nodes {
            self.learn_slots(nodes).await;
        }
        // Through `query_async`, so that an error reply (NOAUTH, LOADING...)
        // is an error, not a value.
        let ping = redis::cmd("PING");
        let result = self
            .within_timeout(async {
                on_shared_connection!(&self.pools, |connection| ping
                    .query_async::<String>(&mut connection))
                .map(drop)
                .map_err(classify)
            })
            .await;
        match (&*self.nodes, &result) {
            (Nodes::One(node), Err(err)) if err.is_transient() => node.breaker.record_failure(),
            (Nodes::One(node), _) => node.breaker.record_success(),
            (Nodes::PerPrimary(_), Err(err)) if err.is_transient() => {}
            (Nodes::PerPrimary(nodes), _) => nodes.record_success(),
        }
        result
    }

    /// Asks a Cluster node `CLUSTER SLOTS`, for the breakers to follow
    /// failovers and resharding. Unanswered, the breakers keep what they
    /// knew.
    async fn learn_slots(&self, nodes: &ClusterNodes) {
        let mut ask = redis::cmd("CLUSTER");
        ask.arg("SLOTS");
        let reply = self
            .within_timeout(async {
                on_shared_connection!(&self.pools, |connection| ask
                    .query_async::<Value>(&mut connection))
                .map_err(classify)
            })
            .await
            .map_err(|err| err.to_string())
            .and_then(|reply| nodes.learn(&reply));
        if let Err(err) = reply {
            debug!(%err, "no slot map for the circuit breakers this time");
        }
    }

    /// Runs `work` within the command timeout and tells `breaker` how it
    /// went.
    async fn bounded<T>(
        &self,
        breaker: &CircuitBreaker,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let result = self.within_timeout(work).await;
        match &result {
            Err(err) if err.is_transient() => breaker.record_failure(),
            _ => breaker.record_success(),
        }
        result
    }

    /// Runs `work` within the command timeout. A call cut off leaves its
    /// connection usable: a multiplexed connection drops the late reply.
    async fn within_timeout<T>(
        &self,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.command_timeout, work)
            .await
            .map_err(|_| StoreError::deadline(self.command_timeout))
            .and_then(|result| result)
    }
}

/// The configured TLS material, if any (else the system's roots serve).
fn certificates(settings: &RedisSettings) -> Option<TlsCertificates> {
    if settings.tls.ca.is_none() && settings.tls.client.is_none() {
        return None;
    }
    Some(TlsCertificates {
        client_tls: settings
            .tls
            .client
            .clone()
            .map(|(client_cert, client_key)| ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: settings.tls.ca.clone(),
    })
}

/// The URLs as connection settings, as written.
fn plain_connection_infos(settings: &RedisSettings) -> Result<Vec<ConnectionInfo>, RedisError> {
    settings
        .urls
        .iter()
        .map(|url| url.as_str().into_connection_info())
        .collect()
}

/// The URLs as connection settings, with the TLS material applied to each
/// `rediss://` one (how a standalone client takes it).
fn connection_infos(settings: &RedisSettings) -> Result<Vec<ConnectionInfo>, RedisError> {
    let Some(certificates) = certificates(settings) else {
        return plain_connection_infos(settings);
    };
    settings
        .urls
        .iter()
        .map(|url| {
            let client = redis::Client::build_with_tls(url.as_str(), certificates.clone())?;
            Ok(client.get_connection_info().clone())
        })
        .collect()
}

/// A pool of the connections `open` opens, with the pool's size and
/// timeouts.
fn bounded_pool<O: Open>(
    open: O,
    settings: &RedisSettings,
) -> Result<Pool<Connections<O>>, StoreError> {
    // The connections are shared by calls (see `managers`), so a thread
    // rarely needs more than one or two: the size is split among threads.
    let per_thread = settings.pool_size.div_ceil(crate::worker::count()).max(1);
    Pool::builder(Connections(open))
        .max_size(per_thread)
        .wait_timeout(Some(settings.command_timeout))
        .create_timeout(Some(settings.connect_timeout))
        .recycle_timeout(Some(settings.command_timeout))
        .runtime(Runtime::Tokio1)
        .build()
        .map_err(StoreError::config)
}

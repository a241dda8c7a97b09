//! The configured store as the limiter, health and the quota service see
//! it: Redis, shared by every ratelimitd instance, or the embedded one.
//! Only this file and the limiter's own decisions (`decisions`) tell the
//! two apart; the rest of the server asks the store itself.

use std::sync::Arc;

use crate::algorithm::State;
use crate::error::StoreError;
use crate::quota::QuotaLedgers;
use crate::store::{MemoryStore, RedisStore};

/// The configured store: Redis, shared by every ratelimitd instance, or the
/// embedded one holding the algorithms' state in this process.
#[derive(Clone)]
pub enum Store {
    /// Redis, shared by every instance.
    Redis(RedisStore),
    /// The embedded store, this process's own.
    Memory(Arc<MemoryStore<State>>),
}

impl Store {
    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Redis(_) => "redis",
            Self::Memory(_) => "memory",
        }
    }

    /// Does the store answer now? Asks Redis for `PING`, whatever the
    /// circuit breaker says (the answer also closes or opens it); the
    /// embedded store, in this process, answers while we do.
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Self::Redis(redis) => redis.ping().await,
            Self::Memory(_) => Ok(()),
        }
    }

    /// Reports the Redis pool's connections in use and idle to the
    /// metrics; the embedded store has none.
    pub fn report_pool(&self) {
        if let Self::Redis(redis) = self {
            redis.report_pool();
        }
    }

    /// The quota ledgers on this store: on Redis, with this process's own
    /// ledger for the `local` failure policy; on the embedded store, this
    /// process's own alone.
    pub fn quota_ledgers(&self) -> QuotaLedgers {
        match self {
            Self::Redis(redis) => QuotaLedgers::on_redis(redis.clone()),
            Self::Memory(_) => QuotaLedgers::in_process(),
        }
    }
}

//! The two places state can live, whatever the state: Redis, shared by
//! every ratelimitd instance, or this process's memory. The limiter's store
//! (`limiter::Store`) and the quota service's ledger (`quota::QuotaLedger`)
//! are each one of these, over their own in-process state; what both ask
//! of either place is here.

use std::sync::Arc;

use super::RedisStore;
use crate::error::StoreError;

/// Redis, or `M` in this process.
pub enum Backend<M> {
    /// Redis, shared by every instance.
    Redis(RedisStore),
    /// This process's own, one instance's only.
    Memory(Arc<M>),
}

// Not derived: cloning shares `M`, which need not be `Clone` itself.
impl<M> Clone for Backend<M> {
    fn clone(&self) -> Self {
        match self {
            Self::Redis(redis) => Self::Redis(redis.clone()),
            Self::Memory(memory) => Self::Memory(memory.clone()),
        }
    }
}

impl<M> Backend<M> {
    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Redis(_) => "redis",
            Self::Memory(_) => "memory",
        }
    }

    /// Which store it is, for logs: the Redis's label (`main`,
    /// `per_second`), or `embedded`.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Redis(redis) => redis.label(),
            Self::Memory(_) => "embedded",
        }
    }

    /// Does it answer now? Asks Redis for `PING`, whatever the circuit
    /// breaker says (the answer also closes or opens it); this process's
    /// memory answers while we do.
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Self::Redis(redis) => redis.ping().await,
            Self::Memory(_) => Ok(()),
        }
    }

    /// Opens the calling thread's first Redis connection ahead of its
    /// first call (see [`RedisStore::warm`]); memory needs none.
    pub async fn warm(&self) {
        if let Self::Redis(redis) = self {
            redis.warm().await;
        }
    }

    /// Reports the Redis pool's connections in use and idle to the
    /// metrics; memory has none.
    pub fn report_pool(&self) {
        if let Self::Redis(redis) = self {
            redis.report_pool();
        }
    }
}

//! The configured store as the limiter, health and the quota service see
//! it: the store's [`Backend`] over the algorithms' state. Besides the
//! store itself, only this file and the limiter's own decisions
//! (`decisions`) tell Redis and the embedded store apart; the rest of the
//! server asks the store.

use crate::algorithm::State;
use crate::quota::QuotaLedgers;
use crate::store::{Backend, MemoryStore};

/// The configured store: Redis, shared by every ratelimitd instance, or the
/// embedded one holding the algorithms' state in this process.
pub type Store = Backend<MemoryStore<State>>;

impl Store {
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

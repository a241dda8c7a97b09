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
///
/// The embedded store needs nothing but a clock; Redis is reached through
/// [`RedisStore`](crate::store::RedisStore). Both decide with the same
/// semantics.
///
/// ```
/// use std::sync::Arc;
///
/// use ratelimitd::limiter::{Limiter, Store};
/// use ratelimitd::store::{MemoryStore, SystemClock};
///
/// let store = Store::Memory(MemoryStore::new(Arc::new(SystemClock::default())));
/// assert!(matches!(store, Store::Memory(_)));
/// let limiter = Limiter::new(store, "ratelimitd:");
/// assert!(matches!(limiter.store(), Store::Memory(_)));
/// ```
pub type Store = Backend<MemoryStore<State>>;

impl Store {
    /// The quota ledgers on this store: on Redis, with this process's own
    /// ledger for the `local` failure policy; on the embedded store, this
    /// process's own alone.
    pub(crate) fn quota_ledgers(&self) -> QuotaLedgers {
        match self {
            Self::Redis(redis) => QuotaLedgers::on_redis(redis.clone()),
            Self::Memory(_) => QuotaLedgers::in_process(),
        }
    }
}

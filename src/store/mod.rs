//! Where decisions keep their state: Redis, shared by every ratelimitd
//! instance, or the embedded in-process store.

pub mod breaker;
mod managers;
pub mod memory;
mod pinned_tls;
pub mod redis;

use std::sync::Arc;

pub use self::memory::{Clock, ManualClock, MemoryStore, SystemClock};
pub use self::redis::{Credentials, RedisSettings, RedisStore, RedisTls, Topology};
use crate::algorithm::State;

/// The configured store.
#[derive(Clone)]
pub enum Store {
    Redis(RedisStore),
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
}

//! The limiter's options (key prefix, local over-limit cache, failure
//! policy), and the limiter they build on the store the store's options
//! name.

use std::sync::Arc;

use super::decisions::Limiter;
use super::denial_cache::DenialCache;
use super::store::Store;
use crate::algorithm::State;
use crate::error::StoreError;
use crate::limit::FailurePolicy;
use crate::options::byte_size;
use crate::store::redis::PER_SECOND;
use crate::store::{EmbeddedSettings, MemoryStore, RedisStore, StoreSettings, SystemClock};

/// The default prefix of every storage key.
pub const DEFAULT_KEY_PREFIX: &str = "ratelimitd:";

/// How decisions are keyed, cached, and answered while Redis cannot.
#[derive(Clone, Debug, PartialEq, clap::Args)]
#[command(next_help_heading = "Store")]
pub struct LimiterOptions {
    /// Prefix of every storage key, to share one Redis between services.
    #[arg(long, env = "RATELIMITD_KEY_PREFIX", default_value = DEFAULT_KEY_PREFIX)]
    pub key_prefix: String,

    /// Keys this instance remembers Redis denied (until their denial lifts),
    /// to answer a flood on them without Redis; 0 turns the cache off. A
    /// cached denial only answers the same limit and the same or a larger
    /// cost, so it never denies what Redis would allow (but a key deleted by
    /// hand in Redis stays denied here until its retry-after).
    #[arg(long, env = "RATELIMITD_LOCAL_CACHE_SIZE", default_value_t = 100_000)]
    pub local_cache_size: usize,

    /// Most memory the local over-limit cache may take, e.g. `16MiB` (its
    /// estimate: keys and entries); with --local-cache-size, whichever
    /// binds first. 0 turns the cache off.
    #[arg(long, env = "RATELIMITD_LOCAL_CACHE_MAX_BYTES", default_value = "16MiB",
          value_parser = byte_size)]
    pub local_cache_max_bytes: usize,

    /// What to answer when Redis cannot decide in time: fail-closed
    /// (UNAVAILABLE), fail-open (allow), or local (decide on this instance's
    /// own embedded store). CheckLimit calls may name their own.
    #[arg(
        long,
        env = "RATELIMITD_FAILURE_POLICY",
        value_enum,
        default_value = "fail-closed",
        help_heading = "Failure policy"
    )]
    pub failure_policy: FailurePolicy,
}

impl LimiterOptions {
    /// The limiter on the store `store` names: on Redis (with this
    /// instance's own embedded store for the `local` failure policy) or on
    /// the embedded store alone. Must run inside a tokio runtime (embedded
    /// stores start their eviction task).
    pub fn build(&self, store: &StoreSettings) -> Result<Limiter, StoreError> {
        match store {
            StoreSettings::Redis {
                redis,
                per_second,
                local,
            } => {
                let store = Store::Redis(RedisStore::new(redis)?);
                let limiter = Limiter::new(store, self.key_prefix.clone())
                    .with_failure_policy(self.failure_policy, embedded(local))
                    .with_denial_cache(DenialCache::new(
                        self.local_cache_size,
                        self.local_cache_max_bytes,
                    ));
                let Some(per_second) = per_second else {
                    return Ok(limiter);
                };
                let per_second = RedisStore::new(per_second)?.labelled(PER_SECOND);
                Ok(limiter.with_per_second(per_second))
            }
            StoreSettings::Embedded(settings) => Ok(Limiter::new(
                Store::Memory(embedded(settings)),
                self.key_prefix.clone(),
            )),
        }
    }
}

/// An embedded store within `settings`, its sweeper running.
fn embedded(settings: &EmbeddedSettings) -> Arc<MemoryStore<State>> {
    let memory = MemoryStore::with_max_bytes(Arc::new(SystemClock::default()), settings.max_bytes);
    memory.spawn_sweeper(settings.sweep_interval);
    memory
}

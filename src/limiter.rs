//! Decides one validated request on the configured store: names the storage
//! key, then runs the request's algorithm there. Knows nothing of gRPC.

use tracing::instrument;

use crate::algorithm::{self, fixed_window, sliding_window, token_bucket};
use crate::error::StoreError;
use crate::limit::{Algorithm, Decision, LimitRequest};
use crate::store::Store;

/// The default prefix of every storage key.
pub const DEFAULT_KEY_PREFIX: &str = "ratelimitd:";

/// Decides requests on one store.
#[derive(Clone)]
pub struct Limiter {
    store: Store,
    key_prefix: String,
}

impl Limiter {
    pub fn new(store: Store, key_prefix: impl Into<String>) -> Self {
        Self {
            store,
            key_prefix: key_prefix.into(),
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// May `request.key` spend `request.cost` now? Over the limit is an
    /// `Ok` decision; `Err` only when the store failed.
    #[instrument(skip_all, fields(algorithm = request.algorithm.name(), cost = request.cost))]
    pub async fn check(&self, request: &LimitRequest) -> Result<Decision, StoreError> {
        let key = storage_key(&self.key_prefix, &request.algorithm, request.key.as_str());
        let limit = request.algorithm.limit();
        match &self.store {
            Store::Redis(redis) => {
                let cost = request.cost;
                let reply = match &request.algorithm {
                    Algorithm::FixedWindow(p) => {
                        let args = fixed_window::script_args(p, cost);
                        redis.run_script(&fixed_window::SCRIPT, &key, args).await?
                    }
                    Algorithm::SlidingWindow(p) => {
                        let args = sliding_window::script_args(p, cost);
                        redis
                            .run_script(&sliding_window::SCRIPT, &key, args)
                            .await?
                    }
                    Algorithm::TokenBucket(p) => {
                        let args = token_bucket::script_args(p, cost);
                        redis.run_script(&token_bucket::SCRIPT, &key, args).await?
                    }
                };
                algorithm::decision_from_reply(limit, reply).map_err(StoreError::Reply)
            }
            Store::Memory(memory) => Ok(memory.update(&key, |state, now| {
                algorithm::decide_in_memory(&request.algorithm, state, now, request.cost)
            })),
        }
    }
}

/// `<prefix>{<tag>:<caller key>}`. The braces are a Redis Cluster hash tag:
/// every key of one limit hashes to one slot, whatever the caller's key holds
/// (a `}` inside it only shortens the tag; the key itself stays unique). The
/// algorithm's tag keeps one caller key under two algorithms apart.
pub fn storage_key(prefix: &str, algorithm: &Algorithm, caller_key: &str) -> String {
    let tag = algorithm::key_tag(algorithm);
    let mut key = String::with_capacity(prefix.len() + tag.len() + caller_key.len() + 3);
    key.push_str(prefix);
    key.push('{');
    key.push_str(tag);
    key.push(':');
    key.push_str(caller_key);
    key.push('}');
    key
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limit::{FixedWindow, SlidingWindow};

    #[test]
    fn keys_carry_prefix_algorithm_and_a_hash_tag() {
        let fixed = Algorithm::FixedWindow(FixedWindow::new(1, Duration::from_secs(1)).unwrap());
        let sliding =
            Algorithm::SlidingWindow(SlidingWindow::new(1, Duration::from_secs(1)).unwrap());
        assert_eq!(
            storage_key("ratelimitd:", &sliding, "user42"),
            "ratelimitd:{sw:user42}"
        );
        assert_ne!(
            storage_key("p:", &fixed, "user42"),
            storage_key("p:", &sliding, "user42")
        );
    }
}

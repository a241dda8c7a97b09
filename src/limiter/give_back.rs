//! Units a client leased and did not spend, given back to the limits that
//! can take them: a token bucket or GCRA limit on Redis, by the refund
//! script, one key at a time. A window's units are not given back (they
//! come back with the window); nor are the embedded store's (they come
//! back with the refill).

use super::decisions::Limiter;
use super::keys::storage_key;
use super::script::{self, ScriptLimit, SpendMark};
use super::store::Store;
use crate::algorithm::{Algorithm, LimitRequest};
use crate::error::StoreError;

impl Limiter {
    /// Gives each of `requests` its `cost` back where it can be: on Redis,
    /// to a token bucket (never above its capacity) or a GCRA limit (never
    /// below empty). Answers whether anything was given back.
    pub(crate) async fn give_back(&self, requests: &[LimitRequest]) -> Result<bool, StoreError> {
        let Store::Redis(redis) = self.store() else {
            return Ok(false);
        };
        let mut given = false;
        for request in requests {
            if request.cost == 0
                || !matches!(
                    request.algorithm,
                    Algorithm::TokenBucket(_) | Algorithm::Gcra(_)
                )
            {
                continue;
            }
            let key = storage_key(self.key_prefix(), &request.algorithm, &request.key);
            let limit = ScriptLimit {
                key: &key,
                algorithm: &request.algorithm,
                cost: request.cost,
                shadow: request.shadow,
            };
            let refunded: i64 = redis
                .run_script(&key, &script::refund_call(&[(limit, SpendMark::Unmarked)]))
                .await?;
            given |= refunded > 0;
        }
        Ok(given)
    }
}

//! Units a client leased and did not spend, given back to the limits that
//! can take them: a token bucket or GCRA limit, on Redis by the refund
//! script (one key at a time), on the embedded store by its twin. A
//! window's units are not given back: they come back with the window.

use super::decisions::Limiter;
use super::keys::storage_key;
use super::script::{self, ScriptLimit, SpendMark};
use super::store::Store;
use crate::algorithm::{self, Algorithm, LimitRequest};
use crate::error::StoreError;

impl Limiter {
    /// Gives each of `requests` its `cost` back where it can be: to a
    /// token bucket (never above its capacity) or a GCRA limit (never
    /// below empty). Answers whether anything was given back.
    pub(crate) async fn give_back(&self, requests: &[LimitRequest]) -> Result<bool, StoreError> {
        let givable = requests.iter().filter(|request| {
            request.cost > 0
                && matches!(
                    request.algorithm,
                    Algorithm::TokenBucket(_) | Algorithm::Gcra(_)
                )
        });
        let redis = match self.store() {
            Store::Redis(redis) => redis,
            Store::Memory(memory) => {
                let mut given = false;
                for request in givable {
                    let key = storage_key(self.key_prefix(), &request.algorithm, &request.key);
                    given |= memory.with_keys(&[key.as_str()], |locked, _| {
                        locked.decide(0, |state| {
                            algorithm::give_back_in_memory(&request.algorithm, state, request.cost)
                        })
                    });
                }
                return Ok(given);
            }
        };
        let mut given = false;
        for request in givable {
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

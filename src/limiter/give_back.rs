//! Spends that may be given back, and giving them back: a lease's units
//! are spent with each limit's mark (what finds that spend again: its
//! window, or nothing for a bucket), and what the client did not use goes
//! back to a fixed window only while it still counts the window spent, to a
//! token bucket or GCRA limit at any time. On Redis by the refund script
//! (one key at a time), on the embedded store by its twin.

use super::decisions::Limiter;
use super::in_memory;
use super::keys::{Groups, storage_key};
use super::on_redis;
use super::script::{self, ScriptLimit, SpendMark};
use super::store::Store;
use crate::algorithm::{self, Algorithm, LimitRequest};
use crate::error::StoreError;
use crate::limit::Decision;

/// One request's part of a spend that may be given back: its decision and,
/// if its limit spent, the mark of that spend.
pub type MarkedDecision = (Decision, Option<SpendMark>);

impl Limiter {
    /// Decides `requests` together, all or nothing, as
    /// [`Limiter::check_all`] does failing closed (a Redis that cannot
    /// answer is an error: units no one can give back exactly are not
    /// spent), and answers each request's decision with, if its limit
    /// spent, the mark [`Limiter::give_back`] needs to give back to the
    /// spend's own window and to no later one. The denial cache is not
    /// asked: every call reaches the store.
    pub async fn spend_marked(
        &self,
        requests: &[LimitRequest],
    ) -> Result<Vec<MarkedDecision>, StoreError> {
        let groups = Groups::new(self.key_prefix(), requests);
        let (decisions, marks) = match self.store() {
            Store::Redis(redis) => on_redis::decide_marked(redis, &groups, requests).await?,
            Store::Memory(memory) => in_memory::decide_marked(memory, &groups, requests)?,
        };
        let decisions = groups.per_request(decisions);
        Ok(decisions
            .into_iter()
            .enumerate()
            .map(|(i, decision)| {
                let mark = groups
                    .group_of(i)
                    .and_then(|g| marks.get(g).copied().flatten());
                (decision, mark)
            })
            .collect())
    }

    /// Gives each request of `spent` its `cost` back, with the mark of
    /// its spend, where it can be: to a fixed window only while it counts
    /// the window spent (never below none), to a token bucket (never above
    /// its capacity) or a GCRA limit (never below empty). Answers whether
    /// anything was given back.
    pub async fn give_back(&self, spent: &[(LimitRequest, SpendMark)]) -> Result<bool, StoreError> {
        let givable = spent.iter().filter(|(request, _)| {
            request.cost > 0
                && matches!(
                    request.algorithm,
                    Algorithm::FixedWindow(_) | Algorithm::TokenBucket(_) | Algorithm::Gcra(_)
                )
        });
        let redis = match self.store() {
            Store::Redis(redis) => redis,
            Store::Memory(memory) => {
                let mut given = false;
                for (request, mark) in givable {
                    let key = storage_key(self.key_prefix(), &request.algorithm, &request.key);
                    given |= memory.with_keys(&[key.as_str()], |locked, _| {
                        locked.decide(0, |state| {
                            algorithm::give_back_in_memory(
                                &request.algorithm,
                                state,
                                request.cost,
                                mark.arg(),
                            )
                        })
                    });
                }
                return Ok(given);
            }
        };
        let mut given = false;
        for (request, mark) in givable {
            let key = storage_key(self.key_prefix(), &request.algorithm, &request.key);
            let limit = ScriptLimit {
                key: &key,
                algorithm: &request.algorithm,
                cost: request.cost,
                shadow: request.shadow,
            };
            let refunded: i64 = redis
                .run_script(&key, &script::refund_call(&[(limit, *mark)]))
                .await?;
            given |= refunded > 0;
        }
        Ok(given)
    }
}

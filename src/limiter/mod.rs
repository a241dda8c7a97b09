//! Decides validated requests on the configured store: names each storage
//! key, then runs the requests' algorithms there, all of one call's limits
//! together; when Redis cannot answer, applies the failure policy. Knows
//! nothing of gRPC.

mod denial_cache;
mod on_redis;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, instrument};

use crate::algorithm::{self, State};
use crate::error::StoreError;
use crate::limit::{
    Algorithm, CallerKey, Decision, FailurePolicy, KeyOrigin, LimitRequest, RetryAfter,
};
use crate::metrics;
use crate::store::{MemoryStore, RedisStore, Store};

pub use denial_cache::DenialCache;

/// The default prefix of every storage key.
pub const DEFAULT_KEY_PREFIX: &str = "ratelimitd:";

/// Decides requests on one store.
#[derive(Clone)]
pub struct Limiter {
    store: Store,
    key_prefix: String,
    default_policy: FailurePolicy,
    /// Where `Local` decides while Redis cannot: this instance's own state.
    local: Option<Arc<MemoryStore<State>>>,
    /// Keys Redis denied until a known instant, answered without Redis.
    denials: Option<Arc<DenialCache>>,
}

impl Limiter {
    /// A limiter that fails closed when its store cannot answer.
    pub fn new(store: Store, key_prefix: impl Into<String>) -> Self {
        Self {
            store,
            key_prefix: key_prefix.into(),
            default_policy: FailurePolicy::FailClosed,
            local: None,
            denials: None,
        }
    }

    /// Answers requests that Redis has already denied from `cache`, until
    /// their denial lifts, without asking Redis.
    pub fn with_denial_cache(mut self, cache: Option<DenialCache>) -> Self {
        self.denials = cache.map(Arc::new);
        self
    }

    /// Answers by `policy` when Redis cannot (unless a call names its own),
    /// deciding `Local` calls on `local`.
    pub fn with_failure_policy(
        mut self,
        policy: FailurePolicy,
        local: Arc<MemoryStore<State>>,
    ) -> Self {
        self.default_policy = policy;
        self.local = Some(local);
        self
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// May `request.key` spend `request.cost` now? Over the limit is an
    /// `Ok` decision; `Err` only when the store failed.
    pub async fn check(
        &self,
        request: &LimitRequest,
        policy: Option<FailurePolicy>,
    ) -> Result<Decision, StoreError> {
        let mut decisions = self
            .check_all(std::slice::from_ref(request), policy)
            .await?;
        decisions
            .pop()
            .ok_or_else(|| StoreError::Reply("no decision for the request".into()))
    }

    /// Decides several limits for one request together, atomically: either
    /// every limit not in shadow mode allows and each allowing limit spends
    /// its cost, or nothing is spent. One decision per request, in order.
    /// Requests naming the same storage key are decided as one, with their
    /// costs added, so a key cannot pass twice on the same units. When Redis
    /// cannot answer, `policy` (or the limiter's default) answers.
    #[instrument(level = "debug", skip_all, fields(limits = requests.len()))]
    pub async fn check_all(
        &self,
        requests: &[LimitRequest],
        policy: Option<FailurePolicy>,
    ) -> Result<Vec<Decision>, StoreError> {
        self.decide(requests, policy, Combination::AllOrNothing)
            .await
    }

    /// Decides several limits for one request, each on its own, as
    /// envoyproxy/ratelimit does: each spends what it allows, and a fixed
    /// window counts what it denies too ([`algorithm::Spend::Always`]). The
    /// denial cache is not used: a denied limit must still be counted.
    #[instrument(level = "debug", skip_all, fields(limits = requests.len()))]
    pub async fn check_each(
        &self,
        requests: &[LimitRequest],
        policy: Option<FailurePolicy>,
    ) -> Result<Vec<Decision>, StoreError> {
        self.decide(requests, policy, Combination::Each).await
    }

    async fn decide(
        &self,
        requests: &[LimitRequest],
        policy: Option<FailurePolicy>,
        combination: Combination,
    ) -> Result<Vec<Decision>, StoreError> {
        let groups = Groups::new(&self.key_prefix, requests);
        let decisions = match &self.store {
            Store::Redis(redis) => {
                // One instant serves the cache lookup and, if Redis is asked,
                // as when it was asked: taken before the call, it is never
                // later than Redis's decision.
                let sent = Instant::now();
                let cached = combination == Combination::AllOrNothing;
                if cached && let Some(known) = self.known_denial(&groups, requests, sent) {
                    let decisions = self.complete_denial(redis, &groups, requests, known).await;
                    return Ok(groups.of_request.iter().map(|&g| decisions[g]).collect());
                }
                // Boxed: the Redis path's future is kilobytes, and unboxed it
                // would be copied with every embedded-store decision too.
                match Box::pin(on_redis::decide(redis, &groups, requests, combination)).await {
                    Err(err) if err.is_transient() => {
                        let policy = policy.unwrap_or(self.default_policy);
                        debug!(%err, ?policy, "Redis cannot decide: the failure policy answers");
                        return self.when_redis_fails(err, policy, &groups, requests, combination);
                    }
                    decided => {
                        let decisions = decided?;
                        if cached {
                            self.remember_denials(&groups, requests, &decisions, sent);
                        }
                        decisions
                    }
                }
            }
            Store::Memory(memory) => decide_in_memory(memory, &groups, requests, combination),
        };
        Ok(groups.of_request.iter().map(|&g| decisions[g]).collect())
    }

    /// The denial cache's answers for the request's groups, when one of
    /// its enforcing limits is known to deny it (so the whole request is
    /// denied): `Some` for each group the cache knows.
    fn known_denial(
        &self,
        groups: &Groups,
        requests: &[LimitRequest],
        now: Instant,
    ) -> Option<Vec<Option<Decision>>> {
        let cache = self.denials.as_deref()?;
        let algorithm = |group: &Group| &requests[group.first].algorithm;
        let known = |group: &Group| cache.denial(&group.key, algorithm(group), group.cost, now);
        // A first pass that allocates nothing: most requests miss.
        let (hit, denial) = groups.unique.iter().enumerate().find_map(|(g, group)| {
            let denial = known(group).filter(|_| !group.shadow)?;
            Some((g, denial))
        })?;
        metrics::denial_cache_hit();
        // The denial found is kept as found: looked up again, it could have
        // been replaced in between.
        Some(
            groups
                .unique
                .iter()
                .enumerate()
                .map(|(g, group)| if g == hit { Some(denial) } else { known(group) })
                .collect(),
        )
    }

    /// A request a cached denial denies, answered as Redis's own denial
    /// would be: the groups the cache does not know are asked on Redis in
    /// one read-only script (their denial, or what they have), so each
    /// reports its real remaining and reset. If Redis cannot answer, they
    /// report their whole limit, the most they could have (marked
    /// degraded): the request is denied either way.
    async fn complete_denial(
        &self,
        redis: &RedisStore,
        groups: &Groups,
        requests: &[LimitRequest],
        known: Vec<Option<Decision>>,
    ) -> Vec<Decision> {
        let unknown: Vec<usize> = (0..known.len()).filter(|&g| known[g].is_none()).collect();
        if unknown.is_empty() {
            return known.into_iter().flatten().collect();
        }
        let asked = Box::pin(on_redis::answer_denied(redis, groups, requests, &unknown))
            .await
            .unwrap_or_else(|err| {
                debug!(%err, "Redis cannot say what the other limits of a cached denial have");
                unknown
                    .iter()
                    .map(|&g| {
                        let limit = requests[groups.unique[g].first].algorithm.limit();
                        Decision {
                            allowed: true,
                            limit,
                            remaining: limit,
                            reset_after: 0,
                            retry_after: RetryAfter::After(0),
                            degraded: true,
                        }
                    })
                    .collect()
            });
        // `asked` has one answer per unknown group, in order, so every
        // group gets one.
        let mut asked = asked.into_iter();
        known
            .into_iter()
            .filter_map(|decision| decision.or_else(|| asked.next()))
            .collect()
    }

    /// Keeps Redis's denials of `groups` (asked at `sent`) in the cache.
    fn remember_denials(
        &self,
        groups: &Groups,
        requests: &[LimitRequest],
        decisions: &[Decision],
        sent: Instant,
    ) {
        let Some(cache) = self.denials.as_deref() else {
            return;
        };
        for (group, decision) in groups.unique.iter().zip(decisions) {
            if !decision.allowed {
                let algorithm = &requests[group.first].algorithm;
                cache.remember(&group.key, algorithm, group.cost, decision, sent);
            }
        }
    }

    /// The failure policy's answer while Redis cannot decide: the error
    /// itself (fail closed), or degraded decisions.
    fn when_redis_fails(
        &self,
        err: StoreError,
        policy: FailurePolicy,
        groups: &Groups,
        requests: &[LimitRequest],
        combination: Combination,
    ) -> Result<Vec<Decision>, StoreError> {
        let decisions = match (policy, &self.local) {
            (FailurePolicy::FailClosed, _) | (FailurePolicy::Local, None) => return Err(err),
            (FailurePolicy::FailOpen, _) => groups
                .unique
                .iter()
                .map(|group| fail_open(&requests[group.first].algorithm, group.cost))
                .collect(),
            (FailurePolicy::Local, Some(local)) => {
                decide_in_memory(local, groups, requests, combination)
            }
        };
        Ok(groups
            .of_request
            .iter()
            .map(|&g| Decision {
                degraded: true,
                ..decisions[g]
            })
            .collect())
    }
}

/// How one call's limits are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Combination {
    /// Together: all spend, or none does.
    AllOrNothing,
    /// Each on its own, counting denied hits where the algorithm does.
    Each,
}

/// Decides the groups on an embedded store: the twin of the script.
fn decide_in_memory(
    memory: &MemoryStore<State>,
    groups: &Groups,
    requests: &[LimitRequest],
    combination: Combination,
) -> Vec<Decision> {
    if combination == Combination::Each {
        let keys: Vec<&str> = groups.unique.iter().map(|g| g.key.as_str()).collect();
        let costs: Vec<u64> = groups.unique.iter().map(|g| g.cost).collect();
        return memory.with_keys(&keys, |locked, now| {
            algorithm::decide_each(&costs, |i, cost, spend| {
                let algorithm = &requests[groups.unique[i].first].algorithm;
                locked.decide(i, |state| {
                    algorithm::decide_in_memory(algorithm, state, now, cost, spend)
                })
            })
        });
    }
    if let [group] = &*groups.unique {
        // Most calls decide one key: borrow its parameters in place rather
        // than collect them, as this path runs millions of times a second.
        let algorithm = &requests[group.first].algorithm;
        return memory.with_keys(&[group.key.as_str()], |locked, now| {
            algorithm::decide_together(
                std::slice::from_ref(&group.cost),
                std::slice::from_ref(&group.shadow),
                |i, cost, spend| {
                    locked.decide(i, |state| {
                        algorithm::decide_in_memory(algorithm, state, now, cost, spend)
                    })
                },
            )
        });
    }
    let keys: Vec<&str> = groups.unique.iter().map(|g| g.key.as_str()).collect();
    let costs: Vec<u64> = groups.unique.iter().map(|g| g.cost).collect();
    let shadow: Vec<bool> = groups.unique.iter().map(|g| g.shadow).collect();
    memory.with_keys(&keys, |locked, now| {
        algorithm::decide_together(&costs, &shadow, |i, cost, spend| {
            let algorithm = &requests[groups.unique[i].first].algorithm;
            locked.decide(i, |state| {
                algorithm::decide_in_memory(algorithm, state, now, cost, spend)
            })
        })
    })
}

/// Failing open: allowed, with the whole limit said to remain (nothing is
/// known), except a cost no state could ever allow.
fn fail_open(algorithm: &Algorithm, cost: u64) -> Decision {
    let limit = algorithm.limit();
    Decision {
        allowed: cost <= limit,
        limit,
        remaining: limit.saturating_sub(cost),
        reset_after: 0,
        retry_after: if cost <= limit {
            RetryAfter::After(0)
        } else {
            RetryAfter::Never
        },
        degraded: true,
    }
}

/// Up to this many requests per call, groups are found by a scan.
const SCAN_GROUPS_UP_TO: usize = 16;

/// Requests grouped by storage key.
struct Groups {
    unique: OneOrMany<Group>,
    /// For each request, the index of its group in `unique`.
    of_request: OneOrMany<usize>,
}

/// A list that holds a single item without allocating: most calls carry one
/// request, and on the embedded store allocations are a good part of a
/// decision's cost. Used as a slice.
enum OneOrMany<T> {
    One([T; 1]),
    Many(Vec<T>),
}

impl<T> std::ops::Deref for OneOrMany<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Self::One(item) => item,
            Self::Many(items) => items,
        }
    }
}

impl<'a, T> IntoIterator for &'a OneOrMany<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

struct Group {
    key: String,
    /// The request whose algorithm decides the group.
    first: usize,
    cost: u64,
    /// Only if every request of the group is in shadow mode.
    shadow: bool,
}

impl Groups {
    fn new(prefix: &str, requests: &[LimitRequest]) -> Self {
        if let [request] = requests {
            return Self {
                unique: OneOrMany::One([Group {
                    key: storage_key(prefix, &request.algorithm, &request.key),
                    first: 0,
                    cost: request.cost,
                    shadow: request.shadow,
                }]),
                of_request: OneOrMany::One([0]),
            };
        }
        let mut unique: Vec<Group> = Vec::with_capacity(requests.len());
        let mut of_request = Vec::with_capacity(requests.len());
        // Requests per call are usually few (Envoy descriptors), and then a
        // scan is cheapest; a map keeps a large call (bounds raised by the
        // operator) linear rather than quadratic.
        let mut index_of: Option<HashMap<String, usize>> =
            (requests.len() > SCAN_GROUPS_UP_TO).then(|| HashMap::with_capacity(requests.len()));
        for (index, request) in requests.iter().enumerate() {
            let key = storage_key(prefix, &request.algorithm, &request.key);
            let existing = match &index_of {
                Some(index_of) => index_of.get(&key).copied(),
                None => unique.iter().position(|group| group.key == key),
            };
            match existing {
                Some(existing) => {
                    let group = &mut unique[existing];
                    group.cost = group.cost.saturating_add(request.cost);
                    group.shadow &= request.shadow;
                    of_request.push(existing);
                }
                None => {
                    if let Some(index_of) = &mut index_of {
                        index_of.insert(key.clone(), unique.len());
                    }
                    of_request.push(unique.len());
                    unique.push(Group {
                        key,
                        first: index,
                        cost: request.cost,
                        shadow: request.shadow,
                    });
                }
            }
        }
        Self {
            unique: OneOrMany::Many(unique),
            of_request: OneOrMany::Many(of_request),
        }
    }
}

/// `<prefix>{<tag>:<key>}`, with the tag `rls:<tag>` for keys composed from
/// Envoy descriptors. The braces are a Redis Cluster hash tag: every key of
/// one limit hashes to one slot, whatever the key holds (a `}` inside it
/// only shortens the tag; the key itself stays unique). The algorithm's tag
/// keeps one caller key under two algorithms apart, and no `CheckLimit` key
/// can name an Envoy one (their tags never start with `rls`).
pub fn storage_key(prefix: &str, algorithm: &Algorithm, key: &CallerKey) -> String {
    let tag = algorithm::key_tag(algorithm);
    let origin = match key.origin() {
        KeyOrigin::CheckLimit => "",
        KeyOrigin::Envoy => "rls:",
    };
    let text = key.as_str();
    let mut storage =
        String::with_capacity(prefix.len() + origin.len() + tag.len() + text.len() + 3);
    storage.push_str(prefix);
    storage.push('{');
    storage.push_str(origin);
    storage.push_str(tag);
    storage.push(':');
    storage.push_str(text);
    storage.push('}');
    storage
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::limit::{FixedWindow, SlidingWindow};

    fn caller(key: &str) -> CallerKey {
        CallerKey::new(key.into()).unwrap()
    }

    #[test]
    fn keys_carry_prefix_algorithm_and_a_hash_tag() {
        let fixed = Algorithm::FixedWindow(FixedWindow::new(1, Duration::from_secs(1)).unwrap());
        let sliding =
            Algorithm::SlidingWindow(SlidingWindow::new(1, Duration::from_secs(1)).unwrap());
        assert_eq!(
            storage_key("ratelimitd:", &sliding, &caller("user42")),
            "ratelimitd:{sl:user42}"
        );
        assert_ne!(
            storage_key("p:", &fixed, &caller("user42")),
            storage_key("p:", &sliding, &caller("user42"))
        );
        assert_ne!(
            storage_key("p:", &fixed, &caller("rls:fw:x")),
            storage_key("p:", &fixed, &CallerKey::envoy("x".into()))
        );
    }
}

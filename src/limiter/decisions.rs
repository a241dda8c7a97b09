//! The limiter: one store (and, beside a main Redis, a per-second one for
//! the requests routed there: see `split`), with its key prefix, failure
//! policy and local over-limit cache, deciding each call's limits together
//! or each on its own.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tracing::{debug, instrument};

use super::denial_cache::DenialCache;
use super::keys::{Combination, Group, GroupDecisions, Groups, Route};
use super::store::Store;
use super::{failure, in_memory, on_redis};
use crate::algorithm::LimitRequest;
use crate::algorithm::State;
use crate::error::StoreError;
use crate::limit::{Decision, FailurePolicy};
use crate::metrics;
use crate::store::{MemoryStore, RedisStore};

/// Decides requests on one store (or two: see [`Limiter::with_per_second`]).
///
/// The limiter is the core without policies, metrics or load shedding (the
/// [`Decider`](crate::decider::Decider) adds those): it names each
/// request's storage key under its prefix and runs the request's algorithm
/// on the store.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use ratelimitd::algorithm::{Algorithm, LimitRequest, TokenBucket};
/// use ratelimitd::limit::CallerKey;
/// use ratelimitd::limiter::{Limiter, Store};
/// use ratelimitd::store::{MemoryStore, SystemClock};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = Store::Memory(MemoryStore::new(Arc::new(SystemClock::default())));
/// let limiter = Limiter::new(store, "example:");
/// // Bursts of 3, refilled at one a second.
/// let request = LimitRequest {
///     key: CallerKey::new("client-7".to_owned()).unwrap(),
///     algorithm: Algorithm::TokenBucket(TokenBucket::new(3, 1.0).unwrap()),
///     cost: 2,
///     shadow: false,
/// };
/// let first = limiter.check(&request, None).await.unwrap();
/// assert!(first.is_allowed());
/// assert_eq!(first.remaining(), 1);
/// // Two more do not fit in the one token left: nothing is spent.
/// let second = limiter.check(&request, None).await.unwrap();
/// assert!(!second.is_allowed());
/// assert_eq!(second.remaining(), 1);
/// # });
/// ```
#[derive(Clone)]
pub struct Limiter {
    store: Store,
    /// Beside a main Redis, the Redis for requests routed
    /// [`Route::PerSecond`].
    per_second: Option<RedisStore>,
    key_prefix: String,
    default_policy: FailurePolicy,
    /// Where `Local` decides while Redis cannot: this instance's own state.
    pub(super) local: Option<Arc<MemoryStore<State>>>,
    /// Keys Redis denied until a known instant, answered without Redis.
    pub(super) denials: Option<Arc<DenialCache>>,
}

impl Limiter {
    /// A limiter that fails closed when its store cannot answer.
    pub fn new(store: Store, key_prefix: impl Into<String>) -> Self {
        Self {
            store,
            per_second: None,
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

    /// Decides the requests routed [`Route::PerSecond`] on `redis`, with
    /// the same key prefix, failure policy and denial cache, the rest on
    /// the main store, which must be Redis too (beside the embedded store,
    /// the route is not followed).
    pub fn with_per_second(mut self, redis: RedisStore) -> Self {
        self.per_second = Some(redis);
        self
    }

    /// The (main) store it decides on.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Every store it decides on: the main one, then the per-second Redis
    /// if there is one.
    pub fn stores(&self) -> Vec<Store> {
        std::iter::once(self.store.clone())
            .chain(self.per_second.clone().map(Store::Redis))
            .collect()
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
        self.decide(requests, &[], policy, Combination::AllOrNothing)
            .await
    }

    /// As [`Limiter::check_all`], each request decided on the store its
    /// route names (`routes`, one per request): across two stores, all or
    /// nothing still, as across the nodes of a Redis Cluster (see `split`).
    pub async fn check_all_routed(
        &self,
        requests: &[LimitRequest],
        routes: &[Route],
        policy: Option<FailurePolicy>,
    ) -> Result<Vec<Decision>, StoreError> {
        self.decide(requests, routes, policy, Combination::AllOrNothing)
            .await
    }

    /// As [`Limiter::check_each`], each request decided on the store its
    /// route names.
    pub async fn check_each_routed(
        &self,
        requests: &[LimitRequest],
        routes: &[Route],
        policy: Option<FailurePolicy>,
    ) -> Result<Vec<Decision>, StoreError> {
        self.decide(requests, routes, policy, Combination::Each)
            .await
    }

    /// Decides several limits for one request, each on its own, as
    /// envoyproxy/ratelimit does: each spends what it allows, and a fixed
    /// window counts what it denies too ([`crate::algorithm::Spend::Always`]). The
    /// denial cache is not used: a denied limit must still be counted.
    #[instrument(level = "debug", skip_all, fields(limits = requests.len()))]
    pub async fn check_each(
        &self,
        requests: &[LimitRequest],
        policy: Option<FailurePolicy>,
    ) -> Result<Vec<Decision>, StoreError> {
        self.decide(requests, &[], policy, Combination::Each).await
    }

    /// Decides `requests` on the stores `routes` name (all on the main
    /// store without them).
    async fn decide(
        &self,
        requests: &[LimitRequest],
        routes: &[Route],
        policy: Option<FailurePolicy>,
        combination: Combination,
    ) -> Result<Vec<Decision>, StoreError> {
        let groups = Groups::new(&self.key_prefix, requests);
        let decisions = match &self.store {
            Store::Redis(main) => {
                let redis = match (&self.per_second, groups.routes(routes)) {
                    (None, _) | (_, Ok(Route::Main)) => main,
                    (Some(per_second), Ok(Route::PerSecond)) => per_second,
                    (Some(per_second), Err(by_group)) => {
                        // Boxed as a trait object: the type of the split's
                        // future, nested in every API's, is too deep for
                        // the compiler to prove it `Send` otherwise.
                        let split: Pin<Box<dyn Future<Output = _> + Send + '_>> =
                            Box::pin(self.decide_split(
                                [main, per_second],
                                requests,
                                &groups,
                                &by_group,
                                policy,
                                combination,
                            ));
                        return split.await;
                    }
                };
                self.decide_on_redis(redis, &groups, requests, policy, combination)
                    .await?
            }
            Store::Memory(memory) => in_memory::decide(memory, &groups, requests, combination)?,
        };
        Ok(groups.per_request(decisions))
    }

    /// Decides on Redis, through the denial cache (all or nothing only),
    /// with the failure policy answering while Redis cannot.
    pub(super) async fn decide_on_redis(
        &self,
        redis: &RedisStore,
        groups: &Groups,
        requests: &[LimitRequest],
        policy: Option<FailurePolicy>,
        combination: Combination,
    ) -> Result<GroupDecisions, StoreError> {
        // One instant serves the cache lookup and, if Redis is asked, as
        // when it was asked: taken before the call, it is never later than
        // Redis's decision.
        let sent = Instant::now();
        let cached = combination == Combination::AllOrNothing;
        if cached && let Some(known) = self.known_denial(groups, requests, sent) {
            return self.complete_denial(redis, groups, requests, known).await;
        }
        // Boxed: the Redis path's future is hundreds of bytes, and unboxed
        // it would be copied with every embedded-store decision too.
        match Box::pin(on_redis::decide(redis, groups, requests, combination)).await {
            Err(err) if err.is_transient() => failure::answer(
                err,
                self.policy(policy),
                self.local.as_deref(),
                groups,
                requests,
                combination,
            ),
            decided => {
                let decisions = decided?;
                if cached {
                    self.remember_denials(groups, requests, &decisions, sent);
                }
                Ok(decisions)
            }
        }
    }

    /// What every storage key starts with.
    pub(crate) fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// The failure policy of a call that names `policy` (or none).
    pub(super) fn policy(&self, policy: Option<FailurePolicy>) -> FailurePolicy {
        policy.unwrap_or(self.default_policy)
    }

    /// The denial cache's answers for the request's groups, when one of
    /// its enforcing limits is known to deny it (so the whole request is
    /// denied): `Some` for each group the cache knows.
    pub(super) fn known_denial(
        &self,
        groups: &Groups,
        requests: &[LimitRequest],
        now: Instant,
    ) -> Option<Vec<Option<Decision>>> {
        let cache = self.denials.as_deref()?;
        let known = |group: &Group| {
            cache
                .denial(&group.key, group.algorithm(requests), group.cost, now)
                .map(Decision::marked_local_cache)
        };
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
    pub(super) async fn complete_denial(
        &self,
        redis: &RedisStore,
        groups: &Groups,
        requests: &[LimitRequest],
        known: Vec<Option<Decision>>,
    ) -> Result<GroupDecisions, StoreError> {
        let unknown: Vec<usize> = (0..known.len()).filter(|&g| known[g].is_none()).collect();
        let asked = if unknown.is_empty() {
            Vec::new()
        } else {
            Box::pin(on_redis::answer_denied(redis, groups, requests, &unknown))
                .await
                .unwrap_or_else(|err| {
                    debug!(%err, "Redis cannot say what the other limits of a cached denial have");
                    unknown
                        .iter()
                        .map(|&g| failure::unknown_remaining(groups.unique[g].algorithm(requests)))
                        .collect()
                })
        };
        // `asked` has one answer per unknown group, in order.
        let mut asked = asked.into_iter();
        groups.decide(|g, _| {
            known[g].or_else(|| asked.next()).ok_or_else(|| {
                StoreError::Reply("a limit of a cached denial was not answered".into())
            })
        })
    }

    /// Keeps Redis's denials of `groups` (asked at `sent`) in the cache.
    pub(super) fn remember_denials(
        &self,
        groups: &Groups,
        requests: &[LimitRequest],
        decisions: &GroupDecisions,
        sent: Instant,
    ) {
        let Some(cache) = self.denials.as_deref() else {
            return;
        };
        for (group, decision) in groups.unique.iter().zip(decisions.by_group()) {
            if !decision.is_allowed() {
                let algorithm = group.algorithm(requests);
                cache.remember(&group.key, algorithm, group.cost, decision, sent);
            }
        }
    }
}

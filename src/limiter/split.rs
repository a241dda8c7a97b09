//! A call whose limits live on two Redis deployments: Envoy's rules whose
//! unit is second on the per-second Redis, the rest on the main one (see
//! [`Route`]). Each store decides its part as it would a call of its own;
//! each on its own needs nothing more. All or nothing spans the two in
//! turn: the per-second part first, all or nothing on its Redis; if it
//! denies, the main part spends nothing; else the main part, and if it
//! denies, the per-second part gives back what it spent. No limit admits
//! more than it allows, and a call denied by the main part held per-second
//! units only between its spend and its refund (whereas asking both at
//! once would let calls the per-second part denies fill the main part's
//! limits meanwhile). A cached denial of either part's limits denies the
//! call, as on one store.
//!
//! While one store cannot answer, the failure policy answers for its part
//! only, and the other part is decided on its own (a part the `local`
//! policy decided keeps what it spent if the other part denies).

use std::time::Instant;

use futures::future::join;
use tracing::debug;

use super::decisions::Limiter;
use super::failure;
use super::keys::{Combination, GroupDecisions, Groups, Route};
use super::on_redis::{self, Answers, Scripts};
use crate::algorithm::LimitRequest;
use crate::error::StoreError;
use crate::limit::{Decision, FailurePolicy};
use crate::store::RedisStore;

/// The requests one store decides, grouped on their own.
struct Part<'a> {
    redis: &'a RedisStore,
    requests: Vec<LimitRequest>,
    groups: Groups,
    /// Where each of `requests` is in the call.
    positions: Vec<usize>,
}

impl Part<'_> {
    /// Gives back what the part `spent` in a call denied elsewhere: its
    /// decisions after. A refund Redis cannot make is only logged: the
    /// call is denied either way, and the units come back with the window.
    async fn give_back(&self, spent: &Answers) -> Result<GroupDecisions, StoreError> {
        let scripts = Scripts::new(self.redis, &self.groups, &self.requests);
        let refunded = scripts.give_back(spent).await.unwrap_or_else(|err| {
            debug!(%err, "Redis cannot give back what a denied call spent");
            vec![false; self.groups.unique.len()]
        });
        scripts.after_refund(spent, &refunded)
    }

    /// The part's answers in a call denied by the other part: each limit's
    /// denial of its cost, or what it has; nothing spent.
    async fn denied_elsewhere(&self, limiter: &Limiter) -> Result<GroupDecisions, StoreError> {
        let unknown = vec![None; self.groups.unique.len()];
        limiter
            .complete_denial(self.redis, &self.groups, &self.requests, unknown)
            .await
    }

    /// Keeps Redis's denials of the part's limits in `limiter`'s cache.
    fn remember(&self, limiter: &Limiter, decisions: &GroupDecisions, sent: Instant) {
        limiter.remember_denials(&self.groups, &self.requests, decisions, sent);
    }
}

/// What each part decided, in the parts' order.
type Both = [GroupDecisions; 2];

impl Limiter {
    /// Decides `requests` (grouped as `groups`, each group routed as
    /// `by_group` says) on `stores`, the main Redis and the per-second one:
    /// one decision per request, in order.
    pub(super) async fn decide_split(
        &self,
        stores: [&RedisStore; 2],
        requests: &[LimitRequest],
        groups: &Groups,
        by_group: &[Route],
        policy: Option<FailurePolicy>,
        combination: Combination,
    ) -> Result<Vec<Decision>, StoreError> {
        let parts = self.parts(stores, requests, groups, by_group);
        let decided = match combination {
            Combination::Each => self.apart(&parts, policy, combination).await?,
            Combination::AllOrNothing => self.together(&parts, policy).await?,
        };
        let mut decisions = vec![None; requests.len()];
        for (part, decided) in parts.iter().zip(decided) {
            let answers = part.groups.per_request(decided);
            for (&position, decision) in part.positions.iter().zip(answers) {
                decisions[position] = Some(decision);
            }
        }
        decisions
            .into_iter()
            .map(|decision| {
                decision.ok_or_else(|| StoreError::Reply("a limit was left undecided".into()))
            })
            .collect()
    }

    /// The call's requests by store: the main store's part, then the
    /// per-second one's.
    fn parts<'s>(
        &self,
        stores: [&'s RedisStore; 2],
        requests: &[LimitRequest],
        groups: &Groups,
        by_group: &[Route],
    ) -> [Part<'s>; 2] {
        let route_of = |request: usize| {
            groups
                .group_of(request)
                .and_then(|g| by_group.get(g))
                .copied()
                .unwrap_or_default()
        };
        let part = |route: Route, redis: &'s RedisStore| {
            let positions: Vec<usize> = (0..requests.len())
                .filter(|&request| route_of(request) == route)
                .collect();
            let requests: Vec<LimitRequest> =
                positions.iter().map(|&i| requests[i].clone()).collect();
            Part {
                redis,
                groups: Groups::new(self.key_prefix(), &requests),
                requests,
                positions,
            }
        };
        [
            part(Route::Main, stores[0]),
            part(Route::PerSecond, stores[1]),
        ]
    }

    /// Each part decided on its own store, as a call of its own (the
    /// failure policy answering for a store that cannot).
    async fn apart(
        &self,
        parts: &[Part<'_>; 2],
        policy: Option<FailurePolicy>,
        combination: Combination,
    ) -> Result<Both, StoreError> {
        let [main, per_second] = parts;
        let (main, per_second) = join(
            Box::pin(self.decide_on_redis(
                main.redis,
                &main.groups,
                &main.requests,
                policy,
                combination,
            )),
            Box::pin(self.decide_on_redis(
                per_second.redis,
                &per_second.groups,
                &per_second.requests,
                policy,
                combination,
            )),
        )
        .await;
        Ok([main?, per_second?])
    }

    /// All or nothing across both stores: the per-second part first (all
    /// or nothing on its Redis); if it denies, the main part spends
    /// nothing (it says what each of its limits has, or its denial); else
    /// the main part, and if that denies (or cannot be decided), the
    /// per-second part gives back what it spent.
    async fn together(
        &self,
        parts: &[Part<'_>; 2],
        policy: Option<FailurePolicy>,
    ) -> Result<Both, StoreError> {
        // Taken before Redis is asked, as on one store.
        let sent = Instant::now();
        if let Some(denied) = self.cached_denial(parts, sent).await {
            return denied;
        }
        let [main, per_second] = parts;
        let first = match on_redis::decide_together(
            per_second.redis,
            &per_second.groups,
            &per_second.requests,
        )
        .await
        {
            Ok(first) => first,
            Err(err) if err.is_transient() => {
                return self.without_per_second(parts, err, policy).await;
            }
            Err(err) => return Err(err),
        };
        per_second.remember(self, &first.decisions, sent);
        let Some(spent) = first.spent else {
            let denied = Box::pin(main.denied_elsewhere(self)).await?;
            return Ok([denied, first.decisions]);
        };
        let second = match on_redis::decide_together(main.redis, &main.groups, &main.requests).await
        {
            Ok(second) => {
                main.remember(self, &second.decisions, sent);
                Ok(second.decisions)
            }
            Err(err) if err.is_transient() => failure::answer(
                err,
                self.policy(policy),
                self.local.as_deref(),
                &main.groups,
                &main.requests,
                Combination::AllOrNothing,
            ),
            Err(err) => Err(err),
        };
        let denied = second
            .as_ref()
            .map_or(true, |second| second.denies(&main.groups));
        let first = if denied {
            per_second.give_back(&spent).await?
        } else {
            first.decisions
        };
        Ok([second?, first])
    }

    /// The call while the per-second Redis cannot decide (`err`): the
    /// failure policy answers for its part; if that denies, the main part
    /// spends nothing, else it is decided on its own.
    async fn without_per_second(
        &self,
        parts: &[Part<'_>; 2],
        err: StoreError,
        policy: Option<FailurePolicy>,
    ) -> Result<Both, StoreError> {
        let [main, per_second] = parts;
        debug!(%err, "the per-second Redis cannot decide: the failure policy answers for its limits");
        let answered = failure::answer(
            err,
            self.policy(policy),
            self.local.as_deref(),
            &per_second.groups,
            &per_second.requests,
            Combination::AllOrNothing,
        )?;
        let main = if answered.denies(&per_second.groups) {
            Box::pin(main.denied_elsewhere(self)).await?
        } else {
            let (redis, groups, requests) = (main.redis, &main.groups, &main.requests);
            let combination = Combination::AllOrNothing;
            Box::pin(self.decide_on_redis(redis, groups, requests, policy, combination)).await?
        };
        Ok([main, answered])
    }

    /// When the denial cache knows a limit of either part denies the call:
    /// both parts' answers, as under a cached denial on one store (the
    /// limits the cache does not know asked on their store, writing
    /// nothing).
    async fn cached_denial(
        &self,
        parts: &[Part<'_>; 2],
        sent: Instant,
    ) -> Option<Result<Both, StoreError>> {
        let (hit, known) = parts.iter().enumerate().find_map(|(i, part)| {
            Some((i, self.known_denial(&part.groups, &part.requests, sent)?))
        })?;
        let mut knowledge = parts
            .each_ref()
            .map(|part| vec![None; part.groups.unique.len()]);
        knowledge[hit] = known;
        let [main_known, per_second_known] = knowledge;
        let [main, per_second] = parts;
        let (main, per_second) = join(
            Box::pin(self.complete_denial(main.redis, &main.groups, &main.requests, main_known)),
            Box::pin(self.complete_denial(
                per_second.redis,
                &per_second.groups,
                &per_second.requests,
                per_second_known,
            )),
        )
        .await;
        Some(main.and_then(|main| Ok([main, per_second?])))
    }
}

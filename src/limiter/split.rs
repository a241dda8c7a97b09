//! A call whose limits live on two Redis deployments: Envoy's rules whose
//! unit is second on the per-second Redis, the rest on the main one (see
//! [`Route`]). Each store decides its part as it would a call of its own;
//! each on its own needs nothing more. All or nothing spans the two as it
//! spans the nodes of a Redis Cluster (`on_redis`): both stores say what
//! they would answer, writing nothing; if a limit would deny, nothing is
//! spent; else both spend, and if one now denies (another call took the
//! units in between), the other gives back. A cached denial of either
//! part's limits denies the call, as on one store.
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
use super::on_redis::{Answers, Scripts};
use super::script::Mode;
use crate::error::StoreError;
use crate::limit::{Decision, FailurePolicy, LimitRequest};
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
    fn scripts(&self) -> Scripts<'_> {
        Scripts::new(self.redis, &self.groups, &self.requests)
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
        for (part, decided) in parts.iter().zip(&decided) {
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

    /// All or nothing across both stores.
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
        let scripts = [parts[0].scripts(), parts[1].scripts()];
        let dry = match join(scripts[0].run(Mode::Dry), scripts[1].run(Mode::Dry)).await {
            (Ok(main), Ok(per_second)) => [main, per_second],
            (main, per_second) => {
                for err in [main.err(), per_second.err()].into_iter().flatten() {
                    if !err.is_transient() {
                        return Err(err);
                    }
                }
                debug!("a store cannot answer: each part is decided on its own");
                return self.apart(parts, policy, Combination::AllOrNothing).await;
            }
        };
        let mut denies = false;
        for (part, dry) in parts.iter().zip(&dry) {
            denies |= dry.decisions(&part.groups)?.denies(&part.groups);
        }
        if denies {
            let (main, per_second) =
                join(scripts[0].run(Mode::Look), scripts[1].run(Mode::Look)).await;
            let decided = [
                scripts[0].nothing_spent(&dry[0], main)?,
                scripts[1].nothing_spent(&dry[1], per_second)?,
            ];
            for (part, decided) in parts.iter().zip(&decided) {
                self.remember_denials(&part.groups, &part.requests, decided, sent);
            }
            return Ok(decided);
        }
        let spent = join(scripts[0].run(Mode::Decide), scripts[1].run(Mode::Decide)).await;
        self.after_spending(parts, &scripts, [spent.0, spent.1], policy, sent)
            .await
    }

    /// The call after both stores were asked to spend: each part's
    /// decisions (the failure policy's for a store that failed as it
    /// spent), and if one of them denies, or the call fails, what the other
    /// spent given back.
    async fn after_spending(
        &self,
        parts: &[Part<'_>; 2],
        scripts: &[Scripts<'_>; 2],
        spent: [Result<Answers, StoreError>; 2],
        policy: Option<FailurePolicy>,
        sent: Instant,
    ) -> Result<Both, StoreError> {
        let mut answers: [Option<Answers>; 2] = [None, None];
        let mut decided: [Option<GroupDecisions>; 2] = [None, None];
        let mut failed = None;
        for (i, (part, spent)) in parts.iter().zip(spent).enumerate() {
            let decisions = match spent {
                Ok(spent) => {
                    let decisions = spent.decisions(&part.groups);
                    answers[i] = Some(spent);
                    decisions
                }
                Err(err) if err.is_transient() => failure::answer(
                    err,
                    self.policy(policy),
                    self.local.as_deref(),
                    &part.groups,
                    &part.requests,
                    Combination::AllOrNothing,
                ),
                Err(err) => Err(err),
            };
            match decisions {
                Ok(decisions) => decided[i] = Some(decisions),
                Err(err) => failed = failed.or(Some(err)),
            }
        }
        let denies = parts.iter().zip(&decided).any(|(part, decided)| {
            decided
                .as_ref()
                .is_some_and(|decided| decided.denies(&part.groups))
        });
        if failed.is_some() || denies {
            for (i, scripts) in scripts.iter().enumerate() {
                if let Some(spent) = &answers[i] {
                    let refunded = scripts.give_back(spent).await.unwrap_or_else(|err| {
                        debug!(%err, "Redis cannot give back what a denied call spent");
                        vec![false; parts[i].groups.unique.len()]
                    });
                    decided[i] = Some(scripts.after_refund(spent, &refunded)?);
                }
            }
        }
        if let Some(err) = failed {
            return Err(err);
        }
        for (i, part) in parts.iter().enumerate() {
            if let (Some(_), Some(decided)) = (&answers[i], &decided[i]) {
                self.remember_denials(&part.groups, &part.requests, decided, sent);
            }
        }
        match decided {
            [Some(main), Some(per_second)] => Ok([main, per_second]),
            _ => Err(StoreError::Reply(
                "a store's part was left undecided".into(),
            )),
        }
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

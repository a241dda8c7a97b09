//! One Envoy's quota stream: the buckets it subscribed to by reporting
//! them, each one's demand and last assignment, and what to send it after a
//! report, a nudge, or a look at the clock.
//!
//! Envoy 1.40 reports every bucket it holds every 5 s (whatever
//! `reporting_interval` says), each new bucket at once with a count of one
//! and no elapsed time, and takes assignments only for buckets it has
//! reported, under the exact `BucketId` it sent.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::Shared;
use super::assignment::{Assigned, time_to_live};
use crate::error::StoreError;
use crate::limit::FailurePolicy;
use crate::metrics;
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use crate::quota::{self, MicroRps, Share, ShareOp, ShareParams};
use crate::rules::quota::{QuotaDomain, QuotaLimit, QuotaPolicy, QuotaRate};

/// A demand is worked out only over at least this long: a report hard on
/// the heels of another says little about a rate.
const MIN_DEMAND_WINDOW: Duration = Duration::from_millis(100);

/// Ledger calls of one report in flight at once.
const SETTLE_CONCURRENCY: usize = 16;

/// What a share-or-not settles to, per bucket.
enum Plan {
    /// The policy decides alone (allow all, deny all).
    Fixed(Assigned),
    /// The ledger splits the policy's rate.
    Share(ShareParams, ShareOp, QuotaRate),
}

/// What settling one bucket came to.
struct Settled {
    key: String,
    /// What to tell the Envoy; `None`: nothing (the failure policy left it
    /// to its own fallbacks).
    assigned: Option<Assigned>,
    /// The share settled, if any (a shared rate, settled on the store or
    /// this instance's own ledger).
    share: Option<Share>,
    /// Whether the failure policy answered.
    degraded: bool,
}

/// One subscribed bucket.
struct Subscription {
    /// The `BucketId` as Envoy sent it, echoed in every action.
    bucket: HashMap<String, String>,
    /// The governing policy when last settled, for metrics and plans.
    policy: Arc<QuotaPolicy>,
    /// The domain of the stream, for metrics labels.
    domain: String,
    /// When Envoy last reported it.
    last_report: Instant,
    /// The last demand worked out; `None` while unknown.
    demand: Option<MicroRps>,
    /// The ledger's grant last settled (0 for fixed policies).
    grant: MicroRps,
    /// Whether the last settlement found others subscribed, or left it
    /// short of its fair share: then it settles again at every rebalance.
    contended: bool,
    /// What it was last told, and when.
    sent: Option<(Assigned, Instant)>,
    /// What the metrics count as assigned to it, in requests per second.
    counted_rate: f64,
    /// Whether the ledger holds an entry of it.
    in_ledger: bool,
}

impl Subscription {
    /// Whether what it was last told is `renew_after` old at `now`.
    fn renewal_due(&self, now: Instant, renew_after: Duration) -> bool {
        self.sent
            .is_some_and(|(_, at)| now.saturating_duration_since(at) >= renew_after)
    }
}

/// The state of one stream.
pub(super) struct QuotaStream {
    shared: Arc<Shared>,
    /// This stream's number on this instance.
    number: u64,
    /// Its subscriber id in the ledgers: instance and stream.
    subscriber: String,
    domain: Option<String>,
    /// By storage key.
    buckets: HashMap<String, Subscription>,
    nudges: mpsc::Sender<String>,
    /// The ignore reasons already logged for this stream (each once).
    warned: HashSet<&'static str>,
}

impl QuotaStream {
    pub(super) fn new(shared: Arc<Shared>, number: u64, nudges: mpsc::Sender<String>) -> Self {
        let subscriber = format!("{}:{number}", shared.instance);
        Self {
            shared,
            number,
            subscriber,
            domain: None,
            buckets: HashMap::new(),
            nudges,
            warned: HashSet::new(),
        }
    }

    /// Handles one message of reports: the actions to send back.
    pub(super) async fn on_reports(
        &mut self,
        reports: RateLimitQuotaUsageReports,
    ) -> Vec<BucketAction> {
        if !reports.domain.is_empty() {
            match &self.domain {
                None => self.domain = Some(reports.domain),
                Some(domain) if *domain != reports.domain => {
                    self.ignore("domain_changed", reports.bucket_quota_usages.len());
                    return Vec::new();
                }
                Some(_) => {}
            }
        }
        let Some(domain) = self.domain.clone() else {
            self.ignore("no_domain", reports.bucket_quota_usages.len());
            return Vec::new();
        };
        let rules = self.shared.rules.current();
        let Some(quota) = rules.quota(&domain) else {
            self.ignore("unknown_domain", reports.bucket_quota_usages.len());
            // A reload took the domain's policies away: the Envoy falls
            // back to its own no-assignment behaviour for these buckets.
            return self.abandon_all().await;
        };
        let now = Instant::now();
        let mut plans = Vec::with_capacity(reports.bucket_quota_usages.len());
        for usage in reports.bucket_quota_usages {
            if let Some(planned) = self.plan_report(&domain, quota, usage, now) {
                plans.push(planned);
            }
        }
        self.settle_and_act(plans, true).await
    }

    /// Settles `key` again on its last demand, another stream of this
    /// instance having changed the bucket's shares.
    pub(super) async fn on_nudge(&mut self, key: String) -> Vec<BucketAction> {
        let Some(subscription) = self.buckets.get(&key) else {
            return Vec::new();
        };
        let plan = self.plan(&subscription.policy, subscription.demand);
        self.settle_and_act(vec![(key, plan)], false).await
    }

    /// The periodic look: drops the buckets Envoy stopped reporting
    /// (freeing their shares, telling Envoy to abandon them), then settles
    /// again every contended bucket on its last demand, so that shares move
    /// between the Envoys of different instances within a rebalance
    /// interval rather than at each one's next report.
    pub(super) async fn tick(&mut self) -> Vec<BucketAction> {
        let timeout = self.shared.settings.subscriber_timeout;
        let silent: Vec<String> = self
            .buckets
            .iter()
            .filter(|(_, subscription)| subscription.last_report.elapsed() >= timeout)
            .map(|(key, _)| key.clone())
            .collect();
        let mut actions = self.drop_buckets(silent, true).await;
        // A reload reaches every bucket here, not only at its next report.
        let reloaded = self.follow_reload();
        // And every assignment by half-way through its time to live, should
        // the Envoy's reports come less often than that.
        let renew_after = self.shared.renew_after();
        let now = Instant::now();
        let plans: Vec<(String, Plan)> = self
            .buckets
            .iter()
            .filter(|(key, subscription)| {
                subscription.contended
                    || reloaded.contains(*key)
                    || subscription.renewal_due(now, renew_after)
            })
            .map(|(key, subscription)| {
                (
                    key.clone(),
                    self.plan(&subscription.policy, subscription.demand),
                )
            })
            .collect();
        if !plans.is_empty() {
            actions.extend(self.settle_and_act(plans, false).await);
        }
        actions
    }

    /// Moves every subscription whose governing policy a reload changed to
    /// the policy now in force; the keys of those moved. (A domain whose
    /// policies are gone is left to the next report, which abandons its
    /// buckets.)
    fn follow_reload(&mut self) -> HashSet<String> {
        let mut moved = HashSet::new();
        let Some(domain) = &self.domain else {
            return moved;
        };
        let rules = self.shared.rules.current();
        let Some(quota) = rules.quota(domain) else {
            return moved;
        };
        for (key, subscription) in &mut self.buckets {
            let policy = quota.find(&subscription.bucket);
            if **policy != *subscription.policy {
                recount_policy(subscription, policy.clone());
                moved.insert(key.clone());
            }
        }
        moved
    }

    /// The stream is over: frees every share (a closed stream's Envoy is
    /// gone, or will subscribe again on a new stream).
    pub(super) async fn leave_all(&mut self) {
        let keys = self.buckets.keys().cloned().collect();
        self.drop_buckets(keys, false).await;
    }

    /// The instance stops: the stream's subscriptions are forgotten here,
    /// but their grants stay in the ledger until they run out, since the
    /// Envoys keep enforcing them until their time to live.
    pub(super) fn forget_all(&mut self) {
        for (key, subscription) in self.buckets.drain() {
            self.shared.give_back_subscription();
            self.shared.nudges.unsubscribe(&key, self.number);
            uncount(&subscription);
        }
    }

    /// Every bucket abandoned, its share freed.
    async fn abandon_all(&mut self) -> Vec<BucketAction> {
        let keys = self.buckets.keys().cloned().collect();
        self.drop_buckets(keys, true).await
    }

    /// [`Self::drop_bucket`] for each of `keys`: the abandon actions.
    async fn drop_buckets(&mut self, keys: Vec<String>, abandon: bool) -> Vec<BucketAction> {
        let mut actions = Vec::new();
        for key in keys {
            if let Some(action) = self.drop_bucket(&key, abandon).await {
                actions.push(action);
            }
        }
        actions
    }

    /// Unsubscribes `key`, leaving its ledger; with `abandon`, the action
    /// that tells Envoy.
    async fn drop_bucket(&mut self, key: &str, abandon: bool) -> Option<BucketAction> {
        let subscription = self.buckets.remove(key)?;
        self.shared.give_back_subscription();
        self.shared.nudges.unsubscribe(key, self.number);
        if subscription.in_ledger {
            let leave = ShareParams::default();
            match self
                .shared
                .ledger
                .settle(key, &self.subscriber, ShareOp::Leave, &leave)
                .await
            {
                Ok(_) => self.shared.nudges.nudge(key, self.number),
                // Its entry runs out by itself after the lease.
                Err(err) => debug!(%err, key, "could not free a quota share"),
            }
        }
        uncount(&subscription);
        abandon.then(|| {
            metrics::quota_assignment(&subscription.domain, &subscription.policy.name, "abandon");
            BucketAction {
                bucket_id: Some(BucketId {
                    bucket: subscription.bucket,
                }),
                bucket_action: Some(bucket_action::BucketAction::AbandonAction(AbandonAction {})),
            }
        })
    }

    /// Checks one bucket's report, subscribes it if new, works out its
    /// demand, and plans what settles it.
    fn plan_report(
        &mut self,
        domain: &str,
        quota: &QuotaDomain,
        usage: BucketQuotaUsage,
        now: Instant,
    ) -> Option<(String, Plan)> {
        let bucket = match usage.bucket_id {
            Some(BucketId { bucket }) => bucket,
            None => HashMap::new(),
        };
        if let Err(reason) = self.check_bucket(&bucket) {
            self.ignore(reason, 1);
            return None;
        }
        let key = quota::bucket_key(&self.shared.settings.key_prefix, domain, &bucket);
        let policy = quota.find(&bucket).clone();
        let count = usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied);
        let capacity = match policy.limit {
            QuotaLimit::Rate(rate) => rate.micro_rps(),
            _ => 0,
        };
        // Envoy's measure of the time since its last report of the bucket
        // is cut to whole seconds; ours includes the network's jitter. The
        // longer of the two never overstates the rate by the cut.
        let reported_elapsed = usage
            .time_elapsed
            .and_then(|elapsed| Duration::try_from(elapsed).ok())
            .unwrap_or_default();
        let demand = match self.buckets.get_mut(&key) {
            Some(subscription) => {
                let elapsed = now
                    .saturating_duration_since(subscription.last_report)
                    .max(reported_elapsed);
                subscription.last_report = now;
                if elapsed >= MIN_DEMAND_WINDOW {
                    subscription.demand = Some(rate_of(count, elapsed, capacity));
                }
                if *policy != *subscription.policy {
                    recount_policy(subscription, policy.clone());
                }
                subscription.demand
            }
            None => {
                if self.buckets.len() >= self.shared.settings.max_buckets_per_stream
                    || !self.shared.take_subscription()
                {
                    self.ignore("too_many_buckets", 1);
                    return None;
                }
                // A bucket's first report on this stream: Envoy's first ever
                // (no elapsed time: demand unknown), or its periodic report
                // after a reconnect (its elapsed time is real).
                let demand = (reported_elapsed >= Duration::from_secs(1))
                    .then(|| rate_of(count, reported_elapsed, capacity));
                metrics::quota_subscribers(domain, &policy.name, 1.0);
                self.shared
                    .nudges
                    .subscribe(&key, self.number, &self.nudges);
                self.buckets.insert(
                    key.clone(),
                    Subscription {
                        bucket,
                        policy: policy.clone(),
                        domain: domain.to_owned(),
                        last_report: now,
                        demand,
                        grant: 0,
                        contended: false,
                        sent: None,
                        counted_rate: 0.0,
                        in_ledger: false,
                    },
                );
                demand
            }
        };
        metrics::quota_reported(
            domain,
            &policy.name,
            usage.num_requests_allowed,
            usage.num_requests_denied,
        );
        let plan = self.plan(&policy, demand);
        Some((key, plan))
    }

    /// What settles a bucket under `policy` with `demand`.
    fn plan(&self, policy: &QuotaPolicy, demand: Option<MicroRps>) -> Plan {
        let settings = &self.shared.settings;
        match policy.limit {
            QuotaLimit::AllowAll => Plan::Fixed(Assigned::AllowAll),
            QuotaLimit::DenyAll => Plan::Fixed(Assigned::DenyAll),
            QuotaLimit::Rate(rate) => {
                let capacity = rate.micro_rps();
                let params = ShareParams {
                    capacity,
                    headroom_permille: settings.headroom_permille,
                    // A quiet subscriber still asks for a hundredth, so it
                    // can pick up again without waiting for its report.
                    min_want: (capacity / 100).max(1),
                    lease_ms: duration_ms(settings.assignment_ttl + LEASE_MARGIN),
                    stale_ms: duration_ms(settings.subscriber_timeout),
                    hysteresis_permille: HYSTERESIS_PERMILLE,
                };
                Plan::Share(params, ShareOp::Report(demand), rate)
            }
        }
    }

    /// Settles every plan (the ledger calls concurrently), then works out
    /// what to send. `may_nudge_when_starved`: a settlement that leaves a
    /// subscriber short of its fair share asks this instance's other
    /// subscribers of the bucket to shrink now (not when nudged itself, so
    /// nudges cannot bounce; a shrink always nudges).
    async fn settle_and_act(
        &mut self,
        plans: Vec<(String, Plan)>,
        may_nudge_when_starved: bool,
    ) -> Vec<BucketAction> {
        let shared = self.shared.clone();
        let subscriber = self.subscriber.clone();
        let settled: Vec<Settled> = futures::stream::iter(plans.into_iter().map(|(key, plan)| {
            let shared = shared.clone();
            let subscriber = subscriber.clone();
            async move {
                match plan {
                    Plan::Fixed(assigned) => Settled {
                        key,
                        assigned: Some(assigned),
                        share: None,
                        degraded: false,
                    },
                    Plan::Share(params, op, rate) => {
                        let (answer, degraded) =
                            settle_or_fail(&shared, &key, &subscriber, op, &params).await;
                        match answer {
                            Ok(share) => Settled {
                                key,
                                assigned: Some(Assigned::share(share.grant, &rate)),
                                share: Some(share),
                                degraded,
                            },
                            Err(policy_answer) => Settled {
                                key,
                                assigned: policy_answer,
                                share: None,
                                degraded,
                            },
                        }
                    }
                }
            }
        }))
        .buffered(SETTLE_CONCURRENCY)
        .collect()
        .await;
        let now = Instant::now();
        let mut actions = Vec::new();
        for Settled {
            key,
            assigned,
            share,
            degraded,
        } in settled
        {
            let Some(subscription) = self.buckets.get_mut(&key) else {
                continue;
            };
            if degraded {
                metrics::quota_degraded(&subscription.domain, &subscription.policy.name);
            }
            if let Some(share) = share {
                let shrank = share.grant < subscription.grant;
                let starved = share.target > share.grant;
                subscription.grant = share.grant;
                subscription.contended = share.subscribers > 1 || starved;
                subscription.in_ledger = true;
                if shrank || (starved && may_nudge_when_starved) {
                    self.shared.nudges.nudge(&key, self.number);
                }
            }
            // The failure policy left the Envoy to its own fallbacks.
            let Some(assigned) = assigned else {
                continue;
            };
            let shadow = subscription.policy.shadow || self.shared.settings.shadow_mode;
            let counted = assigned.requests_per_second().unwrap_or(0.0);
            metrics::quota_assigned_rate(
                &subscription.domain,
                &subscription.policy.name,
                counted - subscription.counted_rate,
            );
            subscription.counted_rate = counted;
            let told = if shadow { Assigned::AllowAll } else { assigned };
            let renew_after = self.shared.renew_after();
            let changed = subscription.sent.is_none_or(|(sent, _)| sent != told);
            if !changed && !subscription.renewal_due(now, renew_after) {
                continue;
            }
            subscription.sent = Some((told, now));
            metrics::quota_assignment(&subscription.domain, &subscription.policy.name, told.kind());
            actions.push(BucketAction {
                bucket_id: Some(BucketId {
                    bucket: subscription.bucket.clone(),
                }),
                bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
                    QuotaAssignmentAction {
                        assignment_time_to_live: Some(time_to_live(
                            self.shared.settings.assignment_ttl,
                        )),
                        rate_limit_strategy: Some(told.to_strategy()),
                    },
                )),
            });
        }
        actions
    }

    /// Whether a `BucketId` is one Envoy could send and within bounds.
    fn check_bucket(&self, bucket: &HashMap<String, String>) -> Result<(), &'static str> {
        if bucket.is_empty() || bucket.iter().any(|(k, v)| k.is_empty() || v.is_empty()) {
            return Err("empty_bucket_id");
        }
        let bounds = &self.shared.settings;
        let too_long = bucket
            .iter()
            .any(|(k, v)| k.len() > bounds.max_entry_bytes || v.len() > bounds.max_entry_bytes);
        if bucket.len() > bounds.max_entries || too_long {
            return Err("bucket_id_too_large");
        }
        Ok(())
    }

    /// Counts `count` ignored bucket reports, logging the first of each
    /// reason on this stream.
    fn ignore(&mut self, reason: &'static str, count: usize) {
        metrics::quota_report_ignored(reason, count.max(1) as u64);
        if self.warned.insert(reason) {
            warn!(
                stream = %self.subscriber,
                domain = self.domain.as_deref().unwrap_or(""),
                reason,
                "quota reports ignored (logged once per stream and reason; counted in \
                 ratelimitd_quota_reports_ignored_total)"
            );
        }
    }
}

/// How long a grant counts beyond the assignment's time to live: the push
/// reaches the Envoy a moment after the ledger records it.
const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// A new grant within 5% of the one held keeps the one held.
const HYSTERESIS_PERMILLE: u64 = 50;

/// Settles on the ledger; when the store fails, the failure policy's
/// answer instead: `Err(Some(allow all))` open, `Err(None)` closed (the
/// Envoy's own fallbacks decide), or a share of this instance's own
/// ledger. With whether the failure policy answered.
async fn settle_or_fail(
    shared: &Shared,
    key: &str,
    subscriber: &str,
    op: ShareOp,
    params: &ShareParams,
) -> (Result<Share, Option<Assigned>>, bool) {
    let failed: StoreError = match shared.ledger.settle(key, subscriber, op, params).await {
        Ok(share) => return (Ok(share), false),
        Err(err) => err,
    };
    debug!(%failed, key, "quota share not settled; the failure policy answers");
    let answer = match shared.settings.failure_policy {
        FailurePolicy::FailOpen => Err(Some(Assigned::AllowAll)),
        FailurePolicy::FailClosed => Err(None),
        FailurePolicy::Local => match &shared.local {
            Some(local) => local
                .settle(key, subscriber, op, params)
                .await
                .map_err(|_| None),
            None => Err(None),
        },
    };
    (answer, true)
}

/// `count` requests over `elapsed` as µrps, at most four times the
/// capacity (more says nothing more, and keeps the ledger's arithmetic
/// exact).
fn rate_of(count: u64, elapsed: Duration, capacity: MicroRps) -> MicroRps {
    let micros = elapsed.as_micros().max(1);
    let rate = u128::from(count) * 1_000_000_000_000 / micros;
    u64::try_from(rate)
        .unwrap_or(u64::MAX)
        .min(capacity.saturating_mul(4))
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Takes a subscription out of the metrics.
fn uncount(subscription: &Subscription) {
    metrics::quota_subscribers(&subscription.domain, &subscription.policy.name, -1.0);
    metrics::quota_assigned_rate(
        &subscription.domain,
        &subscription.policy.name,
        -subscription.counted_rate,
    );
}

/// Moves a subscription's metrics to the policy that now governs it.
fn recount_policy(subscription: &mut Subscription, policy: Arc<QuotaPolicy>) {
    uncount(subscription);
    subscription.counted_rate = 0.0;
    subscription.policy = policy;
    metrics::quota_subscribers(&subscription.domain, &subscription.policy.name, 1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_is_a_rate_capped_at_four_capacities() {
        assert_eq!(
            rate_of(500, Duration::from_secs(5), 1_000_000_000),
            100_000_000
        );
        assert_eq!(rate_of(u64::MAX, Duration::from_secs(5), 100), 400);
        assert_eq!(rate_of(10, Duration::ZERO, 1_000_000_000), 4_000_000_000);
    }
}

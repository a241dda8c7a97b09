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

use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::assignment::{Assigned, time_to_live};
use super::settle::{self, Plan, Settled};
use super::shared::Shared;
use super::subscription::{Subscription, rate_of};
use crate::metrics;
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use crate::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use crate::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use crate::quota::{self, ShareOp, ShareParams};
use crate::rules::quota::{QuotaDomain, QuotaLimit};

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
        let subscriber = format!("{}:{number}", shared.roster.instance());
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
        let plan = settle::plan(
            &self.shared.settings,
            &subscription.policy,
            subscription.demand,
        );
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
                let plan = settle::plan(
                    &self.shared.settings,
                    &subscription.policy,
                    subscription.demand,
                );
                (key.clone(), plan)
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
                subscription.recount_policy(policy.clone());
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
    /// but their grants stay in the ledger, since the Envoys keep enforcing
    /// them until they reconnect elsewhere; once this one's beat has run
    /// out (`instances`), the other instances release them when as many
    /// Envoys have subscribed again, or when their leases run out.
    pub(super) fn forget_all(&mut self) {
        for (key, subscription) in self.buckets.drain() {
            self.shared.give_back_subscription();
            self.shared.nudges.unsubscribe(&key, self.number);
            subscription.uncount();
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
            let dead = self.shared.dead_instances();
            match self
                .shared
                .ledger
                .settle(key, &self.subscriber, ShareOp::Leave, &leave, &dead)
                .await
            {
                Ok(_) => self.shared.nudge(key, self.number),
                // Its entry runs out by itself after the lease.
                Err(err) => debug!(%err, key, "could not free a quota share"),
            }
        }
        subscription.uncount();
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
                subscription.reported(now, count, reported_elapsed, capacity, &policy)
            }
            None => {
                if !self.may_subscribe() {
                    return None;
                }
                // A bucket's first report on this stream: Envoy's first ever
                // (no elapsed time: demand unknown), or its periodic report
                // after a reconnect (its elapsed time is real).
                let demand = (reported_elapsed >= Duration::from_secs(1))
                    .then(|| rate_of(count, reported_elapsed, capacity));
                self.shared
                    .nudges
                    .subscribe(&key, self.number, &self.nudges);
                let subscription = Subscription::new(bucket, policy.clone(), domain, now, demand);
                self.buckets.insert(key.clone(), subscription);
                demand
            }
        };
        metrics::quota_reported(
            domain,
            &policy.name,
            usage.num_requests_allowed,
            usage.num_requests_denied,
        );
        let plan = settle::plan(&self.shared.settings, &policy, demand);
        Some((key, plan))
    }

    /// Whether the stream may subscribe to one more bucket: within its own
    /// bound and the instance's (whose subscription it then holds). A
    /// report it may not is ignored.
    fn may_subscribe(&mut self) -> bool {
        if self.buckets.len() >= self.shared.settings.max_buckets_per_stream
            || !self.shared.take_subscription()
        {
            self.ignore("too_many_buckets", 1);
            return false;
        }
        true
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
        let settled = settle::settle_all(&self.shared, &self.subscriber, plans).await;
        let now = Instant::now();
        settled
            .into_iter()
            .filter_map(|settled| self.act(settled, now, may_nudge_when_starved))
            .collect()
    }

    /// Takes in what settling one bucket came to: its share and metrics,
    /// and the assignment to send when what its Envoy was told changes or
    /// is due for renewal.
    fn act(
        &mut self,
        settled: Settled,
        now: Instant,
        may_nudge_when_starved: bool,
    ) -> Option<BucketAction> {
        let Settled {
            key,
            assigned,
            share,
            degraded,
        } = settled;
        let subscription = self.buckets.get_mut(&key)?;
        if degraded {
            metrics::quota_degraded(&subscription.domain, &subscription.policy.name);
        }
        if let Some(share) = share {
            let (shrank, starved) = subscription.record_share(&share);
            if shrank || (starved && may_nudge_when_starved) {
                self.shared.nudge(&key, self.number);
            }
        }
        // `None`: the failure policy left the Envoy to its own fallbacks.
        let assigned = assigned?;
        let shadow = subscription.policy.shadow || self.shared.settings.shadow_mode;
        subscription.count_assigned(&assigned);
        let told = if shadow { Assigned::AllowAll } else { assigned };
        let renew_after = self.shared.renew_after();
        let changed = subscription.sent.is_none_or(|(sent, _)| sent != told);
        if !changed && !subscription.renewal_due(now, renew_after) {
            return None;
        }
        subscription.sent = Some((told, now));
        metrics::quota_assignment(&subscription.domain, &subscription.policy.name, told.kind());
        Some(BucketAction {
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
        })
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

//! One bucket a stream subscribed to by reporting it: the demand worked
//! out from its reports, what the ledger granted it, what its Envoy was
//! last told, and its part of the metrics.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::assignment::Assigned;
use crate::metrics;
use crate::quota::{MicroRps, Share};
use crate::rules::quota::QuotaPolicy;

/// A demand is worked out only over at least this long: a report hard on
/// the heels of another says little about a rate.
const MIN_DEMAND_WINDOW: Duration = Duration::from_millis(100);

/// One subscribed bucket.
pub(super) struct Subscription {
    /// The `BucketId` as Envoy sent it, echoed in every action.
    pub(super) bucket: HashMap<String, String>,
    /// The governing policy when last settled, for metrics and plans.
    pub(super) policy: Arc<QuotaPolicy>,
    /// The domain of the stream, for metrics labels.
    pub(super) domain: String,
    /// When Envoy last reported it.
    pub(super) last_report: Instant,
    /// The last demand worked out; `None` while unknown.
    pub(super) demand: Option<MicroRps>,
    /// The ledger's grant last settled (0 for fixed policies).
    grant: MicroRps,
    /// Whether the last settlement found others subscribed, or left it
    /// short of its fair share: then it settles again at every rebalance.
    pub(super) contended: bool,
    /// What it was last told, and when.
    pub(super) sent: Option<(Assigned, Instant)>,
    /// What the metrics count as assigned to it, in requests per second.
    counted_rate: f64,
    /// Whether the ledger holds an entry of it.
    pub(super) in_ledger: bool,
}

impl Subscription {
    /// A bucket's first report on this stream, at `now`, under `policy`:
    /// counted among the subscribers in the metrics.
    pub(super) fn new(
        bucket: HashMap<String, String>,
        policy: Arc<QuotaPolicy>,
        domain: &str,
        now: Instant,
        demand: Option<MicroRps>,
    ) -> Self {
        metrics::quota_subscribers(domain, &policy.name, 1.0);
        Self {
            bucket,
            policy,
            domain: domain.to_owned(),
            last_report: now,
            demand,
            grant: 0,
            contended: false,
            sent: None,
            counted_rate: 0.0,
            in_ledger: false,
        }
    }

    /// Takes in a later report at `now` of `count` requests, over what
    /// Envoy says has elapsed since its last (`reported_elapsed`), under
    /// `policy`: the demand, worked out again if long enough has passed.
    pub(super) fn reported(
        &mut self,
        now: Instant,
        count: u64,
        reported_elapsed: Duration,
        capacity: MicroRps,
        policy: &Arc<QuotaPolicy>,
    ) -> Option<MicroRps> {
        let elapsed = now
            .saturating_duration_since(self.last_report)
            .max(reported_elapsed);
        self.last_report = now;
        if elapsed >= MIN_DEMAND_WINDOW {
            self.demand = Some(rate_of(count, elapsed, capacity));
        }
        if **policy != *self.policy {
            self.recount_policy(policy.clone());
        }
        self.demand
    }

    /// Whether what it was last told is `renew_after` old at `now`.
    pub(super) fn renewal_due(&self, now: Instant, renew_after: Duration) -> bool {
        self.sent
            .is_some_and(|(_, at)| now.saturating_duration_since(at) >= renew_after)
    }

    /// Takes in a share the ledger settled: whether its grant shrank, and
    /// whether it is short of its fair share.
    pub(super) fn record_share(&mut self, share: &Share) -> (bool, bool) {
        let shrank = share.grant < self.grant;
        let starved = share.target > share.grant;
        self.grant = share.grant;
        self.contended = share.subscribers > 1 || starved;
        self.in_ledger = true;
        (shrank, starved)
    }

    /// Counts `assigned` in the metrics in place of what was assigned.
    pub(super) fn count_assigned(&mut self, assigned: &Assigned) {
        let counted = assigned.requests_per_second().unwrap_or(0.0);
        metrics::quota_assigned_rate(&self.domain, &self.policy.name, counted - self.counted_rate);
        self.counted_rate = counted;
    }

    /// Takes the subscription out of the metrics.
    pub(super) fn uncount(&self) {
        metrics::quota_subscribers(&self.domain, &self.policy.name, -1.0);
        metrics::quota_assigned_rate(&self.domain, &self.policy.name, -self.counted_rate);
    }

    /// Moves the subscription's metrics to the policy that now governs it.
    pub(super) fn recount_policy(&mut self, policy: Arc<QuotaPolicy>) {
        self.uncount();
        self.counted_rate = 0.0;
        self.policy = policy;
        metrics::quota_subscribers(&self.domain, &self.policy.name, 1.0);
    }
}

/// `count` requests over `elapsed` as µrps, at most four times the
/// capacity (more says nothing more, and keeps the ledger's arithmetic
/// exact).
pub(super) fn rate_of(count: u64, elapsed: Duration, capacity: MicroRps) -> MicroRps {
    let micros = elapsed.as_micros().max(1);
    let rate = u128::from(count) * 1_000_000_000_000 / micros;
    u64::try_from(rate)
        .unwrap_or(u64::MAX)
        .min(capacity.saturating_mul(4))
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

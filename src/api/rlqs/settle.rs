//! Settling a stream's buckets: what settles each (its policy alone, or a
//! share of its rate on the ledger), one report's ledger calls run
//! together, and the failure policy's answer while the store cannot.

use std::time::Duration;

use futures::StreamExt;
use tracing::debug;

use super::assignment::Assigned;
use super::options::QuotaSettings;
use super::shared::Shared;
use crate::error::StoreError;
use crate::limit::FailurePolicy;
use crate::quota::{MicroRps, Share, ShareOp, ShareParams};
use crate::rules::quota::{QuotaLimit, QuotaPolicy, QuotaRate};

/// Ledger calls of one report in flight at once.
const SETTLE_CONCURRENCY: usize = 16;

/// How long a grant counts beyond the assignment's time to live: the push
/// reaches the Envoy a moment after the ledger records it.
const LEASE_MARGIN: Duration = Duration::from_secs(1);

/// A new grant within 5% of the one held keeps the one held.
const HYSTERESIS_PERMILLE: u64 = 50;

/// What a share-or-not settles to, per bucket.
pub(super) enum Plan {
    /// The policy decides alone (allow all, deny all).
    Fixed(Assigned),
    /// The ledger splits the policy's rate.
    Share(ShareParams, ShareOp, QuotaRate),
}

/// What settling one bucket came to.
pub(super) struct Settled {
    pub(super) key: String,
    /// What to tell the Envoy; `None`: nothing (the failure policy left it
    /// to its own fallbacks).
    pub(super) assigned: Option<Assigned>,
    /// The share settled, if any (a shared rate, settled on the store or
    /// this instance's own ledger).
    pub(super) share: Option<Share>,
    /// Whether the failure policy answered.
    pub(super) degraded: bool,
}

/// What settles a bucket under `policy` with `demand`.
pub(super) fn plan(
    settings: &QuotaSettings,
    policy: &QuotaPolicy,
    demand: Option<MicroRps>,
) -> Plan {
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

/// Settles every plan for `subscriber`, the ledger calls concurrently; in
/// the plans' order.
pub(super) async fn settle_all(
    shared: &Shared,
    subscriber: &str,
    plans: Vec<(String, Plan)>,
) -> Vec<Settled> {
    futures::stream::iter(plans)
        .map(|(key, plan)| settle(shared, subscriber, key, plan))
        .buffered(SETTLE_CONCURRENCY)
        .collect()
        .await
}

/// Settles one bucket's plan.
async fn settle(shared: &Shared, subscriber: &str, key: String, plan: Plan) -> Settled {
    match plan {
        Plan::Fixed(assigned) => Settled {
            key,
            assigned: Some(assigned),
            share: None,
            degraded: false,
        },
        Plan::Share(params, op, rate) => {
            let (answer, degraded) = settle_or_fail(shared, &key, subscriber, op, &params).await;
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
    let dead = shared.dead_instances();
    let failed: StoreError = match shared
        .ledger
        .settle(key, subscriber, op, params, &dead)
        .await
    {
        Ok(share) => return (Ok(share), false),
        Err(err) => err,
    };
    debug!(%failed, key, "quota share not settled; the failure policy answers");
    let answer = match shared.settings.failure_policy {
        FailurePolicy::FailOpen => Err(Some(Assigned::AllowAll)),
        FailurePolicy::FailClosed => Err(None),
        FailurePolicy::Local => match &shared.local {
            Some(local) => local
                .settle(key, subscriber, op, params, &[])
                .await
                .map_err(|_| None),
            None => Err(None),
        },
    };
    (answer, true)
}

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

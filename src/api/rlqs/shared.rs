//! What every quota stream of the service shares: the ledgers, the rules,
//! the settings, this instance's subscriptions and nudges, and what it
//! knows of the other instances.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tracing::debug;

use super::nudges::Nudges;
use super::options::QuotaSettings;
use crate::quota::QuotaLedger;
use crate::quota::presence::{Presence, Roster};
use crate::rules::RulesHandle;
use crate::telemetry::WarnThrottle;

/// What every stream of the service shares.
pub(super) struct Shared {
    pub(super) ledger: QuotaLedger,
    /// This instance's own ledger, for the `local` failure policy.
    pub(super) local: Option<QuotaLedger>,
    pub(super) rules: RulesHandle,
    pub(super) settings: QuotaSettings,
    /// Names this instance's subscribers apart from other instances', and
    /// knows the dead ones (shared with the lease streams).
    pub(super) roster: Arc<Roster>,
    pub(super) next_stream: AtomicU64,
    /// Subscriptions held by all streams, at most `max_buckets`.
    pub(super) subscriptions: AtomicUsize,
    pub(super) nudges: Nudges,
    /// This instance's beat and nudges on a shared Redis (none on the
    /// embedded store: one process, one instance).
    pub(super) presence: Option<Presence>,
    /// Turns true when the server shuts down.
    pub(super) shutdown: watch::Receiver<bool>,
    /// Throttles the warning of a report over `max_report_bytes`.
    pub(super) too_large: WarnThrottle,
}

impl Shared {
    /// How old an assignment may be before it is sent again: half its time
    /// to live, less one rebalance interval. The rebalance tick is what
    /// renews, so an assignment that is not yet due at one tick must still
    /// be sent by half its life at the next; with a time to live of only two
    /// intervals, that is every tick.
    pub(super) fn renew_after(&self) -> Duration {
        (self.settings.assignment_ttl / 2).saturating_sub(self.settings.rebalance_interval)
    }

    /// Takes one of the instance's subscriptions, if any is left.
    pub(super) fn take_subscription(&self) -> bool {
        self.subscriptions
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held < self.settings.max_buckets).then_some(held + 1)
            })
            .is_ok()
    }

    /// The instances found dead at the last beat.
    pub(super) fn dead_instances(&self) -> Arc<[String]> {
        self.roster.dead()
    }

    /// Asks every other stream subscribed to `key`, on this instance at
    /// once and on the others at their next beat, to settle it again.
    pub(super) fn nudge(&self, key: &str, from: u64) {
        self.nudges.nudge(key, from);
        if let Some(presence) = &self.presence {
            let (presence, key) = (presence.clone(), key.to_owned());
            // Not awaited: a stream does not wait on the others; a nudge
            // lost is made up for at the others' next report.
            tokio::spawn(async move {
                if let Err(err) = presence.nudge(&key).await {
                    debug!(%err, key, "could not nudge the other instances");
                }
            });
        }
    }

    /// Gives one back.
    pub(super) fn give_back_subscription(&self) {
        self.subscriptions.fetch_sub(1, Ordering::Relaxed);
    }
}

//! Whether this instance should get traffic, kept in one place (`Health`)
//! that `grpc.health.v1.Health` and the HTTP `/healthcheck` both follow.
//! It is serving only while all hold: every store answers (the main one,
//! and the per-second Redis when there is one; or the failure
//! policy answers without it; or, with `--health-follows-store=false`,
//! every store has answered once since start), the gRPC port is open, the rules are loaded
//! when health requires them, and shutdown has not begun. So load
//! balancers and Kubernetes take an instance whose Redis is gone out of
//! rotation and back in when it returns, and out at the first moment of
//! shutdown.

use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use tokio::sync::watch;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

use crate::limiter::Store;
use crate::rules::Loads;

/// The health service names we report: the whole server (`""`) and each API.
pub const SERVICE_NAMES: [&str; 5] = [
    "",
    "ratelimitd.v1.RateLimiter",
    "ratelimitd.v1.Leases",
    "envoy.service.ratelimit.v3.RateLimitService",
    "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
];

/// What health is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct State {
    /// The store answers, or the failure policy answers without it.
    pub store: bool,
    /// Rules are in force, or health does not require them.
    pub rules: bool,
    /// The gRPC port accepts calls (opened, and not yet closing).
    pub open: bool,
    /// Shutdown has begun: never serving again.
    pub stopping: bool,
}

impl State {
    /// Serving: every part holds.
    pub(crate) fn serving(self) -> bool {
        self.store && self.rules && self.open && !self.stopping
    }
}

/// The one health state; clones share it.
#[derive(Clone)]
pub(crate) struct Health {
    state: Arc<watch::Sender<State>>,
    requires_rules: bool,
}

impl Health {
    /// Not serving: the store is not yet seen to answer, the port not yet
    /// open. With `requires_rules`, rules must be in force too.
    pub(crate) fn new(requires_rules: bool) -> Self {
        let state = State {
            store: false,
            rules: !requires_rules,
            open: false,
            stopping: false,
        };
        Self {
            state: Arc::new(watch::Sender::new(state)),
            requires_rules,
        }
    }

    /// Serving now?
    pub(crate) fn serving(&self) -> bool {
        self.state.borrow().serving()
    }

    /// Each part of health now.
    pub(crate) fn state(&self) -> State {
        *self.state.borrow()
    }

    /// Is the gRPC port open? What `/json` asks before deciding, so that
    /// it answers only when gRPC would.
    pub(crate) fn is_open(&self) -> bool {
        self.state.borrow().open
    }

    /// The state, told again at each change.
    pub(crate) fn subscribe(&self) -> watch::Receiver<State> {
        self.state.subscribe()
    }

    fn update(&self, change: impl FnOnce(&mut State)) {
        self.state.send_if_modified(|state| {
            let before = *state;
            change(state);
            *state != before
        });
    }

    /// The store answers (or the failure policy does without it), or not.
    pub(crate) fn set_store(&self, answers: bool) {
        self.update(|state| state.store = answers);
    }

    /// Rules are in force, or not (counts only when health requires them).
    pub(crate) fn set_rules(&self, in_force: bool) {
        let requires = self.requires_rules;
        self.update(|state| state.rules = in_force || !requires);
    }

    /// The gRPC port accepts calls.
    pub(crate) fn opened(&self) {
        self.update(|state| state.open = true);
    }

    /// The gRPC port stops taking calls (shutdown, after its delay).
    pub(crate) fn closed(&self) {
        self.update(|state| state.open = false);
    }

    /// Shutdown has begun: not serving, for good.
    pub(crate) fn stop(&self) {
        self.update(|state| state.stopping = true);
    }
}

/// Sets every name in [`SERVICE_NAMES`] to `status`.
pub(crate) async fn report(reporter: &HealthReporter, status: ServingStatus) {
    for name in SERVICE_NAMES {
        reporter.set_service_status(name, status).await;
    }
}

/// Tells `reporter` (gRPC health) each change of `health`, until it has
/// told the first state of shutdown: then returns, so that whoever awaits
/// this task knows gRPC health says NOT_SERVING.
pub(crate) async fn follow_in_grpc(health: Health, reporter: HealthReporter) {
    let mut state = health.subscribe();
    loop {
        let now = *state.borrow_and_update();
        let status = if now.serving() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        report(&reporter, status).await;
        if now.stopping || state.changed().await.is_err() {
            return;
        }
    }
}

/// Follows what the rules source loads: health's rules part is whether
/// rules are in force. Runs as a task; the server aborts it at shutdown.
pub(crate) async fn follow_rules(health: Health, mut loads: watch::Receiver<Loads>) {
    loop {
        let in_force = loads.borrow_and_update().in_force;
        health.set_rules(in_force);
        if loads.changed().await.is_err() {
            return;
        }
    }
}

/// What health's store part does while a store does not answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WhileDown {
    /// Down: NOT_SERVING until every store answers again.
    NotServing,
    /// Up: the failure policy answers without the store.
    PolicyAnswers,
    /// Unchanged: health follows the stores only until they first answer
    /// (`--health-follows-store=false`, as envoyproxy/ratelimit without
    /// `REDIS_HEALTH_CHECK_ACTIVE_CONNECTION`), so a liveness probe on
    /// health does not restart the instance over a Redis outage.
    Unfollowed,
}

/// Probes `stores` every `interval` for ever (all at once: the main one,
/// and the per-second Redis when there is one), setting health's store
/// part at each change of state: up while every one answers, and while
/// one does not as `while_down` says (the probe logs either way). Runs as
/// a task; the server aborts it at shutdown.
pub(crate) async fn watch(
    stores: Vec<Store>,
    health: Health,
    interval: Duration,
    while_down: WhileDown,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut serving: Option<bool> = None;
    loop {
        tick.tick().await;
        stores.iter().for_each(Store::report_pool);
        let results = join_all(stores.iter().map(Store::ping)).await;
        let failed = stores
            .iter()
            .zip(results)
            .find_map(|(store, result)| result.err().map(|reason| (store, reason)));
        let now_serving = failed.is_none();
        if serving == Some(now_serving) {
            continue;
        }
        match (failed, while_down) {
            (None, _) => {
                info!(stores = stores.len(), "store answers");
                health.set_store(true);
            }
            (Some((store, reason)), WhileDown::PolicyAnswers) => {
                warn!(store = store.label(), %reason, "store does not answer: the failure policy answers; health stays up");
                health.set_store(true);
            }
            (Some((store, reason)), WhileDown::Unfollowed) => {
                warn!(store = store.label(), %reason, "store does not answer: health does not follow it (--health-follows-store=false)");
            }
            (Some((store, reason)), WhileDown::NotServing) => {
                warn!(store = store.label(), %reason, "store does not answer: health NOT_SERVING");
                health.set_store(false);
            }
        }
        serving = Some(now_serving);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_needs_every_part_and_stopping_is_for_good() {
        let health = Health::new(true);
        assert!(!health.serving());
        health.set_store(true);
        health.opened();
        assert!(!health.serving(), "rules required");
        health.set_rules(true);
        assert!(health.serving());
        health.set_store(false);
        assert!(!health.serving());
        health.set_store(true);
        health.stop();
        assert!(!health.serving());
        health.set_rules(true);
        assert!(!health.serving());
        let relaxed = Health::new(false);
        relaxed.set_store(true);
        relaxed.opened();
        relaxed.set_rules(false);
        assert!(relaxed.serving(), "rules not required");
        assert!(relaxed.is_open());
        relaxed.stop();
        assert!(relaxed.is_open(), "open through the shutdown delay");
        relaxed.closed();
        assert!(!relaxed.is_open());
    }
}

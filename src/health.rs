//! Keeps `grpc.health.v1.Health` truthful: SERVING only while every store
//! answers (the main one, and the per-second Redis when there is one),
//! checked every interval, so load balancers and Kubernetes take an
//! instance whose Redis is gone out of rotation and back in when it
//! returns.

use std::time::Duration;

use futures::future::join_all;

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;
use tracing::{info, warn};

use crate::limiter::Store;

/// The health service names we report: the whole server (`""`) and each API.
pub const SERVICE_NAMES: [&str; 4] = [
    "",
    "ratelimitd.v1.RateLimiter",
    "envoy.service.ratelimit.v3.RateLimitService",
    "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
];

/// Sets every name in [`SERVICE_NAMES`] to `status`.
pub async fn report(reporter: &HealthReporter, status: ServingStatus) {
    for name in SERVICE_NAMES {
        reporter.set_service_status(name, status).await;
    }
}

/// Probes `stores` every `interval` for ever (all at once), reporting
/// each change of state: SERVING while every one answers. With
/// `serves_without_store` (a failure policy that answers while Redis is
/// down) the instance stays SERVING, and the probe only logs. Runs as a
/// task; the server aborts it at shutdown.
pub async fn watch(
    stores: Vec<Store>,
    reporter: HealthReporter,
    interval: Duration,
    serves_without_store: bool,
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
        match failed {
            None => {
                info!(stores = stores.len(), "store answers: health SERVING");
                report(&reporter, ServingStatus::Serving).await;
            }
            Some((store, reason)) if serves_without_store => {
                warn!(store = store.label(), %reason, "store does not answer: the failure policy answers; health stays SERVING");
                report(&reporter, ServingStatus::Serving).await;
            }
            Some((store, reason)) => {
                warn!(store = store.label(), %reason, "store does not answer: health NOT_SERVING");
                report(&reporter, ServingStatus::NotServing).await;
            }
        }
        serving = Some(now_serving);
    }
}

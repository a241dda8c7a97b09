//! Prometheus metrics, off unless `--metrics-listen` (or the debug
//! listener, `--debug-listen`) names an address.
//! Every `ratelimitd_*` metric's name and labels live here, so what is
//! exported is read in one place. Labels stay bounded: APIs, algorithms,
//! outcomes, error kinds and configured Envoy domains, never a caller's key
//! or a descriptor's value. envoyproxy/ratelimit's statistics are served
//! beside them under the names a statsd_exporter mapping gives them
//! ([`crate::stats`]). Without the exporter the `metrics` macros record
//! into nothing.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Counter, Gauge, counter, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use crate::algorithm::registry::Kind;
use crate::error::StoreError;
use crate::limit::Decision;

/// statsd_exporter's summary quantiles, for the upstream statistics a
/// mapping makes summaries of.
const QUANTILES: [f64; 3] = [0.5, 0.9, 0.99];

/// A histogram's buckets by name: whole (`Full`) or by its start.
pub(crate) type Buckets = Vec<(Matcher, Vec<f64>)>;

/// Installs the recorder, serving `/metrics` on `listen` when given, with
/// `histograms` (the upstream statistics' histograms a mapping names)
/// bucketed as given; the handle renders the same text (the debug
/// listener's `/metrics`). Call once, inside the tokio runtime, before
/// anything is counted.
pub(crate) fn install(
    listen: Option<SocketAddr>,
    histograms: Buckets,
) -> Result<PrometheusHandle, BuildError> {
    let mut builder = PrometheusBuilder::new()
        .set_quantiles(&QUANTILES)?
        .set_buckets_for_metric(
            Matcher::Full("ratelimitd_redis_command_seconds".into()),
            &[
                0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
            ],
        )?
        .set_buckets_for_metric(
            Matcher::Full("ratelimitd_redis_batch_size".into()),
            &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0],
        )?;
    for (matcher, buckets) in histograms {
        builder = builder.set_buckets_for_metric(matcher, &buckets)?;
    }
    let recorder = match listen {
        Some(listen) => {
            tracing::info!(%listen, "serving Prometheus metrics at /metrics");
            // Builds the exporter, and spawns the recorder's upkeep.
            let (recorder, exporter) = builder.with_http_listener(listen).build()?;
            tokio::spawn(exporter);
            recorder
        }
        None => {
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    handle.run_upkeep();
                }
            });
            recorder
        }
    };
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)?;
    export_fixed_zeros();
    Ok(handle)
}

/// The kinds of Redis error, as `ratelimitd_redis_errors_total` labels them.
const REDIS_ERROR_KINDS: [&str; 5] = ["timeout", "unavailable", "circuit_open", "reply", "config"];

/// Why bucket reports are ignored (`ratelimitd_quota_reports_ignored_total`).
const IGNORED_REASONS: [&str; 6] = [
    "no_domain",
    "domain_changed",
    "unknown_domain",
    "empty_bucket_id",
    "bucket_id_too_large",
    "too_many_buckets",
];

/// The kinds of quota assignment (`ratelimitd_quota_assignments_total`).
const ASSIGNMENT_KINDS: [&str; 4] = ["token_bucket", "allow_all", "deny_all", "abandon"];

/// Every counter whose labels are known before anything happens, at 0, so
/// that `rate()` and `increase()` see its first increment. (A series that
/// first appears at 1 shows no increase.)
fn export_fixed_zeros() {
    let decisions = APIS.map(|api| {
        Kind::ALL.map(|algorithm| {
            OUTCOMES.map(|outcome| {
                let counter = counter!(
                    "ratelimitd_decisions_total",
                    "api" => api.label(),
                    "algorithm" => algorithm.name(),
                    "outcome" => outcome
                );
                counter.absolute(0);
                counter
            })
        })
    });
    let in_flight = gauge!("ratelimitd_requests_in_flight");
    // Installed once: a second install fails before this point.
    let _ = HOT.set(HotHandles {
        decisions,
        in_flight,
    });
    for result in ["success", "failure"] {
        counter!("ratelimitd_config_reloads_total", "result" => result).absolute(0);
    }
    for reason in IGNORED_REASONS {
        counter!("ratelimitd_quota_reports_ignored_total", "reason" => reason).increment(0);
    }
    for name in [
        "ratelimitd_local_cache_hits_total",
        "ratelimitd_statsd_dropped_lines_total",
        "ratelimitd_accept_errors_total",
        "ratelimitd_memory_evictions_total",
    ] {
        counter!(name).increment(0);
    }
}

/// Redis `store`'s error counters, at 0 (called when the store is built).
pub(crate) fn redis_store(store: &'static str) {
    for kind in REDIS_ERROR_KINDS {
        counter!("ratelimitd_redis_errors_total", "kind" => kind, "store" => store).increment(0);
    }
}

/// A loaded `CheckLimit` policy's decision counters, at 0.
pub(crate) fn policy_loaded(policy: &str) {
    for outcome in ["allowed", "denied", "degraded"] {
        counter!(
            "ratelimitd_policy_decisions_total",
            "policy" => policy.to_owned(),
            "outcome" => outcome
        )
        .increment(0);
    }
}

/// A loaded quota policy's counters, at 0.
pub(crate) fn quota_policy_loaded(domain: &str, policy: &str) {
    counter!(
        "ratelimitd_quota_degraded_total",
        "domain" => domain.to_owned(),
        "policy" => policy.to_owned()
    )
    .increment(0);
    for kind in ASSIGNMENT_KINDS {
        counter!(
            "ratelimitd_quota_assignments_total",
            "domain" => domain.to_owned(),
            "policy" => policy.to_owned(),
            "kind" => kind
        )
        .increment(0);
    }
    quota_reported(domain, policy, 0, 0);
}

/// The counters and the gauge every call touches, registered once when
/// the recorder is installed: looked up on each call, each would build its
/// key (an allocation, with labels) and search the recorder's registry.
/// Unset without a recorder, when nothing would record them anyway.
struct HotHandles {
    /// `ratelimitd_decisions_total`, by [`APIS`], [`Kind::ALL`] and
    /// [`OUTCOMES`].
    decisions: [[[Counter; OUTCOMES.len()]; Kind::COUNT]; APIS.len()],
    /// `ratelimitd_requests_in_flight`.
    in_flight: Gauge,
}

static HOT: OnceLock<HotHandles> = OnceLock::new();

/// Every [`Api`], in [`HotHandles::decisions`]' order.
const APIS: [Api; 2] = [Api::CheckLimit, Api::Envoy];

/// A decision's outcomes, in [`HotHandles::decisions`]' order.
const OUTCOMES: [&str; 3] = ["allowed", "denied", "degraded"];

/// Which face a decision came through.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Api {
    /// Our `CheckLimit`.
    CheckLimit,
    /// Envoy's `ShouldRateLimit`.
    Envoy,
}

impl Api {
    fn label(self) -> &'static str {
        match self {
            Self::CheckLimit => "check_limit",
            Self::Envoy => "envoy",
        }
    }
}

/// One decision: allowed, denied, or degraded (made by the failure policy).
pub(crate) fn decision(api: Api, algorithm: Kind, decision: &Decision) {
    let Some(hot) = HOT.get() else {
        return;
    };
    let api = match api {
        Api::CheckLimit => 0,
        Api::Envoy => 1,
    };
    let algorithm = algorithm.index();
    let outcome = outcome_index(decision.is_allowed(), decision.is_degraded());
    if let Some(counter) = hot
        .decisions
        .get(api)
        .and_then(|by_algorithm| by_algorithm.get(algorithm))
        .and_then(|by_outcome| by_outcome.get(outcome))
    {
        counter.increment(1);
    }
}

/// A `CheckLimit` that named a policy, by policy and outcome. Policy
/// names come from the operator's file, so the label stays bounded.
pub(crate) fn policy_decision(policy: &str, allowed: bool, degraded: bool) {
    counter!(
        "ratelimitd_policy_decisions_total",
        "policy" => policy.to_owned(),
        "outcome" => outcome(allowed, degraded)
    )
    .increment(1);
}

/// A would-be denial let through by shadow mode, for a configured domain.
pub(crate) fn shadow_decision(domain: &str) {
    counter!("ratelimitd_shadow_decisions_total", "domain" => domain.to_owned()).increment(1);
}

/// One call of the admin API, by endpoint (its route's name) and
/// outcome (`ok`, `unauthenticated`, `forbidden`, `refused`, `failed`).
pub(crate) fn admin_request(endpoint: &'static str, outcome: &'static str) {
    counter!(
        "ratelimitd_admin_requests_total",
        "endpoint" => endpoint,
        "outcome" => outcome
    )
    .increment(1);
}

/// A request answered from the local over-limit cache, without Redis.
pub(crate) fn denial_cache_hit() {
    counter!("ratelimitd_local_cache_hits_total").increment(1);
}

/// The number of calls one script call to Redis `store` carried (1 for a
/// call that went alone).
pub(crate) fn redis_batch(store: &'static str, calls: usize) {
    histogram!("ratelimitd_redis_batch_size", "store" => store).record(calls as f64);
}

/// One script call on Redis `store` (`main`, or `per_second`): how long it
/// took, and how it failed if it did.
pub(crate) fn redis_command(store: &'static str, took: Duration, outcome: Result<(), &StoreError>) {
    histogram!("ratelimitd_redis_command_seconds", "store" => store).record(took.as_secs_f64());
    crate::live::store_call(store, took, outcome.is_err());
    if let Err(err) = outcome {
        let kind = redis_error_kind(err);
        counter!("ratelimitd_redis_errors_total", "kind" => kind, "store" => store).increment(1);
    }
}

/// `err`'s label in `ratelimitd_redis_errors_total`, one of
/// [`REDIS_ERROR_KINDS`]: a timeout is one whichever timeout ran out, ours
/// or the Redis client's.
fn redis_error_kind(err: &StoreError) -> &'static str {
    match err {
        StoreError::Timeout { .. } => "timeout",
        StoreError::Unavailable { .. }
        | StoreError::NoConnection { .. }
        | StoreError::BatchLost => "unavailable",
        StoreError::CircuitOpen => "circuit_open",
        StoreError::Reply(_) | StoreError::Refused { .. } => "reply",
        StoreError::Config { .. } => "config",
    }
}

/// The connections of Redis `store`'s pool now.
pub(crate) fn redis_pool(store: &'static str, in_use: usize, idle: usize) {
    gauge!("ratelimitd_redis_pool_connections", "state" => "in_use", "store" => store)
        .set(in_use as f64);
    gauge!("ratelimitd_redis_pool_connections", "state" => "idle", "store" => store)
        .set(idle as f64);
}

/// A configuration reload that took, or was refused.
pub(crate) fn config_reload(succeeded: bool) {
    let result = if succeeded { "success" } else { "failure" };
    counter!("ratelimitd_config_reloads_total", "result" => result).increment(1);
}

/// Lines of upstream's statistics statsd did not take (the socket was
/// full or refused them, the timer queue was full, the address did not
/// resolve).
pub(crate) fn statsd_dropped(lines: u64) {
    counter!("ratelimitd_statsd_dropped_lines_total").increment(lines);
}

/// Calls in flight, up or down by one.
pub(crate) fn in_flight(delta: f64) {
    if let Some(hot) = HOT.get() {
        hot.in_flight.increment(delta);
    }
}

/// Client connections open, up or down by one.
pub(crate) fn connections(delta: f64) {
    gauge!("ratelimitd_connections").increment(delta);
}

/// A connection closed as soon as it was accepted, for `reason`
/// (`per_ip`: its address had `--max-connections-per-ip` open).
pub(crate) fn connection_refused(reason: &'static str, connections: u64) {
    counter!("ratelimitd_connections_refused_total", "reason" => reason).increment(connections);
}

/// An HTTP connection that lingered at its close (`end`: how that ended),
/// having read and thrown away `discarded` bytes its client still sent.
pub(crate) fn http_lingering_close(end: &'static str, discarded: u64) {
    counter!("ratelimitd_http_lingering_closes_total", "end" => end).increment(1);
    counter!("ratelimitd_http_lingering_discarded_bytes_total").increment(discarded);
}

/// An `accept` that failed (out of file descriptors, mostly).
pub(crate) fn accept_error() {
    counter!("ratelimitd_accept_errors_total").increment(1);
}

/// The embedded store's keys and estimated bytes, after each sweep.
pub(crate) fn memory_store(keys: usize, bytes: usize) {
    gauge!("ratelimitd_memory_keys").set(keys as f64);
    gauge!("ratelimitd_memory_bytes").set(bytes as f64);
}

/// Live keys the embedded store evicted to stay within its budget.
pub(crate) fn memory_evictions(keys: usize) {
    counter!("ratelimitd_memory_evictions_total").increment(keys as u64);
}

/// A quota service stream opened (+1) or closed (-1).
pub(crate) fn quota_streams(delta: f64) {
    gauge!("ratelimitd_quota_streams").increment(delta);
}

/// The lease streams open, up or down.
pub(crate) fn lease_streams(delta: f64) {
    gauge!("ratelimitd_lease_streams").increment(delta);
}

/// A policy's leases held on this instance (one stream's policy and key
/// each), up or down.
pub(crate) fn leases_held(policy: &str, delta: f64) {
    gauge!("ratelimitd_leases_held", "policy" => policy.to_owned()).increment(delta);
}

/// Units of a policy's leases: `leased` (spent for a client), `returned`
/// (given back to the limits), `lapsed` (neither reported spent nor given
/// back when the lease ended).
pub(crate) fn lease_units(policy: &str, outcome: &'static str, units: u64) {
    counter!(
        "ratelimitd_lease_units_total",
        "policy" => policy.to_owned(),
        "outcome" => outcome
    )
    .increment(units);
}

/// A lease asked again (a renewal).
pub(crate) fn lease_renewal(policy: &str) {
    counter!("ratelimitd_lease_renewals_total", "policy" => policy.to_owned()).increment(1);
}

/// What clients reported deciding on a policy: admitted and denied from
/// their leases, and sent to `CheckLimit` instead (fallbacks).
pub(crate) fn lease_local_decisions(policy: &str, admitted: u64, denied: u64, fallbacks: u64) {
    for (outcome, count) in [
        ("allowed", admitted),
        ("denied", denied),
        ("fallback", fallbacks),
    ] {
        if count > 0 {
            counter!(
                "ratelimitd_lease_client_decisions_total",
                "policy" => policy.to_owned(),
                "outcome" => outcome
            )
            .increment(count);
        }
    }
}

/// An ask refused (`reason`: the gRPC code's name).
pub(crate) fn lease_refused(reason: &'static str) {
    counter!("ratelimitd_lease_refusals_total", "reason" => reason).increment(1);
}

/// A quota policy's subscribers on this instance (one Envoy stream's
/// bucket each), up or down.
pub(crate) fn quota_subscribers(domain: &str, policy: &str, delta: f64) {
    gauge!(
        "ratelimitd_quota_subscribers",
        "domain" => domain.to_owned(),
        "policy" => policy.to_owned()
    )
    .increment(delta);
    crate::live::quota_subscribers(domain, policy, delta);
}

/// The rate this instance has assigned under a quota policy, in requests
/// per second, up or down.
pub(crate) fn quota_assigned_rate(domain: &str, policy: &str, delta: f64) {
    gauge!(
        "ratelimitd_quota_assigned_requests_per_second",
        "domain" => domain.to_owned(),
        "policy" => policy.to_owned()
    )
    .increment(delta);
    crate::live::quota_assigned_rate(domain, policy, delta);
}

/// What Envoys reported under a quota policy.
pub(crate) fn quota_reported(domain: &str, policy: &str, allowed: u64, denied: u64) {
    for (outcome, count) in [("allowed", allowed), ("denied", denied)] {
        counter!(
            "ratelimitd_quota_reported_requests_total",
            "domain" => domain.to_owned(),
            "policy" => policy.to_owned(),
            "outcome" => outcome
        )
        .increment(count);
    }
}

/// An assignment sent to an Envoy, by its kind (`token_bucket`,
/// `allow_all`, `deny_all`, `abandon`).
pub(crate) fn quota_assignment(domain: &str, policy: &str, kind: &'static str) {
    counter!(
        "ratelimitd_quota_assignments_total",
        "domain" => domain.to_owned(),
        "policy" => policy.to_owned(),
        "kind" => kind
    )
    .increment(1);
}

/// Bucket reports ignored, and why (`no_domain`, `domain_changed`,
/// `unknown_domain`, `empty_bucket_id`, `bucket_id_too_large`,
/// `too_many_buckets`).
pub(crate) fn quota_report_ignored(reason: &'static str, reports: u64) {
    counter!("ratelimitd_quota_reports_ignored_total", "reason" => reason).increment(reports);
}

/// A share the store could not settle, answered by the failure policy.
pub(crate) fn quota_degraded(domain: &str, policy: &str) {
    counter!(
        "ratelimitd_quota_degraded_total",
        "domain" => domain.to_owned(),
        "policy" => policy.to_owned()
    )
    .increment(1);
}

/// A decision's outcome label.
fn outcome(allowed: bool, degraded: bool) -> &'static str {
    OUTCOMES[outcome_index(allowed, degraded)]
}

/// Where the outcome is in [`OUTCOMES`].
fn outcome_index(allowed: bool, degraded: bool) -> usize {
    if degraded {
        2
    } else if allowed {
        0
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_redis_clients_own_timeout_counts_as_a_timeout_as_ours_does() {
        let ours = StoreError::deadline(Duration::from_millis(100));
        let clients = StoreError::Timeout {
            after: None,
            source: Some(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
        };
        assert_eq!(redis_error_kind(&ours), "timeout");
        assert_eq!(redis_error_kind(&clients), "timeout");
        let others = [
            StoreError::BatchLost,
            StoreError::CircuitOpen,
            StoreError::Reply("?".into()),
            StoreError::config("no Redis URL"),
        ];
        for err in others.iter().chain([&ours, &clients]) {
            assert!(
                REDIS_ERROR_KINDS.contains(&redis_error_kind(err)),
                "{err:?}"
            );
        }
    }
}

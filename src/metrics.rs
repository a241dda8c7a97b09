//! Prometheus metrics, off unless `--metrics-listen` (or the debug
//! listener, `--debug-listen`) names an address.
//! Every metric's name and labels live here, so what is exported is read in
//! one place. Labels stay bounded: APIs, algorithms, outcomes, error kinds
//! and configured Envoy domains and rules, never a caller's key or a
//! descriptor's value. Without the exporter
//! the `metrics` macros record into nothing.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};

use crate::error::StoreError;
use crate::limit::Decision;

/// Whether an exporter is installed: the per-rule series build their
/// labels per request, which is skipped when nothing would read them.
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Installs the recorder, serving `/metrics` on `listen` when given; the
/// handle renders the same text (the debug listener's `/metrics`). Call
/// once, inside the tokio runtime, before anything is counted.
pub fn install(listen: Option<SocketAddr>) -> Result<PrometheusHandle, BuildError> {
    INSTALLED.store(true, Ordering::Relaxed);
    let builder = PrometheusBuilder::new().set_buckets_for_metric(
        metrics_exporter_prometheus::Matcher::Full("ratelimitd_redis_command_seconds".into()),
        &[
            0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0,
        ],
    )?;
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
    Ok(handle)
}

/// Which face a decision came through.
#[derive(Debug, Clone, Copy)]
pub enum Api {
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
pub fn decision(api: Api, algorithm: &'static str, decision: &Decision) {
    let outcome = outcome(decision.is_allowed(), decision.is_degraded());
    counter!(
        "ratelimitd_decisions_total",
        "api" => api.label(),
        "algorithm" => algorithm,
        "outcome" => outcome
    )
    .increment(1);
}

/// A `CheckLimit` that named a policy, by policy and outcome. Policy
/// names come from the operator's file, so the label stays bounded.
pub fn policy_decision(policy: &str, allowed: bool, degraded: bool) {
    counter!(
        "ratelimitd_policy_decisions_total",
        "policy" => policy.to_owned(),
        "outcome" => outcome(allowed, degraded)
    )
    .increment(1);
}

/// A would-be denial let through by shadow mode, for a configured domain.
pub fn shadow_decision(domain: &str) {
    counter!("ratelimitd_shadow_decisions_total", "domain" => domain.to_owned()).increment(1);
}

/// A request answered from the local over-limit cache, without Redis.
pub fn denial_cache_hit() {
    counter!("ratelimitd_local_cache_hits_total").increment(1);
}

/// One script call on Redis: how long it took, and how it failed if it did.
pub fn redis_command(took: Duration, outcome: Result<(), &StoreError>) {
    histogram!("ratelimitd_redis_command_seconds").record(took.as_secs_f64());
    if let Err(err) = outcome {
        let kind = match err {
            StoreError::Timeout(_) => "timeout",
            StoreError::Unavailable(_) => "unavailable",
            StoreError::CircuitOpen => "circuit_open",
            StoreError::Reply(_) => "reply",
            StoreError::Config(_) => "config",
        };
        counter!("ratelimitd_redis_errors_total", "kind" => kind).increment(1);
    }
}

/// The Redis pool's connections now.
pub fn redis_pool(in_use: usize, idle: usize) {
    gauge!("ratelimitd_redis_pool_connections", "state" => "in_use").set(in_use as f64);
    gauge!("ratelimitd_redis_pool_connections", "state" => "idle").set(idle as f64);
}

/// A configuration reload that took, or was refused; and under upstream's
/// names, any load (the first included).
pub fn config_reload(succeeded: bool) {
    let result = if succeeded { "success" } else { "failure" };
    counter!("ratelimitd_config_reloads_total", "result" => result).increment(1);
    config_load(succeeded);
}

/// envoyproxy/ratelimit's `config_load_success` / `config_load_error`.
pub fn config_load(succeeded: bool) {
    if succeeded {
        counter!("ratelimit_service_config_load_success").increment(1);
    } else {
        counter!("ratelimit_service_config_load_error").increment(1);
    }
}

/// One `ShouldRateLimit`, under envoyproxy/ratelimit's name, and its error
/// kind if it failed (`redis_error`: the store; `service_error`: the rest).
pub fn upstream_request(error: Option<&'static str>) {
    counter!("ratelimit_service_total_requests", "grpc_method" => "ShouldRateLimit").increment(1);
    if let Some(err_type) = error {
        counter!("ratelimit_service_should_rate_limit_error", "err_type" => err_type).increment(1);
    }
}

/// One descriptor's hits, by upstream's counters (worked out from a
/// decision by `api::envoy::upstream_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RuleHits {
    /// Hits asked for.
    pub total: u64,
    /// Hits within the limit.
    pub within: u64,
    /// Hits within but near the limit (upstream's near_limit).
    pub near: u64,
    /// Hits over the limit.
    pub over: u64,
    /// Hits over the limit let through by shadow mode.
    pub shadow: u64,
}

/// One configured rule's counters under envoyproxy/ratelimit's Prometheus
/// names (its default statsd mapping: `ratelimit.service.rate_limit.<domain>.<key1>[.<key2>...].<stat>`
/// becomes `ratelimit_service_rate_limit_<stat>{domain, key1[, key2]}`).
/// The keys are the rule's levels in the configuration (`key` or
/// `key_value`, as written), so the series are as many as the rules. Made
/// once per rule (see [`UpstreamRuleCounters::get`]), not per request.
pub struct UpstreamRuleCounters {
    total: metrics::Counter,
    within: metrics::Counter,
    near: metrics::Counter,
    over: metrics::Counter,
    shadow: metrics::Counter,
}

impl UpstreamRuleCounters {
    /// The counters of the rule at `levels` in `domain`, registered on
    /// first use in `slot`; `None` without an exporter or for a rule with
    /// no place in the configuration.
    pub fn get<'a>(
        slot: &'a std::sync::OnceLock<Option<Self>>,
        domain: &str,
        levels: &[String],
    ) -> Option<&'a Self> {
        if !INSTALLED.load(Ordering::Relaxed) {
            return None;
        }
        slot.get_or_init(|| {
            let key1 = levels.first()?;
            let mut labels = vec![
                metrics::Label::new("domain", domain.to_owned()),
                metrics::Label::new("key1", key1.clone()),
            ];
            if let Some(key2) = levels.get(1) {
                labels.push(metrics::Label::new("key2", key2.clone()));
            }
            let counter = |name: &'static str| counter!(name, labels.clone());
            Some(Self {
                total: counter("ratelimit_service_rate_limit_total_hits"),
                within: counter("ratelimit_service_rate_limit_within_limit"),
                near: counter("ratelimit_service_rate_limit_near_limit"),
                over: counter("ratelimit_service_rate_limit_over_limit"),
                shadow: counter("ratelimit_service_rate_limit_shadow_mode"),
            })
        })
        .as_ref()
    }

    /// Adds one request's hits on the rule.
    pub fn record(&self, hits: &RuleHits) {
        self.total.increment(hits.total);
        self.within.increment(hits.within);
        self.near.increment(hits.near);
        self.over.increment(hits.over);
        self.shadow.increment(hits.shadow);
    }
}

/// Calls in flight, up or down by one.
pub fn in_flight(delta: f64) {
    gauge!("ratelimitd_requests_in_flight").increment(delta);
}

/// Client connections open, up or down by one.
pub fn connections(delta: f64) {
    gauge!("ratelimitd_connections").increment(delta);
}

/// An `accept` that failed (out of file descriptors, mostly).
pub fn accept_error() {
    counter!("ratelimitd_accept_errors_total").increment(1);
}

/// The embedded store's keys and estimated bytes, after each sweep.
pub fn memory_store(keys: usize, bytes: usize) {
    gauge!("ratelimitd_memory_keys").set(keys as f64);
    gauge!("ratelimitd_memory_bytes").set(bytes as f64);
}

/// Live keys the embedded store evicted to stay within its budget.
pub fn memory_evictions(keys: usize) {
    counter!("ratelimitd_memory_evictions_total").increment(keys as u64);
}

/// A quota service stream opened (+1) or closed (-1).
pub fn quota_streams(delta: f64) {
    gauge!("ratelimitd_quota_streams").increment(delta);
}

/// A quota policy's subscribers on this instance (one Envoy stream's
/// bucket each), up or down.
pub fn quota_subscribers(domain: &str, policy: &str, delta: f64) {
    gauge!(
        "ratelimitd_quota_subscribers",
        "domain" => domain.to_owned(),
        "policy" => policy.to_owned()
    )
    .increment(delta);
}

/// The rate this instance has assigned under a quota policy, in requests
/// per second, up or down.
pub fn quota_assigned_rate(domain: &str, policy: &str, delta: f64) {
    gauge!(
        "ratelimitd_quota_assigned_requests_per_second",
        "domain" => domain.to_owned(),
        "policy" => policy.to_owned()
    )
    .increment(delta);
}

/// What Envoys reported under a quota policy.
pub fn quota_reported(domain: &str, policy: &str, allowed: u64, denied: u64) {
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
pub fn quota_assignment(domain: &str, policy: &str, kind: &'static str) {
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
pub fn quota_report_ignored(reason: &'static str, reports: u64) {
    counter!("ratelimitd_quota_reports_ignored_total", "reason" => reason).increment(reports);
}

/// A share the store could not settle, answered by the failure policy.
pub fn quota_degraded(domain: &str, policy: &str) {
    counter!(
        "ratelimitd_quota_degraded_total",
        "domain" => domain.to_owned(),
        "policy" => policy.to_owned()
    )
    .increment(1);
}

/// A decision's outcome label.
fn outcome(allowed: bool, degraded: bool) -> &'static str {
    if degraded {
        "degraded"
    } else if allowed {
        "allowed"
    } else {
        "denied"
    }
}

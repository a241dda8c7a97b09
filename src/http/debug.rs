//! The debug listener, as envoyproxy/ratelimit's: `/rlconfig` prints the
//! rules in force ([`crate::rules::dump`]), `/metrics` the Prometheus text,
//! and any other path lists the endpoints, a `path: what` line each,
//! sorted. Upstream's pprof endpoints (Go's profiler) and `/stats` (Go's
//! runtime variables) have no counterpart here.

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

use super::TEXT_PLAIN;
use crate::rules::RulesHandle;

/// The endpoints `/` lists, and what each is for (upstream's words where
/// it has the endpoint).
const RLCONFIG: (&str, &str) = (
    "/rlconfig",
    "print out the currently loaded configuration for debugging",
);
const METRICS: (&str, &str) = (
    "/metrics",
    "print out metrics in the Prometheus text format",
);

/// The debug routes: the rules in `rules`; the metrics `metrics` renders,
/// when an exporter is installed.
pub(crate) fn routes(rules: RulesHandle, metrics: Option<PrometheusHandle>) -> Router {
    let mut endpoints = vec![RLCONFIG];
    let mut router = Router::new().route(
        RLCONFIG.0,
        get(move || {
            let text = rules.current().dump();
            async move { ([(CONTENT_TYPE, TEXT_PLAIN)], text) }
        }),
    );
    if let Some(handle) = metrics {
        endpoints.push(METRICS);
        router = router.route(
            METRICS.0,
            get(move || {
                let text = handle.render();
                async move { ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text) }
            }),
        );
    }
    endpoints.sort_unstable();
    let listing: String = endpoints
        .iter()
        .map(|(path, what)| format!("{path}: {what}\n"))
        .collect();
    router.fallback(move || {
        let listing = listing.clone();
        async move { ([(CONTENT_TYPE, TEXT_PLAIN)], listing).into_response() }
    })
}

//! What ratelimitd says when it starts, at `info`, one short line each (in
//! text and JSON logs alike): each listener with its URL and what it
//! serves, the web console's first; the store; where the rules come from;
//! the failure policy. The whole configuration in force, secrets hidden as
//! the admin API shows them, is logged at `debug`.

use std::net::SocketAddr;

use tracing::{debug, info, warn};

use super::listeners::Listeners;
use crate::config::Config;
use crate::limit::FailurePolicy;
use crate::options::value_name;
use crate::store::{RedisUrl, Topology, redacted_url};

/// Logs the start-up lines, once the listeners are bound.
pub fn announce(config: &Config, listeners: &Listeners) {
    for line in listener_lines(config, listeners) {
        info!("{line}");
    }
    store_lines(config);
    info!("{}", rules_line(config));
    info!("{}", failure_line(config));
    match serde_json::to_string(&config.effective) {
        Ok(effective) => debug!(configuration = %effective, "the configuration in force"),
        Err(err) => debug!(%err, "the configuration in force cannot be written"),
    }
}

/// One line per listener, the console's URL first.
fn listener_lines(config: &Config, listeners: &Listeners) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(http) = listeners.http_address() {
        let url = http_url(http);
        lines.push(format!("web console: {url}/"));
        let admin = if config.http.admin.admin_token.is_some()
            || config.http.admin.admin_token_file.is_some()
        {
            ", the admin API (/admin/v1)"
        } else {
            ""
        };
        lines.push(format!(
            "HTTP on {url}: the console (/), the JSON API (/v1/check, /v1/check-many), health \
             (/healthz, /readyz, /healthcheck), /json, /openapi.json{admin}"
        ));
    }
    let grpc = listeners
        .grpc_address()
        .map_or_else(|_| config.listener.listen.to_string(), |a| a.to_string());
    let tls = if config.tls.tls_cert.is_some() {
        " (TLS)"
    } else {
        ""
    };
    let reflection = if config.listener.reflection {
        ", reflection"
    } else {
        ""
    };
    lines.push(format!(
        "gRPC on {grpc}{tls}: CheckLimit (ratelimitd.v1), Envoy's rate limit service and quota \
         service (RLQS), health{reflection}"
    ));
    if let Some(debug) = listeners.debug_address() {
        lines.push(format!(
            "debug endpoints on {}: /rlconfig, /metrics",
            http_url(debug)
        ));
    }
    if let Some(metrics) = config.telemetry.metrics_listen {
        lines.push(format!(
            "Prometheus metrics on {}/metrics",
            http_url(metrics)
        ));
    }
    lines
}

fn http_url(address: SocketAddr) -> String {
    format!("http://{address}")
}

/// Where the counters live: Redis (warned of when it is not).
fn store_lines(config: &Config) {
    let store = &config.store;
    if store.redis_url.is_empty() {
        warn!(
            "store: embedded, in this process (no --redis-url): limits are NOT shared between \
             ratelimitd instances and are lost on restart"
        );
        return;
    }
    info!(
        "store: {}",
        redis_description(&store.redis_url, store.redis_mode)
    );
    if !store.redis_persecond_url.is_empty() {
        info!(
            "store for Envoy's rules whose unit is second: {}",
            redis_description(&store.redis_persecond_url, store.redis_persecond_mode)
        );
    }
}

/// `Redis (cluster) at redis://a:6379, redis://b:6379`, credentials hidden.
fn redis_description(urls: &[RedisUrl], topology: Topology) -> String {
    let urls: Vec<String> = urls.iter().map(|url| redacted_url(url.as_str())).collect();
    format!("Redis ({}) at {}", value_name(&topology), urls.join(", "))
}

/// Where the Envoy rules and the policies come from.
fn rules_line(config: &Config) -> String {
    let envoy = &config.envoy;
    if let Some(path) = &envoy.config {
        return format!(
            "rules and policies: {}, read again when it changes (checked every {})",
            path.display(),
            humantime::format_duration(envoy.config_poll_interval)
        );
    }
    match &envoy.xds.xds_server {
        Some(server) => format!(
            "rules: from the xDS server {server} as node {}",
            envoy.xds.xds_node_id
        ),
        None => "rules and policies: none (no --config): CheckLimit decides the limits each \
                 call names; Envoy's domains are unconfigured"
            .to_owned(),
    }
}

/// What answers when the store cannot decide in time.
fn failure_line(config: &Config) -> String {
    if config.store.redis_url.is_empty() {
        return "failure policy: none needed on the embedded store".to_owned();
    }
    let policy = config.limiter.failure_policy;
    let answer = match policy {
        FailurePolicy::FailClosed => "the call fails (UNAVAILABLE) and the caller decides",
        FailurePolicy::FailOpen => "the request is allowed, marked degraded",
        FailurePolicy::Local => "this instance's embedded store decides, marked degraded",
    };
    format!(
        "failure policy: {}: when Redis does not answer within {}, {answer}",
        value_name(&policy),
        humantime::format_duration(config.store.redis_command_timeout)
    )
}

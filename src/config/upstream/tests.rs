//! The table of upstream's variables is complete: every variable
//! upstream's settings read has exactly one row, and every row names a
//! variable upstream reads or one its deployments set beside them; and
//! Kubernetes service links are never read as upstream's variables.

use super::service_links::is_service_link;
use super::{Report, SHARED_NAMES, TABLE, switches_upstream_on};
use crate::config::Config;

/// Every variable upstream's settings.go reads (at envoyproxy/ratelimit's
/// main of 2026-07), and so every one a deployment may set.
#[rustfmt::skip]
const UPSTREAM_SETTINGS: &[&str] = &[
    "HOST",
    "PORT",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "GRPC_UDS",
    "GRPC_HOST",
    "GRPC_PORT",
    "GRPC_MAX_CONNECTION_AGE",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "GRPC_SERVER_USE_TLS",
    "GRPC_SERVER_TLS_CERT",
    "GRPC_SERVER_TLS_KEY",
    "GRPC_CLIENT_TLS_CACERT",
    "GRPC_CLIENT_TLS_SAN",
    "LOG_LEVEL",
    "LOG_FORMAT",
    "CONFIG_TYPE",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "CONFIG_GRPC_XDS_NODE_ID",
    "CONFIG_GRPC_XDS_NODE_METADATA",
    "CONFIG_GRPC_XDS_SERVER_URL",
    "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
    "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    "CONFIG_GRPC_XDS_SERVER_USE_TLS",
    "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
    "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
    "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
    "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
    "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
    "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
    "XDS_CLIENT_BACKOFF_JITTER",
    "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_STATSD",
    "STATSD_HOST",
    "STATSD_PORT",
    "EXTRA_TAGS",
    "STATS_FLUSH_INTERVAL",
    "DISABLE_STATS",
    "USE_PROMETHEUS",
    "PROMETHEUS_ADDR",
    "PROMETHEUS_PATH",
    "PROMETHEUS_MAPPER_YAML",
    "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS",
    "RUNTIME_ROOT",
    "RUNTIME_SUBDIRECTORY",
    "RUNTIME_APPDIRECTORY",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "CACHE_KEY_PREFIX",
    "BACKEND_TYPE",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "LIMIT_RESPONSE_HEADERS_ENABLED",
    "LIMIT_LIMIT_HEADER",
    "LIMIT_REMAINING_HEADER",
    "LIMIT_RESET_HEADER",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "REDIS_SOCKET_TYPE",
    "REDIS_TYPE",
    "REDIS_URL",
    "REDIS_POOL_SIZE",
    "REDIS_AUTH",
    "REDIS_TLS",
    "REDIS_TLS_CLIENT_CERT",
    "REDIS_TLS_CLIENT_KEY",
    "REDIS_TLS_CACERT",
    "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_TLS",
    "REDIS_SENTINEL_AUTH",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_TIMEOUT",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_STARTUP_INITIAL_INTERVAL",
    "REDIS_STARTUP_MAX_INTERVAL",
    "REDIS_STARTUP_MAX_ELAPSED_TIME",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "SHADOW_MODE",
    "QUOTA_MODE",
    "RESPONSE_DYNAMIC_METADATA",
    "MERGE_DOMAIN_CONFIG",
    "TRACING_ENABLED",
    "TRACING_SERVICE_NAME",
    "TRACING_SERVICE_NAMESPACE",
    "TRACING_SERVICE_INSTANCE_ID",
    "TRACING_EXPORTER_PROTOCOL",
    "TRACING_SAMPLING_RATE",
];

/// Variables upstream's settings do not read that its deployments set
/// anyway (Envoy Gateway's GRPC_SERVER_TLS_CA_CERT; STATSD_PROTOCOL, read
/// by upstream's statsd library rather than its settings): each has a row
/// too, so that the start says what it does here.
const SET_BESIDE_UPSTREAM: &[&str] = &["GRPC_SERVER_TLS_CA_CERT", "STATSD_PROTOCOL"];

#[test]
fn every_row_names_variables_upstream_reads_or_ones_set_beside_them() {
    for row in TABLE {
        for variable in row.variables {
            let name = variable.name;
            if name.ends_with('*') {
                continue;
            }
            assert!(
                UPSTREAM_SETTINGS.contains(&name) != SET_BESIDE_UPSTREAM.contains(&name),
                "{name}: in upstream's settings, or set beside them (exactly one)"
            );
        }
    }
}

#[test]
fn every_upstream_variable_has_one_row_and_switches_upstream_on() {
    for name in UPSTREAM_SETTINGS.iter().chain(SET_BESIDE_UPSTREAM) {
        let exact = TABLE
            .iter()
            .filter(|row| row.variables.iter().any(|variable| variable.name == *name))
            .count();
        let by_prefix = TABLE.iter().any(|row| {
            row.variables.iter().any(|variable| {
                variable
                    .name
                    .strip_suffix('*')
                    .is_some_and(|prefix| name.starts_with(prefix))
            })
        });
        assert!(
            exact == 1 || (exact == 0 && by_prefix),
            "{name}: {exact} rows"
        );
        let shared = SHARED_NAMES.contains(name);
        assert_eq!(switches_upstream_on(name), !shared, "{name}");
    }
}

#[test]
fn kubernetes_service_links_are_told_by_their_shape() {
    for (name, value) in [
        ("STATSD_SERVICE_HOST", "10.0.0.5"),
        ("STATSD_SERVICE_PORT", "8125"),
        ("STATSD_SERVICE_PORT_METRICS", "8125"),
        ("STATSD_PORT", "tcp://10.0.0.5:8125"),
        ("STATSD_PORT", "udp://[fd00::5]:8125"),
        ("STATSD_PORT_8125_UDP", "udp://10.0.0.5:8125"),
        ("STATSD_PORT_8125_UDP_PROTO", "udp"),
        ("STATSD_PORT_8125_UDP_PORT", "8125"),
        ("STATSD_PORT_8125_SCTP_ADDR", "10.0.0.5"),
        ("MEMCACHE_PORT", "sctp://10.0.0.6:11211"),
        ("GRPC_PORT", "tcp://10.0.0.7:8081"),
    ] {
        assert!(is_service_link(name, value), "{name}={value}");
    }
    for (name, value) in [
        ("STATSD_PORT", "8125"),
        ("PORT", "tcp://10.0.0.5:8080"),
        ("MEMCACHE_HOST_PORT", "memcache:11211"),
        ("TRACING_SERVICE_NAME", "ratelimit"),
        ("TRACING_SERVICE_NAMESPACE", "default"),
        ("STATSD_PORT_8125_HTTP", "x"),
        ("STATSD_HOST", "10.0.0.5"),
    ] {
        assert!(!is_service_link(name, value), "{name}={value}");
    }
}

fn load(variables: &[(&str, &str)]) -> Result<(Config, Report), String> {
    let environment = variables
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    Config::load_from(&["ratelimitd"], &environment).map_err(|err| err.to_string())
}

/// What Kubernetes sets for a Service named `statsd` and one named `tracing`.
const LINKS: &[(&str, &str)] = &[
    ("STATSD_SERVICE_HOST", "10.0.0.5"),
    ("STATSD_SERVICE_PORT", "8125"),
    ("STATSD_PORT", "tcp://10.0.0.5:8125"),
    ("STATSD_PORT_8125_TCP", "tcp://10.0.0.5:8125"),
    ("STATSD_PORT_8125_TCP_PROTO", "tcp"),
    ("STATSD_PORT_8125_TCP_PORT", "8125"),
    ("STATSD_PORT_8125_TCP_ADDR", "10.0.0.5"),
    ("TRACING_SERVICE_HOST", "10.0.0.6"),
    ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
];

#[test]
fn service_links_never_switch_upstream_on_and_are_ignored_with_a_warning() {
    let (config, report) = load(LINKS).unwrap();
    assert!(!report.active, "{report:?}");
    assert!(report.warnings.is_empty(), "{report:?}");
    assert_eq!(config.listener.listen.to_string(), "127.0.0.1:50051");
    let mut upstream = LINKS.to_vec();
    upstream.push(("USE_STATSD", "false"));
    let (config, report) = load(&upstream).expect("STATSD_PORT=tcp://… is not read");
    assert!(report.active);
    assert_eq!(config.listener.listen.to_string(), "0.0.0.0:8081");
    assert!(
        !report.read.iter().any(|name| name.starts_with("STATSD")),
        "{report:?}"
    );
    let port = report
        .warnings
        .iter()
        .find(|warning| warning.starts_with("STATSD_PORT="))
        .expect("a warning for STATSD_PORT");
    assert!(
        port.contains("Kubernetes service link") && port.contains("fail to start"),
        "{port}"
    );
    for name in [
        "STATSD_SERVICE_HOST",
        "STATSD_PORT_8125_TCP_ADDR",
        "TRACING_SERVICE_HOST",
    ] {
        let warning = report
            .warnings
            .iter()
            .find(|warning| warning.starts_with(&format!("{name}=")))
            .unwrap_or_else(|| panic!("a warning for {name}: {report:?}"));
        assert!(warning.contains("does not read it"), "{warning}");
    }
    assert!(!report.warnings.iter().any(|w| w.starts_with("KUBERNETES_")));
    // A port given as a number is upstream's own, as before.
    let (_, report) = load(&[("STATSD_PORT", "8125")]).unwrap();
    assert!(report.active);
}

//! The configuration as a deployment gives it: our flags, upstream's
//! variables, both together, and what the logs may show of it; the
//! listeners' and the start's rows in `listeners`, the per-second Redis's
//! in `per_second`, the statistics' in `stats`.

mod listeners;
mod per_second;
mod stats;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use super::Config;
use super::upstream::{Effect, Environment, ParseError, Report, TABLE};
use crate::api::envoy::KeyLayout;
use crate::api::envoy::options::ConfigFiles;
use crate::config_error::ConfigError;
use crate::options::Secret;
use crate::store::{StoreSettings, Topology};
use crate::telemetry::LogLevel;

fn load(args: &[&str], variables: &[(&str, &str)]) -> Result<(Config, Report), String> {
    let environment: Environment = variables
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect();
    let args: Vec<&str> = std::iter::once("ratelimitd")
        .chain(args.iter().copied())
        .collect();
    Config::load_from(&args, &environment).map_err(|err| err.to_string())
}

#[test]
fn passwords_never_reach_the_logs() {
    let config = Config::parse_from([
        "ratelimitd",
        "--redis-url",
        "redis://u:pw1@h:1/0,redis://u:pw2@h:2/0",
        "--redis-sentinel-auth",
        "sentinel:pw3",
        "--xds-headers",
        "authorization:Bearer pw4",
    ]);
    let logged = format!("{config:?}");
    for secret in ["pw1", "pw2", "pw3", "pw4"] {
        assert!(!logged.contains(secret), "{secret} in {logged}");
    }
    assert!(logged.contains("redis://u:***@h:1/0") && logged.contains("authorization"));
}

#[test]
fn defaults_are_sensible_and_zero_timeouts_are_refused() {
    let config = Config::parse_from(["ratelimitd"]);
    assert_eq!(config.listener.listen.to_string(), "127.0.0.1:50051");
    assert_eq!(config.limiter.key_prefix, "ratelimitd:");
    assert!(matches!(
        config.store.settings().unwrap(),
        StoreSettings::Embedded(_)
    ));
    assert!(Config::try_parse_from(["ratelimitd", "--redis-command-timeout", "0s"]).is_err());
    assert!(Config::try_parse_from(["ratelimitd", "--redis-pool-size", "0"]).is_err());
    let two = Config::parse_from(["ratelimitd", "--redis-url", "redis://a:1,redis://b:2"]);
    let err = two.invalid(two.store.settings().err().expect("two standalone URLs"));
    assert!(
        err.to_string()
            .starts_with("--redis-url: a standalone Redis takes one URL"),
        "{err}"
    );
}

#[test]
fn switches_take_an_explicit_value_too() {
    let config = Config::parse_from(["ratelimitd", "--shadow-mode", "--config-dotfiles=false"]);
    assert!(config.envoy.shadow_mode);
    assert!(!config.envoy.config_dotfiles);
    let config = Config::parse_from(["ratelimitd", "--shadow-mode=false"]);
    assert!(!config.envoy.shadow_mode);
}

#[test]
fn without_upstream_variables_ours_stay() {
    let (config, report) = load(&[], &[("PORT", "8080"), ("REDIS_URL", "x")]).unwrap();
    assert!(!report.active, "shared names alone do not switch");
    assert_eq!(config.listener.listen.to_string(), "127.0.0.1:50051");
    assert!(config.store.redis_url.is_empty());
    assert_eq!(config.limiter.key_prefix, "ratelimitd:");
    assert!(!config.envoy.envoy_count_denied_hits);
}

#[test]
fn upstream_deployment_gets_upstream_defaults() {
    let (config, report) = load(
        &[],
        &[
            ("USE_STATSD", "false"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "127.0.0.1:6380"),
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
        ],
    )
    .unwrap();
    assert!(report.active);
    assert_eq!(config.listener.listen.to_string(), "0.0.0.0:8081");
    assert_eq!(config.store.redis_url, ["redis://127.0.0.1:6380"]);
    assert_eq!(config.store.redis_mode, Topology::Standalone);
    assert_eq!(config.store.redis_pool_size, 10);
    assert_eq!(config.limiter.key_prefix, "");
    assert_eq!(config.limiter.local_cache_max_bytes, 0);
    assert!(config.envoy.envoy_count_denied_hits);
    assert_eq!(config.telemetry.log_level, LogLevel::Warn);
    assert_eq!(
        config.envoy.config,
        Some(PathBuf::from("/data/ratelimit/config"))
    );
    assert_eq!(config.envoy.config_files, ConfigFiles::All);
    assert!(!config.envoy.config_dotfiles);
    assert_eq!(config.origins.of("redis_url"), Some("REDIS_URL"));
    assert_eq!(config.origins.of("key_prefix"), Some("CACHE_KEY_PREFIX"));
    assert_eq!(config.envoy.envoy_key_layout, KeyLayout::Upstream);
}

#[test]
fn upstreams_key_layout_is_a_default_our_flag_overrides() {
    let upstream = [("USE_STATSD", "false"), ("CACHE_KEY_PREFIX", "rl_")];
    let (config, _) = load(&[], &upstream).unwrap();
    assert_eq!(config.limiter.key_prefix, "rl_");
    assert_eq!(config.envoy.envoy_key_layout, KeyLayout::Upstream);
    assert_eq!(
        config.origins.of("envoy_key_layout"),
        Some("CACHE_KEY_PREFIX")
    );
    let (config, _) = load(&["--envoy-key-layout", "ratelimitd"], &upstream).unwrap();
    assert_eq!(config.envoy.envoy_key_layout, KeyLayout::Ratelimitd);
    let (config, _) = load(&[], &[]).unwrap();
    assert_eq!(config.envoy.envoy_key_layout, KeyLayout::Ratelimitd);
}

#[test]
fn defaults_without_redis_url_are_twemproxys_socket() {
    let (config, _) = load(&[], &[("USE_STATSD", "false")]).unwrap();
    assert_eq!(
        config.store.redis_url,
        ["redis+unix:///var/run/nutcracker/ratelimit.sock"]
    );
    assert!(
        config.envoy.config_dotfiles,
        "upstream reads dotfiles by default"
    );
    assert_eq!(
        config.envoy.config,
        Some(PathBuf::from("/srv/runtime_data/current/config"))
    );
}

#[test]
fn our_flag_wins_when_equal_and_conflicts_are_errors() {
    let (config, _) = load(
        &["--listen", "127.0.0.1:9000", "--key-prefix", "mine:"],
        &[
            ("GRPC_HOST", "127.0.0.1"),
            ("GRPC_PORT", "9000"),
            ("USE_STATSD", "false"),
        ],
    )
    .unwrap();
    assert_eq!(config.listener.listen.to_string(), "127.0.0.1:9000");
    assert_eq!(
        config.limiter.key_prefix, "mine:",
        "our flag beats upstream's default"
    );
    let err = load(&["--listen", "127.0.0.1:9001"], &[("GRPC_PORT", "9000")]).unwrap_err();
    assert!(
        err.contains("GRPC_HOST/GRPC_PORT") && err.contains("--listen"),
        "{err}"
    );
    let err = load(&["--key-prefix", "a"], &[("CACHE_KEY_PREFIX", "b")]).unwrap_err();
    assert!(
        err.contains("CACHE_KEY_PREFIX") && err.contains("--key-prefix"),
        "{err}"
    );
    // Equal in meaning, written otherwise: no conflict.
    load(
        &[
            "--redis-command-timeout",
            "1000ms",
            "--redis-connect-timeout",
            "1s",
        ],
        &[("REDIS_TIMEOUT", "1s")],
    )
    .unwrap();
    let err = load(
        &["--redis-sentinel-auth", "a"],
        &[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "m,h:1"),
            ("REDIS_SENTINEL_AUTH", "s3cret"),
        ],
    )
    .unwrap_err();
    assert!(
        err.contains("REDIS_SENTINEL_AUTH") && !err.contains("s3cret"),
        "{err}"
    );
}

#[test]
fn redis_forms_become_urls() {
    let (config, _) = load(
        &[],
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster,127.0.0.1:26379,127.0.0.1:26380"),
            ("REDIS_AUTH", "app:p@ss:w/rd"),
            ("REDIS_SENTINEL_AUTH", ""),
        ],
    )
    .unwrap();
    assert_eq!(config.store.redis_mode, Topology::Sentinel);
    assert_eq!(config.store.redis_sentinel_master, "mymaster");
    assert_eq!(
        config.store.redis_url,
        [
            "redis://app:p%40ss%3Aw%2Frd@127.0.0.1:26379",
            "redis://app:p%40ss%3Aw%2Frd@127.0.0.1:26380"
        ]
    );
    assert_eq!(
        config
            .store
            .redis_sentinel_auth
            .as_ref()
            .map(Secret::expose),
        Some("")
    );
    let (config, _) = load(
        &[],
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "CLUSTER"),
            ("REDIS_URL", "a:1,b:2"),
            ("REDIS_TLS", "true"),
        ],
    )
    .unwrap();
    assert_eq!(config.store.redis_mode, Topology::Cluster);
    assert_eq!(config.store.redis_url, ["rediss://a:1", "rediss://b:2"]);
    let (config, _) = load(
        &[],
        &[
            ("USE_STATSD", "false"),
            ("REDIS_URL", "/tmp/r.sock"),
            ("REDIS_AUTH", "pw"),
        ],
    )
    .unwrap();
    assert_eq!(config.store.redis_url, ["redis+unix:///tmp/r.sock?pass=pw"]);
    let err = load(
        &[],
        &[("REDIS_SOCKET_TYPE", "tcp"), ("REDIS_URL", "nocolon")],
    )
    .unwrap_err();
    assert!(err.contains("host:port"), "{err}");
}

#[test]
fn what_cannot_be_honoured_stops_the_start_by_name() {
    for (name, value) in [
        ("TRACING_ENABLED", "true"),
        ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
        ("BACKEND_TYPE", "memcache"),
        ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "ERROR"),
        ("MERGE_DOMAIN_CONFIG", "true"),
    ] {
        let err = load(&[], &[(name, value)]).unwrap_err();
        assert!(err.contains(name), "{name}: {err}");
    }
    let err = load(&[], &[("SHADOW_MODE", "yes")]).unwrap_err();
    assert!(err.contains("SHADOW_MODE=yes"), "{err}");
    let err = load(&[], &[("REDIS_POOL_SIZE", "0")]).unwrap_err();
    assert!(
        err.contains("REDIS_POOL_SIZE") && err.contains("--redis-pool-size"),
        "{err}"
    );
    let err = load(&[], &[("GRPC_SERVER_USE_TLS", "true")]).unwrap_err();
    assert!(
        err.contains("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT"),
        "{err}"
    );
    let err = load(
        &[],
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "h:1"),
            ("REDIS_TLS_CLIENT_CERT", "/c.pem"),
        ],
    )
    .unwrap_err();
    assert!(
        err.contains("REDIS_TLS_CLIENT_CERT") && err.contains("--redis-tls-key"),
        "{err}"
    );
}

#[test]
fn grpc_tls_takes_the_client_ca_and_san() {
    let (config, _) = load(
        &[],
        &[
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/tls/cert.pem"),
            ("GRPC_SERVER_TLS_KEY", "/tls/key.pem"),
            ("GRPC_CLIENT_TLS_CACERT", "/tls/ca.pem"),
            ("GRPC_CLIENT_TLS_SAN", "client.example"),
        ],
    )
    .unwrap();
    assert_eq!(config.tls.tls_client_ca, Some(PathBuf::from("/tls/ca.pem")));
    assert_eq!(config.tls.tls_client_san.as_deref(), Some("client.example"));
    let (config, _) = load(&[], &[("GRPC_CLIENT_TLS_SAN", "client.example")]).unwrap();
    assert_eq!(
        config.tls.tls_client_san, None,
        "without GRPC_SERVER_USE_TLS, no TLS"
    );
}

#[test]
fn envoy_gateways_server_ca_asks_no_client_certificate_as_upstream_and_says_so() {
    let (config, report) = load(
        &[],
        &[
            ("USE_STATSD", "false"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/tls/cert.pem"),
            ("GRPC_SERVER_TLS_KEY", "/tls/key.pem"),
            ("GRPC_SERVER_TLS_CA_CERT", "/tls/ca.pem"),
        ],
    )
    .unwrap();
    assert_eq!(config.tls.tls_cert, Some(PathBuf::from("/tls/cert.pem")));
    assert_eq!(config.tls.tls_client_ca, None);
    let warning = report
        .warnings
        .iter()
        .find(|w| w.starts_with("GRPC_SERVER_TLS_CA_CERT=/tls/ca.pem has no effect"))
        .unwrap_or_else(|| panic!("no warning: {report:?}"));
    assert!(
        warning.contains("not asked for a certificate")
            && warning.contains("GRPC_CLIENT_TLS_CACERT (--tls-client-ca)"),
        "{warning}"
    );
}

#[test]
fn tuning_knobs_are_accepted_with_a_warning() {
    let (_, report) = load(
        &[],
        &[("USE_STATSD", "false"), ("REDIS_PIPELINE_WINDOW", "150us")],
    )
    .unwrap();
    assert!(
        report
            .warnings
            .iter()
            .any(|w| w.contains("REDIS_PIPELINE_WINDOW")),
        "{report:?}"
    );
}

#[test]
fn health_follows_the_store_as_upstreams_active_connection_check_says() {
    let (config, _) = load(&[], &[]).unwrap();
    assert!(config.store.health_follows_store, "ours follows by default");
    let (config, _) = load(&[], &[("USE_STATSD", "false")]).unwrap();
    assert!(!config.store.health_follows_store, "upstream's does not");
    assert_eq!(
        config.origins.of("health_follows_store"),
        Some("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")
    );
    let (config, _) = load(&[], &[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "T")]).unwrap();
    assert!(config.store.health_follows_store);
    let (config, _) = load(&["--health-follows-store"], &[("USE_STATSD", "false")]).unwrap();
    assert!(
        config.store.health_follows_store,
        "our flag wins over a default"
    );
    let err = load(&[], &[("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "maybe")]).unwrap_err();
    assert!(
        err.contains("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION"),
        "{err}"
    );
}

#[test]
fn never_reads_nothing_and_prometheus_maps_to_metrics() {
    let (config, report) = load(
        &["--envoyproxy-env", "never"],
        &[("USE_STATSD", "true"), ("GRPC_PORT", "1")],
    )
    .unwrap();
    assert!(!report.active);
    assert_eq!(config.listener.listen.to_string(), "127.0.0.1:50051");
    let (config, _) = load(&[], &[("USE_STATSD", "false"), ("USE_PROMETHEUS", "true")]).unwrap();
    assert_eq!(
        config
            .telemetry
            .metrics_listen
            .map(|a| a.to_string())
            .as_deref(),
        Some("0.0.0.0:9090")
    );
    let err = load(
        &["--metrics-listen", "127.0.0.1:1"],
        &[("DISABLE_STATS", "true")],
    )
    .unwrap_err();
    assert!(
        err.contains("DISABLE_STATS") && err.contains("--metrics-listen"),
        "{err}"
    );
}

#[test]
fn xds_config_type_takes_the_rules_from_the_server() {
    let (config, _) = load(
        &[],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
            ("CONFIG_GRPC_XDS_NODE_ID", "ratelimit-0"),
            ("CONFIG_GRPC_XDS_NODE_METADATA", "zone=a,pod=x"),
            (
                "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
                "authorization:Bearer t",
            ),
            ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "500ms"),
        ],
    )
    .unwrap();
    let xds = &config.envoy.xds;
    assert_eq!(xds.xds_server.as_deref(), Some("localhost:18000"));
    assert_eq!(config.envoy.config, None, "no runtime directory with xDS");
    assert_eq!(xds.xds_node_id, "ratelimit-0");
    assert_eq!(xds.xds_node_metadata.0.len(), 2);
    assert_eq!(
        xds.xds_headers.0.0,
        [("authorization".to_owned(), "Bearer t".to_owned())]
    );
    assert_eq!(xds.xds_retry_interval, Duration::from_millis(500));
}

#[test]
fn files_and_xds_together_are_an_error() {
    let (config, _) = load(&["--xds-server", "127.0.0.1:1"], &[("USE_STATSD", "false")]).unwrap();
    assert_eq!(
        config.envoy.config, None,
        "our --xds-server: no runtime directory"
    );
    let err = load(
        &["--xds-server", "127.0.0.1:1"],
        &[("RUNTIME_ROOT", "/data")],
    )
    .unwrap_err();
    assert!(
        err.contains("RUNTIME_ROOT") && err.contains("--xds-server"),
        "{err}"
    );
    let err = load(&["--config", "/etc/x"], &[("CONFIG_TYPE", "GRPC_XDS_SOTW")]).unwrap_err();
    assert!(
        err.contains("CONFIG_GRPC_XDS_SERVER_URL") && err.contains("--config"),
        "{err}"
    );
}

#[test]
fn an_error_about_a_flag_upstream_set_names_the_variable() {
    let (config, _) = load(
        &[],
        &[
            ("REDIS_TLS", "true"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "h:1"),
            ("REDIS_TLS_CACERT", "/nonexistent/ca.pem"),
        ],
    )
    .unwrap();
    let err = config.store.settings().err().expect("no such file");
    let err = config.invalid(err).to_string();
    assert!(
        err.contains("--redis-tls-ca") && err.contains("REDIS_TLS_CACERT"),
        "{err}"
    );
    assert!(matches!(
        Config::load_from(&["ratelimitd", "--listen"], &Environment::new()),
        Err(ConfigError::Parse(ParseError::Clap(_)))
    ));
}

#[test]
fn the_table_names_only_flags_we_have_and_help_names_the_variables() {
    let command = Config::annotated_command();
    for row in TABLE {
        if let Effect::Sets { flags, .. } = row.effect {
            for flag in flags {
                assert!(
                    command.get_arguments().any(|arg| arg.get_id() == flag),
                    "{flag} is not a flag"
                );
            }
        }
    }
    let help = command.clone().render_long_help().to_string();
    assert!(
        help.contains("[envoyproxy/ratelimit: GRPC_HOST, GRPC_PORT]"),
        "{help}"
    );
    assert!(help.contains("REDIS_TIMEOUT"), "{help}");
}

#[test]
fn worker_threads_default_to_the_cores_and_zero_is_refused() {
    let (config, _) = load(&[], &[]).unwrap();
    assert_eq!(config.runtime.worker_threads, None);
    let (config, _) = load(&["--worker-threads", "3"], &[]).unwrap();
    assert_eq!(config.runtime.worker_threads.map(|n| n.get()), Some(3));
    let err = load(&["--worker-threads", "0"], &[]).unwrap_err();
    assert!(err.contains("--worker-threads"), "{err}");
}

//! The rows of the HTTP and debug listeners (HOST/PORT, DEBUG_HOST/
//! DEBUG_PORT) and of the start and health (FORCE_START_WITHOUT_INITIAL_CONFIG,
//! HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED), and our own flags beside them.

use std::time::Duration;

use super::load;
use crate::config::Config;
use clap::Parser;

fn address(option: crate::options::AddressOrOff) -> Option<String> {
    option.0.map(|address| address.to_string())
}

#[test]
fn our_defaults_serve_http_on_loopback_and_no_debug() {
    let config = Config::parse_from(["ratelimitd"]);
    assert_eq!(
        address(config.http.http_listen).as_deref(),
        Some("127.0.0.1:8080")
    );
    assert_eq!(address(config.http.debug_listen), None);
    assert_eq!(config.listener.shutdown_delay.get(), None);
    assert!(!config.envoy.start_without_rules && !config.envoy.health_requires_rules);
    let config = Config::parse_from([
        "ratelimitd",
        "--http-listen=",
        "--debug-listen",
        "127.0.0.1:6070",
        "--shutdown-delay",
        "5s",
    ]);
    assert_eq!(address(config.http.http_listen), None, "empty: off");
    assert_eq!(
        address(config.http.debug_listen).as_deref(),
        Some("127.0.0.1:6070")
    );
    assert_eq!(
        config.listener.shutdown_delay.get(),
        Some(Duration::from_secs(5))
    );
    let err = Config::try_parse_from(["ratelimitd", "--http-listen", "localhost"]).unwrap_err();
    assert!(err.to_string().contains("--http-listen"), "{err}");
}

#[test]
fn host_and_port_set_the_http_listener_upstreams_default_on_every_address() {
    let (config, _) = load(&[], &[("USE_STATSD", "false")]).unwrap();
    assert_eq!(
        address(config.http.http_listen).as_deref(),
        Some("0.0.0.0:8080")
    );
    assert_eq!(config.origins.of("http_listen"), Some("HOST/PORT"));
    let (config, _) = load(
        &[],
        &[
            ("HOST", "127.0.0.1"),
            ("PORT", "9080"),
            ("USE_STATSD", "false"),
        ],
    )
    .unwrap();
    assert_eq!(
        address(config.http.http_listen).as_deref(),
        Some("127.0.0.1:9080")
    );
    let (config, report) = load(&[], &[("PORT", "9080")]).unwrap();
    assert!(!report.active, "PORT alone is anyone's");
    assert_eq!(
        address(config.http.http_listen).as_deref(),
        Some("127.0.0.1:8080")
    );
    // Our flag beats upstream's default, and must agree with what is set.
    let (config, _) = load(&["--http-listen="], &[("USE_STATSD", "false")]).unwrap();
    assert_eq!(address(config.http.http_listen), None);
    let err = load(
        &["--http-listen", "127.0.0.1:1"],
        &[("PORT", "2"), ("USE_STATSD", "false")],
    )
    .unwrap_err();
    assert!(
        err.contains("HOST/PORT") && err.contains("--http-listen"),
        "{err}"
    );
    let err = load(&[], &[("PORT", "http"), ("USE_STATSD", "false")]).unwrap_err();
    assert!(
        err.contains("PORT=http") && err.contains("not a port number"),
        "{err}"
    );
}

#[test]
fn debug_host_and_port_set_the_debug_listener() {
    let (config, _) = load(&[], &[("USE_STATSD", "false")]).unwrap();
    assert_eq!(
        address(config.http.debug_listen).as_deref(),
        Some("0.0.0.0:6070")
    );
    let (config, _) = load(
        &[],
        &[
            ("DEBUG_HOST", "127.0.0.1"),
            ("DEBUG_PORT", "16070"),
            ("USE_STATSD", "false"),
        ],
    )
    .unwrap();
    assert_eq!(
        address(config.http.debug_listen).as_deref(),
        Some("127.0.0.1:16070")
    );
    assert_eq!(
        config.origins.of("debug_listen"),
        Some("DEBUG_HOST/DEBUG_PORT")
    );
    let (config, _) = load(&["--debug-listen="], &[("USE_STATSD", "false")]).unwrap();
    assert_eq!(address(config.http.debug_listen), None, "ours turns it off");
}

#[test]
fn force_start_and_healthy_with_a_config_are_go_booleans() {
    let (config, _) = load(&[], &[("USE_STATSD", "false")]).unwrap();
    assert!(
        !config.envoy.start_without_rules,
        "upstream waits by default"
    );
    assert!(!config.envoy.health_requires_rules);
    let (config, _) = load(
        &[],
        &[
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "1"),
        ],
    )
    .unwrap();
    assert!(config.envoy.start_without_rules && config.envoy.health_requires_rules);
    for name in [
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    ] {
        let err = load(&[], &[(name, "yes")]).unwrap_err();
        assert!(err.contains(&format!("{name}=yes")), "{err}");
    }
    let err = load(
        &["--start-without-rules=false"],
        &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")],
    )
    .unwrap_err();
    assert!(err.contains("--start-without-rules"), "{err}");
}

//! The per-second Redis as a deployment gives it: our `--redis-persecond-*`
//! flags, and upstream's REDIS_PERSECOND variables, row by row.

use std::path::PathBuf;

use clap::Parser;

use super::load;
use crate::config::Config;
use crate::options::Secret;
use crate::store::{StoreSettings, Topology};

#[test]
fn our_flags_describe_a_second_redis_as_the_main_one_is() {
    let config = Config::parse_from([
        "ratelimitd",
        "--redis-url",
        "redis://main:1",
        "--redis-persecond-url",
        "redis://u:pw1@s1:1,redis://u:pw1@s2:2",
        "--redis-persecond-mode",
        "sentinel",
        "--redis-persecond-sentinel-master",
        "fast",
        "--redis-persecond-sentinel-auth",
        "sentinel:pw2",
    ]);
    let logged = format!("{config:?}");
    assert!(
        !logged.contains("pw1") && !logged.contains("pw2"),
        "{logged}"
    );
    let StoreSettings::Redis {
        redis, per_second, ..
    } = config.store.settings().unwrap()
    else {
        panic!("a Redis store");
    };
    let per_second = per_second.expect("a per-second Redis");
    assert_eq!(per_second.urls.len(), 2);
    assert_eq!(per_second.topology, Topology::Sentinel);
    assert_eq!(per_second.sentinel.master, "fast");
    assert_eq!(
        per_second
            .sentinel
            .credentials
            .as_ref()
            .unwrap()
            .user
            .as_deref(),
        Some("sentinel")
    );
    assert_eq!(per_second.pool_size, 32, "the main pool's size by default");
    assert_eq!(per_second.command_timeout, redis.command_timeout);
    let config = Config::parse_from([
        "ratelimitd",
        "--redis-url",
        "redis://main:1",
        "--redis-persecond-url",
        "redis://fast:1",
        "--redis-persecond-pool-size",
        "4",
    ]);
    let StoreSettings::Redis { per_second, .. } = config.store.settings().unwrap() else {
        panic!("a Redis store");
    };
    assert_eq!(per_second.expect("a per-second Redis").pool_size, 4);
}

#[test]
fn what_a_per_second_redis_cannot_be_is_refused_by_flag() {
    let config = Config::parse_from(["ratelimitd", "--redis-persecond-url", "redis://fast:1"]);
    let err = config.invalid(config.store.settings().err().expect("no main Redis"));
    assert!(
        err.to_string()
            .starts_with("--redis-persecond-url: a per-second Redis needs a main one"),
        "{err}"
    );
    let config = Config::parse_from([
        "ratelimitd",
        "--redis-url",
        "redis://main:1",
        "--redis-persecond-url",
        "redis://a:1,redis://b:2",
    ]);
    let err = config.invalid(config.store.settings().err().expect("two standalone URLs"));
    assert!(
        err.to_string().starts_with(
            "--redis-persecond-url: a standalone Redis takes one URL (several are for \
             --redis-persecond-mode cluster"
        ),
        "{err}"
    );
    for flags in [
        &["--redis-persecond-mode", "cluster"][..],
        &["--redis-persecond-pool-size", "3"],
        &["--redis-persecond-tls-ca", "/ca.pem"],
        &["--redis-persecond-sentinel-auth", "pw"],
    ] {
        let args = ["ratelimitd", "--redis-url", "redis://main:1"]
            .iter()
            .chain(flags);
        let err = Config::try_parse_from(args).expect_err("without --redis-persecond-url");
        assert!(err.to_string().contains("--redis-persecond-url"), "{err}");
    }
    let config = Config::parse_from([
        "ratelimitd",
        "--redis-url",
        "redis://main:1",
        "--redis-persecond-url",
        "rediss://fast:1",
        "--redis-persecond-tls-ca",
        "/nonexistent/ca.pem",
    ]);
    let err = config.invalid(config.store.settings().err().expect("no such file"));
    assert!(
        err.to_string()
            .starts_with("--redis-persecond-tls-ca: cannot read"),
        "{err}"
    );
}

#[test]
fn redis_persecond_switches_on_a_second_redis_described_as_redis_url_is() {
    let (config, _) = load(
        &[],
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "127.0.0.1:6380"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", "127.0.0.1:6381"),
            ("REDIS_PERSECOND_AUTH", "app:p@ss"),
            ("REDIS_PERSECOND_TLS", "true"),
            ("REDIS_PERSECOND_POOL_SIZE", "7"),
        ],
    )
    .unwrap();
    assert_eq!(config.store.redis_url, ["redis://127.0.0.1:6380"]);
    assert_eq!(
        config.store.redis_persecond_url,
        ["rediss://app:p%40ss@127.0.0.1:6381"]
    );
    assert_eq!(config.store.redis_persecond_mode, Topology::Standalone);
    assert_eq!(config.store.redis_persecond_pool_size, Some(7));
    assert_eq!(
        config.origins.of("redis_persecond_url"),
        Some("REDIS_PERSECOND_URL")
    );
    let (config, _) = load(
        &[],
        &[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "127.0.0.1:6380"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_TYPE", "sentinel"),
            (
                "REDIS_PERSECOND_URL",
                "fast,127.0.0.1:26379,127.0.0.1:26380",
            ),
            ("REDIS_PERSECOND_SENTINEL_AUTH", "s3cret"),
        ],
    )
    .unwrap();
    assert_eq!(config.store.redis_persecond_mode, Topology::Sentinel);
    assert_eq!(config.store.redis_persecond_sentinel_master, "fast");
    assert_eq!(config.store.redis_persecond_url.len(), 2);
    assert_eq!(
        config
            .store
            .redis_persecond_sentinel_auth
            .as_ref()
            .map(Secret::expose),
        Some("s3cret")
    );
    let err = load(
        &[],
        &[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_TYPE", "cluster"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", "nocolon"),
        ],
    )
    .unwrap_err();
    assert!(
        err.contains("REDIS_PERSECOND_URL=nocolon") && err.contains("host:port"),
        "{err}"
    );
}

#[test]
fn redis_persecond_defaults_to_upstreams_socket_and_its_variables_wait_for_it() {
    let (config, _) = load(&[], &[("REDIS_PERSECOND", "true")]).unwrap();
    assert_eq!(
        config.store.redis_persecond_url,
        ["redis+unix:///var/run/nutcracker/ratelimitpersecond.sock"]
    );
    assert_eq!(config.store.redis_persecond_pool_size, Some(10));
    let (config, _) = load(
        &[],
        &[
            ("REDIS_PERSECOND", "false"),
            ("REDIS_PERSECOND_URL", "127.0.0.1:1"),
            ("REDIS_PERSECOND_POOL_SIZE", "3"),
            ("REDIS_PERSECOND_SENTINEL_AUTH", "x"),
        ],
    )
    .unwrap();
    assert!(config.store.redis_persecond_url.is_empty());
    assert_eq!(config.store.redis_persecond_pool_size, None);
    assert!(config.store.redis_persecond_sentinel_auth.is_none());
    let err = load(&[], &[("REDIS_PERSECOND", "yes")]).unwrap_err();
    assert!(err.contains("REDIS_PERSECOND=yes"), "{err}");
}

#[test]
fn our_per_second_flag_wins_over_upstreams_default_and_conflicts_are_errors() {
    let ours = ["--redis-persecond-url", "redis://fast:1"];
    let (config, _) = load(&ours, &[("REDIS_PERSECOND", "true")]).unwrap();
    assert_eq!(config.store.redis_persecond_url, ["redis://fast:1"]);
    let err = load(
        &ours,
        &[
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", "other:2"),
            ("REDIS_PERSECOND_AUTH", "s3cret"),
        ],
    )
    .unwrap_err();
    assert!(
        err.contains("REDIS_PERSECOND_URL")
            && err.contains("--redis-persecond-url")
            && !err.contains("s3cret"),
        "{err}"
    );
}

#[test]
fn redis_tls_files_serve_whichever_redis_is_over_tls() {
    let tls_files = [
        ("REDIS_TLS_CACERT", "/tls/ca.pem"),
        ("REDIS_TLS_CLIENT_CERT", "/tls/cert.pem"),
        ("REDIS_TLS_CLIENT_KEY", "/tls/key.pem"),
    ];
    let with = |switches: &[(&'static str, &'static str)]| {
        let mut variables = vec![
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "h:1"),
            ("REDIS_PERSECOND", "true"),
            ("REDIS_PERSECOND_SOCKET_TYPE", "tcp"),
            ("REDIS_PERSECOND_URL", "h:2"),
        ];
        variables.extend_from_slice(switches);
        variables.extend_from_slice(&tls_files);
        load(&[], &variables).unwrap().0.store
    };
    let both = with(&[("REDIS_TLS", "true"), ("REDIS_PERSECOND_TLS", "true")]);
    assert_eq!(both.redis_tls_ca, Some(PathBuf::from("/tls/ca.pem")));
    assert_eq!(
        both.redis_persecond_tls_ca,
        Some(PathBuf::from("/tls/ca.pem"))
    );
    assert_eq!(
        both.redis_persecond_tls_key,
        Some(PathBuf::from("/tls/key.pem"))
    );
    let per_second_only = with(&[("REDIS_PERSECOND_TLS", "true")]);
    assert_eq!(per_second_only.redis_tls_cert, None);
    assert_eq!(
        per_second_only.redis_persecond_tls_cert,
        Some(PathBuf::from("/tls/cert.pem"))
    );
    let main_only = with(&[("REDIS_TLS", "true")]);
    assert_eq!(main_only.redis_tls_ca, Some(PathBuf::from("/tls/ca.pem")));
    assert_eq!(main_only.redis_persecond_tls_ca, None);
}

#[test]
fn per_second_tuning_is_warned_about_and_an_empty_pool_only_waits() {
    let (_, report) = load(
        &[],
        &[
            ("USE_STATSD", "false"),
            ("REDIS_PERSECOND_TIMEOUT", "1s"),
            ("REDIS_PERSECOND_PIPELINE_WINDOW", "150us"),
            ("REDIS_PERSECOND_PIPELINE_LIMIT", "8"),
            ("REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "4"),
            ("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "wait"),
        ],
    )
    .unwrap();
    for name in [
        "REDIS_PERSECOND_TIMEOUT",
        "REDIS_PERSECOND_PIPELINE_WINDOW",
        "REDIS_PERSECOND_PIPELINE_LIMIT",
        "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM",
    ] {
        assert!(
            report.warnings.iter().any(|w| w.starts_with(name)),
            "{name}: {report:?}"
        );
    }
    let err = load(&[], &[("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "CREATE")]).unwrap_err();
    assert!(
        err.contains("REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR=CREATE"),
        "{err}"
    );
}

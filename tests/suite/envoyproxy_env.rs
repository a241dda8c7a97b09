//! ratelimitd started as envoyproxy/ratelimit deployments start it: no
//! flags, only upstream's environment variables, its runtime layout, and
//! upstream's defaults (no key prefix, denied hits counted); and what it
//! cannot honour stops the start, naming the variable.

use crate::common;

use std::process::{Command, Stdio};

use common::rls::{descriptor, with_hits};
use common::{RedisServer, ServerProcess};
use ratelimitd::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

/// Upstream's README example 2, unchanged.
const MESSAGING: &str = include_str!("../fixtures/ratelimit/example2.yaml");

#[tokio::test]
async fn started_by_upstreams_variables_it_behaves_as_upstream() {
    let redis = RedisServer::start().await;
    let runtime = tempfile::tempdir().expect("runtime root");
    let config = runtime.path().join("ratelimit").join("config");
    std::fs::create_dir_all(config.join("nested")).expect("runtime directories");
    // Upstream's loader reads every file below the app directory, whatever
    // its name; dotfiles are skipped with RUNTIME_IGNOREDOTFILES.
    std::fs::write(config.join("nested").join("messaging"), MESSAGING).expect("config");
    std::fs::write(config.join(".broken.yaml"), "domain: [").expect("dotfile");
    let redis_url = format!("127.0.0.1:{}", redis.port());
    let root = runtime.path().to_str().expect("utf-8 path");
    let server = ServerProcess::builder()
        .env(&[
            ("USE_STATSD", "false"),
            ("LOG_LEVEL", "debug"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &redis_url),
            ("RUNTIME_ROOT", root),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("REDIS_PIPELINE_WINDOW", "150us"),
            // Envoy Gateway's, which upstream does not read.
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ])
        .upstream_way()
        .start()
        .await;
    let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
    let both = |hits| RateLimitRequest {
        domain: "messaging".into(),
        descriptors: vec![
            with_hits(descriptor(&[("to_number", "9")]), hits),
            with_hits(
                descriptor(&[("message_type", "marketing"), ("to_number", "9")]),
                hits,
            ),
        ],
        hits_addend: 0,
    };
    let denied = client
        .should_rate_limit(both(6))
        .await
        .expect("ShouldRateLimit")
        .into_inner();
    assert_eq!(denied.overall_code(), Code::OverLimit);
    // Upstream counts denied hits: the other descriptor spent its 6.
    assert_eq!(denied.statuses[0].limit_remaining, 94);
    // No key prefix (CACHE_KEY_PREFIX defaults to empty).
    let keys = redis.keys().await;
    assert!(
        !keys.is_empty() && keys.iter().all(|key| !key.starts_with("ratelimitd:")),
        "{keys:?}"
    );
    let log = server.log();
    assert!(
        log.contains("envoyproxy/ratelimit's environment variables in use"),
        "{log}"
    );
    assert!(
        log.contains("REDIS_PIPELINE_WINDOW=150us has no effect"),
        "{log}"
    );
    assert!(
        log.contains("GRPC_SERVER_TLS_CA_CERT=/certs/ca.crt has no effect here")
            && log.contains("GRPC_CLIENT_TLS_CACERT (--tls-client-ca)"),
        "{log}"
    );
    assert!(log.contains("DEBUG"), "LOG_LEVEL=debug: {log}");
    server.terminate().await;
}

/// Runs the binary with `environment` until it exits: its status and log.
fn run_to_exit(environment: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    // Every listener on loopback, on a port the system chooses.
    let output = Command::new(env!("CARGO_BIN_EXE_ratelimitd"))
        .envs([("HOST", "127.0.0.1"), ("PORT", "0")])
        .envs([("DEBUG_HOST", "127.0.0.1"), ("DEBUG_PORT", "0")])
        .envs(environment.iter().copied())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run the ratelimitd binary");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn what_it_cannot_honour_stops_the_start_by_name() {
    for (name, value) in [
        ("TRACING_ENABLED", "true"),
        ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
        ("REDIS_PERSECOND", "true"),
        ("BACKEND_TYPE", "memcache"),
    ] {
        let (status, log) = run_to_exit(&[(name, value)]);
        assert!(!status.success(), "{name}={value} started");
        assert!(log.contains(name), "{name}: {log}");
    }
    // Our flag and upstream's variable disagreeing is an error too.
    let (status, log) = run_to_exit(&[
        ("USE_STATSD", "false"),
        ("RATELIMITD_KEY_PREFIX", "a:"),
        ("CACHE_KEY_PREFIX", "b:"),
    ]);
    assert!(!status.success());
    assert!(
        log.contains("CACHE_KEY_PREFIX") && log.contains("--key-prefix"),
        "{log}"
    );
}

//! The HTTP side as envoyproxy/ratelimit's deployments use it, against the
//! binary started the upstream way (HOST/PORT and DEBUG_HOST/DEBUG_PORT on
//! loopback): `/healthcheck` (200 `OK`, or 500 while the store is down
//! under a failure policy that does not answer, or while no rules are
//! loaded when health requires them), `/json` with upstream's statuses
//! and body shapes, and the debug listener's `/rlconfig`, `/metrics` and
//! its listing.

use crate::common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::http::{HttpResponse, body_json, get, post, request};
use common::{RedisServer, ServerProcess};
use serde_json::json;
use tonic_health::pb::health_check_response::ServingStatus;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/upstream_integration"
);

/// Upstream's variables for `redis` and the rules under `root`, plus `more`.
fn environment<'a>(
    redis: &'a str,
    root: &'a str,
    more: &[(&'a str, &'a str)],
) -> Vec<(&'a str, &'a str)> {
    let mut environment = vec![
        ("USE_STATSD", "false"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis),
        ("RUNTIME_ROOT", root),
        ("RUNTIME_SUBDIRECTORY", "ratelimit"),
        ("RUNTIME_APPDIRECTORY", "config"),
        // Ours: notice a Redis that stops quickly.
        ("RATELIMITD_HEALTH_INTERVAL", "100ms"),
        ("RATELIMITD_REDIS_COMMAND_TIMEOUT", "300ms"),
    ];
    environment.extend_from_slice(more);
    environment
}

async fn healthcheck(port: u16) -> Option<u16> {
    get(port, "/healthcheck", &[])
        .await
        .map(|response| response.status)
}

/// A value no earlier run used.
fn fresh_value() -> String {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
        .to_string()
}

/// Upstream's answer to a bad request: Go's `http.Error`.
fn assert_go_error(response: &HttpResponse, status: u16, text: &str) {
    assert_eq!(response.status, status, "{response:?}");
    assert_eq!(response.body, format!("{text}\n"), "{response:?}");
    assert_eq!(
        response.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(response.header("x-content-type-options"), Some("nosniff"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_answers_as_upstream_with_its_statuses_and_shapes() {
    let redis = RedisServer::start().await;
    let address = format!("127.0.0.1:{}", redis.port());
    let follows = [("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true")];
    let server = ServerProcess::builder()
        .env(&environment(&address, FIXTURE, &follows))
        .upstream_way()
        .start()
        .await;
    let port = server.http_port();
    let ok = get(port, "/healthcheck", &[]).await.expect("an answer");
    assert_eq!((ok.status, ok.body.as_str()), (200, "OK"), "{ok:?}");
    assert_eq!(ok.header("content-type"), Some("text/plain; charset=utf-8"));

    // One a minute, on a value no run used: allowed, then over the limit.
    common::fresh_minute().await;
    let ask = format!(
        r#"{{"domain": "basic", "descriptors": [{{"entries": [{{"key": "one_per_minute", "value": "{}"}}]}}]}}"#,
        fresh_value()
    );
    let allowed = post(port, "/json", &ask).await.expect("an answer");
    assert_eq!(allowed.status, 200, "{allowed:?}");
    assert_eq!(allowed.header("content-type"), Some("application/json"));
    let mut body = body_json(&allowed);
    let reset = body["statuses"][0]
        .as_object_mut()
        .and_then(|status| status.remove("durationUntilReset"))
        .expect("durationUntilReset");
    assert!(
        reset.as_str().is_some_and(|text| text.ends_with('s')),
        "{reset}"
    );
    assert_eq!(
        body,
        json!({
            "overallCode": "OK",
            "statuses": [{
                "code": "OK",
                "currentLimit": {"requestsPerUnit": 1, "unit": "MINUTE"}
            }]
        })
    );
    let over = post(port, "/json", &ask).await.expect("an answer");
    assert_eq!(over.status, 429, "{over:?}");
    let body = body_json(&over);
    assert_eq!(body["overallCode"], "OVER_LIMIT");
    assert_eq!(body["statuses"][0]["code"], "OVER_LIMIT");
    assert_eq!(body["statuses"][0]["currentLimit"]["requestsPerUnit"], 1);

    // A domain nobody configured: OK, no limit. Field names in proto form
    // are read too, as protojson reads them.
    let unconfigured = post(
        port,
        "/json",
        r#"{"domain": "nobody", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}], "hits_addend": 1}"#,
    )
    .await
    .expect("an answer");
    assert_eq!(unconfigured.status, 200, "{unconfigured:?}");
    assert_eq!(
        body_json(&unconfigured),
        json!({"overallCode": "OK", "statuses": [{"code": "OK"}]})
    );

    // What is not a RateLimitRequest, and what the service refuses: 400.
    for bad in [
        r#"{"domain": "basic", "descriptors": ["#,
        r#"{"domain": "basic", "unknown": 1}"#,
        r#"{"domain": "", "descriptors": [{"entries": [{"key": "k"}]}]}"#,
        r#"{"domain": "basic", "descriptors": []}"#,
    ] {
        let answer = post(port, "/json", bad).await.expect("an answer");
        assert_go_error(&answer, 400, "Bad Request");
    }
    let empty = get(port, "/json", &[]).await.expect("an answer");
    assert_go_error(&empty, 400, "Bad Request");
    let elsewhere = get(port, "/nothing-here", &[]).await.expect("an answer");
    assert_go_error(&elsewhere, 404, "404 page not found");

    // The store gone with a policy that does not answer: 500, and health
    // says so until it is back.
    let mut redis = redis;
    redis.kill();
    common::eventually("/healthcheck to say 500", || async {
        healthcheck(port).await == Some(500)
    })
    .await;
    let down = post(port, "/json", &ask).await.expect("an answer");
    assert_go_error(&down, 500, "Internal Server Error");
    let unhealthy = get(port, "/healthcheck", &[]).await.expect("an answer");
    assert_eq!(unhealthy.body, "", "upstream's 500 has no body");
    redis.restart().await;
    common::eventually("/healthcheck to say 200 again", || async {
        healthcheck(port).await == Some(200)
    })
    .await;
    let any_method = request(port, "HEAD", "/healthcheck", &[], "").await;
    assert_eq!(any_method.map(|answer| answer.status), Some(200));
    server.terminate().await;
}

/// Upstream's health follows Redis only with
/// REDIS_HEALTH_CHECK_ACTIVE_CONNECTION: without it, a Redis outage leaves
/// `/healthcheck` and gRPC health up (Envoy Gateway probes liveness there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_redis_only_when_upstream_asks() {
    for (active, down) in [
        (None, (200, ServingStatus::Serving)),
        (Some("true"), (500, ServingStatus::NotServing)),
    ] {
        let mut redis = RedisServer::start().await;
        let address = format!("127.0.0.1:{}", redis.port());
        let more: Vec<(&str, &str)> = active
            .map(|value| ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", value))
            .into_iter()
            .collect();
        let server = ServerProcess::builder()
            .env(&environment(&address, FIXTURE, &more))
            .upstream_way()
            .start()
            .await;
        let port = server.http_port();
        assert_eq!(healthcheck(port).await, Some(200));
        redis.kill();
        common::eventually("the probe to log that Redis does not answer", || async {
            server.log().contains("store does not answer")
        })
        .await;
        common::eventually("/healthcheck and gRPC health to settle", || async {
            healthcheck(port).await == Some(down.0)
                && common::health_status(server.address, "").await == Some(down.1)
        })
        .await;
        assert_eq!(
            healthcheck(port).await,
            Some(down.0),
            "{active:?}: {}",
            server.log()
        );
        server.terminate().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_debug_listener_prints_the_rules_and_the_metrics() {
    let redis = RedisServer::start().await;
    let address = format!("127.0.0.1:{}", redis.port());
    let server = ServerProcess::builder()
        .env(&environment(&address, FIXTURE, &[]))
        .upstream_way()
        .start()
        .await;
    let debug = server.debug.expect("a debug listener").port();
    let rlconfig = get(debug, "/rlconfig", &[]).await.expect("an answer");
    assert_eq!(rlconfig.status, 200);
    assert_eq!(
        rlconfig.body,
        "\
another.key2: unit=MINUTE requests_per_unit=20, shadow_mode: false, quota_mode: false
another.key2_local: unit=MINUTE requests_per_unit=20, shadow_mode: false, quota_mode: false
another.key3: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false
another.key3_local: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false
another.key4: unit=DAY requests_per_unit=20, shadow_mode: false, quota_mode: false
another.key4_local: unit=DAY requests_per_unit=20, shadow_mode: false, quota_mode: false
basic.key1: unit=SECOND requests_per_unit=50, shadow_mode: false, quota_mode: false
basic.key1_local: unit=SECOND requests_per_unit=50, shadow_mode: false, quota_mode: false
basic.one_per_minute: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false
share-threshold-test.files_files/*: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false
share-threshold-test.files_no_share_files_no_share/*: unit=HOUR requests_per_unit=10, shadow_mode: false, quota_mode: false
"
    );
    // Any other path lists the endpoints, as upstream's does.
    for path in ["/", "/debug/pprof/"] {
        let listing = get(debug, path, &[]).await.expect("an answer");
        assert_eq!(
            listing.body,
            "/metrics: print out metrics in the Prometheus text format\n\
             /rlconfig: print out the currently loaded configuration for debugging\n",
            "{path}"
        );
    }
    // Upstream's statistics under their Prometheus names, without
    // USE_PROMETHEUS: the debug listener has them.
    let metrics = get(debug, "/metrics", &[]).await.expect("an answer");
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .body
            .contains("ratelimit_service_config_load_success"),
        "{}",
        metrics.body
    );
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_healthy_with_at_least_one_config_loaded_health_waits_for_rules() {
    let redis = RedisServer::start().await;
    let address = format!("127.0.0.1:{}", redis.port());
    let root = tempfile::tempdir().expect("a runtime root");
    let config = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).expect("the config directory");
    let root_path = root.path().to_string_lossy().into_owned();
    let more = [
        ("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true"),
        ("RATELIMITD_CONFIG_POLL_INTERVAL", "100ms"),
        // For the log line that says the store answers.
        ("LOG_LEVEL", "info"),
    ];
    let server = ServerProcess::builder()
        .env(&environment(&address, &root_path, &more))
        .upstream_way()
        .bound()
        .await;
    let port = server.http_port();
    common::eventually("the store to answer", || async {
        server.log().contains("store answers")
    })
    .await;
    assert_eq!(healthcheck(port).await, Some(500), "no rules yet");
    assert_eq!(
        common::health_status(server.address, "").await,
        Some(ServingStatus::NotServing)
    );
    std::fs::write(
        config.join("limits.yaml"),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .expect("write the rules");
    common::eventually("/healthcheck to say 200 once rules load", || async {
        healthcheck(port).await == Some(200)
    })
    .await;
    common::await_health(server.address, ServingStatus::Serving).await;
    // A configuration without a domain: unhealthy again, as upstream.
    std::fs::remove_file(config.join("limits.yaml")).expect("remove the rules");
    common::eventually("/healthcheck to say 500 without rules", || async {
        healthcheck(port).await == Some(500)
    })
    .await;
    server.terminate().await;
}

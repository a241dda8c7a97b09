//! The proof behind a real Envoy: examples/envoy/envoy.yaml in front of an
//! upstream, asking ratelimitd with examples/envoy/limits.yaml, on the
//! embedded store and on Redis. Through Envoy: 200s up to the limit, then
//! 429 with `x-envoy-ratelimited`; the `x-ratelimit-*` headers right; users
//! limited apart; the sliding-window and token-bucket rules behaving as
//! such; a reload changing the limit; and, with ratelimitd stopped, Envoy
//! failing open as configured.

use crate::common;

use common::envoy::{Envoy, EnvoyPorts};
use common::http::{HttpResponse, start_upstream};
use common::{RedisServer, TestServer};

const LIMITS: &str = include_str!("../../examples/envoy/limits.yaml");

fn header_number(response: &HttpResponse, name: &str) -> u64 {
    let value = response
        .header(name)
        .unwrap_or_else(|| panic!("no {name} in {response:?}"));
    // x-ratelimit-limit is "<limit>, <quota policies>": the limit comes first.
    value
        .split(',')
        .next()
        .and_then(|first| first.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name}: {value}"))
}

fn limited_header(response: &HttpResponse) -> String {
    response
        .header("x-ratelimit-limit")
        .unwrap_or_else(|| panic!("no x-ratelimit-limit in {response:?}"))
        .to_owned()
}

async fn as_user(envoy: &Envoy, user: &str) -> HttpResponse {
    envoy.get("/", &[("x-user-id", user)]).await
}

/// Asks as `user` until the answer is `status` (within the tests' patience).
async fn await_status(envoy: &Envoy, user: &str, status: u16) -> HttpResponse {
    let deadline = std::time::Instant::now() + common::PATIENCE;
    loop {
        let response = as_user(envoy, user).await;
        if response.status == status {
            return response;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{user} never got {status}; last: {response:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

async fn scenario(store_flags: &[&str]) {
    let dir = tempfile::tempdir().expect("config directory");
    let limits = dir.path().join("limits.yaml");
    std::fs::write(&limits, LIMITS).expect("write limits");
    let limits_path = limits.to_string_lossy().into_owned();
    let mut flags = vec!["--config", &limits_path, "--config-poll-interval", "100ms"];
    flags.extend_from_slice(store_flags);
    let ratelimitd = TestServer::start(&flags).await;
    let envoy = Envoy::start(EnvoyPorts {
        ratelimitd: ratelimitd.address.port(),
        upstream: start_upstream().await,
    })
    .await;

    // 3 an hour per user: 200, 200, 200, then 429.
    for remaining in [2, 1, 0] {
        let response = as_user(&envoy, "alice").await;
        assert_eq!(response.status, 200, "{response:?}");
        assert_eq!(header_number(&response, "x-ratelimit-limit"), 3);
        assert_eq!(header_number(&response, "x-ratelimit-remaining"), remaining);
        let reset = header_number(&response, "x-ratelimit-reset");
        assert!((1..=3600).contains(&reset), "reset {reset}");
    }
    // Envoy lists every descriptor's limit after the tightest: the generic
    // key's and the client address's rules matched too.
    let policies = limited_header(&as_user(&envoy, "carol").await);
    assert!(
        policies.contains("1000;w=60"),
        "generic_key rule: {policies}"
    );
    assert!(
        policies.contains("10000;w=3600"),
        "remote_address rule: {policies}"
    );
    let limited = as_user(&envoy, "alice").await;
    assert_eq!(limited.status, 429, "{limited:?}");
    assert_eq!(limited.header("x-envoy-ratelimited"), Some("true"));
    assert_eq!(header_number(&limited, "x-ratelimit-remaining"), 0);

    // Another user has a counter of their own.
    assert_eq!(as_user(&envoy, "bob").await.status, 200);

    // Sliding window: 2 in any 2 s. Denied requests spend nothing, so
    // asking again until it passes is fair.
    assert_eq!(as_user(&envoy, "slider-1").await.status, 200);
    assert_eq!(as_user(&envoy, "slider-1").await.status, 200);
    let limited = as_user(&envoy, "slider-1").await;
    assert_eq!(limited.status, 429);
    let reset = header_number(&limited, "x-ratelimit-reset");
    assert!(
        (1..=2).contains(&reset),
        "a unit leaves within 2 s, not {reset}"
    );
    await_status(&envoy, "slider-1", 200).await;

    // Token bucket: a burst of 2, then one token every 0.5 s.
    assert_eq!(as_user(&envoy, "bucket-1").await.status, 200);
    assert_eq!(as_user(&envoy, "bucket-1").await.status, 200);
    let limited = as_user(&envoy, "bucket-1").await;
    assert_eq!(limited.status, 429);
    assert_eq!(header_number(&limited, "x-ratelimit-reset"), 1);
    let refilled = await_status(&envoy, "bucket-1", 200).await;
    assert_eq!(header_number(&refilled, "x-ratelimit-remaining"), 0);

    // A reload raises the per-user limit from 3 to 5 an hour: alice, denied
    // so far, gets through again without anything restarting.
    let raised = LIMITS.replace(
        "name: per-user\n      unit: hour\n      requests_per_unit: 3",
        "name: per-user\n      unit: hour\n      requests_per_unit: 5",
    );
    assert_ne!(raised, LIMITS, "the limits file has the per-user rule");
    std::fs::write(&limits, raised).expect("rewrite limits");
    let passed = await_status(&envoy, "alice", 200).await;
    assert_eq!(header_number(&passed, "x-ratelimit-limit"), 5);
    assert_eq!(header_number(&passed, "x-ratelimit-remaining"), 1);

    // ratelimitd gone: Envoy fails open (failure_mode_deny: false).
    ratelimitd.stop().await;
    let open = await_status(&envoy, "alice", 200).await;
    assert_eq!(open.header("x-envoy-ratelimited"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_enforces_limits_decided_on_the_embedded_store() {
    scenario(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_enforces_limits_decided_on_redis() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    scenario(&["--redis-url", &url]).await;
    redis.assert_every_key_expires().await;
}

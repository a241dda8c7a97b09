//! When Redis cannot answer, the failure policy does, promptly: fail closed
//! (UNAVAILABLE), fail open (allow, degraded) or local (this instance's own
//! store, degraded); per server and per call; for both APIs. A circuit
//! breaker stops calls from waiting on a hung Redis. And under steady load,
//! a Redis killed for 3 s and restarted: no hung call, every answer by the
//! policy, health both ways, exact decisions after.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{
    RedisServer, TestServer, await_health, fixed_window, request, server_quick_to_notice,
};
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimitd::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratelimitd::pb::ratelimitd::v1 as pb;
use tonic::Code as GrpcCode;
use tonic_health::pb::health_check_response::ServingStatus;

/// Only a hang would exceed this: the timeout plus room for a slow machine.
const HANG: Duration = Duration::from_secs(3);

/// A CheckLimit call that must be answered (with a decision) in time.
async fn decide(server: &TestServer, call: pb::CheckLimitRequest) -> pb::CheckLimitResponse {
    let started = Instant::now();
    let answer = server.client().await.check_limit(call).await;
    assert!(started.elapsed() < HANG, "took {:?}", started.elapsed());
    answer.expect("a decision").into_inner()
}

fn limit_two() -> pb::check_limit_request::Algorithm {
    fixed_window(2, Duration::from_secs(60))
}

#[tokio::test]
async fn fail_open_allows_and_says_degraded_while_redis_is_down() {
    let mut redis = RedisServer::start().await;
    let server = server_quick_to_notice(&redis, &["--failure-policy", "fail-open"]).await;
    redis.kill();
    for _ in 0..5 {
        let answer = decide(&server, request("k", limit_two(), None)).await;
        assert!(answer.allowed && answer.degraded, "{answer:?}");
    }
    let never = decide(&server, request("k", limit_two(), Some(3))).await;
    assert!(
        !never.allowed && never.cost_exceeds_limit,
        "a cost above the limit never passes"
    );
    assert_eq!(
        common::health_status(server.address, "").await,
        Some(ServingStatus::Serving)
    );

    redis.restart().await;
    common::eventually("decisions from Redis again", || async {
        !decide(&server, request("k2", limit_two(), Some(0)))
            .await
            .degraded
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn local_enforces_limits_on_the_instance_while_redis_is_down() {
    let mut redis = RedisServer::start().await;
    let server = server_quick_to_notice(&redis, &["--failure-policy", "local"]).await;
    redis.kill();
    let first = decide(&server, request("k", limit_two(), None)).await;
    let second = decide(&server, request("k", limit_two(), None)).await;
    let third = decide(&server, request("k", limit_two(), None)).await;
    assert!(first.allowed && second.allowed && !third.allowed);
    assert!(first.degraded && second.degraded && third.degraded);
    assert_eq!(third.remaining, 0);
    server.stop().await;
}

#[tokio::test]
async fn a_call_names_its_own_policy() {
    let mut redis = RedisServer::start().await;
    let server = server_quick_to_notice(&redis, &[]).await;
    redis.kill();
    let status = server
        .client()
        .await
        .check_limit(request("k", limit_two(), None))
        .await
        .expect_err("the server fails closed");
    assert_eq!(status.code(), GrpcCode::Unavailable);
    let open = pb::CheckLimitRequest {
        failure_policy: Some(pb::FailurePolicy::FailOpen as i32),
        ..request("k", limit_two(), None)
    };
    let answer = decide(&server, open).await;
    assert!(answer.allowed && answer.degraded);
    let bad = pb::CheckLimitRequest {
        failure_policy: Some(42),
        ..request("k", limit_two(), None)
    };
    let status = server
        .client()
        .await
        .check_limit(bad)
        .await
        .expect_err("unknown policy");
    assert_eq!(status.code(), GrpcCode::InvalidArgument);
    assert!(
        status.message().starts_with("failure_policy: "),
        "{status:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn the_breaker_stops_calls_waiting_on_a_hung_redis() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    // A long timeout, so that waiting on Redis and not waiting are far apart.
    let server = TestServer::start(&[
        "--redis-url",
        &url,
        "--redis-command-timeout",
        "2s",
        "--redis-breaker-threshold",
        "2",
        "--health-interval",
        "200ms",
        "--failure-policy",
        "fail-open",
    ])
    .await;
    await_health(server.address, ServingStatus::Serving).await;
    redis.freeze();
    // Two calls wait out the timeout and open the breaker (the health probe
    // may open it first).
    for _ in 0..2 {
        assert!(
            decide(&server, request("k", limit_two(), None))
                .await
                .degraded
        );
    }
    for _ in 0..10 {
        let started = Instant::now();
        let answer = decide(&server, request("k", limit_two(), None)).await;
        assert!(answer.degraded);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "with the breaker open a call must not wait the 2 s timeout: {:?}",
            started.elapsed()
        );
    }
    redis.thaw();
    common::eventually("the probe to close the breaker", || async {
        !decide(&server, request("k2", limit_two(), Some(0)))
            .await
            .degraded
    })
    .await;
    server.stop().await;
}

fn envoy_descriptor() -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: "key".into(),
            value: "value".into(),
        }],
        ..Default::default()
    }
}

async fn ask_envoy(address: SocketAddr) -> Result<RateLimitResponse, tonic::Status> {
    let mut client = RateLimitServiceClient::new(common::channel(address).await);
    let started = Instant::now();
    let answer = client
        .should_rate_limit(RateLimitRequest {
            domain: "example4a".into(),
            descriptors: vec![envoy_descriptor()],
            hits_addend: 0,
        })
        .await
        .map(tonic::Response::into_inner);
    assert!(started.elapsed() < HANG, "took {:?}", started.elapsed());
    answer
}

#[tokio::test]
async fn the_envoy_face_applies_the_server_policy() {
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ratelimit");
    for (policy, expect_ok) in [("fail-closed", false), ("fail-open", true), ("local", true)] {
        let mut redis = RedisServer::start().await;
        let server =
            server_quick_to_notice(&redis, &["--failure-policy", policy, "--config", fixtures])
                .await;
        redis.kill();
        let answer = ask_envoy(server.address).await;
        match (expect_ok, answer) {
            (true, Ok(response)) => assert_eq!(response.overall_code(), Code::Ok, "{policy}"),
            (false, Err(status)) => assert_eq!(status.code(), GrpcCode::Unavailable, "{policy}"),
            (_, other) => panic!("{policy}: {other:?}"),
        }
        server.stop().await;
    }
}

/// Steady load while Redis dies for 3 s: every call answered in time, by
/// the policy (a decision or UNAVAILABLE), health down and up, and exact
/// decisions once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redis_crash_under_load() {
    let mut redis = RedisServer::start().await;
    let url = redis.url();
    let server = TestServer::start(&[
        "--redis-url",
        &url,
        "--redis-command-timeout",
        "300ms",
        "--health-interval",
        "1s",
    ])
    .await;
    await_health(server.address, ServingStatus::Serving).await;
    let address = server.address;

    let stop = Arc::new(AtomicBool::new(false));
    let decided = Arc::new(AtomicU64::new(0));
    let unavailable = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for worker in 0..4 {
        let (stop, decided, unavailable) = (stop.clone(), decided.clone(), unavailable.clone());
        let mut client = server.client().await;
        load.push(tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let key = format!("load-{worker}-{i}");
                let started = Instant::now();
                let answer = client
                    .check_limit(request(
                        &key,
                        fixed_window(5, Duration::from_secs(60)),
                        None,
                    ))
                    .await;
                slowest = slowest.max(started.elapsed());
                match answer {
                    Ok(response) => {
                        let response = response.into_inner();
                        assert!(response.allowed && !response.degraded, "{response:?}");
                        decided.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(status) => {
                        assert_eq!(status.code(), GrpcCode::Unavailable, "{status:?}");
                        unavailable.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            slowest
        }));
    }

    common::eventually("load to flow", || async {
        decided.load(Ordering::Relaxed) > 100
    })
    .await;
    let killed = Instant::now();
    redis.kill();
    await_health(address, ServingStatus::NotServing).await;
    let not_serving_after = killed.elapsed();
    tokio::time::sleep(Duration::from_secs(3).saturating_sub(killed.elapsed())).await;
    let decided_while_down = decided.load(Ordering::Relaxed);

    redis.restart().await;
    let restarted = Instant::now();
    await_health(address, ServingStatus::Serving).await;
    let serving_after = restarted.elapsed();
    common::eventually("decisions to flow again", || async {
        decided.load(Ordering::Relaxed) > decided_while_down + 100
    })
    .await;
    let recovered_after = restarted.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut slowest = Duration::ZERO;
    for worker in load {
        slowest = slowest.max(worker.await.expect("no panic in the load"));
    }
    println!(
        "redis crash under load: {} decided, {} UNAVAILABLE; NOT_SERVING {:?} after the kill; \
         SERVING {:?} and decisions {:?} after the restart; slowest call {:?}",
        decided.load(Ordering::Relaxed),
        unavailable.load(Ordering::Relaxed),
        not_serving_after,
        serving_after,
        recovered_after,
        slowest
    );
    assert!(
        unavailable.load(Ordering::Relaxed) > 0,
        "the outage was seen"
    );
    assert!(slowest < HANG, "no call hung: slowest {slowest:?}");
    assert!(
        not_serving_after < Duration::from_secs(3),
        "NOT_SERVING took {not_serving_after:?}"
    );
    assert!(
        serving_after < Duration::from_secs(3),
        "SERVING took {serving_after:?}"
    );

    // Exact again, with scripts reloaded on the new Redis.
    let mut client = server.client().await;
    common::assert_two_of_three_admitted(&mut client, "after").await;
    server.stop().await;
}

//! Redis failing under a running server: a crash (SIGKILL), a hang (SIGSTOP)
//! and a script cache flush. Calls must fail fast with UNAVAILABLE, health
//! must follow Redis down and up, and decisions must resume by themselves.

use crate::common;

use std::time::{Duration, Instant};

use common::{
    RedisServer, TestServer, await_health, check, fixed_window, request, server_quick_to_notice,
    sliding_window, token_bucket,
};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);

/// A bound that only a hang would exceed: the timeout plus generous room
/// for a slow machine. Not a speed measurement.
const ANSWER_BOUND: Duration = Duration::from_secs(3);

/// Calls `CheckLimit` on a Redis that cannot answer: UNAVAILABLE, promptly.
async fn assert_unavailable_promptly(server: &TestServer) {
    let mut client = server.client().await;
    let started = Instant::now();
    let status = client
        .check_limit(request("k", fixed_window(5, Duration::from_secs(10)), None))
        .await
        .expect_err("Redis is down");
    let took = started.elapsed();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        took < ANSWER_BOUND,
        "took {took:?} with a {COMMAND_TIMEOUT:?} timeout"
    );
}

#[tokio::test]
async fn a_crashed_redis_gives_unavailable_then_decisions_resume() {
    let mut redis = RedisServer::start().await;
    let server = server_quick_to_notice(&redis, &[]).await;
    let mut client = server.client().await;
    let limit = fixed_window(2, Duration::from_secs(60));
    assert!(check(&mut client, "before", &limit, None).await.allowed);

    redis.kill();
    assert_unavailable_promptly(&server).await;
    await_health(server.address, ServingStatus::NotServing).await;
    assert_unavailable_promptly(&server).await;

    redis.restart().await;
    await_health(server.address, ServingStatus::Serving).await;
    // The restarted Redis lost its scripts and keys: both come back by
    // themselves, and decisions are exact again.
    common::assert_two_of_three_admitted(&mut client, "after").await;
    server.stop().await;
}

#[tokio::test]
async fn a_hung_redis_times_out_instead_of_hanging() {
    let redis = RedisServer::start().await;
    let server = server_quick_to_notice(&redis, &[]).await;
    let mut client = server.client().await;
    let limit = token_bucket(2, 1.0);
    assert!(check(&mut client, "k", &limit, None).await.allowed);

    redis.freeze();
    assert_unavailable_promptly(&server).await;
    await_health(server.address, ServingStatus::NotServing).await;
    assert_unavailable_promptly(&server).await;

    redis.thaw();
    await_health(server.address, ServingStatus::Serving).await;
    let after = check(&mut client, "k", &limit, None).await;
    assert!(after.allowed);
    server.stop().await;
}

#[tokio::test]
async fn a_script_flush_is_survived() {
    let redis = RedisServer::start().await;
    let server = server_quick_to_notice(&redis, &[]).await;
    let mut client = server.client().await;
    let mut connection = redis.connection().await;
    let limits = [
        fixed_window(5, Duration::from_secs(60)),
        sliding_window(5, Duration::from_secs(60)),
        token_bucket(5, 0.01),
    ];
    for limit in &limits {
        assert_eq!(check(&mut client, "k", limit, Some(2)).await.remaining, 3);
    }
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut connection)
        .await
        .expect("SCRIPT FLUSH");
    for limit in &limits {
        let response = check(&mut client, "k", limit, Some(1)).await;
        assert!(response.allowed, "{limit:?}");
        assert_eq!(
            response.remaining, 2,
            "state kept across the flush: {limit:?}"
        );
    }
    server.stop().await;
    redis.assert_every_key_expires().await;
}

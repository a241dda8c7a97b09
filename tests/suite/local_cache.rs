//! The local over-limit cache: a flood on a key Redis has denied is
//! answered without deciding on Redis (counted in `INFO commandstats`; an
//! Envoy request's other descriptors are read, never written), on both faces,
//! and the cache never denies what Redis would allow: a smaller cost, other
//! limit parameters, or a request after the denial lifts all go to Redis.

use crate::common;

use std::time::Duration;

use common::{RedisServer, TestServer, check, eventually, fixed_window, sliding_window};
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use ratelimitd::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

const HOUR: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn a_flood_on_a_denied_key_does_not_reach_redis() {
    let redis = RedisServer::start().await;
    let server = TestServer::on_redis(&redis).await;
    let mut client = server.client().await;
    let limit = fixed_window(3, HOUR);
    for _ in 0..3 {
        assert!(check(&mut client, "flood", &limit, None).await.allowed);
    }
    // The first denial comes from Redis and is remembered.
    let first = check(&mut client, "flood", &limit, None).await;
    assert!(!first.allowed);
    let before = redis.script_calls().await;
    for _ in 0..100 {
        let denied = check(&mut client, "flood", &limit, None).await;
        assert!(!denied.allowed);
        assert_eq!((denied.limit, denied.remaining), (3, 0));
        let retry_after = common::duration(denied.retry_after);
        assert!(
            retry_after > Duration::from_secs(3500) && retry_after <= HOUR,
            "retry after {retry_after:?}"
        );
    }
    assert_eq!(
        redis.script_calls().await,
        before,
        "no script call for the flood"
    );
    // Another key still goes to Redis.
    assert!(check(&mut client, "other", &limit, None).await.allowed);
    assert_eq!(redis.script_calls().await, before + 1);
}

#[tokio::test]
async fn with_the_cache_off_every_denial_asks_redis() {
    let redis = RedisServer::start().await;
    let server = TestServer::start(&["--redis-url", &redis.url(), "--local-cache-size", "0"]).await;
    let mut client = server.client().await;
    let limit = fixed_window(1, HOUR);
    assert!(check(&mut client, "k", &limit, None).await.allowed);
    let before = redis.script_calls().await;
    for _ in 0..20 {
        assert!(!check(&mut client, "k", &limit, None).await.allowed);
    }
    assert_eq!(redis.script_calls().await, before + 20);
}

#[tokio::test]
async fn a_cached_denial_never_denies_a_smaller_cost_or_another_limit() {
    let redis = RedisServer::start().await;
    let server = TestServer::on_redis(&redis).await;
    let mut client = server.client().await;
    let ten = fixed_window(10, HOUR);
    assert!(check(&mut client, "k", &ten, Some(7)).await.allowed);
    // 3 left: a cost of 5 is denied, and remembered as such.
    assert!(!check(&mut client, "k", &ten, Some(5)).await.allowed);
    assert!(!check(&mut client, "k", &ten, Some(5)).await.allowed);
    // A cost of 3 fits: it must reach Redis and pass.
    let three = check(&mut client, "k", &ten, Some(3)).await;
    assert!(three.allowed, "{three:?}");
    assert_eq!(three.remaining, 0);
    // The same key under a higher limit is another question for Redis:
    // 10 spent of 20.
    let twenty = check(&mut client, "k", &fixed_window(20, HOUR), Some(1)).await;
    assert!(twenty.allowed, "{twenty:?}");
    assert_eq!(twenty.remaining, 9);
}

#[tokio::test]
async fn a_cached_denial_lets_go_when_redis_would() {
    let redis = RedisServer::start().await;
    let server = TestServer::on_redis(&redis).await;
    let mut client = server.client().await;
    let limit = sliding_window(1, Duration::from_millis(300));
    assert!(check(&mut client, "k", &limit, None).await.allowed);
    let denied = check(&mut client, "k", &limit, None).await;
    assert!(!denied.allowed);
    assert!(common::duration(denied.retry_after) <= Duration::from_millis(300));
    // Soon allowed again (by Redis), however many denials came from the
    // cache in between.
    eventually("the key is allowed once its window has passed", || {
        let mut client = client.clone();
        async move { check(&mut client, "k", &limit, None).await.allowed }
    })
    .await;
}

#[tokio::test]
async fn the_envoy_face_is_answered_from_the_cache_too() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("limits.yaml"),
        "domain: flood\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: hour\n      \
         requests_per_unit: 2\n  - key: everyone\n    rate_limit:\n      unit: hour\n      \
         requests_per_unit: 1000\n",
    )
    .unwrap();
    let config = dir.path().to_str().unwrap();
    let server = TestServer::start(&["--redis-url", &redis.url(), "--config", config]).await;
    let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
    let request = || RateLimitRequest {
        domain: "flood".into(),
        descriptors: [("user", "mallory"), ("everyone", "all")]
            .iter()
            .map(|(key, value)| RateLimitDescriptor {
                entries: vec![Entry {
                    key: (*key).into(),
                    value: (*value).into(),
                }],
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    };
    let mut codes = Vec::new();
    for _ in 0..3 {
        let response = client
            .should_rate_limit(request())
            .await
            .unwrap()
            .into_inner();
        codes.push(response.overall_code());
    }
    assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
    let before = redis.script_calls().await;
    for _ in 0..50 {
        let response = client
            .should_rate_limit(request())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.overall_code(), Code::OverLimit);
        assert_eq!(response.statuses[0].code(), Code::OverLimit);
        assert_eq!(response.statuses[0].limit_remaining, 0);
        // The other descriptor reports what it really has, as Redis's own
        // denial would: 1000 less the 2 the first two requests spent.
        assert_eq!(response.statuses[1].code(), Code::Ok);
        assert_eq!(response.statuses[1].limit_remaining, 998);
    }
    // The denied descriptor is answered from memory; the other is read in
    // one read-only script per request, which writes nothing.
    assert_eq!(
        redis.script_calls().await,
        before + 50,
        "one read-only script per flooding request"
    );
    // The flood spent nothing of the shared limit: 1000 - 2 remain.
    let mut other = request();
    other.descriptors.remove(0);
    let response = client.should_rate_limit(other).await.unwrap().into_inner();
    assert_eq!(response.statuses[0].limit_remaining, 997);
}

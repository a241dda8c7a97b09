//! `CheckLimit` calls for the tests: the five algorithms as the API spells
//! them, one call that must succeed, many at once, and the quick proofs that
//! a server decides exactly.

use std::time::Duration;

use ratelimitd::algorithm::registry::Kind;
use ratelimitd::pb::ratelimitd::v1 as pb;
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use tonic::transport::Channel;

/// A `Duration` from its protobuf form.
pub(crate) fn duration(value: Option<prost_types::Duration>) -> Duration {
    let value = value.expect("duration is set");
    Duration::new(value.seconds as u64, value.nanos as u32)
}

pub(crate) fn fixed_window(limit: u64, window: Duration) -> pb::check_limit_request::Algorithm {
    pb::check_limit_request::Algorithm::FixedWindow(pb::FixedWindow {
        limit,
        window: Some(window.try_into().expect("window")),
    })
}

pub(crate) fn sliding_window(limit: u64, window: Duration) -> pb::check_limit_request::Algorithm {
    pb::check_limit_request::Algorithm::SlidingWindow(pb::SlidingWindow {
        limit,
        window: Some(window.try_into().expect("window")),
    })
}

pub(crate) fn token_bucket(
    capacity: u64,
    refill_per_second: f64,
) -> pb::check_limit_request::Algorithm {
    pb::check_limit_request::Algorithm::TokenBucket(pb::TokenBucket {
        capacity,
        refill_per_second,
    })
}

pub(crate) fn sliding_window_counter(
    limit: u64,
    window: Duration,
) -> pb::check_limit_request::Algorithm {
    pb::check_limit_request::Algorithm::SlidingWindowCounter(pb::SlidingWindowCounter {
        limit,
        window: Some(window.try_into().expect("window")),
    })
}

pub(crate) fn gcra(rate: u64, period: Duration, burst: u64) -> pb::check_limit_request::Algorithm {
    pb::check_limit_request::Algorithm::Gcra(pb::Gcra {
        rate,
        period: Some(period.try_into().expect("period")),
        burst,
    })
}

pub(crate) fn request(
    key: &str,
    algorithm: pb::check_limit_request::Algorithm,
    cost: Option<u64>,
) -> pb::CheckLimitRequest {
    pb::CheckLimitRequest {
        key: key.to_owned(),
        algorithm: Some(algorithm),
        cost,
        ..Default::default()
    }
}

/// One `CheckLimit` call that must succeed.
pub(crate) async fn check(
    client: &mut RateLimiterClient<Channel>,
    key: &str,
    algorithm: &pb::check_limit_request::Algorithm,
    cost: Option<u64>,
) -> pb::CheckLimitResponse {
    client
        .check_limit(request(key, *algorithm, cost))
        .await
        .unwrap_or_else(|status| panic!("CheckLimit({key}) failed: {status}"))
        .into_inner()
}

/// Every algorithm with limit `limit` and nothing coming back during a test:
/// windows of a minute; the bucket refills one token in 1000 s, GCRA one
/// request in 1000 s; the sliding window counter's window is the longest
/// allowed (366 days), because its windows are aligned to the epoch and a
/// test that straddled two of them would see the previous one's count
/// weighed down. One per registered algorithm, so a new one does not
/// build until it is here too.
pub(crate) fn every_algorithm(limit: u64) -> [pb::check_limit_request::Algorithm; Kind::COUNT] {
    [
        fixed_window(limit, Duration::from_secs(60)),
        sliding_window(limit, Duration::from_secs(60)),
        token_bucket(limit, 0.001),
        gcra(1, Duration::from_secs(1000), limit),
        sliding_window_counter(limit, ratelimitd::limit::MAX_WINDOW),
    ]
}

/// [`every_algorithm`] as the library's validated model, for tests that
/// drive the limiter directly.
pub(crate) fn every_model_algorithm(limit: u64) -> [ratelimitd::algorithm::Algorithm; Kind::COUNT] {
    every_algorithm(limit).map(|algorithm| {
        ratelimitd::api::check::limit_request(request("k", algorithm, None))
            .expect("valid parameters")
            .algorithm
    })
}

/// Fires `calls` CheckLimit calls on `key` at once, spread round-robin over
/// `clients`, and counts the allowed ones. Every call must get an answer.
pub(crate) async fn allowed_of_concurrent_calls(
    clients: &[RateLimiterClient<Channel>],
    calls: usize,
    key: &str,
    algorithm: &pb::check_limit_request::Algorithm,
) -> usize {
    let calls = (0..calls).map(|i| {
        let mut client = clients[i % clients.len()].clone();
        let request = request(key, *algorithm, None);
        tokio::spawn(async move { client.check_limit(request).await })
    });
    let mut allowed = 0;
    for result in futures::future::join_all(calls).await {
        let response = result
            .expect("task")
            .expect("every call is answered")
            .into_inner();
        allowed += usize::from(response.allowed);
    }
    allowed
}

/// 300 concurrent calls on one key with limit 100 admit exactly 100, for
/// each algorithm (on a key of its own).
pub(crate) async fn assert_exactly_100_of_300_for_every_algorithm(
    clients: &[RateLimiterClient<Channel>],
) {
    for (i, algorithm) in every_algorithm(100).iter().enumerate() {
        let key = format!("hot-{i}");
        let allowed = allowed_of_concurrent_calls(clients, 300, &key, algorithm).await;
        assert_eq!(allowed, 100, "{algorithm:?}");
    }
}

/// On a fresh `key`, a fixed window of 2 admits exactly 2 of 3 calls: the
/// quick proof that decisions reach a store and are exact.
pub(crate) async fn assert_two_of_three_admitted(
    client: &mut RateLimiterClient<Channel>,
    key: &str,
) {
    let limit = fixed_window(2, Duration::from_secs(60));
    assert!(
        check(client, key, &limit, None).await.allowed,
        "first call on {key}"
    );
    assert!(
        check(client, key, &limit, None).await.allowed,
        "second call on {key}"
    );
    assert!(
        !check(client, key, &limit, None).await.allowed,
        "third call on {key}"
    );
}

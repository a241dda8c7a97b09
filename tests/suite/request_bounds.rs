//! The bounds on one ShouldRateLimit (descriptors, entries, entry bytes):
//! just at each bound is served, just over is INVALID_ARGUMENT naming the
//! field and the flag, and writes nothing; a flag raises its bound; a
//! request of more limits than one script decides is split into several
//! scripts and still decided all or nothing; an over-long composed key is
//! stored by its digest, bounded and never shared.

use crate::common;

use common::{RedisServer, TestServer};
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimitd::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::transport::Channel;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ratelimit");

type Client = RateLimitServiceClient<Channel>;

async fn start(redis: &RedisServer, extra: &[&str]) -> (TestServer, Client) {
    let url = redis.url();
    let mut flags = vec!["--config", FIXTURES, "--redis-url", &url];
    flags.extend_from_slice(extra);
    let server = TestServer::start(&flags).await;
    let client = RateLimitServiceClient::new(common::channel(server.address).await);
    (server, client)
}

/// A descriptor of `example9` (`key1: value*`, 20 per minute, a counter
/// per value) with these entries and hits.
fn descriptor(entries: Vec<(String, String)>, hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .into_iter()
            .map(|(key, value)| Entry { key, value })
            .collect(),
        hits_addend: Some(hits),
        ..Default::default()
    }
}

fn counted(value: &str, hits: u64) -> RateLimitDescriptor {
    descriptor(vec![("key1".into(), value.into())], hits)
}

fn many(count: usize, hits: u64) -> Vec<RateLimitDescriptor> {
    (0..count)
        .map(|i| counted(&format!("value{i}"), hits))
        .collect()
}

async fn ask(
    client: &mut Client,
    descriptors: Vec<RateLimitDescriptor>,
) -> Result<RateLimitResponse, tonic::Status> {
    client
        .should_rate_limit(RateLimitRequest {
            domain: "example9".into(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .map(tonic::Response::into_inner)
}

fn assert_refused(result: Result<RateLimitResponse, tonic::Status>, field: &str, rule: &str) {
    let status = result.expect_err(field);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with(&format!("{field}: ")) && status.message().contains(rule),
        "{field}: {status:?}"
    );
}

#[tokio::test]
async fn each_bound_serves_just_at_it_and_refuses_just_over_writing_nothing() {
    let redis = RedisServer::start().await;
    let (server, mut client) = start(&redis, &[]).await;

    assert_refused(
        ask(&mut client, many(65, 1)).await,
        "descriptors",
        "at most 64 per request (--max-descriptors), got 65",
    );
    let seventeen: Vec<_> = (0..17).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    assert_refused(
        ask(
            &mut client,
            vec![counted("value", 1), descriptor(seventeen, 1)],
        )
        .await,
        "descriptors[1].entries",
        "at most 16 per descriptor (--max-descriptor-entries), got 17",
    );
    let long = "v".repeat(4097);
    assert_refused(
        ask(
            &mut client,
            vec![descriptor(vec![("key1".into(), long.clone())], 1)],
        )
        .await,
        "descriptors[0].entries[0].value",
        "at most 4096 bytes (--max-descriptor-entry-bytes), got 4097",
    );
    assert_refused(
        ask(
            &mut client,
            vec![descriptor(vec![(long, "value".into())], 1)],
        )
        .await,
        "descriptors[0].entries[0].key",
        "at most 4096 bytes",
    );
    assert!(
        redis.keys().await.is_empty(),
        "a refused request wrote {:?}",
        redis.keys().await
    );

    let at_every_bound = ask(&mut client, many(64, 1)).await.expect("64 descriptors");
    assert_eq!(at_every_bound.overall_code(), Code::Ok);
    assert!(
        at_every_bound
            .statuses
            .iter()
            .all(|status| status.limit_remaining == 19)
    );
    let sixteen: Vec<_> = (0..16).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    ask(&mut client, vec![descriptor(sixteen, 1)])
        .await
        .expect("16 entries");
    let value = format!("value{}", "v".repeat(4096 - "value".len()));
    let status = &ask(&mut client, vec![counted(&value, 1)])
        .await
        .expect("a 4096-byte value")
        .statuses[0];
    assert_eq!(status.limit_remaining, 19, "{status:?}");
    server.stop().await;
}

#[tokio::test]
async fn flags_raise_the_bounds() {
    let redis = RedisServer::start().await;
    let (server, mut client) = start(
        &redis,
        &[
            "--max-descriptors",
            "100",
            "--max-descriptor-entries",
            "20",
            "--max-descriptor-entry-bytes",
            "5000",
        ],
    )
    .await;
    ask(&mut client, many(100, 1))
        .await
        .expect("100 descriptors");
    assert_refused(
        ask(&mut client, many(101, 1)).await,
        "descriptors",
        "at most 100 per request",
    );
    let twenty: Vec<_> = (0..20).map(|i| (format!("k{i}"), "v".to_owned())).collect();
    ask(&mut client, vec![descriptor(twenty, 1)])
        .await
        .expect("20 entries");
    ask(&mut client, vec![counted(&"v".repeat(5000), 1)])
        .await
        .expect("a 5000-byte value");
    server.stop().await;
}

#[tokio::test]
async fn a_request_larger_than_one_script_is_split_and_still_all_or_nothing() {
    let redis = RedisServer::start().await;
    let (server, mut client) = start(&redis, &["--max-descriptors", "300"]).await;

    // 200 counters, one of them asked for 21 of its 20: nothing is spent.
    let mut over = many(200, 1);
    over.push(counted("value0", 20));
    let before = redis.script_calls().await;
    let denied = ask(&mut client, over).await.expect("201 descriptors");
    let scripts = redis.script_calls().await - before;
    assert_eq!(denied.overall_code(), Code::OverLimit);
    assert!(
        scripts >= 4,
        "200 limits in {scripts} scripts: not split into scripts of at most 64"
    );
    let looks = ask(&mut client, many(200, 0)).await.expect("a look");
    assert!(
        looks
            .statuses
            .iter()
            .all(|status| status.limit_remaining == 20),
        "a denied request spent: {looks:?}"
    );

    let allowed = ask(&mut client, many(200, 1))
        .await
        .expect("200 descriptors");
    assert_eq!(allowed.overall_code(), Code::Ok);
    assert!(
        allowed
            .statuses
            .iter()
            .all(|status| status.limit_remaining == 19),
        "{allowed:?}"
    );
    server.stop().await;
    redis.assert_every_key_expires().await;
}

/// Requests at every bound at once (64 descriptors of 4096-byte values,
/// each its own counter), many in a row, while an unrelated caller asks on
/// its own key: every one of its calls is decided (none times out against
/// the 100 ms Redis timeout, none is shed), and every large request too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_at_the_bounds_leave_other_callers_decided() {
    let redis = RedisServer::start().await;
    let (server, client) = start(&redis, &[]).await;
    let heavy = (0..2).map(|worker| {
        let mut client = client.clone();
        tokio::spawn(async move {
            for round in 0..10 {
                let descriptors = (0..64)
                    .map(|i| {
                        let value = format!("value-{worker}-{round}-{i}-");
                        counted(&format!("{value}{}", "v".repeat(4096 - value.len())), 1)
                    })
                    .collect();
                let answer = ask(&mut client, descriptors)
                    .await
                    .expect("a request at the bounds");
                assert_eq!(answer.overall_code(), Code::Ok);
            }
        })
    });
    let heavy: Vec<_> = heavy.collect();

    let mut other = ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient::new(
        common::channel(server.address).await,
    );
    let limit = common::fixed_window(1000, std::time::Duration::from_secs(60));
    let mut slowest = std::time::Duration::ZERO;
    for expected in (900..1000).rev() {
        let sent = std::time::Instant::now();
        let answer = common::check(&mut other, "unrelated", &limit, None).await;
        slowest = slowest.max(sent.elapsed());
        assert!(answer.allowed);
        assert_eq!(answer.remaining, expected);
    }
    for worker in heavy {
        worker.await.expect("a heavy worker");
    }
    eprintln!("slowest unrelated call while requests at the bounds ran: {slowest:?}");
    server.stop().await;
    redis.assert_every_key_expires().await;
}

#[tokio::test]
async fn over_long_descriptor_keys_are_stored_by_digest_and_never_share_a_counter() {
    let redis = RedisServer::start().await;
    let (server, mut client) = start(&redis, &[]).await;
    // Two values (of rule `value*`) of the largest size that differ only in
    // their last byte:
    // a truncated key would count them together.
    let long = |last: char| format!("value{}{last}", "v".repeat(4090));
    for hits in [20, 0] {
        let answer = ask(&mut client, vec![counted(&long('a'), hits)])
            .await
            .expect("a long value");
        assert_eq!(answer.overall_code(), Code::Ok, "hits {hits}");
    }
    let answer = ask(&mut client, vec![counted(&long('a'), 1)])
        .await
        .expect("a long value");
    assert_eq!(
        answer.overall_code(),
        Code::OverLimit,
        "its own counter is spent"
    );
    let answer = ask(&mut client, vec![counted(&long('b'), 20)])
        .await
        .expect("another long value");
    assert_eq!(
        answer.overall_code(),
        Code::Ok,
        "the other has its own counter"
    );

    let keys = redis.keys().await;
    assert_eq!(keys.len(), 2, "{keys:?}");
    for key in &keys {
        assert!(key.len() < 300, "{} bytes: {key}", key.len());
        assert!(key.contains("{rlh:"), "{key}");
    }
    // A short value keeps its readable key, as upstream names it.
    ask(&mut client, vec![counted("value-short", 1)])
        .await
        .expect("a short value");
    assert!(
        redis
            .keys()
            .await
            .iter()
            .any(|key| key.contains("{rls:") && key.contains("11:value-short|")),
        "{:?}",
        redis.keys().await
    );
    server.stop().await;
    redis.assert_every_key_expires().await;
}

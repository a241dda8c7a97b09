//! Real Envoys (1.40, with the rate limit quota filter of
//! examples/envoy/quota-envoy.yaml) enforcing quota that ratelimitd assigns
//! over RLQS, on a real Redis: two Envoys share one limit, on one
//! ratelimitd or on two; the split follows max-min fairness; an Envoy that
//! goes frees its share; a reload reaches them; ratelimitd killed, Envoy
//! falls back to its own configuration, and restarted, the limit holds
//! again; Redis down, the failure policy answers.
//!
//! Envoy 1.40 reports every 5 s, so these tests take tens of seconds.

use crate::common;

use std::path::Path;

use common::envoy::{Envoy, EnvoyPorts, Tally, drive};
use common::http::start_upstream;
use common::quota_policies::{self, api_bucket};
use common::{RedisServer, ServerProcess, TestServer};

/// `requests_per_second` for the bucket every request of the example
/// configuration falls into.
fn write_policies(dir: &Path, requests_per_second: u32) -> String {
    quota_policies::write_policies(dir, &api_bucket("quota-example", requests_per_second))
}

async fn envoy(ratelimitd: u16, upstream: u16) -> Envoy {
    Envoy::start_quota(
        EnvoyPorts {
            ratelimitd,
            upstream,
        },
        &[],
        &[],
    )
    .await
}

/// Both loads at once.
async fn drive_both(
    first: &Envoy,
    first_rate: u32,
    second: &Envoy,
    second_rate: u32,
    seconds: u32,
) -> (Tally, Tally) {
    tokio::join!(
        drive(first.port, first_rate, seconds, &[]),
        drive(second.port, second_rate, seconds, &[]),
    )
}

/// The admitted total of 10 s at 100/s: within 90% and 105% of 1000.
fn assert_about_the_limit(first: &Tally, second: &Tally) {
    let total = first.admitted + second.admitted;
    eprintln!("admitted {total} of 10 s at 100/s: {first:?} {second:?}");
    assert!(
        (900..=1050).contains(&total),
        "admitted {total} of 10 s at 100/s ({first:?} {second:?})"
    );
    assert_eq!(first.failed + second.failed, 0, "{first:?} {second:?}");
}

#[tokio::test]
async fn two_envoys_share_one_limit_and_the_split_follows_demand() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_policies(dir.path(), 100);
    let server = TestServer::start(&["--redis-url", &redis.url(), "--config", &config]).await;
    let upstream = start_upstream().await;
    let first = envoy(server.address.port(), upstream).await;
    let second = envoy(server.address.port(), upstream).await;

    // Both want 150/s: together they get 100/s.
    let (a, b) = drive_both(&first, 150, &second, 150, 10).await;
    assert_about_the_limit(&a, &b);

    // 120/s and 40/s: the smaller demand (and its headroom) fits in an
    // equal share, so it is met in full; the other gets the rest. Within
    // three reports (15 s), then measured over 5 s.
    let (a, b) = drive_both(&first, 120, &second, 40, 20).await;
    let (big, small) = (a.admitted_rate(15, 20), b.admitted_rate(15, 20));
    eprintln!("120/s and 40/s: {big}/s and {small}/s: {a:?} {b:?}");
    assert!(
        small >= 38.0,
        "the small demand is met: {small}/s of 40 ({b:?})"
    );
    assert!(
        (44.0..=62.0).contains(&big),
        "the big one gets the rest (100 less the small one's 48): {big}/s ({a:?})"
    );
    assert!(big + small <= 105.0, "{big} + {small}");

    // The second Envoy goes: the first gets the whole limit within three
    // reporting intervals (at once here: its stream closes).
    drop(second);
    let alone = drive(first.port, 150, 8, &[]).await;
    let rate = alone.admitted_rate(3, 8);
    assert!((90.0..=105.0).contains(&rate), "{rate}/s alone ({alone:?})");
    server.stop().await;
}

#[tokio::test]
async fn envoys_on_two_ratelimitd_instances_share_one_limit_through_redis() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_policies(dir.path(), 100);
    let one = TestServer::start(&["--redis-url", &redis.url(), "--config", &config]).await;
    let two = TestServer::start(&["--redis-url", &redis.url(), "--config", &config]).await;
    let upstream = start_upstream().await;
    let first = envoy(one.address.port(), upstream).await;
    let second = envoy(two.address.port(), upstream).await;
    let (a, b) = drive_both(&first, 150, &second, 150, 10).await;
    assert_about_the_limit(&a, &b);
    // Settled, they hold about half each.
    let (a, b) = drive_both(&first, 150, &second, 150, 6).await;
    for (tally, rate) in [(&a, a.admitted_rate(2, 6)), (&b, b.admitted_rate(2, 6))] {
        assert!((40.0..=60.0).contains(&rate), "{rate}/s ({tally:?})");
    }
    one.stop().await;
    two.stop().await;
}

#[tokio::test]
async fn a_reload_reaches_the_envoys_within_one_reporting_interval() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_policies(dir.path(), 100);
    let server = TestServer::start(&["--config", &config, "--config-poll-interval", "200ms"]).await;
    let upstream = start_upstream().await;
    let first = envoy(server.address.port(), upstream).await;
    let before = drive(first.port, 150, 4, &[]).await;
    let rate = before.admitted_rate(1, 4);
    assert!(
        (90.0..=110.0).contains(&rate),
        "{rate}/s before ({before:?})"
    );
    write_policies(dir.path(), 40);
    // The reload is in within a poll (200 ms) and assigned at the next
    // rebalance (1 s), well within Envoy's reporting interval (5 s).
    let after = drive(first.port, 150, 5, &[]).await;
    let rate = after.admitted_rate(2, 5);
    assert!((35.0..=45.0).contains(&rate), "{rate}/s after ({after:?})");
    server.stop().await;
}

#[tokio::test]
async fn envoy_falls_back_while_ratelimitd_is_gone_and_resubscribes_when_it_is_back() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_policies(dir.path(), 100);
    let flags = [
        "--redis-url",
        &redis.url(),
        "--config",
        &config,
        "--quota-assignment-ttl",
        "2s",
    ];
    let server = ServerProcess::builder().flags(&flags).start().await;
    let address = server.address;
    let upstream = start_upstream().await;
    let edge = envoy(address.port(), upstream).await;
    let held = drive(edge.port, 150, 4, &[]).await;
    let rate = held.admitted_rate(1, 4);
    assert!((90.0..=110.0).contains(&rate), "{rate}/s ({held:?})");

    // Killed: the assignment runs out (2 s), and the example's
    // expired_assignment_behavior denies all for its 60 s.
    drop(server);
    let gone = drive(edge.port, 50, 6, &[]).await;
    assert_eq!(gone.per_second[4..], [(0, 50), (0, 50)], "{gone:?}");

    // Back: Envoy opens a new stream at its next report (5 s), and the
    // limit holds again (a share of it at first: the killed instance's
    // subscriber counts until it goes stale).
    let _server = ServerProcess::builder()
        .flags(&flags)
        .at(address)
        .start()
        .await;
    let back = drive(edge.port, 150, 10, &[]).await;
    let rate = back.admitted_rate(7, 10);
    assert!((40.0..=110.0).contains(&rate), "{rate}/s back ({back:?})");
}

#[tokio::test]
async fn redis_down_gets_the_failure_policy_at_the_edge() {
    let mut redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_policies(dir.path(), 100);
    let server = TestServer::start(&[
        "--redis-url",
        &redis.url(),
        "--config",
        &config,
        "--failure-policy",
        "fail-open",
        "--quota-assignment-ttl",
        "2s",
    ])
    .await;
    let upstream = start_upstream().await;
    let edge = envoy(server.address.port(), upstream).await;
    let held = drive(edge.port, 150, 4, &[]).await;
    let rate = held.admitted_rate(1, 4);
    assert!((90.0..=110.0).contains(&rate), "{rate}/s ({held:?})");
    // Fail open: the next renewal (within a second) allows all.
    redis.kill();
    let open = drive(edge.port, 150, 5, &[]).await;
    assert_eq!(open.per_second[3..], [(150, 0), (150, 0)], "{open:?}");
    server.stop().await;
}

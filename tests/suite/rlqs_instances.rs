//! The quota service across ratelimitd instances on one Redis, driven over
//! gRPC as Envoy drives it: a newcomer on one instance makes the stream
//! holding the whole rate on another shrink with no report of its own (a
//! nudge read at the next beat, not at a rebalance tick or a report); a
//! killed instance's share is handed on once its beat runs out if its
//! Envoy has subscribed again elsewhere, and only once its lease runs out
//! if not; each instance's presence is two keys that expire.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::quota::{QuotaStream, Told, bucket};
use common::quota_policies::{self, api_bucket};
use common::{RedisServer, ServerProcess, TestServer};

/// 100 requests a second for {name: api}.
fn write_policies(dir: &Path) -> String {
    quota_policies::write_policies(dir, &api_bucket("edge", 100))
}

/// A whole share of 100/s: 6000 a minute, a tenth of a second of burst.
const ALL_OF_100: Told = Told::TokenBucket(10, 6000, 60);
/// Half of it.
const HALF_OF_100: Told = Told::TokenBucket(5, 3000, 60);

/// Rebalancing every 30 s, so that what moves sooner was moved by a nudge
/// or a death; an instance timeout of 1 s (a beat every 250 ms).
fn flags<'a>(url: &'a str, config: &'a str) -> [&'a str; 8] {
    [
        "--redis-url",
        url,
        "--config",
        config,
        "--quota-rebalance-interval",
        "30s",
        "--quota-instance-timeout",
        "1s",
    ]
}

/// Waits at most 8 s (well before a report, a rebalance tick or a lease
/// would have moved it) for `stream` to be told `wanted`.
async fn told_within_8s(stream: &mut QuotaStream, wanted: &Told) {
    let api = bucket(&[("name", "api")]);
    let told = tokio::time::timeout(
        Duration::from_secs(8),
        stream.until(&api, |told| told == wanted),
    )
    .await;
    assert!(told.is_ok(), "not told {wanted:?} within 8 s");
}

#[tokio::test]
async fn a_newcomer_elsewhere_shrinks_the_holder_without_a_report() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (url, config) = (redis.url(), write_policies(dir.path()));
    let one = TestServer::start(&flags(&url, &config)).await;
    let two = TestServer::start(&flags(&url, &config)).await;
    let api = bucket(&[("name", "api")]);
    let mut holder = QuotaStream::open(one.address).await;
    holder.subscribe("edge", &api).await;
    assert_eq!(holder.next_one().await.told, ALL_OF_100);
    let mut newcomer = QuotaStream::open(two.address).await;
    newcomer.subscribe("edge", &api).await;
    assert_eq!(newcomer.next_one().await.told, Told::DenyAll);
    // Neither reports again: the holder is nudged to its half, and the
    // newcomer, nudged in turn, grows into it.
    told_within_8s(&mut holder, &HALF_OF_100).await;
    told_within_8s(&mut newcomer, &HALF_OF_100).await;
    // The ledger, the instances' beats and the nudges, each expiring.
    let mut keys = redis.keys().await;
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "ratelimitd:{rlq-presence}:instances".to_owned(),
            "ratelimitd:{rlq-presence}:nudges".to_owned(),
            "ratelimitd:{rlq:edge|name=api}".to_owned(),
        ]
    );
    redis.assert_every_key_expires().await;
    one.stop().await;
    two.stop().await;
}

/// A survivor (in process) and a doomed instance (a process of its own, to
/// be killed) on one Redis, started with `flags`, and a stream on each
/// holding half of {name: api}: the survivor's stream is returned.
async fn both_holding_half(
    flags: &[&str],
) -> (TestServer, ServerProcess, QuotaStream, QuotaStream) {
    let survivor = TestServer::start(flags).await;
    let doomed = ServerProcess::builder().flags(flags).start().await;
    let api = bucket(&[("name", "api")]);
    let mut first = QuotaStream::open(survivor.address).await;
    first.subscribe("edge", &api).await;
    assert_eq!(first.next_one().await.told, ALL_OF_100);
    let mut second = QuotaStream::open(doomed.address).await;
    second.subscribe("edge", &api).await;
    told_within_8s(&mut second, &HALF_OF_100).await;
    told_within_8s(&mut first, &HALF_OF_100).await;
    (survivor, doomed, first, second)
}

#[tokio::test]
async fn a_killed_instance_s_share_is_handed_on_when_its_beat_runs_out_if_its_envoy_is_back() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (url, config) = (redis.url(), write_policies(dir.path()));
    let (survivor, doomed, _first, _second) = both_holding_half(&flags(&url, &config)).await;
    let api = bucket(&[("name", "api")]);
    // Killed, its stream never leaves: its grant would count for its
    // lease (16 s). Its Envoy subscribes again on the survivor; once the
    // dead instance's beat has run out (1 s), that newcomer has its share.
    drop(doomed);
    let mut again = QuotaStream::open(survivor.address).await;
    again.subscribe("edge", &api).await;
    told_within_8s(&mut again, &HALF_OF_100).await;
    survivor.stop().await;
}

/// Rebalancing every second, an instance timeout of 1 s, and assignments
/// that live 4 s (a lease of 5 s).
fn short_lease_flags<'a>(url: &'a str, config: &'a str) -> [&'a str; 10] {
    [
        "--redis-url",
        url,
        "--config",
        config,
        "--quota-rebalance-interval",
        "1s",
        "--quota-instance-timeout",
        "1s",
        "--quota-assignment-ttl",
        "4s",
    ]
}

#[tokio::test]
async fn a_killed_instance_s_share_is_held_until_its_lease_runs_out_if_its_envoy_is_not_back() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (url, config) = (redis.url(), write_policies(dir.path()));
    let (survivor, doomed, mut first, _second) =
        both_holding_half(&short_lease_flags(&url, &config)).await;
    let api = bucket(&[("name", "api")]);
    // Killed, with its Envoy cut off: that Envoy may spend its half until
    // its assignment runs out, so the survivor is not handed it when the
    // beat runs out (1 s), but only when the lease has (at most 5 s after
    // the kill, the last settlement at most a second before it), and a
    // rebalance tick.
    drop(doomed);
    let killed = Instant::now();
    let all = first.until(&api, |told| *told == ALL_OF_100);
    let told = tokio::time::timeout(Duration::from_secs(9), all).await;
    let after = killed.elapsed();
    assert!(
        told.is_ok(),
        "not told the whole rate within 9 s of the kill"
    );
    assert!(
        after >= Duration::from_millis(2500),
        "told the whole rate {after:?} after the kill, while the stranded Envoy may spend half"
    );
    eprintln!("told the whole rate {after:?} after the kill");
    survivor.stop().await;
}

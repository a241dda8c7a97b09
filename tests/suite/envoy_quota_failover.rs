//! Real Envoys (1.40, examples/envoy/quota-envoy.yaml) on two ratelimitd
//! instances sharing one Redis: a newcomer on one instance gets its share
//! at once although the Envoy on the other holds the whole limit; when an
//! instance is killed and its Envoys fail over to the survivor, the dead
//! instance's share is handed on within its instance timeout and two
//! rebalance intervals; and when its Envoy cannot reach the survivor, the
//! share is held until that Envoy's assignment has run out, then handed
//! on; never above the limit.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::envoy::{Envoy, EnvoyPorts, Tally, drive};
use common::http::start_upstream;
use common::quota_policies::{self, api_bucket};
use common::{RedisServer, ServerProcess, TestServer};

/// 100 requests a second for the bucket every request falls into.
fn write_policies(dir: &Path) -> String {
    quota_policies::write_policies(dir, &api_bucket("quota-example", 100))
}

/// A Redis, the policies and an upstream, which every instance and Envoy
/// of a test shares.
struct Shared {
    _redis: RedisServer,
    url: String,
    _dir: tempfile::TempDir,
    config: String,
    upstream: u16,
}

impl Shared {
    async fn start() -> Self {
        let redis = RedisServer::start().await;
        let dir = tempfile::tempdir().expect("a config directory");
        Self {
            url: redis.url(),
            config: write_policies(dir.path()),
            _redis: redis,
            _dir: dir,
            upstream: start_upstream().await,
        }
    }

    /// An instance's flags: the Redis and the policies.
    fn flags(&self) -> [&str; 4] {
        ["--redis-url", &self.url, "--config", &self.config]
    }

    /// An Envoy's ports, towards the instance at `ratelimitd`.
    fn ports(&self, ratelimitd: u16) -> EnvoyPorts {
        EnvoyPorts {
            ratelimitd,
            upstream: self.upstream,
        }
    }
}

/// The admitted per second of loads started together, side by side.
fn totals(loads: &[&Tally]) -> Vec<u64> {
    let seconds = loads.iter().map(|load| load.per_second.len()).min();
    (0..seconds.unwrap_or(0))
        .map(|second| loads.iter().map(|load| load.per_second[second].0).sum())
        .collect()
}

#[tokio::test]
async fn a_newcomer_on_another_instance_gets_its_share_within_a_second() {
    let shared = Shared::start().await;
    let one = TestServer::start(&shared.flags()).await;
    let two = TestServer::start(&shared.flags()).await;
    let first = Envoy::start_quota(shared.ports(one.address.port()), &[], &[]).await;
    let second = Envoy::start_quota(shared.ports(two.address.port()), &[], &[]).await;

    // 60/s each: either alone is within the limit, both are above it. The
    // first subscribes first and, alone, is granted the whole limit; its
    // next report is 5 s away.
    let (a, b) = tokio::join!(drive(first.port, 60, 8, &[]), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drive(second.port, 60, 8, &[]).await
    });
    let totals = totals(&[&a, &b]);
    eprintln!("admitted per second: {totals:?}\nfirst {a:?}\nsecond {b:?}");
    // From its second second on, the newcomer gets about half, and the two
    // together at least 95% of the limit.
    for second_of_load in 2..8 {
        let newcomer = b.per_second[second_of_load].0;
        assert!(
            newcomer >= 40,
            "second {second_of_load}: the newcomer admitted {newcomer} ({b:?})"
        );
        let total = totals[second_of_load];
        assert!(
            (95..=106).contains(&total),
            "second {second_of_load}: {total} admitted of 100 ({totals:?})"
        );
    }
    one.stop().await;
    two.stop().await;
}

/// The example's ratelimitd cluster with a second instance behind the first
/// (priority 1) and gRPC health checks, so that Envoy's stream moves to it
/// when the first is gone, as with one address in front of several.
fn failover_edits(survivor: u16) -> [(&'static str, String); 2] {
    [
        (
            "    - name: ratelimitd\n      type: STATIC\n      connect_timeout: 1s\n",
            "    - name: ratelimitd\n      type: STATIC\n      connect_timeout: 1s\n      \
             health_checks:\n        - timeout: 0.5s\n          interval: 0.5s\n          \
             no_traffic_interval: 0.5s\n          unhealthy_threshold: 1\n          healthy_threshold: 1\n          \
             grpc_health_check: {}\n"
                .to_owned(),
        ),
        (
            "                    socket_address: { address: 127.0.0.1, port_value: 50051 }\n",
            format!(
                "                    socket_address: {{ address: 127.0.0.1, port_value: 50051 }}\n          \
                 - priority: 1\n            lb_endpoints:\n              - endpoint:\n                  \
                 address:\n                    socket_address: {{ address: 127.0.0.1, port_value: {survivor} }}\n"
            ),
        ),
    ]
}

#[tokio::test]
async fn a_killed_instance_s_share_moves_to_the_survivor_within_eight_seconds() {
    let shared = Shared::start().await;
    let survivor = TestServer::start(&shared.flags()).await;
    let doomed = ServerProcess::builder()
        .flags(&shared.flags())
        .start()
        .await;
    let first = Envoy::start_quota(shared.ports(survivor.address.port()), &[], &[]).await;
    let edits = failover_edits(survivor.address.port());
    let edits: Vec<(&str, &str)> = edits.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let second = Envoy::start_quota(
        shared.ports(doomed.address.port()),
        &edits,
        &[
            "--component-log-level",
            "misc:error,rate_limit_quota:debug,grpc:debug,hc:debug",
        ],
    )
    .await;

    // Both above the limit; settled, each holds about half.
    let (a, b) = tokio::join!(
        drive(first.port, 150, 8, &[]),
        drive(second.port, 150, 8, &[])
    );
    let settled = totals(&[&a, &b]);
    eprintln!("before the kill: {settled:?}");
    assert!(
        settled[6..].iter().all(|total| (90..=106).contains(total)),
        "{settled:?}"
    );

    // Killed: the second Envoy keeps its assignment, moves to the survivor
    // at its next report, and from 8 s on the two admit at least 90% of the
    // limit, never more than it.
    let (a, b, ()) = tokio::join!(
        drive(first.port, 150, 12, &[]),
        drive(second.port, 150, 12, &[]),
        async { drop(doomed) }
    );
    let after = totals(&[&a, &b]);
    eprintln!("after the kill: {after:?}\nfirst {a:?}\nsecond {b:?}");
    // The first second also spends what the two token buckets held (a
    // tenth of a second of each share) when the load began.
    assert!(
        after[0] <= 112 && after[1..].iter().all(|total| *total <= 106),
        "over the limit: {after:?}"
    );
    assert!(
        after[8..].iter().all(|total| *total >= 90),
        "the limit not regained by 8 s: {after:?}"
    );
    assert_eq!(a.failed + b.failed, 0, "{a:?} {b:?}");
    survivor.stop().await;
}

/// Seconds of load before the kill, and after it: past the stranded
/// Envoy's assignment (15 s), the lease's margin (1 s), a rebalance
/// interval and a few seconds more.
const BEFORE_THE_KILL: u32 = 10;
const AFTER_THE_KILL: u32 = 22;

#[tokio::test]
async fn a_killed_instance_s_share_is_held_while_its_stranded_envoy_may_still_spend_it() {
    let shared = Shared::start().await;
    let survivor = TestServer::start(&shared.flags()).await;
    let doomed = ServerProcess::builder()
        .flags(&shared.flags())
        .start()
        .await;
    let first = Envoy::start_quota(shared.ports(survivor.address.port()), &[], &[]).await;
    let second = Envoy::start_quota(shared.ports(survivor.address.port()), &[], &[]).await;
    // Its cluster lists the doomed instance alone: once that is killed, it
    // cannot reconnect, and enforces its last assignment until its time to
    // live runs out (then its expired_assignment_behavior, deny all).
    let stranded = Envoy::start_quota(shared.ports(doomed.address.port()), &[], &[]).await;

    // 60/s each, a third of the limit each once settled; the doomed
    // instance killed 10 s into the load, which goes on for 22 s more.
    let seconds = BEFORE_THE_KILL + AFTER_THE_KILL;
    let (a, b, c, ()) = tokio::join!(
        drive(first.port, 60, seconds, &[]),
        drive(second.port, 60, seconds, &[]),
        drive(stranded.port, 60, seconds, &[]),
        async {
            tokio::time::sleep(Duration::from_secs(BEFORE_THE_KILL.into())).await;
            drop(doomed);
        }
    );
    let all = totals(&[&a, &b, &c]);
    let kill = BEFORE_THE_KILL as usize;
    let (before, after) = all.split_at(kill);
    let survivors = totals(&[&a, &b]);
    eprintln!(
        "admitted per second before the kill: {before:?}\nafter it: {after:?}\n\
         the survivors' Envoys after it: {:?}\nthe stranded Envoy's after it: {:?}",
        &survivors[kill..],
        c.per_second[kill..]
            .iter()
            .map(|(admitted, _)| admitted)
            .collect::<Vec<_>>(),
    );
    assert!(
        before[6..].iter().all(|total| (90..=106).contains(total)),
        "not settled before the kill: {before:?}"
    );
    // The stranded Envoy spends its share until its assignment runs out;
    // the survivors are not handed it until then.
    assert!(
        after.iter().all(|total| *total <= 105),
        "over the limit after the kill: {after:?}"
    );
    // Its lease over (at most 16 s after the kill), the survivors take the
    // whole limit within a rebalance interval.
    assert!(
        after[18..].iter().all(|total| *total >= 90),
        "the limit not regained by 18 s after the kill: {after:?}"
    );
    // Stranded indeed: its assignment ran out, and it denies all since.
    assert!(
        c.per_second[kill + 18..]
            .iter()
            .all(|(admitted, _)| *admitted == 0),
        "the stranded Envoy admitted: {c:?}"
    );
    assert_eq!(a.failed + b.failed + c.failed, 0, "{a:?} {b:?} {c:?}");
    survivor.stop().await;
}

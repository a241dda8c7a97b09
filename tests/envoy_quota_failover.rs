//! Real Envoys (1.40, examples/envoy/quota-envoy.yaml) on two ratelimitd
//! instances sharing one Redis: a newcomer on one instance gets its share
//! at once although the Envoy on the other holds the whole limit, and when
//! an instance is killed its Envoys fail over to the survivor, which hands
//! the dead instance's share on within its instance timeout and two
//! rebalance intervals, never above the limit.

mod common;

use std::path::Path;
use std::time::Duration;

use common::envoy::{Envoy, EnvoyPorts, Tally, drive};
use common::http::start_upstream;
use common::{RedisServer, ServerProcess, TestServer};

/// 100 requests a second for the bucket every request falls into.
fn write_policies(dir: &Path) -> String {
    let path = dir.join("quota.yaml");
    std::fs::write(
        &path,
        "domain: quota-example\nquota_buckets:\n  - bucket_id: {name: api}\n    \
         rate_limit: {unit: second, requests_per_unit: 100}\n",
    )
    .expect("write the policies");
    path.to_string_lossy().into_owned()
}

/// The admitted per second of two loads started together, side by side.
fn totals(first: &Tally, second: &Tally) -> Vec<u64> {
    first
        .per_second
        .iter()
        .zip(&second.per_second)
        .map(|((a, _), (b, _))| a + b)
        .collect()
}

#[tokio::test]
async fn a_newcomer_on_another_instance_gets_its_share_within_a_second() {
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_policies(dir.path());
    let flags = ["--redis-url", &redis.url(), "--config", &config];
    let one = TestServer::start(&flags).await;
    let two = TestServer::start(&flags).await;
    let upstream = start_upstream().await;
    let ports = |ratelimitd| EnvoyPorts {
        ratelimitd,
        upstream,
    };
    let first = Envoy::start_quota(ports(one.address.port()), &[], &[]).await;
    let second = Envoy::start_quota(ports(two.address.port()), &[], &[]).await;

    // 60/s each: either alone is within the limit, both are above it. The
    // first subscribes first and, alone, is granted the whole limit; its
    // next report is 5 s away.
    let (a, b) = tokio::join!(drive(first.port, 60, 8, &[]), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        drive(second.port, 60, 8, &[]).await
    });
    let totals = totals(&a, &b);
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
    let redis = RedisServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_policies(dir.path());
    let flags = ["--redis-url", &redis.url(), "--config", &config];
    let survivor = TestServer::start(&flags).await;
    let doomed = ServerProcess::start(&flags).await;
    let upstream = start_upstream().await;
    let ports = |ratelimitd| EnvoyPorts {
        ratelimitd,
        upstream,
    };
    let first = Envoy::start_quota(ports(survivor.address.port()), &[], &[]).await;
    let edits = failover_edits(survivor.address.port());
    let edits: Vec<(&str, &str)> = edits.iter().map(|(a, b)| (*a, b.as_str())).collect();
    let second = Envoy::start_quota(
        ports(doomed.address.port()),
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
    let settled = totals(&a, &b);
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
    let after = totals(&a, &b);
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

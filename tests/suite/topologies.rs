//! Many instances, one limit, on a Redis Cluster (3 primaries, 3 replicas)
//! and on a Sentinel-managed primary: three ratelimitd processes and 300
//! concurrent callers on one key with limit 100 admit exactly 100, for every
//! algorithm; keys spread over every primary; and ratelimitd follows a
//! failover without a restart. Several limits of one `CheckLimit` whose
//! counters live on several primaries are still all or nothing.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::redis::{RedisCluster, RedisSentinel};
use common::{ServerProcess, assert_exactly_100_of_300_for_every_algorithm, fixed_window, request};
use futures::future::join_all;
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use tonic::transport::Channel;

async fn three_instances(flags: &[&str]) -> (Vec<ServerProcess>, Vec<RateLimiterClient<Channel>>) {
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let server = ServerProcess::builder().flags(flags).start().await;
        for _ in 0..3 {
            clients.push(server.client().await);
        }
        servers.push(server);
    }
    (servers, clients)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_shares_one_limit_across_instances_and_spreads_keys() {
    let cluster = RedisCluster::start().await;
    let seeds = cluster.urls().join(",");
    let flags = [
        "--redis-mode",
        "cluster",
        "--redis-url",
        &seeds,
        "--redis-command-timeout",
        "10s",
    ];
    let (_servers, clients) = three_instances(&flags).await;
    assert_exactly_100_of_300_for_every_algorithm(&clients).await;

    // Callers' keys hash over all three primaries.
    let mut client = clients[0].clone();
    for i in 0..300 {
        let key = format!("caller-{i}");
        common::check(
            &mut client,
            &key,
            &fixed_window(5, Duration::from_secs(60)),
            None,
        )
        .await;
    }
    let spread = cluster.keys_per_primary().await;
    assert_eq!(spread.len(), 3);
    assert!(
        spread.iter().all(|(_, keys)| *keys > 30),
        "keys per primary: {spread:?}"
    );

    several_limits_across_nodes_are_all_or_nothing(&cluster, &clients).await;
}

/// Six named limits on one key, whose counters live on several primaries:
/// 300 requests at once through three instances pass exactly 5 (the
/// tightest limit), and the 295 denied ones spend nothing on the other five.
async fn several_limits_across_nodes_are_all_or_nothing(
    cluster: &RedisCluster,
    clients: &[RateLimiterClient<Channel>],
) {
    use ratelimitd::pb::ratelimitd::v1 as pb;
    let limit = |name: &str, limit: u64| pb::Limit {
        name: name.into(),
        algorithm: Some(pb::limit::Algorithm::FixedWindow(pb::FixedWindow {
            limit,
            window: Some(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
        })),
        ..Default::default()
    };
    let ask = move |cost: u64| pb::CheckLimitRequest {
        key: "multi".into(),
        limits: ["tight", "b", "c", "d", "e", "f"]
            .iter()
            // The other limits hold all 300 requests, so only "tight" can
            // deny: with less, requests that passed the dry run all at
            // once could exhaust one of them, and a request "tight"
            // admitted would be refunded after others were denied.
            .map(|name| limit(name, if *name == "tight" { 5 } else { 300 }))
            .collect(),
        cost: Some(cost),
        ..Default::default()
    };
    let before = cluster.keys_per_primary().await;
    let calls = (0..300).map(|i| {
        let mut client = clients[i % clients.len()].clone();
        tokio::spawn(async move { client.check_limit(ask(1)).await })
    });
    let mut passed = 0;
    for call in join_all(calls).await {
        let answer = call.expect("task").expect("answered").into_inner();
        passed += usize::from(answer.allowed);
    }
    assert_eq!(passed, 5);
    let look = clients[0]
        .clone()
        .check_limit(ask(0))
        .await
        .expect("look")
        .into_inner();
    let remaining: Vec<u64> = look.limits.iter().map(|status| status.remaining).collect();
    assert_eq!(remaining, [0, 295, 295, 295, 295, 295]);
    let after = cluster.keys_per_primary().await;
    let gained = before
        .iter()
        .zip(&after)
        .filter(|((_, was), (_, now))| now > was)
        .count();
    assert!(
        gained >= 2,
        "the six counters on one primary: {before:?} → {after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sentinel_shares_one_limit_across_instances() {
    let sentinel = RedisSentinel::start().await;
    let sentinels = sentinel.sentinel_urls().join(",");
    let flags = [
        "--redis-mode",
        "sentinel",
        "--redis-url",
        &sentinels,
        "--redis-sentinel-master",
        sentinel.master_name(),
        "--redis-command-timeout",
        "10s",
    ];
    let (_servers, clients) = three_instances(&flags).await;
    assert_exactly_100_of_300_for_every_algorithm(&clients).await;
}

/// Steady load from a client while `fail` runs; returns (decided, failed,
/// time from the start of `fail` until the first decision after the last
/// failure).
async fn under_load<F: Future<Output = ()>>(
    client: RateLimiterClient<Channel>,
    fail: F,
) -> (u64, u64, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let decided = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let last_failure = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let started = Instant::now();
    let load = {
        let (stop, decided, failed, last_failure) = (
            stop.clone(),
            decided.clone(),
            failed.clone(),
            last_failure.clone(),
        );
        let mut client = client;
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let call = request(
                    &format!("load-{i}"),
                    fixed_window(5, Duration::from_secs(60)),
                    None,
                );
                let begun = Instant::now();
                match client.check_limit(call).await {
                    Ok(_) => {
                        decided.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(status) => {
                        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                        failed.fetch_add(1, Ordering::Relaxed);
                        *last_failure.lock().expect("lock") = Some(Instant::now());
                    }
                }
                assert!(begun.elapsed() < Duration::from_secs(3), "a call hung");
            }
        })
    };
    common::eventually("load to flow", || async {
        decided.load(Ordering::Relaxed) > 50
    })
    .await;
    let failing_from = Instant::now();
    fail.await;
    // Recovered: 200 decisions in a row after the last failure.
    common::eventually("decisions to flow again", || async {
        let quiet = last_failure
            .lock()
            .expect("lock")
            .is_none_or(|at| at.elapsed() > Duration::from_millis(500));
        quiet && decided.load(Ordering::Relaxed) > 250
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    load.await.expect("no panic in the load");
    let recovered = last_failure
        .lock()
        .expect("lock")
        .map_or(Duration::ZERO, |at| at.duration_since(failing_from));
    let _ = started;
    (
        decided.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        recovered,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_primary_killed_under_load_is_followed() {
    let mut cluster = RedisCluster::start().await;
    let seeds = cluster.urls().join(",");
    let server = ServerProcess::builder()
        .flags(&[
            "--redis-mode",
            "cluster",
            "--redis-url",
            &seeds,
            "--redis-command-timeout",
            "500ms",
        ])
        .start()
        .await;
    let client = server.client().await;
    let cluster_ref = &mut cluster;
    let (decided, failed, recovered) = under_load(client, async move {
        let killed = cluster_ref.kill_primary(0).await;
        cluster_ref.await_failover(&killed).await;
    })
    .await;
    println!(
        "cluster primary killed under load: {decided} decided, {failed} UNAVAILABLE, last error \
         {recovered:?} after the kill"
    );
    // Exact again on the new topology.
    let mut client = server.client().await;
    for key in ["after-a", "after-b", "after-c"] {
        common::assert_two_of_three_admitted(&mut client, key).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sentinel_failover_is_followed() {
    let mut sentinel = RedisSentinel::start().await;
    let sentinels = sentinel.sentinel_urls().join(",");
    let server = ServerProcess::builder()
        .flags(&[
            "--redis-mode",
            "sentinel",
            "--redis-url",
            &sentinels,
            "--redis-sentinel-master",
            sentinel.master_name(),
            "--redis-command-timeout",
            "500ms",
        ])
        .start()
        .await;
    let client = server.client().await;
    let sentinel_ref = &mut sentinel;
    let (decided, failed, recovered) = under_load(client, async move {
        let old = sentinel_ref.kill_primary().await;
        sentinel_ref.await_failover(old).await;
    })
    .await;
    println!(
        "sentinel primary killed under load: {decided} decided, {failed} UNAVAILABLE, last error \
         {recovered:?} after the kill"
    );
    let mut client = server.client().await;
    common::assert_two_of_three_admitted(&mut client, "after").await;
}

mod envoy_across_nodes {
    use super::*;
    use common::rls::{descriptor, with_hits};
    use ratelimitd::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

    /// (the 100-a-day number limit, the 5-a-day marketing limit) of
    /// fixtures/ratelimit/example2.yaml, for one number: two keys that hash
    /// to different cluster slots.
    fn both(number: &str, hits: u64) -> RateLimitRequest {
        RateLimitRequest {
            domain: "messaging".into(),
            descriptors: vec![
                with_hits(descriptor(&[("to_number", number)]), hits),
                with_hits(
                    descriptor(&[("message_type", "marketing"), ("to_number", number)]),
                    hits,
                ),
            ],
            hits_addend: 0,
        }
    }

    async fn remaining_of_number(
        client: &mut RateLimitServiceClient<Channel>,
        number: &str,
    ) -> u32 {
        let look = RateLimitRequest {
            domain: "messaging".into(),
            descriptors: vec![with_hits(descriptor(&[("to_number", number)]), 0)],
            hits_addend: 0,
        };
        client
            .should_rate_limit(look)
            .await
            .expect("answer")
            .into_inner()
            .statuses[0]
            .limit_remaining
    }

    /// Sends `count` requests of one hit on both of `number`'s limits at
    /// once, spread over `clients`: how many passed.
    async fn at_once(
        clients: &[RateLimitServiceClient<Channel>],
        number: &str,
        count: usize,
    ) -> usize {
        let calls = (0..count).map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let request = both(number, 1);
            tokio::spawn(async move { client.should_rate_limit(request).await })
        });
        let mut passed = 0;
        for call in join_all(calls).await {
            let response = call.expect("task").expect("answered").into_inner();
            passed += usize::from(response.overall_code() == Code::Ok);
        }
        passed
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn requests_spanning_cluster_nodes_are_all_or_nothing() {
        let cluster = RedisCluster::start().await;
        let seeds = cluster.urls().join(",");
        let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/ratelimit");
        let flags = [
            "--redis-mode",
            "cluster",
            "--redis-url",
            &seeds,
            "--config",
            fixtures,
            "--redis-command-timeout",
            "10s",
        ];
        let mut servers = Vec::new();
        let mut clients = Vec::new();
        for _ in 0..3 {
            let server = ServerProcess::builder().flags(&flags).start().await;
            clients.push(RateLimitServiceClient::new(
                common::channel(server.address).await,
            ));
            servers.push(server);
        }
        let mut client = clients[0].clone();

        // Denied by the 5-a-day limit: the number's own limit spends nothing.
        let denied = client
            .should_rate_limit(both("1", 6))
            .await
            .expect("answer")
            .into_inner();
        assert_eq!(denied.overall_code(), Code::OverLimit);
        assert_eq!(remaining_of_number(&mut client, "1").await, 100);
        let allowed = client
            .should_rate_limit(both("1", 5))
            .await
            .expect("answer")
            .into_inner();
        assert_eq!(allowed.overall_code(), Code::Ok);
        assert_eq!(remaining_of_number(&mut client, "1").await, 95);

        // 90 at once through three instances, only the 5-a-day limit
        // contended (the number's 100 cannot run out): exactly 5 pass, and
        // the 85 denied ones leave the number's limit as the 5 left it.
        let passed = at_once(&clients, "2", 90).await;
        assert_eq!(passed, 5);
        assert_eq!(remaining_of_number(&mut client, "2").await, 95);

        // 300 at once, both limits contended: a request can be denied by
        // the number's units that a request denied elsewhere holds between
        // its spend and its refund, so fewer than 5 may pass; never more,
        // and every unit given back leaves the number's limit as the
        // passing requests left it.
        let passed = at_once(&clients, "3", 300).await;
        println!("both limits contended: {passed} of 300 passed a 5-a-day limit");
        assert!(passed <= 5, "{passed} of 300 passed a 5-a-day limit");
        assert_eq!(
            remaining_of_number(&mut client, "3").await,
            100 - u32::try_from(passed).expect("at most 5")
        );
    }
}

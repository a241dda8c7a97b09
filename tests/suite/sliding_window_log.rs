//! The sliding log on Redis keeps one sorted-set member per request that
//! spent, whatever its cost, and bounds the work of one call: a large cost
//! is one member, entries past the window are skipped and pruned a bounded
//! number per call while the answers stay exact, and a refund takes back one
//! entry and the later entries' running totals with it.

use crate::common;

use std::time::Duration;

use common::{RedisServer, TestServer, check, duration, sliding_window};
use ratelimitd::algorithm::{Algorithm, SlidingWindow};
use ratelimitd::limit::Micros;
use ratelimitd::limiter::script::{self, Mode, ScriptLimit, SpendMark};
use redis::aio::MultiplexedConnection;

/// The storage key of caller key `key` under the sliding window, with the
/// default prefix.
fn storage_key(key: &str) -> String {
    format!("ratelimitd:{{sl:{key}}}")
}

async fn members(redis: &RedisServer, key: &str) -> u64 {
    let mut connection = redis.connection().await;
    redis::cmd("ZCARD")
        .arg(storage_key(key))
        .query_async(&mut connection)
        .await
        .expect("ZCARD")
}

#[tokio::test]
async fn a_large_cost_is_one_member() {
    let redis = RedisServer::start().await;
    let server = TestServer::on_redis(&redis).await;
    let mut client = server.client().await;
    let window = Duration::from_secs(60);
    let limit = sliding_window(100_000, window);

    let spent = check(&mut client, "big", &limit, Some(100_000)).await;
    assert!(spent.allowed);
    assert_eq!(spent.remaining, 0);
    assert_eq!(members(&redis, "big").await, 1);

    let denied = check(&mut client, "big", &limit, Some(1)).await;
    assert!(!denied.allowed);
    let retry_after = duration(denied.retry_after);
    assert!(
        retry_after > window / 2 && retry_after <= window,
        "the one entry leaves a window after it was spent: {retry_after:?}"
    );
    assert_eq!(members(&redis, "big").await, 1, "a denial adds nothing");
    server.stop().await;
    redis.assert_every_key_expires().await;
}

#[tokio::test]
async fn entries_past_the_window_are_skipped_and_pruned_128_per_call() {
    let redis = RedisServer::start().await;
    // Straight to the script, so 300 entries are written well within the
    // window whatever the build.
    let mut connection = redis.connection().await;
    let window = Duration::from_secs(1);
    let limit = sliding_algorithm(1000, window);
    let log = storage_key("log");
    let marker = storage_key("marker");
    let watcher = connection.clone();
    let look_at_marker = move |condition: fn(ratelimitd::limit::Decision) -> bool| {
        let (connection, marker) = (watcher.clone(), marker.clone());
        move || {
            let (mut connection, marker) = (connection.clone(), marker.clone());
            async move { condition(spend(&mut connection, &marker, &limit, 0).await.0) }
        }
    };
    for _ in 0..300 {
        assert!(spend(&mut connection, &log, &limit, 1).await.0.is_allowed());
    }
    // Spent after every entry of "log", on the same Redis clock: its age is
    // at most theirs.
    assert!(
        spend(&mut connection, &storage_key("marker"), &limit, 1)
            .await
            .0
            .is_allowed()
    );
    common::eventually(
        "half the window to pass",
        look_at_marker(|look| look.reset_after() <= Micros::from_millis(500)),
    )
    .await;
    // One more entry keeps the key alive while the 300 leave the window.
    assert!(spend(&mut connection, &log, &limit, 1).await.0.is_allowed());
    assert_eq!(members(&redis, "log").await, 301);
    common::eventually(
        "the 300 to leave the window",
        look_at_marker(|look| look.remaining() == 1000),
    )
    .await;

    // Each call drops at most 128 aged-out entries, counts none of them,
    // and adds its own.
    for (remaining, left) in [(998, 172 + 2), (997, 44 + 3), (996, 4)] {
        let (decision, _) = spend(&mut connection, &log, &limit, 1).await;
        assert!(decision.is_allowed());
        assert_eq!(decision.remaining(), remaining);
        assert_eq!(members(&redis, "log").await, left);
    }
    redis.assert_every_key_expires().await;
}

fn sliding_algorithm(limit: u64, window: Duration) -> Algorithm {
    Algorithm::SlidingWindow(SlidingWindow::new(limit, window).expect("a sliding window"))
}

/// Runs the decision script for one sliding-window limit on `key`; its
/// reply and the mark a refund of it needs.
async fn spend(
    connection: &mut MultiplexedConnection,
    key: &str,
    limit: &Algorithm,
    cost: u64,
) -> (ratelimitd::limit::Decision, SpendMark) {
    let limits = [script_limit(key, limit, cost)];
    let reply: redis::Value = script::decide_call(Mode::Decide, &limits)
        .invoke_async(connection)
        .await
        .expect("decision script");
    let decided = script::decode(&limits, &reply).expect("a decision")[0];
    (decided.decision, decided.mark)
}

fn script_limit<'a>(key: &'a str, algorithm: &'a Algorithm, cost: u64) -> ScriptLimit<'a> {
    ScriptLimit {
        key,
        algorithm,
        cost,
        shadow: false,
    }
}

async fn refund(
    connection: &mut MultiplexedConnection,
    key: &str,
    limit: &Algorithm,
    cost: u64,
    mark: SpendMark,
) -> i64 {
    script::refund_call(&[(script_limit(key, limit, cost), mark)])
        .invoke_async(connection)
        .await
        .expect("refund script")
}

#[tokio::test]
async fn a_refund_takes_back_one_entry_and_its_units_from_the_later_totals() {
    let redis = RedisServer::start().await;
    let mut connection = redis.connection().await;
    let limit = sliding_algorithm(10, Duration::from_secs(60));
    let key = &storage_key("refunded");

    let (first, _) = spend(&mut connection, key, &limit, 3).await;
    let (_, middle) = spend(&mut connection, key, &limit, 4).await;
    let (last, _) = spend(&mut connection, key, &limit, 2).await;
    assert!(first.is_allowed() && last.is_allowed());
    assert_eq!(last.remaining(), 1);
    assert_eq!(refund(&mut connection, key, &limit, 4, middle).await, 1);
    assert_eq!(
        refund(&mut connection, key, &limit, 4, middle).await,
        0,
        "a refund is given once"
    );

    // 3 + 2 units are left: 5 remain, and the entries' totals agree.
    let (look, _) = spend(&mut connection, key, &limit, 0).await;
    assert_eq!(look.remaining(), 5);
    // Cost 8 needs 3 units to leave: the first entry. Cost 9 needs 4: the
    // last one, whose leaving is also the key's reset.
    let (needs_first, _) = spend(&mut connection, key, &limit, 8).await;
    let (needs_last, _) = spend(&mut connection, key, &limit, 9).await;
    assert!(!needs_first.is_allowed() && !needs_last.is_allowed());
    let ratelimitd::limit::RetryAfter::After(first_leaves) = needs_first.retry_after() else {
        panic!("cost 8 of 10 can pass: {needs_first:?}");
    };
    assert!(first_leaves < needs_first.reset_after(), "{needs_first:?}");
    assert_eq!(
        needs_last.retry_after(),
        ratelimitd::limit::RetryAfter::After(needs_last.reset_after())
    );
    let (fits, _) = spend(&mut connection, key, &limit, 5).await;
    assert!(fits.is_allowed());
    assert_eq!(fits.remaining(), 0);
    redis.assert_every_key_expires().await;
}

#[tokio::test]
async fn a_refund_with_many_later_entries_over_counts_never_under() {
    let redis = RedisServer::start().await;
    let mut connection = redis.connection().await;
    let limit = sliding_algorithm(1000, Duration::from_secs(60));
    let key = &storage_key("busy");
    spend(&mut connection, key, &limit, 1).await;
    let (_, refunded) = spend(&mut connection, key, &limit, 1).await;
    for _ in 0..70 {
        spend(&mut connection, key, &limit, 1).await;
    }
    assert_eq!(refund(&mut connection, key, &limit, 1, refunded).await, 1);
    // 71 units are spent; the 70 entries after the refunded one are more
    // than a refund rewrites (64), so its unit still counts until the entry
    // before it leaves the window.
    let (look, _) = spend(&mut connection, key, &limit, 0).await;
    assert_eq!(look.remaining(), 1000 - 72);

    // Refunding the oldest entry needs no rewrite at all.
    let other = &storage_key("oldest");
    let (_, oldest) = spend(&mut connection, other, &limit, 5).await;
    for _ in 0..70 {
        spend(&mut connection, other, &limit, 1).await;
    }
    assert_eq!(refund(&mut connection, other, &limit, 5, oldest).await, 1);
    let (look, _) = spend(&mut connection, other, &limit, 0).await;
    assert_eq!(look.remaining(), 1000 - 70);
    redis.assert_every_key_expires().await;
}

/// Sliding-log requests of cost 100 000 (three of them used to block Redis
/// long enough to fail unrelated callers) running beside an unrelated
/// caller: every call of both is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_costs_leave_other_callers_decided() {
    let redis = RedisServer::start().await;
    let server = TestServer::on_redis(&redis).await;
    let client = server.client().await;
    let limit = sliding_window(100_000, Duration::from_secs(60));
    let heavy: Vec<_> = (0..3)
        .map(|worker| {
            let mut client = client.clone();
            tokio::spawn(async move {
                for round in 0..20 {
                    let key = format!("heavy-{worker}-{round}");
                    assert!(
                        check(&mut client, &key, &limit, Some(100_000))
                            .await
                            .allowed
                    );
                }
            })
        })
        .collect();
    let mut other = client.clone();
    let small = sliding_window(1000, Duration::from_secs(60));
    for expected in (900..1000).rev() {
        assert_eq!(
            check(&mut other, "unrelated", &small, None).await.remaining,
            expected
        );
    }
    for worker in heavy {
        worker.await.expect("a heavy worker");
    }
    server.stop().await;
    redis.assert_every_key_expires().await;
}

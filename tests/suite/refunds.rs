//! Every registered algorithm's refund, through the refund script as the
//! registry puts it together: what a decision spent on Redis is given back
//! once, and a key that was never spent has nothing to give back; and a
//! lease's give-back to a fixed window, on both stores, reaches only the
//! window spent. (The sliding log's own refund rules are
//! tests/suite/sliding_window_log.rs's.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::RedisServer;
use ratelimitd::algorithm::registry::{Kind, Rate};
use ratelimitd::algorithm::{Algorithm, FixedWindow, LimitRequest};
use ratelimitd::limit::{CallerKey, Decision};
use ratelimitd::limiter::script::{self, Mode, ScriptLimit, SpendMark};
use ratelimitd::limiter::{Limiter, Store, storage_key};
use ratelimitd::store::{MemoryStore, RedisSettings, RedisStore, SystemClock, Topology};
use redis::aio::MultiplexedConnection;

fn limit<'a>(key: &'a str, algorithm: &'a Algorithm, cost: u64) -> ScriptLimit<'a> {
    ScriptLimit {
        key,
        algorithm,
        cost,
        shadow: false,
    }
}

/// Decides `cost` on `key` in `mode`: the decision and its spend's mark.
async fn decide(
    connection: &mut MultiplexedConnection,
    mode: Mode,
    key: &str,
    algorithm: &Algorithm,
    cost: u64,
) -> (Decision, SpendMark) {
    let limits = [limit(key, algorithm, cost)];
    let reply: redis::Value = script::decide_call(mode, &limits)
        .invoke_async(connection)
        .await
        .expect("decision script");
    let decided = script::decode(&limits, &reply).expect("a decision")[0];
    (decided.decision, decided.mark)
}

async fn refund(
    connection: &mut MultiplexedConnection,
    key: &str,
    algorithm: &Algorithm,
    cost: u64,
    mark: SpendMark,
) -> i64 {
    script::refund_call(&[(limit(key, algorithm, cost), mark)])
        .invoke_async(connection)
        .await
        .expect("refund script")
}

#[tokio::test]
async fn every_algorithm_gives_back_what_it_spent() {
    let redis = RedisServer::start().await;
    let mut connection = redis.connection().await;
    // A minute's window and a slow refill: nothing comes back by itself
    // while the test runs.
    let rate = Rate::new(10, Duration::from_secs(600));
    for kind in Kind::ALL {
        for (i, algorithm) in kind.layouts(rate).expect("valid").iter().enumerate() {
            let caller = CallerKey::new(format!("{}-{i}", kind.name())).expect("a key");
            let key = &storage_key("refunds:", algorithm, &caller);
            let what = format!("{} ({algorithm:?})", kind.name());
            assert_eq!(
                refund(&mut connection, key, algorithm, 3, SpendMark::Unmarked).await,
                0,
                "{what}: a key never spent has nothing to give back"
            );
            let (spent, mark) = decide(&mut connection, Mode::Decide, key, algorithm, 3).await;
            assert!(spent.is_allowed(), "{what}");
            assert_eq!(spent.remaining(), 7, "{what}");
            assert_eq!(
                refund(&mut connection, key, algorithm, 3, mark).await,
                1,
                "{what}"
            );
            let (look, _) = decide(&mut connection, Mode::Look, key, algorithm, 0).await;
            assert_eq!(look.remaining(), 10, "{what}: all given back");
        }
    }
}

/// A lease's give-back of an anchored fixed window's units, through the
/// library on both stores: back only to the window they were spent in,
/// whose end the spend's mark names; a give-back that comes after the
/// window rolled over gives nothing to the next one, and none ever takes
/// the count below zero.
#[tokio::test]
async fn a_window_takes_back_units_only_while_it_counts_the_window_spent() {
    let redis = RedisServer::start().await;
    let on_redis = Limiter::new(Store::Redis(redis_store(&redis)), "refunds:");
    let embedded = Limiter::new(
        Store::Memory(MemoryStore::new(Arc::new(SystemClock::default()))),
        "refunds:",
    );
    for (name, limiter) in [("redis", on_redis), ("embedded", embedded)] {
        a_window_takes_back_only_its_own(name, &limiter).await;
    }
}

async fn a_window_takes_back_only_its_own(store: &str, limiter: &Limiter) {
    let window =
        Algorithm::FixedWindow(FixedWindow::new(5, Duration::from_millis(100)).expect("a window"));
    let request = |cost| LimitRequest {
        key: CallerKey::new("w".into()).expect("a key"),
        algorithm: window,
        cost,
        shadow: false,
    };
    let remaining = || async {
        limiter
            .check(&request(0), None)
            .await
            .expect("a look")
            .remaining()
    };
    let spend = |cost| async move {
        let spent = limiter
            .spend_marked(&[request(cost)])
            .await
            .expect("a spend");
        let (decision, mark) = spent[0];
        assert!(decision.is_allowed(), "{store}: {decision:?}");
        mark.unwrap_or_else(|| panic!("{store}: a spend has a mark"))
    };
    let give_back = |cost, mark| async move {
        limiter
            .give_back(&[(request(cost), mark)])
            .await
            .expect("a give-back")
    };

    let first = spend(3).await;
    assert!(
        matches!(first, SpendMark::WindowEnd(_)),
        "{store}: {first:?}"
    );
    // The window ends within 100 ms of the spend.
    let deadline = Instant::now() + Duration::from_secs(5);
    while remaining().await < 5 {
        assert!(Instant::now() < deadline, "{store}: the window never ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = spend(2).await;
    assert_ne!(first, second, "{store}: each window has its own end");
    assert!(
        !give_back(3, first).await,
        "{store}: the first window's units are not given to the second"
    );
    assert_eq!(remaining().await, 3, "{store}");
    assert!(give_back(2, second).await, "{store}");
    assert_eq!(
        remaining().await,
        5,
        "{store}: the second window's units are back"
    );
    // More than was counted: the count stops at none, so the window still
    // admits exactly its limit.
    assert!(give_back(4, second).await, "{store}");
    assert_eq!(remaining().await, 5, "{store}");
    spend(5).await;
    let over = limiter.check(&request(1), None).await.expect("a check");
    assert!(!over.is_allowed(), "{store}: {over:?}");
}

fn redis_store(redis: &RedisServer) -> RedisStore {
    RedisStore::new(&RedisSettings {
        urls: vec![redis.url()],
        topology: Topology::Standalone,
        sentinel: Default::default(),
        pool_size: 2,
        connect_timeout: Duration::from_secs(5),
        command_timeout: Duration::from_secs(10),
        breaker_threshold: 3,
        batch_calls: 64,
        tls: Default::default(),
    })
    .expect("a Redis store")
}

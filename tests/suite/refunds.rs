//! Every registered algorithm's refund, through the refund script as the
//! registry puts it together: what a decision spent on Redis is given back
//! once, and a key that was never spent has nothing to give back. (The
//! sliding log's own refund rules are tests/suite/sliding_window_log.rs's.)

use std::time::Duration;

use crate::common::RedisServer;
use ratelimitd::algorithm::Algorithm;
use ratelimitd::algorithm::registry::{Kind, Rate};
use ratelimitd::limit::{CallerKey, Decision};
use ratelimitd::limiter::script::{self, Mode, ScriptLimit, SpendMark};
use ratelimitd::limiter::storage_key;
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

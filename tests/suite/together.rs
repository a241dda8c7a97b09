//! Several limits decided together for one request (what Envoy's
//! descriptors need), through the library on both stores: a request denied
//! by one limit spends nothing on the others, a limit in shadow mode never
//! denies, and under concurrency no limit is over-admitted and denied
//! requests leave no trace.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{RedisServer, every_model_algorithm};
use futures::future::join_all;
use ratelimitd::algorithm::{Algorithm, FixedWindow, LimitRequest};
use ratelimitd::limit::CallerKey;
use ratelimitd::limiter::{Limiter, Store};
use ratelimitd::store::{MemoryStore, RedisSettings, RedisStore, SystemClock, Topology};

fn memory_limiter() -> Limiter {
    Limiter::new(
        Store::Memory(MemoryStore::new(Arc::new(SystemClock::default()))),
        "t:",
    )
}

fn redis_limiter(redis: &RedisServer) -> Limiter {
    let store = RedisStore::new(&RedisSettings {
        urls: vec![redis.url()],
        topology: Topology::Standalone,
        sentinel: Default::default(),
        pool_size: 8,
        connect_timeout: Duration::from_secs(5),
        command_timeout: Duration::from_secs(10),
        breaker_threshold: 3,
        batch_calls: 64,
        tls: Default::default(),
    })
    .expect("redis store");
    Limiter::new(Store::Redis(store), "t:")
}

fn limit(key: &str, algorithm: Algorithm, cost: u64) -> LimitRequest {
    LimitRequest {
        key: CallerKey::new(key.into()).expect("key"),
        algorithm,
        cost,
        shadow: false,
    }
}

fn fixed(limit: u64) -> Algorithm {
    Algorithm::FixedWindow(FixedWindow::new(limit, Duration::from_secs(60)).expect("fixed"))
}

async fn remaining(limiter: &Limiter, key: &str, algorithm: Algorithm) -> u64 {
    limiter
        .check(&limit(key, algorithm, 0), None)
        .await
        .expect("look")
        .remaining()
}

async fn a_denial_by_one_limit_spends_nothing_on_the_others(limiter: &Limiter) {
    for (i, algorithm) in every_model_algorithm(5).into_iter().enumerate() {
        let (roomy, full) = (format!("roomy{i}"), format!("full{i}"));
        limiter
            .check(&limit(&full, algorithm, 5), None)
            .await
            .expect("fill");
        let decisions = limiter
            .check_all(
                &[limit(&roomy, algorithm, 2), limit(&full, algorithm, 1)],
                None,
            )
            .await
            .expect("decide");
        assert!(
            decisions[0].is_allowed(),
            "the roomy limit alone would allow"
        );
        assert_eq!(
            decisions[0].remaining(),
            5,
            "and reports what it has, unspent"
        );
        assert!(!decisions[1].is_allowed());
        assert_eq!(
            remaining(limiter, &roomy, algorithm).await,
            5,
            "{algorithm:?}"
        );

        let both = limiter
            .check_all(
                &[
                    limit(&roomy, algorithm, 2),
                    limit(&format!("free{i}"), algorithm, 1),
                ],
                None,
            )
            .await
            .expect("decide");
        assert!(both.iter().all(|d| d.is_allowed()));
        assert_eq!(both[0].remaining(), 3, "spent when every limit allows");
    }
}

async fn a_shadow_limit_never_denies(limiter: &Limiter) {
    limiter
        .check(&limit("shadowed", fixed(1), 1), None)
        .await
        .expect("fill");
    let shadowed = LimitRequest {
        shadow: true,
        ..limit("shadowed", fixed(1), 1)
    };
    let decisions = limiter
        .check_all(&[limit("enforced", fixed(3), 1), shadowed], None)
        .await
        .expect("decide");
    assert!(decisions[0].is_allowed());
    assert!(
        !decisions[1].is_allowed(),
        "the shadow limit reports its own denial"
    );
    assert_eq!(
        remaining(limiter, "enforced", fixed(3)).await,
        2,
        "the request was spent"
    );
}

async fn one_key_twice_is_counted_once_with_both_costs(limiter: &Limiter) {
    let decisions = limiter
        .check_all(
            &[limit("twice", fixed(3), 2), limit("twice", fixed(3), 2)],
            None,
        )
        .await
        .expect("decide");
    assert!(decisions.iter().all(|d| !d.is_allowed()), "2 + 2 exceeds 3");
    assert_eq!(remaining(limiter, "twice", fixed(3)).await, 3);
    let decisions = limiter
        .check_all(
            &[limit("twice", fixed(3), 1), limit("twice", fixed(3), 2)],
            None,
        )
        .await
        .expect("decide");
    assert!(decisions.iter().all(|d| d.is_allowed()));
    assert_eq!(remaining(limiter, "twice", fixed(3)).await, 0);
}

/// 300 requests at once, each needing a shared limit of 100 and a tighter
/// one of 60: exactly 60 pass, and the 240 denied ones leave the shared
/// limit untouched.
async fn concurrent_groups_admit_exactly_and_denials_leave_no_trace(limiter: &Limiter) {
    let tight_ones = every_model_algorithm(60);
    for (i, algorithm) in every_model_algorithm(100).into_iter().enumerate() {
        let tight = tight_ones[i];
        let (shared, narrow) = (format!("shared{i}"), format!("narrow{i}"));
        let calls = (0..300).map(|_| {
            let limiter = limiter.clone();
            let group = [limit(&shared, algorithm, 1), limit(&narrow, tight, 1)];
            tokio::spawn(async move { limiter.check_all(&group, None).await })
        });
        let mut allowed = 0;
        for result in join_all(calls).await {
            let decisions = result.expect("task").expect("decided");
            if decisions.iter().all(|d| d.is_allowed()) {
                allowed += 1;
            }
        }
        assert_eq!(allowed, 60, "{algorithm:?}");
        assert_eq!(
            remaining(limiter, &shared, algorithm).await,
            40,
            "{algorithm:?}"
        );
    }
}

macro_rules! on_both_stores {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    super::$case(&super::memory_limiter()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $case() {
                    let redis = super::RedisServer::start().await;
                    super::$case(&super::redis_limiter(&redis)).await;
                    redis.assert_every_key_expires().await;
                }
            )*
        }
    };
}

on_both_stores!(
    a_denial_by_one_limit_spends_nothing_on_the_others,
    a_shadow_limit_never_denies,
    one_key_twice_is_counted_once_with_both_costs,
    concurrent_groups_admit_exactly_and_denials_leave_no_trace,
);

//! One behaviour suite for every store: each case below runs through gRPC
//! against a server on the embedded store and against one on a real
//! `redis-server`, and must give the same answers; and all of them in turn
//! on a Redis Cluster, on a Sentinel-managed Redis, behind an ACL user, and
//! over TLS with a client certificate. On standalone Redis,
//! every case ends by checking that every key it wrote has a TTL.

use crate::common;

use std::time::Duration;

use common::redis::{RedisCluster, RedisSentinel, Secured};
use common::{
    RedisServer, TestServer, check, duration, eventually, every_algorithm, fixed_window, gcra,
    sliding_window, sliding_window_counter, token_bucket,
};
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use tonic::transport::Channel;

type Client = RateLimiterClient<Channel>;

/// Expands each case into a test per store.
macro_rules! on_every_store {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $case() {
                    let server = super::TestServer::memory().await;
                    super::$case(&mut server.client().await).await;
                    server.stop().await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test]
                async fn $case() {
                    let redis = super::RedisServer::start().await;
                    let server = super::TestServer::on_redis(&redis).await;
                    super::$case(&mut server.client().await).await;
                    server.stop().await;
                    redis.assert_every_key_expires().await;
                }
            )*
        }
        /// On a Redis Cluster and on Sentinel, one deployment runs every
        /// case in turn, each under a key prefix of its own.
        mod redis_cluster {
            #[tokio::test]
            async fn every_case() {
                let cluster = super::RedisCluster::start().await;
                let seeds = cluster.urls().join(",");
                $(
                    let prefix = concat!(stringify!($case), ":");
                    let flags = ["--redis-mode", "cluster", "--redis-url", &seeds, "--key-prefix", prefix];
                    let server = super::TestServer::start(&flags).await;
                    super::$case(&mut server.client().await).await;
                    server.stop().await;
                )*
            }
        }
        /// Behind an ACL user and over TLS with a private CA and a client
        /// certificate, every case in turn.
        mod redis_secured {
            use super::Secured;

            #[tokio::test]
            async fn every_case_with_an_acl_user() {
                let redis = super::RedisServer::with_acl_user("limiter", "s3cret").await;
                let url = redis.url();
                $(
                    let prefix = concat!(stringify!($case), ":");
                    let flags = ["--redis-url", &url, "--key-prefix", prefix];
                    let server = super::TestServer::start(&flags).await;
                    super::$case(&mut server.client().await).await;
                    server.stop().await;
                )*
            }

            #[tokio::test]
            async fn every_case_over_tls() {
                let redis = super::RedisServer::with_tls_client_auth().await;
                let url = redis.url();
                let path = |file: &std::path::Path| file.to_string_lossy().into_owned();
                let (ca, cert, key) = (
                    path(redis.ca_cert_path()),
                    path(redis.client_cert_path()),
                    path(redis.client_key_path()),
                );
                $(
                    let prefix = concat!(stringify!($case), ":");
                    // A new server per case opens its first connection, TLS
                    // handshake included, inside its first call: a debug build
                    // on a loaded machine may need more than the default 100 ms.
                    let flags = [
                        "--redis-url", &url, "--redis-tls-ca", &ca, "--redis-tls-cert", &cert,
                        "--redis-tls-key", &key, "--key-prefix", prefix,
                        "--redis-command-timeout", "2s",
                    ];
                    let server = super::TestServer::start(&flags).await;
                    super::$case(&mut server.client().await).await;
                    server.stop().await;
                )*
            }
        }
        mod redis_sentinel {
            #[tokio::test]
            async fn every_case() {
                let sentinel = super::RedisSentinel::start().await;
                let sentinels = sentinel.sentinel_urls().join(",");
                $(
                    let prefix = concat!(stringify!($case), ":");
                    let flags = [
                        "--redis-mode", "sentinel", "--redis-url", &sentinels,
                        "--redis-sentinel-master", sentinel.master_name(), "--key-prefix", prefix,
                    ];
                    let server = super::TestServer::start(&flags).await;
                    super::$case(&mut server.client().await).await;
                    server.stop().await;
                )*
            }
        }
    };
}

on_every_store!(
    fixed_window_allows_exactly_the_limit_then_denies,
    fixed_window_allows_again_after_the_window,
    sliding_window_allows_exactly_the_limit_then_denies,
    sliding_window_frees_units_as_they_age_out,
    token_bucket_starts_full_then_denies,
    token_bucket_refills_continuously,
    token_bucket_refills_at_fractional_rates,
    gcra_allows_a_burst_then_one_per_interval,
    sliding_window_counter_allows_the_limit_then_denies,
    sliding_window_counter_rolls_over_to_the_next_window,
    costs_above_one_spend_that_many_units,
    cost_zero_looks_without_spending,
    a_cost_above_the_limit_is_never_allowed,
    algorithms_keep_separate_state_for_one_key,
    any_characters_in_a_key_are_safe,
    one_millisecond_windows_work,
    large_costs_on_the_sliding_log_are_exact,
    sliding_log_entries_of_several_units_leave_oldest_first,
);

async fn fixed_window_allows_exactly_the_limit_then_denies(client: &mut Client) {
    let window = Duration::from_secs(10);
    let limit = fixed_window(5, window);
    for expected_remaining in (0..5).rev() {
        let response = check(client, "user42", &limit, None).await;
        assert!(response.allowed);
        assert_eq!(response.limit, 5);
        assert_eq!(response.remaining, expected_remaining);
        assert_eq!(duration(response.retry_after), Duration::ZERO);
        let reset_after = duration(response.reset_after);
        assert!(
            reset_after <= window && reset_after > window / 2,
            "{reset_after:?}"
        );
    }
    let denied = check(client, "user42", &limit, None).await;
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 0);
    assert!(!denied.cost_exceeds_limit);
    let retry_after = duration(denied.retry_after);
    assert!(
        retry_after <= window && retry_after > window / 2,
        "{retry_after:?}"
    );
    // The whole limit comes back when the window ends.
    assert_eq!(retry_after, duration(denied.reset_after));
}

async fn fixed_window_allows_again_after_the_window(client: &mut Client) {
    let limit = fixed_window(2, Duration::from_millis(500));
    assert!(check(client, "k", &limit, None).await.allowed);
    assert!(check(client, "k", &limit, None).await.allowed);
    let denied = check(client, "k", &limit, None).await;
    assert!(!denied.allowed);
    tokio::time::sleep(duration(denied.retry_after)).await;
    let again = check(client, "k", &limit, None).await;
    assert!(again.allowed, "a new window starts after retry_after");
    assert_eq!(again.remaining, 1);
}

async fn sliding_window_allows_exactly_the_limit_then_denies(client: &mut Client) {
    let window = Duration::from_secs(10);
    let limit = sliding_window(5, window);
    for expected_remaining in (0..5).rev() {
        let response = check(client, "user42", &limit, None).await;
        assert!(response.allowed);
        assert_eq!(response.remaining, expected_remaining);
    }
    let denied = check(client, "user42", &limit, None).await;
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 0);
    let retry_after = duration(denied.retry_after);
    assert!(
        retry_after <= window && retry_after > window / 2,
        "{retry_after:?}"
    );
    assert!(duration(denied.reset_after) >= retry_after);
}

async fn sliding_window_frees_units_as_they_age_out(client: &mut Client) {
    let window = Duration::from_millis(1500);
    let limit = sliding_window(3, window);
    let first = check(client, "k", &limit, None).await;
    assert!(first.allowed);
    // Wait for the clock to move on by a window's third, as the store sees it:
    // the first unit's reset_after shrinks.
    common::eventually("a third of the window to pass", || {
        let mut client = client.clone();
        async move {
            let look = check(&mut client, "k", &limit, Some(0)).await;
            duration(look.reset_after) <= window * 2 / 3
        }
    })
    .await;
    assert!(check(client, "k", &limit, Some(2)).await.allowed);
    let denied = check(client, "k", &limit, None).await;
    assert!(!denied.allowed);
    // Only the first unit must leave, and it is the oldest.
    let retry_after = duration(denied.retry_after);
    assert!(retry_after <= window * 2 / 3, "{retry_after:?}");
    assert!(duration(denied.reset_after) > retry_after);
    tokio::time::sleep(retry_after).await;
    let again = check(client, "k", &limit, None).await;
    assert!(again.allowed, "the oldest unit has left the window");
    assert_eq!(again.remaining, 0);
    assert!(
        !check(client, "k", &limit, None).await.allowed,
        "the others have not"
    );
}

async fn token_bucket_starts_full_then_denies(client: &mut Client) {
    let limit = token_bucket(5, 1.0);
    for expected_remaining in (0..5).rev() {
        let response = check(client, "k", &limit, None).await;
        assert!(response.allowed);
        assert_eq!(response.limit, 5);
        assert_eq!(response.remaining, expected_remaining);
    }
    let denied = check(client, "k", &limit, None).await;
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 0);
    // One token takes 1 s at 1/s; the whole bucket 5 s.
    let retry_after = duration(denied.retry_after);
    assert!(retry_after <= Duration::from_secs(1) && retry_after > Duration::from_millis(500));
    let reset_after = duration(denied.reset_after);
    assert!(reset_after <= Duration::from_secs(5) && reset_after > Duration::from_secs(4));
}

async fn token_bucket_refills_continuously(client: &mut Client) {
    let limit = token_bucket(2, 4.0);
    assert!(check(client, "k", &limit, None).await.allowed);
    assert!(check(client, "k", &limit, None).await.allowed);
    let denied = check(client, "k", &limit, None).await;
    assert!(!denied.allowed);
    assert!(duration(denied.retry_after) <= Duration::from_millis(250));
    tokio::time::sleep(duration(denied.retry_after)).await;
    let refilled = check(client, "k", &limit, None).await;
    assert!(refilled.allowed, "one token is back after retry_after");
    assert_eq!(refilled.remaining, 0);
    // Long after, the bucket is full again but never more than full.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let look = check(client, "k", &limit, Some(0)).await;
    assert_eq!(look.remaining, 2);
    assert_eq!(duration(look.reset_after), Duration::ZERO);
}

async fn token_bucket_refills_at_fractional_rates(client: &mut Client) {
    let half_per_second = token_bucket(1, 0.5);
    assert!(check(client, "slow", &half_per_second, None).await.allowed);
    let denied = check(client, "slow", &half_per_second, None).await;
    // A token takes 2 s at 0.5/s.
    let retry_after = duration(denied.retry_after);
    assert!(retry_after <= Duration::from_secs(2) && retry_after > Duration::from_millis(1500));

    let two_and_a_half = token_bucket(1, 2.5);
    assert!(check(client, "fast", &two_and_a_half, None).await.allowed);
    let denied = check(client, "fast", &two_and_a_half, None).await;
    assert!(duration(denied.retry_after) <= Duration::from_millis(400));
    tokio::time::sleep(duration(denied.retry_after)).await;
    assert!(check(client, "fast", &two_and_a_half, None).await.allowed);
}

async fn gcra_allows_a_burst_then_one_per_interval(client: &mut Client) {
    // 10 a second (one per 100 ms), bursts of 3.
    let limit = gcra(10, Duration::from_secs(1), 3);
    for expected_remaining in [2, 1, 0] {
        let response = check(client, "cells", &limit, None).await;
        assert!(response.allowed);
        assert_eq!(response.limit, 3);
        assert_eq!(response.remaining, expected_remaining);
    }
    let denied = check(client, "cells", &limit, None).await;
    assert!(!denied.allowed);
    let retry_after = duration(denied.retry_after);
    assert!(
        retry_after > Duration::ZERO && retry_after <= Duration::from_millis(100),
        "{retry_after:?}"
    );
    // Empty again 300 ms after the burst began.
    assert!(duration(denied.reset_after) <= Duration::from_millis(300));
    // When told, exactly one more passes.
    tokio::time::sleep(retry_after).await;
    assert!(check(client, "cells", &limit, None).await.allowed);
    assert!(!check(client, "cells", &limit, None).await.allowed);
}

async fn sliding_window_counter_allows_the_limit_then_denies(client: &mut Client) {
    // An hour-long window: the test never straddles two, so the estimate is
    // this window's count alone and exact.
    let hour = Duration::from_secs(3600);
    let limit = sliding_window_counter(5, hour);
    for expected_remaining in (0..5).rev() {
        let response = check(client, "counted", &limit, None).await;
        assert!(response.allowed);
        assert_eq!(response.limit, 5);
        assert_eq!(response.remaining, expected_remaining);
    }
    let denied = check(client, "counted", &limit, Some(2)).await;
    assert!(!denied.allowed);
    assert_eq!(denied.remaining, 0);
    // Not before the next window starts, and within the one after.
    let retry_after = duration(denied.retry_after);
    assert!(
        retry_after > Duration::ZERO && retry_after <= 2 * hour,
        "{retry_after:?}"
    );
    assert!(
        check(client, "counted", &limit, Some(6))
            .await
            .cost_exceeds_limit
    );
}

async fn sliding_window_counter_rolls_over_to_the_next_window(client: &mut Client) {
    let limit = sliding_window_counter(5, Duration::from_millis(100));
    assert!(check(client, "rolling", &limit, Some(5)).await.allowed);
    // The estimate decays as the window slides: the whole limit passes
    // again once the spent window has left it (two windows at most).
    eventually("the whole limit passes again", || {
        let mut client = client.clone();
        async move { check(&mut client, "rolling", &limit, Some(5)).await.allowed }
    })
    .await;
}

async fn costs_above_one_spend_that_many_units(client: &mut Client) {
    for limit in every_algorithm(10) {
        let spent = check(client, "k", &limit, Some(4)).await;
        assert!(spent.allowed, "{limit:?}");
        assert_eq!(spent.remaining, 6, "{limit:?}");
        let too_much = check(client, "k", &limit, Some(7)).await;
        assert!(!too_much.allowed, "{limit:?}");
        assert_eq!(too_much.remaining, 6, "a denial spends nothing: {limit:?}");
        assert!(duration(too_much.retry_after) > Duration::ZERO, "{limit:?}");
        let rest = check(client, "k", &limit, Some(6)).await;
        assert!(rest.allowed, "{limit:?}");
        assert_eq!(rest.remaining, 0, "{limit:?}");
    }
}

async fn cost_zero_looks_without_spending(client: &mut Client) {
    for limit in every_algorithm(3) {
        let fresh = check(client, "k", &limit, Some(0)).await;
        assert!(fresh.allowed, "{limit:?}");
        assert_eq!(fresh.remaining, 3, "{limit:?}");
        assert_eq!(duration(fresh.reset_after), Duration::ZERO, "{limit:?}");
        check(client, "k", &limit, Some(3)).await;
        for _ in 0..3 {
            let look = check(client, "k", &limit, Some(0)).await;
            assert_eq!(look.remaining, 0, "{limit:?}");
        }
        assert!(
            !check(client, "k", &limit, Some(1)).await.allowed,
            "{limit:?}"
        );
    }
}

async fn a_cost_above_the_limit_is_never_allowed(client: &mut Client) {
    for limit in every_algorithm(5) {
        check(client, "k", &limit, Some(2)).await;
        let never = check(client, "k", &limit, Some(6)).await;
        assert!(!never.allowed, "{limit:?}");
        assert!(never.cost_exceeds_limit, "{limit:?}");
        assert_eq!(never.retry_after, None, "{limit:?}");
        assert_eq!(never.remaining, 3, "{limit:?}");
        let after = check(client, "k", &limit, Some(0)).await;
        assert_eq!(after.remaining, 3, "spent nothing: {limit:?}");
    }
}

async fn algorithms_keep_separate_state_for_one_key(client: &mut Client) {
    let [fixed, others @ ..] = every_algorithm(2);
    check(client, "shared", &fixed, Some(2)).await;
    for other in &others {
        assert_eq!(
            check(client, "shared", other, Some(0)).await.remaining,
            2,
            "{other:?}"
        );
    }
    assert_eq!(check(client, "shared", &fixed, Some(0)).await.remaining, 0);
}

async fn any_characters_in_a_key_are_safe(client: &mut Client) {
    let hostile = [
        "}",
        "{",
        "a}b{c",
        "user\n42",
        "' .. redis.call('FLUSHALL') .. '",
        "\"]]; return 1; --",
        "\0",
        "ключ 🔑",
        " ",
    ];
    for limit in every_algorithm(1) {
        for key in hostile {
            let first = check(client, key, &limit, None).await;
            assert!(first.allowed, "{key:?} {limit:?}");
            assert!(
                !check(client, key, &limit, None).await.allowed,
                "{key:?} {limit:?}"
            );
        }
        // Each key was its own limit: a neighbour is untouched.
        assert!(check(client, "a}b", &limit, None).await.allowed);
    }
}

async fn one_millisecond_windows_work(client: &mut Client) {
    for limit in [
        fixed_window(1, Duration::from_millis(1)),
        sliding_window(1, Duration::from_millis(1)),
    ] {
        let first = check(client, "k", &limit, None).await;
        assert!(first.allowed, "{limit:?}");
        let reset_after = duration(first.reset_after);
        assert!(
            reset_after > Duration::ZERO && reset_after <= Duration::from_millis(1),
            "{limit:?}: {reset_after:?}"
        );
        common::eventually("the 1 ms window to pass", || {
            let mut client = client.clone();
            async move { check(&mut client, "k", &limit, Some(0)).await.remaining == 1 }
        })
        .await;
    }
}

async fn large_costs_on_the_sliding_log_are_exact(client: &mut Client) {
    // One entry per call, whatever its cost.
    let limit = sliding_window(5000, Duration::from_secs(60));
    assert_eq!(check(client, "k", &limit, Some(2500)).await.remaining, 2500);
    assert_eq!(check(client, "k", &limit, Some(2499)).await.remaining, 1);
    assert!(!check(client, "k", &limit, Some(2)).await.allowed);
    assert!(check(client, "k", &limit, Some(1)).await.allowed);
}

async fn sliding_log_entries_of_several_units_leave_oldest_first(client: &mut Client) {
    let window = Duration::from_secs(10);
    let limit = sliding_window(10, window);
    assert!(check(client, "k", &limit, Some(3)).await.allowed);
    common::eventually("a tenth of the window to pass", || {
        let mut client = client.clone();
        async move {
            let look = check(&mut client, "k", &limit, Some(0)).await;
            duration(look.reset_after) <= window * 9 / 10
        }
    })
    .await;
    assert_eq!(check(client, "k", &limit, Some(4)).await.remaining, 3);

    // 7 of 10 spent. Cost 7 needs 4 units gone: both entries, the second's
    // leaving being the key's reset. Cost 6 needs 3: the first entry's,
    // which leaves before. (Larger cost first: a denial cached on Redis
    // answers the same or larger costs.)
    let needs_both = check(client, "k", &limit, Some(7)).await;
    assert!(!needs_both.allowed);
    assert_eq!(needs_both.retry_after, needs_both.reset_after);
    let needs_first = check(client, "k", &limit, Some(6)).await;
    assert!(!needs_first.allowed);
    let first_leaves = duration(needs_first.retry_after);
    assert!(
        first_leaves + window / 20 <= duration(needs_first.reset_after),
        "{needs_first:?}"
    );
    let never = check(client, "k", &limit, Some(11)).await;
    assert!(!never.allowed && never.retry_after.is_none());
    assert_eq!(check(client, "k", &limit, Some(3)).await.remaining, 0);
}

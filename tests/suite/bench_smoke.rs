//! A short run of `ratelimitd-bench` against each target it drives (Redis
//! directly, `CheckLimit` with one limit or several, `CheckLimits` batches,
//! `ShouldRateLimit` with the rules it prints): every request is counted
//! once, as allowed, denied or an error, and no more are allowed than the
//! limit permits.

use crate::common;

use std::process::Command;

use common::{RedisServer, TestServer};
use serde_json::Value;

const BENCH: &str = env!("CARGO_BIN_EXE_ratelimitd-bench");

/// Runs the generator with `args` and `--json`, and returns its report.
/// Waits off the test's runtime, which also runs the server in process.
async fn bench(args: &[&str]) -> Value {
    let args: Vec<String> = args.iter().map(|arg| (*arg).to_owned()).collect();
    let mut command = Command::new(BENCH);
    command.args(&args).arg("--json");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("waiting task")
        .expect("run ratelimitd-bench");
    assert!(
        output.status.success(),
        "ratelimitd-bench {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!(
            "ratelimitd-bench printed no JSON ({err}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    })
}

fn count(report: &Value, field: &str) -> u64 {
    report[field]
        .as_u64()
        .unwrap_or_else(|| panic!("no {field} in {report}"))
}

/// 300 requests on one key with a limit of 50 an hour: exactly 50 allowed,
/// the rest denied, none failed, and a latency for each.
fn assert_fifty_of_three_hundred(report: &Value) {
    assert_eq!(count(report, "requests"), 300, "{report}");
    assert_eq!(count(report, "allowed"), 50, "{report}");
    assert_eq!(count(report, "denied"), 250, "{report}");
    assert_eq!(count(report, "errors"), 0, "{report}");
    let latency = &report["latency_us"];
    assert!(
        latency["p50"].as_u64() <= latency["p99"].as_u64(),
        "{report}"
    );
    assert!(latency["max"].as_u64() > Some(0), "{report}");
}

const HOT_FIFTY: [&str; 12] = [
    "--requests",
    "300",
    "--warm-up",
    "0s",
    "--keys",
    "hot",
    "--limit",
    "50",
    "--window",
    "1h",
    "--concurrency",
    "8",
];

#[tokio::test]
async fn every_target_counts_each_request_once_and_allows_at_most_the_limit() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let mut args = HOT_FIFTY.to_vec();
    args.extend(["--target", "redis-direct", "--redis-url", &url]);
    args.extend(["--algorithm", "token-bucket", "--key-prefix", "direct:"]);
    assert_fifty_of_three_hundred(&bench(&args).await);

    let server = TestServer::on_redis(&redis).await;
    let address = format!("http://{}", server.address);
    let mut args = HOT_FIFTY.to_vec();
    args.extend(["--target", "check-limit", "--address", &address]);
    args.extend(["--key-prefix", "check:", "--connections", "3"]);
    assert_fifty_of_three_hundred(&bench(&args).await);

    let rules = Command::new(BENCH)
        .args(["--print-envoy-config", "--domain", "smoke"])
        .args([
            "--algorithm",
            "sliding-window",
            "--limit",
            "50",
            "--window",
            "1h",
        ])
        .output()
        .expect("run ratelimitd-bench --print-envoy-config");
    assert!(rules.status.success());
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("bench.yaml"), &rules.stdout).unwrap();
    let config = dir.path().to_str().unwrap();
    let envoy = TestServer::start(&["--redis-url", &url, "--config", config]).await;
    let address = format!("http://{}", envoy.address);
    let mut args = HOT_FIFTY.to_vec();
    args.extend(["--target", "should-rate-limit", "--address", &address]);
    args.extend(["--domain", "smoke", "--key-prefix", "envoy:"]);
    assert_fifty_of_three_hundred(&bench(&args).await);
}

#[tokio::test]
async fn a_timed_run_over_many_keys_and_an_open_loop_add_up() {
    let server = TestServer::memory().await;
    let address = format!("http://{}", server.address);
    // 20 keys of 5 an hour: at most 100 allowed, however many are sent.
    let report = bench(&[
        "--address",
        &address,
        "--duration",
        "300ms",
        "--warm-up",
        "100ms",
        "--keys",
        "zipf",
        "--key-count",
        "20",
        "--limit",
        "5",
        "--window",
        "1h",
        "--concurrency",
        "4",
    ])
    .await;
    let requests = count(&report, "requests");
    let allowed = count(&report, "allowed");
    assert!(requests > 0, "{report}");
    assert_eq!(
        allowed + count(&report, "denied") + count(&report, "errors"),
        requests,
        "{report}"
    );
    assert!(allowed <= 100, "{report}");
    // Open loop at 200/s for 1 s: exactly the 200 scheduled requests.
    let report = bench(&[
        "--address",
        &address,
        "--rate",
        "200",
        "--duration",
        "1s",
        "--warm-up",
        "0s",
        "--key-prefix",
        "open:",
    ])
    .await;
    assert_eq!(count(&report, "requests"), 200, "{report}");
    assert_eq!(count(&report, "errors"), 0, "{report}");
}

#[tokio::test]
async fn several_limits_and_batches_count_every_decision() {
    let redis = RedisServer::start().await;
    let server = TestServer::on_redis(&redis).await;
    let address = format!("http://{}", server.address);

    // 300 requests on one key, each with four limits of 50 an hour, all or
    // nothing: the same 50 allowed as with one limit.
    let mut args = HOT_FIFTY.to_vec();
    args.extend(["--address", &address, "--limits", "4"]);
    args.extend(["--key-prefix", "several:"]);
    let report = bench(&args).await;
    assert_fifty_of_three_hundred(&report);
    assert_eq!(count(&report, "calls"), 300, "{report}");
    assert_eq!(count(&report, "decisions"), 300, "{report}");
    let limit = report["setup"]["limit"].as_str().unwrap_or_default();
    assert!(limit.starts_with("4 limits (l0..l3)"), "{report}");
    // They really were four limits: four counters on the one key, one per
    // name.
    let counters: Vec<String> = redis
        .keys()
        .await
        .into_iter()
        .filter(|key| key.contains("several:0"))
        .collect();
    assert_eq!(counters.len(), 4, "{counters:?}");
    for name in ["l0", "l1", "l2", "l3"] {
        let named = format!(":{name}:several:0");
        assert!(
            counters.iter().any(|key| key.contains(&named)),
            "no counter for {name}: {counters:?}"
        );
    }

    // 30 calls of 16 requests on one key: 480 decisions, 50 allowed, one
    // latency per call.
    let report = bench(&[
        "--address",
        &address,
        "--batch",
        "16",
        "--requests",
        "30",
        "--warm-up",
        "0s",
        "--keys",
        "hot",
        "--limit",
        "50",
        "--window",
        "1h",
        "--concurrency",
        "4",
        "--key-prefix",
        "batch:",
    ])
    .await;
    assert_eq!(count(&report, "calls"), 30, "{report}");
    assert_eq!(count(&report, "decisions"), 480, "{report}");
    assert_eq!(count(&report, "requests"), 480, "{report}");
    assert_eq!(count(&report, "allowed"), 50, "{report}");
    assert_eq!(count(&report, "denied"), 430, "{report}");
    assert_eq!(count(&report, "errors"), 0, "{report}");
    let per_second = |field: &str| report[field].as_f64().unwrap_or_default();
    let ratio = per_second("decisions_per_second") / per_second("calls_per_second");
    assert!((ratio - 16.0).abs() < 1e-6, "{report}");
    assert!(report["latency_us"]["max"].as_u64() > Some(0), "{report}");
}

#[test]
fn bad_options_are_refused_with_the_rule() {
    let output = Command::new(BENCH)
        .arg("--rate=-5")
        .output()
        .expect("run ratelimitd-bench");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--rate must be a positive number"),
        "{stderr}"
    );
    let output = Command::new(BENCH)
        .args(["--batch", "16", "--target", "should-rate-limit"])
        .output()
        .expect("run ratelimitd-bench");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--batch applies to --target check-limit only"),
        "{stderr}"
    );
}

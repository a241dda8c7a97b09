//! The Envoy rules follow their files without a restart: an edited file, a
//! Kubernetes ConfigMap update (a `..data` symlink swap), and a broken edit,
//! which is refused with file, line and reason while the old rules stay. A
//! broken configuration at start stops the start.

use crate::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{ServerProcess, TestServer};
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use ratelimitd::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

fn limits(requests_per_unit: u32) -> String {
    format!(
        "domain: reload\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      \
         requests_per_unit: {requests_per_unit}\n"
    )
}

/// The `requests_per_unit` in force for the descriptor `(k, a)`, by a look
/// that spends nothing.
async fn limit_in_force(address: std::net::SocketAddr) -> Option<u32> {
    let mut client = RateLimitServiceClient::new(common::channel(address).await);
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: "reload".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "k".into(),
                    value: "a".into(),
                }],
                hits_addend: Some(0),
                ..Default::default()
            }],
            hits_addend: 0,
        })
        .await
        .expect("an answer")
        .into_inner();
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|limit| limit.requests_per_unit)
}

async fn await_limit(address: std::net::SocketAddr, wanted: u32) {
    common::eventually(&format!("the limit to become {wanted}"), || async move {
        limit_in_force(address).await == Some(wanted)
    })
    .await;
}

#[tokio::test]
async fn an_edited_file_is_picked_up_and_a_broken_edit_is_refused() {
    let dir = tempfile::tempdir().expect("config directory");
    let file = dir.path().join("limits.yaml");
    std::fs::write(&file, limits(2)).expect("write");
    let path = file.to_string_lossy().into_owned();
    let server = ServerProcess::builder()
        .flags(&["--config", &path, "--config-poll-interval", "50ms"])
        .logged()
        .start()
        .await;
    assert_eq!(limit_in_force(server.address).await, Some(2));

    std::fs::write(&file, limits(5)).expect("write");
    await_limit(server.address, 5).await;

    let broken =
        "domain: reload\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n";
    std::fs::write(&file, broken).expect("write");
    common::eventually("the broken edit to be reported", || async {
        let log = server.log();
        log.contains("configuration rejected")
            && log.contains("line=5")
            && log.contains("fortnight")
    })
    .await;
    assert!(server.log().contains(&path), "the log names the file");
    assert_eq!(
        limit_in_force(server.address).await,
        Some(5),
        "the old rules stay"
    );

    std::fs::write(&file, limits(7)).expect("write");
    await_limit(server.address, 7).await;
}

fn symlink(target: &str, link: &Path) {
    std::os::unix::fs::symlink(target, link).expect("symlink");
}

#[tokio::test]
async fn a_configmap_update_is_picked_up_and_dotfiles_are_ignored() {
    // The layout kubelet gives a mounted ConfigMap.
    let dir = tempfile::tempdir().expect("config directory");
    let root = dir.path();
    std::fs::create_dir(root.join("..2026_12_02_10_00_00.1")).expect("mkdir");
    std::fs::write(root.join("..2026_12_02_10_00_00.1/limits.yaml"), limits(2)).expect("write");
    symlink("..2026_12_02_10_00_00.1", &root.join("..data"));
    symlink("..data/limits.yaml", &root.join("limits.yaml"));
    std::fs::write(root.join(".editor-swap.yaml"), "{{ not yaml").expect("write");
    std::fs::write(root.join("README.txt"), "not a config").expect("write");

    let path = root.to_string_lossy().into_owned();
    let server = TestServer::start(&["--config", &path, "--config-poll-interval", "50ms"]).await;
    assert_eq!(limit_in_force(server.address).await, Some(2));

    // kubelet writes the new version beside the old, then swaps `..data`
    // atomically.
    std::fs::create_dir(root.join("..2026_12_02_10_05_00.2")).expect("mkdir");
    std::fs::write(root.join("..2026_12_02_10_05_00.2/limits.yaml"), limits(9)).expect("write");
    symlink("..2026_12_02_10_05_00.2", &root.join("..data_tmp"));
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).expect("swap ..data");
    await_limit(server.address, 9).await;
    server.stop().await;
}

#[test]
fn a_broken_configuration_at_start_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("config directory");
    let file = dir.path().join("limits.yaml");
    std::fs::write(
        &file,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
    )
    .expect("write");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratelimitd"))
        .arg("--config")
        .arg(&file)
        .args(["--listen", "127.0.0.1:0", "--http-listen="])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ratelimitd");
    let deadline = std::time::Instant::now() + common::PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "ratelimitd kept running"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = child.wait_with_output().expect("output");
    assert!(!status.success(), "a bad configuration must not start");
    let log = String::from_utf8_lossy(&output.stderr);
    let location = format!("{}:4:", file.display());
    assert!(log.contains(&location), "the error names {location}: {log}");
}

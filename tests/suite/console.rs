//! The web console in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`), driven by Selenium (PyPI, installed by the
//! suite: `common/tools.rs`) in `tests/console/drive.py`: the page loads with
//! nothing on the browser's console at error level, the live chart plots
//! the traffic this test sent, the simulator, its form filled in, plots
//! exactly the numbers `/v1/simulate` answers for the same request, the
//! Leases section lists a lease this test holds (its policy, holder, key,
//! share and demand) and says no policy is leased once the lease's stream
//! ends, and, the admin token given in the page, its key section peeks at
//! a denied key (spending nothing) and resets it.

use crate::common;

use std::io::{BufRead, BufReader, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::http::request;
use common::leases::{LeaseStream, ask as lease_ask};
use common::tools::{self, on_path};
use common::{PATIENCE, ServerProcess};
use ratelimitd::pb::ratelimitd::v1 as pb;
use serde_json::{Value, json};

/// `name` on the PATH, or the environment variable `variable` naming it.
fn program(name: &str, variable: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(variable) {
        return PathBuf::from(path);
    }
    on_path(name).unwrap_or_else(|| {
        panic!(
            "{name} is missing: install Debian's Chromium and its driver \
             (`apt-get install -y chromium chromium-driver`, as .ci/run does), or name \
             the binary in {variable}"
        )
    })
}

fn body_json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|err| panic!("not JSON ({err}): {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_live_traffic_and_plots_the_servers_simulation() {
    let chromium = program("chromium", "RATELIMITD_CHROMIUM");
    let chromedriver = program("chromedriver", "RATELIMITD_CHROMEDRIVER");
    let python = tools::python();

    let dir = tempfile::tempdir().expect("a config directory");
    std::fs::write(
        dir.path().join("policies.yaml"),
        "policies:\n  hot:\n    - {per: 1s, limit: 1000, algorithm: token_bucket, lease: true}\n",
    )
    .expect("write the policies");
    let config = dir.path().to_string_lossy().into_owned();
    let server = ServerProcess::builder()
        .flags(&["--admin-token", ADMIN_TOKEN, "--config", &config])
        .http()
        .logged()
        .start()
        .await;
    let port = server.http_port();

    // Traffic: 3 allowed and 2 denied on a limit of 3 an hour.
    let asked = json!({"key": "browser", "fixedWindow": {"limit": 3, "window": "3600s"}});
    for _ in 0..5 {
        let answer = request(
            port,
            "POST",
            "/v1/check",
            &[("content-type", "application/json")],
            &asked.to_string(),
        )
        .await
        .expect("an answer");
        assert_eq!(answer.status, 200, "{answer:?}");
    }

    // A lease held by a client process, for the Leases section.
    let mut lease = LeaseStream::open(server.address).await;
    let leased = lease
        .ask(pb::LeaseAsk {
            demand: 25.0,
            ..lease_ask("hot", LEASE_KEY)
        })
        .await;
    assert!(leased.error.is_none() && leased.units > 0, "{leased:?}");
    let live = request(port, "GET", "/v1/console/live", &[], "")
        .await
        .expect("an answer");
    let holder = body_json(&live.body)["leases"][0]["holders"][0]["holder"]
        .as_str()
        .unwrap_or_else(|| panic!("the lease in the live view: {}", live.body))
        .to_owned();

    // The form as a user fills it in (the token bucket left out), and the
    // request it describes, written here independently of the page.
    let form = json!({
        "shape": "SAWTOOTH", "rate": "40", "duration": "4", "period": "2", "step": "250",
        "cost": "1",
        "fixed_limit": "10", "fixed_window": "1",
        "sliding_limit": "8", "sliding_window": "2",
        "use_bucket": false,
        "gcra_rate": "5", "gcra_period": "1", "gcra_burst": "3",
        "counter_limit": "12", "counter_window": "1.5",
    });
    let simulated_request = json!({
        "limits": [
            {"name": "fixed", "fixedWindow": {"limit": "10", "window": "1s"}},
            {"name": "log", "slidingWindow": {"limit": "8", "window": "2s"}},
            {"name": "gcra", "gcra": {"rate": "5", "period": "1s", "burst": "3"}},
            {"name": "counter", "slidingWindowCounter": {"limit": "12", "window": "1.5s"}}
        ],
        "traffic": {"shape": "SAWTOOTH", "rate": 40, "duration": "4s", "period": "2s", "cost": "1"},
        "step": "0.250s"
    });
    let settings = json!({
        "url": format!("http://127.0.0.1:{port}/"),
        "chromium": chromium,
        "chromedriver": chromedriver,
        "patience": PATIENCE.as_secs(),
        "live_allowed": 3,
        "live_denied": 2,
        "form": form,
        "charts": 4,
        "admin": {"token": ADMIN_TOKEN, "request": asked},
        "leases": {"policy": "hot", "key": LEASE_KEY},
    });
    let driver = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/console/drive.py");
    let mut errors = tempfile::tempfile().expect("a file for the driver's stderr");
    let mut child = Command::new(python)
        .arg(driver)
        .arg(settings.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(errors.try_clone().expect("the stderr file, again"))
        .spawn()
        .expect("run tests/console/drive.py");
    let mut told = child.stdin.take().expect("the driver's stdin");
    let mut said = BufReader::new(child.stdout.take().expect("the driver's stdout"));
    // The driver says when the page lists the lease (or ends, failing).
    let (first, mut said) = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        said.read_line(&mut line).expect("read the driver");
        (line, said)
    })
    .await
    .expect("the driver's thread");
    // Then the client goes away, and the driver waits for the page to
    // say no policy is leased.
    drop(lease);
    if !first.is_empty() {
        // A driver that ended already says why in its stderr, below.
        let _ = writeln!(told, "the lease is gone");
    }
    drop(told);
    let (rest, status) = tokio::task::spawn_blocking(move || {
        let mut rest = String::new();
        said.read_to_string(&mut rest).expect("read the driver");
        (rest, child.wait().expect("the driver ends"))
    })
    .await
    .expect("the driver's thread");
    let mut stderr = String::new();
    errors.rewind().expect("the stderr file");
    errors
        .read_to_string(&mut stderr)
        .expect("read the driver's stderr");
    assert!(status.success(), "drive.py failed: {stderr}");
    assert_eq!(body_json(&first)["leases_shown"], true, "{first}");
    let seen = body_json(&rest);

    // Nothing at error level on the browser's console (a failed load, a
    // script error, a refused Content-Security-Policy).
    let errors: Vec<&Value> = seen["log"]
        .as_array()
        .expect("the browser's log")
        .iter()
        .filter(|entry| entry["level"] == "SEVERE")
        .collect();
    assert!(errors.is_empty(), "the browser's console: {errors:#?}");

    // The live chart plots what was sent, no more.
    assert_eq!(seen["live"]["allowed"], 3, "{}", seen["live"]);
    assert_eq!(seen["live"]["denied"], 2, "{}", seen["live"]);
    assert_eq!(seen["live"]["seconds"], 300);

    // The Leases section: the policy with its one holder, the whole of its
    // share; then, the stream gone, the empty state.
    let rows = &seen["leases"]["shown"]["rows"];
    assert_eq!(
        rows,
        &json!([
            ["hot: 1 holder, 1000.00 units/s in all"],
            [
                holder,
                LEASE_KEY,
                "1000.00",
                "100.0%",
                "25.00",
                leased.units.to_string(),
                "0"
            ],
        ]),
        "{}",
        seen["leases"]
    );
    assert_eq!(seen["leases"]["gone"]["empty_shown"], true);

    // The simulator plots /v1/simulate's numbers for the same request.
    let answer = request(
        port,
        "POST",
        "/v1/simulate",
        &[("content-type", "application/json")],
        &simulated_request.to_string(),
    )
    .await
    .expect("an answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    let expected = body_json(&answer.body);
    let plotted = seen["simulated"].as_array().expect("the plotted data");
    let limits = expected["limits"].as_array().expect("limits");
    assert_eq!(plotted.len(), limits.len());
    let numbers = |values: &Value| -> Vec<f64> {
        values
            .as_array()
            .expect("values")
            .iter()
            .map(|value| match value {
                Value::String(text) => text.parse().expect("a number"),
                other => other.as_f64().expect("a number"),
            })
            .collect()
    };
    let steps = numbers(&expected["sent"]).len();
    assert_eq!(steps, 16);
    let xs: Vec<f64> = (0..steps).map(|k| k as f64 * 0.25).collect();
    for (data, limit) in plotted.iter().zip(limits) {
        let name = &limit["name"];
        assert_eq!(numbers(&data[0]), xs, "{name}: x");
        assert_eq!(
            numbers(&data[1]),
            numbers(&expected["sent"]),
            "{name}: sent"
        );
        assert_eq!(
            numbers(&data[2]),
            numbers(&limit["admitted"]),
            "{name}: admitted"
        );
        assert_eq!(
            numbers(&data[3]),
            numbers(&limit["denied"]),
            "{name}: denied"
        );
        assert_eq!(
            numbers(&data[4]),
            numbers(&limit["remaining"]),
            "{name}: remaining"
        );
        assert!(
            numbers(&limit["denied"]).iter().sum::<f64>() > 0.0,
            "{name}: the traffic should be over every limit at some point"
        );
    }
    let sent: f64 = numbers(&expected["sent"]).iter().sum();
    assert_eq!(
        seen["sim_state"],
        format!("{sent} requests in {steps} steps"),
        "{seen}"
    );

    // With the admin token given, the key section peeks (spending
    // nothing: none left) and resets (then the key is allowed again).
    let peek = &seen["admin"]["peek"];
    assert_eq!(peek["status"], 200, "{peek}");
    let peeked = body_json(peek["body"].as_str().expect("a body"));
    assert_eq!(peeked["remaining"], "0", "{peeked}");
    assert_eq!(peeked["limit"], "3", "{peeked}");
    assert_eq!(seen["admin"]["reset"]["status"], 200, "{}", seen["admin"]);
    let after = request(
        port,
        "POST",
        "/v1/check",
        &[("content-type", "application/json")],
        &asked.to_string(),
    )
    .await
    .expect("an answer");
    assert_eq!(body_json(&after.body)["allowed"], true, "{after:?}");
    server.terminate().await;
}

/// The admin token the console is given (the server's `--admin-token`).
const ADMIN_TOKEN: &str = "console-test-admin-token";

/// The key of the lease the console shows.
const LEASE_KEY: &str = "browser-lease";

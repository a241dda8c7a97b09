//! The README's app examples ("Call it from an app"), installed as the
//! README says and run against this build of ratelimitd (embedded store):
//! the Node package packed by `npm pack` and installed with express into a
//! fresh app; the Python package built by `pip wheel` and installed with its
//! `asgi` extra into a fresh virtualenv. Each app, its code taken from the
//! README as written, gets six requests within 10 s: five pass, the sixth
//! is 429 with a `Retry-After`. The Node app is started as the README says
//! (`node app.js`) and is used once it prints the line the README says it
//! prints when it listens.
//!
//! One change to each app, made from outside its code: a 2 s deadline
//! instead of the clients' 300 ms, which a machine loaded by the rest of the
//! suite can miss (a miss fails open, and a request would pass uncounted).

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::process::stdout_of_success;
use common::{PATIENCE, ServerProcess};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The code block fenced as ```` ```fence ```` in the README's section "Call
/// it from an app": there is exactly one of each language.
fn readme_example(fence: &str) -> &'static str {
    let readme = include_str!("../../README.md");
    let section = readme
        .split("\n## Call it from an app\n")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("the README's section \"Call it from an app\"");
    let blocks: Vec<&str> = section
        .split(&format!("```{fence}\n"))
        .skip(1)
        .filter_map(|rest| rest.split("\n```").next())
        .collect();
    assert_eq!(blocks.len(), 1, "one ```{fence} block in the section");
    blocks[0]
}

/// Runs `command` to its end and returns its stdout; panics with its output,
/// and `hint` on what to install, unless it succeeds.
fn run(command: &mut Command, hint: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|err| panic!("cannot run {command:?} ({err}): {hint}"));
    stdout_of_success(&format!("{command:?}"), &output)
}

/// The one file in `dir` whose name starts with `prefix` and ends with
/// `suffix`.
fn the_file(dir: &Path, prefix: &str, suffix: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read the folder")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with(prefix) && name.ends_with(suffix))
        })
        .collect();
    assert_eq!(found.len(), 1, "one {prefix}*{suffix} in {}", dir.display());
    found[0].clone()
}

/// A process killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Six requests' answers: five pass, the sixth is 429 with a `Retry-After`
/// of 1 to 10 seconds, and none was let through because the limiter failed.
fn assert_five_pass_then_429(statuses: &[u16], retry_after: Option<&str>, degraded: bool) {
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 429],
        "five pass, the sixth is limited"
    );
    let seconds: u64 = retry_after
        .and_then(|value| value.trim().parse().ok())
        .expect("the 429 has a Retry-After in seconds");
    assert!((1..=10).contains(&seconds), "Retry-After: {seconds}");
    assert!(!degraded, "no answer came from a failing limiter");
}

const NODE_HINT: &str = "install Node.js 20 or newer with npm";

/// Test only, loaded before the app: the middleware's deadline raised to
/// 2 s unless the app sets one.
const NODE_DEADLINE: &str = "const client = require('ratelimitd-client');
const rateLimiter = client.rateLimiter;
client.rateLimiter = (options) => rateLimiter({ deadlineMs: 2000, ...options });
";

/// Packs the Node package and installs it, with express, into a fresh app
/// in `work`, as the README says; writes the README's app there as
/// `app.js`. Returns the app's folder.
fn install_node_app(work: &Path) -> PathBuf {
    let pack = work.join("pack");
    let app = work.join("app");
    std::fs::create_dir_all(&pack).expect("a folder for the tarball");
    std::fs::create_dir_all(&app).expect("the app's folder");
    run(
        Command::new("npm")
            .args(["pack", "--silent", "--pack-destination"])
            .arg(&pack)
            .current_dir(root().join("clients/node")),
        NODE_HINT,
    );
    let tarball = the_file(&pack, "ratelimitd-client-", ".tgz");
    run(
        Command::new("npm").args(["init", "-y"]).current_dir(&app),
        NODE_HINT,
    );
    run(
        Command::new("npm")
            .args(["install", "--no-audit", "--no-fund"])
            .arg(&tarball)
            .arg("express")
            .current_dir(&app),
        NODE_HINT,
    );
    std::fs::write(app.join("app.js"), readme_example("js")).expect("write app.js");
    std::fs::write(app.join("deadline.js"), NODE_DEADLINE).expect("write deadline.js");
    app
}

/// Waits until the app prints, as the README says it does once it
/// listens, `listening on http://127.0.0.1:<port>`; panics with what it
/// printed if it ends its output (it exited) without that line.
async fn listening(port: u16, app: &mut Running) {
    let stdout = app.0.stdout.take().expect("the app's stdout is piped");
    let expected = format!("listening on http://127.0.0.1:{port}");
    let wanted = expected.clone();
    let reading = tokio::task::spawn_blocking(move || {
        let mut reader = BufReader::new(stdout);
        let mut printed = Vec::new();
        let mut line = String::new();
        while reader.read_line(&mut line).expect("read the app's output") > 0 {
            if line.trim_end() == wanted {
                return Ok(reader.into_inner());
            }
            printed.push(line.trim_end().to_owned());
            line.clear();
        }
        Err(printed)
    });
    let found = tokio::time::timeout(PATIENCE, reading)
        .await
        .unwrap_or_else(|_| panic!("the app did not print `{expected}` within {PATIENCE:?}"))
        .expect("join");
    match found {
        // Kept open until the app is stopped: its output must have somewhere to go.
        Ok(stdout) => app.0.stdout = Some(stdout),
        Err(printed) => {
            let status = app.0.wait().expect("the app's exit status");
            panic!("the app exited ({status}) without printing `{expected}`: {printed:?}");
        }
    }
}

#[tokio::test]
async fn the_readmes_node_app_limits_as_it_says() {
    let work = tempfile::tempdir().expect("a folder for the app");
    let folder = work.path().to_path_buf();
    let app = tokio::task::spawn_blocking(move || install_node_app(&folder))
        .await
        .expect("join");
    let server = ServerProcess::builder().flags(&[]).logged().start().await;
    let port = common::free_port();
    let mut node = Running(
        Command::new("node")
            .args(["--require", "./deadline.js", "app.js"])
            .current_dir(&app)
            .env("PORT", port.to_string())
            .env("RATELIMITD_ADDRESS", server.address.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("cannot run node ({err}): {NODE_HINT}")),
    );
    listening(port, &mut node).await;

    let mut responses = Vec::new();
    for _ in 0..6 {
        let response = common::http::get(port, "/", &[])
            .await
            .expect("the app answers");
        responses.push(response);
    }
    let statuses: Vec<u16> = responses.iter().map(|response| response.status).collect();
    let degraded = responses
        .iter()
        .any(|response| response.header("ratelimit-degraded").is_some());
    assert_five_pass_then_429(&statuses, responses[5].header("retry-after"), degraded);
}

const PYTHON_HINT: &str = "install Python 3.11 or newer with venv and pip";

/// Drives the README's app (`app.py`, unchanged but for the deadline) with
/// Starlette's TestClient; prints the six statuses, the sixth's
/// Retry-After, and whether any answer was degraded.
const PYTHON_DRIVER: &str = r#"import warnings

# Newer Starlette suggests another HTTP client for its TestClient; httpx works.
warnings.filterwarnings("ignore", message=".*starlette.testclient.*")

from starlette.testclient import TestClient

import app as readme

readme.limiter.client.deadline = 2.0
with TestClient(readme.app) as client:
    responses = [client.get("/") for _ in range(6)]
print(" ".join(str(response.status_code) for response in responses))
print(responses[-1].headers.get("retry-after", ""))
print(any("ratelimit-degraded" in response.headers for response in responses))
"#;

/// Copies the Python package's sources to `to`, without what a build or a
/// test run leaves beside them: the build then runs outside the checkout
/// (as a user's would), and never in a folder the client's own suite is
/// building in at the same time.
fn copy_sources(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a folder for the sources");
    for entry in std::fs::read_dir(from).expect("read the sources") {
        let entry = entry.expect("an entry");
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let left_by_a_run = [".venv", "build", "dist", "__pycache__", ".pytest_cache"]
            .contains(&name.as_ref())
            || name.ends_with(".egg-info");
        if left_by_a_run {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            copy_sources(&path, &to.join(&*name));
        } else {
            std::fs::copy(&path, to.join(&*name)).expect("copy a source file");
        }
    }
}

/// Builds the Python package's wheel and installs it, with its `asgi` extra
/// (and httpx, for the driver's TestClient), into a fresh virtualenv in
/// `work`, as the README says; writes the README's app there as `app.py`
/// beside the driver. Returns the virtualenv's python and the app's folder.
fn install_python_app(work: &Path) -> (PathBuf, PathBuf) {
    let sources = work.join("ratelimitd-python");
    copy_sources(&root().join("clients/python"), &sources);
    let venv = work.join("venv");
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&venv),
        PYTHON_HINT,
    );
    let python = venv.join("bin/python");
    let pip = |arguments: &[&std::ffi::OsStr]| {
        run(
            Command::new(&python)
                .args(["-m", "pip", "--disable-pip-version-check", "--quiet"])
                .args(arguments),
            PYTHON_HINT,
        )
    };
    let dist = work.join("dist");
    pip(&[
        "wheel".as_ref(),
        "--no-deps".as_ref(),
        sources.as_os_str(),
        "-w".as_ref(),
        dist.as_os_str(),
    ]);
    let wheel = the_file(&dist, "ratelimitd_client-", ".whl");
    let with_asgi = format!("{}[asgi]", wheel.display());
    pip(&["install".as_ref(), with_asgi.as_ref(), "httpx".as_ref()]);
    let app = work.join("app");
    std::fs::create_dir_all(&app).expect("the app's folder");
    std::fs::write(app.join("app.py"), readme_example("python")).expect("write app.py");
    std::fs::write(app.join("drive.py"), PYTHON_DRIVER).expect("write drive.py");
    (python, app)
}

#[tokio::test]
async fn the_readmes_python_app_limits_as_it_says() {
    let work = tempfile::tempdir().expect("a folder for the app");
    let folder = work.path().to_path_buf();
    let (python, app) = tokio::task::spawn_blocking(move || install_python_app(&folder))
        .await
        .expect("join");
    let server = ServerProcess::builder().flags(&[]).logged().start().await;
    let address = server.address.to_string();
    let output = tokio::task::spawn_blocking(move || {
        run(
            Command::new(&python)
                .arg("drive.py")
                .current_dir(&app)
                .env("RATELIMITD_ADDRESS", address),
            PYTHON_HINT,
        )
    })
    .await
    .expect("join");
    let lines: Vec<&str> = output.lines().collect();
    assert_eq!(lines.len(), 3, "the driver's report: {output}");
    let statuses: Vec<u16> = lines[0]
        .split_whitespace()
        .map(|status| status.parse().expect("a status"))
        .collect();
    assert_five_pass_then_429(&statuses, Some(lines[1]), lines[2] == "True");
}

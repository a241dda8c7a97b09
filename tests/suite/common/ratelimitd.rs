//! ratelimitd as the tests start it: in this test process on port 0
//! ([`TestServer`], stopped through its shutdown channel), or as the built
//! binary in a child process ([`ServerProcess`], found through its address
//! file, killed when dropped).

use std::net::SocketAddr;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use ratelimitd::config::Config;
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use ratelimitd::server::Listeners;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::grpc::{await_health, channel, health_status};
use super::process::{ChildProcess, free_port, send_signal};
use super::redis::RedisServer;
use super::wait::PATIENCE;

/// A ratelimitd server running in this test process, on port 0.
pub(crate) struct TestServer {
    pub(crate) address: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    /// Starts with these command-line flags (as after `ratelimitd`), on
    /// `--listen 127.0.0.1:0`, and without an HTTP listener unless they
    /// name one.
    pub(crate) async fn start(flags: &[&str]) -> Self {
        let mut args = vec!["ratelimitd", "--listen", "127.0.0.1:0"];
        if !names_http_listener(flags) {
            args.push("--http-listen=");
        }
        args.extend_from_slice(flags);
        let config = Config::try_parse_from(args).expect("test flags parse");
        let listeners = Listeners::bind(&config).await.expect("bind");
        let address = listeners.grpc_address().expect("local address");
        let (shutdown, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let stop = async {
                let _ = stopped.await;
            };
            ratelimitd::server::run(config, listeners, stop)
                .await
                .expect("server runs");
        });
        // The port is bound at once, and accepts once the server is ready.
        let deadline = Instant::now() + PATIENCE;
        while tokio::net::TcpStream::connect(address).await.is_err() {
            if task.is_finished() {
                task.await.expect("the server task");
                panic!("the server stopped before it served");
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the gRPC port to open"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Self {
            address,
            shutdown: Some(shutdown),
            task: Some(task),
        }
    }

    /// A server on the embedded store.
    pub(crate) async fn memory() -> Self {
        Self::start(&[]).await
    }

    /// A server on `redis`.
    pub(crate) async fn on_redis(redis: &RedisServer) -> Self {
        Self::start(&["--redis-url", &redis.url()]).await
    }

    pub(crate) async fn client(&self) -> RateLimiterClient<Channel> {
        RateLimiterClient::new(channel(self.address).await)
    }

    pub(crate) async fn health(&self) -> HealthClient<Channel> {
        HealthClient::new(channel(self.address).await)
    }

    /// Asks the server to stop and waits until it has.
    pub(crate) async fn stop(mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.expect("server task");
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// What the processes started the upstream way are called in messages.
const UPSTREAM_WAY: &str = "ratelimitd (started the upstream way)";

/// How many times a start on ports chosen by [`free_port`] is tried.
const PORT_ATTEMPTS: usize = 3;

/// A ratelimitd server as a separate process, killed when dropped.
pub(crate) struct ServerProcess {
    pub(crate) address: SocketAddr,
    /// The HTTP listener, when it has one (started the upstream way, or
    /// with `--http-listen`).
    pub(crate) http: Option<SocketAddr>,
    /// The debug listener, when it has one (started the upstream way).
    pub(crate) debug: Option<SocketAddr>,
    process: ChildProcess,
    /// Where its log goes, when the test reads it.
    log: Option<(tempfile::TempDir, std::path::PathBuf)>,
}

impl ServerProcess {
    /// Starts the `ratelimitd` binary with these flags plus `--listen`, and
    /// waits until its health says SERVING.
    pub(crate) async fn start(flags: &[&str]) -> Self {
        Self::spawn(None, flags, false).await
    }

    /// As [`ServerProcess::start`], listening on `address` (the address of
    /// a process that is gone, to start it again where its clients are).
    pub(crate) async fn start_at(address: SocketAddr, flags: &[&str]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimitd"));
        command
            .args(flags)
            .args(["--listen", &address.to_string()])
            .args(http_off(flags));
        Self::launch(command, false, "the ratelimitd process").await
    }

    /// As [`ServerProcess::start`], with its log kept for [`ServerProcess::log`].
    pub(crate) async fn start_logged(flags: &[&str]) -> Self {
        Self::spawn(None, flags, true).await
    }

    /// As [`ServerProcess::start_logged`], started by `prlimit` with this
    /// soft and hard limit on open files.
    pub(crate) async fn start_with_open_file_limit(soft: u64, hard: u64, flags: &[&str]) -> Self {
        Self::spawn(Some((soft, hard)), flags, true).await
    }

    /// Starts the binary as upstream's deployments do: no flags but
    /// `--address-file`, only envoyproxy/ratelimit's variables
    /// (`environment`, plus GRPC_HOST and GRPC_PORT=0 on loopback, and the
    /// HTTP and debug listeners on free loopback ports unless it sets
    /// them), and waits until SERVING.
    pub(crate) async fn start_upstream_way(environment: &[(&str, &str)]) -> Self {
        let mut server = Self::spawn_upstream_way(environment).await;
        if !server.serving_or_exited(UPSTREAM_WAY).await {
            panic!(
                "{UPSTREAM_WAY} exited before serving; its log: {}",
                server.log()
            );
        }
        server
    }

    /// As [`ServerProcess::start_upstream_way`], with its log kept, and
    /// waiting only until the gRPC port is bound (not until it accepts
    /// calls, nor until SERVING).
    pub(crate) async fn spawn_upstream_way(environment: &[(&str, &str)]) -> Self {
        // A port free_port() found free may be taken before the process
        // binds it (another test's connection may get it as its own port):
        // then new ones are chosen.
        for _ in 0..PORT_ATTEMPTS {
            let (command, http, debug) = Self::upstream_command(environment);
            if let Some(mut server) = Self::bind_unless_taken(command, true, UPSTREAM_WAY).await {
                server.http = http;
                server.debug = debug;
                return server;
            }
        }
        panic!("{UPSTREAM_WAY}: its ports were taken {PORT_ATTEMPTS} times in a row");
    }

    /// The command of [`ServerProcess::start_upstream_way`], and where
    /// its HTTP and debug listeners will be when it chose them.
    fn upstream_command(
        environment: &[(&str, &str)],
    ) -> (Command, Option<SocketAddr>, Option<SocketAddr>) {
        let set = |name: &str| environment.iter().any(|(set, _)| *set == name);
        let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimitd"));
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
        command.envs(environment.iter().copied());
        (command, http, debug)
    }

    /// Starts the binary as a container image runs it: no arguments at
    /// all and only `environment` (nothing of the test's own), its log
    /// kept; `grpc` and `http` are where that environment puts its gRPC and
    /// HTTP listeners. Returns at once, before it listens.
    pub(crate) fn spawn_bare(
        environment: &[(&str, &str)],
        grpc: SocketAddr,
        http: SocketAddr,
    ) -> Self {
        let dir = tempfile::tempdir().expect("a directory for the process's files");
        let log_path = dir.path().join("ratelimitd.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let process = Command::new(env!("CARGO_BIN_EXE_ratelimitd"))
            .env_clear()
            .envs(environment.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the ratelimitd binary")
            .into();
        Self {
            address: grpc,
            http: Some(http),
            debug: None,
            process,
            log: Some((dir, log_path)),
        }
    }

    /// How it exited, if it has.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.process.exited()
    }

    /// As [`ServerProcess::start_logged`], with `environment` set too.
    pub(crate) async fn start_with_environment(
        flags: &[&str],
        environment: &[(&str, &str)],
    ) -> Self {
        let command = Self::command_with_environment(flags, environment);
        Self::launch(command, true, "the ratelimitd process").await
    }

    /// As [`ServerProcess::start_with_environment`], but returned as soon
    /// as it listens, SERVING or not (for a store it cannot reach).
    pub(crate) async fn listening_with_environment(
        flags: &[&str],
        environment: &[(&str, &str)],
    ) -> Self {
        let command = Self::command_with_environment(flags, environment);
        let mut server = Self::bind(command, true, "the ratelimitd process").await;
        // Bound is not yet listening: the port takes connections once the
        // server is ready.
        let deadline = Instant::now() + PATIENCE;
        while tokio::net::TcpStream::connect(server.address)
            .await
            .is_err()
        {
            if server.process.exited().is_some() {
                panic!(
                    "ratelimitd exited before listening; its log: {}",
                    server.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for ratelimitd to listen; its log: {}",
                server.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        server
    }

    fn command_with_environment(flags: &[&str], environment: &[(&str, &str)]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimitd"));
        command
            .args(flags)
            .args(["--listen", "127.0.0.1:0"])
            .args(http_off(flags))
            .envs(environment.iter().copied());
        command
    }

    /// Everything the process has logged so far.
    pub(crate) fn log(&self) -> String {
        let (_, path) = self.log.as_ref().expect("started with start_logged");
        std::fs::read_to_string(path).unwrap_or_default()
    }

    async fn spawn(open_files: Option<(u64, u64)>, flags: &[&str], logged: bool) -> Self {
        let binary = env!("CARGO_BIN_EXE_ratelimitd");
        let mut command = match open_files {
            Some((soft, hard)) => {
                let mut command = Command::new("prlimit");
                command
                    .arg(format!("--nofile={soft}:{hard}"))
                    .arg("--")
                    .arg(binary);
                command
            }
            None => Command::new(binary),
        };
        command
            .args(flags)
            .args(["--listen", "127.0.0.1:0"])
            .args(http_off(flags));
        Self::launch(command, logged, "the ratelimitd process").await
    }

    /// [`ServerProcess::bind`], then waits until it serves; panics, with
    /// its log when kept, if it exits first or does not in time.
    async fn launch(command: Command, logged: bool, what: &str) -> Self {
        let mut server = Self::bind(command, logged, what).await;
        if !server.serving_or_exited(what).await {
            let log = server
                .log
                .as_ref()
                .map(|_| server.log())
                .unwrap_or_default();
            panic!("{what} exited before serving; its log: {log}");
        }
        server
    }

    /// Runs `command` with `--address-file` and learns the port it bound
    /// from that file; panics, with its log when kept, if it exits first or
    /// does not bind in time.
    async fn bind(command: Command, logged: bool, what: &str) -> Self {
        Self::bind_unless_taken(command, logged, what)
            .await
            .unwrap_or_else(|| panic!("{what}: a port it was given is taken"))
    }

    /// [`ServerProcess::bind`], but `None` when the process exits because
    /// a port it was given is taken (its log, kept, says so).
    async fn bind_unless_taken(mut command: Command, logged: bool, what: &str) -> Option<Self> {
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
        Some(Self {
            address,
            http: None,
            debug: None,
            process,
            log: logged.then_some((dir, log_path)),
        })
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
                let log = self.log.as_ref().map(|_| self.log()).unwrap_or_default();
                panic!("timed out waiting for {what} to be SERVING; its log: {log}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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

/// Does a test's command line name the HTTP listener?
fn names_http_listener(flags: &[&str]) -> bool {
    flags.iter().any(|flag| flag.starts_with("--http-listen"))
}

/// `--http-listen=` (no HTTP listener: its default port would be shared
/// by every test), unless the flags name one.
fn http_off(flags: &[&str]) -> Option<&'static str> {
    (!names_http_listener(flags)).then_some("--http-listen=")
}

/// A server on `redis` that notices quickly when Redis fails (a 300 ms
/// command timeout, a health probe every 100 ms), with `extra` flags, once
/// it is SERVING.
pub(crate) async fn server_quick_to_notice(redis: &RedisServer, extra: &[&str]) -> TestServer {
    let url = redis.url();
    let mut flags = vec![
        "--redis-url",
        &url,
        "--redis-command-timeout",
        "300ms",
        "--health-interval",
        "100ms",
    ];
    flags.extend_from_slice(extra);
    let server = TestServer::start(&flags).await;
    await_health(server.address, ServingStatus::Serving).await;
    server
}

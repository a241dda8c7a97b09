//! What the integration tests start for themselves: `redis-server` processes
//! on free loopback ports in temporary directories, ratelimitd servers in
//! process (port 0, shutdown channel) or as separate processes, and clients.
//! Nothing here touches the machine's own Redis on 6379.

// Each test file uses its own part of this module, and all of it is `pub`
// for them (no one crate sees it whole).
#![allow(dead_code, unreachable_pub)]

pub mod envoy;
pub mod pip_tool;
pub mod prometheus;
pub mod quota;
pub mod random;
pub mod rls;
pub mod topology;

use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use ratelimitd::config::Config;
use ratelimitd::pb::ratelimitd::v1 as pb;
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// How long a test waits for a condition (a server up, a status flipped)
/// before failing. Generous: CI machines are slow, and a passing test never
/// waits this long.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// A port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    StdTcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("no free loopback port")
}

/// Sends `signal` (as `kill` spells it, e.g. `-TERM`) to process `pid`.
pub fn send_signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
}

/// Opens a TCP connection to `address` and says only the HTTP/2 hello (the
/// preface and an empty SETTINGS), as a client that then goes quiet would.
pub async fn http2_hello(address: SocketAddr) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    tokio::io::AsyncWriteExt::write_all(
        &mut stream,
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
    )
    .await
    .expect("HTTP/2 preface");
    stream
}

/// A `Health.Watch` stream for the whole server on `address`, and the first
/// status it sent.
pub async fn watch_health(
    address: SocketAddr,
) -> (
    ServingStatus,
    tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
) {
    let mut watch = HealthClient::new(channel(address).await)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("watch health")
        .into_inner();
    let first = watch.message().await.expect("no error").expect("a status");
    let status = ServingStatus::try_from(first.status).expect("a known status");
    (status, watch)
}

/// Polls `condition` until it holds or [`PATIENCE`] runs out.
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + PATIENCE;
    while !condition().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Tests that count in windows aligned to the minute (as envoyproxy/ratelimit
/// does) must not cross a minute boundary halfway: waits for the next
/// minute when little of this one is left (a wall-clock boundary, not a
/// condition anything could signal).
pub async fn fresh_minute() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    let into_minute = now.as_secs_f64() % 60.0;
    if into_minute > 45.0 {
        tokio::time::sleep(Duration::from_secs_f64(60.0 - into_minute + 0.2)).await;
    }
}

/// A `redis-server` of our own, killed when dropped.
pub struct RedisServer {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temporary directory for redis-server");
        let mut server = Self {
            port: free_port(),
            dir,
            child: None,
        };
        server.restart().await;
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts (again) on the same port, and waits until it answers.
    pub async fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot start redis-server ({err}); the tests need Redis 7: \
                     install it with `apt-get install redis-server`"
                )
            });
        self.child = Some(child);
        let url = self.url();
        eventually("redis-server to answer PING", || {
            let url = url.clone();
            async move { ping(&url).await }
        })
        .await;
    }

    /// SIGKILL: gone at once, as in a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOP: connections stay open but nothing answers, as in a hung host.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// SIGCONT after [`RedisServer::freeze`].
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        send_signal(
            self.child.as_ref().expect("redis-server is running").id(),
            signal,
        );
    }

    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("redis url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect to test redis")
    }

    /// Script calls (`EVALSHA` and `EVAL`) this Redis has run, from
    /// `INFO commandstats`.
    pub async fn script_calls(&self) -> u64 {
        let mut connection = self.connection().await;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut connection)
            .await
            .expect("INFO commandstats");
        info.lines()
            .filter(|line| {
                line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:")
            })
            .filter_map(|line| {
                let calls = line.split_once("calls=")?.1;
                calls.split(',').next()?.parse::<u64>().ok()
            })
            .sum()
    }

    /// Every key in the database.
    pub async fn keys(&self) -> Vec<String> {
        let mut connection = self.connection().await;
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut connection)
                .await
                .expect("SCAN");
            keys.extend(batch);
            if next == 0 {
                return keys;
            }
            cursor = next;
        }
    }

    /// Fails unless every key in the database will expire.
    pub async fn assert_every_key_expires(&self) {
        let mut connection = self.connection().await;
        for key in self.keys().await {
            let ttl: i64 = redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut connection)
                .await
                .expect("PTTL");
            // -2: expired between SCAN and PTTL, which is fine.
            assert!(ttl != -1, "key {key:?} has no TTL");
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A frozen server ignores SIGKILL only until it is thawed.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.kill();
    }
}

async fn ping(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut connection) = client.get_multiplexed_async_connection().await else {
        return false;
    };
    redis::cmd("PING")
        .query_async::<String>(&mut connection)
        .await
        .is_ok()
}

/// A ratelimitd server running in this test process, on port 0.
pub struct TestServer {
    pub address: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    /// Starts with these command-line flags (as after `ratelimitd`).
    pub async fn start(flags: &[&str]) -> Self {
        let config =
            Config::try_parse_from(std::iter::once("ratelimitd").chain(flags.iter().copied()))
                .expect("test flags parse");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let address = listener.local_addr().expect("local address");
        let (shutdown, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let stop = async {
                let _ = stopped.await;
            };
            ratelimitd::server::run(config, listener, stop)
                .await
                .expect("server runs");
        });
        Self {
            address,
            shutdown: Some(shutdown),
            task: Some(task),
        }
    }

    /// A server on the embedded store.
    pub async fn memory() -> Self {
        Self::start(&[]).await
    }

    /// A server on `redis`.
    pub async fn on_redis(redis: &RedisServer) -> Self {
        Self::start(&["--redis-url", &redis.url()]).await
    }

    pub async fn client(&self) -> RateLimiterClient<Channel> {
        RateLimiterClient::new(channel(self.address).await)
    }

    pub async fn health(&self) -> HealthClient<Channel> {
        HealthClient::new(channel(self.address).await)
    }

    /// Asks the server to stop and waits until it has.
    pub async fn stop(mut self) {
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

/// A ratelimitd server as a separate process, killed when dropped.
pub struct ServerProcess {
    pub address: SocketAddr,
    pub child: Child,
    /// Where its log goes, when the test reads it.
    log: Option<(tempfile::TempDir, std::path::PathBuf)>,
}

impl ServerProcess {
    /// Starts the `ratelimitd` binary with these flags plus `--listen`, and
    /// waits until its health says SERVING.
    pub async fn start(flags: &[&str]) -> Self {
        Self::spawn(None, flags, false).await
    }

    /// As [`ServerProcess::start`], listening on `address` (the address of
    /// a process that is gone, to start it again where its clients are).
    pub async fn start_at(address: SocketAddr, flags: &[&str]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimitd"));
        command.args(flags).args(["--listen", &address.to_string()]);
        Self::launch(command, false, "the ratelimitd process").await
    }

    /// As [`ServerProcess::start`], with its log kept for [`ServerProcess::log`].
    pub async fn start_logged(flags: &[&str]) -> Self {
        Self::spawn(None, flags, true).await
    }

    /// As [`ServerProcess::start_logged`], started by `prlimit` with this
    /// soft and hard limit on open files.
    pub async fn start_with_open_file_limit(soft: u64, hard: u64, flags: &[&str]) -> Self {
        Self::spawn(Some((soft, hard)), flags, true).await
    }

    /// Starts the binary as upstream's deployments do: no flags but
    /// `--address-file`, only envoyproxy/ratelimit's variables
    /// (`environment`, plus GRPC_HOST and GRPC_PORT=0 on loopback), and
    /// waits until SERVING.
    pub async fn start_upstream_way(environment: &[(&str, &str)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_ratelimitd"));
        command
            .env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", "0")
            .envs(environment.iter().copied());
        Self::launch(command, true, "ratelimitd (started the upstream way)").await
    }

    /// Everything the process has logged so far.
    pub fn log(&self) -> String {
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
        command.args(flags).args(["--listen", "127.0.0.1:0"]);
        Self::launch(command, logged, "the ratelimitd process").await
    }

    /// Runs `command` with `--address-file`, learns the port it bound from
    /// that file, and waits until it serves; panics, with its log when
    /// kept, if it exits first or does neither in time.
    async fn launch(mut command: Command, logged: bool, what: &str) -> Self {
        let dir = tempfile::tempdir().expect("a directory for the process's files");
        let address_file = dir.path().join("address");
        let log_path = dir.path().join("ratelimitd.log");
        let stderr = if logged {
            Stdio::from(std::fs::File::create(&log_path).expect("log file"))
        } else {
            Stdio::inherit()
        };
        let mut child = command
            .arg("--address-file")
            .arg(&address_file)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("start the ratelimitd binary (prlimit, for an open-file limit, is util-linux)");
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
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "{what} exited ({status}) before binding; its log: {}",
                    log_of(&log_path)
                );
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} to bind; its log: {}",
                log_of(&log_path)
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let mut server = Self {
            address,
            child,
            log: logged.then_some((dir, log_path)),
        };
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

    /// Waits until the process serves (`true`) or exits first (`false`);
    /// panics, with its log when kept, if it does neither in time.
    async fn serving_or_exited(&mut self, what: &str) -> bool {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if health_status(self.address, "").await == Some(ServingStatus::Serving) {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if Instant::now() >= deadline {
                let log = self.log.as_ref().map(|_| self.log()).unwrap_or_default();
                panic!("timed out waiting for {what} to be SERVING; its log: {log}");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn client(&self) -> RateLimiterClient<Channel> {
        RateLimiterClient::new(channel(self.address).await)
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub async fn terminate(self) -> std::process::ExitStatus {
        send_signal(self.child.id(), "-TERM");
        self.wait().await
    }

    /// Waits for the process to exit.
    pub async fn wait(self) -> std::process::ExitStatus {
        tokio::task::spawn_blocking(move || {
            let mut server = self;
            server.child.wait()
        })
        .await
        .expect("join")
        .expect("wait for ratelimitd")
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub async fn channel(address: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{address}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect to ratelimitd")
}

/// The health status of `service` at `address`, or `None` if it cannot be
/// asked.
pub async fn health_status(address: SocketAddr, service: &str) -> Option<ServingStatus> {
    let endpoint = Channel::from_shared(format!("http://{address}")).ok()?;
    let mut client = HealthClient::new(endpoint.connect().await.ok()?);
    let response = client
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .ok()?;
    ServingStatus::try_from(response.into_inner().status).ok()
}

/// A `Duration` from its protobuf form.
pub fn duration(value: Option<prost_types::Duration>) -> Duration {
    let value = value.expect("duration is set");
    Duration::new(value.seconds as u64, value.nanos as u32)
}

pub fn fixed_window(limit: u64, window: Duration) -> pb::check_limit_request::Algorithm {
    pb::check_limit_request::Algorithm::FixedWindow(pb::FixedWindow {
        limit,
        window: Some(window.try_into().expect("window")),
    })
}

pub fn sliding_window(limit: u64, window: Duration) -> pb::check_limit_request::Algorithm {
    pb::check_limit_request::Algorithm::SlidingWindow(pb::SlidingWindow {
        limit,
        window: Some(window.try_into().expect("window")),
    })
}

pub fn token_bucket(capacity: u64, refill_per_second: f64) -> pb::check_limit_request::Algorithm {
    pb::check_limit_request::Algorithm::TokenBucket(pb::TokenBucket {
        capacity,
        refill_per_second,
    })
}

pub fn sliding_window_counter(limit: u64, window: Duration) -> pb::check_limit_request::Algorithm {
    pb::check_limit_request::Algorithm::SlidingWindowCounter(pb::SlidingWindowCounter {
        limit,
        window: Some(window.try_into().expect("window")),
    })
}

pub fn gcra(rate: u64, period: Duration, burst: u64) -> pb::check_limit_request::Algorithm {
    pb::check_limit_request::Algorithm::Gcra(pb::Gcra {
        rate,
        period: Some(period.try_into().expect("period")),
        burst,
    })
}

pub fn request(
    key: &str,
    algorithm: pb::check_limit_request::Algorithm,
    cost: Option<u64>,
) -> pb::CheckLimitRequest {
    pb::CheckLimitRequest {
        key: key.to_owned(),
        algorithm: Some(algorithm),
        cost,
        ..Default::default()
    }
}

/// One `CheckLimit` call that must succeed.
pub async fn check(
    client: &mut RateLimiterClient<Channel>,
    key: &str,
    algorithm: &pb::check_limit_request::Algorithm,
    cost: Option<u64>,
) -> pb::CheckLimitResponse {
    client
        .check_limit(request(key, *algorithm, cost))
        .await
        .unwrap_or_else(|status| panic!("CheckLimit({key}) failed: {status}"))
        .into_inner()
}

/// Every algorithm with limit `limit` and nothing coming back during a test:
/// windows of a minute; the bucket refills one token in 1000 s, GCRA one
/// request in 1000 s; the sliding window counter's window is the longest
/// allowed (366 days), because its windows are aligned to the epoch and a
/// test that straddled two of them would see the previous one's count
/// weighed down.
pub fn every_algorithm(limit: u64) -> [pb::check_limit_request::Algorithm; 5] {
    [
        fixed_window(limit, Duration::from_secs(60)),
        sliding_window(limit, Duration::from_secs(60)),
        token_bucket(limit, 0.001),
        gcra(1, Duration::from_secs(1000), limit),
        sliding_window_counter(limit, ratelimitd::limit::MAX_WINDOW),
    ]
}

/// [`every_algorithm`] as the library's validated model, for tests that
/// drive the limiter directly.
pub fn every_model_algorithm(limit: u64) -> [ratelimitd::limit::Algorithm; 5] {
    every_algorithm(limit).map(|algorithm| {
        ratelimitd::api::check::limit_request(request("k", algorithm, None))
            .expect("valid parameters")
            .algorithm
    })
}

/// Fires `calls` CheckLimit calls on `key` at once, spread round-robin over
/// `clients`, and counts the allowed ones. Every call must get an answer.
pub async fn allowed_of_concurrent_calls(
    clients: &[RateLimiterClient<Channel>],
    calls: usize,
    key: &str,
    algorithm: &pb::check_limit_request::Algorithm,
) -> usize {
    let calls = (0..calls).map(|i| {
        let mut client = clients[i % clients.len()].clone();
        let request = request(key, *algorithm, None);
        tokio::spawn(async move { client.check_limit(request).await })
    });
    let mut allowed = 0;
    for result in futures::future::join_all(calls).await {
        let response = result
            .expect("task")
            .expect("every call is answered")
            .into_inner();
        allowed += usize::from(response.allowed);
    }
    allowed
}

/// 300 concurrent calls on one key with limit 100 admit exactly 100, for
/// each algorithm (on a key of its own).
pub async fn assert_exactly_100_of_300_for_every_algorithm(clients: &[RateLimiterClient<Channel>]) {
    for (i, algorithm) in every_algorithm(100).iter().enumerate() {
        let key = format!("hot-{i}");
        let allowed = allowed_of_concurrent_calls(clients, 300, &key, algorithm).await;
        assert_eq!(allowed, 100, "{algorithm:?}");
    }
}

/// Waits until every health service name of the server at `address`
/// reports `wanted`.
pub async fn await_health(address: SocketAddr, wanted: ServingStatus) {
    for service in ratelimitd::health::SERVICE_NAMES {
        eventually(
            &format!("health of {service:?} to be {wanted:?}"),
            || async move { health_status(address, service).await == Some(wanted) },
        )
        .await;
    }
}

/// A server on `redis` that notices quickly when Redis fails (a 300 ms
/// command timeout, a health probe every 100 ms), with `extra` flags, once
/// it is SERVING.
pub async fn server_quick_to_notice(redis: &RedisServer, extra: &[&str]) -> TestServer {
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

/// On a fresh `key`, a fixed window of 2 admits exactly 2 of 3 calls: the
/// quick proof that decisions reach a store and are exact.
pub async fn assert_two_of_three_admitted(client: &mut RateLimiterClient<Channel>, key: &str) {
    let limit = fixed_window(2, Duration::from_secs(60));
    assert!(
        check(client, key, &limit, None).await.allowed,
        "first call on {key}"
    );
    assert!(
        check(client, key, &limit, None).await.allowed,
        "second call on {key}"
    );
    assert!(
        !check(client, key, &limit, None).await.allowed,
        "third call on {key}"
    );
}

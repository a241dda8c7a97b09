//! ratelimitd in this test process ([`TestServer`], on port 0, stopped
//! through its shutdown channel); as a child process it is
//! `server_process.rs`'s.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Parser;
use ratelimitd::config::Config;
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use ratelimitd::server::Listeners;
use tokio::sync::oneshot;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::grpc::{await_health, channel};
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

/// Does a test's command line name the HTTP listener? Unless it does, the
/// harness turns it off: its default port would be shared by every test.
pub(crate) fn names_http_listener<Flag: AsRef<str>>(flags: &[Flag]) -> bool {
    flags
        .iter()
        .any(|flag| flag.as_ref().starts_with("--http-listen"))
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

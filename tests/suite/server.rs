//! The server around the API: health, reflection, start-up on the embedded
//! store and graceful shutdown on SIGTERM.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::{RedisServer, ServerProcess, TestServer, fixed_window, free_port, request};
use futures::StreamExt;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_reflection::pb::v1::ServerReflectionRequest;
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

#[tokio::test]
async fn reflection_lists_every_service() {
    let server = TestServer::memory().await;
    let mut client = ServerReflectionClient::new(common::channel(server.address).await);
    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies = client
        .server_reflection_info(futures::stream::iter([list]))
        .await
        .expect("reflection answers")
        .into_inner();
    let reply = replies.next().await.expect("a reply").expect("no error");
    let Some(MessageResponse::ListServicesResponse(services)) = reply.message_response else {
        panic!("unexpected reply {reply:?}");
    };
    let mut names: Vec<String> = services.service.into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "envoy.service.rate_limit_quota.v3.RateLimitQuotaService",
            "envoy.service.ratelimit.v3.RateLimitService",
            "grpc.health.v1.Health",
            "grpc.reflection.v1.ServerReflection",
            "ratelimitd.v1.Leases",
            "ratelimitd.v1.RateLimiter",
        ]
    );
    server.stop().await;
}

#[tokio::test]
async fn reflection_can_be_turned_off() {
    let server = TestServer::start(&["--reflection=false"]).await;
    let mut client = ServerReflectionClient::new(common::channel(server.address).await);
    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let status = client
        .server_reflection_info(futures::stream::iter([list]))
        .await
        .expect_err("no reflection service");
    assert_eq!(status.code(), Code::Unimplemented, "{status:?}");
    // The rest is served as ever.
    let mut api = server.client().await;
    api.check_limit(request("k", fixed_window(1, Duration::from_secs(1)), None))
        .await
        .expect("CheckLimit");
    server.stop().await;
}

#[tokio::test]
async fn health_serves_for_the_server_and_the_api() {
    let server = TestServer::memory().await;
    for service in ratelimitd::health::SERVICE_NAMES {
        common::eventually("SERVING", || async {
            common::health_status(server.address, service).await == Some(ServingStatus::Serving)
        })
        .await;
    }
    let status = server
        .health()
        .await
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .expect_err("unknown service");
    assert_eq!(status.code(), Code::NotFound);
    server.stop().await;
}

#[tokio::test]
async fn starts_on_the_embedded_store_and_says_state_is_not_shared() {
    let dir = tempfile::tempdir().expect("a directory");
    let address_file = dir.path().join("address");
    let child = Command::new(env!("CARGO_BIN_EXE_ratelimitd"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--http-listen=",
            "--address-file",
        ])
        .arg(&address_file)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start ratelimitd");
    let pid = child.id().to_string();
    let mut written = String::new();
    common::eventually("the address file", || {
        written = std::fs::read_to_string(&address_file).unwrap_or_default();
        let whole = written.ends_with('\n');
        async move { whole }
    })
    .await;
    let address: std::net::SocketAddr = written.trim().parse().expect("host:port");
    assert_ne!(address.port(), 0, "the port the system chose");
    common::eventually("SERVING", || async {
        common::health_status(address, "").await == Some(ServingStatus::Serving)
    })
    .await;
    let mut client = ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient::new(
        common::channel(address).await,
    );
    let response = client
        .check_limit(request("k", fixed_window(1, Duration::from_secs(1)), None))
        .await
        .expect("a decision");
    assert!(response.into_inner().allowed);

    let sent = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(sent.success());
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("join")
        .expect("wait for ratelimitd");
    assert!(output.status.success(), "exit status {:?}", output.status);
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains("NOT shared"), "start-up log: {log}");
}

/// `--worker-threads` sets how many threads serve; without it, as many as
/// the cores the process may use. The start-up log says how many.
#[tokio::test]
async fn worker_threads_set_the_threads_that_serve() {
    let cores = std::thread::available_parallelism().map_or(1, |cores| cores.get());
    let threads = if cores == 5 { 7 } else { 5 };
    for (flags, expected) in [
        (
            vec!["--worker-threads".to_owned(), threads.to_string()],
            threads,
        ),
        (vec![], cores),
    ] {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let server = ServerProcess::builder()
            .flags(&flags)
            .logged()
            .start()
            .await;
        let decided = server
            .client()
            .await
            .check_limit(request("k", fixed_window(1, Duration::from_secs(1)), None))
            .await
            .expect("a decision");
        assert!(decided.into_inner().allowed);
        let log = server.log();
        assert!(
            log.contains(&format!("worker_threads={expected}")),
            "{flags:?}: start-up log: {log}"
        );
    }
}

/// SIGTERM while a call waits on a frozen Redis: a health watcher sees
/// NOT_SERVING, the call in flight still gets its answer, and the process
/// exits 0.
#[tokio::test]
async fn sigterm_drains_calls_in_flight_and_exits_zero() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let metrics_port = free_port().to_string();
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    let server = ServerProcess::builder()
        .flags(&[
            "--redis-url",
            &url,
            "--redis-command-timeout",
            "2s",
            "--health-interval",
            "1h",
            "--metrics-listen",
            &metrics_listen,
        ])
        .start()
        .await;
    let (first, mut watch) = common::watch_health(server.address).await;
    assert_eq!(first, ServingStatus::Serving);

    redis.freeze();
    let mut client = server.client().await;
    let in_flight = tokio::spawn(async move {
        client
            .check_limit(request("k", fixed_window(1, Duration::from_secs(1)), None))
            .await
    });
    // The call has reached the server (and waits on Redis) once it is
    // counted in flight.
    let metrics_port: u16 = metrics_port.parse().expect("a port");
    common::eventually("the call in flight", || async move {
        let (_, series) = common::prometheus::scrape(metrics_port).await;
        common::prometheus::value(&series, "ratelimitd_requests_in_flight", &[]) == 1.0
    })
    .await;

    common::send_signal(server.pid(), "-TERM");

    let next = watch.next().await.expect("a status").expect("no error");
    assert_eq!(next.status, ServingStatus::NotServing as i32);
    drop(watch);

    let answer = in_flight.await.expect("join");
    let status = answer.expect_err("Redis is frozen");
    assert_eq!(
        status.code(),
        Code::Unavailable,
        "the call was answered by the server, not cut off: {status:?}"
    );
    assert!(
        status.message().contains("did not answer within"),
        "the server's own timeout answered it: {status:?}"
    );
    let exit = server.wait().await;
    assert!(exit.success(), "exit status {exit:?}");
    redis.thaw();
}

/// SIGTERM with idle connections open (one of them a client that never
/// answers GOAWAY) and a health watcher connected: the process tells them to
/// go away and exits without waiting out its grace (only calls in flight are
/// drained, and a Watch stream is not one).
#[tokio::test]
async fn sigterm_with_idle_connections_and_a_watcher_exits_at_once() {
    let grace = Duration::from_secs(60);
    let server = ServerProcess::builder()
        .flags(&["--shutdown-grace", "60s"])
        .start()
        .await;
    let mut idle = Vec::new();
    for _ in 0..3 {
        let mut client = server.client().await;
        client
            .check_limit(request(
                "k",
                fixed_window(100, Duration::from_secs(60)),
                None,
            ))
            .await
            .expect("a call on the embedded store");
        idle.push(client);
    }
    // Says hello, then neither reads nor closes.
    let mute = common::http2_hello(server.address).await;
    let (_, watch) = common::watch_health(server.address).await;

    let sent_at = std::time::Instant::now();
    let exit = server.terminate().await;
    assert!(exit.success(), "exit status {exit:?}");
    let took = sent_at.elapsed();
    assert!(
        took < grace / 4,
        "shutdown waited {took:?}, as if idle connections were calls in flight"
    );
    drop((idle, watch, mute));
}

/// The start-up log: short lines that say where each listener is and what
/// it serves (the console's URL first), the store (its password hidden),
/// where the rules come from and the failure policy, in text and JSON
/// alike; the whole configuration only at debug, secrets hidden.
#[tokio::test]
async fn the_start_up_log_is_short_lines_the_console_first_and_no_secret() {
    let redis = RedisServer::with_password("not-the-password").await;
    let url = redis.url();
    assert!(url.contains("not-the-password"), "{url}");
    let dir = tempfile::tempdir().expect("a config directory");
    let config = dir.path().to_string_lossy().into_owned();
    let token = "a-token-of-sixteen-characters";
    for format in ["text", "json"] {
        let http = format!("127.0.0.1:{}", free_port());
        let flags = [
            "--log-format",
            format,
            "--http-listen",
            &http,
            "--redis-url",
            &url,
            "--config",
            &config,
            "--admin-token",
            token,
        ];
        let server = ServerProcess::builder()
            .flags(&flags)
            .logged()
            .start()
            .await;
        let log = server.log();
        let lines: Vec<&str> = log.lines().collect();
        for line in &lines {
            assert!(
                line.len() < 400,
                "{format}: a start-up line of {} bytes: {line}",
                line.len()
            );
            assert!(
                !line.contains(token),
                "{format}: the admin token logged: {line}"
            );
        }
        let position = |text: &str| {
            lines
                .iter()
                .position(|line| line.contains(text))
                .unwrap_or_else(|| panic!("{format}: no line with {text:?} in:\n{log}"))
        };
        let console = position(&format!("web console: http://{http}/"));
        let listeners = [
            position(&format!(
                "HTTP on http://{http}: the console (/), the JSON API"
            )),
            position(&format!("gRPC on {}", server.address)),
        ];
        assert!(
            listeners.iter().all(|at| console < *at),
            "{format}: the console's URL comes first:\n{log}"
        );
        position("the admin API (/admin/v1)");
        let store = &lines[position("store: Redis (standalone) at redis://:***@")];
        assert!(!store.contains("not-the-password"), "{store}");
        position(&format!("rules and policies: {config}"));
        position("failure policy: fail-closed: when Redis does not answer within 100ms");
        if format == "json" {
            for line in &lines {
                let _: serde_json::Value = serde_json::from_str(line)
                    .unwrap_or_else(|err| panic!("not a JSON line ({err}): {line}"));
            }
        }
        assert!(
            !log.contains("configuration in force"),
            "{format}: the whole configuration at info:\n{log}"
        );
        server.terminate().await;
    }

    // At debug, the whole configuration in force, as the admin API shows it.
    let server = ServerProcess::builder()
        .flags(&[
            "--log-level",
            "debug",
            "--http-listen",
            "",
            "--redis-url",
            &url,
            "--admin-token",
            token,
        ])
        .logged()
        .start()
        .await;
    let log = server.log();
    let configuration = log
        .lines()
        .find(|line| line.contains("the configuration in force"))
        .unwrap_or_else(|| panic!("no configuration at debug:\n{log}"));
    for shown in [
        r#"{"flag":"redis-url","value":["redis://:***@127.0.0.1:"#,
        r#"{"flag":"admin-token","value":"***","source":"command line"}"#,
    ] {
        assert!(
            configuration.contains(shown),
            "{shown} not in {configuration}"
        );
    }
    assert!(
        !log.contains(token) && !log.contains("not-the-password"),
        "{log}"
    );
    server.terminate().await;
}

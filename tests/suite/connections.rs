//! What one peer can hold, and how connections end: streams whose request
//! never arrives hold no decision slot, are capped per connection and time
//! out; the connection cap makes newcomers wait; one address's connections
//! over its own cap are closed at once; idle connections close;
//! accept errors back off and warn without spinning; the open-file limit is
//! raised at start.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{ServerProcess, TestServer, check, fixed_window};
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tonic_health::pb::health_check_response::ServingStatus;

/// An HTTP/2 connection of our own, below tonic, to send what a well-behaved
/// client would not.
async fn raw_http2(address: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tcp = TcpStream::connect(address).await.expect("connect");
    let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

/// The headers of a CheckLimit call, with no body to follow yet.
fn check_limit_headers(address: SocketAddr) -> http::Request<()> {
    http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{address}/ratelimitd.v1.RateLimiter/CheckLimit"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("request")
}

#[tokio::test]
async fn streams_without_a_request_hold_no_slot_are_capped_and_time_out() {
    let server = TestServer::start(&[
        "--max-concurrent-requests",
        "5",
        "--max-concurrent-streams",
        "100",
        "--request-timeout",
        "1s",
    ])
    .await;
    let address = server.address;
    let mut send = raw_http2(address).await;
    // The server's SETTINGS: it allows 100 streams at once per connection
    // (more would be refused by HTTP/2, so h2 holds them back).
    common::eventually("the server's HTTP/2 settings", || {
        let send = send.clone();
        async move { send.current_max_send_streams() != usize::MAX }
    })
    .await;
    assert_eq!(send.current_max_send_streams(), 100);
    let mut pending = Vec::new();
    for _ in 0..100 {
        send = send.ready().await.expect("a stream under the cap");
        let (response, _body) = send
            .send_request(check_limit_headers(address), false)
            .expect("open a stream");
        pending.push(response);
    }

    // Other callers are served: the 100 unfinished calls hold none of the 5
    // decision slots.
    let mut client = server.client().await;
    let limit = fixed_window(100, Duration::from_secs(60));
    for _ in 0..10 {
        assert!(check(&mut client, "other", &limit, None).await.allowed);
    }

    // Each unfinished call is answered CANCELLED at the request timeout.
    let started = Instant::now();
    for response in pending {
        let response = response.await.expect("an answer, not a reset");
        let status = response
            .headers()
            .get("grpc-status")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned);
        assert_eq!(status.as_deref(), Some("1"), "{response:?}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the unfinished calls were not timed out"
    );
    server.stop().await;
}

#[tokio::test]
async fn at_the_connection_cap_a_newcomer_waits_until_one_closes() {
    let server = TestServer::start(&["--max-connections", "2"]).await;
    let limit = fixed_window(100, Duration::from_secs(60));
    let mut first = server.client().await;
    let mut second = server.client().await;
    assert!(check(&mut first, "k", &limit, None).await.allowed);
    assert!(check(&mut second, "k", &limit, None).await.allowed);

    let address = server.address;
    let third = tokio::spawn(async move {
        let mut third = ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient::new(
            tonic::transport::Endpoint::from_shared(format!("http://{address}"))
                .expect("endpoint")
                .connect_lazy(),
        );
        check(&mut third, "k", &limit, None).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served at a cap of 2"
    );
    drop(first);
    let answer = tokio::time::timeout(Duration::from_secs(10), third)
        .await
        .expect("the third connection served once one closed")
        .expect("join");
    assert!(answer.allowed);
    drop(second);
    server.stop().await;
}

/// Whether the server closed `stream` (end of stream or a reset) rather
/// than serving it (a served connection gets the server's HTTP/2 SETTINGS
/// at once).
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte)).await;
    matches!(read, Ok(Ok(0) | Err(_)))
}

#[tokio::test]
async fn one_address_over_its_connection_cap_is_closed_at_once() {
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    let server = ServerProcess::builder()
        .flags(&["--max-connections-per-ip", "3", "--metrics-listen", &listen])
        .logged()
        .start()
        .await;
    let limit = fixed_window(100, Duration::from_secs(60));
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut client = server.client().await;
        assert!(check(&mut client, "k", &limit, None).await.allowed);
        clients.push(client);
    }

    // The fourth and fifth from 127.0.0.1 are closed as soon as accepted.
    for _ in 0..2 {
        let mut extra = TcpStream::connect(server.address).await.expect("connect");
        assert!(
            closed_by_server(&mut extra).await,
            "a connection over --max-connections-per-ip 3 stayed open"
        );
    }
    for client in &mut clients {
        assert!(check(client, "k", &limit, None).await.allowed);
    }
    let refused = common::prometheus::count(
        port,
        "ratelimitd_connections_refused_total",
        &[("reason", "per_ip")],
    )
    .await;
    assert_eq!(refused, 2);
    common::eventually("the refusal warned about", || async {
        server
            .log()
            .contains("too many connections from one address")
    })
    .await;
    let log = server.log();
    assert_eq!(
        log.matches("too many connections from one address").count(),
        1,
        "the second refusal within 10 s warned again: {log}"
    );

    // Closing one lets a new one in.
    drop(clients.pop());
    let address = server.address;
    common::eventually(
        "a new connection served once one closed",
        move || async move {
            let Ok(channel) = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
                .expect("endpoint")
                .connect()
                .await
            else {
                return false;
            };
            let mut client =
                ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient::new(
                    channel,
                );
            client
                .check_limit(common::request("k", limit, None))
                .await
                .is_ok_and(|answer| answer.into_inner().allowed)
        },
    )
    .await;
}

#[tokio::test]
async fn idle_connections_close_but_a_watched_one_stays() {
    let server = TestServer::start(&["--idle-timeout", "300ms"]).await;
    // Watching from before the server is SERVING: wait for that status, so
    // that no later one is pending on the stream.
    let (mut status, mut watch) = common::watch_health(server.address).await;
    while status != ServingStatus::Serving {
        let next = watch.message().await.expect("no error").expect("a status");
        status = ServingStatus::try_from(next.status).expect("a known status");
    }

    // A connection that only said hello is closed after the idle timeout.
    let mut idle = common::http2_hello(server.address).await;
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buffer = [0u8; 1024];
        loop {
            match idle.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "an idle connection was not closed");

    // The watcher's stream is still open: no message and no error.
    let next = tokio::time::timeout(Duration::from_secs(1), watch.next()).await;
    assert!(next.is_err(), "the watched connection was closed: {next:?}");
    server.stop().await;
}

/// Seconds of CPU the process has used, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("/proc/<pid>/stat");
    // The fields after the command's closing parenthesis; utime and stime
    // are the 12th and 13th of them.
    let after = stat.rsplit_once(')').expect("stat format").1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    ticks / 100.0
}

#[tokio::test]
async fn out_of_file_descriptors_it_backs_off_warns_and_recovers() {
    // The soft limit cannot be raised past the hard one: it stays at 64.
    let server = ServerProcess::builder()
        .flags(&[])
        .open_file_limit(64, 64)
        .logged()
        .start()
        .await;
    assert!(
        server
            .log()
            .contains("open-file limit already at its hard limit"),
        "{}",
        server.log()
    );
    let mut flood = Vec::new();
    for _ in 0..100 {
        if let Ok(stream) = TcpStream::connect(server.address).await {
            flood.push(stream);
        }
    }
    let pid = server.pid();
    let cpu_before = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = cpu_seconds(pid) - cpu_before;
    assert!(
        cpu < 1.0,
        "{cpu} s of CPU in 2 s while out of descriptors: a busy loop"
    );
    let log = server.log();
    let warnings = log
        .matches("cannot accept a connection; backing off")
        .count();
    assert!(
        (1..=4).contains(&warnings),
        "{warnings} accept warnings in 2 s, want 1 to 4 (at most one a second): {log}"
    );

    drop(flood);
    let mut client = server.client().await;
    let limit = fixed_window(1, Duration::from_secs(60));
    assert!(check(&mut client, "k", &limit, None).await.allowed);
}

#[tokio::test]
async fn the_open_file_limit_is_raised_to_the_hard_limit() {
    let server = ServerProcess::builder()
        .flags(&[])
        .open_file_limit(256, 4096)
        .logged()
        .start()
        .await;
    let log = server.log();
    assert!(
        log.contains("raised the open-file limit")
            && log.contains("before=256")
            && log.contains("after=4096"),
        "{log}"
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", server.pid()))
        .expect("/proc/<pid>/limits");
    let open_files = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .expect("Max open files");
    assert!(
        open_files
            .split_whitespace()
            .filter(|word| *word == "4096")
            .count()
            == 2,
        "{open_files}"
    );
}

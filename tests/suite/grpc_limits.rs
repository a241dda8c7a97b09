//! The gRPC listener's own defences: TLS and mutual TLS, the largest
//! request accepted, and the most calls in flight (beyond it:
//! RESOURCE_EXHAUSTED at once, no queue).

use crate::common;

use std::time::{Duration, Instant};

use common::tls::{CLIENT_SAN, TlsFiles, write_certificates};
use common::{RedisServer, TestServer, fixed_window, request};
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use tonic::Code;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

fn path(file: &std::path::Path) -> String {
    file.to_string_lossy().into_owned()
}

/// A TLS channel to `server` trusting `trust`, with `identity` as the client
/// certificate if given.
async fn tls_channel(
    server: &TestServer,
    trust: &TlsFiles,
    identity: Option<&TlsFiles>,
) -> Result<Channel, tonic::transport::Error> {
    let read = |file: &std::path::Path| std::fs::read(file).expect("read PEM");
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(&trust.ca_cert)))
        .domain_name("localhost");
    if let Some(files) = identity {
        tls = tls.identity(Identity::from_pem(
            read(&files.client_cert),
            read(&files.client_key),
        ));
    }
    Channel::from_shared(format!("https://localhost:{}", server.address.port()))
        .expect("endpoint")
        .tls_config(tls)?
        .connect()
        .await
}

async fn one_call(channel: Channel) -> Result<bool, tonic::Status> {
    RateLimiterClient::new(channel)
        .check_limit(request("k", fixed_window(5, Duration::from_secs(60)), None))
        .await
        .map(|response| response.into_inner().allowed)
}

/// Connection refused, or the first call fails: either way, no decision.
async fn refused(channel: Result<Channel, tonic::transport::Error>) -> bool {
    match channel {
        Err(_) => true,
        Ok(channel) => one_call(channel).await.is_err(),
    }
}

#[tokio::test]
async fn tls_serves_clients_that_trust_its_certificate() {
    let dir = tempfile::tempdir().expect("directory");
    let files = write_certificates(dir.path());
    let server = TestServer::start(&[
        "--tls-cert",
        &path(&files.server_cert),
        "--tls-key",
        &path(&files.server_key),
    ])
    .await;
    let channel = tls_channel(&server, &files, None)
        .await
        .expect("TLS connect");
    assert!(one_call(channel).await.expect("a decision over TLS"));
    server.stop().await;
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_certificate_from_its_ca() {
    let dir = tempfile::tempdir().expect("directory");
    let files = write_certificates(&dir.path().join("ours"));
    let stranger = write_certificates(&dir.path().join("theirs"));
    let server = TestServer::start(&[
        "--tls-cert",
        &path(&files.server_cert),
        "--tls-key",
        &path(&files.server_key),
        "--tls-client-ca",
        &path(&files.ca_cert),
    ])
    .await;
    let trusted = tls_channel(&server, &files, Some(&files))
        .await
        .expect("mTLS connect");
    assert!(one_call(trusted).await.expect("a decision over mutual TLS"));
    assert!(
        refused(tls_channel(&server, &files, None).await).await,
        "no certificate"
    );
    assert!(
        refused(tls_channel(&server, &files, Some(&stranger)).await).await,
        "a certificate from another CA"
    );
    server.stop().await;
}

/// Upstream's GRPC_CLIENT_TLS_SAN: the client certificate must name it.
#[tokio::test]
async fn mutual_tls_can_require_a_name_in_the_client_certificate() {
    let dir = tempfile::tempdir().expect("directory");
    let files = write_certificates(dir.path());
    for (san, accepted) in [(CLIENT_SAN, true), ("someone.else.test", false)] {
        let server = TestServer::start(&[
            "--tls-cert",
            &path(&files.server_cert),
            "--tls-key",
            &path(&files.server_key),
            "--tls-client-ca",
            &path(&files.ca_cert),
            "--tls-client-san",
            san,
        ])
        .await;
        let channel = tls_channel(&server, &files, Some(&files)).await;
        if accepted {
            assert!(
                one_call(channel.expect("mTLS connect"))
                    .await
                    .expect("a decision")
            );
        } else {
            assert!(refused(channel).await, "a certificate without {san}");
        }
        server.stop().await;
    }
}

/// Upstream's TestReloadGRPCServerCerts: certificate files replaced on disk
/// serve new connections, without a restart; connections open before keep
/// working.
#[tokio::test]
async fn replaced_server_certificates_are_picked_up_without_a_restart() {
    let dir = tempfile::tempdir().expect("directory");
    let first = write_certificates(&dir.path().join("first"));
    let second = write_certificates(&dir.path().join("second"));
    let live = dir.path().join("live");
    std::fs::create_dir_all(&live).expect("live directory");
    let (cert, key) = (live.join("server.pem"), live.join("server.key"));
    std::fs::copy(&first.server_cert, &cert).expect("copy");
    std::fs::copy(&first.server_key, &key).expect("copy");
    let server = TestServer::start(&[
        "--tls-cert",
        &path(&cert),
        "--tls-key",
        &path(&key),
        "--tls-reload-interval",
        "100ms",
    ])
    .await;
    let before = tls_channel(&server, &first, None)
        .await
        .expect("TLS connect");
    assert!(one_call(before.clone()).await.expect("a decision"));
    assert!(
        refused(tls_channel(&server, &second, None).await).await,
        "not yet"
    );
    // A half-written pair (a key that does not match) keeps the one in use.
    std::fs::copy(&second.server_cert, &cert).expect("copy");
    assert!(one_call(before.clone()).await.is_ok());
    std::fs::copy(&second.server_key, &key).expect("copy");
    common::eventually("the new certificate to serve", || async {
        match tls_channel(&server, &second, None).await {
            Ok(channel) => one_call(channel).await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert!(
        refused(tls_channel(&server, &first, None).await).await,
        "the old CA no longer"
    );
    assert!(one_call(before).await.expect("the open connection stays"));
    server.stop().await;
}

#[tokio::test]
async fn requests_larger_than_the_maximum_are_refused() {
    let server = TestServer::start(&["--max-request-bytes", "200"]).await;
    let mut client = server.client().await;
    let small = request("k", fixed_window(5, Duration::from_secs(60)), None);
    assert!(client.check_limit(small).await.is_ok());
    let large = request(
        &"k".repeat(500),
        fixed_window(5, Duration::from_secs(60)),
        None,
    );
    let status = client.check_limit(large).await.expect_err("too large");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn calls_beyond_the_limit_in_flight_are_shed_at_once() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let server = TestServer::start(&[
        "--redis-url",
        &url,
        "--redis-command-timeout",
        "2s",
        "--max-concurrent-requests",
        "2",
    ])
    .await;
    // A frozen Redis holds every admitted call for the 2 s timeout.
    redis.freeze();
    let calls = (0..5).map(|_| tokio::spawn(call_from("127.0.0.1", server.address)));
    let mut shed = 0;
    let mut waited = 0;
    for call in futures::future::join_all(calls).await {
        let (code, took) = call.expect("task");
        match code {
            Code::ResourceExhausted => {
                shed += 1;
                assert!(
                    took < Duration::from_secs(1),
                    "shed at once, not after {took:?}"
                );
            }
            Code::Unavailable => waited += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((waited, shed), (2, 3));
    redis.thaw();
    server.stop().await;
}

/// One client from `source` (a loopback address) calling CheckLimit on
/// `server` while nothing can be decided; the call's status code and how
/// long it took.
async fn call_from(source: &str, server: std::net::SocketAddr) -> (Code, Duration) {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{server}"))
        .expect("endpoint")
        .local_address(Some(source.parse().expect("a loopback address")))
        .connect()
        .await
        .expect("connect");
    let mut client = RateLimiterClient::new(channel);
    let started = Instant::now();
    let answer = client
        .check_limit(request("k", fixed_window(5, Duration::from_secs(60)), None))
        .await;
    (
        answer.expect_err("nothing is decided").code(),
        started.elapsed(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_peer_cannot_take_every_slot() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let server = TestServer::start(&[
        "--redis-url",
        &url,
        "--redis-command-timeout",
        "2s",
        "--max-concurrent-requests",
        "10",
        "--max-concurrent-requests-per-peer",
        "2",
    ])
    .await;
    // A frozen Redis holds every admitted call for the 2 s timeout.
    redis.freeze();
    let address = server.address;
    let greedy: Vec<_> = (0..4)
        .map(|_| tokio::spawn(call_from("127.0.0.1", address)))
        .collect();
    // Give the greedy peer's calls their head start, then another peer asks.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let other = tokio::spawn(call_from("127.0.0.2", address));

    let mut codes = Vec::new();
    for call in greedy {
        let (code, took) = call.await.expect("task");
        if code == Code::ResourceExhausted {
            assert!(
                took < Duration::from_secs(1),
                "shed at once, not after {took:?}"
            );
        }
        codes.push(code);
    }
    codes.sort_by_key(|code| *code as i32);
    assert_eq!(
        codes,
        [
            Code::ResourceExhausted,
            Code::ResourceExhausted,
            Code::Unavailable,
            Code::Unavailable
        ],
        "two of the greedy peer's four calls admitted"
    );
    let (code, _) = other.await.expect("task");
    assert_eq!(
        code,
        Code::Unavailable,
        "the other peer's call was admitted"
    );
    redis.thaw();
    server.stop().await;
}

/// Over TLS too, calls count against their peer's share of the slots (the
/// call tracking sees TLS connections since TLS ends in ratelimitd's own
/// accept loop; under tonic's TLS it saw none, and one peer could take
/// every slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_calls_count_against_their_peers_share() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let dir = tempfile::tempdir().expect("directory");
    let files = write_certificates(dir.path());
    let server = TestServer::start(&[
        "--redis-url",
        &url,
        "--redis-command-timeout",
        "2s",
        "--max-concurrent-requests",
        "10",
        "--max-concurrent-requests-per-peer",
        "2",
        "--tls-cert",
        &path(&files.server_cert),
        "--tls-key",
        &path(&files.server_key),
    ])
    .await;
    let channel = tls_channel(&server, &files, None)
        .await
        .expect("TLS connect");
    // A frozen Redis holds every admitted call for the 2 s timeout.
    redis.freeze();
    let calls: Vec<_> = (0..4)
        .map(|_| {
            let channel = channel.clone();
            tokio::spawn(async move {
                RateLimiterClient::new(channel)
                    .check_limit(request("k", fixed_window(5, Duration::from_secs(60)), None))
                    .await
                    .map_or_else(|status| status.code(), |_| Code::Ok)
            })
        })
        .collect();
    let mut codes = Vec::new();
    for call in calls {
        codes.push(call.await.expect("task"));
    }
    codes.sort_by_key(|code| *code as i32);
    assert_eq!(
        codes,
        [
            Code::ResourceExhausted,
            Code::ResourceExhausted,
            Code::Unavailable,
            Code::Unavailable
        ],
        "two of the peer's four calls admitted"
    );
    redis.thaw();
    server.stop().await;
}

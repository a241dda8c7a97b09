//! Redis behind a password, an ACL user, TLS with a private CA, and TLS
//! that wants a client certificate: ratelimitd decides on each, and a wrong
//! credential is a store that does not answer (UNAVAILABLE, NOT_SERVING),
//! never a crash.

use crate::common;

use std::time::Duration;

use common::redis::{ClientCertificates, RedisServer, Secured};
use common::tls::self_signed_ca_certificate;
use common::{ServerProcess, TestServer, fixed_window};
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

/// Exactly two of three allowed on a fresh key.
async fn decides_exactly(server: &TestServer) {
    common::assert_two_of_three_admitted(&mut server.client().await, "k").await;
}

async fn serving(server: &TestServer) {
    common::eventually("SERVING", || async {
        common::health_status(server.address, "").await == Some(ServingStatus::Serving)
    })
    .await;
}

/// A call gets no decision: the store does not answer (UNAVAILABLE, or
/// INTERNAL for a store that refuses the connection), never a crash.
async fn no_decision(server: &TestServer, why: &str) {
    no_decision_from(server.client().await, why).await;
}

async fn no_decision_from(mut client: RateLimiterClient<Channel>, why: &str) {
    let status = client
        .check_limit(common::request(
            "k",
            fixed_window(2, Duration::from_secs(60)),
            None,
        ))
        .await
        .expect_err(why);
    assert!(
        matches!(status.code(), Code::Unavailable | Code::Internal),
        "{status:?}"
    );
}

fn path(file: &std::path::Path) -> String {
    file.to_string_lossy().into_owned()
}

#[tokio::test]
async fn a_password() {
    let redis = RedisServer::with_password("s3cret p@ss").await;
    let url = redis.url();
    let server = TestServer::start(&["--redis-url", &url]).await;
    serving(&server).await;
    decides_exactly(&server).await;
    server.stop().await;

    let wrong = redis.url_without_credentials();
    let server = TestServer::start(&["--redis-url", &wrong, "--health-interval", "100ms"]).await;
    no_decision(&server, "no password").await;
    assert_eq!(
        common::health_status(server.address, "").await,
        Some(ServingStatus::NotServing)
    );
    server.stop().await;
}

#[tokio::test]
async fn an_acl_user() {
    let redis = RedisServer::with_acl_user("limiter", "s3cret").await;
    let url = redis.url();
    let server = TestServer::start(&["--redis-url", &url]).await;
    serving(&server).await;
    decides_exactly(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn tls_with_a_private_ca() {
    let redis = RedisServer::with_tls().await;
    let url = redis.url();
    let ca = path(redis.ca_cert_path());
    let server = TestServer::start(&["--redis-url", &url, "--redis-tls-ca", &ca]).await;
    serving(&server).await;
    decides_exactly(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn tls_with_a_client_certificate() {
    let redis = RedisServer::with_tls_client_auth().await;
    let url = redis.url();
    let (ca, cert, key) = (
        path(redis.ca_cert_path()),
        path(redis.client_cert_path()),
        path(redis.client_key_path()),
    );
    let server = TestServer::start(&[
        "--redis-url",
        &url,
        "--redis-tls-ca",
        &ca,
        "--redis-tls-cert",
        &cert,
        "--redis-tls-key",
        &key,
    ])
    .await;
    serving(&server).await;
    decides_exactly(&server).await;
    server.stop().await;
}

/// Upstream's Redis TLS recipe: one self-signed certificate as the CA file
/// and the server's certificate (and, in its client-certificate test, the
/// client's too). webpki alone refuses it (`CaUsedAsEndEntity`); ratelimitd
/// accepts exactly that certificate, pinned, and still checks its name; a
/// certificate not in the CA file stays refused.
#[tokio::test]
async fn tls_with_upstreams_pinned_self_signed_certificate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = self_signed_ca_certificate();
    std::fs::write(dir.path().join("cert.pem"), &cert).expect("cert");
    std::fs::write(dir.path().join("key.pem"), &key).expect("key");
    let (other, _) = self_signed_ca_certificate();
    std::fs::write(dir.path().join("other.pem"), &other).expect("other cert");
    let pem = |name: &str| path(&dir.path().join(name));
    for client_auth in [false, true] {
        let clients = if client_auth {
            ClientCertificates::Required
        } else {
            ClientCertificates::NotAsked
        };
        let redis = RedisServer::pinned(dir.path(), clients, None).await;
        let url = format!("rediss://localhost:{}", redis.port());
        let mut flags = vec!["--redis-url", &url, "--redis-tls-ca"];
        let ca = pem("cert.pem");
        flags.push(&ca);
        let (client_cert, client_key) = (pem("cert.pem"), pem("key.pem"));
        if client_auth {
            flags.extend([
                "--redis-tls-cert",
                &client_cert,
                "--redis-tls-key",
                &client_key,
            ]);
        }
        let server = TestServer::start(&flags).await;
        serving(&server).await;
        decides_exactly(&server).await;
        server.stop().await;
    }
    let redis = RedisServer::pinned(dir.path(), ClientCertificates::NotAsked, None).await;
    let refused = |url: String, ca: String| async move {
        let server = TestServer::start(&[
            "--redis-url",
            &url,
            "--redis-tls-ca",
            &ca,
            "--health-interval",
            "100ms",
        ])
        .await;
        no_decision(&server, "the certificate must be refused").await;
        server.stop().await;
    };
    // Not the pinned certificate: refused.
    refused(
        format!("rediss://localhost:{}", redis.port()),
        pem("other.pem"),
    )
    .await;
    // The pinned certificate, but not for this name: refused.
    refused(
        format!("rediss://127.0.0.1:{}", redis.port()),
        pem("cert.pem"),
    )
    .await;
}

/// Upstream's CI recipe: the self-signed certificate (CA:TRUE) used as the
/// server's is added to the system's trust store, and REDIS_TLS is on with
/// no CA file. ratelimitd trusts what the system trusts (SSL_CERT_FILE
/// stands for the system's store here) and accepts a certificate of that
/// store presented as the server's own, its name checked; a self-signed
/// certificate the store does not hold stays refused, and an ordinary
/// chain to a CA in the store is verified as always.
#[tokio::test]
async fn tls_trusted_through_the_system_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = self_signed_ca_certificate();
    std::fs::write(dir.path().join("cert.pem"), &cert).expect("cert");
    std::fs::write(dir.path().join("key.pem"), &key).expect("key");
    let (other, _) = self_signed_ca_certificate();
    std::fs::write(dir.path().join("other.pem"), &other).expect("other cert");
    let pinned = RedisServer::pinned(dir.path(), ClientCertificates::NotAsked, None).await;
    let signed = RedisServer::with_tls().await;
    let ca = std::fs::read_to_string(signed.ca_cert_path()).expect("the test CA");
    std::fs::write(dir.path().join("store.pem"), format!("{cert}{ca}")).expect("store");
    let pem = |name: &str| path(&dir.path().join(name));
    let store = pem("store.pem");

    // The self-signed certificate, trusted only through the system's store.
    let url = format!("rediss://localhost:{}", pinned.port());
    let server = ServerProcess::builder()
        .flags(&["--redis-url", &url])
        .env(&[("SSL_CERT_FILE", &store)])
        .logged()
        .start()
        .await;
    common::assert_two_of_three_admitted(&mut server.client().await, "k").await;
    server.terminate().await;

    // An ordinary chain to a CA in the store.
    let url = signed.url();
    let server = ServerProcess::builder()
        .flags(&["--redis-url", &url])
        .env(&[("SSL_CERT_FILE", &store)])
        .logged()
        .start()
        .await;
    common::assert_two_of_three_admitted(&mut server.client().await, "k").await;
    server.terminate().await;

    let refused = |url: String, store: String| async move {
        let flags = ["--redis-url", &url, "--health-interval", "100ms"];
        let server = ServerProcess::builder()
            .flags(&flags)
            .env(&[("SSL_CERT_FILE", &store)])
            .logged()
            .listening()
            .await;
        no_decision_from(server.client().await, "the certificate must be refused").await;
        // The handshake's failure is logged by the connection attempt, which
        // may still be writing when the decision has already failed.
        common::eventually("the refused certificate to be logged", || async {
            server.log().contains("invalid peer certificate")
        })
        .await;
        server.terminate().await;
    };
    // A store without the server's certificate (another self-signed one).
    refused(
        format!("rediss://localhost:{}", pinned.port()),
        pem("other.pem"),
    )
    .await;
    // The server's certificate in the store, but not for this name.
    refused(
        format!("rediss://127.0.0.1:{}", pinned.port()),
        store.clone(),
    )
    .await;
}

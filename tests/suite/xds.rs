//! The Envoy rules from an xDS management server (upstream's
//! CONFIG_TYPE=GRPC_XDS_SOTW, as Envoy Gateway runs it), against a small
//! Aggregated Discovery Service the test runs itself (`common::xds`): the configuration
//! served is applied and ACKed (with the node, its metadata and the extra
//! headers), a bad one is NACKed with the reason while the rules in force
//! stay, updates apply, and after the server restarts the client
//! reconnects, sends the version it last accepted, and takes the new one.

use crate::common;

use std::sync::{Arc, Mutex};

use common::TestServer;
use common::rls::{descriptor, with_hits};
use common::xds::{Seen, TYPE_URL, TestAds, listen, serve, serve_over, snapshot};
use ratelimitd::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimitd::pb::ratelimit::config::ratelimit::v3 as conf;
use tokio::sync::watch;

/// The limit ratelimitd applies to `user` in domain `xds` now, if any.
async fn applied_limit(
    client: &mut RateLimitServiceClient<tonic::transport::Channel>,
) -> Option<u32> {
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: "xds".into(),
            descriptors: vec![with_hits(descriptor(&[("user", "u")]), 0)],
            hits_addend: 0,
        })
        .await
        .ok()?
        .into_inner();
    response
        .statuses
        .first()?
        .current_limit
        .as_ref()
        .map(|limit| limit.requests_per_unit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_from_an_xds_server_with_acks_nacks_updates_and_restarts() {
    let (listener, address) = listen("127.0.0.1:0").await;
    let (publish, current) = watch::channel(snapshot("1", 1, conf::RateLimitUnit::Hour));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let ads = TestAds {
        current,
        seen: seen.clone(),
        alive: watch::channel(true).1,
    };
    let stop = serve(listener, ads.clone()).await;
    let server = TestServer::start(&[
        "--xds-server",
        &address.to_string(),
        "--xds-node-id",
        "test-node",
        "--xds-node-metadata",
        "zone=a,team=edge",
        "--xds-headers",
        "x-token:s3cret",
        "--xds-retry-interval",
        "50ms",
        "--xds-retry-max",
        "200ms",
    ])
    .await;
    let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
    let watcher = client.clone();
    let limit_becomes = |wanted: u32| {
        let client = watcher.clone();
        async move {
            common::eventually(&format!("the limit to become {wanted}"), || {
                let mut client = client.clone();
                async move { applied_limit(&mut client).await == Some(wanted) }
            })
            .await;
        }
    };
    limit_becomes(1).await;
    let acked = |version: &str, nonce: &str| {
        let seen = seen.lock().unwrap();
        seen.requests.iter().any(|request| {
            request.version_info == version
                && request.response_nonce == nonce
                && request.error_detail.is_none()
        })
    };
    common::eventually("the first version to be ACKed", || async {
        acked("1", "1")
    })
    .await;
    {
        let seen = seen.lock().unwrap();
        let first = &seen.requests[0];
        assert_eq!(first.type_url, TYPE_URL);
        assert_eq!(
            (first.version_info.as_str(), first.response_nonce.as_str()),
            ("", "")
        );
        let node = first.node.as_ref().expect("the node");
        assert_eq!(node.id, "test-node");
        let metadata = node.metadata.as_ref().expect("node metadata");
        assert_eq!(
            metadata.fields["zone"].kind,
            Some(prost_types::value::Kind::StringValue("a".into()))
        );
        assert_eq!(seen.tokens, ["s3cret"]);
    }

    // A configuration that does not compile: NACKed with why, old rules stay.
    publish
        .send(snapshot("2", 3, conf::RateLimitUnit::Unknown))
        .unwrap();
    common::eventually("the bad version to be NACKed", || async {
        let seen = seen.lock().unwrap();
        seen.requests.iter().any(|request| {
            request.response_nonce == "2"
                && request.version_info == "1"
                && request.error_detail.as_ref().is_some_and(|status| {
                    status.code == 3 && status.message.contains("invalid rate limit unit")
                })
        })
    })
    .await;
    assert_eq!(
        applied_limit(&mut client).await,
        Some(1),
        "the rules in force stay"
    );

    publish
        .send(snapshot("3", 5, conf::RateLimitUnit::Hour))
        .unwrap();
    limit_becomes(5).await;
    common::eventually("version 3 to be ACKed", || async { acked("3", "3") }).await;

    // The server goes away and comes back with a new version: the client
    // reconnects with the version it last accepted, and takes the new one.
    stop.stop();
    common::eventually("the test xDS server to stop", || async {
        tokio::net::TcpStream::connect(address).await.is_err()
    })
    .await;
    assert_eq!(
        applied_limit(&mut client).await,
        Some(5),
        "rules stay while the server is away"
    );
    let before = seen.lock().unwrap().requests.len();
    publish
        .send(snapshot("4", 7, conf::RateLimitUnit::Hour))
        .unwrap();
    // Back on the same address, as a restarted control plane would be.
    let _stop = serve(listen(&address.to_string()).await.0, ads).await;
    limit_becomes(7).await;
    let reconnect = seen.lock().unwrap().requests[before].clone();
    assert_eq!(
        reconnect.version_info, "3",
        "the new stream says what it has"
    );
    assert_eq!(reconnect.response_nonce, "");
    server.stop().await;
}

/// Over TLS (upstream's CONFIG_GRPC_XDS_SERVER_USE_TLS and its CA): the
/// configuration arrives from a server with a private CA's certificate,
/// verified by name; a client that does not trust that CA gets nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rules_from_an_xds_server_over_tls() {
    let dir = tempfile::tempdir().expect("directory");
    let files = common::tls::write_certificates(dir.path());
    let stranger = common::tls::write_certificates(&dir.path().join("stranger"));
    let read = |path: &std::path::Path| std::fs::read(path).expect("read PEM");
    let (listener, address) = listen("127.0.0.1:0").await;
    let (_publish, current) = watch::channel(snapshot("1", 4, conf::RateLimitUnit::Hour));
    let ads = TestAds {
        current,
        seen: Arc::new(Mutex::new(Seen::default())),
        alive: watch::channel(true).1,
    };
    let _running = serve_over(
        listener,
        ads,
        Some((read(&files.server_cert), read(&files.server_key))),
    )
    .await;
    let server_for = |ca: &std::path::Path, waits: bool| {
        let ca = ca.to_string_lossy().into_owned();
        let server = format!("localhost:{}", address.port());
        async move {
            let mut flags = vec![
                "--xds-server",
                &server,
                "--xds-tls",
                "--xds-tls-ca",
                &ca,
                "--xds-retry-interval",
                "50ms",
                "--xds-retry-max",
                "100ms",
            ];
            if !waits {
                // Else its port would stay closed: nothing ever arrives.
                flags.push("--start-without-rules");
            }
            TestServer::start(&flags).await
        }
    };
    let trusting = server_for(&files.ca_cert, true).await;
    let mut client = RateLimitServiceClient::new(common::channel(trusting.address).await);
    common::eventually("the limit from the TLS xDS server", || {
        let mut client = client.clone();
        async move { applied_limit(&mut client).await == Some(4) }
    })
    .await;
    trusting.stop().await;
    let distrusting = server_for(&stranger.ca_cert, false).await;
    client = RateLimitServiceClient::new(common::channel(distrusting.address).await);
    // Several reconnects' worth of time: still no configuration.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(
        applied_limit(&mut client).await,
        None,
        "an untrusted server gives no rules"
    );
    distrusting.stop().await;
}

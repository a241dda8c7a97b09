//! When the gRPC port opens and when it closes, against the binary started
//! the upstream way. With xDS rules (CONFIG_TYPE=GRPC_XDS_SOTW) the port
//! stays closed until the first configuration came, while `/healthcheck`
//! says 500; FORCE_START_WITHOUT_INITIAL_CONFIG opens it at once, and with
//! files starts on a configuration that cannot be read. On SIGTERM health
//! turns NOT_SERVING (500 at `/healthcheck`) while the port still takes
//! calls for `--shutdown-delay`, then it closes.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::http::{get, post, request};
use common::rls::descriptor;
use common::xds::{Seen, TestAds, serve, snapshot};
use common::{RedisServer, ServerProcess, free_port};
use ratelimitd::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimitd::pb::ratelimit::config::ratelimit::v3 as conf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tonic_health::pb::health_check_response::ServingStatus;

/// Upstream's variables for `redis`, plus `more`.
fn environment<'a>(redis: &'a str, more: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut environment = vec![
        ("USE_STATSD", "false"),
        ("REDIS_SOCKET_TYPE", "tcp"),
        ("REDIS_URL", redis),
        ("LOG_LEVEL", "info"),
    ];
    environment.extend_from_slice(more);
    environment
}

/// Upstream's variables for rules from the xDS server at `xds`.
fn xds_environment(xds: &str) -> [(&str, &str); 4] {
    [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
        ("CONFIG_GRPC_XDS_SERVER_URL", xds),
        ("CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "100ms"),
        ("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "200ms"),
    ]
}

async fn healthcheck(server: &ServerProcess) -> Option<u16> {
    let port = server.http_port();
    get(port, "/healthcheck", &[])
        .await
        .map(|response| response.status)
}

/// The limit on `user` in domain `xds` that ShouldRateLimit reports.
async fn xds_limit(server: &ServerProcess) -> Option<u32> {
    let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
    let response = client
        .should_rate_limit(RateLimitRequest {
            domain: "xds".into(),
            descriptors: vec![descriptor(&[("user", "u")])],
            hits_addend: 1,
        })
        .await
        .expect("ShouldRateLimit")
        .into_inner();
    assert_eq!(response.overall_code(), Code::Ok);
    response.statuses[0]
        .current_limit
        .as_ref()
        .map(|limit| limit.requests_per_unit)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_xds_rules_the_grpc_port_opens_once_the_first_configuration_came() {
    let redis = RedisServer::start().await;
    let redis_address = format!("127.0.0.1:{}", redis.port());
    let xds = format!("127.0.0.1:{}", free_port());
    let mut variables = environment(&redis_address, &[]);
    variables.extend(xds_environment(&xds));
    let server = ServerProcess::builder()
        .env(&variables)
        .upstream_way()
        .bound()
        .await;
    common::eventually("ratelimitd to wait for its first configuration", || async {
        server.log().contains("waiting for the first configuration")
    })
    .await;
    // Up, its HTTP side answering, the xDS server out of reach: the port
    // is bound, and refuses.
    assert_eq!(healthcheck(&server).await, Some(500));
    assert!(
        TcpStream::connect(server.address).await.is_err(),
        "the gRPC port accepted before any configuration"
    );
    let port = server.http_port();
    let ask = r#"{"domain": "xds", "descriptors": [{"entries": [{"key": "user", "value": "u"}]}]}"#;
    let early = post(port, "/json", ask).await.expect("an answer");
    assert_eq!(
        (early.status, early.body.as_str()),
        (503, "Service Unavailable\n"),
        "/json decides only when gRPC would"
    );
    // The JSON API neither, and /readyz says why.
    let check = r#"{"key": "u", "fixedWindow": {"limit": "1", "window": "1s"}}"#;
    let headers = [("content-type", "application/json")];
    let early = request(port, "POST", "/v1/check", &headers, check)
        .await
        .expect("an answer");
    assert_eq!(early.status, 503, "{early:?}");
    let readyz = get(port, "/readyz", &[]).await.expect("an answer");
    assert_eq!(readyz.status, 503, "{readyz:?}");
    assert!(readyz.body.contains(r#""open":false"#), "{readyz:?}");

    let (_publish, current) = watch::channel(snapshot("1", 3, conf::RateLimitUnit::Hour));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let ads = TestAds {
        current,
        seen,
        alive: watch::channel(true).1,
    };
    let listener = TcpListener::bind(&xds).await.expect("bind the xDS address");
    let _running = serve(listener, ads).await;
    common::eventually("gRPC health SERVING", || async {
        common::health_status(server.address, "").await == Some(ServingStatus::Serving)
    })
    .await;
    assert_eq!(xds_limit(&server).await, Some(3), "the first configuration");
    assert_eq!(healthcheck(&server).await, Some(200));
    let answered = post(port, "/json", ask).await.expect("an answer");
    assert_eq!(answered.status, 200, "{answered:?}");
    let answered = request(port, "POST", "/v1/check", &headers, check)
        .await
        .expect("an answer");
    assert_eq!(answered.status, 200, "{answered:?}");
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_start_opens_the_port_without_a_configuration() {
    let redis = RedisServer::start().await;
    let redis_address = format!("127.0.0.1:{}", redis.port());
    // Nothing serves xDS there.
    let xds = format!("127.0.0.1:{}", free_port());
    let mut variables = environment(
        &redis_address,
        &[("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")],
    );
    variables.extend(xds_environment(&xds));
    let server = ServerProcess::builder()
        .env(&variables)
        .upstream_way()
        .start()
        .await;
    assert_eq!(xds_limit(&server).await, None, "no rules: no limit");
    assert_eq!(healthcheck(&server).await, Some(200));
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_start_with_files_starts_on_a_configuration_that_cannot_be_read() {
    let redis = RedisServer::start().await;
    let redis_address = format!("127.0.0.1:{}", redis.port());
    let root = tempfile::tempdir().expect("a runtime root");
    let config = root.path().join("ratelimit/config");
    std::fs::create_dir_all(&config).expect("the config directory");
    let broken = "domain: xds\ndescriptors:\n  - key: user\n    rate_limit: {unit: fortnight, requests_per_unit: 2}\n";
    std::fs::write(config.join("limits.yaml"), broken).expect("write");
    let root_path = root.path().to_string_lossy().into_owned();
    let variables = environment(
        &redis_address,
        &[
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true"),
            ("RUNTIME_ROOT", &root_path),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RATELIMITD_CONFIG_POLL_INTERVAL", "100ms"),
        ],
    );
    let server = ServerProcess::builder()
        .env(&variables)
        .upstream_way()
        .start()
        .await;
    assert!(server.log().contains("invalid rate limit unit 'fortnight'"));
    assert_eq!(xds_limit(&server).await, None, "no rules yet");
    std::fs::write(
        config.join("limits.yaml"),
        broken.replace("fortnight", "hour"),
    )
    .expect("write");
    common::eventually("the mended configuration to load", || async {
        xds_limit(&server).await == Some(2)
    })
    .await;
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_turns_health_off_before_the_port_closes() {
    let redis = RedisServer::start().await;
    let redis_address = format!("127.0.0.1:{}", redis.port());
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/upstream_integration"
    );
    let variables = environment(
        &redis_address,
        &[
            ("RUNTIME_ROOT", fixture),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RATELIMITD_SHUTDOWN_DELAY", "5s"),
        ],
    );
    let server = ServerProcess::builder()
        .env(&variables)
        .upstream_way()
        .start()
        .await;
    assert_eq!(healthcheck(&server).await, Some(200));
    common::send_signal(server.pid(), "-TERM");
    common::eventually("/healthcheck to say 500 after SIGTERM", || async {
        healthcheck(&server).await == Some(500)
    })
    .await;
    // Health says go away, yet the port still takes new connections and
    // calls: load balancers have time to stop sending.
    assert_eq!(
        common::health_status(server.address, "").await,
        Some(ServingStatus::NotServing)
    );
    assert_eq!(xds_limit(&server).await, None, "a call still answered");
    let address = server.address;
    let started = std::time::Instant::now();
    let status = server.wait().await;
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "stopped after the delay"
    );
    assert!(
        TcpStream::connect(address).await.is_err(),
        "the port is closed"
    );
}

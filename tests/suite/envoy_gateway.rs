//! ratelimitd run as Envoy Gateway runs envoyproxy/ratelimit, with only the
//! image changed: the built binary started with no arguments and exactly
//! the environment of Envoy Gateway's Deployment (newer releases: metrics
//! for Prometheus through Envoy Gateway's statsd_exporter mapping; older
//! ones: statsd to a statsd_exporter sidecar), its addresses moved to
//! loopback, its certificate secret, Redis and xDS server the test's own.
//! The xDS server requires and verifies the client certificate, as Envoy
//! Gateway's does; a real Envoy asks ratelimitd over TLS, presenting
//! Envoy's certificate, under the rules that server publishes. The
//! kubelet's probes find it ready, the start log says what of that
//! environment has no effect, Envoy's fourth request of three allowed is
//! refused, and the statistics arrive under Envoy Gateway's names.

use crate::common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::envoy::Envoy;
use common::http::{HttpResponse, get, start_upstream};
use common::tls::{EnvoyGatewayCertificates, write_envoy_gateway_certificates};
use common::xds::{Seen, TestAds, listen, serve_mutual_tls};
use common::{PATIENCE, RedisServer, ServerProcess, eventually, free_port};
use ratelimitd::pb::ratelimit::config::ratelimit::v3 as conf;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use tokio::sync::watch;

/// Envoy Gateway's statsd_exporter mapping (its `statsd-exporter-config`
/// ConfigMap, mounted at `/etc/statsd-exporter/conf.yaml`).
const EG_MAPPING: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/envoy_gateway/statsd_conf.yaml"
);

/// The names Envoy Gateway gives a listener's rate limit domain, a route's
/// descriptor and a rule's header match (its translator's test data).
const DOMAIN: &str = "first-listener";
const ROUTE: &str = "first-route";
const RULE: &str = "rule-0-match-0";

/// How ratelimitd's statistics leave it, by Envoy Gateway's release.
#[derive(Clone, Copy, PartialEq)]
enum Release {
    /// USE_PROMETHEUS with Envoy Gateway's mapping, on PROMETHEUS_ADDR.
    Prometheus,
    /// USE_STATSD to STATSD_PORT (a statsd_exporter sidecar).
    Statsd,
}

/// Where the test puts what Envoy Gateway's environment names.
struct Places {
    grpc: u16,
    http: u16,
    debug: u16,
    /// PROMETHEUS_ADDR's or STATSD_PORT's port.
    stats: u16,
    redis: String,
    runtime_root: String,
    certs: EnvoyGatewayCertificates,
    xds: SocketAddr,
}

/// Envoy Gateway's environment for envoyproxy/ratelimit
/// (`internal/infrastructure/kubernetes/ratelimit/testdata/deployments/default.yaml`,
/// and before Envoy Gateway moved to Prometheus, its statsd variant), in
/// its order, with only addresses and paths moved to the test's.
fn environment(release: Release, at: &Places) -> Vec<(String, String)> {
    let file = |name: &str| at.certs.rate_limit_dir.join(name).display().to_string();
    let mut variables = vec![
        ("RUNTIME_ROOT", at.runtime_root.clone()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_IGNOREDOTFILES", "true".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
        ("LOG_LEVEL", "info".into()),
    ];
    match release {
        Release::Prometheus => variables.push(("USE_STATSD", "false".into())),
        Release::Statsd => variables.extend([
            ("USE_STATSD", "true".into()),
            // Upstream's default STATSD_HOST is `localhost` (the sidecar);
            // named here so it cannot resolve to ::1.
            ("STATSD_HOST", "127.0.0.1".into()),
            ("STATSD_PORT", at.stats.to_string()),
        ]),
    }
    variables.extend([
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        // By name, as `envoy-gateway:18001` is: the server's certificate
        // is verified against it.
        (
            "CONFIG_GRPC_XDS_SERVER_URL",
            format!("localhost:{}", at.xds.port()),
        ),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
        ("GRPC_SERVER_USE_TLS", "true".into()),
        ("GRPC_SERVER_TLS_CERT", file("tls.crt")),
        ("GRPC_SERVER_TLS_KEY", file("tls.key")),
        ("GRPC_SERVER_TLS_CA_CERT", file("ca.crt")),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", file("tls.crt")),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", file("tls.key")),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", file("ca.crt")),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", at.redis.clone()),
    ]);
    if release == Release::Prometheus {
        variables.extend([
            ("USE_PROMETHEUS", "true".into()),
            ("PROMETHEUS_ADDR", format!("127.0.0.1:{}", at.stats)),
            ("PROMETHEUS_MAPPER_YAML", EG_MAPPING.into()),
        ]);
    }
    // The container's listeners, on loopback: gRPC 8081, HTTP 8080, debug
    // 6070 (upstream's defaults, which Envoy Gateway keeps).
    variables.extend([
        ("GRPC_HOST", "127.0.0.1".into()),
        ("GRPC_PORT", at.grpc.to_string()),
        ("HOST", "127.0.0.1".into()),
        ("PORT", at.http.to_string()),
        ("DEBUG_HOST", "127.0.0.1".into()),
        ("DEBUG_PORT", at.debug.to_string()),
    ]);
    (variables.into_iter())
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
}

/// The rules Envoy Gateway's translator publishes for a route with one
/// rule on the `x-user-id` header: 3 a minute for each user.
fn rules() -> Vec<conf::RateLimitConfig> {
    vec![conf::RateLimitConfig {
        name: DOMAIN.into(),
        domain: DOMAIN.into(),
        descriptors: vec![conf::RateLimitDescriptor {
            key: ROUTE.into(),
            value: ROUTE.into(),
            descriptors: vec![conf::RateLimitDescriptor {
                key: RULE.into(),
                rate_limit: Some(conf::RateLimitPolicy {
                    unit: conf::RateLimitUnit::Minute as i32,
                    requests_per_unit: 3,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }],
    }]
}

/// Has ratelimitd (node `envoy-ratelimit`) accepted `version`, and
/// presented `client_cert` (DER) on every stream?
fn acked(seen: &Mutex<Seen>, version: &str, client_cert: &[u8]) -> bool {
    let seen = seen.lock().expect("what the xDS server saw");
    let presented = (seen.client_certificates.iter())
        .all(|chain| chain.first().is_some_and(|leaf| leaf == client_cert));
    presented
        && seen.requests.iter().any(|request| {
            request.version_info == version
                && request.error_detail.is_none()
                && request
                    .node
                    .as_ref()
                    .is_some_and(|n| n.id == "envoy-ratelimit")
        })
}

/// The kubelet's HTTP probe of `/healthcheck`: HTTP/1.1, one second to
/// answer; success is 200 to 399.
async fn probe(port: u16) -> bool {
    let headers = [("user-agent", "kube-probe/1.33"), ("accept", "*/*")];
    let answer =
        tokio::time::timeout(Duration::from_secs(1), get(port, "/healthcheck", &headers)).await;
    matches!(
        answer,
        Ok(Some(HttpResponse {
            status: 200..=399,
            ..
        }))
    )
}

/// Envoy as Envoy Gateway configures it for the route of [`rules`]: its
/// rate limit filter asks `ratelimit_cluster`, over TLS that trusts Envoy
/// Gateway's CA, presenting Envoy's certificate. Fails closed, so that
/// each 200 is ratelimitd's OK.
fn envoy_config(grpc: u16, upstream: u16, certs: &EnvoyGatewayCertificates) -> String {
    format!(
        r#"
admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
static_resources:
  listeners:
    - name: {DOMAIN}
      address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: {DOMAIN}
                route_config:
                  name: {DOMAIN}
                  virtual_hosts:
                    - name: app
                      domains: ["*"]
                      routes:
                        - name: {ROUTE}
                          match: {{ prefix: "/" }}
                          route:
                            cluster: upstream
                            rate_limits:
                              - actions:
                                  - generic_key: {{ descriptor_key: {ROUTE}, descriptor_value: {ROUTE} }}
                                  - request_headers: {{ header_name: x-user-id, descriptor_key: {RULE} }}
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: {DOMAIN}
                      enable_x_ratelimit_headers: DRAFT_VERSION_03
                      failure_mode_deny: true
                      timeout: 1s
                      rate_limit_service:
                        grpc_service: {{ envoy_grpc: {{ cluster_name: ratelimit_cluster }} }}
                        transport_api_version: V3
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: upstream
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: upstream
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {upstream} }} }} }}
    - name: ratelimit_cluster
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{ http2_protocol_options: {{}} }}
      load_assignment:
        cluster_name: ratelimit_cluster
        endpoints:
          - lb_endpoints:
              - endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {grpc} }} }} }}
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          common_tls_context:
            tls_params: {{ tls_maximum_protocol_version: TLSv1_3 }}
            tls_certificates:
              - certificate_chain: {{ filename: "{cert}" }}
                private_key: {{ filename: "{key}" }}
            validation_context:
              trusted_ca: {{ filename: "{ca}" }}
"#,
        cert = certs.envoy_cert.display(),
        key = certs.envoy_key.display(),
        ca = certs.ca_cert.display(),
    )
}

/// What the statistics must say of four requests by one user, three
/// allowed: (statistic, count).
const COUNTS: [(&str, f64); 3] = [
    ("total_hits", 4.0),
    ("within_limit", 3.0),
    ("over_limit", 1.0),
];

/// Envoy Gateway's series at PROMETHEUS_ADDR say [`COUNTS`], under its
/// mapping's labels.
async fn prometheus_counts(port: u16) {
    let labels = [
        ("domain", DOMAIN),
        ("key1", "first-route_first-route"),
        ("key2", RULE),
    ];
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (text, series) = common::prometheus::scrape(port).await;
        let value = |stat: &str| {
            let name = format!("ratelimit_service_rate_limit_{stat}");
            common::prometheus::value(&series, &name, &labels)
        };
        if COUNTS.iter().all(|(stat, count)| value(stat) == *count) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/metrics never said {COUNTS:?} for {labels:?}: {text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The statsd lines at `socket` add up to [`COUNTS`] under upstream's
/// names. Upstream flushes every 10 s (STATS_FLUSH_INTERVAL is not in
/// Envoy Gateway's environment): this waits for that flush.
fn statsd_counts(socket: UdpSocket) {
    let prefix = format!("ratelimit.service.rate_limit.{DOMAIN}.{ROUTE}_{ROUTE}.{RULE}");
    let mut sums = std::collections::HashMap::<String, f64>::new();
    let deadline = Instant::now() + Duration::from_secs(10) + PATIENCE;
    let mut buffer = [0u8; 65_536];
    let done = |sums: &std::collections::HashMap<String, f64>| {
        (COUNTS.iter()).all(|(stat, count)| sums.get(&format!("{prefix}.{stat}")) == Some(count))
    };
    while !done(&sums) {
        assert!(
            Instant::now() < deadline,
            "statsd never said {COUNTS:?} of {prefix}: {sums:?}"
        );
        let Ok(received) = socket.recv(&mut buffer) else {
            continue;
        };
        for line in String::from_utf8_lossy(&buffer[..received]).lines() {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            if let Some(("c", value)) = rest.split_once('|').map(|(value, kind)| (kind, value)) {
                let value: f64 = value.parse().expect("a counter's value");
                *sums.entry(name.to_owned()).or_default() += value;
            }
        }
    }
}

/// Starts ratelimitd as Envoy Gateway's pod would, and waits for the
/// kubelet's startup probe, then its readiness probe, to pass.
async fn start_as_envoy_gateway(release: Release, at: &Places) -> ServerProcess {
    let variables = environment(release, at);
    let pairs: Vec<(&str, &str)> = (variables.iter())
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    let grpc = SocketAddr::from(([127, 0, 0, 1], at.grpc));
    let http = SocketAddr::from(([127, 0, 0, 1], at.http));
    let mut server = ServerProcess::builder().env(&pairs).spawn_bare(grpc, http);
    let deadline = Instant::now() + PATIENCE;
    while !probe(at.http).await {
        if let Some(status) = server.exited() {
            panic!(
                "ratelimitd exited ({status}) before it was ready: {}",
                server.log()
            );
        }
        assert!(Instant::now() < deadline, "never ready: {}", server.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        probe(at.http).await,
        "the readiness probe after the startup probe"
    );
    server
}

/// What a run holds on to: the test's Redis, statsd receiver and Envoy
/// Gateway xDS server (what it saw, and where to publish), and where
/// ratelimitd finds them.
struct Setup {
    _dir: tempfile::TempDir,
    _redis: RedisServer,
    _xds: common::xds::Running,
    statsd: UdpSocket,
    seen: Arc<Mutex<Seen>>,
    publish: watch::Sender<(String, Vec<conf::RateLimitConfig>)>,
    at: Places,
}

/// Certificates, Redis, a statsd receiver, and Envoy Gateway's xDS
/// server, serving no rules until the test publishes them.
async fn set_up(release: Release) -> Setup {
    let dir = tempfile::tempdir().expect("a directory");
    let certs = write_envoy_gateway_certificates(&dir.path().join("certs"));
    let redis = RedisServer::start().await;
    let statsd = UdpSocket::bind("127.0.0.1:0").expect("a UDP port for statsd");
    statsd
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("a read timeout");
    let stats = match release {
        Release::Prometheus => free_port(),
        Release::Statsd => statsd.local_addr().expect("its address").port(),
    };
    let (listener, xds) = listen("127.0.0.1:0").await;
    let (publish, current) = watch::channel(("0".to_owned(), Vec::new()));
    let ads = TestAds::new(current);
    let seen = ads.seen.clone();
    let read = |path: &std::path::Path| std::fs::read(path).expect("read PEM");
    let identity = (
        read(&certs.envoy_gateway_cert),
        read(&certs.envoy_gateway_key),
    );
    let running = serve_mutual_tls(listener, ads, identity, read(&certs.ca_cert)).await;
    let runtime_root = dir.path().join("data");
    std::fs::create_dir_all(&runtime_root).expect("the runtime root");
    let at = Places {
        grpc: free_port(),
        http: free_port(),
        debug: free_port(),
        stats,
        redis: format!("127.0.0.1:{}", redis.port()),
        runtime_root: runtime_root.display().to_string(),
        certs,
        xds,
    };
    Setup {
        _dir: dir,
        _redis: redis,
        _xds: running,
        statsd,
        seen,
        publish,
        at,
    }
}

async fn run(release: Release) {
    // Every part bound (a `..` would drop Redis and the xDS server here).
    let Setup {
        _dir,
        _redis,
        _xds,
        statsd,
        seen,
        publish,
        at,
    } = set_up(release).await;
    let server = start_as_envoy_gateway(release, &at).await;
    let log = server.log();
    let ca = at.certs.rate_limit_dir.join("ca.crt");
    assert!(
        log.contains(&format!(
            "GRPC_SERVER_TLS_CA_CERT={} has no effect",
            ca.display()
        )) && log.contains("GRPC_CLIENT_TLS_CACERT"),
        "the start log says GRPC_SERVER_TLS_CA_CERT has no effect, and what would: {log}"
    );
    let tls_crt = CertificateDer::from_pem_file(at.certs.rate_limit_dir.join("tls.crt"))
        .expect("the tls.crt certificate");
    eventually("ratelimitd to accept the empty first snapshot", || async {
        acked(&seen, "0", &tls_crt)
    })
    .await;

    let upstream = start_upstream().await;
    let envoy = Envoy::launch(&envoy_config(at.grpc, upstream, &at.certs), &[]).await;
    let user = [("x-user-id", "alice")];
    // No rules yet: ratelimitd answers OK (Envoy fails closed, so this is
    // its answer over TLS), and counts nothing.
    assert_eq!(envoy.get("/", &user).await.status, 200, "before the rules");

    publish
        .send(("1".to_owned(), rules()))
        .expect("publish the rules");
    eventually("ratelimitd to accept the rules", || async {
        acked(&seen, "1", &tls_crt)
    })
    .await;
    assert!(probe(at.http).await, "still ready under the rules");
    common::fresh_minute().await;
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(envoy.get("/", &user).await.status);
    }
    assert_eq!(statuses, [200, 200, 200, 429], "3 a minute through Envoy");

    match release {
        Release::Prometheus => prometheus_counts(at.stats).await,
        Release::Statsd => tokio::task::spawn_blocking(move || statsd_counts(statsd))
            .await
            .expect("the statsd receiver"),
    }
    // Envoy Gateway gives the pod 300 s to stop; health turning 500 while
    // it does is tests/start_and_stop.rs's (it needs a shutdown delay to
    // be seen).
    let status = server.terminate().await;
    assert!(status.success(), "SIGTERM ends it cleanly: {status}");
    drop(envoy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_as_envoy_gateway_runs_upstream_with_prometheus() {
    run(Release::Prometheus).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_as_envoy_gateway_runs_upstream_with_a_statsd_exporter() {
    run(Release::Statsd).await;
}

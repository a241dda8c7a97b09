//! envoyproxy/ratelimit's statistics as upstream emits them, from the
//! binary started the upstream way: over statsd to a UDP socket of the
//! test's (names, types and values; EXTRA_TAGS in the name and as
//! DogStatsD tags; the flush interval), and through Envoy Gateway's
//! statsd_exporter mapping (`tests/fixtures/envoy_gateway/`) both as
//! ratelimitd serves it (USE_PROMETHEUS with PROMETHEUS_MAPPER_YAML) and
//! applied here to the names received over statsd: every series that
//! mapping names arrives, with its labels.

use crate::common;

use std::collections::HashMap;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::prometheus::scrape;
use common::rls::descriptor;
use common::{PATIENCE, RedisServer, ServerProcess, eventually, free_port};
use ratelimitd::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimitd::stats::mapper::{Mapped, Mapping, StatKind};

const RULES: &str = "
domain: d
descriptors:
  - key: k1
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: quiet
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: hour, requests_per_unit: 2}
      - key: s
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 1}
  - key: detail
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
";

const EG_MAPPING: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/envoy_gateway/statsd_conf.yaml"
);

/// The rules directory and Redis, and upstream's variables for them.
struct Setup {
    redis: RedisServer,
    root: tempfile::TempDir,
}

impl Setup {
    async fn new() -> Self {
        let root = tempfile::tempdir().expect("a runtime root");
        let config = root.path().join("rl/config");
        std::fs::create_dir_all(&config).expect("config directory");
        std::fs::write(config.join("limits.yaml"), RULES).expect("rules");
        Self {
            redis: RedisServer::start().await,
            root,
        }
    }

    async fn start(&self, more: &[(&str, &str)]) -> ServerProcess {
        let redis = format!("127.0.0.1:{}", self.redis.port());
        let root = self.root.path().to_string_lossy().into_owned();
        let mut environment = vec![
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", redis.as_str()),
            ("RUNTIME_ROOT", root.as_str()),
            ("RUNTIME_SUBDIRECTORY", "rl"),
            ("RATELIMITD_CONFIG_POLL_INTERVAL", "50ms"),
        ];
        environment.extend_from_slice(more);
        ServerProcess::builder()
            .env(&environment)
            .upstream_way()
            .start()
            .await
    }

    /// A broken rules file (a load error when read), to remove once
    /// that is counted (a load success).
    fn break_the_rules(&self) -> std::path::PathBuf {
        let bad = self.root.path().join("rl/config/bad.yaml");
        std::fs::write(&bad, "domain: [").expect("a bad file");
        bad
    }
}

fn ask(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: vec![descriptor(entries)],
        hits_addend: 1,
    }
}

/// Traffic that moves every statistic the mapping names.
async fn exercise(server: &ServerProcess) {
    let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
    let mut call = async |request| {
        let _ = client.should_rate_limit(request).await;
    };
    for _ in 0..6 {
        call(ask("d", &[("k1", "v")])).await;
    }
    for _ in 0..3 {
        call(ask("d", &[("a", "x"), ("b", "y")])).await;
        call(ask("d", &[("quiet", "q")])).await;
    }
    for _ in 0..2 {
        call(ask("d", &[("a", "x"), ("s", "z")])).await;
    }
    call(ask("d", &[("detail", "unspecified_value")])).await;
    call(ask("nowhere", &[("k", "v")])).await;
    // Refused: an empty domain is upstream's service error.
    call(ask("", &[("k", "v")])).await;
}

/// A series: its name, labels, and value (`None`: only present).
type Expected = (&'static str, Vec<(&'static str, &'static str)>, Option<f64>);

/// What Envoy Gateway's mapping makes of [`exercise`]'s statistics:
/// series name, labels, value (counters; `None`: only present).
fn expected() -> Vec<Expected> {
    let one = |key1| vec![("domain", "d"), ("key1", key1)];
    let two = vec![("domain", "d"), ("key1", "a_x"), ("key2", "b")];
    vec![
        (
            "ratelimit_service_rate_limit_total_hits",
            one("k1"),
            Some(6.0),
        ),
        (
            "ratelimit_service_rate_limit_within_limit",
            one("k1"),
            Some(5.0),
        ),
        (
            "ratelimit_service_rate_limit_near_limit",
            one("k1"),
            Some(1.0),
        ),
        (
            "ratelimit_service_rate_limit_over_limit",
            one("k1"),
            Some(1.0),
        ),
        (
            "ratelimit_service_rate_limit_shadow_mode",
            one("quiet"),
            Some(2.0),
        ),
        (
            "ratelimit_service_rate_limit_total_hits",
            two.clone(),
            Some(3.0),
        ),
        (
            "ratelimit_service_rate_limit_within_limit",
            two.clone(),
            Some(2.0),
        ),
        (
            "ratelimit_service_rate_limit_near_limit",
            two.clone(),
            Some(1.0),
        ),
        ("ratelimit_service_rate_limit_over_limit", two, Some(1.0)),
        (
            "ratelimit_service_rate_limit_shadow_mode",
            vec![("domain", "d"), ("key1", "a_x"), ("key2", "s")],
            Some(1.0),
        ),
        (
            "ratelimit_service_rate_limit_total_hits",
            one("detail_unspecified_value"),
            Some(1.0),
        ),
        (
            "ratelimit_service_should_rate_limit_error",
            vec![("err_type", "service_error")],
            Some(1.0),
        ),
        (
            "ratelimit_service_total_requests",
            vec![("grpc_method", "ShouldRateLimit")],
            Some(17.0),
        ),
        (
            "ratelimit_service_response_time_seconds_count",
            vec![("grpc_method", "ShouldRateLimit")],
            Some(17.0),
        ),
        ("ratelimit_service_config_load_success", vec![], Some(2.0)),
        ("ratelimit_service_config_load_error", vec![], Some(1.0)),
    ]
}

/// Statistics received over statsd: counters summed, gauges last, timers
/// counted.
#[derive(Debug, Default)]
struct Received {
    counters: HashMap<String, f64>,
    gauges: HashMap<String, f64>,
    timers: HashMap<String, f64>,
    lines: Vec<String>,
}

impl Received {
    fn take(&mut self, datagram: &str) {
        for line in datagram.lines().filter(|line| !line.is_empty()) {
            self.lines.push(line.to_owned());
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            let mut fields = rest.split('|');
            let value: f64 = fields
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN);
            match fields.next() {
                Some("c") => *self.counters.entry(name.into()).or_default() += value,
                Some("g") => {
                    self.gauges.insert(name.into(), value);
                }
                Some("ms") => *self.timers.entry(name.into()).or_default() += 1.0,
                _ => panic!("not a statsd line: {line}"),
            }
        }
    }

    /// Envoy Gateway's mapping applied to the names received.
    fn mapped(&self, mapping: &Mapping) -> HashMap<String, f64> {
        let mut series = HashMap::new();
        let kinds = [
            (&self.counters, StatKind::Counter, ""),
            (&self.gauges, StatKind::Gauge, ""),
            (&self.timers, StatKind::Timer, "_count"),
        ];
        for (stats, kind, suffix) in kinds {
            for (name, value) in stats {
                let Mapped::Series(mapped) = mapping.map(name, kind) else {
                    continue;
                };
                let labels: Vec<String> = (mapped.labels.iter())
                    .map(|(k, v)| format!("{k}=\"{v}\""))
                    .collect();
                let key = format!("{}{suffix}{{{}}}", mapped.name, labels.join(","));
                *series.entry(key).or_default() += value;
            }
        }
        series
    }
}

/// Reads datagrams into `received` until `done` holds of it.
fn receive_until(socket: &UdpSocket, received: &mut Received, done: impl Fn(&Received) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    let mut buffer = [0u8; 65_536];
    while !done(received) {
        assert!(
            Instant::now() < deadline,
            "statsd never said it all: {received:?}"
        );
        if let Ok(n) = socket.recv(&mut buffer) {
            received.take(&String::from_utf8_lossy(&buffer[..n]));
        }
    }
}

fn udp() -> (UdpSocket, String) {
    let socket = UdpSocket::bind("127.0.0.1:0").expect("a UDP port");
    socket
        .set_read_timeout(Some(Duration::from_millis(200)))
        .expect("a read timeout");
    let port = socket.local_addr().expect("its address").port().to_string();
    (socket, port)
}

fn missing(series: &HashMap<String, f64>) -> Vec<String> {
    expected()
        .into_iter()
        .filter(|(name, labels, value)| {
            let got = common::prometheus::value(series, name, labels);
            let present = series
                .keys()
                .any(|key| key.starts_with(&format!("{name}{{")) || key == name);
            !present || value.is_some_and(|wanted| got != wanted)
        })
        .map(|(name, labels, value)| format!("{name}{labels:?} = {value:?}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statsd_carries_upstreams_names_and_eg_mapping_makes_its_series() {
    let setup = Setup::new().await;
    let (socket, port) = udp();
    let server = setup
        .start(&[
            ("STATSD_HOST", "127.0.0.1"),
            ("STATSD_PORT", &port),
            ("STATS_FLUSH_INTERVAL", "100ms"),
        ])
        .await;
    exercise(&server).await;
    let mut received = Received::default();
    let bad = setup.break_the_rules();
    receive_until(&socket, &mut received, |r| {
        r.counters
            .contains_key("ratelimit.service.config_load_error")
    });
    std::fs::remove_file(bad).expect("remove the bad file");
    let mapping = Mapping::parse(&std::fs::read_to_string(EG_MAPPING).unwrap()).unwrap();
    receive_until(&socket, &mut received, |r| {
        missing(&r.mapped(&mapping)).is_empty()
    });
    let counter = |name: &str| received.counters.get(name).copied();
    let rule = "ratelimit.service.rate_limit.d";
    assert_eq!(counter(&format!("{rule}.k1.total_hits")), Some(6.0));
    assert_eq!(counter(&format!("{rule}.a_x.b.over_limit")), Some(1.0));
    assert_eq!(
        counter(&format!("{rule}.detail_unspecified_value.total_hits")),
        Some(1.0)
    );
    assert_eq!(
        counter("ratelimit.service.rate_limit.nowhere.domain_not_found"),
        Some(1.0)
    );
    assert_eq!(
        counter("ratelimit_server.ShouldRateLimit.total_requests"),
        Some(17.0)
    );
    assert_eq!(counter("ratelimit.redis_pool.cx_total"), Some(1.0));
    assert_eq!(
        received.gauges.get("ratelimit.redis_pool.cx_active"),
        Some(&1.0)
    );
    assert!(
        received.lines.iter().any(|l| l
            .starts_with("ratelimit_server.ShouldRateLimit.response_time:")
            && l.ends_with("|ms")),
        "{:?}",
        received.lines
    );
    assert!(
        counter(&format!("{rule}.k1.shadow_mode")).is_none(),
        "a zero change is not sent"
    );
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extra_tags_ride_in_the_name_or_as_dogstatsd_tags_every_flush() {
    let setup = Setup::new().await;
    let (socket, port) = udp();
    let statsd = [
        ("STATSD_HOST", "127.0.0.1"),
        ("STATSD_PORT", port.as_str()),
        ("STATS_FLUSH_INTERVAL", "100ms"),
        ("EXTRA_TAGS", "cluster:eu.1,app:rl"),
    ];
    let server = setup.start(&statsd).await;
    exercise(&server).await;
    let mut received = Received::default();
    let tagged = "ratelimit.service.rate_limit.d.k1.total_hits.__app=rl.__cluster=eu_1";
    receive_until(&socket, &mut received, |r| {
        r.counters.get(tagged) == Some(&6.0)
    });
    // Gauges go every flush: several within a second at 100 ms.
    let gauge = |line: &&String| {
        line.starts_with("ratelimit.redis_pool.cx_active.__app=rl.__cluster=eu_1:")
            && line.ends_with("|g")
    };
    let started = Instant::now();
    let before = received.lines.iter().filter(gauge).count();
    receive_until(&socket, &mut received, |r| {
        r.lines.iter().filter(gauge).count() >= before + 3
    });
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "flushed every 100 ms"
    );
    server.terminate().await;

    let mut dog = statsd.to_vec();
    dog.extend([("USE_STATSD", "false"), ("USE_DOG_STATSD", "true")]);
    let server = setup.start(&dog).await;
    exercise(&server).await;
    let mut received = Received::default();
    // The six hits may straddle a flush: counted over every line, each
    // tagged in DogStatsD's way.
    let name = "ratelimit.service.rate_limit.d.k1.total_hits";
    receive_until(&socket, &mut received, |r| {
        r.counters.get(name) == Some(&6.0)
    });
    let lines: Vec<&String> = (received.lines.iter())
        .filter(|line| line.starts_with(&format!("{name}:")))
        .collect();
    assert!(
        !lines.is_empty()
            && lines
                .iter()
                .all(|line| line.ends_with("|c|#app:rl,cluster:eu_1")),
        "{lines:?}"
    );
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_serves_every_series_of_envoy_gateways_mapping() {
    let setup = Setup::new().await;
    let metrics = free_port();
    let listen = format!("127.0.0.1:{metrics}");
    let server = setup
        .start(&[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", &listen),
            ("PROMETHEUS_MAPPER_YAML", EG_MAPPING),
        ])
        .await;
    exercise(&server).await;
    let bad = setup.break_the_rules();
    eventually("the bad reload is counted", async || {
        let (_, series) = scrape(metrics).await;
        common::prometheus::value(&series, "ratelimit_service_config_load_error", &[]) > 0.0
    })
    .await;
    std::fs::remove_file(bad).expect("remove the bad file");
    eventually("every series of the mapping", async || {
        missing(&scrape(metrics).await.1).is_empty()
    })
    .await;
    let (text, series) = scrape(metrics).await;
    assert!(
        missing(&series).is_empty(),
        "{:?}\n{text}",
        missing(&series)
    );
    // Unmapped, escaped as statsd_exporter escapes them.
    assert!(
        text.contains("ratelimit_service_rate_limit_nowhere_domain_not_found 1"),
        "{text}"
    );
    assert!(text.contains("ratelimit_redis_pool_cx_active "), "{text}");
    server.terminate().await;
}

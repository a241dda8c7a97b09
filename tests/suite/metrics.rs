//! The Prometheus endpoint: scraped and parsed, it counts decisions by API,
//! algorithm and outcome, policy decisions, local-cache hits, Redis command latency, shadow
//! decisions, config reloads, pool connections and calls in flight; and it
//! never names a caller's key. Its error counters are there at 0 from the
//! start, so that `rate()` sees the first error.

use crate::common;

use std::time::Duration;

use common::prometheus::{self, scrape, value};
use common::rls::{descriptor, with_hits};
use common::{RedisServer, ServerProcess, check, fixed_window, free_port, token_bucket};
use ratelimitd::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

/// ratelimitd on `redis` with the metrics endpoint on a port of its own and
/// the rules `config` in a file of a temporary directory, plus `flags`.
struct Metered {
    server: ServerProcess,
    port: u16,
    /// The rules file, for a test to rewrite.
    config: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Metered {
    async fn start(redis: &RedisServer, config: &str, flags: &[&str]) -> Self {
        let url = redis.url();
        let port = free_port();
        let listen = format!("127.0.0.1:{port}");
        let dir = tempfile::tempdir().expect("config directory");
        let path = dir.path().join("limits.yaml");
        std::fs::write(&path, config).expect("write the rules");
        let path_text = path.to_string_lossy().into_owned();
        let mut all = vec![
            "--redis-url",
            &url,
            "--metrics-listen",
            &listen,
            "--config",
            &path_text,
        ];
        all.extend_from_slice(flags);
        let server = ServerProcess::builder().flags(&all).start().await;
        Self {
            server,
            port,
            config: path,
            _dir: dir,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_counts_what_happened_and_names_no_caller() {
    let redis = RedisServer::start().await;
    let shadowed = "domain: metered\ndescriptors:\n  - key: k\n    shadow_mode: true\n    \
                    rate_limit: {unit: hour, requests_per_unit: 1}\npolicies:\n  \
                    metered-plan:\n    - {per: 1h, limit: 1, algorithm: gcra}\n";
    let metered = Metered::start(
        &redis,
        shadowed,
        &[
            "--config-poll-interval",
            "50ms",
            "--health-interval",
            "100ms",
        ],
    )
    .await;
    let (server, port, limits) = (&metered.server, metered.port, &metered.config);

    let mut client = server.client().await;
    let limit = fixed_window(2, Duration::from_secs(60));
    // Two allowed, one denied by Redis, two denied from the local cache.
    for _ in 0..5 {
        check(&mut client, "secret-caller-key", &limit, None).await;
    }
    check(&mut client, "another-caller", &token_bucket(5, 1.0), None).await;
    // A policy: one allowed, one denied.
    for _ in 0..2 {
        let ask = ratelimitd::pb::ratelimitd::v1::CheckLimitRequest {
            key: "a-planned-caller".into(),
            policy: "metered-plan".into(),
            ..Default::default()
        };
        client.check_limit(ask).await.expect("a policy decision");
    }
    let mut envoy = RateLimitServiceClient::new(common::channel(server.address).await);
    let over = with_hits(descriptor(&[("k", "v")]), 2);
    envoy
        .should_rate_limit(RateLimitRequest {
            domain: "metered".into(),
            descriptors: vec![over],
            hits_addend: 0,
        })
        .await
        .expect("an answer");
    std::fs::write(limits, "domain: metered\n").expect("rewrite");
    std::fs::write(limits, "{{ broken").expect("rewrite");

    common::eventually("the reloads to be counted", || async {
        let (_, series) = scrape(port).await;
        value(
            &series,
            "ratelimitd_config_reloads_total",
            &[("result", "failure")],
        ) >= 1.0
    })
    .await;
    let (text, series) = scrape(port).await;
    let decisions = "ratelimitd_decisions_total";
    let check_limit = ("api", "check_limit");
    assert_eq!(
        value(
            &series,
            decisions,
            &[
                check_limit,
                ("algorithm", "fixed_window"),
                ("outcome", "allowed")
            ]
        ),
        2.0
    );
    assert_eq!(
        value(
            &series,
            decisions,
            &[
                check_limit,
                ("algorithm", "fixed_window"),
                ("outcome", "denied")
            ]
        ),
        3.0
    );
    assert_eq!(
        value(&series, "ratelimitd_local_cache_hits_total", &[]),
        2.0
    );
    assert_eq!(
        value(
            &series,
            decisions,
            &[
                check_limit,
                ("algorithm", "token_bucket"),
                ("outcome", "allowed")
            ]
        ),
        1.0
    );
    assert_eq!(
        value(
            &series,
            decisions,
            &[("api", "envoy"), ("outcome", "denied")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &series,
            "ratelimitd_shadow_decisions_total",
            &[("domain", "metered")]
        ),
        1.0
    );
    for outcome in ["allowed", "denied"] {
        let labels = [("policy", "metered-plan"), ("outcome", outcome)];
        let policy = value(&series, "ratelimitd_policy_decisions_total", &labels);
        assert_eq!(policy, 1.0, "{outcome}");
        let labels = [check_limit, ("algorithm", "gcra"), ("outcome", outcome)];
        assert_eq!(value(&series, decisions, &labels), 1.0, "{outcome}");
    }
    assert_eq!(
        value(&series, "ratelimitd_redis_command_seconds_count", &[]),
        7.0,
        "one script per decision: {text}"
    );
    assert!(
        series
            .keys()
            .any(|key| key.starts_with("ratelimitd_redis_pool_connections"))
    );
    assert!(
        series
            .keys()
            .any(|key| key.starts_with("ratelimitd_requests_in_flight"))
    );
    assert!(!text.contains("secret-caller-key") && !text.contains("another-caller"));

    // Redis gone: its errors are counted.
    drop(redis);
    common::eventually("Redis errors to be counted", || async {
        let _ = server
            .client()
            .await
            .check_limit(common::request(
                "k",
                fixed_window(2, Duration::from_secs(60)),
                None,
            ))
            .await;
        let (_, series) = scrape(port).await;
        value(&series, "ratelimitd_redis_errors_total", &[]) >= 1.0
    })
    .await;
}

/// The series with `name` and every `labels` pair, asserted to be there.
fn present(
    series: &std::collections::HashMap<String, f64>,
    text: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> Vec<f64> {
    let found: Vec<f64> = prometheus::matching(series, name, labels).collect();
    assert!(!found.is_empty(), "{name} {labels:?} exported: {text}");
    found
}

#[tokio::test]
async fn error_counters_are_exported_at_zero_from_the_start() {
    let redis = RedisServer::start().await;
    let text = "domain: edge\nquota_buckets:\n  - bucket_id: {name: api}\n    \
                rate_limit: {unit: second, requests_per_unit: 100}\npolicies:\n  \
                plan:\n    - {per: 1h, limit: 1, algorithm: gcra}\n";
    let metered = Metered::start(&redis, text, &[]).await;
    let port = metered.port;
    let (text, series) = scrape(port).await;
    let mut zeros: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("ratelimitd_quota_degraded_total", vec![("domain", "edge")]),
        (
            "ratelimitd_quota_assignments_total",
            vec![("domain", "edge"), ("kind", "deny_all")],
        ),
        (
            "ratelimitd_config_reloads_total",
            vec![("result", "failure")],
        ),
        (
            "ratelimitd_config_reloads_total",
            vec![("result", "success")],
        ),
        ("ratelimitd_statsd_dropped_lines_total", vec![]),
        ("ratelimitd_accept_errors_total", vec![]),
        ("ratelimitd_memory_evictions_total", vec![]),
        ("ratelimitd_local_cache_hits_total", vec![]),
        (
            "ratelimitd_quota_reports_ignored_total",
            vec![("reason", "too_many_buckets")],
        ),
        (
            "ratelimitd_policy_decisions_total",
            vec![("policy", "plan"), ("outcome", "degraded")],
        ),
        (
            "ratelimitd_decisions_total",
            vec![
                ("api", "envoy"),
                ("algorithm", "sliding_window_counter"),
                ("outcome", "degraded"),
            ],
        ),
    ];
    for kind in ["timeout", "unavailable", "circuit_open", "reply", "config"] {
        zeros.push((
            "ratelimitd_redis_errors_total",
            vec![("kind", kind), ("store", "main")],
        ));
    }
    for (name, labels) in &zeros {
        let values = present(&series, &text, name, labels);
        assert!(
            values.iter().all(|value| *value == 0.0),
            "{name} {labels:?} at 0: {text}"
        );
    }
    metered.server.terminate().await;
}

/// envoyproxy/ratelimit's statistics under its Prometheus names (its
/// default statsd mapping), so existing dashboards and alerts keep working:
/// per rule, labelled by domain and the rule's keys in the configuration
/// (never a request's values), hits split as upstream splits them.
#[tokio::test]
async fn upstreams_statistics_under_its_names() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let fixtures = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/ratelimit/example2.yaml"
    );
    let server = ServerProcess::builder()
        .flags(&["--metrics-listen", &listen, "--config", fixtures])
        .start()
        .await;
    let mut envoy = RateLimitServiceClient::new(common::channel(server.address).await);
    let ask = |hits| RateLimitRequest {
        domain: "messaging".into(),
        descriptors: vec![with_hits(
            descriptor(&[("message_type", "marketing"), ("to_number", "2061234567")]),
            hits,
        )],
        hits_addend: 0,
    };
    // A limit of 5 (near above 4): 4 within, then 3 more: 1 near, 2 over.
    for hits in [4, 3] {
        envoy.should_rate_limit(ask(hits)).await.expect("an answer");
    }
    let (text, series) = scrape(port).await;
    let rule = [
        ("domain", "messaging"),
        ("key1", "message_type_marketing"),
        ("key2", "to_number"),
    ];
    for (stat, expected) in [
        ("total_hits", 7.0),
        ("within_limit", 4.0),
        ("near_limit", 1.0),
        ("over_limit", 2.0),
        ("shadow_mode", 0.0),
    ] {
        let name = format!("ratelimit_service_rate_limit_{stat}");
        assert_eq!(value(&series, &name, &rule), expected, "{name}: {text}");
    }
    assert_eq!(
        value(
            &series,
            "ratelimit_service_total_requests",
            &[("grpc_method", "ShouldRateLimit")]
        ),
        2.0
    );
    assert_eq!(
        value(&series, "ratelimit_service_config_load_success", &[]),
        1.0
    );
    assert!(
        !text.contains("2061234567"),
        "no request value in any label"
    );
    server.terminate().await;
}

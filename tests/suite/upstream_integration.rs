//! envoyproxy/ratelimit's own integration test (`test/integration/
//! integration_test.go`, its `testBasicBaseConfig`), ported: ratelimitd
//! started the upstream way, on upstream's integration configuration
//! unchanged (`tests/fixtures/upstream_integration/`, or the same rules
//! from an xDS server), answering every assertion upstream makes about
//! statuses, limits, remaining counts and statistics (under their
//! Prometheus names; and once over statsd, USE_STATSD=true, upstream's
//! default sink, from the datagrams a receiver of the test's gets, where
//! upstream's test reads its in-process statistics), with GRPC_PORT, PORT
//! and DEBUG_PORT set as upstream's test sets them (free loopback ports),
//! in the variants upstream runs it: both counting
//! modes, with the local cache (its `_local` keys), with a key prefix,
//! behind a password, over TLS (upstream's pinned self-signed certificate
//! recipe), on a Redis Cluster, on Sentinel, with the rules from xDS, and
//! each `WithPerSecondRedis` (REDIS_PERSECOND: the second-unit rules on a
//! second Redis of the same kind). Upstream's memcache variants have no
//! counterpart (BACKEND_TYPE=memcache stops ratelimitd's start, by name).
//! The local-cache runs that stop counting over the limit (where the cache
//! answers) also read upstream's `ratelimit.localcache` gauges, over
//! Prometheus and over statsd: hits, and lookups that are hits plus misses.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::prometheus;
use common::redis::{ClientCertificates, RedisCluster, RedisSentinel, Security, SentinelPassword};
use common::rls::{descriptor, with_hits};
use common::tls::self_signed_ca_certificate;
use common::{RedisServer, ServerProcess, free_port};
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimitd::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratelimitd::pb::ratelimit::config::ratelimit::v3 as conf;
use tonic::transport::Channel;

/// How upstream's test varies its settings.
#[derive(Clone, Copy, Default)]
struct Variant {
    local_cache: bool,
    stop_increment: bool,
    /// Statistics over statsd (USE_STATSD, upstream's default sink)
    /// rather than Prometheus.
    statsd: bool,
}

/// Upstream's `NewRateLimitRequest(domain, descriptors, hitsAddend)`.
fn request(domain: &str, descriptors: &[&[(&str, &str)]], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors
            .iter()
            .map(|entries| descriptor(entries))
            .collect(),
        hits_addend: hits,
    }
}

/// A status as upstream's `newDescriptorStatus` compares it (the reset
/// time is taken from the answer, as upstream does).
fn limited(status: &DescriptorStatus) -> (Code, u32, Unit, u32) {
    let limit = status.current_limit.as_ref().expect("a current limit");
    (
        status.code(),
        limit.requests_per_unit,
        limit.unit(),
        status.limit_remaining,
    )
}

/// Upstream's `getCacheKey`: its configuration has a `_local` twin of each
/// key for the local-cache runs.
fn key(name: &str, variant: Variant) -> String {
    if variant.local_cache {
        format!("{name}_local")
    } else {
        name.to_owned()
    }
}

/// Where the test reads upstream's per-rule counters (upstream runs one
/// sink at a time).
enum Stats {
    /// USE_PROMETHEUS on this port: read as asked.
    Prometheus(u16),
    /// USE_STATSD to this receiver: counters summed as they arrive.
    Statsd(StatsdReceiver),
}

impl Stats {
    /// Upstream's variables that send the statistics here.
    fn environment(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::Prometheus(port) => vec![
                ("USE_STATSD", "false".into()),
                ("USE_PROMETHEUS", "true".into()),
                ("PROMETHEUS_ADDR", format!("127.0.0.1:{port}")),
            ],
            Self::Statsd(receiver) => vec![
                ("USE_STATSD", "true".into()),
                ("STATSD_HOST", "127.0.0.1".into()),
                ("STATSD_PORT", receiver.port.to_string()),
                ("STATS_FLUSH_INTERVAL", "20ms".into()),
            ],
        }
    }

    /// Asserts that the per-rule counter `stat` says `expected` (under
    /// upstream's Prometheus name; over statsd, once flushes have brought
    /// that much, within the deadline, and not more).
    async fn assert(&self, stat: &str, domain: &str, key1: &str, expected: u64, at: &str) {
        let got = match self {
            Self::Prometheus(port) => {
                let name = format!("ratelimit_service_rate_limit_{stat}");
                prometheus::count(*port, &name, &[("domain", domain), ("key1", key1)]).await
            }
            Self::Statsd(receiver) => {
                let name = format!("ratelimit.service.rate_limit.{domain}.{key1}.{stat}");
                let deadline = Instant::now() + common::PATIENCE;
                while receiver.count(&name) < expected && Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                receiver.count(&name)
            }
        };
        assert_eq!(got, expected, "{domain}.{key1}.{stat} at {at}");
    }

    /// Upstream's local-cache gauges (`ratelimit.localcache.<stat>`, under
    /// the default mapping's name for an unmapped statistic), once the
    /// cache has answered from a denial and they agree with each other:
    /// lookups are hits and misses, and entries are held.
    async fn assert_local_cache_gauges(&self) {
        let stats = ["hitCount", "missCount", "lookupCount", "entryCount"];
        let deadline = Instant::now() + common::PATIENCE;
        let last = loop {
            let values: Vec<u64> = match self {
                Self::Prometheus(port) => {
                    let (_, series) = prometheus::scrape(*port).await;
                    (stats.iter())
                        .map(|stat| {
                            let name = format!("ratelimit_localcache_{stat}");
                            prometheus::value(&series, &name, &[]) as u64
                        })
                        .collect()
                }
                Self::Statsd(receiver) => (stats.iter())
                    .map(|stat| receiver.gauge(&format!("ratelimit.localcache.{stat}")))
                    .collect(),
            };
            let [hits, misses, lookups, entries] = values[..] else {
                unreachable!("four gauges")
            };
            if hits > 0 && misses > 0 && lookups == hits + misses && entries > 0 {
                return;
            }
            if Instant::now() >= deadline {
                break values;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        panic!("local-cache gauges {stats:?}: {last:?}");
    }
}

/// A statsd receiver on a loopback UDP port: counters (`name:n|c`) summed
/// by name, gauges (`name:n|g`) as last sent.
struct StatsdReceiver {
    port: u16,
    counters: Arc<Mutex<HashMap<String, u64>>>,
    gauges: Arc<Mutex<HashMap<String, u64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StatsdReceiver {
    async fn start() -> Self {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0")
            .await
            .expect("a UDP port");
        let port = socket.local_addr().expect("its address").port();
        let counters = Arc::new(Mutex::new(HashMap::new()));
        let gauges = Arc::new(Mutex::new(HashMap::new()));
        let (into, gauges_into) = (counters.clone(), gauges.clone());
        let task = tokio::spawn(async move {
            let mut buffer = vec![0u8; 65_536];
            while let Ok(n) = socket.recv(&mut buffer).await {
                let datagram = String::from_utf8_lossy(&buffer[..n]).into_owned();
                let mut counters = into.lock().expect("not poisoned");
                let mut gauges = gauges_into.lock().expect("not poisoned");
                for line in datagram.lines() {
                    let Some((name, rest)) = line.split_once(':') else {
                        continue;
                    };
                    if let Some(value) = rest.strip_suffix("|c") {
                        let value: u64 = value.parse().expect("a whole counter");
                        *counters.entry(name.to_owned()).or_default() += value;
                    } else if let Some(value) = rest.strip_suffix("|g") {
                        let value: u64 = value.parse().expect("a whole gauge");
                        gauges.insert(name.to_owned(), value);
                    }
                }
            }
        });
        Self {
            port,
            counters,
            gauges,
            task,
        }
    }

    fn gauge(&self, name: &str) -> u64 {
        let gauges = self.gauges.lock().expect("not poisoned");
        gauges.get(name).copied().unwrap_or(0)
    }

    fn count(&self, name: &str) -> u64 {
        let counters = self.counters.lock().expect("not poisoned");
        counters.get(name).copied().unwrap_or(0)
    }
}

impl Drop for StatsdReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A value no earlier run used, as upstream's random key.
fn fresh_value() -> String {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos()
        .to_string()
}

/// ratelimitd started with upstream's variables for this Redis, plus
/// the statistics' sink and the variant's settings.
async fn start(redis: &[(&str, String)], variant: Variant, stats: &Stats) -> ServerProcess {
    let root = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/upstream_integration"
    );
    let mut environment: Vec<(&str, String)> = vec![
        ("RUNTIME_ROOT", root.into()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_APPDIRECTORY", "config".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
    ];
    environment.extend(stats.environment());
    environment.extend(redis.iter().cloned());
    if variant.local_cache {
        environment.push(("LOCAL_CACHE_SIZE_IN_BYTES", "1000".into()));
    }
    if variant.stop_increment {
        environment.push(("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true".into()));
    }
    let environment: Vec<(&str, &str)> = environment
        .iter()
        .map(|(name, value)| (*name, value.as_str()))
        .collect();
    ServerProcess::builder()
        .env(&environment)
        .upstream_way()
        .start()
        .await
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    request: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(request)
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}

/// Waits until the rules are in force (from xDS they arrive after the
/// start): a look at a rule no assertion counts.
async fn await_rules(client: &RateLimitServiceClient<Channel>) {
    common::eventually("the rules to be in force", || {
        let mut client = client.clone();
        async move {
            let mut look = request("basic", &[&[("one_per_minute", "probe")]], 1);
            look.descriptors[0] = with_hits(look.descriptors[0].clone(), 0);
            let response = ask(&mut client, look).await;
            response.statuses[0].current_limit.is_some()
        }
    })
    .await;
}

/// `testBasicBaseConfig`, assertion by assertion.
async fn basic_base_config(redis: &[(&str, String)], variant: Variant) {
    let stats = if variant.statsd {
        Stats::Statsd(StatsdReceiver::start().await)
    } else {
        Stats::Prometheus(free_port())
    };
    let server = start(redis, variant, &stats).await;
    let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
    await_rules(&client).await;

    // A domain nobody configured: OK, no limit.
    let response = ask(
        &mut client,
        request("foo", &[&[(&key("hello", variant), "world")]], 1),
    )
    .await;
    assert_eq!(response.overall_code(), Code::Ok);
    assert_eq!(response.statuses.len(), 1);
    assert_eq!(response.statuses[0].code(), Code::Ok);
    assert!(response.statuses[0].current_limit.is_none());
    assert_eq!(response.statuses[0].limit_remaining, 0);

    // 50 a second: one hit leaves 49.
    let key1 = key("key1", variant);
    let response = ask(&mut client, request("basic", &[&[(&key1, "foo")]], 1)).await;
    assert_eq!(response.overall_code(), Code::Ok);
    assert_eq!(
        limited(&response.statuses[0]),
        (Code::Ok, 50, Unit::Second, 49)
    );
    stats
        .assert("total_hits", "basic", &key1, 1, "one hit")
        .await;

    // 20 a minute on a fresh value: 20 pass, then over.
    common::fresh_minute().await;
    let key2 = key("key2", variant);
    let value = fresh_value();
    for i in 0..25u32 {
        let response = ask(&mut client, request("another", &[&[(&key2, &value)]], 1)).await;
        let (code, remaining) = if i >= 20 {
            (Code::OverLimit, 0)
        } else {
            (Code::Ok, 19 - i)
        };
        assert_eq!(response.overall_code(), code, "hit {i}");
        assert_eq!(
            limited(&response.statuses[0]),
            (code, 20, Unit::Minute, remaining),
            "hit {i}"
        );
        let at = format!("hit {i}");
        let hits = u64::from(i) + 1;
        stats
            .assert("total_hits", "another", &key2, hits, &at)
            .await;
        let over = if i >= 20 { u64::from(i) - 19 } else { 0 };
        stats
            .assert("over_limit", "another", &key2, over, &at)
            .await;
    }

    // Two keys at once: key2 (20 a minute) and key3 (10 an hour).
    let key3 = key("key3", variant);
    let value = fresh_value();
    for i in 0..15u32 {
        let response = ask(
            &mut client,
            request("another", &[&[(&key2, &value)], &[(&key3, &value)]], 1),
        )
        .await;
        let mut code = Code::Ok;
        let mut remaining_1 = 19 - i;
        let mut remaining_2 = 9u32.saturating_sub(i);
        if i >= 10 {
            code = Code::OverLimit;
            remaining_2 = 0;
            // Upstream stops counting key2 once the request is over the
            // limit with STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT; so does
            // ratelimitd (a denied request spends nothing).
            if variant.stop_increment {
                remaining_1 = 10;
            }
        }
        assert_eq!(response.overall_code(), code, "pair {i}");
        assert_eq!(
            limited(&response.statuses[0]),
            (Code::Ok, 20, Unit::Minute, remaining_1),
            "pair {i}"
        );
        assert_eq!(
            limited(&response.statuses[1]),
            (code, 10, Unit::Hour, remaining_2),
            "pair {i}"
        );
        let at = format!("pair {i}");
        let hits = u64::from(i) + 26;
        stats
            .assert("total_hits", "another", &key2, hits, &at)
            .await;
        stats.assert("over_limit", "another", &key2, 5, &at).await;
        let hits = u64::from(i) + 1;
        stats
            .assert("total_hits", "another", &key3, hits, &at)
            .await;
        let over = if i >= 10 { u64::from(i) - 9 } else { 0 };
        stats
            .assert("over_limit", "another", &key3, over, &at)
            .await;
    }

    // DurationUntilReset counts down (upstream sleeps 2 s between two hits;
    // here a look waits until the clock has moved a whole second).
    let key4 = key("key4", variant);
    let first = ask(&mut client, request("another", &[&[(&key4, "durTest")]], 1)).await;
    let first = first.statuses[0]
        .duration_until_reset
        .as_ref()
        .expect("a reset")
        .seconds;
    common::eventually("the time to reset to count down", || {
        let mut client = client.clone();
        let key4 = key4.clone();
        async move {
            let mut look = request("another", &[&[(&key4, "durTest")]], 1);
            look.descriptors[0].hits_addend = Some(0);
            let later = ask(&mut client, look).await;
            later.statuses[0]
                .duration_until_reset
                .as_ref()
                .is_some_and(|reset| reset.seconds < first)
        }
    })
    .await;
    // ratelimitd asks the cache only where a denied hit is not counted
    // (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): a cached denial would
    // skip counting it.
    if variant.local_cache && variant.stop_increment {
        stats.assert_local_cache_gauges().await;
    }
    server.terminate().await;
}

fn standalone(redis: &RedisServer) -> Vec<(&'static str, String)> {
    vec![("REDIS_URL", format!("127.0.0.1:{}", redis.port()))]
}

#[tokio::test]
async fn basic_config() {
    let redis = RedisServer::start().await;
    basic_base_config(&standalone(&redis), Variant::default()).await;
}

/// `testBasicBaseConfig` with upstream's default sink: USE_STATSD=true,
/// the counts read from the datagrams a statsd receiver of the test's gets
/// (and the HTTP and debug listeners on PORT and DEBUG_PORT, as with every
/// variant).
#[tokio::test]
async fn basic_config_over_statsd() {
    let redis = RedisServer::start().await;
    let variant = Variant {
        statsd: true,
        ..Variant::default()
    };
    basic_base_config(&standalone(&redis), variant).await;
}

#[tokio::test]
async fn basic_config_stop_cache_key_increment_when_overlimit() {
    let redis = RedisServer::start().await;
    let variant = Variant {
        stop_increment: true,
        ..Variant::default()
    };
    basic_base_config(&standalone(&redis), variant).await;
}

#[tokio::test]
async fn basic_config_with_local_cache() {
    // The gauges over each sink: a third run, over statsd.
    for (stop_increment, statsd) in [(false, false), (true, false), (true, true)] {
        // A Redis each: upstream's keys repeat between runs.
        let redis = RedisServer::start().await;
        let variant = Variant {
            local_cache: true,
            stop_increment,
            statsd,
        };
        basic_base_config(&standalone(&redis), variant).await;
    }
}

#[tokio::test]
async fn basic_config_with_cache_prefix() {
    let redis = RedisServer::start().await;
    let mut settings = standalone(&redis);
    settings.push(("CACHE_KEY_PREFIX", "prefix:".into()));
    basic_base_config(&settings, Variant::default()).await;
    let keys = redis.keys().await;
    assert!(
        !keys.is_empty() && keys.iter().all(|key| key.starts_with("prefix:")),
        "{keys:?}"
    );
}

/// `host:port` of a `redis://[user:password@]host:port` URL.
fn address(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_owned()
}

const PASSWORD: &str = "password123";

#[tokio::test]
async fn basic_config_with_auth() {
    let redis = RedisServer::with_password(PASSWORD).await;
    let settings = vec![
        ("REDIS_URL", address(&redis.url())),
        ("REDIS_AUTH", PASSWORD.to_owned()),
    ];
    basic_base_config(&settings, Variant::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn basic_config_with_auth_on_a_redis_cluster() {
    let cluster = RedisCluster::start_with(behind_the_password()).await;
    let nodes: Vec<String> = cluster.urls().iter().map(|url| address(url)).collect();
    let settings = vec![
        ("REDIS_TYPE", "cluster".to_owned()),
        ("REDIS_URL", nodes.join(",")),
        ("REDIS_AUTH", PASSWORD.to_owned()),
    ];
    basic_base_config(&settings, Variant::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn basic_config_with_auth_on_sentinel() {
    let sentinel = RedisSentinel::start_with(behind_the_password()).await;
    let sentinels: Vec<String> = sentinel
        .sentinel_urls()
        .iter()
        .map(|url| address(url))
        .collect();
    let settings = vec![
        ("REDIS_TYPE", "sentinel".to_owned()),
        (
            "REDIS_URL",
            format!("{},{}", sentinel.master_name(), sentinels.join(",")),
        ),
        ("REDIS_AUTH", PASSWORD.to_owned()),
        ("REDIS_SENTINEL_AUTH", PASSWORD.to_owned()),
    ];
    basic_base_config(&settings, Variant::default()).await;
}

/// As upstream's Makefile runs Sentinel: the primary and its replica
/// demand a password, the sentinels none, and only REDIS_AUTH is set. It
/// goes to the primary, never to the sentinels (which would refuse it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn basic_config_with_auth_on_sentinels_without_a_password() {
    let sentinel = RedisSentinel::start_with(Security {
        password: Some(PASSWORD.to_owned()),
        sentinels: SentinelPassword::Open,
        ..Security::default()
    })
    .await;
    assert_eq!(sentinel.sentinel_auth(), None);
    let sentinels: Vec<String> = sentinel
        .sentinel_urls()
        .iter()
        .map(|url| address(url))
        .collect();
    let settings = vec![
        ("REDIS_TYPE", "sentinel".to_owned()),
        (
            "REDIS_URL",
            format!("{},{}", sentinel.master_name(), sentinels.join(",")),
        ),
        ("REDIS_AUTH", PASSWORD.to_owned()),
    ];
    basic_base_config(&settings, Variant::default()).await;
}

/// `testBasicConfigAuthTLS` / `…WithClientCert`: upstream's stunnel recipe,
/// one self-signed certificate as the server's and the client's, in front
/// of a Redis with a password. Without the client certificate it is
/// trusted as upstream's CI trusts it, through the system's store
/// (SSL_CERT_FILE here, no REDIS_TLS_CACERT); with it, REDIS_TLS_CACERT
/// names it.
#[tokio::test]
async fn basic_config_with_auth_over_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = self_signed_ca_certificate();
    let (cert_path, key_path) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert_path, cert).expect("cert");
    std::fs::write(&key_path, key).expect("key");
    let path = |file: &std::path::Path| file.to_string_lossy().into_owned();
    for client_cert in [false, true] {
        // A Redis each: upstream's keys repeat between runs.
        let redis =
            RedisServer::pinned(dir.path(), ClientCertificates::Optional, Some(PASSWORD)).await;
        let port = redis.port();
        let mut settings = vec![
            ("REDIS_URL", format!("localhost:{port}")),
            ("REDIS_AUTH", PASSWORD.to_owned()),
            ("REDIS_TLS", "true".to_owned()),
        ];
        if client_cert {
            settings.push(("REDIS_TLS_CACERT", path(&cert_path)));
            settings.push(("REDIS_TLS_CLIENT_CERT", path(&cert_path)));
            settings.push(("REDIS_TLS_CLIENT_KEY", path(&key_path)));
        } else {
            settings.push(("SSL_CERT_FILE", path(&cert_path)));
        }
        basic_base_config(&settings, Variant::default()).await;
        drop(redis);
    }
}

/// `testShareThreshold`: `files/*` with share_threshold shares one counter
/// between values; `files_no_share/*` counts each value apart.
#[tokio::test]
async fn share_threshold() {
    let redis = RedisServer::start().await;
    let stats = Stats::Prometheus(free_port());
    let server = start(&standalone(&redis), Variant::default(), &stats).await;
    let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
    let domain = "share-threshold-test";
    for _ in 0..10 {
        ask(
            &mut client,
            request(domain, &[&[("files", "files/a.pdf")]], 1),
        )
        .await;
    }
    let response = ask(
        &mut client,
        request(domain, &[&[("files", "files/b.csv")]], 1),
    )
    .await;
    assert_eq!(response.overall_code(), Code::OverLimit);
    assert_eq!(
        limited(&response.statuses[0]),
        (Code::OverLimit, 10, Unit::Hour, 0)
    );
    let base = fresh_value();
    for i in 0..10 {
        let value = format!("files_no_share/{base}-{i}");
        let response = ask(
            &mut client,
            request(domain, &[&[("files_no_share", &value)]], 1),
        )
        .await;
        assert_eq!(
            limited(&response.statuses[0]),
            (Code::Ok, 10, Unit::Hour, 9),
            "{value}"
        );
    }
    server.terminate().await;
}

/// `config_load_success` under upstream's name.
async fn loads(metrics: u16) -> u64 {
    prometheus::count(metrics, "ratelimit_service_config_load_success", &[]).await
}

/// `testBasicConfigReload` (and `…WithoutWatchRoot`): a file added to the
/// runtime directory is loaded without a restart (counted in
/// config_load_success), its domain answers, and its removal reloads too.
#[tokio::test]
async fn config_reload_with_and_without_watch_root() {
    for watch_root in ["true", "false"] {
        let redis = RedisServer::start().await;
        let runtime = tempfile::tempdir().expect("runtime");
        let fixtures = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/upstream_integration/ratelimit"
        );
        let config = runtime.path().join("ratelimit").join("config");
        std::fs::create_dir_all(&config).expect("runtime directories");
        for file in ["another.yaml", "basic.yaml", "share_threshold.yaml"] {
            std::fs::copy(format!("{fixtures}/config/{file}"), config.join(file)).expect("copy");
        }
        let metrics = free_port();
        let prometheus = format!("127.0.0.1:{metrics}");
        let redis_url = format!("127.0.0.1:{}", redis.port());
        let root = runtime.path().to_string_lossy().into_owned();
        let server = ServerProcess::builder()
            .env(&[
                ("USE_STATSD", "false"),
                ("RUNTIME_ROOT", &root),
                ("RUNTIME_SUBDIRECTORY", "ratelimit"),
                ("RUNTIME_WATCH_ROOT", watch_root),
                ("REDIS_SOCKET_TYPE", "tcp"),
                ("REDIS_URL", &redis_url),
                ("USE_PROMETHEUS", "true"),
                ("PROMETHEUS_ADDR", &prometheus),
                ("RATELIMITD_CONFIG_POLL_INTERVAL", "100ms"),
            ])
            .upstream_way()
            .start()
            .await;
        let mut client = RateLimitServiceClient::new(common::channel(server.address).await);
        let response = ask(&mut client, request("reload", &[&[("block", "foo")]], 1)).await;
        assert_eq!(response.overall_code(), Code::Ok, "not configured yet");
        assert!(response.statuses[0].current_limit.is_none());
        let before = loads(metrics).await;
        std::fs::copy(
            format!("{fixtures}/reload.yaml"),
            config.join("reload.yaml"),
        )
        .expect("add");
        common::eventually("the new file to load", || async {
            loads(metrics).await > before
        })
        .await;
        let response = ask(&mut client, request("reload", &[&[("block", "foo")]], 1)).await;
        assert_eq!(
            response.overall_code(),
            Code::OverLimit,
            "0 a second blocks"
        );
        let response = ask(&mut client, request("reload", &[&[("key1", "foo")]], 1)).await;
        assert_eq!(
            limited(&response.statuses[0]),
            (Code::Ok, 50, Unit::Second, 49)
        );
        let before = loads(metrics).await;
        std::fs::remove_file(config.join("reload.yaml")).expect("remove");
        common::eventually("the removal to reload", || async {
            loads(metrics).await > before
        })
        .await;
        server.terminate().await;
    }
}

/// REDIS_PERSECOND with a standalone per-second Redis (upstream's
/// `makeSimpleRedisSettings(…, perSecond=true, …)`).
fn with_per_second(main: &RedisServer, per_second: &RedisServer) -> Vec<(&'static str, String)> {
    let mut settings = standalone(main);
    settings.extend([
        ("REDIS_PERSECOND", "true".to_owned()),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp".to_owned()),
        (
            "REDIS_PERSECOND_URL",
            format!("127.0.0.1:{}", per_second.port()),
        ),
    ]);
    settings
}

/// Script calls in a Redis's `INFO commandstats`.
fn script_calls(info: &str) -> u64 {
    info.lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| {
            let calls = line.split_once("calls=")?.1;
            calls.split(',').next()?.parse::<u64>().ok()
        })
        .sum()
}

/// What one Redis deployment shows after the runs: its keys, and the
/// script calls it ran.
struct Seen {
    keys: Vec<String>,
    scripts: u64,
}

impl Seen {
    /// A standalone server, through `redis-cli` (which also trusts
    /// upstream's pinned certificate).
    async fn standalone(redis: &RedisServer) -> Self {
        let keys = redis.cli(&["KEYS", "*"]).await.expect("KEYS");
        let info = redis.cli(&["INFO", "commandstats"]).await.expect("INFO");
        Self {
            keys: keys.lines().map(str::to_owned).collect(),
            scripts: script_calls(&info),
        }
    }

    /// Every primary of a Redis Cluster.
    async fn cluster(cluster: &RedisCluster) -> Self {
        let mut seen = Self {
            keys: Vec::new(),
            scripts: 0,
        };
        for (port, _) in cluster.keys_per_primary().await {
            seen.add(&mut cluster.node_connection(port).await).await;
        }
        seen
    }

    /// The primary a Sentinel group names.
    async fn sentinel(sentinel: &RedisSentinel) -> Self {
        let mut seen = Self {
            keys: Vec::new(),
            scripts: 0,
        };
        seen.add(&mut sentinel.primary_connection().await).await;
        seen
    }

    async fn add(&mut self, connection: &mut redis::aio::MultiplexedConnection) {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(connection)
            .await
            .expect("KEYS");
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(connection)
            .await
            .expect("INFO");
        self.keys.extend(keys);
        self.scripts += script_calls(&info);
    }
}

/// The second-unit rule (`key1`) was decided on the per-second Redis, and
/// the others (`key2`…`key4`, whose windows outlive the runs) only on the
/// main one. (key1's own keys last a second: they are gone by now.)
fn assert_split(main: &Seen, per_second: &Seen) {
    let others = |key: &String| ["key2", "key3", "key4"].iter().any(|k| key.contains(k));
    assert!(
        per_second.scripts > 0,
        "the per-second Redis decided nothing"
    );
    assert!(
        !per_second.keys.iter().any(others),
        "per-second Redis: {:?}",
        per_second.keys
    );
    assert!(main.keys.iter().any(others), "main Redis: {:?}", main.keys);
}

/// [`assert_split`] on two standalone servers.
async fn assert_split_standalone(main: &RedisServer, per_second: &RedisServer) {
    assert_split(
        &Seen::standalone(main).await,
        &Seen::standalone(per_second).await,
    );
}

/// `TestBasicConfig`'s four `WithPerSecondRedis…` runs: with and without
/// the local cache, in both counting modes.
#[tokio::test]
async fn basic_config_with_per_second_redis() {
    for (local_cache, stop_increment) in
        [(false, false), (true, false), (false, true), (true, true)]
    {
        // Two Redis each: upstream's keys repeat between runs.
        let (main, per_second) = (RedisServer::start().await, RedisServer::start().await);
        let variant = Variant {
            local_cache,
            stop_increment,
            ..Variant::default()
        };
        basic_base_config(&with_per_second(&main, &per_second), variant).await;
        assert_split_standalone(&main, &per_second).await;
    }
}

/// `testBasicConfigAuth`'s `WithPerSecondRedisAuth` runs: both Redis behind
/// the password, with and without the local cache.
#[tokio::test]
async fn basic_config_with_per_second_redis_and_auth() {
    let main = RedisServer::with_password(PASSWORD).await;
    let per_second = RedisServer::with_password(PASSWORD).await;
    let settings = vec![
        ("REDIS_URL", address(&main.url())),
        ("REDIS_AUTH", PASSWORD.to_owned()),
        ("REDIS_PERSECOND", "true".to_owned()),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp".to_owned()),
        ("REDIS_PERSECOND_URL", address(&per_second.url())),
        ("REDIS_PERSECOND_AUTH", PASSWORD.to_owned()),
    ];
    // The local cache's run counts `_local` keys: the same servers serve.
    without_and_with_the_local_cache(&settings).await;
    assert_split_standalone(&main, &per_second).await;
}

/// `testBasicConfigAuthTLS`'s `WithPerSecondRedisTLS` runs: both Redis over
/// TLS (upstream's pinned certificate) behind the password, one set of
/// REDIS_TLS_* files for both, with and without the local cache.
#[tokio::test]
async fn basic_config_with_per_second_redis_over_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (cert, key) = self_signed_ca_certificate();
    let cert_path = dir.path().join("cert.pem");
    std::fs::write(&cert_path, cert).expect("cert");
    std::fs::write(dir.path().join("key.pem"), key).expect("key");
    let main = RedisServer::pinned(dir.path(), ClientCertificates::Optional, Some(PASSWORD)).await;
    let per_second =
        RedisServer::pinned(dir.path(), ClientCertificates::Optional, Some(PASSWORD)).await;
    let settings = vec![
        ("REDIS_URL", format!("localhost:{}", main.port())),
        ("REDIS_AUTH", PASSWORD.to_owned()),
        ("REDIS_TLS", "true".to_owned()),
        ("REDIS_TLS_CACERT", cert_path.to_string_lossy().into_owned()),
        ("REDIS_PERSECOND", "true".to_owned()),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp".to_owned()),
        (
            "REDIS_PERSECOND_URL",
            format!("localhost:{}", per_second.port()),
        ),
        ("REDIS_PERSECOND_AUTH", PASSWORD.to_owned()),
        ("REDIS_PERSECOND_TLS", "true".to_owned()),
    ];
    without_and_with_the_local_cache(&settings).await;
    assert_split_standalone(&main, &per_second).await;
}

/// The variables that describe one Redis: the main one's or the
/// per-second one's.
struct Names {
    kind: &'static str,
    url: &'static str,
    auth: &'static str,
    sentinel_auth: &'static str,
}

const MAIN: Names = Names {
    kind: "REDIS_TYPE",
    url: "REDIS_URL",
    auth: "REDIS_AUTH",
    sentinel_auth: "REDIS_SENTINEL_AUTH",
};

const PER_SECOND: Names = Names {
    kind: "REDIS_PERSECOND_TYPE",
    url: "REDIS_PERSECOND_URL",
    auth: "REDIS_PERSECOND_AUTH",
    sentinel_auth: "REDIS_PERSECOND_SENTINEL_AUTH",
};

/// `basic_base_config` on `settings` as upstream's per-second runs do it:
/// without the local cache, then with it (its `_local` keys).
async fn without_and_with_the_local_cache(settings: &[(&str, String)]) {
    for local_cache in [false, true] {
        let variant = Variant {
            local_cache,
            ..Variant::default()
        };
        basic_base_config(settings, variant).await;
    }
}

/// The settings of a main Redis and a per-second one (REDIS_PERSECOND).
fn split(
    main: Vec<(&'static str, String)>,
    per_second: Vec<(&'static str, String)>,
) -> Vec<(&'static str, String)> {
    let mut settings = main;
    settings.extend(per_second);
    settings.extend([
        ("REDIS_PERSECOND", "true".to_owned()),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp".to_owned()),
    ]);
    settings
}

/// Servers that ask for upstream's test password.
fn behind_the_password() -> Security {
    Security {
        password: Some(PASSWORD.to_owned()),
        ..Security::default()
    }
}

/// REDIS_TYPE=cluster's settings for `cluster`, under `names`.
fn cluster_settings(names: &Names, cluster: &RedisCluster) -> Vec<(&'static str, String)> {
    let nodes: Vec<String> = cluster.urls().iter().map(|url| address(url)).collect();
    vec![
        (names.kind, "cluster".to_owned()),
        (names.url, nodes.join(",")),
        (names.auth, PASSWORD.to_owned()),
    ]
}

/// `testBasicConfigAuthWithRedisCluster`'s `WithPerSecondRedisAuth` runs:
/// the per-second Redis a second Cluster, both behind the password, with
/// and without the local cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn basic_config_with_per_second_redis_on_redis_clusters() {
    let main = RedisCluster::start_with(behind_the_password()).await;
    let per_second = RedisCluster::start_with(behind_the_password()).await;
    let settings = split(
        cluster_settings(&MAIN, &main),
        cluster_settings(&PER_SECOND, &per_second),
    );
    without_and_with_the_local_cache(&settings).await;
    assert_split(
        &Seen::cluster(&main).await,
        &Seen::cluster(&per_second).await,
    );
}

/// REDIS_TYPE=sentinel's settings for `sentinel`, under `names`.
fn sentinel_settings(names: &Names, sentinel: &RedisSentinel) -> Vec<(&'static str, String)> {
    let sentinels: Vec<String> = sentinel
        .sentinel_urls()
        .iter()
        .map(|url| address(url))
        .collect();
    vec![
        (names.kind, "sentinel".to_owned()),
        (
            names.url,
            format!("{},{}", sentinel.master_name(), sentinels.join(",")),
        ),
        (names.auth, PASSWORD.to_owned()),
        (names.sentinel_auth, PASSWORD.to_owned()),
    ]
}

/// `testBasicAuthConfigWithRedisSentinel`'s `WithPerSecondRedisAuth` runs:
/// the per-second Redis a second Sentinel group, both behind the password,
/// with and without the local cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn basic_config_with_per_second_redis_on_sentinel() {
    let main = RedisSentinel::start_with(behind_the_password()).await;
    let per_second = RedisSentinel::start_with(behind_the_password()).await;
    let settings = split(
        sentinel_settings(&MAIN, &main),
        sentinel_settings(&PER_SECOND, &per_second),
    );
    without_and_with_the_local_cache(&settings).await;
    assert_split(
        &Seen::sentinel(&main).await,
        &Seen::sentinel(&per_second).await,
    );
}

/// go-control-plane's form of a rule: `key` with `requests_per_unit` per
/// `unit`.
fn xds_rule(
    key: &str,
    unit: conf::RateLimitUnit,
    requests_per_unit: u32,
) -> conf::RateLimitDescriptor {
    conf::RateLimitDescriptor {
        key: key.into(),
        rate_limit: Some(conf::RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Upstream's `initialXdsBasicConfig`: the `basic` and `another` domains of
/// its integration configuration, as an xDS server serves them.
fn upstream_xds_configs() -> Vec<conf::RateLimitConfig> {
    use conf::RateLimitUnit::{Day, Hour, Minute, Second};
    let config = |domain: &str, descriptors| conf::RateLimitConfig {
        name: domain.into(),
        domain: domain.into(),
        descriptors,
    };
    vec![
        config(
            "basic",
            vec![
                xds_rule("key1", Second, 50),
                xds_rule("key1_local", Second, 50),
                xds_rule("one_per_minute", Minute, 1),
            ],
        ),
        config(
            "another",
            vec![
                xds_rule("key2", Minute, 20),
                xds_rule("key3", Hour, 10),
                xds_rule("key2_local", Minute, 20),
                xds_rule("key3_local", Hour, 10),
                xds_rule("key4", Day, 20),
                xds_rule("key4_local", Day, 20),
            ],
        ),
    ]
}

/// `TestXdsProviderBasicConfig`: the rules from an xDS server
/// (CONFIG_TYPE=GRPC_XDS_SOTW, upstream's node id), without and with the
/// per-second Redis, without and with the local cache.
#[tokio::test]
async fn xds_provider_basic_config() {
    let (_xds, xds_address, _publish) =
        common::xds::serve_configs("1", upstream_xds_configs()).await;
    let xds = [
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".to_owned()),
        ("CONFIG_GRPC_XDS_NODE_ID", "init-test-node".to_owned()),
        ("CONFIG_GRPC_XDS_SERVER_URL", xds_address.to_string()),
    ];
    for per_second in [false, true] {
        // The local cache's run counts `_local` keys: the same servers serve.
        let (main, fast) = (RedisServer::start().await, RedisServer::start().await);
        let mut settings = match per_second {
            true => with_per_second(&main, &fast),
            false => standalone(&main),
        };
        settings.extend(xds.iter().cloned());
        without_and_with_the_local_cache(&settings).await;
        if per_second {
            assert_split_standalone(&main, &fast).await;
        } else {
            assert_eq!(fast.script_calls().await, 0);
        }
    }
}

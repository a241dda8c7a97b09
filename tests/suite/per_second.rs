//! A per-second Redis beside the main one (`--redis-persecond-url`, or
//! upstream's REDIS_PERSECOND): Envoy's rules whose unit is second count
//! there and nowhere else, every other limit (minute rules, CheckLimit's)
//! on the main Redis, as both servers' keys show; a request spanning both
//! is all or nothing, exactly, under concurrency; and with one store down
//! the failure policy answers for the limits on it only while health says
//! NOT_SERVING. The same through upstream's variables, with the binary
//! started as upstream's deployments start it, whose Redis metrics say
//! which store.
//!
//! The rules are `tests/fixtures/per_second/ratelimit/config/split.yaml`.
//! Counting rules there are an hour long (a second rule with
//! `unit_multiplier: 3600`), and calls that count are redone if an hour
//! began meanwhile, so no window boundary falls between them.

use crate::common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::rls::descriptor;
use common::{RedisServer, ServerProcess, TestServer, await_health, fixed_window};
use ratelimitd::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use ratelimitd::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use ratelimitd::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

type Client = RateLimitServiceClient<Channel>;

const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/per_second/ratelimit/config"
);

/// A value no other call used, so each test's keys are its own.
fn fresh(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!("{name}-{nanos}")
}

/// The hour of the clock now, since the epoch.
fn hour() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs()
        / 3600
}

/// `calls`, redone (it makes its own fresh keys) until an hour does not
/// begin while it runs.
async fn within_one_hour<T, Fut: Future<Output = T>>(mut calls: impl FnMut() -> Fut) -> T {
    loop {
        let before = hour();
        let result = calls().await;
        if hour() == before {
            return result;
        }
    }
}

/// A server on the rules, `main` and `per_second`, quick to notice a Redis
/// that fails, with `extra` flags, once SERVING.
async fn start(main: &RedisServer, per_second: &RedisServer, extra: &[&str]) -> TestServer {
    start_waiting(main, per_second, "300ms", extra).await
}

/// [`start`], waiting on Redis up to `timeout`.
async fn start_waiting(
    main: &RedisServer,
    per_second: &RedisServer,
    timeout: &str,
    extra: &[&str],
) -> TestServer {
    let (main, per_second) = (main.url(), per_second.url());
    let mut flags = vec![
        "--config",
        RULES,
        "--redis-url",
        &main,
        "--redis-persecond-url",
        &per_second,
        "--redis-command-timeout",
        timeout,
        "--health-interval",
        "100ms",
    ];
    flags.extend_from_slice(extra);
    let server = TestServer::start(&flags).await;
    await_health(server.address, ServingStatus::Serving).await;
    server
}

async fn client(address: std::net::SocketAddr) -> Client {
    RateLimitServiceClient::new(common::channel(address).await)
}

/// A request in the `split` domain of one descriptor per `(key, value)`.
fn split(descriptors: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: "split".into(),
        descriptors: descriptors
            .iter()
            .map(|entry| descriptor(&[*entry]))
            .collect(),
        hits_addend: 1,
    }
}

async fn ask(client: &mut Client, request: RateLimitRequest) -> Result<Code, tonic::Code> {
    client
        .should_rate_limit(request)
        .await
        .map(|response| response.into_inner().overall_code())
        .map_err(|status| status.code())
}

/// The keys of `redis` that name `value`.
async fn keys_of(redis: &RedisServer, value: &str) -> Vec<String> {
    let mut keys: Vec<String> = redis
        .keys()
        .await
        .into_iter()
        .filter(|key| key.contains(value))
        .collect();
    keys.sort();
    keys
}

/// The units counted on `redis` under the keys that name `value` (Envoy's
/// fixed windows: in ratelimitd's layout a hash whose `n` is the count, in
/// upstream's a string counter).
async fn counted(redis: &RedisServer, value: &str) -> u64 {
    let mut connection = redis.connection().await;
    let mut total = 0;
    for key in keys_of(redis, value).await {
        let mut read = redis::cmd(if key.ends_with('}') { "HGET" } else { "GET" });
        read.arg(&key);
        if key.ends_with('}') {
            read.arg("n");
        }
        let count: Option<u64> = read.query_async(&mut connection).await.expect("the count");
        total += count.unwrap_or(0);
    }
    total
}

/// Whether `key` counts an Envoy limit of one second: in ratelimitd's
/// layout its window (`w1000`) ends the name; in upstream's (a rule alone
/// on its descriptor, with upstream's variables) the name is the
/// descriptor's, `<domain>_<key>_<value>_<window start>`, and the second
/// rules here are `per_second` and the override.
fn counts_seconds(key: &str) -> bool {
    if key.ends_with('}') {
        return key.ends_with("w1000}");
    }
    key.contains("_per_second_") || key.contains("-override_")
}

/// Asks once for a second rule, a minute rule, a descriptor with both, a
/// descriptor overriding its limit with one per SECOND, and CheckLimit with
/// a one-second window; then each Redis holds only its own keys.
async fn assert_keys_on_their_store(address: std::net::SocketAddr, stores: [&RedisServer; 2]) {
    let per_second = stores[1];
    // A one-second key lives until its second ends: asked and listed
    // across the end of a second, one may be gone. Then ask again.
    let mut attempts = 0;
    let (value, fast, slow) = loop {
        attempts += 1;
        let second = redis_second(per_second).await;
        let asked = ask_every_kind(address, stores).await;
        if redis_second(per_second).await == second {
            break asked;
        }
        assert!(attempts < 5, "each of 5 tries straddled a second");
    };
    // Per second: the second rule, the second limit of `both`, the override.
    assert_eq!(fast.len(), 3, "per-second Redis: {fast:?}");
    assert!(
        fast.iter().all(|key| counts_seconds(key)),
        "only one-second windows: {fast:?}"
    );
    assert!(fast.iter().any(|key| key.contains("per_second")));
    assert!(fast.iter().any(|key| key.contains("override")));
    // Main: the minute rule, the minute limit of `both`, CheckLimit's key.
    assert_eq!(slow.len(), 3, "main Redis: {slow:?}");
    assert!(
        slow.iter()
            .all(|key| !counts_seconds(key) || key.contains("check-")),
        "{slow:?}"
    );
    assert!(
        slow.iter()
            .any(|key| key.contains(&format!("check-{value}")))
    );
}

/// Asks once for each kind of rule (a fresh value): the value, the keys
/// of it on the per-second Redis, and those on the main one.
async fn ask_every_kind(
    address: std::net::SocketAddr,
    [main, per_second]: [&RedisServer; 2],
) -> (String, Vec<String>, Vec<String>) {
    let value = fresh("placed");
    let mut envoy = client(address).await;
    let mut overridden = descriptor(&[("per_minute", &format!("{value}-override"))]);
    overridden.limit = Some(RateLimitOverride {
        requests_per_unit: 9,
        unit: Unit::Second as i32,
    });
    let mut request = split(&[
        ("per_second", &value),
        ("per_minute", &value),
        ("both", &value),
    ]);
    request.descriptors.push(overridden);
    assert_eq!(ask(&mut envoy, request).await, Ok(Code::Ok));
    let mut check = RateLimiterClient::new(common::channel(address).await);
    let one_second = fixed_window(5, Duration::from_secs(1));
    let key = format!("check-{value}");
    assert!(
        common::check(&mut check, &key, &one_second, None)
            .await
            .allowed
    );
    let fast = keys_of(per_second, &value).await;
    let slow = keys_of(main, &value).await;
    (value, fast, slow)
}

/// Redis's clock, in whole seconds.
async fn redis_second(redis: &RedisServer) -> u64 {
    let (seconds, _micros): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut redis.connection().await)
        .await
        .expect("TIME");
    seconds
}

#[tokio::test]
async fn second_rules_count_on_the_per_second_redis_and_the_rest_on_the_main_one() {
    let (main, per_second) = (RedisServer::start().await, RedisServer::start().await);
    let server = start(&main, &per_second, &[]).await;
    assert_keys_on_their_store(server.address, [&main, &per_second]).await;
    server.stop().await;
}

/// Fires 300 requests at once, each spending on `descriptors` (with a
/// fresh value each run), over `clients`: how many were admitted, and the
/// value used.
async fn admitted_of_300(clients: &[Client], descriptors: [&'static str; 2]) -> (usize, String) {
    within_one_hour(|| async {
        let value = fresh("hot");
        let calls = (0..300).map(|i| {
            let mut client = clients[i % clients.len()].clone();
            let request = split(&[(descriptors[0], &value), (descriptors[1], &value)]);
            tokio::spawn(async move { ask(&mut client, request).await })
        });
        let mut admitted = 0;
        for answer in futures::future::join_all(calls).await {
            let code = answer.expect("task").expect("every call is answered");
            admitted += usize::from(code == Code::Ok);
        }
        (admitted, value)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_request_spanning_both_stores_is_all_or_nothing_exactly_under_concurrency() {
    let (main, per_second) = (RedisServer::start().await, RedisServer::start().await);
    // Generous: a slow machine still answers every call from Redis.
    let server = start_waiting(&main, &per_second, "10s", &[]).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(server.address).await);
    }
    // The per-second Redis's limit binds: the main one counts only what it
    // admitted.
    let (admitted, value) = admitted_of_300(&clients, ["second_100", "hour_150"]).await;
    assert_eq!(admitted, 100);
    assert_eq!(counted(&per_second, &value).await, 100);
    assert_eq!(counted(&main, &value).await, 100);
    assert!(
        keys_of(&main, &value)
            .await
            .iter()
            .all(|k| k.contains("hour"))
    );
    // The main Redis's limit binds: the per-second one gives back.
    let (admitted, value) = admitted_of_300(&clients, ["second_150", "hour_100"]).await;
    assert_eq!(admitted, 100);
    assert_eq!(counted(&main, &value).await, 100);
    assert_eq!(counted(&per_second, &value).await, 100);
    server.stop().await;
}

/// `second_2` and `hour_2` on one value, in one request and each alone,
/// while the per-second Redis is down: minute... hour limits still count
/// on the main Redis.
async fn spanning(client: &mut Client, value: &str) -> Result<Code, tonic::Code> {
    ask(client, split(&[("second_2", value), ("hour_2", value)])).await
}

#[tokio::test]
async fn per_second_redis_down_fail_closed_refuses_its_limits_only_and_health_says_so() {
    let (main, mut per_second) = (RedisServer::start().await, RedisServer::start().await);
    let server = start(&main, &per_second, &[]).await;
    let mut envoy = client(server.address).await;
    per_second.kill();
    await_health(server.address, ServingStatus::NotServing).await;
    let value = fresh("down");
    within_one_hour(|| async {
        let value = fresh("down");
        for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
            let answer = ask(&mut envoy.clone(), split(&[("hour_2", &value)])).await;
            assert_eq!(answer, Ok(expected), "the main Redis decides its own");
        }
    })
    .await;
    let second = ask(&mut envoy, split(&[("second_2", &value)])).await;
    assert_eq!(second, Err(tonic::Code::Unavailable));
    assert_eq!(
        spanning(&mut envoy, &value).await,
        Err(tonic::Code::Unavailable)
    );
    per_second.restart().await;
    await_health(server.address, ServingStatus::Serving).await;
    assert_eq!(spanning(&mut envoy, &fresh("back")).await, Ok(Code::Ok));
    server.stop().await;
}

#[tokio::test]
async fn per_second_redis_down_fail_open_allows_its_limits_only() {
    let (main, mut per_second) = (RedisServer::start().await, RedisServer::start().await);
    let server = start(&main, &per_second, &["--failure-policy", "fail-open"]).await;
    let mut envoy = client(server.address).await;
    per_second.kill();
    within_one_hour(|| async {
        let value = fresh("open");
        let mut envoy = envoy.clone();
        // The second rule is allowed by the policy; the hour one is still
        // counted on the main Redis, and denies the third.
        for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
            assert_eq!(spanning(&mut envoy, &value).await, Ok(expected));
        }
        assert_eq!(counted(&main, &value).await, 2);
    })
    .await;
    let value = fresh("open-alone");
    for _ in 0..3 {
        let answer = ask(&mut envoy, split(&[("second_2", &value)])).await;
        assert_eq!(answer, Ok(Code::Ok), "fail-open allows the second rule");
    }
    assert_eq!(
        common::health_status(server.address, "").await,
        Some(ServingStatus::Serving),
        "the policy answers without the store"
    );
    server.stop().await;
}

#[tokio::test]
async fn main_redis_down_the_per_second_one_still_decides_its_own() {
    let (mut main, per_second) = (RedisServer::start().await, RedisServer::start().await);
    let server = start(&main, &per_second, &["--failure-policy", "local"]).await;
    let mut envoy = client(server.address).await;
    main.kill();
    await_health(server.address, ServingStatus::Serving).await;
    within_one_hour(|| async {
        let value = fresh("main-down");
        let mut envoy = envoy.clone();
        for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
            assert_eq!(spanning(&mut envoy, &value).await, Ok(expected));
        }
        // The per-second Redis counted its own (the main one's limit was
        // decided on this instance, by the `local` policy).
        assert_eq!(counted(&per_second, &value).await, 2);
    })
    .await;
    let value = fresh("local");
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        let answer = ask(&mut envoy, split(&[("hour_2", &value)])).await;
        assert_eq!(answer, Ok(expected), "the local policy counts");
    }
    server.stop().await;
}

/// Upstream's variables for the rules and these two Redis servers, with
/// Redis failures noticed quickly.
fn upstream_variables(main: &RedisServer, per_second: &RedisServer) -> Vec<(&'static str, String)> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/per_second");
    vec![
        ("USE_STATSD", "false".into()),
        ("RUNTIME_ROOT", root.into()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("REDIS_SOCKET_TYPE", "tcp".into()),
        ("REDIS_URL", format!("127.0.0.1:{}", main.port())),
        ("REDIS_PERSECOND", "true".into()),
        ("REDIS_PERSECOND_SOCKET_TYPE", "tcp".into()),
        (
            "REDIS_PERSECOND_URL",
            format!("127.0.0.1:{}", per_second.port()),
        ),
        ("REDIS_TIMEOUT", "300ms".into()),
        ("RATELIMITD_HEALTH_INTERVAL", "100ms".into()),
        // Health follows Redis, so that it tells when one is gone.
        ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true".into()),
    ]
}

#[tokio::test]
async fn upstreams_variables_split_the_stores_the_same_way() {
    let (main, mut per_second) = (RedisServer::start().await, RedisServer::start().await);
    let variables = upstream_variables(&main, &per_second);
    let environment: Vec<(&str, &str)> = variables
        .iter()
        .map(|(name, value)| (*name, value.as_str()))
        .collect();
    let metrics = common::free_port();
    let prometheus = format!("127.0.0.1:{metrics}");
    let mut environment = environment;
    environment.extend([("USE_PROMETHEUS", "true"), ("PROMETHEUS_ADDR", &prometheus)]);
    let server = ServerProcess::builder()
        .env(&environment)
        .upstream_way()
        .start()
        .await;
    assert_keys_on_their_store(server.address, [&main, &per_second]).await;
    // Redis's metrics say which store.
    for store in ["main", "per_second"] {
        let (_, series) = common::prometheus::scrape(metrics).await;
        let labels = [("store", store)];
        let calls =
            common::prometheus::value(&series, "ratelimitd_redis_command_seconds_count", &labels);
        assert!(calls >= 1.0, "{store}: {calls}");
        let pool = "ratelimitd_redis_pool_connections";
        assert!(
            series
                .keys()
                .any(|key| key.starts_with(pool) && key.contains(&format!("store=\"{store}\""))),
            "{store}'s pool"
        );
    }
    // Upstream counts each limit on its own (denied hits too): so does a
    // request spanning both stores.
    let mut envoy = client(server.address).await;
    within_one_hour(|| async {
        let value = fresh("upstream");
        let mut envoy = envoy.clone();
        for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
            assert_eq!(spanning(&mut envoy, &value).await, Ok(expected));
        }
        assert_eq!(counted(&per_second, &value).await, 3);
        assert_eq!(counted(&main, &value).await, 3);
    })
    .await;
    per_second.kill();
    await_health(server.address, ServingStatus::NotServing).await;
    let value = fresh("upstream-down");
    let minute = ask(&mut envoy, split(&[("hour_2", &value)])).await;
    assert_eq!(minute, Ok(Code::Ok), "the main Redis decides its own");
    let second = ask(&mut envoy, split(&[("second_2", &value)])).await;
    assert_eq!(second, Err(tonic::Code::Unavailable));
    server.terminate().await;
}

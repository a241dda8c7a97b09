//! envoyproxy/ratelimit's own `integration-test/scripts`, run as upstream
//! runs them: ratelimitd started the upstream way (only upstream's
//! variables, its runtime layout, `RESPONSE_DYNAMIC_METADATA=true`) on
//! upstream's example configuration, unchanged
//! (`tests/fixtures/upstream/config/`), behind a real Envoy on upstream's
//! `proxy.yaml` with its two mock services on `mock.yaml` (only addresses
//! and ports rewritten, and the rate limit call's deadline raised from
//! Envoy's 20 ms default). Each script's requests and assertions are kept as
//! written; the 60 s waits that check a minute's quota comes back are left
//! out (aligned windows are tested elsewhere). Where ratelimitd's own
//! defaults (denied hits spend nothing) answer otherwise, the test runs the
//! script both ways and shows both.

use crate::common;

use common::envoy::Envoy;
use common::http::HttpResponse;
use common::{RedisServer, ServerProcess, free_port, prometheus};

const PROXY: &str = include_str!("../fixtures/upstream/proxy.yaml");
const MOCK: &str = include_str!("../fixtures/upstream/mock.yaml");

/// Upstream's docker-compose stack on loopback: Redis, ratelimitd, the
/// mock services' Envoy and the proxy Envoy.
struct Stack {
    redis: RedisServer,
    _server: ServerProcess,
    proxy: Envoy,
    _mock: Envoy,
    metrics: u16,
}

impl Stack {
    /// `count_denied`: upstream's default counting (STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT
    /// unset), or ratelimitd's (`true`: denied hits spend nothing).
    async fn start(count_denied: bool) -> Self {
        let redis = RedisServer::start().await;
        let metrics = free_port();
        let redis_url = format!("127.0.0.1:{}", redis.port());
        let prometheus = format!("127.0.0.1:{metrics}");
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
        let mut environment = vec![
            ("USE_STATSD", "false"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", redis_url.as_str()),
            ("RUNTIME_ROOT", root),
            ("RUNTIME_SUBDIRECTORY", "upstream"),
            ("RUNTIME_IGNOREDOTFILES", "true"),
            ("RESPONSE_DYNAMIC_METADATA", "true"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", prometheus.as_str()),
        ];
        if !count_denied {
            environment.push(("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true"));
        }
        let server = ServerProcess::builder()
            .env(&environment)
            .upstream_way()
            .start()
            .await;
        let (service_1, service_2) = (free_port(), free_port());
        let mock = Envoy::launch(
            &rewrite(
                MOCK,
                &[
                    ("0.0.0.0", "127.0.0.1".into()),
                    ("port_value: 9999", format!("port_value: {service_1}")),
                    ("port_value: 10001", format!("port_value: {service_2}")),
                    ("port_value: 8001", "port_value: 0".into()),
                ],
            ),
            &[],
        )
        .await;
        let proxy = Envoy::launch(
            &rewrite(
                PROXY,
                &[
                    ("0.0.0.0", "127.0.0.1".into()),
                    ("address: ratelimit", "address: 127.0.0.1".into()),
                    ("address: envoy-mock", "address: 127.0.0.1".into()),
                    (
                        "port_value: 8081",
                        format!("port_value: {}", server.address.port()),
                    ),
                    ("port_value: 9999", format!("port_value: {service_1}")),
                    ("port_value: 10001", format!("port_value: {service_2}")),
                    ("port_value: 8888", "port_value: 0".into()),
                    ("port_value: 8001", "port_value: 0".into()),
                    // upstream's file leaves the filter's call to the rate
                    // limit service at Envoy's default deadline, 20 ms,
                    // after which (with `failure_mode_deny: false`) Envoy
                    // lets the request through undecided; a loaded 2-core
                    // test machine misses 20 ms often enough to fail a
                    // script that expects a denial.
                    (
                        "failure_mode_deny: false",
                        "failure_mode_deny: false\n                      timeout: 10s".into(),
                    ),
                ],
            ),
            // docker-compose starts the proxy with this cluster name.
            &["--service-cluster", "proxy"],
        )
        .await;
        Self {
            redis,
            _server: server,
            proxy,
            _mock: mock,
            metrics,
        }
    }

    /// `ShouldRateLimit` calls ratelimitd has answered, from its metrics.
    async fn calls(&self) -> u64 {
        let method = [("grpc_method", "ShouldRateLimit")];
        prometheus::count(self.metrics, "ratelimit_service_total_requests", &method).await
    }

    /// `curl -H ... http://envoy-proxy:8888<path>`, then waits until
    /// ratelimitd has answered `calls` calls for it (2 on a route that
    /// also reports at stream end), so the next request sees them counted.
    async fn curl(&self, path: &str, headers: &[(&str, &str)], calls: u64) -> HttpResponse {
        let before = self.calls().await;
        let response = self.proxy.get(path, headers).await;
        common::eventually(&format!("{calls} rate limit calls for {path}"), || async {
            self.calls().await >= before + calls
        })
        .await;
        response
    }

    /// A fresh start for the next script: its counters, in a window with
    /// time left.
    async fn next_script(&self) {
        let mut connection = self.redis.connection().await;
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut connection)
            .await
            .expect("FLUSHALL on the test's own Redis");
        common::fresh_minute().await;
    }
}

/// Replaces each `from` (which must be there) with its `to`, everywhere.
fn rewrite(template: &str, replacements: &[(&str, String)]) -> String {
    replacements
        .iter()
        .fold(template.to_owned(), |text, (from, to)| {
            assert!(text.contains(from), "the upstream file has no `{from}`");
            text.replace(from, to)
        })
}

/// `curl -f` succeeded.
fn ok(response: &HttpResponse) -> bool {
    (200..400).contains(&response.status)
}

/// simple-get.sh: the happy path.
async fn simple_get(stack: &Stack) {
    let response = stack
        .curl("/twoheader", &[("foo", "test"), ("baz", "shady")], 1)
        .await;
    assert!(ok(&response), "simple-get: {response:?}");
}

/// trigger-ratelimit.sh: (foo: *), (baz: not-so-shady) allows 3 a minute.
async fn trigger_ratelimit(stack: &Stack) {
    let headers = [("foo", "pelle"), ("baz", "not-so-shady")];
    for i in 1..=3 {
        let response = stack.curl("/twoheader", &headers, 1).await;
        assert!(ok(&response), "request {i} should not be limited yet");
    }
    let response = stack.curl("/twoheader", &headers, 1).await;
    assert!(!ok(&response), "the 4th should be limited");
    let response = stack.curl("/twoheader", &headers, 1).await;
    assert_eq!(response.status, 429, "Too Many Requests: {response:?}");
}

/// trigger-shadow-mode-key.sh: (foo: *), (baz: shady), 3 a minute in
/// shadow mode, never limits, and x-ratelimit-remaining is then 0 ("Remaining
/// should be zero", the script says; its test `[ $remaining == "0" ]` is
/// written inverted and passes upstream only because `curl -i` leaves a
/// carriage return on the value, so the intent is what is checked here).
async fn trigger_shadow_mode_key(stack: &Stack) {
    let headers = [("foo", "pelle"), ("baz", "shady")];
    for i in 1..=5 {
        let response = stack.curl("/twoheader", &headers, 1).await;
        assert!(ok(&response), "request {i}: shadow mode never limits");
    }
    let response = stack.curl("/twoheader", &headers, 1).await;
    assert_eq!(
        response.header("x-ratelimit-remaining"),
        Some("0"),
        "{response:?}"
    );
}

/// One request of a script: path, headers, and whether it passes.
type Step<'a> = (&'a str, &'a [(&'a str, &'a str)], bool);

/// replaces.sh, every step as the script has it.
async fn replaces(stack: &Stack) {
    let steps: &[Step] = &[
        // replaces increases the limit: banned_limit (0/min) replaced by
        // override's 2/min.
        (
            "/twoheader",
            &[("foo", "bkthomps"), ("bar", "banned")],
            false,
        ),
        (
            "/fourheader",
            &[
                ("foo", "bkthomps"),
                ("bar", "banned"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "mock"),
            ],
            false,
        ),
        (
            "/fourheader",
            &[
                ("foo", "bkthomps"),
                ("bar", "banned"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "override"),
            ],
            true,
        ),
        (
            "/fourheader",
            &[
                ("foo", "bkthomps"),
                ("bar", "banned"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "override"),
            ],
            true,
        ),
        (
            "/fourheader",
            &[
                ("foo", "bkthomps"),
                ("bar", "banned"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "override"),
            ],
            false,
        ),
        // replaces does not change the original limit.
        (
            "/fourheader",
            &[
                ("foo", "my_foo"),
                ("bar", "bkthomps"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "bkthomps"),
            ],
            true,
        ),
        (
            "/fourheader",
            &[
                ("foo", "my_foo"),
                ("bar", "bkthomps"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "bkthomps"),
            ],
            true,
        ),
        (
            "/fourheader",
            &[
                ("foo", "my_foo"),
                ("bar", "bkthomps"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "bkthomps"),
            ],
            false,
        ),
        (
            "/fourheader",
            &[
                ("foo", "my_foo"),
                ("bar", "bkthomps"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "not_bkthomps"),
            ],
            true,
        ),
        (
            "/fourheader",
            &[
                ("foo", "my_foo"),
                ("bar", "bkthomps"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "not_bkthomps"),
            ],
            false,
        ),
        (
            "/fourheader",
            &[
                ("foo", "my_foo"),
                ("bar", "bkthomps"),
                ("source_cluster", "proxy"),
                ("destination_cluster", "bkthomps"),
            ],
            false,
        ),
    ];
    run_steps(stack, "replaces (1, 2)", steps).await;
    // replaces can replace several rules: a fresh window, as upstream's
    // script gets from running after the others.
    stack.next_script().await;
    let five = [
        ("foo", "my_foo"),
        ("bar", "bkthomps"),
        ("source_cluster", "proxy"),
        ("destination_cluster", "fake"),
        ("category", "account"),
    ];
    let four = [
        ("foo", "foo_3"),
        ("bar", "bar_3"),
        ("source_cluster", "proxy"),
        ("destination_cluster", "fake"),
    ];
    let steps: &[Step] = &[
        ("/fiveheader", &five, true),
        ("/fiveheader", &five, true),
        ("/fiveheader", &five, true),
        ("/fiveheader", &five, true),
        ("/fiveheader", &five, false),
        ("/twoheader", &[("foo", "foo_2"), ("bar", "bkthomps")], true),
        (
            "/twoheader",
            &[("foo", "foo_2"), ("bar", "bkthomps")],
            false,
        ),
        ("/fourheader", &four, true),
        ("/fourheader", &four, true),
        ("/fourheader", &four, false),
        ("/fiveheader", &five, false),
    ];
    run_steps(stack, "replaces (3)", steps).await;
}

async fn run_steps(stack: &Stack, script: &str, steps: &[Step<'_>]) {
    for (i, (path, headers, allowed)) in steps.iter().enumerate() {
        let response = stack.curl(path, headers, 1).await;
        assert_eq!(
            ok(&response),
            *allowed,
            "{script} step {}: {path} {headers:?}: {response:?}",
            i + 1
        );
    }
}

/// quota.sh: (service: service_1) 1/min and (service: service_2) 2/min,
/// both in quota mode: a request is denied only when both are spent.
async fn quota(stack: &Stack) {
    for i in 1..=2 {
        assert!(ok(&stack.curl("/quota", &[], 1).await), "quota request {i}");
    }
    let response = stack.curl("/quota", &[], 1).await;
    assert_eq!(response.status, 429, "every quota spent: {response:?}");
}

/// token-quota.sh: service_2 (2/min) checked with hits 0 on the request
/// and charged 1 at stream end (`apply_on_stream_done`). `binds`: the
/// 4th request is refused (upstream's counting: the late report past the
/// limit is recorded); else it passes (our default refuses the report).
async fn token_quota(stack: &Stack, binds: bool) {
    for i in 1..=3 {
        let response = stack
            .curl("/tokenquota", &[("request-no", &i.to_string())], 2)
            .await;
        assert!(ok(&response), "token quota request {i}");
    }
    let response = stack.curl("/tokenquota", &[("request-no", "4")], 2).await;
    assert_eq!(!ok(&response), binds, "request 4: {response:?}");
}

/// multiservice-tokenquota.sh: the dynamic metadata of the passing quota
/// descriptors routes each request to a service with quota left; each
/// service is charged at stream end. `binds`: upstream's counting records
/// the late charge past the quota, so service 1 serves 2 and service 2
/// then 3; else (our default) the charge past the quota is refused, the
/// quota of service 1 never runs out, and it serves every request.
async fn multiservice_tokenquota(stack: &Stack, binds: bool) {
    let expected: &[(u32, Option<&str>)] = if binds {
        &[
            (1, Some("Service 1")),
            (2, Some("Service 1")),
            (3, Some("Service 2")),
            (4, Some("Service 2")),
            (5, Some("Service 2")),
            (6, None),
        ]
    } else {
        &[
            (1, Some("Service 1")),
            (2, Some("Service 1")),
            (3, Some("Service 1")),
            (4, Some("Service 1")),
            (5, Some("Service 1")),
            (6, Some("Service 1")),
        ]
    };
    for &(request, service) in expected {
        // A denied request reaches no service, so nothing reports at its end.
        let calls = if service.is_some() { 2 } else { 1 };
        let response = stack
            .curl(
                "/multiservice-tokenquota",
                &[("request-no", &request.to_string())],
                calls,
            )
            .await;
        match service {
            Some(service) => assert!(
                ok(&response) && response.body.contains(&format!("from {service}")),
                "request {request} should be served by {service}: {response:?}"
            ),
            None => assert!(
                !response.body.contains("Hello World from Service"),
                "request {request} should be refused: {response:?}"
            ),
        }
    }
}

/// value-included-in-stats-key-when-unspecified.sh:
/// (unspec: *) allows 2 a minute. Its statistics, as upstream's
/// `detailed_metric` names them, carry the request's value:
/// `unspec_unspecified_value`.
async fn value_in_stats_key(stack: &Stack) {
    let headers = [("unspec", "unspecified_value")];
    for i in 1..=2 {
        assert!(
            ok(&stack.curl("/unspec", &headers, 1).await),
            "unspec request {i}"
        );
    }
    assert!(
        !ok(&stack.curl("/unspec", &headers, 1).await),
        "the 3rd is limited"
    );
    let (text, series) = prometheus::scrape(stack.metrics).await;
    let over = prometheus::value(
        &series,
        "ratelimit_service_rate_limit_over_limit",
        &[("key1", "unspec_unspecified_value")],
    );
    assert_eq!(over, 1.0, "{text}");
    let configured = prometheus::value(
        &series,
        "ratelimit_service_rate_limit_total_hits",
        &[("key1", "unspec")],
    );
    assert_eq!(
        configured, 0.0,
        "named after the value, not the rule: {text}"
    );
}

/// run-all.sh's scripts, in its (alphabetical) order, each on fresh
/// counters, as upstream runs them: started the upstream way, every
/// script passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_integration_scripts_pass_started_the_upstream_way() {
    let stack = Stack::start(true).await;
    stack.next_script().await;
    multiservice_tokenquota(&stack, true).await;
    stack.next_script().await;
    quota(&stack).await;
    stack.next_script().await;
    replaces(&stack).await;
    stack.next_script().await;
    simple_get(&stack).await;
    stack.next_script().await;
    token_quota(&stack, true).await;
    stack.next_script().await;
    trigger_ratelimit(&stack).await;
    stack.next_script().await;
    trigger_shadow_mode_key(&stack).await;
    stack.next_script().await;
    value_in_stats_key(&stack).await;
}

/// The same scripts with ratelimitd's own counting (denied hits spend
/// nothing, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true): all pass but the
/// two token quotas charged after the response, which do not bind then, as
/// the README says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_denied_hits_free_only_late_charges_differ() {
    let stack = Stack::start(false).await;
    stack.next_script().await;
    multiservice_tokenquota(&stack, false).await;
    stack.next_script().await;
    quota(&stack).await;
    stack.next_script().await;
    replaces(&stack).await;
    stack.next_script().await;
    token_quota(&stack, false).await;
    stack.next_script().await;
    trigger_ratelimit(&stack).await;
    stack.next_script().await;
    trigger_shadow_mode_key(&stack).await;
}

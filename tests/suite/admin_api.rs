//! The admin API against the built binary: not served without a token;
//! with one, every operation its OpenAPI document lists answers as listed,
//! to the token only (401 without, 403 with another, one body for both),
//! every call logged with the caller's address and counted; a peek spends
//! nothing and a reset lets a denied key through again, on Redis (its
//! local cache of denials cleared) and on the embedded store; the lists
//! show where rules, policies and quota buckets were written and when they
//! were loaded; the configuration hides the Redis password and the token;
//! bodies that are bad, huge or slow are refused; a token file is read at
//! start, and a bad one stops the start.

use crate::common;

use std::process::{Command, Stdio};
use std::time::Instant;

use common::http::{HttpResponse, body_json, exchange, request};
use common::prometheus;
use common::{PATIENCE, RedisServer, ServerProcess, eventually, free_port};
use ratelimitd::http::Endpoint;
use serde_json::{Value, json};

/// The token the servers here are started with.
const TOKEN: &str = "an-admin-token-for-tests-0123456789";

/// The policies, an Envoy domain with quota buckets.
const POLICIES: &str = "\
policies:
  free-tier:
    - {per: 1s, limit: 10}
    - {per: 1h, limit: 1000}
  plans:
    - {name: per-minute, per: 1m, limit: 3}
    - {name: daily, per: 1d, limit: 2, algorithm: sliding_window_counter}
";
const EDGE: &str = "\
domain: edge
descriptors:
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5}
quota_buckets:
  - bucket_id: {name: api}
    rate_limit: {unit: second, requests_per_unit: 100}
";

/// A server process with its HTTP listener on a free loopback port, the
/// rules above in a directory of their own, plus `flags`.
async fn start(flags: &[&str]) -> (ServerProcess, tempfile::TempDir) {
    start_with_environment(flags, &[]).await
}

async fn start_with_environment(
    flags: &[&str],
    environment: &[(&str, &str)],
) -> (ServerProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a config directory");
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).expect("write the policies");
    std::fs::write(dir.path().join("edge.yaml"), EDGE).expect("write the domain");
    let config = dir.path().to_string_lossy().into_owned();
    let server = ServerProcess::builder()
        .flags(&["--config", &config])
        .flags(flags)
        .env(environment)
        .http()
        .logged()
        .start()
        .await;
    (server, dir)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// A call of `method` on `path` with `authorization` (if any), and a JSON
/// `body` (if any).
async fn call(
    port: u16,
    method: &str,
    path: &str,
    authorization: Option<&str>,
    body: &str,
) -> HttpResponse {
    let mut headers = Vec::new();
    if let Some(authorization) = authorization {
        headers.push(("authorization", authorization));
    }
    if !body.is_empty() {
        headers.push(("content-type", "application/json"));
    }
    request(port, method, path, &headers, body)
        .await
        .expect("an answer")
}

/// A call with the right token.
async fn admin(port: u16, method: &str, path: &str, body: &str) -> HttpResponse {
    call(port, method, path, Some(&bearer(TOKEN)), body).await
}

/// A call with the right token that must answer 200: its body.
async fn admin_ok(port: u16, method: &str, path: &str, body: &str) -> Value {
    let answer = admin(port, method, path, body).await;
    assert_eq!(answer.status, 200, "{method} {path} {body}: {answer:?}");
    body_json(&answer)
}

/// A decision on `/v1/check`.
async fn check(port: u16, body: &Value) -> Value {
    let answer = call(port, "POST", "/v1/check", None, &body.to_string()).await;
    assert_eq!(answer.status, 200, "{body}: {answer:?}");
    body_json(&answer)
}

fn method_of(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::AdminPeek | Endpoint::AdminReset => "POST",
        _ => "GET",
    }
}

fn admin_endpoints() -> impl Iterator<Item = Endpoint> {
    Endpoint::ALL
        .into_iter()
        .filter(|endpoint| endpoint.is_admin())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_the_admin_api_is_not_served_nor_documented() {
    let (server, _dir) = start(&[]).await;
    let port = server.http_port();
    for endpoint in admin_endpoints() {
        let body = if method_of(endpoint) == "POST" {
            r#"{"key": "k", "fixedWindow": {"limit": 1, "window": "1s"}}"#
        } else {
            ""
        };
        let answer = admin(port, method_of(endpoint), endpoint.path(), body).await;
        assert_eq!(answer.status, 404, "{endpoint:?}: {answer:?}");
    }
    let document = body_json(&call(port, "GET", "/openapi.json", None, "").await);
    let paths = document["paths"].as_object().expect("paths");
    assert!(
        paths.keys().all(|path| !path.starts_with("/admin")),
        "{paths:?}"
    );
    assert!(document["components"]["securitySchemes"].is_null());
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_operation_answers_as_documented_to_the_token_only_logged_and_counted() {
    let debug = free_port();
    let debug_listen = format!("127.0.0.1:{debug}");
    let (server, _dir) = start(&["--admin-token", TOKEN, "--debug-listen", &debug_listen]).await;
    let port = server.http_port();
    let served = call(port, "GET", "/openapi.json", None, "").await;
    assert_eq!(served.status, 200, "{served:?}");
    common::openapi::assert_valid(&served.body);
    let document = body_json(&served);
    // Every route, the admin API's among them, and nothing else.
    let paths = document["paths"].as_object().expect("paths");
    let mut listed: Vec<&str> = paths.keys().map(String::as_str).collect();
    let mut routes: Vec<&str> = Endpoint::ALL.iter().map(|e| e.path()).collect();
    listed.sort_unstable();
    routes.sort_unstable();
    assert_eq!(listed, routes);
    assert_eq!(
        document["components"]["securitySchemes"]["adminToken"],
        json!({"type": "http", "scheme": "bearer", "description": "The server's --admin-token."})
    );
    // Each admin operation answers its examples (every form of the
    // request, for the POSTs) with 200, a status it lists; and refuses a
    // caller without the token (401) or with another (403), with one
    // body for all.
    let mut refusals = Vec::new();
    for endpoint in admin_endpoints() {
        let path = endpoint.path();
        let method = method_of(endpoint).to_ascii_lowercase();
        let operation = &paths[path][&method];
        assert_eq!(operation["security"], json!([{"adminToken": []}]), "{path}");
        let statuses: Vec<u16> = operation["responses"]
            .as_object()
            .expect("responses")
            .keys()
            .map(|status| status.parse().expect("a status code"))
            .collect();
        for status in [200, 401, 403] {
            assert!(statuses.contains(&status), "{path}: {statuses:?}");
        }
        let bodies: Vec<String> =
            match operation["requestBody"]["content"]["application/json"]["examples"].as_object() {
                Some(examples) => examples
                    .values()
                    .map(|example| example["value"].to_string())
                    .collect(),
                None => vec![String::new()],
            };
        for body in &bodies {
            let answer = admin(port, method_of(endpoint), path, body).await;
            assert_eq!(answer.status, 200, "{path} {body}: {answer:?}");
        }
        let body = &bodies[0];
        for (authorization, status) in [
            (None, 401),
            (Some("Basic dXNlcjpwYXNz".to_owned()), 401),
            (Some("Bearer".to_owned()), 401),
            (Some(bearer("not-the-admin-token-0123456789")), 403),
            (Some(bearer(&format!("{TOKEN}x"))), 403),
            (Some(bearer(&TOKEN[..TOKEN.len() - 1])), 403),
        ] {
            let answer = call(
                port,
                method_of(endpoint),
                path,
                authorization.as_deref(),
                body,
            )
            .await;
            assert_eq!(
                answer.status, status,
                "{path} {authorization:?}: {answer:?}"
            );
            assert_eq!(
                answer.header("www-authenticate"),
                (status == 401).then_some("Bearer"),
                "{answer:?}"
            );
            refusals.push(answer.body);
        }
    }
    let body = &refusals[0];
    assert!(refusals.iter().all(|other| other == body), "{refusals:?}");
    assert_eq!(
        serde_json::from_str::<Value>(body).expect("JSON"),
        json!({"field": "authorization", "rule": "must be `Bearer <the server's admin token>`"})
    );
    // Counted by endpoint and outcome.
    let (_, series) = prometheus::scrape(debug).await;
    let count = |endpoint: &str, outcome: &str| {
        prometheus::value(
            &series,
            "ratelimitd_admin_requests_total",
            &[("endpoint", endpoint), ("outcome", outcome)],
        ) as u64
    };
    assert_eq!(count("peek", "ok"), 3, "the three forms");
    assert_eq!(count("reset", "ok"), 3);
    assert_eq!(count("rules", "ok"), 1);
    assert_eq!(count("config", "ok"), 1);
    for endpoint in [
        "peek",
        "reset",
        "rules",
        "policies",
        "quota_buckets",
        "config",
    ] {
        assert_eq!(count(endpoint, "unauthenticated"), 3, "{endpoint}");
        assert_eq!(count(endpoint, "forbidden"), 3, "{endpoint}");
    }
    // Logged with the caller's address; the token never.
    let log = server.log();
    assert!(
        log.lines().any(|line| line.contains("admin API call")
            && line.contains("/admin/v1/rules")
            && line.contains("peer=127.0.0.1:")),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|line| line.contains("admin API call refused")
                && line.contains("outcome=\"forbidden\"")),
        "{log}"
    );
    assert!(!log.contains(TOKEN), "the token is in the log: {log}");
    server.terminate().await;
}

/// Peek at, spend on and reset one key in each form of the request, on a
/// server whose store is `flags`' ( `on_redis`: with the local cache of
/// denials, which the reset must clear).
async fn peek_spend_and_reset(port: u16, on_redis: bool) {
    // One limit, 2 a minute: a peek says what a check leaves, and spends
    // nothing, however often.
    let one = json!({"key": "one", "fixedWindow": {"limit": "2", "window": "60s"}});
    let spent = check(port, &one).await;
    assert_eq!(
        (spent["allowed"].clone(), spent["remaining"].clone()),
        (json!(true), json!("1"))
    );
    for _ in 0..3 {
        let peek = admin_ok(port, "POST", "/admin/v1/peek", &one.to_string()).await;
        assert_eq!(peek["remaining"], "1", "{peek}");
        assert_eq!(peek["limit"], "2", "{peek}");
    }
    let last = check(port, &one).await;
    assert_eq!(
        (last["allowed"].clone(), last["remaining"].clone()),
        (json!(true), json!("0"))
    );
    let denied = check(port, &one).await;
    assert_eq!(denied["allowed"], false, "{denied}");
    // Denied again: on Redis, from the local cache.
    let denied = check(port, &one).await;
    assert_eq!(denied["allowed"], false, "{denied}");
    let peek = admin_ok(port, "POST", "/admin/v1/peek", &one.to_string()).await;
    assert_eq!(peek["remaining"], "0", "{peek}");
    // Reset: the key's counter is gone, and so is this instance's cached
    // denial; the key is allowed again, with its whole limit.
    let reset = admin_ok(port, "POST", "/admin/v1/reset", &one.to_string()).await;
    assert_eq!(
        reset,
        json!({"reset": [{
            "name": "",
            "algorithm": "fixed_window",
            "storageKey": "ratelimitd:{fw:one}",
            "existed": true,
            "cachedDenial": on_redis,
        }]}),
    );
    let again = check(port, &one).await;
    assert_eq!(
        (again["allowed"].clone(), again["remaining"].clone()),
        (json!(true), json!("1"))
    );
    // A reset of a key that holds nothing says so.
    let fresh = json!({"key": "never", "gcra": {"rate": "1", "period": "1s", "burst": "1"}});
    let reset = admin_ok(port, "POST", "/admin/v1/reset", &fresh.to_string()).await;
    assert_eq!(reset["reset"][0]["existed"], false, "{reset}");

    // Several limits, one with a cost of its own: a peek spends on none.
    let several = json!({"key": "several", "limits": [
        {"name": "burst", "tokenBucket": {"capacity": "10", "refillPerSecond": 0.001}, "cost": "4"},
        {"name": "hourly", "slidingWindow": {"limit": "100", "window": "3600s"}}
    ]});
    let spent = check(port, &several).await;
    assert_eq!(spent["limits"][0]["remaining"], "6", "{spent}");
    let peek = admin_ok(port, "POST", "/admin/v1/peek", &several.to_string()).await;
    assert_eq!(peek["limits"][0]["remaining"], "6", "{peek}");
    assert_eq!(peek["limits"][1]["remaining"], "99", "{peek}");
    let reset = admin_ok(port, "POST", "/admin/v1/reset", &several.to_string()).await;
    let names: Vec<&Value> = reset["reset"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| &r["name"])
        .collect();
    assert_eq!(names, [&json!("burst"), &json!("hourly")], "{reset}");
    let after = check(port, &several).await;
    assert_eq!(
        after["limits"][0]["remaining"], "6",
        "whole again, then 4 spent: {after}"
    );

    // A policy: spent to its denial, peeked, reset.
    let plan = json!({"key": "tenant7", "policy": "plans"});
    for _ in 0..2 {
        assert_eq!(check(port, &plan).await["allowed"], true);
    }
    let denied = check(port, &plan).await;
    assert_eq!(denied["allowed"], false, "daily is 2: {denied}");
    let peek = admin_ok(port, "POST", "/admin/v1/peek", &plan.to_string()).await;
    assert_eq!(peek["limits"][0]["remaining"], "1", "{peek}");
    assert_eq!(peek["limits"][1]["remaining"], "0", "{peek}");
    let reset = admin_ok(port, "POST", "/admin/v1/reset", &plan.to_string()).await;
    assert_eq!(reset["reset"][0]["name"], "per-minute", "{reset}");
    assert_eq!(reset["reset"][1]["name"], "daily", "{reset}");
    assert!(
        reset["reset"]
            .as_array()
            .expect("a list")
            .iter()
            .all(|r| r["existed"] == true),
        "{reset}"
    );
    assert_eq!(check(port, &plan).await["allowed"], true);
    // A policy the server does not know.
    let unknown = admin(
        port,
        "POST",
        "/admin/v1/reset",
        r#"{"key": "k", "policy": "nobody"}"#,
    )
    .await;
    assert_eq!(unknown.status, 404, "{unknown:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_spends_nothing_and_a_reset_lets_a_denied_key_through_on_redis() {
    let redis = RedisServer::start().await;
    let (server, _dir) = start(&["--admin-token", TOKEN, "--redis-url", &redis.url()]).await;
    peek_spend_and_reset(server.http_port(), true).await;
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peek_spends_nothing_and_a_reset_lets_a_denied_key_through_on_the_embedded_store() {
    let (server, _dir) = start(&["--admin-token", TOKEN]).await;
    peek_spend_and_reset(server.http_port(), false).await;
    server.terminate().await;
}

/// An RFC 3339 time as the lists write it, to the millisecond.
fn loaded_at(list: &Value) -> String {
    let text = list["loadedAt"]
        .as_str()
        .unwrap_or_else(|| panic!("loadedAt: {list}"));
    assert!(
        text.len() == "2026-01-01T00:00:00.000Z".len() && text.ends_with('Z'),
        "{text}"
    );
    text.to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_show_where_rules_policies_and_quota_buckets_were_written_and_when_loaded() {
    let (server, dir) = start(&["--admin-token", TOKEN, "--config-poll-interval", "100ms"]).await;
    let port = server.http_port();
    let rules = admin_ok(port, "GET", "/admin/v1/rules", "").await;
    assert_eq!(
        rules["origin"],
        format!("files {}", dir.path().display()),
        "{rules}"
    );
    let first_load = loaded_at(&rules);
    let file = |name: &str| dir.path().join(name).to_string_lossy().into_owned();
    assert_eq!(
        rules["rules"],
        json!([{
            "domain": "edge",
            "descriptor": "path_/login",
            "name": null,
            "kind": "counted",
            "unit": "MINUTE",
            "unitMultiplier": 1,
            "requestsPerUnit": 5,
            "algorithm": "fixed_window",
            "shadow": false,
            "quotaMode": false,
            "source": {"file": file("edge.yaml"), "line": 5},
        }])
    );
    let policies = admin_ok(port, "GET", "/admin/v1/policies", "").await;
    assert_eq!(loaded_at(&policies), first_load);
    let names: Vec<&str> = policies["policies"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|policy| policy["name"].as_str())
        .collect();
    assert_eq!(names, ["free-tier", "plans"], "{policies}");
    let plans = &policies["policies"][1];
    assert_eq!(plans["source"]["file"], file("policies.yaml"), "{plans}");
    assert!(
        plans["source"]["line"]
            .as_u64()
            .is_some_and(|line| line > 1),
        "{plans}"
    );
    assert_eq!(
        plans["limits"][1],
        json!({
            "name": "daily",
            "algorithm": {"name": "sliding_window_counter", "limit": 2, "window": "86400s",
                          "refillPerSecond": null, "interval": null},
            "scope": "key",
            "shadow": false,
        })
    );
    let quota = admin_ok(port, "GET", "/admin/v1/quota-buckets", "").await;
    assert_eq!(quota["subscriptions"], 0, "{quota}");
    assert_eq!(quota["domains"][0]["domain"], "edge", "{quota}");
    let bucket = &quota["domains"][0]["policies"][0];
    assert_eq!(bucket["bucket"], "name=api", "{quota}");
    assert_eq!(
        (bucket["requests"].clone(), bucket["periodSeconds"].clone()),
        (json!(100), json!(1))
    );
    assert_eq!(bucket["source"]["file"], file("edge.yaml"), "{quota}");
    assert_eq!(
        quota["domains"][0]["default"]["kind"], "allow_all",
        "{quota}"
    );
    // A reload: the new rule, from its file, and a later load time.
    std::fs::write(
        dir.path().join("more.yaml"),
        "domain: more\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 7}\n",
    )
    .expect("write a rules file");
    eventually("the reload shows in the rules list", || async {
        let rules = admin_ok(port, "GET", "/admin/v1/rules", "").await;
        rules["rules"].as_array().is_some_and(|all| {
            all.iter()
                .any(|rule| rule["domain"] == "more" && rule["source"]["file"] == file("more.yaml"))
        }) && loaded_at(&rules) > first_load
    })
    .await;
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_hides_the_redis_password_and_the_token() {
    let password = "a-redis-password-never-shown";
    let redis = RedisServer::with_password(password).await;
    assert!(redis.url().contains(password), "the URL carries it");
    let (server, _dir) = start_with_environment(
        &["--redis-url", &redis.url(), "--max-request-bytes", "4096"],
        &[("RATELIMITD_ADMIN_TOKEN", TOKEN)],
    )
    .await;
    let answer = admin(server.http_port(), "GET", "/admin/v1/config", "").await;
    assert_eq!(answer.status, 200, "{answer:?}");
    for secret in [password, TOKEN] {
        assert!(!answer.body.contains(secret), "{answer:?}");
    }
    let config = body_json(&answer);
    let flag = |name: &str| -> Value {
        config["flags"]
            .as_array()
            .expect("flags")
            .iter()
            .find(|flag| flag["flag"] == name)
            .unwrap_or_else(|| panic!("--{name} in {config}"))
            .clone()
    };
    let url = flag("redis-url");
    assert_eq!(url["source"], "command line");
    assert!(
        url["value"][0]
            .as_str()
            .is_some_and(|shown| shown.contains(":***@")),
        "{url}"
    );
    assert_eq!(
        flag("admin-token"),
        json!({"flag": "admin-token", "value": "***", "source": "environment (RATELIMITD_ADMIN_TOKEN)"})
    );
    assert_eq!(flag("max-request-bytes")["value"], "4096");
    assert_eq!(flag("listen")["source"], "command line");
    assert_eq!(
        flag("http-read-timeout"),
        json!({"flag": "http-read-timeout", "value": "5s", "source": "default"})
    );
    let log = server.log();
    for secret in [password, TOKEN] {
        assert!(!log.contains(secret), "in the log: {log}");
    }
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_huge_and_slow_bodies_are_refused_and_the_token_comes_first() {
    let (server, _dir) = start(&[
        "--admin-token",
        TOKEN,
        "--max-request-bytes",
        "2048",
        "--http-read-timeout",
        "300ms",
    ])
    .await;
    let port = server.http_port();
    let authorization = format!("authorization: {}\r\n", bearer(TOKEN));
    for path in ["/admin/v1/peek", "/admin/v1/reset"] {
        // Not JSON, not an object, wrong types, an unknown field: 400
        // naming the request and the rule.
        for (body, rule) in [
            ("{", "EOF while parsing"),
            ("[]", "invalid type"),
            (r#"{"key": 5}"#, "invalid type"),
            (r#"{"key": "k", "cost": "many"}"#, "invalid"),
            (
                r#"{"key": "k", "fixedWindow": {"limit": 5, "window": 10}}"#,
                "invalid type",
            ),
            (r#"{"key": "k", "nope": 1}"#, "unknown field `nope`"),
        ] {
            let answer = admin(port, "POST", path, body).await;
            assert_eq!(answer.status, 400, "{path} {body}: {answer:?}");
            let refusal = body_json(&answer);
            assert_eq!(refusal["field"], "request", "{refusal}");
            assert!(
                refusal["rule"]
                    .as_str()
                    .is_some_and(|text| text.contains(rule)),
                "{path} {body}: {refusal}"
            );
        }
        // The service's own rules, naming the field.
        let answer = admin(
            port,
            "POST",
            path,
            r#"{"key": "k", "fixedWindow": {"limit": 5, "window": "0s"}}"#,
        )
        .await;
        assert_eq!(answer.status, 400, "{answer:?}");
        assert_eq!(body_json(&answer)["field"], "fixed_window.window");
        // Not JSON by its content type.
        let answer = request(
            port,
            "POST",
            path,
            &[
                ("authorization", &bearer(TOKEN)),
                ("content-type", "text/plain"),
            ],
            "{}",
        )
        .await
        .expect("an answer");
        assert_eq!(answer.status, 415, "{answer:?}");
        // Over --max-request-bytes: said by its length, or found reading.
        let declared = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{authorization}\
             content-type: application/json\r\ncontent-length: 2049\r\n\r\n"
        );
        let answer = exchange(port, declared.as_bytes())
            .await
            .expect("an answer");
        assert_eq!(answer.status, 413, "{answer:?}");
        assert!(answer.body.contains("at most 2048 bytes"), "{answer:?}");
        let chunk = "x".repeat(3000);
        let chunked = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{authorization}\
             content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n\
             {:x}\r\n{chunk}\r\n",
            chunk.len()
        );
        let answer = exchange(port, chunked.as_bytes()).await.expect("an answer");
        assert_eq!(answer.status, 413, "{answer:?}");
        // Half a body, and then nothing: 408 when the deadline passes.
        let half = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{authorization}\
             content-type: application/json\r\ncontent-length: 40\r\n\r\n{{\"key\": "
        );
        let answer = exchange(port, half.as_bytes()).await.expect("an answer");
        assert_eq!(answer.status, 408, "{answer:?}");
        assert!(answer.body.contains("--http-read-timeout"), "{answer:?}");
        // Without the token, no body is read: 401 for a huge one, at once
        // for a slow one.
        let huge = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             content-type: application/json\r\ncontent-length: 1000000\r\n\r\n"
        );
        let answer = exchange(port, huge.as_bytes()).await.expect("an answer");
        assert_eq!(answer.status, 401, "{answer:?}");
        let half = half.replace(&authorization, "");
        let answer = exchange(port, half.as_bytes()).await.expect("an answer");
        assert_eq!(answer.status, 401, "{answer:?}");
    }
    server.terminate().await;
}

/// Runs the binary with `args` (it must stop by itself) and returns its
/// exit status's success and its stderr.
fn run_to_exit(args: &[&str]) -> (bool, String) {
    let log = tempfile::NamedTempFile::new().expect("a log file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_ratelimitd"))
        .args(["--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(log.reopen().expect("the log file"))
        .spawn()
        .expect("start ratelimitd");
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("its status") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("ratelimitd {args:?} did not stop by itself");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(log.path()).unwrap_or_default();
    (status.success(), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_file_is_read_at_start_and_a_bad_token_stops_the_start() {
    let dir = tempfile::tempdir().expect("a directory");
    let file = dir.path().join("admin-token");
    std::fs::write(&file, format!("{TOKEN}\n")).expect("write the token");
    let path = file.to_string_lossy().into_owned();
    let (server, _rules) = start(&["--admin-token-file", &path]).await;
    let port = server.http_port();
    // The newline is not part of the token.
    admin_ok(port, "GET", "/admin/v1/config", "").await;
    server.terminate().await;

    std::fs::write(&file, "\n").expect("empty the token file");
    let (started, stderr) = run_to_exit(&["--admin-token-file", &path]);
    assert!(!started);
    assert!(
        stderr.contains("--admin-token-file: the token in the file is empty"),
        "{stderr}"
    );
    let missing = dir.path().join("missing").to_string_lossy().into_owned();
    let (started, stderr) = run_to_exit(&["--admin-token-file", &missing]);
    assert!(!started);
    assert!(
        stderr.contains("--admin-token-file: cannot read"),
        "{stderr}"
    );
    let (started, stderr) = run_to_exit(&["--admin-token", "short"]);
    assert!(!started);
    assert!(
        stderr.contains("--admin-token: the token must be at least 16 characters"),
        "{stderr}"
    );
    let (started, stderr) = run_to_exit(&["--admin-token", TOKEN, "--admin-token-file", &path]);
    assert!(!started);
    assert!(stderr.contains("cannot be used with"), "{stderr}");
}

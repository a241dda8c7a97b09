//! The web console's routes against the built binary: `POST /v1/simulate`
//! answers the simulation the library computes for the same request, and
//! refuses every kind of bad body naming the field and the rule (not
//! JSON, a wrong type, an unknown field, another content type, a body over
//! `--max-request-bytes`, a run over its bounds).

use crate::common;

use common::ServerProcess;
use common::free_port;
use common::http::{assert_body_bounded_at_2048, assert_refused, body_json, post_json, request};
use prost::Message;
use ratelimitd::pb::json::ratelimitd::v1 as json;
use ratelimitd::pb::ratelimitd::v1 as pb;
use serde_json::{Value, json};

/// A server process with its HTTP listener on a free loopback port, plus
/// `flags`.
async fn start(flags: &[&str]) -> (ServerProcess, u16) {
    let server = ServerProcess::builder()
        .flags(flags)
        .http()
        .logged()
        .start()
        .await;
    let port = server.http_port();
    (server, port)
}

/// The library's answer to `request` (JSON), in JSON as the server writes it.
fn computed(request: &Value) -> Value {
    let read: json::SimulateRequest =
        serde_json::from_value(request.clone()).expect("a SimulateRequest");
    let grpc = pb::SimulateRequest::decode(read.encode_to_vec().as_slice()).expect("the same");
    let answer = ratelimitd::simulate::simulation(grpc)
        .expect("a valid run")
        .run();
    let twin = json::SimulateResponse::decode(answer.encode_to_vec().as_slice()).expect("same");
    serde_json::to_value(twin).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_answers_the_servers_own_algorithms_and_refuses_bad_bodies() {
    let (server, port) = start(&["--max-request-bytes", "2048"]).await;

    // A fixed window of 10 a second under 50 a second: exactly 10 a window.
    let asked = json!({
        "limits": [{"fixedWindow": {"limit": 10, "window": "1s"}}],
        "traffic": {"shape": "STEADY", "rate": 50, "duration": "3s"},
        "step": "1s"
    });
    let answer = post_json(port, "/v1/simulate", &asked.to_string()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let body = body_json(&answer);
    assert_eq!(body["sent"], json!([50, 50, 50]), "{body}");
    let limit = &body["limits"][0];
    assert_eq!(limit["admitted"], json!([10, 10, 10]), "{body}");
    assert_eq!(limit["denied"], json!([40, 40, 40]), "{body}");
    assert_eq!(limit["algorithm"], "fixed_window");
    assert_eq!(limit["limit"], "10", "64-bit integers as strings");
    assert_eq!(limit["name"], "", "every field written");
    assert_eq!(body["step"], "1s");

    // The example of the OpenAPI document, all five algorithms: what the
    // library computes, number for number.
    let example = ratelimitd::http::console::simulate_example();
    let answer = post_json(port, "/v1/simulate", &example.to_string()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(body_json(&answer), computed(&example));

    // Not JSON, not an object, a wrong type, an unknown field.
    for (body, rule) in [
        ("{", "EOF while parsing"),
        ("", "EOF while parsing"),
        ("[]", "invalid type"),
        (r#"{"limits": {"name": "x"}}"#, "invalid type"),
        (r#"{"traffic": {"rate": "fast"}}"#, "invalid"),
        (r#"{"traffic": {"shape": "SQUARE"}}"#, "unknown variant"),
        (r#"{"nope": 1}"#, "unknown field `nope`"),
        (r#"{"traffic": {"nope": 1}}"#, "unknown field `nope`"),
    ] {
        let answer = post_json(port, "/v1/simulate", body).await;
        assert_refused(&answer, 400, "request", rule);
    }
    // Another content type, or none.
    let answer = request(
        port,
        "POST",
        "/v1/simulate",
        &[("content-type", "text/plain")],
        "{}",
    )
    .await
    .expect("an answer");
    assert_refused(&answer, 415, "content-type", "application/json");
    // Over --max-request-bytes: said by its length, or found reading.
    assert_body_bounded_at_2048(port, "/v1/simulate").await;

    // A run over its bounds, or with a bad limit: the field and the rule.
    let limits = json!([{"fixedWindow": {"limit": 10, "window": "1s"}}]);
    for (body, field, rule) in [
        (json!({"limits": limits}), "traffic", "is required"),
        (
            json!({"limits": limits, "traffic": {"shape": "STEADY", "rate": 1000, "duration": "3600s"}}),
            "traffic.rate",
            "at most 100000",
        ),
        (
            json!({"limits": limits, "traffic": {"shape": "STEADY", "rate": 1, "duration": "60s"}, "step": "0.001s"}),
            "step",
            "at most 10000",
        ),
        (
            json!({"limits": [], "traffic": {"shape": "STEADY", "rate": 1, "duration": "1s"}}),
            "limits",
            "1 to 10",
        ),
        (
            json!({"limits": [{"gcra": {"rate": 1, "burst": 1}}], "traffic": {"shape": "STEADY", "rate": 1, "duration": "1s"}}),
            "limits[0].gcra.period",
            "is required",
        ),
    ] {
        let answer = post_json(port, "/v1/simulate", &body.to_string()).await;
        assert_refused(&answer, 400, field, rule);
    }
    // Only POST.
    let wrong = request(port, "GET", "/v1/simulate", &[], "")
        .await
        .expect("an answer");
    assert_eq!(wrong.status, 405, "{wrong:?}");
    server.terminate().await;
}

/// The live series of `origin`/`name`/`algorithm` from a live view: its
/// allowed and denied, summed over the seconds shown.
fn live_totals(view: &Value, origin: &str, name: &str, algorithm: &str) -> (u64, u64) {
    let sum = |values: &Value| -> u64 {
        values
            .as_array()
            .expect("per-second counts")
            .iter()
            .map(|count| count.as_u64().expect("a count"))
            .sum()
    };
    view["series"]
        .as_array()
        .expect("series")
        .iter()
        .find(|series| {
            series["origin"] == origin && series["name"] == name && series["algorithm"] == algorithm
        })
        .map_or((0, 0), |series| {
            (sum(&series["allowed"]), sum(&series["denied"]))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_counts_decisions_as_prometheus_does_and_names_the_most_denied_keys() {
    let dir = tempfile::tempdir().expect("a config directory");
    std::fs::write(
        dir.path().join("policies.yaml"),
        "policies:\n  tiny:\n    - {per: 1h, limit: 1}\n",
    )
    .expect("write the policies");
    std::fs::write(
        dir.path().join("web.yaml"),
        "domain: web\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .expect("write the rules");
    let metrics = format!("127.0.0.1:{}", free_port());
    let config = dir.path().to_string_lossy().into_owned();
    let (server, port) = start(&[
        "--config",
        &config,
        "--metrics-listen",
        &metrics,
        "--failure-policy",
        "fail-open",
    ])
    .await;
    let metrics_port: u16 = metrics.rsplit(':').next().unwrap().parse().unwrap();

    // Nothing yet: every second at zero, the configuration shown.
    let answer = request(port, "GET", "/v1/console/live", &[], "")
        .await
        .expect("an answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.header("content-type"), Some("application/json"));
    let view = body_json(&answer);
    assert_eq!(view["failurePolicy"], "FAIL_OPEN");
    assert_eq!(view["store"]["serving"], true);
    assert_eq!(view["store"]["stores"], json!(["embedded"]));
    assert_eq!(view["times"].as_array().map(Vec::len), Some(300));
    assert_eq!(view["topDeniedKeys"], json!([]));

    // 5 on a limit of 2 for "hot", 1 for "cool"; twice the policy of 1.
    let hot = json!({"key": "hot", "fixedWindow": {"limit": 2, "window": "3600s"}}).to_string();
    for _ in 0..5 {
        assert_eq!(post_json(port, "/v1/check", &hot).await.status, 200);
    }
    let cool = json!({"key": "cool", "fixedWindow": {"limit": 2, "window": "3600s"}}).to_string();
    assert_eq!(post_json(port, "/v1/check", &cool).await.status, 200);
    let tiny = json!({"key": "someone", "policy": "tiny"}).to_string();
    for _ in 0..2 {
        assert_eq!(post_json(port, "/v1/check", &tiny).await.status, 200);
    }

    // Twice Envoy's rule of 1 an hour, through upstream's /json.
    let envoy =
        json!({"domain": "web", "descriptors": [{"entries": [{"key": "user", "value": "u1"}]}]});
    for status in [200, 429] {
        let answer = post_json(port, "/json", &envoy.to_string()).await;
        assert_eq!(answer.status, status, "{answer:?}");
    }

    let view = body_json(
        &request(port, "GET", "/v1/console/live", &[], "")
            .await
            .expect("an answer"),
    );
    assert_eq!(live_totals(&view, "request", "", "fixed_window"), (3, 3));
    assert_eq!(live_totals(&view, "policy", "tiny", "fixed_window"), (1, 1));
    assert_eq!(
        live_totals(&view, "rule", "web.user", "fixed_window"),
        (1, 1)
    );
    // The same decisions Prometheus counted.
    let (_, series) = common::prometheus::scrape(metrics_port).await;
    let prometheus = |outcome: &str| {
        common::prometheus::value(
            &series,
            "ratelimitd_decisions_total",
            &[("api", "check_limit"), ("outcome", outcome)],
        ) as u64
    };
    assert_eq!((prometheus("allowed"), prometheus("denied")), (4, 4));
    let keys: Vec<(String, u64)> = view["topDeniedKeys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| {
            (
                k["key"].as_str().expect("a key").to_owned(),
                k["denied"].as_u64().expect("a count"),
            )
        })
        .collect();
    assert_eq!(
        keys,
        // A policy's limit counts on `<policy>/<limit>:<key>`.
        // An Envoy descriptor's counter is named by its entries and window.
        [
            ("hot".to_owned(), 3),
            ("3:web|4:user|2:u1|w3600000".to_owned(), 1),
            ("tiny/1h:someone".to_owned(), 1),
        ],
        "{}",
        view["topDeniedKeys"]
    );
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_self_contained_and_runs_only_its_own_scripts() {
    let (server, port) = start(&[]).await;
    let page = request(port, "GET", "/", &[], "").await.expect("an answer");
    assert_eq!(page.status, 200, "{page:?}");
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert!(
        page.body.contains("uPlot (v1.6.32)"),
        "the chart library is inlined"
    );
    // Nothing from anywhere else: no URL but the page's own in a src or href.
    for attribute in ["src=\"http", "href=\"http", "src=\"//", "href=\"//"] {
        assert!(!page.body.contains(attribute), "{attribute} in the page");
    }
    let policy = page
        .header("content-security-policy")
        .expect("a Content-Security-Policy");
    assert!(
        policy.starts_with("default-src 'none'; script-src 'sha256-"),
        "{policy}"
    );
    assert!(policy.contains("connect-src 'self'"), "{policy}");
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    // Only GET.
    let wrong = request(port, "POST", "/", &[], "")
        .await
        .expect("an answer");
    assert_eq!(wrong.status, 405, "{wrong:?}");
    server.terminate().await;
}

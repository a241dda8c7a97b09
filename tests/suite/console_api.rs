//! The web console's routes against the built binary: `POST /v1/simulate`
//! answers the simulation the library computes for the same request, and
//! refuses every kind of bad body naming the field and the rule (not
//! JSON, a wrong type, an unknown field, another content type, a body over
//! `--max-request-bytes`, a run over its bounds); `GET /v1/console/live`
//! counts decisions as Prometheus does, names the most denied keys, and
//! lists each leased policy's holders with their shares until they go, in
//! the fields the OpenAPI document describes.

use crate::common;

use std::collections::BTreeSet;

use common::ServerProcess;
use common::free_port;
use common::http::{assert_body_bounded_at_2048, assert_refused, body_json, post_json, request};
use common::leases::{LeaseStream, ask as lease_ask};
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

/// The live view's leased policies, as `GET /v1/console/live` answers.
async fn live_leases(port: u16) -> Vec<Value> {
    let answer = request(port, "GET", "/v1/console/live", &[], "")
        .await
        .expect("an answer");
    assert_eq!(answer.status, 200, "{answer:?}");
    body_json(&answer)["leases"]
        .as_array()
        .expect("leases, a list")
        .clone()
}

/// The names of the properties the OpenAPI document gives schema `name`.
fn schema_properties(document: &Value, name: &str) -> BTreeSet<String> {
    document["components"]["schemas"][name]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("the document has no schema {name}"))
        .keys()
        .cloned()
        .collect()
}

fn keys_of(object: &Value) -> BTreeSet<String> {
    object
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect()
}

/// The holder of `key`'s lease among a leased policy's holders.
fn holder_of<'a>(policy: &'a Value, key: &str) -> &'a Value {
    policy["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|holder| holder["key"] == key)
        .unwrap_or_else(|| panic!("no holder of {key}: {policy}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_live_view_lists_each_leased_policys_holders_with_their_shares_until_they_go() {
    let dir = tempfile::tempdir().expect("a config directory");
    std::fs::write(
        dir.path().join("policies.yaml"),
        "policies:\n  hot:\n    - {per: 1s, limit: 1000, algorithm: token_bucket, lease: true}\n",
    )
    .expect("write the policies");
    let config = dir.path().to_string_lossy().into_owned();
    let (server, port) = start(&["--config", &config]).await;
    assert_eq!(
        live_leases(port).await,
        Vec::<Value>::new(),
        "nothing leased"
    );

    // Two client processes, each alone on its key: each one's share is
    // the whole rate of its key's bucket.
    let mut first = LeaseStream::open(server.address).await;
    let mut second = LeaseStream::open(server.address).await;
    let alpha = first
        .ask(pb::LeaseAsk {
            demand: 300.0,
            ..lease_ask("hot", "alpha")
        })
        .await;
    let beta = second
        .ask(pb::LeaseAsk {
            demand: 50.0,
            ..lease_ask("hot", "beta")
        })
        .await;
    assert!(alpha.error.is_none() && alpha.units > 0, "{alpha:?}");
    assert!(beta.error.is_none() && beta.units > 0, "{beta:?}");
    // The first admits 40 of its units and renews, wanting more.
    let renewed = first
        .ask(pb::LeaseAsk {
            demand: 320.0,
            admitted: 40,
            held: alpha.units - 40,
            ..lease_ask("hot", "alpha")
        })
        .await;
    assert!(renewed.error.is_none(), "{renewed:?}");

    // The view is written before the grant is sent: no wait.
    let leases = live_leases(port).await;
    assert_eq!(leases.len(), 1, "{leases:?}");
    let hot = &leases[0];
    assert_eq!(hot["policy"], "hot");
    assert_eq!(hot["holders"].as_array().map(Vec::len), Some(2), "{hot}");
    assert_eq!(hot["shareUnitsPerSecond"], 2000.0, "{hot}");
    let (a, b) = (holder_of(hot, "alpha"), holder_of(hot, "beta"));
    assert_eq!(a["shareUnitsPerSecond"], 1000.0, "{a}");
    assert_eq!(a["demandRequestsPerSecond"], 320.0, "{a}");
    assert_eq!(a["granted"], alpha.units + renewed.units, "{a}");
    assert_eq!(a["admitted"], 40, "{a}");
    assert_eq!(b["shareUnitsPerSecond"], 1000.0, "{b}");
    assert_eq!(b["demandRequestsPerSecond"], 50.0, "{b}");
    assert_eq!(b["granted"], beta.units, "{b}");
    assert_eq!(b["admitted"], 0, "{b}");
    // Holders are lease streams, `<instance>:l<n>`: two of one instance.
    let stream_of = |holder: &Value| -> (String, String) {
        let id = holder["holder"].as_str().expect("a holder id");
        let (instance, stream) = id.rsplit_once(':').expect("<instance>:l<n>");
        (instance.to_owned(), stream.to_owned())
    };
    let (instance_a, stream_a) = stream_of(a);
    let (instance_b, stream_b) = stream_of(b);
    assert_eq!(instance_a, instance_b);
    assert_ne!(stream_a, stream_b);
    for stream in [&stream_a, &stream_b] {
        assert!(
            stream
                .strip_prefix('l')
                .is_some_and(|n| n.parse::<u64>().is_ok()),
            "{stream}"
        );
    }

    // The document describes exactly the fields served.
    let document = body_json(
        &request(port, "GET", "/openapi.json", &[], "")
            .await
            .expect("an answer"),
    );
    assert!(schema_properties(&document, "LiveView").contains("leases"));
    assert_eq!(schema_properties(&document, "LeasedPolicy"), keys_of(hot));
    assert_eq!(schema_properties(&document, "LeaseHolder"), keys_of(a));

    // A client that goes away: its holder leaves once the server sees the
    // stream end.
    drop(second);
    common::eventually("the ended stream's holder to leave the view", || async {
        let leases = live_leases(port).await;
        leases.len() == 1 && leases[0]["holders"].as_array().map(Vec::len) == Some(1)
    })
    .await;
    let leases = live_leases(port).await;
    assert_eq!(holder_of(&leases[0], "alpha")["holder"], a["holder"]);
    assert_eq!(leases[0]["shareUnitsPerSecond"], 1000.0, "{}", leases[0]);

    // A release lets the last go: no policy is leased.
    let released = first
        .ask(pb::LeaseAsk {
            release: true,
            admitted: 0,
            held: alpha.units + renewed.units - 40,
            ..lease_ask("hot", "alpha")
        })
        .await;
    assert!(released.error.is_none(), "{released:?}");
    assert_eq!(live_leases(port).await, Vec::<Value>::new());
    server.terminate().await;
}

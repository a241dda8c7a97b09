//! The HTTP JSON API against the built binary: every operation its OpenAPI
//! document lists answers with a status the document lists (and the
//! document is valid OpenAPI, by openapi-spec-validator, and lists every
//! route the server has), and so does the README's example; bad bodies of every kind are refused naming the
//! field and the rule; slow bodies meet the read deadline; one key is
//! decided the same through HTTP and gRPC, in every form of the request;
//! a store that cannot decide is 503 and `/readyz` says so.

use crate::common;

use common::http::{
    HttpResponse, assert_body_bounded_at_2048, assert_refused, body_json, exchange, get, post_json,
    request,
};
use common::{RedisServer, ServerProcess, free_port};
use prost::Message;
use ratelimitd::http::Endpoint;
use ratelimitd::pb::json::ratelimitd::v1 as json;
use ratelimitd::pb::ratelimitd::v1 as pb;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The policy the document's policy example names, and one of our own.
const POLICIES: &str = "\
policies:
  free-tier:
    - {per: 1s, limit: 10}
    - {per: 1h, limit: 1000}
  plans:
    - {name: per-minute, per: 1m, limit: 100}
    - {name: daily, per: 1d, limit: 2}
";

/// A server process with its HTTP listener on a free loopback port and the
/// policies above, plus `flags`.
async fn start(flags: &[&str]) -> (ServerProcess, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a config directory");
    std::fs::write(dir.path().join("policies.yaml"), POLICIES).expect("write the policies");
    let config = dir.path().to_string_lossy().into_owned();
    let server = ServerProcess::builder()
        .flags(&["--config", &config])
        .flags(flags)
        .http()
        .logged()
        .start()
        .await;
    (server, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_answers_as_the_openapi_document_says_and_every_route_is_in_it() {
    let (server, _dir) = start(&[]).await;
    let port = server.http_port();
    let served = get(port, "/openapi.json", &[]).await.expect("an answer");
    assert_eq!(served.status, 200, "{served:?}");
    assert_eq!(served.header("content-type"), Some("application/json"));
    let document = body_json(&served);

    // Valid OpenAPI 3.1.
    common::openapi::assert_valid(&served.body);
    assert_eq!(document["openapi"], "3.1.0");

    // Every route the server has is in it, and nothing else.
    let paths = document["paths"].as_object().expect("paths");
    let mut listed: Vec<&str> = paths.keys().map(String::as_str).collect();
    // (The admin API's are served only with an admin token: tests/admin_api.rs.)
    let mut routes: Vec<&str> = Endpoint::served(false).map(|e| e.path()).collect();
    listed.sort_unstable();
    routes.sort_unstable();
    assert_eq!(listed, routes);

    // Every operation answers with a status it lists: each example body
    // of the POSTs (every form of CheckLimitRequest among them), and the
    // GETs; on this healthy server, each answers 200.
    let mut asked = 0;
    for (path, item) in paths {
        for (method, operation) in item.as_object().expect("a path item") {
            let statuses: Vec<u16> = operation["responses"]
                .as_object()
                .expect("responses")
                .keys()
                .map(|status| status.parse().expect("a status code"))
                .collect();
            let content = &operation["requestBody"]["content"]["application/json"];
            let bodies: Vec<String> = match content["examples"].as_object() {
                Some(examples) => examples
                    .values()
                    .map(|example| example["value"].to_string())
                    .collect(),
                None => vec![String::new()],
            };
            for body in bodies {
                let headers: &[(&str, &str)] = if body.is_empty() {
                    &[]
                } else {
                    &[("content-type", "application/json")]
                };
                let answer = request(port, &method.to_uppercase(), path, headers, &body)
                    .await
                    .expect("an answer");
                assert!(
                    statuses.contains(&answer.status),
                    "{method} {path} {body}: {} is not among {statuses:?}: {answer:?}",
                    answer.status
                );
                assert_eq!(answer.status, 200, "{method} {path} {body}: {answer:?}");
                asked += 1;
            }
        }
    }
    assert!(
        asked >= Endpoint::served(false).count() + 2,
        "the three forms of /v1/check"
    );

    // The README's example asks what the document says it may.
    let readme = include_str!("../../README.md");
    let example = readme
        .split("\n## Ask it over HTTP\n")
        .nth(1)
        .and_then(|section| section.split("-d '").nth(1))
        .and_then(|rest| rest.split('\'').next())
        .expect("the README's curl example, with -d '...'");
    let answer = post_json(port, "/v1/check", example).await;
    assert_eq!(body_json(&answer)["allowed"], true, "{answer:?}");

    // What is not listed is not served: another path, another method.
    let elsewhere = get(port, "/v1/nothing", &[]).await.expect("an answer");
    assert_eq!(elsewhere.status, 404, "{elsewhere:?}");
    for path in ["/v1/check", "/v1/check-many"] {
        let wrong = get(port, path, &[]).await.expect("an answer");
        assert_eq!(wrong.status, 405, "GET {path}: {wrong:?}");
    }
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_refused_naming_the_field_and_the_rule() {
    let (server, _dir) = start(&["--max-request-bytes", "2048"]).await;
    let port = server.http_port();
    for (path, wrong_type) in [
        ("/v1/check", r#"{"key": 5}"#),
        ("/v1/check-many", r#"{"requests": {"key": "k"}}"#),
    ] {
        // Not JSON, not an object, a wrong type, an unknown field.
        for (body, rule) in [
            ("{", "EOF while parsing"),
            ("", "EOF while parsing"),
            ("[]", "invalid type"),
            (wrong_type, "invalid type"),
            (r#"{"nope": 1}"#, "unknown field `nope`"),
        ] {
            let answer = post_json(port, path, body).await;
            assert_refused(&answer, 400, "request", rule);
        }
        // Another content type, or none.
        let answer = request(port, "POST", path, &[("content-type", "text/plain")], "{}")
            .await
            .expect("an answer");
        assert_refused(&answer, 415, "content-type", "application/json");
        let answer = request(port, "POST", path, &[], "{}")
            .await
            .expect("an answer");
        assert_refused(&answer, 415, "content-type", "application/json");
        // Over --max-request-bytes: said by its length, or found reading.
        assert_body_bounded_at_2048(port, path).await;
    }
    // The service's own rules, as gRPC names them.
    for (body, status, field, rule) in [
        (
            r#"{"key": "", "fixedWindow": {"limit": 5, "window": "1s"}}"#,
            400,
            "key",
            "",
        ),
        (
            r#"{"key": "k", "fixedWindow": {"limit": "5", "window": "0s"}}"#,
            400,
            "fixed_window.window",
            "",
        ),
        (
            r#"{"key": "k", "tokenBucket": {"capacity": "5", "refillPerSecond": -1}}"#,
            400,
            "token_bucket.refill_per_second",
            "",
        ),
        (r#"{"key": "k"}"#, 400, "", ""),
        (
            r#"{"key": "k", "policy": "nobody"}"#,
            404,
            "policy",
            "nobody",
        ),
    ] {
        let answer = post_json(port, "/v1/check", body).await;
        assert_eq!(answer.status, status, "{body}: {answer:?}");
        let refusal = body_json(&answer);
        assert!(
            refusal["field"]
                .as_str()
                .is_some_and(|named| named.starts_with(field)),
            "{body}: {refusal}"
        );
        assert!(
            refusal["rule"]
                .as_str()
                .is_some_and(|text| !text.is_empty() && text.contains(rule)),
            "{body}: {refusal}"
        );
    }
    // A batch malformed as a whole; a bad item in a good batch is its own
    // error, and the others are decided.
    let empty = post_json(port, "/v1/check-many", r#"{"requests": []}"#).await;
    assert_refused(&empty, 400, "requests", "must not be empty");
    let mixed = post_json(
        port,
        "/v1/check-many",
        r#"{"requests": [{"key": ""}, {"key": "k", "gcra": {"rate": 1, "period": "1s", "burst": 1}}]}"#,
    )
    .await;
    assert_eq!(mixed.status, 200, "{mixed:?}");
    let results = body_json(&mixed);
    assert_eq!(results["results"][0]["error"]["code"], 3, "{results}");
    assert_eq!(
        results["results"][1]["response"]["allowed"], true,
        "{results}"
    );
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_slower_than_the_read_deadline_gets_408_and_slow_headers_a_closed_connection() {
    let (server, _dir) = start(&["--http-read-timeout", "300ms"]).await;
    let port = server.http_port();
    // Half a body, and then nothing: the server answers when its deadline
    // passes, on each endpoint that reads one.
    for path in ["/v1/check", "/v1/check-many", "/json"] {
        let half = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\
             content-type: application/json\r\ncontent-length: 40\r\n\r\n{{\"key\": "
        );
        let answer = exchange(port, half.as_bytes()).await.expect("an answer");
        assert_eq!(answer.status, 408, "{path}: {answer:?}");
        if path != "/json" {
            assert_refused(&answer, 408, "request", "--http-read-timeout");
        }
    }
    // Half the headers, and then nothing: the server closes the
    // connection when its deadline passes (PATIENCE only bounds a server
    // that never would).
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stream
        .write_all(b"POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-")
        .await
        .expect("half the headers");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(common::PATIENCE, stream.read_to_end(&mut answer)).await;
    assert!(
        matches!(read, Ok(Ok(_))),
        "the server kept a connection whose headers stalled: {read:?}"
    );
    assert!(
        !String::from_utf8_lossy(&answer).contains(" 200 "),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    server.terminate().await;
}

/// A client that writes its whole request before reading (as Python's
/// `urllib` and Node's `fetch` do) still gets the early answer to a body
/// over `--max-request-bytes`: the server reads and throws away what is
/// still coming before it closes, rather than resetting the connection,
/// and counts that it did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_a_whole_oversized_body_before_reading_gets_its_413() {
    let metrics = format!("127.0.0.1:{}", free_port());
    // The linger's time bound is the read timeout: generous here, so a
    // loaded machine's slow client is not cut off before it closes.
    let (server, _dir) = start(&["--metrics-listen", &metrics, "--http-read-timeout", "60s"]).await;
    let port = server.http_port();
    let metrics_port: u16 = metrics
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("a port");

    // 8 MiB where 1 MiB is the bound, all written before a byte is read.
    let body = vec![b' '; 8 << 20];
    let mut raw = format!(
        "POST /v1/check HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(&body);
    let answer = exchange(port, &raw)
        .await
        .expect("the 413, not a connection reset while the body was written");
    assert_refused(&answer, 413, "request", "--max-request-bytes");

    // Python's urllib, as a user's script would send it.
    let script = format!(
        "import urllib.request, urllib.error\n\
         request = urllib.request.Request('http://127.0.0.1:{port}/v1/check', \
         data=b' ' * (8 << 20), headers={{'content-type': 'application/json'}})\n\
         try:\n    urllib.request.urlopen(request)\n\
         except urllib.error.HTTPError as error:\n    print(error.code, error.read().decode())\n"
    );
    let python = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", &script])
            .output()
            .expect("python3 (a prerequisite of the suite)")
    })
    .await
    .expect("python's thread");
    let printed = String::from_utf8_lossy(&python.stdout);
    assert!(
        python.status.success()
            && printed.starts_with("413 ")
            && printed.contains("--max-request-bytes"),
        "urllib: {printed}{}",
        String::from_utf8_lossy(&python.stderr)
    );

    // Both lingering closes counted, with (nearly) all they threw away.
    common::wait::settle("the lingering closes counted", || async {
        let (_, series) = common::prometheus::scrape(metrics_port).await;
        let ends: Vec<(String, f64)> = ["closed", "byte_limit", "time_limit", "error"]
            .into_iter()
            .map(|end| {
                let count = common::prometheus::matching(
                    &series,
                    "ratelimitd_http_lingering_closes_total",
                    &[("end", end)],
                )
                .sum();
                (end.to_owned(), count)
            })
            .collect();
        let discarded: f64 = common::prometheus::matching(
            &series,
            "ratelimitd_http_lingering_discarded_bytes_total",
            &[],
        )
        .sum();
        let closed = ends.first().map_or(0.0, |(_, count)| *count);
        if closed == 2.0 && discarded > 2.0 * 7.0 * 1024.0 * 1024.0 {
            Ok(())
        } else {
            Err(format!(
                "lingering closes by end {ends:?}, {discarded} bytes discarded"
            ))
        }
    })
    .await;
    server.terminate().await;
}

/// An HTTP decision, as the gRPC type.
fn decision(response: &HttpResponse) -> pb::CheckLimitResponse {
    assert_eq!(response.status, 200, "{response:?}");
    let read: json::CheckLimitResponse =
        serde_json::from_str(&response.body).expect("a CheckLimitResponse");
    pb::CheckLimitResponse::decode(read.encode_to_vec().as_slice()).expect("the same message")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_grpc_decide_one_key_together_in_every_form() {
    let redis = RedisServer::start().await;
    let (server, _dir) = start(&["--redis-url", &redis.url()]).await;
    let port = server.http_port();
    let mut client = server.client().await;
    // This test's own Redis: no other run has spent on the key.
    let key = "both".to_owned();

    // One limit of 3 a minute on one key: HTTP and gRPC spend the same
    // counter, turn about.
    let asked = json!({"key": key, "fixedWindow": {"limit": "3", "window": "60s"}});
    let grpc_request = pb::CheckLimitRequest {
        key: key.clone(),
        algorithm: Some(pb::check_limit_request::Algorithm::FixedWindow(
            pb::FixedWindow {
                limit: 3,
                window: Some(prost_types::Duration {
                    seconds: 60,
                    nanos: 0,
                }),
            },
        )),
        ..Default::default()
    };
    let first = post_json(port, "/v1/check", &asked.to_string()).await;
    let first_decision = decision(&first);
    assert!(first_decision.allowed);
    assert_eq!(first_decision.remaining, 2);
    assert_eq!(
        first.header("ratelimit-policy"),
        Some(r#""default";q=3;w=60"#)
    );
    assert!(
        first
            .header("ratelimit")
            .is_some_and(|value| value.starts_with(r#""default";r=2;t="#)),
        "{first:?}"
    );
    assert_eq!(first.header("retry-after"), None);
    let second = client
        .check_limit(grpc_request.clone())
        .await
        .expect("a decision")
        .into_inner();
    assert!(second.allowed);
    assert_eq!(second.remaining, 1, "HTTP spent on the same counter");
    let third = decision(&post_json(port, "/v1/check", &asked.to_string()).await);
    assert_eq!((third.allowed, third.remaining), (true, 0));
    let denied_grpc = client
        .check_limit(grpc_request.clone())
        .await
        .expect("a decision")
        .into_inner();
    assert!(!denied_grpc.allowed);
    // Denied is 200 with the decision, and Retry-After.
    let denied = post_json(port, "/v1/check", &asked.to_string()).await;
    let denied_http = decision(&denied);
    assert!(!denied_http.allowed);
    assert_eq!(
        (denied_http.limit, denied_http.remaining),
        (denied_grpc.limit, denied_grpc.remaining)
    );
    let body = body_json(&denied);
    assert_eq!(body["allowed"], false, "written, not left out: {body}");
    assert_eq!(body["limit"], "3", "64-bit integers as strings: {body}");
    let wait: u64 = denied
        .header("retry-after")
        .and_then(|value| value.parse().ok())
        .expect("Retry-After in seconds");
    assert!((1..=60).contains(&wait), "{denied:?}");

    // Several limits: the statuses and the most restrictive, as gRPC.
    let several_key = format!("{key}-several");
    let several = json!({"key": several_key, "limits": [
        {"name": "per-minute", "slidingWindow": {"limit": "10", "window": "60s"}},
        {"name": "burst", "gcra": {"rate": "2", "period": "60s", "burst": "2"}}
    ]});
    let by_http = post_json(port, "/v1/check", &several.to_string()).await;
    let by_http_decision = decision(&by_http);
    assert_eq!(by_http_decision.limits.len(), 2);
    assert_eq!(
        by_http.header("ratelimit-policy"),
        Some(r#""burst";q=2;w=60"#),
        "{by_http_decision:?}"
    );
    let several_grpc: pb::CheckLimitRequest = {
        let read: json::CheckLimitRequest =
            serde_json::from_value(several.clone()).expect("a request");
        pb::CheckLimitRequest::decode(read.encode_to_vec().as_slice()).expect("the same")
    };
    let by_grpc = client
        .check_limit(several_grpc)
        .await
        .expect("a decision")
        .into_inner();
    assert_eq!(by_grpc.limits[0].remaining, 8, "both spent on per-minute");
    assert_eq!(by_grpc.limits[1].remaining, 0, "both spent on burst");
    let spent = decision(&post_json(port, "/v1/check", &several.to_string()).await);
    assert!(!spent.allowed);
    assert_eq!(spent.limits[0].remaining, 8, "a denial spends nothing");

    // A named policy.
    let policy = json!({"key": format!("{key}-policy"), "policy": "plans"});
    let first = post_json(port, "/v1/check", &policy.to_string()).await;
    assert_eq!(first.header("ratelimit-policy"), Some(r#""daily";q=2"#));
    assert_eq!(decision(&first).limits[1].remaining, 1);
    let again = client
        .check_limit(pb::CheckLimitRequest {
            key: format!("{key}-policy"),
            policy: "plans".into(),
            ..Default::default()
        })
        .await
        .expect("a decision")
        .into_inner();
    assert_eq!(again.limits[1].remaining, 0);

    // The batch: each item as /v1/check would decide it.
    let batch = json!({"requests": [asked, policy]});
    let answer = post_json(port, "/v1/check-many", &batch.to_string()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let results = body_json(&answer);
    assert_eq!(results["results"][0]["response"]["allowed"], false);
    assert_eq!(results["results"][1]["response"]["allowed"], false);
    server.terminate().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_cannot_decide_is_503_and_readyz_says_so() {
    let mut redis = RedisServer::start().await;
    let (server, _dir) = start(&[
        "--redis-url",
        &redis.url(),
        "--redis-command-timeout",
        "300ms",
        "--health-interval",
        "100ms",
    ])
    .await;
    let port = server.http_port();
    let ready = get(port, "/readyz", &[]).await.expect("an answer");
    assert_eq!(ready.status, 200, "{ready:?}");
    assert_eq!(
        body_json(&ready),
        json!({"status": "SERVING", "store": true, "rules": true, "open": true, "stopping": false})
    );
    redis.kill();
    common::eventually("/readyz to say 503", || async {
        get(port, "/readyz", &[]).await.map(|answer| answer.status) == Some(503)
    })
    .await;
    let not_ready = body_json(&get(port, "/readyz", &[]).await.expect("an answer"));
    assert_eq!(not_ready["status"], "NOT_SERVING");
    assert_eq!(not_ready["store"], false);
    let alive = get(port, "/healthz", &[]).await.expect("an answer");
    assert_eq!(alive.status, 200, "alive all the same: {alive:?}");

    let ask = r#"{"key": "down", "fixedWindow": {"limit": "5", "window": "10s"}}"#;
    let down = post_json(port, "/v1/check", ask).await;
    assert_eq!(down.status, 503, "{down:?}");
    assert_eq!(body_json(&down)["code"], "UNAVAILABLE");
    // The failure policy answers first when it can: a decision, degraded.
    let open = post_json(
        port,
        "/v1/check",
        r#"{"key": "down", "fixedWindow": {"limit": "5", "window": "10s"}, "failurePolicy": "FAIL_OPEN"}"#,
    )
    .await;
    let answer = decision(&open);
    assert!(answer.allowed && answer.degraded, "{answer:?}");

    redis.restart().await;
    common::eventually("/readyz to say 200 again", || async {
        get(port, "/readyz", &[]).await.map(|answer| answer.status) == Some(200)
    })
    .await;
    assert_eq!(post_json(port, "/v1/check", ask).await.status, 200);
    server.terminate().await;
}

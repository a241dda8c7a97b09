//! `CheckLimits`: many independent requests in one call, each decided as
//! `CheckLimit` would and answered on its own (errors per item), exactly
//! under the concurrency inside one batch; a batch that is empty or too
//! large is refused whole.

use crate::common;

use std::collections::HashMap;

use common::{RedisServer, TestServer, every_algorithm, fixed_window, request};
use ratelimitd::pb::ratelimitd::v1 as pb;
use ratelimitd::pb::ratelimitd::v1::check_limit_result::Result as ItemResult;
use tonic::Code;

/// What one item of the batch below should get.
enum Expected {
    /// A decision on this counter (key and algorithm), whose limit is 3.
    Decided(String),
    /// An error with this code, its message starting so.
    Error(Code, &'static str),
}

/// 1000 items: 35 keys under every algorithm, each counter asked 4 times
/// with a limit of 3, and invalid items among them (a bad parameter, an
/// unknown policy, an empty key).
fn batch() -> (Vec<pb::CheckLimitRequest>, Vec<Expected>) {
    let algorithms = every_algorithm(3);
    let mut items = Vec::new();
    let mut expected = Vec::new();
    for i in 0..1000 {
        let (item, outcome) = match i % 10 {
            7 => (
                request(
                    "k",
                    fixed_window(0, std::time::Duration::from_secs(60)),
                    None,
                ),
                Expected::Error(
                    Code::InvalidArgument,
                    "fixed_window.limit: must be at least 1",
                ),
            ),
            8 => (
                pb::CheckLimitRequest {
                    key: "k".into(),
                    policy: "nowhere".into(),
                    ..Default::default()
                },
                Expected::Error(Code::NotFound, "policy: 'nowhere' is not defined"),
            ),
            9 => (
                pb::CheckLimitRequest {
                    key: String::new(),
                    ..request("k", algorithms[0], None)
                },
                Expected::Error(Code::InvalidArgument, "key: must not be empty"),
            ),
            _ => {
                // Every key under every algorithm, 4 times each.
                let algorithm = (i / 50) % algorithms.len();
                let key = format!("b-{}", i % 50);
                (
                    request(&key, algorithms[algorithm], None),
                    Expected::Decided(format!("{key}/{algorithm}")),
                )
            }
        };
        items.push(item);
        expected.push(outcome);
    }
    (items, expected)
}

async fn every_item_gets_its_own_answer(server: &TestServer) {
    let mut client = server.client().await;
    let (items, expected) = batch();
    let response = client
        .check_limits(pb::CheckLimitsRequest { requests: items })
        .await
        .expect("the batch is answered")
        .into_inner();
    assert_eq!(response.results.len(), 1000);
    let mut attempts: HashMap<&str, (u64, u64)> = HashMap::new();
    for (i, (result, expected)) in response.results.iter().zip(&expected).enumerate() {
        match (&result.result, expected) {
            (Some(ItemResult::Response(answer)), Expected::Decided(counter)) => {
                let (asked, allowed) = attempts.entry(counter).or_default();
                *asked += 1;
                *allowed += u64::from(answer.allowed);
                assert_eq!(answer.limit, 3, "item {i}");
            }
            (Some(ItemResult::Error(status)), Expected::Error(code, message)) => {
                assert_eq!(status.code, *code as i32, "item {i}: {status:?}");
                assert!(status.message.starts_with(message), "item {i}: {status:?}");
            }
            (other, _) => panic!("item {i} answered {other:?}"),
        }
    }
    // Each counter allowed exactly its limit: the items of one batch,
    // decided concurrently, are as exact as separate calls.
    assert_eq!(attempts.len(), 35 * 5, "35 keys under 5 algorithms");
    for (counter, (asked, allowed)) in attempts {
        assert_eq!(asked, 4, "{counter}");
        assert_eq!(allowed, 3, "{counter}: {allowed} of {asked}");
    }
}

#[tokio::test]
async fn a_batch_of_1000_on_the_embedded_store() {
    let server = TestServer::memory().await;
    every_item_gets_its_own_answer(&server).await;
}

#[tokio::test]
async fn a_batch_of_1000_on_redis() {
    let redis = RedisServer::start().await;
    let server = TestServer::on_redis(&redis).await;
    every_item_gets_its_own_answer(&server).await;
}

#[tokio::test]
async fn an_empty_or_too_large_batch_is_refused_whole() {
    let server = TestServer::start(&["--max-batch-size", "10"]).await;
    let mut client = server.client().await;
    let empty = client
        .check_limits(pb::CheckLimitsRequest::default())
        .await
        .expect_err("empty");
    assert_eq!(empty.code(), Code::InvalidArgument);
    assert_eq!(empty.message(), "requests: must not be empty");
    let item = request("k", every_algorithm(1)[0], None);
    let eleven = client
        .check_limits(pb::CheckLimitsRequest {
            requests: vec![item.clone(); 11],
        })
        .await
        .expect_err("too large");
    assert_eq!(eleven.code(), Code::InvalidArgument);
    assert!(
        eleven
            .message()
            .starts_with("requests: must hold at most 10 requests (got 11)"),
        "{eleven:?}"
    );
    // Ten is fine, and nothing of the refused batch was spent.
    let ten = client
        .check_limits(pb::CheckLimitsRequest {
            requests: vec![item; 10],
        })
        .await
        .expect("ten")
        .into_inner();
    let allowed = ten
        .results
        .iter()
        .filter(|result| matches!(&result.result, Some(ItemResult::Response(r)) if r.allowed))
        .count();
    assert_eq!(allowed, 1);
}

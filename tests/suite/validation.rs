//! Every malformed `CheckLimit` gets `INVALID_ARGUMENT` naming the field and
//! the rule, and writes nothing to Redis.

use crate::common;

use std::time::Duration;

use common::{
    RedisServer, TestServer, fixed_window, gcra, request, sliding_window, sliding_window_counter,
    token_bucket,
};
use ratelimitd::limit::{MAX_KEY_BYTES, MAX_QUANTITY, MAX_SLIDING_WINDOW_LIMIT, MAX_WINDOW};
use ratelimitd::pb::ratelimitd::v1 as pb;
use tonic::Code;

fn fixed_with_window(window: Option<prost_types::Duration>) -> pb::check_limit_request::Algorithm {
    pb::check_limit_request::Algorithm::FixedWindow(pb::FixedWindow { limit: 5, window })
}

fn window(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos })
}

/// (what is wrong, the request, the field the error must name)
fn bad_requests() -> Vec<(&'static str, pb::CheckLimitRequest, &'static str)> {
    let second = Duration::from_secs(1);
    let ok = || fixed_window(5, second);
    vec![
        ("empty key", request("", ok(), None), "key"),
        (
            "key over the maximum",
            request(&"k".repeat(MAX_KEY_BYTES + 1), ok(), None),
            "key",
        ),
        (
            "no algorithm",
            pb::CheckLimitRequest {
                key: "k".into(),
                algorithm: None,
                ..Default::default()
            },
            "algorithm",
        ),
        (
            "limit 0",
            request("k", fixed_window(0, second), None),
            "fixed_window.limit",
        ),
        (
            "limit over the maximum",
            request("k", fixed_window(MAX_QUANTITY + 1, second), None),
            "fixed_window.limit",
        ),
        (
            "sliding limit 0",
            request("k", sliding_window(0, second), None),
            "sliding_window.limit",
        ),
        (
            "sliding limit over its maximum",
            request(
                "k",
                sliding_window(MAX_SLIDING_WINDOW_LIMIT + 1, second),
                None,
            ),
            "sliding_window.limit",
        ),
        (
            "capacity 0",
            request("k", token_bucket(0, 1.0), None),
            "token_bucket.capacity",
        ),
        (
            "window missing",
            request("k", fixed_with_window(None), None),
            "fixed_window.window",
        ),
        (
            "window zero",
            request("k", fixed_with_window(window(0, 0)), None),
            "fixed_window.window",
        ),
        (
            "window negative",
            request("k", fixed_with_window(window(-1, 0)), None),
            "fixed_window.window",
        ),
        (
            "window above the maximum",
            request(
                "k",
                fixed_with_window(window(MAX_WINDOW.as_secs() as i64 + 1, 0)),
                None,
            ),
            "fixed_window.window",
        ),
        (
            "window not whole milliseconds",
            request("k", fixed_with_window(window(0, 1_500_000)), None),
            "fixed_window.window",
        ),
        (
            "sliding window zero",
            request(
                "k",
                pb::check_limit_request::Algorithm::SlidingWindow(pb::SlidingWindow {
                    limit: 5,
                    window: window(0, 0),
                }),
                None,
            ),
            "sliding_window.window",
        ),
        (
            "sliding window counter limit 0",
            request("k", sliding_window_counter(0, Duration::from_secs(1)), None),
            "sliding_window_counter.limit",
        ),
        (
            "gcra rate 0",
            request("k", gcra(0, Duration::from_secs(1), 5), None),
            "gcra.rate",
        ),
        (
            "gcra burst 0",
            request("k", gcra(5, Duration::from_secs(1), 0), None),
            "gcra.burst",
        ),
        (
            "gcra faster than one per microsecond",
            request("k", gcra(2_000_000, Duration::from_secs(1), 5), None),
            "gcra.rate",
        ),
        (
            "gcra burst taking over a year to earn back",
            request("k", gcra(1, Duration::from_secs(86_400), 400), None),
            "gcra.burst",
        ),
        (
            "gcra period of 1.5 ms",
            request("k", gcra(1, Duration::from_micros(1500), 1), None),
            "gcra.period",
        ),
        (
            "refill zero",
            request("k", token_bucket(5, 0.0), None),
            "token_bucket.refill_per_second",
        ),
        (
            "refill negative",
            request("k", token_bucket(5, -1.0), None),
            "token_bucket.refill_per_second",
        ),
        (
            "refill NaN",
            request("k", token_bucket(5, f64::NAN), None),
            "token_bucket.refill_per_second",
        ),
        (
            "refill infinite",
            request("k", token_bucket(5, f64::INFINITY), None),
            "token_bucket.refill_per_second",
        ),
        (
            "refill too slow to ever expire",
            request("k", token_bucket(5, 1e-9), None),
            "token_bucket.refill_per_second",
        ),
        (
            "cost over the maximum",
            request("k", ok(), Some(MAX_QUANTITY + 1)),
            "cost",
        ),
    ]
}

async fn assert_each_is_refused(server: &TestServer) {
    let mut client = server.client().await;
    for (what, request, field) in bad_requests() {
        let status = client.check_limit(request).await.expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert!(
            status.message().starts_with(&format!("{field}: ")),
            "{what}: message {:?} should name {field}",
            status.message()
        );
    }
}

#[tokio::test]
async fn bad_requests_are_refused_on_redis_and_write_nothing() {
    let redis = RedisServer::start().await;
    let server = TestServer::on_redis(&redis).await;
    assert_each_is_refused(&server).await;
    assert_eq!(redis.keys().await, Vec::<String>::new());
    server.stop().await;
}

#[tokio::test]
async fn bad_requests_are_refused_on_the_embedded_store() {
    let server = TestServer::memory().await;
    assert_each_is_refused(&server).await;
    server.stop().await;
}

#[tokio::test]
async fn messages_state_the_rule() {
    let server = TestServer::memory().await;
    let mut client = server.client().await;
    let status = client
        .check_limit(request("k", token_bucket(5, f64::NAN), None))
        .await
        .expect_err("NaN rate");
    assert_eq!(
        status.message(),
        "token_bucket.refill_per_second: must be a finite number"
    );
    let status = client
        .check_limit(request("", fixed_window(1, Duration::from_secs(1)), None))
        .await
        .expect_err("empty key");
    assert_eq!(status.message(), "key: must not be empty");
    server.stop().await;
}

/// Sends `body` as the raw protobuf message of the unary call at `path`.
async fn raw_call(server: &TestServer, path: &'static str, body: Vec<u8>) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(common::channel(server.address).await);
    grpc.ready().await.expect("channel ready");
    grpc.unary::<_, pb::CheckLimitResponse, _>(
        tonic::Request::new(body),
        http::uri::PathAndQuery::from_static(path),
        RawBytes,
    )
    .await
    .expect_err("an undecodable request is refused")
}

/// Encodes a `Vec<u8>` as it is; decodes replies as `CheckLimitResponse`
/// (never reached: every call here is refused).
#[derive(Clone, Default)]
struct RawBytes;

struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Codec for RawBytes {
    type Encode = Vec<u8>;
    type Decode = pb::CheckLimitResponse;
    type Encoder = RawEncoder;
    type Decoder = tonic_prost::ProstDecoder<pb::CheckLimitResponse>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

/// Bytes that are not a protobuf message of the request's type.
fn undecodable_bodies() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("a varint cut short", vec![0x08, 0xff]),
        ("a length past the end", vec![0x0a, 0x10, b'k']),
        ("wire type 7 does not exist", vec![0x0f, 0x00]),
        ("field number 0", vec![0x00, 0x01]),
        ("key not UTF-8", vec![0x0a, 0x02, 0xc3, 0x28]),
        ("a nested message cut short", vec![0x12, 0x02, 0x08]),
    ]
}

#[tokio::test]
async fn undecodable_requests_are_invalid_argument_on_both_apis_and_write_nothing() {
    let redis = RedisServer::start().await;
    let server = TestServer::on_redis(&redis).await;
    for path in [
        "/ratelimitd.v1.RateLimiter/CheckLimit",
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    ] {
        for (what, body) in undecodable_bodies() {
            let status = raw_call(&server, path, body).await;
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "{path}, {what}: {status:?}"
            );
            assert!(
                status
                    .message()
                    .starts_with("request: not a valid protobuf message"),
                "{path}, {what}: {status:?}"
            );
        }
    }
    assert_eq!(redis.keys().await, Vec::<String>::new());
    // Well-formed requests on the same server are still decided.
    common::assert_two_of_three_admitted(&mut server.client().await, "after-garbage").await;
    server.stop().await;
}

//! `/json`, as envoyproxy/ratelimit serves it for clients that cannot speak
//! gRPC: a `RateLimitRequest` in proto3's JSON mapping in, the
//! `RateLimitResponse` out, decided as the gRPC port's `ShouldRateLimit`
//! decides ([`EnvoyService::answer`]). The JSON is pbjson's (camelCase
//! names out, either form in; enums by name; 64-bit integers as strings;
//! unknown fields refused), on message types that share the protobuf
//! encoding with the gRPC ones ([`crate::pb::json`]): the request and
//! response cross between the two through it.
//!
//! Statuses, as upstream's: 400 for a body that is not such a request and
//! for a request the service refuses (no domain, no descriptors, beyond
//! the bounds); 429 when the overall code is OVER_LIMIT; 500 when the
//! overall code is UNKNOWN or the service failed (the store, with a failure
//! policy that does not answer); 503 while the gRPC port is not open
//! (upstream's HTTP port is not open either then); 413 for a body over
//! `--max-request-bytes` and 408 for one slower than
//! `--http-read-timeout` ([`super::body`]); else 200. Errors are a status
//! line's text, as Go's `http.Error` writes them.

use axum::body::Body;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, any};
use prost::Message;
use tracing::{debug, warn};

use super::body::{self, BodyBounds, BodyError};
use super::status_only;
use crate::api::envoy::EnvoyService;
use crate::error::Error;
use crate::health::Health;
use crate::pb::envoy::service::ratelimit::v3 as rls;
use crate::pb::json::envoy::service::ratelimit::v3 as json;

/// `/json` on `envoy`, with bodies within `bounds`, answering only while
/// `health` says the gRPC port is open. Any method, as upstream.
pub(crate) fn route(envoy: EnvoyService, health: Health, bounds: BodyBounds) -> MethodRouter {
    any(move |headers: HeaderMap, body: Body| {
        answer(envoy.clone(), health.clone(), bounds, headers, body)
    })
}

async fn answer(
    envoy: EnvoyService,
    health: Health,
    bounds: BodyBounds,
    headers: HeaderMap,
    body: Body,
) -> Response {
    // Before the gRPC port opens (waiting for the first xDS
    // configuration) and once it closes at shutdown, gRPC would not
    // answer either.
    if !health.is_open() {
        return status_only(StatusCode::SERVICE_UNAVAILABLE);
    }
    let body = match body::read(body, &headers, bounds).await {
        Ok(body) => body,
        Err(err) => {
            warn!(%err, "/json: the body");
            return status_only(match err {
                BodyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
                BodyError::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
                BodyError::Broken(_) => StatusCode::BAD_REQUEST,
            });
        }
    };
    let request = match read(&body) {
        Ok(request) => request,
        Err(err) => {
            warn!(%err, "/json: not a RateLimitRequest");
            return status_only(StatusCode::BAD_REQUEST);
        }
    };
    match envoy.answer(None, &request).await {
        Ok(response) => write(response),
        Err(err) => {
            warn!(%err, "/json: refused");
            status_only(status_of(&err))
        }
    }
}

/// The status of a call the service did not answer: 400 for a request it
/// refused, as upstream's; 500 for the rest (the store; every decision
/// slot taken).
fn status_of(err: &Error) -> StatusCode {
    match err {
        Error::InvalidArgument(_) | Error::NotFound(_) => StatusCode::BAD_REQUEST,
        Error::Store(_) | Error::Overloaded(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The request in `body`, as the gRPC service takes it.
fn read(body: &[u8]) -> Result<rls::RateLimitRequest, String> {
    let request: json::RateLimitRequest =
        serde_json::from_slice(body).map_err(|err| err.to_string())?;
    rls::RateLimitRequest::decode(request.encode_to_vec().as_slice()).map_err(|err| err.to_string())
}

/// The response as JSON, with its status.
fn write(response: rls::RateLimitResponse) -> Response {
    let (code, body) = match to_json(&response) {
        Ok(written) => written,
        Err(err) => {
            warn!(%err, "/json: cannot write the response");
            return status_only(StatusCode::INTERNAL_SERVER_ERROR);
        }
    };
    debug!(?code, "/json answered");
    let status = match code {
        json::rate_limit_response::Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
        json::rate_limit_response::Code::Unknown => StatusCode::INTERNAL_SERVER_ERROR,
        json::rate_limit_response::Code::Ok => StatusCode::OK,
    };
    (status, [(CONTENT_TYPE, "application/json")], body).into_response()
}

/// The response's overall code, and the response in JSON.
fn to_json(
    response: &rls::RateLimitResponse,
) -> Result<(json::rate_limit_response::Code, Vec<u8>), String> {
    let response = json::RateLimitResponse::decode(response.encode_to_vec().as_slice())
        .map_err(|err| err.to_string())?;
    let body = serde_json::to_vec(&response).map_err(|err| err.to_string())?;
    Ok((response.overall_code(), body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_either_name_form_and_numbers_as_strings() {
        let request = read(
            br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}],
                "limit":{"requests_per_unit":"5","unit":"MINUTE"},"hitsAddend":"7"}],
                "hits_addend":2}"#,
        )
        .unwrap();
        assert_eq!(request.domain, "d");
        assert_eq!(request.hits_addend, 2);
        let descriptor = &request.descriptors[0];
        assert_eq!(descriptor.entries[0].value, "v");
        let limit = descriptor.limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (5, 2));
        assert_eq!(descriptor.hits_addend, Some(7));
        for bad in [
            &b""[..],
            b"[]",
            br#"{"domain":"d","nope":1}"#,
            br#"{"domain":5}"#,
        ] {
            assert!(read(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn responses_are_camel_case_with_enums_by_name_and_no_defaults() {
        let response = rls::RateLimitResponse {
            overall_code: rls::rate_limit_response::Code::OverLimit as i32,
            statuses: vec![rls::rate_limit_response::DescriptorStatus {
                code: rls::rate_limit_response::Code::OverLimit as i32,
                current_limit: Some(rls::rate_limit_response::RateLimit {
                    name: String::new(),
                    requests_per_unit: 1,
                    unit: rls::rate_limit_response::rate_limit::Unit::Minute as i32,
                }),
                limit_remaining: 0,
                duration_until_reset: Some(prost_types::Duration {
                    seconds: 30,
                    nanos: 0,
                }),
                quota: None,
            }],
            response_headers_to_add: vec![crate::pb::envoy::config::core::v3::HeaderValue {
                key: "RateLimit-Limit".into(),
                value: "1".into(),
                raw_value: Vec::new(),
            }],
            raw_body: vec![0, 1],
            ..Default::default()
        };
        let (_, body) = to_json(&response).unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "overallCode": "OVER_LIMIT",
                "statuses": [{
                    "code": "OVER_LIMIT",
                    "currentLimit": {"requestsPerUnit": 1, "unit": "MINUTE"},
                    "durationUntilReset": "30s"
                }],
                "responseHeadersToAdd": [{"key": "RateLimit-Limit", "value": "1"}],
                "rawBody": "AAE="
            })
        );
        let answer = write(response);
        assert_eq!(answer.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(answer.headers()[CONTENT_TYPE], "application/json");
    }
}

//! The JSON API of the service listener: `POST /v1/check` (`CheckLimit`,
//! in any of its forms: one limit, several, a named policy) and `POST
//! /v1/check-many` (`CheckLimits`, the batch), asked of the decision
//! service ([`crate::decider`]) through the same [`check::check_limit`]
//! and [`check::check_limits`] the gRPC port goes through; `GET /healthz` and `GET /readyz`, following
//! [`crate::health`]. Messages are proto3's JSON mapping as pbjson reads
//! and writes it ([`crate::pb::json`]: camelCase out, either name form in,
//! 64-bit integers as strings, enums by name, unknown fields refused); a
//! request crosses to the gRPC types through the protobuf encoding, as in
//! `/json`.
//!
//! Statuses: 200 with the decision, allowed or not (being over the limit
//! is an answer, never 429); 400 for a body that is not such a message
//! and for a request the service refuses, 404 for a policy the server does
//! not know, 408 for a body slower than `--http-read-timeout`, 413 for one
//! over `--max-request-bytes`, 415 for a content type other than JSON:
//! each with `{"field": ..., "rule": ...}`; 503 when no decision can be
//! had now (the store, after the failure policy; every decision slot
//! taken; the gRPC port not open), 500 for the rest: each with
//! `{"code": ..., "message": ...}`, the gRPC status.

use axum::body::Body;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use prost::Message;
use serde::Serialize;
use tracing::warn;

use super::body::{self, BodyBounds, BodyError};
use crate::api::check;
use crate::api::envoy::headers::sf_string;
use crate::decider::Decider;
use crate::error::Error;
use crate::health::Health;
use crate::pb::algorithm::StatedWindow;
use crate::pb::json::ratelimitd::v1 as json;
use crate::pb::ratelimitd::v1 as pb;

/// The media type the API reads and writes.
pub(crate) const JSON: &str = "application/json";

/// What the API's handlers share.
#[derive(Clone)]
pub(crate) struct Api {
    /// The decision service, asked as the gRPC `RateLimiter` asks it.
    pub decider: Decider,
    /// Whether the instance can decide.
    pub health: Health,
    /// How much a body may hold and how long it may take.
    pub bounds: BodyBounds,
}

/// A refused request: the field and the rule it breaks, as gRPC's
/// INVALID_ARGUMENT message names them.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Refusal {
    /// The field's path in the request (proto field names, e.g.
    /// `fixed_window.window`; `request` for the body as a whole,
    /// `content-type` for that header).
    pub field: String,
    /// The rule it breaks.
    pub rule: String,
}

/// No decision could be had: the gRPC status the call ended with.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Failure {
    /// The gRPC status code's name, e.g. `UNAVAILABLE`.
    pub code: String,
    /// What happened.
    pub message: String,
}

/// `/readyz`'s answer: health, and each part of it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Readiness {
    /// `SERVING` when every part holds (the instance can decide), else
    /// `NOT_SERVING`: what gRPC health says.
    pub status: String,
    /// The store answers, or the failure policy answers without it.
    pub store: bool,
    /// Rules are in force, or health does not require them.
    pub rules: bool,
    /// The gRPC port accepts calls.
    pub open: bool,
    /// Shutdown has begun.
    pub stopping: bool,
}

/// `/healthz`'s answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Liveness {
    /// Always `alive`: the process answers.
    pub status: String,
}

/// `POST /v1/check`: `CheckLimit`, with the IETF `RateLimit-Policy` and
/// `RateLimit` headers and, when denied, `Retry-After`, as the client
/// libraries set them.
pub(crate) async fn check(api: Api, headers: HeaderMap, body: Body) -> Response {
    let request: pb::CheckLimitRequest =
        match accept::<json::CheckLimitRequest, _>(&api, &headers, body, "CheckLimitRequest").await
        {
            Ok(request) => request,
            Err(answer) => return answer,
        };
    decide(&api, request).await
}

/// `request` decided as `POST /v1/check` decides it: the answer, with its
/// headers.
pub(super) async fn decide(api: &Api, request: pb::CheckLimitRequest) -> Response {
    let windows = windows(&request);
    match check::check_limit(&api.decider, None, request).await {
        Ok(response) => {
            let quota = quota_headers(&windows, &response);
            written::<_, json::CheckLimitResponse>(&response, quota)
        }
        Err(err) => failed(&err),
    }
}

/// `POST /v1/check-many`: `CheckLimits`.
pub(crate) async fn check_many(api: Api, headers: HeaderMap, body: Body) -> Response {
    let request: pb::CheckLimitsRequest =
        match accept::<json::CheckLimitsRequest, _>(&api, &headers, body, "CheckLimitsRequest")
            .await
        {
            Ok(request) => request,
            Err(answer) => return answer,
        };
    match check::check_limits(&api.decider, None, request).await {
        Ok(response) => written::<_, json::CheckLimitsResponse>(&response, HeaderMap::new()),
        Err(err) => failed(&err),
    }
}

/// `GET /healthz`: the process answers.
pub(crate) async fn healthz() -> Response {
    json_answer(
        StatusCode::OK,
        &Liveness {
            status: "alive".into(),
        },
    )
}

/// `GET /readyz`: 200 while the instance can decide (gRPC health
/// SERVING), else 503; each part of health in the body.
pub(crate) async fn readyz(health: Health) -> Response {
    let state = health.state();
    let serving = state.serving();
    let body = Readiness {
        status: if serving { "SERVING" } else { "NOT_SERVING" }.into(),
        store: state.store,
        rules: state.rules,
        open: state.open,
        stopping: state.stopping,
    };
    let status = if serving {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json_answer(status, &body)
}

/// `body` in JSON, with `status`.
pub(super) fn json_answer(status: StatusCode, body: &impl Serialize) -> Response {
    match serde_json::to_vec(body) {
        Ok(body) => (status, [(CONTENT_TYPE, JSON)], body).into_response(),
        Err(err) => {
            warn!(%err, "cannot write an answer");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// The request of a call, as the gRPC service takes it (`Json` its
/// pbjson twin, `name` its message's name in errors); or the answer that
/// refuses it.
pub(super) async fn accept<Json, Grpc>(
    api: &Api,
    headers: &HeaderMap,
    body: Body,
    name: &str,
) -> Result<Grpc, Response>
where
    Json: Message + for<'de> serde::Deserialize<'de>,
    Grpc: Message + Default,
{
    // Before the gRPC port opens (waiting for the first xDS
    // configuration) and once it closes at shutdown, gRPC would not
    // answer either.
    if !api.health.is_open() {
        return Err(failure(
            StatusCode::SERVICE_UNAVAILABLE,
            FailureCode::Unavailable,
            "not deciding yet, or any more: the gRPC port is not open".into(),
        ));
    }
    read_message::<Json, Grpc>(api.bounds, headers, body, name).await
}

/// The message a JSON body holds (`Json` its pbjson twin, `name` its
/// message's name in errors), as the gRPC type; or the answer refusing
/// it: 415 for another content type, 413 over the size bound, 408 too
/// slow, 400 for anything but such a message.
pub(super) async fn read_message<Json, Grpc>(
    bounds: BodyBounds,
    headers: &HeaderMap,
    body: Body,
    name: &str,
) -> Result<Grpc, Response>
where
    Json: Message + for<'de> serde::Deserialize<'de>,
    Grpc: Message + Default,
{
    if !is_json(headers) {
        return Err(refused(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content-type",
            format!("must be {JSON}"),
        ));
    }
    let body = body::read(body, headers, bounds).await.map_err(|err| {
        let status = match err {
            BodyError::TooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            BodyError::TooSlow(_) => StatusCode::REQUEST_TIMEOUT,
            BodyError::Broken(_) => StatusCode::BAD_REQUEST,
        };
        refused(status, "request", err.to_string())
    })?;
    let request: Json = serde_json::from_slice(&body).map_err(|err| {
        refused(
            StatusCode::BAD_REQUEST,
            "request",
            format!("must be a {name} in proto3's JSON mapping: {err}"),
        )
    })?;
    // Both types encode the same message: this cannot fail short of a bug.
    Grpc::decode(request.encode_to_vec().as_slice()).map_err(|err| {
        warn!(%err, "{name}: the JSON and gRPC types disagree");
        failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            FailureCode::Internal,
            format!("{name}: {err}"),
        )
    })
}

/// `application/json`, with parameters or without.
pub(super) fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|media| media.trim().eq_ignore_ascii_case(JSON))
}

/// 200 with `response` in JSON (`Json` its pbjson twin) and `headers`.
pub(super) fn written<Grpc: Message, Json: Message + Default + Serialize>(
    response: &Grpc,
    headers: HeaderMap,
) -> Response {
    let write = || -> Result<Vec<u8>, String> {
        let twin = Json::decode(response.encode_to_vec().as_slice()).map_err(|e| e.to_string())?;
        serde_json::to_vec(&twin).map_err(|e| e.to_string())
    };
    match write() {
        Ok(body) => (StatusCode::OK, headers, [(CONTENT_TYPE, JSON)], body).into_response(),
        Err(err) => {
            warn!(%err, "cannot write the response");
            failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                FailureCode::Internal,
                format!("cannot write the response: {err}"),
            )
        }
    }
}

/// The answer to a call the service did not decide: 400 for a refused
/// request and 404 for an unknown policy, naming the field and the rule;
/// 503 when a later call may be decided (the store for now, every
/// decision slot taken), else 500, naming the gRPC code.
pub(super) fn failed(err: &Error) -> Response {
    match err {
        Error::InvalidArgument(refused_for) => refused(
            StatusCode::BAD_REQUEST,
            &refused_for.field,
            refused_for.rule.clone(),
        ),
        Error::NotFound(refused_for) => refused(
            StatusCode::NOT_FOUND,
            &refused_for.field,
            refused_for.rule.clone(),
        ),
        Error::Store(store) if store.is_transient() => failure(
            StatusCode::SERVICE_UNAVAILABLE,
            FailureCode::Unavailable,
            err.to_string(),
        ),
        Error::Store(_) => failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            FailureCode::Internal,
            err.to_string(),
        ),
        Error::Overloaded(_) => failure(
            StatusCode::SERVICE_UNAVAILABLE,
            FailureCode::ResourceExhausted,
            err.to_string(),
        ),
    }
}

pub(super) fn refused(status: StatusCode, field: &str, rule: String) -> Response {
    json_answer(
        status,
        &Refusal {
            field: field.to_owned(),
            rule,
        },
    )
}

pub(super) fn failure(status: StatusCode, code: FailureCode, message: String) -> Response {
    json_answer(
        status,
        &Failure {
            code: code.name().to_owned(),
            message,
        },
    )
}

/// The gRPC code a [`Failure`] names: what the call would have ended with
/// over gRPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FailureCode {
    /// No decision can be had now; a later call may have one.
    Unavailable,
    /// Every slot for such work is taken.
    ResourceExhausted,
    /// Anything else.
    Internal,
}

impl FailureCode {
    /// Its name, as the gRPC specification writes it.
    fn name(self) -> &'static str {
        match self {
            Self::Unavailable => "UNAVAILABLE",
            Self::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Self::Internal => "INTERNAL",
        }
    }
}

/// The window, in whole seconds, of each limit a request names, for the
/// `w` of `RateLimit-Policy`: the one limit's, or each of `limits`'; none
/// for a policy's (its windows are the operator's, and the client
/// libraries send none either).
fn windows(request: &pb::CheckLimitRequest) -> Vec<Option<u64>> {
    if let Some(algorithm) = &request.algorithm {
        return vec![algorithm.window_seconds()];
    }
    request
        .limits
        .iter()
        .map(|limit| limit.algorithm.as_ref()?.window_seconds())
        .collect()
}

/// A duration in whole seconds, rounded up (never early).
fn seconds(duration: Option<&prost_types::Duration>) -> Option<u64> {
    let duration = duration?;
    let whole = u64::try_from(duration.seconds).ok()?;
    Some(whole + u64::from(duration.nanos > 0))
}

/// `RateLimit-Policy`, `RateLimit` and, when denied and waiting helps,
/// `Retry-After`, as the client libraries set them
/// (draft-ietf-httpapi-ratelimit-headers): the item named after the limit
/// the top-level fields describe, `default` (or `default#<n>`, the n-th of
/// several) when it has no name; `w` when the request gave the window.
fn quota_headers(windows: &[Option<u64>], response: &pb::CheckLimitResponse) -> HeaderMap {
    let chosen = response.most_restrictive as usize;
    let named = response
        .limits
        .get(chosen)
        .map(|status| status.name.as_str())
        .filter(|name| !name.is_empty());
    let id = match named {
        Some(name) => name.to_owned(),
        None if response.limits.len() > 1 => format!("default#{}", chosen + 1),
        None => "default".to_owned(),
    };
    let id = sf_string(&id);
    let window = windows
        .get(chosen)
        .copied()
        .flatten()
        .map(|seconds| format!(";w={seconds}"))
        .unwrap_or_default();
    let reset = seconds(response.reset_after.as_ref()).unwrap_or(0);
    let mut headers = HeaderMap::new();
    let mut set = |name: &'static str, value: String| {
        // `sf_string` keeps the id printable ASCII; numbers are digits.
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(HeaderName::from_static(name), value);
        }
    };
    set(
        "ratelimit-policy",
        format!("{id};q={}{window}", response.limit),
    );
    set(
        "ratelimit",
        format!("{id};r={};t={reset}", response.remaining),
    );
    if !response.allowed
        && let Some(wait) = seconds(response.retry_after.as_ref())
    {
        set(RETRY_AFTER.as_str(), wait.to_string());
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    fn duration(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
        Some(prost_types::Duration { seconds, nanos })
    }

    fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
        headers.get(name).and_then(|value| value.to_str().ok())
    }

    #[test]
    fn one_limit_headers_carry_its_window_and_retry_after_only_when_denied() {
        let request = pb::CheckLimitRequest {
            key: "k".into(),
            algorithm: Some(pb::check_limit_request::Algorithm::FixedWindow(
                pb::FixedWindow {
                    limit: 5,
                    window: duration(10, 0),
                },
            )),
            ..Default::default()
        };
        let mut response = pb::CheckLimitResponse {
            allowed: true,
            limit: 5,
            remaining: 4,
            reset_after: duration(9, 1),
            retry_after: duration(0, 0),
            ..Default::default()
        };
        let headers = quota_headers(&windows(&request), &response);
        assert_eq!(
            header(&headers, "ratelimit-policy"),
            Some(r#""default";q=5;w=10"#)
        );
        assert_eq!(header(&headers, "ratelimit"), Some(r#""default";r=4;t=10"#));
        assert_eq!(header(&headers, "retry-after"), None);
        response.allowed = false;
        response.retry_after = duration(2, 500);
        let headers = quota_headers(&windows(&request), &response);
        assert_eq!(header(&headers, "retry-after"), Some("3"));
        response.retry_after = None;
        let headers = quota_headers(&windows(&request), &response);
        assert_eq!(header(&headers, "retry-after"), None, "waiting never helps");
    }

    #[test]
    fn several_limits_name_the_most_restrictive_and_a_policy_has_no_window() {
        let limit = |name: &str, algorithm| pb::Limit {
            name: name.into(),
            algorithm: Some(algorithm),
            ..Default::default()
        };
        let request = pb::CheckLimitRequest {
            key: "k".into(),
            limits: vec![
                limit(
                    "hourly",
                    pb::limit::Algorithm::FixedWindow(pb::FixedWindow {
                        limit: 1000,
                        window: duration(3600, 0),
                    }),
                ),
                limit(
                    "",
                    pb::limit::Algorithm::TokenBucket(pb::TokenBucket {
                        capacity: 2,
                        refill_per_second: 0.3,
                    }),
                ),
            ],
            ..Default::default()
        };
        let status = |name: &str| pb::LimitStatus {
            name: name.into(),
            ..Default::default()
        };
        let response = pb::CheckLimitResponse {
            allowed: true,
            limit: 2,
            remaining: 1,
            limits: vec![status("hourly"), status("")],
            most_restrictive: 1,
            ..Default::default()
        };
        let headers = quota_headers(&windows(&request), &response);
        assert_eq!(
            header(&headers, "ratelimit-policy"),
            Some(r#""default#2";q=2;w=7"#)
        );
        let policy = pb::CheckLimitRequest {
            key: "k".into(),
            policy: "plans".into(),
            ..Default::default()
        };
        let response = pb::CheckLimitResponse {
            limit: 3,
            limits: vec![status("per-minute"), status("daily")],
            most_restrictive: 1,
            ..Default::default()
        };
        let headers = quota_headers(&windows(&policy), &response);
        assert_eq!(header(&headers, "ratelimit-policy"), Some(r#""daily";q=3"#));
    }

    #[test]
    fn only_json_is_read() {
        let with = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
            headers
        };
        assert!(is_json(&with("application/json")));
        assert!(is_json(&with("Application/JSON; charset=utf-8")));
        assert!(!is_json(&with("text/plain")));
        assert!(!is_json(&with("application/json-seq")));
        assert!(!is_json(&HeaderMap::new()));
    }
}

//! `GET /v1/console/live`: what the web console's live view draws
//! ([`crate::live`]): decisions per second over the last minutes per face,
//! rule or policy and algorithm, the store's health and latency, the
//! failure policy in force, the quota service's shares, and the most
//! denied keys. Read-only, and bounded whatever the traffic.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::Response;

use super::api;
use crate::health::Health;
use crate::live;

/// `GET /v1/console/live`.
pub(crate) async fn live(health: Health) -> Response {
    let Some(live) = live::get() else {
        return api::failure(
            StatusCode::SERVICE_UNAVAILABLE,
            api::FailureCode::Unavailable,
            "the live view is not recording in this process".into(),
        );
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    api::json_answer(StatusCode::OK, &live.view(now, health.state().store))
}

//! `GET /v1/console/live`: what the web console's live view draws
//! ([`crate::live`]): decisions per second over the last minutes per face,
//! rule or policy and algorithm, the store's health and latency, the
//! failure policy in force, the quota service's shares, and the most
//! denied keys. Read-only, and bounded whatever the traffic.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::Response;
use tonic::Code;
use utoipa::openapi::path::{Operation, OperationBuilder};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::{PartialSchema, ToSchema};

use super::api::{self, JSON};
use super::openapi;
use crate::health::Health;
use crate::live::{self, DeniedKey, LiveSeries, LiveView, QuotaShare, StoreLatency, StoreView};

/// `GET /v1/console/live`.
pub async fn live(health: Health) -> Response {
    let Some(live) = live::get() else {
        return api::failure(
            StatusCode::SERVICE_UNAVAILABLE,
            Code::Unavailable,
            "the live view is not recording in this process".into(),
        );
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    api::json_answer(StatusCode::OK, &live.view(now, health.state().store))
}

/// The schemas of the live view's answer, for the OpenAPI document.
pub fn schemas() -> Vec<(
    String,
    utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
)> {
    vec![
        (LiveView::name().into_owned(), LiveView::schema()),
        (LiveSeries::name().into_owned(), LiveSeries::schema()),
        (StoreView::name().into_owned(), StoreView::schema()),
        (StoreLatency::name().into_owned(), StoreLatency::schema()),
        (QuotaShare::name().into_owned(), QuotaShare::schema()),
        (DeniedKey::name().into_owned(), DeniedKey::schema()),
    ]
}

/// `GET /v1/console/live`'s OpenAPI operation.
pub fn operation() -> Operation {
    OperationBuilder::new()
        .operation_id(Some("consoleLive"))
        .tag("console")
        .summary(Some(
            "The console's live view: decisions per second, store, quota, denied keys",
        ))
        .description(Some(
            "Decisions per second over the last 300 seconds, allowed, denied and degraded, per \
             face (`check_limit`, `envoy`), origin (a configured rule, a named policy, or \
             parameters the request sent) and algorithm, counted beside the Prometheus counters; \
             the store's health and its calls and latency per second; the failure policy in \
             force; the quota service's subscribers and assigned rates; and the 50 most denied \
             keys, from a space-saving sketch. Labels are bounded by the configuration: a \
             caller's key is never a series.",
        ))
        .response(
            "200",
            ResponseBuilder::new()
                .description("The live view.")
                .content(
                    JSON,
                    openapi::json_content(openapi::schema_ref(&LiveView::name())),
                )
                .build(),
        )
        .response(
            "503",
            openapi::failure("The live view is not recording in this process."),
        )
        .build()
}

//! The OpenAPI operations of the web console's routes (`GET /`,
//! `GET /v1/console/live`, `POST /v1/simulate`) and the schemas of the live
//! view's answer, which is not a proto message.

use utoipa::openapi::path::{Operation, OperationBuilder};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::{PartialSchema, ToSchema};

use super::{Endpoint, HttpMethod, JSON, RefOr, Schema};
use crate::http::console::simulate_example;
use crate::live::{
    DeniedKey, LeaseHolder, LeasedPolicy, LiveSeries, LiveView, QuotaShare, StoreLatency, StoreView,
};

/// A console endpoint's method and operation.
pub(super) fn operation(endpoint: Endpoint) -> (HttpMethod, Operation) {
    match endpoint {
        Endpoint::Simulate => (HttpMethod::Post, simulate_operation()),
        Endpoint::ConsoleLive => (HttpMethod::Get, live_operation()),
        _ => (HttpMethod::Get, page_operation()),
    }
}

/// `POST /v1/simulate`'s OpenAPI operation.
fn simulate_operation() -> Operation {
    super::refusals(
        OperationBuilder::new()
            .operation_id(Some("simulate"))
            .tag("console")
            .summary(Some(
                "Run limits under a traffic pattern on a simulated clock",
            ))
            .description(Some(
                "Each limit is decided by the server's own algorithm code (the embedded store's), \
                 on its own simulated counter, on a clock that starts at zero: nothing is stored \
                 and the same request always gets the same answer. Bounded: at most 10 limits, \
                 100000 requests, 10000 steps and 1 h of traffic; more is 400 naming the field. \
                 503 when two simulations are running already.",
            ))
            .request_body(Some(
                super::json_body(
                    "ratelimitd.v1.SimulateRequest",
                    &[("five algorithms under bursts", simulate_example())],
                )
                .build(),
            )),
    )
    .response(
        "200",
        ResponseBuilder::new()
            .description(
                "Per step: requests sent, and each limit's admitted, denied and remaining.",
            )
            .content(
                JSON,
                super::json_content(super::schema_ref("ratelimitd.v1.SimulateResponse")),
            )
            .build(),
    )
    .build()
}

/// `GET /`'s OpenAPI operation.
fn page_operation() -> Operation {
    OperationBuilder::new()
        .operation_id(Some("console"))
        .tag("console")
        .summary(Some("The web console"))
        .description(Some(
            "An HTML page: the live view (`/v1/console/live`) and the simulator \
             (`/v1/simulate`). Self-contained: its scripts and styles are built into the binary.",
        ))
        .response(
            "200",
            ResponseBuilder::new()
                .description("The page.")
                .content("text/html", super::text_content())
                .build(),
        )
        .build()
}

/// The schemas of the live view's answer, for the OpenAPI document.
pub(super) fn schemas() -> Vec<(String, RefOr<Schema>)> {
    vec![
        (LiveView::name().into_owned(), LiveView::schema()),
        (LiveSeries::name().into_owned(), LiveSeries::schema()),
        (StoreView::name().into_owned(), StoreView::schema()),
        (StoreLatency::name().into_owned(), StoreLatency::schema()),
        (QuotaShare::name().into_owned(), QuotaShare::schema()),
        (LeasedPolicy::name().into_owned(), LeasedPolicy::schema()),
        (LeaseHolder::name().into_owned(), LeaseHolder::schema()),
        (DeniedKey::name().into_owned(), DeniedKey::schema()),
    ]
}

/// `GET /v1/console/live`'s OpenAPI operation.
fn live_operation() -> Operation {
    OperationBuilder::new()
        .operation_id(Some("consoleLive"))
        .tag("console")
        .summary(Some(
            "The console's live view: decisions per second, store, quota, leases, denied keys",
        ))
        .description(Some(
            "Decisions per second over the last 300 seconds, allowed, denied and degraded, per \
             face (`check_limit`, `envoy`), origin (a configured rule, a named policy, or \
             parameters the request sent) and algorithm, counted beside the Prometheus counters; \
             the store's health and its calls and latency per second; the failure policy in \
             force; the quota service's subscribers and assigned rates; each policy leased on \
             this instance with its holders (lease streams), each one's key, share of the \
             policy's rate, demand, and units granted and admitted, at most 200 holders in all; \
             and the 50 most denied keys, from a space-saving sketch. Labels are bounded by the \
             configuration: a caller's key is never a series.",
        ))
        .response(
            "200",
            ResponseBuilder::new()
                .description("The live view.")
                .content(
                    JSON,
                    super::json_content(super::schema_ref(&LiveView::name())),
                )
                .build(),
        )
        .response(
            "503",
            super::failure("The live view is not recording in this process."),
        )
        .build()
}

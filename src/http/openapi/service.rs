//! The OpenAPI operations of the listener's own routes: health
//! (`/healthz`, `/readyz`), this document (`/openapi.json`), and
//! envoyproxy/ratelimit's `/json` and `/healthcheck`.

use serde_json::json;
use utoipa::ToSchema;
use utoipa::openapi::path::{Operation, OperationBuilder};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Type};

use super::{JSON, json_body, json_content, schema_ref, text_content};
use crate::http::api::{Liveness, Readiness};

/// `GET /healthz`: liveness.
pub(super) fn healthz() -> Operation {
    OperationBuilder::new()
        .operation_id(Some("healthz"))
        .tag("health")
        .summary(Some("Liveness: the process answers"))
        .response(
            "200",
            ResponseBuilder::new()
                .description("Alive.")
                .content(JSON, json_content(schema_ref(&Liveness::name())))
                .build(),
        )
        .build()
}

/// `GET /readyz`: readiness.
pub(super) fn readyz() -> Operation {
    OperationBuilder::new()
        .operation_id(Some("readyz"))
        .tag("health")
        .summary(Some(
            "Readiness: the instance can decide (gRPC health SERVING)",
        ))
        .response(
            "200",
            ResponseBuilder::new()
                .description("SERVING.")
                .content(JSON, json_content(schema_ref(&Readiness::name())))
                .build(),
        )
        .response(
            "503",
            ResponseBuilder::new()
                .description("NOT_SERVING: the body says which part does not hold.")
                .content(JSON, json_content(schema_ref(&Readiness::name())))
                .build(),
        )
        .build()
}

/// `GET /openapi.json`: this document.
pub(super) fn openapi() -> Operation {
    OperationBuilder::new()
        .operation_id(Some("openapi"))
        .tag("meta")
        .summary(Some("This document"))
        .response(
            "200",
            ResponseBuilder::new()
                .description("The OpenAPI 3.1 document.")
                .content(
                    JSON,
                    json_content(ObjectBuilder::new().schema_type(Type::Object).into()),
                )
                .build(),
        )
        .build()
}

/// `/json`, as envoyproxy/ratelimit serves it.
pub(super) fn json() -> Operation {
    OperationBuilder::new()
        .operation_id(Some("json"))
        .tag("envoyproxy/ratelimit")
        .summary(Some(
            "Envoy's ShouldRateLimit, as envoyproxy/ratelimit's /json serves it",
        ))
        .description(Some(
            "Upstream's endpoint and statuses, for its clients: any method and any content \
             type are read; 429 when the overall code is OVER_LIMIT; errors are plain text.",
        ))
        .request_body(Some(
            json_body(
                "envoy.service.ratelimit.v3.RateLimitRequest",
                &[(
                    "one descriptor",
                    json!({"domain": "example", "descriptors": [
                        {"entries": [{"key": "user", "value": "42"}]}
                    ]}),
                )],
            )
            .build(),
        ))
        .response(
            "200",
            ResponseBuilder::new()
                .description("Overall code OK.")
                .content(
                    JSON,
                    json_content(schema_ref("envoy.service.ratelimit.v3.RateLimitResponse")),
                )
                .build(),
        )
        .response(
            "429",
            ResponseBuilder::new()
                .description("Overall code OVER_LIMIT.")
                .content(
                    JSON,
                    json_content(schema_ref("envoy.service.ratelimit.v3.RateLimitResponse")),
                )
                .build(),
        )
        .response(
            "400",
            ResponseBuilder::new()
                .description("Not a RateLimitRequest, or one the service refuses.")
                .content("text/plain", text_content())
                .build(),
        )
        .response(
            "408",
            ResponseBuilder::new()
                .description("The body did not arrive within --http-read-timeout.")
                .content("text/plain", text_content())
                .build(),
        )
        .response(
            "413",
            ResponseBuilder::new()
                .description("The body is larger than --max-request-bytes.")
                .content("text/plain", text_content())
                .build(),
        )
        .response(
            "500",
            ResponseBuilder::new()
                .description("Overall code UNKNOWN, or the service failed.")
                .build(),
        )
        .response(
            "503",
            ResponseBuilder::new()
                .description("The gRPC port is not open.")
                .content("text/plain", text_content())
                .build(),
        )
        .build()
}

/// `/healthcheck`, as envoyproxy/ratelimit serves it.
pub(super) fn healthcheck() -> Operation {
    OperationBuilder::new()
        .operation_id(Some("healthcheck"))
        .tag("envoyproxy/ratelimit")
        .summary(Some("envoyproxy/ratelimit's health check (any method)"))
        .response(
            "200",
            ResponseBuilder::new()
                .description("`OK`: SERVING.")
                .content("text/plain", text_content())
                .build(),
        )
        .response(
            "500",
            ResponseBuilder::new()
                .description("NOT_SERVING; no body.")
                .build(),
        )
        .build()
}

//! The OpenAPI operations of the decision API: `POST /v1/check` and
//! `POST /v1/check-many`.

use serde_json::json;
use utoipa::openapi::path::{Operation, OperationBuilder};
use utoipa::openapi::response::ResponseBuilder;

use super::{JSON, check_examples, header, json_body, json_content, refusal, refusals, schema_ref};

/// `POST /v1/check`: one request, in any of its three forms.
pub(super) fn check() -> Operation {
    refusals(
        OperationBuilder::new()
            .operation_id(Some("check"))
            .tag("decisions")
            .summary(Some("Decide one request (gRPC CheckLimit)"))
            .description(Some(
                "One request in one of three forms: one limit (`key` and one algorithm), \
                 several limits decided together, all or nothing (`key` and `limits`), or \
                 a policy the operator named in the server's policies file (`key` and \
                 `policy`). Being over the limit is an answer: 200 with `allowed: false`.",
            ))
            .request_body(Some(
                json_body("ratelimitd.v1.CheckLimitRequest", &check_examples()).build(),
            )),
    )
    .response(
        "200",
        ResponseBuilder::new()
            .description(
                "The decision, allowed or denied, with the IETF rate-limit headers as the \
                 client libraries set them.",
            )
            .content(
                JSON,
                json_content(schema_ref("ratelimitd.v1.CheckLimitResponse")),
            )
            .header(
                "RateLimit-Policy",
                header(
                    "`\"<id>\";q=<limit>;w=<window seconds>`: the limit the top-level \
                     fields describe, named by its `name` (`default`, or `default#<n>` for \
                     the n-th of several, without one); no `w` for a policy.",
                ),
            )
            .header(
                "RateLimit",
                header("`\"<id>\";r=<remaining>;t=<seconds until reset>`."),
            )
            .header(
                "Retry-After",
                header(
                    "Seconds until the request would be allowed; only when denied, and \
                     not when waiting never helps (`costExceedsLimit`).",
                ),
            )
            .build(),
    )
    .response(
        "404",
        refusal("The request names a policy the server does not know (NOT_FOUND over gRPC)."),
    )
    .build()
}

/// `POST /v1/check-many`: many independent requests.
pub(super) fn check_many() -> Operation {
    refusals(
        OperationBuilder::new()
            .operation_id(Some("checkMany"))
            .tag("decisions")
            .summary(Some("Decide many independent requests (gRPC CheckLimits)"))
            .description(Some(
                "Each request is decided on its own, as `/v1/check` would decide it, and \
                 answered in its own result, in order: a decision, or the error it would \
                 have had (a `google.rpc.Status`). 400 only for a batch malformed as a \
                 whole: empty, or over the server's --max-batch-size.",
            ))
            .request_body(Some(json_body(
                "ratelimitd.v1.CheckLimitsRequest",
                &[(
                    "two requests",
                    json!({"requests": [
                        {"key": "user42", "gcra": {"rate": "10", "period": "1s", "burst": "20"}},
                        {"key": "user43", "slidingWindow": {"limit": "100", "window": "60s"}}
                    ]}),
                )],
            ).build())),
    )
    .response(
        "200",
        ResponseBuilder::new()
            .description("One result per request, in order.")
            .content(JSON, json_content(schema_ref("ratelimitd.v1.CheckLimitsResponse")))
            .build(),
    )
    .build()
}

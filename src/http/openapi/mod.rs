//! The service listener's OpenAPI 3.1 document, served at
//! `/openapi.json`, built from what serves: its paths and operations from
//! [`Endpoint::ALL`] (the list the router is built from), its message
//! schemas from the compiled protobuf descriptors ([`FILE_DESCRIPTOR_SET`])
//! in proto3's JSON mapping as pbjson reads and writes it (camelCase
//! names, 64-bit integers as strings, enums by name, durations as
//! `"1.5s"`, unknown fields refused), with the proto's comments as their
//! descriptions; the API's own bodies from their Rust types. A field or
//! route added in one place is in the document, and none can be left in it
//! once gone. The admin API's operations are in it only when the server
//! serves them (it has an admin token), each requiring the bearer token
//! (the `adminToken` security scheme).

use serde_json::json;
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::{
    Components, ContentBuilder, InfoBuilder, OpenApi, OpenApiBuilder, Paths, Ref, RefOr, Required,
};
use utoipa::{PartialSchema, ToSchema};

use super::Endpoint;
use super::admin::openapi as admin;
use super::api::{Failure, JSON, Liveness, Readiness, Refusal};

mod console;
mod decisions;
mod schemas;
mod service;

use self::schemas::MessageSchemas;

/// The messages the API reads and writes; every message they hold is
/// described too.
const ROOTS: [&str; 8] = [
    "ratelimitd.v1.CheckLimitRequest",
    "ratelimitd.v1.CheckLimitResponse",
    "ratelimitd.v1.CheckLimitsRequest",
    "ratelimitd.v1.CheckLimitsResponse",
    "envoy.service.ratelimit.v3.RateLimitRequest",
    "envoy.service.ratelimit.v3.RateLimitResponse",
    "ratelimitd.v1.SimulateRequest",
    "ratelimitd.v1.SimulateResponse",
];

/// The document of a server that serves the admin API (`admin`) or not.
pub(crate) fn document(admin: bool) -> OpenApi {
    let mut components = Components::new();
    match MessageSchemas::from_descriptors() {
        Ok(schemas) => components.schemas.extend(schemas.0),
        // The descriptors are compiled into the binary: only a build gone
        // wrong gets here, and the document then says what is missing.
        Err(err) => tracing::warn!(%err, "OpenAPI: no message schemas"),
    }
    for (name, schema) in [
        (Refusal::name(), Refusal::schema()),
        (Failure::name(), Failure::schema()),
        (Readiness::name(), Readiness::schema()),
        (Liveness::name(), Liveness::schema()),
    ] {
        components.schemas.insert(name.into_owned(), schema);
    }
    if admin {
        admin::components(&mut components);
    }
    components.schemas.extend(console::schemas());
    let mut paths = Paths::new();
    for endpoint in Endpoint::served(admin) {
        let (method, operation) = operation(endpoint);
        paths
            .paths
            .insert(endpoint.path().to_owned(), PathItem::new(method, operation));
    }
    OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("ratelimitd")
                .version(env!("CARGO_PKG_VERSION"))
                .description(Some(
                    "ratelimitd's HTTP listener: the JSON API (the gRPC `ratelimitd.v1.RateLimiter` \
                     methods in proto3's JSON mapping, decided by the same code), health, and \
                     envoyproxy/ratelimit's `/json` and `/healthcheck`. Requests may name fields \
                     in camelCase (as written here) or as in the proto (`fixed_window`); 64-bit \
                     integers may be numbers or strings and are written as strings; enums may be \
                     names or numbers and are written as names. A field the message does not have \
                     is refused.",
                ))
                .build(),
        )
        .paths(paths)
        .components(Some(components))
        .build()
}

/// `name` in `#/components/schemas`.
fn schema_ref(name: &str) -> RefOr<Schema> {
    RefOr::Ref(Ref::from_schema_name(name))
}

fn json_content(schema: RefOr<Schema>) -> utoipa::openapi::Content {
    ContentBuilder::new().schema(Some(schema)).build()
}

fn text_content() -> utoipa::openapi::Content {
    ContentBuilder::new()
        .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
        .build()
}

/// A 4xx answer with a [`Refusal`].
fn refusal(description: &str) -> utoipa::openapi::Response {
    ResponseBuilder::new()
        .description(description)
        .content(JSON, json_content(schema_ref(&Refusal::name())))
        .build()
}

/// A 5xx answer with a [`Failure`].
fn failure(description: &str) -> utoipa::openapi::Response {
    ResponseBuilder::new()
        .description(description)
        .content(JSON, json_content(schema_ref(&Failure::name())))
        .build()
}

fn header(description: &str) -> utoipa::openapi::header::Header {
    HeaderBuilder::new()
        .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
        .description(Some(description))
        .build()
}

/// The answers every API call shares, but its 200.
fn refusals(operation: OperationBuilder) -> OperationBuilder {
    operation
        .response(
            "400",
            refusal(
                "The body is not such a message, or the service refuses it: the field and the rule \
                 it breaks (INVALID_ARGUMENT over gRPC).",
            ),
        )
        .response(
            "408",
            refusal("The body did not arrive within the server's --http-read-timeout."),
        )
        .response(
            "413",
            refusal("The body is larger than the server's --max-request-bytes."),
        )
        .response("415", refusal("The content type is not application/json."))
        .response("500", failure("The service failed otherwise."))
        .response(
            "503",
            failure(
                "No decision can be had now: the store cannot decide and the failure policy does \
                 not answer (UNAVAILABLE), every decision slot is taken (RESOURCE_EXHAUSTED), or \
                 the gRPC port is not open (before the first configuration, during shutdown).",
            ),
        )
}

fn json_body(schema: &str, examples: &[(&str, serde_json::Value)]) -> RequestBodyBuilder {
    RequestBodyBuilder::new()
        .required(Some(Required::True))
        .content(
            JSON,
            ContentBuilder::new()
                .schema(Some(schema_ref(schema)))
                .examples_from_iter(examples.iter().map(|(name, value)| {
                    (
                        *name,
                        ExampleBuilder::new()
                            .summary(*name)
                            .value(Some(value.clone()))
                            .build(),
                    )
                }))
                .build(),
        )
}

/// The example bodies of `POST /v1/check`, one per form of the request.
/// The tests send each: the `policy` one needs a policy named
/// `free-tier`.
pub(crate) fn check_examples() -> [(&'static str, serde_json::Value); 3] {
    [
        (
            "one limit",
            json!({"key": "user42", "fixedWindow": {"limit": "5", "window": "10s"}}),
        ),
        (
            "several limits",
            json!({"key": "user42", "limits": [
                {"name": "per-second", "tokenBucket": {"capacity": "10", "refillPerSecond": 10}},
                {"name": "per-hour", "slidingWindowCounter": {"limit": "1000", "window": "3600s"}}
            ]}),
        ),
        (
            "a named policy",
            json!({"key": "user42", "policy": "free-tier", "cost": "1"}),
        ),
    ]
}

/// An operation on a `CheckLimitRequest` (the admin API's): its body, with
/// `/v1/check`'s examples, and the answers every API call shares.
fn on_check_request(operation: OperationBuilder) -> utoipa::openapi::path::Operation {
    refusals(operation)
        .request_body(Some(
            json_body("ratelimitd.v1.CheckLimitRequest", &check_examples()).build(),
        ))
        .response(
            "404",
            refusal("The request names a policy the server does not know."),
        )
        .build()
}

/// Each endpoint's method and operation. A new endpoint does not compile
/// until it is described here.
fn operation(endpoint: Endpoint) -> (HttpMethod, utoipa::openapi::path::Operation) {
    match endpoint {
        Endpoint::AdminPeek => (HttpMethod::Post, on_check_request(admin::peek())),
        Endpoint::AdminReset => (HttpMethod::Post, on_check_request(admin::reset())),
        Endpoint::AdminRules => (HttpMethod::Get, admin::rules()),
        Endpoint::AdminPolicies => (HttpMethod::Get, admin::policies()),
        Endpoint::AdminQuotaBuckets => (HttpMethod::Get, admin::quota_buckets()),
        Endpoint::AdminConfig => (HttpMethod::Get, admin::config()),
        Endpoint::Check => (HttpMethod::Post, decisions::check()),
        Endpoint::CheckMany => (HttpMethod::Post, decisions::check_many()),
        Endpoint::Healthz => (HttpMethod::Get, service::healthz()),
        Endpoint::Readyz => (HttpMethod::Get, service::readyz()),
        Endpoint::OpenApi => (HttpMethod::Get, service::openapi()),
        Endpoint::Json => (HttpMethod::Post, service::json()),
        Endpoint::Healthcheck => (HttpMethod::Get, service::healthcheck()),
        Endpoint::Simulate | Endpoint::ConsoleLive | Endpoint::Console => {
            console::operation(endpoint)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document_json() -> serde_json::Value {
        serde_json::to_value(document(false)).unwrap()
    }

    #[test]
    fn messages_are_described_in_the_json_mapping_with_their_comments() {
        let document = document_json();
        let schemas = &document["components"]["schemas"];
        let request = &schemas["ratelimitd.v1.CheckLimitRequest"];
        assert_eq!(request["additionalProperties"], false);
        assert_eq!(
            request["properties"]["fixedWindow"]["$ref"],
            "#/components/schemas/ratelimitd.v1.FixedWindow"
        );
        assert_eq!(
            request["properties"]["failurePolicy"]["$ref"],
            "#/components/schemas/ratelimitd.v1.FailurePolicy"
        );
        assert_eq!(request["properties"]["limits"]["type"], "array");
        assert_eq!(
            request["properties"]["cost"]["type"],
            json!(["string", "integer"])
        );
        assert!(
            request["description"]
                .as_str()
                .is_some_and(|text| text.contains("At most one of `fixedWindow`")),
            "{request}"
        );
        assert!(
            request["properties"]["key"]["description"]
                .as_str()
                .is_some_and(|text| text.starts_with("Who is being limited")),
            "{request}"
        );
        let window = &schemas["ratelimitd.v1.FixedWindow"]["properties"]["window"];
        assert_eq!(window["type"], "string");
        assert_eq!(
            schemas["ratelimitd.v1.FailurePolicy"]["enum"],
            json!([
                "FAILURE_POLICY_UNSPECIFIED",
                "FAIL_CLOSED",
                "FAIL_OPEN",
                "LOCAL"
            ])
        );
        assert!(schemas["google.rpc.Status"].is_object());
        assert!(schemas["envoy.service.ratelimit.v3.RateLimitResponse.Code"].is_object());
        // Every reference resolves.
        let text = document.to_string();
        for reference in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = reference.split('"').next().unwrap();
            assert!(
                schemas[name].is_object(),
                "{name} is referenced, not described"
            );
        }
    }

    #[test]
    fn every_endpoint_served_has_its_path_and_only_those() {
        for admin in [false, true] {
            let document = serde_json::to_value(document(admin)).unwrap();
            let paths = document["paths"].as_object().unwrap();
            assert_eq!(paths.len(), Endpoint::served(admin).count());
            for endpoint in Endpoint::ALL {
                assert_eq!(
                    paths.contains_key(endpoint.path()),
                    admin || !endpoint.is_admin(),
                    "{endpoint:?}, admin {admin}"
                );
            }
            assert_eq!(document["openapi"], "3.1.0");
            let schemes = &document["components"]["securitySchemes"];
            assert_eq!(schemes[admin::ADMIN_TOKEN].is_object(), admin, "{schemes}");
            // Every reference resolves.
            let text = document.to_string();
            for reference in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
                let name = reference.split('"').next().unwrap();
                assert!(
                    document["components"]["schemas"][name].is_object(),
                    "{name} is referenced, not described"
                );
            }
        }
        let document = serde_json::to_value(document(true)).unwrap();
        let peek = &document["paths"]["/admin/v1/peek"]["post"];
        assert_eq!(peek["security"], json!([{admin::ADMIN_TOKEN: []}]));
        assert!(document["paths"]["/v1/check"]["post"]["security"].is_null());
    }
}

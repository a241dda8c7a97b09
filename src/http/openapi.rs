//! The service listener's OpenAPI 3.1 document, served at
//! `/openapi.json`, built from what serves: its paths and operations from
//! [`Endpoint::ALL`] (the list the router is built from), its message
//! schemas from the compiled protobuf descriptors ([`FILE_DESCRIPTOR_SET`])
//! in proto3's JSON mapping as pbjson reads and writes it (camelCase
//! names, 64-bit integers as strings, enums by name, durations as
//! `"1.5s"`, unknown fields refused), with the proto's comments as their
//! descriptions; the API's own bodies from their Rust types. A field or
//! route added in one place is in the document, and none can be left in it
//! once gone.

use std::collections::{BTreeMap, HashMap};

use prost::Message;
use prost_types::field_descriptor_proto::{Label, Type as Proto};
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};
use serde_json::json;
use utoipa::openapi::example::ExampleBuilder;
use utoipa::openapi::header::HeaderBuilder;
use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
use utoipa::openapi::request_body::RequestBodyBuilder;
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, Schema, SchemaFormat, SchemaType, Type,
};
use utoipa::openapi::{
    Components, ContentBuilder, InfoBuilder, OpenApi, OpenApiBuilder, Paths, Ref, RefOr, Required,
};
use utoipa::{PartialSchema, ToSchema};

use super::Endpoint;
use super::api::{Failure, JSON, Liveness, Readiness, Refusal};
use crate::pb::FILE_DESCRIPTOR_SET;

mod console;

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

/// The document.
pub fn document() -> OpenApi {
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
    components.schemas.extend(console::schemas());
    let mut paths = Paths::new();
    for endpoint in Endpoint::ALL {
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
pub fn check_examples() -> [(&'static str, serde_json::Value); 3] {
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

/// Each endpoint's method and operation. A new endpoint does not compile
/// until it is described here.
fn operation(endpoint: Endpoint) -> (HttpMethod, utoipa::openapi::path::Operation) {
    match endpoint {
        Endpoint::Check => (
            HttpMethod::Post,
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
                    .request_body(Some(json_body(
                        "ratelimitd.v1.CheckLimitRequest",
                        &check_examples(),
                    ).build())),
            )
            .response(
                "200",
                ResponseBuilder::new()
                    .description(
                        "The decision, allowed or denied, with the IETF rate-limit headers as the \
                         client libraries set them.",
                    )
                    .content(JSON, json_content(schema_ref("ratelimitd.v1.CheckLimitResponse")))
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
            .build(),
        ),
        Endpoint::CheckMany => (
            HttpMethod::Post,
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
            .build(),
        ),
        Endpoint::Healthz => (
            HttpMethod::Get,
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
                .build(),
        ),
        Endpoint::Readyz => (
            HttpMethod::Get,
            OperationBuilder::new()
                .operation_id(Some("readyz"))
                .tag("health")
                .summary(Some("Readiness: the instance can decide (gRPC health SERVING)"))
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
                .build(),
        ),
        Endpoint::OpenApi => (
            HttpMethod::Get,
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
                .build(),
        ),
        Endpoint::Json => (
            HttpMethod::Post,
            OperationBuilder::new()
                .operation_id(Some("json"))
                .tag("envoyproxy/ratelimit")
                .summary(Some("Envoy's ShouldRateLimit, as envoyproxy/ratelimit's /json serves it"))
                .description(Some(
                    "Upstream's endpoint and statuses, for its clients: any method and any content \
                     type are read; 429 when the overall code is OVER_LIMIT; errors are plain text.",
                ))
                .request_body(Some(json_body(
                    "envoy.service.ratelimit.v3.RateLimitRequest",
                    &[(
                        "one descriptor",
                        json!({"domain": "example", "descriptors": [
                            {"entries": [{"key": "user", "value": "42"}]}
                        ]}),
                    )],
                ).build()))
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
                .build(),
        ),
        Endpoint::Healthcheck => (
            HttpMethod::Get,
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
                .build(),
        ),
        Endpoint::Simulate | Endpoint::ConsoleLive | Endpoint::Console => {
            console::operation(endpoint)
        }
    }
}

/// The schema of every message (and enum) the [`ROOTS`] hold, by full
/// proto name.
struct MessageSchemas(BTreeMap<String, RefOr<Schema>>);

/// A message or enum of the descriptor set, with the comments of its file.
enum Declared<'a> {
    Message(&'a DescriptorProto, Vec<i32>, &'a Comments),
    Enum(&'a EnumDescriptorProto, Vec<i32>, &'a Comments),
}

/// A file's leading comments, by the path of what they precede.
type Comments = HashMap<Vec<i32>, String>;

/// Descriptor paths: `FileDescriptorProto.message_type`, `enum_type`;
/// `DescriptorProto.field`, `nested_type`, `enum_type`;
/// `EnumDescriptorProto.value`.
const FILE_MESSAGES: i32 = 4;
const FILE_ENUMS: i32 = 5;
const MESSAGE_FIELDS: i32 = 2;
const MESSAGE_NESTED: i32 = 3;
const MESSAGE_ENUMS: i32 = 4;

impl MessageSchemas {
    fn from_descriptors() -> Result<Self, String> {
        let set = FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).map_err(|err| err.to_string())?;
        let comments: Vec<Comments> = set.file.iter().map(file_comments).collect();
        let mut declared = HashMap::new();
        for (file, comments) in set.file.iter().zip(&comments) {
            let package = file.package().to_owned();
            for (i, message) in file.message_type.iter().enumerate() {
                declare_message(
                    &mut declared,
                    &package,
                    message,
                    vec![FILE_MESSAGES, i as i32],
                    comments,
                );
            }
            for (i, kind) in file.enum_type.iter().enumerate() {
                declared.insert(
                    format!("{package}.{}", kind.name()),
                    Declared::Enum(kind, vec![FILE_ENUMS, i as i32], comments),
                );
            }
        }
        let mut schemas = BTreeMap::new();
        let mut pending: Vec<String> = ROOTS.iter().map(|root| (*root).to_owned()).collect();
        while let Some(name) = pending.pop() {
            if schemas.contains_key(&name) {
                continue;
            }
            let schema = match declared.get(&name) {
                Some(Declared::Message(message, path, comments)) => {
                    message_schema(message, path, comments, &declared, &mut pending)
                }
                Some(Declared::Enum(kind, path, comments)) => enum_schema(kind, path, comments),
                None => return Err(format!("{name} is not in the descriptors")),
            };
            schemas.insert(name, schema);
        }
        Ok(Self(schemas))
    }
}

fn declare_message<'a>(
    declared: &mut HashMap<String, Declared<'a>>,
    scope: &str,
    message: &'a DescriptorProto,
    path: Vec<i32>,
    comments: &'a Comments,
) {
    let name = format!("{scope}.{}", message.name());
    for (i, nested) in message.nested_type.iter().enumerate() {
        let mut nested_path = path.clone();
        nested_path.extend([MESSAGE_NESTED, i as i32]);
        declare_message(declared, &name, nested, nested_path, comments);
    }
    for (i, kind) in message.enum_type.iter().enumerate() {
        let mut enum_path = path.clone();
        enum_path.extend([MESSAGE_ENUMS, i as i32]);
        declared.insert(
            format!("{name}.{}", kind.name()),
            Declared::Enum(kind, enum_path, comments),
        );
    }
    declared.insert(name, Declared::Message(message, path, comments));
}

fn file_comments(file: &prost_types::FileDescriptorProto) -> Comments {
    let Some(info) = &file.source_code_info else {
        return Comments::new();
    };
    info.location
        .iter()
        .filter_map(|location| {
            let text = location.leading_comments.as_deref()?;
            let text = text
                .lines()
                .map(str::trim)
                .collect::<Vec<_>>()
                .join("\n")
                .trim()
                .to_owned();
            (!text.is_empty()).then(|| (location.path.clone(), text))
        })
        .collect()
}

fn message_schema(
    message: &DescriptorProto,
    path: &[i32],
    comments: &Comments,
    declared: &HashMap<String, Declared<'_>>,
    pending: &mut Vec<String>,
) -> RefOr<Schema> {
    // A map field's entries: an object of values.
    let entries: HashMap<String, &DescriptorProto> = message
        .nested_type
        .iter()
        .filter(|nested| nested.options.as_ref().is_some_and(|o| o.map_entry()))
        .map(|nested| (nested.name().to_owned(), nested))
        .collect();
    let mut object = ObjectBuilder::new()
        .schema_type(Type::Object)
        .additional_properties(Some(AdditionalProperties::FreeForm(false)))
        .description(comments.get(path).cloned());
    let mut oneofs: Vec<Vec<String>> = vec![Vec::new(); message.oneof_decl.len()];
    for (i, field) in message.field.iter().enumerate() {
        let mut field_path = path.to_vec();
        field_path.extend([MESSAGE_FIELDS, i as i32]);
        let json_name = field.json_name().to_owned();
        if let Some(index) = field.oneof_index
            && !field.proto3_optional()
            && let Some(members) = oneofs.get_mut(index as usize)
        {
            members.push(format!("`{json_name}`"));
        }
        let entry = field
            .type_name()
            .rsplit('.')
            .next()
            .and_then(|short| entries.get(short))
            .filter(|_| field.r#type() == Proto::Message);
        let schema = match entry {
            Some(entry) => {
                let value = entry.field.iter().find(|f| f.number() == 2);
                let value = value.map_or_else(
                    || RefOr::T(utoipa::openapi::schema::empty()),
                    |value| field_type(value, declared, pending),
                );
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .additional_properties(Some(AdditionalProperties::RefOr(value)))
                    .into()
            }
            None if field.label() == Label::Repeated => ArrayBuilder::new()
                .items(field_type(field, declared, pending))
                .into(),
            None => field_type(field, declared, pending),
        };
        object = object.property(json_name, describe(schema, comments.get(&field_path)));
    }
    let groups: Vec<String> = message
        .oneof_decl
        .iter()
        .zip(&oneofs)
        .filter(|(_, members)| members.len() > 1)
        .map(|(oneof, members)| {
            format!(
                "At most one of {} (`{}`).",
                members.join(", "),
                oneof.name()
            )
        })
        .collect();
    if !groups.is_empty() {
        let mut text = comments.get(path).cloned().unwrap_or_default();
        for group in groups {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(&group);
        }
        object = object.description(Some(text));
    }
    object.into()
}

/// `schema` with a field's comment as its description.
fn describe(schema: RefOr<Schema>, comment: Option<&String>) -> RefOr<Schema> {
    let Some(comment) = comment else {
        return schema;
    };
    match schema {
        RefOr::Ref(mut reference) => {
            reference.description = comment.clone();
            RefOr::Ref(reference)
        }
        RefOr::T(Schema::Object(mut object)) => {
            object.description = Some(comment.clone());
            RefOr::T(Schema::Object(object))
        }
        RefOr::T(Schema::Array(mut array)) => {
            array.description = Some(comment.clone());
            RefOr::T(Schema::Array(array))
        }
        other => other,
    }
}

fn enum_schema(kind: &EnumDescriptorProto, path: &[i32], comments: &Comments) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(kind.value.iter().map(|value| value.name().to_owned())))
        .description(comments.get(path).cloned())
        .into()
}

fn scalar(kind: Type, format: Option<&str>) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(kind)
        .format(format.map(|format| SchemaFormat::Custom(format.to_owned())))
        .into()
}

/// A 64-bit integer: a string of digits when written, a number or such a
/// string when read.
fn wide_integer(format: &str) -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Integer]))
        .format(Some(SchemaFormat::Custom(format.to_owned())))
        .pattern(Some(if format.starts_with('u') {
            "^[0-9]+$"
        } else {
            "^-?[0-9]+$"
        }))
        .into()
}

/// One value of `field` (an item, for a repeated one).
fn field_type(
    field: &prost_types::FieldDescriptorProto,
    declared: &HashMap<String, Declared<'_>>,
    pending: &mut Vec<String>,
) -> RefOr<Schema> {
    match field.r#type() {
        Proto::Double | Proto::Float => scalar(Type::Number, None),
        Proto::Int64 | Proto::Sint64 | Proto::Sfixed64 => wide_integer("int64"),
        Proto::Uint64 | Proto::Fixed64 => wide_integer("uint64"),
        Proto::Int32 | Proto::Sint32 | Proto::Sfixed32 => scalar(Type::Integer, Some("int32")),
        Proto::Uint32 | Proto::Fixed32 => scalar(Type::Integer, Some("uint32")),
        Proto::Bool => scalar(Type::Boolean, None),
        Proto::String => scalar(Type::String, None),
        Proto::Bytes => ObjectBuilder::new()
            .schema_type(Type::String)
            .content_encoding("base64")
            .into(),
        Proto::Enum | Proto::Message | Proto::Group => {
            let name = field.type_name().trim_start_matches('.');
            if let Some(known) = well_known(name) {
                return known;
            }
            if declared.contains_key(name) {
                pending.push(name.to_owned());
            }
            schema_ref(name)
        }
    }
}

/// The well-known types, in their JSON mapping.
fn well_known(name: &str) -> Option<RefOr<Schema>> {
    Some(match name {
        "google.protobuf.Duration" => ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some(r"^-?[0-9]+(\.[0-9]{1,9})?s$"))
            .examples([json!("1.5s")])
            .into(),
        "google.protobuf.Timestamp" => ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::Custom("date-time".into())))
            .into(),
        "google.protobuf.Struct" | "google.protobuf.Any" | "google.protobuf.Empty" => {
            ObjectBuilder::new().schema_type(Type::Object).into()
        }
        "google.protobuf.ListValue" => ArrayBuilder::new().into(),
        "google.protobuf.Value" => RefOr::T(utoipa::openapi::schema::empty()),
        "google.protobuf.DoubleValue" | "google.protobuf.FloatValue" => scalar(Type::Number, None),
        "google.protobuf.Int64Value" => wide_integer("int64"),
        "google.protobuf.UInt64Value" => wide_integer("uint64"),
        "google.protobuf.Int32Value" => scalar(Type::Integer, Some("int32")),
        "google.protobuf.UInt32Value" => scalar(Type::Integer, Some("uint32")),
        "google.protobuf.BoolValue" => scalar(Type::Boolean, None),
        "google.protobuf.StringValue" => scalar(Type::String, None),
        "google.protobuf.BytesValue" => ObjectBuilder::new()
            .schema_type(Type::String)
            .content_encoding("base64")
            .into(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document_json() -> serde_json::Value {
        serde_json::to_value(document()).unwrap()
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
    fn every_endpoint_has_its_path() {
        let document = document_json();
        let paths = document["paths"].as_object().unwrap();
        assert_eq!(paths.len(), Endpoint::ALL.len());
        for endpoint in Endpoint::ALL {
            assert!(paths.contains_key(endpoint.path()), "{endpoint:?}");
        }
        assert_eq!(document["openapi"], "3.1.0");
    }
}

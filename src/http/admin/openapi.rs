//! The admin API's part of the OpenAPI document (`http::openapi`, which
//! adds what every API call on a `CheckLimitRequest` shares): its
//! operations, each requiring the bearer token (the `adminToken` security
//! scheme) and answering 401 and 403, and the schemas of its answers. In
//! the document only when the server serves the admin API.

use utoipa::openapi::path::{Operation, OperationBuilder};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{Components, ContentBuilder, Ref, RefOr, Response};
use utoipa::{PartialSchema, ToSchema};

use super::lists::{
    AlgorithmEntry, ConfigList, FlagEntry, PoliciesList, PolicyEntry, PolicyLimitEntry,
    QuotaDomainEntry, QuotaList, QuotaPolicyEntry, RuleEntry, RulesList, Written,
};
use super::{ResetAnswer, ResetEntry};
use crate::http::api::{JSON, Refusal};

/// The name of the admin API's security scheme.
pub(crate) const ADMIN_TOKEN: &str = "adminToken";

/// The admin API's schemas and its security scheme, into `components`.
pub(crate) fn components(components: &mut Components) {
    for (name, schema) in [
        (ResetAnswer::name(), ResetAnswer::schema()),
        (ResetEntry::name(), ResetEntry::schema()),
        (RulesList::name(), RulesList::schema()),
        (RuleEntry::name(), RuleEntry::schema()),
        (Written::name(), Written::schema()),
        (PoliciesList::name(), PoliciesList::schema()),
        (PolicyEntry::name(), PolicyEntry::schema()),
        (PolicyLimitEntry::name(), PolicyLimitEntry::schema()),
        (AlgorithmEntry::name(), AlgorithmEntry::schema()),
        (QuotaList::name(), QuotaList::schema()),
        (QuotaDomainEntry::name(), QuotaDomainEntry::schema()),
        (QuotaPolicyEntry::name(), QuotaPolicyEntry::schema()),
        (ConfigList::name(), ConfigList::schema()),
        (FlagEntry::name(), FlagEntry::schema()),
    ] {
        components.schemas.insert(name.into_owned(), schema);
    }
    components.add_security_scheme(
        ADMIN_TOKEN,
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some("The server's --admin-token."))
                .build(),
        ),
    );
}

/// `description`, answered with a [`Refusal`].
fn refusal(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(JSON, json_of(&Refusal::name()))
        .build()
}

/// JSON of the schema `name`.
fn json_of(name: &str) -> utoipa::openapi::Content {
    ContentBuilder::new()
        .schema(Some(RefOr::Ref(Ref::from_schema_name(name))))
        .build()
}

/// An admin operation: the bearer token required, 401 and 403 answered.
fn admin_operation(id: &str, summary: &str, description: &str) -> OperationBuilder {
    OperationBuilder::new()
        .operation_id(Some(id))
        .tag("admin")
        .summary(Some(summary))
        .description(Some(description))
        .security(SecurityRequirement::new(ADMIN_TOKEN, Vec::<String>::new()))
        .response(
            "401",
            refusal("No `Authorization: Bearer` credentials. The body is the same as 403's."),
        )
        .response(
            "403",
            refusal("A token other than the server's. The body is the same as 401's."),
        )
}

/// An admin list (a GET): 200 with `schema`.
fn admin_list(id: &str, summary: &str, description: &str, schema: &str) -> Operation {
    admin_operation(id, summary, description)
        .response(
            "200",
            ResponseBuilder::new()
                .description("The list.")
                .content(JSON, json_of(schema))
                .build(),
        )
        .build()
}

/// `POST /admin/v1/peek`, but its body and the answers it shares with
/// every call on a `CheckLimitRequest`.
pub(crate) fn peek() -> OperationBuilder {
    admin_operation(
        "adminPeek",
        "What the limits of a request have left, spending nothing",
        "The request in any form `/v1/check` takes, decided as `/v1/check` decides it but at \
         cost 0 (on every limit): the answer says what is left, and nothing is spent.",
    )
    .response(
        "200",
        ResponseBuilder::new()
            .description("The decision at cost 0, with /v1/check's headers.")
            .content(JSON, json_of("ratelimitd.v1.CheckLimitResponse"))
            .build(),
    )
}

/// `POST /admin/v1/reset`, as [`peek`].
pub(crate) fn reset() -> OperationBuilder {
    admin_operation(
        "adminReset",
        "Reset the limits of a request",
        "Deletes the counter of every limit the request names (in any form `/v1/check` takes; \
         its cost is ignored) on the store, and forgets this instance's cached denials of \
         them. Other instances' cached denials stand until they lift.",
    )
    .response(
        "200",
        ResponseBuilder::new()
            .description("What was reset, one entry per limit.")
            .content(JSON, json_of(&ResetAnswer::name()))
            .build(),
    )
}

/// `GET /admin/v1/rules`.
pub(crate) fn rules() -> Operation {
    admin_list(
        "adminRules",
        "The Envoy rules in force",
        "Every limit of every domain, with the file (or xDS resource) and line it was written \
         at, and when the rules were put in force.",
        &RulesList::name(),
    )
}

/// `GET /admin/v1/policies`.
pub(crate) fn policies() -> Operation {
    admin_list(
        "adminPolicies",
        "The named policies in force",
        "Every `CheckLimit` policy with its limits and where it was written.",
        &PoliciesList::name(),
    )
}

/// `GET /admin/v1/quota-buckets`.
pub(crate) fn quota_buckets() -> Operation {
    admin_list(
        "adminQuotaBuckets",
        "The quota service's policies, and this instance's subscriptions",
        "Every domain's quota bucket policies with where they were written, and how many \
         bucket subscriptions this instance's streams hold.",
        &QuotaList::name(),
    )
}

/// `GET /admin/v1/config`.
pub(crate) fn config() -> Operation {
    admin_list(
        "adminConfig",
        "The configuration in force",
        "Every flag's value and where it came from; secrets show as `***`, Redis URLs without \
         their credentials.",
        &ConfigList::name(),
    )
}

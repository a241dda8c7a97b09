//! The admin API, on the service listener, served only when a token is
//! configured ([`AdminOptions`]): peek at the limits a `CheckLimitRequest`
//! names without spending (`POST /admin/v1/peek`: `/v1/check`'s own path,
//! at cost 0), reset them (`POST /admin/v1/reset`), list the Envoy rules,
//! the policies and the quota service's buckets in force with where they
//! were written and when loaded, and show the configuration with its
//! secrets hidden ([`lists`]).
//!
//! Every call must carry `Authorization: Bearer <token>`: without one it
//! is 401, with another token 403, both with the same body, so the answer
//! says nothing of the token. The token is compared in constant time, as
//! SHA-256 digests (so its length does not show either). Every call is
//! logged with the caller's address and counted
//! (`ratelimitd_admin_requests_total`).

pub(crate) mod lists;
pub(crate) mod openapi;
pub(crate) mod options;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{MethodRouter, get, post};
use serde::Serialize;
use subtle::ConstantTimeEq;
use tracing::{info, warn};

pub(crate) use self::options::AdminOptions;
use super::Endpoint;
use super::api::{self, Api};
use crate::api::check;
use crate::api::rlqs::QuotaService;
use crate::config::effective::Effective;
use crate::decider::ResetLimit;
use crate::metrics;
use crate::options::Secret;
use crate::pb::json::ratelimitd::v1 as json;
use crate::pb::ratelimitd::v1 as pb;
use crate::rules::RulesHandle;

/// What the admin API serves, besides the JSON API's parts.
pub(crate) struct AdminParts {
    /// The token callers must send.
    pub token: Secret,
    /// The rules in force.
    pub rules: RulesHandle,
    /// Where the rules come from, for the rules list.
    pub rules_origin: String,
    /// The quota service, for its subscriptions.
    pub quota: QuotaService,
    /// The configuration in force, secrets hidden.
    pub effective: Effective,
}

/// The admin API's handlers' shared state.
#[derive(Clone)]
pub(crate) struct Admin(Arc<Inner>);

struct Inner {
    /// SHA-256 of the token: compared in constant time, whatever the
    /// length of what is sent.
    token_digest: ring::digest::Digest,
    api: Api,
    rules: RulesHandle,
    rules_origin: String,
    quota: QuotaService,
    effective: Effective,
}

/// What a refused caller is told, 401 or 403 alike.
const TOKEN_RULE: &str = "must be `Bearer <the server's admin token>`";

/// `POST /admin/v1/reset`'s answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ResetAnswer {
    /// One entry per limit the request names, in order (limits sharing
    /// one counter name the same key).
    pub reset: Vec<ResetEntry>,
}

/// One limit reset.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ResetEntry {
    /// The limit's name (empty for an unnamed limit and the one-limit
    /// form).
    pub name: String,
    /// Its algorithm.
    pub algorithm: String,
    /// Its counter's key on the store.
    pub storage_key: String,
    /// The store held state for it (now deleted).
    pub existed: bool,
    /// This instance had a denial of it cached (now forgotten). Other
    /// instances keep theirs until they lift.
    pub cached_denial: bool,
}

impl From<ResetLimit> for ResetEntry {
    fn from(limit: ResetLimit) -> Self {
        Self {
            name: limit.name,
            algorithm: limit.algorithm.to_owned(),
            storage_key: limit.key.storage_key,
            existed: limit.key.existed,
            cached_denial: limit.key.cached_denial,
        }
    }
}

impl Admin {
    /// The admin API over `parts`, deciding through `api`.
    pub(crate) fn new(parts: AdminParts, api: Api) -> Self {
        Self(Arc::new(Inner {
            token_digest: digest(parts.token.expose().as_bytes()),
            api,
            rules: parts.rules,
            rules_origin: parts.rules_origin,
            quota: parts.quota,
            effective: parts.effective,
        }))
    }

    /// The route of an admin endpoint (any other endpoint: none).
    pub(crate) fn route(&self, endpoint: Endpoint) -> Option<MethodRouter> {
        let admin = self.clone();
        let handler = move |request: Request| {
            let admin = admin.clone();
            async move { admin.serve(endpoint, request).await }
        };
        match endpoint {
            Endpoint::AdminPeek | Endpoint::AdminReset => Some(post(handler)),
            Endpoint::AdminRules
            | Endpoint::AdminPolicies
            | Endpoint::AdminQuotaBuckets
            | Endpoint::AdminConfig => Some(get(handler)),
            _ => None,
        }
    }

    /// One call: the token checked, then answered; logged and counted.
    async fn serve(self, endpoint: Endpoint, request: Request) -> Response {
        let (parts, body) = request.into_parts();
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(peer)| peer.to_string())
            .unwrap_or_else(|| "unknown".to_owned());
        let answer = match self.authorize(&parts.headers) {
            Err(status) => token_refused(status),
            Ok(()) => self.answer(endpoint, &parts.headers, body).await,
        };
        let status = answer.status();
        let outcome = match status {
            StatusCode::UNAUTHORIZED => "unauthenticated",
            StatusCode::FORBIDDEN => "forbidden",
            status if status.is_success() => "ok",
            status if status.is_client_error() => "refused",
            _ => "failed",
        };
        metrics::admin_request(label(endpoint), outcome);
        let path = endpoint.path();
        let status = status.as_u16();
        if matches!(outcome, "unauthenticated" | "forbidden") {
            warn!(%peer, endpoint = path, status, outcome, "admin API call refused");
        } else {
            info!(%peer, endpoint = path, status, outcome, "admin API call");
        }
        answer
    }

    /// `Ok` for the right bearer token; 401 without bearer credentials,
    /// 403 with others.
    fn authorize(&self, headers: &HeaderMap) -> Result<(), StatusCode> {
        let Some(token) = bearer(headers) else {
            return Err(StatusCode::UNAUTHORIZED);
        };
        let sent = digest(token);
        if bool::from(sent.as_ref().ct_eq(self.0.token_digest.as_ref())) {
            Ok(())
        } else {
            Err(StatusCode::FORBIDDEN)
        }
    }

    async fn answer(
        &self,
        endpoint: Endpoint,
        headers: &HeaderMap,
        body: axum::body::Body,
    ) -> Response {
        let admin = &self.0;
        match endpoint {
            Endpoint::AdminPeek => match check_request(admin, headers, body).await {
                Ok(request) => api::decide(&admin.api, looking_only(request)).await,
                Err(answer) => answer,
            },
            Endpoint::AdminReset => {
                let request = match check_request(admin, headers, body).await {
                    Ok(request) => request,
                    Err(answer) => return answer,
                };
                let reset = match check::ask(&admin.api.decider, request) {
                    Ok(question) => admin.api.decider.reset(&question).await,
                    Err(err) => Err(err),
                };
                match reset {
                    Ok(reset) => api::json_answer(
                        StatusCode::OK,
                        &ResetAnswer {
                            reset: reset.into_iter().map(ResetEntry::from).collect(),
                        },
                    ),
                    Err(err) => api::failed(&err),
                }
            }
            Endpoint::AdminRules => {
                let (rules, loaded_at) = admin.rules.current_with_time();
                api::json_answer(
                    StatusCode::OK,
                    &lists::rules_list(&rules, loaded_at, &admin.rules_origin),
                )
            }
            Endpoint::AdminPolicies => {
                let (rules, loaded_at) = admin.rules.current_with_time();
                api::json_answer(StatusCode::OK, &lists::policies_list(&rules, loaded_at))
            }
            Endpoint::AdminQuotaBuckets => {
                let (rules, loaded_at) = admin.rules.current_with_time();
                api::json_answer(
                    StatusCode::OK,
                    &lists::quota_list(&rules, loaded_at, admin.quota.subscriptions()),
                )
            }
            Endpoint::AdminConfig => api::json_answer(
                StatusCode::OK,
                &lists::ConfigList {
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    flags: admin.effective.flags().iter().map(Into::into).collect(),
                },
            ),
            _ => super::not_found(),
        }
    }
}

/// The metrics label of an admin endpoint.
pub(crate) fn label(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::AdminPeek => "peek",
        Endpoint::AdminReset => "reset",
        Endpoint::AdminRules => "rules",
        Endpoint::AdminPolicies => "policies",
        Endpoint::AdminQuotaBuckets => "quota_buckets",
        Endpoint::AdminConfig => "config",
        _ => "other",
    }
}

fn digest(token: &[u8]) -> ring::digest::Digest {
    ring::digest::digest(&ring::digest::SHA256, token)
}

/// The credentials of an `Authorization: Bearer <token>` header (the
/// scheme in any case, as RFC 9110 has it).
fn bearer(headers: &HeaderMap) -> Option<&[u8]> {
    let value = headers.get(AUTHORIZATION)?.as_bytes();
    let space = value.iter().position(|&byte| byte == b' ')?;
    let (scheme, rest) = value.split_at(space);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// 401 or 403, with one body for both.
fn token_refused(status: StatusCode) -> Response {
    let mut answer = api::refused(status, "authorization", TOKEN_RULE.to_owned());
    if status == StatusCode::UNAUTHORIZED {
        answer
            .headers_mut()
            .insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    answer
}

/// The `CheckLimitRequest` a peek or a reset names, read as
/// `POST /v1/check` reads it; or the answer refusing it.
async fn check_request(
    admin: &Inner,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<pb::CheckLimitRequest, Response> {
    api::accept::<json::CheckLimitRequest, pb::CheckLimitRequest>(
        &admin.api,
        headers,
        body,
        "CheckLimitRequest",
    )
    .await
}

/// `request` spending nothing: cost 0 on it and on each of its limits
/// (the proto's "look only").
fn looking_only(mut request: pb::CheckLimitRequest) -> pb::CheckLimitRequest {
    request.cost = Some(0);
    for limit in &mut request.limits {
        limit.cost = Some(0);
    }
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn only_bearer_credentials_are_read() {
        assert_eq!(bearer(&with("Bearer abc")), Some(&b"abc"[..]));
        assert_eq!(bearer(&with("bearer  abc ")), Some(&b"abc"[..]));
        assert_eq!(bearer(&with("Basic abc")), None);
        assert_eq!(bearer(&with("Bearer ")), None);
        assert_eq!(bearer(&with("Bearer")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }

    #[test]
    fn a_peek_spends_nothing_on_any_limit() {
        let request = pb::CheckLimitRequest {
            key: "k".into(),
            cost: Some(3),
            limits: vec![pb::Limit {
                cost: Some(5),
                ..Default::default()
            }],
            ..Default::default()
        };
        let looked = looking_only(request);
        assert_eq!(looked.cost, Some(0));
        assert_eq!(looked.limits[0].cost, Some(0));
    }
}

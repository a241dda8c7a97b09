//! The `ratelimitd.v1.RateLimiter` service: protobuf in, validated
//! questions to the limiter (one limit, several, or a named policy's),
//! decisions back to protobuf; and batches of such questions. Nothing else
//! happens here: `question` validates, `answer` answers; `reset` is an
//! operator's reset of the limits a request names.

mod answer;
mod question;
mod reset;

use futures::StreamExt;
use tonic::{Request, Response, Status};
use tracing::debug;

pub use self::answer::response;
use self::answer::several_response;
pub use self::question::limit_request;
use self::question::{Form, question};
pub use self::reset::ResetLimit;
use crate::error::Error;
use crate::limit::InvalidArgument;
use crate::limiter::Limiter;
use crate::live;
use crate::load_shed::DecisionSlots;
use crate::metrics::{self, Api};
use crate::pb::google::rpc;
use crate::pb::ratelimitd::v1 as pb;
use crate::rules::{Rules, RulesHandle};

/// Items of one batch decided at once: enough to keep a Redis pool busy,
/// few enough that one batch does not take every connection from the
/// unary calls beside it.
const BATCH_CONCURRENCY: usize = 32;

/// Bounds on what one call may ask.
#[derive(Debug, Clone, Copy)]
pub struct CheckBounds {
    /// Most limits in one request's `limits`.
    pub max_limits: usize,
    /// Most requests in one `CheckLimits`.
    pub max_batch: usize,
}

/// The service, over one limiter.
#[derive(Clone)]
pub struct CheckService {
    limiter: Limiter,
    slots: DecisionSlots,
    /// Where the named policies are (with every other rule, reloaded with
    /// them).
    rules: RulesHandle,
    bounds: CheckBounds,
}

impl CheckService {
    /// The service, deciding on `limiter`, each call holding one of
    /// `slots`, with the policies of `rules`.
    pub fn new(
        limiter: Limiter,
        slots: DecisionSlots,
        rules: RulesHandle,
        bounds: CheckBounds,
    ) -> Self {
        Self {
            limiter,
            slots,
            rules,
            bounds,
        }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> pb::rate_limiter_server::RateLimiterServer<Self> {
        pb::rate_limiter_server::RateLimiterServer::new(self)
    }

    /// Validates and decides one request, against the policies of `rules`
    /// (taken only for requests that name a policy: the other forms need
    /// no look at the configuration).
    async fn answer(
        &self,
        request: pb::CheckLimitRequest,
        rules: Option<&Rules>,
    ) -> Result<pb::CheckLimitResponse, Error> {
        let question = question(request, rules, self.bounds.max_limits)?;
        match question.form {
            Form::One => {
                let request = &question.requests[0];
                let decision = self.limiter.check(request, question.failure_policy).await?;
                metrics::decision(Api::CheckLimit, request.algorithm.kind(), &decision);
                live::decision(
                    live::Face::CheckLimit,
                    live::Origin::Request,
                    request,
                    &decision,
                );
                debug!(
                    algorithm = request.algorithm.name(),
                    allowed = decision.is_allowed(),
                    remaining = decision.remaining(),
                    "decided"
                );
                Ok(response(&decision))
            }
            Form::Several { labels, policy } => {
                let decisions = self
                    .limiter
                    .check_all(&question.requests, question.failure_policy)
                    .await?;
                let origin = match &policy {
                    Some(policy) => live::Origin::Policy(&policy.name),
                    None => live::Origin::Request,
                };
                for (request, decision) in question.requests.iter().zip(&decisions) {
                    metrics::decision(Api::CheckLimit, request.algorithm.kind(), decision);
                    live::decision(live::Face::CheckLimit, origin, request, decision);
                }
                let response = several_response(&labels, &decisions);
                if let Some(policy) = &policy {
                    metrics::policy_decision(&policy.name, response.allowed, response.degraded);
                }
                debug!(
                    limits = decisions.len(),
                    policy = policy.as_ref().map(|p| p.name.as_str()),
                    allowed = response.allowed,
                    "decided"
                );
                Ok(response)
            }
        }
    }
}

#[tonic::async_trait]
impl pb::rate_limiter_server::RateLimiter for CheckService {
    async fn check_limit(
        &self,
        request: Request<pb::CheckLimitRequest>,
    ) -> Result<Response<pb::CheckLimitResponse>, Status> {
        let (_in_flight, request) = self.slots.admit(request)?;
        let rules = (!request.policy.is_empty()).then(|| self.rules.current());
        let response = self.answer(request, rules.as_deref()).await?;
        Ok(Response::new(response))
    }

    /// One slot for the whole batch: its items are decided at most
    /// `BATCH_CONCURRENCY` at a time, and every item against the same
    /// policies (one reload cannot split a batch).
    async fn check_limits(
        &self,
        request: Request<pb::CheckLimitsRequest>,
    ) -> Result<Response<pb::CheckLimitsResponse>, Status> {
        let (_in_flight, batch) = self.slots.admit(request)?;
        let items = batch.requests;
        if items.is_empty() {
            return Err(Error::from(InvalidArgument::new("requests", "must not be empty")).into());
        }
        if items.len() > self.bounds.max_batch {
            return Err(Error::from(InvalidArgument::new(
                "requests",
                format!(
                    "must hold at most {} requests (got {}); the server's --max-batch-size \
                     sets the bound",
                    self.bounds.max_batch,
                    items.len()
                ),
            ))
            .into());
        }
        let rules = items
            .iter()
            .any(|item| !item.policy.is_empty())
            .then(|| self.rules.current());
        let rules = rules.as_deref();
        let results = futures::stream::iter(items)
            .map(|item| async move {
                let result = match self.answer(item, rules).await {
                    Ok(response) => pb::check_limit_result::Result::Response(response),
                    Err(err) => {
                        let status = Status::from(err);
                        pb::check_limit_result::Result::Error(rpc::Status {
                            code: status.code() as i32,
                            message: status.message().to_owned(),
                            details: Vec::new(),
                        })
                    }
                };
                pb::CheckLimitResult {
                    result: Some(result),
                }
            })
            .buffered(BATCH_CONCURRENCY)
            .collect()
            .await;
        Ok(Response::new(pb::CheckLimitsResponse { results }))
    }
}

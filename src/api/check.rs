//! The `ratelimitd.v1.RateLimiter` service: protobuf in, validated
//! questions to the [`Decider`] (one limit, several, or a named policy's),
//! answers back to protobuf; and batches of such questions. Nothing else
//! happens here: `question` validates, `answer` answers. The HTTP API
//! speaks the same messages (in their JSON mapping) and asks through the
//! same `check_limit` and `check_limits`.

mod answer;
mod question;

use std::net::IpAddr;

use tonic::{Request, Response, Status};

pub(crate) use self::answer::{answer, status};
pub use self::question::limit_request;
pub(crate) use self::question::question;
use crate::api::status::item_status;
use crate::decider::Decider;
use crate::error::Error;
use crate::incoming;
use crate::pb::ratelimitd::v1 as pb;

/// The service, over one decider.
#[derive(Clone)]
pub(crate) struct CheckService {
    decider: Decider,
}

impl CheckService {
    /// The service, asking `decider`.
    pub(crate) fn new(decider: Decider) -> Self {
        Self { decider }
    }

    /// The tonic server for this service.
    pub(crate) fn into_server(self) -> pb::rate_limiter_server::RateLimiterServer<Self> {
        pb::rate_limiter_server::RateLimiterServer::new(self)
    }
}

/// `request` as the decider's question, against the policies in force
/// (looked at only when it names a policy: the other forms need no look
/// at the configuration).
pub(crate) fn ask(
    decider: &Decider,
    request: pb::CheckLimitRequest,
) -> Result<crate::decider::Question, Error> {
    let rules = (!request.policy.is_empty()).then(|| decider.rules());
    question(request, rules.as_deref(), decider.bounds().max_limits)
}

/// `CheckLimit`, whatever carries it: a decision slot for `peer`, then
/// `request` validated and decided.
pub(crate) async fn check_limit(
    decider: &Decider,
    peer: Option<IpAddr>,
    request: pb::CheckLimitRequest,
) -> Result<pb::CheckLimitResponse, Error> {
    let _in_flight = decider.admit(peer)?;
    let question = ask(decider, request)?;
    Ok(answer(&decider.decide(question).await?))
}

/// `CheckLimits`, whatever carries it: one decision slot for the whole
/// batch, and every item against the same policies (one reload cannot
/// split a batch); an item refused or undecided carries its error.
pub(crate) async fn check_limits(
    decider: &Decider,
    peer: Option<IpAddr>,
    batch: pb::CheckLimitsRequest,
) -> Result<pb::CheckLimitsResponse, Error> {
    let _in_flight = decider.admit(peer)?;
    let items = batch.requests;
    let rules = items
        .iter()
        .any(|item| !item.policy.is_empty())
        .then(|| decider.rules());
    let max_limits = decider.bounds().max_limits;
    let questions = items
        .into_iter()
        .map(|item| question(item, rules.as_deref(), max_limits))
        .collect();
    let answers = decider.decide_batch(questions).await?;
    let results = answers
        .into_iter()
        .map(|answered| {
            let result = match answered {
                Ok(answered) => pb::check_limit_result::Result::Response(answer(&answered)),
                Err(err) => pb::check_limit_result::Result::Error(item_status(&err)),
            };
            pb::CheckLimitResult {
                result: Some(result),
            }
        })
        .collect();
    Ok(pb::CheckLimitsResponse { results })
}

#[tonic::async_trait]
impl pb::rate_limiter_server::RateLimiter for CheckService {
    async fn check_limit(
        &self,
        request: Request<pb::CheckLimitRequest>,
    ) -> Result<Response<pb::CheckLimitResponse>, Status> {
        let peer = incoming::peer_ip(request.extensions());
        let response = check_limit(&self.decider, peer, request.into_inner()).await?;
        Ok(Response::new(response))
    }

    async fn check_limits(
        &self,
        request: Request<pb::CheckLimitsRequest>,
    ) -> Result<Response<pb::CheckLimitsResponse>, Status> {
        let peer = incoming::peer_ip(request.extensions());
        let response = check_limits(&self.decider, peer, request.into_inner()).await?;
        Ok(Response::new(response))
    }
}

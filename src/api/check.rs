//! The `ratelimitd.v1.RateLimiter` service: protobuf in, validated
//! questions to the limiter (one limit, several, or a named policy's),
//! decisions back to protobuf; and batches of such questions. Nothing else
//! happens here.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use tonic::{Request, Response, Status};
use tracing::debug;

use crate::algorithm::{
    self,
    registry::{self, Kind},
};
use crate::error::Error;
use crate::incoming;
use crate::limit::{
    self, Algorithm, CallerKey, Decision, FailurePolicy, InvalidArgument, LimitRequest, Micros,
    RetryAfter,
};
use crate::limiter::Limiter;
use crate::load_shed::DecisionSlots;
use crate::metrics::{self, Api};
use crate::pb::convert::micros_to_duration;
use crate::pb::google::rpc;
use crate::pb::ratelimitd::v1 as pb;
use crate::pb::ratelimitd::v1::check_limit_request::Algorithm as PbAlgorithm;
use crate::policy::Policy;
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
                metrics::decision(Api::CheckLimit, request.algorithm.name(), &decision);
                debug!(
                    algorithm = request.algorithm.name(),
                    allowed = decision.allowed,
                    remaining = decision.remaining,
                    "decided"
                );
                Ok(response(&decision))
            }
            Form::Several { labels, policy } => {
                let decisions = self
                    .limiter
                    .check_all(&question.requests, question.failure_policy)
                    .await?;
                for (request, decision) in question.requests.iter().zip(&decisions) {
                    metrics::decision(Api::CheckLimit, request.algorithm.name(), decision);
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
        let _in_flight = self.slots.enter(incoming::peer_ip(request.extensions()))?;
        let request = request.into_inner();
        let rules = (!request.policy.is_empty()).then(|| self.rules.current());
        let response = self.answer(request, rules.as_deref()).await?;
        Ok(Response::new(response))
    }

    /// One slot for the whole batch: its items are decided at most
    /// [`BATCH_CONCURRENCY`] at a time, and every item against the same
    /// policies (one reload cannot split a batch).
    async fn check_limits(
        &self,
        request: Request<pb::CheckLimitsRequest>,
    ) -> Result<Response<pb::CheckLimitsResponse>, Status> {
        let _in_flight = self.slots.enter(incoming::peer_ip(request.extensions()))?;
        let items = request.into_inner().requests;
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

/// A validated request: the limit requests to decide, and how to answer.
struct Question {
    requests: Vec<LimitRequest>,
    form: Form,
    failure_policy: Option<FailurePolicy>,
}

enum Form {
    /// One limit: answered in the top-level fields alone.
    One,
    /// Several limits (or a policy's): one label per request, in order.
    Several {
        labels: Vec<Label>,
        policy: Option<Arc<Policy>>,
    },
}

/// What a status reports of its limit besides the decision.
struct Label {
    name: String,
    shadow: bool,
}

/// Validates a request once, into the types the core trusts: its form,
/// then that form's fields. `rules` is the configuration in force when the
/// request names a policy (`None` for the other forms).
fn question(
    request: pb::CheckLimitRequest,
    rules: Option<&Rules>,
    max_limits: usize,
) -> Result<Question, Error> {
    let failure_policy = failure_policy(request.failure_policy)?;
    let forms = [
        ("an algorithm", request.algorithm.is_some()),
        ("limits", !request.limits.is_empty()),
        ("policy", !request.policy.is_empty()),
    ];
    let set: Vec<&str> = forms
        .iter()
        .filter(|(_, set)| *set)
        .map(|(f, _)| *f)
        .collect();
    if set.len() > 1 {
        return Err(InvalidArgument::new(
            if request.policy.is_empty() {
                "limits"
            } else {
                "policy"
            },
            format!(
                "cannot be combined with {}: a request sets one algorithm, or limits, or a \
                 policy",
                set[0]
            ),
        )
        .into());
    }
    if !request.policy.is_empty() {
        limit::check_name("policy", &request.policy)?;
        let known = rules.and_then(|rules| rules.policy(&request.policy));
        let Some(policy) = known.cloned() else {
            return Err(Error::NotFound(format!(
                "policy: '{}' is not defined in the server's policies",
                request.policy
            )));
        };
        let key = CallerKey::new(request.key)?;
        let cost = limit::cost(request.cost)?;
        let labels = policy
            .limits
            .iter()
            .map(|limit| Label {
                name: limit.name.clone(),
                shadow: limit.shadow,
            })
            .collect();
        return Ok(Question {
            requests: policy.requests(&key, cost),
            form: Form::Several {
                labels,
                policy: Some(policy),
            },
            failure_policy,
        });
    }
    if !request.limits.is_empty() {
        let (requests, labels) = several(request, max_limits)?;
        return Ok(Question {
            requests,
            form: Form::Several {
                labels,
                policy: None,
            },
            failure_policy,
        });
    }
    Ok(Question {
        requests: vec![limit_request(request)?],
        form: Form::One,
        failure_policy,
    })
}

/// The limit requests of a request with `limits`, and their labels.
fn several(
    request: pb::CheckLimitRequest,
    max_limits: usize,
) -> Result<(Vec<LimitRequest>, Vec<Label>), InvalidArgument> {
    if request.limits.len() > max_limits {
        return Err(InvalidArgument::new(
            "limits",
            format!(
                "must hold at most {max_limits} limits (got {}); the server's \
                 --max-limits-per-request sets the bound",
                request.limits.len()
            ),
        ));
    }
    let key = if request.key.is_empty() {
        None
    } else {
        Some(CallerKey::new(request.key)?)
    };
    let cost = limit::cost(request.cost)?;
    let mut requests: Vec<LimitRequest> = Vec::with_capacity(request.limits.len());
    let mut labels: Vec<Label> = Vec::with_capacity(request.limits.len());
    // The limits seen so far, by what makes a counter theirs: a name, or
    // (unnamed) a key and an algorithm. A map, so a bound raised high
    // stays linear.
    let mut seen: HashMap<(String, String, &'static str), usize> = HashMap::new();
    for (i, limit) in request.limits.into_iter().enumerate() {
        let within = |err: InvalidArgument| err.within(&format!("limits[{i}]"));
        if !limit.name.is_empty() {
            limit::check_name("name", &limit.name).map_err(within)?;
        }
        let own_key = if limit.key.is_empty() {
            key.clone().ok_or_else(|| {
                InvalidArgument::new("key", "is required when the request has no key")
            })
        } else {
            CallerKey::new(limit.key)
        }
        .map_err(within)?;
        let algorithm = algorithm(limit.algorithm.map(PbAlgorithm::from)).map_err(within)?;
        let limit_cost = match limit.cost {
            Some(cost) => limit::cost(Some(cost)).map_err(within)?,
            None => cost,
        };
        let identity = if limit.name.is_empty() {
            (
                String::new(),
                own_key.as_str().to_owned(),
                algorithm::key_tag(&algorithm),
            )
        } else {
            (limit.name.clone(), String::new(), "")
        };
        if let Some(first) = seen.insert(identity, i) {
            let (field, rule) = if limit.name.is_empty() {
                let rule = format!(
                    "counts on the same counter as limits[{first}] (same key and algorithm): \
                     give one of them a name, or its own key"
                );
                ("key", rule)
            } else {
                let rule = format!("'{}' is already the name of limits[{first}]", limit.name);
                ("name", rule)
            };
            return Err(within(InvalidArgument::new(field, rule)));
        }
        let counted = if limit.name.is_empty() {
            own_key
        } else {
            CallerKey::named(&limit.name, &own_key)
        };
        requests.push(LimitRequest {
            key: counted,
            algorithm,
            cost: limit_cost,
            shadow: false,
        });
        labels.push(Label {
            name: limit.name,
            shadow: false,
        });
    }
    Ok((requests, labels))
}

/// Validates a one-limit request into the request the core decides.
pub fn limit_request(request: pb::CheckLimitRequest) -> Result<LimitRequest, InvalidArgument> {
    let key = CallerKey::new(request.key)?;
    let algorithm = algorithm(request.algorithm)?;
    let cost = limit::cost(request.cost)?;
    Ok(LimitRequest {
        key,
        algorithm,
        cost,
        shadow: false,
    })
}

/// An algorithm and its parameters, each checked.
fn algorithm(algorithm: Option<PbAlgorithm>) -> Result<Algorithm, InvalidArgument> {
    let Some(algorithm) = algorithm else {
        return Err(InvalidArgument::new(
            "algorithm",
            format!(
                "is required: set one of {} (or, for the request, limits or a policy)",
                Kind::names(", ")
            ),
        ));
    };
    registry::from_proto(algorithm)
}

/// The call's own failure policy, if it names one.
fn failure_policy(value: Option<i32>) -> Result<Option<FailurePolicy>, InvalidArgument> {
    match value.map(pb::FailurePolicy::try_from) {
        None | Some(Ok(pb::FailurePolicy::Unspecified)) => Ok(None),
        Some(Ok(pb::FailurePolicy::FailClosed)) => Ok(Some(FailurePolicy::FailClosed)),
        Some(Ok(pb::FailurePolicy::FailOpen)) => Ok(Some(FailurePolicy::FailOpen)),
        Some(Ok(pb::FailurePolicy::Local)) => Ok(Some(FailurePolicy::Local)),
        Some(Err(_)) => Err(InvalidArgument::new(
            "failure_policy",
            "must be FAIL_CLOSED, FAIL_OPEN or LOCAL",
        )),
    }
}

/// The protobuf form of a decision.
pub fn response(decision: &Decision) -> pb::CheckLimitResponse {
    let (retry_after, cost_exceeds_limit) = retry(decision);
    pb::CheckLimitResponse {
        allowed: decision.allowed,
        limit: decision.limit,
        remaining: decision.remaining,
        reset_after: Some(micros_to_duration(decision.reset_after)),
        retry_after,
        cost_exceeds_limit,
        degraded: decision.degraded,
        limits: Vec::new(),
        most_restrictive: 0,
    }
}

/// The answer to several limits decided together: one status each, and
/// the request's overall decision (see the proto's `CheckLimitResponse`).
fn several_response(labels: &[Label], decisions: &[Decision]) -> pb::CheckLimitResponse {
    let enforcing: Vec<usize> = (0..decisions.len())
        .filter(|&i| !labels[i].shadow)
        .collect();
    let allowed = enforcing.iter().all(|&i| decisions[i].allowed);
    // Denied: the denying limit with the longest wait (never is longest).
    // Allowed: the fewest units left, then the longest reset. Ties go to
    // the first, as `min_by_key` keeps it. (The Envoy face orders one
    // descriptor's limits the same way.)
    let restrictiveness = |decision: &Decision| {
        if allowed || decision.allowed {
            (1, decision.remaining, Reverse(decision.reset_after))
        } else {
            let wait = match decision.retry_after {
                RetryAfter::After(micros) => micros,
                RetryAfter::Never => Micros::MAX,
            };
            (0, 0, Reverse(wait))
        }
    };
    // All shadow: the statuses still name the most restrictive.
    let candidates = if enforcing.is_empty() {
        (0..decisions.len()).collect()
    } else {
        enforcing
    };
    let chosen = candidates
        .into_iter()
        .min_by_key(|&i| restrictiveness(&decisions[i]))
        .map(|i| (i, &decisions[i]));
    let degraded = decisions.iter().any(|decision| decision.degraded);
    let Some((most_restrictive, top)) = chosen else {
        // No limits: `question` never builds such a request.
        return pb::CheckLimitResponse {
            allowed,
            degraded,
            ..Default::default()
        };
    };
    let (retry_after, cost_exceeds_limit) = if allowed {
        (Some(micros_to_duration(0)), false)
    } else {
        retry(top)
    };
    let limits = labels
        .iter()
        .zip(decisions)
        .map(|(label, decision)| {
            let (retry_after, cost_exceeds_limit) = retry(decision);
            pb::LimitStatus {
                name: label.name.clone(),
                allowed: decision.allowed,
                limit: decision.limit,
                remaining: decision.remaining,
                reset_after: Some(micros_to_duration(decision.reset_after)),
                retry_after,
                cost_exceeds_limit,
                shadow: label.shadow,
            }
        })
        .collect();
    pb::CheckLimitResponse {
        allowed,
        limit: top.limit,
        remaining: top.remaining,
        reset_after: Some(micros_to_duration(top.reset_after)),
        retry_after,
        cost_exceeds_limit,
        degraded,
        limits,
        most_restrictive: most_restrictive as u32,
    }
}

/// A decision's `retry_after` and `cost_exceeds_limit`.
fn retry(decision: &Decision) -> (Option<prost_types::Duration>, bool) {
    match decision.retry_after {
        RetryAfter::After(micros) => (Some(micros_to_duration(micros)), false),
        RetryAfter::Never => (None, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(algorithm: PbAlgorithm) -> pb::CheckLimitRequest {
        pb::CheckLimitRequest {
            key: "k".into(),
            algorithm: Some(algorithm),
            cost: None,
            failure_policy: None,
            limits: Vec::new(),
            policy: String::new(),
        }
    }

    fn fixed(limit: u64, window: Option<prost_types::Duration>) -> PbAlgorithm {
        PbAlgorithm::FixedWindow(pb::FixedWindow { limit, window })
    }

    fn secs(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
        Some(prost_types::Duration { seconds, nanos })
    }

    #[test]
    fn each_bad_field_is_named_in_the_error() {
        let cases = [
            (request(fixed(0, secs(1, 0))), "fixed_window.limit"),
            (request(fixed(1, None)), "fixed_window.window"),
            (request(fixed(1, secs(0, 0))), "fixed_window.window"),
            (request(fixed(1, secs(-1, 0))), "fixed_window.window"),
            (request(fixed(1, secs(0, -5))), "fixed_window.window"),
            (
                request(fixed(1, secs(0, 1_000_000_000))),
                "fixed_window.window",
            ),
            (
                request(PbAlgorithm::TokenBucket(pb::TokenBucket {
                    capacity: 1,
                    refill_per_second: f64::NAN,
                })),
                "token_bucket.refill_per_second",
            ),
            (
                pb::CheckLimitRequest {
                    cost: Some(limit::MAX_QUANTITY + 1),
                    ..request(fixed(1, secs(1, 0)))
                },
                "cost",
            ),
            (
                pb::CheckLimitRequest {
                    algorithm: None,
                    ..request(fixed(1, secs(1, 0)))
                },
                "algorithm",
            ),
        ];
        for (request, field) in cases {
            let err = limit_request(request.clone()).unwrap_err();
            assert_eq!(err.field, field, "{request:?}");
        }
    }

    #[test]
    fn unset_cost_is_one_and_zero_cost_is_kept() {
        let one = limit_request(request(fixed(1, secs(1, 0)))).unwrap();
        assert_eq!(one.cost, 1);
        let zero = pb::CheckLimitRequest {
            cost: Some(0),
            ..request(fixed(1, secs(1, 0)))
        };
        assert_eq!(limit_request(zero).unwrap().cost, 0);
    }

    #[test]
    fn never_is_an_unset_retry_after_and_a_flag() {
        let response = response(&Decision {
            allowed: false,
            limit: 1,
            remaining: 1,
            reset_after: 1_500_000,
            retry_after: RetryAfter::Never,
            degraded: false,
        });
        assert!(response.cost_exceeds_limit);
        assert_eq!(response.retry_after, None);
        assert_eq!(response.reset_after, secs(1, 500_000_000));
    }

    fn decided(allowed: bool, remaining: u64, reset: Micros, retry: RetryAfter) -> Decision {
        Decision {
            allowed,
            limit: 10,
            remaining,
            reset_after: reset,
            retry_after: retry,
            degraded: false,
        }
    }

    fn labels(shadows: &[bool]) -> Vec<Label> {
        shadows
            .iter()
            .enumerate()
            .map(|(i, &shadow)| Label {
                name: format!("l{i}"),
                shadow,
            })
            .collect()
    }

    #[test]
    fn allowed_the_fewest_left_speaks_ties_to_the_longest_reset() {
        let ok = RetryAfter::After(0);
        let answer = several_response(
            &labels(&[false, false, false]),
            &[
                decided(true, 3, 1_000_000, ok),
                decided(true, 2, 1_000_000, ok),
                decided(true, 2, 5_000_000, ok),
            ],
        );
        assert!(answer.allowed);
        assert_eq!(answer.most_restrictive, 2);
        assert_eq!((answer.remaining, answer.reset_after), (2, secs(5, 0)));
        assert_eq!(answer.retry_after, secs(0, 0));
    }

    #[test]
    fn denied_the_longest_wait_speaks_and_never_is_longest() {
        let wait = |seconds: u64| RetryAfter::After(seconds * 1_000_000);
        let answer = several_response(
            &labels(&[false, false, false]),
            &[
                decided(false, 0, 9_000_000, wait(2)),
                decided(true, 0, 1_000_000, wait(0)),
                decided(false, 0, 1_000_000, wait(7)),
            ],
        );
        assert!(!answer.allowed);
        assert_eq!(answer.most_restrictive, 2, "an allowing limit never speaks");
        assert_eq!(answer.retry_after, secs(7, 0));
        let never = several_response(
            &labels(&[false, false]),
            &[
                decided(false, 0, 1, wait(3)),
                decided(false, 5, 1, RetryAfter::Never),
            ],
        );
        assert_eq!(never.most_restrictive, 1);
        assert!(never.cost_exceeds_limit);
        assert_eq!(never.retry_after, None);
    }

    #[test]
    fn a_shadow_limit_neither_denies_nor_speaks() {
        let answer = several_response(
            &labels(&[true, false]),
            &[
                decided(false, 0, 1, RetryAfter::After(5_000_000)),
                decided(true, 4, 1, RetryAfter::After(0)),
            ],
        );
        assert!(answer.allowed);
        assert_eq!(answer.most_restrictive, 1);
        assert!(answer.limits[0].shadow && !answer.limits[0].allowed);
        // All in shadow: the statuses still name the most restrictive.
        let all = several_response(
            &labels(&[true, true]),
            &[
                decided(true, 4, 1, RetryAfter::After(0)),
                decided(false, 0, 1, RetryAfter::After(5_000_000)),
            ],
        );
        assert!(all.allowed, "shadow limits never deny");
        assert_eq!(all.most_restrictive, 1);
    }
}

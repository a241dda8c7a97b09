//! The `ratelimitd.v1.RateLimiter` service: protobuf in, validated request to
//! the limiter, decision back to protobuf. Nothing else happens here.

use std::time::Duration;

use tonic::{Request, Response, Status};
use tracing::debug;

use crate::error::Error;
use crate::incoming;
use crate::limit::{
    self, Algorithm, CallerKey, Decision, FailurePolicy, FixedWindow, Gcra, InvalidArgument,
    LimitRequest, Micros, RetryAfter, SlidingWindow, SlidingWindowCounter, TokenBucket,
};
use crate::limiter::Limiter;
use crate::load_shed::DecisionSlots;
use crate::metrics::{self, Api};
use crate::pb::ratelimitd::v1 as pb;
use crate::pb::ratelimitd::v1::check_limit_request::Algorithm as PbAlgorithm;

/// The service, over one limiter.
#[derive(Clone)]
pub struct CheckService {
    limiter: Limiter,
    slots: DecisionSlots,
}

impl CheckService {
    /// The service, deciding on `limiter`, each call holding one of `slots`.
    pub fn new(limiter: Limiter, slots: DecisionSlots) -> Self {
        Self { limiter, slots }
    }

    /// The tonic server for this service.
    pub fn into_server(self) -> pb::rate_limiter_server::RateLimiterServer<Self> {
        pb::rate_limiter_server::RateLimiterServer::new(self)
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
        let policy = failure_policy(request.failure_policy).map_err(Error::from)?;
        let request = limit_request(request).map_err(Error::from)?;
        let decision = self
            .limiter
            .check(&request, policy)
            .await
            .map_err(Error::from)?;
        metrics::decision(Api::CheckLimit, request.algorithm.name(), &decision);
        debug!(
            algorithm = request.algorithm.name(),
            allowed = decision.allowed,
            remaining = decision.remaining,
            "decided"
        );
        Ok(Response::new(response(&decision)))
    }
}

/// Validates a request once, into the types the core trusts.
pub fn limit_request(request: pb::CheckLimitRequest) -> Result<LimitRequest, InvalidArgument> {
    let key = CallerKey::new(request.key)?;
    let algorithm = match request.algorithm {
        None => {
            return Err(InvalidArgument::new(
                "algorithm",
                "is required: set one of fixed_window, sliding_window, token_bucket, gcra, \
                 sliding_window_counter",
            ));
        }
        Some(PbAlgorithm::FixedWindow(p)) => {
            let window = duration("window", p.window);
            window
                .and_then(|window| FixedWindow::new(p.limit, window))
                .map(Algorithm::FixedWindow)
                .map_err(|err| err.within("fixed_window"))?
        }
        Some(PbAlgorithm::SlidingWindow(p)) => {
            let window = duration("window", p.window);
            window
                .and_then(|window| SlidingWindow::new(p.limit, window))
                .map(Algorithm::SlidingWindow)
                .map_err(|err| err.within("sliding_window"))?
        }
        Some(PbAlgorithm::TokenBucket(p)) => TokenBucket::new(p.capacity, p.refill_per_second)
            .map(Algorithm::TokenBucket)
            .map_err(|err| err.within("token_bucket"))?,
        Some(PbAlgorithm::SlidingWindowCounter(p)) => {
            let window = duration("window", p.window);
            window
                .and_then(|window| SlidingWindowCounter::new(p.limit, window))
                .map(Algorithm::SlidingWindowCounter)
                .map_err(|err| err.within("sliding_window_counter"))?
        }
        Some(PbAlgorithm::Gcra(p)) => {
            let period = duration("period", p.period);
            period
                .and_then(|period| Gcra::new(p.rate, period, p.burst))
                .map(Algorithm::Gcra)
                .map_err(|err| err.within("gcra"))?
        }
    };
    let cost = limit::cost(request.cost)?;
    Ok(LimitRequest {
        key,
        algorithm,
        cost,
        shadow: false,
    })
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

/// A protobuf duration that must be present and not negative.
fn duration(
    field: &str,
    value: Option<prost_types::Duration>,
) -> Result<Duration, InvalidArgument> {
    let value = value.ok_or_else(|| InvalidArgument::new(field, "is required"))?;
    if value.seconds < 0 || value.nanos < 0 {
        return Err(InvalidArgument::new(
            field,
            "must be positive (got a negative duration)",
        ));
    }
    if value.nanos > 999_999_999 {
        return Err(InvalidArgument::new(
            field,
            "nanos must be at most 999999999",
        ));
    }
    Ok(Duration::new(value.seconds as u64, value.nanos as u32))
}

/// The protobuf form of a decision.
pub fn response(decision: &Decision) -> pb::CheckLimitResponse {
    let (retry_after, cost_exceeds_limit) = match decision.retry_after {
        RetryAfter::After(micros) => (Some(proto_duration(micros)), false),
        RetryAfter::Never => (None, true),
    };
    pb::CheckLimitResponse {
        allowed: decision.allowed,
        limit: decision.limit,
        remaining: decision.remaining,
        reset_after: Some(proto_duration(decision.reset_after)),
        retry_after,
        cost_exceeds_limit,
        degraded: decision.degraded,
    }
}

fn proto_duration(micros: Micros) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (micros / 1_000_000) as i64,
        nanos: ((micros % 1_000_000) * 1000) as i32,
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
}

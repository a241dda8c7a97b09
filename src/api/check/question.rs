//! A `CheckLimit` request validated once, into the [`Question`] the
//! decider takes: which of its three forms it takes (one algorithm,
//! several `limits`, or a named policy), then that form's fields, each
//! error naming the field.

use std::collections::HashMap;

use crate::algorithm::{self, registry::Kind};
use crate::algorithm::{Algorithm, LimitRequest};
use crate::decider::{self, Limits, NamedLimit, Question};
use crate::error::Error;
use crate::limit::{self, CallerKey, FailurePolicy, InvalidArgument};
use crate::pb::algorithm::from_proto;
use crate::pb::ratelimitd::v1 as pb;
use crate::pb::ratelimitd::v1::check_limit_request::Algorithm as PbAlgorithm;
use crate::rules::Rules;

/// Validates a request once, into the question the decider takes: its
/// form, then that form's fields. `rules` is the configuration in force
/// when the request names a policy (`None` for the other forms);
/// `max_limits` bounds the several-limits form.
pub(crate) fn question(
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
    let limits = if !request.policy.is_empty() {
        limit::check_name("policy", &request.policy)?;
        let policy = match rules {
            Some(rules) => decider::policy(rules, &request.policy)?,
            None => decider::policy(&Rules::default(), &request.policy)?,
        };
        let key = CallerKey::new(request.key)?;
        let cost = limit::cost(request.cost)?;
        Limits::Policy { policy, key, cost }
    } else if !request.limits.is_empty() {
        Limits::Several(several(request, max_limits)?)
    } else {
        Limits::One(limit_request(request)?)
    };
    Ok(Question {
        limits,
        failure_policy,
    })
}

/// The limits of a request with `limits`, each with its name.
fn several(
    request: pb::CheckLimitRequest,
    max_limits: usize,
) -> Result<Vec<NamedLimit>, InvalidArgument> {
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
    let mut limits: Vec<NamedLimit> = Vec::with_capacity(request.limits.len());
    // The limits seen so far, by what makes a counter theirs: a name, or
    // (unnamed) a key and an algorithm. A map, so a bound raised high
    // stays linear.
    let mut seen: HashMap<(String, String, &'static str), usize> = HashMap::new();
    for (i, limit) in request.limits.into_iter().enumerate() {
        let within = |err: InvalidArgument| err.within(&format!("limits[{i}]"));
        let limit = one_of_several(limit, key.as_ref(), cost).map_err(within)?;
        let identity = if limit.name.is_empty() {
            let tag = algorithm::key_tag(&limit.request.algorithm);
            (String::new(), limit.request.key.as_str().to_owned(), tag)
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
        limits.push(limit);
    }
    Ok(limits)
}

/// One entry of `limits`, on the request's `key` unless it has its own,
/// spending the request's `cost` unless it says; a named limit counts on a
/// counter of its own. The error names the field within the entry.
fn one_of_several(
    limit: pb::Limit,
    key: Option<&CallerKey>,
    cost: u64,
) -> Result<NamedLimit, InvalidArgument> {
    if !limit.name.is_empty() {
        limit::check_name("name", &limit.name)?;
    }
    let own_key = if limit.key.is_empty() {
        key.cloned()
            .ok_or_else(|| InvalidArgument::new("key", "is required when the request has no key"))?
    } else {
        CallerKey::new(limit.key)?
    };
    let algorithm = algorithm(limit.algorithm.map(PbAlgorithm::from))?;
    let cost = match limit.cost {
        Some(cost) => limit::cost(Some(cost))?,
        None => cost,
    };
    let counted = if limit.name.is_empty() {
        own_key
    } else {
        CallerKey::named(&limit.name, &own_key)
    };
    Ok(NamedLimit {
        name: limit.name,
        request: LimitRequest {
            key: counted,
            algorithm,
            cost,
            shadow: false,
        },
    })
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
    from_proto(algorithm)
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
}

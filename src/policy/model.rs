//! The policies' model: a named set of limits, how one limit's `per` /
//! `limit` / `burst` become an algorithm's parameters, and how a policy
//! becomes limit requests. Pure.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::registry::{self, Kind, Rate, WindowStart};
use crate::algorithm::{Algorithm, LimitRequest};
use crate::limit::{CallerKey, InvalidArgument};

/// Every policy, by name.
pub(crate) type Policies = HashMap<String, Arc<Policy>>;

/// A named set of limits, decided together, all or nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Its name, as callers send it.
    pub name: String,
    /// Its limits, in file order (the order of a response's statuses).
    pub limits: Vec<PolicyLimit>,
    /// Where it was written, as `file:line`, for logs.
    pub source: String,
}

/// One limit of a policy.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyLimit {
    /// Unique within the policy: its own `name`, else its `per` as
    /// written. Part of its counter's name.
    pub name: String,
    /// The algorithm and its parameters.
    pub algorithm: Algorithm,
    /// Whose counter it spends.
    pub scope: Scope,
    /// Decided and reported, but never denies.
    pub shadow: bool,
    /// Whether clients may lease its units (`lease: true`), and within
    /// what bounds; `None`: every request asks the store.
    pub lease: Option<LeaseBounds>,
}

/// The bounds of a leasable limit's leases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseBounds {
    /// The most units one lease holds (`lease_max_units`; default a
    /// quarter of the limit).
    pub max_units: u64,
    /// The longest a lease's units stay valid (`lease_max_duration`;
    /// default half the limit's `per`, at most 5 s).
    pub max_duration: Duration,
}

impl LeaseBounds {
    /// The longest default lease: long enough that a client renews a few
    /// times a second at most, short enough that a client's share follows
    /// its demand within seconds.
    pub const LONGEST_DEFAULT: Duration = Duration::from_secs(5);

    /// The default bounds of a limit of `limit` units per `per`: a quarter
    /// of the limit, for half the `per` (at most [`Self::LONGEST_DEFAULT`]).
    /// With half the `per`, the units every client holds at once stay
    /// under half the limit (see docs/leases.md).
    pub fn default_for(limit: u64, per: Duration) -> Self {
        Self {
            max_units: (limit / 4).max(1),
            max_duration: (per / 2)
                .min(Self::LONGEST_DEFAULT)
                .max(Duration::from_millis(1)),
        }
    }
}

/// Whose counter a policy limit spends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Each caller key its own (the default).
    Key,
    /// One counter for the whole policy, whatever the key: a plan-wide
    /// limit.
    Policy,
}

/// `limit` units per `per` under `algorithm` (`fixed_window` when `None`),
/// with `burst` for the two algorithms that take one, as the registry
/// reads a rate ([`Kind::build`]); a fixed window starts at the key's first
/// request, as `CheckLimit`'s.
///
/// The error names the file's field (`per`, `limit`, `burst`, `algorithm`)
/// and the rule.
pub(crate) fn algorithm(
    algorithm: Option<&str>,
    limit: u64,
    per: Duration,
    burst: Option<u64>,
) -> Result<Algorithm, InvalidArgument> {
    let name = algorithm.unwrap_or(Kind::FixedWindow.name());
    let kind = Kind::from_name(name);
    if burst.is_some() && !kind.is_some_and(Kind::takes_burst) {
        return Err(registry::burst_refused(name));
    }
    let Some(kind) = kind else {
        return Err(InvalidArgument::new(
            "algorithm",
            format!("unknown '{name}': use {}", Kind::names(" or ")),
        ));
    };
    // The parameters' own names, mapped back to the file's.
    let field = |err: InvalidArgument| {
        let field = match err.field.as_str() {
            "window" | "period" | "refill_per_second" => "per",
            "capacity" if burst.is_some() => "burst",
            "capacity" | "rate" => "limit",
            other => other,
        };
        InvalidArgument::new(field, err.rule)
    };
    let rate = Rate { limit, per, burst };
    kind.build(rate, WindowStart::FirstRequest).map_err(field)
}

impl Policy {
    /// The limit requests asking it for `key` to spend `cost`.
    pub fn requests(&self, key: &CallerKey, cost: u64) -> Vec<LimitRequest> {
        self.limits
            .iter()
            .map(|limit| LimitRequest {
                key: CallerKey::policy(
                    &self.name,
                    &limit.name,
                    (limit.scope == Scope::Key).then_some(key),
                ),
                algorithm: limit.algorithm,
                cost,
                shadow: limit.shadow,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn each_algorithm_reads_limit_per_and_burst() {
        let Algorithm::TokenBucket(bucket) =
            algorithm(Some("token_bucket"), 10, SECOND, None).unwrap()
        else {
            panic!("not a token bucket")
        };
        assert_eq!(bucket.capacity(), 10);
        assert_eq!(bucket.refill_per_second(), 10.0);
        let Algorithm::TokenBucket(bucket) =
            algorithm(Some("token_bucket"), 60, Duration::from_secs(60), Some(5)).unwrap()
        else {
            panic!("not a token bucket")
        };
        assert_eq!((bucket.capacity(), bucket.refill_per_second()), (5, 1.0));
        let Algorithm::Gcra(gcra) = algorithm(Some("gcra"), 10, SECOND, Some(3)).unwrap() else {
            panic!("not gcra")
        };
        assert_eq!(
            (gcra.burst(), gcra.interval()),
            (3, crate::limit::Micros::from_millis(100))
        );
        assert!(matches!(
            algorithm(None, 1000, Duration::from_secs(3600), None).unwrap(),
            Algorithm::FixedWindow(fixed) if fixed.limit() == 1000 && !fixed.is_aligned()
        ));
    }

    #[test]
    fn errors_name_the_files_fields() {
        let field = |name: Option<&str>, limit, per, burst| {
            algorithm(name, limit, per, burst).unwrap_err().field
        };
        assert_eq!(field(None, 0, SECOND, None), "limit");
        assert_eq!(field(None, 1, Duration::ZERO, None), "per");
        assert_eq!(field(Some("token_bucket"), 1, Duration::ZERO, None), "per");
        assert_eq!(field(Some("token_bucket"), 1, SECOND, Some(0)), "burst");
        assert_eq!(field(Some("gcra"), 1, SECOND, Some(0)), "burst");
        assert_eq!(field(Some("fixed_window"), 1, SECOND, Some(2)), "burst");
        assert_eq!(field(Some("leaky"), 1, SECOND, None), "algorithm");
    }

    #[test]
    fn a_policy_wide_limit_ignores_the_key() {
        let policy = Policy {
            name: "free".into(),
            limits: vec![
                PolicyLimit {
                    name: "1s".into(),
                    algorithm: algorithm(None, 1, SECOND, None).unwrap(),
                    scope: Scope::Key,
                    shadow: false,
                    lease: None,
                },
                PolicyLimit {
                    name: "plan".into(),
                    algorithm: algorithm(None, 1, SECOND, None).unwrap(),
                    scope: Scope::Policy,
                    shadow: true,
                    lease: None,
                },
            ],
            source: "policies.yaml:2".into(),
        };
        let key = CallerKey::new("u1".into()).unwrap();
        let requests = policy.requests(&key, 2);
        assert_eq!(requests[0].key.as_str(), "free/1s:u1");
        assert_eq!(requests[1].key.as_str(), "free/plan");
        assert!(requests[1].shadow && !requests[0].shadow);
        assert!(requests.iter().all(|request| request.cost == 2));
    }
}

//! What an Envoy is told to enforce for a bucket: a subscriber's share as
//! a `RateLimitStrategy`, shaped to what Envoy 1.40's quota filter actually
//! enforces (pinned down in tests/suite/envoy_quota_pinned.rs and docs/rlqs.md):
//!
//! - only `blanket_rule` and `token_bucket` are enforced
//!   (`requests_per_time_unit` is logged as unsupported and ignored);
//! - `fill_interval` counts in whole seconds (under one second the rate is
//!   infinite), and a new bucket replaces the old only if `max_tokens`,
//!   `tokens_per_fill` or the interval's *nanoseconds* differ, so the
//!   interval is fixed per policy and only the token counts carry a change;
//! - `assignment_time_to_live` counts in whole seconds, and unset or zero
//!   expires at once.

use std::time::Duration;

use crate::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use crate::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use crate::quota::MicroRps;
use crate::rules::quota::QuotaRate;

/// The shortest fill interval given: a minute, so a share is counted in
/// whole requests per minute (1/60 of a request per second).
const MIN_FILL_SECONDS: u64 = 60;

/// What an Envoy enforces for a bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Assigned {
    /// Every request passes.
    AllowAll,
    /// No request passes.
    DenyAll,
    /// A token bucket: `tokens_per_fill` every `fill_seconds`, holding at
    /// most `max_tokens` (and starting full).
    TokenBucket {
        /// The burst.
        max_tokens: u32,
        /// Tokens per interval.
        tokens_per_fill: u32,
        /// The interval, in whole seconds.
        fill_seconds: u64,
    },
}

impl Assigned {
    /// The token bucket enforcing `grant` of a bucket whose policy is
    /// `rate`: the interval is the policy's period, at least a minute, and
    /// the burst the policy's `burst` in the grant's proportion (else a
    /// tenth of a second of the grant), at least one request. A grant too
    /// small for one request per interval denies all.
    pub(crate) fn share(grant: MicroRps, rate: &QuotaRate) -> Self {
        let fill_seconds = rate.period_seconds.max(MIN_FILL_SECONDS);
        let capacity = rate.micro_rps().max(1);
        // The grant's part of the policy's requests, scaled to the
        // interval: exact for a whole share, whatever µrps rounded off.
        let tokens = u128::from(rate.requests) * u128::from(fill_seconds) * u128::from(grant)
            / (u128::from(rate.period_seconds.max(1)) * u128::from(capacity));
        if tokens == 0 {
            return Self::DenyAll;
        }
        let burst = match rate.burst {
            Some(burst) => (u128::from(burst) * u128::from(grant)).div_ceil(u128::from(capacity)),
            None => u128::from(grant).div_ceil(10 * 1_000_000),
        };
        Self::TokenBucket {
            max_tokens: clamp_u32(burst.max(1)),
            tokens_per_fill: clamp_u32(tokens),
            fill_seconds,
        }
    }

    /// Its rate in requests per second, for metrics.
    pub(crate) fn requests_per_second(&self) -> Option<f64> {
        match *self {
            Self::AllowAll => None,
            Self::DenyAll => Some(0.0),
            Self::TokenBucket {
                tokens_per_fill,
                fill_seconds,
                ..
            } => Some(f64::from(tokens_per_fill) / fill_seconds as f64),
        }
    }

    /// A short name for metrics and logs.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::AllowAll => "allow_all",
            Self::DenyAll => "deny_all",
            Self::TokenBucket { .. } => "token_bucket",
        }
    }

    /// As Envoy's protobuf.
    pub(crate) fn to_strategy(self) -> RateLimitStrategy {
        let strategy = match self {
            Self::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
            Self::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
            Self::TokenBucket {
                max_tokens,
                tokens_per_fill,
                fill_seconds,
            } => Strategy::TokenBucket(TokenBucket {
                max_tokens,
                tokens_per_fill: Some(tokens_per_fill),
                fill_interval: Some(prost_types::Duration {
                    seconds: i64::try_from(fill_seconds).unwrap_or(i64::MAX),
                    nanos: 0,
                }),
            }),
        };
        RateLimitStrategy {
            strategy: Some(strategy),
        }
    }
}

/// A time to live in Envoy's terms: whole seconds, at least one.
pub(super) fn time_to_live(ttl: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(ttl.as_secs().max(1)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}

fn clamp_u32(value: u128) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_second(requests: u64, burst: Option<u64>) -> QuotaRate {
        QuotaRate {
            requests,
            period_seconds: 1,
            burst,
        }
    }

    #[test]
    fn a_share_is_whole_requests_per_minute_with_a_tenth_of_a_second_of_burst() {
        let half = Assigned::share(50_000_000, &per_second(100, None));
        assert_eq!(
            half,
            Assigned::TokenBucket {
                max_tokens: 5,
                tokens_per_fill: 3000,
                fill_seconds: 60
            }
        );
        assert_eq!(half.requests_per_second(), Some(50.0));
        // A third: 33.33/s is 1999.99 a minute, rounded down.
        let third = Assigned::share(33_333_333, &per_second(100, None));
        assert!(matches!(
            third,
            Assigned::TokenBucket {
                tokens_per_fill: 1999,
                max_tokens: 4,
                ..
            }
        ));
    }

    #[test]
    fn the_policys_burst_is_split_as_the_rate_is() {
        let rate = per_second(100, Some(40));
        let quarter = Assigned::share(25_000_000, &rate);
        assert!(matches!(
            quarter,
            Assigned::TokenBucket { max_tokens: 10, .. }
        ));
        // Long periods fill once per period.
        let hourly = QuotaRate {
            requests: 10,
            period_seconds: 3600,
            burst: None,
        };
        let all = Assigned::share(hourly.micro_rps(), &hourly);
        assert_eq!(
            all,
            Assigned::TokenBucket {
                max_tokens: 1,
                tokens_per_fill: 10,
                fill_seconds: 3600
            }
        );
    }

    #[test]
    fn a_share_under_one_request_per_interval_denies() {
        assert_eq!(
            Assigned::share(10_000, &per_second(100, None)),
            Assigned::DenyAll
        );
        assert_eq!(
            Assigned::share(0, &per_second(100, None)),
            Assigned::DenyAll
        );
    }

    #[test]
    fn times_to_live_are_whole_seconds_of_at_least_one() {
        assert_eq!(time_to_live(Duration::from_millis(1500)).seconds, 1);
        assert_eq!(time_to_live(Duration::ZERO).seconds, 1);
        assert_eq!(time_to_live(Duration::from_secs(15)).seconds, 15);
    }
}

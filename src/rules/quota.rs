//! The quota policies of Envoy's Rate Limit Quota Service (RLQS), compiled
//! for lookup: per domain, which policy governs a `BucketId` and the rate
//! it allows. Pure: no I/O, no store.
//!
//! A policy names some of a bucket's keys, each with an exact value or a
//! wildcard (`*`: any run of characters); it governs a bucket that has every
//! key it names with a matching value (the bucket may have more keys). The
//! most specific policy wins: the most exact values, then the most
//! wildcards, then the most characters in its wildcards besides `*`, then
//! the first in the file. A bucket no policy governs gets
//! the domain's default (`quota_default`; allow all when not written).
//! Each bucket a policy governs has the policy's rate to itself: a policy
//! `{tenant: "*"}` of 100/s gives every tenant 100/s.

use std::collections::HashMap;
use std::sync::Arc;

use super::rule::{Period, Source};
use super::wildcard::Wildcard;

/// The largest rate a policy may give, in requests per second: shares are
/// counted in millionths of a request per second, and their arithmetic
/// (demand × headroom, floored quotients) must stay exact in Redis's Lua,
/// whose numbers are doubles: exact integers below 2^53.
pub(crate) const MAX_REQUESTS_PER_SECOND: u64 = 1_000_000;

/// What a quota policy allows each bucket it governs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaLimit {
    /// Every request (`unlimited: true`).
    AllowAll,
    /// No request (`requests_per_unit: 0`, as upstream reads it).
    DenyAll,
    /// A rate, shared by every Envoy that reports the bucket.
    Rate(QuotaRate),
}

/// `requests_per_unit` per `unit` × `unit_multiplier`, as a rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaRate {
    /// `requests_per_unit`.
    pub requests: u64,
    /// The period, `unit` × `unit_multiplier`, in seconds.
    pub period_seconds: u64,
    /// `burst`: the requests a bucket may take at once beyond its rate,
    /// split among its Envoys as the rate is; unset, a tenth of a second's
    /// worth of each Envoy's share (at least one request each).
    pub burst: Option<u64>,
}

impl QuotaRate {
    /// The rate in millionths of a request per second (µrps), rounded
    /// down: what shares are counted in. At least 1 for a valid rate.
    pub fn micro_rps(self) -> u64 {
        let micro = u128::from(self.requests) * 1_000_000 / u128::from(self.period_seconds.max(1));
        u64::try_from(micro).unwrap_or(u64::MAX)
    }

    /// A rate, if it is within the bounds shares can count: at least one
    /// millionth of a request per second, at most
    /// [`MAX_REQUESTS_PER_SECOND`].
    pub fn new(requests: u64, period: Period, burst: Option<u64>) -> Result<Self, String> {
        let period_seconds = period.seconds();
        let rate = Self {
            requests,
            period_seconds,
            burst,
        };
        let micro = rate.micro_rps();
        if micro == 0 {
            return Err(format!(
                "requests_per_unit: {requests} per {period_seconds}s is below the smallest \
                 quota rate (one request per 1 000 000 seconds)"
            ));
        }
        if micro > MAX_REQUESTS_PER_SECOND * 1_000_000 {
            return Err(format!(
                "requests_per_unit: at most {MAX_REQUESTS_PER_SECOND} requests per second \
                 for a quota"
            ));
        }
        Ok(rate)
    }
}

/// A value a policy asks of one bucket key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValuePattern {
    /// This value exactly.
    Exact(String),
    /// Any value the wildcard matches.
    Wildcard(Wildcard),
}

impl ValuePattern {
    /// `*` in the text makes a wildcard.
    pub fn new(text: &str) -> Self {
        Wildcard::new(text).map_or_else(|| Self::Exact(text.to_owned()), Self::Wildcard)
    }

    fn matches(&self, value: &str) -> bool {
        match self {
            Self::Exact(exact) => exact == value,
            Self::Wildcard(pattern) => pattern.matches(value),
        }
    }
}

/// How specifically a policy matches a bucket: exact values, wildcards,
/// and the wildcards' characters besides `*`; more wins.
type Specificity = (usize, usize, usize);

/// One quota policy.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaPolicy {
    /// The `rate_limit`'s `name`, else the bucket pattern written out
    /// (`name=api,tenant=*`): the `policy` label of its metrics, so as many
    /// series as policies, never one per bucket.
    pub name: String,
    /// The keys it asks for, with their values, sorted by key.
    pub bucket: Vec<(String, ValuePattern)>,
    /// What it allows each bucket.
    pub limit: QuotaLimit,
    /// `shadow_mode`: shares are worked out and reported in metrics, and
    /// every Envoy is told to allow all.
    pub shadow: bool,
    /// Where it was written (the default of a domain that writes none: the
    /// file's `domain:` line).
    pub source: Source,
}

impl QuotaPolicy {
    /// How specifically it matches `bucket`: (exact values, wildcards,
    /// wildcards' characters besides `*`), or `None` when it does not
    /// govern it.
    fn specificity(&self, bucket: &HashMap<String, String>) -> Option<Specificity> {
        let (mut exact, mut literal) = (0, 0);
        for (key, pattern) in &self.bucket {
            let value = bucket.get(key)?;
            if !pattern.matches(value) {
                return None;
            }
            match pattern {
                ValuePattern::Exact(_) => exact += 1,
                ValuePattern::Wildcard(wildcard) => literal += wildcard.literal_len(),
            }
        }
        Some((exact, self.bucket.len() - exact, literal))
    }
}

/// One domain's quota policies.
#[derive(Debug, Clone, PartialEq)]
pub struct QuotaDomain {
    /// In file order.
    pub policies: Vec<Arc<QuotaPolicy>>,
    /// For a bucket no policy governs.
    pub default: Arc<QuotaPolicy>,
}

impl QuotaDomain {
    /// The policy governing `bucket`: the most specific, the first written
    /// among equals, else the default.
    pub fn find(&self, bucket: &HashMap<String, String>) -> &Arc<QuotaPolicy> {
        let mut best: Option<(Specificity, &Arc<QuotaPolicy>)> = None;
        for policy in &self.policies {
            if let Some(score) = policy.specificity(bucket)
                && best.is_none_or(|(best_score, _)| score > best_score)
            {
                best = Some((score, policy));
            }
        }
        best.map_or(&self.default, |(_, policy)| policy)
    }
}

/// The default of a domain whose file writes no `quota_default`: allow all,
/// as Envoy itself does for a bucket without an assignment.
pub(crate) fn allow_all_default(source: Source) -> Arc<QuotaPolicy> {
    Arc::new(QuotaPolicy {
        name: "default".to_owned(),
        bucket: Vec::new(),
        limit: QuotaLimit::AllowAll,
        shadow: false,
        source,
    })
}

/// A bucket pattern written out, sorted by key: `name=api,tenant=*`.
pub(crate) fn render_pattern(bucket: &[(String, ValuePattern)]) -> String {
    bucket
        .iter()
        .map(|(key, pattern)| match pattern {
            ValuePattern::Exact(value) => format!("{key}={value}"),
            ValuePattern::Wildcard(wildcard) => format!("{key}={}", wildcard.pattern),
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Unit;

    fn policy(name: &str, bucket: &[(&str, &str)]) -> Arc<QuotaPolicy> {
        let mut bucket: Vec<(String, ValuePattern)> = bucket
            .iter()
            .map(|(key, value)| ((*key).to_owned(), ValuePattern::new(value)))
            .collect();
        bucket.sort_by(|a, b| a.0.cmp(&b.0));
        Arc::new(QuotaPolicy {
            name: name.to_owned(),
            bucket,
            limit: QuotaLimit::DenyAll,
            shadow: false,
            source: Source {
                file: "q.yaml".into(),
                line: 1,
            },
        })
    }

    #[test]
    fn the_most_specific_policy_wins_then_the_first_written() {
        let domain = QuotaDomain {
            policies: vec![
                policy("any-tenant", &[("tenant", "*")]),
                policy("acme-star", &[("tenant", "acme*")]),
                policy("api-any-tenant", &[("name", "api"), ("tenant", "*")]),
                policy("api-acme", &[("name", "api"), ("tenant", "acme")]),
                policy("also-any-tenant", &[("tenant", "*")]),
            ],
            default: allow_all_default(Source {
                file: "q.yaml".into(),
                line: 1,
            }),
        };
        let name_of = |pairs: &[(&str, &str)]| {
            let bucket: HashMap<String, String> = pairs
                .iter()
                .map(|&(key, value)| (key.into(), value.into()))
                .collect();
            domain.find(&bucket).name.clone()
        };
        assert_eq!(name_of(&[("name", "api"), ("tenant", "acme")]), "api-acme");
        assert_eq!(
            name_of(&[("name", "api"), ("tenant", "other")]),
            "api-any-tenant"
        );
        assert_eq!(
            name_of(&[("name", "web"), ("tenant", "acme-eu")]),
            "acme-star"
        );
        assert_eq!(name_of(&[("tenant", "other")]), "any-tenant");
        assert_eq!(name_of(&[("name", "api")]), "default");
        assert_eq!(name_of(&[]), "default");
    }

    #[test]
    fn rates_are_counted_in_millionths_within_bounds() {
        let second = Period::of(Unit::Second);
        let rate = QuotaRate::new(100, second, None).unwrap();
        assert_eq!(rate.micro_rps(), 100_000_000);
        let five_minutes = Period::parse(Some(Unit::Minute), "minute", Some(5)).unwrap();
        let rate = QuotaRate::new(5000, five_minutes, None).unwrap();
        assert_eq!(rate.micro_rps(), 16_666_666);
        assert!(QuotaRate::new(1, Period::of(Unit::Year), None).is_err());
        assert!(QuotaRate::new(1, Period::of(Unit::Day), None).is_ok());
        assert!(QuotaRate::new(MAX_REQUESTS_PER_SECOND + 1, second, None).is_err());
        assert!(QuotaRate::new(MAX_REQUESTS_PER_SECOND, second, None).is_ok());
    }

    #[test]
    fn patterns_render_sorted() {
        let policy = policy("p", &[("tenant", "a*"), ("name", "api")]);
        assert_eq!(render_pattern(&policy.bucket), "name=api,tenant=a*");
    }
}

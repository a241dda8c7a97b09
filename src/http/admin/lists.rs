//! The admin API's lists, as JSON: the Envoy rules in force, the
//! `CheckLimit` policies, the quota service's policies and this
//! instance's subscriptions, each with where it was written and when the
//! rules were put in force; and the configuration, secrets hidden.

use std::time::SystemTime;

use serde::Serialize;

use crate::algorithm::Algorithm;
use crate::algorithm::registry::{Parameters, with_parameters};
use crate::config::effective::EffectiveFlag;
use crate::policy::{Policy, Scope};
use crate::rules::quota::{QuotaLimit, QuotaPolicy, render_pattern};
use crate::rules::{Limit, Rule, Rules};

/// A time as RFC 3339, in UTC, to the millisecond.
pub(crate) fn timestamp(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

/// Where a rule, policy or quota policy was written.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Written {
    /// The file, as read (`xds:<name>` for a resource from xDS).
    pub file: String,
    /// Its line, 1-based.
    pub line: u64,
}

/// `GET /admin/v1/rules`: the Envoy rules in force.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RulesList {
    /// Where the rules come from: `files <path>`, `xds <server>`, or
    /// `none`.
    pub origin: String,
    /// When the rules in force were put in force (RFC 3339); `null` before
    /// the first configuration.
    pub loaded_at: Option<String>,
    /// Every limit of every domain, by domain.
    pub rules: Vec<RuleEntry>,
}

/// One limit of a descriptor.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RuleEntry {
    /// The domain.
    pub domain: String,
    /// The descriptor's place below the domain: one `key` or `key_value`
    /// per level, joined with `.` (the key of upstream's statistics).
    pub descriptor: String,
    /// The limit's `name`, if it has one.
    pub name: Option<String>,
    /// `counted`, `unlimited`, or `blocked` (`requests_per_unit: 0`).
    pub kind: String,
    /// `SECOND`, `MINUTE`, `HOUR`, `DAY`, ... (none when unlimited).
    pub unit: Option<String>,
    /// `unit_multiplier` (1 when unset).
    pub unit_multiplier: Option<u32>,
    /// `requests_per_unit` (0 unless counted).
    pub requests_per_unit: u32,
    /// The algorithm counting it, when counted.
    pub algorithm: Option<String>,
    /// `shadow_mode`.
    pub shadow: bool,
    /// `quota_mode`.
    pub quota_mode: bool,
    /// Where it was written.
    pub source: Written,
}

/// `GET /admin/v1/policies`: `CheckLimit`'s named policies.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PoliciesList {
    /// When the rules holding them were put in force (RFC 3339).
    pub loaded_at: Option<String>,
    /// By name.
    pub policies: Vec<PolicyEntry>,
}

/// One policy.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct PolicyEntry {
    /// Its name, as callers send it.
    pub name: String,
    /// Its limits, in file order.
    pub limits: Vec<PolicyLimitEntry>,
    /// Where it was written.
    pub source: Written,
}

/// One limit of a policy.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct PolicyLimitEntry {
    /// Its name within the policy.
    pub name: String,
    /// Its algorithm and parameters.
    pub algorithm: AlgorithmEntry,
    /// `key` (each caller key its own counter) or `policy` (one counter
    /// for the whole policy).
    pub scope: String,
    /// Decided and reported, but never denies.
    pub shadow: bool,
}

/// An algorithm and its parameters.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AlgorithmEntry {
    /// `fixed_window`, `sliding_window`, `sliding_window_counter`,
    /// `token_bucket` or `gcra`.
    pub name: String,
    /// The limit, capacity or burst.
    pub limit: u64,
    /// The window, for the window algorithms, as `"<seconds>s"`.
    pub window: Option<String>,
    /// A token bucket's refill rate.
    pub refill_per_second: Option<f64>,
    /// GCRA's time between requests at the sustained rate, as
    /// `"<seconds>s"`.
    pub interval: Option<String>,
}

/// `GET /admin/v1/quota-buckets`: the quota service's policies, and this
/// instance's subscriptions.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct QuotaList {
    /// When the rules holding them were put in force (RFC 3339).
    pub loaded_at: Option<String>,
    /// This instance's id among the instances sharing the store.
    pub instance: String,
    /// Bucket subscriptions this instance's streams hold now.
    pub subscriptions: usize,
    /// By domain.
    pub domains: Vec<QuotaDomainEntry>,
}

/// One domain's quota policies.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct QuotaDomainEntry {
    /// The domain.
    pub domain: String,
    /// In file order; the most specific match governs a bucket.
    pub policies: Vec<QuotaPolicyEntry>,
    /// For a bucket no other policy governs.
    pub default: QuotaPolicyEntry,
}

/// One quota policy.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct QuotaPolicyEntry {
    /// Its name (its metrics' `policy` label).
    pub name: String,
    /// The buckets it governs, `key=value` (or a wildcard) per key.
    pub bucket: String,
    /// `rate`, `allow_all` or `deny_all`.
    pub kind: String,
    /// A rate's requests per period.
    pub requests: Option<u64>,
    /// A rate's period, in seconds.
    pub period_seconds: Option<u64>,
    /// A rate's burst, when written.
    pub burst: Option<u64>,
    /// `shadow_mode`.
    pub shadow: bool,
    /// Where it was written.
    pub source: Written,
}

/// `GET /admin/v1/config`: every flag in force.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ConfigList {
    /// The server's version.
    pub version: String,
    /// Every flag, in `--help`'s order.
    pub flags: Vec<FlagEntry>,
}

/// One flag.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct FlagEntry {
    /// Its long name, without `--`.
    pub flag: String,
    /// Its value as given, or its default: a string, a list of strings for
    /// a flag taking several, `null` when unset. Secrets show as `***`,
    /// Redis URLs without their credentials.
    #[schema(value_type = Object)]
    pub value: serde_json::Value,
    /// Where the value came from: `command line`, `environment (<name>)`,
    /// `default`, `envoyproxy/ratelimit (<names>)`, or `unset`.
    pub source: String,
}

impl From<&EffectiveFlag> for FlagEntry {
    fn from(flag: &EffectiveFlag) -> Self {
        Self {
            flag: flag.flag.clone(),
            value: flag.value.clone(),
            source: flag.source.clone(),
        }
    }
}

/// The Envoy rules of `rules`.
pub(crate) fn rules_list(rules: &Rules, loaded_at: Option<SystemTime>, origin: &str) -> RulesList {
    RulesList {
        origin: origin.to_owned(),
        loaded_at: loaded_at.map(timestamp),
        rules: rules
            .each_rule()
            .into_iter()
            .map(|(domain, rule)| rule_entry(domain, rule))
            .collect(),
    }
}

fn rule_entry(domain: &str, rule: &Rule) -> RuleEntry {
    let descriptor = rule.descriptor();
    let unit = |unit: crate::spec::Unit| format!("{unit:?}").to_ascii_uppercase();
    let (kind, unit, unit_multiplier, requests_per_unit, algorithm) = match rule.limit() {
        Limit::Unlimited => ("unlimited", None, None, 0, None),
        Limit::Blocked(period) => (
            "blocked",
            Some(unit(period.unit())),
            Some(period.multiplier()),
            0,
            None,
        ),
        Limit::Counted(counted) => (
            "counted",
            Some(unit(counted.period().unit())),
            Some(counted.period().multiplier()),
            counted.requests_per_unit(),
            Some(counted.algorithm().name().to_owned()),
        ),
    };
    RuleEntry {
        domain: domain.to_owned(),
        descriptor: descriptor.stats_key.join("."),
        name: rule.name().map(str::to_owned),
        kind: kind.to_owned(),
        unit,
        unit_multiplier,
        requests_per_unit,
        algorithm,
        shadow: descriptor.shadow,
        quota_mode: descriptor.quota,
        source: Written {
            file: rule.source().file.clone(),
            line: rule.source().line,
        },
    }
}

/// The policies of `rules`.
pub(crate) fn policies_list(rules: &Rules, loaded_at: Option<SystemTime>) -> PoliciesList {
    PoliciesList {
        loaded_at: loaded_at.map(timestamp),
        policies: rules
            .each_policy()
            .into_iter()
            .map(|policy| policy_entry(policy))
            .collect(),
    }
}

fn policy_entry(policy: &Policy) -> PolicyEntry {
    PolicyEntry {
        name: policy.name.clone(),
        limits: policy
            .limits
            .iter()
            .map(|limit| PolicyLimitEntry {
                name: limit.name.clone(),
                algorithm: algorithm_entry(&limit.algorithm),
                scope: match limit.scope {
                    Scope::Key => "key",
                    Scope::Policy => "policy",
                }
                .to_owned(),
                shadow: limit.shadow,
            })
            .collect(),
        source: written_at(&policy.source),
    }
}

/// `file:line` as a policy keeps its place.
fn written_at(source: &str) -> Written {
    match source.rsplit_once(':') {
        Some((file, line)) if line.parse::<u64>().is_ok() => Written {
            file: file.to_owned(),
            line: line.parse().unwrap_or_default(),
        },
        _ => Written {
            file: source.to_owned(),
            line: 0,
        },
    }
}

/// Milliseconds as `"<seconds>s"`, as durations are written in the API.
fn seconds(millis: u64) -> String {
    if millis.is_multiple_of(1000) {
        format!("{}s", millis / 1000)
    } else {
        format!("{}.{:03}s", millis / 1000, millis % 1000)
    }
}

/// `algorithm` as the lists show it: its name, limit, and the parameters
/// it has ([`Parameters::shown`]).
pub(crate) fn algorithm_entry(algorithm: &Algorithm) -> AlgorithmEntry {
    let shown = with_parameters!(algorithm, p => p.shown());
    AlgorithmEntry {
        name: algorithm.name().to_owned(),
        limit: algorithm.limit(),
        window: shown.window.map(|window| seconds(window.as_millis())),
        refill_per_second: shown.refill_per_second,
        interval: shown.interval.map(|interval| {
            let micros = interval.as_micros();
            format!("{}.{:06}s", micros / 1_000_000, micros % 1_000_000)
        }),
    }
}

/// The quota policies of `rules`, and this instance's subscriptions.
pub(crate) fn quota_list(
    rules: &Rules,
    loaded_at: Option<SystemTime>,
    (instance, subscriptions): (&str, usize),
) -> QuotaList {
    QuotaList {
        loaded_at: loaded_at.map(timestamp),
        instance: instance.to_owned(),
        subscriptions,
        domains: rules
            .each_quota_domain()
            .into_iter()
            .map(|(domain, quota)| QuotaDomainEntry {
                domain: domain.to_owned(),
                policies: quota
                    .policies
                    .iter()
                    .map(|p| quota_policy_entry(p))
                    .collect(),
                default: quota_policy_entry(&quota.default),
            })
            .collect(),
    }
}

fn quota_policy_entry(policy: &QuotaPolicy) -> QuotaPolicyEntry {
    let (kind, requests, period_seconds, burst) = match policy.limit {
        QuotaLimit::AllowAll => ("allow_all", None, None, None),
        QuotaLimit::DenyAll => ("deny_all", None, None, None),
        QuotaLimit::Rate(rate) => (
            "rate",
            Some(rate.requests),
            Some(rate.period_seconds),
            rate.burst,
        ),
    };
    QuotaPolicyEntry {
        name: policy.name.clone(),
        bucket: render_pattern(&policy.bucket),
        kind: kind.to_owned(),
        requests,
        period_seconds,
        burst,
        shadow: policy.shadow,
        source: Written {
            file: policy.source.file.clone(),
            line: policy.source.line,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules;

    #[test]
    fn rules_and_policies_are_listed_with_where_they_were_written() {
        let text = "\
domain: edge
descriptors:
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: internal
    rate_limit: {unlimited: true}
policies:
  plans:
    - {name: per-minute, per: 1m, limit: 100}
    - {per: 1d, limit: 2, algorithm: gcra}
";
        let rules = rules::compile(&[("edge.yaml".into(), text.to_owned())]).unwrap();
        let listed = serde_json::to_value(rules_list(&rules, None, "files /etc/rules")).unwrap();
        assert_eq!(listed["loadedAt"], serde_json::Value::Null);
        // In the order written.
        let login = &listed["rules"][0];
        assert_eq!(login["descriptor"], "path_/login", "{listed}");
        assert_eq!(login["unit"], "MINUTE");
        assert_eq!(login["requestsPerUnit"], 5);
        assert_eq!(login["algorithm"], "fixed_window");
        assert_eq!(
            login["source"],
            serde_json::json!({"file": "edge.yaml", "line": 5})
        );
        assert_eq!(listed["rules"][1]["kind"], "unlimited", "{listed}");
        let policies =
            serde_json::to_value(policies_list(&rules, Some(SystemTime::UNIX_EPOCH))).unwrap();
        assert_eq!(policies["loadedAt"], "1970-01-01T00:00:00.000Z");
        let plans = &policies["policies"][0];
        assert_eq!(plans["name"], "plans");
        assert_eq!(plans["source"]["file"], "edge.yaml");
        assert_eq!(plans["limits"][0]["algorithm"]["window"], "60s", "{plans}");
        assert_eq!(plans["limits"][1]["algorithm"]["name"], "gcra", "{plans}");
    }
}

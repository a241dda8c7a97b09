//! The `policies:` section of a rules file (conventionally
//! `policies.yaml`, with or without a `domain`): each policy a list of
//! limits with `per`, `limit`, and optionally `algorithm`, `burst`, `name`,
//! `scope` and `shadow_mode`. Every error names the file, the line and the
//! reason.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::model::{self, LeaseBounds, Policy, PolicyLimit, Scope};
use crate::algorithm::Algorithm;
use crate::config_error::ConfigError;
use crate::limit;
use crate::limiter::script::MAX_LIMITS_PER_SCRIPT;
use crate::spec::{Text, Unit};

/// The section as written: policy name → its limits.
pub(crate) type PoliciesSpec = BTreeMap<Text, Spanned<Vec<Spanned<PolicyLimitSpec>>>>;

/// One limit of a policy, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicyLimitSpec {
    /// Unique in its policy; default: `per` as written.
    name: Option<Text>,
    /// The window or period: `1s`, `500ms`, `1h`, or a unit word.
    per: Option<Text>,
    limit: Option<u64>,
    /// Default `fixed_window`.
    algorithm: Option<Text>,
    /// Token bucket capacity or GCRA burst; default `limit`.
    burst: Option<u64>,
    /// `key` (default): each key its own counter; `policy`: one counter.
    scope: Option<Text>,
    #[serde(default)]
    shadow_mode: bool,
    /// Clients may lease its units (see docs/leases.md).
    #[serde(default)]
    lease: bool,
    /// The most units one lease holds.
    lease_max_units: Option<u64>,
    /// The longest a lease holds: `2s`, `500ms`.
    lease_max_duration: Option<Text>,
}

/// The policies of `file`'s section, each with the line it starts at. A
/// policy holds at most as many limits as one Redis script decides at once.
pub(crate) fn compile(file: &str, specs: &PoliciesSpec) -> Result<Vec<(Policy, u64)>, ConfigError> {
    let mut policies = Vec::with_capacity(specs.len());
    for (Text(name), spanned) in specs {
        let line = spanned.referenced.line();
        let error = |line: u64, reason: String| ConfigError::in_file(file, line, reason);
        limit::check_name("policy name", name)
            .map_err(|err| error(line, format!("policy '{name}': {err}")))?;
        if spanned.value.is_empty() {
            return Err(error(line, format!("policy '{name}' has no limits")));
        }
        if spanned.value.len() > MAX_LIMITS_PER_SCRIPT {
            return Err(error(
                line,
                format!("policy '{name}' has more than {MAX_LIMITS_PER_SCRIPT} limits"),
            ));
        }
        let mut limits: Vec<(PolicyLimit, u64)> = Vec::with_capacity(spanned.value.len());
        for limit_spec in &spanned.value {
            let at = limit_spec.referenced.line();
            let compiled = policy_limit(&limit_spec.value)
                .map_err(|reason| error(at, format!("policy '{name}': {reason}")))?;
            if let Some((_, first)) = limits.iter().find(|(l, _)| l.name == compiled.name) {
                return Err(error(
                    at,
                    format!(
                        "policy '{name}': duplicate limit name '{}' (first at line {first}): \
                         give one of them its own `name`",
                        compiled.name
                    ),
                ));
            }
            limits.push((compiled, at));
        }
        let policy = Policy {
            name: name.clone(),
            limits: limits.into_iter().map(|(limit, _)| limit).collect(),
            source: format!("{file}:{line}"),
        };
        policies.push((policy, line));
    }
    Ok(policies)
}

/// One limit of a policy; the error is the reason, naming the field.
fn policy_limit(spec: &PolicyLimitSpec) -> Result<PolicyLimit, String> {
    let per_text = match &spec.per {
        Some(Text(per)) if !per.trim().is_empty() => per.trim(),
        _ => return Err("a limit needs `per` (e.g. `per: 1s`, `per: 1h`)".into()),
    };
    let per = match Unit::parse(per_text) {
        Some(unit) => std::time::Duration::from_secs(unit.seconds()),
        None => humantime::parse_duration(per_text).map_err(|err| {
            format!("per: '{per_text}' is not a duration like 1s, 500ms or 1h ({err})")
        })?,
    };
    let Some(count) = spec.limit else {
        return Err("a limit needs `limit` (units per `per`)".into());
    };
    let algorithm = spec.algorithm.as_ref().map(|Text(name)| name.as_str());
    let algorithm =
        model::algorithm(algorithm, count, per, spec.burst).map_err(|err| err.to_string())?;
    let name = match &spec.name {
        Some(Text(name)) => name.clone(),
        None => per_text.split_whitespace().collect(),
    };
    limit::check_name("name", &name).map_err(|err| match &spec.name {
        Some(_) => err.to_string(),
        None => format!("the limit's default name (its `per`) {err}: give it a `name`"),
    })?;
    let scope = match spec.scope.as_ref().map(|Text(scope)| scope.as_str()) {
        None | Some("key") => Scope::Key,
        Some("policy") => Scope::Policy,
        Some(other) => return Err(format!("scope: unknown '{other}': use key or policy")),
    };
    let lease = lease_bounds(spec, &algorithm, count, per)?;
    Ok(PolicyLimit {
        name,
        algorithm,
        scope,
        shadow: spec.shadow_mode,
        lease,
    })
}

/// A limit's lease bounds: `None` without `lease: true`; the error names
/// the field and the rule.
fn lease_bounds(
    spec: &PolicyLimitSpec,
    algorithm: &Algorithm,
    count: u64,
    per: std::time::Duration,
) -> Result<Option<LeaseBounds>, String> {
    if !spec.lease {
        return match (spec.lease_max_units, &spec.lease_max_duration) {
            (None, None) => Ok(None),
            (Some(_), _) => Err("lease_max_units: applies only with `lease: true`".into()),
            (None, Some(_)) => Err("lease_max_duration: applies only with `lease: true`".into()),
        };
    }
    if !matches!(
        algorithm,
        Algorithm::FixedWindow(_) | Algorithm::TokenBucket(_) | Algorithm::Gcra(_)
    ) {
        return Err(format!(
            "lease: applies to fixed_window, token_bucket and gcra only (this limit is {}: a \
             leased unit is spent before it is used, and a sliding window would count it at \
             the wrong moment)",
            algorithm.name()
        ));
    }
    let mut bounds = LeaseBounds::default_for(count, per);
    if let Some(units) = spec.lease_max_units {
        if units == 0 {
            return Err("lease_max_units: must be at least 1".into());
        }
        bounds.max_units = units;
    }
    if let Some(Text(text)) = &spec.lease_max_duration {
        let duration = humantime::parse_duration(text.trim()).map_err(|err| {
            format!("lease_max_duration: '{text}' is not a duration like 2s or 500ms ({err})")
        })?;
        if duration.is_zero() || duration > std::time::Duration::from_secs(3600) {
            return Err("lease_max_duration: must be positive and at most 1h".into());
        }
        bounds.max_duration = duration;
    }
    Ok(Some(bounds))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithm::Algorithm;

    fn compile_text(text: &str) -> Result<Vec<(Policy, u64)>, ConfigError> {
        let spec: PoliciesSpec = serde_saphyr::from_str(text).expect("a policies map");
        compile("policies.yaml", &spec)
    }

    #[test]
    fn a_policy_reads_units_durations_and_defaults() {
        let policies = compile_text(
            "free:\n  - {per: minute, limit: 10}\n  - {per: 500ms, limit: 2, algorithm: gcra, burst: 1, name: fast, scope: policy, shadow_mode: true}\n",
        )
        .unwrap();
        let (policy, line) = &policies[0];
        assert_eq!(
            (policy.name.as_str(), *line, policy.source.as_str()),
            ("free", 2, "policies.yaml:2")
        );
        let [minute, fast] = &policy.limits[..] else {
            panic!("two limits: {policy:?}");
        };
        assert_eq!(
            (minute.name.as_str(), minute.scope, minute.shadow),
            ("minute", Scope::Key, false)
        );
        assert!(
            matches!(minute.algorithm, Algorithm::FixedWindow(w) if w.limit() == 10 && !w.is_aligned())
        );
        assert_eq!(
            (fast.name.as_str(), fast.scope, fast.shadow),
            ("fast", Scope::Policy, true)
        );
        assert!(
            matches!(fast.algorithm, Algorithm::Gcra(g) if g.burst() == 1 && g.interval() == limit::Micros::from_millis(250))
        );
    }

    #[test]
    fn a_leasable_limit_has_bounds_of_its_own_or_the_defaults() {
        let policies = compile_text(
            "hot:\n  - {per: 1s, limit: 1000, algorithm: token_bucket, lease: true}\n  - {per: 1m, limit: 20000, lease: true, lease_max_units: 50, lease_max_duration: 2s}\n  - {per: 1h, limit: 9}\n",
        )
        .unwrap();
        let limits = &policies[0].0.limits;
        assert_eq!(
            limits[0].lease,
            Some(LeaseBounds {
                max_units: 250,
                max_duration: std::time::Duration::from_millis(500)
            })
        );
        assert_eq!(
            limits[1].lease,
            Some(LeaseBounds {
                max_units: 50,
                max_duration: std::time::Duration::from_secs(2)
            })
        );
        assert_eq!(limits[2].lease, None);
    }

    #[test]
    fn errors_name_the_line_the_policy_and_the_field() {
        let too_many = format!(
            "big:\n{}",
            "  - {per: 1s, limit: 1}\n".repeat(MAX_LIMITS_PER_SCRIPT + 1)
        );
        let cases = [
            (
                "free:\n  - {limit: 1}\n",
                2,
                "policy 'free': a limit needs `per`",
            ),
            ("free:\n  - {per: 1s}\n", 2, "a limit needs `limit`"),
            (
                "free:\n  - {per: soon, limit: 1}\n",
                2,
                "per: 'soon' is not a duration",
            ),
            (
                "free:\n  - {per: 1s, limit: 1, algorithm: leaky}\n",
                2,
                "algorithm: unknown 'leaky': use fixed_window, sliding_window, token_bucket, gcra or sliding_window_counter",
            ),
            (
                "free:\n  - {per: 1s, limit: 0, algorithm: token_bucket}\n",
                2,
                "limit: must be at least 1",
            ),
            (
                "free:\n  - {per: 1s, limit: 1, burst: 2}\n",
                2,
                "burst: applies to token_bucket and gcra only (this limit is fixed_window)",
            ),
            (
                "free:\n  - {per: 1s, limit: 1, scope: everyone}\n",
                2,
                "scope: unknown 'everyone': use key or policy",
            ),
            (
                "free:\n  - {per: 1s, limit: 1}\n  - {per: 1s, limit: 2}\n",
                3,
                "duplicate limit name '1s' (first at line 2)",
            ),
            ("free: []\n", 1, "policy 'free' has no limits"),
            (
                "free:\n  - {per: 1s, limit: 1, algorithm: sliding_window, lease: true}\n",
                2,
                "lease: applies to fixed_window, token_bucket and gcra only (this limit is sliding_window",
            ),
            (
                "free:\n  - {per: 1s, limit: 1, lease_max_units: 3}\n",
                2,
                "lease_max_units: applies only with `lease: true`",
            ),
            (
                "free:\n  - {per: 1s, limit: 1, lease: true, lease_max_units: 0}\n",
                2,
                "lease_max_units: must be at least 1",
            ),
            (
                "free:\n  - {per: 1s, limit: 1, lease: true, lease_max_duration: soon}\n",
                2,
                "lease_max_duration: 'soon' is not a duration",
            ),
            (&too_many, 2, "policy 'big' has more than 64 limits"),
        ];
        crate::spec::assert_refused("policies.yaml", &cases, compile_text);
    }
}

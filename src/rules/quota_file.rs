//! A domain's quota service policies, an extension of upstream's format:
//! `quota_buckets` (each a `bucket_id` pattern and a `rate_limit` with
//! `unit`, `requests_per_unit`, `unit_multiplier`, `unlimited`, `name` and
//! `burst`) and `quota_default`, read into [`QuotaDomain`]. Every error
//! names the file, the line and the reason.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::quota::{
    QuotaDomain, QuotaLimit, QuotaPolicy, QuotaRate, ValuePattern, allow_all_default,
    render_pattern,
};
use super::rule::{Period, Source};
use crate::config_error::ConfigError;
use crate::spec::{Text, Unit};

/// One `quota_buckets` entry, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QuotaBucketSpec {
    bucket_id: Option<Spanned<BTreeMap<Text, Text>>>,
    rate_limit: Option<Spanned<QuotaRateSpec>>,
    #[serde(default)]
    shadow_mode: bool,
}

/// `quota_default`, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct QuotaDefaultSpec {
    rate_limit: Option<Spanned<QuotaRateSpec>>,
    #[serde(default)]
    shadow_mode: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuotaRateSpec {
    unit: Option<Text>,
    requests_per_unit: Option<u64>,
    unit_multiplier: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    name: Option<Text>,
    /// Requests a bucket may take at once beyond its rate.
    burst: Option<u64>,
}

/// A domain's quota policies, from `quota_buckets` and `quota_default`
/// (allow all when not written, where the file's `domain:` is).
pub(crate) fn compile(
    file: &str,
    buckets: &[Spanned<QuotaBucketSpec>],
    default: Option<&Spanned<QuotaDefaultSpec>>,
    domain_source: Source,
) -> Result<QuotaDomain, ConfigError> {
    let error = |line: u64, reason: &str| ConfigError::in_file(file, line, reason);
    let source = |line: u64| Source {
        file: file.to_owned(),
        line,
    };
    let mut policies: Vec<Arc<QuotaPolicy>> = Vec::with_capacity(buckets.len());
    for spanned in buckets {
        let line = spanned.referenced.line();
        let spec = &spanned.value;
        let Some(bucket_id) = &spec.bucket_id else {
            return Err(error(line, "quota bucket has no bucket_id"));
        };
        let bucket = bucket(file, bucket_id)?;
        let pattern = render_pattern(&bucket);
        if let Some(first) = policies
            .iter()
            .find(|policy| render_pattern(&policy.bucket) == pattern)
        {
            let reason = format!(
                "duplicate quota bucket '{pattern}' (first at line {})",
                first.source.line
            );
            return Err(error(line, &reason));
        }
        let (limit, name) = quota_limit(file, spec.rate_limit.as_ref(), line)?;
        policies.push(Arc::new(QuotaPolicy {
            name: name.unwrap_or(pattern),
            bucket,
            limit,
            shadow: spec.shadow_mode,
            source: source(line),
        }));
    }
    let default = match default {
        None => allow_all_default(domain_source),
        Some(spanned) => {
            let line = spanned.referenced.line();
            let (limit, name) = quota_limit(file, spanned.value.rate_limit.as_ref(), line)?;
            Arc::new(QuotaPolicy {
                name: name.unwrap_or_else(|| "default".to_owned()),
                bucket: Vec::new(),
                limit,
                shadow: spanned.value.shadow_mode,
                source: source(line),
            })
        }
    };
    Ok(QuotaDomain { policies, default })
}

/// A `bucket_id`'s keys and the values they ask for.
fn bucket(
    file: &str,
    bucket_id: &Spanned<BTreeMap<Text, Text>>,
) -> Result<Vec<(String, ValuePattern)>, ConfigError> {
    let line = bucket_id.referenced.line();
    let mut bucket = Vec::with_capacity(bucket_id.value.len());
    for (Text(key), Text(value)) in &bucket_id.value {
        if key.is_empty() || value.is_empty() {
            return Err(ConfigError::in_file(
                file,
                line,
                "bucket_id keys and values must not be empty (Envoy sends none)",
            ));
        }
        bucket.push((key.clone(), ValuePattern::new(value)));
    }
    if bucket.is_empty() {
        return Err(ConfigError::in_file(
            file,
            line,
            "bucket_id must name at least one key (quota_default governs the rest)",
        ));
    }
    Ok(bucket)
}

/// A quota policy's `rate_limit`: what it allows, and its name.
fn quota_limit(
    file: &str,
    spanned: Option<&Spanned<QuotaRateSpec>>,
    line: u64,
) -> Result<(QuotaLimit, Option<String>), ConfigError> {
    let Some(spanned) = spanned else {
        return Err(ConfigError::in_file(
            file,
            line,
            "quota bucket has no rate_limit",
        ));
    };
    let line = spanned.referenced.line();
    let error = |reason: String| ConfigError::in_file(file, line, reason);
    let spec = &spanned.value;
    let name = spec
        .name
        .as_ref()
        .map(|Text(name)| name.clone())
        .filter(|name| !name.is_empty());
    let unit_text = Text::or_empty(spec.unit.as_ref());
    let unit = Unit::parse(unit_text);
    if spec.unlimited {
        if unit.is_some() || spec.requests_per_unit.is_some() || spec.burst.is_some() {
            return Err(error(
                "should not specify unit, requests_per_unit or burst when unlimited".into(),
            ));
        }
        return Ok((QuotaLimit::AllowAll, name));
    }
    let period = Period::parse(unit, unit_text, spec.unit_multiplier).map_err(error)?;
    // As upstream reads a rate_limit: a missing requests_per_unit is 0.
    let requests = spec.requests_per_unit.unwrap_or(0);
    if requests == 0 {
        return Ok((QuotaLimit::DenyAll, name));
    }
    if spec.burst == Some(0) {
        return Err(error("burst must be at least 1".into()));
    }
    let rate = QuotaRate::new(requests, period, spec.burst).map_err(error)?;
    Ok((QuotaLimit::Rate(rate), name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a file holds of a domain's quota policies.
    #[derive(Deserialize)]
    struct Domain {
        quota_buckets: Option<Vec<Spanned<QuotaBucketSpec>>>,
        quota_default: Option<Spanned<QuotaDefaultSpec>>,
    }

    fn compile_text(text: &str) -> Result<QuotaDomain, ConfigError> {
        let spec: Domain = serde_saphyr::from_str(text).expect(text);
        let domain_source = Source {
            file: "limits.yaml".into(),
            line: 1,
        };
        compile(
            "limits.yaml",
            spec.quota_buckets.as_deref().unwrap_or_default(),
            spec.quota_default.as_ref(),
            domain_source,
        )
    }

    #[test]
    fn quota_policies_compile_with_their_default() {
        let quota = compile_text(
            "quota_buckets:\n  - bucket_id: {name: api, tenant: \"*\"}\n    rate_limit: {unit: second, requests_per_unit: 100}\n  - bucket_id: {name: blocked}\n    rate_limit: {unit: second, requests_per_unit: 0, name: nobody}\n    shadow_mode: true\nquota_default:\n  rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 5000, burst: 50}\n",
        )
        .unwrap();
        assert_eq!(quota.policies.len(), 2);
        assert_eq!(quota.policies[0].name, "name=api,tenant=*");
        assert_eq!(quota.policies[0].source.line, 2);
        assert!(
            matches!(quota.policies[0].limit, QuotaLimit::Rate(rate) if rate.micro_rps() == 100_000_000)
        );
        assert_eq!(quota.policies[1].name, "nobody");
        assert_eq!(quota.policies[1].limit, QuotaLimit::DenyAll);
        assert!(quota.policies[1].shadow);
        assert_eq!(
            quota.default.limit,
            QuotaLimit::Rate(QuotaRate {
                requests: 5000,
                period_seconds: 300,
                burst: Some(50)
            })
        );
        assert_eq!(quota.default.source.line, 8);
        // Only buckets: the rest is allowed, by a default where the domain is.
        let quota = compile_text(
            "quota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unlimited: true}\n",
        )
        .unwrap();
        assert_eq!(quota.default.limit, QuotaLimit::AllowAll);
        assert_eq!(
            (quota.default.name.as_str(), quota.default.source.line),
            ("default", 1)
        );
        assert_eq!(quota.policies[0].limit, QuotaLimit::AllowAll);
    }

    #[test]
    fn quota_errors_name_the_line_and_the_reason() {
        let cases = [
            (
                "quota_buckets:\n  - rate_limit: {unlimited: true}\n",
                2,
                "quota bucket has no bucket_id",
            ),
            (
                "quota_buckets:\n  - bucket_id: {}\n    rate_limit: {unlimited: true}\n",
                2,
                "at least one key",
            ),
            (
                "quota_buckets:\n  - bucket_id: {a: \"\"}\n    rate_limit: {unlimited: true}\n",
                2,
                "must not be empty",
            ),
            (
                "quota_buckets:\n  - bucket_id: {a: b}\n",
                2,
                "quota bucket has no rate_limit",
            ),
            (
                "quota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
                3,
                "invalid rate limit unit 'fortnight'",
            ),
            (
                "quota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unit: second, requests_per_unit: 2000000}\n",
                3,
                "at most 1000000 requests per second",
            ),
            (
                "quota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unit: year, requests_per_unit: 1}\n",
                3,
                "below the smallest quota rate",
            ),
            (
                "quota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unit: second, requests_per_unit: 1, burst: 0}\n",
                3,
                "burst must be at least 1",
            ),
            (
                "quota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unlimited: true, unit: second}\n",
                3,
                "when unlimited",
            ),
            (
                "quota_buckets:\n  - bucket_id: {a: b}\n    rate_limit: {unlimited: true}\n  - bucket_id: {a: b}\n    rate_limit: {unlimited: true}\n",
                4,
                "duplicate quota bucket 'a=b' (first at line 2)",
            ),
        ];
        crate::spec::assert_refused("limits.yaml", &cases, compile_text);
    }
}

//! envoyproxy/ratelimit's `descriptors`, read as upstream reads them into a
//! domain's tree of rules. Every error names the file, the line and the
//! reason, in upstream's words where upstream has them.
//!
//! Accepted as upstream: `key`, `value` (a `*` anywhere makes a wildcard:
//! any run of characters), `descriptors` (nested), `rate_limit` with `unit`,
//! `requests_per_unit`, `unlimited`, `name`, `replaces`, and `shadow_mode`,
//! `detailed_metric`, `value_to_metric`, `share_threshold`, `quota_mode`
//! and `metadata` on descriptors: every field upstream's schema accepts.
//! Three extensions on `rate_limit`: `count_denied_hits` (a request matching
//! the rule is counted as upstream counts), `algorithm` (`fixed_window`, the
//! default, with windows aligned to the unit as upstream; `sliding_window`;
//! `token_bucket`; `gcra`; `sliding_window_counter`) and `unit_multiplier`
//! (the window is `unit` × this).
//!
//! An extension on descriptors: `rate_limits`, a list of entries each with
//! exactly the fields of `rate_limit`, beside or instead of it (`rate_limit`
//! then counts as the list's first entry): several limits on one
//! descriptor, all decided together with the request's other descriptors.
//! `shadow_mode`, `quota_mode`, `metadata` and `share_threshold` are the
//! descriptor's and hold for every entry. Two counted entries with the same
//! algorithm and the same window (`unit` × `unit_multiplier`) would name one
//! counter, and are refused. An `unlimited: true` entry limits nothing (a
//! descriptor whose entries all are is unlimited); a `requests_per_unit: 0`
//! entry blocks the descriptor, as a single blocked rule does. Each entry's
//! `name` is its own: reported in `current_limit` when that entry is the
//! most restrictive, and the `replaces` of any rule matched in the same
//! request drops every entry so named, the descriptor keeping its other
//! entries (with none left it has no limit, as a replaced upstream rule).
//! An entry's `replaces` may not name an entry of its own descriptor (it
//! could only ever drop it). An unnamed entry of a descriptor with several
//! has the policy id `<descriptor path>#<position>` (1-based, `rate_limit`
//! first) in the IETF headers. `rate_limits: []` is no limit, as no
//! `rate_limit`.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::rule::{DescriptorSettings, Limit, Period, Rule, Source, StatsNaming, Written};
use super::tree::{Level, Node};
use super::wildcard::Wildcard;
use crate::algorithm::{self, registry::Kind};
use crate::config_error::ConfigError;
use crate::pb::convert;
use crate::spec::{Text, Unit};

/// One descriptor, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DescriptorSpec {
    key: Option<Text>,
    value: Option<Text>,
    rate_limit: Option<Spanned<RateLimitSpec>>,
    /// Extension: more limits on the same descriptor, each as
    /// `rate_limit`, all decided together (after `rate_limit`, if given).
    #[serde(default)]
    rate_limits: Vec<Spanned<RateLimitSpec>>,
    #[serde(default)]
    descriptors: Vec<Spanned<DescriptorSpec>>,
    #[serde(default)]
    shadow_mode: bool,
    /// Upstream's statistics named after the request's values.
    #[serde(default)]
    detailed_metric: bool,
    /// Upstream's statistics named after the request's value at this
    /// level (when matched by a wildcard or by key alone).
    #[serde(default)]
    value_to_metric: bool,
    #[serde(default)]
    share_threshold: bool,
    /// Over the limit, denies only when every quota descriptor is over.
    #[serde(default)]
    quota_mode: bool,
    /// Attached to the response's dynamic metadata when the descriptor
    /// passes.
    metadata: Option<Spanned<serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RateLimitSpec {
    unit: Option<Text>,
    requests_per_unit: Option<u32>,
    #[serde(default)]
    unlimited: bool,
    name: Option<Text>,
    #[serde(default)]
    replaces: Vec<ReplacesSpec>,
    /// Extension: `fixed_window` (default), `sliding_window`, `token_bucket`,
    /// `gcra`, `sliding_window_counter`.
    algorithm: Option<Text>,
    /// Extension: the window is `unit` × this.
    unit_multiplier: Option<u32>,
    /// Extension: a request matching this rule is counted as upstream
    /// counts (each descriptor on its own, denied hits too), for rules
    /// Envoy charges after the response (`apply_on_stream_done`).
    #[serde(default)]
    count_denied_hits: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplacesSpec {
    name: Option<Text>,
}

/// The tree of `domain`'s `descriptors`, written in `file`.
pub(crate) fn compile(
    file: &str,
    domain: &str,
    descriptors: &[Spanned<DescriptorSpec>],
) -> Result<Level, ConfigError> {
    let mut context = Context {
        file,
        path: vec![domain.to_owned()],
        value_to_metric: Vec::new(),
    };
    context.level(descriptors)
}

struct Context<'a> {
    file: &'a str,
    /// The descriptor path down to the level being read: the domain, then
    /// one `key` or `key_value` per level.
    path: Vec<String>,
    /// Per level of the path: whether the request's value names upstream's
    /// statistics there (`value_to_metric` on a wildcard or key-only level).
    value_to_metric: Vec<bool>,
}

impl Context<'_> {
    fn error(&self, line: u64, reason: impl Into<String>) -> ConfigError {
        ConfigError::in_file(self.file, line, reason)
    }

    fn level(&mut self, descriptors: &[Spanned<DescriptorSpec>]) -> Result<Level, ConfigError> {
        let mut level = Level::default();
        for descriptor in descriptors {
            let line = descriptor.referenced.line();
            let spec = &descriptor.value;
            let key = match &spec.key {
                Some(Text(key)) if !key.is_empty() => key.clone(),
                _ => return Err(self.error(line, "descriptor has empty key")),
            };
            let value = spec
                .value
                .as_ref()
                .map(|Text(value)| value.clone())
                .filter(|v| !v.is_empty());
            let composite = match &value {
                Some(value) => format!("{key}_{value}"),
                None => key.clone(),
            };
            let is_wildcard = value.as_deref().and_then(Wildcard::new).is_some();
            if spec.share_threshold && !is_wildcard {
                return Err(self.error(
                    line,
                    format!(
                        "share_threshold can only be used with wildcard values (containing '*'), \
                         but found key '{composite}'"
                    ),
                ));
            }
            let exact = value.is_some() && !is_wildcard;
            self.path.push(composite.clone());
            self.value_to_metric.push(spec.value_to_metric && !exact);
            let naming = StatsNaming {
                detailed: spec.detailed_metric,
                value_to_metric: self.value_to_metric.contains(&true),
            };
            let settings = Arc::new(self.settings(spec)?.named(naming));
            let rules = self.rules(spec, &settings)?;
            let children = self.level(&spec.descriptors)?;
            self.path.pop();
            self.value_to_metric.pop();
            let node = Node {
                rules: rules.into_iter().map(Arc::new).collect(),
                shared_pattern: spec.share_threshold.then(|| value.clone()).flatten(),
                value_to_metric: spec.value_to_metric,
                children,
            };
            if !level.insert(key, value.as_deref(), node) {
                let at = self.path.join(".");
                return Err(self.error(
                    line,
                    format!("duplicate descriptor composite key '{at}.{composite}'"),
                ));
            }
        }
        Ok(level)
    }

    /// What the descriptor at the end of the path gives its limits.
    fn settings(&self, spec: &DescriptorSpec) -> Result<DescriptorSettings, ConfigError> {
        let metadata = match &spec.metadata {
            None => None,
            Some(metadata) => {
                Some(convert::json_to_struct(&metadata.value).ok_or_else(|| {
                    self.error(metadata.referenced.line(), "metadata must be a map")
                })?)
            }
        };
        Ok(DescriptorSettings::new(
            spec.shadow_mode,
            spec.quota_mode,
            metadata,
            self.path[1..].to_vec(),
        ))
    }

    /// A descriptor's limits: its `rate_limit` first, then each entry of
    /// its `rate_limits`.
    fn rules(
        &self,
        spec: &DescriptorSpec,
        settings: &Arc<DescriptorSettings>,
    ) -> Result<Vec<Rule>, ConfigError> {
        let entries: Vec<&Spanned<RateLimitSpec>> =
            spec.rate_limit.iter().chain(&spec.rate_limits).collect();
        // The headers name one limit of several: the path alone would not
        // say which.
        let several = entries.len() > 1;
        let mut rules: Vec<Rule> = Vec::with_capacity(entries.len());
        for (position, entry) in entries.into_iter().enumerate() {
            let rule = self.rule(entry, settings, several.then_some(position + 1))?;
            for earlier in &rules {
                self.check_apart(earlier, &rule)?;
            }
            rules.push(rule);
        }
        Ok(rules)
    }

    /// Two limits of one descriptor must count on counters of their own,
    /// and neither may replace the other.
    fn check_apart(&self, earlier: &Rule, rule: &Rule) -> Result<(), ConfigError> {
        let line = rule.source().line;
        if let Some((tag, algorithm, window)) = counter(rule)
            && counter(earlier).is_some_and(|(t, _, w)| (t, w) == (tag, window))
        {
            return Err(self.error(
                line,
                format!(
                    "this limit and the one at line {} would share one counter \
                     (both {algorithm} over {} s): change the unit, \
                     unit_multiplier or algorithm of one of them",
                    earlier.source().line,
                    window.as_secs()
                ),
            ));
        }
        // Both decide every request of the descriptor: replacing one by
        // the other could only ever drop it.
        for (replacing, replaced) in [(rule, earlier), (earlier, rule)] {
            if let Some(name) = replaced.name()
                && replacing.replaces().iter().any(|r| r == name)
            {
                return Err(self.error(
                    line,
                    format!(
                        "replaces should not name a limit of the same descriptor \
                         ('{name}', line {})",
                        replaced.source().line
                    ),
                ));
            }
        }
        Ok(())
    }

    /// One `rate_limit` (or entry of `rate_limits`), the `position`-th of
    /// its descriptor's several.
    fn rule(
        &self,
        spanned: &Spanned<RateLimitSpec>,
        settings: &Arc<DescriptorSettings>,
        position: Option<usize>,
    ) -> Result<Rule, ConfigError> {
        let line = spanned.referenced.line();
        let spec = &spanned.value;
        let unit_text = Text::or_empty(spec.unit.as_ref());
        let unit = Unit::parse(unit_text);
        if spec.unlimited && unit.is_some() {
            return Err(self.error(line, "should not specify rate limit unit when unlimited"));
        }
        let name = spec
            .name
            .as_ref()
            .map(|Text(name)| name.clone())
            .filter(|n| !n.is_empty());
        let mut replaces = Vec::with_capacity(spec.replaces.len());
        for replaced in &spec.replaces {
            match &replaced.name {
                Some(Text(replaced)) if !replaced.is_empty() => {
                    if Some(replaced) == name.as_ref() {
                        return Err(
                            self.error(line, "replaces should not contain name of same descriptor")
                        );
                    }
                    replaces.push(replaced.clone());
                }
                _ => return Err(self.error(line, "should not have an empty replaces entry")),
            }
        }
        let limit = if spec.unlimited {
            Limit::Unlimited
        } else {
            self.limit(line, spec, unit, unit_text)?
        };
        let written = Written {
            name,
            replaces,
            count_denied_hits: spec.count_denied_hits,
            position,
            source: Source {
                file: self.file.to_owned(),
                line,
            },
        };
        Ok(Rule::configured(limit, settings.clone(), written))
    }

    /// What a limited `rate_limit` does: `requests_per_unit` (a missing one
    /// is 0, always denied, as upstream reads it) per its period, under its
    /// algorithm.
    fn limit(
        &self,
        line: u64,
        spec: &RateLimitSpec,
        unit: Option<Unit>,
        unit_text: &str,
    ) -> Result<Limit, ConfigError> {
        let period = Period::parse(unit, unit_text, spec.unit_multiplier)
            .map_err(|reason| self.error(line, reason))?;
        let name = spec
            .algorithm
            .as_ref()
            .map_or(Kind::FixedWindow.name(), |Text(name)| name.as_str());
        let Some(kind) = Kind::from_name(name) else {
            return Err(self.error(
                line,
                format!("unknown algorithm '{name}': use {}", Kind::names(" or ")),
            ));
        };
        let requests_per_unit = spec.requests_per_unit.unwrap_or(0);
        Limit::rate(requests_per_unit, period, kind).map_err(|err| {
            // The algorithm's parameters, in the file's words.
            let field = match err.field.as_str() {
                "window" | "period" => "unit × unit_multiplier",
                "limit" | "capacity" | "rate" | "burst" => "requests_per_unit",
                other => other,
            };
            self.error(line, format!("{field}: {}", err.rule))
        })
    }
}

/// What names a counted rule's counter beside its descriptor's entries:
/// its window, and its algorithm (storage keys carry the algorithm's tag).
/// Unlimited and blocked rules keep none.
fn counter(rule: &Rule) -> Option<(&'static str, &'static str, Duration)> {
    match rule.limit() {
        Limit::Counted(counted) => Some((
            algorithm::key_tag(counted.algorithm()),
            counted.algorithm().name(),
            counted.period().window(),
        )),
        Limit::Unlimited | Limit::Blocked(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a file holds of a domain's descriptors.
    #[derive(Deserialize)]
    struct Domain {
        domain: String,
        descriptors: Vec<Spanned<DescriptorSpec>>,
    }

    fn compile_text(text: &str) -> Result<Level, ConfigError> {
        let spec: Domain = serde_saphyr::from_str(text).expect(text);
        compile("limits.yaml", &spec.domain, &spec.descriptors)
    }

    /// The rules `text` gives the descriptor `(key, value)`.
    fn find(text: &str, key: &str, value: &str) -> Option<Vec<Arc<Rule>>> {
        let level = compile_text(text).expect(text);
        let entries = [(key, value)];
        level.find(&entries).map(|found| found.rules.to_vec())
    }

    /// Requests per unit, unit and line of each rule.
    fn rates(rules: &[Arc<Rule>]) -> Vec<(u32, Unit, u64)> {
        rules
            .iter()
            .filter_map(|rule| {
                let (requests, period) = rule.limit().reported()?;
                Some((requests, period.unit(), rule.source().line))
            })
            .collect()
    }

    #[test]
    fn errors_name_the_file_the_line_and_the_reason() {
        let cases = [
            (
                "domain: d\ndescriptors:\n  - value: v\n",
                3,
                "descriptor has empty key",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n",
                5,
                "invalid rate limit unit 'fortnight'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
                4,
                "should not specify rate limit unit when unlimited",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n  - key: k\n",
                4,
                "duplicate descriptor composite key 'd.k'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, name: a, replaces: [{name: a}]}\n",
                4,
                "replaces should not contain name of same descriptor",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{}]}\n",
                4,
                "should not have an empty replaces entry",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    share_threshold: true\n",
                3,
                "share_threshold can only be used with wildcard values",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    metadata: [1]\n",
                4,
                "metadata must be a map",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, algorithm: leaky}\n",
                4,
                "unknown algorithm 'leaky': use fixed_window, sliding_window, token_bucket, gcra or sliding_window_counter",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100001, algorithm: sliding_window}\n",
                4,
                "requests_per_unit: must be at most 100000",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, unit_multiplier: 2, requests_per_unit: 1}\n",
                4,
                "unit × unit_multiplier: must be at most",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unit_multiplier: 0, requests_per_unit: 1}\n",
                4,
                "unit_multiplier must be at least 1",
            ),
        ];
        crate::spec::assert_refused("limits.yaml", &cases, compile_text);
    }

    #[test]
    fn scalars_of_any_type_are_text_and_units_ignore_case() {
        let text = "domain: d\ndescriptors:\n  - key: code\n    value: 429\n    rate_limit: {unit: MINUTE, requests_per_unit: 1}\n";
        let rules = find(text, "code", "429").unwrap();
        assert_eq!(rates(&rules), [(1, Unit::Minute, 5)]);
    }

    #[test]
    fn a_descriptor_may_carry_several_limits() {
        let text = "domain: d\ndescriptors:\n  - key: api\n    rate_limits:\n      - {unit: second, requests_per_unit: 3, name: burst}\n      - unit: minute\n        requests_per_unit: 5\n";
        let rules = find(text, "api", "x").unwrap();
        assert_eq!(rates(&rules), [(3, Unit::Second, 5), (5, Unit::Minute, 6)]);
        assert_eq!(rules[0].policy_id(), "burst");
        assert_eq!(rules[1].policy_id(), "api#2", "unnamed, one of several");
    }

    #[test]
    fn rate_limit_comes_first_before_rate_limits() {
        let text = "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: true\n    rate_limit: {unit: hour, requests_per_unit: 100}\n    rate_limits:\n      - {unit: second, requests_per_unit: 2}\n      - {unit: second, requests_per_unit: 5, algorithm: token_bucket}\n      - {unlimited: true}\n";
        let rules = find(text, "k", "v").unwrap();
        let units: Vec<Unit> = rates(&rules).into_iter().map(|(_, unit, _)| unit).collect();
        assert_eq!(units, [Unit::Hour, Unit::Second, Unit::Second]);
        assert_eq!(rules[0].policy_id(), "k#1");
        assert!(rules.iter().all(|rule| rule.shadow()), "the descriptor's");
        assert_eq!(rules[3].limit(), &Limit::Unlimited);
        // One rate_limit alone keeps upstream's id; so does a list of one.
        let text = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: b\n    rate_limits: [{unit: hour, requests_per_unit: 1}]\n  - key: c\n    rate_limits: []\n";
        for key in ["a", "b"] {
            let rules = find(text, key, "v").unwrap();
            assert_eq!(rules.len(), 1);
            assert_eq!(rules[0].policy_id(), key);
        }
        assert!(find(text, "c", "v").is_none(), "an empty list: no limit");
    }

    #[test]
    fn several_limits_errors_name_the_entry() {
        let cases = [
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: minute, requests_per_unit: 3}\n      - {unit: second, unit_multiplier: 60, requests_per_unit: 5}\n",
                6,
                "this limit and the one at line 5 would share one counter (both fixed_window over 60 s): change the unit, unit_multiplier or algorithm of one of them",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3, algorithm: gcra}\n    rate_limits:\n      - {unit: second, requests_per_unit: 5, algorithm: gcra}\n",
                6,
                "would share one counter (both gcra over 1 s)",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 3}\n      - unit: fortnight\n        requests_per_unit: 5\n",
                6,
                "invalid rate limit unit 'fortnight'",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 3, name: a}\n      - {unit: minute, requests_per_unit: 5, replaces: [{name: a}]}\n",
                6,
                "replaces should not name a limit of the same descriptor ('a', line 5)",
            ),
            (
                "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 3, replaces: [{name: b}]}\n      - {unit: minute, requests_per_unit: 5, name: b}\n",
                6,
                "replaces should not name a limit of the same descriptor ('b', line 6)",
            ),
        ];
        crate::spec::assert_refused("limits.yaml", &cases, compile_text);
        // Without a counter, or with another window or algorithm, no clash.
        compile_text(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 3}\n      - {unit: second, requests_per_unit: 3, algorithm: sliding_window}\n      - {unit: second, unit_multiplier: 2, requests_per_unit: 5}\n      - {unit: second, requests_per_unit: 0}\n      - {unlimited: true}\n      - {unlimited: true}\n",
        )
        .unwrap();
    }

    #[test]
    fn zero_or_missing_requests_block_and_unlimited_reads_nothing_else() {
        let text = "domain: d\ndescriptors:\n  - key: zero\n    rate_limit: {unit: minute, requests_per_unit: 0, algorithm: gcra}\n  - key: missing\n    rate_limit: {unit: hour}\n  - key: open\n    rate_limit: {unlimited: true, algorithm: leaky, unit_multiplier: 0}\n";
        let limit = |key: &str| find(text, key, "v").unwrap()[0].limit().clone();
        assert_eq!(limit("zero"), Limit::Blocked(Period::of(Unit::Minute)));
        assert_eq!(limit("missing"), Limit::Blocked(Period::of(Unit::Hour)));
        assert_eq!(limit("open"), Limit::Unlimited);
    }
}

//! The rules in force as text, in the form of envoyproxy/ratelimit's
//! `/rlconfig` debug endpoint (its configuration's `Dump()`): one line per
//! limit, `<domain>.<key_value>...: unit=<UNIT> requests_per_unit=<n>,
//! shadow_mode: <bool>, quota_mode: <bool>`. Upstream prints in Go's map
//! order, which changes from run to run; these lines are sorted. An
//! unlimited rule reads `unit=UNKNOWN requests_per_unit=0`, as upstream's
//! does when written without a rate. Our extensions add `, unit_multiplier:
//! <n>` and `, algorithm: <name>` to the lines of rules that use them.

use super::rule::Limit;
use super::{Rule, Rules};
use crate::algorithm::Algorithm;

impl Rules {
    /// Every limit of every domain, a line each, sorted.
    pub fn dump(&self) -> String {
        let mut lines: Vec<String> = self
            .each_rule()
            .into_iter()
            .map(|(domain, rule)| line(domain, rule))
            .collect();
        lines.sort();
        lines.concat()
    }
}

/// One limit's line.
fn line(domain: &str, rule: &Rule) -> String {
    let descriptor = rule.descriptor();
    let mut key = domain.to_owned();
    for part in &descriptor.stats_key {
        key.push('.');
        key.push_str(part);
    }
    let (unit, requests, extensions) = match rule.limit() {
        Limit::Unlimited => ("UNKNOWN".to_owned(), 0, String::new()),
        Limit::Blocked(period) => (unit_name(period.unit()), 0, multiplier(period.multiplier())),
        Limit::Counted(counted) => {
            let period = counted.period();
            let mut extensions = multiplier(period.multiplier());
            if !matches!(counted.algorithm(), Algorithm::FixedWindow(_)) {
                extensions.push_str(&format!(", algorithm: {}", counted.algorithm().name()));
            }
            (
                unit_name(period.unit()),
                counted.requests_per_unit(),
                extensions,
            )
        }
    };
    format!(
        "{key}: unit={unit} requests_per_unit={requests}, shadow_mode: {}, quota_mode: {}{extensions}\n",
        descriptor.shadow, descriptor.quota
    )
}

/// The unit as upstream's enum names it (`MINUTE`).
fn unit_name(unit: crate::spec::Unit) -> String {
    format!("{unit:?}").to_ascii_uppercase()
}

fn multiplier(multiplier: u32) -> String {
    if multiplier == 1 {
        String::new()
    } else {
        format!(", unit_multiplier: {multiplier}")
    }
}

#[cfg(test)]
mod tests {
    use crate::rules;

    #[test]
    fn one_sorted_line_per_limit_in_upstreams_words() {
        let text = "\
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /login
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
    descriptors:
      - key: user
        quota_mode: true
        rate_limit: {unit: hour, requests_per_unit: 0}
  - key: internal
    rate_limit: {unlimited: true}
  - key: tenant
    rate_limits:
      - {unit: minute, requests_per_unit: 100, unit_multiplier: 5}
      - {unit: second, requests_per_unit: 3, algorithm: gcra}
  - key: plain
    descriptors:
      - key: deep
        rate_limit: {unit: day, requests_per_unit: 1}
";
        let rules = rules::compile(&[("edge.yaml".into(), text.to_owned())]).unwrap();
        assert_eq!(
            rules.dump(),
            "\
edge.internal: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false
edge.path_/login.user: unit=HOUR requests_per_unit=0, shadow_mode: false, quota_mode: true
edge.path_/login: unit=MINUTE requests_per_unit=5, shadow_mode: true, quota_mode: false
edge.plain.deep: unit=DAY requests_per_unit=1, shadow_mode: false, quota_mode: false
edge.remote_address: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false
edge.tenant: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false, unit_multiplier: 5
edge.tenant: unit=SECOND requests_per_unit=3, shadow_mode: false, quota_mode: false, algorithm: gcra
"
        );
        assert_eq!(rules::Rules::default().dump(), "");
    }
}

//! The limits configured for Envoy, compiled for lookup, and the matching
//! rules of envoyproxy/ratelimit: which rules, if any, govern a request's
//! descriptor (one per `rate_limit`, several with the `rate_limits`
//! extension). Pure: no I/O, no store.
//!
//! Matching walks the descriptor's entries down the domain's tree. At each
//! level an entry matches, in this order: a rule with the same key and
//! value; the first (in file order) wildcard rule with the same key whose
//! value, less its trailing `*`, starts the entry's value; a rule with the
//! same key and no value. A rule applies only at the depth of the request's
//! last entry: a longer descriptor than the tree is deep, or one ending on a
//! node without a `rate_limit` (nor `rate_limits`), has no limit.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::limit::Algorithm;
pub use crate::spec::Unit;

/// Where a rule was written, for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The file, relative to the configuration directory.
    pub file: String,
    /// The line (1-based) of the descriptor.
    pub line: u64,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// What a rule does with the requests it governs.
#[derive(Debug, Clone, PartialEq)]
pub enum Limit {
    /// Never limited, never counted.
    Unlimited,
    /// `requests_per_unit: 0`: always over the limit, never counted.
    Blocked,
    /// Counted on the store by this algorithm.
    Counted(Algorithm),
}

/// One limit of a descriptor (its `rate_limit`, or an entry of its
/// `rate_limits`), with the settings of the descriptor that holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// `name`, reported in `current_limit` and targeted by `replaces`.
    pub name: Option<String>,
    /// `requests_per_unit`.
    pub requests_per_unit: u32,
    /// `unit`.
    pub unit: Unit,
    /// The window is `unit` × this (1 unless `unit_multiplier` is set).
    pub unit_multiplier: u32,
    /// What the rule does: count, allow all, or deny all.
    pub limit: Limit,
    /// Names of rules this one replaces within the same request.
    pub replaces: Vec<String>,
    /// Decided and counted, but never denies.
    pub shadow: bool,
    /// `quota_mode`: over the limit, it denies the request only when every
    /// quota descriptor of the request is over.
    pub quota: bool,
    /// `metadata`, attached to the response's dynamic metadata when the
    /// descriptor passes (with RESPONSE_DYNAMIC_METADATA).
    pub metadata: Option<prost_types::Struct>,
    /// The rule's place in its file, one `key` or `key_value` per level
    /// below the domain: the key of upstream's statistics for it (empty
    /// for a limit Envoy sent, which has no place in the configuration).
    pub stats_key: Vec<String>,
    /// The counters of `stats_key` under upstream's names, made on first
    /// use (the metrics exporter is installed by then).
    pub upstream_counters: UpstreamCountersSlot,
    /// Extension `count_denied_hits`: a request this rule governs is
    /// decided each descriptor on its own, a fixed window counting denied
    /// hits too, so a report Envoy sends after the response always counts.
    pub count_denied_hits: bool,
    /// An id for the IETF `RateLimit-Policy` header: the name, else the
    /// descriptor path in the configuration (with `#<position>` when the
    /// descriptor has several limits).
    pub policy_id: String,
    /// Where it was written.
    pub source: Source,
}

impl Rule {
    /// The window: `unit` × `unit_multiplier`.
    pub fn window(&self) -> Duration {
        Duration::from_secs(self.unit.seconds() * u64::from(self.unit_multiplier))
    }
}

/// A rule's upstream-named counters, once made. Rules compare and print
/// without them: they are a cache of what `stats_key` names.
#[derive(Default)]
pub struct UpstreamCountersSlot(
    pub std::sync::OnceLock<Option<crate::metrics::UpstreamRuleCounters>>,
);

impl Clone for UpstreamCountersSlot {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for UpstreamCountersSlot {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for UpstreamCountersSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpstreamCountersSlot")
    }
}

/// A node of a domain's descriptor tree.
#[derive(Debug, Default)]
pub struct Node {
    /// The limits of a descriptor ending here, all decided together: one
    /// for upstream's `rate_limit`, none for a node without one.
    pub rules: Vec<Arc<Rule>>,
    /// `share_threshold`: all values matching this wildcard share one
    /// counter, named by the pattern instead of the value.
    pub shared_pattern: Option<String>,
    /// The nodes one entry deeper.
    pub children: Level,
}

/// The rules at one depth.
#[derive(Debug, Default)]
pub struct Level {
    /// key → value → node.
    pub exact: HashMap<String, HashMap<String, Node>>,
    /// (key, value pattern, node), in file order.
    pub wildcards: Vec<(String, Wildcard, Node)>,
    /// key → node, for rules without a value.
    pub any_value: HashMap<String, Node>,
}

impl Level {
    /// Whether no rule is below this level.
    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcards.is_empty() && self.any_value.is_empty()
    }

    fn find(&self, key: &str, value: &str) -> Option<&Node> {
        if let Some(node) = self.exact.get(key).and_then(|values| values.get(value)) {
            return Some(node);
        }
        if let Some((_, _, node)) = self
            .wildcards
            .iter()
            .find(|(k, pattern, _)| k == key && pattern.matches(value))
        {
            return Some(node);
        }
        self.any_value.get(key)
    }
}

/// A value with `*` in it, each `*` standing for any run of characters
/// (none included), as upstream matches: `files*` is a prefix, `a*b*c`
/// starts with `a`, ends with `c` and has `b` between.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wildcard {
    /// As written, `*` included.
    pub pattern: String,
    /// The pattern split at each `*`.
    parts: Vec<String>,
}

impl Wildcard {
    /// `None` when `pattern` has no `*`.
    pub fn new(pattern: &str) -> Option<Self> {
        pattern.contains('*').then(|| Self {
            pattern: pattern.to_owned(),
            parts: pattern.split('*').map(str::to_owned).collect(),
        })
    }

    /// Whether `value` matches the pattern (`*` matches any run of characters).
    pub fn matches(&self, value: &str) -> bool {
        let (first, rest) = match self.parts.split_first() {
            Some(split) => split,
            None => return false,
        };
        let Some((last, middle)) = rest.split_last() else {
            return value == first;
        };
        if value.len() < self.parts.iter().map(String::len).sum::<usize>() {
            return false;
        }
        let Some(mut remaining) = value
            .strip_prefix(first.as_str())
            .and_then(|after| after.strip_suffix(last.as_str()))
        else {
            return false;
        };
        // Each middle part in order, as early as it appears.
        for part in middle {
            let Some(at) = remaining.find(part.as_str()) else {
                return false;
            };
            remaining = &remaining[at + part.len()..];
        }
        true
    }
}

/// Every configured domain.
#[derive(Debug, Default)]
pub struct Rules {
    /// Domain → its top level.
    pub domains: HashMap<String, Level>,
    /// Domain → its quota service policies, for the domains that have any.
    pub quotas: HashMap<String, super::quota_policies::QuotaDomain>,
    /// `CheckLimit`'s named policies, from files with `policies:`.
    pub policies: crate::policy::Policies,
}

/// The rules governing a descriptor, and the values their counters are
/// named by.
#[derive(Debug, Clone, PartialEq)]
pub struct Found<'a> {
    /// The governing rules: at least one, in file order.
    pub rules: &'a [Arc<Rule>],
    /// Per entry: the request's value, or the wildcard pattern where the
    /// level shares one counter (`share_threshold`).
    pub counter_values: Vec<&'a str>,
}

impl Rules {
    /// Is `domain` configured?
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The rules for a descriptor of `(key, value)` entries in `domain`.
    pub fn find<'a>(&'a self, domain: &str, entries: &'a [(String, String)]) -> Option<Found<'a>> {
        let mut level = self.domains.get(domain)?;
        let mut counter_values = Vec::with_capacity(entries.len());
        for (depth, (key, value)) in entries.iter().enumerate() {
            let node = level.find(key, value)?;
            counter_values.push(node.shared_pattern.as_deref().unwrap_or(value));
            if depth + 1 == entries.len() {
                return (!node.rules.is_empty()).then_some(Found {
                    rules: &node.rules,
                    counter_values,
                });
            }
            if node.children.is_empty() {
                return None;
            }
            level = &node.children;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::Wildcard;

    #[test]
    fn wildcards_match_as_upstreams() {
        let matches = |pattern: &str, value: &str| Wildcard::new(pattern).unwrap().matches(value);
        assert!(matches("files*", "files/a.pdf"));
        assert!(matches("files*", "files"));
        assert!(!matches("files*", "file"));
        assert!(matches("bar*baz*qux", "bar1baz2qux"));
        assert!(matches("bar*baz*qux", "barbazqux"));
        assert!(!matches("bar*baz*qux", "bar1qux"));
        assert!(
            !matches("ab*ba", "aba"),
            "prefix and suffix may not overlap"
        );
        assert!(matches("*.pdf", "report.pdf"));
        assert!(matches("*", ""));
        assert!(Wildcard::new("plain").is_none());
    }
}

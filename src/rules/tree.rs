//! A domain's descriptors compiled for lookup, and the matching rules of
//! envoyproxy/ratelimit: which rules, if any, govern a request's
//! descriptor (one per `rate_limit`, several with the `rate_limits`
//! extension). Pure: no I/O, no store.
//!
//! Matching walks the descriptor's entries down the domain's tree. At each
//! level an entry matches, in this order: a rule with the same key and
//! value; the first (in file order) wildcard rule with the same key whose
//! value matches the entry's value; a rule with the same key and no value.
//! A rule applies only at the depth of the request's last entry: a longer
//! descriptor than the tree is deep, or one ending on a node without a
//! `rate_limit` (nor `rate_limits`), has no limit.

use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;

use super::rule::Rule;
use super::wildcard::Wildcard;

/// A node of a domain's descriptor tree.
#[derive(Debug, Default)]
pub(crate) struct Node {
    /// The limits of a descriptor ending here, all decided together: one
    /// for upstream's `rate_limit`, none for a node without one.
    pub rules: Vec<Arc<Rule>>,
    /// `share_threshold`: all values matching this wildcard share one
    /// counter, named by the pattern instead of the value.
    pub shared_pattern: Option<String>,
    /// `value_to_metric`: matched by a wildcard or by its key alone, the
    /// request's value names upstream's statistics at this level.
    pub value_to_metric: bool,
    /// The nodes one entry deeper.
    pub children: Level,
}

/// How an entry matched a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How<'a> {
    /// By key and value.
    Exact,
    /// By key and this wildcard pattern.
    Wildcard(&'a str),
    /// By key alone.
    AnyValue,
}

/// The rules at one depth.
#[derive(Debug, Default)]
pub(crate) struct Level {
    /// key → value → node.
    exact: HashMap<String, HashMap<String, Node>>,
    /// (key, value pattern, node), in file order.
    wildcards: Vec<(String, Wildcard, Node)>,
    /// key → node, for rules without a value.
    any_value: HashMap<String, Node>,
}

/// The rules governing a descriptor, and the values their counters are
/// named by.
#[derive(Debug, Clone)]
pub struct Found<'a> {
    /// The governing rules: at least one, in file order.
    pub rules: &'a [Arc<Rule>],
    /// Per entry: the request's value, or the wildcard pattern where the
    /// level shares one counter (`share_threshold`).
    pub counter_values: SmallVec<[&'a str; 4]>,
}

impl Level {
    /// Whether no rule is below this level.
    pub(crate) fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.wildcards.is_empty() && self.any_value.is_empty()
    }

    /// Every node at this level: exact values, wildcards, then rules
    /// without a value.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = &Node> {
        let exact = self.exact.values().flat_map(HashMap::values);
        let wildcards = self.wildcards.iter().map(|(_, _, node)| node);
        exact.chain(wildcards).chain(self.any_value.values())
    }

    /// Adds the node for `key` with `value` (an exact value, a wildcard
    /// pattern, or none for any value); `false`, adding nothing, when the
    /// level already has one for them.
    pub(crate) fn insert(&mut self, key: String, value: Option<&str>, node: Node) -> bool {
        match value {
            Some(value) => match Wildcard::new(value) {
                Some(pattern) => {
                    let taken = self
                        .wildcards
                        .iter()
                        .any(|(k, p, _)| *k == key && *p == pattern);
                    if !taken {
                        self.wildcards.push((key, pattern, node));
                    }
                    !taken
                }
                None => {
                    let values = self.exact.entry(key).or_default();
                    let taken = values.contains_key(value);
                    if !taken {
                        values.insert(value.to_owned(), node);
                    }
                    !taken
                }
            },
            None => {
                let taken = self.any_value.contains_key(&key);
                if !taken {
                    self.any_value.insert(key, node);
                }
                !taken
            }
        }
    }

    /// The rules for a descriptor of `(key, value)` entries below this
    /// level.
    pub(crate) fn find<'a>(&'a self, entries: &[(&'a str, &'a str)]) -> Option<Found<'a>> {
        let mut level = self;
        let mut counter_values = SmallVec::with_capacity(entries.len());
        for (depth, (key, value)) in entries.iter().enumerate() {
            let node = level.node(key, value)?;
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

    fn node(&self, key: &str, value: &str) -> Option<&Node> {
        self.node_how(key, value).map(|(node, _)| node)
    }

    fn node_how(&self, key: &str, value: &str) -> Option<(&Node, How<'_>)> {
        if let Some(node) = self.exact.get(key).and_then(|values| values.get(value)) {
            return Some((node, How::Exact));
        }
        if let Some((_, pattern, node)) = self
            .wildcards
            .iter()
            .find(|(k, pattern, _)| k == key && pattern.matches(value))
        {
            return Some((node, How::Wildcard(&pattern.pattern)));
        }
        self.any_value.get(key).map(|node| (node, How::AnyValue))
    }

    /// The key upstream names the statistics of a descriptor of `entries`
    /// (one [`Level::find`] matched) by in `domain`, from the request's
    /// values: with `detailed` (`detailed_metric`), every entry as
    /// `key_value` (a `share_threshold` wildcard's pattern for its value);
    /// else each level as configured, but for the request's value where a
    /// wildcard or key-only level says `value_to_metric`.
    pub(crate) fn request_stats_key(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        detailed: bool,
    ) -> String {
        let mut stat_key = domain.to_owned();
        let mut level = self;
        let shared = |node: &'_ Node, how| match how {
            How::Wildcard(_) => node.shared_pattern.clone(),
            How::Exact | How::AnyValue => None,
        };
        let any_shared = detailed && {
            let mut walk = self;
            entries
                .iter()
                .any(|(key, value)| match walk.node_how(key, value) {
                    Some((node, how)) => {
                        walk = &node.children;
                        shared(node, how).is_some()
                    }
                    None => false,
                })
        };
        for (key, value) in entries {
            stat_key.push('.');
            stat_key.push_str(key);
            let Some((node, how)) = level.node_how(key, value) else {
                continue;
            };
            // upstream's plain detailed name is always `key_value`, even
            // for an empty value; its others leave an empty value out.
            let (named, always) = match (detailed, shared(node, how)) {
                (_, Some(pattern)) => (pattern, false),
                (true, None) => ((*value).to_owned(), !any_shared),
                (false, None) => match how {
                    How::Exact => ((*value).to_owned(), false),
                    How::Wildcard(_) | How::AnyValue if node.value_to_metric => {
                        ((*value).to_owned(), false)
                    }
                    How::Wildcard(pattern) => (pattern.to_owned(), false),
                    How::AnyValue => (String::new(), false),
                },
            };
            if always || !named.is_empty() {
                stat_key.push('_');
                stat_key.push_str(&named);
            }
            level = &node.children;
        }
        stat_key
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::rule::{DescriptorSettings, Limit, Written};

    fn node(rules: usize, shared: Option<&str>, children: Level) -> Node {
        let rule = || {
            Arc::new(Rule::configured(
                Limit::Unlimited,
                Arc::new(DescriptorSettings::default()),
                Written::default(),
            ))
        };
        Node {
            rules: (0..rules).map(|_| rule()).collect(),
            shared_pattern: shared.map(str::to_owned),
            value_to_metric: false,
            children,
        }
    }

    fn entries<'a>(pairs: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        pairs.to_vec()
    }

    #[test]
    fn exact_then_first_wildcard_then_any_value_and_only_at_the_last_entry() {
        let mut inner = Level::default();
        assert!(inner.insert(
            "path".into(),
            Some("/a*"),
            node(1, Some("/a*"), Level::default())
        ));
        assert!(inner.insert("path".into(), Some("/*"), node(2, None, Level::default())));
        assert!(inner.insert(
            "path".into(),
            Some("/about"),
            node(3, None, Level::default())
        ));
        assert!(inner.insert("path".into(), None, node(4, None, Level::default())));
        assert!(
            !inner.insert("path".into(), Some("/*"), node(1, None, Level::default())),
            "taken"
        );
        let mut top = Level::default();
        assert!(top.insert("user".into(), None, node(0, None, inner)));
        let found = |pairs: &[(&str, &str)]| {
            let entries = entries(pairs);
            top.find(&entries)
                .map(|found| (found.rules.len(), found.counter_values.join("|")))
        };
        assert_eq!(
            found(&[("user", "u"), ("path", "/about")]),
            Some((3, "u|/about".into()))
        );
        assert_eq!(
            found(&[("user", "u"), ("path", "/ab")]),
            Some((1, "u|/a*".into())),
            "shared"
        );
        assert_eq!(
            found(&[("user", "u"), ("path", "/b")]),
            Some((2, "u|/b".into()))
        );
        assert_eq!(
            found(&[("user", "u"), ("path", "b")]),
            Some((4, "u|b".into()))
        );
        assert_eq!(found(&[("user", "u")]), None, "no rule at the first level");
        assert_eq!(
            found(&[("user", "u"), ("path", "b"), ("x", "y")]),
            None,
            "deeper than the tree"
        );
        assert_eq!(found(&[("tenant", "t")]), None);
    }
}

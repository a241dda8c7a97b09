//! The rules in force as lists, for the admin API and the debug dump:
//! every Envoy rule with its domain, every `CheckLimit` policy, every
//! domain's quota service policies; each in a stable order.

use std::sync::Arc;

use super::quota::QuotaDomain;
use super::tree::Level;
use super::{Rule, Rules};
use crate::policy::Policy;

impl Rules {
    /// Every Envoy rule with its domain, by domain, then in the order
    /// they were written (a descriptor's several limits in theirs).
    pub fn each_rule(&self) -> Vec<(&str, &Rule)> {
        let mut rules = Vec::new();
        for (domain, level) in &self.domains {
            collect(domain, level, &mut rules);
        }
        // Stable: the limits of one descriptor, which share a place, keep
        // the tree's order, theirs.
        rules.sort_by(|(a_domain, a), (b_domain, b)| {
            let place = |rule: &Rule| (rule.source().file.clone(), rule.source().line);
            (a_domain, place(a)).cmp(&(b_domain, place(b)))
        });
        rules
    }

    /// Every `CheckLimit` policy, by name.
    pub fn each_policy(&self) -> Vec<&Arc<Policy>> {
        let mut policies: Vec<&Arc<Policy>> = self.policies.values().collect();
        policies.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        policies
    }

    /// Every domain's quota service policies, by domain.
    pub fn each_quota_domain(&self) -> Vec<(&str, &QuotaDomain)> {
        let mut domains: Vec<(&str, &QuotaDomain)> = self
            .quotas
            .iter()
            .map(|(name, domain)| (name.as_str(), domain))
            .collect();
        domains.sort_unstable_by_key(|(name, _)| *name);
        domains
    }
}

fn collect<'a>(domain: &'a str, level: &'a Level, rules: &mut Vec<(&'a str, &'a Rule)>) {
    for node in level.nodes() {
        rules.extend(node.rules.iter().map(|rule| (domain, rule.as_ref())));
        collect(domain, &node.children, rules);
    }
}

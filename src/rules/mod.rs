//! The operator's rules, as loaded from the rules files (or xDS) into one
//! snapshot that every face reads: Envoy's descriptor rules per domain, the
//! quota service's policies per domain, and `CheckLimit`'s named policies.
//! Pure models and grammars below, reading and polling in `directory`
//! and `source`, swapping in `handle`.
//!
//! - `directory`: which files of the runtime directory, and their text.
//! - `document`: one file as a whole, and a set of files into [`Rules`].
//! - `descriptors_file`: upstream's `descriptors` into a tree of rules
//!   (`tree`, `rule`).
//! - `quota_file`: the quota service's buckets into `quota` policies.
//! - `CheckLimit`'s policies are a room of their own: [`crate::policy`].
//! - `dump`: the rules in force as upstream's debug endpoint prints them;
//!   `listing`: as lists, for it and the admin API.

pub(crate) mod descriptors_file;
pub(crate) mod directory;
pub(crate) mod document;
pub(crate) mod dump;
pub(crate) mod handle;
pub(crate) mod listing;
pub(crate) mod quota;
pub(crate) mod quota_file;
pub(crate) mod rule;
pub(crate) mod source;
pub(crate) mod tree;
pub(crate) mod wildcard;

use std::collections::HashMap;
use std::sync::Arc;

pub(crate) use self::directory::FileSelection;
pub use self::document::compile;
pub(crate) use self::handle::Loads;
pub use self::handle::RulesHandle;
use self::quota::QuotaDomain;
pub(crate) use self::rule::{Counted, DescriptorSettings, Limit, Period, Rule};
pub(crate) use self::source::ConfigSource;
pub(crate) use self::tree::{Found, Level};
use crate::policy::{Policies, Policy};

/// Every rule in force: one compiled configuration.
#[derive(Debug, Default)]
pub struct Rules {
    /// Domain → its top level.
    domains: HashMap<String, Level>,
    /// Domain → its quota service policies, for the domains that have any.
    quotas: HashMap<String, QuotaDomain>,
    /// `CheckLimit`'s named policies, from files with `policies:`.
    policies: Policies,
}

impl Rules {
    /// Is `domain` configured?
    pub fn has_domain(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The rules for a descriptor of `(key, value)` entries in `domain`.
    pub fn find<'a>(&'a self, domain: &str, entries: &[(&'a str, &'a str)]) -> Option<Found<'a>> {
        self.domains.get(domain)?.find(entries)
    }

    /// The key upstream names the statistics of a descriptor of `entries`
    /// in `domain` by, from the request's values (see
    /// `Level::request_stats_key`).
    pub(crate) fn request_stats_key(
        &self,
        domain: &str,
        entries: &[(&str, &str)],
        detailed: bool,
    ) -> Option<String> {
        let level = self.domains.get(domain)?;
        Some(level.request_stats_key(domain, entries, detailed))
    }

    /// `domain`'s quota service policies, if it has any.
    pub fn quota(&self, domain: &str) -> Option<&QuotaDomain> {
        self.quotas.get(domain)
    }

    /// The policy named `name`.
    pub fn policy(&self, name: &str) -> Option<&Arc<Policy>> {
        self.policies.get(name)
    }

    /// How many domains are configured.
    pub fn domain_count(&self) -> usize {
        self.domains.len()
    }

    /// How many policies are defined.
    pub fn policy_count(&self) -> usize {
        self.policies.len()
    }

    /// Exports the counters of every policy and quota policy at 0, so that
    /// `rate()` sees their first increment.
    fn export_zeros(&self) {
        for name in self.policies.keys() {
            crate::metrics::policy_loaded(name);
        }
        for (domain, quota) in &self.quotas {
            for policy in quota.policies.iter().chain([&quota.default]) {
                crate::metrics::quota_policy_loaded(domain, &policy.name);
            }
        }
    }

    /// Nothing configured: no domain and no policy.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty() && self.policies.is_empty()
    }
}

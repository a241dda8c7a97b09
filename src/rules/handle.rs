//! The rules in force, shared by every request and swapped whole when a
//! reload (files or xDS) compiles: a request keeps the set it started with,
//! and readers never wait for a writer.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Rules;

/// A handle on the rules in force; clones share them.
#[derive(Clone, Default)]
pub struct RulesHandle(Arc<ArcSwap<Rules>>);

impl RulesHandle {
    /// A handle that starts with `rules`.
    pub fn new(rules: Rules) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(rules)))
    }

    /// The rules now.
    pub fn current(&self) -> Arc<Rules> {
        self.0.load_full()
    }

    /// Puts `rules` in force for every request that starts after this.
    pub fn replace(&self, rules: Rules) {
        self.0.store(Arc::new(rules));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_keeps_the_rules_it_took() {
        let handle = RulesHandle::default();
        let before = handle.current();
        let mut rules = Rules::default();
        rules.domains.insert("edge".into(), Default::default());
        handle.clone().replace(rules);
        assert!(!before.has_domain("edge"));
        assert!(handle.current().has_domain("edge"));
    }
}

//! The rules in force, shared by every request and swapped whole when a
//! reload (files or xDS) compiles: a request keeps the set it started with,
//! and readers never wait for a writer. Beside them, what has been loaded
//! so far ([`Loads`]), for what waits on a configuration: the start (with
//! xDS) and health (when it requires rules).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use tokio::sync::watch;

use super::Rules;

/// What the configuration source has delivered so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Loads {
    /// A configuration came, whether it was put in force or rejected.
    pub arrived: bool,
    /// The rules in force were loaded from a configuration and hold at
    /// least one domain or policy.
    pub in_force: bool,
}

/// A handle on the rules in force; clones share them.
#[derive(Clone)]
pub struct RulesHandle(Arc<Shared>);

struct Shared {
    rules: ArcSwap<Rules>,
    loads: watch::Sender<Loads>,
    /// When the rules in force were put in force (none before the first
    /// configuration), for the admin API.
    loaded_at: Mutex<Option<SystemTime>>,
}

impl Default for RulesHandle {
    /// No rules yet: every domain unconfigured, nothing arrived.
    fn default() -> Self {
        Self::with(Rules::default(), Loads::default())
    }
}

impl RulesHandle {
    /// A handle that starts with `rules`, loaded from a configuration.
    pub fn new(rules: Rules) -> Self {
        let loads = Loads {
            arrived: true,
            in_force: !rules.is_empty(),
        };
        let handle = Self::with(rules, loads);
        handle.loaded_now();
        handle
    }

    fn with(rules: Rules, loads: Loads) -> Self {
        rules.export_zeros();
        Self(Arc::new(Shared {
            rules: ArcSwap::from_pointee(rules),
            loads: watch::Sender::new(loads),
            loaded_at: Mutex::new(None),
        }))
    }

    /// The rules in force now, and when they were put in force (`None`:
    /// no configuration has been yet).
    pub fn current_with_time(&self) -> (Arc<Rules>, Option<SystemTime>) {
        let loaded_at = self
            .0
            .loaded_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (self.current(), *loaded_at)
    }

    fn loaded_now(&self) {
        *self
            .0
            .loaded_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(SystemTime::now());
    }

    /// The rules now.
    pub fn current(&self) -> Arc<Rules> {
        self.0.rules.load_full()
    }

    /// Puts `rules` in force for every request that starts after this.
    pub fn replace(&self, rules: Rules) {
        let in_force = !rules.is_empty();
        rules.export_zeros();
        {
            // Held across the swap, so a reader sees the rules and their
            // time together.
            let mut loaded_at = self
                .0
                .loaded_at
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            self.0.rules.store(Arc::new(rules));
            *loaded_at = Some(SystemTime::now());
        }
        self.0.loads.send_if_modified(|loads| {
            let before = *loads;
            *loads = Loads {
                arrived: true,
                in_force,
            };
            *loads != before
        });
    }

    /// A configuration came and was rejected: the rules in force stay.
    pub fn rejected(&self) {
        self.0.loads.send_if_modified(|loads| {
            let before = loads.arrived;
            loads.arrived = true;
            !before
        });
    }

    /// What has been loaded so far, told again at each change.
    pub fn loads(&self) -> watch::Receiver<Loads> {
        self.0.loads.subscribe()
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

    #[test]
    fn loads_say_what_came_and_whether_rules_are_in_force() {
        let handle = RulesHandle::default();
        let loads = handle.loads();
        assert_eq!(*loads.borrow(), Loads::default());
        handle.rejected();
        assert_eq!(
            *loads.borrow(),
            Loads {
                arrived: true,
                in_force: false
            }
        );
        let mut rules = Rules::default();
        rules.domains.insert("edge".into(), Default::default());
        handle.replace(rules);
        assert!(loads.borrow().in_force);
        handle.rejected();
        assert!(loads.borrow().in_force, "a rejected change keeps the rules");
        handle.replace(Rules::default());
        assert!(!loads.borrow().in_force, "an empty configuration");
        assert!(!RulesHandle::new(Rules::default()).loads().borrow().in_force);
    }
}

//! Where the Envoy rules come from: the `--config` file or directory, read at
//! start (a bad configuration stops the start) and polled for changes after
//! (a bad change is logged with file, line and reason, and the rules in
//! force stay). Polling the content, rather than watching file events, sees
//! every way a file can change: editors' rename-into-place, Kubernetes
//! ConfigMap `..data` symlink swaps, network filesystems.

use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use tracing::{error, info};

use super::config_file::{ConfigError, FileSelection, Snapshot};
use super::rules::Rules;
use crate::metrics;

/// The rules in force, shared by every request and swapped whole on reload.
#[derive(Clone, Default)]
pub struct RulesHandle(Arc<RwLock<Arc<Rules>>>);

impl RulesHandle {
    /// A source that starts with `rules`.
    pub fn new(rules: Rules) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(rules))))
    }

    /// The rules now; a request keeps the set it started with.
    pub fn current(&self) -> Arc<Rules> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn replace(&self, rules: Rules) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(rules);
    }
}

/// A configuration path and what was last read from it.
pub struct ConfigSource {
    path: PathBuf,
    selection: FileSelection,
    last: Snapshot,
}

impl ConfigSource {
    /// Reads and compiles `path`; any error is the caller's to report.
    pub fn load(path: PathBuf, selection: FileSelection) -> Result<(Self, Rules), ConfigError> {
        let snapshot = Snapshot::read(&path, selection)?;
        let rules = snapshot.compile()?;
        metrics::config_load(true);
        info!(
            path = %path.display(),
            files = snapshot.files.len(),
            domains = rules.domains.len(),
            policies = rules.policies.len(),
            "loaded rate limit configuration"
        );
        Ok((
            Self {
                path,
                selection,
                last: snapshot,
            },
            rules,
        ))
    }

    /// Polls every `interval` for ever, swapping in each change that
    /// compiles. Runs as a task; the server aborts it at shutdown.
    pub async fn watch(mut self, rules: RulesHandle, interval: Duration) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            self.poll(&rules);
        }
    }

    /// One look at the files: reload if they changed since the last look.
    fn poll(&mut self, rules: &RulesHandle) {
        let snapshot = match Snapshot::read(&self.path, self.selection) {
            Ok(snapshot) => snapshot,
            Err(err) => {
                // Mid-swap or deleted: report once, keep the rules.
                let missing = Snapshot { files: Vec::new() };
                if self.last != missing {
                    error!(error = %err, "cannot read the configuration; the rules in force stay");
                    self.last = missing;
                }
                return;
            }
        };
        if snapshot == self.last {
            return;
        }
        match snapshot.compile() {
            Ok(compiled) => {
                info!(
                    path = %self.path.display(),
                    files = snapshot.files.len(),
                    domains = compiled.domains.len(),
                    policies = compiled.policies.len(),
                    "reloaded rate limit configuration"
                );
                rules.replace(compiled);
                metrics::config_reload(true);
            }
            Err(err) => {
                metrics::config_reload(false);
                error!(
                    file = %err.file,
                    line = err.line,
                    reason = %err.reason,
                    "configuration rejected; the rules in force stay"
                );
            }
        }
        // Either way, report this content once, not on every poll.
        self.last = snapshot;
    }
}

//! Where the rules come from: the `--config` file or directory, read at
//! start (a bad configuration stops the start, unless the start goes on
//! without rules: see [`ConfigSource::pending`]) and polled for changes after
//! (a bad change is logged with file, line and reason, and the rules in
//! force stay). Polling the content, rather than watching file events, sees
//! every way a file can change: editors' rename-into-place, Kubernetes
//! ConfigMap `..data` symlink swaps, network filesystems.

use std::path::PathBuf;
use std::time::Duration;

use tracing::{error, info};

use super::directory::{FileSelection, Files};
use super::handle::RulesHandle;
use super::{Rules, document};
use crate::config_error::ConfigError;
use crate::metrics;

/// A configuration path and what was last read from it.
pub(crate) struct ConfigSource {
    path: PathBuf,
    selection: FileSelection,
    last: Files,
}

impl ConfigSource {
    /// Reads and compiles `path`; any error is the caller's to report.
    pub(crate) fn load(
        path: PathBuf,
        selection: FileSelection,
    ) -> Result<(Self, Rules), ConfigError> {
        let snapshot = Files::read(&path, selection)?;
        let rules = document::compile(&snapshot.files)?;
        crate::stats::config_load(true);
        info!(
            path = %path.display(),
            files = snapshot.files.len(),
            domains = rules.domain_count(),
            policies = rules.policy_count(),
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

    /// A source whose first load failed, started anyway (the rules stay
    /// empty): polling loads the first configuration that compiles.
    pub(crate) fn pending(path: PathBuf, selection: FileSelection) -> Self {
        Self {
            path,
            selection,
            last: Files::default(),
        }
    }

    /// Polls every `interval` for ever, swapping in each change that
    /// compiles. Runs as a task; the server aborts it at shutdown.
    pub(crate) async fn watch(mut self, rules: RulesHandle, interval: Duration) {
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
        let snapshot = match Files::read(&self.path, self.selection) {
            Ok(snapshot) => snapshot,
            Err(err) => {
                // Mid-swap or deleted: report once, keep the rules.
                let missing = Files::default();
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
        match document::compile(&snapshot.files) {
            Ok(compiled) => {
                info!(
                    path = %self.path.display(),
                    files = snapshot.files.len(),
                    domains = compiled.domain_count(),
                    policies = compiled.policy_count(),
                    "reloaded rate limit configuration"
                );
                rules.replace(compiled);
                metrics::config_reload(true);
                crate::stats::config_load(true);
            }
            Err(err) => {
                rules.rejected();
                metrics::config_reload(false);
                crate::stats::config_load(false);
                if let ConfigError::File { file, line, reason } = &err {
                    error!(
                        file = %file,
                        line,
                        reason = %reason,
                        "configuration rejected; the rules in force stay"
                    );
                } else {
                    error!(error = %err, "configuration rejected; the rules in force stay");
                }
            }
        }
        // Either way, report this content once, not on every poll.
        self.last = snapshot;
    }
}

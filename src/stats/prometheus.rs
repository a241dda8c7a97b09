//! Upstream's statistics as Prometheus series, served with ratelimitd's own
//! at `--metrics-listen`: each statistic's statsd name (its tags in it, as
//! upstream's Prometheus sink sees it) goes through the statsd_exporter
//! mapping once, when its handle is made, and the handle then counts into
//! the series it names. Unlike upstream, whose series move only when its
//! statistics are flushed, they move as things happen.

use std::collections::HashMap;
use std::sync::Mutex;

use metrics::Label;
use tracing::warn;

use super::mapper::{Mapped, Mapping, Series, StatKind};

/// The mapping, and each series name's kind so far (one name is one kind:
/// a second kind under it is dropped, as statsd_exporter drops it).
#[derive(Debug)]
pub struct Prometheus {
    mapping: Mapping,
    kinds: Mutex<HashMap<String, StatKind>>,
}

/// A statistic's series: what its values are multiplied by, and where
/// they go.
pub struct Scaled<T> {
    /// The handle.
    pub handle: T,
    /// The mapping's `scale`, or 1.
    pub scale: f64,
}

impl Prometheus {
    /// Series named by `mapping`.
    pub fn new(mapping: Mapping) -> Self {
        Self {
            mapping,
            kinds: Mutex::new(HashMap::new()),
        }
    }

    /// The mapping.
    pub fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// The series of counter `stat`, unless dropped.
    pub fn counter(&self, stat: &str) -> Option<Scaled<metrics::Counter>> {
        let (series, labels) = self.series(stat, StatKind::Counter)?;
        if let Some(help) = series.help.clone() {
            metrics::describe_counter!(series.name.clone(), help);
        }
        Some(Scaled {
            handle: metrics::counter!(series.name, labels),
            scale: series.scale.unwrap_or(1.0),
        })
    }

    /// The series of gauge `stat`, unless dropped.
    pub fn gauge(&self, stat: &str) -> Option<Scaled<metrics::Gauge>> {
        let (series, labels) = self.series(stat, StatKind::Gauge)?;
        if let Some(help) = series.help.clone() {
            metrics::describe_gauge!(series.name.clone(), help);
        }
        Some(Scaled {
            handle: metrics::gauge!(series.name, labels),
            scale: series.scale.unwrap_or(1.0),
        })
    }

    /// The histogram or summary of timer `stat`, unless dropped.
    pub fn timer(&self, stat: &str) -> Option<Scaled<metrics::Histogram>> {
        let (series, labels) = self.series(stat, StatKind::Timer)?;
        if let Some(help) = series.help.clone() {
            metrics::describe_histogram!(series.name.clone(), help);
        }
        Some(Scaled {
            handle: metrics::histogram!(series.name, labels),
            scale: series.scale.unwrap_or(1.0),
        })
    }

    fn series(&self, stat: &str, kind: StatKind) -> Option<(Series, Vec<Label>)> {
        let Mapped::Series(series) = self.mapping.map(stat, kind) else {
            return None;
        };
        let mut kinds = self
            .kinds
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let known = *kinds.entry(series.name.clone()).or_insert(kind);
        drop(kinds);
        if known != kind {
            warn!(
                statistic = stat,
                series = %series.name,
                "a statistic maps to a Prometheus name another kind of statistic has; dropped"
            );
            return None;
        }
        let labels = series
            .labels
            .iter()
            .map(|(key, value)| Label::new(key.clone(), value.clone()))
            .collect();
        Some((series, labels))
    }
}

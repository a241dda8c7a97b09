//! The statistics themselves: one cell per statsd name (as gostats keeps
//! one per name), made once and shared by every handle to that name, and
//! recorded into with atomics only. The statsd sink reads the cells at each
//! flush; the Prometheus series, when served, are counted into as the cells
//! are. A cell nothing holds any more (a rule reloaded away, a request's
//! name the cache let go) is forgotten once its last change is flushed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::names::Tags;
use super::prometheus::{Prometheus, Scaled};

/// Timer observations waiting for the statsd sink, at most.
pub(crate) const TIMER_QUEUE: usize = 65_536;

/// Where timer observations wait for the statsd sink.
pub(crate) type TimerSender = tokio::sync::mpsc::Sender<(Arc<TimerCell>, u64)>;
/// What the statsd sink takes them from.
pub(crate) type TimerQueue = tokio::sync::mpsc::Receiver<(Arc<TimerCell>, u64)>;

/// A cell's Prometheus series, made when the cell first changes (so that,
/// as upstream's, a statistic that never moved has no series).
struct Series<T> {
    prometheus: Option<Arc<Prometheus>>,
    name: Arc<str>,
    made: OnceLock<Option<Scaled<T>>>,
}

impl<T> Series<T> {
    fn new(prometheus: Option<&Arc<Prometheus>>, name: &Arc<str>) -> Self {
        Self {
            prometheus: prometheus.cloned(),
            name: name.clone(),
            made: OnceLock::new(),
        }
    }

    fn get(&self, make: impl FnOnce(&Prometheus, &str) -> Option<Scaled<T>>) -> Option<&Scaled<T>> {
        let prometheus = self.prometheus.as_deref()?;
        self.made
            .get_or_init(|| make(prometheus, &self.name))
            .as_ref()
    }
}

/// One statsd name's counter.
pub struct CounterCell {
    /// The name without the tags (DogStatsD sends those apart).
    pub base: Arc<str>,
    value: AtomicU64,
    sent: AtomicU64,
    prometheus: Series<metrics::Counter>,
}

impl CounterCell {
    /// What was added since the last call (gostats' latch).
    pub fn latch(&self) -> u64 {
        let value = self.value.load(Ordering::Relaxed);
        let sent = self.sent.swap(value, Ordering::Relaxed);
        value.wrapping_sub(sent)
    }
}

/// One statsd name's gauge.
pub struct GaugeCell {
    /// The name without the tags.
    pub base: Arc<str>,
    value: AtomicU64,
    prometheus: Series<metrics::Gauge>,
}

impl GaugeCell {
    /// The value now.
    pub fn value(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

/// One statsd name's timer.
pub struct TimerCell {
    /// The name with the tags.
    pub name: Arc<str>,
    /// The name without the tags.
    pub base: Arc<str>,
    queue: Option<TimerSender>,
    dropped: Arc<AtomicU64>,
    prometheus: Series<metrics::Histogram>,
}

/// A counter; does nothing when statistics are off.
#[derive(Clone, Default)]
pub struct Counter(Option<Arc<CounterCell>>);

impl Counter {
    /// Adds `n`.
    pub fn add(&self, n: u64) {
        let Some(cell) = &self.0 else { return };
        if n == 0 {
            return;
        }
        cell.value.fetch_add(n, Ordering::Relaxed);
        if let Some(series) = cell.prometheus.get(Prometheus::counter) {
            series.handle.increment(scaled(n, series.scale));
        }
    }

    /// Adds one.
    pub fn inc(&self) {
        self.add(1);
    }

    /// The total so far (0 when off).
    pub fn value(&self) -> u64 {
        self.0
            .as_ref()
            .map_or(0, |cell| cell.value.load(Ordering::Relaxed))
    }
}

/// A gauge of unsigned values, as gostats' are; does nothing when off.
#[derive(Clone, Default)]
pub struct Gauge(Option<Arc<GaugeCell>>);

impl Gauge {
    /// Up by `n`.
    pub fn add(&self, n: u64) {
        let Some(cell) = &self.0 else { return };
        let now = cell.value.fetch_add(n, Ordering::Relaxed).wrapping_add(n);
        Self::show(cell, now);
    }

    /// Down by `n`.
    pub fn sub(&self, n: u64) {
        let Some(cell) = &self.0 else { return };
        let now = cell.value.fetch_sub(n, Ordering::Relaxed).wrapping_sub(n);
        Self::show(cell, now);
    }

    /// Whether statistics are on (the gauge records).
    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Set to `value`.
    pub fn set(&self, value: u64) {
        let Some(cell) = &self.0 else { return };
        cell.value.store(value, Ordering::Relaxed);
        Self::show(cell, value);
    }

    /// The value now (0 when off).
    pub fn value(&self) -> u64 {
        self.0.as_ref().map_or(0, |cell| cell.value())
    }

    fn show(cell: &GaugeCell, value: u64) {
        if let Some(series) = cell.prometheus.get(Prometheus::gauge) {
            series.handle.set(value as f64 * series.scale);
        }
    }
}

/// A timer of milliseconds; does nothing when off.
#[derive(Clone, Default)]
pub struct Timer(Option<Arc<TimerCell>>);

impl Timer {
    /// One observation of `millis` milliseconds. Queued for statsd without
    /// waiting: a full queue drops it, and counts the drop.
    pub fn record_millis(&self, millis: u64) {
        let Some(cell) = &self.0 else { return };
        if let Some(series) = cell.prometheus.get(Prometheus::timer) {
            series.handle.record(millis as f64 * series.scale);
        }
        if let Some(queue) = &cell.queue
            && queue.try_send((cell.clone(), millis)).is_err()
        {
            cell.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Every statistic by statsd name, and where they go besides statsd.
pub struct Registry {
    tags: Tags,
    prometheus: Option<Arc<Prometheus>>,
    timers: Option<TimerSender>,
    /// Timer observations the full queue dropped.
    pub timers_dropped: Arc<AtomicU64>,
    counters: Mutex<HashMap<Arc<str>, Arc<CounterCell>>>,
    gauges: Mutex<HashMap<Arc<str>, Arc<GaugeCell>>>,
}

impl Registry {
    /// Statistics tagged `tags`, counted into `prometheus` when given;
    /// timers queued on `timers` for statsd when given.
    pub fn new(tags: Tags, prometheus: Option<Prometheus>, timers: Option<TimerSender>) -> Self {
        Self {
            tags,
            prometheus: prometheus.map(Arc::new),
            timers,
            timers_dropped: Arc::default(),
            counters: Mutex::default(),
            gauges: Mutex::default(),
        }
    }

    /// The tags every statistic carries.
    pub fn tags(&self) -> &Tags {
        &self.tags
    }

    /// The counter `base` (its tags added), made on first use.
    pub fn counter(&self, base: &str) -> Counter {
        let name = self.tags.serialize(base);
        let mut counters = lock(&self.counters);
        if let Some(cell) = counters.get(name.as_str()) {
            return Counter(Some(cell.clone()));
        }
        let name: Arc<str> = name.into();
        let cell = Arc::new(CounterCell {
            base: base.into(),
            value: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            prometheus: Series::new(self.prometheus.as_ref(), &name),
        });
        counters.insert(name, cell.clone());
        Counter(Some(cell))
    }

    /// The gauge `base` (its tags added), made on first use.
    pub fn gauge(&self, base: &str) -> Gauge {
        let name = self.tags.serialize(base);
        let mut gauges = lock(&self.gauges);
        if let Some(cell) = gauges.get(name.as_str()) {
            return Gauge(Some(cell.clone()));
        }
        let name: Arc<str> = name.into();
        let cell = Arc::new(GaugeCell {
            base: base.into(),
            value: AtomicU64::new(0),
            prometheus: Series::new(self.prometheus.as_ref(), &name),
        });
        gauges.insert(name, cell.clone());
        Gauge(Some(cell))
    }

    /// The timer `base` (its tags added). Timers hold no value between
    /// flushes: each observation is sent.
    pub fn timer(&self, base: &str) -> Timer {
        let name: Arc<str> = self.tags.serialize(base).into();
        Timer(Some(Arc::new(TimerCell {
            prometheus: Series::new(self.prometheus.as_ref(), &name),
            name,
            base: base.into(),
            queue: self.timers.clone(),
            dropped: self.timers_dropped.clone(),
        })))
    }

    /// Each counter's name and cell, for a flush; counters nothing else
    /// holds, with nothing left to send, are forgotten.
    pub fn counters(&self) -> Vec<(Arc<str>, Arc<CounterCell>)> {
        let mut counters = lock(&self.counters);
        counters.retain(|_, cell| {
            Arc::strong_count(cell) > 1
                || cell.value.load(Ordering::Relaxed) != cell.sent.load(Ordering::Relaxed)
        });
        counters
            .iter()
            .map(|(name, cell)| (name.clone(), cell.clone()))
            .collect()
    }

    /// Each gauge's name and cell, for a flush; gauges nothing else holds
    /// are forgotten.
    pub fn gauges(&self) -> Vec<(Arc<str>, Arc<GaugeCell>)> {
        let mut gauges = lock(&self.gauges);
        gauges.retain(|_, cell| Arc::strong_count(cell) > 1);
        gauges
            .iter()
            .map(|(name, cell)| (name.clone(), cell.clone()))
            .collect()
    }
}

/// `n` times `scale`, as a count.
fn scaled(n: u64, scale: f64) -> u64 {
    if scale == 1.0 {
        n
    } else {
        (n as f64 * scale).round() as u64
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cell_per_name_counted_as_gostats_latches() {
        let registry = Registry::new(Tags::default(), None, None);
        let a = registry.counter("x.a");
        let again = registry.counter("x.a");
        a.add(3);
        again.inc();
        let counters = registry.counters();
        assert_eq!(counters.len(), 1);
        assert_eq!(counters[0].1.latch(), 4);
        assert_eq!(counters[0].1.latch(), 0, "only what changed since");
        drop(counters);
        drop((a, again));
        assert!(registry.counters().is_empty(), "forgotten when unheld");
    }

    #[test]
    fn an_unheld_counter_stays_until_its_change_is_sent() {
        let registry = Registry::new(Tags::default(), None, None);
        registry.counter("x.b").add(2);
        let counters = registry.counters();
        assert_eq!(counters[0].1.latch(), 2);
        drop(counters);
        assert!(registry.counters().is_empty());
        let gauge = registry.gauge("x.g");
        gauge.add(5);
        gauge.sub(2);
        assert_eq!(registry.gauges()[0].1.value(), 3);
        gauge.set(7);
        assert_eq!(registry.gauges()[0].1.value(), 7);
    }
}

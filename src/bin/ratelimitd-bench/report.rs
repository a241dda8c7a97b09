//! What a run saw: per-worker tallies (each request's outcome, and an HDR
//! histogram of each call's latency) merged into one summary, printed as
//! text or JSON, and the live progress line.

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::json;

use crate::target::Outcomes;

/// Highest latency the histogram tells apart (longer calls count as this):
/// a minute, in microseconds.
const HIGHEST_LATENCY_US: u64 = 60_000_000;

/// One worker's (or the whole run's) measured calls, and the requests they
/// carried (one each, or a batch's).
pub(crate) struct Tally {
    /// One entry per call: a batch is answered as a whole.
    latency_us: Histogram<u64>,
    pub calls: u64,
    pub allowed: u64,
    pub denied: u64,
    pub errors: BTreeMap<String, u64>,
}

impl Tally {
    pub(crate) fn new() -> Self {
        Self {
            // Three significant digits from 1 µs to a minute: about 180 KiB.
            latency_us: Histogram::new_with_bounds(1, HIGHEST_LATENCY_US, 3)
                .expect("constant histogram bounds are valid"),
            calls: 0,
            allowed: 0,
            denied: 0,
            errors: BTreeMap::new(),
        }
    }

    pub(crate) fn record(&mut self, outcomes: Outcomes, latency: Duration) {
        let micros = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.latency_us.saturating_record(micros.max(1));
        self.calls += 1;
        self.allowed += outcomes.allowed;
        self.denied += outcomes.denied;
        for (kind, count) in outcomes.errors {
            *self.errors.entry(kind).or_default() += count;
        }
    }

    pub(crate) fn merge(&mut self, other: Tally) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
        self.calls += other.calls;
        self.allowed += other.allowed;
        self.denied += other.denied;
        for (kind, count) in other.errors {
            *self.errors.entry(kind).or_default() += count;
        }
    }

    pub(crate) fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    /// Requests decided (or failed): one per unary call, a batch's worth
    /// per `CheckLimits`. Each is one decision, however many limits it
    /// holds.
    pub(crate) fn requests(&self) -> u64 {
        self.allowed + self.denied + self.error_count()
    }
}

/// The whole run, for printing.
pub(crate) struct Summary {
    /// Lines describing what was driven and how: (label, value).
    pub setup: Vec<(&'static str, String)>,
    pub warm_up: Duration,
    /// From the end of the warm-up to the last measured answer.
    pub measured: Duration,
    pub tally: Tally,
}

impl Summary {
    /// Decisions (requests decided, or failed) per second: what compares
    /// across unary calls and batches.
    pub(crate) fn throughput(&self) -> f64 {
        self.per_second(self.tally.requests())
    }

    pub(crate) fn calls_per_second(&self) -> f64 {
        self.per_second(self.tally.calls)
    }

    fn per_second(&self, count: u64) -> f64 {
        let seconds = self.measured.as_secs_f64();
        if seconds > 0.0 {
            count as f64 / seconds
        } else {
            0.0
        }
    }

    /// Whether calls carried several requests each.
    fn batched(&self) -> bool {
        self.tally.calls != self.tally.requests()
    }

    fn percentile(&self, quantile: f64) -> u64 {
        self.tally.latency_us.value_at_quantile(quantile)
    }

    pub(crate) fn text(&self) -> String {
        let tally = &self.tally;
        let mut lines: Vec<String> = self
            .setup
            .iter()
            .map(|(label, value)| format!("{label:<12} {value}"))
            .collect();
        lines.push(format!(
            "{:<12} {:.2} s after {:.2} s warm-up",
            "measured",
            self.measured.as_secs_f64(),
            self.warm_up.as_secs_f64()
        ));
        lines.push(format!(
            "{:<12} {} ({:.0}/s)",
            "decisions",
            tally.requests(),
            self.throughput()
        ));
        if self.batched() {
            lines.push(format!(
                "{:<12} {} ({:.0}/s), latency below is per call",
                "calls",
                tally.calls,
                self.calls_per_second()
            ));
        }
        lines.push(format!("{:<12} {}", "allowed", tally.allowed));
        lines.push(format!("{:<12} {}", "denied", tally.denied));
        let errors: Vec<String> = tally
            .errors
            .iter()
            .map(|(kind, count)| format!("{count} {kind}"))
            .collect();
        lines.push(format!(
            "{:<12} {}{}",
            "errors",
            tally.error_count(),
            if errors.is_empty() {
                String::new()
            } else {
                format!(" ({})", errors.join(", "))
            }
        ));
        if tally.requests() > 0 {
            lines.push(format!(
                "{:<12} p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  mean {:.0}",
                "latency µs",
                self.percentile(0.5),
                self.percentile(0.9),
                self.percentile(0.99),
                self.percentile(0.999),
                tally.latency_us.max(),
                tally.latency_us.mean(),
            ));
        }
        lines.join("\n")
    }

    pub(crate) fn json(&self) -> serde_json::Value {
        let tally = &self.tally;
        let setup: serde_json::Map<String, serde_json::Value> = self
            .setup
            .iter()
            .map(|(label, value)| ((*label).to_owned(), json!(value)))
            .collect();
        // `requests` and `throughput_per_second` are the decisions, as
        // before batches (benches/load.sh reads them); `decisions` names
        // them plainly, beside the calls that carried them.
        json!({
            "setup": setup,
            "warm_up_seconds": self.warm_up.as_secs_f64(),
            "measured_seconds": self.measured.as_secs_f64(),
            "requests": tally.requests(),
            "throughput_per_second": self.throughput(),
            "decisions": tally.requests(),
            "decisions_per_second": self.throughput(),
            "calls": tally.calls,
            "calls_per_second": self.calls_per_second(),
            "allowed": tally.allowed,
            "denied": tally.denied,
            "errors": tally.error_count(),
            "error_kinds": tally.errors,
            "latency_us": {
                "p50": self.percentile(0.5),
                "p90": self.percentile(0.9),
                "p99": self.percentile(0.99),
                "p99_9": self.percentile(0.999),
                "max": tally.latency_us.max(),
                "mean": tally.latency_us.mean(),
            },
        })
    }
}

/// Every request's answer so far, warm-up included, for the progress line.
#[derive(Default)]
pub(crate) struct Progress {
    pub allowed: AtomicU64,
    pub denied: AtomicU64,
    pub errors: AtomicU64,
}

impl Progress {
    pub(crate) fn count(&self, outcomes: &Outcomes) {
        for (counter, count) in [
            (&self.allowed, outcomes.allowed),
            (&self.denied, outcomes.denied),
            (&self.errors, outcomes.error_count()),
        ] {
            if count > 0 {
                counter.fetch_add(count, Ordering::Relaxed);
            }
        }
    }

    fn snapshot(&self) -> [u64; 3] {
        [
            self.allowed.load(Ordering::Relaxed),
            self.denied.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        ]
    }

    /// Rewrites one status line on stderr every second until dropped by
    /// the caller (abort the task).
    pub(crate) async fn show(&self) {
        let started = tokio::time::Instant::now();
        let mut ticks = tokio::time::interval(Duration::from_secs(1));
        ticks.tick().await;
        let mut last = 0;
        loop {
            ticks.tick().await;
            let [allowed, denied, errors] = self.snapshot();
            let total = allowed + denied + errors;
            let mut stderr = std::io::stderr().lock();
            let _ = write!(
                stderr,
                "\r\x1b[2K{:>5.0}s  {:>9}/s  allowed {allowed}  denied {denied}  errors {errors}",
                started.elapsed().as_secs_f64(),
                total - last,
            );
            let _ = stderr.flush();
            last = total;
        }
    }
}

/// Clears the progress line.
pub(crate) fn clear_progress() {
    let mut stderr = std::io::stderr().lock();
    let _ = write!(stderr, "\r\x1b[2K");
    let _ = stderr.flush();
}

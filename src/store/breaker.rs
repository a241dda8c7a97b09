//! A circuit breaker in front of Redis. After `threshold` failures in a row
//! it opens: calls stop waiting on Redis and fail at once (so the failure
//! policy answers within microseconds instead of a timeout each), until a
//! probe, the health check's PING, finds Redis answering again.
//!
//! Counting failures in a row (not a rate) keeps it simple and makes one slow
//! command under load harmless; the health probe, not live traffic, closes
//! it, so a dead Redis is not hammered by every request. A breaker made
//! [`CircuitBreaker::with_trials`] also lets one call through now and then
//! while open, and closes when that call succeeds: for a Redis Cluster
//! node, whose breaker the probe cannot close while any other node is down
//! (its PING goes to every primary).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::{info, warn};

/// Opens after a number of failures in a row, so callers stop waiting on a Redis that is down; the health probe closes it.
#[derive(Debug)]
pub struct CircuitBreaker {
    failures_in_a_row: AtomicU32,
    open: AtomicBool,
    threshold: u32,
    /// While open, one call every so often goes through as a trial.
    trials: Option<Trials>,
}

/// When the next trial call may go through, in microseconds since `epoch`.
#[derive(Debug)]
struct Trials {
    every: Duration,
    epoch: Instant,
    next: AtomicU64,
}

impl Trials {
    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    fn every(&self) -> u64 {
        u64::try_from(self.every.as_micros()).unwrap_or(u64::MAX)
    }

    /// The first trial comes one interval after the breaker opens.
    fn opened(&self) {
        self.next
            .store(self.now().saturating_add(self.every()), Ordering::Relaxed);
    }

    /// Is a trial due? If so, this call is it, and the next one is an
    /// interval away (one caller wins among those that ask at once).
    fn take(&self) -> bool {
        let now = self.now();
        let due = self.next.load(Ordering::Relaxed);
        now >= due
            && self
                .next
                .compare_exchange(
                    due,
                    now.saturating_add(self.every()),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }
}

impl CircuitBreaker {
    /// A breaker that opens after `threshold` failures in a row.
    pub fn new(threshold: u32) -> Self {
        Self {
            failures_in_a_row: AtomicU32::new(0),
            open: AtomicBool::new(false),
            threshold: threshold.max(1),
            trials: None,
        }
    }

    /// As [`CircuitBreaker::new`], letting one call through every `every`
    /// while open: the first to succeed closes it.
    pub fn with_trials(threshold: u32, every: Duration) -> Self {
        Self {
            trials: Some(Trials {
                every,
                epoch: Instant::now(),
                next: AtomicU64::new(0),
            }),
            ..Self::new(threshold)
        }
    }

    /// May a call go to Redis now?
    pub fn allows(&self) -> bool {
        !self.open.load(Ordering::Acquire) || self.trials.as_ref().is_some_and(Trials::take)
    }

    /// Is it open (calls fail at once, but for trials)?
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// Redis answered: the breaker closes.
    pub fn record_success(&self) {
        self.failures_in_a_row.store(0, Ordering::Relaxed);
        if self.open.swap(false, Ordering::AcqRel) {
            info!("Redis answers again: circuit breaker closed");
        }
    }

    /// Redis did not answer (in time).
    pub fn record_failure(&self) {
        let failures = self.failures_in_a_row.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= self.threshold && !self.open.swap(true, Ordering::AcqRel) {
            if let Some(trials) = &self.trials {
                trials.opened();
            }
            warn!(
                failures,
                "Redis keeps failing: circuit breaker open until it answers a probe"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_in_a_row_and_closes_on_success() {
        let breaker = CircuitBreaker::new(3);
        breaker.record_failure();
        breaker.record_failure();
        breaker.record_success();
        breaker.record_failure();
        breaker.record_failure();
        assert!(breaker.allows(), "a success in between resets the count");
        breaker.record_failure();
        assert!(!breaker.allows());
        breaker.record_success();
        assert!(breaker.allows());
    }

    #[test]
    fn without_trials_only_a_success_closes_it() {
        let breaker = CircuitBreaker::new(1);
        breaker.record_failure();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!breaker.allows());
    }

    #[test]
    fn an_open_breaker_with_trials_lets_one_call_through_per_interval() {
        let every = Duration::from_millis(200);
        let breaker = CircuitBreaker::with_trials(1, every);
        breaker.record_failure();
        assert!(!breaker.allows(), "no trial before an interval has passed");
        std::thread::sleep(every);
        assert!(breaker.allows(), "a trial once the interval has passed");
        assert!(!breaker.allows(), "one trial per interval");
        assert!(breaker.is_open());
        breaker.record_failure();
        assert!(!breaker.allows(), "a failed trial leaves it open");
        std::thread::sleep(every);
        assert!(breaker.allows());
        breaker.record_success();
        assert!(!breaker.is_open(), "a trial that succeeds closes it");
        assert!(breaker.allows() && breaker.allows());
    }
}

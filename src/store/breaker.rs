//! A circuit breaker in front of Redis. After `threshold` failures in a row
//! it opens: calls stop waiting on Redis and fail at once (so the failure
//! policy answers within microseconds instead of a timeout each), until a
//! probe, the health check's PING, finds Redis answering again.
//!
//! Counting failures in a row (not a rate) keeps it simple and makes one slow
//! command under load harmless; the health probe, not live traffic, closes
//! it, so a dead Redis is not hammered by every request.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use tracing::{info, warn};

/// Opens after a number of failures in a row, so callers stop waiting on a Redis that is down; the health probe closes it.
#[derive(Debug)]
pub struct CircuitBreaker {
    failures_in_a_row: AtomicU32,
    open: AtomicBool,
    threshold: u32,
}

impl CircuitBreaker {
    /// A breaker that opens after `threshold` failures in a row.
    pub fn new(threshold: u32) -> Self {
        Self {
            failures_in_a_row: AtomicU32::new(0),
            open: AtomicBool::new(false),
            threshold: threshold.max(1),
        }
    }

    /// May a call go to Redis now?
    pub fn allows(&self) -> bool {
        !self.open.load(Ordering::Acquire)
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
}

//! Sliding window (log): every unit spent is remembered with its time, and a
//! request is allowed while the units within the last `window` plus its cost
//! stay within the limit. Exact, with memory O(limit) per key. The Lua side
//! is `sliding_window.lua`; this file holds its in-memory twin.

use std::collections::VecDeque;

use super::MemoryChange;
use crate::limit::{Decision, Micros, RetryAfter, SlidingWindow};

/// The in-memory state of one key: the log as (stamp, units) runs, oldest
/// first. Runs instead of one entry per unit keep memory per request, not per
/// unit; the answers are the same as the script's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    runs: VecDeque<(Micros, u64)>,
    used: u64,
    /// Copies of the log's first run and last stamp (meaningless while it
    /// is empty). Most decisions need only these, and the log's buffer is
    /// rarely in cache (its two ends apart, among thousands of keys): read
    /// from here, it is touched only to prune or to count further back.
    oldest: (Micros, u64),
    newest: Micros,
}

impl State {
    fn push(&mut self, stamp: Micros, units: u64) {
        if self.runs.is_empty() {
            self.oldest = (stamp, units);
        }
        self.runs.push_back((stamp, units));
        self.used += units;
        self.newest = stamp;
    }

    fn pop_oldest(&mut self) {
        if let Some((_, units)) = self.runs.pop_front() {
            self.used -= units;
        }
        if let Some(&next) = self.runs.front() {
            self.oldest = next;
        }
    }

    /// The runs, oldest first, reading the buffer only past the first.
    fn runs(&self) -> impl Iterator<Item = (Micros, u64)> + '_ {
        let first = (!self.runs.is_empty()).then_some(self.oldest);
        first.into_iter().chain(self.runs.iter().skip(1).copied())
    }
}

/// The in-memory twin of `sliding_window.lua`. With `spend` false it
/// decides the same and adds nothing (it may still drop aged-out runs).
pub fn decide(
    params: &SlidingWindow,
    state: &mut Option<State>,
    now: Micros,
    cost: u64,
    spend: bool,
) -> (Decision, MemoryChange) {
    let limit = params.limit;
    let window = params.window.as_micros();
    let log = state.get_or_insert_with(State::default);
    let mut pruned = false;
    while !log.runs.is_empty() && log.oldest.0 + window <= now {
        log.pop_oldest();
        pruned = true;
    }
    let newest = (!log.runs.is_empty()).then_some(log.newest);
    let used = log.used;
    let remaining = limit.saturating_sub(used);
    let reset_after = newest.map_or(0, |stamp| stamp + window - now);
    let unchanged = if log.runs.is_empty() {
        *state = None;
        MemoryChange::Updated
    } else if pruned {
        MemoryChange::Updated
    } else {
        MemoryChange::None
    };
    let denied = |retry_after| Decision {
        allowed: false,
        limit,
        remaining,
        reset_after,
        retry_after,
        degraded: false,
    };
    if cost > limit {
        return (denied(RetryAfter::Never), unchanged);
    }
    if used + cost > limit {
        // Enough of the oldest units must leave: the k-th oldest is the last.
        let k = used + cost - limit;
        let mut seen = 0;
        let mut leaves_at = now;
        if let Some(log) = state.as_ref() {
            for (stamp, units) in log.runs() {
                seen += units;
                if seen >= k {
                    leaves_at = stamp + window;
                    break;
                }
            }
        }
        return (denied(RetryAfter::After(leaves_at - now)), unchanged);
    }
    let mut decision = Decision {
        allowed: true,
        limit,
        remaining: remaining - cost,
        reset_after,
        retry_after: RetryAfter::After(0),
        degraded: false,
    };
    if cost == 0 || !spend {
        return (decision, unchanged);
    }
    let stamp = match newest {
        Some(newest) if newest >= now => newest + 1,
        _ => now,
    };
    state.get_or_insert_with(State::default).push(stamp, cost);
    decision.reset_after = stamp + window - now;
    (
        decision,
        MemoryChange::Written {
            expires_at: stamp + window,
        },
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn params(limit: u64, window_ms: u64) -> SlidingWindow {
        SlidingWindow::new(limit, Duration::from_millis(window_ms)).unwrap()
    }

    #[test]
    fn units_leave_the_window_one_run_at_a_time() {
        let p = params(3, 1000);
        let mut state = None;
        assert!(decide(&p, &mut state, 0, 2, true).0.allowed);
        assert!(decide(&p, &mut state, 400_000, 1, true).0.allowed);
        let (d, _) = decide(&p, &mut state, 500_000, 1, true);
        assert!(!d.allowed);
        // The two units spent at 0 leave at 1 s.
        assert_eq!(d.retry_after, RetryAfter::After(500_000));
        assert_eq!(d.reset_after, 900_000);
        let (d, _) = decide(&p, &mut state, 1_000_000, 2, true);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
    }

    #[test]
    fn a_denial_names_the_time_enough_units_have_left() {
        let p = params(4, 1000);
        let mut state = None;
        for t in [0, 100_000, 200_000, 300_000] {
            assert!(decide(&p, &mut state, t, 1, true).0.allowed);
        }
        // Cost 3 needs the three oldest gone: the one stamped 200 ms.
        let (d, _) = decide(&p, &mut state, 300_000, 3, true);
        assert_eq!(d.retry_after, RetryAfter::After(900_000));
    }

    #[test]
    fn after_pruning_the_next_run_is_the_oldest() {
        let p = params(2, 1000);
        let mut state = None;
        assert!(decide(&p, &mut state, 0, 1, true).0.allowed);
        assert!(decide(&p, &mut state, 500_000, 1, true).0.allowed);
        // The run at 0 leaves; the one at 500 ms is now the first to go.
        assert!(decide(&p, &mut state, 1_000_000, 1, true).0.allowed);
        let (d, _) = decide(&p, &mut state, 1_200_000, 1, true);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, RetryAfter::After(300_000));
        assert_eq!(d.reset_after, 800_000);
        let (d, _) = decide(&p, &mut state, 1_200_000, 2, true);
        assert_eq!(d.retry_after, RetryAfter::After(800_000));
    }

    #[test]
    fn stamps_never_go_backwards_when_the_clock_does() {
        let p = params(10, 1000);
        let mut state = None;
        decide(&p, &mut state, 500_000, 1, true);
        let (d, change) = decide(&p, &mut state, 400_000, 1, true);
        assert!(d.allowed);
        assert_eq!(
            change,
            MemoryChange::Written {
                expires_at: 1_500_001
            }
        );
    }

    #[test]
    fn an_emptied_log_is_dropped() {
        let p = params(1, 10);
        let mut state = None;
        decide(&p, &mut state, 0, 1, true);
        let (d, _) = decide(&p, &mut state, 10_000, 0, true);
        assert!(d.allowed);
        assert!(state.is_none());
    }
}

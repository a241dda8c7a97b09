//! Sliding window (log): every request that spent is remembered with its
//! time and its units, and a request is allowed while the units within the
//! last `window` plus its cost stay within the limit. Exact, with memory
//! O(requests in the window) per key, whatever their cost. The Lua side is
//! `sliding_window.lua`; this file holds its in-memory twin.

use std::collections::VecDeque;

use super::parameters::{Mark, Parameters, Rate, ScriptValue, Shown, WindowStart};
use super::{Spend, written_for};
use crate::limit::{
    Decision, InvalidArgument, LimitPerWindow, MAX_SLIDING_WINDOW_LIMIT, Micros, RetryAfter,
};
use crate::store::MemoryChange;

/// At most `limit` units within any span of `window`: the sliding log,
/// whose log holds one entry per unit spent (hence its lower bound).
pub type SlidingWindow = LimitPerWindow<MAX_SLIDING_WINDOW_LIMIT>;

/// The in-memory state of one key: the log, oldest first, as (stamp,
/// running total of units after this entry). As in the script, running
/// totals make every answer a subtraction or a binary search, so a decision
/// costs O(log entries) whatever the cost or the limit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    entries: VecDeque<(Micros, u64)>,
    /// The running total before the oldest entry.
    base: u64,
    /// Copies of the oldest entry's stamp and the newest entry (meaningless
    /// while the log is empty). Most decisions need only these, and the
    /// log's buffer is rarely in cache (its two ends apart, among thousands
    /// of keys): read from here, it is touched only to prune or to search.
    oldest_stamp: Micros,
    newest: (Micros, u64),
}

impl State {
    pub(super) fn snapshot(&self) -> Snapshot {
        let mut before = self.base;
        let entries = self
            .entries
            .iter()
            .map(|&(stamp, total)| {
                let units = total - before;
                before = total;
                (stamp, units)
            })
            .collect();
        Snapshot { entries }
    }

    /// The bytes the log's buffer holds, used or not.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * std::mem::size_of::<(Micros, u64)>()
    }

    fn push(&mut self, stamp: Micros, units: u64) {
        let total = if self.entries.is_empty() {
            self.oldest_stamp = stamp;
            self.base + units
        } else {
            self.newest.1 + units
        };
        self.entries.push_back((stamp, total));
        self.newest = (stamp, total);
    }

    /// Drops the entries that have left the window at `now`; true if any.
    fn prune(&mut self, now: Micros, window: Micros) -> bool {
        if self.entries.is_empty() || self.oldest_stamp + window > now {
            return false;
        }
        let gone = self
            .entries
            .partition_point(|&(stamp, _)| stamp + window <= now);
        if let Some(&(_, total)) = gone.checked_sub(1).and_then(|last| self.entries.get(last)) {
            self.base = total;
        }
        self.entries.drain(..gone);
        if let Some(&(stamp, _)) = self.entries.front() {
            self.oldest_stamp = stamp;
        }
        true
    }

    fn used(&self) -> u64 {
        if self.entries.is_empty() {
            0
        } else {
            self.newest.1 - self.base
        }
    }

    /// The stamp of the oldest entry whose leaving frees at least `units`.
    fn freeing(&self, units: u64) -> Option<Micros> {
        let at = self
            .entries
            .partition_point(|&(_, total)| total - self.base < units);
        self.entries.get(at).map(|&(stamp, _)| stamp)
    }
}

/// A log as plain values, the same in both twins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The log's entries, oldest first: (stamp, units).
    pub entries: Vec<(Micros, u64)>,
}

/// The in-memory twin of `sliding_window.lua`. With `spend` false it
/// decides the same and adds nothing (it may still drop aged-out entries).
pub fn decide(
    params: &SlidingWindow,
    state: &mut Option<State>,
    now: Micros,
    cost: u64,
    spend: bool,
) -> (Decision, MemoryChange) {
    let limit = params.limit();
    let window = params.window().as_micros();
    let log = state.get_or_insert_with(State::default);
    let pruned = log.prune(now, window);
    let newest = (!log.entries.is_empty()).then_some(log.newest.0);
    let used = log.used();
    let remaining = limit.saturating_sub(used);
    let reset_after = newest.map_or(Micros::ZERO, |stamp| stamp + window - now);
    let unchanged = if log.entries.is_empty() {
        *state = None;
        MemoryChange::Updated
    } else if pruned {
        MemoryChange::Updated
    } else {
        MemoryChange::None
    };
    let denied = |retry_after| Decision::denied(limit, remaining, reset_after, retry_after);
    if cost > limit {
        return (denied(RetryAfter::Never), unchanged);
    }
    if used + cost > limit {
        // Enough units must leave: the oldest entry whose leaving frees them.
        let leaves_at = state
            .as_ref()
            .and_then(|log| log.freeing(used + cost - limit))
            .map_or(now, |stamp| stamp + window);
        return (denied(RetryAfter::After(leaves_at - now)), unchanged);
    }
    if cost == 0 || !spend {
        return (
            Decision::allowed(limit, remaining - cost, reset_after),
            unchanged,
        );
    }
    let stamp = match newest {
        // Stamps only move forward, whatever the clock does.
        Some(newest) if newest >= now => newest + Micros::from_micros(1),
        _ => now,
    };
    state.get_or_insert_with(State::default).push(stamp, cost);
    let reset_after = stamp + window - now;
    (
        Decision::allowed(limit, remaining - cost, reset_after),
        written_for(now, reset_after),
    )
}

/// What the lists made from the registry need of its parameters.
impl Parameters for SlidingWindow {
    type State = State;
    /// At most `limit` per `per`.
    fn from_rate(rate: Rate, _start: WindowStart) -> Result<Self, InvalidArgument> {
        Self::new(rate.limit, rate.per)
    }
    fn limit(&self) -> u64 {
        self.limit()
    }
    fn decide(
        &self,
        state: &mut Option<State>,
        now: Micros,
        cost: u64,
        spend: Spend,
    ) -> (Decision, MemoryChange) {
        decide(self, state, now, cost, spend != Spend::Dry)
    }
    fn script_values(&self) -> [ScriptValue; 3] {
        [
            ScriptValue::Whole(self.limit()),
            ScriptValue::Whole(self.window().as_micros().as_micros()),
            ScriptValue::Whole(0),
        ]
    }
    /// The stamp of the entry the spend added.
    fn mark(&self) -> Mark {
        Mark::Entry
    }
    /// The newest entry's stamp: that of the entry the spend added.
    fn spend_mark(&self, state: &State) -> u64 {
        state.newest.0.as_micros()
    }
    fn shown(&self) -> Shown {
        Shown {
            window: Some(self.window()),
            ..Shown::default()
        }
    }
    fn span(&self) -> Micros {
        self.window().as_micros()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::SlidingWindowCounter;

    /// A time of `micros` microseconds.
    const fn us(micros: u64) -> Micros {
        Micros::from_micros(micros)
    }

    fn params(limit: u64, window_ms: u64) -> SlidingWindow {
        SlidingWindow::new(limit, Duration::from_millis(window_ms)).unwrap()
    }

    #[test]
    fn units_leave_the_window_one_entry_at_a_time() {
        let p = params(3, 1000);
        let mut state = None;
        assert!(decide(&p, &mut state, Micros::ZERO, 2, true).0.is_allowed());
        assert!(decide(&p, &mut state, us(400_000), 1, true).0.is_allowed());
        let (d, _) = decide(&p, &mut state, us(500_000), 1, true);
        assert!(!d.is_allowed());
        // The two units spent at 0 leave at 1 s.
        assert_eq!(d.retry_after(), RetryAfter::After(us(500_000)));
        assert_eq!(d.reset_after(), us(900_000));
        let (d, _) = decide(&p, &mut state, us(1_000_000), 2, true);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
    }

    #[test]
    fn a_denial_names_the_time_enough_units_have_left() {
        let p = params(4, 1000);
        let mut state = None;
        for t in [0, 100, 200, 300] {
            let t = Micros::from_millis(t);
            assert!(decide(&p, &mut state, t, 1, true).0.is_allowed());
        }
        // Cost 3 needs the three oldest gone: the one stamped 200 ms.
        let (d, _) = decide(&p, &mut state, us(300_000), 3, true);
        assert_eq!(d.retry_after(), RetryAfter::After(us(900_000)));
    }

    #[test]
    fn after_pruning_the_next_entry_is_the_oldest() {
        let p = params(2, 1000);
        let mut state = None;
        assert!(decide(&p, &mut state, Micros::ZERO, 1, true).0.is_allowed());
        assert!(decide(&p, &mut state, us(500_000), 1, true).0.is_allowed());
        // The entry at 0 leaves; the one at 500 ms is now the first to go.
        assert!(
            decide(&p, &mut state, us(1_000_000), 1, true)
                .0
                .is_allowed()
        );
        let (d, _) = decide(&p, &mut state, us(1_200_000), 1, true);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), RetryAfter::After(us(300_000)));
        assert_eq!(d.reset_after(), us(800_000));
        let (d, _) = decide(&p, &mut state, us(1_200_000), 2, true);
        assert_eq!(d.retry_after(), RetryAfter::After(us(800_000)));
    }

    #[test]
    fn stamps_never_go_backwards_when_the_clock_does() {
        let p = params(10, 1000);
        let mut state = None;
        decide(&p, &mut state, us(500_000), 1, true);
        let (d, change) = decide(&p, &mut state, us(400_000), 1, true);
        assert!(d.is_allowed());
        // Stamped 500 001, the entry counts until 1 500 001; the key, like
        // Redis's (PEXPIRE 1101 ms at 400 ms), lives through 1 501 ms.
        assert_eq!(d.reset_after(), us(1_100_001));
        assert_eq!(
            change,
            MemoryChange::Written {
                expires_at: us(1_502_000)
            }
        );
    }

    #[test]
    fn an_emptied_log_is_dropped() {
        let p = params(1, 10);
        let mut state = None;
        decide(&p, &mut state, Micros::ZERO, 1, true);
        let (d, _) = decide(&p, &mut state, us(10_000), 0, true);
        assert!(d.is_allowed());
        assert!(state.is_none());
    }

    #[test]
    fn a_request_is_one_entry_whatever_its_cost() {
        let p = params(100_000, 1000);
        let mut state = None;
        assert!(
            decide(&p, &mut state, Micros::ZERO, 100_000, true)
                .0
                .is_allowed()
        );
        assert_eq!(state.as_ref().map(|log| log.entries.len()), Some(1));
        let (d, _) = decide(&p, &mut state, us(10), 1, true);
        assert_eq!(d.retry_after(), RetryAfter::After(us(999_990)));
    }

    #[test]
    fn the_sliding_log_is_bounded_lower_than_the_counter() {
        let hour = Duration::from_secs(3600);
        let above = MAX_SLIDING_WINDOW_LIMIT + 1;
        assert_eq!(SlidingWindow::new(above, hour).unwrap_err().field, "limit");
        assert_eq!(
            SlidingWindowCounter::new(above, hour).unwrap().limit(),
            above
        );
    }
}

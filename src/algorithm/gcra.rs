//! GCRA (the generic cell rate algorithm): one request every `interval`
//! sustained, up to `burst` at once, from one timestamp per key. Exact, and
//! O(1) memory. The Lua side is `gcra.lua`; this file holds its in-memory
//! twin, which does the same integer steps.

use super::registry::{Kind, Mark, Parameters, ScriptValue, Shown};
use super::written_for;
use crate::limit::{Decision, Gcra, Micros, RetryAfter};
use crate::store::MemoryChange;

/// The in-memory state of one key: its theoretical arrival time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    tat: Micros,
}

impl State {
    pub(super) fn snapshot(&self) -> super::Snapshot {
        super::Snapshot::Gcra { tat: self.tat }
    }
}

/// The in-memory twin of `gcra.lua`. A missing state is an idle key. With
/// `spend` false it decides the same and changes nothing.
pub fn decide(
    params: &Gcra,
    state: &mut Option<State>,
    now: Micros,
    cost: u64,
    spend: bool,
) -> (Decision, MemoryChange) {
    let interval = params.interval();
    let tolerance = interval * params.burst();
    let tat = state.as_ref().map_or(now, |s| s.tat).max(now);
    let remaining_at = |at: Micros| (now + tolerance).saturating_sub(at) / interval;
    let denied =
        |retry_after| Decision::denied(params.burst(), remaining_at(tat), tat - now, retry_after);
    if cost > params.burst() {
        return (denied(RetryAfter::Never), MemoryChange::None);
    }
    let new_tat = tat + interval * cost;
    // Lua's is negative near time 0 (the embedded store's test clocks).
    let allow_at = new_tat.saturating_sub(tolerance);
    if allow_at > now {
        return (
            denied(RetryAfter::After(allow_at - now)),
            MemoryChange::None,
        );
    }
    let decision = Decision::allowed(params.burst(), remaining_at(new_tat), new_tat - now);
    if cost == 0 || !spend {
        return (decision, MemoryChange::None);
    }
    *state = Some(State { tat: new_tat });
    (decision, written_for(now, new_tat - now))
}

/// What the lists made from the registry need of its parameters.
impl Parameters for Gcra {
    const KIND: Kind = Kind::Gcra;
    fn script_values(&self) -> [ScriptValue; 3] {
        [
            ScriptValue::Whole(self.burst()),
            ScriptValue::Whole(self.interval().as_micros()),
            ScriptValue::Whole(0),
        ]
    }
    /// Intervals are simply given back.
    fn mark(&self) -> Mark {
        Mark::Unmarked
    }
    fn shown(&self) -> Shown {
        Shown {
            interval: Some(self.interval()),
            ..Shown::default()
        }
    }
    /// A whole burst of intervals.
    fn span(&self) -> Micros {
        self.interval() * self.burst()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A time of `micros` microseconds.
    const fn us(micros: u64) -> Micros {
        Micros::from_micros(micros)
    }

    fn params(rate: u64, period_ms: u64, burst: u64) -> Gcra {
        Gcra::new(rate, Duration::from_millis(period_ms), burst).unwrap()
    }

    #[test]
    fn a_burst_passes_then_one_request_per_interval() {
        // 10 a second (one per 100 ms), bursts of 3.
        let p = params(10, 1000, 3);
        let mut state = None;
        for left in [2, 1, 0] {
            let (d, _) = decide(&p, &mut state, Micros::ZERO, 1, true);
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), left);
        }
        let (d, _) = decide(&p, &mut state, Micros::ZERO, 1, true);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), RetryAfter::After(us(100_000)));
        assert_eq!(d.reset_after(), us(300_000));
        // One interval later exactly one more passes.
        assert!(decide(&p, &mut state, us(100_000), 1, true).0.is_allowed());
        assert!(!decide(&p, &mut state, us(100_000), 1, true).0.is_allowed());
        // Idle long enough, the whole burst is back.
        let (d, _) = decide(&p, &mut state, us(10_000_000), 0, true);
        assert_eq!(d.remaining(), 3);
    }

    #[test]
    fn costs_take_several_intervals_and_a_cost_above_the_burst_never_passes() {
        let p = params(10, 1000, 5);
        let mut state = None;
        let (d, _) = decide(&p, &mut state, Micros::ZERO, 4, true);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 1);
        let (d, _) = decide(&p, &mut state, Micros::ZERO, 3, true);
        assert!(!d.is_allowed());
        // Two more intervals must pass first.
        assert_eq!(d.retry_after(), RetryAfter::After(us(200_000)));
        let (d, _) = decide(&p, &mut state, Micros::ZERO, 6, true);
        assert_eq!(d.retry_after(), RetryAfter::Never);
    }

    #[test]
    fn the_interval_is_rounded_up_never_down() {
        // 3 a second: one every 333 334 µs, never faster than asked.
        assert_eq!(params(3, 1000, 1).interval(), us(333_334));
        assert!(Gcra::new(2_000_000, Duration::from_secs(1), 1).is_err());
        assert!(Gcra::new(1, Duration::from_secs(86_400), 400).is_err());
    }

    #[test]
    fn a_look_spends_nothing() {
        let p = params(10, 1000, 2);
        let mut state = None;
        let (d, change) = decide(&p, &mut state, Micros::ZERO, 1, false);
        assert!(d.is_allowed());
        assert_eq!(change, MemoryChange::None);
        assert!(state.is_none());
    }
}

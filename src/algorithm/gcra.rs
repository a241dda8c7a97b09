//! GCRA (the generic cell rate algorithm): one request every `interval`
//! sustained, up to `burst` at once, from one timestamp per key. Exact, and
//! O(1) memory. The Lua side is `gcra.lua`; this file holds its in-memory
//! twin, which does the same integer steps.

use std::time::Duration;

use super::parameters::{Mark, Parameters, Rate, ScriptValue, Shown, WindowStart};
use super::{Spend, written_for};
use crate::limit::{
    Decision, InvalidArgument, MAX_QUANTITY, MAX_WINDOW, Micros, RetryAfter, Window, quantity,
};
use crate::store::MemoryChange;

/// GCRA (the generic cell rate algorithm): `rate` requests per `period`
/// sustained, one every `interval` microseconds, and up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gcra {
    burst: u64,
    /// The period divided by the rate, rounded up to a whole microsecond,
    /// so the sustained rate is never above the one asked for.
    interval: Micros,
}

impl Gcra {
    /// `rate` requests per `period` sustained, up to `burst` at once.
    pub fn new(rate: u64, period: Duration, burst: u64) -> Result<Self, InvalidArgument> {
        let rate = quantity("rate", rate, MAX_QUANTITY)?;
        let period = Window::new(period).map_err(|err| InvalidArgument::new("period", err.rule))?;
        let burst = quantity("burst", burst, MAX_QUANTITY)?;
        let period_us = period.as_micros().as_micros();
        if rate > period_us {
            return Err(InvalidArgument::new(
                "rate",
                format!("must be at most one per microsecond of period ({period_us})"),
            ));
        }
        let interval = period_us.div_ceil(rate);
        // The key lives until a full burst is earned back; bound that like a
        // window (this also keeps every instant below 2^53, exact in Lua).
        let tolerance = u128::from(burst) * u128::from(interval);
        if tolerance > MAX_WINDOW.as_micros() {
            return Err(InvalidArgument::new(
                "burst",
                format!(
                    "is too large for the rate: earning back {burst} requests would take \
                     {} s, more than the maximum of 366 days",
                    tolerance / 1_000_000
                ),
            ));
        }
        Ok(Self {
            burst,
            interval: Micros::from_micros(interval),
        })
    }

    /// Requests that may pass at once.
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// The time between requests at the sustained rate: at least 1 µs.
    pub fn interval(&self) -> Micros {
        self.interval
    }
}

/// The in-memory state of one key: its theoretical arrival time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    tat: Micros,
}

impl State {
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot { tat: self.tat }
    }
}

/// A key's theoretical arrival time, the same in both twins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The theoretical arrival time.
    pub tat: Micros,
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
    type State = State;
    /// `limit` per `per` sustained, `burst` (default `limit`) at once.
    fn from_rate(rate: Rate, _start: WindowStart) -> Result<Self, InvalidArgument> {
        Self::new(rate.limit, rate.per, rate.burst.unwrap_or(rate.limit))
    }
    fn limit(&self) -> u64 {
        self.burst()
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
            ScriptValue::Whole(self.burst()),
            ScriptValue::Whole(self.interval().as_micros()),
            ScriptValue::Whole(0),
        ]
    }
    /// Intervals are simply given back.
    fn mark(&self) -> Mark {
        Mark::Unmarked
    }
    fn spend_mark(&self, _state: &State) -> u64 {
        0
    }
    /// As `gcra_refund`: the theoretical arrival time moved back by `cost`
    /// intervals (one before now is an idle key's).
    fn give_back(&self, state: &mut State, cost: u64, _mark: u64) -> bool {
        state.tat = state.tat.saturating_sub(self.interval() * cost);
        true
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

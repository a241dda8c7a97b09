//! Sliding window counter: a sliding window estimated from two aligned
//! fixed-window counts (this window's, and the previous one's weighted by
//! how much of it the last window still covers), in O(1) memory. An
//! approximation: it can admit more than the limit in some span of one
//! window when the previous window's traffic was uneven. The Lua side is
//! `sliding_window_counter.lua`; this file holds its in-memory twin, which
//! does the same floating-point steps in the same order.

use super::parameters::{Mark, Parameters, Rate, ScriptValue, Shown, WindowStart};
use super::{Spend, written_for};
use crate::limit::{Decision, InvalidArgument, LimitPerWindow, MAX_QUANTITY, Micros, RetryAfter};
use crate::store::MemoryChange;

/// At most about `limit` units per `window`, estimated from two aligned
/// fixed-window counts (the sliding window counter).
pub type SlidingWindowCounter = LimitPerWindow<MAX_QUANTITY>;

/// The in-memory state of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    /// The index of the window `current` counts (now / window).
    index: u64,
    current: u64,
    previous: u64,
}

impl State {
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            index: self.index,
            current: self.current,
            previous: self.previous,
        }
    }
}

/// The two counts as plain values, the same in both twins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The window `current` counts.
    pub index: u64,
    /// Units counted in it.
    pub current: u64,
    /// Units counted in the window before.
    pub previous: u64,
}

/// The previous window's share of `count` at `into` microseconds into the
/// current window, rounded down.
fn share(count: u64, into: Micros, window: Micros) -> u64 {
    let left = (window - into).as_micros() as f64;
    (count as f64 * (left / window.as_micros() as f64)).floor() as u64
}

/// The first instant (microseconds into a window, `from` or later) at which
/// `count`'s share is at most `allowed`.
fn first_fit(count: u64, allowed: u64, from: Micros, window: Micros) -> Micros {
    if share(count, from, window) <= allowed {
        return from;
    }
    let window_us = window.as_micros() as f64;
    let guess = (window_us - (allowed + 1) as f64 * window_us / count as f64).floor();
    let mut into = if guess < from.as_micros() as f64 {
        from
    } else {
        Micros::from_micros(guess as u64)
    };
    let mut steps = 0;
    while into < window && steps < 16 && share(count, into, window) > allowed {
        into += Micros::from_micros(1);
        steps += 1;
    }
    into
}

/// The in-memory twin of `sliding_window_counter.lua`. With `spend` false
/// it decides the same and changes nothing.
pub fn decide(
    params: &SlidingWindowCounter,
    state: &mut Option<State>,
    now: Micros,
    cost: u64,
    spend: bool,
) -> (Decision, MemoryChange) {
    let window = params.window().as_micros();
    let limit = params.limit();
    let mut index = now / window;
    let (mut current, mut previous) = (0, 0);
    if let Some(stored) = state.as_ref() {
        // Redis's clock stepped back: keep counting in the stored window.
        index = index.max(stored.index);
        if stored.index == index {
            (current, previous) = (stored.current, stored.previous);
        } else if stored.index + 1 == index {
            previous = stored.current;
        }
    }
    let elapsed = now.saturating_sub(window * index);
    let estimate = share(previous, elapsed, window) + current;
    let remaining = limit.saturating_sub(estimate);
    let next_start = window - elapsed;
    let reset_after = if current > 0 {
        next_start + window
    } else if previous > 0 {
        next_start
    } else {
        Micros::ZERO
    };
    let denied = |retry_after| Decision::denied(limit, remaining, reset_after, retry_after);
    if cost > limit {
        return (denied(RetryAfter::Never), MemoryChange::None);
    }
    if estimate + cost > limit {
        let retry_after = if current + cost <= limit {
            first_fit(previous, limit - cost - current, elapsed, window) - elapsed
        } else {
            next_start + first_fit(current, limit - cost, Micros::ZERO, window)
        };
        return (denied(RetryAfter::After(retry_after)), MemoryChange::None);
    }
    if cost == 0 || !spend {
        return (
            Decision::allowed(limit, remaining - cost, reset_after),
            MemoryChange::None,
        );
    }
    *state = Some(State {
        index,
        current: current + cost,
        previous,
    });
    let reset_after = next_start + window;
    (
        Decision::allowed(limit, remaining - cost, reset_after),
        written_for(now, reset_after),
    )
}

/// What the lists made from the registry need of its parameters.
impl Parameters for SlidingWindowCounter {
    type State = State;
    /// About `limit` per `per`.
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
    /// The window spent in: a refund gives units back only while the key
    /// counts it.
    fn mark(&self) -> Mark {
        Mark::Window
    }
    /// The index of the window the state counts.
    fn spend_mark(&self, state: &State) -> u64 {
        state.index
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

    const SECOND: Micros = Micros::from_secs(1);

    /// A time of `micros` microseconds.
    const fn us(micros: u64) -> Micros {
        Micros::from_micros(micros)
    }

    fn params(limit: u64) -> SlidingWindowCounter {
        SlidingWindowCounter::new(limit, Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn the_previous_window_counts_by_how_much_of_it_is_still_covered() {
        let p = params(10);
        let mut state = None;
        // 10 in window 5, all at its start.
        for _ in 0..10 {
            assert!(decide(&p, &mut state, SECOND * 5, 1, true).0.is_allowed());
        }
        let (d, _) = decide(&p, &mut state, SECOND * 5, 1, true);
        assert!(!d.is_allowed());
        // Nothing fits until window 6, where the share of window 5 falls
        // below 10 (to 9, rounded down) a microsecond in.
        assert_eq!(d.retry_after(), RetryAfter::After(SECOND + us(1)));
        // A quarter into window 6, the estimate is 10 * 0.75 = 7.5 -> 7.
        let (d, _) = decide(&p, &mut state, SECOND * 6 + us(250_000), 0, true);
        assert_eq!(d.remaining(), 3);
        for _ in 0..3 {
            assert!(
                decide(&p, &mut state, SECOND * 6 + us(250_000), 1, true)
                    .0
                    .is_allowed()
            );
        }
        let (d, _) = decide(&p, &mut state, SECOND * 6 + us(250_000), 1, true);
        assert!(!d.is_allowed());
        // One more fits once the share falls to 6: 30 % into window 6.
        assert_eq!(d.retry_after(), RetryAfter::After(us(50_001)));
        let RetryAfter::After(retry) = d.retry_after() else {
            panic!("never")
        };
        assert!(
            decide(&p, &mut state, SECOND * 6 + us(250_000) + retry, 1, false)
                .0
                .is_allowed()
        );
        assert!(
            !decide(
                &p,
                &mut state,
                SECOND * 6 + us(250_000) + retry - us(1),
                1,
                false
            )
            .0
            .is_allowed()
        );
        // Two windows on, nothing of window 5 counts.
        let (d, _) = decide(&p, &mut state, SECOND * 8, 0, true);
        assert_eq!(d.remaining(), 10);
    }

    #[test]
    fn reset_after_runs_past_the_window_while_its_count_still_weighs() {
        let p = params(10);
        let mut state = None;
        // 3 a quarter into window 5: they weigh on the estimate until the
        // end of window 6, so the key is full again 1.75 windows on.
        let (d, _) = decide(&p, &mut state, SECOND * 5 + us(250_000), 3, true);
        assert_eq!(d.reset_after(), SECOND + us(750_000));
        // At window 5's end the key is not full (a reset_after clamped to
        // the window would say it was).
        let (d, _) = decide(&p, &mut state, SECOND * 6, 0, true);
        assert_eq!(d.remaining(), 7);
        assert_eq!(d.reset_after(), SECOND);
        // Rounding down lets the estimate reach 0 a little earlier (past
        // two thirds of window 6): reset_after is the latest it is full.
        let (d, _) = decide(&p, &mut state, SECOND * 6 + us(666_667), 0, true);
        assert_eq!(d.remaining(), 10);
        let (d, _) = decide(&p, &mut state, SECOND * 7, 0, true);
        assert_eq!((d.remaining(), d.reset_after()), (10, Micros::ZERO));
    }

    #[test]
    fn retry_after_is_the_first_microsecond_that_fits() {
        for limit in [1, 3, 7, 10, 1000] {
            let p = params(limit);
            for spent in 1..=limit.min(20) {
                let mut state = None;
                assert!(
                    decide(&p, &mut state, SECOND * 3 + us(17), spent, true)
                        .0
                        .is_allowed()
                );
                let asked_at = SECOND * 3 + us(400_000);
                let (d, _) = decide(&p, &mut state, asked_at, limit, false);
                if d.is_allowed() {
                    continue;
                }
                let RetryAfter::After(retry) = d.retry_after() else {
                    panic!("never")
                };
                let at = asked_at + retry;
                assert!(
                    decide(&p, &mut state, at, limit, false).0.is_allowed(),
                    "{limit} {spent}"
                );
                assert!(
                    !decide(&p, &mut state, at - us(1), limit, false)
                        .0
                        .is_allowed(),
                    "{limit} {spent}"
                );
            }
        }
    }

    #[test]
    fn in_any_span_of_one_window_it_admits_at_most_twice_the_limit() {
        // The worst case: each window's traffic at its very end, weighed by
        // the next window as if it had been spread evenly.
        let p = params(10);
        let mut state = None;
        let mut admitted = Vec::new();
        for window in 1..20 {
            let end = SECOND * (window + 1);
            for at in (0..50)
                .map(|i| end - us(1000) + us(20) * i)
                .chain((1..50).map(|i| end + us(19_000) * i))
            {
                if decide(&p, &mut state, at, 1, true).0.is_allowed() {
                    admitted.push(at);
                }
            }
        }
        admitted.sort_unstable();
        let most = (0..admitted.len())
            .map(|i| {
                admitted[i..]
                    .iter()
                    .take_while(|&&at| at < admitted[i] + SECOND)
                    .count()
            })
            .max()
            .unwrap_or(0);
        assert!(most > 10, "the estimate is not exact: {most}");
        assert!(most <= 20, "{most} in one window");
    }

    #[test]
    fn a_cost_above_the_limit_never_passes_and_a_look_spends_nothing() {
        let p = params(5);
        let mut state = None;
        let (d, _) = decide(&p, &mut state, SECOND, 6, true);
        assert_eq!(d.retry_after(), RetryAfter::Never);
        let (d, change) = decide(&p, &mut state, SECOND, 1, false);
        assert!(d.is_allowed());
        assert_eq!(change, MemoryChange::None);
        assert!(state.is_none());
    }
}

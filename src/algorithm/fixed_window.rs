//! Fixed window: a counter per key, either anchored (the window starts at
//! the key's first spending request; `CheckLimit`) or aligned to multiples
//! of the window since the Unix epoch (as envoyproxy/ratelimit does), and
//! then kept with its window's number or, by name, as envoyproxy/ratelimit
//! keeps it (a plain counter in a key named with the window's start). The
//! Lua side is `fixed_window.lua`; this file holds its in-memory twin.
//!
//! Cheapest of the algorithms (one small key) but it admits up to twice the
//! limit across a window boundary.

use std::time::Duration;

use super::parameters::{Mark, Parameters, Rate, ScriptValue, Shown, WindowStart};
use super::{Spend, redis_expiry_at};
use crate::limit::{Decision, InvalidArgument, MAX_QUANTITY, Micros, RetryAfter, Window, quantity};
use crate::store::MemoryChange;

/// At most `limit` units per window.
///
/// Each parameter is checked once, when the value is made; the error names
/// the field and the rule.
///
/// ```
/// use std::time::Duration;
///
/// use ratelimitd::algorithm::{FixedWindow, FixedWindowMode};
///
/// let per_minute = FixedWindow::new(100, Duration::from_secs(60)).unwrap();
/// assert_eq!(per_minute.limit(), 100);
/// assert_eq!(per_minute.window().as_millis(), 60_000);
/// assert_eq!(per_minute.mode(), FixedWindowMode::Anchored);
///
/// let refused = FixedWindow::new(0, Duration::from_secs(60)).unwrap_err();
/// assert_eq!(refused.to_string(), "limit: must be at least 1");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FixedWindow {
    limit: u64,
    window: Window,
    mode: FixedWindowMode,
}

/// Where a fixed window starts, and how its count is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixedWindowMode {
    /// The window starts at the key's first spending request
    /// (`CheckLimit`).
    Anchored,
    /// Windows are the multiples of the window's length since the Unix
    /// epoch, as envoyproxy/ratelimit counts them; the key keeps the number
    /// of the window it counts.
    Aligned,
    /// Aligned, and kept as envoyproxy/ratelimit keeps it: a plain counter
    /// in a key that its caller names with the window's start, living one
    /// window from its last count (`--envoy-key-layout upstream`).
    AlignedByName,
}

impl FixedWindow {
    /// A window anchored at the key's first spending request.
    pub fn new(limit: u64, window: Duration) -> Result<Self, InvalidArgument> {
        Ok(Self {
            limit: quantity("limit", limit, MAX_QUANTITY)?,
            window: Window::new(window)?,
            mode: FixedWindowMode::Anchored,
        })
    }

    /// A window aligned to multiples of its length since the Unix epoch.
    pub fn aligned(limit: u64, window: Duration) -> Result<Self, InvalidArgument> {
        Ok(Self {
            mode: FixedWindowMode::Aligned,
            ..Self::new(limit, window)?
        })
    }

    /// The same limit, aligned, counted in a plain counter that the caller
    /// names with each window's start, as envoyproxy/ratelimit counts.
    pub fn aligned_by_name(self) -> Self {
        Self {
            mode: FixedWindowMode::AlignedByName,
            ..self
        }
    }

    /// Units per window.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The window's length.
    pub fn window(&self) -> Window {
        self.window
    }

    /// Where the window starts, and how the count is kept.
    pub fn mode(&self) -> FixedWindowMode {
        self.mode
    }

    /// Windows aligned to multiples of their length since the Unix epoch.
    pub fn is_aligned(&self) -> bool {
        self.mode != FixedWindowMode::Anchored
    }
}

/// The in-memory state of one key, as the script keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    used: u64,
    /// Aligned: the number of the window `used` counts (a key left from the
    /// previous window, still alive in its last millisecond, counts
    /// nothing). Anchored and by name: `None`.
    window: Option<u64>,
    /// When the counter expires, in whole milliseconds, as Redis keeps it:
    /// the window's end (by name: a window after the last count).
    expires_ms: u64,
}

impl State {
    pub(super) fn snapshot(&self) -> Snapshot {
        Snapshot {
            window: self.window,
            used: self.used,
        }
    }
}

/// A key's count as plain values, the same in both twins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// An aligned window's number (`None`: anchored, or by name).
    pub window: Option<u64>,
    /// Units counted.
    pub used: u64,
}

/// What a decision finds of a key's counter at an instant.
struct Found {
    /// Aligned (by name too): the number of the window the instant is in,
    /// counted from the Unix epoch. Anchored: `None`.
    current: Option<u64>,
    /// Whether the stored counter counts at the instant.
    in_window: bool,
    /// The units it counts.
    used: u64,
    /// Until its window ends (0 without one).
    reset_after: Micros,
}

impl Found {
    /// What `state` holds for `params` at `now`.
    fn at(params: &FixedWindow, state: Option<&State>, now: Micros) -> Self {
        let window_us = params.window().as_micros();
        let current = params.is_aligned().then(|| now / window_us);
        let in_window = match (state, params.mode()) {
            (None, _) => false,
            (Some(stored), FixedWindowMode::Aligned) => stored.window == current,
            // A key named by its window counts while it lives.
            (Some(_), FixedWindowMode::AlignedByName | FixedWindowMode::Anchored) => true,
        };
        let (used, reset_after) = match (state, current) {
            (Some(stored), Some(window)) if in_window => {
                (stored.used, window_us * (window + 1) - now)
            }
            (Some(stored), None) => (
                stored.used,
                Micros::from_millis(stored.expires_ms - now.as_millis()),
            ),
            _ => (0, Micros::ZERO),
        };
        Self {
            current,
            in_window,
            used,
            reset_after,
        }
    }

    /// Counts `cost` more at `now` on what was found: the window's
    /// `reset_after` then, and what the store does.
    fn record(
        &self,
        params: &FixedWindow,
        state: &mut Option<State>,
        now: Micros,
        cost: u64,
    ) -> (Micros, MemoryChange) {
        let window_us = params.window().as_micros();
        let (used, window, expires_ms, reset_after) = match (self.current, params.mode()) {
            (Some(window), FixedWindowMode::AlignedByName) => {
                let end = window_us * (window + 1);
                let lives_until = now.as_millis() + params.window().as_millis();
                (self.used + cost, None, lives_until, end - now)
            }
            (Some(window), _) => {
                let end = window_us * (window + 1);
                (self.used + cost, Some(window), end.as_millis(), end - now)
            }
            (None, _) if self.in_window => {
                if let Some(stored) = state.as_mut() {
                    stored.used += cost;
                }
                return (self.reset_after, MemoryChange::Updated);
            }
            (None, _) => (
                cost,
                None,
                now.as_millis() + params.window().as_millis(),
                window_us,
            ),
        };
        *state = Some(State {
            used,
            window,
            expires_ms,
        });
        let change = MemoryChange::Written {
            expires_at: redis_expiry_at(expires_ms),
        };
        (reset_after, change)
    }
}

/// The in-memory twin of `fixed_window.lua`, step for step. `state` is
/// `None` when the key has no live window (the store drops expired state
/// before calling). With [`Spend::Dry`] it decides the same and changes
/// nothing; with [`Spend::Always`] a denied cost is counted too (upstream's
/// way), and `remaining` is what is left after it.
///
/// An anchored window's `reset_after` is whole milliseconds: the time from
/// the millisecond `now` is in to the counter's expiry, as Redis's `PTTL`
/// would say it.
pub fn decide(
    params: &FixedWindow,
    state: &mut Option<State>,
    now: Micros,
    cost: u64,
    spend: Spend,
) -> (Decision, MemoryChange) {
    let limit = params.limit();
    let found = Found::at(params, state.as_ref(), now);
    let used = found.used;
    if cost > limit || used + cost > limit {
        let (mut remaining, mut reset_after) = (limit.saturating_sub(used), found.reset_after);
        let mut change = MemoryChange::None;
        if spend == Spend::Always && cost > 0 {
            (reset_after, change) = found.record(params, state, now, cost);
            remaining = limit.saturating_sub(used + cost);
        }
        // The whole limit is back when the window ends; `reset_after` is 0
        // within the window's last millisecond, so never less than 1 ms.
        let retry_after = if cost > limit {
            RetryAfter::Never
        } else {
            RetryAfter::After(reset_after.max(Micros::from_millis(1)))
        };
        return (
            Decision::denied(limit, remaining, reset_after, retry_after),
            change,
        );
    }
    let (reset_after, change) = if cost > 0 && spend != Spend::Dry {
        found.record(params, state, now, cost)
    } else {
        (found.reset_after, MemoryChange::None)
    };
    (
        Decision::allowed(limit, limit - used - cost, reset_after),
        change,
    )
}

/// What the lists made from the registry need of its parameters.
impl Parameters for FixedWindow {
    type State = State;
    /// `limit` per `per`, the window starting as `start` says.
    fn from_rate(rate: Rate, start: WindowStart) -> Result<Self, InvalidArgument> {
        match start {
            WindowStart::FirstRequest => Self::new(rate.limit, rate.per),
            WindowStart::Epoch => Self::aligned(rate.limit, rate.per),
        }
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
        decide(self, state, now, cost, spend)
    }
    fn script_values(&self) -> [ScriptValue; 3] {
        let mode = match self.mode() {
            FixedWindowMode::Anchored => 0,
            FixedWindowMode::Aligned => 1,
            FixedWindowMode::AlignedByName => 2,
        };
        [
            ScriptValue::Whole(self.limit()),
            ScriptValue::Whole(self.window().as_millis()),
            ScriptValue::Whole(mode),
        ]
    }
    /// An aligned window's number, an anchored window's end: a refund
    /// gives units back only while the key counts that window. Named by
    /// its window, the key is the window.
    fn mark(&self) -> Mark {
        match self.mode() {
            FixedWindowMode::Aligned => Mark::Window,
            FixedWindowMode::Anchored => Mark::WindowEnd,
            FixedWindowMode::AlignedByName => Mark::Unmarked,
        }
    }
    /// As `fixed_window.lua` replies: an aligned window's number, an
    /// anchored window's end (Unix ms), 0 by name.
    fn spend_mark(&self, state: &State) -> u64 {
        match self.mode() {
            FixedWindowMode::Aligned => state.window.unwrap_or(0),
            FixedWindowMode::Anchored => state.expires_ms,
            FixedWindowMode::AlignedByName => 0,
        }
    }
    /// As `fixed_window_refund`: only while the key counts the window
    /// spent (by name: the key is the window), never below none.
    fn give_back(&self, state: &mut State, cost: u64, mark: u64) -> bool {
        let spent_here = match self.mode() {
            FixedWindowMode::Aligned => state.window == Some(mark),
            FixedWindowMode::Anchored => state.expires_ms == mark,
            FixedWindowMode::AlignedByName => true,
        };
        if spent_here {
            state.used = state.used.saturating_sub(cost);
        }
        spent_here
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

    /// A time of `micros` microseconds.
    const fn us(micros: u64) -> Micros {
        Micros::from_micros(micros)
    }

    fn params(limit: u64, window_ms: u64) -> FixedWindow {
        FixedWindow::new(limit, Duration::from_millis(window_ms)).unwrap()
    }

    #[test]
    fn aligned_windows_end_on_multiples_of_the_window() {
        let p = FixedWindow::aligned(2, Duration::from_millis(1000)).unwrap();
        let mut state = None;
        let (d, change) = decide(&p, &mut state, us(2_300_000), 1, Spend::IfAllowed);
        assert_eq!(d.reset_after(), us(700_000));
        assert_eq!(
            change,
            MemoryChange::Written {
                expires_at: us(3_001_000)
            }
        );
    }

    #[test]
    fn by_name_a_counter_counts_while_it_lives_and_lives_a_window_from_its_last_count() {
        let p = FixedWindow::aligned(2, Duration::from_millis(1000))
            .unwrap()
            .aligned_by_name();
        let mut state = None;
        let (d, change) = decide(&p, &mut state, us(2_300_000), 1, Spend::IfAllowed);
        assert_eq!((d.remaining(), d.reset_after()), (1, us(700_000)));
        assert_eq!(
            change,
            MemoryChange::Written {
                expires_at: us(3_301_000)
            }
        );
        // Into the next window the same key still counts: its caller names
        // each window's key, so a key is only ever asked in its own window.
        let (d, _) = decide(&p, &mut state, us(3_100_000), 1, Spend::IfAllowed);
        assert_eq!((d.remaining(), d.reset_after()), (0, us(900_000)));
        let (d, change) = decide(&p, &mut state, us(3_200_000), 1, Spend::IfAllowed);
        assert!(!d.is_allowed());
        assert_eq!(change, MemoryChange::None);
    }

    #[test]
    fn a_dry_run_decides_without_spending() {
        let p = params(2, 1000);
        let mut state = None;
        let (d, change) = decide(&p, &mut state, Micros::ZERO, 2, Spend::Dry);
        assert!(d.is_allowed());
        assert_eq!(d.remaining(), 0);
        assert_eq!(change, MemoryChange::None);
        assert!(state.is_none());
    }

    #[test]
    fn allows_the_limit_then_denies_until_the_window_ends() {
        let p = params(3, 1000);
        let mut state = None;
        for expected_remaining in [2, 1, 0] {
            let (d, _) = decide(&p, &mut state, us(5_000), 1, Spend::IfAllowed);
            assert!(d.is_allowed());
            assert_eq!(d.remaining(), expected_remaining);
        }
        let (d, change) = decide(&p, &mut state, us(205_000), 1, Spend::IfAllowed);
        assert!(!d.is_allowed());
        assert_eq!(d.retry_after(), RetryAfter::After(us(800_000)));
        assert_eq!(d.reset_after(), us(800_000));
        assert_eq!(change, MemoryChange::None);
    }

    #[test]
    fn a_cost_above_the_limit_is_never_allowed_and_spends_nothing() {
        let p = params(3, 1000);
        let mut state = None;
        let (d, _) = decide(&p, &mut state, Micros::ZERO, 4, Spend::IfAllowed);
        assert_eq!(d.retry_after(), RetryAfter::Never);
        assert_eq!(d.remaining(), 3);
        assert!(state.is_none());
    }

    #[test]
    fn cost_zero_looks_without_starting_a_window() {
        let p = params(3, 1000);
        let mut state = None;
        let (d, change) = decide(&p, &mut state, Micros::ZERO, 0, Spend::IfAllowed);
        assert!(d.is_allowed());
        assert_eq!((d.remaining(), d.reset_after()), (3, Micros::ZERO));
        assert_eq!(change, MemoryChange::None);
        assert!(state.is_none());
    }

    #[test]
    fn spending_always_counts_denied_hits_too() {
        let p = FixedWindow::aligned(2, Duration::from_millis(1000)).unwrap();
        let mut state = None;
        for (cost, allowed, remaining) in [(1, true, 1), (2, false, 0), (0, false, 0)] {
            let (d, _) = decide(&p, &mut state, us(100_000), cost, Spend::Always);
            assert_eq!(
                (d.is_allowed(), d.remaining()),
                (allowed, remaining),
                "cost {cost}"
            );
        }
        assert_eq!(state.as_ref().map(|s| s.used), Some(3));
        // Over the limit from the start, it still starts the window.
        let mut fresh = None;
        let (d, change) = decide(&p, &mut fresh, us(100_000), 5, Spend::Always);
        assert_eq!(
            (d.is_allowed(), d.retry_after(), d.reset_after()),
            (false, RetryAfter::Never, us(900_000))
        );
        assert_eq!(
            change,
            MemoryChange::Written {
                expires_at: us(1_001_000)
            }
        );
    }
}

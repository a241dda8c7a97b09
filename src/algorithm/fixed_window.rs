//! Fixed window: a counter per key whose window starts at the key's first
//! spending request. Its Redis script and its in-memory twin live side by
//! side so one review covers both.
//!
//! Cheapest of the algorithms (one small string per key) but it admits up to
//! twice the limit across a window boundary.

use std::sync::LazyLock;

use redis::Script;

use super::MemoryChange;
use crate::limit::{Decision, FixedWindow, Micros, RetryAfter};

/// The Redis side; `KEYS`, `ARGV` and reply are documented in the file.
pub static SCRIPT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("fixed_window.lua")));

/// `ARGV` for [`SCRIPT`]: limit, window in milliseconds, cost.
pub fn script_args(params: &FixedWindow, cost: u64) -> (u64, u64, u64) {
    (params.limit, params.window.as_millis(), cost)
}

/// The in-memory state of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    used: u64,
    window_end: Micros,
}

/// The in-memory twin of [`SCRIPT`]. `state` is `None` when the key has no
/// live window (the store drops expired state before calling).
pub fn decide(
    params: &FixedWindow,
    state: &mut Option<State>,
    now: Micros,
    cost: u64,
) -> (Decision, MemoryChange) {
    let limit = params.limit;
    let (used, reset_after) = match state {
        Some(s) => (s.used, s.window_end.saturating_sub(now)),
        None => (0, 0),
    };
    let remaining = limit.saturating_sub(used);
    let denied = |retry_after| Decision {
        allowed: false,
        limit,
        remaining,
        reset_after,
        retry_after,
    };
    if cost > limit {
        return (denied(RetryAfter::Never), MemoryChange::None);
    }
    if used + cost > limit {
        return (
            denied(RetryAfter::After(reset_after.max(1))),
            MemoryChange::None,
        );
    }
    let mut decision = Decision {
        allowed: true,
        limit,
        remaining: remaining - cost,
        reset_after,
        retry_after: RetryAfter::After(0),
    };
    if cost == 0 {
        return (decision, MemoryChange::None);
    }
    match state {
        Some(s) => {
            s.used += cost;
            (decision, MemoryChange::Updated)
        }
        None => {
            let window_end = now + params.window.as_micros();
            *state = Some(State {
                used: cost,
                window_end,
            });
            decision.reset_after = params.window.as_micros();
            (
                decision,
                MemoryChange::Written {
                    expires_at: window_end,
                },
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn params(limit: u64, window_ms: u64) -> FixedWindow {
        FixedWindow::new(limit, Duration::from_millis(window_ms)).unwrap()
    }

    #[test]
    fn allows_the_limit_then_denies_until_the_window_ends() {
        let p = params(3, 1000);
        let mut state = None;
        for expected_remaining in [2, 1, 0] {
            let (d, _) = decide(&p, &mut state, 5_000, 1);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
        }
        let (d, change) = decide(&p, &mut state, 205_000, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, RetryAfter::After(800_000));
        assert_eq!(d.reset_after, 800_000);
        assert_eq!(change, MemoryChange::None);
    }

    #[test]
    fn a_cost_above_the_limit_is_never_allowed_and_spends_nothing() {
        let p = params(3, 1000);
        let mut state = None;
        let (d, _) = decide(&p, &mut state, 0, 4);
        assert_eq!(d.retry_after, RetryAfter::Never);
        assert_eq!(d.remaining, 3);
        assert!(state.is_none());
    }

    #[test]
    fn cost_zero_looks_without_starting_a_window() {
        let p = params(3, 1000);
        let mut state = None;
        let (d, change) = decide(&p, &mut state, 0, 0);
        assert!(d.allowed);
        assert_eq!((d.remaining, d.reset_after), (3, 0));
        assert_eq!(change, MemoryChange::None);
        assert!(state.is_none());
    }
}

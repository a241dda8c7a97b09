//! Fixed window: a counter per key, either anchored (the window starts at
//! the key's first spending request; `CheckLimit`) or aligned to multiples
//! of the window since the Unix epoch (as envoyproxy/ratelimit does). The
//! Lua side is `fixed_window.lua`; this file holds its in-memory twin.
//!
//! Cheapest of the algorithms (one small key) but it admits up to twice the
//! limit across a window boundary.

use crate::algorithm::MemoryChange;
use crate::limit::{Decision, FixedWindow, Micros, RetryAfter};

/// The in-memory state of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    used: u64,
    window_end: Micros,
}

/// The in-memory twin of `fixed_window.lua`. `state` is `None` when the key
/// has no live window (the store drops expired state before calling). With
/// `spend` false it decides the same and changes nothing.
pub fn decide(
    params: &FixedWindow,
    state: &mut Option<State>,
    now: Micros,
    cost: u64,
    spend: bool,
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
        degraded: false,
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
        degraded: false,
    };
    if cost == 0 || !spend {
        return (decision, MemoryChange::None);
    }
    match state {
        Some(s) => {
            s.used += cost;
            (decision, MemoryChange::Updated)
        }
        None => {
            let window = params.window.as_micros();
            let window_end = if params.aligned {
                (now / window + 1) * window
            } else {
                now + window
            };
            *state = Some(State {
                used: cost,
                window_end,
            });
            decision.reset_after = window_end - now;
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
    fn aligned_windows_end_on_multiples_of_the_window() {
        let p = FixedWindow {
            aligned: true,
            ..params(2, 1000)
        };
        let mut state = None;
        let (d, change) = decide(&p, &mut state, 2_300_000, 1, true);
        assert_eq!(d.reset_after, 700_000);
        assert_eq!(
            change,
            MemoryChange::Written {
                expires_at: 3_000_000
            }
        );
    }

    #[test]
    fn a_dry_run_decides_without_spending() {
        let p = params(2, 1000);
        let mut state = None;
        let (d, change) = decide(&p, &mut state, 0, 2, false);
        assert!(d.allowed);
        assert_eq!(d.remaining, 0);
        assert_eq!(change, MemoryChange::None);
        assert!(state.is_none());
    }

    #[test]
    fn allows_the_limit_then_denies_until_the_window_ends() {
        let p = params(3, 1000);
        let mut state = None;
        for expected_remaining in [2, 1, 0] {
            let (d, _) = decide(&p, &mut state, 5_000, 1, true);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
        }
        let (d, change) = decide(&p, &mut state, 205_000, 1, true);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, RetryAfter::After(800_000));
        assert_eq!(d.reset_after, 800_000);
        assert_eq!(change, MemoryChange::None);
    }

    #[test]
    fn a_cost_above_the_limit_is_never_allowed_and_spends_nothing() {
        let p = params(3, 1000);
        let mut state = None;
        let (d, _) = decide(&p, &mut state, 0, 4, true);
        assert_eq!(d.retry_after, RetryAfter::Never);
        assert_eq!(d.remaining, 3);
        assert!(state.is_none());
    }

    #[test]
    fn cost_zero_looks_without_starting_a_window() {
        let p = params(3, 1000);
        let mut state = None;
        let (d, change) = decide(&p, &mut state, 0, 0, true);
        assert!(d.allowed);
        assert_eq!((d.remaining, d.reset_after), (3, 0));
        assert_eq!(change, MemoryChange::None);
        assert!(state.is_none());
    }
}

//! Fixed window: a counter per key, either anchored (the window starts at
//! the key's first spending request; `CheckLimit`) or aligned to multiples
//! of the window since the Unix epoch (as envoyproxy/ratelimit does). The
//! Lua side is `fixed_window.lua`; this file holds its in-memory twin.
//!
//! Cheapest of the algorithms (one small key) but it admits up to twice the
//! limit across a window boundary.

use crate::algorithm::{MemoryChange, Spend};
use crate::limit::{Decision, FixedWindow, Micros, RetryAfter};

/// The in-memory state of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    used: u64,
    window_end: Micros,
}

/// The in-memory twin of `fixed_window.lua`. `state` is `None` when the key
/// has no live window (the store drops expired state before calling). With
/// [`Spend::Dry`] it decides the same and changes nothing; with
/// [`Spend::Always`] a denied cost is counted too (upstream's way), and
/// `remaining` is what is left after it.
pub fn decide(
    params: &FixedWindow,
    state: &mut Option<State>,
    now: Micros,
    cost: u64,
    spend: Spend,
) -> (Decision, MemoryChange) {
    let limit = params.limit;
    let (used, mut reset_after) = match state {
        Some(s) => (s.used, s.window_end.saturating_sub(now)),
        None => (0, 0),
    };
    let mut remaining = limit.saturating_sub(used);
    let allowed = cost <= limit && used + cost <= limit;
    let change = if cost > 0 && (spend == Spend::Always || (allowed && spend == Spend::IfAllowed)) {
        let change = record(params, state, now, cost);
        if let Some(s) = state {
            reset_after = s.window_end - now;
        }
        change
    } else {
        MemoryChange::None
    };
    if !allowed {
        if change != MemoryChange::None {
            remaining = limit.saturating_sub(used + cost);
        }
        let retry_after = if cost > limit {
            RetryAfter::Never
        } else {
            RetryAfter::After(reset_after.max(1))
        };
        let decision = Decision {
            allowed: false,
            limit,
            remaining,
            reset_after,
            retry_after,
            degraded: false,
        };
        return (decision, change);
    }
    let decision = Decision {
        allowed: true,
        limit,
        remaining: remaining - cost,
        reset_after,
        retry_after: RetryAfter::After(0),
        degraded: false,
    };
    (decision, change)
}

/// Adds `cost` to the window in progress, or starts one.
fn record(params: &FixedWindow, state: &mut Option<State>, now: Micros, cost: u64) -> MemoryChange {
    match state {
        Some(s) => {
            s.used += cost;
            MemoryChange::Updated
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
            MemoryChange::Written {
                expires_at: window_end,
            }
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
        let (d, change) = decide(&p, &mut state, 2_300_000, 1, Spend::IfAllowed);
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
        let (d, change) = decide(&p, &mut state, 0, 2, Spend::Dry);
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
            let (d, _) = decide(&p, &mut state, 5_000, 1, Spend::IfAllowed);
            assert!(d.allowed);
            assert_eq!(d.remaining, expected_remaining);
        }
        let (d, change) = decide(&p, &mut state, 205_000, 1, Spend::IfAllowed);
        assert!(!d.allowed);
        assert_eq!(d.retry_after, RetryAfter::After(800_000));
        assert_eq!(d.reset_after, 800_000);
        assert_eq!(change, MemoryChange::None);
    }

    #[test]
    fn a_cost_above_the_limit_is_never_allowed_and_spends_nothing() {
        let p = params(3, 1000);
        let mut state = None;
        let (d, _) = decide(&p, &mut state, 0, 4, Spend::IfAllowed);
        assert_eq!(d.retry_after, RetryAfter::Never);
        assert_eq!(d.remaining, 3);
        assert!(state.is_none());
    }

    #[test]
    fn cost_zero_looks_without_starting_a_window() {
        let p = params(3, 1000);
        let mut state = None;
        let (d, change) = decide(&p, &mut state, 0, 0, Spend::IfAllowed);
        assert!(d.allowed);
        assert_eq!((d.remaining, d.reset_after), (3, 0));
        assert_eq!(change, MemoryChange::None);
        assert!(state.is_none());
    }

    #[test]
    fn spending_always_counts_denied_hits_too() {
        let p = FixedWindow {
            aligned: true,
            ..params(2, 1000)
        };
        let mut state = None;
        for (cost, allowed, remaining) in [(1, true, 1), (2, false, 0), (0, false, 0)] {
            let (d, _) = decide(&p, &mut state, 100_000, cost, Spend::Always);
            assert_eq!(
                (d.allowed, d.remaining),
                (allowed, remaining),
                "cost {cost}"
            );
        }
        assert_eq!(state.as_ref().map(|s| s.used), Some(3));
        // Over the limit from the start, it still starts the window.
        let mut fresh = None;
        let (d, change) = decide(&p, &mut fresh, 100_000, 5, Spend::Always);
        assert_eq!(
            (d.allowed, d.retry_after, d.reset_after),
            (false, RetryAfter::Never, 900_000)
        );
        assert_eq!(
            change,
            MemoryChange::Written {
                expires_at: 1_000_000
            }
        );
    }
}

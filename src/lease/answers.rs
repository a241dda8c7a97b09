//! What a grant says beside its units: how long they are valid, how long
//! to wait when there are none, and what the limits had left after it.

use std::time::{Duration, Instant};

use super::Grant;
use super::sizing::Leasable;
use crate::decider::Label;
use crate::limit::{Decision, RetryAfter};
use crate::limiter::MarkedDecision;
use crate::policy::Policy;

/// The answer to an ask that gets no units now: `retry_after` set when the
/// client is to deny once its holding is spent.
pub(super) fn waiting(retry_after: Option<Duration>, renew_after: Duration) -> Grant {
    Grant {
        units: 0,
        valid_for: Duration::ZERO,
        limits: Vec::new(),
        retry_after,
        renew_after,
    }
}

/// The answer to an ask that gets nothing and need not wait.
pub(super) fn nothing() -> Grant {
    waiting(None, Duration::ZERO)
}

/// A lease's size: the share's rate for the lease's time, within the
/// policy's largest lease, and at least one unit.
pub(super) fn lease_size(leasable: &Leasable, share_rate: f64) -> f64 {
    (share_rate * leasable.max_duration.as_secs_f64())
        .min(leasable.max_units as f64)
        .max(1.0)
}

/// How long granted units are valid: the policy's longest lease, and for a
/// window no longer than the window the units were spent in.
pub(super) fn valid_for(
    policy: &Policy,
    limits: &[(Label, Decision)],
    longest: Duration,
) -> Duration {
    policy
        .limits
        .iter()
        .zip(limits)
        .filter(|(limit, _)| matches!(limit.algorithm, crate::algorithm::Algorithm::FixedWindow(_)))
        .map(|(_, (_, decision))| decision.reset_after().as_duration())
        .fold(longest, Duration::min)
}

/// The longest wait among the denying limits.
pub(super) fn longest_wait(limits: &[(Label, Decision)]) -> Option<Duration> {
    limits
        .iter()
        .filter_map(|(_, decision)| match decision.retry_after() {
            RetryAfter::After(wait) if !decision.is_allowed() => Some(wait.as_duration()),
            _ => None,
        })
        .max()
}

/// What the tightest enforcing limit of `policy` has left after `spent`,
/// and until when that stands (its reset: a window's end, a bucket's
/// refill), or `None` when no limit enforces.
pub(super) fn least_left(
    policy: &Policy,
    spent: &[MarkedDecision],
    now: Instant,
) -> Option<(u64, Instant)> {
    policy
        .limits
        .iter()
        .zip(spent)
        .filter(|(limit, _)| !limit.shadow)
        .map(|(_, (decision, _))| {
            (
                decision.remaining(),
                now + decision.reset_after().as_duration(),
            )
        })
        .min_by_key(|&(left, _)| left)
}

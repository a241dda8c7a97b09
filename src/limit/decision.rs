//! A limit's answer to one request, built so that it cannot say two things
//! at once: an allowed decision has nothing to wait for, and only a denied
//! one says how long to wait, or that waiting will never do.

use super::Micros;

/// When a denied request could be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryAfter {
    /// After this long (zero for an allowed decision: now).
    After(Micros),
    /// Never: the cost exceeds the limit or capacity itself.
    Never,
}

/// Whether the cost may be spent, and if not, when it could be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allowed,
    Denied(RetryAfter),
}

/// The answer. Being over the limit is a decision, not an error.
///
/// ```
/// use ratelimitd::limit::{Decision, Micros, RetryAfter};
///
/// let denied = Decision::denied(
///     10,
///     0,
///     Micros::from_secs(30),
///     RetryAfter::After(Micros::from_secs(6)),
/// );
/// assert!(!denied.is_allowed());
/// assert_eq!(denied.limit(), 10);
/// assert_eq!(denied.retry_after(), RetryAfter::After(Micros::from_secs(6)));
///
/// // An allowed decision waits for nothing.
/// let allowed = Decision::allowed(10, 9, Micros::from_secs(30));
/// assert_eq!(allowed.retry_after(), RetryAfter::After(Micros::ZERO));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    verdict: Verdict,
    limit: u64,
    remaining: u64,
    reset_after: Micros,
    degraded: bool,
    local_cache: bool,
}

impl Decision {
    /// The cost may be spent (it was, unless it was a look): `remaining` is
    /// what is left after it, and the key is back to its whole `limit` in
    /// `reset_after`.
    pub fn allowed(limit: u64, remaining: u64, reset_after: Micros) -> Self {
        Self {
            verdict: Verdict::Allowed,
            limit,
            remaining,
            reset_after,
            degraded: false,
            local_cache: false,
        }
    }

    /// The cost is refused: it could pass after `retry_after`, or never (a
    /// cost above the limit).
    pub fn denied(
        limit: u64,
        remaining: u64,
        reset_after: Micros,
        retry_after: RetryAfter,
    ) -> Self {
        Self {
            verdict: Verdict::Denied(retry_after),
            limit,
            remaining,
            reset_after,
            degraded: false,
            local_cache: false,
        }
    }

    /// The same decision, marked as made by the failure policy, without the
    /// shared store.
    pub fn marked_degraded(self) -> Self {
        Self {
            degraded: true,
            ..self
        }
    }

    /// The same decision, marked as the local over-limit cache's, made
    /// without asking the store.
    pub fn marked_local_cache(self) -> Self {
        Self {
            local_cache: true,
            ..self
        }
    }

    /// Answered from the local over-limit cache.
    pub fn is_from_local_cache(&self) -> bool {
        self.local_cache
    }

    /// Whether the cost may be spent now.
    pub fn is_allowed(&self) -> bool {
        self.verdict == Verdict::Allowed
    }

    /// The limit or capacity in force.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Units left after this decision.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Until the key is back to its full quota.
    pub fn reset_after(&self) -> Micros {
        self.reset_after
    }

    /// When the cost could pass: at once (after zero) when allowed.
    pub fn retry_after(&self) -> RetryAfter {
        match self.verdict {
            Verdict::Allowed => RetryAfter::After(Micros::ZERO),
            Verdict::Denied(retry_after) => retry_after,
        }
    }

    /// Decided by the failure policy, without the shared store.
    pub fn is_degraded(&self) -> bool {
        self.degraded
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allowed_decision_never_waits_and_a_denied_one_says_how_long() {
        let allowed = Decision::allowed(5, 4, Micros::from_millis(1));
        assert!(allowed.is_allowed() && !allowed.is_degraded());
        assert_eq!(allowed.retry_after(), RetryAfter::After(Micros::ZERO));
        let never = Decision::denied(5, 5, Micros::ZERO, RetryAfter::Never);
        assert!(!never.is_allowed());
        assert_eq!(never.retry_after(), RetryAfter::Never);
        let degraded = never.marked_degraded();
        assert!(degraded.is_degraded());
        assert_eq!(degraded.retry_after(), RetryAfter::Never);
    }
}

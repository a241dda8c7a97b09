//! What the [`Decider`](super::Decider) answers a question: one decision,
//! or several with a label each and the overall answer spoken by the most
//! restrictive of them.

use std::cmp::Reverse;

use super::question::Label;
use crate::limit::{Decision, Micros, RetryAfter};

/// The answer to one [`Question`](super::Question).
#[derive(Debug, Clone)]
pub enum Answer {
    /// The one limit's decision.
    One(Decision),
    /// Several limits' (or a policy's) decisions.
    Several(Several),
}

/// The decisions on several limits asked together, one per limit in the
/// order asked, each with its label.
#[derive(Debug, Clone)]
pub struct Several {
    /// What each limit's answer reports besides its decision.
    pub labels: Vec<Label>,
    /// One decision per label.
    pub decisions: Vec<Decision>,
}

impl Several {
    /// Allowed when every limit not in shadow mode allows (shadow limits
    /// never deny).
    pub fn is_allowed(&self) -> bool {
        self.enforcing().all(|i| self.decisions[i].is_allowed())
    }

    /// Some limit was answered by the failure policy, not the store.
    pub fn is_degraded(&self) -> bool {
        self.decisions.iter().any(Decision::is_degraded)
    }

    /// The limit that speaks for the answer: denied, the denying limit
    /// with the longest wait (a cost that never fits waits longest);
    /// allowed, the one with the fewest units left, then the longest
    /// reset. Ties go to the first; with every limit in shadow mode, the
    /// most restrictive of them all. `None` only without limits.
    pub fn most_restrictive(&self) -> Option<usize> {
        let allowed = self.is_allowed();
        let restrictiveness = |decision: &Decision| {
            if allowed || decision.is_allowed() {
                (1, decision.remaining(), Reverse(decision.reset_after()))
            } else {
                let wait = match decision.retry_after() {
                    RetryAfter::After(micros) => micros,
                    RetryAfter::Never => Micros::MAX,
                };
                (0, 0, Reverse(wait))
            }
        };
        let enforcing: Vec<usize> = self.enforcing().collect();
        let candidates = if enforcing.is_empty() {
            (0..self.decisions.len()).collect()
        } else {
            enforcing
        };
        // `min_by_key` keeps the first of equals.
        candidates
            .into_iter()
            .min_by_key(|&i| restrictiveness(&self.decisions[i]))
    }

    /// The limits that may deny: those not in shadow mode.
    fn enforcing(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.decisions.len()).filter(|&i| !self.labels.get(i).is_some_and(|label| label.shadow))
    }
}

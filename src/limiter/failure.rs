//! The failure policy: what a call gets while Redis cannot decide (the
//! error itself, everything allowed, or this instance's own state), marked
//! degraded.

use tracing::debug;

use super::in_memory;
use super::keys::{Combination, GroupDecisions, Groups};
use crate::algorithm::State;
use crate::algorithm::{Algorithm, LimitRequest};
use crate::error::StoreError;
use crate::limit::{Decision, FailurePolicy, Micros, RetryAfter};
use crate::store::MemoryStore;

/// The failure policy's answer while Redis cannot decide (`err`): the error
/// itself (fail closed, or `local` without a `local` store), or degraded
/// decisions.
pub(super) fn answer(
    err: StoreError,
    policy: FailurePolicy,
    local: Option<&MemoryStore<State>>,
    groups: &Groups,
    requests: &[LimitRequest],
    combination: Combination,
) -> Result<GroupDecisions, StoreError> {
    debug!(%err, ?policy, "Redis cannot decide: the failure policy answers");
    let decisions = match (policy, local) {
        (FailurePolicy::FailClosed, _) | (FailurePolicy::Local, None) => return Err(err),
        (FailurePolicy::FailOpen, _) => groups.decide(|_, group| {
            Ok::<_, StoreError>(fail_open(group.algorithm(requests), group.cost))
        })?,
        (FailurePolicy::Local, Some(local)) => {
            in_memory::decide(local, groups, requests, combination)?
        }
    };
    Ok(decisions.map(Decision::marked_degraded))
}

/// Failing open: allowed, with the whole limit said to remain (nothing is
/// known), except a cost no state could ever allow.
fn fail_open(algorithm: &Algorithm, cost: u64) -> Decision {
    let limit = algorithm.limit();
    let decision = if cost <= limit {
        Decision::allowed(limit, limit - cost, Micros::ZERO)
    } else {
        Decision::denied(limit, 0, Micros::ZERO, RetryAfter::Never)
    };
    decision.marked_degraded()
}

/// What a limit of a cached denial reports when Redis cannot say what it
/// has: its whole limit, the most it could have (marked degraded).
pub(super) fn unknown_remaining(algorithm: &Algorithm) -> Decision {
    let limit = algorithm.limit();
    Decision::allowed(limit, limit, Micros::ZERO).marked_degraded()
}

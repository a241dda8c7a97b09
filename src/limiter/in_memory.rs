//! Deciding a call's groups on an embedded store (the configured one, or
//! this instance's own state under the `local` failure policy): the twin of
//! the decision script, through `algorithm`'s drivers.

use super::keys::{Combination, GroupDecisions, Groups};
use super::script::SpendMark;
use crate::algorithm::LimitRequest;
use crate::algorithm::{self, State};
use crate::error::StoreError;
use crate::limit::{Decision, Micros};
use crate::store::memory::{HeapSize, LockedKeys};
use crate::store::{MemoryChange, MemoryStore};

/// Decides the groups on `memory`, all of them under one lock of their
/// shards, at one instant.
pub(super) fn decide(
    memory: &MemoryStore<State>,
    groups: &Groups,
    requests: &[LimitRequest],
    combination: Combination,
) -> Result<GroupDecisions, StoreError> {
    if let ([group], Combination::AllOrNothing) = (&*groups.unique, combination) {
        // Most calls decide one key: borrow its parameters in place rather
        // than collect them, as this path runs millions of times a second.
        let algorithm = group.algorithm(requests);
        let decisions = memory.with_keys(&[group.key.as_str()], |locked, now| {
            algorithm::decide_together(
                std::slice::from_ref(&group.cost),
                std::slice::from_ref(&group.shadow),
                |i, cost, spend| {
                    locked.decide(i, |state| {
                        algorithm::decide_in_memory(algorithm, state, now, cost, spend)
                    })
                },
            )
        });
        return groups.expect_one_each(decisions);
    }
    let keys: Vec<&str> = groups.unique.iter().map(|g| g.key.as_str()).collect();
    let costs: Vec<u64> = groups.unique.iter().map(|g| g.cost).collect();
    let decisions = memory.with_keys(&keys, |locked, now| {
        decide_locked(locked, now, groups, requests, &costs, combination)
    });
    groups.expect_one_each(decisions)
}

/// Decides every group on its locked key at `now`, each spending its
/// `costs[i]`, as `combination` says: one decision per group.
fn decide_locked(
    locked: &mut LockedKeys<'_, State>,
    now: Micros,
    groups: &Groups,
    requests: &[LimitRequest],
    costs: &[u64],
    combination: Combination,
) -> Vec<Decision> {
    let mut decide = |i: usize, cost, spend| {
        let algorithm = groups.unique[i].algorithm(requests);
        locked.decide(i, |state| {
            algorithm::decide_in_memory(algorithm, state, now, cost, spend)
        })
    };
    match combination {
        Combination::Each => algorithm::decide_each(costs, decide),
        Combination::AllOrNothing => {
            let shadow: Vec<bool> = groups.unique.iter().map(|g| g.shadow).collect();
            algorithm::decide_together(costs, &shadow, &mut decide)
        }
    }
}

/// Decides the groups on `memory` all or nothing, as [`decide`] does, and
/// answers with each group's decision the mark of its spend, if it spent
/// (no enforcing limit denied, and it has a cost), read under the same
/// locks: the twin of the decision script's marks.
pub(super) fn decide_marked(
    memory: &MemoryStore<State>,
    groups: &Groups,
    requests: &[LimitRequest],
) -> Result<(GroupDecisions, Vec<Option<SpendMark>>), StoreError> {
    let keys: Vec<&str> = groups.unique.iter().map(|g| g.key.as_str()).collect();
    let costs: Vec<u64> = groups.unique.iter().map(|g| g.cost).collect();
    memory.with_keys(&keys, |locked, now| {
        let decided = decide_locked(
            locked,
            now,
            groups,
            requests,
            &costs,
            Combination::AllOrNothing,
        );
        let decisions = groups.expect_one_each(decided)?;
        let spent = !decisions.denies(groups);
        let marks = decisions
            .by_group()
            .iter()
            .enumerate()
            .map(|(i, decision)| {
                if !spent || !decision.is_allowed() || costs[i] == 0 {
                    return None;
                }
                let algorithm = groups.unique[i].algorithm(requests);
                locked.decide(i, |state| {
                    let mark = state.as_ref().map(|state| {
                        SpendMark::of(algorithm, algorithm::mark_in_memory(algorithm, state))
                    });
                    (mark, MemoryChange::None)
                })
            })
            .collect();
        Ok((decisions, marks))
    })
}

/// How much the embedded store charges a key for its state.
impl HeapSize for State {
    fn heap_bytes(&self) -> usize {
        match self {
            // The only state with a buffer: the log's entries.
            Self::SlidingWindow(log) => log.heap_bytes(),
            _ => 0,
        }
    }
}

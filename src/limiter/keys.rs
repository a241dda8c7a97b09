//! Naming storage keys, and grouping one call's requests by the key they
//! name (requests on one key are decided as one, their costs added), with
//! the groups' Redis Cluster slots, and how the groups combine (together or
//! each on its own). What every store's driver starts from.

use std::collections::HashMap;

use redis::cluster_routing::Slot;

use crate::algorithm;
use crate::algorithm::{Algorithm, LimitRequest};
use crate::error::StoreError;
use crate::limit::{CallerKey, Decision, KeyOrigin};

/// Up to this many requests per call, groups are found by a scan.
const SCAN_GROUPS_UP_TO: usize = 16;

/// Requests grouped by storage key.
pub(super) struct Groups {
    pub(super) unique: OneOrMany<Group>,
    /// For each request, the index of its group in `unique`.
    of_request: OneOrMany<usize>,
}

/// A list that holds a single item without allocating: most calls carry one
/// request, and on the embedded store allocations are a good part of a
/// decision's cost. Used as a slice.
pub(super) enum OneOrMany<T> {
    One([T; 1]),
    Many(Vec<T>),
}

impl<T> std::ops::Deref for OneOrMany<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Self::One(item) => item,
            Self::Many(items) => items,
        }
    }
}

impl<'a, T> IntoIterator for &'a OneOrMany<T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

pub(super) struct Group {
    pub(super) key: String,
    /// The request whose algorithm decides the group.
    pub(super) first: usize,
    pub(super) cost: u64,
    /// Only if every request of the group is in shadow mode.
    pub(super) shadow: bool,
}

impl Group {
    /// The algorithm that decides the group: its first request's.
    pub(super) fn algorithm<'r>(&self, requests: &'r [LimitRequest]) -> &'r Algorithm {
        &requests[self.first].algorithm
    }
}

impl Groups {
    pub(super) fn new(prefix: &str, requests: &[LimitRequest]) -> Self {
        if let [request] = requests {
            return Self {
                unique: OneOrMany::One([Group {
                    key: storage_key(prefix, &request.algorithm, &request.key),
                    first: 0,
                    cost: request.cost,
                    shadow: request.shadow,
                }]),
                of_request: OneOrMany::One([0]),
            };
        }
        let mut unique: Vec<Group> = Vec::with_capacity(requests.len());
        let mut of_request = Vec::with_capacity(requests.len());
        // Requests per call are usually few (Envoy descriptors), and then a
        // scan is cheapest; a map keeps a large call (bounds raised by the
        // operator) linear rather than quadratic.
        let mut index_of: Option<HashMap<String, usize>> =
            (requests.len() > SCAN_GROUPS_UP_TO).then(|| HashMap::with_capacity(requests.len()));
        for (index, request) in requests.iter().enumerate() {
            let key = storage_key(prefix, &request.algorithm, &request.key);
            let existing = match &index_of {
                Some(index_of) => index_of.get(&key).copied(),
                None => unique.iter().position(|group| group.key == key),
            };
            match existing {
                Some(existing) => {
                    let group = &mut unique[existing];
                    group.cost = group.cost.saturating_add(request.cost);
                    group.shadow &= request.shadow;
                    of_request.push(existing);
                }
                None => {
                    if let Some(index_of) = &mut index_of {
                        index_of.insert(key.clone(), unique.len());
                    }
                    of_request.push(unique.len());
                    unique.push(Group {
                        key,
                        first: index,
                        cost: request.cost,
                        shadow: request.shadow,
                    });
                }
            }
        }
        Self {
            unique: OneOrMany::Many(unique),
            of_request: OneOrMany::Many(of_request),
        }
    }
}

/// `<prefix>{<tag>:<key>}`, with the tag `rls:<tag>` for keys composed from
/// Envoy descriptors (`rlh:<tag>` for one kept as its digest, see
/// [`CallerKey::envoy`]), `lim:<tag>` for a named limit and `pol:<tag>` for
/// a policy's ([`CallerKey::named`], [`CallerKey::policy`]). The braces are a Redis Cluster hash tag: every key of
/// one limit hashes to one slot, whatever the key holds (a `}` inside it
/// only shortens the tag; the key itself stays unique). The algorithm's tag
/// keeps one caller key under two algorithms apart, and no `CheckLimit` key
/// can name an Envoy, named or policy one (no algorithm's tag is `rls`,
/// `rlh`, `lim` or `pol`).
///
/// A key named as envoyproxy/ratelimit names its counters
/// ([`CallerKey::upstream`]) is `<prefix><name>` exactly, as upstream
/// stores it (no hash tag: a request's keys may live on several Cluster
/// nodes). Its name ends in its window's start, a number, where every
/// other key ends in `}`, so none of them can name it.
pub fn storage_key(prefix: &str, algorithm: &Algorithm, key: &CallerKey) -> String {
    let tag = algorithm::key_tag(algorithm);
    let origin = match key.origin() {
        KeyOrigin::CheckLimit => "",
        KeyOrigin::Envoy => "rls:",
        KeyOrigin::EnvoyDigest => "rlh:",
        KeyOrigin::Named => "lim:",
        KeyOrigin::Policy => "pol:",
        KeyOrigin::Upstream => return format!("{prefix}{}", key.as_str()),
    };
    let text = key.as_str();
    let mut storage =
        String::with_capacity(prefix.len() + origin.len() + tag.len() + text.len() + 3);
    storage.push_str(prefix);
    storage.push('{');
    storage.push_str(origin);
    storage.push_str(tag);
    storage.push(':');
    storage.push_str(text);
    storage.push('}');
    storage
}

/// One decision per group of a [`Groups`], in order. Only the groups make
/// one ([`Groups::decide`]), so it always holds exactly one per group, and
/// every request finds its group's decision.
pub(super) struct GroupDecisions(Vec<Decision>);

impl Groups {
    /// Decides every group with `decide(index, group)`: one decision each.
    pub(super) fn decide<E>(
        &self,
        mut decide: impl FnMut(usize, &Group) -> Result<Decision, E>,
    ) -> Result<GroupDecisions, E> {
        self.unique
            .iter()
            .enumerate()
            .map(|(g, group)| decide(g, group))
            .collect::<Result<_, _>>()
            .map(GroupDecisions)
    }

    /// Takes `decisions` from a driver that decides every group in order
    /// (`decide_together`, `decide_each`); a count that does not match is a
    /// reply error rather than a misaligned answer.
    pub(super) fn expect_one_each(
        &self,
        decisions: Vec<Decision>,
    ) -> Result<GroupDecisions, StoreError> {
        if decisions.len() != self.unique.len() {
            return Err(StoreError::Reply(format!(
                "{} decisions for {} keys",
                decisions.len(),
                self.unique.len()
            )));
        }
        Ok(GroupDecisions(decisions))
    }

    /// Each request's decision: its group's.
    pub(super) fn per_request(&self, decisions: GroupDecisions) -> Vec<Decision> {
        if self.of_request.len() == self.unique.len() {
            // Every request is a group of its own, and groups are made in
            // the order of their first requests: the decisions are in
            // order already (most calls carry one request).
            return decisions.0;
        }
        self.of_request.iter().map(|&g| decisions.0[g]).collect()
    }

    /// The groups `members` by Redis Cluster slot: each inner list can go
    /// to one node in one script.
    pub(super) fn by_slot(&self, members: impl IntoIterator<Item = usize>) -> Vec<Vec<usize>> {
        // In order of first appearance, so a call's scripts are stable.
        let mut position_of_slot: HashMap<Slot, usize> = HashMap::new();
        let mut slots: Vec<Vec<usize>> = Vec::new();
        for g in members {
            let slot = Slot::for_key(self.unique[g].key.as_bytes());
            let position = *position_of_slot.entry(slot).or_insert_with(|| {
                slots.push(Vec::new());
                slots.len() - 1
            });
            slots[position].push(g);
        }
        slots
    }
}

impl GroupDecisions {
    /// The decisions, by group index.
    pub(super) fn by_group(&self) -> &[Decision] {
        &self.0
    }

    /// Does one of `groups` not in shadow mode deny?
    pub(super) fn denies(&self, groups: &Groups) -> bool {
        groups
            .unique
            .iter()
            .zip(&self.0)
            .any(|(group, decision)| !group.shadow && !decision.is_allowed())
    }

    /// Changes every decision with `change`.
    pub(super) fn map(self, change: impl FnMut(Decision) -> Decision) -> Self {
        Self(self.0.into_iter().map(change).collect())
    }
}

/// Which store decides a request, when there are two.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Route {
    /// The main store: every limit but Envoy's per-second rules.
    #[default]
    Main,
    /// The per-second Redis, when one is configured (the main store
    /// otherwise): Envoy's rules whose unit is second.
    PerSecond,
}

impl Groups {
    /// The store of each group, by its first request's route (`routes`,
    /// one per request; `Main` where missing): one route for them all, or
    /// each group's.
    pub(super) fn routes(&self, routes: &[Route]) -> Result<Route, Vec<Route>> {
        let of = |group: &Group| routes.get(group.first).copied().unwrap_or_default();
        let first = self.unique.first().map(of).unwrap_or_default();
        if self.unique.iter().all(|group| of(group) == first) {
            return Ok(first);
        }
        Err(self.unique.iter().map(of).collect())
    }

    /// The index of request `request`'s group.
    pub(super) fn group_of(&self, request: usize) -> Option<usize> {
        self.of_request.get(request).copied()
    }
}

/// How one call's limits are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Combination {
    /// Together: all spend, or none does.
    AllOrNothing,
    /// Each on its own, counting denied hits where the algorithm does.
    Each,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{FixedWindow, SlidingWindow};

    fn caller(key: &str) -> CallerKey {
        CallerKey::new(key.into()).unwrap()
    }

    #[test]
    fn keys_carry_prefix_algorithm_and_a_hash_tag() {
        let fixed = Algorithm::FixedWindow(FixedWindow::new(1, Duration::from_secs(1)).unwrap());
        let sliding =
            Algorithm::SlidingWindow(SlidingWindow::new(1, Duration::from_secs(1)).unwrap());
        assert_eq!(
            storage_key("ratelimitd:", &sliding, &caller("user42")),
            "ratelimitd:{sl:user42}"
        );
        assert_ne!(
            storage_key("p:", &fixed, &caller("user42")),
            storage_key("p:", &sliding, &caller("user42"))
        );
        assert_ne!(
            storage_key("p:", &fixed, &caller("rls:fw:x")),
            storage_key("p:", &fixed, &CallerKey::envoy("x".into()))
        );
        assert_eq!(
            storage_key("p:", &fixed, &CallerKey::upstream("d_k_v_60".into())),
            "p:d_k_v_60"
        );
    }
}

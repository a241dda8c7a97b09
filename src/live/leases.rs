//! The lease holders the console's live view shows: for each policy leased
//! on this instance, each stream's lease on each key, with its share of the
//! policy's rate, its demand, and the units granted and admitted in all.
//!
//! Bounded: at most [`MAX_LEASE_HOLDERS`] are shown; a holder beyond them is
//! left out until a place frees up (it shows at its next ask). The view is
//! not a metric, so a caller's key may appear here, as it does in the
//! denied-keys sketch; no holder ever becomes a label.

use std::collections::BTreeMap;

use serde::Serialize;

/// Most holders shown, over all policies.
pub(crate) const MAX_LEASE_HOLDERS: usize = 200;

/// What the console shows of one holding, as its stream's server knows it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct HolderStats {
    /// Its share of the policy's rate, units per second.
    pub share_per_second: f64,
    /// Its client's last reported demand, requests per second.
    pub demand_per_second: f64,
    /// Units granted, in all.
    pub granted: u64,
    /// Units its client reported admitting, in all.
    pub admitted: u64,
}

/// Every holder shown, by (policy, holder, key): ordered, so that the view
/// groups by policy and lists holders in a stable order.
#[derive(Debug, Default)]
pub(super) struct Holders {
    shown: BTreeMap<(String, String, String), HolderStats>,
}

impl Holders {
    /// Shows `stats` for `holder`'s lease on `policy` and `key`, if it is
    /// shown already or there is room.
    pub(super) fn update(&mut self, policy: &str, holder: &str, key: &str, stats: HolderStats) {
        // A tuple of owned strings is looked up only by one: cheap enough,
        // as a lease is asked for a few times a second at most.
        let place = (policy.to_owned(), holder.to_owned(), key.to_owned());
        if let Some(shown) = self.shown.get_mut(&place) {
            *shown = stats;
        } else if self.shown.len() < MAX_LEASE_HOLDERS {
            self.shown.insert(place, stats);
        }
    }

    /// Stops showing `holder`'s lease on `policy` and `key`.
    pub(super) fn remove(&mut self, policy: &str, holder: &str, key: &str) {
        self.shown
            .remove(&(policy.to_owned(), holder.to_owned(), key.to_owned()));
    }

    /// The holders, grouped by policy, policies in order of their names.
    pub(super) fn view(&self) -> Vec<LeasedPolicy> {
        let mut policies: Vec<LeasedPolicy> = Vec::new();
        for ((policy, holder, key), stats) in &self.shown {
            let holder = LeaseHolder {
                holder: holder.clone(),
                key: key.clone(),
                share_units_per_second: stats.share_per_second,
                demand_requests_per_second: stats.demand_per_second,
                granted: stats.granted,
                admitted: stats.admitted,
            };
            match policies.last_mut() {
                Some(last) if last.policy == *policy => {
                    last.share_units_per_second += holder.share_units_per_second;
                    last.holders.push(holder);
                }
                _ => policies.push(LeasedPolicy {
                    policy: policy.clone(),
                    share_units_per_second: holder.share_units_per_second,
                    holders: vec![holder],
                }),
            }
        }
        policies
    }
}

/// A policy leased on this instance, and its holders.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LeasedPolicy {
    /// The policy.
    pub policy: String,
    /// Its holders on this instance, by holder then key.
    pub holders: Vec<LeaseHolder>,
    /// Their shares added up, units per second.
    pub share_units_per_second: f64,
}

/// One stream's lease on a policy and key.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct LeaseHolder {
    /// The lease stream: `<instance>:l<n>`, as on the fair-share ledger.
    pub holder: String,
    /// The key its per-key limits spend (as the client sent it).
    pub key: String,
    /// Its share of the policy's rate, units per second, as last settled.
    pub share_units_per_second: f64,
    /// Its client's last reported demand, requests per second.
    pub demand_requests_per_second: f64,
    /// Units granted to it, in all.
    pub granted: u64,
    /// Units its client reported admitting, in all.
    pub admitted: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(share: f64, demand: f64, granted: u64, admitted: u64) -> HolderStats {
        HolderStats {
            share_per_second: share,
            demand_per_second: demand,
            granted,
            admitted,
        }
    }

    #[test]
    fn holders_are_grouped_by_policy_with_their_shares_summed() {
        let mut holders = Holders::default();
        holders.update("hot", "i:l2", "b", stats(400.0, 50.0, 20, 5));
        holders.update("cold", "i:l1", "a", stats(10.0, 1.0, 1, 0));
        holders.update("hot", "i:l1", "a", stats(600.0, 300.0, 100, 40));
        // A renewal replaces what was shown.
        holders.update("hot", "i:l1", "a", stats(600.0, 310.0, 150, 90));
        let view = holders.view();
        let policies: Vec<(&str, f64, usize)> = view
            .iter()
            .map(|p| (p.policy.as_str(), p.share_units_per_second, p.holders.len()))
            .collect();
        assert_eq!(policies, [("cold", 10.0, 1), ("hot", 1000.0, 2)]);
        let first = &view[1].holders[0];
        assert_eq!(
            (
                first.holder.as_str(),
                first.key.as_str(),
                first.demand_requests_per_second,
                first.granted,
                first.admitted
            ),
            ("i:l1", "a", 310.0, 150, 90)
        );
        holders.remove("hot", "i:l1", "a");
        holders.remove("hot", "i:l9", "nobody");
        let view = holders.view();
        assert_eq!(view[1].holders.len(), 1);
        assert_eq!(view[1].share_units_per_second, 400.0);
        holders.remove("cold", "i:l1", "a");
        assert_eq!(holders.view().len(), 1, "a policy without holders goes");
    }

    #[test]
    fn at_most_the_bound_is_shown_and_a_freed_place_is_taken_at_the_next_ask() {
        let mut holders = Holders::default();
        for n in 0..MAX_LEASE_HOLDERS + 10 {
            holders.update("hot", &format!("i:l{n}"), "k", stats(1.0, 1.0, 1, 0));
        }
        let shown = |holders: &Holders| -> usize {
            holders
                .view()
                .iter()
                .map(|policy| policy.holders.len())
                .sum()
        };
        assert_eq!(shown(&holders), MAX_LEASE_HOLDERS);
        // One shown already is still updated when full.
        holders.update("hot", "i:l0", "k", stats(7.0, 1.0, 1, 0));
        assert_eq!(holders.view()[0].holders[0].share_units_per_second, 7.0);
        holders.remove("hot", "i:l0", "k");
        let late = format!("i:l{}", MAX_LEASE_HOLDERS + 5);
        holders.update("hot", &late, "k", stats(1.0, 1.0, 1, 0));
        assert_eq!(shown(&holders), MAX_LEASE_HOLDERS);
        assert!(
            holders.view()[0].holders.iter().any(|h| h.holder == late),
            "the late holder takes the freed place"
        );
    }
}

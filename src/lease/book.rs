//! One lease stream's book: for each policy and key its client leases,
//! what the server granted it, what it reported spending, and its share.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use super::sizing::Allowance;
use crate::limiter::script::SpendMark;
use crate::policy::Policy;

/// Below this part of its fair share, a client is underserved.
const UNDERSERVED: f64 = 0.9;

/// A client's lease on one policy and key, as its stream's server knows it.
#[derive(Debug)]
pub(crate) struct Holding {
    /// Where its share is settled.
    pub ledger_key: String,
    /// The policy as last leased (the rules may reload in between).
    pub policy: Arc<Policy>,
    /// Units granted, in all.
    pub granted: u64,
    /// Units the client reported admitting, in all: never above `granted`.
    pub admitted: u64,
    /// Units given back, in all.
    pub returned: u64,
    /// The grants whose units may still be valid, oldest first.
    pub tranches: VecDeque<Tranche>,
    /// What may be granted now, held to the share.
    pub allowance: Allowance,
    /// Its share of the policy's rate, units per second.
    pub share_rate: f64,
    /// How many clients lease the same policy (and key), itself included,
    /// at its last settlement: beside others it is held to its share.
    pub subscribers: u64,
    /// When its share was last settled.
    pub settled_at: Option<Instant>,
    /// Its last reported demand, requests per second.
    pub demand: f64,
    /// Whether its last grant was cut short by what the limits had left.
    pub low: bool,
    /// What the tightest limit had left after its last grant, and until
    /// when that stands.
    pub left: Option<(u64, Instant)>,
}

/// Units granted at once, and what finds their spend again.
#[derive(Debug, Clone)]
pub(crate) struct Tranche {
    /// Units granted.
    pub units: u64,
    /// Until when they are valid.
    pub until: Instant,
    /// The policy they were spent on.
    pub policy: Arc<Policy>,
    /// Each of its limits' mark of the spend, in the policy's order;
    /// `None` where a limit spent nothing (in shadow mode, it denied).
    pub marks: Vec<Option<SpendMark>>,
}

/// Units to give back to the spends that one set of marks finds.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GiveBack {
    /// Units to give back.
    pub units: u64,
    /// The policy they were spent on.
    pub policy: Arc<Policy>,
    /// Each limit's mark of the spend, in the policy's order.
    pub marks: Vec<Option<SpendMark>>,
}

impl Holding {
    /// Units granted that are still valid at `now` and were not reported
    /// spent: the most a client can give back.
    pub(crate) fn outstanding(&mut self, now: Instant) -> u64 {
        while self
            .tranches
            .front()
            .is_some_and(|tranche| tranche.until <= now)
        {
            self.tranches.pop_front();
        }
        let valid: u64 = self.tranches.iter().map(|tranche| tranche.units).sum();
        valid.min(self.lapsed())
    }

    /// `units` (at most [`Holding::outstanding`]) as given back to the
    /// tranches valid at `now`, the latest first: a client spends the
    /// units it holds oldest first, so those it still holds are the
    /// latest. Tranches spent on the same windows are given back at once.
    pub(crate) fn give_back(&mut self, now: Instant, units: u64) -> Vec<GiveBack> {
        let mut left = units.min(self.outstanding(now));
        let mut parts: Vec<GiveBack> = Vec::new();
        for tranche in self.tranches.iter().rev() {
            if left == 0 {
                break;
            }
            let taken = tranche.units.min(left);
            left -= taken;
            match parts.last_mut() {
                Some(last)
                    if Arc::ptr_eq(&last.policy, &tranche.policy)
                        && last.marks == tranche.marks =>
                {
                    last.units += taken;
                }
                _ => parts.push(GiveBack {
                    units: taken,
                    policy: tranche.policy.clone(),
                    marks: tranche.marks.clone(),
                }),
            }
        }
        parts
    }

    /// Whether other clients lease the same policy (and key) too.
    pub(crate) fn contended(&self) -> bool {
        self.subscribers > 1
    }

    /// Whether its share is well below what a max-min fair split of `rate`
    /// gives its last reported demand (that demand, or an equal part of
    /// the rate if less): its demand rose since the share was settled.
    pub(crate) fn underserved(&self, rate: f64) -> bool {
        let fair = self.demand.min(rate / self.subscribers.max(1) as f64);
        self.share_rate < UNDERSERVED * fair
    }

    /// Units granted that were neither reported spent nor given back:
    /// lapsed unspent, once the lease is gone.
    pub(crate) fn lapsed(&self) -> u64 {
        self.granted.saturating_sub(self.admitted + self.returned)
    }
}

/// Every lease one stream holds, by (policy, key).
#[derive(Debug, Default)]
pub(crate) struct Book {
    holdings: HashMap<(String, String), Holding>,
}

impl Book {
    /// The lease on `policy` and `key`, if held.
    pub(crate) fn get_mut(&mut self, policy: &str, key: &str) -> Option<&mut Holding> {
        self.holdings.get_mut(&(policy.to_owned(), key.to_owned()))
    }

    /// Holds a new lease.
    pub(crate) fn insert(&mut self, policy: &str, key: &str, holding: Holding) -> &mut Holding {
        self.holdings
            .entry((policy.to_owned(), key.to_owned()))
            .or_insert(holding)
    }

    /// Lets the lease on `policy` and `key` go.
    pub(crate) fn remove(&mut self, policy: &str, key: &str) -> Option<Holding> {
        self.holdings.remove(&(policy.to_owned(), key.to_owned()))
    }

    /// How many leases the stream holds.
    pub(crate) fn len(&self) -> usize {
        self.holdings.len()
    }

    /// Lets every lease go.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = ((String, String), Holding)> + '_ {
        self.holdings.drain()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Policy;

    fn holding(share_rate: f64, demand: f64, subscribers: u64) -> Holding {
        let now = Instant::now();
        Holding {
            ledger_key: "k".into(),
            policy: Arc::new(Policy {
                name: "p".into(),
                limits: Vec::new(),
                source: "test".into(),
            }),
            granted: 0,
            admitted: 0,
            returned: 0,
            tranches: VecDeque::new(),
            allowance: Allowance::full(0.0, now),
            share_rate,
            subscribers,
            settled_at: Some(now),
            demand,
            low: false,
            left: None,
        }
    }

    #[test]
    fn units_go_back_to_the_latest_valid_tranches_first_by_their_marks() {
        let mut lease = holding(10.0, 10.0, 1);
        let now = lease.settled_at.expect("settled");
        let policy = lease.policy.clone();
        let tranche = |units, secs, end| Tranche {
            units,
            until: now + std::time::Duration::from_secs(secs),
            policy: policy.clone(),
            marks: vec![Some(SpendMark::WindowEnd(end))],
        };
        lease.tranches =
            VecDeque::from([tranche(5, 1, 100), tranche(7, 2, 100), tranche(4, 3, 200)]);
        lease.granted = 16;
        let parts = |lease: &mut Holding, at, units| -> Vec<(u64, Vec<Option<SpendMark>>)> {
            lease
                .give_back(at, units)
                .into_iter()
                .map(|part| (part.units, part.marks))
                .collect()
        };
        let window = |end| vec![Some(SpendMark::WindowEnd(end))];
        assert_eq!(
            parts(&mut lease, now, 9),
            [(4, window(200)), (5, window(100))]
        );
        // Tranches spent in one window go back together.
        assert_eq!(
            parts(&mut lease, now, 14),
            [(4, window(200)), (10, window(100))]
        );
        // Never more than was granted, valid and not reported spent.
        lease.admitted = 10;
        assert_eq!(
            parts(&mut lease, now, 100),
            [(4, window(200)), (2, window(100))]
        );
        let later = now + std::time::Duration::from_millis(2500);
        assert_eq!(parts(&mut lease, later, 100), [(4, window(200))]);
    }

    #[test]
    fn underserved_is_well_below_the_max_min_share_of_the_demand() {
        // Four on 1000/s: an equal part is 250.
        assert!(
            holding(100.0, 300.0, 4).underserved(1000.0),
            "wants 300, fair 250"
        );
        assert!(
            !holding(240.0, 300.0, 4).underserved(1000.0),
            "within 10% of 250"
        );
        assert!(
            !holding(157.0, 150.0, 4).underserved(1000.0),
            "has its demand"
        );
        assert!(
            holding(50.0, 150.0, 4).underserved(1000.0),
            "its demand came back"
        );
        // Alone, its fair share is its demand, up to the whole rate.
        assert!(holding(100.0, 900.0, 1).underserved(1000.0));
        assert!(!holding(1000.0, 5000.0, 1).underserved(1000.0));
    }
}

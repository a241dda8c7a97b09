//! How one quota bucket's rate is shared among its subscribers: the Rust
//! twin of `share.lua`, for the embedded store (tests/suite/quota_twins.rs proves
//! the two equal). Pure: the caller holds the bucket's entries and the
//! clock.
//!
//! Each subscriber (one Envoy's stream, for one bucket) reports its demand;
//! the capacity is split max-min fair: a subscriber wanting less than an
//! equal share gets its want (demand plus headroom), and the rest is split
//! evenly among the others; when every want fits, what is left is split
//! evenly on top of them. The grants in force never add up to more than
//! the capacity: a subscriber's grant shrinks to its fair share at once
//! (or to within the hysteresis above it), and grows only into what the
//! others' grants in force leave free (they shrink when they settle next).
//!
//! A dead instance's subscribers no longer report: their demand stops
//! counting at once. But each one's Envoy may still enforce its last
//! assignment until its time to live, if it could not reconnect to another
//! instance; so a dead instance's entry whose grant is still in force is an
//! *orphan*, whose grant keeps counting until it runs out. Orphans are
//! released sooner only when the bucket has at least as many *newcomers*
//! (subscribers of live instances first settled after the orphans' last
//! settlement, as an Envoy that reconnected is) as orphans: then all at
//! once. A new Envoy arriving then is taken for a reconnected one: an
//! orphan may be released while its Envoy, cut off, still enforces it, for
//! at most its time to live.

use std::collections::HashMap;

/// A rate in millionths of a request per second.
pub type MicroRps = u64;

/// Milliseconds since the Unix epoch, on the store's clock.
pub type Millis = u64;

/// What a subscriber asks of a bucket's ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareOp {
    /// Its demand now (`None` while unknown: a new subscriber, which is
    /// given an equal share); answers its grant.
    Report(Option<MicroRps>),
    /// It is gone (its stream closed): its grant is free at once.
    Leave,
}

/// How shares are worked out: the bucket's policy and the service's
/// settings. (A leave needs none of them: the default serves.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShareParams {
    /// The bucket's rate, shared by all its subscribers.
    pub capacity: MicroRps,
    /// What a subscriber wants beyond its demand, per mille of it.
    pub headroom_permille: u64,
    /// The least a subscriber wants, so a quiet one can start again.
    pub min_want: MicroRps,
    /// How long a grant counts after it is written: the assignment's time
    /// to live, and a margin for the push to reach the Envoy.
    pub lease_ms: u64,
    /// How long a demand counts without a new report.
    pub stale_ms: u64,
    /// A new grant within this (per mille) of the one held keeps the one
    /// held, so small changes are not pushed.
    pub hysteresis_permille: u64,
}

/// One subscriber's entry in a bucket's ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// Its last reported demand; `None` while unknown.
    pub demand: Option<MicroRps>,
    /// Its share.
    pub grant: MicroRps,
    /// When its demand stops counting, unless it reports again.
    pub stale_at: Millis,
    /// When its grant stops counting: at or after its assignment's time to
    /// live runs out at the Envoy.
    pub expires_at: Millis,
    /// When it first settled, kept across its settlements.
    pub since: Millis,
    /// When it last settled.
    pub settled_at: Millis,
}

impl Entry {
    /// The entry as `share.lua` stores it: "demand grant stale_at
    /// expires_at since settled_at", demand -1 while unknown.
    pub fn encode(&self) -> String {
        let demand = self.demand.map_or(-1, |d| d as i64);
        format!(
            "{demand} {} {} {} {} {}",
            self.grant, self.stale_at, self.expires_at, self.since, self.settled_at
        )
    }

    /// Reads [`Entry::encode`]'s form, or the first four numbers alone
    /// (the form of earlier versions), as since 0 and settled at its
    /// expiry: never a newcomer, and never released before it runs out.
    pub fn decode(text: &str) -> Option<Self> {
        let mut numbers = text.split(' ');
        let demand: i64 = numbers.next()?.parse().ok()?;
        let mut next = || numbers.next().map(|number| number.parse::<u64>().ok());
        let (grant, stale_at, expires_at) = (next()??, next()??, next()??);
        let (since, settled_at) = match (next(), next(), next()) {
            (None, None, None) => (0, expires_at),
            (Some(since), Some(settled_at), None) => (since?, settled_at?),
            _ => return None,
        };
        Some(Self {
            demand: u64::try_from(demand).ok(),
            grant,
            stale_at,
            expires_at,
            since,
            settled_at,
        })
    }
}

/// What a report (or a leave) settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Share {
    /// The subscriber's grant (0 after a leave).
    pub grant: MicroRps,
    /// Its fair share, which the grant grows to as others shrink.
    pub target: MicroRps,
    /// Subscribers whose demand counts, itself included (after a leave,
    /// the others).
    pub subscribers: u64,
    /// The grants in force, its own included.
    pub granted: MicroRps,
}

/// What `demand` asks for: unknown asks for everything (and so gets an
/// equal share); else the demand and headroom, at least `min_want`, at
/// most the capacity.
fn want(demand: Option<MicroRps>, params: &ShareParams) -> MicroRps {
    match demand {
        None => params.capacity,
        Some(demand) => (demand + demand * params.headroom_permille / 1000)
            .max(params.min_want)
            .min(params.capacity),
    }
}

/// How a max-min fair split of a capacity among wants comes out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The wants do not all fit: each want above this level is cut to it.
    Level(MicroRps),
    /// They all fit: each gets its want and this much of what is left.
    Spare(MicroRps),
}

/// The max-min fair split of `capacity` among `wants`.
pub fn split(capacity: MicroRps, wants: &mut [MicroRps]) -> Split {
    wants.sort_unstable();
    let mut left = capacity;
    for (k, &want) in wants.iter().enumerate() {
        let fair = left / (wants.len() - k) as u64;
        if want > fair {
            return Split::Level(fair);
        }
        left -= want;
    }
    Split::Spare(left / wants.len().max(1) as u64)
}

/// The instance a subscriber id names: what comes before its first `:`
/// (ids are `<instance>:<stream>`).
pub fn instance_of(subscriber: &str) -> Option<&str> {
    subscriber.split_once(':').map(|(instance, _)| instance)
}

/// What the other subscribers' entries come to at a settlement.
#[derive(Default)]
struct Others {
    /// The grants in force of the live instances' subscribers.
    held: MicroRps,
    /// What those whose demand counts want.
    wants: Vec<MicroRps>,
    /// When each of those first settled.
    sinces: Vec<Millis>,
    /// The orphans: dead instances' subscribers whose grants are in force.
    orphans: Vec<String>,
    /// Their grants.
    orphaned: MicroRps,
    /// The latest of their settlements.
    orphans_settled: Millis,
}

impl Others {
    /// Every entry but `me`'s, at `now`.
    fn tally(
        entries: &HashMap<String, Entry>,
        me: &str,
        params: &ShareParams,
        now: Millis,
        is_dead: impl Fn(&str) -> bool,
    ) -> Self {
        let mut others = Self::default();
        for (id, entry) in entries {
            if id == me {
                continue;
            }
            if is_dead(id) {
                others.orphans.push(id.clone());
                others.orphaned += entry.grant;
                others.orphans_settled = others.orphans_settled.max(entry.settled_at);
                continue;
            }
            if entry.expires_at > now {
                others.held += entry.grant;
            }
            if entry.stale_at > now {
                others.wants.push(want(entry.demand, params));
                others.sinces.push(entry.since);
            }
        }
        others
    }

    /// The subscribers first settled after the orphans last did, with
    /// `me` if it is one.
    fn newcomers(&self, me_too: bool) -> usize {
        let settled = self.orphans_settled;
        self.sinces.iter().filter(|since| **since > settled).count() + usize::from(me_too)
    }
}

/// Settles `op` for subscriber `me` on a bucket's `entries` at `now`, as
/// `share.lua` does on Redis: drops the entries whose demand and grant have
/// both run out, and those of the instances found `dead` whose grants have;
/// releases the dead instances' other entries (the orphans) if as many
/// newcomers have come, else counts their grants; then answers and records
/// `me`'s grant.
pub fn settle(
    entries: &mut HashMap<String, Entry>,
    me: &str,
    op: ShareOp,
    params: &ShareParams,
    now: Millis,
    dead: &[String],
) -> Share {
    let is_dead = |id: &str| instance_of(id).is_some_and(|i| dead.iter().any(|d| d == i));
    entries.retain(|id, entry| {
        id == me || entry.expires_at > now || (entry.stale_at > now && !is_dead(id))
    });
    let others = Others::tally(entries, me, params, now, is_dead);
    // Its own entry, run out, is gone, whether or not the store has
    // dropped it yet.
    let my_since = entries
        .get(me)
        .filter(|mine| mine.stale_at > now || mine.expires_at > now)
        .map_or(now, |mine| mine.since);
    let mut held = others.held;
    if !others.orphans.is_empty() {
        let me_new = op != ShareOp::Leave && !is_dead(me) && my_since > others.orphans_settled;
        if others.newcomers(me_new) >= others.orphans.len() {
            for id in &others.orphans {
                entries.remove(id);
            }
        } else {
            held += others.orphaned;
        }
    }
    let mut wants = others.wants;
    let demand = match op {
        ShareOp::Leave => {
            entries.remove(me);
            return Share {
                grant: 0,
                target: 0,
                subscribers: wants.len() as u64,
                granted: held,
            };
        }
        ShareOp::Report(demand) => demand,
    };
    let my_want = want(demand, params);
    wants.push(my_want);
    // When the wants all fit, the spare is split on top of them, so that a
    // bucket's rate is never held back from Envoys that may need it before
    // their next report.
    let target = match split(params.capacity, &mut wants) {
        Split::Level(level) => my_want.min(level),
        Split::Spare(spare) => my_want + spare,
    };
    let free = params.capacity.saturating_sub(held);
    let mut grant = target.min(free);
    if let Some(mine) = entries.get(me) {
        let close = grant.abs_diff(mine.grant) * 1000 <= mine.grant * params.hysteresis_permille;
        if mine.expires_at > now && mine.grant <= free && close {
            grant = mine.grant;
        }
    }
    entries.insert(
        me.to_owned(),
        Entry {
            demand,
            grant,
            stale_at: now + params.stale_ms,
            expires_at: now + params.lease_ms,
            since: my_since,
            settled_at: now,
        },
    );
    Share {
        grant,
        target,
        subscribers: wants.len() as u64,
        granted: held + grant,
    }
}

#[cfg(test)]
mod tests;

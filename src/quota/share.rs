//! How one quota bucket's rate is shared among its subscribers: the Rust
//! twin of `share.lua`, for the embedded store (tests/quota_twins.rs proves
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
    /// When its grant stops counting.
    pub expires_at: Millis,
}

impl Entry {
    /// The entry as `share.lua` stores it: "demand grant stale_at
    /// expires_at", demand -1 while unknown.
    pub fn encode(&self) -> String {
        let demand = self.demand.map_or(-1, |d| d as i64);
        format!(
            "{demand} {} {} {}",
            self.grant, self.stale_at, self.expires_at
        )
    }

    /// Reads [`Entry::encode`]'s form.
    pub fn decode(text: &str) -> Option<Self> {
        let mut numbers = text.split(' ');
        let demand: i64 = numbers.next()?.parse().ok()?;
        let mut next = || numbers.next()?.parse::<u64>().ok();
        let entry = Self {
            demand: u64::try_from(demand).ok(),
            grant: next()?,
            stale_at: next()?,
            expires_at: next()?,
        };
        numbers.next().is_none().then_some(entry)
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

/// Settles `op` for subscriber `me` on a bucket's `entries` at `now`, as
/// `share.lua` does on Redis: drops the entries whose demand and grant have
/// both run out, and those of the instances found `dead`, then answers and
/// records `me`'s grant.
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
        id == me || (!is_dead(id) && (entry.stale_at > now || entry.expires_at > now))
    });
    let mut held: MicroRps = 0;
    let mut wants = Vec::with_capacity(entries.len() + 1);
    for (id, entry) in entries.iter() {
        if id == me {
            continue;
        }
        if entry.expires_at > now {
            held += entry.grant;
        }
        if entry.stale_at > now {
            wants.push(want(entry.demand, params));
        }
    }
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

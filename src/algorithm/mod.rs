//! The rate-limit algorithms, one Lua file and one Rust file each: the Rust
//! file holds its parameters, and the Lua function decides on Redis while
//! the Rust function is its in-memory twin with the same semantics
//! (tests/suite/twins.rs proves them equal). This module is the twin of
//! `decide.lua`'s driver for the embedded store; the script itself, and how
//! a call becomes its arguments, is `limiter::script`. Nothing here knows
//! Redis. [`registry`] is the one list of the algorithms: from it come
//! [`Algorithm`], [`State`] and [`Snapshot`], and it builds each algorithm
//! from the parameters the faces state.

pub mod fixed_window;
pub mod gcra;
pub mod parameters;
pub mod registry;
mod request;
pub mod sliding_window;
pub mod sliding_window_counter;
pub mod token_bucket;
mod variants;

// Each algorithm's parameters type, by its short path.
pub use fixed_window::{FixedWindow, FixedWindowMode};
pub use gcra::Gcra;
pub use registry::{Algorithm, Snapshot, State};
pub use request::LimitRequest;
pub use sliding_window::SlidingWindow;
pub use sliding_window_counter::SlidingWindowCounter;
pub use token_bucket::TokenBucket;

use crate::limit::{Decision, Micros};
use crate::store::MemoryChange;

/// What one decision may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spend {
    /// Nothing: say what would be answered.
    Dry,
    /// The cost, if allowed.
    IfAllowed,
    /// The cost even when denied, as envoyproxy/ratelimit counts hits: the
    /// fixed window does; the other algorithms spend only what they allow
    /// (a denied cost there would be debt that keeps a retrying client out
    /// past any window).
    Always,
}

/// Whether `algorithm` counts a cost it denies when told to
/// ([`Spend::Always`]), as its registry entry says: only the fixed window
/// does, in both twins.
pub fn counts_denied_hits(algorithm: &Algorithm) -> bool {
    algorithm.kind().entry().counts_denied_hits
}

/// When Redis drops a key given `PEXPIRE key ttl_ms` (or `SET ... PX`) at
/// `now`: see [`redis_expiry_at`]. The twins expire their state at that
/// same instant, so the embedded store's keys live exactly as long.
pub fn redis_expiry_after(now: Micros, ttl_ms: u64) -> Micros {
    redis_expiry_at(now.as_millis() + ttl_ms)
}

/// When Redis drops a key that expires at `at_ms` (`PEXPIREAT`): Redis
/// keeps expiry in whole milliseconds of its clock and drops a key once its
/// clock is past that millisecond, so the key lives through all of it.
pub fn redis_expiry_at(at_ms: u64) -> Micros {
    Micros::from_millis(at_ms + 1)
}

/// What the store does for a spend its algorithm wrote with a time to live
/// of `reset_after`, as the script's `PEXPIRE` of it in whole milliseconds
/// (rounded up) has Redis do.
fn written_for(now: Micros, reset_after: Micros) -> MemoryChange {
    MemoryChange::Written {
        expires_at: redis_expiry_after(now, reset_after.as_millis_rounded_up()),
    }
}

/// The tag in the storage key's hash tag, one per kind of state, so the same
/// caller key under two algorithms names two different keys: the
/// algorithm's registry tag, except for the fixed window's aligned modes,
/// which keep their state in other shapes. These tags name the keys an
/// existing deployment's counters are in, so none of them may change.
pub fn key_tag(algorithm: &Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow(p) => match p.mode() {
            FixedWindowMode::Anchored => algorithm.kind().tag(),
            FixedWindowMode::Aligned => "fa",
            FixedWindowMode::AlignedByName => "fn",
        },
        _ => algorithm.kind().tag(),
    }
}

/// Decides `cost` under `algorithm` on in-memory state: the twin of one
/// algorithm's Lua function. `state` is `None` for a key with no live state.
pub fn decide_in_memory(
    algorithm: &Algorithm,
    state: &mut Option<State>,
    now: Micros,
    cost: u64,
    spend: Spend,
) -> (Decision, MemoryChange) {
    // Only the fixed window counts denied hits (`counts_denied_hits`): the
    // others take `Spend::Always` as `Spend::IfAllowed`.
    algorithm.decide_on(state, now, cost, spend)
}

/// The mark the decision script replies for a spend under `algorithm` that
/// left `state`: what the refund script needs to find that spend (its
/// window, or its log entry), 0 where it needs nothing: the in-memory twin
/// of each algorithm's reply, its [`spend_mark`](parameters::Parameters::spend_mark).
pub fn mark_in_memory(algorithm: &Algorithm, state: &State) -> u64 {
    algorithm.spend_mark_on(state)
}

/// Gives `cost` units of a spend marked `mark` back to a key's live `state`
/// under `algorithm`: the in-memory twin of the refund script for a fixed
/// window (only to the window spent, never below none), a token bucket
/// (never above its capacity) and GCRA, by each algorithm's
/// [`give_back`](parameters::Parameters::give_back). Answers whether anything was.
pub fn give_back_in_memory(
    algorithm: &Algorithm,
    state: &mut Option<State>,
    cost: u64,
    mark: u64,
) -> (bool, MemoryChange) {
    if algorithm.give_back_on(state, cost, mark) {
        (true, MemoryChange::Updated)
    } else {
        (false, MemoryChange::None)
    }
}

/// The twin of `decide.lua`'s driver in `decide` mode: decides
/// `costs.len()` limits together, all or nothing. `decide(i, cost, spend)`
/// decides limit `i`; `shadow[i]` says limit `i` may not deny the group.
///
/// All or nothing exists three times, each where it must: in `decide.lua`
/// (atomic on one Redis node), here (the same steps under the embedded
/// store's shard locks; tests/suite/twins.rs proves the two answer alike), and in
/// `limiter::on_redis` across Redis Cluster nodes, where no one script
/// sees every key, so it is dry run, spend and refund instead. The first
/// two share their steps (dry run every limit, then spend or look); the
/// third is built from the script's `dry`, `look` and `decide` modes.
pub fn decide_together(
    costs: &[u64],
    shadow: &[bool],
    mut decide: impl FnMut(usize, u64, Spend) -> Decision,
) -> Vec<Decision> {
    if costs.len() == 1 {
        // Alone, a limit spends only if it allows: no dry run needed.
        return vec![decide(0, costs[0], Spend::IfAllowed)];
    }
    let dry: Vec<Decision> = costs
        .iter()
        .enumerate()
        .map(|(i, &cost)| decide(i, cost, Spend::Dry))
        .collect();
    let all_allow = dry
        .iter()
        .zip(shadow)
        .all(|(decision, &shadow)| decision.is_allowed() || shadow);
    dry.into_iter()
        .enumerate()
        .map(|(i, decision)| match (decision.is_allowed(), all_allow) {
            (false, _) => decision,
            (true, true) => decide(i, costs[i], Spend::IfAllowed),
            (true, false) => decide(i, 0, Spend::Dry),
        })
        .collect()
}

/// The twin of `decide.lua`'s driver in `each` mode: every limit decided on
/// its own, spending [`Spend::Always`].
pub fn decide_each(
    costs: &[u64],
    mut decide: impl FnMut(usize, u64, Spend) -> Decision,
) -> Vec<Decision> {
    costs
        .iter()
        .enumerate()
        .map(|(i, &cost)| decide(i, cost, Spend::Always))
        .collect()
}

//! The rate-limit algorithms, one Lua file and one Rust file each: the Lua
//! function decides on Redis, the Rust function is its in-memory twin with
//! the same semantics. This module puts the Lua functions into the one
//! script every decision runs (`decide.lua` decides one request's limits
//! together, all or nothing) and is that script's twin for the embedded
//! store.

pub mod fixed_window;
pub mod gcra;
pub mod sliding_window;
pub mod sliding_window_counter;
pub mod token_bucket;

use std::sync::LazyLock;

use redis::{Script, ScriptInvocation};

use crate::limit::{Algorithm, Decision, Micros, RetryAfter};

/// The script behind every decision on Redis: the algorithms'
/// functions, then `decide.lua`, which documents `KEYS`, `ARGV` and reply.
/// Loaded once per Redis and called by SHA.
pub static SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("fixed_window.lua"),
        include_str!("sliding_window.lua"),
        include_str!("token_bucket.lua"),
        include_str!("gcra.lua"),
        include_str!("sliding_window_counter.lua"),
        include_str!("decide.lua"),
    ))
});

/// Takes back what [`SCRIPT`] spent, when a request spanning several Redis
/// Cluster nodes was denied by one after another had spent; `refund.lua`
/// documents `KEYS`, `ARGV` and reply.
pub static REFUND_SCRIPT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(concat!(
        include_str!("sliding_window.lua"),
        include_str!("refund.lua")
    ))
});

/// The last `ARGV` value of [`SCRIPT`]: decide (spend, all or nothing),
/// decide each limit on its own (spending even what it denies, where the
/// algorithm counts denied hits), only say what each limit would answer,
/// or answer for a request denied elsewhere (by a cached denial): each
/// limit's denial, or what it has, writing nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptMode {
    Decide,
    Each,
    Dry,
    Denied,
}

impl ScriptMode {
    pub fn arg(self) -> &'static str {
        match self {
            Self::Decide => "decide",
            Self::Each => "each",
            Self::Dry => "dry",
            Self::Denied => "denied",
        }
    }
}

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
/// ([`Spend::Always`]): only the fixed window does, in both twins.
pub fn counts_denied_hits(algorithm: &Algorithm) -> bool {
    matches!(algorithm, Algorithm::FixedWindow(_))
}

/// The in-memory state of one key, whichever algorithm owns it. A key's name
/// includes its algorithm, so one key never holds two kinds of state.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    FixedWindow(fixed_window::State),
    SlidingWindow(sliding_window::State),
    TokenBucket(token_bucket::State),
    Gcra(gcra::State),
    SlidingWindowCounter(sliding_window_counter::State),
}

impl crate::store::memory::HeapSize for State {
    fn heap_bytes(&self) -> usize {
        match self {
            // The only state with a buffer: the log's entries.
            Self::SlidingWindow(log) => log.heap_bytes(),
            _ => 0,
        }
    }
}

/// What an in-memory decision did to the key's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryChange {
    /// Nothing.
    None,
    /// Changed it (or emptied it), keeping its expiry.
    Updated,
    /// Wrote it with a new expiry.
    Written { expires_at: Micros },
}

/// The tag in the storage key's hash tag, one per kind of state, so the same
/// caller key under two algorithms names two different keys.
pub fn key_tag(algorithm: &Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow(p) if p.aligned => "fa",
        Algorithm::FixedWindow(_) => "fw",
        Algorithm::SlidingWindow(_) => "sl",
        Algorithm::TokenBucket(_) => "tb",
        Algorithm::Gcra(_) => "gc",
        Algorithm::SlidingWindowCounter(_) => "sc",
    }
}

/// Adds one limit's six `ARGV` values for [`SCRIPT`] (the last is shadow,
/// 1 or 0) or [`REFUND_SCRIPT`] (the last is the mark).
pub fn push_script_args(
    invocation: &mut ScriptInvocation<'_>,
    algorithm: &Algorithm,
    cost: u64,
    last: i64,
) {
    match algorithm {
        Algorithm::FixedWindow(p) => invocation
            .arg("fw")
            .arg(p.limit)
            .arg(p.window.as_millis())
            .arg(u8::from(p.aligned)),
        Algorithm::SlidingWindow(p) => invocation
            .arg("sw")
            .arg(p.limit)
            .arg(p.window.as_micros())
            .arg(0),
        // The rate goes in Rust's shortest exact decimal form, which Lua's
        // `tonumber` reads back to the same double.
        Algorithm::TokenBucket(p) => invocation
            .arg("tb")
            .arg(p.capacity)
            .arg(p.refill_per_second)
            .arg(0),
        Algorithm::Gcra(p) => invocation.arg("gc").arg(p.burst).arg(p.interval).arg(0),
        Algorithm::SlidingWindowCounter(p) => invocation
            .arg("sc")
            .arg(p.limit)
            .arg(p.window.as_micros())
            .arg(0),
    };
    invocation.arg(cost).arg(last);
}

/// Reads one limit's part of the script's reply, `{allowed, remaining,
/// reset_after_us, retry_after_us (-1: never), mark}`, refusing anything out
/// of range; the mark is what a refund of this decision needs.
pub fn decision_from_reply(limit: u64, reply: &[i64]) -> Result<(Decision, i64), String> {
    let &[allowed, remaining, reset_after, retry_after, mark] = reply else {
        return Err(format!("script replied {} values, not 5", reply.len()));
    };
    let non_negative = |name: &str, value: i64| {
        u64::try_from(value).map_err(|_| format!("script replied {name} = {value}"))
    };
    let allowed = match allowed {
        0 => false,
        1 => true,
        other => return Err(format!("script replied allowed = {other}")),
    };
    let retry_after = match retry_after {
        -1 => RetryAfter::Never,
        value => RetryAfter::After(non_negative("retry_after", value)?),
    };
    let decision = Decision {
        allowed,
        limit,
        remaining: non_negative("remaining", remaining)?,
        reset_after: non_negative("reset_after", reset_after)?,
        retry_after,
        degraded: false,
    };
    Ok((decision, mark))
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
    let spends = spend != Spend::Dry;
    // Each arm lends the algorithm its own variant and puts it back after.
    macro_rules! with_variant {
        ($variant:ident, $module:ident, $params:expr, $spend:expr) => {{
            let mut own = match state.take() {
                Some(State::$variant(s)) => Some(s),
                _ => None,
            };
            let outcome = $module::decide($params, &mut own, now, cost, $spend);
            *state = own.map(State::$variant);
            outcome
        }};
    }
    match algorithm {
        Algorithm::FixedWindow(p) => with_variant!(FixedWindow, fixed_window, p, spend),
        Algorithm::SlidingWindow(p) => with_variant!(SlidingWindow, sliding_window, p, spends),
        Algorithm::TokenBucket(p) => with_variant!(TokenBucket, token_bucket, p, spends),
        Algorithm::Gcra(p) => with_variant!(Gcra, gcra, p, spends),
        Algorithm::SlidingWindowCounter(p) => {
            with_variant!(SlidingWindowCounter, sliding_window_counter, p, spends)
        }
    }
}

/// The twin of `decide.lua`'s driver in `decide` mode: decides
/// `costs.len()` limits together, all or nothing. `decide(i, cost, spend)`
/// decides limit `i`; `shadow[i]` says limit `i` may not deny the group.
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
        .all(|(decision, &shadow)| decision.allowed || shadow);
    dry.into_iter()
        .enumerate()
        .map(|(i, decision)| match (decision.allowed, all_allow) {
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

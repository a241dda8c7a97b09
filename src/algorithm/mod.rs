//! The rate-limit algorithms, one file each: parameters go in, a
//! [`Decision`] comes out, either from the algorithm's Lua script on Redis or
//! from its in-memory twin on the embedded store. This module picks the
//! right one for a request and reads the scripts' shared reply.

pub mod fixed_window;
pub mod sliding_window;
pub mod token_bucket;

use crate::limit::{Algorithm, Decision, Micros, RetryAfter};

/// The in-memory state of one key, whichever algorithm owns it. A key's name
/// includes its algorithm, so one key never holds two kinds of state.
#[derive(Debug, Clone, PartialEq)]
pub enum State {
    FixedWindow(fixed_window::State),
    SlidingWindow(sliding_window::State),
    TokenBucket(token_bucket::State),
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

/// The tag that starts the storage key's hash tag, one per algorithm, so the
/// same caller key under two algorithms names two different keys.
pub fn key_tag(algorithm: &Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow(_) => "fw",
        Algorithm::SlidingWindow(_) => "sw",
        Algorithm::TokenBucket(_) => "tb",
    }
}

/// Reads every script's reply, `{allowed, remaining, reset_after_us,
/// retry_after_us (-1: never)}`, refusing anything out of range.
pub fn decision_from_reply(limit: u64, reply: [i64; 4]) -> Result<Decision, String> {
    let [allowed, remaining, reset_after, retry_after] = reply;
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
    Ok(Decision {
        allowed,
        limit,
        remaining: non_negative("remaining", remaining)?,
        reset_after: non_negative("reset_after", reset_after)?,
        retry_after,
    })
}

/// Decides `cost` under `algorithm` on in-memory state: the twin of
/// the algorithms' scripts. `state` is `None` for a key with no live state.
pub fn decide_in_memory(
    algorithm: &Algorithm,
    state: &mut Option<State>,
    now: Micros,
    cost: u64,
) -> (Decision, MemoryChange) {
    // Each arm lends the algorithm its own variant and puts it back after.
    macro_rules! with_variant {
        ($variant:ident, $module:ident, $params:expr) => {{
            let mut own = match state.take() {
                Some(State::$variant(s)) => Some(s),
                _ => None,
            };
            let outcome = $module::decide($params, &mut own, now, cost);
            *state = own.map(State::$variant);
            outcome
        }};
    }
    match algorithm {
        Algorithm::FixedWindow(p) => with_variant!(FixedWindow, fixed_window, p),
        Algorithm::SlidingWindow(p) => with_variant!(SlidingWindow, sliding_window, p),
        Algorithm::TokenBucket(p) => with_variant!(TokenBucket, token_bucket, p),
    }
}

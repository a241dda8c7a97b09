//! The protocol between Rust and the Lua scripts that decide on Redis: which
//! Lua parts make each script, how a call's limits become `KEYS` and `ARGV`,
//! and how the reply becomes decisions. The one place that knows both the
//! algorithms' parameters and Redis's script calls; `decide.lua` and
//! `refund.lua` (beside this file) document the same layout from Lua's side,
//! and [`lua`] puts each script's text together from the algorithm registry.

use std::sync::LazyLock;

use redis::{Cmd, RedisWrite, Script, ScriptInvocation, ToRedisArgs, Value};

use crate::algorithm::Algorithm;
use crate::algorithm::registry::{Mark, Parameters, ScriptValue, with_parameters};
use crate::error::StoreError;
use crate::limit::{Decision, Micros, RetryAfter};
pub use crate::store::BatchScripts;
use crate::store::{Batchable, CLOCK_LUA, ScriptArgs, ScriptReply, script_values};

pub mod lua;

pub use lua::{
    ALGORITHMS_LUA, ALGORITHMS_WITH_REFUNDS_LUA, DECIDE_BATCH_LUA, DECIDE_LUA,
    DECIDE_NODE_BATCH_LUA, REFUND_PART_LUA,
};

/// The most limits one script call decides. Each costs the script a few
/// Redis commands (tens of microseconds at most), so a call stays well
/// inside any sane `--redis-command-timeout` and does not hold a Redis node
/// from other callers for long. What one request may ask is bounded by it:
/// a named policy's limits, `CheckLimit`'s default limits per request, and
/// `ShouldRateLimit`'s default descriptors each fit in one call.
pub const MAX_LIMITS_PER_SCRIPT: usize = 64;

/// The first line of a script built on [`DECIDE_NODE_BATCH_LUA`]: Redis
/// lets it touch keys of several hash slots, all on the node it runs on.
pub const NODE_BATCH_FLAGS: &str = "#!lua flags=allow-cross-slot-keys\n";

/// The script behind every decision on Redis: the algorithms, the clock,
/// then `decide.lua`. Loaded once per Redis and called by SHA.
pub static DECIDE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[ALGORITHMS_LUA, CLOCK_LUA, DECIDE_LUA].concat()));

/// [`DECIDE`] for many calls at once (see `store::batch`).
pub static DECIDE_BATCH: LazyLock<Script> = LazyLock::new(|| Script::new(&decide_batch_source()));

/// The text of [`DECIDE_BATCH`], for a tool that loads and calls it itself
/// (`ratelimitd-bench --print-batch-script`).
pub fn decide_batch_source() -> String {
    [ALGORITHMS_LUA, CLOCK_LUA, DECIDE_BATCH_LUA].concat()
}

/// [`DECIDE`] for many calls at once on one node of a Redis Cluster.
pub static DECIDE_NODE_BATCH: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            NODE_BATCH_FLAGS,
            ALGORITHMS_LUA,
            CLOCK_LUA,
            DECIDE_NODE_BATCH_LUA,
        ]
        .concat(),
    )
});

/// Takes back what [`DECIDE`] spent, when a request spanning several Redis
/// Cluster nodes was denied by one after another had spent.
pub static REFUND: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[ALGORITHMS_WITH_REFUNDS_LUA, REFUND_PART_LUA].concat()));

/// `ARGV` values per limit: algorithm, three parameters, cost, and shadow
/// (decide) or mark (refund).
pub const ARGS_PER_LIMIT: usize = 6;

/// Reply values per limit: remaining (`-1 - remaining` if denied),
/// reset_after, and the mark (allowed) or retry_after (denied).
pub const REPLY_PER_LIMIT: usize = 3;

/// How [`DECIDE`] decides a call's limits: its last `ARGV` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// All or nothing: spend only if every limit not in shadow mode allows.
    Decide,
    /// Every limit on its own, a fixed window counting even what it denies.
    Each,
    /// What every limit would answer its cost; nothing written.
    Dry,
    /// What every limit has (cost 0); nothing written.
    Look,
    /// The call is denied elsewhere (a cached denial): each limit's denial,
    /// or what it has; nothing written.
    Denied,
}

impl Mode {
    fn arg(self) -> &'static str {
        match self {
            Self::Decide => "decide",
            Self::Each => "each",
            Self::Dry => "dry",
            Self::Look => "look",
            Self::Denied => "denied",
        }
    }
}

/// One limit of a script call.
#[derive(Debug, Clone, Copy)]
pub struct ScriptLimit<'a> {
    /// Its storage key.
    pub key: &'a str,
    /// Its algorithm and parameters.
    pub algorithm: &'a Algorithm,
    /// Units to spend.
    pub cost: u64,
    /// In shadow mode: it may not deny the call.
    pub shadow: bool,
}

/// What a refund needs to find one spend again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpendMark {
    /// Nothing: the units are given back to the key as it is (a fixed
    /// window named by its window; token bucket, GCRA).
    Unmarked,
    /// The window the units were counted in: given back only while the key
    /// still counts it (aligned fixed window, sliding window counter).
    Window(u64),
    /// The end (Unix ms) of the window the units were counted in: given
    /// back only while the key's window ends then (anchored fixed window).
    WindowEnd(u64),
    /// The stamp of the log entry the spend added (sliding window).
    Entry(Micros),
}

impl SpendMark {
    /// Reads the mark the script replied for `algorithm`.
    fn from_reply(algorithm: &Algorithm, mark: i64) -> Result<Self, StoreError> {
        let unsigned = u64::try_from(mark)
            .map_err(|_| StoreError::Reply(format!("script replied mark = {mark}")))?;
        Ok(Self::of(algorithm, unsigned))
    }

    /// The mark `value` (as the script replies it) of a spend under
    /// `algorithm`.
    pub fn of(algorithm: &Algorithm, value: u64) -> Self {
        match with_parameters!(algorithm, p => p.mark()) {
            Mark::Unmarked => Self::Unmarked,
            Mark::Window => Self::Window(value),
            Mark::WindowEnd => Self::WindowEnd(value),
            Mark::Entry => Self::Entry(Micros::from_micros(value)),
        }
    }

    /// The mark as the refund script takes it (and the decision script
    /// replies it).
    pub fn arg(self) -> u64 {
        match self {
            Self::Unmarked => 0,
            Self::Window(window) | Self::WindowEnd(window) => window,
            Self::Entry(stamp) => stamp.as_micros(),
        }
    }
}

/// One limit's answer from [`DECIDE`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decided {
    /// What the limit answered.
    pub decision: Decision,
    /// What a refund of this decision's spend needs.
    pub mark: SpendMark,
}

/// A [`DECIDE`] call for `limits` (on one Redis node) in `mode`.
pub fn decide_call(mode: Mode, limits: &[ScriptLimit<'_>]) -> ScriptInvocation<'static> {
    decide_call_on(&DECIDE, mode, limits)
}

/// A [`DECIDE`] call for `limits` (on one Redis node) in `mode`, which may
/// go out in a batch with others ([`DECIDE_BATCH`], or on a Redis Cluster
/// [`DECIDE_NODE_BATCH`]).
pub fn decide_batchable(mode: Mode, limits: &[ScriptLimit<'_>]) -> Batchable {
    decide_batchable_on(
        BatchScripts {
            single: &DECIDE,
            batch: &DECIDE_BATCH,
            node_batch: &DECIDE_NODE_BATCH,
        },
        mode,
        limits,
    )
}

/// A call of `scripts` (the [`DECIDE`] family, or, in tests, the same
/// under a clock of their own) for `limits` in `mode`.
pub fn decide_batchable_on(
    scripts: BatchScripts,
    mode: Mode,
    limits: &[ScriptLimit<'_>],
) -> Batchable {
    let values = ARGS_PER_LIMIT * limits.len() + 1;
    let key_bytes = limits.iter().map(|limit| limit.key.len()).sum::<usize>();
    // Each value is a short number or word.
    let mut arguments = ScriptArgs::with_capacity(limits.len() + values, key_bytes + 8 * values);
    for limit in limits {
        arguments.arg(limit.key);
    }
    write_decide_args(&mut arguments, mode, limits);
    Batchable::new(
        scripts,
        arguments,
        limits.len(),
        REPLY_PER_LIMIT * limits.len(),
    )
}

/// Appends `decide.lua`'s values for `limits` in `mode` to `args` (see
/// [`Batchable::new`]).
fn write_decide_args(args: &mut impl RedisWrite, mode: Mode, limits: &[ScriptLimit<'_>]) {
    for limit in limits {
        push_limit(args, limit.algorithm, limit.cost, u64::from(limit.shadow));
    }
    put(args, mode.arg());
}

/// A call of `script`, a [`DECIDE`] with a clock of its own (tests), for
/// `limits` in `mode`.
pub fn decide_call_on<'s>(
    script: &'s Script,
    mode: Mode,
    limits: &[ScriptLimit<'_>],
) -> ScriptInvocation<'s> {
    let mut args = Cmd::new();
    write_decide_args(&mut args, mode, limits);
    let mut invocation = script.prepare_invoke();
    for limit in limits {
        invocation.key(limit.key);
    }
    for arg in script_values(&args) {
        invocation.arg(arg);
    }
    invocation
}

/// A [`REFUND`] call giving back `spent` (limits on one node, each with the
/// mark its decision replied).
pub fn refund_call(spent: &[(ScriptLimit<'_>, SpendMark)]) -> ScriptInvocation<'static> {
    refund_call_on(&REFUND, spent)
}

/// A call of `script` (the refund part, as [`REFUND`]) giving back `spent`.
pub fn refund_call_on<'s>(
    script: &'s Script,
    spent: &[(ScriptLimit<'_>, SpendMark)],
) -> ScriptInvocation<'s> {
    let mut invocation = script.prepare_invoke();
    let mut args = Cmd::new();
    for (limit, mark) in spent {
        invocation.key(limit.key);
        push_limit(&mut args, limit.algorithm, limit.cost, mark.arg());
    }
    for arg in script_values(&args) {
        invocation.arg(arg);
    }
    invocation
}

/// A time goes to a script as its whole microseconds, the unit every
/// script counts time in.
impl ToRedisArgs for Micros {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        self.as_micros().write_redis_args(out);
    }
}

/// Appends `value` as a script's values, in Redis's own encoding.
fn put(args: &mut impl RedisWrite, value: impl ToRedisArgs) {
    value.write_redis_args(args);
}

/// One limit's [`ARGS_PER_LIMIT`] values, the last being `last`: the
/// algorithm by its registry tag, then its three parameters.
fn push_limit(args: &mut impl RedisWrite, algorithm: &Algorithm, cost: u64, last: u64) {
    put(args, algorithm.kind().tag());
    for value in with_parameters!(algorithm, p => p.script_values()) {
        match value {
            ScriptValue::Whole(number) => put(args, number),
            ScriptValue::Rate(rate) => put(args, rate),
        }
    }
    put(args, cost);
    put(args, last);
}

/// [`decode_each`]'s answers collected: one [`Decided`] per limit, in
/// order.
pub fn decode(limits: &[ScriptLimit<'_>], reply: &Value) -> Result<Vec<Decided>, StoreError> {
    let mut decided = Vec::with_capacity(limits.len());
    decode_each(limits, reply, |_, one| decided.push(one))?;
    Ok(decided)
}

/// Reads [`DECIDE`]'s reply for `limits` as Redis sent it (a list of
/// integers): limit `i`'s [`Decided`] goes to `each(i, decided)`, in order,
/// or an error says what was out of range. Nothing is collected, so a
/// caller keeps the answers where it wants them.
pub fn decode_each(
    limits: &[ScriptLimit<'_>],
    reply: &Value,
    each: impl FnMut(usize, Decided),
) -> Result<(), StoreError> {
    let Value::Array(values) = reply else {
        return Err(StoreError::Reply(format!("script replied {reply:?}")));
    };
    decode_values(limits, values, each)
}

/// [`decode_each`] of a reply as the store hands it over (its values
/// perhaps a part of a batch's reply).
pub fn decode_reply(
    limits: &[ScriptLimit<'_>],
    reply: &ScriptReply,
    each: impl FnMut(usize, Decided),
) -> Result<(), StoreError> {
    match reply.values() {
        Ok(values) => decode_values(limits, values, each),
        Err(reply) => Err(StoreError::Reply(format!("script replied {reply:?}"))),
    }
}

/// [`decode_each`] of the reply's values.
fn decode_values(
    limits: &[ScriptLimit<'_>],
    values: &[Value],
    mut each: impl FnMut(usize, Decided),
) -> Result<(), StoreError> {
    if values.len() != REPLY_PER_LIMIT * limits.len() {
        return Err(StoreError::Reply(format!(
            "script replied {} values for {} limits",
            values.len(),
            limits.len()
        )));
    }
    let integer = |value: &Value| match value {
        Value::Int(integer) => Ok(*integer),
        other => Err(StoreError::Reply(format!("script replied {other:?}"))),
    };
    for (i, (limit, part)) in limits
        .iter()
        .zip(values.chunks_exact(REPLY_PER_LIMIT))
        .enumerate()
    {
        let part = [integer(&part[0])?, integer(&part[1])?, integer(&part[2])?];
        each(i, decode_one(limit.algorithm, part)?);
    }
    Ok(())
}

/// One limit's part of the reply, `{state, reset_after_us, last}`: `state`
/// is the remaining units if the limit allows and `-1 - remaining` if it
/// denies; `last` is the mark of an allowed limit, and the retry_after_us
/// (-1: never) of a denied one.
fn decode_one(
    algorithm: &Algorithm,
    [state, reset_after, last]: [i64; REPLY_PER_LIMIT],
) -> Result<Decided, StoreError> {
    let non_negative = |name: &str, value: i64| {
        u64::try_from(value)
            .map_err(|_| StoreError::Reply(format!("script replied {name} = {value}")))
    };
    let limit = algorithm.limit();
    let reset_after = Micros::from_micros(non_negative("reset_after", reset_after)?);
    if let Ok(remaining) = u64::try_from(state) {
        return Ok(Decided {
            decision: Decision::allowed(limit, remaining, reset_after),
            mark: SpendMark::from_reply(algorithm, last)?,
        });
    }
    // `state` is negative: -1 - state is at most i64::MAX.
    let remaining = non_negative("remaining", -1 - state)?;
    let retry_after = match last {
        -1 => RetryAfter::Never,
        wait => RetryAfter::After(Micros::from_micros(non_negative("retry_after", wait)?)),
    };
    Ok(Decided {
        decision: Decision::denied(limit, remaining, reset_after, retry_after),
        // A denied limit spent nothing: there is nothing to give back.
        mark: SpendMark::Unmarked,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::FixedWindow;

    fn fixed() -> Algorithm {
        Algorithm::FixedWindow(FixedWindow::new(3, Duration::from_secs(1)).expect("valid"))
    }

    /// `reply`, as Redis would send it, decoded.
    fn decode_integers(
        limits: &[ScriptLimit<'_>],
        reply: &[i64],
    ) -> Result<Vec<Decided>, StoreError> {
        decode(limits, &integers(reply))
    }

    /// `values` as Redis sends a script's list of integers.
    fn integers(values: &[i64]) -> Value {
        Value::Array(values.iter().map(|&value| Value::Int(value)).collect())
    }

    /// A limit of `algorithm` on key `k`, spending 1.
    fn spending_one(algorithm: &Algorithm) -> ScriptLimit<'_> {
        ScriptLimit {
            key: "k",
            algorithm,
            cost: 1,
            shadow: false,
        }
    }

    #[test]
    fn a_reply_of_the_wrong_length_or_out_of_range_is_an_error() {
        let algorithm = fixed();
        let limit = spending_one(&algorithm);
        let limits = [limit, limit];
        assert!(decode_integers(&limits, &[2, 0, 0]).is_err());
        assert!(decode_integers(&limits[..1], &[2, 0, 0, 0, 0]).is_err());
        assert!(decode_integers(&limits[..1], &[2, -1, 0]).is_err());
        assert!(
            decode_integers(&limits[..1], &[2, 0, -1]).is_err(),
            "a negative mark"
        );
        assert!(
            decode_integers(&limits[..1], &[-1, 0, -2]).is_err(),
            "a wait below never"
        );
        let decided = decode_integers(&limits[..1], &[-1, 5, -1]).expect("valid");
        assert!(!decided[0].decision.is_allowed());
        assert_eq!(decided[0].decision.remaining(), 0);
        assert_eq!(decided[0].decision.retry_after(), RetryAfter::Never);
        assert_eq!(decided[0].decision.limit(), 3);
        assert_eq!(decided[0].mark, SpendMark::Unmarked);
    }

    #[test]
    fn a_reply_as_redis_sent_it_is_read_limit_by_limit() {
        let algorithm = fixed();
        let limit = spending_one(&algorithm);
        let mut read = Vec::new();
        decode_each(
            &[limit, limit],
            &integers(&[2, 7, 0, -1, 5, 900]),
            |i, decided| {
                read.push((
                    i,
                    decided.decision.is_allowed(),
                    decided.decision.remaining(),
                ));
            },
        )
        .expect("valid");
        assert_eq!(read, [(0, true, 2), (1, false, 0)]);

        let ignore = |_, _| {};
        assert!(decode_each(&[limit], &integers(&[2, 7]), ignore).is_err());
        assert!(decode_each(&[limit], &integers(&[2, -1, 0]), ignore).is_err());
        assert!(decode_each(&[limit], &Value::Int(2), ignore).is_err());
        let text = Value::Array(vec![
            Value::Int(2),
            Value::BulkString(b"7".to_vec()),
            Value::Int(0),
        ]);
        assert!(decode_each(&[limit], &text, ignore).is_err());
    }

    #[test]
    fn each_algorithm_is_sent_by_its_registry_tag() {
        use crate::algorithm::registry::{Kind, Rate, WindowStart};
        let rate = Rate::new(2, Duration::from_secs(1));
        for kind in Kind::ALL {
            let algorithm = kind.build(rate, WindowStart::FirstRequest).expect("valid");
            let mut args = Cmd::new();
            write_decide_args(&mut args, Mode::Decide, &[spending_one(&algorithm)]);
            let sent: Vec<Vec<u8>> = args
                .args_iter()
                .map(|arg| match arg {
                    redis::Arg::Simple(bytes) => bytes.to_vec(),
                    _ => Vec::new(),
                })
                .collect();
            assert_eq!(sent.len(), ARGS_PER_LIMIT + 1, "{}", kind.name());
            assert_eq!(sent[0], kind.tag().as_bytes(), "{}", kind.name());
        }
    }

    #[test]
    fn the_sign_of_the_first_value_says_allowed_or_denied() {
        let algorithm = fixed();
        let limits = [spending_one(&algorithm)];
        let allowed = decode_integers(&limits, &[2, 7, 0]).expect("valid")[0].decision;
        assert!(allowed.is_allowed());
        assert_eq!(allowed.retry_after(), RetryAfter::After(Micros::ZERO));
        assert_eq!(
            (allowed.remaining(), allowed.reset_after()),
            (2, Micros::from_micros(7))
        );
        let denied = decode_integers(&limits, &[-3, 7, 900]).expect("valid")[0].decision;
        assert!(!denied.is_allowed());
        assert_eq!(
            (
                denied.remaining(),
                denied.reset_after(),
                denied.retry_after()
            ),
            (
                2,
                Micros::from_micros(7),
                RetryAfter::After(Micros::from_micros(900))
            )
        );
        let at_bottom = decode_integers(&limits, &[i64::MIN, 0, 1]).expect("valid")[0].decision;
        assert_eq!(
            at_bottom.remaining(),
            u64::try_from(i64::MAX).expect("fits")
        );
    }
}

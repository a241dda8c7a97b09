//! Many script calls to one Redis as one: the calls waiting for the same
//! Redis go out together as one call of a batch script, which runs each in
//! arrival order exactly as it would have run alone, and each caller gets
//! its own reply. Redis spends most of a short script call on the call
//! itself, so under load one batch costs it little more than one call.
//!
//! Nothing waits for a batch to fill. A few batches may be in flight at a
//! time ([`SLOTS`]); a caller queues its call and, if a slot is free,
//! starts a driver that sends whatever is queued, itself included, until
//! the queue is empty. A caller that finds every slot taken is picked up by
//! a driver that is already running. A lone call goes out at once, as the
//! single script it would have been without batching.
//!
//! The batch script's layout, which this side writes and the batch script
//! reads. Calls waiting together are mostly the same limits on other keys,
//! so a batch sends each distinct list of values (a *form*: the values and
//! the number of keys they go with) once, and each call names its form.
//! `KEYS` every call's keys, one call's after the other's; `ARGV` the number
//! of calls `n` and of forms `m`, then each call's form (1 to `m`), then
//! each form's number of keys, then each form's number of values, then
//! every form's values; its reply, every call's reply in order in one flat
//! list, each the call's own values (as many as its [`Batchable`] says) or,
//! as one string, the text of the error it met (one list: Redis spends more
//! on each list in a script's reply than on a command). Redis spends a good
//! part of a batch on turning its values into strings, twice (its own and
//! Lua's), so a value sent once per form rather than once per call is work
//! saved on the one process every instance shares.
//! On a Redis Cluster, where one script may not declare keys of several
//! hash slots, a batch holds the calls waiting for one node, and its keys
//! move to `ARGV`, after the counts and before the values; `KEYS` is then
//! the first call's first key alone, which routes the batch to the node.
//! A call there whose key the node does not serve (the slot moved) is
//! stopped before it writes anything and goes out again on its own.
//!
//! `args` holds a call's keys and values, `queue` the calls waiting and
//! the hand-over of each one's outcome, `reply` the cutting of a batch's
//! reply into each call's.

mod args;
mod queue;
mod reply;

use redis::aio::ConnectionLike;
use redis::{Arg, Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, ToRedisArgs, Value};

pub use self::args::{Args, ScriptArgs};
pub(super) use self::queue::{Batcher, Outcome, Pending, answer_all, invocation};
pub use self::reply::ScriptReply;
use self::reply::{Part, split_replies};

/// Batches in flight to one Redis at a time: while one runs, the next
/// fills, and one in flight more keeps Redis busy while a reply travels.
const SLOTS: usize = 2;

/// The most calls in one batch (`--redis-batch-calls` may say fewer).
const MAX_CALLS: usize = 64;

/// The most keys in one batch (a single call may have this many alone):
/// a script blocks its Redis while it runs, so a batch stays as short as
/// the longest single call.
const MAX_KEYS: usize = 64;

/// The scripts of a call that may go out in a batch.
#[derive(Debug, Clone, Copy)]
pub struct BatchScripts {
    /// The script for the call alone.
    pub single: &'static Script,
    /// The script for many such calls (the layout in this module's header).
    pub batch: &'static Script,
    /// The script for many such calls on one node of a Redis Cluster.
    pub node_batch: &'static Script,
}

/// One script call that may go out in a batch: its keys and values, the
/// script that runs it alone, and the batch script that runs many of them.
#[derive(Debug)]
pub struct Batchable {
    scripts: BatchScripts,
    /// The call's keys, then its values, in one buffer, so that building a
    /// call and laying it into a batch takes no allocation per key or
    /// value.
    arguments: ScriptArgs,
    /// How many of `arguments` are keys.
    key_count: usize,
    /// How many are values.
    value_count: usize,
    /// How many values the call's reply has when the script decides it:
    /// its part of a batch's flat reply.
    reply_values: usize,
}

impl Batchable {
    /// A call of `scripts` whose `arguments` are its keys (the first
    /// `key_count`), then its values, and whose reply, when the script
    /// decides it, has `reply_values` values.
    pub fn new(
        scripts: BatchScripts,
        arguments: ScriptArgs,
        key_count: usize,
        reply_values: usize,
    ) -> Self {
        Self {
            scripts,
            value_count: arguments.len().saturating_sub(key_count),
            arguments,
            key_count,
            reply_values,
        }
    }

    /// The call's keys.
    pub fn keys(&self) -> impl Iterator<Item = &[u8]> {
        self.arguments.iter().take(self.key_count)
    }

    /// The call's values.
    pub fn values(&self) -> impl Iterator<Item = &[u8]> {
        self.arguments.iter().skip(self.key_count)
    }

    /// The call alone, as the single script: its `EVALSHA` written
    /// straight from the call's buffer.
    pub fn alone(&self) -> BatchCall {
        let script = self.scripts.single;
        let mut evalsha =
            Cmd::with_capacity(3 + self.arguments.len(), 64 + self.arguments.byte_len());
        evalsha
            .arg("EVALSHA")
            .arg(script.get_hash())
            .arg(self.key_count);
        for arg in &self.arguments {
            evalsha.arg(arg);
        }
        BatchCall { script, evalsha }
    }

    /// `calls` (all for the first one's batch script) as one call of the
    /// batch script, laid out as this module's header says; none for no
    /// calls.
    pub fn together(calls: &[&Self]) -> Option<BatchCall> {
        Self::laid_out(calls, false)
    }

    /// `calls` (all for the first one's batch script, and all waiting for
    /// one node of a Redis Cluster) as one call of its node batch script,
    /// the keys among the values; none for no calls.
    pub fn together_on_node(calls: &[&Self]) -> Option<BatchCall> {
        Self::laid_out(calls, true)
    }

    /// The batch layout (this module's header): the keys as keys, or, for
    /// one node of a Redis Cluster (`on_node`), among the values after the
    /// counts, with the first key alone as the key that routes the call.
    /// Every form's values come after; a standalone call's keys, being
    /// keys, take no place among them.
    fn laid_out(calls: &[&Self], on_node: bool) -> Option<BatchCall> {
        let first = calls.first()?;
        let script = if on_node {
            first.scripts.node_batch
        } else {
            first.scripts.batch
        };
        let forms = Forms::of(calls);
        let keys = calls.iter().map(|call| call.key_count).sum::<usize>();
        let values = forms
            .first_calls
            .iter()
            .map(|call| call.value_count)
            .sum::<usize>();
        // Room for the command and its counts (each a short word or
        // number, the hash 40 bytes), then every key and every value.
        let counts = 6 + calls.len() + 2 * forms.first_calls.len();
        let bytes = 64
            + 8 * counts
            + calls
                .iter()
                .map(|call| call.arguments.byte_len())
                .sum::<usize>();
        let mut evalsha = Cmd::with_capacity(counts + keys + values, bytes);
        evalsha.arg("EVALSHA").arg(script.get_hash());
        if on_node {
            evalsha.arg(1).arg(first.keys().next()?);
        } else {
            evalsha.arg(keys);
            calls.iter().flat_map(|call| call.keys()).for_each(|key| {
                evalsha.arg(key);
            });
        }
        evalsha.arg(calls.len()).arg(forms.first_calls.len());
        for form in &forms.of_call {
            evalsha.arg(form + 1);
        }
        for call in &forms.first_calls {
            evalsha.arg(call.key_count);
        }
        for call in &forms.first_calls {
            evalsha.arg(call.value_count);
        }
        if on_node {
            calls.iter().flat_map(|call| call.keys()).for_each(|key| {
                evalsha.arg(key);
            });
        }
        for value in forms.first_calls.iter().flat_map(|call| call.values()) {
            evalsha.arg(value);
        }
        Some(BatchCall { script, evalsha })
    }

    /// The batch script's flat `reply` to `calls` (as laid out by
    /// [`Batchable::together`] or [`Batchable::together_on_node`]) as each
    /// call's own: its values as one list, or the text of the error it met;
    /// none if the reply is not laid out for these calls.
    pub fn replies_of(calls: &[&Self], reply: Value) -> Option<Vec<Value>> {
        let (values, parts) =
            split_replies(calls.iter().map(|call| call.reply_values), reply).ok()?;
        let part = |part| match part {
            Part::Values(range) => values
                .get(range)
                .map(|values| Value::Array(values.to_vec())),
            Part::Failed(at) => values.get(at).cloned(),
        };
        parts.into_iter().map(part).collect()
    }

    /// The same form as `other`: as many keys, and the same values, as
    /// the batch sends them (compared as the one run of bytes they are).
    fn same_form(&self, other: &Self) -> bool {
        self.key_count == other.key_count
            && self.arguments.bytes_after(self.key_count)
                == other.arguments.bytes_after(other.key_count)
    }
}

/// The distinct forms of a batch's calls (this module's header), in the
/// order they first appear, and which one each call has.
struct Forms<'a> {
    /// Each form's first call, which stands for it.
    first_calls: Vec<&'a Batchable>,
    /// Each call's form, an index into `first_calls`.
    of_call: Vec<usize>,
}

impl<'a> Forms<'a> {
    fn of(calls: &[&'a Batchable]) -> Self {
        let mut first_calls: Vec<&Batchable> = Vec::new();
        let mut of_call = Vec::with_capacity(calls.len());
        for &call in calls {
            // Most batches hold one form or a few: a comparison with each,
            // a short run of bytes, costs less than hashing every call.
            let known = first_calls.iter().position(|form| form.same_form(call));
            of_call.push(known.unwrap_or_else(|| {
                first_calls.push(call);
                first_calls.len() - 1
            }));
        }
        Self {
            first_calls,
            of_call,
        }
    }
}

/// The values a [`Cmd`] used as a list of arguments holds, in order.
pub fn script_values(args: &Cmd) -> impl Iterator<Item = &[u8]> {
    // Only a SCAN's cursor is anything but a plain value: no call here
    // has one.
    args.args_iter().filter_map(|arg| match arg {
        Arg::Simple(value) => Some(value),
        _ => None,
    })
}

/// One script call, ready to send: a batch script's, or one call's alone
/// ([`Batchable::alone`]), its `EVALSHA` with every key and value in one
/// buffer.
pub struct BatchCall {
    script: &'static Script,
    evalsha: Cmd,
}

impl BatchCall {
    /// Appends `value` to the call's values (a test's clock, after the
    /// layout's last value).
    pub fn arg(&mut self, value: impl ToRedisArgs) -> &mut Self {
        self.evalsha.arg(value);
        self
    }

    /// Runs the call on `connection`, loading the script first where Redis
    /// does not have it yet (`NOSCRIPT`), as `ScriptInvocation` does.
    pub async fn invoke_async(&self, connection: &mut impl ConnectionLike) -> RedisResult<Value> {
        match self.evalsha.query_async(connection).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.prepare_invoke().load_async(connection).await?;
                self.evalsha.query_async(connection).await
            }
            reply => reply,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::LazyLock;

    use super::*;

    static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new("return 1"));

    /// A call of [`SCRIPT`] on `keys` with `values`.
    pub(super) fn call(keys: &[&str], values: &[&str]) -> Batchable {
        let mut arguments = ScriptArgs::default();
        for argument in keys.iter().chain(values) {
            arguments.arg(*argument);
        }
        let scripts = BatchScripts {
            single: &SCRIPT,
            batch: &SCRIPT,
            node_batch: &SCRIPT,
        };
        Batchable::new(scripts, arguments, keys.len(), 2 * keys.len())
    }

    fn sent(batch: &BatchCall) -> Vec<String> {
        script_values(&batch.evalsha)
            .map(|value| String::from_utf8_lossy(value).into_owned())
            .collect()
    }

    #[test]
    fn calls_with_the_same_values_send_them_once() {
        let a = call(&["a"], &["fw", "10", "1000", "decide"]);
        let b = call(&["b"], &["fw", "10", "1000", "decide"]);
        let c = call(&["c"], &["fw", "10", "1000", "dry"]);
        // The same values with another number of keys are another form.
        let d = call(&["d", "e"], &["fw", "10", "1000", "decide"]);
        let e = call(&["f"], &["fw", "10", "1000", "dry"]);
        let batch = Batchable::together(&[&a, &b, &c, &d, &e]).expect("calls");
        let sha = SCRIPT.get_hash();
        #[rustfmt::skip]
        let expected = [
            "EVALSHA", sha, "6", "a", "b", "c", "d", "e", "f",
            "5", "3", // calls, forms
            "1", "1", "2", "3", "2", // each call's form
            "1", "1", "2", // each form's keys
            "4", "4", "4", // each form's values
            "fw", "10", "1000", "decide",
            "fw", "10", "1000", "dry",
            "fw", "10", "1000", "decide",
        ];
        assert_eq!(sent(&batch), expected);

        let on_node = Batchable::together_on_node(&[&a, &b, &c]).expect("calls");
        #[rustfmt::skip]
        let expected = [
            "EVALSHA", sha, "1", "a",
            "3", "2", "1", "1", "2", "1", "1", "4", "4",
            "a", "b", "c",
            "fw", "10", "1000", "decide",
            "fw", "10", "1000", "dry",
        ];
        assert_eq!(sent(&on_node), expected);
    }
}

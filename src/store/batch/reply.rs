//! A batch script's reply cut into each call's (the layout in `store::batch`'s
//! header): each call's values, or the error it met, as its own call would
//! have met it.

use std::ops::Range;
use std::sync::Arc;

use redis::{RedisError, Value};

/// A script call's reply, as its caller reads it.
#[derive(Debug, Clone, PartialEq)]
pub enum ScriptReply {
    /// The reply as Redis sent it (the call went out alone).
    Whole(Value),
    /// The call's values within its batch's flat reply, which the batch's
    /// calls share rather than each taking a copy.
    InBatch {
        /// The batch script's reply.
        reply: Arc<Vec<Value>>,
        /// Where the call's values are in it.
        values: Range<usize>,
    },
}

impl ScriptReply {
    /// The reply's values when it is a list of them, else the reply as
    /// Redis sent it.
    pub fn values(&self) -> Result<&[Value], &Value> {
        match self {
            Self::Whole(Value::Array(values)) => Ok(values),
            Self::Whole(other) => Err(other),
            Self::InBatch { reply, values } => reply.get(values.clone()).ok_or(&Value::Nil),
        }
    }
}

/// One call's part of a batch script's flat reply.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Part {
    /// Its values, where they are in the reply.
    Values(Range<usize>),
    /// The error it met: the text at this place in the reply.
    Failed(usize),
}

/// A batch script's flat `reply` cut into each call's part, given how
/// many values each call's reply has (`reply_values`): its values, or the
/// error's text where the call met one. A call of no values has nothing
/// that can fail, so text after it is the next call's. A reply of another
/// shape comes back whole, as the error.
pub(super) fn split_replies(
    reply_values: impl Iterator<Item = usize>,
    reply: Value,
) -> Result<(Arc<Vec<Value>>, Vec<Part>), Value> {
    let Value::Array(values) = reply else {
        return Err(reply);
    };
    let is_text = |value: &Value| matches!(value, Value::BulkString(_) | Value::SimpleString(_));
    let mut parts = Vec::with_capacity(reply_values.size_hint().0);
    let mut at = 0;
    for count in reply_values {
        match values.get(at) {
            Some(value) if count > 0 && is_text(value) => {
                parts.push(Part::Failed(at));
                at += 1;
            }
            _ => {
                parts.push(Part::Values(at..at + count));
                at += count;
            }
        }
    }
    if at != values.len() {
        return Err(Value::Array(values));
    }
    Ok((Arc::new(values), parts))
}

/// The error a call of a batch met, from its `text` in the batch's reply,
/// as its own call would have met it.
pub(super) fn error_of_one(text: &Value) -> RedisError {
    let text = match text {
        Value::BulkString(text) => text.as_slice(),
        Value::SimpleString(text) => text.as_bytes(),
        _ => b"",
    };
    let mut line = Vec::with_capacity(text.len() + 3);
    line.push(b'-');
    line.extend(text.iter().map(|&byte| match byte {
        b'\r' | b'\n' => b' ',
        other => other,
    }));
    line.extend(b"\r\n");
    match redis::parse_redis_value(&line) {
        Ok(Value::ServerError(err)) => err.into(),
        Ok(_) => RedisError::from((
            redis::ErrorKind::Extension,
            "script error",
            String::from_utf8_lossy(text).into_owned(),
        )),
        Err(err) => err,
    }
}

/// Did a call of a Redis Cluster node's batch stop because the node does
/// not serve its keys (their slot moved, or is moving) or cannot serve them
/// now (the cluster is down)? Redis stops a script's command on such a key
/// before it runs, and the batch script touches every key of a call before
/// deciding it, so the call wrote nothing: it can go out on its own, to
/// the node that serves it, and meet there what it would have met alone.
pub(super) fn not_served_here(err: &RedisError) -> bool {
    let text = err.to_string();
    text.contains("Script attempted to access a non local key")
        || text.contains("while the cluster is down")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_reply_is_cut_into_each_calls_values_or_error() {
        let int = Value::Int;
        let text = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let reply = Value::Array(vec![int(1), int(2), text("ERR a"), int(3), int(4), int(5)]);
        let (values, parts) = split_replies([2, 3, 3].into_iter(), reply).expect("laid out");
        assert_eq!(
            parts,
            [Part::Values(0..2), Part::Failed(2), Part::Values(3..6)]
        );
        let shared = ScriptReply::InBatch {
            reply: Arc::clone(&values),
            values: 3..6,
        };
        assert_eq!(shared.values(), Ok([int(3), int(4), int(5)].as_slice()));
        let err = error_of_one(&values[2]);
        assert_eq!(err.detail(), Some("a"), "{err}");
        // A call of no values cannot fail: the text is the next call's.
        let (_, parts) =
            split_replies([0, 1].into_iter(), Value::Array(vec![text("ERR c")])).expect("laid out");
        assert_eq!(parts, [Part::Values(0..0), Part::Failed(0)]);
        // Too few values, one too many, a value where an error's text
        // would end the reply: each comes back whole.
        for (counts, values) in [
            (vec![2], vec![int(1)]),
            (vec![1], vec![int(1), int(2)]),
            (vec![3, 1], vec![int(1), text("ERR b"), int(2)]),
        ] {
            let reply = Value::Array(values);
            assert_eq!(split_replies(counts.into_iter(), reply.clone()), Err(reply));
        }
        assert_eq!(split_replies([1].into_iter(), int(1)), Err(int(1)));
        assert_eq!(ScriptReply::Whole(int(1)).values(), Err(&int(1)));
    }
}

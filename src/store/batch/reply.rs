//! A batch script's reply cut into each call's (the layout in `store::batch`'s
//! header): each call's values, or the error it met, as its own call would
//! have met it.

use redis::{RedisError, Value};

/// A batch script's flat `reply` cut into each call's, given how many
/// values each call's reply has (`reply_values`): a list of those values,
/// or the error's text where the call met one. A call of no values has
/// nothing that can fail, so text after it is the next call's. A reply of
/// another shape comes back whole, as the error.
pub(super) fn split_replies(
    reply_values: impl Iterator<Item = usize> + Clone,
    reply: Value,
) -> Result<Vec<Value>, Value> {
    let Value::Array(values) = reply else {
        return Err(reply);
    };
    let is_text = |value: &Value| matches!(value, Value::BulkString(_) | Value::SimpleString(_));
    // The layout is checked before anything is taken out of the reply.
    let mut at = 0;
    for count in reply_values.clone() {
        at += match values.get(at) {
            Some(value) if count > 0 && is_text(value) => 1,
            _ => count,
        };
    }
    if at != values.len() {
        return Err(Value::Array(values));
    }
    let mut replies = Vec::new();
    let mut values = values.into_iter();
    for count in reply_values {
        if count > 0 && values.as_slice().first().is_some_and(is_text) {
            replies.extend(values.next());
        } else {
            replies.push(Value::Array(values.by_ref().take(count).collect()));
        }
    }
    Ok(replies)
}

/// One call's part of the batch script's reply: its own reply, or the
/// error it met, as its own call would have met it.
pub(super) fn reply_of_one(reply: Value) -> Result<Value, RedisError> {
    let text = match reply {
        Value::BulkString(text) => text,
        Value::SimpleString(text) => text.into_bytes(),
        value => return Ok(value),
    };
    let mut line = Vec::with_capacity(text.len() + 3);
    line.push(b'-');
    line.extend(text.iter().map(|&byte| match byte {
        b'\r' | b'\n' => b' ',
        other => other,
    }));
    line.extend(b"\r\n");
    match redis::parse_redis_value(&line) {
        Ok(Value::ServerError(err)) => Err(err.into()),
        Ok(_) => Err(RedisError::from((
            redis::ErrorKind::Extension,
            "script error",
            String::from_utf8_lossy(&text).into_owned(),
        ))),
        Err(err) => Err(err),
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
        assert_eq!(
            split_replies([2, 3, 3].into_iter(), reply),
            Ok(vec![
                Value::Array(vec![int(1), int(2)]),
                text("ERR a"),
                Value::Array(vec![int(3), int(4), int(5)]),
            ])
        );
        // A call of no values cannot fail: the text is the next call's.
        assert_eq!(
            split_replies([0, 1].into_iter(), Value::Array(vec![text("ERR c")])),
            Ok(vec![Value::Array(vec![]), text("ERR c")])
        );
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
    }
}

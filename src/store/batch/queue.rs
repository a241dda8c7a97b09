//! The calls waiting for one Redis node (`store::batch`'s header): queued
//! by their callers, taken a batch at a time by a driver, and each
//! caller handed its part of the batch's outcome.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use redis::{ErrorKind, RedisError, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use super::reply::{Part, error_of_one, not_served_here, split_replies};
use super::{BatchCall, Batchable, MAX_CALLS, MAX_KEYS, SLOTS, ScriptReply};
use crate::error::StoreError;
use crate::store::breaker::CircuitBreaker;

/// What became of a queued call.
pub(in crate::store) enum Outcome {
    /// Its reply.
    Reply(ScriptReply),
    /// The error it met, as it would have met it alone.
    Failed(StoreError),
    /// Its batch was refused before it ran (Redis answered the batch with
    /// an error): the call goes out on its own.
    OnItsOwn(Batchable),
}

/// A queued call and where its outcome goes.
pub(in crate::store) struct Pending {
    call: Batchable,
    outcome: oneshot::Sender<Outcome>,
}

impl Pending {
    /// The call.
    pub(in crate::store) fn call(&self) -> &Batchable {
        &self.call
    }

    /// Hands the caller its outcome (a caller that gave up is gone).
    pub(in crate::store) fn answer(self, outcome: Outcome) {
        let _gone = self.outcome.send(outcome);
    }

    /// Sends the call back to its caller, to go out on its own.
    pub(in crate::store) fn on_its_own(self) {
        let outcome = Outcome::OnItsOwn(self.call);
        let _gone = self.outcome.send(outcome);
    }
}

/// The calls waiting for one Redis, and the batches in flight to it.
pub(in crate::store) struct Batcher {
    queue: Mutex<VecDeque<Pending>>,
    slots: Arc<Semaphore>,
    max_calls: usize,
}

impl Batcher {
    /// A queue whose batches carry at most `max_calls` calls (at most
    /// [`MAX_CALLS`]).
    pub(in crate::store) fn new(max_calls: usize) -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            slots: Arc::new(Semaphore::new(SLOTS)),
            max_calls: max_calls.clamp(1, MAX_CALLS),
        }
    }

    /// Queues `call`: where its outcome will come, and a slot if one was
    /// free (the caller then starts a driver with it).
    pub(in crate::store) fn enqueue(
        &self,
        call: Batchable,
    ) -> (oneshot::Receiver<Outcome>, Option<OwnedSemaphorePermit>) {
        let (outcome, receiver) = oneshot::channel();
        self.queue().push_back(Pending { call, outcome });
        (receiver, Arc::clone(&self.slots).try_acquire_owned().ok())
    }

    /// The next batch: the calls at the front of the queue, within the
    /// bounds, all for the same batch script; calls whose callers gave up
    /// are dropped.
    pub(in crate::store) fn take(&self) -> Vec<Pending> {
        let mut queue = self.queue();
        let mut batch: Vec<Pending> = Vec::new();
        let mut keys = 0;
        while let Some(next) = queue.front() {
            if next.outcome.is_closed() {
                queue.pop_front();
                continue;
            }
            if let Some(first) = batch.first() {
                let full = batch.len() >= self.max_calls || keys + next.call.key_count > MAX_KEYS;
                if full || !std::ptr::eq(first.call.scripts.batch, next.call.scripts.batch) {
                    break;
                }
            }
            keys += next.call.key_count;
            batch.extend(queue.pop_front());
        }
        batch
    }

    /// Do its batches carry more than one call?
    pub(in crate::store) fn batches(&self) -> bool {
        self.max_calls > 1
    }

    /// After a driver gave its slot back on finding the queue empty: a slot
    /// for it to go on with, if a call came in meanwhile and no other
    /// driver took the slot (so that no call is left in the queue with no
    /// driver coming).
    pub(in crate::store) fn lead_again(&self) -> Option<OwnedSemaphorePermit> {
        if self.queue().is_empty() {
            return None;
        }
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<Pending>> {
        // The queue is left whole by every holder: a panic elsewhere does
        // not make it unusable.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Hands each caller of `batch` its part of the batch script's `reply`,
/// and tells `breaker` how the call went; `classify` reads a call's error
/// as the store reads any.
pub(in crate::store) fn answer_all(
    batch: Vec<Pending>,
    reply: Result<Value, StoreError>,
    breaker: &CircuitBreaker,
    classify: fn(RedisError) -> StoreError,
) {
    let reply = reply
        .map(|reply| split_replies(batch.iter().map(|pending| pending.call.reply_values), reply));
    match reply {
        Ok(Ok((reply, parts))) => {
            breaker.record_success();
            for (pending, part) in batch.into_iter().zip(parts) {
                let failed = match part {
                    Part::Values(values) => {
                        let reply = Arc::clone(&reply);
                        pending.answer(Outcome::Reply(ScriptReply::InBatch { reply, values }));
                        continue;
                    }
                    Part::Failed(at) => reply.get(at).map_or_else(
                        || RedisError::from((ErrorKind::Extension, "script error")),
                        error_of_one,
                    ),
                };
                if not_served_here(&failed) {
                    pending.on_its_own();
                } else {
                    pending.answer(Outcome::Failed(classify(failed)));
                }
            }
        }
        Ok(Err(other)) => {
            breaker.record_success();
            let err = StoreError::Reply(format!("batch script replied {other:?}"));
            for pending in batch {
                pending.answer(Outcome::Failed(err.clone()));
            }
        }
        Err(err) => {
            // As if each call had failed alone: its failure counts towards
            // the breaker as its own call's would have.
            for pending in batch {
                if err.is_transient() {
                    breaker.record_failure();
                }
                pending.answer(Outcome::Failed(err.clone()));
            }
        }
    }
}

/// The batch script's call for `batch` (see [`Batchable::together`]), for
/// one node of a Redis Cluster if `on_cluster`
/// ([`Batchable::together_on_node`]).
pub(in crate::store) fn invocation(batch: &[Pending], on_cluster: bool) -> Option<BatchCall> {
    let calls: Vec<&Batchable> = batch.iter().map(Pending::call).collect();
    Batchable::laid_out(&calls, on_cluster)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::batch::tests::call;

    fn queued(key: &str) -> (Pending, oneshot::Receiver<Outcome>) {
        let (outcome, receiver) = oneshot::channel();
        let call = call(&[key], &[]);
        (Pending { call, outcome }, receiver)
    }

    #[tokio::test]
    async fn a_call_whose_key_the_node_does_not_serve_goes_out_on_its_own() {
        let (decided, decided_outcome) = queued("a");
        let (moved, moved_outcome) = queued("b");
        let (down, down_outcome) = queued("c");
        let (broken, broken_outcome) = queued("d");
        let reply = Value::Array(vec![
            Value::Int(1),
            Value::Int(2),
            Value::BulkString(
                b"ERR Script attempted to access a non local key in a cluster node script: 1f"
                    .to_vec(),
            ),
            Value::BulkString(
                b"ERR Script attempted to execute a command while the cluster is down".to_vec(),
            ),
            Value::BulkString(b"ERR unknown algorithm xx".to_vec()),
        ]);
        let breaker = CircuitBreaker::new(1);
        answer_all(
            vec![decided, moved, down, broken],
            Ok(reply),
            &breaker,
            |err| StoreError::Refused { source: err },
        );
        assert!(matches!(
            decided_outcome.await,
            Ok(Outcome::Reply(reply)) if reply.values() == Ok([Value::Int(1), Value::Int(2)].as_slice())
        ));
        assert!(
            matches!(moved_outcome.await, Ok(Outcome::OnItsOwn(call)) if call.keys().eq([b"b".as_slice()]))
        );
        assert!(
            matches!(down_outcome.await, Ok(Outcome::OnItsOwn(call)) if call.keys().eq([b"c".as_slice()]))
        );
        assert!(
            matches!(broken_outcome.await, Ok(Outcome::Failed(StoreError::Refused { source })) if source.to_string().contains("unknown algorithm"))
        );
        assert!(breaker.allows());
    }

    #[tokio::test]
    async fn a_failed_batch_gives_every_caller_the_error_with_its_source() {
        let (first, first_outcome) = queued("a");
        let (second, second_outcome) = queued("b");
        let lost: RedisError = std::io::Error::from(std::io::ErrorKind::ConnectionReset).into();
        let breaker = CircuitBreaker::new(2);
        let failed = Err(StoreError::Unavailable { source: lost });
        answer_all(vec![first, second], failed, &breaker, |err| {
            StoreError::Refused { source: err }
        });
        for outcome in [first_outcome.await, second_outcome.await] {
            let Ok(Outcome::Failed(err)) = outcome else {
                panic!("a caller was not given the batch's error");
            };
            let source = std::error::Error::source(&err).and_then(|err| err.downcast_ref());
            assert!(
                source.is_some_and(RedisError::is_connection_dropped),
                "{err:?}"
            );
        }
        assert!(!breaker.allows(), "each caller's failure counts");
    }
}

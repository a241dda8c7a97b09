//! Sheds decisions beyond a server-wide number in flight: a decision that
//! finds every slot taken gets `RESOURCE_EXHAUSTED` at once, instead of
//! queueing without bound while Redis is slow (a queue only turns a slow
//! store into a slow proxy and then a memory problem).
//!
//! A slot is taken by the API handlers once the request has been read and
//! decoded, not when its headers arrive: a peer that opens streams and never
//! sends their bodies holds only its own connection's streams (bounded per
//! connection and timed out by the server), never the slots every other
//! caller needs.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::Status;

use crate::metrics;

/// At most `limit` decisions in flight across all connections.
#[derive(Clone)]
pub struct DecisionSlots {
    slots: Arc<Semaphore>,
    limit: usize,
}

impl DecisionSlots {
    pub fn new(limit: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// A slot for one decision, held until the guard is dropped (also when
    /// the client gives up and the call's future is dropped unfinished).
    pub fn enter(&self) -> Result<InFlight, Status> {
        match self.slots.clone().try_acquire_owned() {
            Ok(slot) => {
                metrics::in_flight(1.0);
                Ok(InFlight { _slot: slot })
            }
            Err(_) => Err(Status::resource_exhausted(format!(
                "more than {} calls in flight (--max-concurrent-requests)",
                self.limit
            ))),
        }
    }
}

/// A slot taken, counted in the in-flight gauge until dropped.
pub struct InFlight {
    _slot: OwnedSemaphorePermit,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::in_flight(-1.0);
    }
}

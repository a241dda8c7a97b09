//! Sheds decisions beyond a server-wide number in flight: a decision that
//! finds every slot taken is refused at once (`RESOURCE_EXHAUSTED` over
//! gRPC), instead of queueing without bound while Redis is slow (a queue only turns a slow
//! store into a slow proxy and then a memory problem).
//!
//! A slot is taken by the API handlers once the request has been read and
//! decoded, not when its headers arrive: a peer that opens streams and never
//! sends their bodies holds only its own connection's streams (bounded per
//! connection and timed out by the server), never the slots every other
//! caller needs. And no one peer (client IP address) may hold more than its
//! own share (`--max-concurrent-requests-per-peer`, by default 90%), so a
//! peer with many connections cannot take every slot either.
//!
//! Why not tower's `ConcurrencyLimit` behind `LoadShed`: as layers they
//! take the slot when a request's headers arrive, before its body is read,
//! which is exactly what lets a slow-body peer hold every slot; and they
//! have no notion of a peer's share. The global bound here is a tokio
//! `Semaphore` all the same; what is our own is only the per-peer count.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::Error;
use crate::metrics;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// At most `limit` decisions in flight across all connections, and at most
/// `per_peer_limit` of them from one IP address.
#[derive(Clone)]
pub(crate) struct DecisionSlots {
    slots: Arc<Semaphore>,
    limit: usize,
    peers: Arc<PeerSlots>,
}

/// Decisions in flight by peer address; an address with none has no entry.
struct PeerSlots {
    limit: usize,
    in_flight: Mutex<HashMap<IpAddr, usize>>,
}

impl DecisionSlots {
    /// At most `limit` decisions in flight, `per_peer_limit` of them from one address.
    pub(crate) fn new(limit: usize, per_peer_limit: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
            peers: Arc::new(PeerSlots {
                limit: per_peer_limit,
                in_flight: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// A slot for one decision from `peer` (`None`: not known), held until
    /// the guard is dropped (also when the client gives up and the call's
    /// future is dropped unfinished).
    pub(crate) fn enter(&self, peer: Option<IpAddr>) -> Result<InFlight, Error> {
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            return Err(Error::Overloaded(format!(
                "more than {} calls in flight (--max-concurrent-requests)",
                self.limit
            )));
        };
        if let Some(peer) = peer {
            let mut in_flight = self.peers.lock();
            let count = in_flight.entry(peer).or_insert(0);
            if *count >= self.peers.limit {
                return Err(Error::Overloaded(format!(
                    "more than {} calls in flight from {peer} \
                     (--max-concurrent-requests-per-peer)",
                    self.peers.limit
                )));
            }
            *count += 1;
        }
        metrics::in_flight(1.0);
        Ok(InFlight {
            _slot: slot,
            peer: peer.map(|peer| (self.peers.clone(), peer)),
        })
    }
}

impl PeerSlots {
    /// The map's lock; a panic while holding it leaves counts whole.
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn leave(&self, peer: IpAddr) {
        let mut in_flight = self.lock();
        if let Some(count) = in_flight.get_mut(&peer) {
            *count -= 1;
            if *count == 0 {
                in_flight.remove(&peer);
            }
        }
    }
}

/// A slot taken, counted in the in-flight gauge until dropped.
pub(crate) struct InFlight {
    _slot: OwnedSemaphorePermit,
    peer: Option<(Arc<PeerSlots>, IpAddr)>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some((peers, peer)) = &self.peer {
            peers.leave(*peer);
        }
        metrics::in_flight(-1.0);
    }
}

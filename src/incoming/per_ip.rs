//! Counts open connections by client IP address, so that one address can
//! hold at most `--max-connections-per-ip` of them.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Connections open by peer address; an address with none has no entry.
#[derive(Debug)]
pub(super) struct PeerConnections {
    limit: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

impl PeerConnections {
    /// At most `limit` connections open from one address.
    pub(super) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// The most connections one address may have open.
    pub(super) fn limit(&self) -> usize {
        self.limit
    }

    /// A place for one more connection from `peer`, held until dropped, or
    /// `None` when it already has `limit` open.
    pub(super) fn enter(self: &Arc<Self>, peer: IpAddr) -> Option<PeerSlot> {
        let mut open = self.lock();
        let count = open.entry(peer).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(PeerSlot {
            peers: self.clone(),
            peer,
        })
    }

    /// The map's lock; a panic while holding it leaves counts whole.
    fn lock(&self) -> MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One connection counted against its address, until dropped.
#[derive(Debug)]
pub(super) struct PeerSlot {
    peers: Arc<PeerConnections>,
    peer: IpAddr,
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.lock();
        if let Some(count) = open.get_mut(&self.peer) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_limit_and_a_closed_one_frees_a_place() {
        let peers = PeerConnections::new(2);
        let a: IpAddr = [127, 0, 0, 1].into();
        let b: IpAddr = [127, 0, 0, 2].into();
        let first = peers.enter(a).expect("first");
        let _second = peers.enter(a).expect("second");
        assert!(peers.enter(a).is_none(), "a third from one address");
        assert!(peers.enter(b).is_some(), "another address is not held back");
        drop(first);
        assert!(peers.enter(a).is_some(), "a place freed by a close");
        drop(_second);
        assert!(peers.lock().is_empty(), "no entry for an address with none");
    }
}

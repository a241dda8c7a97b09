//! The embedded store: state in this process, for a single instance or for
//! tests. Same answers as Redis, but not shared between instances.
//!
//! A concurrent map (dashmap: sharded locks) holds each key's state with its
//! expiry. A decision runs under the key's shard lock, which makes it as
//! atomic as a Lua script is on Redis. Expired state is treated as absent at
//! once and evicted by a background sweep, so memory stays bounded by the
//! keys live within their windows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use dashmap::mapref::entry::Entry;

use crate::algorithm::MemoryChange;
use crate::limit::Micros;

/// Where the embedded store reads the time. Redis reads its own clock; here
/// a trait lets unit tests drive the time by hand.
pub trait Clock: Send + Sync + 'static {
    /// Microseconds since an arbitrary fixed start; never goes backwards.
    fn now(&self) -> Micros;
}

/// The process's monotonic clock.
#[derive(Debug)]
pub struct MonotonicClock(Instant);

impl Default for MonotonicClock {
    fn default() -> Self {
        Self(Instant::now())
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> Micros {
        self.0.elapsed().as_micros() as Micros
    }
}

/// A clock that moves only when told: for tests.
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_micros() as u64, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Micros {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Debug)]
struct Slot<S> {
    /// `None` once a decision emptied it; such a slot is removed right after.
    state: Option<S>,
    /// The state counts while `now < expires_at`, as a Redis key does.
    expires_at: Micros,
}

impl<S> Slot<S> {
    /// Runs `decide` on this slot's live state and records its change.
    fn decide<R>(
        &mut self,
        now: Micros,
        decide: impl FnOnce(&mut Option<S>, Micros) -> (R, MemoryChange),
    ) -> R {
        if self.expires_at <= now {
            self.state = None;
        }
        let (result, change) = decide(&mut self.state, now);
        if let MemoryChange::Written { expires_at } = change {
            self.expires_at = expires_at;
        }
        result
    }
}

/// Keys and their state of type `S`, with expiry.
pub struct MemoryStore<S> {
    slots: DashMap<Box<str>, Slot<S>>,
    clock: Arc<dyn Clock>,
}

impl<S: Send + Sync + 'static> MemoryStore<S> {
    /// A store on `clock`; call [`MemoryStore::spawn_sweeper`] to evict
    /// expired keys in the background.
    pub fn new(clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            slots: DashMap::new(),
            clock,
        })
    }

    /// Evicts expired keys every `interval` for as long as the store lives.
    pub fn spawn_sweeper(self: &Arc<Self>, interval: Duration) {
        let store: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(store) = store.upgrade() else { return };
                store.evict_expired();
            }
        });
    }

    /// Drops every key whose state has expired.
    pub fn evict_expired(&self) {
        let now = self.clock.now();
        self.slots.retain(|_, slot| slot.expires_at > now);
    }

    /// Keys held, live or not yet evicted.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Runs `decide` on `key`'s live state (`None` if absent or expired),
    /// atomically with respect to every other call on the same key, and keeps
    /// what it leaves: a state left `None` removes the key.
    pub fn update<R>(
        &self,
        key: &str,
        decide: impl FnOnce(&mut Option<S>, Micros) -> (R, MemoryChange),
    ) -> R {
        let now = self.clock.now();
        // Most calls find their key: look it up without allocating first.
        if let Some(mut slot) = self.slots.get_mut(key) {
            let result = slot.decide(now, decide);
            let emptied = slot.state.is_none();
            drop(slot);
            if emptied {
                // The shard lock is released: remove the key only if no call
                // has written it since.
                self.slots.remove_if(key, |_, slot| slot.state.is_none());
            }
            return result;
        }
        match self.slots.entry(key.into()) {
            // Another call created the key since the lookup above.
            Entry::Occupied(mut occupied) => {
                let result = occupied.get_mut().decide(now, decide);
                if occupied.get().state.is_none() {
                    occupied.remove();
                }
                result
            }
            Entry::Vacant(vacant) => {
                let mut slot = Slot {
                    state: None,
                    expires_at: now,
                };
                let result = slot.decide(now, decide);
                if slot.state.is_some() {
                    vacant.insert(slot);
                }
                result
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A counter that expires 10 µs after its last write.
    fn count(state: &mut Option<u64>, now: Micros) -> (u64, MemoryChange) {
        let n = state.get_or_insert(0);
        *n += 1;
        (
            *n,
            MemoryChange::Written {
                expires_at: now + 10,
            },
        )
    }

    #[test]
    fn state_counts_until_it_expires_then_is_evicted() {
        let clock = Arc::new(ManualClock::default());
        let store = MemoryStore::new(clock.clone());
        assert_eq!(store.update("k", count), 1);
        clock.advance(Duration::from_micros(9));
        assert_eq!(store.update("k", count), 2);
        clock.advance(Duration::from_micros(10));
        assert_eq!(store.update("k", count), 1, "expired state reads as absent");
        clock.advance(Duration::from_micros(10));
        store.evict_expired();
        assert!(store.is_empty());
    }

    #[test]
    fn a_decision_that_writes_nothing_stores_nothing() {
        let store: Arc<MemoryStore<u64>> = MemoryStore::new(Arc::new(ManualClock::default()));
        store.update("k", |_, _| ((), MemoryChange::None));
        assert!(store.is_empty());
        store.update("k", count);
        store.update("k", |state, _| {
            *state = None;
            ((), MemoryChange::Updated)
        });
        assert!(store.is_empty(), "an emptied key is removed");
    }
}

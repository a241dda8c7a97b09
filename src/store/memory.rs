//! The embedded store: state in this process, for a single instance or for
//! tests. Same answers as Redis, but not shared between instances.
//!
//! Keys live in a fixed number of shards, each a `HashMap` behind a mutex. A
//! decision runs with its keys' shards locked, which makes it as atomic as a
//! Lua script is on Redis, also for a decision over several keys at once
//! (shards are locked in ascending order, so two such decisions never wait on
//! each other in a cycle). A concurrent map crate was not enough here: none
//! locks several keys together. Expired state is treated as absent at once
//! and evicted by a background sweep, which also gives memory back (maps
//! shrunk, the allocator trimmed).
//!
//! Memory is capped (`--memory-max-bytes`): each shard keeps an estimate of
//! what its keys take (key bytes, state, the map's table) and may use its
//! share of the budget. A write that takes a shard past its share evicts
//! there, first what has expired, then the keys closest to expiry, down to
//! 90% of the share. Closest to expiry because those lose the least: an
//! evicted key starts afresh (as if its window had ended), so it may admit
//! up to one more limit, and these keys were about to start afresh anyway.
//! A flood of new keys therefore cannot reset a long-window key while
//! shorter-lived keys remain, and never grows memory past the cap.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use super::clock::Clock;
use crate::limit::Micros;
use crate::metrics;

/// What a state holds on the heap beyond its own size, for the budget.
pub trait HeapSize {
    /// Heap bytes held.
    fn heap_bytes(&self) -> usize;
}

impl HeapSize for u64 {
    fn heap_bytes(&self) -> usize {
        0
    }
}

/// Enough shards that two cores rarely meet on one lock.
const SHARDS: usize = 64;

/// The embedded store's memory budget unless configured.
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;

/// The least the store must have shrunk by before the allocator is trimmed.
const TRIM_AFTER_FREEING: usize = 1 << 20;

/// What the allocator adds to each key's bytes (its header and rounding),
/// as glibc's malloc does for small blocks.
const ALLOCATION_OVERHEAD: usize = 16;

#[derive(Debug)]
struct Slot<S> {
    /// `None` once a decision emptied it; such a slot is removed right after.
    state: Option<S>,
    /// The state counts while `now < expires_at`, as a Redis key does.
    expires_at: Micros,
}

/// One shard's keys, and the bytes their keys and states take beyond the
/// map's table.
struct Shard<S> {
    map: HashMap<Box<str>, Slot<S>>,
    entry_bytes: usize,
}

impl<S: HeapSize> Shard<S> {
    fn new() -> Self {
        Self {
            map: HashMap::new(),
            entry_bytes: 0,
        }
    }

    /// What one key takes beyond its place in the table.
    fn entry_bytes(key: &str, slot: &Slot<S>) -> usize {
        key.len() + ALLOCATION_OVERHEAD + slot.state.as_ref().map_or(0, HeapSize::heap_bytes)
    }

    /// The shard's estimated memory: entries and the table (one control
    /// byte and one (key, slot) pair per bucket, full or not).
    fn bytes(&self) -> usize {
        let bucket = std::mem::size_of::<(Box<str>, Slot<S>)>() + 1;
        self.entry_bytes + self.map.capacity() * bucket
    }

    /// Keeps the keys `keep` says to, with the byte count following; the
    /// number dropped.
    fn retain(&mut self, mut keep: impl FnMut(&str, &Slot<S>) -> bool) -> usize {
        let before = self.map.len();
        let mut freed = 0;
        self.map.retain(|key, slot| {
            let kept = keep(key, slot);
            if !kept {
                freed += Self::entry_bytes(key, slot);
            }
            kept
        });
        self.entry_bytes -= freed;
        before - self.map.len()
    }

    /// Drops what expired at `now`; the number dropped.
    fn evict_expired(&mut self, now: Micros) -> usize {
        self.retain(|_, slot| slot.expires_at > now)
    }

    /// Brings the shard under `budget` after a write: evicts what expired,
    /// then, if still above 90% of it, the keys closest to expiry (never
    /// `keep`, the key just written) until under 90%. Returns the number
    /// of live keys evicted.
    fn make_room(&mut self, budget: usize, now: Micros, keep: &str) -> usize {
        if self.bytes() <= budget {
            return 0;
        }
        self.evict_expired(now);
        let target = budget / 10 * 9;
        let mut evicted = 0;
        if self.bytes() > target {
            // Free what the entries over the target take, soonest expiry
            // first.
            let mut by_expiry: Vec<(Micros, usize)> = self
                .map
                .iter()
                .filter(|(key, _)| &***key != keep)
                .map(|(key, slot)| (slot.expires_at, Self::entry_bytes(key, slot)))
                .collect();
            by_expiry.sort_unstable();
            // The table keeps its size (so refilling it does not grow it
            // again): only entries free bytes.
            let mut to_free = self.bytes() - target;
            let mut threshold = None;
            for (expires_at, bytes) in by_expiry {
                threshold = Some(expires_at);
                if bytes >= to_free {
                    break;
                }
                to_free -= bytes;
            }
            if let Some(threshold) = threshold {
                evicted = self.retain(|key, slot| slot.expires_at > threshold || key == keep);
            }
        }
        // A table grown past the budget on its own (a budget of few keys)
        // is shrunk to what is left.
        if self.bytes() > target && self.map.capacity() > 2 * self.map.len() {
            self.map.shrink_to(0);
        }
        evicted
    }
}

/// What a decision did to a key's state: the store's part of every
/// in-memory decision (the algorithms' twins say it, the store acts on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryChange {
    /// Nothing.
    None,
    /// Changed it (or emptied it), keeping its expiry.
    Updated,
    /// Wrote it with a new expiry.
    Written {
        /// When the state stops counting.
        expires_at: Micros,
    },
}

/// Keys and their state of type `S`, with expiry, within a memory budget.
pub struct MemoryStore<S> {
    shards: Box<[Mutex<Shard<S>>]>,
    /// Spreads keys over shards; seeded per store, as the maps' hashing is.
    shard_hasher: foldhash::fast::RandomState,
    clock: Arc<dyn Clock>,
    /// Each shard's share of the memory budget.
    shard_budget: usize,
    /// Live keys evicted to stay within it, ever.
    evictions: AtomicU64,
    /// The most the store held since the allocator was last trimmed.
    high_water_bytes: AtomicUsize,
}

impl<S: HeapSize + Send + 'static> MemoryStore<S> {
    /// A store on `clock` with the default budget; call
    /// [`MemoryStore::spawn_sweeper`] to evict expired keys in the
    /// background.
    pub fn new(clock: Arc<dyn Clock>) -> Arc<Self> {
        Self::with_max_bytes(clock, DEFAULT_MAX_BYTES)
    }

    /// A store that keeps its estimated memory within `max_bytes`.
    pub fn with_max_bytes(clock: Arc<dyn Clock>, max_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
            shard_hasher: foldhash::fast::RandomState::default(),
            clock,
            shard_budget: max_bytes / SHARDS,
            evictions: AtomicU64::new(0),
            high_water_bytes: AtomicUsize::new(0),
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

    /// Drops every key whose state has expired, one shard at a time, and
    /// gives the memory back: a map mostly empty is shrunk, and once the
    /// store holds at most half of what it held at its highest since the
    /// last time (and at least `TRIM_AFTER_FREEING` less), the allocator
    /// returns its free pages to the system. Not at every sweep: trimming
    /// walks the allocator's arenas under their locks, and keys expiring
    /// while others arrive leave nothing to give back. Reports keys and
    /// bytes to the metrics.
    pub fn evict_expired(&self) {
        let now = self.clock.now();
        let (mut keys, mut bytes) = (0, 0);
        for shard in &self.shards {
            let mut shard = lock(shard);
            shard.evict_expired(now);
            if shard.map.capacity() > 4 * shard.map.len() {
                shard.map.shrink_to(0);
            }
            keys += shard.map.len();
            bytes += shard.bytes();
        }
        let high_water = self
            .high_water_bytes
            .fetch_max(bytes, Ordering::Relaxed)
            .max(bytes);
        if bytes <= high_water / 2 && high_water - bytes >= TRIM_AFTER_FREEING {
            trim_allocator();
            self.high_water_bytes.store(bytes, Ordering::Relaxed);
        }
        metrics::memory_store(keys, bytes);
    }

    /// Keys held, live or not yet evicted.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).map.len()).sum()
    }

    /// Live keys evicted to stay within the budget, since the store began.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    /// The store's estimated memory, in bytes.
    pub fn bytes(&self) -> usize {
        self.shards.iter().map(|shard| lock(shard).bytes()).sum()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of `key`'s live state and when it expires, without changing
    /// anything: for inspection and tests.
    pub fn peek(&self, key: &str) -> Option<(S, Micros)>
    where
        S: Clone,
    {
        let now = self.clock.now();
        let shard = lock(&self.shards[self.shard_of(key)]);
        let slot = shard.map.get(key).filter(|slot| slot.expires_at > now)?;
        Some((slot.state.clone()?, slot.expires_at))
    }

    /// Removes `key`, live or expired: whether it held live state.
    pub fn remove(&self, key: &str) -> bool {
        let now = self.clock.now();
        let mut shard = lock(&self.shards[self.shard_of(key)]);
        let Some((held, slot)) = shard.map.remove_entry(key) else {
            return false;
        };
        shard.entry_bytes -= Shard::entry_bytes(&held, &slot);
        slot.expires_at > now && slot.state.is_some()
    }

    /// Locks the shards of all `keys` (in ascending order) and runs `work`,
    /// which may decide on any of them through [`LockedKeys::decide`]; no
    /// other call sees any of these keys until `work` returns.
    pub fn with_keys<R>(
        &self,
        keys: &[&str],
        work: impl FnOnce(&mut LockedKeys<'_, S>, Micros) -> R,
    ) -> R {
        let locked = if let [key] = keys {
            // Most calls name one key: lock its shard with nothing to
            // allocate or sort.
            Locked::One(lock(&self.shards[self.shard_of(key)]))
        } else {
            let shard_of: Vec<usize> = keys.iter().map(|key| self.shard_of(key)).collect();
            let mut order = shard_of.clone();
            order.sort_unstable();
            order.dedup();
            let guards = order
                .into_iter()
                .map(|index| (index, lock(&self.shards[index])))
                .collect();
            Locked::Many { shard_of, guards }
        };
        // Read the clock with the locks held, so decisions on a key see time
        // in the order they run.
        let now = self.clock.now();
        let mut locked = LockedKeys {
            keys,
            locked,
            now,
            shard_budget: self.shard_budget,
            evictions: &self.evictions,
        };
        work(&mut locked, now)
    }

    /// foldhash rather than the maps' SipHash, which as well made hashing a
    /// fifth of a decision: a shard only spreads lock traffic, so keys
    /// crafted to share one would only share its lock, while the map inside
    /// still resists crafted collisions.
    fn shard_of(&self, key: &str) -> usize {
        let hash = self.shard_hasher.hash_one(key);
        // The top bits, scaled to the shard count.
        ((u128::from(hash) * SHARDS as u128) >> 64) as usize
    }
}

/// The keys of one [`MemoryStore::with_keys`] call, with their shards locked.
pub struct LockedKeys<'a, S> {
    keys: &'a [&'a str],
    locked: Locked<'a, S>,
    now: Micros,
    shard_budget: usize,
    evictions: &'a AtomicU64,
}

/// The shards locked for a call's keys.
enum Locked<'a, S> {
    /// The shard of the call's only key.
    One(MutexGuard<'a, Shard<S>>),
    Many {
        /// For each key, its shard's index.
        shard_of: Vec<usize>,
        /// Each shard of the keys, once, by index.
        guards: Vec<(usize, MutexGuard<'a, Shard<S>>)>,
    },
}

impl<S: HeapSize> LockedKeys<'_, S> {
    /// Runs `decide` on the live state of key number `index` (`None` if
    /// absent or expired) and keeps what it leaves: a state left `None`
    /// removes the key.
    pub fn decide<T>(
        &mut self,
        index: usize,
        decide: impl FnOnce(&mut Option<S>) -> (T, MemoryChange),
    ) -> T {
        let key = self.keys[index];
        let now = self.now;
        let shard = match &mut self.locked {
            Locked::One(guard) => &mut **guard,
            Locked::Many { shard_of, guards } => {
                let shard = shard_of[index];
                guards
                    .iter_mut()
                    .find(|(locked, _)| *locked == shard)
                    .map(|(_, guard)| &mut **guard)
                    .expect("with_keys locked the shard of every key")
            }
        };
        let run = |slot: &mut Slot<S>| {
            if slot.expires_at <= now {
                slot.state = None;
            }
            let (result, change) = decide(&mut slot.state);
            if let MemoryChange::Written { expires_at } = change {
                slot.expires_at = expires_at;
            }
            result
        };
        let result = match shard.map.get_mut(key) {
            Some(slot) => {
                let before = Shard::entry_bytes(key, slot);
                let result = run(slot);
                let after = Shard::entry_bytes(key, slot);
                shard.entry_bytes = shard.entry_bytes - before + after;
                if slot.state.is_none() {
                    shard.map.remove(key);
                    shard.entry_bytes -= after;
                }
                result
            }
            None => {
                let mut slot = Slot {
                    state: None,
                    expires_at: now,
                };
                let result = run(&mut slot);
                if slot.state.is_some() {
                    shard.entry_bytes += Shard::entry_bytes(key, &slot);
                    shard.map.insert(key.into(), slot);
                }
                result
            }
        };
        let evicted = shard.make_room(self.shard_budget, now, key);
        if evicted > 0 {
            self.evictions.fetch_add(evicted as u64, Ordering::Relaxed);
            metrics::memory_evictions(evicted);
        }
        result
    }
}

/// Hands the allocator's free memory back to the system. glibc keeps freed
/// small blocks in its arenas for reuse, so after a wave of keys expired the
/// process would otherwise stay at its peak size.
fn trim_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and may be called at any time;
    // it only releases memory the allocator holds free.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// A shard's lock. A panic while holding it cannot leave a half-written
/// state (decisions only write whole values), so a poisoned lock is used
/// as it is rather than failing every later request.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;

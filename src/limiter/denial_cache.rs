//! The local over-limit cache: a bounded, per-instance memory of keys Redis
//! denied and until when, so that a flood on a key already over its limit
//! is answered without a Redis call.
//!
//! Why a cached denial is safe: when Redis denies cost `d` and says "retry
//! after `r`", no cost of `d` or more can pass on that key before `r` has
//! passed, because what frees capacity before then is only time, and other
//! requests only use more. So a denial of cost `d` until `T` may answer a
//! later request of cost `c >= d` before `T`, under the same limit, and
//! nothing else: a smaller cost may still fit, and a request under other
//! parameters (another window, a reloaded rule) is another question. `T` is
//! counted from when the request was sent, which is before Redis decided,
//! so the cache lets go no later than Redis would.
//!
//! What can free capacity early, and so make a cached denial stale for up
//! to `r`: an operator deleting the key, a Redis failover to a replica that
//! had not seen the spending, and the refunds of a request spanning Redis
//! Cluster nodes (it holds units only between its spend and its refund).
//!
//! The cache counts what it does (lookups answered and not, evictions,
//! expired and replaced entries) in atomics, and sets upstream's
//! `ratelimit.localcache` gauges as the counts change.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, Weighter};

use crate::algorithm::Algorithm;
use crate::limit::{Decision, Micros, RetryAfter};
use crate::stats::{self, Gauge, LocalCacheStats};

/// Denials by storage key.
pub struct DenialCache {
    denials: Cache<String, Denial, DenialWeight, DefaultHashBuilder, Evictions>,
    counts: Counts,
}

/// What the cache has done so far (upstream's freecache counts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheCounts {
    /// Lookups a cached denial answered.
    pub hits: u64,
    /// Lookups it did not (no entry, a stale one, or one for another cost
    /// or limit).
    pub misses: u64,
    /// Entries held now.
    pub entries: u64,
    /// Entries evicted for room before their denial lifted.
    pub evictions: u64,
    /// Entries found, or evicted, after their denial lifted.
    pub expired: u64,
    /// Entries a newer denial on the same key replaced.
    pub overwrites: u64,
}

/// The counts, and the gauges they are shown in.
#[derive(Default)]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    expired: AtomicU64,
    overwrites: AtomicU64,
    stats: LocalCacheStats,
}

impl Counts {
    fn count(count: &AtomicU64, gauge: &Gauge) {
        count.fetch_add(1, Ordering::Relaxed);
        gauge.add(1);
    }

    fn hit(&self) {
        Self::count(&self.hits, &self.stats.hit_count);
        self.looked_up();
    }

    fn miss(&self) {
        Self::count(&self.misses, &self.stats.miss_count);
        self.looked_up();
    }

    fn looked_up(&self) {
        self.stats.lookup_count.add(1);
    }

    fn expired(&self) {
        Self::count(&self.expired, &self.stats.expired_count);
    }
}

/// Collects the entries an insert pushes out (quick_cache reports both
/// the entries evicted for room and the one a new value replaces), for
/// [`DenialCache::remember`] to count.
#[derive(Clone)]
struct Evictions;

impl Lifecycle<String, Denial> for Evictions {
    type RequestState = Vec<(String, Instant)>;

    fn begin_request(&self) -> Self::RequestState {
        Vec::new()
    }

    fn on_evict(&self, state: &mut Self::RequestState, key: String, denial: Denial) {
        state.push((key, denial.until));
    }
}

/// What one cached denial costs besides its key's bytes: the key's `String`,
/// the denial, and the cache's own bookkeeping per entry (an estimate).
const ENTRY_OVERHEAD: usize = std::mem::size_of::<String>() + std::mem::size_of::<Denial>() + 32;

/// Weighs a denial by its bytes, and at least `floor`, the byte budget's
/// share of one key under the key cap: the total weight within the byte
/// budget then keeps both the bytes and the keys within their caps.
#[derive(Debug, Clone, Copy)]
struct DenialWeight {
    floor: u64,
}

impl Weighter<String, Denial> for DenialWeight {
    fn weight(&self, key: &String, _denial: &Denial) -> u64 {
        ((key.len() + ENTRY_OVERHEAD) as u64).max(self.floor)
    }
}

#[derive(Debug, Clone, Copy)]
struct Denial {
    /// The limit the denial was made under.
    algorithm: Algorithm,
    /// The cost denied: this or more is denied until `until`.
    cost: u64,
    until: Instant,
    /// When the key is back to its whole quota.
    reset_at: Instant,
    /// What Redis said was left; less may be left now, never more.
    remaining: u64,
}

impl DenialCache {
    /// A cache of at most `max_keys` keys taking at most `max_bytes` (least
    /// useful evicted first), or none when either is 0.
    pub fn new(max_keys: usize, max_bytes: usize) -> Option<Self> {
        if max_keys == 0 || max_bytes == 0 {
            return None;
        }
        let floor = (max_bytes / max_keys).max(1) as u64;
        let counts = Counts {
            stats: stats::local_cache(),
            ..Counts::default()
        };
        Some(Self {
            denials: Cache::with(
                max_keys.min(max_bytes / ENTRY_OVERHEAD).max(1),
                max_bytes as u64,
                DenialWeight { floor },
                DefaultHashBuilder::default(),
                Evictions,
            ),
            counts,
        })
    }

    /// What the cache has done so far.
    pub fn counts(&self) -> CacheCounts {
        let load = |count: &AtomicU64| count.load(Ordering::Relaxed);
        let counts = &self.counts;
        CacheCounts {
            hits: load(&counts.hits),
            misses: load(&counts.misses),
            entries: self.denials.len() as u64,
            evictions: load(&counts.evictions),
            expired: load(&counts.expired),
            overwrites: load(&counts.overwrites),
        }
    }

    /// Shows the entries held now.
    fn show_entries(&self) {
        let entries = &self.counts.stats.entry_count;
        if entries.is_on() {
            entries.set(self.denials.len() as u64);
        }
    }

    /// The weight of what the cache holds: at least its bytes.
    pub fn weight(&self) -> u64 {
        self.denials.weight()
    }

    /// The denial of `cost` on `key` under `algorithm` at `now`, if one is
    /// known.
    pub fn denial(
        &self,
        key: &str,
        algorithm: &Algorithm,
        cost: u64,
        now: Instant,
    ) -> Option<Decision> {
        let found = self.lookup(key, algorithm, cost, now);
        match found {
            Some(_) => self.counts.hit(),
            None => self.counts.miss(),
        }
        found
    }

    fn lookup(
        &self,
        key: &str,
        algorithm: &Algorithm,
        cost: u64,
        now: Instant,
    ) -> Option<Decision> {
        let denial = self.denials.get(key)?;
        if now >= denial.until {
            // Stale: taken out (unless a newer denial took its place).
            if self
                .denials
                .remove_if(key, |held| now >= held.until)
                .is_some()
            {
                self.counts.expired();
                self.show_entries();
            }
            return None;
        }
        // A cost above the limit gets its own answer (never, not "later"),
        // which Redis gives.
        if cost < denial.cost || cost > algorithm.limit() || denial.algorithm != *algorithm {
            return None;
        }
        // The denial's own time is exact for its cost only. A larger cost
        // may need more to leave or refill, by an amount only the store
        // knows; once the key is back to its whole quota every cost within
        // the limit fits, so that time is never too early.
        let retry_at = if cost == denial.cost {
            denial.until
        } else {
            denial.until.max(denial.reset_at)
        };
        Some(Decision::denied(
            algorithm.limit(),
            denial.remaining,
            Micros::from_duration(denial.reset_at.saturating_duration_since(now)),
            // At least 1 µs: a denial always says to wait.
            RetryAfter::After(Micros::from_duration(retry_at - now).max(Micros::from_micros(1))),
        ))
    }

    /// Remembers Redis's `decision` on `key` for `cost` under `algorithm`,
    /// asked at `sent`, if it is a denial that time will lift.
    pub fn remember(
        &self,
        key: &str,
        algorithm: &Algorithm,
        cost: u64,
        decision: &Decision,
        sent: Instant,
    ) {
        let RetryAfter::After(retry_after) = decision.retry_after() else {
            // A cost above the limit is denied whatever the state: nothing
            // about the key to remember.
            return;
        };
        if decision.is_allowed() || decision.is_degraded() || retry_after == Micros::ZERO {
            return;
        }
        let denial = Denial {
            algorithm: *algorithm,
            cost,
            until: sent + retry_after.as_duration(),
            reset_at: sent + decision.reset_after().as_duration(),
            remaining: decision.remaining(),
        };
        // The newest denial replaces an older one: each is true on its own.
        let pushed_out = self.denials.insert_with_lifecycle(key.to_owned(), denial);
        if pushed_out.is_empty() {
            return self.show_entries();
        }
        let counts = &self.counts;
        let now = Instant::now();
        for (evicted, until) in pushed_out {
            if evicted == key {
                Counts::count(&counts.overwrites, &counts.stats.overwrite_count);
            } else if now >= until {
                counts.expired();
            } else {
                Counts::count(&counts.evictions, &counts.stats.evacuate_count);
            }
        }
        self.show_entries();
    }

    /// Forgets the denial held for `key`, if any (an operator reset the
    /// key): whether one was held.
    pub fn forget(&self, key: &str) -> bool {
        let held = self.denials.remove(key).is_some();
        if held {
            self.show_entries();
        }
        held
    }

    /// Keys held now (stale ones included until evicted or replaced).
    pub fn len(&self) -> usize {
        self.denials.len()
    }

    /// Whether no denial is cached.
    pub fn is_empty(&self) -> bool {
        self.denials.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::algorithm::{FixedWindow, TokenBucket};

    fn fixed(limit: u64) -> Algorithm {
        Algorithm::FixedWindow(FixedWindow::new(limit, Duration::from_secs(10)).unwrap())
    }

    fn denied(remaining: u64, retry_after_ms: u64) -> Decision {
        let wait = Micros::from_millis(retry_after_ms);
        Decision::denied(10, remaining, wait, RetryAfter::After(wait))
    }

    #[test]
    fn a_larger_cost_is_told_to_wait_until_the_key_resets() {
        let cache = DenialCache::new(10, 1 << 20).unwrap();
        let sent = Instant::now();
        // Cost 2 fits in 200 ms; the key is whole again in 900 ms.
        let decision = Decision::denied(
            10,
            1,
            Micros::from_millis(900),
            RetryAfter::After(Micros::from_millis(200)),
        );
        cache.remember("k", &fixed(10), 2, &decision, sent);
        let later = sent + Duration::from_millis(100);
        let same = cache.denial("k", &fixed(10), 2, later).unwrap();
        assert_eq!(
            same.retry_after(),
            RetryAfter::After(Micros::from_millis(100))
        );
        let larger = cache.denial("k", &fixed(10), 5, later).unwrap();
        assert_eq!(
            larger.retry_after(),
            RetryAfter::After(Micros::from_millis(800))
        );
    }

    #[test]
    fn a_denial_answers_the_same_or_larger_cost_until_it_lifts() {
        let cache = DenialCache::new(10, 1 << 20).unwrap();
        let sent = Instant::now();
        cache.remember("k", &fixed(10), 5, &denied(3, 1000), sent);
        let soon = sent + Duration::from_millis(400);
        let decision = cache.denial("k", &fixed(10), 5, soon).unwrap();
        assert!(!decision.is_allowed());
        assert_eq!(decision.remaining(), 3);
        assert_eq!(
            decision.retry_after(),
            RetryAfter::After(Micros::from_millis(600))
        );
        assert!(cache.denial("k", &fixed(10), 7, soon).is_some());
        // Above the limit the answer is "never", not "later": Redis's.
        assert!(cache.denial("k", &fixed(10), 11, soon).is_none());
        // Cost 4 might fit in what is left: only Redis can say.
        assert!(cache.denial("k", &fixed(10), 4, soon).is_none());
        assert!(
            cache
                .denial("k", &fixed(10), 5, sent + Duration::from_secs(1))
                .is_none()
        );
    }

    #[test]
    fn a_denial_answers_only_the_limit_it_was_made_under_and_only_its_key() {
        let cache = DenialCache::new(10, 1 << 20).unwrap();
        let now = Instant::now();
        cache.remember("k", &fixed(10), 1, &denied(0, 1000), now);
        assert!(cache.denial("k", &fixed(20), 1, now).is_none());
        let bucket = Algorithm::TokenBucket(TokenBucket::new(10, 1.0).unwrap());
        assert!(cache.denial("k", &bucket, 1, now).is_none());
        assert!(cache.denial("other", &fixed(10), 1, now).is_none());
    }

    #[test]
    fn only_denials_that_time_lifts_are_remembered() {
        let cache = DenialCache::new(10, 1 << 20).unwrap();
        let now = Instant::now();
        let allowed = Decision::allowed(10, 5, Micros::ZERO);
        let never = Decision::denied(10, 10, Micros::ZERO, RetryAfter::Never);
        let degraded = denied(0, 1000).marked_degraded();
        for decision in [allowed, never, degraded] {
            cache.remember("k", &fixed(10), 1, &decision, now);
        }
        assert!(cache.is_empty());
        assert!(
            DenialCache::new(0, 1 << 20).is_none(),
            "size 0 turns it off"
        );
        assert!(DenialCache::new(10, 0).is_none(), "0 bytes turns it off");
    }

    #[test]
    fn the_cache_stays_within_its_size() {
        let cache = DenialCache::new(100, 1 << 20).unwrap();
        let now = Instant::now();
        for i in 0..1000 {
            cache.remember(&format!("k{i}"), &fixed(10), 1, &denied(0, 1000), now);
        }
        assert!(cache.len() <= 100, "{} keys held", cache.len());
    }

    #[test]
    fn long_keys_are_held_within_the_byte_budget() {
        let budget = 64 << 10;
        let cache = DenialCache::new(100_000, budget).unwrap();
        let now = Instant::now();
        let long = "x".repeat(1024);
        for i in 0..1000 {
            cache.remember(&format!("{long}{i}"), &fixed(10), 1, &denied(0, 1000), now);
        }
        assert!(cache.weight() <= budget as u64, "weight {}", cache.weight());
        assert!(
            cache.len() * 1024 <= budget,
            "{} keys of 1 KiB in {budget} bytes",
            cache.len()
        );
        assert!(cache.len() > 10, "the budget holds some: {}", cache.len());
    }

    #[test]
    fn lookups_evictions_expiries_and_overwrites_are_counted() {
        let cache = DenialCache::new(1000, 1 << 20).unwrap();
        let now = Instant::now();
        assert!(cache.denial("k", &fixed(10), 1, now).is_none());
        cache.remember("k", &fixed(10), 1, &denied(0, 1000), now);
        cache.remember("k", &fixed(10), 1, &denied(0, 500), now);
        assert!(cache.denial("k", &fixed(10), 1, now).is_some());
        // Found, but for a smaller cost than it denied: a miss.
        cache.remember("j", &fixed(10), 5, &denied(0, 1000), now);
        assert!(cache.denial("j", &fixed(10), 2, now).is_none());
        let later = now + Duration::from_millis(600);
        assert!(cache.denial("k", &fixed(10), 1, later).is_none());
        assert_eq!(
            cache.counts(),
            CacheCounts {
                hits: 1,
                misses: 3,
                entries: 1,
                evictions: 0,
                expired: 1,
                overwrites: 1,
            }
        );
        // Past the cap, entries whose denial still holds are evicted.
        let full = DenialCache::new(10, 1 << 20).unwrap();
        for i in 0..100 {
            full.remember(&format!("k{i}"), &fixed(10), 1, &denied(0, 60_000), now);
        }
        let counts = full.counts();
        assert_eq!(counts.entries, full.len() as u64);
        assert!(counts.entries <= 10, "{counts:?}");
        assert_eq!(counts.evictions, 100 - counts.entries, "{counts:?}");
        assert_eq!((counts.expired, counts.overwrites), (0, 0));
    }
}

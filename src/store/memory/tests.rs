//! The embedded store's unit tests: expiry, one lock over several keys,
//! the spread over shards, and the memory budget.

use super::*;
use crate::store::ManualClock;

/// One decision on one key.
fn update<R>(
    store: &MemoryStore<u64>,
    key: &str,
    decide: impl FnOnce(&mut Option<u64>, Micros) -> (R, MemoryChange),
) -> R {
    store.with_keys(&[key], |keys, now| {
        keys.decide(0, |state| decide(state, now))
    })
}

/// A counter that expires 10 µs after its last write.
fn count(state: &mut Option<u64>, now: Micros) -> (u64, MemoryChange) {
    let n = state.get_or_insert(0);
    *n += 1;
    (
        *n,
        MemoryChange::Written {
            expires_at: now + Micros::from_micros(10),
        },
    )
}

#[test]
fn state_counts_until_it_expires_then_is_evicted() {
    let clock = Arc::new(ManualClock::default());
    let store = MemoryStore::new(clock.clone());
    assert_eq!(update(&store, "k", count), 1);
    clock.advance(Duration::from_micros(9));
    assert_eq!(update(&store, "k", count), 2);
    clock.advance(Duration::from_micros(10));
    assert_eq!(
        update(&store, "k", count),
        1,
        "expired state reads as absent"
    );
    clock.advance(Duration::from_micros(10));
    store.evict_expired();
    assert!(store.is_empty());
}

#[test]
fn a_decision_that_writes_nothing_stores_nothing() {
    let store: Arc<MemoryStore<u64>> = MemoryStore::new(Arc::new(ManualClock::default()));
    update(&store, "k", |_, _| ((), MemoryChange::None));
    assert!(store.is_empty());
    update(&store, "k", count);
    update(&store, "k", |state, _| {
        *state = None;
        ((), MemoryChange::Updated)
    });
    assert!(store.is_empty(), "an emptied key is removed");
}

#[test]
fn keys_spread_evenly_over_the_shards() {
    let store: Arc<MemoryStore<u64>> = MemoryStore::new(Arc::new(ManualClock::default()));
    let mut per_shard = [0; SHARDS];
    let keys = 64_000;
    for i in 0..keys {
        per_shard[store.shard_of(&format!("ratelimitd:{{fw:user-{i}}}"))] += 1;
    }
    // 1000 a shard on average, give or take some 30: far within these.
    let fair = keys / SHARDS;
    assert!(
        per_shard
            .iter()
            .all(|&n| n > fair * 4 / 5 && n < fair * 6 / 5),
        "{per_shard:?}"
    );
}

#[test]
fn several_keys_are_decided_under_one_lock() {
    let store: Arc<MemoryStore<u64>> = MemoryStore::new(Arc::new(ManualClock::default()));
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    // 200 keys land on shards in every order; a key twice is fine too.
    let mut with_repeat = keys.clone();
    with_repeat.push(keys[0]);
    let counts = store.with_keys(&with_repeat, |locked, now| {
        (0..with_repeat.len())
            .map(|i| locked.decide(i, |state| count(state, now)))
            .collect::<Vec<_>>()
    });
    assert_eq!(counts[0], 1);
    assert_eq!(counts[200], 2, "the repeated key saw the first write");
    assert_eq!(store.len(), 200);
}

/// A counter on `key` that expires at `expires_at`.
fn write_until(store: &MemoryStore<u64>, key: &str, expires_at: Micros) {
    update(store, key, |state, _| {
        *state = Some(1);
        ((), MemoryChange::Written { expires_at })
    });
}

#[test]
fn past_its_budget_the_store_evicts_the_keys_closest_to_expiry() {
    let budget = 1 << 20;
    let store: Arc<MemoryStore<u64>> =
        MemoryStore::with_max_bytes(Arc::new(ManualClock::default()), budget);
    for i in 0..100 {
        write_until(&store, &format!("long-{i}"), Micros::from_secs(1000));
    }
    let padding = "p".repeat(200);
    let written = 20_000;
    for i in 0..written {
        write_until(
            &store,
            &format!("{padding}-{i}"),
            Micros::from_micros(1_000 + i),
        );
        assert!(store.bytes() <= budget, "{} bytes held", store.bytes());
    }
    let held = store.len();
    assert!(held < written as usize, "nothing was evicted: {held} keys");
    assert_eq!(held as u64 + store.evictions(), written + 100);
    // The long-lived keys outlive every short one, so none was evicted;
    // of the short ones, the latest to expire are the ones held.
    for i in 0..100 {
        let long = format!("long-{i}");
        assert_eq!(
            update(&store, &long, |state, _| (*state, MemoryChange::None)),
            Some(1)
        );
    }
    let newest = format!("{padding}-{}", written - 1);
    assert_eq!(
        update(&store, &newest, |state, _| (*state, MemoryChange::None)),
        Some(1)
    );
    let oldest = format!("{padding}-0");
    assert_eq!(
        update(&store, &oldest, |state, _| (*state, MemoryChange::None)),
        None
    );
}

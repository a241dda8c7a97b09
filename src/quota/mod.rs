//! Shared quota: each quota bucket's rate split among the Envoys that
//! report it, across every ratelimitd instance, through the configured
//! store (Redis, one hash per bucket, or this process's own ledger). The
//! Envoy quota service (`api::rlqs`) asks it for each subscriber's share.
//!
//! On Redis every settlement is one atomic script (`share.lua`) on the
//! bucket's hash, on Redis's clock; the embedded ledger runs its Rust twin
//! (`share`) under a lock, on the process's clock.

pub(crate) mod presence;
pub mod share;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use redis::Script;

use crate::error::StoreError;
use crate::limit::{CallerKey, KeyOrigin};
use crate::store::{Backend, CLOCK_LUA, Clock, RedisStore, SystemClock};
pub use share::{Entry, MicroRps, Millis, Share, ShareOp, ShareParams};

/// The share script's own part; a clock must be defined above it.
pub const SHARE_LUA: &str = include_str!("share.lua");

/// The script that settles shares on Redis: the clock, then `share.lua`.
pub(crate) static SHARE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[CLOCK_LUA, SHARE_LUA].concat()));

/// Where the ledgers of quota buckets live: on Redis, shared by every
/// instance, or in this process (one instance's subscribers only).
pub(crate) type QuotaLedger = Backend<MemoryLedger>;

impl QuotaLedger {
    /// A new ledger of this process's own, on the system's clock.
    fn own() -> Self {
        Self::Memory(MemoryLedger::new(Arc::new(SystemClock::default())))
    }

    /// Settles `op` for `subscriber` on the bucket stored at `key`, with
    /// the instances found `dead` (whose subscribers' grants are held or
    /// released: see [`share::settle`]).
    pub async fn settle(
        &self,
        key: &str,
        subscriber: &str,
        op: ShareOp,
        params: &ShareParams,
        dead: &[String],
    ) -> Result<Share, StoreError> {
        match self {
            Self::Redis(store) => {
                let mut invocation = SHARE.key(key);
                share_args(&mut invocation, subscriber, op, params, dead);
                let reply: Vec<i64> = store.run_script(key, &invocation).await?;
                decode_share(&reply)
            }
            Self::Memory(ledger) => Ok(ledger.settle(key, subscriber, op, params, dead)),
        }
    }

    /// The Redis store the ledger is on, if it is.
    pub fn redis(&self) -> Option<&RedisStore> {
        match self {
            Self::Redis(store) => Some(store),
            Self::Memory(_) => None,
        }
    }
}

/// The quota ledgers on the configured store (see `limiter::Store`).
pub(crate) struct QuotaLedgers {
    /// Where shares are settled.
    pub shared: QuotaLedger,
    /// This instance's own ledger, which settles for the `local` failure
    /// policy while `shared` cannot (on Redis only).
    pub own: Option<QuotaLedger>,
}

impl QuotaLedgers {
    /// On Redis, shared by every instance, with this instance's own ledger
    /// beside it.
    pub(crate) fn on_redis(redis: RedisStore) -> Self {
        Self {
            shared: QuotaLedger::Redis(redis),
            own: Some(QuotaLedger::own()),
        }
    }

    /// This instance's own ledger alone (on the embedded store).
    pub(crate) fn in_process() -> Self {
        Self {
            shared: QuotaLedger::own(),
            own: None,
        }
    }
}

/// Adds `share.lua`'s `ARGV` for `op` to a script call.
pub fn share_args(
    invocation: &mut redis::ScriptInvocation<'_>,
    subscriber: &str,
    op: ShareOp,
    params: &ShareParams,
    dead: &[String],
) {
    let (name, demand) = match op {
        ShareOp::Report(demand) => (
            "report",
            demand.map_or(-1, |d| i64::try_from(d).unwrap_or(i64::MAX)),
        ),
        ShareOp::Leave => ("leave", -1),
    };
    invocation
        .arg(subscriber)
        .arg(name)
        .arg(demand)
        .arg(params.capacity)
        .arg(params.headroom_permille)
        .arg(params.min_want)
        .arg(params.lease_ms)
        .arg(params.stale_ms)
        .arg(params.hysteresis_permille)
        .arg(dead.len());
    for instance in dead {
        invocation.arg(instance);
    }
}

/// Reads `share.lua`'s reply: grant, target, subscribers, granted.
pub fn decode_share(reply: &[i64]) -> Result<Share, StoreError> {
    let number = |i: usize| {
        reply
            .get(i)
            .and_then(|&n| u64::try_from(n).ok())
            .ok_or_else(|| StoreError::Reply(format!("share script replied {reply:?}")))
    };
    if reply.len() != 4 {
        return Err(StoreError::Reply(format!("share script replied {reply:?}")));
    }
    Ok(Share {
        grant: number(0)?,
        target: number(1)?,
        subscribers: number(2)?,
        granted: number(3)?,
    })
}

/// The bytes escaped in a bucket's stored name, so that its parts cannot
/// run into one another.
const NAME_ESCAPES: &AsciiSet = &CONTROLS.add(b'%').add(b'|').add(b',').add(b'=');

/// `<prefix>{rlq:<domain>|<key>=<value>,...}`, the pairs sorted by key and
/// each part percent-escaped; a name over 1 KiB is kept as its prefix and
/// SHA-256 (tag `rlqh:`), as Envoy descriptor keys are. The braces make the
/// whole name one Redis Cluster hash tag: one bucket, one slot.
pub(crate) fn bucket_key(prefix: &str, domain: &str, bucket: &HashMap<String, String>) -> String {
    let mut pairs: Vec<(&String, &String)> = bucket.iter().collect();
    pairs.sort();
    let mut name = utf8_percent_encode(domain, NAME_ESCAPES).to_string();
    name.push('|');
    for (i, (key, value)) in pairs.into_iter().enumerate() {
        if i > 0 {
            name.push(',');
        }
        name.extend(utf8_percent_encode(key, NAME_ESCAPES));
        name.push('=');
        name.extend(utf8_percent_encode(value, NAME_ESCAPES));
    }
    let key = CallerKey::envoy(name);
    let tag = match key.origin() {
        KeyOrigin::EnvoyDigest => "rlqh:",
        _ => "rlq:",
    };
    format!("{prefix}{{{tag}{}}}", key.as_str())
}

/// The embedded store's ledgers: every bucket's entries in this process.
pub struct MemoryLedger {
    clock: Arc<dyn Clock>,
    state: Mutex<MemoryState>,
}

#[derive(Default)]
struct MemoryState {
    buckets: HashMap<String, HashMap<String, Entry>>,
    /// When run-out entries and emptied buckets are next swept away.
    next_sweep: Millis,
}

/// How often the embedded ledgers drop what has run out.
const SWEEP_EVERY_MS: Millis = 10_000;

impl MemoryLedger {
    /// Empty ledgers on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Self {
            clock,
            state: Mutex::new(MemoryState::default()),
        })
    }

    /// [`share::settle`] on the bucket at `key`, now. (One process has no
    /// other instances: `dead` is for the twin tests.)
    pub fn settle(
        &self,
        key: &str,
        subscriber: &str,
        op: ShareOp,
        params: &ShareParams,
        dead: &[String],
    ) -> Share {
        let now = self.clock.now().as_millis();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if now >= state.next_sweep {
            state.buckets.retain(|_, entries| {
                entries.retain(|_, entry| entry.stale_at > now || entry.expires_at > now);
                !entries.is_empty()
            });
            state.next_sweep = now + SWEEP_EVERY_MS;
        }
        let entries = state.buckets.entry(key.to_owned()).or_default();
        let share = share::settle(entries, subscriber, op, params, now, dead);
        if entries.is_empty() {
            state.buckets.remove(key);
        }
        share
    }

    /// A bucket's entries, for tests.
    pub fn entries(&self, key: &str) -> HashMap<String, Entry> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.buckets.get(key).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key of the bucket `pairs` names in domain `edge`.
    fn key_of<const N: usize>(pairs: [(&str, &str); N]) -> String {
        let bucket = pairs.map(|(k, v)| (k.to_owned(), v.to_owned())).into();
        bucket_key("p:", "edge", &bucket)
    }

    #[test]
    fn bucket_keys_are_one_hash_tag_and_never_run_together() {
        let key = key_of([("tenant", "a"), ("name", "api")]);
        assert_eq!(key, "p:{rlq:edge|name=api,tenant=a}");
        let tricky = key_of([("name", "api,tenant=a")]);
        assert_ne!(tricky, key);
        assert_eq!(tricky, "p:{rlq:edge|name=api%2Ctenant%3Da}");
        let long = key_of([("name", &"x".repeat(2000))]);
        assert!(long.starts_with("p:{rlqh:edge|name=xxx"), "{long}");
        assert!(long.len() < 1200, "{}", long.len());
    }
}

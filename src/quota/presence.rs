//! Which ratelimitd instances on one Redis are alive, and nudges between
//! them: each instance beats (`beat.lua`) every fraction of a second; one
//! whose beat ran out is dead, and the ledgers stop counting its
//! subscribers' demand at once, and their grants once their Envoys have
//! subscribed again elsewhere or their leases run out (`share`). A stream
//! that wants a bucket settled again by every instance (a newcomer short of
//! its share, a share shrunk or freed) writes a nudge (`nudge.lua`), which
//! the others read at their next beat.
//!
//! Both keys carry one hash tag, so each call is one script on one node
//! (Redis Cluster included), on Redis's clock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, PoisonError, RwLock};
use std::time::Duration;

use redis::Script;

use crate::error::StoreError;
use crate::store::{CLOCK_LUA, RedisStore};

/// The heartbeat script: the clock, then `beat.lua`.
static BEAT: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[CLOCK_LUA, include_str!("beat.lua")].concat()));

/// The nudge script: the clock, then `nudge.lua`.
static NUDGE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&[CLOCK_LUA, include_str!("nudge.lua")].concat()));

/// How long a nudge is kept for the others to read, at least: many beats.
const KEEP_NUDGES: Duration = Duration::from_secs(10);

/// Who this instance is among those on one store, and which of the others
/// the last beat found dead: shared by everything that settles shares (the
/// quota service's streams and the lease streams), so that each names its
/// subscribers `<instance>:<stream>` and leaves the dead ones' demand out.
#[derive(Debug)]
pub(crate) struct Roster {
    instance: String,
    dead: RwLock<Arc<[String]>>,
    /// Something on this instance settles shares: it must beat, or the
    /// others would take its subscribers for a dead instance's.
    in_use: AtomicBool,
}

impl Roster {
    /// A new instance, with a random id, knowing of no dead ones.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            instance: format!("{:016x}", rand::random::<u64>()),
            dead: RwLock::new(Arc::from([])),
            in_use: AtomicBool::new(false),
        })
    }

    /// This instance's id.
    pub(crate) fn instance(&self) -> &str {
        &self.instance
    }

    /// The instances found dead at the last beat.
    pub(crate) fn dead(&self) -> Arc<[String]> {
        self.dead
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// What the last beat found.
    pub(crate) fn set_dead(&self, dead: Vec<String>) {
        *self.dead.write().unwrap_or_else(PoisonError::into_inner) = dead.into();
    }

    /// Marks this instance as settling shares from now on.
    pub(crate) fn use_it(&self) {
        self.in_use.store(true, Ordering::Relaxed);
    }

    /// Whether anything on this instance has settled shares.
    pub(crate) fn in_use(&self) -> bool {
        self.in_use.load(Ordering::Relaxed)
    }
}

/// This instance's presence on the shared store.
#[derive(Clone)]
pub(crate) struct Presence {
    store: RedisStore,
    instances_key: String,
    nudges_key: String,
    /// This instance's id, as its subscribers' ids begin.
    me: String,
    /// How long one beat holds.
    timeout: Duration,
    /// How long an instance is named dead after its beat ran out.
    forget_after: Duration,
    /// How long nudges are kept.
    keep_nudges: Duration,
}

/// What one beat learned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Beat {
    /// Redis's clock at the beat, ms: the next beat reads nudges from it.
    pub now_ms: i64,
    /// The instances whose beat ran out.
    pub dead: Vec<String>,
    /// The nudges since the last beat: (instance, bucket key).
    pub nudged: Vec<(String, String)>,
}

impl Presence {
    /// Instance `me`'s presence on `store`, under `prefix`: each beat holds
    /// for `timeout`, and polls every `every` (nudges are kept long enough
    /// for several polls). A dead instance is named for `forget_after`, by
    /// when its subscribers' entries have run out by themselves.
    pub(crate) fn new(
        store: RedisStore,
        prefix: &str,
        me: &str,
        timeout: Duration,
        every: Duration,
        forget_after: Duration,
    ) -> Self {
        Self {
            store,
            instances_key: format!("{prefix}{{rlq-presence}}:instances"),
            nudges_key: format!("{prefix}{{rlq-presence}}:nudges"),
            me: me.to_owned(),
            timeout,
            forget_after,
            keep_nudges: KEEP_NUDGES.max(every * 8),
        }
    }

    /// Beats, and reads the dead instances and the nudges written at or
    /// after `since_ms` (the last beat's `now_ms`; 0: all that are kept).
    pub(crate) async fn beat(&self, since_ms: i64) -> Result<Beat, StoreError> {
        let mut invocation = BEAT.key(&self.instances_key);
        invocation
            .key(&self.nudges_key)
            .arg(&self.me)
            .arg(millis(self.timeout))
            .arg(millis(self.forget_after))
            .arg(since_ms);
        let (now_ms, dead, nudges): (i64, Vec<String>, Vec<String>) = self
            .store
            .run_script(&self.instances_key, &invocation)
            .await?;
        let nudged = nudges
            .into_iter()
            .filter_map(|member| {
                let (instance, key) = member.split_once(' ')?;
                Some((instance.to_owned(), key.to_owned()))
            })
            .collect();
        Ok(Beat {
            now_ms,
            dead,
            nudged,
        })
    }

    /// Asks the other instances to settle the bucket at `key` again.
    pub(crate) async fn nudge(&self, key: &str) -> Result<(), StoreError> {
        let mut invocation = NUDGE.key(&self.nudges_key);
        invocation
            .arg(format!("{} {key}", self.me))
            .arg(millis(self.keep_nudges));
        let _: i64 = self.store.run_script(&self.nudges_key, &invocation).await?;
        Ok(())
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

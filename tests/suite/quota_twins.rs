//! The quota twins are equal: `share.lua` on a real Redis and its Rust twin
//! (`quota::share::settle`, and the embedded `MemoryLedger` around it) give
//! identical shares and keep identical entries (and the Lua hash the expiry
//! the entries imply) after every step of random sequences of
//! reports, unknown demands and leaves, over time that lets entries go
//! stale, expire and be dropped, over capacity reloads, and with instances
//! found dead (whose subscribers' grants still in force are orphans: held
//! until they run out, or released all at once by as many newcomers); and
//! on Redis the grants in force, orphans' included, never add up to more
//! than the capacity.
//!
//! The Lua side is the production script with its clock replaced
//! (tests/fixtures/twins/fake_clock.lua, as tests/twins.rs does): `now`
//! comes from the last argument and Redis's key expiry is emulated on that
//! clock, so time moves by any amount without waiting. Both sides get their
//! arguments from `quota::share_args`. Sequences are proptest's
//! (`common::draws`): seeded, so a run replays exactly, and a failure is
//! shrunk to a short sequence and names the steps that led to it. Another
//! seed: `PROPTEST_RNG_SEED=7 cargo test --all-features --test suite
//! quota_twins::`.

use crate::common;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use common::RedisServer;
use common::draws::{self, Draws, Tape, tapes};
use ratelimitd::quota::share::{self, Entry, MicroRps, Millis, Share, ShareOp, ShareParams};
use ratelimitd::quota::{MemoryLedger, SHARE_LUA, decode_share, share_args};
use ratelimitd::store::ManualClock;
use redis::Script;
use redis::aio::MultiplexedConnection;

/// The share script under the test's clock.
static SCRIPT_AT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&[include_str!("../fixtures/twins/fake_clock.lua"), SHARE_LUA].concat())
});

/// Where the fake clock keeps each key's expiry (ms).
const EXPIRY: &str = "twins:expiry";

/// Where every sequence starts: a real epoch in microseconds, so times are
/// as large as Redis `TIME` gives.
const START: u64 = 1_764_806_400_000_000;

/// The largest capacity a bucket has (µrps): a million requests a second.
const MAX_CAPACITY: MicroRps = 1_000_000_000_000;

/// The subscribers of every sequence: `<instance>:<stream>`, three
/// instances.
const SUBSCRIBERS: [&str; 6] = ["i1:1", "i1:2", "i2:1", "i2:2", "i3:1", "i3:2"];

/// Now and then, some instances found dead for a step; and `gone`, the
/// instances that died for good.
fn random_dead(random: &mut Draws<'_>, gone: &[&str]) -> Vec<String> {
    let dead: &[&str] = match random.upto(10) {
        0 => &["i2"],
        1 => &["i1", "i3"],
        _ => &[],
    };
    let mut dead: Vec<String> = dead.iter().map(|id| (*id).to_owned()).collect();
    dead.extend(gone.iter().map(|id| (*id).to_owned()));
    dead.sort();
    dead.dedup();
    dead
}

/// Who settles: mostly a subscriber of an instance still alive (one that
/// died settles nothing more, unless cut off from the beats alone).
fn random_subscriber(random: &mut Draws<'_>, gone: &[&str]) -> &'static str {
    let alive: Vec<&str> = SUBSCRIBERS
        .iter()
        .copied()
        .filter(|id| share::instance_of(id).is_some_and(|i| !gone.contains(&i)))
        .collect();
    if alive.is_empty() || random.chance(5) {
        random.pick(&SUBSCRIBERS)
    } else {
        random.pick(&alive)
    }
}

/// A bucket's rate: tiny ones (floors and remainders everywhere), ordinary
/// ones, and ones near the largest.
fn random_capacity(random: &mut Draws<'_>) -> MicroRps {
    match random.upto(6) {
        0 => random.between(1, 10),
        1 => random.between(1, 1000),
        2 => random.between(1000, 1_000_000),
        3 => 1_000_000 * random.between(1, 10_000),
        4 => MAX_CAPACITY - random.upto(1_000_000_000),
        5 => MAX_CAPACITY,
        _ => random.between(1, MAX_CAPACITY),
    }
}

/// The least a subscriber wants, in `1..=capacity`.
fn random_min_want(random: &mut Draws<'_>, capacity: MicroRps) -> MicroRps {
    match random.upto(4) {
        0 => 1,
        1 => capacity,
        2 => (capacity / 100).max(1),
        _ => random.between(1, capacity),
    }
}

/// A lease or stale time (ms), in `1..60_000`.
fn random_period(random: &mut Draws<'_>) -> u64 {
    match random.upto(3) {
        0 => random.between(1, 20),
        1 => random.between(1, 2000),
        _ => random.between(1, 59_999),
    }
}

fn random_params(random: &mut Draws<'_>) -> ShareParams {
    let capacity = random_capacity(random);
    let lease_ms = random_period(random);
    let stale_ms = match random.upto(4) {
        // Equal, and just either side.
        0 => lease_ms,
        1 => (lease_ms + 1).min(59_999),
        2 => (lease_ms - 1).max(1),
        _ => random_period(random),
    };
    let headroom = random.upto(1000);
    let hysteresis = random.upto(200);
    ShareParams {
        capacity,
        headroom_permille: random.pick(&[0, 1000, 200, headroom]),
        min_want: random_min_want(random, capacity),
        lease_ms,
        stale_ms,
        hysteresis_permille: random.pick(&[0, 200, 50, hysteresis]),
    }
}

/// A config reload: a new capacity (often near the old one, so held grants
/// can exceed it by a little or by far), and the bucket's other settings
/// perhaps changed too; the service's lease and stale times stay.
fn reload(random: &mut Draws<'_>, params: &mut ShareParams) {
    let old = params.capacity;
    params.capacity = match random.upto(3) {
        0 => random_capacity(random),
        1 => (old / random.between(2, 10)).max(1),
        2 => (old - old / random.between(2, 100)).max(1),
        _ => (old * random.between(2, 10)).min(MAX_CAPACITY),
    };
    if random.chance(30) || params.min_want > params.capacity {
        params.min_want = random_min_want(random, params.capacity);
    }
    if random.chance(20) {
        params.headroom_permille = random.upto(1000);
    }
    if random.chance(20) {
        params.hysteresis_permille = random.upto(200);
    }
    // Instances in a rolling configuration change disagree on times too.
    if random.chance(20) {
        params.lease_ms = random.between(1, 60_000);
    }
    if random.chance(20) {
        params.stale_ms = random.between(1, 60_000);
    }
}

/// A demand (µrps) in `0..=4 × capacity`, as the caller guarantees.
fn random_demand(random: &mut Draws<'_>, params: &ShareParams) -> MicroRps {
    let capacity = params.capacity;
    match random.upto(9) {
        0 => 0,
        1 => 4 * capacity,
        2 => random.upto(4 * capacity),
        3 => random.upto(params.min_want),
        // About an equal share, where the water level is decided.
        4 | 5 => {
            let share = capacity / random.between(1, SUBSCRIBERS.len() as u64);
            (share + random.upto(2)).saturating_sub(1)
        }
        // What is within the hysteresis of the last grant, roughly.
        6 => capacity - capacity / random.between(1, 50),
        _ => random.upto(capacity),
    }
}

fn random_op(random: &mut Draws<'_>, params: &ShareParams) -> ShareOp {
    match random.upto(19) {
        0 | 1 => ShareOp::Leave,
        2..=4 => ShareOp::Report(None),
        _ => ShareOp::Report(Some(random_demand(random, params))),
    }
}

/// How far time moves (µs): not at all, within a millisecond, across one,
/// to just before, at or after a lease or stale time, or past them all.
fn random_step(random: &mut Draws<'_>, now: u64, params: &ShareParams) -> u64 {
    let shortest = params.lease_ms.min(params.stale_ms) * 1000;
    let longest = params.lease_ms.max(params.stale_ms) * 1000;
    match random.upto(11) {
        0 | 1 => 0,
        2 => random.between(1, 999),
        3 => (1000 - now % 1000) + random.upto(2) - 1,
        4 => {
            let period = random.pick(&[params.lease_ms, params.stale_ms]) * 1000;
            period + random.pick(&[0, 1000, 2000]) - 1000
        }
        5 | 6 => random.upto(shortest),
        7 | 8 => random.upto(longest / 4),
        9 => random.upto(longest),
        10 => longest + random.upto(longest),
        _ => random.upto(3 * longest),
    }
}

/// What Redis holds for the bucket at `key` at `now` (µs): its entries and
/// its expiry (ms). A key past its fake expiry is gone, whether or not Redis
/// has looked.
async fn stored_in_redis(
    redis: &mut MultiplexedConnection,
    key: &str,
    now: u64,
) -> Result<(HashMap<String, Entry>, Option<Millis>), String> {
    let (flat, expiry): (HashMap<String, String>, Option<Millis>) = redis::pipe()
        .cmd("HGETALL")
        .arg(key)
        .cmd("HGET")
        .arg(EXPIRY)
        .arg(key)
        .query_async(redis)
        .await
        .map_err(|err| format!("reading {key}: {err}"))?;
    if expiry.is_some_and(|at| now / 1000 > at) {
        return Ok((HashMap::new(), None));
    }
    let mut entries = HashMap::new();
    for (id, text) in flat {
        let entry =
            Entry::decode(&text).ok_or_else(|| format!("entry {id} of {key} is {text:?}"))?;
        entries.insert(id, entry);
    }
    if !entries.is_empty() && expiry.is_none() {
        return Err(format!("{key} holds {entries:?} and never expires"));
    }
    Ok((entries, expiry))
}

/// `op` settled by `share.lua` on Redis at `now` (µs).
async fn settle_in_redis(
    redis: &mut MultiplexedConnection,
    key: &str,
    subscriber: &str,
    op: ShareOp,
    params: &ShareParams,
    now: u64,
    dead: &[String],
) -> Result<Share, String> {
    let mut invocation = SCRIPT_AT.key(key);
    share_args(&mut invocation, subscriber, op, params, dead);
    let reply: Vec<i64> = invocation
        .arg(now)
        .invoke_async(redis)
        .await
        .map_err(|err| format!("share.lua: {err}"))?;
    decode_share(&reply).map_err(|err| err.to_string())
}

/// One bucket on Redis and in Rust (the bare twin, and the embedded ledger
/// on a clock that agrees), settled alike.
struct Twins {
    redis: MultiplexedConnection,
    key: String,
    entries: HashMap<String, Entry>,
    clock: Arc<ManualClock>,
    ledger: Arc<MemoryLedger>,
    now: u64,
    /// What the Lua hash's expiry (ms) must be: set by each report, kept by
    /// a leave, gone with the last entry.
    expiry: Option<Millis>,
    seen: Seen,
}

impl Twins {
    async fn new(redis: &RedisServer, key: String, start: u64) -> Self {
        let clock = Arc::new(ManualClock::default());
        clock.advance(Duration::from_micros(start));
        Self {
            redis: redis.connection().await,
            key,
            entries: HashMap::new(),
            ledger: MemoryLedger::new(clock.clone()),
            clock,
            now: start,
            expiry: None,
            seen: Seen::default(),
        }
    }

    fn advance(&mut self, by: u64) {
        self.now += by;
        self.clock.advance(Duration::from_micros(by));
    }

    /// Settles `op` on all three; the share, once all agree on it and on
    /// what is stored.
    async fn step(
        &mut self,
        subscriber: &str,
        op: ShareOp,
        params: &ShareParams,
        dead: &[String],
    ) -> Result<Share, String> {
        let now_ms = self.now / 1000;
        let lua = settle_in_redis(
            &mut self.redis,
            &self.key,
            subscriber,
            op,
            params,
            self.now,
            dead,
        )
        .await?;
        let before = self.entries.clone();
        let hash_expired = self.expiry.is_some_and(|at| now_ms > at);
        let rust = share::settle(&mut self.entries, subscriber, op, params, now_ms, dead);
        let ledger = self.ledger.settle(&self.key, subscriber, op, params, dead);
        if lua != rust || ledger != rust {
            return Err(format!(
                "shares differ\n     lua: {lua:?}\n    rust: {rust:?}\n  ledger: {ledger:?}"
            ));
        }
        if let ShareOp::Report(_) = op {
            // The latest time any entry kept still counts.
            self.expiry = self
                .entries
                .values()
                .map(|entry| entry.stale_at.max(entry.expires_at))
                .max();
        }
        if self.entries.is_empty() {
            self.expiry = None;
        }
        let (stored, expiry) = stored_in_redis(&mut self.redis, &self.key, self.now).await?;
        if stored != self.entries {
            return Err(format!(
                "entries differ\n   lua: {}\n  rust: {}",
                sorted(&stored),
                sorted(&self.entries)
            ));
        }
        let in_ledger = self.ledger.entries(&self.key);
        if in_ledger != self.entries {
            return Err(format!(
                "entries differ\n    rust: {}\n  ledger: {}",
                sorted(&self.entries),
                sorted(&in_ledger)
            ));
        }
        if expiry != self.expiry {
            return Err(format!(
                "the hash expires at {expiry:?}, not {:?} (now_ms {now_ms})",
                self.expiry
            ));
        }
        let alive = self
            .seen
            .orphans(&before, &self.entries, subscriber, op, now_ms, dead)?;
        self.seen.note(&alive, subscriber, op, params, now_ms, &lua);
        self.seen.hash_expired += u64::from(hash_expired);
        Ok(lua)
    }
}

/// How often a sequence met each case worth meeting, so that a change to
/// the generators cannot quietly stop reaching one.
#[derive(Debug, Default)]
struct Seen {
    /// Another's entry dropped, its demand stale and its grant expired.
    dropped: u64,
    /// Another's demand stale while its grant is in force.
    stale_in_force: u64,
    /// Another's grant expired while its demand counts.
    expired_counting: u64,
    /// An entry's stale or expiry time exactly now.
    at_the_edge: u64,
    /// The others' grants in force above the capacity (after a reload).
    over_capacity: u64,
    /// A grant below its target, for want of room.
    short_of_target: u64,
    /// A grant held for the hysteresis rather than moved.
    kept: u64,
    /// A leave.
    left: u64,
    /// A settlement on a hash that had expired.
    hash_expired: u64,
    /// A dead instance's entry dropped, its grant run out.
    orphan_expired: u64,
    /// A settlement that held the orphans (too few newcomers).
    orphans_held: u64,
    /// A settlement that released the orphans.
    orphans_released: u64,
}

impl Seen {
    /// What became of the dead instances' entries at a settlement of `me`
    /// (`before` it and `after`): those whose grants ran out are dropped,
    /// and the others (the orphans) are all kept, or all released when as
    /// many live subscribers whose demand counts (`me` too, on a report)
    /// first settled after the orphans last did. Answers the entries the
    /// settlement went on counting.
    fn orphans(
        &mut self,
        before: &HashMap<String, Entry>,
        after: &HashMap<String, Entry>,
        me: &str,
        op: ShareOp,
        now_ms: Millis,
        dead: &[String],
    ) -> Result<HashMap<String, Entry>, String> {
        let is_dead =
            |id: &str| share::instance_of(id).is_some_and(|i| dead.iter().any(|d| d == i));
        let mut orphans = Vec::new();
        let mut last_settled = 0;
        for (id, entry) in before {
            if id != me && is_dead(id) {
                if entry.expires_at <= now_ms {
                    self.orphan_expired += 1;
                } else {
                    orphans.push(id.as_str());
                    last_settled = last_settled.max(entry.settled_at);
                }
            }
        }
        let kept = orphans.iter().filter(|id| after.contains_key(**id)).count();
        if orphans.is_empty() {
            // Nothing to release.
        } else if kept == orphans.len() {
            self.orphans_held += 1;
        } else if kept == 0 {
            self.orphans_released += 1;
        } else {
            return Err(format!("{kept} of the orphans {orphans:?} kept"));
        }
        let newcomers = before
            .iter()
            .filter(|(id, entry)| {
                *id != me && !is_dead(id) && entry.stale_at > now_ms && entry.since > last_settled
            })
            .count();
        let my_since = before
            .get(me)
            .filter(|mine| mine.stale_at > now_ms || mine.expires_at > now_ms)
            .map_or(now_ms, |mine| mine.since);
        let me_new = op != ShareOp::Leave && !is_dead(me) && my_since > last_settled;
        let released = !orphans.is_empty() && kept == 0;
        if released != (newcomers + usize::from(me_new) >= orphans.len() && !orphans.is_empty()) {
            return Err(format!(
                "orphans {orphans:?} (last settled {last_settled}) released: {released}, \
                 with {newcomers} newcomers besides {me} (new: {me_new})"
            ));
        }
        Ok(before
            .iter()
            .filter(|(id, entry)| {
                *id == me || !is_dead(id) || (entry.expires_at > now_ms && !released)
            })
            .map(|(id, entry)| (id.clone(), *entry))
            .collect())
    }

    fn note(
        &mut self,
        before: &HashMap<String, Entry>,
        me: &str,
        op: ShareOp,
        params: &ShareParams,
        now_ms: Millis,
        share: &Share,
    ) {
        let mut held = 0;
        for (id, entry) in before {
            let stale = entry.stale_at <= now_ms;
            let expired = entry.expires_at <= now_ms;
            self.at_the_edge += u64::from(entry.stale_at == now_ms || entry.expires_at == now_ms);
            if id == me {
                continue;
            }
            self.dropped += u64::from(stale && expired);
            self.stale_in_force += u64::from(stale && !expired);
            self.expired_counting += u64::from(!stale && expired);
            if !expired {
                held += entry.grant;
            }
        }
        self.over_capacity += u64::from(held > params.capacity);
        if op == ShareOp::Leave {
            self.left += 1;
            return;
        }
        let moved = share.target.min(params.capacity.saturating_sub(held));
        self.short_of_target += u64::from(moved < share.target);
        self.kept += u64::from(share.grant != moved);
    }

    fn add(&mut self, other: &Self) {
        self.dropped += other.dropped;
        self.stale_in_force += other.stale_in_force;
        self.expired_counting += other.expired_counting;
        self.at_the_edge += other.at_the_edge;
        self.over_capacity += other.over_capacity;
        self.short_of_target += other.short_of_target;
        self.kept += other.kept;
        self.left += other.left;
        self.hash_expired += other.hash_expired;
        self.orphan_expired += other.orphan_expired;
        self.orphans_held += other.orphans_held;
        self.orphans_released += other.orphans_released;
    }
}

/// Entries in subscriber order, for a failure message.
fn sorted(entries: &HashMap<String, Entry>) -> String {
    let mut listed: Vec<_> = entries.iter().collect();
    listed.sort_by_key(|(id, _)| id.as_str());
    listed
        .iter()
        .map(|(id, entry)| format!("\n    {id}: {}", entry.encode()))
        .collect()
}

/// Draws in a sequence's set-up or step: more than either reads (a
/// reload's and a demand's are the most, some twenty).
const DRAWS: usize = 32;

/// A sequence's set-up: its bucket's settings, and when it starts.
fn random_start(random: &mut Draws<'_>) -> (ShareParams, u64) {
    let params = random_params(random);
    (params, START + random.upto(10_000_000))
}

/// What happens before a step's settlement: a reload, perhaps (`true`
/// when one came), and perhaps an instance dying for good.
fn random_events(
    random: &mut Draws<'_>,
    params: &mut ShareParams,
    gone: &mut Vec<&'static str>,
) -> bool {
    let reloaded = random.chance(4);
    if reloaded {
        reload(random, params);
    }
    if random.chance(2) {
        let dies = random.pick(&["i2", "i3"]);
        if !gone.contains(&dies) {
            gone.push(dies);
        }
    }
    reloaded
}

/// Runs one sequence on both twins, on `key`; on a difference, fails with
/// the steps that led to it. Answers the cases it met.
async fn run_sequence(redis: &RedisServer, tape: &Tape, key: String) -> Result<Seen, String> {
    let (mut params, start) = random_start(&mut Draws::new(&tape.setup));
    let first = params;
    let mut twins = Twins::new(redis, key, start).await;
    let mut history = Vec::new();
    let mut gone = Vec::new();
    for (step, draws) in tape.steps.iter().enumerate() {
        let mut random = Draws::new(draws);
        let by = random_step(&mut random, twins.now, &params);
        twins.advance(by);
        let died = gone.len();
        if random_events(&mut random, &mut params, &mut gone) {
            history.push(format!("step {step}: reload to {params:?}"));
        }
        if let Some(dies) = gone.get(died) {
            history.push(format!("step {step}: {dies} dies"));
        }
        let subscriber = random_subscriber(&mut random, &gone);
        let op = random_op(&mut random, &params);
        let dead = random_dead(&mut random, &gone);
        history.push(format!(
            "step {step}: +{by} µs (now_ms {}), {subscriber} {op:?}, dead {dead:?}",
            twins.now / 1000
        ));
        match twins.step(subscriber, op, &params, &dead).await {
            Ok(share) => history.push(format!("  -> {share:?}")),
            Err(difference) => {
                let recent = history[history.len().saturating_sub(30)..].join("\n");
                return Err(format!(
                    "step {step}, params {first:?}\n{recent}\n{difference}"
                ));
            }
        }
    }
    Ok(twins.seen)
}

/// A runtime of the test's own, for proptest's cases (which it runs one by
/// one, outside any runtime), and a Redis on it.
fn runtime_and_redis() -> (tokio::runtime::Runtime, RedisServer) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let redis = runtime.block_on(RedisServer::start());
    (runtime, redis)
}

#[test]
fn shares_and_entries_are_the_same_in_lua_and_rust() {
    let (runtime, redis) = runtime_and_redis();
    // Each case: four sequences of about 100 steps side by side, each on
    // its own bucket and connection; 60 cases.
    let seen = RefCell::new(Seen::default());
    let lanes = proptest::collection::vec(tapes(1..=199, DRAWS), 4);
    draws::check(60, lanes, |lanes| {
        runtime.block_on(async {
            redis.flush_all().await;
            let runs = lanes
                .iter()
                .enumerate()
                .map(|(lane, tape)| run_sequence(&redis, tape, format!("quota_twins:{{l{lane}}}")));
            for (lane, run) in futures::future::join_all(runs)
                .await
                .into_iter()
                .enumerate()
            {
                let met = run.map_err(|difference| format!("lane {lane}, {difference}"))?;
                seen.borrow_mut().add(&met);
            }
            Ok(())
        })
    });
    let seen = seen.into_inner();
    println!("{seen:?}");
    let Seen {
        dropped,
        stale_in_force,
        expired_counting,
        at_the_edge,
        over_capacity,
        short_of_target,
        kept,
        left,
        hash_expired,
        orphan_expired,
        orphans_held,
        orphans_released,
    } = seen;
    for (case, count) in [
        ("dropped", dropped),
        ("stale_in_force", stale_in_force),
        ("expired_counting", expired_counting),
        ("at_the_edge", at_the_edge),
        ("over_capacity", over_capacity),
        ("short_of_target", short_of_target),
        ("kept", kept),
        ("left", left),
        ("hash_expired", hash_expired),
        ("orphan_expired", orphan_expired),
        ("orphans_held", orphans_held),
        ("orphans_released", orphans_released),
    ] {
        assert!(count >= 20, "the sequences met {case} only {count} times");
    }
}

/// On Redis alone, with instances dying: after every report, the grants in
/// force in the hash (orphans' included) add up to no more than the
/// capacity, and so does the reply's `granted`,
/// unless the capacity shrank while grants given under the old one are in
/// force (until the last of them runs out, or a lease, whichever is
/// later); and even then a report's grant fits in what
/// the others' grants in force leave free.
#[test]
fn grants_in_force_on_redis_never_exceed_the_capacity() {
    let (runtime, redis) = runtime_and_redis();
    // 150 sequences of about 120 steps.
    draws::check(150, tapes(1..=239, DRAWS), |tape| {
        runtime.block_on(async {
            redis.flush_all().await;
            grants_stay_within_the_capacity(&mut redis.connection().await, &tape).await
        })
    });
}

/// Runs one sequence on Redis alone; fails, with the steps that led to it,
/// when grants in force exceed what they may.
async fn grants_stay_within_the_capacity(
    connection: &mut MultiplexedConnection,
    tape: &Tape,
) -> Result<(), String> {
    let (mut params, mut now) = random_start(&mut Draws::new(&tape.setup));
    let first = params;
    let key = "quota_invariant:{b}";
    // Until when grants from before the last shrink may be in force.
    let mut shrunk_until: Millis = 0;
    let mut history = Vec::new();
    let mut gone = Vec::new();
    for (step, draws) in tape.steps.iter().enumerate() {
        let mut random = Draws::new(draws);
        let by = random_step(&mut random, now, &params);
        now += by;
        let now_ms = now / 1000;
        let before = params.capacity;
        if random_events(&mut random, &mut params, &mut gone) {
            if params.capacity < before {
                // The grants in force were given under the old capacity and
                // last as long as the lease they were given (which a reload
                // may have shortened since).
                let (entries, _) = stored_in_redis(connection, key, now).await?;
                let latest = entries.values().map(|entry| entry.expires_at).max();
                shrunk_until = (now_ms + params.lease_ms).max(latest.unwrap_or(0));
            }
            history.push(format!("step {step}: reload to {params:?}"));
        }
        let subscriber = random_subscriber(&mut random, &gone);
        let op = random_op(&mut random, &params);
        let dead = random_dead(&mut random, &gone);
        history.push(format!(
            "step {step}: +{by} µs (now_ms {now_ms}), {subscriber} {op:?}, dead {dead:?}"
        ));
        let fail = |history: &[String], what: String| {
            let recent = history[history.len().saturating_sub(30)..].join("\n");
            format!("step {step}, params {first:?}\n{recent}\n{what}")
        };
        let share = settle_in_redis(connection, key, subscriber, op, &params, now, &dead)
            .await
            .map_err(|err| fail(&history, err))?;
        history.push(format!("  -> {share:?}"));
        // Even after a shrink, a report only takes what is free.
        let others = share.granted.checked_sub(share.grant);
        let free = others.map(|others| params.capacity.saturating_sub(others));
        if op != ShareOp::Leave && free.is_none_or(|free| share.grant > free) {
            return Err(fail(
                &history,
                format!("granted more than is free: {share:?}"),
            ));
        }
        if op == ShareOp::Leave || now_ms < shrunk_until {
            continue;
        }
        let (entries, _) = stored_in_redis(connection, key, now)
            .await
            .map_err(|err| fail(&history, err))?;
        let in_force: MicroRps = entries
            .values()
            .filter(|entry| entry.expires_at > now_ms)
            .map(|entry| entry.grant)
            .sum();
        if in_force > params.capacity || share.granted > params.capacity {
            return Err(fail(
                &history,
                format!(
                    "grants in force {in_force} (granted {}) exceed the capacity {}:{}",
                    share.granted,
                    params.capacity,
                    sorted(&entries)
                ),
            ));
        }
        if in_force != share.granted {
            return Err(fail(
                &history,
                format!(
                    "granted {} but {in_force} in force:{}",
                    share.granted,
                    sorted(&entries)
                ),
            ));
        }
    }
    Ok(())
}

/// Entries of four numbers alone (the form of earlier versions) settle
/// alike in Lua and Rust: never newcomers, and, orphaned, held until their
/// grants run out.
#[tokio::test]
async fn entries_of_four_numbers_settle_alike() {
    let redis = RedisServer::start().await;
    let mut connection = redis.connection().await;
    let params = ShareParams {
        capacity: 100_000_000,
        headroom_permille: 200,
        min_want: 1_000_000,
        lease_ms: 16_000,
        stale_ms: 15_000,
        hysteresis_permille: 50,
    };
    let key = "quota_four:{b}";
    let start_ms = START / 1000;
    // A third each, one of them (i2's) of an instance found dead below.
    let four = |ms: Millis| format!("-1 33333333 {} {}", start_ms + ms - 1000, start_ms + ms);
    let written = [
        ("i1:1", four(10_000)),
        ("i2:1", four(11_000)),
        ("i3:1", four(12_000)),
    ];
    let mut entries = HashMap::new();
    for (id, text) in &written {
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg(id)
            .arg(text)
            .query_async(&mut connection)
            .await
            .expect("HSET");
        entries.insert((*id).to_owned(), Entry::decode(text).expect("four numbers"));
    }
    let _: () = redis::cmd("HSET")
        .arg(EXPIRY)
        .arg(key)
        .arg(start_ms + 12_000)
        .query_async(&mut connection)
        .await
        .expect("HSET the expiry");
    let dead = ["i2".to_owned()];
    // A newcomer on i1, then the others: i2:1 is held until it runs out
    // (its settlement unknown, taken for its expiry), then dropped.
    let steps = [
        ("i1:9", 1000),
        ("i3:1", 2000),
        ("i1:1", 3000),
        ("i1:9", 11_000),
    ];
    for (step, (me, ms)) in steps.into_iter().enumerate() {
        let now = START + ms * 1000;
        let op = ShareOp::Report(Some(100_000_000));
        let lua = settle_in_redis(&mut connection, key, me, op, &params, now, &dead)
            .await
            .expect("share.lua");
        let rust = share::settle(&mut entries, me, op, &params, now / 1000, &dead);
        assert_eq!(lua, rust, "step {step}");
        let (stored, _) = stored_in_redis(&mut connection, key, now)
            .await
            .expect("the entries");
        assert_eq!(stored, entries, "step {step}");
        assert_eq!(entries.contains_key("i2:1"), ms < 11_000, "step {step}");
    }
}

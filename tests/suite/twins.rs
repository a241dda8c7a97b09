//! The twins are equal: each algorithm's Lua function on a real Redis and
//! its Rust twin in the embedded store give identical decisions (allowed,
//! remaining, reset_after, retry_after) and keep identical state (values
//! and expiry) after every step of random sequences of (time, cost,
//! parameters), for every registered algorithm in each of its layouts
//! (the fixed window anchored, aligned, and aligned by name), alone and
//! several per call, in every script mode, with the marks a lease's spend
//! keeps, and through a lease's give-back of a fixed window's, token
//! bucket's or GCRA's units by those marks (the refund script and its
//! twin).
//!
//! The Lua side is the production script with its clock replaced
//! (tests/fixtures/twins/fake_clock.lua): `now` comes from an argument and
//! Redis's expiry is emulated on that clock, so time moves by any amount
//! without waiting. The Rust side is the embedded store on a manual clock,
//! through the limiter (decide and each) or the twin functions (the modes
//! only Redis runs). Both get their arguments from `limiter::script`.
//! Sequences are proptest's (`common::draws`): seeded, so a run replays
//! exactly, and a failure is shrunk to a short sequence and names the steps
//! that led to it. Another seed: `PROPTEST_RNG_SEED=7 cargo test
//! --all-features --test suite twins::` (the filter takes quota_twins'
//! tests too).

use crate::common;

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use common::RedisServer;
use common::draws::{self, Draws, Tape, tapes};
use ratelimitd::algorithm::registry::{Kind, Rate};
use ratelimitd::algorithm::{
    self, Snapshot, Spend, State, fixed_window, gcra, redis_expiry_at, sliding_window,
    sliding_window_counter, token_bucket,
};
use ratelimitd::algorithm::{Algorithm, FixedWindowMode, LimitRequest};
use ratelimitd::limit::{CallerKey, Decision, Micros};
use ratelimitd::limiter::script::{self, Decided, Mode, ScriptLimit, SpendMark};
use ratelimitd::limiter::{Limiter, Store, storage_key};
use ratelimitd::store::{ManualClock, MemoryStore};
use redis::Script;
use redis::aio::MultiplexedConnection;

const PREFIX: &str = "twins:";

/// The decision script under the test's clock.
static SCRIPT_AT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            include_str!("../fixtures/twins/fake_clock.lua"),
            script::ALGORITHMS_LUA,
            script::DECIDE_LUA,
        ]
        .concat(),
    )
});

/// The refund script under the test's clock: a lease's give-back of a
/// fixed window's, a token bucket's or a GCRA limit's units.
static REFUND_AT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        &[
            include_str!("../fixtures/twins/fake_clock.lua"),
            script::ALGORITHMS_WITH_REFUNDS_LUA,
            script::REFUND_PART_LUA,
        ]
        .concat(),
    )
});

/// Where every sequence starts: a real epoch in microseconds, so values are
/// as large as Redis `TIME` gives (and stay exact below 2^53). The test's
/// own schedule counts plain microseconds.
const START: u64 = 1_764_806_400_000_000;

/// Every way an algorithm keeps its state, as (algorithm, layout): the
/// registry's algorithms, each in every layout [`Kind::layouts`] gives it.
fn every_layout() -> Vec<(Kind, usize)> {
    let sample = Rate::new(1, Duration::from_secs(1));
    Kind::ALL
        .into_iter()
        .flat_map(|kind| {
            let layouts = kind.layouts(sample).expect("valid parameters").len();
            (0..layouts).map(move |layout| (kind, layout))
        })
        .collect()
}

/// Random parameters for `kind`: a limit of 1 to 6 per window of 1 ms to
/// 1 s; a token bucket of that capacity refilled at one of a few rates
/// (slow, fractional, fast); GCRA's rate of 1 to 5 per window, bursts of
/// the limit.
fn random_rate(random: &mut Draws<'_>, kind: Kind) -> Rate {
    let limit = 1 + random.upto(5);
    let window = Duration::from_millis(random.pick(&[1, 2, 5, 10, 50, 1000]));
    match kind {
        Kind::FixedWindow | Kind::SlidingWindow | Kind::SlidingWindowCounter => {
            Rate::new(limit, window)
        }
        Kind::TokenBucket => {
            // Refill rates of 0.5, 1, 1/3, 3.7, 100, 1000 and 12345.6 a
            // second, each exactly the quotient of these.
            let (units, per_ms) = random.pick(&[
                (1, 2000),
                (1, 1000),
                (1, 3000),
                (37, 10_000),
                (100, 1000),
                (1000, 1000),
                (123_456, 10_000),
            ]);
            Rate {
                limit: units,
                per: Duration::from_millis(per_ms),
                burst: Some(limit),
            }
        }
        Kind::Gcra => Rate {
            limit: 1 + random.upto(4),
            per: window,
            burst: Some(limit),
        },
    }
}

fn random_algorithm(random: &mut Draws<'_>, (kind, layout): (Kind, usize)) -> Algorithm {
    let rate = random_rate(random, kind);
    kind.layouts(rate).expect("valid parameters")[layout]
}

/// A span that finds the edges: none, a few microseconds, around a
/// millisecond boundary, within or across windows.
fn random_step(random: &mut Draws<'_>, now: u64, window: u64) -> u64 {
    match random.upto(9) {
        0 | 1 => 0,
        2 => 1 + random.upto(2),
        3 => random.upto(999),
        // To just before, at or after the next whole millisecond.
        4 => (1000 - now % 1000) + random.upto(2) - 1,
        5 | 6 => random.upto(window),
        // To just before, at or after the next multiple of the window.
        7 => (window - now % window) + random.upto(2) - 1,
        8 => window + random.upto(window),
        _ => random.upto(3 * window),
    }
}

fn random_cost(random: &mut Draws<'_>, limit: u64) -> u64 {
    match random.upto(9) {
        0 => 0,
        1..=4 => 1,
        5 => 2,
        6 => limit,
        7 => limit + 1,
        _ => random.upto(limit + 1),
    }
}

/// One Redis and one embedded store, on clocks that agree.
struct Twins {
    redis: MultiplexedConnection,
    clock: Arc<ManualClock>,
    memory: Arc<MemoryStore<State>>,
    limiter: Limiter,
    now: u64,
    /// Each key's mark of its latest spend by a call in `decide` mode, as
    /// both sides answered it: what a give-back names.
    marks: HashMap<String, u64>,
}

impl Twins {
    async fn new(redis: &RedisServer) -> Self {
        let clock = Arc::new(ManualClock::default());
        clock.advance(Duration::from_micros(START));
        let memory = MemoryStore::new(clock.clone());
        Self {
            redis: redis.connection().await,
            limiter: Limiter::new(Store::Memory(memory.clone()), PREFIX),
            clock,
            memory,
            now: START,
            marks: HashMap::new(),
        }
    }

    fn advance(&mut self, by: u64) {
        self.now += by;
        self.clock.advance(Duration::from_micros(by));
    }

    /// Decides `requests` in `mode` on both; the decisions (Lua's, then
    /// Rust's), after checking that both stores hold the same.
    async fn step(
        &mut self,
        mode: Mode,
        requests: &[LimitRequest],
        marked: bool,
    ) -> Result<Vec<Decision>, String> {
        let keys: Vec<String> = requests
            .iter()
            .map(|r| storage_key(PREFIX, &r.algorithm, &r.key))
            .collect();
        let limits: Vec<ScriptLimit<'_>> = requests
            .iter()
            .zip(&keys)
            .map(|(request, key)| ScriptLimit {
                key,
                algorithm: &request.algorithm,
                cost: request.cost,
                shadow: request.shadow,
            })
            .collect();
        let reply: redis::Value = script::decide_call_on(&SCRIPT_AT, mode, &limits)
            .arg(self.now)
            .invoke_async(&mut self.redis)
            .await
            .map_err(|err| format!("script: {err}"))?;
        let decided = script::decode(&limits, &reply).map_err(|err| err.to_string())?;
        let lua: Vec<Decision> = decided.iter().map(|one| one.decision).collect();
        let rust = if mode == Mode::Decide && marked {
            self.spend_marked(requests, &keys, &decided).await?
        } else {
            self.decide_in_memory(mode, requests, &keys).await?
        };
        if lua != rust {
            return Err(format!(
                "decisions differ\n   lua: {lua:?}\n  rust: {rust:?}"
            ));
        }
        for (request, key) in requests.iter().zip(&keys) {
            self.same_state(&request.algorithm, key).await?;
        }
        Ok(lua)
    }

    /// The embedded store's spend with marks (a lease's), whose marks must
    /// be those the script replied (`lua`) for every limit that spent;
    /// they are kept for later give-backs. Its decisions.
    async fn spend_marked(
        &mut self,
        requests: &[LimitRequest],
        keys: &[String],
        lua: &[Decided],
    ) -> Result<Vec<Decision>, String> {
        let spent = self
            .limiter
            .spend_marked(requests)
            .await
            .map_err(|err| format!("embedded store: {err}"))?;
        let call_spent = lua
            .iter()
            .zip(requests)
            .all(|(one, request)| request.shadow || one.decision.is_allowed());
        for (((decision, mark), one), (request, key)) in
            spent.iter().zip(lua).zip(requests.iter().zip(keys))
        {
            let spends = call_spent && decision.is_allowed() && request.cost > 0;
            let expected = spends.then_some(one.mark);
            if *mark != expected {
                return Err(format!(
                    "marks of {key} differ\n   lua: {expected:?}\n  rust: {mark:?}"
                ));
            }
            if let Some(mark) = mark {
                self.marks.insert(key.clone(), mark.arg());
            }
        }
        Ok(spent.into_iter().map(|(decision, _)| decision).collect())
    }

    /// Whether Redis and the embedded store hold the same for `key`.
    async fn same_state(&mut self, algorithm: &Algorithm, key: &str) -> Result<(), String> {
        let lua = self.stored_in_redis(algorithm, key).await;
        let rust = self
            .memory
            .peek(key)
            .map(|(state, expires_at)| (state.snapshot(), expires_at));
        if lua != rust {
            return Err(format!(
                "state of {key} differs\n   lua: {lua:?}\n  rust: {rust:?}"
            ));
        }
        Ok(())
    }

    async fn decide_in_memory(
        &self,
        mode: Mode,
        requests: &[LimitRequest],
        keys: &[String],
    ) -> Result<Vec<Decision>, String> {
        let decided = match mode {
            Mode::Decide => self.limiter.check_all(requests, None).await,
            Mode::Each => self.limiter.check_each(requests, None).await,
            // The modes only Redis runs (a cluster's steps, a cached
            // denial's completion): their twin is each limit decided dry.
            Mode::Dry | Mode::Look | Mode::Denied => {
                let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
                return Ok(self.memory.with_keys(&keys, |locked, now| {
                    let mut dry = |i: usize, cost: u64| {
                        let algorithm = &requests[i].algorithm;
                        locked.decide(i, |state| {
                            algorithm::decide_in_memory(algorithm, state, now, cost, Spend::Dry)
                        })
                    };
                    (0..requests.len())
                        .map(|i| match mode {
                            Mode::Dry => dry(i, requests[i].cost),
                            Mode::Look => dry(i, 0),
                            _ => {
                                let decision = dry(i, requests[i].cost);
                                if decision.is_allowed() {
                                    dry(i, 0)
                                } else {
                                    decision
                                }
                            }
                        })
                        .collect()
                }));
            }
        };
        decided.map_err(|err| format!("embedded store: {err}"))
    }

    /// Gives each of `requests` its cost back where a lease's release
    /// would (a fixed window's, token bucket's or GCRA's live key) on
    /// both, with the mark of the key's latest marked spend (perhaps of a
    /// window gone since; 0 if none): whether each was given back, after
    /// checking both stores hold the same.
    async fn give_back(&mut self, requests: &[LimitRequest]) -> Result<(), String> {
        let givable = requests.iter().filter(|r| {
            matches!(
                r.algorithm,
                Algorithm::FixedWindow(_) | Algorithm::TokenBucket(_) | Algorithm::Gcra(_)
            ) && r.cost > 0
        });
        for request in givable {
            let key = storage_key(PREFIX, &request.algorithm, &request.key);
            let mark = SpendMark::of(
                &request.algorithm,
                self.marks.get(&key).copied().unwrap_or(0),
            );
            let limit = ScriptLimit {
                key: &key,
                algorithm: &request.algorithm,
                cost: request.cost,
                shadow: false,
            };
            let lua: i64 = script::refund_call_on(&REFUND_AT, &[(limit, mark)])
                .arg(self.now)
                .invoke_async(&mut self.redis)
                .await
                .map_err(|err| format!("refund script: {err}"))?;
            let rust = self
                .limiter
                .give_back(&[(request.clone(), mark)])
                .await
                .map_err(|err| format!("embedded store: {err}"))?;
            if (lua == 1) != rust {
                return Err(format!("given back to {key}: lua {lua}, rust {rust}"));
            }
            self.same_state(&request.algorithm, &key).await?;
        }
        Ok(())
    }

    /// What Redis holds for `key`, read as each Lua file documents, with
    /// when the embedded store would drop it.
    async fn stored_in_redis(
        &mut self,
        algorithm: &Algorithm,
        key: &str,
    ) -> Option<(Snapshot, Micros)> {
        let expiry_ms: Option<u64> = redis::cmd("HGET")
            .arg("twins:expiry")
            .arg(key)
            .query_async(&mut self.redis)
            .await
            .expect("HGET");
        // Past its expiry, a key is gone, whether or not Redis has looked.
        if expiry_ms.is_some_and(|at| self.now / 1000 > at) {
            return None;
        }
        let shared = self.redis.clone();
        let connection = &mut self.redis;
        let hash = |fields: &'static [&'static str]| {
            let mut command = redis::cmd("HMGET");
            command.arg(key).arg(fields);
            let mut connection = shared.clone();
            async move {
                let values: Vec<Option<String>> =
                    command.query_async(&mut connection).await.expect("HMGET");
                values
            }
        };
        let number = |text: &Option<String>| -> u64 {
            let value: f64 = text.as_deref().expect("a field").parse().expect("a number");
            assert!(value.fract() == 0.0 && value >= 0.0, "{value} is no count");
            value as u64
        };
        let snapshot = match algorithm {
            Algorithm::FixedWindow(p) if p.mode() == FixedWindowMode::Aligned => {
                let values = hash(&["w", "n"]).await;
                values[0].as_ref()?;
                Snapshot::FixedWindow(fixed_window::Snapshot {
                    window: Some(number(&values[0])),
                    used: number(&values[1]),
                })
            }
            Algorithm::FixedWindow(_) => {
                let used: Option<String> = redis::cmd("GET")
                    .arg(key)
                    .query_async(connection)
                    .await
                    .expect("GET");
                Snapshot::FixedWindow(fixed_window::Snapshot {
                    window: None,
                    used: number(&Some(used?)),
                })
            }
            Algorithm::SlidingWindow(p) => {
                let members: Vec<(String, u64)> = redis::cmd("ZRANGE")
                    .arg(key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(connection)
                    .await
                    .expect("ZRANGE");
                // Entries that left the window wait to be pruned; they
                // count for nothing, and the twin drops them at once.
                let window = p.window().as_micros().as_micros();
                let entries: Vec<(Micros, u64)> = members
                    .into_iter()
                    .filter(|&(_, stamp)| stamp + window > self.now)
                    .map(|(member, stamp)| {
                        let (_, units) = member.split_once(':').expect("before:units");
                        (Micros::from_micros(stamp), units.parse().expect("units"))
                    })
                    .collect();
                if entries.is_empty() {
                    return None;
                }
                Snapshot::SlidingWindow(sliding_window::Snapshot { entries })
            }
            Algorithm::TokenBucket(_) => {
                let values = hash(&["t", "ts"]).await;
                let tokens: f64 = values[0].as_deref()?.parse().expect("tokens");
                Snapshot::TokenBucket(token_bucket::Snapshot {
                    tokens,
                    stamp: Micros::from_micros(number(&values[1])),
                })
            }
            Algorithm::Gcra(_) => {
                let tat: Option<String> = redis::cmd("GET")
                    .arg(key)
                    .query_async(connection)
                    .await
                    .expect("GET");
                Snapshot::Gcra(gcra::Snapshot {
                    tat: Micros::from_micros(number(&Some(tat?))),
                })
            }
            Algorithm::SlidingWindowCounter(_) => {
                let values = hash(&["w", "c", "p"]).await;
                values[0].as_ref()?;
                Snapshot::SlidingWindowCounter(sliding_window_counter::Snapshot {
                    index: number(&values[0]),
                    current: number(&values[1]),
                    previous: number(&values[2]),
                })
            }
        };
        let expiry_ms = expiry_ms.unwrap_or_else(|| panic!("{key} has no expiry"));
        Some((snapshot, redis_expiry_at(expiry_ms)))
    }
}

fn request(name: &str, algorithm: Algorithm, cost: u64, shadow: bool) -> LimitRequest {
    LimitRequest {
        key: CallerKey::new(name.into()).expect("a key"),
        algorithm,
        cost,
        shadow,
    }
}

/// Runs one sequence of `limits` limits from a clean Redis; on a
/// difference, fails with the steps that led to it.
async fn run_sequence(redis: &RedisServer, tape: &Tape, limits: usize) -> Result<(), String> {
    redis.flush_all().await;
    let mut random = Draws::new(&tape.setup);
    let mut twins = Twins::new(redis).await;
    let layouts = every_layout();
    let algorithms: Vec<Algorithm> = (0..limits)
        .map(|_| {
            let layout = random.pick(&layouts);
            random_algorithm(&mut random, layout)
        })
        .collect();
    let shortest = algorithms
        .iter()
        .map(Algorithm::span)
        .min()
        .map_or(1000, Micros::as_micros);
    let mut history = Vec::new();
    for (step, draws) in tape.steps.iter().enumerate() {
        let mut random = Draws::new(draws);
        let by = random_step(&mut random, twins.now, shortest.max(1));
        twins.advance(by);
        let mode = match random.upto(19) {
            0 => Mode::Dry,
            1 => Mode::Look,
            2 => Mode::Denied,
            3 | 4 => Mode::Each,
            _ => Mode::Decide,
        };
        let requests: Vec<LimitRequest> = algorithms
            .iter()
            .enumerate()
            .map(|(i, algorithm)| {
                let cost = random_cost(&mut random, algorithm.limit());
                let shadow = limits > 1 && random.chance(10);
                request(&format!("k{i}"), *algorithm, cost, shadow)
            })
            .collect();
        let costs: Vec<u64> = requests.iter().map(|r| r.cost).collect();
        // Now and then, a lease's release instead: the costs given back.
        let give_back = random.chance(12);
        history.push(format!(
            "step {step}: +{by} µs (now {}), {}, costs {costs:?}",
            twins.now,
            if give_back {
                "give back".to_owned()
            } else {
                format!("{mode:?}")
            }
        ));
        let stepped = if give_back {
            twins.give_back(&requests).await
        } else {
            // Every other step in `decide` mode, the twin is the spend
            // with marks (a lease's).
            twins.step(mode, &requests, step % 2 == 0).await.map(drop)
        };
        if let Err(difference) = stepped {
            let recent = history[history.len().saturating_sub(12)..].join("\n");
            return Err(format!("limits {algorithms:?}\n{recent}\n{difference}"));
        }
    }
    Ok(())
}

/// Runs `cases` sequences of about 150 steps (1 to 300) of `limits` limits.
fn sequences_agree(cases: u32, limits: RangeInclusive<usize>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let redis = runtime.block_on(RedisServer::start());
    // A step reads at most 3 draws and 3 for each of at most 4 limits.
    let sequences = (limits, tapes(1..=300, 16));
    draws::check(cases, sequences, |(limits, tape)| {
        runtime.block_on(run_sequence(&redis, &tape, limits))
    });
}

#[test]
fn each_algorithm_alone_decides_and_stores_the_same_in_lua_and_rust() {
    sequences_agree(120, 1..=1);
}

#[test]
fn several_limits_per_call_decide_and_store_the_same_in_lua_and_rust() {
    sequences_agree(60, 2..=4);
}

//! Decisions on Redis go out in batches: the decisions waiting for one Redis
//! are decided by one script call, each exactly as alone. Shown three ways:
//! the batch script answers a random sequence of calls exactly as the
//! single script answers them one by one (both on the differential test's
//! clock, tests/fixtures/twins/fake_clock.lua), an error in one call of a
//! batch touching no other; several ratelimitd processes on one Redis still
//! admit exactly the limit of a hot key, for every algorithm, with fewer
//! script calls than decisions; and 50 callers at once need fewer than half
//! a script call per decision (`INFO commandstats`).

mod common;

use std::sync::LazyLock;
use std::time::Duration;

use common::random::Random;
use common::{
    RedisServer, ServerProcess, allowed_of_concurrent_calls, check, every_algorithm,
    every_model_algorithm, fixed_window,
};
use ratelimitd::limit::Algorithm;
use ratelimitd::limiter::script::{self, Mode, ScriptLimit};
use ratelimitd::store::Batchable;
use redis::Value;
use redis::aio::MultiplexedConnection;

const CLOCK: &str = include_str!("fixtures/twins/fake_clock.lua");

/// The single script under the test's clock.
static SINGLE_AT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&[CLOCK, script::ALGORITHMS_LUA, script::DECIDE_LUA].concat())
});

/// The batch script under the test's clock.
static BATCH_AT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&[CLOCK, script::ALGORITHMS_LUA, script::DECIDE_BATCH_LUA].concat())
});

/// A real epoch in microseconds, as Redis `TIME` gives.
const START: u64 = 1_764_806_400_000_000;

const MODES: [Mode; 5] = [
    Mode::Decide,
    Mode::Each,
    Mode::Dry,
    Mode::Look,
    Mode::Denied,
];

/// One call of a sequence: its limits as (algorithm index, key number,
/// cost, shadow), and its mode.
struct Call {
    limits: Vec<(usize, u64, u64, bool)>,
    mode: Mode,
}

fn random_call(random: &mut Random, algorithms: usize) -> Call {
    let count = random.between(1, 3);
    let limits = (0..count)
        .map(|_| {
            let algorithm = usize::try_from(random.upto(algorithms as u64 - 1)).expect("small");
            (algorithm, random.upto(2), random.upto(3), random.chance(20))
        })
        .collect();
    Call {
        limits,
        mode: random.pick(&MODES),
    }
}

/// `call` on the keys under `prefix`, under the test's clock.
fn batchable(call: &Call, algorithms: &[Algorithm], prefix: &str) -> Batchable {
    let keys: Vec<String> = call
        .limits
        .iter()
        .map(|&(algorithm, key, _, _)| format!("{prefix}{algorithm}:{key}"))
        .collect();
    let limits: Vec<ScriptLimit<'_>> = call
        .limits
        .iter()
        .zip(&keys)
        .map(|(&(algorithm, _, cost, shadow), key)| ScriptLimit {
            key,
            algorithm: &algorithms[algorithm],
            cost,
            shadow,
        })
        .collect();
    script::decide_batchable_on(&SINGLE_AT, &BATCH_AT, call.mode, &limits)
}

/// A call the script cannot decide: an unknown algorithm.
fn broken_call(prefix: &str) -> Batchable {
    let args = ["xx", "1", "1", "0", "1", "0", "decide"];
    Batchable {
        single: &SINGLE_AT,
        batch: &BATCH_AT,
        keys: vec![format!("{prefix}broken")],
        args: args.iter().map(|arg| arg.as_bytes().to_vec()).collect(),
    }
}

async fn alone(redis: &mut MultiplexedConnection, call: &Batchable, now: u64) -> Value {
    match call.alone().arg(now).invoke_async::<Value>(redis).await {
        Ok(value) => value,
        Err(err) => Value::SimpleString(format!("error: {}", err.detail().unwrap_or(""))),
    }
}

/// A batch's replies, a call's error (its text) written as [`alone`] writes
/// it.
async fn together(redis: &mut MultiplexedConnection, calls: &[&Batchable], now: u64) -> Vec<Value> {
    let mut invocation = Batchable::together(calls).expect("calls");
    let reply: Value = invocation
        .arg(now)
        .invoke_async(redis)
        .await
        .expect("the batch runs");
    let Value::Array(replies) = reply else {
        panic!("the batch replied {reply:?}");
    };
    replies
        .into_iter()
        .map(|reply| match reply {
            Value::BulkString(text) => {
                Value::SimpleString(format!("error: {}", String::from_utf8_lossy(&text)))
            }
            other => other,
        })
        .collect()
}

#[tokio::test]
async fn a_batch_decides_each_call_exactly_as_it_would_be_decided_alone() {
    let redis = RedisServer::start().await;
    let mut connection = redis.connection().await;
    let algorithms = every_model_algorithm(5);
    let mut random = Random::new(0x0ba7_c4e5);
    let mut now = START;
    for round in 0..200 {
        let calls: Vec<Call> = (0..random.between(1, 12))
            .map(|_| random_call(&mut random, algorithms.len()))
            .collect();
        let broken_at = random.chance(10).then(|| random.upto(calls.len() as u64));
        let mut batched = Vec::new();
        let mut singles = Vec::new();
        for (i, call) in calls.iter().enumerate() {
            if broken_at == Some(i as u64) {
                batched.push(broken_call("a:"));
                singles.push(broken_call("b:"));
            }
            batched.push(batchable(call, &algorithms, "a:"));
            singles.push(batchable(call, &algorithms, "b:"));
        }
        let refs: Vec<&Batchable> = batched.iter().collect();
        let in_batch = together(&mut connection, &refs, now).await;
        let mut one_by_one = Vec::new();
        for call in &singles {
            one_by_one.push(alone(&mut connection, call, now).await);
        }
        assert_eq!(in_batch.len(), one_by_one.len(), "round {round}");
        for (i, (batch, single)) in in_batch.iter().zip(&one_by_one).enumerate() {
            match (batch, single) {
                (Value::SimpleString(batch), Value::SimpleString(single)) => {
                    assert!(
                        batch.contains("unknown algorithm"),
                        "round {round}: {batch}"
                    );
                    assert!(
                        single.contains("unknown algorithm"),
                        "round {round}: {single}"
                    );
                }
                _ => assert_eq!(batch, single, "round {round}, call {i}"),
            }
        }
        now += random.pick(&[0, 1, 1_000, 250_000, 2_000_000, 70_000_000]);
    }
}

/// `--local-cache-size 0`: every denial too is decided on Redis, so that
/// the script calls counted are the decisions' own.
const NO_CACHE: [&str; 4] = ["--redis-command-timeout", "10s", "--local-cache-size", "0"];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_batching_on_one_redis_admit_exactly_the_limit() {
    let redis = RedisServer::start().await;
    let url = redis.url();
    let mut flags = vec!["--redis-url", &url];
    flags.extend(NO_CACHE);
    let servers = [
        ServerProcess::start(&flags).await,
        ServerProcess::start(&flags).await,
        ServerProcess::start(&flags).await,
    ];
    let mut clients = Vec::new();
    for server in &servers {
        for _ in 0..4 {
            clients.push(server.client().await);
        }
    }
    let before = redis.script_calls().await;
    let mut decisions = 0;
    for (i, algorithm) in every_algorithm(200).iter().enumerate() {
        let key = format!("batched-{i}");
        let allowed = allowed_of_concurrent_calls(&clients, 600, &key, algorithm).await;
        assert_eq!(allowed, 200, "{algorithm:?}");
        decisions += 600;
    }
    let calls = redis.script_calls().await - before;
    assert!(
        calls < decisions,
        "{calls} script calls for {decisions} decisions: no batch formed"
    );
    redis.assert_every_key_expires().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_callers_at_once_take_less_than_half_a_script_call_per_decision() {
    const CALLERS: usize = 50;
    const EACH: usize = 40;
    let redis = RedisServer::start().await;
    let url = redis.url();
    let mut flags = vec!["--redis-url", &url];
    flags.extend(NO_CACHE);
    let server = ServerProcess::start(&flags).await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(server.client().await);
    }
    let limit = fixed_window(1_000_000, Duration::from_secs(3600));
    let before = redis.script_calls().await;
    let callers = (0..CALLERS).map(|i| {
        let mut client = clients[i % clients.len()].clone();
        tokio::spawn(async move {
            for j in 0..EACH {
                let key = format!("caller-{i}-{}", j % 4);
                assert!(check(&mut client, &key, &limit, None).await.allowed);
            }
        })
    });
    for caller in futures::future::join_all(callers).await {
        caller.expect("caller");
    }
    let calls = redis.script_calls().await - before;
    let decisions = (CALLERS * EACH) as u64;
    assert!(
        calls * 2 < decisions,
        "{calls} script calls for {decisions} decisions"
    );
}

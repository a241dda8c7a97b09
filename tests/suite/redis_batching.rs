//! Decisions on Redis go out in batches: the decisions waiting for one Redis
//! are decided by one script call, each exactly as alone. Shown three ways:
//! the batch script answers a random sequence of calls exactly as the
//! single script answers them one by one (both on the differential test's
//! clock, tests/fixtures/twins/fake_clock.lua), an error in one call of a
//! batch touching no other, in both layouts (every key declared, and a
//! Cluster node's, the keys among the values); several ratelimitd
//! processes on one Redis or one Redis Cluster still admit exactly the
//! limit of a hot key, for every algorithm, with fewer script calls than
//! decisions; and 50 callers at once need fewer than half a script call per
//! decision (`INFO commandstats`). On a Cluster, a node's batch stops a
//! call whose key the node does not serve before the call writes anything,
//! and a batch the node refuses goes out call by call.

use crate::common;

use std::sync::LazyLock;
use std::time::Duration;

use common::draws::{self, Draws, Tape, tapes};
use common::redis::{RedisCluster, info_field};
use common::{
    RedisServer, ServerProcess, allowed_of_concurrent_calls, check, every_algorithm,
    every_model_algorithm, fixed_window,
};
use ratelimitd::algorithm::Algorithm;
use ratelimitd::limiter::script::{self, BatchScripts, Mode, ScriptLimit};
use ratelimitd::store::Batchable;
use redis::Value;
use redis::aio::MultiplexedConnection;

const CLOCK: &str = include_str!("../fixtures/twins/fake_clock.lua");

/// The single script under the test's clock.
static SINGLE_AT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&[CLOCK, script::ALGORITHMS_LUA, script::DECIDE_LUA].concat())
});

/// The batch script under the test's clock.
static BATCH_AT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(&[CLOCK, script::ALGORITHMS_LUA, script::DECIDE_BATCH_LUA].concat())
});

/// The batch script for one Cluster node, under the test's clock.
static NODE_BATCH_AT: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        &[
            script::NODE_BATCH_FLAGS,
            CLOCK,
            script::ALGORITHMS_LUA,
            script::DECIDE_NODE_BATCH_LUA,
        ]
        .concat(),
    )
});

/// The three scripts under the test's clock.
fn scripts_at() -> BatchScripts {
    BatchScripts {
        single: &SINGLE_AT,
        batch: &BATCH_AT,
        node_batch: &NODE_BATCH_AT,
    }
}

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

fn random_call(random: &mut Draws<'_>, algorithms: usize) -> Call {
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
    script::decide_batchable_on(scripts_at(), call.mode, &limits)
}

/// A call the script cannot decide: an unknown algorithm.
fn broken_call(prefix: &str) -> Batchable {
    let args = ["xx", "1", "1", "0", "1", "0", "decide"];
    let mut arguments = ratelimitd::store::ScriptArgs::default();
    arguments.arg(format!("{prefix}broken"));
    for arg in args {
        arguments.arg(arg);
    }
    Batchable::new(scripts_at(), arguments, 1, script::REPLY_PER_LIMIT)
}

async fn alone(redis: &mut MultiplexedConnection, call: &Batchable, now: u64) -> Value {
    match call.alone().arg(now).invoke_async(redis).await {
        Ok(value) => value,
        Err(err) => Value::SimpleString(format!("error: {}", err.detail().unwrap_or(""))),
    }
}

/// How a batch is laid out: every key declared (a standalone Redis), or,
/// as for one Cluster node, the keys among the values.
#[derive(Debug, Clone, Copy)]
enum Layout {
    Keys,
    Node,
}

/// A batch's replies, a call's error (its text) written as [`alone`] writes
/// it.
async fn together(
    redis: &mut MultiplexedConnection,
    layout: Layout,
    calls: &[&Batchable],
    now: u64,
) -> Vec<Value> {
    let mut invocation = match layout {
        Layout::Keys => Batchable::together(calls),
        Layout::Node => Batchable::together_on_node(calls),
    }
    .expect("calls");
    let reply: Value = invocation
        .arg(now)
        .invoke_async(redis)
        .await
        .expect("the batch runs");
    let Some(replies) = Batchable::replies_of(calls, reply.clone()) else {
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

#[test]
fn a_batch_decides_each_call_exactly_as_it_would_be_decided_alone() {
    batches_decide_as_calls_alone(Layout::Keys);
}

#[test]
fn a_cluster_node_batch_decides_each_call_exactly_as_it_would_be_decided_alone() {
    batches_decide_as_calls_alone(Layout::Node);
}

/// Draws in a round: up to 12 calls of up to 14 draws each, and 3 more.
const ROUND_DRAWS: usize = 176;

/// Random sequences of batches in `layout` (proptest's, from
/// `common::draws`: seeded, and shrunk on a failure; another seed:
/// `PROPTEST_RNG_SEED=7 cargo test --all-features --test suite
/// redis_batching::`): 8 of about 25 rounds (1 to 49), 200 rounds in all,
/// each from an empty Redis.
fn batches_decide_as_calls_alone(layout: Layout) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let redis = runtime.block_on(RedisServer::start());
    draws::check(8, tapes(1..=49, ROUND_DRAWS), |tape| {
        runtime.block_on(async {
            redis.flush_all().await;
            rounds_decide_as_calls_alone(&mut redis.connection().await, layout, &tape).await
        })
    });
}

/// Each round's batch, each call's reply compared with the same call's
/// alone, on keys of their own.
async fn rounds_decide_as_calls_alone(
    connection: &mut MultiplexedConnection,
    layout: Layout,
    tape: &Tape,
) -> Result<(), String> {
    let algorithms = every_model_algorithm(5);
    let mut now = START;
    for (round, draws) in tape.steps.iter().enumerate() {
        let mut random = Draws::new(draws);
        let mut calls: Vec<Call> = Vec::new();
        for _ in 0..random.between(1, 12) {
            let call = match calls.len() {
                // Half the calls after the first have the limits and mode of
                // an earlier one, on keys drawn anew: in a batch they share
                // that call's values.
                earlier @ 1.. if random.chance(50) => {
                    let like =
                        &calls[usize::try_from(random.upto(earlier as u64 - 1)).expect("small")];
                    Call {
                        limits: like
                            .limits
                            .iter()
                            .map(|&(algorithm, _, cost, shadow)| {
                                (algorithm, random.upto(2), cost, shadow)
                            })
                            .collect(),
                        mode: like.mode,
                    }
                }
                _ => random_call(&mut random, algorithms.len()),
            };
            calls.push(call);
        }
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
        let in_batch = together(connection, layout, &refs, now).await;
        let mut one_by_one = Vec::new();
        for call in &singles {
            one_by_one.push(alone(connection, call, now).await);
        }
        if in_batch.len() != one_by_one.len() {
            return Err(format!(
                "round {round}: {} replies in the batch, {} alone",
                in_batch.len(),
                one_by_one.len()
            ));
        }
        for (i, (batch, single)) in in_batch.iter().zip(&one_by_one).enumerate() {
            let alike = match (batch, single) {
                (Value::SimpleString(batch), Value::SimpleString(single)) => {
                    batch.contains("unknown algorithm") && single.contains("unknown algorithm")
                }
                _ => batch == single,
            };
            if !alike {
                return Err(format!(
                    "round {round}, call {i} of {}: in the batch {batch:?}, alone {single:?}",
                    calls.len()
                ));
            }
        }
        now += random.pick(&[0, 1, 1_000, 250_000, 2_000_000, 70_000_000]);
    }
    Ok(())
}

/// `--local-cache-size 0`: every denial too is decided on Redis, so that
/// the script calls counted are the decisions' own.
const NO_CACHE: [&str; 4] = ["--redis-command-timeout", "10s", "--local-cache-size", "0"];

/// The Redis the ratelimitd processes of a test share.
enum Shared {
    Standalone(RedisServer),
    Cluster(RedisCluster),
}

impl Shared {
    async fn standalone() -> Self {
        Self::Standalone(RedisServer::start().await)
    }

    async fn cluster() -> Self {
        Self::Cluster(RedisCluster::start().await)
    }

    /// The flags that point ratelimitd at it, with [`NO_CACHE`] and
    /// `extra`.
    fn flags(&self, extra: &[&str]) -> Vec<String> {
        let mut flags = match self {
            Self::Standalone(redis) => vec!["--redis-url".to_owned(), redis.url()],
            Self::Cluster(cluster) => vec![
                "--redis-mode".to_owned(),
                "cluster".to_owned(),
                "--redis-url".to_owned(),
                cluster.urls().join(","),
            ],
        };
        flags.extend(NO_CACHE.iter().chain(extra).map(|flag| (*flag).to_owned()));
        flags
    }

    async fn servers(&self, count: usize, extra: &[&str]) -> Vec<ServerProcess> {
        let flags = self.flags(extra);
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let mut servers = Vec::new();
        for _ in 0..count {
            servers.push(ServerProcess::builder().flags(&flags).start().await);
        }
        servers
    }

    async fn script_calls(&self) -> u64 {
        match self {
            Self::Standalone(redis) => redis.script_calls().await,
            Self::Cluster(cluster) => cluster.script_calls().await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_batching_on_one_redis_admit_exactly_the_limit() {
    let redis = Shared::standalone().await;
    three_processes_admit_exactly_the_limit(&redis).await;
    if let Shared::Standalone(redis) = &redis {
        redis.assert_every_key_expires().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_batching_on_one_cluster_admit_exactly_the_limit() {
    three_processes_admit_exactly_the_limit(&Shared::cluster().await).await;
}

/// 3 processes x 4 clients, 600 calls at once on one key per algorithm:
/// exactly 200 admitted, in fewer script calls than decisions.
async fn three_processes_admit_exactly_the_limit(redis: &Shared) {
    let servers = redis.servers(3, &[]).await;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_callers_at_once_take_less_than_half_a_script_call_per_decision() {
    fifty_callers_take_less_than_half_a_call_per_decision(&Shared::standalone().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_callers_on_a_cluster_take_less_than_half_a_script_call_per_decision() {
    fifty_callers_take_less_than_half_a_call_per_decision(&Shared::cluster().await).await;
}

/// 50 callers at once, each on keys of its own (on a Cluster, spread over
/// every primary): fewer than half a script call per decision.
async fn fifty_callers_take_less_than_half_a_call_per_decision(redis: &Shared) {
    const CALLERS: usize = 50;
    const EACH: usize = 40;
    let servers = redis.servers(1, &[]).await;
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(servers[0].client().await);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_batches_of_one_call_every_decision_is_a_script_call_of_its_own() {
    let redis = Shared::standalone().await;
    let servers = redis.servers(1, &["--redis-batch-calls", "1"]).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(servers[0].client().await);
    }
    let limit = fixed_window(100, Duration::from_secs(3600));
    // Loads the script: calls that meet NOSCRIPT are counted twice.
    check(&mut clients[0], "first", &limit, None).await;
    let before = redis.script_calls().await;
    let allowed = allowed_of_concurrent_calls(&clients, 300, "alone", &limit).await;
    assert_eq!(allowed, 100);
    assert_eq!(redis.script_calls().await - before, 300);
}

/// A key of `cluster` whose primary is (or, with `on` false, is not) the
/// one on `port`.
async fn key_where(cluster: &RedisCluster, name: &str, port: u16, on: bool) -> String {
    for i in 0.. {
        let key = format!("{name}-{i}");
        if (cluster.primary_for_key(&key).await.port == port) == on {
            return key;
        }
    }
    unreachable!("some key hashes there")
}

#[tokio::test]
async fn a_cluster_node_batch_stops_a_call_whose_keys_live_elsewhere_before_it_writes() {
    let cluster = RedisCluster::start().await;
    let here = cluster.primaries().await[0].port;
    let mut node = cluster.node_connection(here).await;
    let local = key_where(&cluster, "here", here, true).await;
    let also_local = key_where(&cluster, "also-here", here, true).await;
    let elsewhere = key_where(&cluster, "there", here, false).await;
    let limit = every_model_algorithm(5)[0];
    let call = |keys: &[&String], mode: Mode| {
        let limits: Vec<ScriptLimit<'_>> = keys
            .iter()
            .map(|key| ScriptLimit {
                key,
                algorithm: &limit,
                cost: 1,
                shadow: false,
            })
            .collect();
        script::decide_batchable(mode, &limits)
    };
    let decided = call(&[&local], Mode::Decide);
    let moved = call(&[&elsewhere], Mode::Decide);
    // Each on its own would spend the local key before reaching the other.
    let half_here = call(&[&also_local, &elsewhere], Mode::Each);
    let after = call(&[&local], Mode::Decide);
    let calls = [&decided, &moved, &half_here, &after];
    let batch = Batchable::together_on_node(&calls).expect("calls");
    let reply: Value = batch.invoke_async(&mut node).await.expect("the batch runs");
    let Some(replies) = Batchable::replies_of(&calls, reply.clone()) else {
        panic!("the batch replied {reply:?}");
    };
    let text = |reply: &Value| match reply {
        Value::BulkString(text) => String::from_utf8_lossy(text).into_owned(),
        other => panic!("expected an error's text, got {other:?}"),
    };
    // An allowed limit's first value is what remains.
    let remaining = |reply: &Value| match reply {
        Value::Array(values) => values[0].clone(),
        other => panic!("expected a decision, got {other:?}"),
    };
    assert_eq!(remaining(&replies[0]), Value::Int(4));
    assert!(
        text(&replies[1]).contains("non local key"),
        "{:?}",
        replies[1]
    );
    assert!(
        text(&replies[2]).contains("non local key"),
        "{:?}",
        replies[2]
    );
    assert_eq!(remaining(&replies[3]), Value::Int(3));
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&also_local)
        .query_async(&mut node)
        .await
        .expect("EXISTS");
    assert_eq!(exists, 0, "the stopped call wrote {also_local}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_a_cluster_node_refuses_goes_out_call_by_call() {
    // Out of memory, a node refuses a flagged script (the node batch
    // script) before it runs, while an unflagged one (the single script)
    // runs and fails only if it writes: a denial writes nothing. So every
    // caller of a refused batch still gets its denial, not the failure
    // policy's answer (`fail-open` would allow).
    let shared = Shared::cluster().await;
    let Shared::Cluster(cluster) = &shared else {
        unreachable!("a cluster")
    };
    let servers = shared.servers(1, &["--failure-policy", "fail-open"]).await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(servers[0].client().await);
    }
    let limit = fixed_window(3, Duration::from_secs(3600));
    let key = "refused";
    assert_eq!(
        allowed_of_concurrent_calls(&clients, 3, key, &limit).await,
        3
    );
    let primaries = cluster.primaries().await;
    for primary in &primaries {
        set_maxmemory(cluster, primary.port, "1").await;
    }
    let allowed = allowed_of_concurrent_calls(&clients, 200, key, &limit).await;
    let mut refused = 0;
    for primary in &primaries {
        let info: String = redis::cmd("INFO")
            .arg("errorstats")
            .query_async(&mut cluster.node_connection(primary.port).await)
            .await
            .expect("INFO errorstats");
        refused += info_field(&info, "errorstat_OOM")
            .and_then(|count| count.strip_prefix("count="))
            .map_or(0, |count| count.parse::<u64>().expect("a count"));
        set_maxmemory(cluster, primary.port, "0").await;
    }
    assert_eq!(allowed, 0, "calls of a refused batch were not decided");
    assert!(refused > 0, "no batch was refused");
}

async fn set_maxmemory(cluster: &RedisCluster, port: u16, bytes: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", bytes])
        .query_async(&mut cluster.node_connection(port).await)
        .await
        .expect("CONFIG SET maxmemory");
}

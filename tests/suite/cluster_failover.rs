//! A Redis Cluster primary SIGKILLed under load: how soon after its replica
//! says `role:master` ratelimitd decides that shard's keys again, and
//! whether the other shards' keys keep being decided meanwhile. One
//! instance has closed-loop load on keys of all three shards, another one
//! caller on the failed shard's keys. Only real answers count: the failure
//! policy is fail-closed, so a call Redis did not decide is UNAVAILABLE.
//!
//! The cluster keeps Redis's default `cluster-require-full-coverage yes`:
//! from the moment the nodes flag the primary failed until its replica
//! takes over, every node refuses every key (`CLUSTERDOWN`). That pause is
//! Redis's own; the test watches for it and does not count it against
//! ratelimitd.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::redis::{ClusterNode, RedisCluster, Role};
use common::{PATIENCE, ServerProcess, fixed_window, request};
use ratelimitd::limiter::{DEFAULT_KEY_PREFIX, storage_key};
use ratelimitd::pb::ratelimitd::v1::check_limit_request::Algorithm;
use ratelimitd::pb::ratelimitd::v1::rate_limiter_client::RateLimiterClient;
use tokio::sync::watch;
use tonic::transport::Channel;

/// Closed-loop callers on the loaded instance, on each shard's keys.
const CALLERS_PER_SHARD: usize = 3;

/// Keys per shard that a shard's callers take turns on.
const KEYS_PER_SHARD: usize = 4;

/// How long the load goes on once both instances decide the failed
/// shard's keys again: a pause on the other shards that comes late still
/// shows.
const AFTERWARDS: Duration = Duration::from_secs(1);

/// What is asked: the promoted replica decides within 1 s of its
/// promotion, and no other shard goes a second without a decision while
/// Redis would answer it. Generous for a loaded 2-core machine, where it
/// takes about 0.1 s (a breaker's trial interval, the command timeout).
const BOUND: Duration = Duration::from_secs(1);

/// A limit no caller reaches: every answer is a decision on Redis.
fn limit() -> Algorithm {
    fixed_window(1_000_000_000, Duration::from_secs(60))
}

/// One call: which shard its key is on, when it was asked and answered,
/// and whether Redis decided it.
#[derive(Clone, Copy)]
struct Call {
    shard: usize,
    asked: Instant,
    answered: Instant,
    decided: bool,
}

type Calls = Arc<Mutex<Vec<Call>>>;

/// What the cluster did, as seen by polling it.
struct Failover {
    /// When the replica first said `role:master`.
    promoted: Instant,
    /// From when to when a surviving primary said `cluster_state:fail`
    /// (refusing every key), if it did.
    refused: Option<(Instant, Instant)>,
}

/// `KEYS_PER_SHARD` keys for each primary, in the order of `primaries`,
/// found by the slot of their storage key.
async fn keys_per_shard(cluster: &RedisCluster, primaries: &[ClusterNode]) -> Vec<Vec<String>> {
    let mut shards = vec![Vec::new(); primaries.len()];
    let mut i = 0;
    while shards.iter().any(|keys| keys.len() < KEYS_PER_SHARD) {
        let key = format!("failover-{i}");
        i += 1;
        let model = ratelimitd::api::check::limit_request(request(&key, limit(), None))
            .expect("a valid request");
        let stored = storage_key(DEFAULT_KEY_PREFIX, &model.algorithm, &model.key);
        let slot = cluster.slot_of(&stored).await;
        let shard = primaries
            .iter()
            .position(|primary| primary.owns_slot(slot))
            .unwrap_or_else(|| panic!("no primary serves slot {slot}"));
        if shards[shard].len() < KEYS_PER_SHARD {
            shards[shard].push(key);
        }
    }
    shards
}

/// Whether Redis decided a call: fail-closed answers anything else with
/// UNAVAILABLE, and nothing here may be degraded.
async fn decide(client: &mut RateLimiterClient<Channel>, key: &str) -> bool {
    match client.check_limit(request(key, limit(), Some(1))).await {
        Ok(answer) => !answer.into_inner().degraded,
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            false
        }
    }
}

/// Starts `callers` loops on each (shard, keys) of `shards`, each going
/// round that shard's keys and waiting `pause` between calls, recording
/// every call, until `stop`. A caller keeps to one shard, so that the
/// other shards' callers never all wait on the failed one.
fn load(
    client: &RateLimiterClient<Channel>,
    shards: &[(usize, Vec<String>)],
    callers: usize,
    pause: Duration,
    stop: &watch::Receiver<bool>,
) -> (Calls, Vec<tokio::task::JoinHandle<()>>) {
    let calls: Calls = Arc::default();
    let mut tasks = Vec::new();
    for (shard, keys) in shards {
        for caller in 0..callers {
            let (mut client, keys, calls, stop) =
                (client.clone(), keys.clone(), calls.clone(), stop.clone());
            let shard = *shard;
            tasks.push(tokio::spawn(async move {
                for key in keys.iter().cycle().skip(caller) {
                    if *stop.borrow() {
                        break;
                    }
                    let asked = Instant::now();
                    let decided = decide(&mut client, key).await;
                    let answered = Instant::now();
                    calls.lock().expect("calls").push(Call {
                        shard,
                        asked,
                        answered,
                        decided,
                    });
                    if !pause.is_zero() {
                        tokio::time::sleep(pause).await;
                    }
                }
            }));
        }
    }
    (calls, tasks)
}

/// Polls the replica's `INFO replication` and a surviving primary's
/// `CLUSTER INFO` every 5 ms until the replica says `role:master` and the
/// survivor `cluster_state:ok` again.
async fn watch_failover(cluster: &RedisCluster, replica: u16, survivor: u16) -> Failover {
    let mut replica = cluster.node_connection(replica).await;
    let mut survivor = cluster.node_connection(survivor).await;
    let (mut promoted, mut refused_from, mut refused_until) = (None, None, None);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = Instant::now();
        let role: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut replica)
            .await
            .unwrap_or_default();
        if promoted.is_none() && role.lines().any(|line| line.trim_end() == "role:master") {
            promoted = Some(now);
        }
        let state: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut survivor)
            .await
            .expect("the surviving primary answers CLUSTER INFO");
        let ok = state
            .lines()
            .any(|line| line.trim_end() == "cluster_state:ok");
        if !ok && refused_from.is_none() {
            refused_from = Some(now);
        }
        if ok && refused_from.is_some() && refused_until.is_none() {
            refused_until = Some(now);
        }
        if let Some(promoted) = promoted
            && ok
        {
            return Failover {
                promoted,
                refused: refused_from.zip(refused_until),
            };
        }
        assert!(Instant::now() < deadline, "no failover: {role}\n{state}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The first decision on `shard` asked after `since`, waited for.
async fn first_decision(calls: &Calls, shard: usize, since: Instant, who: &str) -> Instant {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let first = calls
            .lock()
            .expect("calls")
            .iter()
            .filter(|call| call.shard == shard && call.decided && call.asked > since)
            .map(|call| call.answered)
            .min();
        if let Some(at) = first {
            return at;
        }
        assert!(Instant::now() < deadline, "{who} never decided again");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The longest time the shards other than `failed` went without a
/// decision from `from` to `to`, less any part of it when Redis refused
/// every key (`refused`).
fn longest_gap_elsewhere(
    calls: &Calls,
    failed: usize,
    (from, to): (Instant, Instant),
    refused: Option<(Instant, Instant)>,
) -> Duration {
    let mut answered: Vec<Instant> = calls
        .lock()
        .expect("calls")
        .iter()
        .filter(|call| call.shard != failed && call.decided && call.answered <= to)
        .map(|call| call.answered)
        .collect();
    answered.sort();
    let first = answered
        .iter()
        .rposition(|at| *at <= from)
        .expect("the other shards decided before the kill");
    answered.push(to);
    answered[first..]
        .windows(2)
        .map(|pair| {
            let overlap = refused.map_or(Duration::ZERO, |(start, end)| {
                end.min(pair[1])
                    .saturating_duration_since(start.max(pair[0]))
            });
            (pair[1] - pair[0]).saturating_sub(overlap)
        })
        .max()
        .unwrap_or_default()
}

fn millis(duration: Duration) -> String {
    format!("{:.0} ms", duration.as_secs_f64() * 1000.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_promoted_replica_decides_within_a_second_and_other_shards_never_wait() {
    let mut cluster = RedisCluster::start().await;
    let primaries = cluster.primaries().await;
    let shards = keys_per_shard(&cluster, &primaries).await;
    let failed = 0;
    let replica = cluster
        .nodes()
        .await
        .into_iter()
        .find(|node| {
            node.role == Role::Replica && node.primary_id == Some(primaries[failed].id.clone())
        })
        .expect("the primary has a replica");
    let seeds = cluster.urls().join(",");
    let flags = [
        "--redis-mode",
        "cluster",
        "--redis-url",
        &seeds,
        "--failure-policy",
        "fail-closed",
    ];
    let loaded = ServerProcess::builder()
        .flags(&flags)
        .logged()
        .start()
        .await;
    let light = ServerProcess::builder()
        .flags(&flags)
        .logged()
        .start()
        .await;

    let (stop, stopped) = watch::channel(false);
    let everywhere: Vec<_> = shards.iter().cloned().enumerate().collect();
    let (calls, mut tasks) = load(
        &loaded.client().await,
        &everywhere,
        CALLERS_PER_SHARD,
        Duration::ZERO,
        &stopped,
    );
    let one_shard = [(failed, shards[failed].clone())];
    let (light_calls, light_tasks) = load(
        &light.client().await,
        &one_shard,
        1,
        Duration::from_millis(10),
        &stopped,
    );
    tasks.extend(light_tasks);
    let warm = Instant::now();
    first_decision(&calls, failed, warm, "the loaded instance").await;
    first_decision(&light_calls, failed, warm, "the lightly loaded instance").await;

    cluster.kill_primary(failed).await;
    let killed = Instant::now();
    let failover = watch_failover(&cluster, replica.port, primaries[1].port).await;
    let loaded_decides = first_decision(&calls, failed, killed, "the loaded instance").await;
    let light_decides = first_decision(&light_calls, failed, killed, "the light one").await;
    tokio::time::sleep(AFTERWARDS).await;
    let end = Instant::now();
    stop.send(true).expect("the callers listen");
    for task in tasks {
        task.await.expect("no caller panicked");
    }
    let gap = longest_gap_elsewhere(&calls, failed, (killed, end), failover.refused);
    let promoted = failover.promoted;
    let (loaded_after, light_after) = (
        loaded_decides.saturating_duration_since(promoted),
        light_decides.saturating_duration_since(promoted),
    );
    let refused = failover
        .refused
        .map_or("never".to_owned(), |(from, until)| {
            format!(
                "from {} to {} after the kill",
                millis(from - killed),
                millis(until - killed)
            )
        });
    eprintln!(
        "cluster failover: role:master {} after the kill; the failed shard decided again {} \
         after the promotion under load ({CALLERS_PER_SHARD} callers per shard, {} calls), {} \
         with one caller; the other shards' longest gap {} (not counting Redis refusing every \
         key: {refused})",
        millis(promoted - killed),
        millis(loaded_after),
        calls.lock().expect("calls").len(),
        millis(light_after),
        millis(gap),
    );
    let log = || format!("the loaded instance's log:\n{}", loaded.log());
    assert!(
        loaded_after < BOUND,
        "under load, {} after the promotion; {}",
        millis(loaded_after),
        log()
    );
    assert!(
        light_after < BOUND,
        "with one caller, {} after the promotion",
        millis(light_after)
    );
    assert!(
        gap < BOUND,
        "the other shards waited {} for nothing; {}",
        millis(gap),
        log()
    );
}

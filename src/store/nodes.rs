//! What stands in front of each Redis node: a circuit breaker and the
//! queue of calls waiting to go out to it in a batch ([`Node`]). One for a
//! standalone Redis (or the primary Sentinels name); on a Redis Cluster,
//! one per primary, found by a key's hash slot, so that a node that fails
//! opens the breaker of its own keys only, every other node's keys still
//! decided meanwhile, and a batch holds one node's calls. Which primary
//! serves which hash slot is learnt from `CLUSTER SLOTS` at each health
//! probe; until the first answer, one node stands for every slot (its
//! batches then go where their first key lives, and a call whose keys live
//! elsewhere goes out again on its own: see `batch`).
//!
//! A node's breaker lets a trial call through every so often while open
//! (see `breaker`): the probe's `PING` goes to every primary, so it cannot
//! close one node's breaker while another node is down, and after a
//! failover the replica that took over answers the first trial.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::Value;

use super::batch::Batcher;
use super::breaker::CircuitBreaker;
use crate::worker::PerThread;

/// Hash slots in a Redis Cluster.
const SLOTS: usize = 16384;

/// One Redis node's breaker and batch queue.
pub(super) struct Node {
    pub(super) breaker: CircuitBreaker,
    /// Each worker thread's queue: a thread's calls batch with its own
    /// calls, and the driver that sends them runs on that thread, so a
    /// batch's reply wakes no other thread.
    pub(super) batchers: PerThread<Batcher>,
}

impl Node {
    fn new(breaker: CircuitBreaker, batch_calls: usize) -> Arc<Self> {
        Arc::new(Self {
            breaker,
            batchers: PerThread::new(|| Batcher::new(batch_calls)),
        })
    }
}

/// The nodes of a Redis: one, or a Cluster's primaries.
pub(super) enum Nodes {
    /// A standalone Redis, or the primary Sentinels name: its breaker is
    /// closed by the health probe.
    One(Arc<Node>),
    /// A Cluster's primaries, found by the key's slot.
    PerPrimary(ClusterNodes),
}

impl Nodes {
    /// One node, whose breaker opens after `threshold` failures in a row,
    /// batching up to `batch_calls` calls.
    pub(super) fn one(threshold: u32, batch_calls: usize) -> Self {
        Self::One(Node::new(CircuitBreaker::new(threshold), batch_calls))
    }

    /// The node a call on `key` goes to.
    pub(super) fn for_key(&self, key: &str) -> Arc<Node> {
        match self {
            Self::One(node) => Arc::clone(node),
            Self::PerPrimary(nodes) => nodes.for_key(key.as_bytes()),
        }
    }

    /// Do calls go out in batches? Unless batches are of one call, or on
    /// a Cluster whose nodes cannot run the node batch script.
    pub(super) fn batch(&self) -> bool {
        match self {
            Self::One(node) => node.batchers.get().batches(),
            Self::PerPrimary(nodes) => {
                nodes.batch_calls > 1 && nodes.batching.load(Ordering::Relaxed)
            }
        }
    }
}

/// A Redis Cluster's primaries, found by a key's hash slot.
pub(super) struct ClusterNodes {
    table: ArcSwap<SlotTable>,
    threshold: u32,
    trial_every: Duration,
    batch_calls: usize,
    /// Cleared for good when a node cannot compile the node batch script
    /// (its first line, the script's flags, is Redis 7's): every call then
    /// goes out on its own.
    batching: AtomicBool,
}

/// Who serves each slot, as last learnt.
struct SlotTable {
    /// For each slot, its primary's place in `nodes`.
    owner: Box<[u16]>,
    /// `host:port` of each primary (empty for the stand-in for all of
    /// them), with its node.
    nodes: Vec<(String, Arc<Node>)>,
}

impl ClusterNodes {
    /// Nodes whose breakers open after `threshold` failures in a row, and
    /// let a trial through every `trial_every` while open, batching up to
    /// `batch_calls` calls.
    pub(super) fn new(threshold: u32, trial_every: Duration, batch_calls: usize) -> Self {
        let everyone = (
            String::new(),
            Self::node(threshold, trial_every, batch_calls),
        );
        Self {
            table: ArcSwap::from_pointee(SlotTable {
                owner: vec![0; SLOTS].into_boxed_slice(),
                nodes: vec![everyone],
            }),
            threshold,
            trial_every,
            batch_calls,
            batching: AtomicBool::new(true),
        }
    }

    /// Calls go out one by one from now on (see `batching`).
    pub(super) fn stop_batching(&self) {
        self.batching.store(false, Ordering::Relaxed);
    }

    fn node(threshold: u32, trial_every: Duration, batch_calls: usize) -> Arc<Node> {
        Node::new(
            CircuitBreaker::with_trials(threshold, trial_every),
            batch_calls,
        )
    }

    /// The node that serves `key`'s slot.
    pub(super) fn for_key(&self, key: &[u8]) -> Arc<Node> {
        let table = self.table.load();
        let node = table.owner[usize::from(slot(key))];
        Arc::clone(&table.nodes[usize::from(node)].1)
    }

    /// Every node answered (the probe's `PING`): every breaker closes.
    pub(super) fn record_success(&self) {
        for (_, node) in &self.table.load().nodes {
            node.breaker.record_success();
        }
    }

    /// Takes in a `CLUSTER SLOTS` reply. A primary already known keeps its
    /// node (its breaker open or not, its queue); a new one gets a closed
    /// breaker; slots no one serves keep the stand-in's.
    pub(super) fn learn(&self, reply: &Value) -> Result<(), String> {
        let ranges = primaries(reply)?;
        let old = self.table.load();
        let mut nodes = vec![old.nodes[0].clone()];
        let mut owner = vec![0u16; SLOTS].into_boxed_slice();
        for (first, last, address) in ranges {
            let index = match nodes.iter().position(|(known, _)| *known == address) {
                Some(index) => index,
                None => {
                    let node = old
                        .nodes
                        .iter()
                        .find(|(known, _)| *known == address)
                        .map(|(_, node)| Arc::clone(node))
                        .unwrap_or_else(|| {
                            Self::node(self.threshold, self.trial_every, self.batch_calls)
                        });
                    nodes.push((address, node));
                    nodes.len() - 1
                }
            };
            let index = u16::try_from(index).map_err(|_| "over 65535 primaries".to_owned())?;
            owner[usize::from(first)..=usize::from(last)].fill(index);
        }
        self.table.store(Arc::new(SlotTable { owner, nodes }));
        Ok(())
    }
}

/// A key's hash slot, as Redis Cluster computes it: CRC16 (XMODEM) of the
/// key's hash tag (what is between its first `{` and the next `}`, if not
/// empty), else of the whole key, modulo 16384.
fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&byte| byte == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&byte| byte == b'}')
                .map(|close| &rest[..close])
        })
        .filter(|tag| !tag.is_empty())
        .unwrap_or(key);
    crc16::State::<crc16::XMODEM>::calculate(tagged) % SLOTS as u16
}

/// The slot ranges of a `CLUSTER SLOTS` reply, each with its primary's
/// `host:port`.
fn primaries(reply: &Value) -> Result<Vec<(u16, u16, String)>, String> {
    let Value::Array(entries) = reply else {
        return Err(format!("CLUSTER SLOTS answered {reply:?}"));
    };
    entries
        .iter()
        .map(|entry| match entry {
            Value::Array(fields) => match fields.as_slice() {
                [
                    Value::Int(first),
                    Value::Int(last),
                    Value::Array(primary),
                    ..,
                ] => {
                    let slot = |value: i64| {
                        u16::try_from(value)
                            .ok()
                            .filter(|slot| usize::from(*slot) < SLOTS)
                            .ok_or_else(|| format!("slot {value} in CLUSTER SLOTS"))
                    };
                    let (first, last) = (slot(*first)?, slot(*last)?);
                    if first > last {
                        return Err(format!("slots {first}-{last} in CLUSTER SLOTS"));
                    }
                    Ok((first, last, address(primary)?))
                }
                _ => Err(format!("CLUSTER SLOTS entry {entry:?}")),
            },
            _ => Err(format!("CLUSTER SLOTS entry {entry:?}")),
        })
        .collect()
}

/// `host:port` of a node in a `CLUSTER SLOTS` entry.
fn address(node: &[Value]) -> Result<String, String> {
    match node {
        [Value::BulkString(host), Value::Int(port), ..] => {
            Ok(format!("{}:{port}", String::from_utf8_lossy(host)))
        }
        [Value::SimpleString(host), Value::Int(port), ..] => Ok(format!("{host}:{port}")),
        _ => Err(format!("CLUSTER SLOTS node {node:?}")),
    }
}

#[cfg(test)]
mod tests {
    use redis::cluster_routing::Slot;

    use super::*;

    fn node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"0123456789abcdef".to_vec()),
        ])
    }

    fn slots(ranges: &[(i64, i64, i64)]) -> Value {
        Value::Array(
            ranges
                .iter()
                .map(|&(first, last, port)| {
                    Value::Array(vec![
                        Value::Int(first),
                        Value::Int(last),
                        node("10.0.0.1", port),
                        node("10.0.0.2", port + 1),
                    ])
                })
                .collect(),
        )
    }

    /// A key whose slot is in `range`.
    fn key_in(range: std::ops::RangeInclusive<u16>) -> String {
        (0..)
            .map(|i| format!("k{i}"))
            .find(|key| range.contains(&slot(key.as_bytes())))
            .expect("some key hashes there")
    }

    #[test]
    fn slots_are_redis_clusters() {
        // Redis's documentation: CRC16 of "123456789" is 0x31C3.
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}".as_slice()));
        for key in ["", "a", "ratelimitd:{fw:user42}", "{}", "x{y}z{w}", "{{a}}"] {
            assert_eq!(
                Slot::new(slot(key.as_bytes())),
                Some(Slot::for_key(key)),
                "{key:?}"
            );
        }
    }

    #[test]
    fn one_stand_in_breaker_until_the_slots_are_known() {
        let nodes = ClusterNodes::new(1, Duration::from_secs(60), 64);
        nodes.for_key(b"a").breaker.record_failure();
        assert!(!nodes.for_key(b"b").breaker.allows());
        nodes.record_success();
        assert!(nodes.for_key(b"b").breaker.allows());
    }

    #[test]
    fn a_failing_node_opens_its_own_keys_breaker_only() {
        let nodes = ClusterNodes::new(2, Duration::from_secs(60), 64);
        nodes
            .learn(&slots(&[
                (0, 5460, 7000),
                (5461, 10922, 7002),
                (10923, 16383, 7004),
            ]))
            .expect("learnt");
        let (failing, other) = (key_in(0..=5460), key_in(5461..=10922));
        nodes.for_key(failing.as_bytes()).breaker.record_failure();
        nodes.for_key(failing.as_bytes()).breaker.record_failure();
        assert!(!nodes.for_key(key_in(0..=5460).as_bytes()).breaker.allows());
        assert!(nodes.for_key(other.as_bytes()).breaker.allows());
        assert!(
            nodes
                .for_key(key_in(10923..=16383).as_bytes())
                .breaker
                .allows()
        );

        // Learnt again, the same node keeps its open breaker; when its
        // replica (a new address) serves its slots, they have a closed one.
        nodes
            .learn(&slots(&[(0, 5460, 7000), (5461, 16383, 7002)]))
            .expect("learnt");
        assert!(!nodes.for_key(failing.as_bytes()).breaker.allows());
        nodes
            .learn(&slots(&[(0, 5460, 7001), (5461, 16383, 7002)]))
            .expect("learnt");
        assert!(nodes.for_key(failing.as_bytes()).breaker.allows());
    }

    #[test]
    fn slots_no_one_serves_keep_the_stand_in() {
        let nodes = ClusterNodes::new(1, Duration::from_secs(60), 64);
        nodes.learn(&slots(&[(0, 99, 7000)])).expect("learnt");
        nodes
            .for_key(key_in(100..=16383).as_bytes())
            .breaker
            .record_failure();
        assert!(nodes.for_key(key_in(0..=99).as_bytes()).breaker.allows());
        assert!(
            !nodes
                .for_key(key_in(200..=16383).as_bytes())
                .breaker
                .allows()
        );
    }

    #[test]
    fn a_malformed_reply_is_refused_and_changes_nothing() {
        let nodes = ClusterNodes::new(1, Duration::from_secs(60), 64);
        for reply in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            slots(&[(0, 16384, 7000)]),
            slots(&[(10, 5, 7000)]),
        ] {
            assert!(nodes.learn(&reply).is_err(), "{reply:?}");
        }
        nodes.for_key(b"a").breaker.record_failure();
        assert!(!nodes.for_key(b"b").breaker.allows());
    }
}

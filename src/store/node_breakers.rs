//! The circuit breakers of a Redis Cluster: one per primary, so that a
//! node that fails opens the breaker of its own keys only, and every other
//! node's keys are still decided meanwhile. Which primary serves which hash
//! slot is learnt from `CLUSTER SLOTS` at each health probe; until the
//! first answer, one breaker stands for every slot.
//!
//! A node's breaker lets a trial call through every so often while open
//! (see `breaker`): the probe's `PING` goes to every primary, so it cannot
//! close one node's breaker while another node is down, and after a
//! failover the replica that took over answers the first trial.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::Value;

use super::breaker::CircuitBreaker;

/// Hash slots in a Redis Cluster.
const SLOTS: usize = 16384;

/// One breaker per primary, found by a key's hash slot.
pub(super) struct NodeBreakers {
    table: ArcSwap<SlotTable>,
    threshold: u32,
    trial_every: Duration,
}

/// Who serves each slot, as last learnt.
struct SlotTable {
    /// For each slot, its primary's place in `nodes`.
    owner: Box<[u16]>,
    /// `host:port` of each primary (empty for the stand-in for all of
    /// them), with its breaker.
    nodes: Vec<(String, Arc<CircuitBreaker>)>,
}

impl NodeBreakers {
    /// Breakers that open after `threshold` failures in a row on a node,
    /// and let a trial through every `trial_every` while open.
    pub(super) fn new(threshold: u32, trial_every: Duration) -> Self {
        let everyone = (
            String::new(),
            Arc::new(CircuitBreaker::with_trials(threshold, trial_every)),
        );
        Self {
            table: ArcSwap::from_pointee(SlotTable {
                owner: vec![0; SLOTS].into_boxed_slice(),
                nodes: vec![everyone],
            }),
            threshold,
            trial_every,
        }
    }

    /// The breaker of the node that serves `key`'s slot.
    pub(super) fn for_key(&self, key: &[u8]) -> Arc<CircuitBreaker> {
        let table = self.table.load();
        let node = table.owner[usize::from(slot(key))];
        Arc::clone(&table.nodes[usize::from(node)].1)
    }

    /// Every node answered (the probe's `PING`): every breaker closes.
    pub(super) fn record_success(&self) {
        for (_, breaker) in &self.table.load().nodes {
            breaker.record_success();
        }
    }

    /// Takes in a `CLUSTER SLOTS` reply. A primary already known keeps its
    /// breaker (open or not); a new one gets a closed breaker; slots no one
    /// serves keep the stand-in's.
    pub(super) fn learn(&self, reply: &Value) -> Result<(), String> {
        let ranges = primaries(reply)?;
        let old = self.table.load();
        let mut nodes = vec![old.nodes[0].clone()];
        let mut owner = vec![0u16; SLOTS].into_boxed_slice();
        for (first, last, address) in ranges {
            let index = match nodes.iter().position(|(known, _)| *known == address) {
                Some(index) => index,
                None => {
                    let breaker = old
                        .nodes
                        .iter()
                        .find(|(known, _)| *known == address)
                        .map(|(_, breaker)| Arc::clone(breaker))
                        .unwrap_or_else(|| {
                            Arc::new(CircuitBreaker::with_trials(
                                self.threshold,
                                self.trial_every,
                            ))
                        });
                    nodes.push((address, breaker));
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
        let breakers = NodeBreakers::new(1, Duration::from_secs(60));
        breakers.for_key(b"a").record_failure();
        assert!(!breakers.for_key(b"b").allows());
        breakers.record_success();
        assert!(breakers.for_key(b"b").allows());
    }

    #[test]
    fn a_failing_node_opens_its_own_keys_breaker_only() {
        let breakers = NodeBreakers::new(2, Duration::from_secs(60));
        breakers
            .learn(&slots(&[
                (0, 5460, 7000),
                (5461, 10922, 7002),
                (10923, 16383, 7004),
            ]))
            .expect("learnt");
        let (failing, other) = (key_in(0..=5460), key_in(5461..=10922));
        breakers.for_key(failing.as_bytes()).record_failure();
        breakers.for_key(failing.as_bytes()).record_failure();
        assert!(!breakers.for_key(key_in(0..=5460).as_bytes()).allows());
        assert!(breakers.for_key(other.as_bytes()).allows());
        assert!(breakers.for_key(key_in(10923..=16383).as_bytes()).allows());

        // Learnt again, the same node keeps its open breaker; when its
        // replica (a new address) serves its slots, they have a closed one.
        breakers
            .learn(&slots(&[(0, 5460, 7000), (5461, 16383, 7002)]))
            .expect("learnt");
        assert!(!breakers.for_key(failing.as_bytes()).allows());
        breakers
            .learn(&slots(&[(0, 5460, 7001), (5461, 16383, 7002)]))
            .expect("learnt");
        assert!(breakers.for_key(failing.as_bytes()).allows());
    }

    #[test]
    fn slots_no_one_serves_keep_the_stand_in() {
        let breakers = NodeBreakers::new(1, Duration::from_secs(60));
        breakers.learn(&slots(&[(0, 99, 7000)])).expect("learnt");
        breakers
            .for_key(key_in(100..=16383).as_bytes())
            .record_failure();
        assert!(breakers.for_key(key_in(0..=99).as_bytes()).allows());
        assert!(!breakers.for_key(key_in(200..=16383).as_bytes()).allows());
    }

    #[test]
    fn a_malformed_reply_is_refused_and_changes_nothing() {
        let breakers = NodeBreakers::new(1, Duration::from_secs(60));
        for reply in [
            Value::Nil,
            Value::Array(vec![Value::Int(1)]),
            slots(&[(0, 16384, 7000)]),
            slots(&[(10, 5, 7000)]),
        ] {
            assert!(breakers.learn(&reply).is_err(), "{reply:?}");
        }
        breakers.for_key(b"a").record_failure();
        assert!(!breakers.for_key(b"b").allows());
    }
}

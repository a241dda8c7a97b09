//! Deciding a request's groups of limits on Redis: one script on one node,
//! or, on a Redis Cluster where the keys live on several nodes, a dry
//! decision everywhere, then spending everywhere, with refunds when a node
//! denies after another has spent.

use std::collections::HashMap;

use futures::future::join_all;

use super::{Combination, Groups};
use crate::algorithm::{self, REFUND_SCRIPT, SCRIPT, ScriptMode};
use crate::error::StoreError;
use crate::limit::{Decision, LimitRequest};
use crate::store::RedisStore;

/// The most limits one script call decides. Each costs the script a few
/// Redis commands (tens of microseconds at most), so a call stays well
/// inside any sane `--redis-command-timeout` and does not hold a Redis node
/// from other callers for long; `ShouldRateLimit` at its default bounds
/// (64 descriptors) fits in one call.
pub(super) const MAX_LIMITS_PER_SCRIPT: usize = 64;

/// Decides the groups on Redis: one script call when every key lives on
/// one node. On a Redis Cluster, where a request's keys can hash to several
/// nodes and no script may span them, all or nothing takes three steps:
/// every node says what it would answer (writing nothing); if any limit
/// would deny, nothing is spent; else every node spends (atomically on its
/// own), and if one now denies (another request took the units in between),
/// the nodes that spent give it back. No limit ever admits more than it
/// allows; a request denied that way held units only between its spend and
/// its refund.
///
/// Each on its own ([`Combination::Each`]) needs none of that: every
/// script decides its limits in `each` mode.
pub(super) async fn decide(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
    combination: Combination,
) -> Result<Vec<Decision>, StoreError> {
    let partitions = script_partitions(redis, groups, 0..groups.unique.len());
    if combination == Combination::Each {
        let decided = on_every_node(
            redis,
            groups,
            requests,
            &partitions,
            ScriptMode::Each,
            false,
        )
        .await?;
        return decided
            .into_iter()
            .map(|decided| {
                decided
                    .map(|(decision, _)| decision)
                    .ok_or_else(|| StoreError::Reply("a limit was not decided".into()))
            })
            .collect();
    }
    if let [everyone] = partitions.as_slice() {
        let decided =
            run_decide(redis, groups, requests, everyone, ScriptMode::Decide, false).await?;
        return Ok(decided.into_iter().map(|(decision, _)| decision).collect());
    }
    let everywhere = |mode, look| on_every_node(redis, groups, requests, &partitions, mode, look);
    let denies = |result: &[Option<(Decision, i64)>]| {
        groups
            .unique
            .iter()
            .zip(result)
            .any(|(group, decided)| !group.shadow && decided.is_some_and(|(d, _)| !d.allowed))
    };
    let result = everywhere(ScriptMode::Dry, false).await?;
    if denies(&result) {
        // Nothing is spent; the limits that would allow report what they have.
        let looks = everywhere(ScriptMode::Dry, true).await?;
        return Ok(result
            .into_iter()
            .zip(looks)
            .filter_map(|(dry, look)| match dry? {
                (decision, _) if !decision.allowed => Some(decision),
                _ => look.map(|(decision, _)| decision),
            })
            .collect());
    }
    let result = everywhere(ScriptMode::Decide, false).await?;
    if !denies(&result) {
        return Ok(result.into_iter().flatten().map(|(d, _)| d).collect());
    }
    // A node denied after others spent: those give the units back. A node
    // spent only if none of its own enforcing limits denied (otherwise its
    // allowing limits answered with a look, spending nothing).
    let mut refunded = vec![false; groups.unique.len()];
    for members in &partitions {
        let spent_here = members
            .iter()
            .all(|&g| groups.unique[g].shadow || result[g].is_some_and(|(d, _)| d.allowed));
        if spent_here {
            refund(redis, groups, requests, members, &result).await?;
            for &g in members {
                refunded[g] = true;
            }
        }
    }
    Ok(result
        .into_iter()
        .zip(&groups.unique)
        .zip(refunded)
        .filter_map(|((decided, group), refunded)| {
            let (decision, _) = decided?;
            Some(if decision.allowed && refunded {
                // Given back: what is left is as before this request.
                Decision {
                    remaining: decision.remaining + group.cost,
                    ..decision
                }
            } else {
                decision
            })
        })
        .collect())
}

/// What the groups `members` answer in a request that a cached denial of
/// another of its limits denies: each one's denial of its cost, or, if it
/// would allow, what it has; nothing is written. One read-only script per
/// node, in parallel. One answer per member, in order.
pub(super) async fn answer_denied(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
    members: &[usize],
) -> Result<Vec<Decision>, StoreError> {
    let partitions = script_partitions(redis, groups, members.iter().copied());
    let mut answered = on_every_node(
        redis,
        groups,
        requests,
        &partitions,
        ScriptMode::Denied,
        false,
    )
    .await?;
    members
        .iter()
        .map(|&g| {
            answered[g]
                .take()
                .map(|(decision, _)| decision)
                .ok_or_else(|| StoreError::Reply("a limit was not answered".into()))
        })
        .collect()
}

/// The scripts that decide the groups `members`: on a Redis Cluster one
/// per slot (no script may span nodes), and, since a script blocks its
/// node while it runs, none of more than MAX_LIMITS_PER_SCRIPT limits.
fn script_partitions(
    redis: &RedisStore,
    groups: &Groups,
    members: impl IntoIterator<Item = usize>,
) -> Vec<Vec<usize>> {
    let partitions = if redis.is_cluster() {
        groups.by_slot(members)
    } else {
        vec![members.into_iter().collect()]
    };
    partitions
        .iter()
        .flat_map(|members| members.chunks(MAX_LIMITS_PER_SCRIPT).map(<[usize]>::to_vec))
        .collect()
}

/// Runs the decision script in `mode` for every partition at once; what
/// each group got, by group index (`None` for groups in no partition).
async fn on_every_node(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
    partitions: &[Vec<usize>],
    mode: ScriptMode,
    look: bool,
) -> Result<Vec<Option<(Decision, i64)>>, StoreError> {
    let replies = join_all(
        partitions
            .iter()
            .map(|members| run_decide(redis, groups, requests, members, mode, look)),
    )
    .await;
    let mut result = vec![None; groups.unique.len()];
    for (members, reply) in partitions.iter().zip(replies) {
        for (&g, decided) in members.iter().zip(reply?) {
            result[g] = Some(decided);
        }
    }
    Ok(result)
}

/// One call of the decision script for the groups `members` (all on one
/// node); with `look`, every cost is 0.
async fn run_decide(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
    members: &[usize],
    mode: ScriptMode,
    look: bool,
) -> Result<Vec<(Decision, i64)>, StoreError> {
    let mut invocation = SCRIPT.prepare_invoke();
    for &g in members {
        let group = &groups.unique[g];
        invocation.key(group.key.as_str());
        let cost = if look { 0 } else { group.cost };
        algorithm::push_script_args(
            &mut invocation,
            &requests[group.first].algorithm,
            cost,
            i64::from(group.shadow),
        );
    }
    invocation.arg(mode.arg());
    let reply: Vec<i64> = redis.run_script(&invocation).await?;
    if reply.len() != 5 * members.len() {
        return Err(StoreError::Reply(format!(
            "script replied {} values for {} limits",
            reply.len(),
            members.len()
        )));
    }
    members
        .iter()
        .zip(reply.chunks(5))
        .map(|(&g, part)| {
            let limit = requests[groups.unique[g].first].algorithm.limit();
            algorithm::decision_from_reply(limit, part).map_err(StoreError::Reply)
        })
        .collect()
}

/// Gives back what the groups `members` (all on one node) spent.
async fn refund(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
    members: &[usize],
    spent: &[Option<(Decision, i64)>],
) -> Result<(), StoreError> {
    let mut invocation = REFUND_SCRIPT.prepare_invoke();
    let mut any = false;
    for &g in members {
        let group = &groups.unique[g];
        let Some((decision, mark)) = spent[g] else {
            continue;
        };
        if !decision.allowed || group.cost == 0 {
            continue;
        }
        invocation.key(group.key.as_str());
        algorithm::push_script_args(
            &mut invocation,
            &requests[group.first].algorithm,
            group.cost,
            mark,
        );
        any = true;
    }
    if any {
        let _refunded: i64 = redis.run_script(&invocation).await?;
    }
    Ok(())
}

impl Groups {
    /// The groups `members` by Redis Cluster slot: each inner list can go
    /// to one node in one script.
    fn by_slot(&self, members: impl IntoIterator<Item = usize>) -> Vec<Vec<usize>> {
        // In order of first appearance, so a call's scripts are stable.
        let mut position_of_slot: HashMap<u16, usize> = HashMap::new();
        let mut slots: Vec<Vec<usize>> = Vec::new();
        for g in members {
            let slot = cluster_slot(&self.unique[g].key);
            let position = *position_of_slot.entry(slot).or_insert_with(|| {
                slots.push(Vec::new());
                slots.len() - 1
            });
            slots[position].push(g);
        }
        slots
    }
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag, or of
/// the whole key without one, modulo 16384.
fn cluster_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|&b| b == b'}')?;
        // `{}` is no tag: the whole key counts.
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes)) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_redis_cluster_hashing() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(cluster_slot("123456789"), 0x31C3);
        assert_eq!(
            cluster_slot("{user1000}.following"),
            cluster_slot("user1000")
        );
        assert_eq!(cluster_slot("foo{{bar}}zap"), cluster_slot("{bar"));
        // An empty first tag means no tag: the whole key is hashed.
        assert_ne!(cluster_slot("foo{}{bar}"), cluster_slot("bar"));
    }
}

//! Deciding a request's groups of limits on Redis: one script on one node,
//! or, on a Redis Cluster where the keys live on several nodes, a dry
//! decision everywhere, then spending everywhere, with refunds when a node
//! denies after another has spent.

use super::keys::{Combination, Group, GroupDecisions, Groups};
use super::script::{self, Decided, MAX_LIMITS_PER_SCRIPT, Mode, ScriptLimit, SpendMark};
use crate::algorithm::LimitRequest;
use crate::error::StoreError;
use crate::limit::Decision;
use crate::store::RedisStore;
use futures::future::join_all;

/// Decides the groups on Redis: one script call when every key lives on
/// one node, all or nothing inside `decide.lua`. On a Redis Cluster, where
/// a request's keys can hash to several nodes and no script may span them,
/// all or nothing takes three steps: every node says what it would answer
/// (writing nothing); if any limit would deny, nothing is spent; else every
/// node spends (atomically on its own), and if one now denies (another
/// request took the units in between), the nodes that spent give it back.
/// No limit ever admits more than it allows; a request denied that way held
/// units only between its spend and its refund. (This is the third form of
/// all or nothing, beside `decide.lua`'s and its twin
/// `algorithm::decide_together`: it is what remains possible across
/// nodes, where no one script sees every key.)
///
/// Each on its own ([`Combination::Each`]) needs none of that: every
/// script decides its limits in `each` mode.
pub(super) async fn decide(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
    combination: Combination,
) -> Result<GroupDecisions, StoreError> {
    if !redis.is_cluster() && groups.unique.len() <= MAX_LIMITS_PER_SCRIPT {
        // One script decides every group (what `script_partitions` gives
        // on one node): its decisions are the call's, with nothing to
        // join, collect per script or give back.
        let mode = match combination {
            Combination::Each => Mode::Each,
            Combination::AllOrNothing => Mode::Decide,
        };
        return in_one_script(redis, groups, requests, mode).await;
    }
    if combination == Combination::Each {
        let scripts = Scripts::new(redis, groups, requests);
        return scripts.run(Mode::Each).await?.decisions(groups);
    }
    Ok(decide_together(redis, groups, requests).await?.decisions)
}

/// A call decided all or nothing on one Redis, and what it spent there, if
/// it spent: what to give back if another store denies the call.
pub(super) struct Together {
    /// One per group.
    pub(super) decisions: GroupDecisions,
    /// The answers of the spending scripts, when every enforcing limit
    /// allowed (and so spent).
    pub(super) spent: Option<Answers>,
}

impl Together {
    /// The call as the spending scripts answered it.
    fn spending(groups: &Groups, answers: Answers) -> Result<Self, StoreError> {
        let decisions = answers.decisions(groups)?;
        let spent = (!decisions.denies(groups)).then_some(answers);
        Ok(Self { decisions, spent })
    }

    /// The call, denied, having spent nothing (or all of it given back).
    fn nothing_spent(decisions: GroupDecisions) -> Self {
        Self {
            decisions,
            spent: None,
        }
    }
}

/// All or nothing on one Redis (see [`decide`]).
pub(super) async fn decide_together(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
) -> Result<Together, StoreError> {
    let scripts = Scripts::new(redis, groups, requests);
    if scripts.partitions.len() == 1 {
        return Together::spending(groups, scripts.run(Mode::Decide).await?);
    }
    let dry = scripts.run(Mode::Dry).await?;
    if dry.decisions(groups)?.denies(groups) {
        let looks = scripts.run(Mode::Look).await?;
        return Ok(Together::nothing_spent(
            scripts.nothing_spent(&dry, &looks)?,
        ));
    }
    let spent = scripts.run(Mode::Decide).await?;
    if !spent.decisions(groups)?.denies(groups) {
        return Together::spending(groups, spent);
    }
    // Boxed: giving back runs the refund script outside any batch, through
    // a future of about 4 KiB; inline, every decision on Redis would
    // allocate that room (4.3 KiB rather than 0.4 KiB per decision in
    // flight), though few ever give back.
    let refunded = Box::pin(scripts.give_back(&spent)).await?;
    Ok(Together::nothing_spent(
        scripts.after_refund(&spent, &refunded)?,
    ))
}

/// All or nothing on one Redis, as [`decide_together`], with the mark of
/// each group's spend if it spent (allowed, with a cost, in a call that
/// spent).
pub(super) async fn decide_marked(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
) -> Result<(GroupDecisions, Vec<Option<SpendMark>>), StoreError> {
    let together = decide_together(redis, groups, requests).await?;
    let marks = match &together.spent {
        Some(answers) => (0..groups.unique.len())
            .map(|g| {
                let decided = answers.get(g)?;
                let spent = decided.decision.is_allowed() && groups.unique[g].cost > 0;
                Ok(spent.then_some(decided.mark))
            })
            .collect::<Result<_, StoreError>>()?,
        None => vec![None; groups.unique.len()],
    };
    Ok((together.decisions, marks))
}

/// The scripts that decide one call's groups on one Redis, and the steps
/// of all or nothing across them (`split` gives back across two Redis
/// deployments with them too).
pub(super) struct Scripts<'a> {
    redis: &'a RedisStore,
    groups: &'a Groups,
    requests: &'a [LimitRequest],
    /// The groups of each script (see [`script_partitions`]).
    partitions: Vec<Vec<usize>>,
}

impl<'a> Scripts<'a> {
    /// The scripts of every group of the call, on `redis`.
    pub(super) fn new(
        redis: &'a RedisStore,
        groups: &'a Groups,
        requests: &'a [LimitRequest],
    ) -> Self {
        let partitions = script_partitions(redis, groups, 0..groups.unique.len());
        Self {
            redis,
            groups,
            requests,
            partitions,
        }
    }

    /// Runs every script in `mode`, at once.
    async fn run(&self, mode: Mode) -> Result<Answers, StoreError> {
        on_every_node(
            self.redis,
            self.groups,
            self.requests,
            &self.partitions,
            mode,
        )
        .await
    }

    /// The answer of a call that a `dry` run denied, nothing spent: the
    /// denying limits as the dry run answered, the others what they have
    /// (`looks`).
    fn nothing_spent(&self, dry: &Answers, looks: &Answers) -> Result<GroupDecisions, StoreError> {
        self.groups.decide(|g, _| {
            let decision = dry.get(g)?.decision;
            if decision.is_allowed() {
                Ok(looks.get(g)?.decision)
            } else {
                Ok(decision)
            }
        })
    }

    /// Gives back what the scripts that spent (none of whose enforcing
    /// limits denied: the others answered with a look, spending nothing)
    /// spent: which groups were given back.
    pub(super) async fn give_back(&self, spent: &Answers) -> Result<Vec<bool>, StoreError> {
        let mut refunded = vec![false; self.groups.unique.len()];
        for members in &self.partitions {
            let mut spent_here = true;
            for &g in members {
                spent_here &= self.groups.unique[g].shadow || spent.get(g)?.decision.is_allowed();
            }
            if spent_here {
                refund(self.redis, self.groups, self.requests, members, spent).await?;
                for &g in members {
                    refunded[g] = true;
                }
            }
        }
        Ok(refunded)
    }

    /// The decisions after [`Scripts::give_back`]: a limit given back has
    /// what it had before the call.
    pub(super) fn after_refund(
        &self,
        spent: &Answers,
        refunded: &[bool],
    ) -> Result<GroupDecisions, StoreError> {
        self.groups.decide(|g, group| {
            let decision = spent.get(g)?.decision;
            Ok(if decision.is_allowed() && refunded[g] {
                Decision::allowed(
                    decision.limit(),
                    decision.remaining() + group.cost,
                    decision.reset_after(),
                )
            } else {
                decision
            })
        })
    }
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
    let answers = on_every_node(redis, groups, requests, &partitions, Mode::Denied).await?;
    members
        .iter()
        .map(|&g| Ok(answers.get(g)?.decision))
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
    if !redis.is_cluster() {
        let members: Vec<usize> = members.into_iter().collect();
        if members.len() <= MAX_LIMITS_PER_SCRIPT {
            return vec![members];
        }
        return members
            .chunks(MAX_LIMITS_PER_SCRIPT)
            .map(<[usize]>::to_vec)
            .collect();
    }
    let partitions = groups.by_slot(members);
    partitions
        .iter()
        .flat_map(|members| members.chunks(MAX_LIMITS_PER_SCRIPT).map(<[usize]>::to_vec))
        .collect()
}

/// What the scripts of one step answered, by group index.
pub(super) struct Answers(Vec<Option<Decided>>);

impl Answers {
    /// Group `g`'s answer; an error if no script answered for it.
    fn get(&self, g: usize) -> Result<Decided, StoreError> {
        self.0
            .get(g)
            .copied()
            .flatten()
            .ok_or_else(|| StoreError::Reply(format!("no script answered for limit {g}")))
    }

    /// The answers as decisions of `groups`.
    pub(super) fn decisions(&self, groups: &Groups) -> Result<GroupDecisions, StoreError> {
        groups.decide(|g, _| Ok(self.get(g)?.decision))
    }
}

/// Runs the decision script in `mode` for every partition at once.
async fn on_every_node(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
    partitions: &[Vec<usize>],
    mode: Mode,
) -> Result<Answers, StoreError> {
    let mut answers = vec![None; groups.unique.len()];
    if let [members] = partitions {
        // One script (every call on a standalone Redis or Sentinel): no
        // joining, which would take room for the futures of every script.
        run_decide(redis, groups, requests, members, mode, &mut answers).await?;
        return Ok(Answers(answers));
    }
    let replies = join_all(partitions.iter().map(|members| {
        let mut answers = vec![None; groups.unique.len()];
        async move {
            run_decide(redis, groups, requests, members, mode, &mut answers).await?;
            Ok::<_, StoreError>(answers)
        }
    }))
    .await;
    for (members, reply) in partitions.iter().zip(replies) {
        let reply = reply?;
        for &g in members {
            answers[g] = reply[g];
        }
    }
    Ok(Answers(answers))
}

/// Every group of the call decided by one script call in `mode`.
async fn in_one_script(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
    mode: Mode,
) -> Result<GroupDecisions, StoreError> {
    // Most calls decide one key: its limit stays on the stack.
    let one: [ScriptLimit<'_>; 1];
    let many: Vec<ScriptLimit<'_>>;
    let limits: &[ScriptLimit<'_>] = if let [group] = &*groups.unique {
        one = [script_limit(group, requests)];
        &one
    } else {
        many = script_limits(groups, requests, 0..groups.unique.len());
        &many
    };
    let mut decisions = Vec::with_capacity(limits.len());
    decide_on_node(redis, limits, mode, |_, decided| {
        decisions.push(decided.decision);
    })
    .await?;
    groups.expect_one_each(decisions)
}

/// One decision script call for `limits` (all on one node) in `mode`:
/// each limit's answer to `each`, by its index in `limits`, exactly once.
async fn decide_on_node(
    redis: &RedisStore,
    limits: &[ScriptLimit<'_>],
    mode: Mode,
    each: impl FnMut(usize, Decided),
) -> Result<(), StoreError> {
    let slot_key = limits.first().map_or("", |limit| limit.key);
    let reply = redis
        .run_batched(slot_key, script::decide_batchable(mode, limits))
        .await?;
    script::decode_reply(limits, &reply, each)
}

/// The script's view of the groups `members`.
fn script_limits<'a>(
    groups: &'a Groups,
    requests: &'a [LimitRequest],
    members: impl IntoIterator<Item = usize>,
) -> Vec<ScriptLimit<'a>> {
    members
        .into_iter()
        .map(|g| script_limit(&groups.unique[g], requests))
        .collect()
}

/// The script's view of `group`.
fn script_limit<'a>(group: &'a Group, requests: &'a [LimitRequest]) -> ScriptLimit<'a> {
    ScriptLimit {
        key: &group.key,
        algorithm: group.algorithm(requests),
        cost: group.cost,
        shadow: group.shadow,
    }
}

/// One call of the decision script for the groups `members` (all on one
/// node): each member's answer into `answers`, by group index.
async fn run_decide(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
    members: &[usize],
    mode: Mode,
    answers: &mut [Option<Decided>],
) -> Result<(), StoreError> {
    let limits = script_limits(groups, requests, members.iter().copied());
    decide_on_node(redis, &limits, mode, |i, decided| {
        answers[members[i]] = Some(decided);
    })
    .await
}

/// Gives back what the groups `members` (all on one node) spent.
async fn refund(
    redis: &RedisStore,
    groups: &Groups,
    requests: &[LimitRequest],
    members: &[usize],
    spent: &Answers,
) -> Result<(), StoreError> {
    let mut given_back = Vec::new();
    for (limit, &g) in script_limits(groups, requests, members.iter().copied())
        .into_iter()
        .zip(members)
    {
        let decided = spent.get(g)?;
        if decided.decision.is_allowed() && limit.cost > 0 {
            given_back.push((limit, decided.mark));
        }
    }
    if let Some((first, _)) = given_back.first() {
        let _refunded: i64 = redis
            .run_script(first.key, &script::refund_call(&given_back))
            .await?;
    }
    Ok(())
}

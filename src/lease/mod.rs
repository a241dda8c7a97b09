//! Leases: a client process decides a hot policy by itself, from units the
//! server has already spent for it. Each lease is prepaid: the units are
//! spent on every limit of the policy with the same atomic decision as
//! `CheckLimit`, before the client hears of them, so no limit ever admits
//! more than it allows, whoever holds them and whatever fails
//! (docs/semantics.md has the proof). A lease's size is the client's
//! share of the policy's rate, settled among every client leasing it on
//! every instance by the quota service's fair-share ledger and presence,
//! for the lease's time, topped up at each renewal; units a client gives
//! back go back to the limits that can take them.
//!
//! `sizing` says what may be leased and how much; `book` is one stream's
//! leases. The gRPC face is `api::lease`.

mod answers;
pub(crate) mod book;
mod options;
pub(crate) mod sizing;

pub use self::options::LeaseOptions;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use self::answers::{lease_size, least_left, longest_wait, nothing, valid_for, waiting};
use self::book::{Book, Holding, Tranche};
use self::sizing::{Allowance, Leasable, TopUp};
use crate::algorithm::LimitRequest;
use crate::decider::{self, Label};
use crate::error::Error;
use crate::limit::{CallerKey, Decision, InvalidArgument};
use crate::limiter::script::SpendMark;
use crate::limiter::{Limiter, MarkedDecision};
use crate::live;
use crate::metrics;
use crate::policy::{Policy, Scope};
use crate::quota::presence::Roster;
use crate::quota::{QuotaLedger, ShareOp, ShareParams};
use crate::rules::RulesHandle;

/// What a client asks of one policy and key.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Ask {
    /// The policy.
    pub policy: String,
    /// Whose counters its per-key limits spend.
    pub key: String,
    /// Requests per second the client sees on them.
    pub demand: f64,
    /// Units of earlier grants it still holds.
    pub held: u64,
    /// Admitted from leases since its last ask.
    pub admitted: u64,
    /// Denied locally since its last ask.
    pub denied: u64,
    /// Sent to `CheckLimit` since its last ask.
    pub fallbacks: u64,
    /// It stops leasing them, giving `held` back.
    pub release: bool,
}

/// What an ask got.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Grant {
    /// Units spent for the client.
    pub units: u64,
    /// How long they are valid, from when the client sent its ask.
    pub valid_for: Duration,
    /// Each limit after the spend, in the policy's order.
    pub limits: Vec<(Label, Decision)>,
    /// Set when `units` is zero for want of units: deny locally this long.
    pub retry_after: Option<Duration>,
    /// When to ask again.
    pub renew_after: Duration,
}

/// When a client renews, as a fraction of its lease's time.
const RENEW_AT: f64 = 0.7;

/// The service's own settings.
#[derive(Debug, Clone)]
pub struct LeaseSettings {
    /// Most leases one stream may hold.
    pub max_per_stream: usize,
    /// Most leases all streams of this instance may hold together.
    pub max_total: usize,
    /// How often a lease's share is settled again, at most.
    pub settle_every: Duration,
    /// What a client's share allows beyond its demand, per mille.
    pub headroom_permille: u64,
}

/// The lease service's core: grants, renews and releases leases on a
/// limiter, with shares settled on a ledger.
pub(crate) struct Leaser {
    limiter: Limiter,
    rules: RulesHandle,
    ledger: QuotaLedger,
    roster: Arc<Roster>,
    settings: LeaseSettings,
    /// Leases held by every stream of this instance.
    held: AtomicUsize,
}

impl Leaser {
    /// Leases on `limiter`, for the policies of `rules`, with shares
    /// settled on `ledger` among the instances `roster` knows.
    pub(crate) fn new(
        limiter: Limiter,
        rules: RulesHandle,
        ledger: QuotaLedger,
        roster: Arc<Roster>,
        settings: LeaseSettings,
    ) -> Self {
        Self {
            limiter,
            rules,
            ledger,
            roster,
            settings,
            held: AtomicUsize::new(0),
        }
    }

    /// This instance's id among those on its store.
    pub(crate) fn instance(&self) -> &str {
        self.roster.instance()
    }

    /// Answers `ask` from the stream `subscriber`, whose leases are `book`.
    pub(crate) async fn ask(
        &self,
        subscriber: &str,
        book: &mut Book,
        ask: &Ask,
    ) -> Result<Grant, Error> {
        let policy = decider::policy(&self.rules.current(), &ask.policy)?;
        let key = CallerKey::new(ask.key.clone()).map_err(|err| err.within("key"))?;
        let leasable = sizing::leasable(&policy)?;
        if !ask.demand.is_finite() || ask.demand < 0.0 {
            return Err(InvalidArgument::new(
                "demand",
                "must be a number of requests per second, 0 or more",
            )
            .into());
        }
        let now = Instant::now();
        if ask.release {
            return self.release(subscriber, book, ask, &key, now).await;
        }
        let holding = match book.get_mut(&ask.policy, &ask.key) {
            Some(holding) => {
                metrics::lease_renewal(&ask.policy);
                holding
            }
            None => {
                self.take_slot(book)?;
                metrics::leases_held(&ask.policy, 1.0);
                book.insert(&ask.policy, &ask.key, self.new_holding(&policy, &key, now))
            }
        };
        report(holding, ask)?;
        holding.policy = policy.clone();
        holding.demand = ask.demand;
        self.settle_share(subscriber, holding, &leasable, now)
            .await?;
        let grant = self
            .spend(&policy, &key, holding, &leasable, ask.held, now)
            .await?;
        live::lease_holder(&ask.policy, subscriber, &ask.key, shown(holding));
        Ok(grant)
    }

    /// A new lease's holding; its allowance is set at its first settlement.
    fn new_holding(&self, policy: &Arc<Policy>, key: &CallerKey, now: Instant) -> Holding {
        Holding {
            ledger_key: self.ledger_key(policy, key),
            policy: policy.clone(),
            granted: 0,
            admitted: 0,
            returned: 0,
            tranches: VecDeque::new(),
            allowance: Allowance::full(0.0, now),
            share_rate: 0.0,
            subscribers: 0,
            settled_at: None,
            demand: 0.0,
            low: false,
            left: None,
        }
    }

    /// Takes one of the instance's lease slots, if the stream and the
    /// instance have one left.
    fn take_slot(&self, book: &Book) -> Result<(), Error> {
        if book.len() >= self.settings.max_per_stream {
            return Err(Error::Overloaded(format!(
                "this stream holds {} leases, the server's --lease-max-per-stream",
                self.settings.max_per_stream
            )));
        }
        self.held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |held| {
                (held < self.settings.max_total).then_some(held + 1)
            })
            .map(drop)
            .map_err(|_| {
                Error::Overloaded(format!(
                    "this server holds {} leases, its --lease-max",
                    self.settings.max_total
                ))
            })
    }

    /// Where the share of `policy` on `key` is settled: one ledger for the
    /// policy when every limit counts policy-wide, else one per key.
    fn ledger_key(&self, policy: &Policy, key: &CallerKey) -> String {
        let per_key = policy.limits.iter().any(|limit| limit.scope == Scope::Key);
        let scoped = CallerKey::policy(&policy.name, "lease", per_key.then_some(key));
        format!("{}{{rll:{}}}", self.limiter.key_prefix(), scoped.as_str())
    }

    /// Settles the holding's share of the policy's rate, unless it was
    /// settled within the last `settle_every`; or within the last eighth of
    /// it if the client is underserved (its demand came back after a
    /// pause, say), so that its share follows within a fraction of a
    /// second rather than seconds.
    async fn settle_share(
        &self,
        subscriber: &str,
        holding: &mut Holding,
        leasable: &Leasable,
        now: Instant,
    ) -> Result<(), Error> {
        let every = if holding.underserved(leasable.rate) {
            self.settings.settle_every / 8
        } else {
            self.settings.settle_every
        };
        let due = holding
            .settled_at
            .is_none_or(|at| now.saturating_duration_since(at) >= every);
        if !due {
            return Ok(());
        }
        self.roster.use_it();
        let capacity = micro(leasable.rate);
        let params = ShareParams {
            capacity,
            headroom_permille: self.settings.headroom_permille,
            min_want: (capacity / 100).max(1),
            // Units granted under a share stay held up to a lease's time
            // after the last grant, which comes up to `settle_every` after
            // the settlement.
            lease_ms: millis(
                leasable.max_duration + self.settings.settle_every + Duration::from_secs(1),
            ),
            // A client that stopped asking (killed) stops counting two
            // settlements later.
            stale_ms: millis(self.settings.settle_every * 2 + Duration::from_secs(1)),
            hysteresis_permille: 50,
        };
        let demand =
            (holding.settled_at.is_some() || holding.demand > 0.0).then(|| micro(holding.demand));
        let dead = self.roster.dead();
        let share = self
            .ledger
            .settle(
                &holding.ledger_key,
                subscriber,
                ShareOp::Report(demand),
                &params,
                &dead,
            )
            .await?;
        let first = holding.settled_at.is_none();
        holding.share_rate = share.grant as f64 / 1e6;
        holding.subscribers = share.subscribers;
        holding.settled_at = Some(now);
        let size = lease_size(leasable, holding.share_rate);
        if first {
            holding.allowance = Allowance::full(size, now);
        }
        Ok(())
    }

    /// Spends the units that top the lease up, and answers with them.
    async fn spend(
        &self,
        policy: &Policy,
        key: &CallerKey,
        holding: &mut Holding,
        leasable: &Leasable,
        held: u64,
        now: Instant,
    ) -> Result<Grant, Error> {
        let size = lease_size(leasable, holding.share_rate);
        holding.allowance.accrue(holding.share_rate, size, now);
        // Late enough that a renewal tops up most of a lease (few store
        // calls), early enough that the answer comes back before the
        // units run out.
        let renew_after = leasable.max_duration.mul_f64(RENEW_AT);
        // Alone on the policy, a client may have units as fast as the limits
        // allow, as by CheckLimit; beside others that want more, it is held
        // to its share.
        let share = holding
            .contended()
            .then_some((holding.allowance.units, holding.share_rate));
        let wanted = match sizing::top_up(size, held, share, holding.low) {
            TopUp::Spend(units) => units,
            TopUp::Enough => return Ok(waiting(None, renew_after)),
            TopUp::Wait(wait) => {
                // A share of nothing yet (the others' grants still hold
                // it all) grows at the next settlement, not with time.
                let wait = wait.min(self.settings.settle_every);
                return Ok(waiting(Some(wait), wait));
            }
        };
        // Within what the limits had left at the last grant, when that still
        // stands: spending more and giving the rest back would show other
        // callers, for a moment, less left than there is. Nothing left then
        // still tries one unit: a refill may have come, and a denial says
        // how long to wait.
        let cost = holding
            .left
            .filter(|&(_, until)| now < until)
            .map_or(wanted, |(left, _)| sizing::within_left(wanted, left.max(1)));
        let (units, spent) = self.spend_up_to(policy, key, cost).await?;
        holding.low = units < wanted;
        holding.left = least_left(policy, &spent, now);
        let (decisions, marks): (Vec<Decision>, Vec<Option<SpendMark>>) = spent.into_iter().unzip();
        let limits: Vec<(Label, Decision)> = Label::of_policy(policy)
            .into_iter()
            .zip(decisions)
            .collect();
        if units == 0 {
            let retry_after = longest_wait(&limits).unwrap_or(leasable.max_duration);
            return Ok(Grant {
                units: 0,
                valid_for: Duration::ZERO,
                limits,
                retry_after: Some(retry_after),
                renew_after: retry_after,
            });
        }
        let valid_for = valid_for(policy, &limits, leasable.max_duration);
        holding.granted += units;
        // Alone, a client is not held to its allowance: what it took then
        // is no debt to repay once others come (it would starve it for as
        // long as it was alone).
        holding.allowance.units = (holding.allowance.units - units as f64).max(0.0);
        holding.tranches.push_back(Tranche {
            units,
            until: now + valid_for,
            policy: holding.policy.clone(),
            marks,
        });
        metrics::lease_units(&policy.name, "leased", units);
        Ok(Grant {
            units,
            valid_for,
            limits,
            retry_after: None,
            renew_after: valid_for.mul_f64(RENEW_AT),
        })
    }

    /// Spends `wanted` units of every limit of `policy` for `key`, all or
    /// nothing, within what the limits have left ([`sizing::within_left`]:
    /// at most half of it): if a limit has fewer left, that part of the
    /// least of them; if the spend took more than that part (others spent
    /// since), the rest goes straight back. Answers the units spent (0:
    /// none) and each limit's decision, with the mark of its spend if it
    /// spent. A Redis that cannot answer is an error: nothing is leased on
    /// a failure policy's word.
    async fn spend_up_to(
        &self,
        policy: &Policy,
        key: &CallerKey,
        wanted: u64,
    ) -> Result<(u64, Vec<MarkedDecision>), Error> {
        let mut cost = wanted;
        for _ in 0..2 {
            let spent = self
                .limiter
                .spend_marked(&policy.requests(key, cost))
                .await?;
            let enforcing: Vec<&Decision> = policy
                .limits
                .iter()
                .zip(&spent)
                .filter(|(limit, _)| !limit.shadow)
                .map(|(_, (decision, _))| decision)
                .collect();
            let least_denied = enforcing
                .iter()
                .filter(|decision| !decision.is_allowed())
                .map(|decision| decision.remaining())
                .min();
            let Some(least) = least_denied else {
                // Spent: what the limits had left was what they have now
                // and this spend.
                let left = enforcing
                    .iter()
                    .map(|decision| decision.remaining().saturating_add(cost))
                    .min();
                let kept = left.map_or(cost, |left| sizing::within_left(cost, left));
                return Ok(self.keep(policy, key, cost, kept, spent).await);
            };
            // Denied, nothing spent: `least` is what the tightest limit has.
            if least == 0 || least >= cost {
                return Ok((0, spent));
            }
            cost = sizing::within_left(cost, least);
        }
        Ok((0, Vec::new()))
    }

    /// Of `cost` units just spent as `spent`, keeps `kept` for the client
    /// and gives the rest back to the spend they came from. A give-back
    /// that does not happen keeps them all: they are spent either way, and
    /// the limits still allowed them.
    async fn keep(
        &self,
        policy: &Policy,
        key: &CallerKey,
        cost: u64,
        kept: u64,
        spent: Vec<MarkedDecision>,
    ) -> (u64, Vec<MarkedDecision>) {
        let excess = cost - kept;
        if excess == 0 {
            return (cost, spent);
        }
        let marks: Vec<Option<SpendMark>> = spent.iter().map(|(_, mark)| *mark).collect();
        match self.give_back_units(policy, key, excess, &marks).await {
            Ok(true) => {}
            Ok(false) => return (cost, spent),
            Err(err) => {
                tracing::debug!(%err, "could not give back what a grant spent beyond its part");
                return (cost, spent);
            }
        }
        let spent = spent
            .into_iter()
            .map(|(decision, mark)| match mark {
                Some(_) if decision.is_allowed() => (
                    Decision::allowed(
                        decision.limit(),
                        decision.remaining().saturating_add(excess),
                        decision.reset_after(),
                    ),
                    mark,
                ),
                _ => (decision, mark),
            })
            .collect();
        (kept, spent)
    }

    /// Gives `units` of `key`'s spend on `policy` back, each limit to the
    /// spend its mark finds; answers whether anything was given back.
    async fn give_back_units(
        &self,
        policy: &Policy,
        key: &CallerKey,
        units: u64,
        marks: &[Option<SpendMark>],
    ) -> Result<bool, Error> {
        let spent: Vec<(LimitRequest, SpendMark)> = policy
            .requests(key, units)
            .into_iter()
            .zip(marks)
            .filter_map(|(request, mark)| Some((request, (*mark)?)))
            .collect();
        Ok(self.limiter.give_back(&spent).await?)
    }

    /// Ends the lease on `ask`'s policy and key: gives back what the client
    /// says it holds (at most what was granted, still valid and not
    /// reported spent), each unit to the spend it came from (a window only
    /// while it still counts), and leaves its share.
    async fn release(
        &self,
        subscriber: &str,
        book: &mut Book,
        ask: &Ask,
        key: &CallerKey,
        now: Instant,
    ) -> Result<Grant, Error> {
        let Some(mut holding) = book.remove(&ask.policy, &ask.key) else {
            return Ok(nothing());
        };
        let reported = report(&mut holding, ask);
        let mut given_back = Ok(());
        if reported.is_ok() {
            for part in holding.give_back(now, ask.held) {
                match self
                    .give_back_units(&part.policy, key, part.units, &part.marks)
                    .await
                {
                    Ok(true) => {
                        holding.returned += part.units;
                        metrics::lease_units(&ask.policy, "returned", part.units);
                    }
                    Ok(false) => {}
                    Err(err) => {
                        given_back = Err(err);
                        break;
                    }
                }
            }
        }
        self.let_go(subscriber, (&ask.policy, &ask.key), holding)
            .await;
        reported?;
        given_back?;
        Ok(nothing())
    }

    /// Lets every lease of a stream that ended go: their units lapse with
    /// their time (the client can no longer say what it spent).
    pub(crate) async fn end_stream(&self, subscriber: &str, book: &mut Book) {
        let holdings: Vec<((String, String), Holding)> = book.drain().collect();
        for ((policy, key), holding) in holdings {
            self.let_go(subscriber, (&policy, &key), holding).await;
        }
    }

    /// Leaves the holding's share and counts what lapsed.
    /// `policy` and `key` are the book's, as the live view was told them.
    async fn let_go(&self, subscriber: &str, (policy, key): (&str, &str), holding: Holding) {
        self.held.fetch_sub(1, Ordering::Relaxed);
        live::lease_gone(policy, subscriber, key);
        metrics::leases_held(&holding.policy.name, -1.0);
        metrics::lease_units(&holding.policy.name, "lapsed", holding.lapsed());
        if holding.settled_at.is_some() {
            let dead = self.roster.dead();
            if let Err(err) = self
                .ledger
                .settle(
                    &holding.ledger_key,
                    subscriber,
                    ShareOp::Leave,
                    &ShareParams::default(),
                    &dead,
                )
                .await
            {
                // Its share runs out by itself.
                tracing::debug!(%err, "could not leave a lease's share");
            }
        }
    }
}

/// Takes in what the client reports having decided; refused when it
/// admitted more than it was granted.
fn report(holding: &mut Holding, ask: &Ask) -> Result<(), Error> {
    let unreported = holding.granted - holding.admitted;
    if ask.admitted > unreported {
        return Err(InvalidArgument::new(
            "admitted",
            format!(
                "is {}, more than the {unreported} units granted and not yet reported on this \
                 policy and key",
                ask.admitted
            ),
        )
        .into());
    }
    holding.admitted += ask.admitted;
    metrics::lease_local_decisions(&ask.policy, ask.admitted, ask.denied, ask.fallbacks);
    Ok(())
}

/// What the console's live view shows of a holding.
fn shown(holding: &Holding) -> live::HolderStats {
    live::HolderStats {
        share_per_second: holding.share_rate,
        demand_per_second: holding.demand,
        granted: holding.granted,
        admitted: holding.admitted,
    }
}

fn micro(rate: f64) -> u64 {
    (rate * 1e6).clamp(0.0, u64::MAX as f64) as u64
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

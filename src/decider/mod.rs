//! The decision service, free of any transport: a validated [`Question`]
//! in (one limit, several, or a named policy's; or a batch of them), an
//! [`Answer`] or an [`Error`] out. The gRPC, HTTP and Envoy faces turn
//! their wire types into questions and answers into their wire types; this
//! is where deciding happens, is counted and is shown live.
//!
//! `question` is what may be asked, `answer` what comes back.

mod answer;
mod question;

use std::net::IpAddr;

use futures::{FutureExt, StreamExt};
use tracing::debug;

pub use self::answer::{Answer, Several};
pub use self::question::{Label, Limits, NamedLimit, Question, policy};
use crate::error::Error;
use crate::limit::InvalidArgument;
use crate::limiter::{Limiter, ResetKey};
use crate::live;
use crate::load_shed::{DecisionSlots, InFlight};
use crate::metrics::{self, Api};
use crate::rules::{Rules, RulesHandle};

/// Questions of one batch decided at once: enough to keep a Redis pool
/// busy, few enough that one batch does not take every connection from
/// the single questions beside it.
const BATCH_CONCURRENCY: usize = 32;

/// Bounds on what one call may ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckBounds {
    /// Most limits in one question's several limits.
    pub max_limits: usize,
    /// Most questions in one batch.
    pub max_batch: usize,
}

impl Default for CheckBounds {
    /// The server's defaults: as many limits as one Redis script decides,
    /// a thousand questions a batch.
    fn default() -> Self {
        Self {
            max_limits: crate::limiter::script::MAX_LIMITS_PER_SCRIPT,
            max_batch: 1000,
        }
    }
}

/// The decision service: answers [`Question`]s on a [`Limiter`], with the
/// operator's named policies, counting each decision in the metrics and
/// the console's live view.
///
/// ```
/// use std::time::Duration;
///
/// use ratelimitd::decider::{Answer, Decider, Question};
/// use ratelimitd::algorithm::{Algorithm, FixedWindow, LimitRequest};
/// use ratelimitd::limit::CallerKey;
/// use ratelimitd::limiter::{Limiter, Store};
/// use ratelimitd::store::{MemoryStore, SystemClock};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let store = Store::Memory(MemoryStore::new(std::sync::Arc::new(SystemClock::default())));
/// let decider = Decider::new(Limiter::new(store, "example:"));
/// let ask = || Question::one(LimitRequest {
///     key: CallerKey::new("user-42".to_owned()).unwrap(),
///     algorithm: Algorithm::FixedWindow(FixedWindow::new(2, Duration::from_secs(60)).unwrap()),
///     cost: 1,
///     shadow: false,
/// });
/// for expected in [true, true, false] {
///     let Answer::One(decision) = decider.decide(ask()).await.unwrap() else {
///         unreachable!("one limit asked, one decision answered")
///     };
///     assert_eq!(decision.is_allowed(), expected);
/// }
/// # });
/// ```
#[derive(Clone)]
pub struct Decider {
    limiter: Limiter,
    /// Where the named policies are (with every other rule, reloaded with
    /// them).
    rules: RulesHandle,
    /// Decisions in flight, bounded; `None`: unbounded.
    slots: Option<DecisionSlots>,
    bounds: CheckBounds,
}

impl Decider {
    /// Decides on `limiter`, without named policies, bounded only by
    /// [`CheckBounds::default`].
    pub fn new(limiter: Limiter) -> Self {
        Self {
            limiter,
            rules: RulesHandle::default(),
            slots: None,
            bounds: CheckBounds::default(),
        }
    }

    /// The same service, finding named policies in `rules`.
    pub fn with_rules(self, rules: RulesHandle) -> Self {
        Self { rules, ..self }
    }

    /// The same service, admitting callers to at most `slots` decisions
    /// in flight ([`Decider::admit`]).
    pub(crate) fn with_slots(self, slots: DecisionSlots) -> Self {
        Self {
            slots: Some(slots),
            ..self
        }
    }

    /// The same service, within `bounds`.
    pub fn with_bounds(self, bounds: CheckBounds) -> Self {
        Self { bounds, ..self }
    }

    /// What one call may ask.
    pub fn bounds(&self) -> CheckBounds {
        self.bounds
    }

    /// The rules in force now, to find policies in ([`policy`]): one
    /// snapshot for every question of one call, so a reload cannot split
    /// a batch.
    pub fn rules(&self) -> std::sync::Arc<Rules> {
        self.rules.current()
    }

    /// A slot for one call from `peer` (`None`: not known), held until the
    /// guard is dropped; `Overloaded` when every slot is taken. Without
    /// slots, every call is admitted.
    pub(crate) fn admit(&self, peer: Option<IpAddr>) -> Result<Option<InFlight>, Error> {
        self.slots
            .as_ref()
            .map(|slots| slots.enter(peer))
            .transpose()
    }

    /// Decides `question`. Over the limit is an answer; an error only
    /// when no decision could be had (the store failed, and the failure
    /// policy does not answer).
    pub async fn decide(&self, question: Question) -> Result<Answer, Error> {
        if let Limits::One(request) = &question.limits {
            let decision = self.limiter.check(request, question.failure_policy).await?;
            metrics::decision(Api::CheckLimit, request.algorithm.kind(), &decision);
            live::decision(
                live::Face::CheckLimit,
                live::Origin::Request,
                request,
                &decision,
            );
            debug!(
                algorithm = request.algorithm.name(),
                allowed = decision.is_allowed(),
                remaining = decision.remaining(),
                "decided"
            );
            return Ok(Answer::One(decision));
        }
        let requests = question.requests();
        let labels = question.labels().unwrap_or_default();
        let decisions = self
            .limiter
            .check_all(&requests, question.failure_policy)
            .await?;
        let policy = question.policy();
        let origin = match policy {
            Some(policy) => live::Origin::Policy(&policy.name),
            None => live::Origin::Request,
        };
        for (request, decision) in requests.iter().zip(&decisions) {
            metrics::decision(Api::CheckLimit, request.algorithm.kind(), decision);
            live::decision(live::Face::CheckLimit, origin, request, decision);
        }
        let several = Several { labels, decisions };
        let allowed = several.is_allowed();
        if let Some(policy) = policy {
            metrics::policy_decision(&policy.name, allowed, several.is_degraded());
        }
        debug!(
            limits = several.decisions.len(),
            policy = policy.map(|p| p.name.as_str()),
            allowed,
            "decided"
        );
        Ok(Answer::Several(several))
    }

    /// Decides a batch: each question on its own, at most a few dozen at
    /// a time, one answer (or error) per question in order. A question
    /// that could not be asked (its error) is answered by that error in
    /// its place. The whole batch is refused when it is empty or over
    /// [`CheckBounds::max_batch`].
    pub async fn decide_batch(
        &self,
        questions: Vec<Result<Question, Error>>,
    ) -> Result<Vec<Result<Answer, Error>>, Error> {
        if questions.is_empty() {
            return Err(InvalidArgument::new("requests", "must not be empty").into());
        }
        if questions.len() > self.bounds.max_batch {
            return Err(InvalidArgument::new(
                "requests",
                format!(
                    "must hold at most {} requests (got {}); the server's --max-batch-size \
                     sets the bound",
                    self.bounds.max_batch,
                    questions.len()
                ),
            )
            .into());
        }
        Ok(futures::stream::iter(questions)
            // Boxed: the batch's future type stays shallow enough for the
            // compiler to prove it `Send`.
            .map(|question| async move { self.decide(question?).await }.boxed())
            .buffered(BATCH_CONCURRENCY)
            .collect()
            .await)
    }

    /// Deletes the counter of every limit `question` names, as
    /// [`Decider::decide`] would read them (cost and failure policy
    /// aside): one entry per limit, in order; limits sharing one counter
    /// are reported each, with the same key. Spends nothing and decides
    /// nothing.
    pub async fn reset(&self, question: &Question) -> Result<Vec<ResetLimit>, Error> {
        let requests = question.requests();
        let keys = self.limiter.reset(&requests).await?;
        let names: Vec<String> = match question.labels() {
            None => vec![String::new()],
            Some(labels) => labels.into_iter().map(|label| label.name).collect(),
        };
        Ok(requests
            .iter()
            .zip(names)
            .zip(keys)
            .map(|((request, name), key)| ResetLimit {
                name,
                algorithm: request.algorithm.name(),
                key,
            })
            .collect())
    }
}

/// One limit a reset cleared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetLimit {
    /// The limit's name (empty for an unnamed one, and for the one-limit
    /// form).
    pub name: String,
    /// Its algorithm's name.
    pub algorithm: &'static str,
    /// What became of its storage key.
    pub key: ResetKey,
}

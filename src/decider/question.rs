//! What a caller may ask the [`Decider`](super::Decider): one limit, several
//! decided together, or a named policy's, each already validated into the
//! core's types; and the look-up that turns a policy's name into the
//! policy.

use std::sync::Arc;

use crate::algorithm::LimitRequest;
use crate::error::Error;
use crate::limit::{CallerKey, FailurePolicy, InvalidArgument};
use crate::policy::Policy;
use crate::rules::Rules;

/// One question: the limits to decide, and how to answer while the store
/// cannot.
#[derive(Debug, Clone)]
pub struct Question {
    /// What to decide.
    pub limits: Limits,
    /// The call's own failure policy; `None` keeps the limiter's.
    pub failure_policy: Option<FailurePolicy>,
}

/// The limits a [`Question`] asks about, in one of three forms.
#[derive(Debug, Clone)]
pub enum Limits {
    /// One limit, answered by its own decision.
    One(LimitRequest),
    /// Several limits decided together, all or nothing, in order.
    Several(Vec<NamedLimit>),
    /// The limits of an operator's named policy, on `key`, each spending
    /// `cost`.
    Policy {
        /// The policy, as [`policy`] found it.
        policy: Arc<Policy>,
        /// Whose counters its per-key limits spend.
        key: CallerKey,
        /// What each of its limits spends.
        cost: u64,
    },
}

/// One limit of several, with the name its answer reports.
#[derive(Debug, Clone)]
pub struct NamedLimit {
    /// Its name; empty for an unnamed limit. A named limit counts on a
    /// counter of its own (see [`CallerKey::named`]).
    pub name: String,
    /// The limit itself.
    pub request: LimitRequest,
}

/// What an answer reports of one limit besides its decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Label {
    /// The limit's name (empty for an unnamed one).
    pub name: String,
    /// Decided and reported, but never denies.
    pub shadow: bool,
}

impl Label {
    /// The labels of `policy`'s limits, in order.
    pub fn of_policy(policy: &crate::policy::Policy) -> Vec<Self> {
        policy
            .limits
            .iter()
            .map(|limit| Self {
                name: limit.name.clone(),
                shadow: limit.shadow,
            })
            .collect()
    }
}

impl Question {
    /// A question on one limit, under the limiter's failure policy.
    pub fn one(request: LimitRequest) -> Self {
        Self {
            limits: Limits::One(request),
            failure_policy: None,
        }
    }

    /// What the limiter decides: one request per limit, in order.
    pub fn requests(&self) -> Vec<LimitRequest> {
        match &self.limits {
            Limits::One(request) => vec![request.clone()],
            Limits::Several(limits) => limits.iter().map(|limit| limit.request.clone()).collect(),
            Limits::Policy { policy, key, cost } => policy.requests(key, *cost),
        }
    }

    /// What each limit's answer reports besides its decision, in order;
    /// `None` for the one-limit form, which reports no label.
    pub fn labels(&self) -> Option<Vec<Label>> {
        match &self.limits {
            Limits::One(_) => None,
            Limits::Several(limits) => Some(
                limits
                    .iter()
                    .map(|limit| Label {
                        name: limit.name.clone(),
                        shadow: limit.request.shadow,
                    })
                    .collect(),
            ),
            Limits::Policy { policy, .. } => Some(Label::of_policy(policy)),
        }
    }

    /// The policy the question names, if it names one.
    pub fn policy(&self) -> Option<&Arc<Policy>> {
        match &self.limits {
            Limits::Policy { policy, .. } => Some(policy),
            Limits::One(_) | Limits::Several(_) => None,
        }
    }
}

/// The policy `name` in `rules` (the rules in force, see
/// [`Decider::rules`](super::Decider::rules)); `NotFound`, naming the
/// field `policy`, when the operator defined none by that name.
pub fn policy(rules: &Rules, name: &str) -> Result<Arc<Policy>, Error> {
    rules.policy(name).cloned().ok_or_else(|| {
        Error::NotFound(InvalidArgument::new(
            "policy",
            format!("'{name}' is not defined in the server's policies"),
        ))
    })
}

//! An operator's reset of the limits a `CheckLimitRequest` names, in any
//! of its forms (one limit, several, a policy's): validated as a decision
//! is, then each limit's counter deleted ([`Limiter::reset`]). Spends
//! nothing and decides nothing.

use super::CheckService;
use super::question::{Form, question};
use crate::error::Error;
use crate::limiter::ResetKey;
use crate::pb::ratelimitd::v1 as pb;

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

impl CheckService {
    /// Deletes the counter of every limit `request` names, as `CheckLimit`
    /// would read them (its cost and failure policy are ignored). Limits
    /// sharing one counter are reported each, with the same key.
    pub async fn reset(&self, request: pb::CheckLimitRequest) -> Result<Vec<ResetLimit>, Error> {
        let rules = (!request.policy.is_empty()).then(|| self.rules.current());
        let question = question(request, rules.as_deref(), self.bounds.max_limits)?;
        let keys = self.limiter.reset(&question.requests).await?;
        let names: Vec<String> = match question.form {
            Form::One => vec![String::new()],
            Form::Several { labels, .. } => labels.into_iter().map(|label| label.name).collect(),
        };
        Ok(question
            .requests
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

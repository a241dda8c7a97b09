//! What can go wrong while deciding. Being over the limit is not here:
//! that is a decision. Each face says what an error is in its protocol.

use std::time::Duration;

use crate::limit::InvalidArgument;

/// A failure of the store, classified where it entered.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer within the command timeout.
    #[error("store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store cannot be reached now (connection refused or lost, loading,
    /// failing over); a later call may succeed.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The circuit breaker is open: Redis failed repeatedly and has not yet
    /// answered a probe, so it was not asked.
    #[error("store unavailable: circuit breaker open after repeated failures")]
    CircuitOpen,
    /// The store answered something we do not understand: a bug or a
    /// misconfigured store, not a passing fault.
    #[error("store replied unexpectedly: {0}")]
    Reply(String),
    /// The store's settings cannot work (e.g. a malformed URL).
    #[error("store misconfigured: {0}")]
    Config(String),
}

impl StoreError {
    /// A fault a later call may not meet: the failure policy answers it.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Timeout(_) | Self::Unavailable(_) | Self::CircuitOpen
        )
    }
}

/// Why a request got no decision.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The request broke a rule.
    #[error(transparent)]
    InvalidArgument(#[from] InvalidArgument),
    /// The request names something the server does not know (a policy):
    /// the field that names it, and what the server lacks.
    #[error(transparent)]
    NotFound(InvalidArgument),
    /// The store could not decide.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Every decision slot is taken: the call is shed at once rather than
    /// queued. What bound was reached.
    #[error("{0}")]
    Overloaded(String),
}

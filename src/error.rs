//! What can go wrong while deciding, and the one place it becomes a gRPC
//! status. Being over the limit is not here: that is a decision.

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
}

impl From<Error> for tonic::Status {
    /// The message is `field: rule` for a refused request, and the
    /// [`InvalidArgument`] itself rides along as the status's source, so
    /// that a caller in this process (the HTTP API) reads the field and the
    /// rule without parsing the message.
    fn from(err: Error) -> Self {
        match err {
            Error::InvalidArgument(err) => {
                with_source(tonic::Status::invalid_argument(err.to_string()), err)
            }
            Error::NotFound(err) => with_source(tonic::Status::not_found(err.to_string()), err),
            Error::Store(err) if err.is_transient() => tonic::Status::unavailable(err.to_string()),
            Error::Store(err) => tonic::Status::internal(err.to_string()),
        }
    }
}

fn with_source(mut status: tonic::Status, err: InvalidArgument) -> tonic::Status {
    status.set_source(std::sync::Arc::new(err));
    status
}

/// The field and the rule a refused call broke, when `status` came from
/// an [`Error`] (see `From<Error> for tonic::Status`).
pub fn refusal(status: &tonic::Status) -> Option<&InvalidArgument> {
    std::error::Error::source(status)?.downcast_ref::<InvalidArgument>()
}

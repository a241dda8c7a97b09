//! What can go wrong while deciding. Being over the limit is not here:
//! that is a decision. Each face says what an error is in its protocol.

use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::PoolError;
use redis::RedisError;

use crate::limit::InvalidArgument;

/// A failure of the store, classified where it entered, with the error it
/// came from as its `source()`. Clone, because one batch's failure is
/// every waiting caller's: each gets a copy, its cause with it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The store did not answer in time: within the command timeout
    /// (`after`), or within the Redis client's own connect or reply
    /// timeout (then `after` is `None` and `source` is the client's error).
    #[error("store did not answer {}", within(after))]
    Timeout {
        /// The command timeout, when it was ours that ran out.
        after: Option<Duration>,
        /// The Redis client's error, when its own timeout ran out.
        #[source]
        source: Option<RedisError>,
    },
    /// Redis cannot be reached now (connection refused or lost, loading,
    /// failing over); a later call may succeed.
    #[error("store unavailable: {source}")]
    Unavailable {
        /// What the Redis client met.
        #[source]
        source: RedisError,
    },
    /// The pool had no connection to give in time, or was closed.
    #[error("store unavailable: {}", pool_fault(source))]
    NoConnection {
        /// The pool's error (shared: it cannot be cloned).
        #[source]
        source: Arc<PoolError>,
    },
    /// The batch a call waited in ended without answering it: its driver
    /// stopped (the runtime shut down, or the driver panicked).
    #[error("store unavailable: the batch was dropped")]
    BatchLost,
    /// The circuit breaker is open: Redis failed repeatedly and has not yet
    /// answered a probe, so it was not asked.
    #[error("store unavailable: circuit breaker open after repeated failures")]
    CircuitOpen,
    /// The store answered something we do not understand: a bug or a
    /// misconfigured store, not a passing fault.
    #[error("store replied unexpectedly: {0}")]
    Reply(String),
    /// Redis answered with an error a later call would meet too (a
    /// script's error, a type it cannot read): a bug or a misconfigured
    /// store, not a passing fault.
    #[error("store replied unexpectedly: {source}")]
    Refused {
        /// Redis's error, as the client read it.
        #[source]
        source: RedisError,
    },
    /// The store's settings cannot work (e.g. a malformed URL).
    #[error("store misconfigured: {source}")]
    Config {
        /// What found the fault: mostly the Redis client.
        #[source]
        source: Arc<dyn std::error::Error + Send + Sync>,
    },
}

impl StoreError {
    /// The store did not answer within our command timeout, `after`.
    pub fn deadline(after: Duration) -> Self {
        Self::Timeout {
            after: Some(after),
            source: None,
        }
    }

    /// The store's settings cannot work, as `source` found.
    pub fn config(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Config {
            source: Arc::from(source.into()),
        }
    }

    /// A fault a later call may not meet: the failure policy answers it.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. }
                | Self::Unavailable { .. }
                | Self::NoConnection { .. }
                | Self::BatchLost
                | Self::CircuitOpen
        )
    }
}

/// The time the store had, as a timeout's message says it.
fn within(after: &Option<Duration>) -> String {
    match after {
        Some(after) => format!("within {after:?}"),
        None => "within the Redis client's own timeout".to_owned(),
    }
}

/// The pool's error as the message says it: a timeout by what timed out.
fn pool_fault(err: &PoolError) -> String {
    match err {
        PoolError::Timeout(kind) => format!("redis pool timed out ({kind:?})"),
        other => other.to_string(),
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

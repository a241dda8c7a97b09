//! What a Redis client's or pool's error means to the store: a timeout, a
//! passing fault, or one a later call would meet too, each keeping the
//! error as its source; and what Redis's error reply to a whole batch
//! script says, read by its kind rather than its text.

use std::sync::Arc;

use deadpool_redis::PoolError;
use redis::{ErrorKind, RedisError, RetryMethod, ServerErrorKind};

use crate::error::StoreError;

/// The Redis client's own timeouts (connect, reply) are `Timeout`, as the
/// command timeout is; errors a later call may not meet (connection lost,
/// loading, failover) are `Unavailable`; the rest mean a bug or a
/// misconfiguration.
pub(super) fn classify(err: RedisError) -> StoreError {
    if err.is_timeout() {
        return StoreError::Timeout {
            after: None,
            source: Some(err),
        };
    }
    match err.retry_method() {
        RetryMethod::NoRetry => StoreError::Refused { source: err },
        _ => StoreError::Unavailable { source: err },
    }
}

/// The Redis client's errors as [`classify`] reads them; the pool's own
/// (no connection in time, closed, a failed hook) as `NoConnection`.
pub(super) fn classify_pool(err: PoolError) -> StoreError {
    match err {
        PoolError::Backend(err) => classify(err),
        other => StoreError::NoConnection {
            source: Arc::new(other),
        },
    }
}

/// Did Redis answer a script call with an error before running it? Any
/// error reply to the whole batch script is one: its driver catches the
/// errors of the calls it runs. A lost connection or a timeout is not: the
/// script may have run.
pub(super) fn refused_unrun(err: &RedisError) -> bool {
    matches!(err.kind(), ErrorKind::Server(_) | ErrorKind::Extension)
        && !err.is_io_error()
        && !err.is_timeout()
        && !err.is_connection_dropped()
}

/// Did Redis fail the script itself: it could not compile it (a Redis
/// before 7 cannot read the flags line the node batch script starts
/// with), or the script failed at run time outside the calls its driver
/// catches? Redis answers both with a plain `ERR`; a refusal to run it now
/// (READONLY, LOADING, BUSY, OOM...) has a code of its own.
pub(super) fn script_failed(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::io;

    use deadpool::managed::TimeoutType;
    use redis::Value;

    use super::*;

    /// `reply` (an error line without its `-` and CRLF) as the client
    /// reads it.
    fn error_reply(reply: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{reply}\r\n").as_bytes()) {
            Ok(Value::ServerError(err)) => err.into(),
            other => panic!("{reply:?} read as {other:?}"),
        }
    }

    #[test]
    fn the_clients_own_timeout_is_a_timeout_with_the_clients_error_as_source() {
        let err = classify(io::Error::from(io::ErrorKind::TimedOut).into());
        assert!(
            matches!(&err, StoreError::Timeout { after: None, source: Some(source) } if source.is_timeout()),
            "{err:?}"
        );
        assert!(err.is_transient());
        assert_eq!(
            err.to_string(),
            "store did not answer within the Redis client's own timeout"
        );
        let source = err
            .source()
            .and_then(|source| source.downcast_ref::<RedisError>());
        assert!(source.is_some_and(RedisError::is_timeout), "{err:?}");
    }

    #[test]
    fn a_lost_connection_is_unavailable_with_the_clients_error_as_source() {
        let err = classify(io::Error::from(io::ErrorKind::ConnectionReset).into());
        assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
        assert!(err.is_transient());
        let source = err
            .source()
            .and_then(|source| source.downcast_ref::<RedisError>());
        assert!(
            source.is_some_and(RedisError::is_connection_dropped),
            "{err:?}"
        );
        let loading = classify(error_reply(
            "LOADING Redis is loading the dataset in memory",
        ));
        assert!(
            matches!(loading, StoreError::Unavailable { .. }),
            "{loading:?}"
        );
    }

    #[test]
    fn a_scripts_error_is_refused_with_the_reply_as_source_and_message() {
        let err = classify(error_reply("ERR unknown algorithm xx"));
        assert!(matches!(err, StoreError::Refused { .. }), "{err:?}");
        assert!(!err.is_transient());
        assert!(
            err.to_string().starts_with("store replied unexpectedly: ")
                && err.to_string().contains("unknown algorithm xx"),
            "{err}"
        );
        let source = err
            .source()
            .and_then(|source| source.downcast_ref::<RedisError>());
        assert_eq!(source.and_then(RedisError::code), Some("ERR"));
    }

    #[test]
    fn the_pools_timeout_is_unavailable_with_the_pools_error_as_source() {
        let err = classify_pool(PoolError::Timeout(TimeoutType::Wait));
        assert!(matches!(err, StoreError::NoConnection { .. }), "{err:?}");
        assert!(err.is_transient());
        assert_eq!(
            err.to_string(),
            "store unavailable: redis pool timed out (Wait)"
        );
        let source = err
            .source()
            .and_then(|source| source.downcast_ref::<Arc<PoolError>>());
        assert!(
            matches!(
                source.map(AsRef::as_ref),
                Some(PoolError::Timeout(TimeoutType::Wait))
            ),
            "{err:?}"
        );
        let backend = classify_pool(PoolError::Backend(
            io::Error::from(io::ErrorKind::TimedOut).into(),
        ));
        assert!(matches!(backend, StoreError::Timeout { .. }), "{backend:?}");
    }

    #[test]
    fn a_failed_script_is_told_by_its_kind_from_a_refusal_to_run_it_now() {
        for failed in [
            "ERR Error compiling script (new function): user_script:1: unexpected symbol near '#'",
            "ERR user_script:12: Script attempted to access nonexistent global variable 'x'",
        ] {
            let err = error_reply(failed);
            assert!(refused_unrun(&err) && script_failed(&err), "{failed}");
        }
        for refusal in [
            "READONLY You can't write against a read only replica.",
            "LOADING Redis is loading the dataset in memory",
            "BUSY Redis is busy running a script.",
            "OOM command not allowed when used memory > 'maxmemory'.",
        ] {
            let err = error_reply(refusal);
            assert!(refused_unrun(&err) && !script_failed(&err), "{refusal}");
        }
        let timeout: RedisError = io::Error::from(io::ErrorKind::TimedOut).into();
        assert!(!refused_unrun(&timeout) && !script_failed(&timeout));
    }
}

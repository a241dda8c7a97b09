//! What a domain [`Error`] is over gRPC: the status a call ends with, and
//! the `google.rpc.Status` a batch item carries.

use crate::error::Error;
use crate::pb::google::rpc;

/// The gRPC code of `err`: a refused request is INVALID_ARGUMENT, an
/// unknown policy NOT_FOUND, a passing store fault UNAVAILABLE (a later
/// call may succeed), any other store fault INTERNAL, and a call shed for
/// load RESOURCE_EXHAUSTED.
pub(crate) fn code(err: &Error) -> tonic::Code {
    match err {
        Error::InvalidArgument(_) => tonic::Code::InvalidArgument,
        Error::NotFound(_) => tonic::Code::NotFound,
        Error::Store(err) if err.is_transient() => tonic::Code::Unavailable,
        Error::Store(_) => tonic::Code::Internal,
        Error::Overloaded(_) => tonic::Code::ResourceExhausted,
    }
}

impl From<Error> for tonic::Status {
    /// The message is `field: rule` for a refused request, else what went
    /// wrong.
    fn from(err: Error) -> Self {
        tonic::Status::new(code(&err), err.to_string())
    }
}

/// `err` as one item of a batch's answer.
pub(crate) fn item_status(err: &Error) -> rpc::Status {
    rpc::Status {
        code: code(err) as i32,
        message: err.to_string(),
        details: Vec::new(),
    }
}

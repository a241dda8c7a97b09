//! The gRPC faces of the service: each turns its protocol's requests into
//! validated [`crate::limit`] types, asks the [`crate::limiter::Limiter`], and
//! turns decisions back into its protocol.

pub mod check;
pub mod envoy;
pub mod rlqs;

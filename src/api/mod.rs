//! The gRPC faces of the service: each turns its protocol's requests into
//! validated [`crate::limit`] types, asks the core ([`crate::decider`], or
//! the [`crate::limiter::Limiter`] for Envoy's rules), and turns decisions
//! back into its protocol; `status` is what an error is over gRPC.

pub mod check;
pub(crate) mod envoy;
pub(crate) mod lease;
pub(crate) mod rlqs;
pub(crate) mod status;

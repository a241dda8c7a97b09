//! One validated question for the limiter: a caller's key, the algorithm
//! it is limited under, and what it would spend.

use super::Algorithm;
use crate::limit::CallerKey;

/// One validated question: may `key` spend `cost` under `algorithm` now?
#[derive(Debug, Clone, PartialEq)]
pub struct LimitRequest {
    /// Who is limited.
    pub key: CallerKey,
    /// Under which limit.
    pub algorithm: Algorithm,
    /// Units to spend (0 looks without spending).
    pub cost: u64,
    /// Decided and reported, but never the reason a group of limits is
    /// denied (Envoy's shadow mode). Always `false` for `CheckLimit`.
    pub shadow: bool,
}

//! Decides validated requests on the configured store: names each storage
//! key, then runs the requests' algorithms there, all of one call's limits
//! together; when Redis cannot answer, applies the failure policy. Knows
//! nothing of gRPC.
//!
//! [`Limiter`] (`decisions`) decides on a [`Store`] (`store`): `keys` names
//! and groups a call's keys, `on_redis` and `in_memory` drive the two
//! stores (the scripts' side in `script`), `split` decides a call across
//! the main Redis and the per-second one, `failure` answers while Redis
//! cannot, `denial_cache` remembers what Redis denied, and `reset` is an
//! operator's reset of keys.

mod decisions;
mod denial_cache;
mod failure;
mod give_back;
mod in_memory;
mod keys;
mod on_redis;
mod options;
mod reset;
pub mod script;
mod split;
mod store;

pub use self::decisions::Limiter;
pub use self::denial_cache::DenialCache;
pub use self::give_back::MarkedDecision;
pub use self::keys::{Route, storage_key};
pub use self::options::{DEFAULT_KEY_PREFIX, LimiterOptions};
pub use self::reset::ResetKey;
pub use self::store::Store;

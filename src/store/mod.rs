//! Where decisions keep their state: Redis, shared by every ratelimitd
//! instance, or the embedded in-process store ([`Backend`], one or the
//! other). Knows nothing of the algorithms: the limiter chooses which
//! (`limiter::Store`).
//!
//! `redis` runs scripts through pools that `managers` open (`pinned_tls`
//! for a pinned server certificate), behind a `breaker` per node (on a
//! Cluster, one per primary: `nodes`), as `redis_settings` say, many calls
//! to one node as one script call (`batch`), and reads what goes wrong as
//! `redis_errors` says; `memory` keeps state in this
//! process, reading the time from `clock` (beside the script part that
//! reads Redis's); `options` turns the command line into settings.

mod backend;
mod batch;
pub mod breaker;
mod clock;
mod managers;
pub mod memory;
mod nodes;
pub mod options;
mod pinned_tls;
pub mod redis;
mod redis_errors;
mod redis_settings;

pub use self::backend::Backend;
pub use self::batch::{
    Args, BatchCall, BatchScripts, Batchable, ScriptArgs, ScriptReply, script_values,
};
pub use self::clock::{CLOCK_LUA, Clock, ManualClock, SystemClock};
pub use self::memory::{MemoryChange, MemoryStore};
pub use self::options::{EmbeddedSettings, RedisUrl, StoreOptions, StoreSettings, redacted_url};
pub use self::redis::RedisStore;
pub use self::redis_settings::{Credentials, RedisSettings, RedisTls, Sentinel, Topology};

//! ratelimitd: a rate-limit decision service.
//!
//! Application servers and proxies ask over gRPC "may this key spend this much
//! now?" and get allow or deny, with the limit, what remains and when to retry.
//! A request flows top to bottom through these modules:
//!
//! - [`server`] builds the tonic router (our API, Envoy's, health,
//!   reflection; TLS) and runs it until a shutdown signal, on connections
//!   that [`incoming`] accepts and closes (cap, idle, shutdown) and
//!   [`drain`] tracks calls on; [`load_shed`] sheds decisions beyond the
//!   limit in flight; [`health`] keeps the health status truthful, and
//!   [`http`] serves it at `/healthcheck` beside `/json` and the debug
//!   endpoints.
//! - [`api`] turns protobuf requests into validated [`limit`] types and
//!   decisions back into protobuf; it is the only layer that knows tonic
//!   besides [`server`], [`pb`] and `/json` in [`http`].
//! - [`limiter`] names the storage key and hands the request to its
//!   [`algorithm`] on the configured store.
//! - [`rules`] holds the operator's rules as loaded from the rules files (or
//!   xDS) into one snapshot every face reads: Envoy's descriptors, the quota
//!   service's policies, and [`policy`], the named limit sets that
//!   `CheckLimit` callers may name instead of parameters; [`spec`] is what
//!   their grammars share.
//! - [`quota`] splits each Envoy quota bucket's rate among the Envoys
//!   reporting it (the quota service, `api::rlqs`), on the same store.
//! - [`algorithm`] holds, per algorithm, its Lua script for Redis and its
//!   in-memory twin with the same semantics; its registry is the one place
//!   that names the algorithms (their tags and Lua sources too) and builds
//!   them from a face's parameters, and the scripts, the metrics and the
//!   benchmarks take their lists of algorithms from it.
//! - [`store`] runs scripts on Redis through a deadpool pool, or keeps state in
//!   an embedded map with expiry.
//!
//! [`stats`] names envoyproxy/ratelimit's statistics as upstream does and
//! sends them over statsd and to the metrics endpoint through a
//! statsd_exporter mapping, beside ratelimitd's own [`metrics`].
//!
//! [`config`] gathers the command line and environment (and
//! envoyproxy/ratelimit's variables) into each subsystem's group of
//! options, which the subsystem turns into its settings; [`options`] holds
//! what the groups share. [`error`] and [`options`] are leaves that every
//! layer may use.

pub mod algorithm;
#[cfg(test)]
mod algorithm_lists;
pub mod api;
pub mod codec;
pub mod config;
pub mod drain;
pub mod error;
pub mod health;
pub mod http;
pub mod incoming;
pub mod limit;
pub mod limiter;
pub mod live;
pub mod load_shed;
pub mod metrics;
pub mod options;
pub mod pb;
pub mod policy;
pub mod quota;
pub mod rules;
pub mod server;
pub mod simulate;
pub mod spec;
pub mod stats;
pub mod store;
pub mod telemetry;
pub mod tls;

//! ratelimitd: a rate-limit decision service.
//!
//! Application servers and proxies ask over gRPC "may this key spend this much
//! now?" and get allow or deny, with the limit, what remains and when to retry.
//! The `ratelimitd` binary serves that question over gRPC, HTTP/JSON and
//! Envoy's rate limit protocols; this library is the same service without
//! the transport, for a program that decides in its own process.
//!
//! # Embedding the decision service
//!
//! A [`decider::Decider`] answers [`decider::Question`]s on a
//! [`limiter::Limiter`], which keeps its counters on a [`limiter::Store`]:
//! the embedded store in this process (below), or Redis shared by every
//! instance ([`store::RedisStore`]). A question names its limits already
//! validated: each algorithm's parameters ([`algorithm::FixedWindow`],
//! [`algorithm::TokenBucket`], ...) are checked when they are made, and a
//! broken rule is an [`limit::InvalidArgument`] naming the field. Being
//! over the limit is a [`limit::Decision`], not an error; an
//! [`error::Error`] means no decision could be had.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use ratelimitd::decider::{Answer, Decider, Limits, NamedLimit, Question};
//! use ratelimitd::algorithm::{Algorithm, FixedWindow, LimitRequest, TokenBucket};
//! use ratelimitd::limit::CallerKey;
//! use ratelimitd::limiter::{Limiter, Store};
//! use ratelimitd::store::{MemoryStore, SystemClock};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # tokio::runtime::Runtime::new()?.block_on(async {
//! let store = Store::Memory(MemoryStore::new(Arc::new(SystemClock::default())));
//! let decider = Decider::new(Limiter::new(store, "myapp:"));
//!
//! // Two limits on one caller, decided together: both allow, or nothing
//! // is spent.
//! let key = CallerKey::new("user-42".to_owned())?;
//! let limit = |name: &str, algorithm| NamedLimit {
//!     name: name.to_owned(),
//!     request: LimitRequest {
//!         key: CallerKey::named(name, &key),
//!         algorithm,
//!         cost: 1,
//!         shadow: false,
//!     },
//! };
//! let question = Question {
//!     limits: Limits::Several(vec![
//!         limit("burst", Algorithm::TokenBucket(TokenBucket::new(5, 1.0)?)),
//!         limit("hourly", Algorithm::FixedWindow(FixedWindow::new(100, Duration::from_secs(3600))?)),
//!     ]),
//!     failure_policy: None,
//! };
//! let Answer::Several(answer) = decider.decide(question).await? else {
//!     unreachable!("several limits asked, several answered");
//! };
//! assert!(answer.is_allowed());
//! // The limit closest to denying speaks for the answer: the bucket.
//! let speaker = answer.most_restrictive().expect("two limits");
//! assert_eq!(answer.labels[speaker].name, "burst");
//! assert_eq!(answer.decisions[speaker].remaining(), 4);
//! # Ok::<_, Box<dyn std::error::Error>>(())
//! # })
//! # }
//! ```
//!
//! # How a request flows
//!
//! In the server, a request flows top to bottom through these modules:
//!
//! - [`server`] builds the tonic router (our API, Envoy's, health,
//!   reflection; TLS) and runs it until a shutdown signal, on connections
//!   that [`incoming`] accepts and closes (cap, idle, shutdown) and
//!   `drain` tracks calls on; `load_shed` sheds decisions beyond the
//!   limit in flight; [`health`] keeps the health status truthful, and
//!   [`http`] serves it at `/healthcheck` beside `/json` and the debug
//!   endpoints.
//! - [`api`] turns protobuf requests into validated [`limit`] and
//!   [`algorithm`] types and decisions back into protobuf, and errors into
//!   gRPC statuses; with
//!   [`server`] it is the layer that knows tonic (beside the connection
//!   plumbing: [`incoming`], `drain`, [`health`], `codec`, [`pb`]).
//!   [`http`] speaks the same protobuf messages in their JSON mapping and
//!   maps errors to HTTP statuses of its own.
//! - [`decider`] is the decision service the faces ask, free of any
//!   transport: a validated question (one limit, several, a named
//!   [`policy`]'s; or a batch) in, decisions or an [`error::Error`] out.
//! - [`limiter`] names the storage key and hands the request to its
//!   [`algorithm`] on the configured store.
//! - [`rules`] holds the operator's rules as loaded from the rules files (or
//!   xDS) into one snapshot every face reads: Envoy's descriptors, the quota
//!   service's policies, and [`policy`], the named limit sets that
//!   `CheckLimit` callers may name instead of parameters; `spec` is what
//!   their grammars share.
//! - [`quota`] splits each Envoy quota bucket's rate among the Envoys
//!   reporting it (the quota service, `api::rlqs`), on the same store.
//! - [`algorithm`] holds, per algorithm, its parameters, its Lua script
//!   for Redis and its in-memory twin with the same semantics; its
//!   registry is the one list of the algorithms (their tags and Lua
//!   sources too), from which the [`algorithm::Algorithm`] enum, the
//!   per-key state and every match over them are made, and which builds
//!   them from a face's parameters; the scripts, the metrics and the
//!   benchmarks take their lists of algorithms from it. A
//!   [`algorithm::LimitRequest`] is one key under one algorithm.
//! - [`store`] runs scripts on Redis through a deadpool pool, or keeps state in
//!   an embedded map with expiry.
//!
//! [`stats`] names envoyproxy/ratelimit's statistics as upstream does and
//! sends them over statsd and to the metrics endpoint through a
//! statsd_exporter mapping, beside ratelimitd's own `metrics`.
//!
//! [`config`] gathers the command line and environment (and
//! envoyproxy/ratelimit's variables) into each subsystem's group of
//! options, which the subsystem turns into its settings; [`options`] holds
//! what the groups share. [`error`] and [`options`] are leaves that every
//! layer may use; [`config_error`] is the one error of what the operator
//! configured wrong, in the rules files, the options or the command line.

pub mod algorithm;
#[cfg(test)]
mod algorithm_lists;
pub mod api;
pub(crate) mod codec;
pub mod config;
pub mod config_error;
pub mod decider;
pub(crate) mod drain;
pub mod error;
pub mod health;
pub mod http;
pub mod incoming;
pub mod lease;
pub mod limit;
pub mod limiter;
pub(crate) mod live;
pub(crate) mod load_shed;
pub(crate) mod metrics;
pub mod options;
pub mod pb;
pub mod policy;
pub mod quota;
pub mod rules;
pub mod server;
pub mod simulate;
pub(crate) mod spec;
pub mod stats;
pub mod store;
pub mod telemetry;
pub(crate) mod tls;
pub mod worker;

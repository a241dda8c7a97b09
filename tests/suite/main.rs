//! The integration tests, as one test binary: each module is the tests of
//! one part of ratelimitd, and `common` is what they start and how they
//! talk to it. One binary links the helpers and the crate once; cargo runs
//! its tests on threads of one process, so every test starts its own
//! servers on free ports and touches nothing another test could see.
//!
//! Run one module's tests with `cargo test --test suite twins::`, or one
//! test by its name.

mod common;

mod admin_api;
mod batches;
// The load generator is built only with the `bench` feature.
#[cfg(feature = "bench")]
mod bench_smoke;
mod clients;
mod cluster_failover;
mod concurrency;
mod configuration_reference;
mod conformance;
mod connections;
mod console;
mod console_api;
mod deploy;
mod docs_links;
mod documented_commands;
mod envoy_gateway;
mod envoy_proxy;
mod envoy_quota;
mod envoy_quota_failover;
mod envoy_quota_pinned;
mod envoy_reload;
mod envoy_rls;
mod envoyproxy_env;
mod failure_policy;
mod grpc_limits;
mod grpcurl;
mod http_api;
mod http_endpoints;
mod lease_clients;
mod leases;
mod local_cache;
mod memory_cap;
mod metrics;
mod per_second;
mod policies;
mod quota_twins;
mod readme_apps;
mod readme_installs;
mod redis_batching;
mod redis_faults;
mod redis_security;
mod refunds;
mod request_bounds;
mod rlqs;
mod rlqs_instances;
mod rolling_switch;
mod server;
mod several_limits;
mod sliding_window_log;
mod start_and_stop;
mod structure;
mod together;
mod topologies;
mod topologies_secured;
mod topology_harness;
mod twins;
mod upstream_integration;
mod upstream_scripts;
mod upstream_stats;
mod validation;
mod xds;

//! What the integration tests start for themselves, and how they talk to it:
//! `redis-server` processes in every topology (`redis/`), ratelimitd in
//! process (`ratelimitd.rs`) or as a child process (`server_process.rs`), a real Envoy
//! (`envoy.rs`), an xDS management server (`xds.rs`), and the clients and
//! waits around them. Every process is on a free loopback port in a
//! temporary directory and is killed when the test lets go of it; nothing
//! here touches the machine's own Redis on 6379.
//!
//! The helpers most tests use are re-exported here (`common::TestServer`,
//! `common::eventually`, `common::check`, ...); the rest are reached through
//! their module (`common::redis::RedisCluster`, `common::envoy::Envoy`).

pub(crate) mod checks;
pub(crate) mod client_installs;
pub(crate) mod draws;
pub(crate) mod envoy;
pub(crate) mod grpc;
pub(crate) mod http;
pub(crate) mod leases;
pub(crate) mod markdown;
pub(crate) mod openapi;
pub(crate) mod process;
pub(crate) mod prometheus;
pub(crate) mod quota;
pub(crate) mod quota_policies;
pub(crate) mod ratelimitd;
pub(crate) mod redis;
pub(crate) mod rls;
pub(crate) mod sandbox;
pub(crate) mod server_process;
pub(crate) mod tls;
pub(crate) mod tools;
pub(crate) mod wait;
pub(crate) mod xds;

// The helpers most tests use, by their short names.
pub(crate) use self::{
    checks::*,
    grpc::*,
    process::{free_port, send_signal},
    ratelimitd::{TestServer, server_quick_to_notice},
    redis::RedisServer,
    server_process::ServerProcess,
    wait::{PATIENCE, eventually, fresh_minute},
};

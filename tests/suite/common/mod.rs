//! What the integration tests start for themselves, and how they talk to it:
//! `redis-server` processes in every topology (`redis/`), ratelimitd in
//! process or as a child process (`ratelimitd.rs`), a real Envoy
//! (`envoy.rs`), an xDS management server (`xds.rs`), and the clients and
//! waits around them. Every process is on a free loopback port in a
//! temporary directory and is killed when the test lets go of it; nothing
//! here touches the machine's own Redis on 6379.
//!
//! The helpers most tests use are re-exported here (`common::TestServer`,
//! `common::eventually`, `common::check`, ...); the rest are reached through
//! their module (`common::redis::RedisCluster`, `common::envoy::Envoy`).

// Each test file uses its own part of this module, and all of it is `pub`
// for them (no one crate sees it whole).
#![allow(dead_code, unreachable_pub)]

pub mod checks;
pub mod envoy;
pub mod grpc;
pub mod http;
pub mod markdown;
pub mod openapi;
pub mod process;
pub mod prometheus;
pub mod quota;
pub mod random;
pub mod ratelimitd;
pub mod redis;
pub mod rls;
pub mod sandbox;
pub mod tls;
pub mod tools;
pub mod wait;
pub mod xds;

// The helpers most tests use, by their short names; a test binary that
// uses none of some would otherwise be told so.
#[allow(unused_imports)]
pub use self::{
    checks::*,
    grpc::*,
    process::{free_port, send_signal},
    ratelimitd::{ServerProcess, TestServer, server_quick_to_notice},
    redis::RedisServer,
    wait::{PATIENCE, eventually, fresh_minute},
};

//! Redis as the tests run it, the ways production runs it: a single server
//! ([`RedisServer`], plain or demanding a password, an ACL user or TLS), a
//! Redis Cluster ([`RedisCluster`], 3 primaries and 3 replicas) and a
//! Sentinel group ([`RedisSentinel`], a primary, a replica and 3
//! sentinels), each secured or not by a [`Security`].
//!
//! Every process is `redis-server` from PATH (Redis 7), started one way
//! ([`process::RedisProcess`]): on a free loopback port, in its own folder
//! of its topology's temporary directory, where it also logs. A topology
//! kills all its processes when dropped, frozen ones too, and then removes
//! its directory. Nothing here touches the machine's own Redis on 6379.

pub(crate) mod access;
pub(crate) mod cluster;
pub(crate) mod cluster_node;
pub(crate) mod cluster_state;
pub(crate) mod directives;
pub(crate) mod process;
pub(crate) mod queries;
pub(crate) mod security;
pub(crate) mod sentinel;
pub(crate) mod standalone;

// What the tests name, by short paths; a test binary that uses none of
// some would otherwise be told so.
#[allow(unused_imports)]
pub(crate) use self::{
    access::Secured,
    cluster::RedisCluster,
    cluster_node::{CLUSTER_SLOTS, ClusterNode, Role},
    queries::info_field,
    security::{ClientCertificates, Security, SentinelPassword},
    sentinel::{MASTER_NAME, RedisSentinel},
    standalone::RedisServer,
};

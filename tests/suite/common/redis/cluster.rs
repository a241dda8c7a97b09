//! A Redis Cluster of the test's own, 3 primaries and 3 replicas, plain or
//! secured ([`Security`]): started, created with `redis-cli --cluster
//! create`, and its nodes killed, frozen, thawed and restarted. What the
//! nodes say of each other, and the waits built on it, are in
//! `cluster_state.rs`. A node is failed after 1 s
//! (`cluster-node-timeout`), so failovers take seconds.

use std::time::Duration;

use super::access::{Access, Secured};
use super::cluster_node::ClusterNode;
use super::directives::directive;
use super::process::Nodes;
use super::queries::{run, script_calls_in};
use super::security::{Security, Setup};
use crate::common::process::free_port;

/// How long `redis-cli --cluster create` may take (it waits for the nodes
/// to agree, which takes about a second).
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// A 3-primary, 3-replica Redis Cluster of our own.
pub(crate) struct RedisCluster {
    /// In creation order (`redis-cli --cluster create` makes the first three
    /// primaries, but nothing here counts on it: ask
    /// [`RedisCluster::primaries`]).
    pub(super) nodes: Nodes,
    pub(super) setup: Setup,
}

impl RedisCluster {
    /// Starts 6 nodes, joins them with `redis-cli --cluster create
    /// --cluster-replicas 1`, and waits until every node reports
    /// `cluster_state:ok` with all 16384 slots served, all nodes agree on who
    /// serves which, and every replica's link to its primary is up.
    pub(crate) async fn start() -> Self {
        Self::start_with(Security::default()).await
    }

    /// As [`RedisCluster::start`], with every node demanding `security`: a
    /// password (`requirepass`, and `masterauth` so that replicas get in),
    /// and/or TLS only (`port 0`, `tls-port`; the cluster bus and the
    /// replication links over TLS too: `tls-cluster yes`, `tls-replication
    /// yes`), with certificates made for the test
    /// ([`crate::common::tls::write_certificates`]; the nodes show the
    /// client certificate when they connect to each other), and/or an ACL
    /// user (`user NAME on >PASSWORD ~* &* +@all`, the default user off,
    /// and `masteruser`/`masterauth` so that replicas get in; `redis-cli
    /// --cluster create` and the harness's own queries log in as that
    /// user). [`RedisCluster::urls`] then carry the password (and the user)
    /// and use `rediss://`; a client must trust [`Secured::ca_cert_path`].
    pub(crate) async fn start_with(security: Security) -> Self {
        let setup = Setup::new("the Redis Cluster", security);
        let tls = setup.access().tls_files().is_some();
        let mut nodes = Vec::new();
        for index in 0..6 {
            let node = setup
                .start_data_node(
                    format!("cluster node {index}"),
                    &format!("node{index}"),
                    |_| {
                        // The bus port is set, not left at port + 10000,
                        // which may be above 65535 or taken.
                        let bus_port = free_port().to_string();
                        let mut directives = vec![
                            directive(&["cluster-enabled", "yes"]),
                            directive(&["cluster-port", &bus_port]),
                            directive(&["cluster-config-file", "nodes.conf"]),
                            directive(&["cluster-node-timeout", "1000"]),
                        ];
                        if tls {
                            directives.push(directive(&["tls-cluster", "yes"]));
                        }
                        directives
                    },
                )
                .await;
            nodes.push(node);
        }
        let cluster = Self {
            nodes: Nodes::new("cluster node", nodes),
            setup,
        };
        cluster.create().await;
        cluster.await_healthy().await;
        cluster
    }

    /// `redis-cli --cluster create`: assigns the slots to the first three
    /// nodes and makes each of the others a replica of one of them.
    async fn create(&self) {
        let mut args = vec!["--cluster".to_owned(), "create".to_owned()];
        args.extend(
            self.nodes
                .ports()
                .into_iter()
                .map(|port| format!("127.0.0.1:{port}")),
        );
        args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(str::to_owned));
        args.extend(self.setup.access().cli_args(true));
        args.push("--no-auth-warning".to_owned());
        let output = run("redis-cli", args, CREATE_TIMEOUT).await;
        let created = output
            .as_ref()
            .is_ok_and(|text| text.contains("[OK] All 16384 slots covered"));
        assert!(
            created,
            "redis-cli --cluster create failed: {}",
            output.unwrap_or_else(|why| why)
        );
    }

    /// The `redis://127.0.0.1:port` of each node still answering (neither
    /// killed nor frozen), in creation order: seeds for a cluster client.
    /// Started [`RedisCluster::start_with`] a password, it is in each URL
    /// (`redis://:PASSWORD@127.0.0.1:port`, percent-encoded), and with an
    /// ACL user, the user and its password (`redis://USER:PASSWORD@...`);
    /// with TLS they are `rediss://`.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.live_ports()
            .into_iter()
            .map(|port| self.setup.access().url(port))
            .collect()
    }

    /// The ports of the nodes still answering (neither killed nor frozen).
    pub(crate) fn live_ports(&self) -> Vec<u16> {
        self.nodes.answering_ports()
    }

    /// A cluster client's connection, seeded with every running node: it
    /// follows the slots itself (MOVED, ASK, failovers).
    pub(crate) async fn connection(&self) -> redis::cluster_async::ClusterConnection {
        let mut builder = redis::cluster::ClusterClientBuilder::new(self.urls());
        if let Some(certificates) = self.setup.access().certificates() {
            builder = builder.certs(certificates);
        }
        builder
            .build()
            .expect("cluster client for the test cluster")
            .get_async_connection()
            .await
            .expect("connect to the test cluster")
    }

    /// A connection to one node (logged in, over TLS if need be): it
    /// answers MOVED for keys it does not serve.
    pub(crate) async fn node_connection(&self, port: u16) -> redis::aio::MultiplexedConnection {
        self.setup
            .access()
            .connect(port)
            .await
            .unwrap_or_else(|why| panic!("cannot connect to cluster node {port}: {why}"))
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`: only the `{hash tag}`
    /// counts, if there is one).
    pub(crate) async fn slot_of(&self, key: &str) -> u16 {
        let port = *self
            .live_ports()
            .first()
            .expect("a cluster node is running");
        self.setup
            .access()
            .query(port, redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
            .await
            .unwrap_or_else(|why| panic!("CLUSTER KEYSLOT {key}: {why}"))
    }

    /// The primary that serves `key` now.
    pub(crate) async fn primary_for_key(&self, key: &str) -> ClusterNode {
        let slot = self.slot_of(key).await;
        self.primaries()
            .await
            .into_iter()
            .find(|node| node.owns_slot(slot))
            .unwrap_or_else(|| panic!("no primary serves slot {slot} of {key:?}"))
    }

    /// How many keys each primary holds (`DBSIZE`), in the order of
    /// [`RedisCluster::primaries`], as (port, keys): shows how keys spread.
    pub(crate) async fn keys_per_primary(&self) -> Vec<(u16, u64)> {
        let mut counts = Vec::new();
        for primary in self.primaries().await {
            let keys: u64 = self
                .setup
                .access()
                .query(primary.port, &redis::cmd("DBSIZE"))
                .await
                .unwrap_or_else(|why| panic!("DBSIZE on {}: {why}", primary.port));
            counts.push((primary.port, keys));
        }
        counts
    }

    /// Script calls (`EVALSHA` and `EVAL`) the primaries have run, from
    /// their `INFO commandstats`.
    pub(crate) async fn script_calls(&self) -> u64 {
        let mut calls = 0;
        for primary in self.primaries().await {
            let info: String = self
                .setup
                .access()
                .query(primary.port, redis::cmd("INFO").arg("commandstats"))
                .await
                .unwrap_or_else(|why| panic!("INFO commandstats on {}: {why}", primary.port));
            calls += script_calls_in(&info);
        }
        calls
    }

    /// SIGKILLs the primary at `index` of [`RedisCluster::primaries`], as in
    /// a crash, and returns it as it was. Its replica takes over after about
    /// the node timeout (1 s): see [`RedisCluster::await_failover`]. Killing
    /// a primary that has no replica left (one promoted by an earlier
    /// failover) loses its slots for good.
    pub(crate) async fn kill_primary(&mut self, index: usize) -> ClusterNode {
        let primaries = self.primaries().await;
        let primary = primaries
            .get(index)
            .unwrap_or_else(|| panic!("no primary {index}: the cluster has {primaries:?}"))
            .clone();
        self.nodes.get_mut(primary.port).kill();
        primary
    }

    /// Starts a killed node again on its port, with its `nodes.conf`: it
    /// rejoins, as a replica if its slots have been taken over. Follow
    /// with [`RedisCluster::await_healthy`].
    pub(crate) async fn restart_node(&mut self, port: u16) {
        self.nodes.get_mut(port).restart().await;
    }

    /// SIGSTOP: the node keeps its connections but answers nothing, as on a
    /// hung host. After the node timeout the cluster fails it over, and
    /// [`RedisCluster::await_failover`] waits for that as for a kill. Until
    /// thawed it counts as gone: not in [`RedisCluster::urls`], and
    /// [`RedisCluster::await_healthy`] wants it flagged `fail`.
    pub(crate) fn freeze(&self, port: u16) {
        self.nodes.get(port).freeze();
    }

    /// SIGCONT after [`RedisCluster::freeze`]: the node rejoins, as a
    /// replica if its slots have been taken over meanwhile. Follow with
    /// [`RedisCluster::await_healthy`].
    pub(crate) fn thaw(&self, port: u16) {
        self.nodes.get(port).thaw();
    }
}

impl Secured for RedisCluster {
    fn access(&self) -> &Access {
        self.setup.access()
    }
}

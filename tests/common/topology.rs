//! Redis set up the ways production runs it, for the tests that need more
//! than one plain server: a Redis Cluster (3 primaries, 3 replicas), a
//! Sentinel group (a primary, a replica, 3 sentinels), and single servers
//! that demand a password, an ACL user or TLS. The cluster and the sentinel
//! group can demand a password and/or TLS too (`start_with(Security)`).
//!
//! Every process is `redis-server` from PATH (Redis 7), on free loopback
//! ports, in its own folder of the harness's temporary directory, where it
//! also logs (`redis.log`, and `stderr.log` for what it says before its log
//! is open). Timeouts are short so that failovers take seconds: a cluster
//! node is failed after 1 s (`cluster-node-timeout`), a sentinel's primary
//! after 1 s (`down-after-milliseconds`). A harness kills all its processes
//! when dropped, frozen ones too, and then removes its directory. Nothing
//! here touches the machine's own Redis on 6379.

use std::collections::{BTreeMap, HashMap};
use std::fs::OpenOptions;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::{PATIENCE, free_port};

/// Slots in a Redis Cluster.
pub const CLUSTER_SLOTS: usize = 16384;

/// How often the harness looks again while it waits for a topology to
/// settle. Each look opens a few loopback connections.
const POLL: Duration = Duration::from_millis(50);

/// How long one `redis-cli` run may take before it is killed: a frozen
/// server would otherwise hang it forever.
const CLI_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `redis-cli --cluster create` may take (it waits for the nodes
/// to agree, which takes about a second).
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Settings every data node gets: no persistence (nothing to clean up, no
/// fork for a save), and full resyncs that start at once instead of waiting
/// 5 s for more replicas (the Redis 7 default), so replicas are in sync, and
/// therefore eligible for failover, within milliseconds.
const DATA_NODE_SETTINGS: [&str; 6] = [
    "--save",
    "",
    "--appendonly",
    "no",
    "--repl-diskless-sync-delay",
    "0",
];

// ---------------------------------------------------------------------------
// Redis Cluster
// ---------------------------------------------------------------------------

/// A 3-primary, 3-replica Redis Cluster of our own.
pub struct RedisCluster {
    /// In creation order (`redis-cli --cluster create` makes the first three
    /// primaries, but nothing here counts on it: ask
    /// [`RedisCluster::primaries`]). Declared before `dir` so the processes
    /// die before their folders are removed.
    nodes: Vec<Process>,
    /// What gets a client past the nodes (nothing, for [`RedisCluster::start`]).
    access: Access,
    dir: tempfile::TempDir,
}

/// Who serves which slots: port to slot ranges.
type SlotOwners = BTreeMap<u16, Vec<RangeInclusive<u16>>>;

/// What a node is in a cluster or a replication pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Primary,
    Replica,
}

/// One node as the cluster sees it (a line of `CLUSTER NODES`), with the
/// process id of ours that runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The 40-character node id.
    pub id: String,
    pub port: u16,
    /// `None` once the harness has killed it (a frozen node keeps its pid).
    pub pid: Option<u32>,
    pub role: Role,
    /// For a replica, the id of its primary.
    pub primary_id: Option<String>,
    /// The slot ranges it serves (empty for a replica).
    pub slots: Vec<RangeInclusive<u16>>,
    /// The flags as the node asked reported them: `myself`, `master`,
    /// `slave`, `fail?`, `fail`, `handshake`, ...
    pub flags: Vec<String>,
}

impl ClusterNode {
    pub fn url(&self) -> String {
        node_url(self.port)
    }

    pub fn owns_slot(&self, slot: u16) -> bool {
        self.slots.iter().any(|range| range.contains(&slot))
    }

    pub fn slot_count(&self) -> usize {
        self.slots.iter().map(|range| range.len()).sum()
    }

    /// Flagged `fail` (agreed by the cluster) or `fail?` (suspected by the
    /// node asked).
    pub fn is_failing(&self) -> bool {
        self.has_flag("fail") || self.has_flag("fail?")
    }

    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    fn first_slot(&self) -> Option<u16> {
        self.slots.first().map(|range| *range.start())
    }
}

impl RedisCluster {
    /// Starts 6 nodes, joins them with `redis-cli --cluster create
    /// --cluster-replicas 1`, and waits until every node reports
    /// `cluster_state:ok` with all 16384 slots served, all nodes agree on who
    /// serves which, and every replica's link to its primary is up.
    pub async fn start() -> Self {
        Self::start_with(Security::default()).await
    }

    /// As [`RedisCluster::start`], with every node demanding `security`: a
    /// password (`requirepass`, and `masterauth` so that replicas get in),
    /// and/or TLS only (`port 0`, `tls-port`; the cluster bus and the
    /// replication links over TLS too: `tls-cluster yes`, `tls-replication
    /// yes`), with certificates made for the test ([`write_certificates`];
    /// the nodes show the client certificate when they connect to each
    /// other), and/or an ACL user (`user NAME on >PASSWORD ~* &* +@all`,
    /// the default user off, and `masteruser`/`masterauth` so that replicas
    /// get in; `redis-cli --cluster create` and the harness's own queries
    /// log in as that user). [`RedisCluster::urls`] then carry the password
    /// (and the user) and use `rediss://`; a client must trust
    /// [`RedisCluster::ca_cert_path`].
    pub async fn start_with(security: Security) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory for the Redis Cluster");
        let tls_files = security
            .tls
            .map(|_| write_certificates(&dir.path().join("tls")));
        let access = Access::new(&security, tls_files.as_ref());
        let secured = secured_node_args(&security, tls_files.as_ref());
        let mut nodes = Vec::new();
        for index in 0..6 {
            let node_dir = dir.path().join(format!("node{index}"));
            let data_dir = path_arg(&node_dir);
            let node = Process::start(
                format!("cluster node {index}"),
                node_dir,
                access.cli_args(true),
                |port| {
                    // The bus port is set, not left at port + 10000, which
                    // may be above 65535 or taken.
                    let bus_port = free_port();
                    let mut args = listen_args(port, tls_files.is_some());
                    if tls_files.is_some() {
                        args.extend(strings(&["--tls-cluster", "yes"]));
                    }
                    args.into_iter()
                        .chain(strings(&["--cluster-enabled", "yes"]))
                        .chain(strings(&["--cluster-port", &bus_port.to_string()]))
                        .chain(strings(&["--cluster-config-file", "nodes.conf"]))
                        .chain(strings(&["--cluster-node-timeout", "1000"]))
                        .chain(strings(&DATA_NODE_SETTINGS))
                        .chain(strings(&["--dir", &data_dir]))
                        .chain(secured.iter().cloned())
                        .collect()
                },
            )
            .await;
            nodes.push(node);
        }
        let cluster = Self { nodes, access, dir };
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
                .iter()
                .map(|node| format!("127.0.0.1:{}", node.port)),
        );
        args.extend(strings(&["--cluster-replicas", "1", "--cluster-yes"]));
        args.extend(self.access.cli_args(true));
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
    pub fn urls(&self) -> Vec<String> {
        self.live_ports()
            .into_iter()
            .map(|port| self.access.url(port))
            .collect()
    }

    /// The ports of the nodes still answering (neither killed nor frozen).
    pub fn live_ports(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|node| node.is_answering())
            .map(|node| node.port)
            .collect()
    }

    /// Every node the cluster knows, killed ones too, as a running node
    /// reports them, in creation order.
    pub async fn nodes(&self) -> Vec<ClusterNode> {
        let mut last_error = String::from("no node is running");
        for port in self.live_ports() {
            match self.nodes_seen_by(port).await {
                Ok(mut nodes) => {
                    nodes.sort_by_key(|node| self.index_of(node.port));
                    return nodes;
                }
                Err(why) => last_error = why,
            }
        }
        panic!("cannot ask the cluster for its nodes: {last_error}");
    }

    /// The primaries serving slots, ordered by their first slot, so that
    /// index 0 is whoever serves slot 0 (after a failover too).
    pub async fn primaries(&self) -> Vec<ClusterNode> {
        let mut primaries: Vec<ClusterNode> = self
            .nodes()
            .await
            .into_iter()
            .filter(|node| node.role == Role::Primary && !node.slots.is_empty())
            .filter(|node| !node.is_failing())
            .collect();
        primaries.sort_by_key(ClusterNode::first_slot);
        primaries
    }

    /// The replicas still answering (neither killed nor frozen).
    pub async fn replicas(&self) -> Vec<ClusterNode> {
        let live = self.live_ports();
        self.nodes()
            .await
            .into_iter()
            .filter(|node| node.role == Role::Replica && live.contains(&node.port))
            .collect()
    }

    /// SIGKILLs the primary at `index` of [`RedisCluster::primaries`], as in
    /// a crash, and returns it as it was. Its replica takes over after about
    /// the node timeout (1 s): see [`RedisCluster::await_failover`]. Killing
    /// a primary that has no replica left (one promoted by an earlier
    /// failover) loses its slots for good.
    pub async fn kill_primary(&mut self, index: usize) -> ClusterNode {
        let primaries = self.primaries().await;
        let primary = primaries
            .get(index)
            .unwrap_or_else(|| panic!("no primary {index}: the cluster has {primaries:?}"))
            .clone();
        self.process_mut(primary.port).kill();
        primary
    }

    /// Waits until the slots of `killed` (from [`RedisCluster::kill_primary`])
    /// are served by another node, which answers `ROLE` as a primary, and
    /// the cluster is healthy again as in [`RedisCluster::await_healthy`].
    /// Returns the new primary.
    pub async fn await_failover(&self, killed: &ClusterNode) -> ClusterNode {
        let slot = killed
            .first_slot()
            .expect("kill_primary returns a primary with slots");
        settle(
            &format!(
                "a replica to take over slot {slot} from port {}",
                killed.port
            ),
            || async move {
                let owner = self
                    .primaries()
                    .await
                    .into_iter()
                    .find(|node| node.owns_slot(slot))
                    .ok_or_else(|| format!("no running primary serves slot {slot}"))?;
                if owner.port == killed.port {
                    return Err(format!("port {} still serves slot {slot}", owner.port));
                }
                let role = role(&self.access, owner.port).await?;
                if role != "master" {
                    return Err(format!("port {} answers ROLE {role}", owner.port));
                }
                self.health().await?;
                Ok(owner)
            },
        )
        .await
    }

    /// Waits until every running node reports `cluster_state:ok` with all
    /// slots served, they all agree on who serves which slots, none of them
    /// is suspected, every running primary serves slots, every killed node
    /// is flagged `fail` by all of them, and every running replica's link to
    /// its primary is up.
    pub async fn await_healthy(&self) {
        settle("the Redis Cluster to be healthy", || self.health()).await;
    }

    /// Why the cluster is not healthy yet, if it is not.
    async fn health(&self) -> Result<(), String> {
        let live = self.live_ports();
        let mut agreed: Option<(u16, SlotOwners)> = None;
        for &port in &live {
            let info: String = query(&self.access, port, redis::cmd("CLUSTER").arg("INFO")).await?;
            for (field, wanted) in [
                ("cluster_state", "ok".to_owned()),
                ("cluster_slots_assigned", CLUSTER_SLOTS.to_string()),
                ("cluster_slots_ok", CLUSTER_SLOTS.to_string()),
                ("cluster_known_nodes", self.nodes.len().to_string()),
            ] {
                let value = info_field(&info, field);
                if value != Some(wanted.as_str()) {
                    return Err(format!("port {port} reports {field}:{value:?}"));
                }
            }
            let nodes = self.nodes_seen_by(port).await?;
            let mut owners = SlotOwners::new();
            for node in &nodes {
                let running = live.contains(&node.port);
                if running && (node.is_failing() || node.has_flag("handshake")) {
                    return Err(format!(
                        "port {port} sees {} as {:?}",
                        node.port, node.flags
                    ));
                }
                if !running && !node.has_flag("fail") {
                    return Err(format!(
                        "port {port} does not yet see the killed {} as failed",
                        node.port
                    ));
                }
                if running && node.role == Role::Primary && node.slots.is_empty() {
                    // A restarted primary whose slots were taken over, not
                    // yet turned into a replica.
                    return Err(format!(
                        "port {port} sees {} as a primary without slots",
                        node.port
                    ));
                }
                if !node.slots.is_empty() {
                    owners.insert(node.port, node.slots.clone());
                }
            }
            match &agreed {
                None => agreed = Some((port, owners)),
                Some((first, first_owners)) if *first_owners != owners => {
                    return Err(format!(
                        "port {first} and port {port} disagree about the slots: \
                         {first_owners:?} against {owners:?}"
                    ));
                }
                Some(_) => {}
            }
            let myself = nodes
                .iter()
                .find(|node| node.has_flag("myself"))
                .ok_or_else(|| format!("port {port} does not list itself"))?;
            if myself.role == Role::Replica {
                let replication: String =
                    query(&self.access, port, redis::cmd("INFO").arg("replication")).await?;
                let link = info_field(&replication, "master_link_status");
                if link != Some("up") {
                    return Err(format!("replica {port} has master_link_status:{link:?}"));
                }
            }
        }
        Ok(())
    }

    /// Waits until every running replica has everything its primary has
    /// written so far (its `slave_repl_offset` has reached the primary's
    /// `master_repl_offset`). Replication is asynchronous: a write that a
    /// replica has not received yet is lost when its primary is killed.
    pub async fn await_replicated(&self) {
        settle(
            "the replicas to catch up with their primaries",
            || async move {
                let nodes = self.nodes().await;
                let live = self.live_ports();
                for replica in nodes.iter().filter(|node| node.role == Role::Replica) {
                    if !live.contains(&replica.port) {
                        continue;
                    }
                    let primary = nodes
                        .iter()
                        .find(|node| Some(&node.id) == replica.primary_id.as_ref())
                        .ok_or_else(|| format!("replica {} has no known primary", replica.port))?;
                    caught_up(&self.access, primary.port, replica.port).await?;
                }
                Ok(())
            },
        )
        .await;
    }

    /// A cluster client's connection, seeded with every running node: it
    /// follows the slots itself (MOVED, ASK, failovers).
    pub async fn connection(&self) -> redis::cluster_async::ClusterConnection {
        let mut builder = redis::cluster::ClusterClientBuilder::new(self.urls());
        if let Some(certificates) = self.access.certificates() {
            install_crypto_provider();
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
    pub async fn node_connection(&self, port: u16) -> redis::aio::MultiplexedConnection {
        connect(&self.access, port)
            .await
            .unwrap_or_else(|why| panic!("cannot connect to cluster node {port}: {why}"))
    }

    /// The hash slot of `key` (`CLUSTER KEYSLOT`: only the `{hash tag}`
    /// counts, if there is one).
    pub async fn slot_of(&self, key: &str) -> u16 {
        let port = *self
            .live_ports()
            .first()
            .expect("a cluster node is running");
        query(
            &self.access,
            port,
            redis::cmd("CLUSTER").arg("KEYSLOT").arg(key),
        )
        .await
        .unwrap_or_else(|why| panic!("CLUSTER KEYSLOT {key}: {why}"))
    }

    /// The primary that serves `key` now.
    pub async fn primary_for_key(&self, key: &str) -> ClusterNode {
        let slot = self.slot_of(key).await;
        self.primaries()
            .await
            .into_iter()
            .find(|node| node.owns_slot(slot))
            .unwrap_or_else(|| panic!("no primary serves slot {slot} of {key:?}"))
    }

    /// How many keys each primary holds (`DBSIZE`), in the order of
    /// [`RedisCluster::primaries`], as (port, keys): shows how keys spread.
    pub async fn keys_per_primary(&self) -> Vec<(u16, u64)> {
        let mut counts = Vec::new();
        for primary in self.primaries().await {
            let keys: u64 = query(&self.access, primary.port, &redis::cmd("DBSIZE"))
                .await
                .unwrap_or_else(|why| panic!("DBSIZE on {}: {why}", primary.port));
            counts.push((primary.port, keys));
        }
        counts
    }

    /// Starts a killed node again on its port, with its `nodes.conf`: it
    /// rejoins, as a replica if its slots have been taken over. Follow
    /// with [`RedisCluster::await_healthy`].
    pub async fn restart_node(&mut self, port: u16) {
        self.process_mut(port).restart().await;
    }

    /// SIGSTOP: the node keeps its connections but answers nothing, as on a
    /// hung host. After the node timeout the cluster fails it over, and
    /// [`RedisCluster::await_failover`] waits for that as for a kill. Until
    /// thawed it counts as gone: not in [`RedisCluster::urls`], and
    /// [`RedisCluster::await_healthy`] wants it flagged `fail`.
    pub fn freeze(&self, port: u16) {
        self.process(port).freeze();
    }

    /// SIGCONT after [`RedisCluster::freeze`]: the node rejoins, as a
    /// replica if its slots have been taken over meanwhile. Follow with
    /// [`RedisCluster::await_healthy`].
    pub fn thaw(&self, port: u16) {
        self.process(port).thaw();
    }

    /// Where the nodes' folders (data, `nodes.conf`, logs) are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    async fn nodes_seen_by(&self, port: u16) -> Result<Vec<ClusterNode>, String> {
        let text: String = query(&self.access, port, redis::cmd("CLUSTER").arg("NODES")).await?;
        let mut nodes = text
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(parse_cluster_node)
            .collect::<Result<Vec<_>, _>>()?;
        for node in &mut nodes {
            node.pid = self
                .nodes
                .iter()
                .find(|process| process.port == node.port)
                .and_then(Process::pid);
        }
        Ok(nodes)
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|node| node.port == port)
            .unwrap_or(usize::MAX)
    }

    fn process(&self, port: u16) -> &Process {
        self.nodes
            .iter()
            .find(|node| node.port == port)
            .unwrap_or_else(|| panic!("no cluster node of ours on port {port}"))
    }

    fn process_mut(&mut self, port: u16) -> &mut Process {
        self.nodes
            .iter_mut()
            .find(|node| node.port == port)
            .unwrap_or_else(|| panic!("no cluster node of ours on port {port}"))
    }
}

/// One line of `CLUSTER NODES`: `<id> <ip:port@cport[,hostname]> <flags>
/// <primary> <ping-sent> <pong-recv> <config-epoch> <link-state> <slot>...`.
fn parse_cluster_node(line: &str) -> Result<ClusterNode, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [id, address, flags, primary, _, _, _, _, slots @ ..] = fields.as_slice() else {
        return Err(format!("unexpected CLUSTER NODES line: {line:?}"));
    };
    let port = address
        .split('@')
        .next()
        .and_then(|host_port| host_port.rsplit(':').next())
        .and_then(|port| port.parse().ok())
        .ok_or_else(|| format!("no port in CLUSTER NODES line: {line:?}"))?;
    let flags: Vec<String> = flags.split(',').map(str::to_owned).collect();
    let role = if flags.iter().any(|flag| flag == "slave") {
        Role::Replica
    } else {
        Role::Primary
    };
    let mut ranges = Vec::new();
    // `[slot->-id]` and `[slot-<-id]` are slots being migrated: not served
    // by this node yet, or still.
    for slot in slots.iter().filter(|slot| !slot.starts_with('[')) {
        let (start, end) = slot.split_once('-').unwrap_or((*slot, *slot));
        match (start.parse(), end.parse()) {
            (Ok(start), Ok(end)) => ranges.push(start..=end),
            _ => return Err(format!("bad slot {slot:?} in CLUSTER NODES line: {line:?}")),
        }
    }
    ranges.sort_by_key(|range| *range.start());
    Ok(ClusterNode {
        id: (*id).to_owned(),
        port,
        pid: None,
        role,
        primary_id: (*primary != "-").then(|| (*primary).to_owned()),
        slots: ranges,
        flags,
    })
}

// ---------------------------------------------------------------------------
// Redis Sentinel
// ---------------------------------------------------------------------------

/// The name the sentinels monitor the primary under.
pub const MASTER_NAME: &str = "mymaster";

/// A primary, a replica and 3 sentinels (quorum 2) of our own.
pub struct RedisSentinel {
    /// Declared first: dropped first, so no sentinel watches the data nodes
    /// die and tries to fail over while the harness goes.
    sentinels: Vec<Process>,
    /// Started as primary (0) and replica (1); after a failover the roles
    /// are swapped: ask [`RedisSentinel::primary_port`].
    data: Vec<Process>,
    /// What gets a client past the data nodes, and past the sentinels
    /// (nothing, for [`RedisSentinel::start`]).
    data_access: Access,
    sentinel_access: Access,
    dir: tempfile::TempDir,
}

impl RedisSentinel {
    /// Starts the primary, a replica of it (and waits until it is in sync),
    /// then 3 sentinels monitoring it with quorum 2, 1 s down-after and 3 s
    /// failover timeout, and waits until every sentinel sees the primary up,
    /// the replica in sync and the 2 other sentinels.
    pub async fn start() -> Self {
        Self::start_with(Security::default()).await
    }

    /// As [`RedisSentinel::start`], secured by `security`:
    ///
    /// - a password: the data nodes demand it (`requirepass`, and
    ///   `masterauth` so that the replica gets in), the sentinels give it to
    ///   them (`sentinel auth-pass`), and the sentinels demand it too
    ///   (`requirepass` in sentinel mode), since a client that has one
    ///   password for both (ratelimitd takes the data nodes' password from
    ///   the sentinel URL) would otherwise be refused by the sentinels;
    /// - TLS: every process, data node or sentinel, on a TLS port only
    ///   (`port 0`, `tls-port`), replication and the sentinels' links to
    ///   the data nodes and to each other over TLS too (`tls-replication
    ///   yes`), with certificates made for the test ([`write_certificates`]).
    ///
    /// - an ACL user: the data nodes demand it (`user NAME on >PASSWORD ~*
    ///   &* +@all`, the default user off, and `masteruser`/`masterauth` so
    ///   that the replica gets in), the sentinels log in as it (`sentinel
    ///   auth-user`, `sentinel auth-pass`), and the sentinels demand it too
    ///   (the same `user` line and `user default off` in sentinel.conf, and
    ///   `sentinel sentinel-user`/`sentinel-pass` so that they get into each
    ///   other), for the same reason as the password.
    ///
    /// [`RedisSentinel::sentinel_urls`] then carry the password (and the
    /// user) and use `rediss://`.
    pub async fn start_with(security: Security) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory for Redis Sentinel");
        let tls_files = security
            .tls
            .map(|_| write_certificates(&dir.path().join("tls")));
        let data_access = Access::new(&security, tls_files.as_ref());
        let mut sentinel_access = data_access.clone();
        match &security.sentinels {
            SentinelPassword::Same => {}
            SentinelPassword::Open => sentinel_access.password = None,
            SentinelPassword::Own(password) => sentinel_access.password = Some(password.clone()),
        }
        let secured = secured_node_args(&security, tls_files.as_ref());
        let primary = start_data_node(
            "sentinel primary",
            &dir.path().join("primary"),
            None,
            &data_access,
            &secured,
        )
        .await;
        let replica = start_data_node(
            "sentinel replica",
            &dir.path().join("replica"),
            Some(primary.port),
            &data_access,
            &secured,
        )
        .await;
        let (primary_port, replica_port) = (primary.port, replica.port);
        settle("the replica to be in sync", || {
            let data_access = &data_access;
            async move {
                let replication: String = query(
                    data_access,
                    replica_port,
                    redis::cmd("INFO").arg("replication"),
                )
                .await?;
                match info_field(&replication, "master_link_status") {
                    Some("up") => Ok(()),
                    link => Err(format!("master_link_status:{link:?}")),
                }
            }
        })
        .await;
        let mut secured_config = String::new();
        if let Some((user, password)) = &security.acl_user {
            let rule = config_string(&format!(">{password}"));
            let (user, password) = (config_string(user), config_string(password));
            secured_config.push_str(&format!(
                "sentinel auth-user {MASTER_NAME} {user}\n\
                 sentinel auth-pass {MASTER_NAME} {password}\n\
                 sentinel sentinel-user {user}\n\
                 sentinel sentinel-pass {password}\n\
                 user {user} on {rule} ~* &* +@all\n\
                 user default off\n"
            ));
        } else if let Some(password) = &security.password {
            secured_config.push_str(&format!(
                "sentinel auth-pass {MASTER_NAME} {}\n",
                config_string(password)
            ));
            if let Some(own) = &sentinel_access.password {
                secured_config.push_str(&format!("requirepass {}\n", config_string(own)));
            }
        }
        if let Some(files) = &tls_files {
            for (directive, file) in [
                ("tls-cert-file", &files.server_cert),
                ("tls-key-file", &files.server_key),
                ("tls-client-cert-file", &files.client_cert),
                ("tls-client-key-file", &files.client_key),
                ("tls-ca-cert-file", &files.ca_cert),
            ] {
                secured_config
                    .push_str(&format!("{directive} {}\n", config_string(&path_arg(file))));
            }
            let auth_clients = match security.tls {
                Some(ClientCertificates::Required) => "yes",
                _ => "optional",
            };
            secured_config.push_str(&format!(
                "tls-replication yes\ntls-auth-clients {auth_clients}\n"
            ));
        }
        let tls = tls_files.is_some();
        let mut sentinels = Vec::new();
        for index in 0..3 {
            let sentinel_dir = dir.path().join(format!("sentinel{index}"));
            let config_path = sentinel_dir.join("sentinel.conf");
            let data_dir = path_arg(&sentinel_dir);
            let sentinel = Process::start(
                format!("sentinel {index}"),
                sentinel_dir.clone(),
                sentinel_access.cli_args(true),
                |port| {
                    // A sentinel rewrites its configuration file, so each
                    // has its own, written anew for each port tried.
                    let listen = if tls {
                        format!("port 0\ntls-port {port}\n")
                    } else {
                        format!("port {port}\n")
                    };
                    let config = format!(
                        "{listen}\
                         bind 127.0.0.1\n\
                         dir \"{data_dir}\"\n\
                         sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} 2\n\
                         sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                         sentinel failover-timeout {MASTER_NAME} 3000\n\
                         sentinel parallel-syncs {MASTER_NAME} 1\n\
                         {secured_config}"
                    );
                    std::fs::write(&config_path, config).expect("write sentinel.conf");
                    vec![path_arg(&config_path), "--sentinel".to_owned()]
                },
            )
            .await;
            sentinels.push(sentinel);
        }
        let group = Self {
            sentinels,
            data: vec![primary, replica],
            data_access,
            sentinel_access,
            dir,
        };
        settle("the sentinels to agree", || {
            group.agreement(primary_port, replica_port)
        })
        .await;
        group
    }

    /// Why the sentinels do not yet all see `primary` up with `replica` in
    /// sync and each other, if they do not.
    async fn agreement(&self, primary: u16, replica: u16) -> Result<(), String> {
        for port in self.sentinel_ports() {
            let master: HashMap<String, String> = query(
                &self.sentinel_access,
                port,
                redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME),
            )
            .await?;
            let field = |name: &str| master.get(name).map(String::as_str).unwrap_or("");
            let expected = [
                ("port", primary.to_string()),
                ("flags", "master".to_owned()),
                ("num-slaves", "1".to_owned()),
                ("num-other-sentinels", "2".to_owned()),
            ];
            for (name, wanted) in expected {
                if field(name) != wanted {
                    return Err(format!("sentinel {port} reports {name} {:?}", field(name)));
                }
            }
            let replicas: Vec<HashMap<String, String>> = query(
                &self.sentinel_access,
                port,
                redis::cmd("SENTINEL").arg("REPLICAS").arg(MASTER_NAME),
            )
            .await?;
            let in_sync = replicas.iter().any(|seen| {
                seen.get("port") == Some(&replica.to_string())
                    && seen.get("flags").map(String::as_str) == Some("slave")
                    && seen.get("master-link-status").map(String::as_str) == Some("ok")
            });
            if !in_sync {
                return Err(format!("sentinel {port} sees the replicas as {replicas:?}"));
            }
        }
        Ok(())
    }

    /// Waits until the replica has everything the primary has written so
    /// far, as [`RedisCluster::await_replicated`] does.
    pub async fn await_replicated(&self) {
        let primary = self.primary_port().await;
        let replicas: Vec<u16> = self
            .data
            .iter()
            .filter(|node| node.is_answering() && node.port != primary)
            .map(|node| node.port)
            .collect();
        settle("the replica to catch up with the primary", || {
            let replicas = replicas.clone();
            async move {
                for replica in replicas {
                    caught_up(&self.data_access, primary, replica).await?;
                }
                Ok(())
            }
        })
        .await;
    }

    /// The `redis://127.0.0.1:port` of each sentinel; started
    /// [`RedisSentinel::start_with`] a password, it is in each URL
    /// (`redis://:PASSWORD@127.0.0.1:port`, percent-encoded), and with TLS
    /// they are `rediss://`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinel_ports()
            .into_iter()
            .map(|port| self.sentinel_access.url(port))
            .collect()
    }

    /// The URL of a sentinel with the data nodes' credentials in it (how
    /// ratelimitd takes the primary's when the sentinels' differ).
    pub fn sentinel_urls_with_data_credentials(&self) -> Vec<String> {
        self.sentinel_ports()
            .into_iter()
            .map(|port| self.data_access.url(port))
            .collect()
    }

    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels
            .iter()
            .map(|sentinel| sentinel.port)
            .collect()
    }

    /// The name the primary is monitored under (`mymaster`).
    pub fn master_name(&self) -> &'static str {
        MASTER_NAME
    }

    /// The primary's port as the first sentinel that answers says
    /// (`SENTINEL get-master-addr-by-name`).
    pub async fn primary_port(&self) -> u16 {
        let mut last_error = String::from("no sentinel");
        for port in self.sentinel_ports() {
            match master_address(&self.sentinel_access, port).await {
                Ok(primary) => return primary,
                Err(why) => last_error = why,
            }
        }
        panic!("no sentinel says where the primary is: {last_error}");
    }

    /// `redis://` URL of the current primary (with the password, or
    /// `rediss://`, as [`RedisSentinel::sentinel_urls`]).
    pub async fn primary_url(&self) -> String {
        self.data_access.url(self.primary_port().await)
    }

    /// The ports of the primary and replica started, killed ones too.
    pub fn data_ports(&self) -> Vec<u16> {
        self.data.iter().map(|node| node.port).collect()
    }

    /// A connection to the current primary (logged in, over TLS if need
    /// be).
    pub async fn primary_connection(&self) -> redis::aio::MultiplexedConnection {
        let port = self.primary_port().await;
        connect(&self.data_access, port)
            .await
            .unwrap_or_else(|why| panic!("cannot connect to the primary on {port}: {why}"))
    }

    /// SIGKILLs the current primary, as in a crash, and returns its port.
    /// The sentinels promote the replica after about 1 s: see
    /// [`RedisSentinel::await_failover`].
    pub async fn kill_primary(&mut self) -> u16 {
        let port = self.primary_port().await;
        self.data_node_mut(port).kill();
        port
    }

    /// Waits until every sentinel names a primary other than `old_port`,
    /// no longer down, and that node answers `ROLE` as a primary. Returns
    /// its port.
    pub async fn await_failover(&self, old_port: u16) -> u16 {
        settle(
            &format!("the sentinels to replace the primary on {old_port}"),
            || async move {
                let mut agreed = None;
                for port in self.sentinel_ports() {
                    let primary = master_address(&self.sentinel_access, port).await?;
                    if primary == old_port {
                        return Err(format!("sentinel {port} still names {old_port}"));
                    }
                    if agreed.is_some_and(|agreed| agreed != primary) {
                        return Err(format!("sentinels name {agreed:?} and {primary}"));
                    }
                    agreed = Some(primary);
                    let flags: HashMap<String, String> = query(
                        &self.sentinel_access,
                        port,
                        redis::cmd("SENTINEL").arg("MASTER").arg(MASTER_NAME),
                    )
                    .await?;
                    let flags = flags.get("flags").map(String::as_str).unwrap_or("");
                    if flags != "master" {
                        return Err(format!("sentinel {port} flags the new primary {flags:?}"));
                    }
                }
                let primary = agreed.ok_or("no sentinel")?;
                let role = role(&self.data_access, primary).await?;
                if role != "master" {
                    return Err(format!("port {primary} answers ROLE {role}"));
                }
                Ok(primary)
            },
        )
        .await
    }

    /// Starts a killed data node again on its port, as a primary (as it was
    /// started): the sentinels turn it into a replica of the current
    /// primary within seconds.
    pub async fn restart(&mut self, port: u16) {
        self.data_node_mut(port).restart().await;
    }

    /// SIGSTOP on a data node: connections stay open, nothing answers.
    pub fn freeze(&self, port: u16) {
        self.data_node(port).freeze();
    }

    /// SIGCONT after [`RedisSentinel::freeze`].
    pub fn thaw(&self, port: u16) {
        self.data_node(port).thaw();
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn data_node(&self, port: u16) -> &Process {
        self.data
            .iter()
            .find(|node| node.port == port)
            .unwrap_or_else(|| panic!("no data node of ours on port {port}"))
    }

    fn data_node_mut(&mut self, port: u16) -> &mut Process {
        self.data
            .iter_mut()
            .find(|node| node.port == port)
            .unwrap_or_else(|| panic!("no data node of ours on port {port}"))
    }
}

/// A plain (non-cluster) data node, a replica of `primary` if given,
/// secured by `secured` (from [`secured_node_args`]), which `access` gets
/// past.
async fn start_data_node(
    name: &str,
    dir: &Path,
    primary: Option<u16>,
    access: &Access,
    secured: &[String],
) -> Process {
    let data_dir = path_arg(dir);
    let tls = access.tls.is_some();
    Process::start(
        name.to_owned(),
        dir.to_owned(),
        access.cli_args(true),
        |port| {
            let mut args = listen_args(port, tls);
            args.extend(secured.iter().cloned());
            args.extend(strings(&DATA_NODE_SETTINGS));
            args.extend(strings(&["--dir", &data_dir]));
            if let Some(primary) = primary {
                args.extend(strings(&["--replicaof", "127.0.0.1", &primary.to_string()]));
            }
            args
        },
    )
    .await
}

/// `--bind 127.0.0.1` and `--port PORT`, or for TLS `--port 0 --tls-port
/// PORT`.
fn listen_args(port: u16, tls: bool) -> Vec<String> {
    let mut args = strings(&["--bind", "127.0.0.1"]);
    if tls {
        args.extend(strings(&["--port", "0", "--tls-port", &port.to_string()]));
    } else {
        args.extend(strings(&["--port", &port.to_string()]));
    }
    args
}

/// The `redis-server` arguments that make a data node of a cluster or a
/// sentinel group demand `security` and reach its peers through it: the
/// password as `requirepass` and `masterauth`; TLS with the test
/// certificates, replication over TLS, the client certificate shown to
/// peers (`tls-client-cert-file`: the server certificate is for servers
/// only), and a client certificate from others as `security.tls` says.
fn secured_node_args(security: &Security, files: Option<&TlsFiles>) -> Vec<String> {
    let mut args = Vec::new();
    if let Some((user, password)) = &security.acl_user {
        let rule = format!(">{password}");
        args.extend(strings(&["--user", user, "on", &rule, "~*", "&*", "+@all"]));
        args.extend(strings(&["--user", "default", "off"]));
        args.extend(strings(&["--masteruser", user, "--masterauth", password]));
    } else if let Some(password) = &security.password {
        args.extend(strings(&[
            "--requirepass",
            password,
            "--masterauth",
            password,
        ]));
    }
    if let (Some(mode), Some(files)) = (security.tls, files) {
        for (option, file) in [
            ("--tls-cert-file", &files.server_cert),
            ("--tls-key-file", &files.server_key),
            ("--tls-client-cert-file", &files.client_cert),
            ("--tls-client-key-file", &files.client_key),
            ("--tls-ca-cert-file", &files.ca_cert),
        ] {
            args.extend(strings(&[option, &path_arg(file)]));
        }
        let auth_clients = match mode {
            ClientCertificates::Optional => "optional",
            ClientCertificates::Required => "yes",
        };
        args.extend(strings(&["--tls-replication", "yes"]));
        args.extend(strings(&["--tls-auth-clients", auth_clients]));
    }
    args
}

/// A string as a quoted `redis.conf` argument.
fn config_string(text: &str) -> String {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    format!("\"{escaped}\"")
}

/// The primary's port according to the sentinel on `port`.
async fn master_address(access: &Access, port: u16) -> Result<u16, String> {
    let address: Vec<String> = query(
        access,
        port,
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(MASTER_NAME),
    )
    .await?;
    match address.as_slice() {
        [_, primary] => primary
            .parse()
            .map_err(|_| format!("sentinel {port} names port {primary:?}")),
        _ => Err(format!("sentinel {port} answers {address:?}")),
    }
}

// ---------------------------------------------------------------------------
// Password, ACL and TLS
// ---------------------------------------------------------------------------

/// How a [`SecureRedis`] lets clients in.
#[derive(Debug, Clone, Default)]
pub struct Security {
    /// `requirepass`: the default user needs this password.
    pub password: Option<String>,
    /// A user with this name and password that may run every command on
    /// every key and channel (`user NAME on >PASSWORD ~* &* +@all`, the
    /// rules `ACL SETUSER` takes); the default user is switched off.
    pub acl_user: Option<(String, String)>,
    /// TLS only (the plain port is off), with certificates made for the
    /// test.
    pub tls: Option<ClientCertificates>,
    /// With `password`, for a Sentinel group: what the sentinels
    /// themselves demand, when not the data nodes' password.
    pub sentinels: SentinelPassword,
}

/// What the sentinels of a group started with a password demand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SentinelPassword {
    /// The data nodes' password.
    #[default]
    Same,
    /// No password.
    Open,
    /// A password of their own.
    Own(String),
}

/// Whether a TLS Redis asks clients for a certificate
/// (`tls-auth-clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCertificates {
    /// `optional`: a client may show one (signed by the test CA) or not.
    Optional,
    /// `yes`: a client without one is refused.
    Required,
}

/// The PEM files of a TLS [`SecureRedis`], all made by [`rcgen`] for the
/// test: a CA, the server's certificate (for `127.0.0.1` and `localhost`)
/// and a client certificate, each signed by the CA.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// A single `redis-server` of our own that wants a password, an ACL user
/// or TLS.
pub struct SecureRedis {
    process: Process,
    access: Access,
    dir: tempfile::TempDir,
}

impl SecureRedis {
    /// `requirepass password`. The password goes into [`SecureRedis::url`]
    /// percent-encoded.
    pub async fn with_password(password: &str) -> Self {
        Self::start(Security {
            password: Some(password.to_owned()),
            ..Security::default()
        })
        .await
    }

    /// An ACL user `user` with `password`, allowed every command on every
    /// key; the default user is off, so nothing works without logging in.
    pub async fn with_acl_user(user: &str, password: &str) -> Self {
        Self::start(Security {
            acl_user: Some((user.to_owned(), password.to_owned())),
            ..Security::default()
        })
        .await
    }

    /// TLS only, a client certificate optional.
    pub async fn with_tls() -> Self {
        Self::start(Security {
            tls: Some(ClientCertificates::Optional),
            ..Security::default()
        })
        .await
    }

    /// TLS only, a client certificate signed by the test CA required.
    pub async fn with_tls_client_auth() -> Self {
        Self::start(Security {
            tls: Some(ClientCertificates::Required),
            ..Security::default()
        })
        .await
    }

    /// Any combination of the above.
    pub async fn start(security: Security) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory for redis-server");
        let tls_files = security.tls.map(|_| write_certificates(dir.path()));
        let access = Access::new(&security, tls_files.as_ref());
        // The same settings as a node of a cluster or a sentinel group (the
        // replication ones do nothing on a node without replicas).
        let mut server_args = secured_node_args(&security, tls_files.as_ref());
        server_args.extend(strings(&DATA_NODE_SETTINGS));
        server_args.extend(strings(&["--dir", &path_arg(dir.path())]));
        let tls = tls_files.is_some();
        let process = Process::try_start(
            "secure redis-server".to_owned(),
            dir.path().join("redis"),
            access.cli_args(true),
            |port| {
                let mut args = listen_args(port, tls);
                args.extend(server_args.iter().cloned());
                args
            },
        )
        .await
        .unwrap_or_else(|log| {
            if tls && log.contains("tls-port") {
                panic!(
                    "the installed redis-server has no TLS (it must be built with \
                     BUILD_TLS=yes, as Debian's redis-server is):\n{log}"
                );
            }
            panic!("secure redis-server did not start:\n{log}");
        });
        Self {
            process,
            access,
            dir,
        }
    }

    pub fn port(&self) -> u16 {
        self.process.port
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// `redis://` with the credentials in it, or `rediss://` for TLS. For
    /// TLS a client must trust [`TlsFiles::ca_cert`]; the server
    /// certificate names `127.0.0.1` and `localhost`.
    pub fn url(&self) -> String {
        format!("{}/0", self.access.url(self.port()))
    }

    /// [`SecureRedis::url`] without the credentials.
    pub fn url_without_credentials(&self) -> String {
        let anonymous = Access {
            tls: self.access.tls.clone(),
            ..Access::default()
        };
        format!("{}/0", anonymous.url(self.port()))
    }

    /// A connection through [`SecureRedis::url`], logged in (over TLS
    /// with the client certificate, for a TLS server).
    pub async fn connection(&self) -> redis::aio::MultiplexedConnection {
        connect(&self.access, self.port())
            .await
            .unwrap_or_else(|why| panic!("cannot connect to the secure test redis: {why}"))
    }

    /// Runs `redis-cli COMMAND...` logged in, over TLS with the client
    /// certificate if the server is TLS, and returns what it printed.
    /// `redis-cli` prints error replies (`NOAUTH ...`) there too, and still
    /// exits 0.
    pub async fn cli(&self, command: &[&str]) -> Result<String, String> {
        cli(self.port(), &self.process.cli_args, command).await
    }

    /// As [`SecureRedis::cli`] with no password, no user and no client
    /// certificate (only the CA, to trust the server).
    pub async fn cli_anonymous(&self, command: &[&str]) -> Result<String, String> {
        cli(self.port(), &self.access.cli_args(false), command).await
    }

    /// SIGKILL, as in a crash.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Starts again on the same port, with the same settings and files.
    pub async fn restart(&mut self) {
        self.process.restart().await;
    }

    /// SIGSTOP: connections stay open, nothing answers, as on a hung host.
    pub fn freeze(&self) {
        self.process.freeze();
    }

    /// SIGCONT after [`SecureRedis::freeze`].
    pub fn thaw(&self) {
        self.process.thaw();
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A self-signed certificate that says CA:TRUE, for `localhost` (what
/// envoyproxy/ratelimit's `openssl req -x509 ... -subj /CN=localhost
/// -addext subjectAltName=DNS:localhost` makes): its PEM certificate and
/// key.
pub fn self_signed_ca_certificate() -> (String, String) {
    let key = KeyPair::generate().expect("generate a key");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("parameters");
    params
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).expect("self-sign");
    (cert.pem(), key.serialize_pem())
}

/// A TLS-only `redis-server` as upstream's stunnel recipe runs it: serving
/// `dir/cert.pem` with `dir/key.pem`, trusting `dir/cert.pem` for client
/// certificates (`tls_auth_clients`: `yes`, `no` or `optional`), with a
/// password if given; killed when dropped.
pub struct PinnedRedis {
    pub port: u16,
    child: Child,
}

impl PinnedRedis {
    pub async fn start(dir: &Path, tls_auth_clients: &str, password: Option<&str>) -> Self {
        let port = free_port();
        let file = |name: &str| dir.join(name).to_string_lossy().into_owned();
        let mut command = Command::new("redis-server");
        command
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                "0",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--tls-port", &port.to_string()])
            .args([
                "--tls-cert-file",
                &file("cert.pem"),
                "--tls-key-file",
                &file("key.pem"),
            ])
            .args(["--tls-ca-cert-file", &file("cert.pem")])
            .args(["--tls-auth-clients", tls_auth_clients]);
        if let Some(password) = password {
            command.args(["--requirepass", password]);
        }
        let child = command
            .arg("--dir")
            .arg(dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server (the tests need Redis 7 built with TLS: apt-get install redis-server)");
        super::eventually("the TLS redis-server to listen", || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        Self { port, child }
    }
}

impl Drop for PinnedRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The subject alternative name of [`write_certificates`]' client
/// certificate.
pub const CLIENT_SAN: &str = "client.ratelimitd.test";

/// Makes a new CA, a server certificate for `127.0.0.1` and `localhost`,
/// and a client certificate, both signed by that CA, and writes them and
/// their keys as PEM files into `dir` (created if missing): `ca.pem`,
/// `server.pem`, `server.key`, `client.pem`, `client.key`. Each call makes
/// a CA of its own, so two calls give certificates that do not trust each
/// other. Usable for any TLS server in the tests, not only Redis.
pub fn write_certificates(dir: &Path) -> TlsFiles {
    std::fs::create_dir_all(dir).unwrap_or_else(|err| panic!("create {}: {err}", dir.display()));
    let ca_key = KeyPair::generate().expect("generate the test CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "ratelimitd test CA");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params
        .self_signed(&ca_key)
        .expect("self-sign the test CA");
    let ca = Issuer::new(ca_params, ca_key);

    let leaf = |name: &str, alt_names: &[&str], purpose: ExtendedKeyUsagePurpose| {
        let key = KeyPair::generate().expect("generate a test certificate key");
        let alt_names: Vec<String> = alt_names.iter().map(|name| (*name).to_owned()).collect();
        let mut params = CertificateParams::new(alt_names).expect("certificate parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![purpose];
        let cert = params
            .signed_by(&key, &ca)
            .expect("sign a test certificate with the test CA");
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(
        "127.0.0.1",
        &["127.0.0.1", "localhost"],
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (client_cert, client_key) = leaf(
        "ratelimitd test client",
        &[CLIENT_SAN],
        ExtendedKeyUsagePurpose::ClientAuth,
    );

    let write = |name: &str, pem: &str| {
        let path = dir.join(name);
        std::fs::write(&path, pem).unwrap_or_else(|err| panic!("write {}: {err}", path.display()));
        path
    };
    TlsFiles {
        ca_cert: write("ca.pem", &ca_cert.pem()),
        server_cert: write("server.pem", &server_cert),
        server_key: write("server.key", &server_key),
        client_cert: write("client.pem", &client_cert),
        client_key: write("client.key", &client_key),
    }
}

/// Userinfo for a URL: everything but unreserved characters escaped.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// One `redis-server` of a harness: killed (after a SIGCONT, in case it is
/// frozen) when dropped.
struct Process {
    /// Which one, in messages: "cluster node 3".
    name: String,
    /// Its own folder: working directory, `redis.log`, `stderr.log`.
    dir: PathBuf,
    port: u16,
    /// The `redis-server` arguments, kept to restart it the same way.
    args: Vec<String>,
    /// What `redis-cli` needs besides host and port to be let in.
    cli_args: Vec<String>,
    child: Option<Child>,
    /// Stopped by SIGSTOP. Atomic (not a `Cell`) so that a harness stays
    /// `Sync` and futures borrowing it stay `Send`.
    frozen: AtomicBool,
}

impl Process {
    /// As [`Process::try_start`], and panics with the log if it fails.
    async fn start(
        name: String,
        dir: PathBuf,
        cli_args: Vec<String>,
        args: impl FnMut(u16) -> Vec<String>,
    ) -> Self {
        let what = name.clone();
        Self::try_start(name, dir, cli_args, args)
            .await
            .unwrap_or_else(|log| panic!("{what} did not start:\n{log}"))
    }

    /// Starts `redis-server` with the arguments `args` makes for a free
    /// port, and waits until it answers as itself (its `process_id`). A
    /// port taken between the choice and the bind (by another test, or by
    /// an outgoing connection) is not a failure: another port is tried.
    /// Otherwise the `Err` is what the server logged.
    async fn try_start(
        name: String,
        dir: PathBuf,
        cli_args: Vec<String>,
        mut args: impl FnMut(u16) -> Vec<String>,
    ) -> Result<Self, String> {
        const ATTEMPTS: usize = 5;
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|err| panic!("create {}: {err}", dir.display()));
        let mut attempt = 1;
        loop {
            for log in ["redis.log", "stderr.log"] {
                let _ = std::fs::remove_file(dir.join(log));
            }
            let port = free_port();
            let mut process = Self {
                name: name.clone(),
                dir: dir.clone(),
                port,
                args: args(port),
                cli_args: cli_args.clone(),
                child: None,
                frozen: AtomicBool::new(false),
            };
            match process.launch().await {
                Ok(()) => return Ok(process),
                Err(log) if log.contains("Address already in use") && attempt < ATTEMPTS => {
                    attempt += 1;
                }
                Err(log) => return Err(log),
            }
        }
    }

    /// Spawns the process and waits until it answers `INFO server` with its
    /// own process id (a server that failed to bind could otherwise be
    /// mistaken for whatever holds the port).
    async fn launch(&mut self) -> Result<(), String> {
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stderr.log"))
            .unwrap_or_else(|err| panic!("open stderr.log in {}: {err}", self.dir.display()));
        let stdout = stderr.try_clone().expect("duplicate the stderr.log handle");
        let child = Command::new("redis-server")
            .args(&self.args)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot start redis-server ({err}); the tests need Redis 7 with \
                     redis-cli: install it with `apt-get install redis-server`"
                )
            });
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(format!("{} exited ({status}):\n{}", self.name, self.log()));
            }
            if let Ok(info) = cli(self.port, &self.cli_args, &["INFO", "server"]).await
                && info_field(&info, "process_id") == Some(pid.to_string().as_str())
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "{} did not answer on port {} within {PATIENCE:?}:\n{}",
                    self.name,
                    self.port,
                    self.log()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts again on the same port with the same arguments.
    async fn restart(&mut self) {
        assert!(!self.is_running(), "{} is still running", self.name);
        if let Err(log) = self.launch().await {
            panic!(
                "{} did not restart on port {}:\n{log}",
                self.name, self.port
            );
        }
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Running and not frozen.
    fn is_answering(&self) -> bool {
        self.is_running() && !self.frozen.load(Ordering::SeqCst)
    }

    /// SIGKILL (after SIGCONT if frozen: a stopped process dies only once
    /// it runs again), and reaps it.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if self.frozen.swap(false, Ordering::SeqCst) {
                let _ = Command::new("kill")
                    .args(["-CONT", &child.id().to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status();
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn freeze(&self) {
        self.signal("-STOP");
        self.frozen.store(true, Ordering::SeqCst);
    }

    fn thaw(&self) {
        self.signal("-CONT");
        self.frozen.store(false, Ordering::SeqCst);
    }

    fn signal(&self, signal: &str) {
        let pid = self
            .pid()
            .unwrap_or_else(|| panic!("{} is not running", self.name));
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} ({})", self.name);
    }

    /// What it logged, for failure messages.
    fn log(&self) -> String {
        ["stderr.log", "redis.log"]
            .iter()
            .filter_map(|name| std::fs::read_to_string(self.dir.join(name)).ok())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------------------
// Talking to the processes
// ---------------------------------------------------------------------------

fn node_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// What every topology started here offers a test about how to get in:
/// one implementation of each accessor, over the topology's [`Access`].
pub trait Secured {
    /// How clients get in (the data nodes', for a Sentinel group).
    fn access(&self) -> &Access;

    /// The password it demands, if any (the ACL user's, if there is one).
    fn password(&self) -> Option<&str> {
        self.access().password.as_deref()
    }

    /// The PEM files, for a topology started with TLS.
    fn tls_files(&self) -> &TlsFiles {
        self.access()
            .tls
            .as_ref()
            .expect("started with TLS (start_with / with_tls)")
    }

    /// The test CA that signed every certificate.
    fn ca_cert_path(&self) -> &Path {
        &self.tls_files().ca_cert
    }

    /// A client certificate signed by the test CA.
    fn client_cert_path(&self) -> &Path {
        &self.tls_files().client_cert
    }

    /// The key of [`Secured::client_cert_path`].
    fn client_key_path(&self) -> &Path {
        &self.tls_files().client_key
    }
}

impl Secured for RedisCluster {
    fn access(&self) -> &Access {
        &self.access
    }
}

impl Secured for RedisSentinel {
    fn access(&self) -> &Access {
        &self.data_access
    }
}

impl Secured for SecureRedis {
    fn access(&self) -> &Access {
        &self.access
    }
}

/// What a client needs to get past a node of a secured topology: the
/// password (`requirepass`), or the ACL user and its password, and, for
/// TLS, the test CA and client certificate. The default is a plain node
/// that asks for nothing.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// The ACL user to log in as; `None` for the default user.
    user: Option<String>,
    /// The password of `user`, or of the default user.
    password: Option<String>,
    tls: Option<TlsFiles>,
}

impl Access {
    /// The ACL user if there is one (the default user is off then), or
    /// else the password.
    fn new(security: &Security, tls: Option<&TlsFiles>) -> Self {
        let (user, password) = match &security.acl_user {
            Some((user, password)) => (Some(user.clone()), Some(password.clone())),
            None => (None, security.password.clone()),
        };
        Self {
            user,
            password,
            tls: tls.cloned(),
        }
    }

    /// `redis://` or, for TLS, `rediss://`, with the user and password
    /// (percent-encoded) if there are any.
    fn url(&self, port: u16) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        let user = self.user.as_deref().map(percent_encode).unwrap_or_default();
        let credentials = self
            .password
            .as_deref()
            .map(|password| format!("{user}:{}@", percent_encode(password)))
            .unwrap_or_default();
        format!("{scheme}://{credentials}127.0.0.1:{port}")
    }

    /// The test CA to trust and the client certificate to show, for the
    /// redis crate; `None` without TLS.
    fn certificates(&self) -> Option<redis::TlsCertificates> {
        let files = self.tls.as_ref()?;
        let read = |path: &Path| {
            std::fs::read(path).unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
        };
        Some(redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read(&files.client_cert),
                client_key: read(&files.client_key),
            }),
            root_cert: Some(read(&files.ca_cert)),
        })
    }

    fn client(&self, port: u16) -> Result<redis::Client, String> {
        let client = match self.certificates() {
            Some(certificates) => {
                install_crypto_provider();
                redis::Client::build_with_tls(self.url(port), certificates)
            }
            None => redis::Client::open(self.url(port)),
        };
        client.map_err(|err| err.to_string())
    }

    /// The `redis-cli` arguments that get past it: TLS with the CA, and if
    /// `credentials`, the client certificate and the password or user too.
    fn cli_args(&self, credentials: bool) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(files) = &self.tls {
            args.extend(strings(&["--tls", "--cacert", &path_arg(&files.ca_cert)]));
            if credentials {
                args.extend(strings(&["--cert", &path_arg(&files.client_cert)]));
                args.extend(strings(&["--key", &path_arg(&files.client_key)]));
            }
        }
        if credentials {
            if let Some(user) = &self.user {
                args.extend(strings(&["--user", user]));
            }
            if let Some(password) = &self.password {
                args.extend(strings(&["--pass", password]));
            }
        }
        args
    }
}

/// rustls wants one process-wide crypto provider; ratelimitd installs
/// `ring` (src/server.rs), and so does the harness before its own first TLS
/// connection.
fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A connection to 127.0.0.1:`port` that gets past `access` (the redis
/// crate's default timeouts apply: 1 s to connect, 500 ms for an answer, so
/// a frozen node makes a query fail instead of hang).
async fn connect(access: &Access, port: u16) -> Result<redis::aio::MultiplexedConnection, String> {
    access
        .client(port)?
        .get_multiplexed_async_connection()
        .await
        .map_err(|err| format!("connect to port {port}: {err}"))
}

/// One command on a fresh connection to 127.0.0.1:`port`, through `access`.
async fn query<T: redis::FromRedisValue>(
    access: &Access,
    port: u16,
    command: &redis::Cmd,
) -> Result<T, String> {
    let mut connection = connect(access, port).await?;
    command
        .query_async(&mut connection)
        .await
        .map_err(|err| format!("port {port}: {err}"))
}

/// Whether the replica on `replica` has received all that the primary on
/// `primary` has written (the primary's offset is read first).
async fn caught_up(access: &Access, primary: u16, replica: u16) -> Result<(), String> {
    let offset = |info: &str, field: &str| -> Result<u64, String> {
        info_field(info, field)
            .and_then(|value| value.parse().ok())
            .ok_or_else(|| format!("no {field} in INFO replication"))
    };
    let written: String = query(access, primary, redis::cmd("INFO").arg("replication")).await?;
    let written = offset(&written, "master_repl_offset")?;
    let received: String = query(access, replica, redis::cmd("INFO").arg("replication")).await?;
    let received = offset(&received, "slave_repl_offset")?;
    if received < written {
        return Err(format!(
            "replica {replica} is at offset {received}, primary {primary} at {written}"
        ));
    }
    Ok(())
}

/// What `ROLE` says first: `master`, `slave` or `sentinel`.
async fn role(access: &Access, port: u16) -> Result<String, String> {
    let reply: Vec<redis::Value> = query(access, port, &redis::cmd("ROLE")).await?;
    match reply.first() {
        Some(redis::Value::BulkString(bytes)) => Ok(String::from_utf8_lossy(bytes).into_owned()),
        Some(redis::Value::SimpleString(text)) => Ok(text.clone()),
        other => Err(format!("port {port} answers ROLE with {other:?}")),
    }
}

/// A field of an `INFO` (or `CLUSTER INFO`) reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.trim_end()
            .split_once(':')
            .filter(|(name, _)| *name == field)
            .map(|(_, value)| value)
    })
}

/// `redis-cli -h 127.0.0.1 -p PORT ARGS... COMMAND...`: what it printed.
async fn cli(port: u16, args: &[String], command: &[&str]) -> Result<String, String> {
    let mut all = strings(&[
        "-h",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "--no-auth-warning",
    ]);
    all.extend(args.iter().cloned());
    all.extend(strings(command));
    run("redis-cli", all, CLI_TIMEOUT).await
}

/// Runs `program` off the async threads, killed if it takes longer than
/// `timeout`. `Ok` is its standard output when it exits 0; `Err` says what
/// went wrong, with everything it printed.
async fn run(program: &str, args: Vec<String>, timeout: Duration) -> Result<String, String> {
    let program = program.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut child = Command::new(&program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|err| format!("cannot run {program} ({err}): install redis-tools"))?;
        let deadline = Instant::now() + timeout;
        // The outputs wanted here are small: they fit the pipes while the
        // program runs, so it is enough to read them once it has exited.
        while child.try_wait().map_err(|err| err.to_string())?.is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{program} {args:?} took over {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let output = child.wait_with_output().map_err(|err| err.to_string())?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() {
            Ok(stdout)
        } else {
            Err(format!(
                "{program} {args:?} failed ({}):\n{stdout}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ))
        }
    })
    .await
    .expect("the thread running a command")
}

/// Polls `observe` until it gives `Ok`, and returns that. Panics after
/// [`PATIENCE`] with the last `Err`, which says what was still not so.
async fn settle<T, F, Fut>(what: &str, mut observe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        match observe().await {
            Ok(value) => return value,
            Err(why) => assert!(
                Instant::now() < deadline,
                "timed out after {PATIENCE:?} waiting for {what}: {why}"
            ),
        }
        tokio::time::sleep(POLL).await;
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|item| (*item).to_owned()).collect()
}

/// A path as a command-line argument (temporary directories are UTF-8).
fn path_arg(path: &Path) -> String {
    path.to_str()
        .unwrap_or_else(|| panic!("non-UTF-8 path {}", path.display()))
        .to_owned()
}

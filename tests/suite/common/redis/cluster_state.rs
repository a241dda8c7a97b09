//! What a [`RedisCluster`]'s nodes say of each other (`CLUSTER NODES`,
//! `CLUSTER INFO`), and the waits built on it: healthy, failed over,
//! replicated.

use super::cluster::RedisCluster;
use super::cluster_node::{CLUSTER_SLOTS, ClusterNode, Role, SlotOwners, parse_cluster_node};
use super::queries::{answers_as_primary, await_caught_up, info_field, replica_link_up};
use crate::common::wait::settle;

impl RedisCluster {
    /// Every node the cluster knows, killed ones too, as a running node
    /// reports them, in creation order.
    pub(crate) async fn nodes(&self) -> Vec<ClusterNode> {
        let mut last_error = String::from("no node is running");
        for port in self.live_ports() {
            match self.nodes_seen_by(port).await {
                Ok(mut nodes) => {
                    nodes.sort_by_key(|node| self.nodes.index_of(node.port).unwrap_or(usize::MAX));
                    return nodes;
                }
                Err(why) => last_error = why,
            }
        }
        panic!("cannot ask the cluster for its nodes: {last_error}");
    }

    /// The primaries serving slots, ordered by their first slot, so that
    /// index 0 is whoever serves slot 0 (after a failover too).
    pub(crate) async fn primaries(&self) -> Vec<ClusterNode> {
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
    pub(crate) async fn replicas(&self) -> Vec<ClusterNode> {
        let live = self.live_ports();
        self.nodes()
            .await
            .into_iter()
            .filter(|node| node.role == Role::Replica && live.contains(&node.port))
            .collect()
    }

    /// Waits until the slots of `killed` (from [`RedisCluster::kill_primary`])
    /// are served by another node, which answers `ROLE` as a primary, and
    /// the cluster is healthy again as in [`RedisCluster::await_healthy`].
    /// Returns the new primary.
    pub(crate) async fn await_failover(&self, killed: &ClusterNode) -> ClusterNode {
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
                answers_as_primary(self.setup.access(), owner.port).await?;
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
    pub(crate) async fn await_healthy(&self) {
        settle("the Redis Cluster to be healthy", || self.health()).await;
    }

    /// Waits until every running replica has everything its primary has
    /// written so far. Replication is asynchronous: a write that a replica
    /// has not received yet is lost when its primary is killed.
    pub(crate) async fn await_replicated(&self) {
        await_caught_up(self.setup.access(), || async move {
            let nodes = self.nodes().await;
            let live = self.live_ports();
            let replicas = nodes
                .iter()
                .filter(|node| node.role == Role::Replica && live.contains(&node.port));
            replicas
                .map(|replica| {
                    nodes
                        .iter()
                        .find(|node| Some(&node.id) == replica.primary_id.as_ref())
                        .map(|primary| (primary.port, replica.port))
                        .ok_or_else(|| format!("replica {} has no known primary", replica.port))
                })
                .collect()
        })
        .await;
    }

    /// Why the cluster is not healthy yet, if it is not.
    async fn health(&self) -> Result<(), String> {
        let mut agreed: Option<(u16, SlotOwners)> = None;
        for port in self.live_ports() {
            let owners = self.health_seen_by(port).await?;
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
        }
        Ok(())
    }

    /// Why the node on `port` does not see a healthy cluster, if it does
    /// not; if it does, who it sees serving which slots.
    async fn health_seen_by(&self, port: u16) -> Result<SlotOwners, String> {
        let access = self.setup.access();
        let info: String = access
            .query(port, redis::cmd("CLUSTER").arg("INFO"))
            .await?;
        for (field, wanted) in [
            ("cluster_state", "ok".to_owned()),
            ("cluster_slots_assigned", CLUSTER_SLOTS.to_string()),
            ("cluster_slots_ok", CLUSTER_SLOTS.to_string()),
            ("cluster_known_nodes", self.nodes.ports().len().to_string()),
        ] {
            let value = info_field(&info, field);
            if value != Some(wanted.as_str()) {
                return Err(format!("port {port} reports {field}:{value:?}"));
            }
        }
        let live = self.live_ports();
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
                // A restarted primary whose slots were taken over, not yet
                // turned into a replica.
                return Err(format!(
                    "port {port} sees {} as a primary without slots",
                    node.port
                ));
            }
            if !node.slots.is_empty() {
                owners.insert(node.port, node.slots.clone());
            }
        }
        let myself = nodes
            .iter()
            .find(|node| node.has_flag("myself"))
            .ok_or_else(|| format!("port {port} does not list itself"))?;
        if myself.role == Role::Replica {
            replica_link_up(access, port).await?;
        }
        Ok(owners)
    }

    async fn nodes_seen_by(&self, port: u16) -> Result<Vec<ClusterNode>, String> {
        let text: String = self
            .setup
            .access()
            .query(port, redis::cmd("CLUSTER").arg("NODES"))
            .await?;
        let mut nodes = text
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(parse_cluster_node)
            .collect::<Result<Vec<_>, _>>()?;
        for node in &mut nodes {
            node.pid = self.nodes.pid_of(node.port);
        }
        Ok(nodes)
    }
}

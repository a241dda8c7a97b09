//! A Redis Cluster's nodes as one of them sees them: a line of `CLUSTER
//! NODES` read into a [`ClusterNode`] (id, port, role, slots, flags).

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

/// Slots in a Redis Cluster.
pub(crate) const CLUSTER_SLOTS: usize = 16384;

/// Who serves which slots: port to slot ranges.
pub(crate) type SlotOwners = BTreeMap<u16, Vec<RangeInclusive<u16>>>;

/// What a node is in a cluster or a replication pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Primary,
    Replica,
}

/// One node as the cluster sees it (a line of `CLUSTER NODES`), with the
/// process id of ours that runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClusterNode {
    /// The 40-character node id.
    pub(crate) id: String,
    pub(crate) port: u16,
    /// `None` once the harness has killed it (a frozen node keeps its pid).
    pub(crate) pid: Option<u32>,
    pub(crate) role: Role,
    /// For a replica, the id of its primary.
    pub(crate) primary_id: Option<String>,
    /// The slot ranges it serves (empty for a replica).
    pub(crate) slots: Vec<RangeInclusive<u16>>,
    /// The flags as the node asked reported them: `myself`, `master`,
    /// `slave`, `fail?`, `fail`, `handshake`, ...
    pub(crate) flags: Vec<String>,
}

impl ClusterNode {
    pub(crate) fn owns_slot(&self, slot: u16) -> bool {
        self.slots.iter().any(|range| range.contains(&slot))
    }

    pub(crate) fn slot_count(&self) -> usize {
        self.slots.iter().map(|range| range.len()).sum()
    }

    /// Flagged `fail` (agreed by the cluster) or `fail?` (suspected by the
    /// node asked).
    pub(crate) fn is_failing(&self) -> bool {
        self.has_flag("fail") || self.has_flag("fail?")
    }

    pub(crate) fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    pub(crate) fn first_slot(&self) -> Option<u16> {
        self.slots.first().map(|range| *range.start())
    }
}

/// One line of `CLUSTER NODES`: `<id> <ip:port@cport[,hostname]> <flags>
/// <primary> <ping-sent> <pong-recv> <config-epoch> <link-state> <slot>...`.
pub(crate) fn parse_cluster_node(line: &str) -> Result<ClusterNode, String> {
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

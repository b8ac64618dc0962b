//! The three volume shapes, and who acts for the volumes no single node owns. Pure.
//!
//! - `node`: a directory on one node, PV pinned there (the kubevirt legacy shape).
//! - `shared`: a directory on a network filesystem mounted at the same path on every node; the PV
//!   has no node affinity (the torchbox shape).
//! - `everyNode`: a directory of the same name on every node, one PV without node affinity, for
//!   DaemonSets (the kubeboost shape).
//!
//! Who acts for a `shared` or `everyNode` operation that no annotation assigns: every node ranks
//! the live nodes that serve the pool by a hash of (volume key, node) and the highest acts
//! (rendezvous hashing). Every node computes the same ranking from the same leases, so in the
//! normal case exactly one acts; when that node's lease expires it drops out of the ranking and
//! the next one takes over. Two nodes acting at once (a stale view) is safe by construction: the
//! directory is created idempotently, the PV name is fixed so only one create succeeds, and a
//! removal is an atomic rename into the trash.

use std::time::Duration;

use sha2::{Digest, Sha256};

/// StorageClass parameter naming the shape.
pub const PARAMETER: &str = "topology";

/// A volume shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Topology {
    /// One node's directory, PV pinned to that node.
    Node,
    /// One directory on a filesystem every node mounts at the same path.
    Shared,
    /// A directory of the same name on every node.
    EveryNode,
}

impl Topology {
    /// Every value, in the spelling of the StorageClass parameter.
    pub const ALL: [Topology; 3] = [Topology::Node, Topology::Shared, Topology::EveryNode];

    /// Reads the parameter value (exact spelling, as Kubernetes enums are).
    pub fn parse(value: &str) -> Option<Topology> {
        Self::ALL.into_iter().find(|t| t.as_str() == value)
    }

    /// The parameter value, also used as the PV's topology label.
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::Node => "node",
            Topology::Shared => "shared",
            Topology::EveryNode => "everyNode",
        }
    }

    /// Access modes the shape can honour. A node-local directory serves pods of one node only;
    /// a shared filesystem serves every node; an every-node directory is written on each node by
    /// that node's pods (so "read-only many" would be an empty directory everywhere).
    pub fn access_modes(self) -> &'static [&'static str] {
        match self {
            Topology::Node => &["ReadWriteOnce", "ReadWriteOncePod"],
            Topology::Shared => &["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany", "ReadOnlyMany"],
            Topology::EveryNode => &["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany"],
        }
    }

    /// Whether the shape needs a pool declared `shared` (and only such a pool).
    pub fn needs_shared_pool(self) -> bool {
        self == Topology::Shared
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A pool as a node advertises it: a name and the root path. Two nodes serve the same shared pool
/// only if both match (a pool of the same name mounted elsewhere is another pool).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    /// Pool name.
    pub name: String,
    /// Root path on the node.
    pub root: String,
}

impl PoolKey {
    /// A key from a name and a root.
    pub fn new(name: &str, root: &str) -> PoolKey {
        PoolKey { name: name.to_owned(), root: root.to_owned() }
    }
}

/// A node whose provisioner is alive, as its lease says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveNode {
    /// Node object name.
    pub node: String,
    /// The pools it can use right now.
    pub pools: Vec<PoolKey>,
    /// How long until its lease expires unless renewed.
    pub expires_in: Duration,
}

/// Who performs an operation on a volume no single node owns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acting {
    /// This node.
    Me,
    /// Another live node; look again once its lease would have expired, in case it died.
    Other {
        /// The node that acts.
        node: String,
        /// When to look again.
        recheck_after: Duration,
    },
    /// No live node serves the pool.
    Nobody,
}

/// Margin added to a lease's expiry before looking again, so that the look happens after the
/// expiry even with a little clock drift between renewals and checks.
const RECHECK_MARGIN: Duration = Duration::from_secs(2);

/// The node that acts on `key` (a claim or PV uid) in `pool`, among the `live` nodes that serve
/// it. `live` includes this node's own entry when it serves the pool now.
pub fn acting_node(key: &str, pool: &PoolKey, me: &str, live: &[LiveNode]) -> Acting {
    let best = live
        .iter()
        .filter(|n| n.pools.contains(pool))
        .max_by(|a, b| rank(key, &a.node).cmp(&rank(key, &b.node)).then_with(|| b.node.cmp(&a.node)));
    match best {
        None => Acting::Nobody,
        Some(n) if n.node == me => Acting::Me,
        Some(n) => Acting::Other { node: n.node.clone(), recheck_after: n.expires_in + RECHECK_MARGIN },
    }
}

/// The node that speaks for the cluster about `key` when no node serves its pool (so that one
/// node, not every node, explains it): the same ranking over every live node.
pub fn spokesman(key: &str, me: &str, live: &[LiveNode]) -> Acting {
    let best = live.iter().max_by(|a, b| rank(key, &a.node).cmp(&rank(key, &b.node)).then_with(|| b.node.cmp(&a.node)));
    match best {
        None => Acting::Nobody,
        Some(n) if n.node == me => Acting::Me,
        Some(n) => Acting::Other { node: n.node.clone(), recheck_after: n.expires_in + RECHECK_MARGIN },
    }
}

fn rank(key: &str, node: &str) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(key.as_bytes());
    hasher.update([0]);
    hasher.update(node.as_bytes());
    hasher.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> PoolKey {
        PoolKey::new("nfs", "/mnt/nfs")
    }

    fn live(node: &str, pools: &[PoolKey], secs: u64) -> LiveNode {
        LiveNode { node: node.into(), pools: pools.to_vec(), expires_in: Duration::from_secs(secs) }
    }

    fn nodes(names: &[&str]) -> Vec<LiveNode> {
        names.iter().map(|n| live(n, &[pool()], 60)).collect()
    }

    fn actor(key: &str, me: &str, live: &[LiveNode]) -> Option<String> {
        match acting_node(key, &pool(), me, live) {
            Acting::Me => Some(me.to_owned()),
            Acting::Other { node, .. } => Some(node),
            Acting::Nobody => None,
        }
    }

    #[test]
    fn every_node_agrees_on_exactly_one_actor_per_volume() {
        let all = nodes(&["a", "b", "c", "d"]);
        for i in 0..200 {
            let key = format!("uid-{i}");
            let verdicts: Vec<_> = ["a", "b", "c", "d"].iter().map(|me| acting_node(&key, &pool(), me, &all)).collect();
            assert_eq!(verdicts.iter().filter(|v| **v == Acting::Me).count(), 1, "{key}: {verdicts:?}");
            let named: std::collections::BTreeSet<_> =
                ["a", "b", "c", "d"].iter().map(|me| actor(&key, me, &all)).collect();
            assert_eq!(named.len(), 1, "everyone names the same actor");
        }
    }

    #[test]
    fn work_spreads_over_the_nodes() {
        let all = nodes(&["a", "b", "c"]);
        let mut counts = std::collections::BTreeMap::new();
        for i in 0..300 {
            *counts.entry(actor(&format!("uid-{i}"), "a", &all).unwrap()).or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 3, "{counts:?}");
        assert!(counts.values().all(|c| *c > 50), "{counts:?}");
    }

    #[test]
    fn when_the_actor_is_gone_the_next_in_rank_takes_over_and_others_keep_their_volumes() {
        let all = nodes(&["a", "b", "c"]);
        for i in 0..100 {
            let key = format!("uid-{i}");
            let first = actor(&key, "a", &all).unwrap();
            let rest: Vec<_> = all.iter().filter(|n| n.node != first).cloned().collect();
            let second = actor(&key, "a", &rest).unwrap();
            assert_ne!(first, second);
            // Removing a node that was not the actor changes nothing (rendezvous property).
            let other = all.iter().find(|n| n.node != first).unwrap().node.clone();
            let without_other: Vec<_> = all.iter().filter(|n| n.node != other).cloned().collect();
            assert_eq!(actor(&key, "a", &without_other).unwrap(), first);
        }
    }

    #[test]
    fn only_nodes_serving_the_same_pool_at_the_same_path_are_candidates() {
        let elsewhere = PoolKey::new("nfs", "/srv/other");
        let all = vec![live("a", std::slice::from_ref(&elsewhere), 60), live("b", &[], 60), live("c", &[pool()], 60)];
        for i in 0..50 {
            assert_eq!(actor(&format!("uid-{i}"), "a", &all).as_deref(), Some("c"));
        }
        assert_eq!(acting_node("k", &pool(), "a", &all[..2]), Acting::Nobody);
    }

    #[test]
    fn another_actor_is_rechecked_after_its_lease_would_expire() {
        let all = vec![live("a", &[pool()], 10), live("b", &[pool()], 40)];
        for i in 0..50 {
            let key = format!("uid-{i}");
            if let Acting::Other { node, recheck_after } = acting_node(&key, &pool(), "a", &all) {
                assert_eq!(node, "b");
                assert_eq!(recheck_after, Duration::from_secs(40) + RECHECK_MARGIN);
                return;
            }
        }
        panic!("b never ranked first in 50 keys");
    }

    #[test]
    fn one_spokesman_among_all_live_nodes() {
        let all = vec![live("a", &[], 60), live("b", &[], 60)];
        let verdicts: Vec<_> = ["a", "b"].iter().map(|me| spokesman("uid", me, &all)).collect();
        assert_eq!(verdicts.iter().filter(|v| **v == Acting::Me).count(), 1);
        assert_eq!(spokesman("uid", "a", &[]), Acting::Nobody);
    }

    #[test]
    fn topology_parameter_values_and_modes() {
        assert_eq!(Topology::parse("node"), Some(Topology::Node));
        assert_eq!(Topology::parse("shared"), Some(Topology::Shared));
        assert_eq!(Topology::parse("everyNode"), Some(Topology::EveryNode));
        assert_eq!(Topology::parse("everynode"), None, "exact spelling, as Kubernetes enums");
        assert!(!Topology::Node.access_modes().contains(&"ReadWriteMany"));
        assert!(Topology::Shared.access_modes().contains(&"ReadOnlyMany"));
        assert!(Topology::EveryNode.access_modes().contains(&"ReadWriteMany"));
        assert!(!Topology::EveryNode.access_modes().contains(&"ReadOnlyMany"));
    }
}

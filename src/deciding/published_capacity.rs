//! What this node tells kube-scheduler about its free space (`--publish-capacity`): one
//! `CSIStorageCapacity` object per class of ours whose pool this node can use now, when an object
//! is due for an update, and which objects of other nodes are left over. Pure.
//!
//! kube-scheduler's VolumeBinding plugin reads these objects only for a class whose provisioner
//! has a `CSIDriver` object with `storageCapacity: true`; then a node with no object of the class
//! selecting it, or one too small, is filtered out before a WaitForFirstConsumer claim is placed.
//! So "no object" means "do not place volumes of this class here": right for a node that lacks
//! the class's pool, whose pool is unusable, or whose provisioner is gone.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::storage::v1::StorageClass;
use sha2::{Digest, Sha256};

use crate::deciding::class::class_request;
use crate::deciding::pool_roots::largest_single_fit;
use crate::deciding::quota::QuotaMode;
use crate::deciding::settings::DecisionConfig;
use crate::deciding::topology::{self, Acting, LiveNode, Topology};

/// Shortest time between two updates of one object's figures (creation and removal are not
/// delayed): a busy pool costs at most one write per class per this interval.
pub const MIN_UPDATE_INTERVAL: Duration = Duration::from_secs(30);
/// Smallest change worth a write, whatever the pool's size.
pub const MIN_CHANGE_BYTES: u64 = 1 << 20;
/// A change smaller than this fraction (1/32, about 3 %) of the published figure is not
/// published: the scheduler's view is approximate by design, and a claim placed on a node that
/// turns out too small is still handed back to the scheduler.
const CHANGE_FRACTION_DIVISOR: u64 = 32;

/// Free space of one root of one of this node's pools, as the publisher measured it (a pool of
/// several roots has one per root).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpace {
    /// Pool name.
    pub pool: String,
    /// Bytes a new volume may take: available space minus the pool's reserve; `None` while the
    /// pool is unusable (missing root, not a mount point when required).
    pub usable_bytes: Option<u64>,
    /// The pool can enforce a `quota: enforce` class now; a class that asks for it is offered
    /// only where this holds, since the claim would be refused anywhere else.
    pub enforces_quota: bool,
}

/// One object this node should publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    /// Object name (deterministic per provisioner, node and class).
    pub name: String,
    /// The class it describes.
    pub class: String,
    /// The pool that class uses on this node.
    pub pool: String,
    /// `capacity` and `maximumVolumeSize`: a volume is a directory sharing the pool's
    /// filesystem, so the largest volume that fits is all the space there is.
    pub bytes: u64,
}

/// The object name for `node` and `class`: `hpp-<provisioner hash>-<hash of node and class>`,
/// a valid name whatever the lengths of node and class names.
pub fn object_name(provisioner_hash: &str, node: &str, class: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update(node.as_bytes());
    hasher.update([0]);
    hasher.update(class.as_bytes());
    let digest = hasher.finalize();
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("hpp-{provisioner_hash}-{hex}")
}

/// The objects this node should publish: one per class of `provisioner` whose parameters are
/// valid, whose pool this node has with the right kind (shared or local) and can use now.
/// Classes this node cannot serve get none, so the scheduler places their claims elsewhere
/// instead of here and back again. A `shared` pool is one filesystem for all nodes: every node
/// publishes the same figures for it (each for itself, so only nodes with a live provisioner
/// are offered). An `everyNode` class gets each node's own free space, the only figure a node
/// knows; the scheduler checks the node it places the first consumer on.
pub fn wanted(
    provisioners: &[&str],
    provisioner_hash: &str,
    node: &str,
    classes: &[StorageClass],
    config: &DecisionConfig,
    space: &[PoolSpace],
) -> Vec<Wanted> {
    let mut wanted: Vec<Wanted> = classes
        .iter()
        .filter(|class| provisioners.contains(&class.provisioner.as_str()))
        .filter_map(|class| {
            let name = class.metadata.name.as_deref()?;
            let request = class_request(class, name, config).ok()?;
            let pool = config.pools.iter().find(|p| Some(&p.name) == request.pool.as_ref())?;
            if pool.shared != request.topology.needs_shared_pool() {
                return None;
            }
            // A pool of several roots (one per disk) offers the largest volume one of its roots
            // can take: a volume cannot span disks. Only node-shaped classes may use one.
            let roots: Vec<_> = space.iter().filter(|s| s.pool == pool.name).collect();
            if roots.len() > 1 && request.topology != Topology::Node {
                return None;
            }
            let able = roots.iter().filter(|s| request.quota != QuotaMode::Enforce || s.enforces_quota);
            let bytes = largest_single_fit(able.map(|s| s.usable_bytes))?;
            Some(Wanted {
                name: object_name(provisioner_hash, node, name),
                class: name.to_owned(),
                pool: pool.name.clone(),
                bytes,
            })
        })
        .collect();
    wanted.sort_by(|a, b| a.name.cmp(&b.name));
    wanted
}

/// What this node last wrote for one of its objects (or found on the server at start-up).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// The pool recorded on the object.
    pub pool: String,
    /// The published figure.
    pub bytes: u64,
    /// How long ago this node wrote it (`None`: written before this process started).
    pub written_ago: Option<Duration>,
}

/// A write to make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Create or update the object.
    Apply(Wanted),
    /// Remove the object: its class is gone, or this node can no longer serve it.
    Delete(String),
}

/// Whether a published figure should be replaced by `wanted`: always when the object is
/// missing or its pool changed; otherwise when the figure moved by at least 1/32 of the
/// published value (and at least [`MIN_CHANGE_BYTES`]) and the last write is at least
/// [`MIN_UPDATE_INTERVAL`] old. An idle pool therefore causes no writes at all.
pub fn update_due(published: Option<&Published>, wanted: &Wanted) -> bool {
    let Some(published) = published else { return true };
    if published.pool != wanted.pool {
        return true;
    }
    let change = published.bytes.abs_diff(wanted.bytes);
    let threshold = (published.bytes / CHANGE_FRACTION_DIVISOR).max(MIN_CHANGE_BYTES);
    let settled = published.written_ago.is_none_or(|ago| ago >= MIN_UPDATE_INTERVAL);
    change >= threshold && settled
}

/// The writes that bring this node's published objects to `wanted`.
pub fn writes(wanted: &[Wanted], published: &BTreeMap<String, Published>) -> Vec<Write> {
    let mut writes: Vec<Write> =
        wanted.iter().filter(|w| update_due(published.get(&w.name), w)).map(|w| Write::Apply(w.clone())).collect();
    writes.extend(
        published
            .keys()
            .filter(|name| !wanted.iter().any(|w| &w.name == *name))
            .map(|name| Write::Delete(name.clone())),
    );
    writes
}

/// An object of this provisioner as listed from the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Object name.
    pub name: String,
    /// The node that published it (from its annotation), if recorded.
    pub node: Option<String>,
}

/// Objects of other nodes whose provisioner is gone (no live lease: killed, or stopped without
/// cleaning up), that this node removes. One live node speaks for each gone node (the same
/// ranking as for every cluster-wide duty), so the objects are deleted once, not once per node.
/// Objects without a node are left alone: this provisioner never writes such an object.
pub fn stale(listed: &[Listed], me: &str, live: &[LiveNode]) -> Vec<String> {
    listed
        .iter()
        .filter_map(|object| {
            let node = object.node.as_deref()?;
            if node == me || live.iter().any(|n| n.node == node) {
                return None;
            }
            (topology::spokesman(&format!("capacity/{node}"), me, live) == Acting::Me).then(|| object.name.clone())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deciding::layout::PoolPath;
    use crate::deciding::settings::ProvisionOnNodePolicy;

    const ME: &str = "node-a";
    const PROVISIONER: &str = "hostpath.example.org";

    fn class(name: &str, provisioner: &str, params: &[(&str, &str)]) -> StorageClass {
        StorageClass {
            metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() },
            provisioner: provisioner.into(),
            parameters: Some(params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        }
    }

    fn config(pools: Vec<PoolPath>) -> DecisionConfig {
        DecisionConfig {
            use_naming_prefix: false,
            default_pool: Some("legacy".into()),
            pools,
            pv_finalizer: false,
            provision_on_node: ProvisionOnNodePolicy::Allow,
            reserved_bytes: 0,
            pv_capacity: crate::deciding::settings::PvCapacity::Request,
            affinity_keys: Vec::new(),
            block_device_dir: None,
        }
    }

    fn space(pool: &str, bytes: Option<u64>) -> PoolSpace {
        PoolSpace { pool: pool.into(), usable_bytes: bytes, enforces_quota: false }
    }

    #[test]
    fn an_enforce_class_is_offered_only_on_pools_that_enforce_quota() {
        let classes = [
            class("enforced", PROVISIONER, &[("storagePool", "ssd"), ("quota", "enforce")]),
            class("plain", PROVISIONER, &[("storagePool", "ssd")]),
        ];
        let pools = vec![PoolPath::local("ssd", "/mnt/ssd")];
        let unable = published_for(&classes, pools.clone(), &[space("ssd", Some(1 << 30))]);
        assert_eq!(unable, vec![("plain".into(), "ssd".into(), 1 << 30)]);
        let able = PoolSpace { enforces_quota: true, ..space("ssd", Some(1 << 30)) };
        let mut got = published_for(&classes, pools, &[able]);
        got.sort();
        assert_eq!(got, vec![("enforced".into(), "ssd".into(), 1 << 30), ("plain".into(), "ssd".into(), 1 << 30)]);
    }

    #[test]
    fn a_pool_of_several_roots_offers_its_largest_single_fit_to_node_classes_only() {
        let classes = [
            class("spread", PROVISIONER, &[("storagePool", "data")]),
            class("spread-enforced", PROVISIONER, &[("storagePool", "data"), ("quota", "enforce")]),
            class("everywhere", PROVISIONER, &[("storagePool", "data"), ("topology", "everyNode")]),
        ];
        let pools = vec![PoolPath::local("data", "/mnt/disk1"), PoolPath::local("data", "/mnt/disk2")];
        let disks = [
            PoolSpace { enforces_quota: true, ..space("data", Some(2 << 30)) },
            space("data", Some(5 << 30)),
            space("data", None),
        ];
        let mut got = published_for(&classes, pools, &disks);
        got.sort();
        assert_eq!(
            got,
            vec![("spread".into(), "data".into(), 5 << 30), ("spread-enforced".into(), "data".into(), 2 << 30)],
            "the roomiest disk (not the sum); for quota, the roomiest disk that enforces it; no every-node object"
        );
    }

    fn published_for(
        classes: &[StorageClass],
        pools: Vec<PoolPath>,
        space: &[PoolSpace],
    ) -> Vec<(String, String, u64)> {
        wanted(&[PROVISIONER], "abcd1234", ME, classes, &config(pools), space)
            .into_iter()
            .map(|w| (w.class, w.pool, w.bytes))
            .collect()
    }

    #[test]
    fn each_class_of_ours_gets_its_pools_free_space() {
        let classes = [
            class("default", PROVISIONER, &[]),
            class("fast", PROVISIONER, &[("storagePool", "ssd")]),
            class("foreign", "other.example.org", &[]),
        ];
        let pools = vec![PoolPath::local("legacy", "/var/hpvolumes"), PoolPath::local("ssd", "/mnt/ssd")];
        let got = published_for(&classes, pools, &[space("legacy", Some(100 << 20)), space("ssd", Some(7 << 30))]);
        let mut want = vec![("default".into(), "legacy".into(), 100 << 20), ("fast".into(), "ssd".into(), 7 << 30)];
        let mut got_sorted = got.clone();
        got_sorted.sort();
        want.sort();
        assert_eq!(got_sorted, want, "{got:?}");
    }

    #[test]
    fn a_class_this_node_cannot_serve_gets_no_object() {
        let classes = [
            class("missing-pool", PROVISIONER, &[("storagePool", "nvme")]),
            class("bad-parameter", PROVISIONER, &[("colour", "blue")]),
            class("shared-on-local", PROVISIONER, &[("topology", "shared")]),
            class("node-on-shared", PROVISIONER, &[("storagePool", "nfs")]),
            class("unusable", PROVISIONER, &[("storagePool", "hdd")]),
        ];
        let pools = vec![
            PoolPath::local("legacy", "/var/hpvolumes"),
            PoolPath::shared("nfs", "/mnt/nfs"),
            PoolPath::local("hdd", "/mnt/hdd"),
        ];
        let got =
            published_for(&classes, pools, &[space("legacy", Some(1)), space("nfs", Some(1)), space("hdd", None)]);
        assert!(got.is_empty(), "{got:?}");
    }

    #[test]
    fn shared_and_every_node_classes_publish_this_nodes_view_of_their_pool() {
        let classes = [
            class("shared", PROVISIONER, &[("storagePool", "nfs"), ("topology", "shared")]),
            class("everywhere", PROVISIONER, &[("topology", "everyNode")]),
        ];
        let pools = vec![PoolPath::local("legacy", "/var/hpvolumes"), PoolPath::shared("nfs", "/mnt/nfs")];
        let mut got = published_for(&classes, pools, &[space("legacy", Some(5 << 30)), space("nfs", Some(9 << 40))]);
        got.sort();
        assert_eq!(
            got,
            vec![("everywhere".into(), "legacy".into(), 5 << 30), ("shared".into(), "nfs".into(), 9 << 40)]
        );
    }

    #[test]
    fn object_names_are_valid_distinct_and_stable() {
        let a = object_name("abcd1234", ME, "fast");
        assert_eq!(a, object_name("abcd1234", ME, "fast"));
        assert_ne!(a, object_name("abcd1234", "node-b", "fast"));
        assert_ne!(a, object_name("abcd1234", ME, "slow"));
        assert_ne!(object_name("abcd1234", "a", "bc"), object_name("abcd1234", "ab", "c"));
        let long = object_name("abcd1234", &"n".repeat(253), &"c".repeat(253));
        assert!(crate::deciding::layout::is_dns_subdomain(&long) && long.len() < 64, "{long}");
    }

    fn want(bytes: u64) -> Wanted {
        Wanted { name: "obj".into(), class: "c".into(), pool: "legacy".into(), bytes }
    }

    fn was(bytes: u64, ago_secs: Option<u64>) -> Published {
        Published { pool: "legacy".into(), bytes, written_ago: ago_secs.map(Duration::from_secs) }
    }

    #[test]
    fn a_missing_object_is_written_at_once() {
        assert!(update_due(None, &want(0)));
    }

    #[test]
    fn an_unchanged_or_slightly_changed_figure_is_not_rewritten() {
        let gib = 1u64 << 30;
        assert!(!update_due(Some(&was(10 * gib, None)), &want(10 * gib)), "idle: no write");
        assert!(!update_due(Some(&was(10 * gib, Some(3600))), &want(10 * gib - gib / 64)), "under 1/32");
        assert!(!update_due(Some(&was(10 << 20, Some(3600))), &want((10 << 20) + 4096)), "under 1 MiB");
    }

    #[test]
    fn a_real_change_is_written_once_the_minimum_interval_has_passed() {
        let gib = 1u64 << 30;
        assert!(update_due(Some(&was(10 * gib, Some(3600))), &want(9 * gib)));
        assert!(update_due(Some(&was(10 * gib, None)), &want(11 * gib)), "first write of this process");
        assert!(!update_due(Some(&was(10 * gib, Some(5))), &want(9 * gib)), "wrote 5 s ago");
        assert!(update_due(Some(&was(2 << 20, Some(30))), &want(0)), "a pool that filled up");
    }

    #[test]
    fn a_class_that_moved_to_another_pool_is_rewritten_at_once() {
        let moved = Published { pool: "ssd".into(), ..was(5, Some(1)) };
        assert!(update_due(Some(&moved), &want(5)));
    }

    #[test]
    fn writes_apply_what_is_due_and_delete_what_is_no_longer_wanted() {
        let mut published = BTreeMap::new();
        published.insert("obj".to_owned(), was(1 << 30, Some(3600)));
        published.insert("gone-class".to_owned(), was(1 << 30, Some(1)));
        let fresh = Wanted { name: "new".into(), ..want(5) };
        let got = writes(&[want(1 << 30), fresh.clone()], &published);
        assert_eq!(got, vec![Write::Apply(fresh), Write::Delete("gone-class".into())]);
        assert!(writes(&[want(1 << 30)], &BTreeMap::from([("obj".to_owned(), was(1 << 30, None))])).is_empty());
    }

    fn live(nodes: &[&str]) -> Vec<LiveNode> {
        nodes
            .iter()
            .map(|n| LiveNode { node: (*n).into(), pools: vec![], expires_in: Duration::from_secs(60) })
            .collect()
    }

    fn listed(name: &str, node: Option<&str>) -> Listed {
        Listed { name: name.into(), node: node.map(Into::into) }
    }

    #[test]
    fn objects_of_gone_nodes_are_removed_by_exactly_one_live_node() {
        let objects = [listed("x1", Some("dead")), listed("x2", Some("dead")), listed("y", Some("node-b"))];
        let nodes = live(&[ME, "node-b", "node-c"]);
        let removers: Vec<&str> =
            nodes.iter().map(|n| n.node.as_str()).filter(|me| !stale(&objects, me, &nodes).is_empty()).collect();
        assert_eq!(removers.len(), 1, "{removers:?}");
        assert_eq!(stale(&objects, removers[0], &nodes), vec!["x1".to_owned(), "x2".to_owned()]);
    }

    #[test]
    fn live_nodes_own_objects_and_unlabelled_ones_are_kept() {
        let objects = [listed("mine", Some(ME)), listed("b", Some("node-b")), listed("anon", None)];
        assert!(stale(&objects, ME, &live(&[ME, "node-b"])).is_empty());
        // This node's own objects are never stale to itself, even while its lease lapsed.
        assert!(stale(&[listed("mine", Some(ME))], ME, &live(&[])).is_empty());
        assert!(stale(&[listed("b", Some("node-b"))], ME, &live(&[])).is_empty(), "no live node: nobody acts");
    }
}

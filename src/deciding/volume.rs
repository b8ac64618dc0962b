//! Whether this node deletes a PV and its directory (docs/architecture.md: compatibility contract item 6, deletion rules). Pure.

use std::time::Duration;

use crate::deciding::identity::Identity;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout::{self, AcceptedPath, PathRefusal, PoolPath};
use crate::deciding::topology::{self, Acting, LiveNode, Topology};
use crate::deciding::unserved::{self, Placement, ServeAdvice};
use crate::keys;

/// Why a PV is left alone silently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ignore {
    /// Already being deleted (by an admin, or by us).
    BeingDeleted,
    /// Not `Released`.
    NotReleased,
    /// Reclaim policy is not `Delete` (Retain keeps PV and data).
    NotDeletePolicy,
    /// Made by another provisioner.
    NotOurs,
    /// Owned by another node, or owner unknown (other nodes stay silent: no event, no retry).
    OtherNode,
    /// A shared or every-node volume another live node acts on; look again when its lease
    /// would have expired.
    ActedOnBy {
        /// The acting node.
        node: String,
        /// When to look again.
        recheck_after: Duration,
    },
    /// An every-node volume whose directory is not under any pool of this node.
    NotMyPool,
}

/// What to do with a PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeDecision {
    /// Nothing, silently.
    Ignore(Ignore),
    /// Remove this directory, then the PV.
    Delete(AcceptedPath),
    /// Ours to delete, but the path is unsafe: Warning event, nothing removed.
    Refuse(DeleteRefusal),
    /// A live every-node volume: make sure this node's copy exists, registering this node's
    /// finalizer on the PV first (so a copy never exists without the PV knowing of it).
    EnsureCopy {
        /// This node's directory.
        accepted: AcceptedPath,
        /// The PV lacks this node's finalizer.
        add_finalizer: bool,
    },
    /// An every-node volume on its way out: remove this node's copy, then its finalizer.
    RemoveCopy {
        /// This node's directory.
        accepted: AcceptedPath,
        /// The PV carries this node's finalizer.
        remove_finalizer: bool,
        /// This node speaks for the volume: it reports nodes whose copies hold the PV back.
        report_waiting: bool,
    },
    /// An every-node volume going away under the Retain policy: keep the copy, drop the finalizer.
    KeepCopy,
    /// A PV deleted by hand while our deletion-protection finalizer holds it, under the Retain
    /// policy: keep the data, let the PV go.
    DropProtection,
    /// A released every-node volume: this node deletes the PV object; every node's finalizer
    /// holds it until that node removed its copy.
    DeleteObject,
}

/// The shape of a PV as this node reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeShape {
    /// Pinned to one node (by annotation or node affinity), or owned by nobody we know.
    Node,
    /// On a shared pool, no owning node.
    Shared,
    /// A copy on every node, no owning node.
    EveryNode,
}

/// Reads the shape: a PV with an owning node is node-shaped; one with our topology label says
/// so; one with neither (the torchbox and kubeboost builds wrote no affinity) is shared when its
/// directory lies in a shared pool and every-node when in a local one.
pub fn volume_shape(pv: &KeptVolume, pools: &[PoolPath]) -> VolumeShape {
    if owner_node(pv).is_some() {
        return VolumeShape::Node;
    }
    match pv.labels.get(keys::TOPOLOGY_LABEL).and_then(Topology::parse) {
        Some(Topology::Shared) => return VolumeShape::Shared,
        Some(Topology::EveryNode) => return VolumeShape::EveryNode,
        Some(Topology::Node) | None => {}
    }
    let path = volume_path(pv);
    let pool = path
        .and_then(|p| layout::normalise(p).ok())
        .and_then(|p| p.parent().and_then(|parent| pools.iter().find(|pool| pool.root == parent)).cloned());
    match pool {
        Some(pool) if pool.shared => VolumeShape::Shared,
        Some(_) => VolumeShape::EveryNode,
        None => VolumeShape::Node,
    }
}

/// Why the owning node refuses to delete a PV's data.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeleteRefusal {
    /// No `spec.hostPath` (the Go build crashed here).
    #[error(
        "PV has neither spec.hostPath nor spec.local; refusing to delete anything. Remove the PV by hand once its data is dealt with"
    )]
    NoHostPath,
    /// The owner annotation names another node than the node label: the annotation's node does
    /// not watch this PV (it watches its own label), so without this report no node would act.
    #[error(
        "PV says it belongs to node {annotation} (annotation kubevirt.io/provisionOnNode) but is labelled for node {label} ({key}); no node deletes it until they agree: fix whichever is wrong"
    )]
    OwnerMismatch {
        /// The node in the annotation.
        annotation: String,
        /// The node in the label.
        label: String,
        /// The label key.
        key: &'static str,
    },
    /// A shared or every-node volume whose directory is in no pool that any node with a running
    /// provisioner serves: no node can make, keep or remove it. (A path inside a served pool
    /// that is no volume of it is an [`DeleteRefusal::UnsafePath`] instead.)
    #[error(
        "the volume's path {path:?} is in no pool a node with a running provisioner serves (pool roots: {roots}); {advice}"
    )]
    NoNodeServesPath {
        /// The PV's hostPath.
        path: String,
        /// The pool roots served.
        roots: String,
        /// Which pool to configure, if any can be.
        advice: ServeAdvice,
    },
    /// The path failed the rules of docs/architecture.md, deletion rules.
    #[error("refusing to delete {path:?}: {refusal}. Nothing was removed; check the PV and remove it by hand")]
    UnsafePath {
        /// The PV's hostPath.
        path: String,
        /// Which rule.
        refusal: PathRefusal,
    },
}

/// The directory of a PV of ours: `spec.hostPath.path`, or `spec.local.path` for a class with
/// `volumeType: local`. Every decision about a PV's data reads its path through this.
///
/// A Block PV's `spec.local.path` is its device node, never its data: its directory is the
/// backing-dir annotation (`deciding::block`), so that deletion, accounting, the reaper and the
/// doctor act on the directory holding the backing file and never on a path under `/dev`. A
/// Block PV without the annotation has no directory (nothing is removed for it).
pub fn volume_path(pv: &KeptVolume) -> Option<&str> {
    let spec = pv.spec.as_ref()?;
    if is_block(pv) {
        return pv.annotations.get(crate::deciding::block::BACKING_DIR_ANNOTATION);
    }
    spec.host_path.as_ref().map(|h| h.path.as_str()).or_else(|| spec.local.as_ref().map(|l| l.path.as_str()))
}

/// Whether the PV is a `volumeMode: Block` volume (its path is a device, its data a file).
pub fn is_block(pv: &KeptVolume) -> bool {
    pv.spec.as_ref().is_some_and(|s| s.volume_mode.as_deref() == Some("Block"))
}

/// The requests promised in the pool at `root`: the capacity of every PV whose directory is in it
/// (any phase: a Released volume's data is still there until it is removed).
pub fn promised_bytes<'a>(pvs: impl IntoIterator<Item = &'a KeptVolume>, root: &'a std::path::Path) -> u64 {
    pool_volume_bytes(pvs, root).map(|(_, bytes)| bytes).fold(0u64, u64::saturating_add)
}

/// The PVs whose directory is in the pool at `root`, by name, with their capacity in bytes.
pub fn pool_volume_bytes<'a>(
    pvs: impl IntoIterator<Item = &'a KeptVolume>,
    root: &'a std::path::Path,
) -> impl Iterator<Item = (&'a str, u64)> {
    pvs.into_iter()
        .filter(move |pv| {
            volume_path(pv).and_then(|p| layout::normalise(p).ok()).is_some_and(|p| p.parent() == Some(root))
        })
        .filter_map(|pv| {
            let quantity = pv.spec.as_ref()?.capacity.as_ref()?.get("storage")?;
            let bytes = crate::deciding::capacity::parse_bytes(&quantity.0).ok()?;
            Some((pv.metadata.name.as_deref().unwrap_or_default(), bytes))
        })
}

/// The node that owns a PV: the `kubevirt.io/provisionOnNode` annotation, or for PVs lacking it
/// (written before August 2019) the single value of its `kubernetes.io/hostname` node affinity.
pub fn owner_node(pv: &KeptVolume) -> Option<&str> {
    if let Some(node) = pv.annotations.get(keys::PROVISION_ON_NODE) {
        return Some(node);
    }
    let terms = &pv.spec.as_ref()?.node_affinity.as_ref()?.required.as_ref()?.node_selector_terms;
    let [term] = &terms[..] else { return None };
    let [expr] = term.match_expressions.as_deref()? else { return None };
    if &*expr.key != keys::HOSTNAME_LABEL || &*expr.operator != "In" {
        return None;
    }
    match expr.values.as_deref()? {
        [value] => Some(&**value),
        _ => None,
    }
}

/// Decides for one PV. `my_hostname` is this node's `kubernetes.io/hostname` label value, which
/// legacy affinity-only PVs may carry instead of the node name. `live` (this node included when
/// it serves a pool) is read only for shared and every-node PVs.
pub fn decide_volume(
    pv: &KeptVolume,
    me: &Identity,
    my_hostname: &str,
    pools: &[PoolPath],
    live: &[LiveNode],
) -> VolumeDecision {
    match volume_shape(pv, pools) {
        VolumeShape::Node => decide_node_volume(pv, me, my_hostname, pools),
        VolumeShape::Shared => decide_shared_volume(pv, me, pools, live),
        VolumeShape::EveryNode => decide_every_node_volume(pv, me, pools, live),
    }
}

/// Whether a node-shaped PV is this node's: pinned to a label this node carries
/// (`nodeAffinityKey`, whichever node made it), else named by its owner annotation, or for PVs
/// older than that annotation by the node's hostname label value.
pub fn is_mine(pv: &KeptVolume, me: &Identity, my_hostname: &str) -> bool {
    if let Some(held) = crate::deciding::node_affinity::holds(pv, &me.affinity) {
        return held;
    }
    owner_node(pv).is_some_and(|owner| owner == me.node || (!has_owner_annotation(pv) && owner == my_hostname))
}

fn decide_node_volume(pv: &KeptVolume, me: &Identity, my_hostname: &str, pools: &[PoolPath]) -> VolumeDecision {
    let mine = is_mine(pv, me, my_hostname);
    if retained_but_protected(pv, me) && mine {
        return VolumeDecision::DropProtection;
    }
    if let Some(ignore) = not_to_delete(pv, me) {
        return VolumeDecision::Ignore(ignore);
    }
    match owner_node(pv) {
        _ if mine => {}
        Some(owner)
            if has_owner_annotation(pv)
                && crate::deciding::node_affinity::pinned_label(pv).is_none()
                && labelled_for(pv) == Some(layout::node_label_value(&me.node)) =>
        {
            return VolumeDecision::Refuse(DeleteRefusal::OwnerMismatch {
                annotation: owner.to_owned(),
                label: me.node.clone(),
                key: keys::NODE_LABEL,
            });
        }
        _ => return VolumeDecision::Ignore(Ignore::OtherNode),
    }
    match accepted_path(pv, pools) {
        Ok(accepted) => VolumeDecision::Delete(accepted),
        Err(refusal) => VolumeDecision::Refuse(refusal),
    }
}

/// A shared volume has one directory: the node the ranking picks removes it and the PV.
fn decide_shared_volume(pv: &KeptVolume, me: &Identity, pools: &[PoolPath], live: &[LiveNode]) -> VolumeDecision {
    let key = pv.metadata.name.as_deref().unwrap_or_default();
    if retained_but_protected(pv, me) {
        return speak(key, me, live, VolumeDecision::DropProtection);
    }
    if let Some(ignore) = not_to_delete(pv, me) {
        return VolumeDecision::Ignore(ignore);
    }
    match accepted_path(pv, pools) {
        Ok(accepted) => {
            let pool = pools.iter().find(|p| p.root == accepted.root).map(PoolPath::key);
            match pool.map(|pool| topology::acting_node(key, &pool, &me.node, live)) {
                Some(Acting::Other { node, recheck_after }) => {
                    VolumeDecision::Ignore(Ignore::ActedOnBy { node, recheck_after })
                }
                // Nobody else serves it: this node has the pool, so it tries (and reports why
                // if the pool is unusable right now).
                _ => VolumeDecision::Delete(accepted),
            }
        }
        Err(DeleteRefusal::UnsafePath { refusal: PathRefusal::OutsidePools { .. }, .. }) => {
            outside_my_pools(pv, me, pools, live)
        }
        Err(refusal) => speak(key, me, live, VolumeDecision::Refuse(refusal)),
    }
}

/// A shared or every-node PV whose directory is in none of this node's pools: a volume of a pool
/// another live node serves is that node's; a path inside a served pool that is no volume of it,
/// or in no served pool, is reported by one node (every node decides alike, whichever pools it
/// has itself).
fn outside_my_pools(pv: &KeptVolume, me: &Identity, pools: &[PoolPath], live: &[LiveNode]) -> VolumeDecision {
    let key = pv.metadata.name.as_deref().unwrap_or_default();
    let path = volume_path(pv).unwrap_or_default().to_owned();
    let served = unserved::served_pools(pools, live);
    let refusal = match unserved::place(&path, key, &served) {
        Placement::ServedVolume(_) => return VolumeDecision::Ignore(Ignore::NotMyPool),
        Placement::NotAVolume(refusal) => DeleteRefusal::UnsafePath { path, refusal },
        Placement::Unserved(advice) => {
            let mut roots: Vec<String> = served.iter().map(|p| p.root.display().to_string()).collect();
            roots.sort_unstable();
            let roots = if roots.is_empty() { "none".to_owned() } else { roots.join(", ") };
            DeleteRefusal::NoNodeServesPath { path, roots, advice }
        }
    };
    speak(key, me, live, VolumeDecision::Refuse(refusal))
}

/// An every-node volume has a copy on each node: each node keeps its own in step with the PV.
fn decide_every_node_volume(pv: &KeptVolume, me: &Identity, pools: &[PoolPath], live: &[LiveNode]) -> VolumeDecision {
    let provisioned_by = pv.annotations.get(keys::PROVISIONED_BY);
    if !provisioned_by.is_some_and(|p| me.serves(p)) {
        return VolumeDecision::Ignore(Ignore::NotOurs);
    }
    let key = pv.metadata.name.as_deref().unwrap_or_default();
    let accepted = match accepted_path(pv, pools) {
        Ok(accepted) => accepted,
        Err(DeleteRefusal::UnsafePath { refusal: PathRefusal::OutsidePools { .. }, .. }) => {
            return outside_my_pools(pv, me, pools, live);
        }
        Err(refusal) => return speak(key, me, live, VolumeDecision::Refuse(refusal)),
    };
    let Some(pool) = pools.iter().find(|p| p.root == accepted.root && !p.shared) else {
        return VolumeDecision::Ignore(Ignore::NotMyPool);
    };
    let finalizer = layout::copy_finalizer(&me.node);
    let has_finalizer = pv.metadata.finalizers.as_ref().is_some_and(|f| f.contains(&finalizer));
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    let delete_policy = pv.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete");
    let acting = topology::acting_node(key, &pool.key(), &me.node, live);
    if pv.metadata.deletion_timestamp.is_some() {
        // A Bound PV deleted by hand stays (pv-protection) until its claim goes: copies are
        // removed only once no claim uses them.
        if phase == Some("Bound") {
            return VolumeDecision::Ignore(Ignore::NotReleased);
        }
        if !delete_policy {
            return if has_finalizer {
                VolumeDecision::KeepCopy
            } else {
                VolumeDecision::Ignore(Ignore::NotDeletePolicy)
            };
        }
        return VolumeDecision::RemoveCopy {
            accepted,
            remove_finalizer: has_finalizer,
            report_waiting: !matches!(acting, Acting::Other { .. }),
        };
    }
    match phase {
        Some("Released") if delete_policy => match acting {
            Acting::Other { node, recheck_after } => VolumeDecision::Ignore(Ignore::ActedOnBy { node, recheck_after }),
            Acting::Me | Acting::Nobody => VolumeDecision::DeleteObject,
        },
        // Retained or failed: copies stay as they are, for an admin to deal with.
        Some("Released" | "Failed") => VolumeDecision::Ignore(Ignore::NotDeletePolicy),
        _ => VolumeDecision::EnsureCopy { accepted, add_finalizer: !has_finalizer },
    }
}

/// Whether our deletion-protection finalizer holds the PV.
pub fn is_protected(pv: &KeptVolume) -> bool {
    pv.metadata.finalizers.as_ref().is_some_and(|f| f.iter().any(|f| f == keys::PROTECTION_FINALIZER))
}

/// A PV of ours deleted by hand under the Retain policy while our finalizer holds it, once no
/// claim uses it: the data stays, the PV may go.
fn retained_but_protected(pv: &KeptVolume, me: &Identity) -> bool {
    let provisioned_by = pv.annotations.get(keys::PROVISIONED_BY);
    pv.metadata.deletion_timestamp.is_some()
        && is_protected(pv)
        && pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound")
        && pv.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) != Some("Delete")
        && provisioned_by.is_some_and(|p| me.serves(p))
}

/// The silent reasons not to delete a PV at all.
fn not_to_delete(pv: &KeptVolume, me: &Identity) -> Option<Ignore> {
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    if pv.metadata.deletion_timestamp.is_some() {
        // Deleted by hand: without our finalizer the PV is gone already as far as we can act;
        // with it, the data goes once no claim uses the volume.
        if !is_protected(pv) {
            return Some(Ignore::BeingDeleted);
        }
        if phase == Some("Bound") {
            return Some(Ignore::NotReleased);
        }
    } else if phase != Some("Released") {
        return Some(Ignore::NotReleased);
    }
    if pv.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) != Some("Delete") {
        return Some(Ignore::NotDeletePolicy);
    }
    let provisioned_by = pv.annotations.get(keys::PROVISIONED_BY);
    if !provisioned_by.is_some_and(|p| me.serves(p)) {
        return Some(Ignore::NotOurs);
    }
    None
}

/// The PV's directory, if its path passes the rules of deletion.
fn accepted_path(pv: &KeptVolume, pools: &[PoolPath]) -> Result<AcceptedPath, DeleteRefusal> {
    let Some(path) = volume_path(pv) else {
        return Err(DeleteRefusal::NoHostPath);
    };
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    let named_by_pattern = pv.annotations.contains_key(keys::PATH_PATTERN);
    layout::accept_volume_path(path, pv_name, pools, named_by_pattern)
        .map_err(|refusal| DeleteRefusal::UnsafePath { path: path.to_owned(), refusal })
}

/// A refusal about a volume without an owning node is reported by one node only.
fn speak(key: &str, me: &Identity, live: &[LiveNode], decision: VolumeDecision) -> VolumeDecision {
    match topology::spokesman(key, &me.node, live) {
        Acting::Other { .. } => VolumeDecision::Ignore(Ignore::OtherNode),
        Acting::Me | Acting::Nobody => decision,
    }
}

/// The value of our node label on the PV.
fn labelled_for(pv: &KeptVolume) -> Option<String> {
    pv.labels.get(keys::NODE_LABEL).map(str::to_owned)
}

fn has_owner_annotation(pv: &KeptVolume) -> bool {
    pv.annotations.contains_key(keys::PROVISION_ON_NODE)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::test_fixtures::*;

    /// A PV shaped exactly like the Go build writes it (no labels, no hostPath type), released.
    fn go_pv(dir: &str, owner_annotation: Option<&str>, affinity_node: &str) -> KeptVolume {
        let pv = pv(&format!("/var/hpvolumes/{dir}"), "Released").hostname_affinity(affinity_node);
        match owner_annotation {
            Some(node) => pv.owner_annotation(node).build(),
            None => pv.build(),
        }
    }

    fn decide(pv: &KeptVolume) -> VolumeDecision {
        decide_volume(pv, &me(), "node-a-host", &config().pools, &[])
    }

    fn pv_dir() -> String {
        format!("pvc-{UID}")
    }

    #[test]
    fn released_delete_pv_of_ours_on_this_node_is_deleted_in_every_go_layout() {
        for dir in [pv_dir(), format!("data-{}", pv_dir()), format!("default-data-{}", pv_dir())] {
            let d = decide(&go_pv(&dir, Some(NODE), NODE));
            assert_eq!(
                d,
                VolumeDecision::Delete(AcceptedPath {
                    pool: "legacy".into(),
                    root: "/var/hpvolumes".into(),
                    dir_name: dir,
                    marked: false
                })
            );
        }
    }

    #[test]
    fn other_nodes_stay_silent() {
        assert_eq!(decide(&go_pv(&pv_dir(), Some(OTHER_NODE), OTHER_NODE)), VolumeDecision::Ignore(Ignore::OtherNode));
        // The annotation wins over the affinity.
        assert_eq!(decide(&go_pv(&pv_dir(), Some(OTHER_NODE), NODE)), VolumeDecision::Ignore(Ignore::OtherNode));
    }

    #[test]
    fn pv_without_owner_annotation_falls_back_to_node_affinity() {
        assert!(matches!(decide(&go_pv(&pv_dir(), None, NODE)), VolumeDecision::Delete(_)));
        assert!(matches!(decide(&go_pv(&pv_dir(), None, "node-a-host")), VolumeDecision::Delete(_)));
        assert_eq!(decide(&go_pv(&pv_dir(), None, OTHER_NODE)), VolumeDecision::Ignore(Ignore::OtherNode));
    }

    #[test]
    fn pv_without_any_owner_outside_the_pools_is_nobodys() {
        let mut pv = go_pv(&pv_dir(), None, NODE);
        pv.spec.as_mut().unwrap().node_affinity = None;
        pv.spec.as_mut().unwrap().host_path.as_mut().unwrap().path = format!("/elsewhere/{}", pv_dir());
        assert_eq!(decide(&pv), VolumeDecision::Ignore(Ignore::OtherNode));
    }

    // ---- shared and every-node volumes ----

    use crate::deciding::topology::{LiveNode, PoolKey};

    fn shape_pools() -> Vec<PoolPath> {
        vec![PoolPath::local("legacy", "/var/hpvolumes"), PoolPath::shared("nfs", "/mnt/nfs")]
    }

    /// A PV without an owning node, as the torchbox (shared) or kubeboost (every-node) builds
    /// wrote them, or with our topology label.
    fn unpinned_pv(path: &str, topology: Option<&str>, phase: &str) -> KeptVolume {
        let mut pv = go_pv(&pv_dir(), None, NODE);
        pv.spec.as_mut().unwrap().node_affinity = None;
        pv.spec.as_mut().unwrap().host_path.as_mut().unwrap().path = path.into();
        pv.status.as_mut().unwrap().phase = Some(phase.into());
        if let Some(t) = topology {
            pv.labels = KeptMap::from([(keys::TOPOLOGY_LABEL, t)]);
        }
        pv
    }

    fn live(nodes: &[&str]) -> Vec<LiveNode> {
        nodes
            .iter()
            .map(|n| LiveNode {
                node: (*n).into(),
                pools: vec![PoolKey::new("legacy", "/var/hpvolumes"), PoolKey::new("nfs", "/mnt/nfs")],
                expires_in: Duration::from_secs(30),
            })
            .collect()
    }

    fn decide_as(node: &str, pv: &KeptVolume, live: &[LiveNode]) -> VolumeDecision {
        let me = Identity { node: node.into(), ..me() };
        decide_volume(pv, &me, node, &shape_pools(), live)
    }

    #[test]
    fn shapes_are_read_from_the_owner_the_label_or_the_pool() {
        let pools = shape_pools();
        assert_eq!(volume_shape(&go_pv(&pv_dir(), Some(NODE), NODE), &pools), VolumeShape::Node);
        let torchbox = unpinned_pv(&format!("/mnt/nfs/{}", pv_dir()), None, "Released");
        assert_eq!(volume_shape(&torchbox, &pools), VolumeShape::Shared);
        let kubeboost = unpinned_pv(&format!("/var/hpvolumes/default-data-{}", pv_dir()), None, "Bound");
        assert_eq!(volume_shape(&kubeboost, &pools), VolumeShape::EveryNode);
        let labelled = unpinned_pv(&format!("/var/hpvolumes/{}", pv_dir()), Some("shared"), "Bound");
        assert_eq!(volume_shape(&labelled, &pools), VolumeShape::Shared);
    }

    #[test]
    fn a_released_shared_volume_is_deleted_by_exactly_one_live_node() {
        let nodes = live(&["a", "b", "c"]);
        let pv = unpinned_pv(&format!("/mnt/nfs/{}", pv_dir()), None, "Released");
        let deleters: Vec<_> =
            ["a", "b", "c"].iter().filter(|n| matches!(decide_as(n, &pv, &nodes), VolumeDecision::Delete(_))).collect();
        assert_eq!(deleters.len(), 1, "{deleters:?}");
        // Its actor gone, another takes over.
        let rest: Vec<_> = nodes.iter().filter(|n| n.node != *deleters[0]).cloned().collect();
        let next: Vec<_> =
            rest.iter().filter(|n| matches!(decide_as(&n.node, &pv, &rest), VolumeDecision::Delete(_))).collect();
        assert_eq!(next.len(), 1);
        assert_ne!(next[0].node, *deleters[0]);
    }

    #[test]
    fn a_bound_shared_volume_is_left_alone() {
        let pv = unpinned_pv(&format!("/mnt/nfs/{}", pv_dir()), Some("shared"), "Bound");
        assert_eq!(decide_as("a", &pv, &live(&["a"])), VolumeDecision::Ignore(Ignore::NotReleased));
    }

    #[test]
    fn every_node_keeps_its_copy_while_the_volume_lives() {
        let path = format!("/var/hpvolumes/{}", pv_dir());
        let accepted =
            AcceptedPath { pool: "legacy".into(), root: "/var/hpvolumes".into(), dir_name: pv_dir(), marked: false };
        let mut pv = unpinned_pv(&path, Some("everyNode"), "Bound");
        for node in ["a", "b"] {
            assert_eq!(
                decide_as(node, &pv, &live(&["a", "b"])),
                VolumeDecision::EnsureCopy { accepted: accepted.clone(), add_finalizer: true }
            );
        }
        pv.metadata.finalizers = Some(vec![layout::copy_finalizer("a")]);
        assert_eq!(
            decide_as("a", &pv, &live(&["a", "b"])),
            VolumeDecision::EnsureCopy { accepted: accepted.clone(), add_finalizer: false }
        );
    }

    #[test]
    fn a_released_every_node_volume_is_deleted_by_one_node_and_each_removes_its_copy() {
        let path = format!("/var/hpvolumes/{}", pv_dir());
        let mut pv = unpinned_pv(&path, Some("everyNode"), "Released");
        pv.metadata.finalizers = Some(vec![layout::copy_finalizer("a"), layout::copy_finalizer("b")]);
        let nodes = live(&["a", "b"]);
        let deleting: Vec<_> =
            ["a", "b"].iter().filter(|n| decide_as(n, &pv, &nodes) == VolumeDecision::DeleteObject).collect();
        assert_eq!(deleting.len(), 1);
        pv.metadata.deletion_timestamp = Some(Time(Default::default()));
        let mut speakers = 0;
        for node in ["a", "b", "c"] {
            match decide_as(node, &pv, &nodes) {
                VolumeDecision::RemoveCopy { remove_finalizer, report_waiting, .. } => {
                    assert_eq!(remove_finalizer, node != "c", "{node}");
                    speakers += usize::from(report_waiting);
                }
                other => panic!("{node}: {other:?}"),
            }
        }
        assert_eq!(speakers, 1, "one node reports copies that hold the PV back");
    }

    #[test]
    fn every_node_copies_stay_while_a_deleted_pv_is_still_bound_or_retained() {
        let path = format!("/var/hpvolumes/{}", pv_dir());
        let mut pv = unpinned_pv(&path, Some("everyNode"), "Bound");
        pv.metadata.finalizers = Some(vec![layout::copy_finalizer("a")]);
        pv.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(decide_as("a", &pv, &live(&["a"])), VolumeDecision::Ignore(Ignore::NotReleased));
        pv.status.as_mut().unwrap().phase = Some("Released".into());
        pv.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        assert_eq!(decide_as("a", &pv, &live(&["a"])), VolumeDecision::KeepCopy);
        let mut retained = unpinned_pv(&path, Some("everyNode"), "Released");
        retained.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        assert_eq!(decide_as("a", &retained, &live(&["a"])), VolumeDecision::Ignore(Ignore::NotDeletePolicy));
    }

    #[test]
    fn kubeboost_directory_names_are_recognised_and_foreign_paths_are_not_ours() {
        let kubeboost = unpinned_pv(&format!("/var/hpvolumes/default-data-{}", pv_dir()), None, "Bound");
        assert!(matches!(
            decide_as("a", &kubeboost, &live(&["a"])),
            VolumeDecision::EnsureCopy { accepted: AcceptedPath { ref dir_name, .. }, .. } if *dir_name == format!("default-data-{}", pv_dir())
        ));
        let mut other_root = unpinned_pv(&format!("/var/hpvolumes/{}", pv_dir()), Some("everyNode"), "Bound");
        other_root.spec.as_mut().unwrap().host_path.as_mut().unwrap().path = format!("/data/{}", pv_dir());
        // A pool no live node serves: the one node speaking for it says so...
        assert!(matches!(
            decide_as("a", &other_root, &live(&["a"])),
            VolumeDecision::Refuse(DeleteRefusal::NoNodeServesPath { advice: ServeAdvice::ServeParent(ref parent), .. }) if parent == "/data"
        ));
        // ... while a pool another live node serves is that node's.
        let mut served = live(&["a", "b"]);
        served[1].pools.push(topology::PoolKey::new("data", "/data"));
        assert_eq!(decide_as("a", &other_root, &served), VolumeDecision::Ignore(Ignore::NotMyPool));
        let mut traversal = unpinned_pv(&format!("/var/hpvolumes/{}", pv_dir()), Some("everyNode"), "Bound");
        traversal.spec.as_mut().unwrap().host_path.as_mut().unwrap().path = "/var/hpvolumes/../etc".into();
        let refusals = ["a", "b"]
            .iter()
            .filter(|n| matches!(decide_as(n, &traversal, &live(&["a", "b"])), VolumeDecision::Refuse(_)))
            .count();
        assert_eq!(refusals, 1, "one node reports an unsafe every-node PV");
    }

    /// A shared or every-node PV at a served pool's root, or inside a served pool but not
    /// directly under its root, whichever node serves that pool: refused as no volume of that
    /// pool by exactly one node, and no node advises serving another pool for it.
    #[test]
    fn a_path_in_a_served_pool_that_is_no_volume_is_refused_as_such_by_one_node() {
        // Node b alone serves /data; a (the other live node) serves the usual pools.
        let mut nodes = live(&["a", "b"]);
        nodes[1].pools = vec![topology::PoolKey::new("data", "/data")];
        let b_pools = vec![PoolPath::local("data", "/data")];
        let decide_on = |node: &str, pv: &KeptVolume| {
            let me = Identity { node: node.into(), ..me() };
            let pools = if node == "b" { b_pools.clone() } else { shape_pools() };
            decide_volume(pv, &me, node, &pools, &nodes)
        };
        for (path, topology, pool) in [
            ("/data".to_owned(), "shared", "data"),
            (format!("/data/sub/{}", pv_dir()), "everyNode", "data"),
            ("/mnt/nfs/".to_owned(), "everyNode", "nfs"),
            (format!("/mnt/nfs/a/b/{}", pv_dir()), "shared", "nfs"),
        ] {
            let pv = unpinned_pv(&path, Some(topology), "Released");
            let decisions: Vec<_> = ["a", "b"].iter().map(|n| decide_on(n, &pv)).collect();
            let refusals: Vec<_> = decisions.iter().filter(|d| matches!(d, VolumeDecision::Refuse(_))).collect();
            assert_eq!(refusals.len(), 1, "{path}: one node speaks: {decisions:?}");
            let VolumeDecision::Refuse(refusal @ DeleteRefusal::UnsafePath { refusal: why, .. }) = refusals[0] else {
                panic!("{path}: {refusals:?}");
            };
            assert!(
                matches!(why, PathRefusal::PoolRoot { pool: p, .. } | PathRefusal::NestedInPool { pool: p, .. } if p == pool),
                "{path}: {why:?}"
            );
            let text = refusal.to_string();
            assert!(!text.contains("--pool") && !text.contains("in no pool"), "{path}: {text}");
            assert!(
                decisions
                    .iter()
                    .all(|d| matches!(d, VolumeDecision::Refuse(_) | VolumeDecision::Ignore(Ignore::OtherNode)))
            );
        }
    }

    #[test]
    fn only_released_delete_pvs_of_ours_without_deletion_timestamp_qualify() {
        let mut bound = go_pv(&pv_dir(), Some(NODE), NODE);
        bound.status.as_mut().unwrap().phase = Some("Bound".into());
        assert_eq!(decide(&bound), VolumeDecision::Ignore(Ignore::NotReleased));

        let mut retain = go_pv(&pv_dir(), Some(NODE), NODE);
        retain.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        assert_eq!(decide(&retain), VolumeDecision::Ignore(Ignore::NotDeletePolicy));

        let mut foreign = go_pv(&pv_dir(), Some(NODE), NODE);
        foreign.annotations.insert(keys::PROVISIONED_BY, "other");
        assert_eq!(decide(&foreign), VolumeDecision::Ignore(Ignore::NotOurs));

        let mut deleting = go_pv(&pv_dir(), Some(NODE), NODE);
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(decide(&deleting), VolumeDecision::Ignore(Ignore::BeingDeleted));
    }

    #[test]
    fn pv_without_host_path_is_refused_not_a_crash() {
        let mut pv = go_pv(&pv_dir(), Some(NODE), NODE);
        pv.spec.as_mut().unwrap().host_path = None;
        assert_eq!(decide(&pv), VolumeDecision::Refuse(DeleteRefusal::NoHostPath));
    }

    #[test]
    fn pv_pointing_outside_the_pool_is_refused() {
        let mut pv = go_pv(&pv_dir(), Some(NODE), NODE);
        for path in ["/", "/etc", "/var/hpvolumes", "/var/hpvolumes/../../etc"] {
            pv.spec.as_mut().unwrap().host_path.as_mut().unwrap().path = path.into();
            assert!(matches!(decide(&pv), VolumeDecision::Refuse(DeleteRefusal::UnsafePath { .. })), "{path}");
        }
    }

    #[test]
    fn an_owner_annotation_disagreeing_with_the_label_is_reported_by_the_labelled_node() {
        // Labelled for this node (so only this node sees it), annotated for another.
        let mut pv = go_pv(&pv_dir(), Some(OTHER_NODE), OTHER_NODE);
        pv.labels = KeptMap::from([(keys::NODE_LABEL, NODE)]);
        match decide(&pv) {
            VolumeDecision::Refuse(refusal @ DeleteRefusal::OwnerMismatch { .. }) => {
                let text = refusal.to_string();
                assert!(text.contains(OTHER_NODE) && text.contains(NODE), "{text}");
            }
            other => panic!("{other:?}"),
        }
        // Still silent while there is nothing to do.
        pv.status.as_mut().unwrap().phase = Some("Bound".into());
        assert_eq!(decide(&pv), VolumeDecision::Ignore(Ignore::NotReleased));
    }

    #[test]
    fn a_protected_pv_deleted_by_hand_is_cleaned_up_once_no_claim_uses_it() {
        let mut pv = go_pv(&pv_dir(), Some(NODE), NODE);
        pv.metadata.finalizers = Some(vec![keys::PROTECTION_FINALIZER.into()]);
        pv.metadata.deletion_timestamp = Some(Time(Default::default()));
        pv.status.as_mut().unwrap().phase = Some("Bound".into());
        assert_eq!(decide(&pv), VolumeDecision::Ignore(Ignore::NotReleased), "still in use");
        pv.status.as_mut().unwrap().phase = Some("Released".into());
        assert!(matches!(decide(&pv), VolumeDecision::Delete(_)), "Delete policy: the data goes, then the finalizer");
        pv.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        assert_eq!(decide(&pv), VolumeDecision::DropProtection, "Retain: the data stays, the PV goes");
        let mut others = pv.clone();
        others.annotations.insert(keys::PROVISION_ON_NODE, OTHER_NODE);
        assert!(matches!(decide(&others), VolumeDecision::Ignore(_)), "another node's PV: silent");
        // Without our finalizer a deleted PV is not ours to act on (the Go-compatible default).
        pv.metadata.finalizers = None;
        assert_eq!(decide(&pv), VolumeDecision::Ignore(Ignore::BeingDeleted));
    }

    #[test]
    fn refusals_on_other_nodes_stay_silent() {
        // An unsafe PV of another node is that node's to report.
        let mut pv = go_pv(&pv_dir(), Some(OTHER_NODE), OTHER_NODE);
        pv.spec.as_mut().unwrap().host_path = None;
        assert_eq!(decide(&pv), VolumeDecision::Ignore(Ignore::OtherNode));
    }
}

//! Clones: a claim whose `dataSource` (or `dataSourceRef`) names another claim of the same class
//! in the same namespace gets a copy of that claim's volume. Pure decisions: is the clone
//! accepted, may it start yet, which node copies, and how each filesystem copies.

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec};

use crate::deciding::capacity::parse_bytes;
use crate::deciding::class::claim_class_name;
use crate::deciding::identity::Identity;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout::{self, PoolPath};
use crate::deciding::quota::QuotaMode;
use crate::deciding::refusal::CloneRefusal;
use crate::deciding::volume::{self, VolumeShape};
use crate::keys;

/// The only data source kind we fill (core API group).
pub const CLAIM_KIND: &str = "PersistentVolumeClaim";

/// Which claim, if any, a claim asks to be cloned from. `dataSourceRef` wins over `dataSource`
/// (the API server mirrors one into the other when only one is set).
pub fn requested_source(spec: &PersistentVolumeClaimSpec, namespace: &str) -> Result<Option<String>, CloneRefusal> {
    let from_ref = spec
        .data_source_ref
        .as_ref()
        .map(|r| (r.api_group.clone().unwrap_or_default(), r.kind.clone(), r.name.clone(), r.namespace.clone()));
    let from_source = spec
        .data_source
        .as_ref()
        .map(|s| (s.api_group.clone().unwrap_or_default(), s.kind.clone(), s.name.clone(), None));
    if let (Some(a), Some(b)) = (&from_ref, &from_source)
        && (&a.0, &a.1, &a.2) != (&b.0, &b.1, &b.2)
    {
        return Err(CloneRefusal::Ambiguous);
    }
    let Some((group, kind, name, ns)) = from_ref.or(from_source) else { return Ok(None) };
    if kind == "VolumeSnapshot" {
        return Err(CloneRefusal::Snapshot { kind, name });
    }
    let restore = kind == crate::deciding::snapshot::KIND && group == crate::deciding::snapshot::GROUP;
    if !restore && (kind != CLAIM_KIND || !group.is_empty()) {
        return Err(CloneRefusal::Populator { kind, group, name });
    }
    if let Some(ns) = ns.filter(|ns| ns != namespace) {
        return Err(CloneRefusal::OtherNamespace { namespace: ns, name, own: namespace.to_owned() });
    }
    // A restore is no clone: `deciding::snapshot` reads it.
    Ok((!restore).then_some(name))
}

/// The same, straight from a claim.
pub fn claim_source(claim: &PersistentVolumeClaim) -> Result<Option<String>, CloneRefusal> {
    match &claim.spec {
        Some(spec) => requested_source(spec, claim.metadata.namespace.as_deref().unwrap_or_default()),
        None => Ok(None),
    }
}

/// Refuses, before any copying, a `quota: enforce` clone of a source that is no quota volume:
/// only a snapshot of a quota volume can be limited; a copy of a plain directory would be made
/// in full and then fail to get its limit, for good.
pub fn check_quota_source(
    quota: QuotaMode,
    source_claim: &str,
    source_is_quota_volume: bool,
) -> Result<(), CloneRefusal> {
    match quota {
        QuotaMode::Enforce if !source_is_quota_volume => Err(CloneRefusal::SourceWithoutQuota(source_claim.to_owned())),
        _ => Ok(()),
    }
}

/// Whether `claim` still waits for a copy of source claim `source_name` (of its namespace): it
/// names that source, is not being deleted and has no volume yet (the library's rule: a pending
/// clone of it).
pub fn awaits_copy_of(claim: &PersistentVolumeClaim, source_name: &str) -> bool {
    let names_source = matches!(claim_source(claim), Ok(Some(name)) if name == source_name);
    let has_volume = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_some_and(|n| !n.is_empty());
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
    names_source
        && claim.metadata.deletion_timestamp.is_none()
        && !has_volume
        && matches!(phase, None | Some("Pending"))
}

/// Whether source claim `source_name`'s cloning-protection finalizer may be removed: no claim of
/// its namespace (`claims`) waits for a copy of it, except `finished` (the uid of the clone whose
/// copy just ended, still pending until its PV is made). The count of copies one process makes
/// cannot answer this: on a shared pool another node may be copying the same source.
pub fn may_release_source(source_name: &str, claims: &[PersistentVolumeClaim], finished: Option<&str>) -> bool {
    !claims
        .iter()
        .filter(|claim| finished.is_none() || claim.metadata.uid.as_deref() != finished)
        .any(|claim| awaits_copy_of(claim, source_name))
}

/// What the source claim and its PV allow right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceVerdict {
    /// Not usable yet (missing, being deleted, not bound): say why and look again.
    Wait(String),
    /// Never usable as it is.
    Refuse(CloneRefusal),
    /// Held by this node, or on a shared pool (where every node sees the same files): copy from
    /// `dir_name` in the clone's pool.
    Ready {
        /// The pool root holding it (one of the clone's pool's roots): the copy is made there.
        root: std::path::PathBuf,
        /// The source's directory directly under that root.
        dir_name: String,
        /// A `pathPattern` directory: copied only while its marker names this PV.
        marked_for: Option<String>,
    },
    /// A node-local volume of another node: only that node can copy it.
    Elsewhere(String),
}

/// The clone being checked.
#[derive(Clone, Copy, Debug)]
pub struct CloneRequest<'a> {
    /// The source claim's name.
    pub source_name: &'a str,
    /// The clone's class.
    pub class_name: &'a str,
    /// The clone's storage request, verbatim (for messages).
    pub request: &'a str,
    /// The clone's request in bytes.
    pub request_bytes: u64,
    /// The roots of the pool the clone goes to (one, or one per disk of a pool of several).
    pub pools: &'a [PoolPath],
    /// The clone is a `volumeMode: Block` claim: its source must be a Block volume too.
    pub block: bool,
}

/// A claim's storage request in bytes.
pub fn request_bytes(claim: &PersistentVolumeClaim) -> Option<u64> {
    storage_request(claim).and_then(|q| parse_bytes(q).ok())
}

fn storage_request(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?.get("storage").map(|q| q.0.as_str())
}

/// Checks the source claim and its PV (either may be missing).
pub fn check_source(
    clone: CloneRequest<'_>,
    source: Option<&PersistentVolumeClaim>,
    source_pv: Option<&KeptVolume>,
    me: &Identity,
) -> SourceVerdict {
    let name = clone.source_name;
    let Some(source) = source else {
        return SourceVerdict::Wait(format!(
            "source claim {name:?} does not exist (yet); the clone is made once it exists and is bound"
        ));
    };
    if source.metadata.deletion_timestamp.is_some() {
        return SourceVerdict::Wait(format!(
            "source claim {name:?} is being deleted; the clone waits: if the source goes away, delete this claim or point it at another source"
        ));
    }
    let source_class = claim_class_name(source).unwrap_or_default();
    if source_class != clone.class_name {
        return SourceVerdict::Refuse(CloneRefusal::OtherClass {
            source_claim: name.to_owned(),
            source_class: source_class.to_owned(),
            class: clone.class_name.to_owned(),
        });
    }
    // The source's own request is what its user asked for; a PV's capacity may be the whole
    // filesystem (--pv-capacity=filesystem), so it is no measure of the source.
    if let Some(source_request) = storage_request(source)
        && let Ok(source_bytes) = parse_bytes(source_request)
        && clone.request_bytes < source_bytes
    {
        return SourceVerdict::Refuse(CloneRefusal::Smaller {
            requested: clone.request.to_owned(),
            source_claim: name.to_owned(),
            source_request: source_request.to_owned(),
        });
    }
    let bound_pv = source.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|v| !v.is_empty());
    let phase = source.status.as_ref().and_then(|s| s.phase.as_deref());
    let (Some(pv_name), Some("Bound")) = (bound_pv, phase) else {
        return SourceVerdict::Wait(format!(
            "source claim {name:?} is not bound yet; the clone is made once it is (a WaitForFirstConsumer source is bound when its first pod is scheduled)"
        ));
    };
    let Some(pv) = source_pv.filter(|pv| pv.metadata.name.as_deref() == Some(pv_name)) else {
        return SourceVerdict::Wait(format!(
            "source claim {name:?} is bound to PV {pv_name:?}, which is not visible yet"
        ));
    };
    let ours = pv.annotations.get(keys::PROVISIONED_BY).is_some_and(|p| me.serves(p));
    if !ours {
        return SourceVerdict::Refuse(CloneRefusal::NotOurs {
            source_claim: name.to_owned(),
            pv: pv_name.to_owned(),
            provisioner: me.provisioner.clone(),
        });
    }
    let bound_uid = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.uid.as_deref());
    if bound_uid != source.metadata.uid.as_deref() {
        return SourceVerdict::Wait(format!("PV {pv_name:?} is not bound to source claim {name:?} (yet)"));
    }
    let pools = clone.pools;
    // A Block source's directory holds its backing file, copied whole; a Block volume is
    // never cloned into a directory for a pod, nor a directory into a device image.
    let mode = |block: bool| if block { "Block" } else { "Filesystem" };
    if volume::is_block(pv) != clone.block {
        return SourceVerdict::Refuse(CloneRefusal::VolumeMode {
            source_claim: name.to_owned(),
            source_mode: mode(volume::is_block(pv)),
            mode: mode(clone.block),
        });
    }
    let owner = match volume::volume_shape(pv, pools) {
        // Pinned to a label this node carries: this node's, whichever node made it.
        VolumeShape::Node if crate::deciding::node_affinity::holds(pv, &me.affinity) == Some(true) => {
            Some(me.node.clone())
        }
        VolumeShape::Node => volume::owner_node(pv).map(str::to_owned),
        VolumeShape::Shared => None,
        VolumeShape::EveryNode => return SourceVerdict::Refuse(CloneRefusal::EveryNode(name.to_owned())),
    };
    // Another node's directory is checked by that node, against its own pools.
    if let Some(owner) = owner.filter(|owner| *owner != me.node) {
        return SourceVerdict::Elsewhere(owner);
    }
    let path = volume::volume_path(pv).unwrap_or_default();
    let named_by_pattern = pv.annotations.contains_key(crate::keys::PATH_PATTERN);
    let (root, dir_name, marked_for) = match layout::accept_volume_path(path, pv_name, pools, named_by_pattern) {
        Ok(accepted) => (accepted.root, accepted.dir_name, accepted.marked.then(|| pv_name.to_owned())),
        Err(why) => {
            return SourceVerdict::Refuse(CloneRefusal::OtherPool {
                pv: pv_name.to_owned(),
                path: path.to_owned(),
                pool: pools.first().map(|p| p.name.clone()).unwrap_or_default(),
                why: why.to_string(),
            });
        }
    };
    SourceVerdict::Ready { root, dir_name, marked_for }
}

/// Who copies, once the source is ready and the claim decision chose this node (or, for an
/// Immediate node-shaped claim, chose nobody).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloneActor {
    /// This node copies.
    Me,
    /// The source's node copies; this node stays silent.
    Other(String),
    /// The scheduler placed the claim here, but the source lives on `source_node`: say so and
    /// give the claim back to the scheduler.
    WrongNode {
        /// Where the source lives.
        source_node: String,
    },
    /// Pinned here by annotation while the source lives elsewhere.
    Refuse(CloneRefusal),
}

/// How the claim decision placed the clone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Immediate and node-shaped: no node is named; the source's owner acts.
    Unplaced,
    /// Placed here by the scheduler (WaitForFirstConsumer).
    Scheduled,
    /// Placed here by `kubevirt.io/provisionOnNode`, or chosen among the live nodes (shared).
    Pinned,
}

/// The node that holds the source copies it: a node-local directory exists on one node only.
/// On a shared pool every node sees the same files, so whichever node the claim decision chose
/// copies.
pub fn clone_actor(owner: Option<&str>, placement: Placement, me: &Identity) -> CloneActor {
    let Some(owner) = owner else { return CloneActor::Me };
    if owner == me.node {
        return CloneActor::Me;
    }
    match placement {
        Placement::Unplaced => CloneActor::Other(owner.to_owned()),
        Placement::Scheduled => CloneActor::WrongNode { source_node: owner.to_owned() },
        Placement::Pinned => {
            CloneActor::Refuse(CloneRefusal::PinnedElsewhere { pinned: me.node.clone(), source_node: owner.to_owned() })
        }
    }
}

/// The filesystem a pool lives on, as far as copying cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FilesystemKind {
    /// btrfs: subvolume snapshots and reflinks.
    Btrfs,
    /// XFS: reflinks (when made with `reflink=1`, the default since xfsprogs 5.1).
    Xfs,
    /// Anything else: bytes are copied.
    Other,
}

/// How a volume is copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyMethod {
    /// One btrfs snapshot of the source subvolume (atomic, instant, shares every extent).
    Snapshot,
    /// A walk that shares each file's extents (`FICLONE`), falling back to bytes per file.
    Reflink,
    /// A walk that copies bytes (holes kept).
    Bytes,
}

impl CopyMethod {
    /// For logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Snapshot => "snapshot",
            Self::Reflink => "reflink",
            Self::Bytes => "bytes",
        }
    }
}

/// btrfs snapshots a source that is a subvolume (quota volumes are) and reflinks otherwise;
/// XFS reflinks; other filesystems copy bytes.
pub fn copy_method(kind: FilesystemKind, source_is_subvolume: bool) -> CopyMethod {
    match kind {
        FilesystemKind::Btrfs if source_is_subvolume => CopyMethod::Snapshot,
        FilesystemKind::Btrfs | FilesystemKind::Xfs => CopyMethod::Reflink,
        FilesystemKind::Other => CopyMethod::Bytes,
    }
}

#[cfg(test)]
mod tests;

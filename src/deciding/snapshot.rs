//! Snapshots: a `HostPathSnapshot` (this project's own resource: the snapshot controller of
//! `snapshot.storage.k8s.io` serves CSI drivers only) is a point-in-time copy of a claim's
//! volume, kept on the node and pool root of the volume, under
//! `<root>/.hpp-snapshots/<snapshot uid>`: a btrfs snapshot of a quota subvolume, a reflink copy
//! on XFS and btrfs, a byte copy elsewhere. A claim whose `dataSourceRef` names it is restored
//! from it. Pure decisions: the resource, who takes a snapshot, whether a restore may start,
//! and when a snapshot may go.
//!
//! The directory is named by the snapshot's UID alone, never by a path or name from the
//! object: nothing a user writes into a `HostPathSnapshot` can point the provisioner at
//! another directory.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::deciding::identity::Identity;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout::{self, PoolPath};
use crate::deciding::volume::{self, VolumeShape};
use crate::keys;

pub mod recreation;

/// The resource's API group.
pub const GROUP: &str = "hostpath-provisioner.kubevirt.io";
/// Its version.
pub const VERSION: &str = "v1alpha1";
/// Its kind.
pub const KIND: &str = "HostPathSnapshot";
/// Its plural.
pub const PLURAL: &str = "hostpathsnapshots";
/// Held by a snapshot whose directory exists, until the node holding it has moved it to the
/// trash.
pub const FINALIZER: &str = "hostpath-provisioner.kubevirt.io/snapshot";
/// Annotation on a snapshot of a Block volume, `Block`: information for whoever reads the
/// object. Never what a restore goes by: tenants may edit their snapshots' annotations, so the
/// mode is [`SnapshotStatus::volume_mode`], which only the provisioner writes (tenants get no
/// `hostpathsnapshots/status`); an edited annotation is put back ([`mode_annotation_fix`]).
pub const VOLUME_MODE_ANNOTATION: &str = "hostpath-provisioner.kubevirt.io/volume-mode";

/// `status.volumeMode` of a copy of a Block volume.
pub const BLOCK_MODE: &str = "Block";
/// `status.volumeMode` of a copy of a Filesystem volume.
pub const FILESYSTEM_MODE: &str = "Filesystem";

/// The status's `volumeMode` for a copy of a Block volume when `block`.
pub fn volume_mode_name(block: bool) -> &'static str {
    if block { BLOCK_MODE } else { FILESYSTEM_MODE }
}

/// Whether a snapshot is a copy of a Block volume, as the provisioner wrote it in the status
/// when the copy became ready (or as the copy's on-disk record said when an object made again
/// got it back). Absent: a snapshot of an earlier release, which copied Filesystem volumes
/// only. The annotation is never read here.
pub fn snapshot_is_block(snapshot: &HostPathSnapshot) -> bool {
    snapshot.status.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some(BLOCK_MODE)
}

/// What a ready snapshot's volume-mode annotation must be changed to, when someone changed
/// it: `Some(Some("Block"))` puts it back on a Block copy's object, `Some(None)` removes one
/// added to a Filesystem copy's. `None`: it says what the status says (or the snapshot is not
/// ready, or its status has no mode yet: a snapshot of an earlier build, whose mode is read
/// from its copy's record first, and nothing is said yet).
pub fn mode_annotation_fix(snapshot: &HostPathSnapshot) -> Option<Option<&'static str>> {
    snapshot.status.as_ref().filter(|s| s.ready_to_use && s.volume_mode.is_some())?;
    let annotation =
        snapshot.metadata.annotations.as_ref().and_then(|a| a.get(VOLUME_MODE_ANNOTATION)).map(String::as_str);
    let wanted = snapshot_is_block(snapshot).then_some(BLOCK_MODE);
    (annotation != wanted).then_some(wanted)
}

/// A point-in-time copy of a claim's volume.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HostPathSnapshot {
    /// `hostpath-provisioner.kubevirt.io/v1alpha1`.
    #[serde(default = "api_version")]
    pub api_version: String,
    /// `HostPathSnapshot`.
    #[serde(default = "kind")]
    pub kind: String,
    /// Standard metadata.
    pub metadata: ObjectMeta,
    /// What to copy.
    pub spec: SnapshotSpec,
    /// What the provisioner made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<SnapshotStatus>,
}

/// What to copy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSpec {
    /// The claim whose volume is copied.
    pub source: SnapshotSource,
}

/// The source of a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotSource {
    /// A claim of the snapshot's namespace.
    pub persistent_volume_claim_name: String,
}

/// What the provisioner made.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// The copy is complete and may be restored.
    #[serde(default)]
    pub ready_to_use: bool,
    /// The node that holds the copy (a restore is made there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The source's capacity: the least a restoring claim must request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<String>,
    /// How it was copied: `snapshot` (btrfs), `reflink` or `bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Bytes of file data in the copy (apparent sizes; shared extents count in full).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// The root of the pool holding the copy, on `node` (`<root>/.hpp-snapshots/<uid>`): what
    /// keeps the operator from releasing that pool's claim while the copy lives. Absent from
    /// snapshots of earlier releases, whose copy then holds every pool of its node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_root: Option<String>,
    /// When the copy was made (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<String>,
    /// Why it is not ready, while it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The volume mode of the copied volume, `Block` or `Filesystem`, written with
    /// `readyToUse`: what a restore goes by ([`snapshot_is_block`]). Absent from snapshots of
    /// earlier builds: the holding node writes it from its copy's record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_mode: Option<String>,
}

fn api_version() -> String {
    format!("{GROUP}/{VERSION}")
}

fn kind() -> String {
    KIND.to_owned()
}

impl Default for HostPathSnapshot {
    fn default() -> Self {
        HostPathSnapshot {
            api_version: api_version(),
            kind: kind(),
            metadata: ObjectMeta::default(),
            spec: SnapshotSpec::default(),
            status: None,
        }
    }
}

impl kube::Resource for HostPathSnapshot {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(KIND)
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(PLURAL)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

impl HostPathSnapshot {
    /// A snapshot named `name` of claim `source` (of the namespace it is created in).
    pub fn new(name: &str, source: &str) -> HostPathSnapshot {
        HostPathSnapshot {
            metadata: ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
            spec: SnapshotSpec { source: SnapshotSource { persistent_volume_claim_name: source.to_owned() } },
            ..Default::default()
        }
    }

    /// The directory name of its copy: its UID, checked again (the API is not trusted).
    pub fn dir_name(&self) -> Option<&str> {
        self.metadata.uid.as_deref().filter(|uid| layout::is_uid(uid))
    }

    /// Ready, on `node`.
    pub fn ready_on(&self) -> Option<&str> {
        let status = self.status.as_ref().filter(|s| s.ready_to_use)?;
        status.node.as_deref()
    }
}

/// Whether this node keeps a snapshot in its watch cache (and trims what it keeps): one that no
/// node holds yet (this node may have to take it, or speak for it), or one this node holds (its
/// deletion is this node's work). A snapshot held by another node never becomes this node's, so
/// a cluster's snapshots cost each node only its own and the pending ones.
pub fn keep(snapshot: &mut HostPathSnapshot, node: &str) -> bool {
    snapshot.metadata.managed_fields = None;
    snapshot.status.as_ref().and_then(|s| s.node.as_deref()).is_none_or(|holder| holder == node)
}

/// What the source claim and its PV allow a snapshot to do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceState {
    /// Not yet (missing, not bound): say why, look again.
    Wait(String),
    /// Never as it is: say why.
    Refuse(String),
    /// A volume of another node (that node takes it) or of another provisioner (that one
    /// answers): say nothing.
    Elsewhere(String),
    /// This node's volume: copy `dir_name` of the pool root `root`.
    Here {
        /// The pool root holding the volume.
        root: std::path::PathBuf,
        /// Its directory.
        dir_name: String,
        /// A `pathPattern` directory: copied only while its marker names this PV.
        marked_for: Option<String>,
        /// The source's capacity, as its PV states it.
        restore_size: String,
        /// A Block volume: its directory holds its backing file, flushed from its loop before
        /// the copy, and the snapshot is annotated [`VOLUME_MODE_ANNOTATION`].
        block: bool,
    },
}

/// Where the source of a snapshot stands: `claim` is the source claim (if it exists, as
/// returned for `claim_name` in `namespace`, the snapshot's) and `pv` the PV it is bound to (if
/// any); `pools` this node's pools.
///
/// A snapshot whose source is another provisioner's (the claim's storage-provisioner annotation,
/// or its PV's provisioned-by) is left to that provisioner, silently: two provisioner
/// instances of different names both run a snapshot controller, and each answering the other's
/// snapshots ("not made by ...") would rewrite their status back and forth.
pub fn source_state(
    claim_name: &str,
    namespace: &str,
    claim: Option<&PersistentVolumeClaim>,
    pv: Option<&KeptVolume>,
    me: &Identity,
    my_hostname: &str,
    pools: &[PoolPath],
) -> SourceState {
    let Some(claim) = claim else {
        return SourceState::Wait(format!("source claim {claim_name:?} does not exist (yet)"));
    };
    if claim.metadata.namespace.as_deref() != Some(namespace) || claim.metadata.name.as_deref() != Some(claim_name) {
        return SourceState::Refuse(format!(
            "the claim returned for {claim_name:?} in namespace {namespace:?} is {:?} of namespace {:?}; only a claim of the snapshot's own namespace is copied",
            claim.metadata.name.as_deref().unwrap_or_default(),
            claim.metadata.namespace.as_deref().unwrap_or_default()
        ));
    }
    let claimed_by = [keys::STORAGE_PROVISIONER, keys::STORAGE_PROVISIONER_BETA]
        .iter()
        .find_map(|key| claim.metadata.annotations.as_ref()?.get(*key));
    if let Some(other) = claimed_by.filter(|p| !me.serves(p)) {
        return SourceState::Elsewhere(format!("provisioner {other}"));
    }
    if claim.metadata.deletion_timestamp.is_some() {
        return SourceState::Refuse(format!("source claim {claim_name:?} is being deleted"));
    }
    let Some(pv) = pv else {
        return SourceState::Wait(format!("source claim {claim_name:?} has no volume yet"));
    };
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    match pv.annotations.get(keys::PROVISIONED_BY) {
        Some(ours) if me.serves(ours) => {}
        Some(other) => return SourceState::Elsewhere(format!("provisioner {other}")),
        // Nobody's (a PV made by hand): every instance says the same words, so none rewrites
        // another's status.
        None => {
            return SourceState::Refuse(format!(
                "the volume of claim {claim_name:?} (PV {pv_name}) was made by no provisioner: only volumes a \
                 hostpath provisioner made can be snapshotted"
            ));
        }
    }
    let bound_uid = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.uid.as_deref());
    if bound_uid != claim.metadata.uid.as_deref() {
        return SourceState::Wait(format!("PV {pv_name} is not bound to claim {claim_name:?} (yet)"));
    }
    match volume::volume_shape(pv, pools) {
        VolumeShape::Node if volume::is_mine(pv, me, my_hostname) => {}
        VolumeShape::Node => match volume::owner_node(pv) {
            Some(owner) => return SourceState::Elsewhere(owner.to_owned()),
            None => return SourceState::Refuse(format!("PV {pv_name} names no node")),
        },
        VolumeShape::Shared | VolumeShape::EveryNode => {
            return SourceState::Refuse(format!(
                "the volume of claim {claim_name:?} is a shared or every-node volume: only node volumes can be snapshotted"
            ));
        }
    }
    let path = volume::volume_path(pv).unwrap_or_default();
    let named_by_pattern = pv.annotations.contains_key(keys::PATH_PATTERN);
    let accepted = match layout::accept_volume_path(path, pv_name, pools, named_by_pattern) {
        Ok(accepted) => accepted,
        Err(why) => return SourceState::Refuse(format!("PV {pv_name} at {path}: {why}")),
    };
    let restore_size = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .map_or_else(|| "0".to_owned(), |q| q.0.clone());
    SourceState::Here {
        root: accepted.root,
        dir_name: accepted.dir_name,
        marked_for: accepted.marked.then(|| pv_name.to_owned()),
        restore_size,
        block: volume::is_block(pv),
    }
}

/// What a claim asks to be restored from: the name of a `HostPathSnapshot` of its namespace,
/// named by `dataSourceRef` (or `dataSource`, which takes any API group too).
pub fn requested_snapshot(claim: &PersistentVolumeClaim) -> Option<&str> {
    let spec = claim.spec.as_ref()?;
    let from_ref = spec.data_source_ref.as_ref().filter(|r| {
        r.kind == KIND
            && r.api_group.as_deref() == Some(GROUP)
            && r.namespace.as_deref().is_none_or(|ns| Some(ns) == claim.metadata.namespace.as_deref())
    });
    if let Some(reference) = from_ref {
        return Some(&reference.name);
    }
    let source = spec.data_source.as_ref()?;
    (source.kind == KIND && source.api_group.as_deref() == Some(GROUP)).then_some(source.name.as_str())
}

/// Whether `claim` waits for a restore of snapshot `name`: it names it, is not being deleted
/// and has no volume yet.
pub fn awaits_restore_of(claim: &PersistentVolumeClaim, name: &str) -> bool {
    let has_volume = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_some_and(|n| !n.is_empty());
    requested_snapshot(claim) == Some(name) && claim.metadata.deletion_timestamp.is_none() && !has_volume
}

/// Whether a restore from `snapshot` may start now for a claim requesting `request_bytes`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RestoreVerdict {
    /// Not yet (missing, not ready): say why, look again.
    Wait(String),
    /// Never as it is: say what to change.
    Refuse(String),
    /// Ready on `node`.
    Ready {
        /// The node holding the copy.
        node: String,
        /// The snapshot's directory name.
        dir_name: String,
        /// How it was copied (`snapshot`: a btrfs subvolume, which a quota limit can hold).
        method: Option<String>,
    },
}

/// Why a name read from a claim or a snapshot (a restore's `dataSourceRef.name`, a snapshot's
/// `spec.source.persistentVolumeClaimName`) must not go into a request's URL, if it must not:
/// object names are DNS subdomains, and anything else (`..`, `/`, `?`) would address another
/// object or resource. Checked before any request.
pub fn name_refusal(what: &str, name: &str) -> Option<String> {
    (!layout::is_dns_subdomain(name)).then(|| {
        format!(
            "{what} {name:?} is not a valid object name (a DNS subdomain: lowercase letters, digits, '-' and '.', \
             at most 253 characters); nothing was looked up"
        )
    })
}

/// Checks a restore's snapshot (`None`: it does not exist), asked for by `name` in `namespace`,
/// for a claim of `request_bytes`, a `volumeMode: Block` one when `block`.
pub fn restore_verdict(
    name: &str,
    namespace: &str,
    snapshot: Option<&HostPathSnapshot>,
    request_bytes: u64,
    block: bool,
) -> RestoreVerdict {
    if let Some(why) = name_refusal(KIND, name) {
        return RestoreVerdict::Refuse(why);
    }
    let Some(snapshot) = snapshot else {
        return RestoreVerdict::Wait(format!("{KIND} {name:?} does not exist (yet)"));
    };
    // Only an object of the claim's own namespace may be restored from, whatever answered.
    if snapshot.metadata.namespace.as_deref() != Some(namespace) || snapshot.metadata.name.as_deref() != Some(name) {
        return RestoreVerdict::Refuse(format!(
            "the {KIND} returned for {name:?} in namespace {namespace:?} is {:?} of namespace {:?}; only a snapshot of the claim's own namespace is restored",
            snapshot.metadata.name.as_deref().unwrap_or_default(),
            snapshot.metadata.namespace.as_deref().unwrap_or_default()
        ));
    }
    if snapshot.metadata.deletion_timestamp.is_some() {
        return RestoreVerdict::Refuse(format!("{KIND} {name:?} is being deleted"));
    }
    let (Some(node), Some(dir_name)) = (snapshot.ready_on(), snapshot.dir_name()) else {
        let why = snapshot.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_else(|| "not taken yet".into());
        return RestoreVerdict::Wait(format!("{KIND} {name:?} is not ready: {why}"));
    };
    // A copy taken by a release before `status.volumeMode`: its node writes the mode from the
    // copy's record, once it runs this release and the CRD has the field. Until then nothing
    // says which mode it is, and a guess could hand a device image to a Filesystem claim.
    if snapshot.status.as_ref().is_some_and(|s| s.volume_mode.is_none()) {
        return RestoreVerdict::Wait(format!(
            "{KIND} {name:?} has no status.volumeMode yet: it was taken by an earlier release, and its node {node:?} writes the mode from its copy once it runs this release with this release's CustomResourceDefinition (docs/upgrading.md)"
        ));
    }
    if snapshot_is_block(snapshot) != block {
        let mode = |block: bool| if block { "Block" } else { "Filesystem" };
        let taken = mode(snapshot_is_block(snapshot));
        return RestoreVerdict::Refuse(format!(
            "{KIND} {name:?} is a copy of a volumeMode {taken} volume and this claim asks for volumeMode {}: a restore keeps its snapshot's volume mode (a Block volume is one device image, a Filesystem volume a tree of files); use volumeMode {taken}",
            mode(block)
        ));
    }
    let status = snapshot.status.as_ref();
    let size = status.and_then(|s| s.restore_size.as_deref()).unwrap_or("0");
    if let Ok(size_bytes) = crate::deciding::capacity::parse_bytes(size)
        && request_bytes < size_bytes
    {
        return RestoreVerdict::Refuse(format!(
            "{KIND} {name:?} holds a volume of {size}; request at least that much storage"
        ));
    }
    RestoreVerdict::Ready {
        node: node.to_owned(),
        dir_name: dir_name.to_owned(),
        method: status.and_then(|s| s.method.clone()),
    }
}

#[cfg(test)]
mod tests;

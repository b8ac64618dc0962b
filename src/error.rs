//! Errors of the two reconcilers. Each variant knows the event reason it is reported under,
//! whether retrying can help, and a short label for metrics.

use crate::deciding::capacity::ShortOfSpace;
use crate::filesystem::PoolError;

/// Event reasons, with the Go build's meanings (docs/architecture.md, compatibility contract item 8).
pub mod reason {
    /// Normal: provisioning started.
    pub const PROVISIONING: &str = "Provisioning";
    /// Normal: PV created.
    pub const PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
    /// A `pathPattern` directory made for a PV that is gone was taken over, data and all.
    pub const DIRECTORY_REUSED: &str = "DirectoryReused";
    /// Warning: could not provision (with the reason).
    pub const PROVISIONING_FAILED: &str = "ProvisioningFailed";
    /// Warning: the directory of a failed provisioning could not be removed again.
    pub const PROVISIONING_CLEANUP_FAILED: &str = "ProvisioningCleanupFailed";
    /// Warning: could not delete a released volume.
    pub const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";
    /// Warning: an Immediate claim names no node, so no node will ever provision it.
    pub const NODE_SELECTION_REQUIRED: &str = "NodeSelectionRequired";
    /// Warning, on this node's Node object: volume directories hold data but have no PV.
    pub const ORPHANED_VOLUME: &str = "OrphanedVolumeData";
    /// Warning: the claim waits for a node where no provisioner runs.
    pub const NO_PROVISIONER_ON_NODE: &str = "NoProvisionerOnNode";
    /// Warning, on this node's Node object: data of deleted volumes cannot be removed from the trash.
    pub const TRASH_PURGE_FAILED: &str = "TrashPurgeFailed";
    /// Warning: a terminating every-node PV waits for nodes whose provisioner is not running.
    pub const WAITING_FOR_NODES: &str = "WaitingForNodes";
    /// Warning, on a released label-pinned PV: other live nodes carry its value, and this one
    /// holds no directory for it; the PV is kept. Also on a Node whose own value of a served
    /// `nodeAffinityKey` other live nodes carry (looked for at start and every 5 minutes).
    pub const DUPLICATE_AFFINITY_LABEL: &str = "DuplicateAffinityLabel";
    /// Warning, on this node's Node object: its CSIStorageCapacity objects cannot be written.
    pub const CAPACITY_PUBLISH_FAILED: &str = "CapacityPublishFailed";
    /// Warning, on this node's Node object: a deleted volume's data waits in the deletion staging
    /// because the trash cannot take it (with its path and size).
    pub const STRANDED_VOLUME_DATA: &str = "StrandedVolumeData";
    /// Warning, on a shared or every-node PV: no node with a running provisioner serves a pool
    /// its directory is in.
    pub const VOLUME_NOT_SERVED: &str = "VolumeNotServed";
    /// Warning: a clone waits for its source claim (missing, being deleted, not bound yet).
    pub const CLONE_SOURCE_NOT_READY: &str = "CloneSourceNotReady";
    /// Warning, on a PV: deleted because its node's Node object was gone past
    /// `--reap-volumes-of-removed-nodes` (names the node).
    pub const REMOVED_NODE_VOLUME_DELETED: &str = "RemovedNodeVolumeDeleted";
    /// Warning, on a PV and on its claim, from the `release-claims-of-removed-nodes` Deployment:
    /// the claim was deleted because the PV's node's Node object was gone past the grace period
    /// (names the node; the PV was set to Retain first, so the data stays on that node).
    pub const REMOVED_NODE_CLAIM_RELEASED: &str = "RemovedNodeClaimReleased";
    /// Warning, on a PV of a removed node: its claim could not be deleted (with the API
    /// server's answer; a 403 names the missing RBAC rule). The PV is Retain already.
    pub const REMOVED_NODE_CLAIM_NOT_RELEASED: &str = "RemovedNodeClaimNotReleased";
    /// Warning, on a Node: `RELEASE_CLAIMS_OF_REMOVED_NODES` is set on its provisioner pod (an
    /// install from before) and ignored: node pods never delete claims.
    pub const RELEASE_CLAIMS_SETTING_IGNORED: &str = "ReleaseClaimsSettingIgnored";
    /// Normal, on a `HostPathSnapshot`: the copy is complete (with its method and size).
    pub const SNAPSHOT_READY: &str = "SnapshotReady";
    /// Warning, on a `HostPathSnapshot`: it cannot be taken now, or at all (with the reason).
    pub const SNAPSHOT_FAILED: &str = "SnapshotFailed";
    /// Warning, on a `HostPathSnapshot` being deleted: its copy stays while claims restore from
    /// it, or could not be moved to the trash.
    pub const SNAPSHOT_DELETE_WAITING: &str = "SnapshotDeleteWaiting";
    /// Warning, on the node's Node object: a snapshot copy on it has no HostPathSnapshot any
    /// more (names the copy and when it goes to the trash).
    pub const SNAPSHOT_COPY_ORPHANED: &str = "SnapshotCopyOrphaned";
    /// Normal, on the node's Node object: a snapshot copy without its snapshot was moved to the
    /// trash after its grace period.
    pub const SNAPSHOT_COPY_REMOVED: &str = "SnapshotCopyRemoved";
    /// Warning, on a ready `HostPathSnapshot`: its volume-mode annotation was changed and is
    /// put back as `status.volumeMode` says (a restore never goes by the annotation).
    pub const SNAPSHOT_MODE_ANNOTATION_RESTORED: &str = "SnapshotModeAnnotationRestored";
    /// Warning, on a ready `HostPathSnapshot` of an earlier release: its mode cannot be written
    /// to `status.volumeMode` because the CRD served is an earlier release's; it is not
    /// restored until this release's CRD is applied (retried with backoff).
    pub const SNAPSHOT_CRD_OUTDATED: &str = "SnapshotCrdOutdated";
    /// Warning, on a released Block PV: its loop device is still open (a pod, a mount); the
    /// kernel detaches it at its last close, and the backing file is trashed after that.
    pub const BLOCK_DEVICE_IN_USE: &str = "BlockDeviceInUse";
    /// Warning, on a Block PV of this node: it could not be exposed at start (its device node
    /// is missing until that is fixed; a pod of it waits).
    pub const BLOCK_VOLUME_NOT_EXPOSED: &str = "BlockVolumeNotExposed";
    /// Normal, on a Block PV of this node: released for a deletion that then failed, and kept
    /// (`Retain`, bound again): its device node is back (`deciding::block::released`).
    pub const BLOCK_VOLUME_EXPOSED_AGAIN: &str = "BlockVolumeExposedAgain";
}

/// Whether and how soon to try again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Transient: back off exponentially and retry.
    Backoff,
    /// Needs a change (to the object or by an admin): wait for the object to change, and look
    /// again after the slowest backoff step in case the world changed instead.
    AfterChange,
}

/// Provisioning failed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// An API call failed.
    #[error("Kubernetes API error: {0}")]
    Api(#[from] kube::Error),
    /// The pool refused or failed.
    #[error("{0}")]
    Pool(#[from] PoolError),
    /// A PV of our name exists but belongs to another claim.
    #[error("PersistentVolume {pv} already exists and is bound to another claim (uid {other_uid})")]
    PvConflict {
        /// PV name.
        pv: String,
        /// The claimRef UID found.
        other_uid: String,
    },
    /// Not enough free space.
    #[error("{0}")]
    InsufficientSpace(#[from] ShortOfSpace),
    /// A byte copy (a restore) does not fit beside the reserve and the copies being made.
    #[error("{0}")]
    NoRoomForCopy(#[from] crate::deciding::copy_room::NoRoomForCopy),
    /// PV creation failed and the directory could not be removed again.
    #[error(
        "creating the PV failed ({create}) and removing directory {dir} again failed too ({cleanup}); remove it by hand"
    )]
    Cleanup {
        /// Why the PV create failed.
        create: String,
        /// Directory left behind.
        dir: String,
        /// Why removal failed.
        cleanup: String,
    },
    /// The pool named in a plan is not open on this node.
    #[error("pool {0} is not configured on this node")]
    UnknownPool(String),
    /// Copying the source volume of a clone failed; nothing of the copy is visible as a volume.
    #[error("cloning volume {source_dir} failed: {error}")]
    Clone {
        /// The source's directory name.
        source_dir: String,
        /// Why.
        error: PoolError,
    },
    /// The class enforces quota and the pool cannot.
    #[error("{0}")]
    QuotaUnsupported(#[from] crate::deciding::quota::QuotaRefusal),
    /// A shared pool's record of promised space (requests accounting) cannot be read.
    #[error(
        "the record of space promised in pool {pool} (annotation {annotation} of Lease {lease}) cannot be read: {error}; \
         delete that Lease to start a new record (volumes being made in the pool at that moment are then not counted)"
    )]
    PromiseRecord {
        /// The pool's name.
        pool: String,
        /// The Lease, `namespace/name`.
        lease: String,
        /// The annotation holding the record.
        annotation: &'static str,
        /// Why it cannot be read.
        error: String,
    },
    /// A Block volume's PV could not be written (its name gives no device node).
    #[error("{0}")]
    BlockPv(#[from] crate::deciding::block::BlockPathRefusal),
    /// A Block clone's source was not copied: its PV's paths, or the file at its backing path,
    /// are not the volume's (or its loops could not be flushed).
    #[error("the source Block volume is not copied: {0}")]
    BlockSource(#[from] VolumeError),
    /// Other nodes kept changing a shared pool's record of promises: no attempt could write it.
    #[error(
        "space in pool {pool} could not be promised: other nodes changed its record (Lease {lease}) at every one of {attempts} attempts"
    )]
    PromiseContention {
        /// The pool's name.
        pool: String,
        /// The Lease, `namespace/name`.
        lease: String,
        /// How many attempts were made.
        attempts: usize,
    },
}

impl ClaimError {
    /// The event reason to report this under.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Cleanup { .. } => reason::PROVISIONING_CLEANUP_FAILED,
            _ => reason::PROVISIONING_FAILED,
        }
    }

    /// Whether to retry with backoff.
    pub fn retry(&self) -> Retry {
        match self {
            Self::Api(_)
            | Self::InsufficientSpace(_)
            | Self::NoRoomForCopy(_)
            | Self::Cleanup { .. }
            | Self::PromiseRecord { .. }
            | Self::PromiseContention { .. } => Retry::Backoff,
            Self::Pool(e) | Self::Clone { error: e, .. } if e.is_retryable() => Retry::Backoff,
            Self::BlockSource(e) => e.retry(),
            Self::Pool(_)
            | Self::Clone { .. }
            | Self::PvConflict { .. }
            | Self::UnknownPool(_)
            | Self::BlockPv(_)
            | Self::QuotaUnsupported(_) => Retry::AfterChange,
        }
    }

    /// Label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Api(_) => "api",
            Self::Pool(_) => "pool",
            Self::Clone { .. } => "clone",
            Self::PvConflict { .. } => "pv_conflict",
            Self::InsufficientSpace(_) | Self::NoRoomForCopy(_) => "insufficient_space",
            Self::Cleanup { .. } => "cleanup",
            Self::UnknownPool(_) => "unknown_pool",
            Self::QuotaUnsupported(_) => "quota_unsupported",
            Self::BlockPv(_) | Self::BlockSource(_) => "block",
            Self::PromiseRecord { .. } => "promise_record",
            Self::PromiseContention { .. } => "promise_contention",
        }
    }
}

/// Deletion failed.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// An API call failed.
    #[error("Kubernetes API error: {0}")]
    Api(#[from] kube::Error),
    /// The pool refused or failed.
    #[error("{0}")]
    Pool(#[from] PoolError),
    /// The pool named by the accepted path is not open on this node.
    #[error("pool {0} is not configured on this node")]
    UnknownPool(String),
    /// A Block PV whose paths are not the ones this provisioner writes: nothing is detached
    /// nor removed for it.
    #[error("{0}")]
    BlockPv(#[from] crate::deciding::block::kept::BlockPvRefusal),
    /// A Block PV to delete on a node where Block volumes are off: its loop cannot be detached.
    #[error(
        "{0} is a Block volume and Block volumes are off on this node: its loop device and node cannot be released; turn them on with --block-volumes to delete it"
    )]
    BlockVolumesOff(String),
}

impl VolumeError {
    /// The event reason to report this under.
    pub fn reason(&self) -> &'static str {
        reason::VOLUME_FAILED_DELETE
    }

    /// Whether to retry with backoff.
    pub fn retry(&self) -> Retry {
        match self {
            Self::Api(_) => Retry::Backoff,
            Self::Pool(e) if e.is_retryable() => Retry::Backoff,
            Self::Pool(_) | Self::UnknownPool(_) | Self::BlockPv(_) | Self::BlockVolumesOff(_) => Retry::AfterChange,
        }
    }

    /// Label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Api(_) => "api",
            Self::Pool(_) => "pool",
            Self::UnknownPool(_) => "unknown_pool",
            Self::BlockPv(_) | Self::BlockVolumesOff(_) => "block_pv",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insufficient_space_reads_in_human_units() {
        let error = ClaimError::InsufficientSpace(ShortOfSpace {
            pool: "legacy".into(),
            node: "node-a".into(),
            requested: 1 << 60,
            available: 69_409_710_080,
            reserved: 0,
            promised: None,
        });
        assert_eq!(
            error.to_string(),
            "not enough free space in pool legacy on node node-a: the claim requests 1 EiB, 64.6 GiB available (reserve 0)"
        );
    }
}

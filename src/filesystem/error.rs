//! Errors of the filesystem edge: each names the path and the remedy, because it becomes the
//! note of an event an admin reads, and knows whether retrying can help.

use std::path::PathBuf;

use rustix::io::Errno;

use super::InvalidDirName;

/// Everything that can go wrong at the filesystem edge; each message names the path and the remedy
/// because it becomes the note of a Kubernetes event read by a cluster admin.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The configured root path is relative or contains `.` or `..` components.
    #[error(
        "pool {pool:?}: root path {} must be absolute and must not contain '.' or '..' \
         components; fix the pool configuration",
        .path.display()
    )]
    InvalidRootPath {
        /// Pool name.
        pool: String,
        /// Path as configured.
        path: PathBuf,
    },
    /// The pool root (or one of its parents) does not exist.
    #[error(
        "pool {pool:?}: root directory {} does not exist; create it or mount the pool's disk \
         there, then restart the provisioner",
        .path.display()
    )]
    RootMissing {
        /// Pool name.
        pool: String,
        /// Pool root path.
        path: PathBuf,
    },
    /// The pool root, or a component of its path, is not a directory.
    #[error(
        "pool {pool:?}: root {} is not a directory; point the pool at a directory",
        .path.display()
    )]
    RootNotDirectory {
        /// Pool name.
        pool: String,
        /// Pool root path.
        path: PathBuf,
    },
    /// The pool root's last component is a symlink, refused so the pool cannot be redirected.
    #[error(
        "pool {pool:?}: root {} is a symbolic link, which is refused so that the pool cannot be \
         silently redirected; configure the directory it points to instead",
        .path.display()
    )]
    RootIsSymlink {
        /// Pool name.
        pool: String,
        /// Pool root path.
        path: PathBuf,
    },
    /// The root path now names another directory than the one opened at startup.
    #[error(
        "pool {pool:?}: {} no longer names the directory opened at startup (was the disk \
         unmounted, or the directory moved or replaced?); nothing is created or deleted in this \
         pool until an admin restores it and restarts the provisioner",
        .path.display()
    )]
    RootChanged {
        /// Pool name.
        pool: String,
        /// Pool root path.
        path: PathBuf,
    },
    /// The root path now leads somewhere else than at startup: through other symlinks, or from
    /// another parent directory (a directory above the root was moved or replaced).
    #[error(
        "pool {pool:?}: {} now leads to {} instead of {} (a directory above the pool root was moved \
         or replaced by a symbolic link?); nothing is created or deleted in this pool until the path \
         leads where it did, or the provisioner is restarted",
        .path.display(), .now.display(), .was.display()
    )]
    RootRedirected {
        /// Pool name.
        pool: String,
        /// Pool root path as configured.
        path: PathBuf,
        /// Where the path leads now.
        now: PathBuf,
        /// Where it led at startup.
        was: PathBuf,
    },
    /// `--require-mountpoint` or the pool's `mountpoint` option is set and nothing is mounted at
    /// the pool root.
    #[error(
        "pool {pool:?}: nothing is mounted at {} and the pool must be a mount point \
         (require-mountpoint, or the pool's mountpoint option); mount the pool's \
         disk there (provisioning and deletion wait and resume by themselves)",
        .path.display()
    )]
    RootNotMountpoint {
        /// Pool name.
        pool: String,
        /// Pool root path.
        path: PathBuf,
    },
    /// A symlink sits where a volume directory should be created.
    #[error(
        "{}: a symbolic link is where the volume directory should be; it was left untouched and \
         not followed; an admin should inspect and remove it",
        .path.display()
    )]
    VolumeIsSymlink {
        /// Path of the symlink.
        path: PathBuf,
    },
    /// A non-directory sits where a volume directory should be created.
    #[error(
        "{}: exists but is not a directory, so it cannot be used as a volume; an admin should \
         inspect and remove it",
        .path.display()
    )]
    VolumeNotDirectory {
        /// Path of the entry.
        path: PathBuf,
    },
    /// Another mount was met inside (or on) a volume directory; the operation stopped there.
    #[error(
        "{}: another filesystem is mounted there, inside a volume; the provisioner never \
         creates, deletes or descends across a mount, so it stopped there (entries a deletion \
         removed before meeting it stay removed); unmount it (umount {}) and the next attempt \
         can proceed",
        .path.display(), .path.display()
    )]
    MountInsideVolume {
        /// Path of the mount point (reconstructed for the message).
        path: PathBuf,
    },
    /// A volume staged for deletion could not go back to its place: something else is there now.
    #[error(
        "{}: the volume could not be restored to {}, where something else is now; it was kept \
         where it is and nothing was replaced: an admin should compare the two and move the \
         volume back by hand",
        .staged.display(), .path.display()
    )]
    StagedPlaceTaken {
        /// The volume's place.
        path: PathBuf,
        /// Where the staged volume is.
        staged: PathBuf,
    },
    /// A directory the provisioner keeps its own work in (the trash, the deletion staging, the
    /// clone staging, or a level below them) is not a plain directory of the pool's own mount:
    /// someone put a symlink, a file or a mount in its place. Nothing is done through it.
    #[error(
        "{}: this provisioner's bookkeeping directory is {what}, not a plain directory on the pool's own \
         filesystem; nothing is removed or moved through it. Move it out of the way (it is not the \
         provisioner's), and the provisioner makes its directory again",
        .path.display()
    )]
    BookkeepingReplaced {
        /// The directory.
        path: PathBuf,
        /// What is there instead ("a symlink or a file", "a mount").
        what: &'static str,
    },
    /// The kernel refused an operation (EPERM/EACCES): immutable attribute, ownership, LSM.
    #[error(
        "{}: {op} was refused ({source}); check for the immutable or append-only attribute \
         (lsattr; chattr -i -a), ownership, or a security-module denial (SELinux/AppArmor audit \
         log); once fixed, the next attempt can succeed",
        .path.display()
    )]
    PermissionDenied {
        /// What we were doing.
        op: &'static str,
        /// The path concerned (reconstructed for the message).
        path: PathBuf,
        /// The kernel's error.
        source: Errno,
    },
    /// The tree changed under the deletion in a way that made continuing unsafe.
    #[error(
        "{}: the directory tree changed while it was being deleted (an entry was moved, replaced \
         or kept reappearing); stopped to stay safe, the deletion will be retried",
        .path.display()
    )]
    TreeChanged {
        /// Where the change was seen.
        path: PathBuf,
    },
    /// Any other system call failure.
    #[error("{}: {op} failed ({source}); {}", .path.display(), io_hint(*.source))]
    Io {
        /// What we were doing.
        op: &'static str,
        /// The path concerned (reconstructed for the message).
        path: PathBuf,
        /// The kernel's error.
        source: Errno,
    },
    /// A volume directory that should be empty is not, so it was kept.
    #[error(
        "{}: kept because it is not empty (a workload may have written to it); remove it by \
         hand if its data is not needed",
        .path.display()
    )]
    VolumeNotEmpty {
        /// Path of the directory.
        path: PathBuf,
    },
    /// A name was refused as a volume directory name.
    #[error(transparent)]
    InvalidName(#[from] InvalidDirName),
    /// The pool's filesystem is mounted read-only.
    #[error(
        "pool {pool:?}: the filesystem at {} is mounted read-only; remount it read-write \
         (provisioning and deletion in this pool wait and resume by themselves)",
        .path.display()
    )]
    ReadOnly {
        /// Pool name.
        pool: String,
        /// Pool root path.
        path: PathBuf,
    },
    /// A clone met a device node in its source: copying it would need `CAP_MKNOD` and would give
    /// the clone's pods the device, so clones refuse it.
    #[error(
        "{}: a device node in the source volume; clones do not copy device nodes (that would need \
         CAP_MKNOD and would hand the device to the clone's pods); remove it from the source, or \
         copy the data another way",
        .path.display()
    )]
    DeviceInVolume {
        /// Path of the device node.
        path: PathBuf,
    },
    /// A clone could not give a copy its owner: the process lacks `CAP_CHOWN`.
    #[error(
        "{}: {op} was refused (EPERM); a clone keeps every file's owner, which needs the CHOWN \
         capability (and FSETID to keep set-group-ID bits): add them to the provisioner's \
         securityContext.capabilities.add",
        .path.display()
    )]
    MissingCapability {
        /// What we were doing.
        op: &'static str,
        /// The path concerned.
        path: PathBuf,
    },
    /// A quota volume's name holds a plain directory (or another subvolume shape), which would
    /// carry no quota.
    #[error(
        "{}: exists but is not a btrfs subvolume of this pool, so no quota can be set on it; it was \
         left untouched; an admin should inspect it (a volume made before the class enforced quota?)",
        .path.display()
    )]
    NotSubvolume {
        /// Path of the entry.
        path: PathBuf,
    },
    /// A project quota volume's directory carries no project id this provisioner gave out.
    #[error(
        "{}: has no project id of this provisioner, so no project quota can be set on it; it was left untouched; \
         an admin should inspect it (a volume made before the class enforced quota, or a clone?)",
        .path.display()
    )]
    NoProjectId {
        /// Path of the entry.
        path: PathBuf,
    },
    /// A clone asked for on a project quota pool: the copy would not be charged to a project.
    #[error(
        "{}: clones with quota: enforce on a project quota pool (XFS, ext4) are not supported yet: the copied \
         files would not be charged to the clone's project; clone on a btrfs pool, or with a class without quota",
        .path.display()
    )]
    ProjectQuotaClone {
        /// Path of the clone.
        path: PathBuf,
    },
    /// Every project id from the base up is taken on the pool.
    #[error("pool {pool}: no free project id is left for a new quota volume")]
    ProjectIdsExhausted {
        /// Pool name.
        pool: String,
    },
    /// The pool's filesystem keeps no user extended attributes, which carry the marker of a
    /// `pathPattern` directory.
    #[error(
        "the filesystem of {} keeps no user extended attributes (user.*), where a pathPattern directory carries the provisioner's marker; use a class without pathPattern for this pool",
        .path.display()
    )]
    MarkerUnsupported {
        /// The directory.
        path: PathBuf,
    },
    /// A `pathPattern` directory does not carry the marker of the PV acting on it.
    #[error(
        "{} does not carry the marker of PV {pv} ({}); nothing was removed or changed through it. It belongs to another volume or was not made by the provisioner: check the PV's path",
        .path.display(),
        .found.as_deref().map_or_else(|| "it has none".to_owned(), |other| format!("it names {other}"))
    )]
    NotMarkedFor {
        /// The directory.
        path: PathBuf,
        /// The PV acting.
        pv: String,
        /// The PV the marker names, if any.
        found: Option<String>,
    },
    /// Something appeared at a `pathPattern` directory's place while the volume was being made
    /// aside: nothing was replaced.
    #[error("{} appeared while the volume was being made; nothing was replaced (decided again on the next attempt)", .path.display())]
    PatternPlaceTaken {
        /// The place.
        path: PathBuf,
    },
    /// A directory mode outside 0..=0o7777 was requested.
    #[error("directory mode {mode:#o} is not a permission mode (at most 0o7777); fix the configured mode")]
    InvalidMode {
        /// The requested mode.
        mode: u32,
    },
    /// A Block volume's loop device was not exposed or not detached: the facts read about its
    /// backing file or its loops do not prove them the volume's (`deciding::block::loop_safety`).
    #[error("Block volume {}: {refusal}; nothing was attached, exposed or detached", .path.display())]
    BlockRefused {
        /// The backing file.
        path: PathBuf,
        /// Why.
        refusal: crate::deciding::block::loop_safety::LoopRefusal,
    },
    /// A loop device changed between the check and the act (detached, or attached to another
    /// file by someone else): nothing was done to it, and the next attempt looks again.
    #[error("loop{number} changed while it was being checked; nothing was done to it (retried)")]
    LoopChanged {
        /// N of `/dev/loopN`.
        number: u32,
    },
}

impl PoolError {
    /// Whether retrying the same operation later can succeed without an admin acting.
    ///
    /// Transient I/O (EIO, EBUSY, ENOSPC, EMFILE, ...), a tree that changed under us, and a
    /// missing mount at boot (the disk may be mounted after the DaemonSet starts) are retryable.
    /// Symlinks where a volume should be, mounts inside a volume, non-directories, permission
    /// refusals (immutable files, LSM denials) and configuration mistakes stay exactly as they are
    /// until an admin acts, so retrying them only repeats the same event.
    pub fn is_retryable(&self) -> bool {
        match self {
            PoolError::RootNotMountpoint { .. }
            | PoolError::TreeChanged { .. }
            | PoolError::ReadOnly { .. }
            | PoolError::RootRedirected { .. }
            // Whoever put something in its place may take it away: looked at again with backoff.
            | PoolError::BookkeepingReplaced { .. }
            // The next attempt looks at the place again and decides anew.
            | PoolError::PatternPlaceTaken { .. }
            | PoolError::LoopChanged { .. } => true,
            PoolError::Io { source, .. } => errno_is_retryable(*source),
            PoolError::InvalidRootPath { .. }
            | PoolError::RootMissing { .. }
            | PoolError::RootNotDirectory { .. }
            | PoolError::RootIsSymlink { .. }
            | PoolError::RootChanged { .. }
            | PoolError::VolumeIsSymlink { .. }
            | PoolError::VolumeNotDirectory { .. }
            | PoolError::MountInsideVolume { .. }
            | PoolError::StagedPlaceTaken { .. }
            | PoolError::PermissionDenied { .. }
            | PoolError::VolumeNotEmpty { .. }
            | PoolError::NotSubvolume { .. }
            | PoolError::NoProjectId { .. }
            | PoolError::ProjectIdsExhausted { .. }
            | PoolError::ProjectQuotaClone { .. }
            | PoolError::InvalidName(_)
            | PoolError::DeviceInVolume { .. }
            | PoolError::MissingCapability { .. }
            | PoolError::MarkerUnsupported { .. }
            | PoolError::NotMarkedFor { .. }
            | PoolError::InvalidMode { .. }
            | PoolError::BlockRefused { .. } => false,
        }
    }

    /// A short stable label for metrics (`reason` label of the refused/failed counters).
    pub fn label(&self) -> &'static str {
        match self {
            PoolError::InvalidRootPath { .. } => "invalid_root_path",
            PoolError::RootMissing { .. } => "root_missing",
            PoolError::RootNotDirectory { .. } => "root_not_directory",
            PoolError::RootIsSymlink { .. } => "root_is_symlink",
            PoolError::RootChanged { .. } => "root_changed",
            PoolError::RootRedirected { .. } => "root_redirected",
            PoolError::RootNotMountpoint { .. } => "root_not_mountpoint",
            PoolError::ReadOnly { .. } => "read_only",
            PoolError::VolumeIsSymlink { .. } => "volume_is_symlink",
            PoolError::VolumeNotDirectory { .. } => "volume_not_directory",
            PoolError::MountInsideVolume { .. } => "mount_inside_volume",
            PoolError::StagedPlaceTaken { .. } => "staged_place_taken",
            PoolError::BookkeepingReplaced { .. } => "bookkeeping_replaced",
            PoolError::PermissionDenied { .. } => "permission_denied",
            PoolError::TreeChanged { .. } => "tree_changed",
            PoolError::Io { .. } => "io",
            PoolError::VolumeNotEmpty { .. } => "volume_not_empty",
            PoolError::InvalidName(_) => "invalid_name",
            PoolError::NotSubvolume { .. } => "not_subvolume",
            PoolError::NoProjectId { .. } => "no_project_id",
            PoolError::ProjectIdsExhausted { .. } => "project_ids_exhausted",
            PoolError::ProjectQuotaClone { .. } => "project_quota_clone",
            PoolError::InvalidMode { .. } => "invalid_mode",
            PoolError::DeviceInVolume { .. } => "device_in_volume",
            PoolError::MissingCapability { .. } => "missing_capability",
            PoolError::MarkerUnsupported { .. } => "marker_unsupported",
            PoolError::NotMarkedFor { .. } => "not_marked_for_pv",
            PoolError::PatternPlaceTaken { .. } => "pattern_place_taken",
            PoolError::BlockRefused { .. } => "block_refused",
            PoolError::LoopChanged { .. } => "loop_changed",
        }
    }
}

/// Errors that describe a state only an admin can change are not retried.
fn errno_is_retryable(e: Errno) -> bool {
    !matches!(
        e,
        Errno::ROFS
            | Errno::INVAL
            | Errno::NAMETOOLONG
            | Errno::BADF
            | Errno::NOTDIR
            | Errno::LOOP
            | Errno::XDEV
            | Errno::OPNOTSUPP
            | Errno::PERM
            | Errno::ACCESS
    )
}

/// The remedy half of an I/O error message.
fn io_hint(e: Errno) -> &'static str {
    match e {
        Errno::ROFS => "the pool's filesystem is read-only; remount it read-write",
        Errno::NOSPC | Errno::DQUOT => "the pool's filesystem or its quota is full; free space (retried automatically)",
        Errno::IO => {
            "the disk reported an I/O error; check the kernel log (dmesg) and the disk (retried \
             automatically)"
        }
        Errno::BUSY => "the entry is in use (retried automatically)",
        Errno::MFILE | Errno::NFILE | Errno::NOMEM => {
            "the node is short of file descriptors or memory (retried automatically)"
        }
        e if errno_is_retryable(e) => "retried automatically",
        _ => "an admin should investigate",
    }
}

/// Maps a failed system call to the error an admin can act on.
pub(super) fn fs_error(op: &'static str, path: PathBuf, source: Errno) -> PoolError {
    match source {
        Errno::PERM | Errno::ACCESS => PoolError::PermissionDenied { op, path, source },
        _ => PoolError::Io { op, path, source },
    }
}

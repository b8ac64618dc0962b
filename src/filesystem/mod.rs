//! The filesystem edge of the provisioner: pool roots and the volume directories directly under them.
//!
//! Everything here goes through a [`PoolRoot`] handle (a descriptor opened once) and a validated
//! single-component [`VolumeDirName`]; no free-form path from the API ever reaches the kernel.
//! docs/architecture.md, deletion rules is the contract; the rules it implies are:
//!
//! - The volume directory is opened beneath the pool root descriptor with `openat2`
//!   (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`), or with
//!   `openat(O_NOFOLLOW)` on kernels without `openat2` (a single component, so that is equivalent
//!   for symlinks). A symlink is never followed: it is unlinked as a name.
//! - Trees are removed by descriptor, iteratively (an explicit stack, so depth is bounded by memory,
//!   not by the thread stack or `PATH_MAX`), with every directory opened relative to its parent's
//!   descriptor. Non-directories are unlinked and never opened.
//! - Every directory entered is checked to be on the pool's own mount (`RESOLVE_NO_XDEV`, then
//!   `st_dev`, `STATX_ATTR_MOUNT_ROOT` and the statx mount id); another mount stops the deletion.
//! - Callers re-check the root with [`PoolRoot::check`] before each operation, so an unmounted or
//!   replaced pool disk stops provisioning and deletion (docs/architecture.md, deletion rules, `--require-mountpoint`).

use std::ffi::{CStr, CString, OsStr};
use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rustix::fs::{AtFlags, CWD, Dir, FileType, Mode, OFlags, ResolveFlags, StatxAttributes, StatxFlags};
use rustix::io::Errno;

/// Longest directory name Linux filesystems accept (`NAME_MAX`).
const MAX_NAME_BYTES: usize = 255;

/// How many of the deepest directory levels a removal keeps open.
///
/// Holding one descriptor per level would make a deep tree exhaust `RLIMIT_NOFILE` (often 1024)
/// and fail forever; re-opening a parent through `..` could leave the tree if a directory was
/// moved meanwhile. So a removal keeps open the volume directory, the deepest `OPEN_DIR_WINDOW`
/// levels and at most `MAX_ANCHORS` "anchor" levels spread evenly above them (every
/// `stride`-th level, the stride doubling whenever the anchors would exceed the cap). An evicted
/// ancestor is re-opened by name from the nearest open one, never through `..`, and every
/// directory re-opened must have the device and inode recorded on the way down. That bounds a
/// removal to 1 + 64 + 64 directory descriptors at any depth, and re-opening stays cheap: a tree
/// 10,000 levels deep costs about 25,000 extra opens.
const OPEN_DIR_WINDOW: usize = 64;

/// Cap on the anchor levels kept open above the window (see [`OPEN_DIR_WINDOW`]).
const MAX_ANCHORS: usize = 64;

/// How often a directory is re-listed when entries keep appearing in it while it is emptied.
const MAX_RESCANS: u32 = 8;

/// How often an entry may change between file and directory under us before we give up.
const MAX_TYPE_CHANGES: u32 = 4;

/// How often `openat2` is retried when the kernel reports a concurrent rename (`EAGAIN`).
const MAX_OPENAT2_RETRIES: u32 = 16;

/// Mode given to directories that lack owner read, write or search permission before emptying.
const OWNER_RWX: u32 = 0o700;

/// Nested btrfs subvolumes removed with a volume since start, in every pool (see
/// [`nested_subvolumes_removed`]).
static NESTED_SUBVOLUMES_REMOVED: AtomicU64 = AtomicU64::new(0);

/// How many btrfs subvolumes nested inside volumes this process has removed: each was made by a
/// workload and escaped its volume's quota. Read into a metric by the trash loop.
pub fn nested_subvolumes_removed() -> u64 {
    NESTED_SUBVOLUMES_REMOVED.load(Ordering::Relaxed)
}

/// A validated directory name directly under a pool root: non-empty, at most 255 bytes, no '/',
/// no NUL, not "." or "..".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VolumeDirName(String);

impl VolumeDirName {
    /// Validates `s` as a single path component that cannot climb out of or alias the pool root.
    pub fn new(s: &str) -> Result<Self, InvalidDirName> {
        let reason = if s.is_empty() {
            Some("it is empty")
        } else if s.len() > MAX_NAME_BYTES {
            Some("it is longer than 255 bytes")
        } else if s == "." || s == ".." {
            Some("it names the current or parent directory")
        } else if s.contains('/') {
            Some("it contains '/'")
        } else if s.contains('\0') {
            Some("it contains a NUL byte")
        } else {
            None
        };
        match reason {
            None => Ok(Self(s.to_owned())),
            Some(reason) => Err(InvalidDirName { name: truncate_for_message(s, 300), reason }),
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VolumeDirName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A string refused as a [`VolumeDirName`]; the message quotes it (shortened) and says why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid volume directory name {name:?}: {reason}; a volume directory name must be a single \
     path component of 1 to 255 bytes, without '/' or NUL, and not '.' or '..'"
)]
pub struct InvalidDirName {
    name: String,
    reason: &'static str,
}

/// Whether [`PoolRoot::create_volume_dir`] made the directory or found it already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    /// The directory was created by this call.
    New,
    /// The directory already existed (a retry or a restart after a crash); its mode was reset.
    Existing,
}

/// Outcome of [`PoolRoot::remove_volume_dir`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// The volume was removed; `entries` counts the names unlinked, the volume directory included.
    Removed {
        /// Names unlinked (files, links, special files and directories, the volume itself too).
        entries: u64,
    },
    /// Nothing was there: docs/architecture.md, compatibility contract item 6 counts a missing directory as already deleted.
    AlreadyGone,
}

/// Capacity figures of a pool's filesystem, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolStats {
    /// Size of the filesystem: `f_blocks * f_frsize`.
    pub total_bytes: u64,
    /// Free space including the blocks reserved for root: `f_bfree * f_frsize`.
    pub free_bytes: u64,
    /// Space available to unprivileged users: `f_bavail * f_frsize`.
    pub available_bytes: u64,
    /// `f_blocks * f_bsize`, the capacity figure the Go provisioner reported (kept for parity).
    pub go_total_bytes: u64,
}

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
    /// `--require-mountpoint` is set and nothing is mounted at the pool root.
    #[error(
        "pool {pool:?}: nothing is mounted at {} and require-mountpoint is set; mount the pool's \
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
    /// A directory mode outside 0..=0o7777 was requested.
    #[error("directory mode {mode:#o} is not a permission mode (at most 0o7777); fix the configured mode")]
    InvalidMode {
        /// The requested mode.
        mode: u32,
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
            | PoolError::RootRedirected { .. } => true,
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
            | PoolError::InvalidMode { .. } => false,
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
fn fs_error(op: &'static str, path: PathBuf, source: Errno) -> PoolError {
    match source {
        Errno::PERM | Errno::ACCESS => PoolError::PermissionDenied { op, path, source },
        _ => PoolError::Io { op, path, source },
    }
}

/// This process's mount table, its read error as a pool error.
fn read_mount_table() -> Result<Vec<crate::deciding::mount_table::Mount>, PoolError> {
    mount_table::read().map_err(|e| PoolError::Io {
        op: "read the mount table",
        path: PathBuf::from(mount_table::MOUNT_TABLE),
        source: Errno::from_io_error(&e).unwrap_or(Errno::IO),
    })
}

/// Shortens `s` to at most `max` bytes on a character boundary, marking the cut.
fn truncate_for_message(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// What one `statx` (or `fstat` on kernels before 4.11) says about an inode.
#[derive(Clone, Copy, Debug)]
struct Inode {
    dev: u64,
    ino: u64,
    mode: u32,
    /// `STATX_ATTR_MOUNT_ROOT`, when the kernel reports it (5.8+).
    mount_root: Option<bool>,
    /// `STATX_MNT_ID`, when the kernel reports it (5.8+).
    mnt_id: Option<u64>,
}

impl Inode {
    fn file_type(&self) -> FileType {
        FileType::from_raw_mode(self.mode)
    }
}

/// `statx` of `path` relative to `dirfd` (`""` with `AT_EMPTY_PATH` for the descriptor itself).
fn inode_at<P: rustix::path::Arg + Copy>(dirfd: BorrowedFd<'_>, path: P, flags: AtFlags) -> Result<Inode, Errno> {
    let mask = StatxFlags::TYPE | StatxFlags::MODE | StatxFlags::INO | StatxFlags::MNT_ID;
    match rustix::fs::statx(dirfd, path, flags, mask) {
        Ok(st) => {
            let mount_root = st
                .stx_attributes_mask
                .contains(StatxAttributes::MOUNT_ROOT)
                .then(|| st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT));
            let mnt_id =
                StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::MNT_ID).then_some(st.stx_mnt_id);
            Ok(Inode {
                dev: rustix::fs::makedev(st.stx_dev_major, st.stx_dev_minor),
                ino: st.stx_ino,
                mode: u32::from(st.stx_mode),
                mount_root,
                mnt_id,
            })
        }
        Err(Errno::NOSYS) => {
            let st = rustix::fs::statat(dirfd, path, flags)?;
            Ok(Inode { dev: st.st_dev, ino: st.st_ino, mode: st.st_mode, mount_root: None, mnt_id: None })
        }
        Err(e) => Err(e),
    }
}

/// `statx` of an open descriptor.
fn inode_of(fd: BorrowedFd<'_>) -> Result<Inode, Errno> {
    inode_at(fd, c"", AtFlags::EMPTY_PATH)
}

/// A pool root directory, opened once; all volume operations are relative to its descriptor.
#[derive(Debug)]
pub struct PoolRoot {
    name: String,
    path: PathBuf,
    /// `O_PATH` descriptor of the root: enough for `*at` calls, `statx` and `fstatvfs`, and needs
    /// no permission on the directory itself.
    fd: OwnedFd,
    dev: u64,
    ino: u64,
    mnt_id: Option<u64>,
    /// Cleared the first time `openat2` reports `ENOSYS` (kernels before 5.6).
    openat2: AtomicBool,
}

/// Where a pool root was found: see [`PoolRoot::origin`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootOrigin {
    /// The path the kernel resolved.
    pub resolved: PathBuf,
    /// Device and inode of its parent directory.
    pub parent: (u64, u64),
}

/// Whether opening a directory may enter a nested btrfs subvolume on the pool's own mount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Subvolumes {
    /// The removal walk: a subvolume inside a volume is part of the volume's tree.
    Descend,
    /// Anything else: a different device number is refused like a mount.
    Refuse,
}

/// What opening a directory entry as a directory found.
enum DirOpen {
    Opened(OwnedFd, Inode),
    NotDirectory,
    Gone,
}

impl PoolRoot {
    /// Opens an existing absolute directory as a pool root.
    ///
    /// Symlinks in intermediate components are followed once, here: everything at and above the
    /// root is admin territory (tenants only write inside volume directories), and distributions
    /// like Fedora CoreOS make `/mnt` a symlink. The directory reached is pinned by this handle,
    /// and [`PoolRoot::check`] refuses to go on if the path later resolves elsewhere. A symlink as
    /// the last component is refused (`RootIsSymlink`): it is almost always a mistake, and
    /// refusing it keeps "the pool root" and "the directory at that path" the same thing.
    /// `.` and `..` components are refused because the lexical path matching of the deletion
    /// rules (`docs/architecture.md`) would disagree with the kernel about them.
    pub fn open(name: &str, path: &Path) -> Result<PoolRoot, PoolError> {
        let has_dots = path.as_os_str().as_bytes().split(|b| *b == b'/').any(|c| c == b"." || c == b"..");
        if !path.is_absolute() || has_dots {
            return Err(PoolError::InvalidRootPath { pool: name.to_owned(), path: path.to_owned() });
        }
        // Dropping repeated and trailing slashes matters: a trailing slash would make the kernel
        // follow a final symlink despite O_NOFOLLOW.
        let clean: PathBuf = path.components().collect();
        debug_assert!(clean.components().all(|c| matches!(c, Component::RootDir | Component::Normal(_))));
        let fd = rustix::fs::openat(CWD, &clean, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| match e {
                Errno::NOENT => PoolError::RootMissing { pool: name.to_owned(), path: clean.clone() },
                Errno::NOTDIR => PoolError::RootNotDirectory { pool: name.to_owned(), path: clean.clone() },
                e => fs_error("open the pool root", clean.clone(), e),
            })?;
        let inode = inode_of(fd.as_fd()).map_err(|e| fs_error("stat the pool root", clean.clone(), e))?;
        match inode.file_type() {
            FileType::Directory => {}
            FileType::Symlink => {
                return Err(PoolError::RootIsSymlink { pool: name.to_owned(), path: clean });
            }
            _ => {
                return Err(PoolError::RootNotDirectory { pool: name.to_owned(), path: clean });
            }
        }
        Ok(PoolRoot {
            name: name.to_owned(),
            path: clean,
            fd,
            dev: inode.dev,
            ino: inode.ino,
            mnt_id: inode.mnt_id,
            openat2: AtomicBool::new(true),
        })
    }

    /// Where the root really is: the path the kernel resolved when it was opened (symlinks
    /// followed), and the device and inode of that path's parent directory.
    pub fn origin(&self) -> Result<RootOrigin, PoolError> {
        let link = format!("/proc/self/fd/{}", self.fd.as_raw_fd());
        let resolved = PathBuf::from(std::ffi::OsString::from_vec(
            rustix::fs::readlink(link.as_str(), Vec::new())
                .map_err(|e| fs_error("resolve the pool root", self.path.clone(), e))?
                .into_bytes(),
        ));
        let parent = resolved.parent().unwrap_or(Path::new("/"));
        let inode = inode_at(CWD, parent, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| fs_error("stat the pool root's parent", parent.to_owned(), e))?;
        Ok(RootOrigin { resolved, parent: (inode.dev, inode.ino) })
    }

    /// The pool's configured name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The pool root path (without repeated or trailing slashes).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The host path of a volume directory, for PV specs and messages only; operations never use it.
    pub fn volume_path(&self, name: &VolumeDirName) -> PathBuf {
        self.path.join(name.as_str())
    }

    /// Verifies that the root path still names the directory opened at startup (same device and
    /// inode) and, when `require_mountpoint`, that it is a mount point. Call it before every
    /// operation: an unmounted disk must neither receive new volumes nor have its mount point's
    /// underlying directory cleaned instead of the disk.
    pub fn check(&self, require_mountpoint: bool) -> Result<(), PoolError> {
        let now = inode_at(CWD, &self.path, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| match e {
            Errno::NOENT => PoolError::RootMissing { pool: self.name.clone(), path: self.path.clone() },
            e => fs_error("stat the pool root", self.path.clone(), e),
        })?;
        if (now.dev, now.ino) != (self.dev, self.ino) {
            return Err(PoolError::RootChanged { pool: self.name.clone(), path: self.path.clone() });
        }
        if require_mountpoint && !self.is_mountpoint()? {
            return Err(PoolError::RootNotMountpoint { pool: self.name.clone(), path: self.path.clone() });
        }
        let st = rustix::fs::fstatvfs(&self.fd).map_err(|e| fs_error("statvfs the pool root", self.path.clone(), e))?;
        if st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
            return Err(PoolError::ReadOnly { pool: self.name.clone(), path: self.path.clone() });
        }
        Ok(())
    }

    /// Whether something is mounted at the root path, bind mounts of a subdirectory of the same
    /// filesystem included.
    ///
    /// Uses `STATX_ATTR_MOUNT_ROOT` (Linux 5.8+); older kernels fall back to comparing the device
    /// with the parent's and then to `/proc/self/mountinfo`, which also knows same-device binds.
    pub fn is_mountpoint(&self) -> Result<bool, PoolError> {
        let inode = inode_at(CWD, &self.path, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| fs_error("stat the pool root", self.path.clone(), e))?;
        match inode.mount_root {
            Some(root) => Ok(root),
            None => self.is_mountpoint_without_statx_attr(inode.dev),
        }
    }

    /// The pre-5.8 answer of [`PoolRoot::is_mountpoint`].
    fn is_mountpoint_without_statx_attr(&self, dev: u64) -> Result<bool, PoolError> {
        let Some(parent) = self.path.parent() else {
            return Ok(true); // "/" is always a mount point
        };
        let parent_inode = inode_at(CWD, parent, AtFlags::empty())
            .map_err(|e| fs_error("stat the pool root's parent", parent.to_owned(), e))?;
        if parent_inode.dev != dev {
            return Ok(true);
        }
        // Same device as the parent: only the mount table can tell a bind mount of a subdirectory
        // from a plain directory. mountinfo shows resolved paths, hence the canonical form.
        let canonical = std::fs::canonicalize(&self.path).map_err(|e| PoolError::Io {
            op: "resolve the pool root path",
            path: self.path.clone(),
            source: Errno::from_io_error(&e).unwrap_or(Errno::IO),
        })?;
        let mounts = read_mount_table()?;
        Ok(crate::deciding::mount_table::is_mount_point(&mounts, &canonical))
    }

    /// Creates the volume directory with exactly `mode` (whatever the umask, docs/architecture.md, compatibility contract item 9).
    ///
    /// An existing directory is accepted as [`Created::Existing`] so retries and restarts converge
    /// (docs/architecture.md, what a provisioned volume looks like), and its mode is reset to `mode`. An existing symlink or
    /// non-directory is refused and left untouched.
    pub fn create_volume_dir(&self, name: &VolumeDirName, mode: u32) -> Result<Created, PoolError> {
        if mode > 0o7777 {
            return Err(PoolError::InvalidMode { mode });
        }
        let mode = Mode::from_raw_mode(mode);
        let path = self.volume_path(name);
        let created = match rustix::fs::mkdirat(&self.fd, name.as_str(), mode) {
            Ok(()) => Created::New,
            Err(Errno::EXIST) => Created::Existing,
            Err(e) => return Err(fs_error("create the volume directory", path, e)),
        };
        let fd = match self.open_dir_beneath(self.fd.as_fd(), name.as_str(), &|| path.clone(), Subvolumes::Refuse)? {
            DirOpen::Opened(fd, _) => fd,
            DirOpen::NotDirectory => {
                let inode = inode_at(self.fd.as_fd(), name.as_str(), AtFlags::SYMLINK_NOFOLLOW);
                return Err(match inode {
                    Ok(i) if i.file_type() == FileType::Symlink => PoolError::VolumeIsSymlink { path },
                    _ => PoolError::VolumeNotDirectory { path },
                });
            }
            // Removed between mkdir and open: another actor is at work; let the retry sort it out.
            DirOpen::Gone => return Err(fs_error("open the volume directory", path, Errno::NOENT)),
        };
        // mkdirat applied the umask; fchmod on our own descriptor sets exactly `mode`.
        rustix::fs::fchmod(&fd, mode).map_err(|e| fs_error("set the volume directory mode", path.clone(), e))?;
        tracing::debug!(pool = %self.name, path = %path.display(), ?created, "volume directory ready");
        Ok(created)
    }

    /// True if an entry of that name exists under the root, whatever its type (symlinks are not
    /// followed, so a dangling symlink exists).
    pub fn volume_dir_exists(&self, name: &VolumeDirName) -> Result<bool, PoolError> {
        match rustix::fs::statat(&self.fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(_) => Ok(true),
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(fs_error("stat the volume directory", self.volume_path(name), e)),
        }
    }

    /// Removes the volume directory tree without following symlinks or leaving the pool's mount.
    ///
    /// A missing entry is [`Removal::AlreadyGone`]. A symlink or other non-directory at the volume
    /// name is unlinked (never followed) and counts as removed. A mount met anywhere inside stops
    /// the removal with [`PoolError::MountInsideVolume`]; entries removed before that stay removed.
    pub fn remove_volume_dir(&self, name: &VolumeDirName) -> Result<Removal, PoolError> {
        if let Some(removal) = self.remove_if_subvolume(name)? {
            tracing::debug!(pool = %self.name, volume = %name, ?removal, "quota volume removed");
            return Ok(removal);
        }
        let removal = Walker::new(self, OPEN_DIR_WINDOW, MAX_ANCHORS).remove(name)?;
        tracing::debug!(pool = %self.name, volume = %name, ?removal, "volume directory removed");
        Ok(removal)
    }

    /// Removes the volume directory only if it is empty: the cleanup after a failed PV creation
    /// and of orphan directories must never touch data a workload already wrote. A missing entry
    /// is fine; a symlink, non-directory or mount point in its place is refused and kept.
    pub fn remove_empty_volume_dir(&self, name: &VolumeDirName) -> Result<(), PoolError> {
        let path = self.volume_path(name);
        // rmdir(2) never follows a symlink in the last component (it answers ENOTDIR) and never
        // removes a non-empty directory, so one call is safe on its own.
        match rustix::fs::unlinkat(&self.fd, name.as_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(Errno::NOTEMPTY | Errno::EXIST) => Err(PoolError::VolumeNotEmpty { path }),
            Err(Errno::NOTDIR) => {
                let inode = inode_at(self.fd.as_fd(), name.as_str(), AtFlags::SYMLINK_NOFOLLOW);
                Err(match inode {
                    Ok(i) if i.file_type() == FileType::Symlink => PoolError::VolumeIsSymlink { path },
                    _ => PoolError::VolumeNotDirectory { path },
                })
            }
            Err(Errno::BUSY) => Err(PoolError::MountInsideVolume { path }),
            Err(e) => Err(fs_error("remove the empty volume directory", path, e)),
        }
    }

    /// How long ago the entry `name` directly under the root last changed (its ctime), without
    /// following a symlink. `None` when it is gone.
    pub fn entry_age(&self, name: &VolumeDirName) -> Result<Option<std::time::Duration>, PoolError> {
        match rustix::fs::statat(&self.fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                let changed = std::time::UNIX_EPOCH
                    + std::time::Duration::new(
                        st.st_ctime.max(0) as u64,
                        st.st_ctime_nsec.clamp(0, 999_999_999) as u32,
                    );
                Ok(Some(std::time::SystemTime::now().duration_since(changed).unwrap_or_default()))
            }
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(fs_error("stat the volume directory", self.volume_path(name), e)),
        }
    }

    /// Names of the entries directly under the pool root (any type, "." and ".." left out), for
    /// orphan cleanup. Names that are not UTF-8 are skipped: this provisioner never makes them.
    pub fn list_entries(&self) -> Result<Vec<String>, PoolError> {
        let list_error = |e| fs_error("list the pool root", self.path.clone(), e);
        // The root handle is O_PATH, which cannot be read; "." through it is the same directory.
        let fd = rustix::fs::openat(
            &self.fd,
            c".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(list_error)?;
        let mut dir = Dir::new(fd).map_err(list_error)?;
        let mut names = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(list_error)?;
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            if let Ok(name) = name.to_str() {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    /// Capacity of the pool's filesystem.
    pub fn stats(&self) -> Result<PoolStats, PoolError> {
        let st = rustix::fs::fstatvfs(&self.fd).map_err(|e| fs_error("statvfs the pool root", self.path.clone(), e))?;
        Ok(PoolStats {
            total_bytes: st.f_blocks.saturating_mul(st.f_frsize),
            free_bytes: st.f_bfree.saturating_mul(st.f_frsize),
            available_bytes: st.f_bavail.saturating_mul(st.f_frsize),
            go_total_bytes: st.f_blocks.saturating_mul(st.f_bsize),
        })
    }

    /// Opens `name` under `dirfd` as a directory without following any symlink or crossing any
    /// mount, with `openat2` where the kernel has it.
    fn open_beneath<P: rustix::path::Arg + Copy>(
        &self,
        dirfd: BorrowedFd<'_>,
        name: P,
        flags: OFlags,
    ) -> Result<OwnedFd, Errno> {
        let flags = flags | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        if self.openat2.load(Ordering::Relaxed) {
            let resolve =
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS | ResolveFlags::NO_XDEV;
            let mut attempts = 0;
            loop {
                match rustix::fs::openat2(dirfd, name, flags, Mode::empty(), resolve) {
                    // The kernel saw a concurrent rename and could not prove containment.
                    Err(Errno::AGAIN) if attempts < MAX_OPENAT2_RETRIES => attempts += 1,
                    Err(Errno::NOSYS) => {
                        self.openat2.store(false, Ordering::Relaxed);
                        break;
                    }
                    result => return result,
                }
            }
        }
        // One component with O_NOFOLLOW cannot traverse a symlink; mounts are caught afterwards by
        // the device and mount checks of the caller.
        rustix::fs::openat(dirfd, name, flags, Mode::empty())
    }

    /// True for an inode on the pool root's own mount (same mount id, not a mount root) whose
    /// device number differs only because it sits in another btrfs subvolume: a subvolume a
    /// tenant created inside a volume (`btrfs subvolume create` needs no privilege), or inside
    /// one. Only the mount id tells this apart from a mount: without it (kernels before 5.8)
    /// the answer is false and such a volume stays refused as if it held a mount.
    fn is_on_own_mount_in_another_subvolume(&self, inode: &Inode) -> bool {
        inode.dev != self.dev
            && inode.mount_root != Some(true)
            && matches!((inode.mnt_id, self.mnt_id), (Some(a), Some(b)) if a == b)
            && rustix::fs::fstatfs(&self.fd).is_ok_and(|st| {
                #[allow(clippy::unnecessary_cast)] // f_type's width differs between architectures
                let magic = st.f_type as u64;
                magic == quota::btrfs::SUPER_MAGIC
            })
    }

    /// Whether an inode belongs to another mount than the pool root's.
    fn is_foreign_mount(&self, inode: &Inode) -> bool {
        inode.dev != self.dev
            || inode.mount_root == Some(true)
            || matches!((inode.mnt_id, self.mnt_id), (Some(a), Some(b)) if a != b)
    }

    /// Opens a directory entry for listing, refusing mounts and making it writable by its owner.
    ///
    /// `path` is only for messages. Directories missing owner read, write or search permission are
    /// `fchmod`ed to 0700 through the opened descriptor, which matters when the provisioner runs
    /// without `CAP_DAC_OVERRIDE`.
    fn open_dir_beneath<P: rustix::path::Arg + Copy>(
        &self,
        dirfd: BorrowedFd<'_>,
        name: P,
        path: &dyn Fn() -> PathBuf,
        subvolumes: Subvolumes,
    ) -> Result<DirOpen, PoolError> {
        let fd = match self.open_beneath(dirfd, name, OFlags::RDONLY) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(DirOpen::Gone),
            // ELOOP: a symlink (O_NOFOLLOW, RESOLVE_NO_SYMLINKS); ENOTDIR: another non-directory.
            Err(Errno::LOOP | Errno::NOTDIR) => return Ok(DirOpen::NotDirectory),
            Err(Errno::XDEV) => {
                return Err(PoolError::MountInsideVolume { path: path() });
            }
            Err(Errno::ACCESS) => return self.open_unreadable_dir(dirfd, name, path, subvolumes),
            Err(e) => return Err(fs_error("open directory", path(), e)),
        };
        let inode = self.inspect_dir(fd.as_fd(), path, subvolumes)?;
        if inode.mode & OWNER_RWX != OWNER_RWX {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(OWNER_RWX))
                .map_err(|e| fs_error("make directory writable", path(), e))?;
        }
        Ok(DirOpen::Opened(fd, inode))
    }

    /// `open_dir_beneath` for a directory we may not read (mode 0000, 0300, ... without
    /// `CAP_DAC_READ_SEARCH`): an `O_PATH` descriptor needs no permission on the directory, then
    /// its mode is fixed and it is re-opened for listing through that descriptor.
    fn open_unreadable_dir<P: rustix::path::Arg + Copy>(
        &self,
        dirfd: BorrowedFd<'_>,
        name: P,
        path: &dyn Fn() -> PathBuf,
        subvolumes: Subvolumes,
    ) -> Result<DirOpen, PoolError> {
        let pfd = match self.open_beneath(dirfd, name, OFlags::PATH) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(DirOpen::Gone),
            Err(Errno::LOOP | Errno::NOTDIR) => return Ok(DirOpen::NotDirectory),
            Err(Errno::XDEV) => {
                return Err(PoolError::MountInsideVolume { path: path() });
            }
            Err(e) => return Err(fs_error("open directory", path(), e)),
        };
        let before = self.inspect_dir(pfd.as_fd(), path, subvolumes)?;
        // fchmod refuses O_PATH descriptors. chmod through the descriptor's /proc magic link acts
        // on exactly the inode the descriptor holds, never on a symlink target. It is the one
        // absolute path we hand the kernel, and it names our own descriptor, not the pool.
        let magic = format!("/proc/self/fd/{}", pfd.as_raw_fd());
        rustix::fs::chmod(magic.as_str(), Mode::from_raw_mode(OWNER_RWX))
            .map_err(|e| fs_error("make directory readable", path(), e))?;
        let fd = rustix::fs::openat(
            &pfd,
            c".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| fs_error("open directory", path(), e))?;
        let after = self.inspect_dir(fd.as_fd(), path, subvolumes)?;
        if (after.dev, after.ino) != (before.dev, before.ino) {
            return Err(PoolError::TreeChanged { path: path() });
        }
        Ok(DirOpen::Opened(fd, after))
    }

    /// `statx` of an opened directory, refusing anything on another mount (and, unless
    /// `subvolumes` says so, a nested btrfs subvolume).
    fn inspect_dir(
        &self,
        fd: BorrowedFd<'_>,
        path: &dyn Fn() -> PathBuf,
        subvolumes: Subvolumes,
    ) -> Result<Inode, PoolError> {
        let inode = inode_of(fd).map_err(|e| fs_error("stat directory", path(), e))?;
        let nested_subvolume = subvolumes == Subvolumes::Descend && self.is_on_own_mount_in_another_subvolume(&inode);
        if self.is_foreign_mount(&inode) && !nested_subvolume {
            return Err(PoolError::MountInsideVolume { path: path() });
        }
        if inode.file_type() != FileType::Directory {
            // O_DIRECTORY makes this impossible; refuse rather than trust it blindly.
            return Err(PoolError::TreeChanged { path: path() });
        }
        Ok(inode)
    }
}

/// One directory on the removal stack.
struct Frame {
    /// Name within the parent (the volume name for the bottom frame).
    name: CString,
    /// Identity recorded when first opened, checked again whenever the directory is re-opened.
    dev: u64,
    ino: u64,
    /// `None` while evicted to keep the number of open descriptors bounded.
    dir: Option<Dir>,
    /// How often this directory has been re-listed because it was not empty at `rmdir`.
    rescans: u32,
    /// Set when the directory is the root of a nested btrfs subvolume: its id, whose qgroup is
    /// destroyed once the subvolume is removed.
    subvolume_id: Option<u64>,
}

/// What removing one directory entry did.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// The name was unlinked.
    Unlinked,
    /// The entry is a directory and was pushed on the stack to be emptied first.
    Descended,
    /// The entry had already vanished (a concurrent deletion); nothing to do.
    Gone,
}

/// The iterative, descriptor-based tree removal behind [`PoolRoot::remove_volume_dir`].
struct Walker<'a> {
    pool: &'a PoolRoot,
    stack: Vec<Frame>,
    /// Deepest levels kept open (see [`OPEN_DIR_WINDOW`]).
    window: usize,
    /// Cap on open anchor levels below the window (see [`MAX_ANCHORS`]).
    max_anchors: usize,
    /// Levels that are multiples of `stride` stay open as anchors once they leave the window.
    stride: usize,
    entries: u64,
    open_dirs: usize,
    max_open_dirs: usize,
    /// Directories opened again after eviction (for tests of the descriptor budget).
    reopened: u64,
    /// Nested btrfs subvolumes removed (each one escaped a quota volume's limit).
    nested_subvolumes: u64,
}

impl<'a> Walker<'a> {
    fn new(pool: &'a PoolRoot, window: usize, max_anchors: usize) -> Self {
        let window = window.max(1);
        Walker {
            pool,
            stack: Vec::new(),
            window,
            max_anchors: max_anchors.max(1),
            stride: window,
            entries: 0,
            open_dirs: 0,
            max_open_dirs: 0,
            reopened: 0,
            nested_subvolumes: 0,
        }
    }

    fn remove(&mut self, volume: &VolumeDirName) -> Result<Removal, PoolError> {
        let name = CString::new(volume.as_str()).map_err(|_| PoolError::Io {
            op: "use the volume name",
            path: self.pool.volume_path(volume),
            source: Errno::INVAL,
        })?;
        match self.remove_entry(None, &name, FileType::Unknown, 0)? {
            Step::Gone => return Ok(Removal::AlreadyGone),
            Step::Unlinked => return Ok(Removal::Removed { entries: 1 }),
            Step::Descended => {}
        }
        self.drain()?;
        Ok(Removal::Removed { entries: self.entries })
    }

    /// Empties and removes every directory on the stack, deepest first.
    fn drain(&mut self) -> Result<(), PoolError> {
        while let Some(top) = self.stack.len().checked_sub(1) {
            self.ensure_open(top)?;
            let next = match self.stack[top].dir.as_mut() {
                Some(dir) => dir.read(),
                None => return Err(self.changed(Some(top))),
            };
            match next {
                None => self.finish_top()?,
                Some(Err(e)) => {
                    return Err(fs_error("list directory", self.path_of(Some(top), None), e));
                }
                Some(Ok(entry)) => {
                    let name = entry.file_name();
                    if name == c"." || name == c".." {
                        continue;
                    }
                    self.remove_entry(Some(top), name, entry.file_type(), 0)?;
                }
            }
        }
        Ok(())
    }

    /// Removes the entry `name` of frame `parent` (`None`: the pool root), descending into it if
    /// it is a directory. `file_type` is the `d_type` hint; it is only a hint, because the entry
    /// may change under us: safety never rests on it, only on `O_NOFOLLOW` opens and `unlinkat`.
    fn remove_entry(
        &mut self,
        parent: Option<usize>,
        name: &CStr,
        file_type: FileType,
        rescans: u32,
    ) -> Result<Step, PoolError> {
        let mut as_dir = match file_type {
            FileType::Directory => true,
            FileType::Unknown => {
                let parent_fd = self.parent_fd(parent)?;
                match inode_at(parent_fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(inode) => inode.file_type() == FileType::Directory,
                    Err(Errno::NOENT) => return Ok(Step::Gone),
                    Err(e) => return Err(fs_error("stat", self.path_of(parent, Some(name)), e)),
                }
            }
            _ => false,
        };
        for _ in 0..MAX_TYPE_CHANGES {
            if as_dir {
                let opened = {
                    let parent_fd = self.parent_fd(parent)?;
                    let path = || self.path_of(parent, Some(name));
                    self.pool.open_dir_beneath(parent_fd, name, &path, Subvolumes::Descend)?
                };
                match opened {
                    DirOpen::Opened(fd, inode) => {
                        self.push(name, fd, inode, rescans)?;
                        return Ok(Step::Descended);
                    }
                    DirOpen::NotDirectory => as_dir = false,
                    DirOpen::Gone => return Ok(Step::Gone),
                }
            } else {
                let parent_fd = self.parent_fd(parent)?;
                match rustix::fs::unlinkat(parent_fd, name, AtFlags::empty()) {
                    Ok(()) => {
                        self.entries += 1;
                        return Ok(Step::Unlinked);
                    }
                    Err(Errno::NOENT) => return Ok(Step::Gone),
                    // Linux answers unlink(2) on a directory with EISDIR: it became one.
                    Err(Errno::ISDIR) => as_dir = true,
                    // A file bind-mounted over this name (in our namespace) cannot be unlinked.
                    Err(Errno::BUSY) => {
                        let mounted = inode_at(parent_fd, name, AtFlags::SYMLINK_NOFOLLOW)
                            .is_ok_and(|inode| self.pool.is_foreign_mount(&inode));
                        let path = self.path_of(parent, Some(name));
                        return Err(if mounted {
                            PoolError::MountInsideVolume { path }
                        } else {
                            fs_error("unlink", path, Errno::BUSY)
                        });
                    }
                    Err(e) => return Err(fs_error("unlink", self.path_of(parent, Some(name)), e)),
                }
            }
        }
        Err(PoolError::TreeChanged { path: self.path_of(parent, Some(name)) })
    }

    /// The top directory is listed to the end: remove it from its parent, re-listing it if
    /// entries appeared meanwhile.
    fn finish_top(&mut self) -> Result<(), PoolError> {
        let Some(mut frame) = self.stack.pop() else {
            return Ok(());
        };
        if frame.dir.take().is_some() {
            self.open_dirs -= 1;
        }
        let parent = self.stack.len().checked_sub(1);
        if let Some(p) = parent {
            self.ensure_open(p)?;
        }
        let parent_fd = self.parent_fd(parent)?;
        match rustix::fs::unlinkat(parent_fd, frame.name.as_c_str(), AtFlags::REMOVEDIR) {
            Ok(()) => {
                self.entries += 1;
                if let Some(id) = frame.subvolume_id {
                    self.nested_subvolume_removed(parent, &frame.name, id);
                }
                Ok(())
            }
            Err(Errno::NOENT) => Ok(()),
            Err(Errno::NOTEMPTY | Errno::EXIST) => {
                if frame.rescans >= MAX_RESCANS {
                    return Err(PoolError::TreeChanged { path: self.path_of(parent, Some(&frame.name)) });
                }
                self.remove_entry(parent, &frame.name, FileType::Directory, frame.rescans + 1).map(|_| ())
            }
            // rmdir(2) answers EBUSY for a mount point that appeared after we listed the parent.
            Err(Errno::BUSY) => Err(PoolError::MountInsideVolume { path: self.path_of(parent, Some(&frame.name)) }),
            Err(e) => Err(fs_error("remove directory", self.path_of(parent, Some(&frame.name)), e)),
        }
    }

    /// A nested subvolume is gone (rmdir(2) deletes an empty one): its qgroup goes too when the
    /// kernel lets it, and the escape is logged, since the tenant's data in it was not limited.
    fn nested_subvolume_removed(&mut self, parent: Option<usize>, name: &CStr, id: u64) {
        self.nested_subvolumes += 1;
        NESTED_SUBVOLUMES_REMOVED.fetch_add(1, Ordering::Relaxed);
        let path = self.path_of(parent, Some(name));
        let destroyed = self.pool.readable_root().and_then(|root| {
            quota::btrfs::destroy_qgroup(&root, id).map_err(|e| fs_error("destroy the qgroup", path.clone(), e))
        });
        tracing::warn!(
            pool = %self.pool.name, path = %path.display(), id, ?destroyed,
            "removed a btrfs subvolume nested inside a volume (made by a workload; it was not limited by the volume's quota)"
        );
    }

    /// Pushes an opened directory and evicts the descriptor that falls out of the window.
    fn push(&mut self, name: &CStr, fd: OwnedFd, inode: Inode, rescans: u32) -> Result<(), PoolError> {
        let parent_dev = self.stack.last().map_or(self.pool.dev, |f| f.dev);
        let subvolume_id = (inode.ino == quota::btrfs::SUBVOLUME_ROOT_INO && inode.dev != parent_dev)
            .then(|| quota::btrfs::subvolume_id(&fd).ok())
            .flatten();
        self.stack.push(Frame {
            name: name.to_owned(),
            dev: inode.dev,
            ino: inode.ino,
            dir: None,
            rescans,
            subvolume_id,
        });
        let index = self.stack.len() - 1;
        self.install(index, fd)
    }

    /// Makes `fd` the listing descriptor of frame `index` and enforces the window.
    fn install(&mut self, index: usize, fd: OwnedFd) -> Result<(), PoolError> {
        let dir = Dir::new(fd).map_err(|e| fs_error("list directory", self.path_of(Some(index), None), e))?;
        if self.stack[index].dir.replace(dir).is_none() {
            self.open_dirs += 1;
        }
        // The level leaving the window stays open if it is an anchor. Invariant: below the
        // window, exactly the levels that are multiples of `stride` are open (besides level 0).
        if let Some(evict) = index.checked_sub(self.window)
            && evict >= 1
        {
            if evict % self.stride == 0 {
                while evict / self.stride > self.max_anchors {
                    self.stride *= 2;
                    let old = self.stride / 2;
                    for odd in (old..=evict).step_by(self.stride) {
                        self.close(odd);
                    }
                }
            } else {
                self.close(evict);
            }
        }
        self.max_open_dirs = self.max_open_dirs.max(self.open_dirs);
        Ok(())
    }

    /// Evicts frame `index`'s descriptor (it is re-opened by name when needed again).
    fn close(&mut self, index: usize) {
        if self.stack[index].dir.take().is_some() {
            self.open_dirs -= 1;
        }
    }

    /// Re-opens frame `index` if it was evicted, walking down by name from the nearest open
    /// ancestor (never through `..`) and checking every directory is the one recorded.
    fn ensure_open(&mut self, index: usize) -> Result<(), PoolError> {
        if self.stack[index].dir.is_some() {
            return Ok(());
        }
        let first = (0..index).rev().find(|&i| self.stack[i].dir.is_some()).map_or(0, |i| i + 1);
        for k in first..=index {
            let parent = k.checked_sub(1);
            let opened = {
                let parent_fd = self.parent_fd(parent)?;
                let path = || self.path_of(Some(k), None);
                self.pool.open_dir_beneath(parent_fd, self.stack[k].name.as_c_str(), &path, Subvolumes::Descend)?
            };
            match opened {
                DirOpen::Opened(fd, inode) if (inode.dev, inode.ino) == (self.stack[k].dev, self.stack[k].ino) => {
                    self.reopened += 1;
                    self.install(k, fd)?;
                }
                _ => return Err(self.changed(Some(k))),
            }
        }
        Ok(())
    }

    /// The descriptor entries of frame `parent` are relative to (`None`: the pool root).
    fn parent_fd(&self, parent: Option<usize>) -> Result<BorrowedFd<'_>, PoolError> {
        match parent {
            None => Ok(self.pool.fd.as_fd()),
            Some(i) => match self.stack[i].dir.as_ref() {
                Some(dir) => dir.fd().map_err(|e| fs_error("use directory", self.path_of(Some(i), None), e)),
                None => Err(self.changed(Some(i))),
            },
        }
    }

    fn changed(&self, frame: Option<usize>) -> PoolError {
        PoolError::TreeChanged { path: self.path_of(frame, None) }
    }

    /// Rebuilds a path for messages only: the pool root, the names of frames `0..=frame`, then
    /// `child`. Very deep paths keep their head and tail so an event note stays readable.
    fn path_of(&self, frame: Option<usize>, child: Option<&CStr>) -> PathBuf {
        const HEAD: usize = 8;
        const TAIL: usize = 24;
        let frames = frame.map_or(&self.stack[..0], |f| &self.stack[..=f]);
        let mut names: Vec<&OsStr> = frames.iter().map(|f| OsStr::from_bytes(f.name.to_bytes())).collect();
        if let Some(child) = child {
            names.push(OsStr::from_bytes(child.to_bytes()));
        }
        let mut path = self.pool.path.clone();
        if names.len() > HEAD + TAIL + 1 {
            let skipped = names.len() - HEAD - TAIL;
            path.extend(&names[..HEAD]);
            path.push(format!("...({skipped} more levels)..."));
            path.extend(&names[names.len() - TAIL..]);
        } else {
            path.extend(&names);
        }
        path
    }
}

mod clone;
pub mod mount_table;
pub mod os_disk;
pub mod pools;
pub mod quota;
mod trash;

pub use clone::{CLONE_STAGING_DIR, CloneReport};
pub use trash::{STAGING_DIR, Staged, StagedVolume, TRASH_DIR, Trashed};

#[cfg(test)]
mod tests;

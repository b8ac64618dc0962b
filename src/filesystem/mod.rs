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

use std::fmt;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, StatxAttributes, StatxFlags};
use rustix::io::Errno;

/// Longest directory name Linux filesystems accept (`NAME_MAX`).
const MAX_NAME_BYTES: usize = 255;

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

mod error;
mod marker;
mod root;
mod walker;

use walker::{MAX_ANCHORS, OPEN_DIR_WINDOW, Walker};

pub use error::PoolError;
use error::fs_error;
pub use marker::{MAKING_PREFIX, MARKER_XATTR, Marker};
use root::{DirOpen, Subvolumes};
pub use root::{PoolRoot, RootOrigin};
pub mod block;
mod clone;
pub mod mount_table;
pub mod os_disk;
pub mod pools;
pub mod quota;
mod snapshots;
mod trash;

pub use clone::{CLONE_STAGING_DIR, CloneReport};
pub use snapshots::SNAPSHOTS_DIR;
pub use trash::{STAGING_DIR, Staged, StagedVolume, TRASH_DIR, Trashed};

#[cfg(test)]
mod tests;

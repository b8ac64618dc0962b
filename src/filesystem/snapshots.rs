//! Snapshots of volumes (`deciding::snapshot`), kept beside the volumes they copy, under
//! `<pool root>/.hpp-snapshots/<snapshot uid>`, on the same filesystem: a snapshot is taken and
//! restored with the clone's copy (a btrfs snapshot of a subvolume, reflinks where the
//! filesystem shares extents, bytes elsewhere), staged and renamed into place only once
//! complete. A snapshot leaves by the pool's trash, as a volume does.
//!
//! The snapshots directory is a bookkeeping directory: opened beneath the root without
//! following a symlink, refused when something else (a symlink, a file, a mount) stands in its
//! place. Its entries are named by snapshot UIDs only.

use std::os::fd::AsFd;

use super::{CloneReport, PoolError, PoolRoot, Trashed, VolumeDirName};
use crate::deciding::layout;
use crate::deciding::snapshot::recreation::{MAX_RECORD_BYTES, RECORD_XATTR};

/// Directory directly under a pool root that holds the snapshots (dot-prefixed, so it never
/// matches a volume layout and the orphan cleanup leaves it alone).
pub const SNAPSHOTS_DIR: &str = ".hpp-snapshots";

impl PoolRoot {
    /// The snapshots directory as a root of its own; `None` when it does not exist and
    /// `create` is false.
    fn snapshots_root(&self, create: bool) -> Result<Option<PoolRoot>, PoolError> {
        let path = self.path.join(SNAPSHOTS_DIR);
        let Some(fd) = self.open_own_dir(self.fd.as_fd(), SNAPSHOTS_DIR, &path, create)? else { return Ok(None) };
        self.sub_root(fd, "snapshots", path).map(Some)
    }

    /// Copies volume `source` into snapshot `snapshot`, staged under `node`'s name. A snapshot
    /// complete before (a retry after a crash) is found as it is.
    pub fn take_snapshot(
        &self,
        source: &VolumeDirName,
        snapshot: &VolumeDirName,
        node: &VolumeDirName,
    ) -> Result<CloneReport, PoolError> {
        let snapshots = self.snapshots_root(true)?.ok_or_else(|| missing(self))?;
        snapshots.copy_in(self, source, snapshot, node)
    }

    /// Copies snapshot `snapshot` into a new volume `target` of this root.
    pub fn restore_snapshot(
        &self,
        snapshot: &VolumeDirName,
        target: &VolumeDirName,
        node: &VolumeDirName,
    ) -> Result<CloneReport, PoolError> {
        let snapshots = self.snapshots_root(false)?.ok_or_else(|| missing(self))?;
        self.copy_in(&snapshots, snapshot, target, node)
    }

    /// Whether copies on this root share their data with the source (btrfs, XFS: a snapshot
    /// or reflinks), rather than taking as much room again (a byte copy).
    pub fn shares_extents(&self) -> bool {
        super::clone::filesystem_kind(self.fd.as_fd()) != crate::deciding::clone::FilesystemKind::Other
    }

    /// Whether snapshot `snapshot` of this root is a btrfs subvolume (a snapshot of a quota
    /// volume, which a quota limit can hold), as the disk says.
    pub fn snapshot_is_subvolume(&self, snapshot: &VolumeDirName) -> Result<bool, PoolError> {
        let Some(snapshots) = self.snapshots_root(false)? else { return Ok(false) };
        if super::clone::filesystem_kind(snapshots.fd.as_fd()) != crate::deciding::clone::FilesystemKind::Btrfs {
            return Ok(false);
        }
        match rustix::fs::statat(&snapshots.fd, snapshot.as_str(), rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Ok(rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Directory
                && stat.st_ino == super::clone::BTRFS_SUBVOLUME_ROOT_INO),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(super::fs_error("stat the snapshot", snapshots.volume_path(snapshot), e)),
        }
    }

    /// Whether this root holds snapshot `snapshot`.
    pub fn has_snapshot(&self, snapshot: &VolumeDirName) -> Result<bool, PoolError> {
        match self.snapshots_root(false)? {
            Some(snapshots) => snapshots.volume_dir_exists(snapshot),
            None => Ok(false),
        }
    }

    /// Moves snapshot `snapshot` into the pool's trash (its data is removed in the background),
    /// with the checks a volume's move gets: never following a symlink, refused when a
    /// filesystem is mounted on or inside it.
    pub fn trash_snapshot(&self, snapshot: &VolumeDirName) -> Result<Trashed, PoolError> {
        let Some(snapshots) = self.snapshots_root(false)? else { return Ok(Trashed::AlreadyGone) };
        if let Some(nothing_to_move) = snapshots.check_movable(snapshot)? {
            return Ok(nothing_to_move);
        }
        let entry = self.rename_into_trash(snapshots.fd.as_fd(), snapshot)?;
        Ok(Trashed::Moved(entry))
    }

    /// Removes the snapshot copies this node left unfinished (a crash mid-copy); returns how
    /// many. They are staged under their snapshot's UID.
    pub fn sweep_snapshot_staging(&self, node: &VolumeDirName) -> Result<u64, PoolError> {
        match self.snapshots_root(false)? {
            Some(snapshots) => snapshots.sweep_staging(node, layout::is_uid),
            None => Ok(0),
        }
    }

    /// Bytes allocated to snapshot copy `uid` (0 when there is none).
    pub fn snapshot_copy_bytes(&self, uid: &str) -> Result<u64, PoolError> {
        match self.snapshots_root(false)? {
            Some(snapshots) => snapshots.bytes_under(uid),
            None => Ok(0),
        }
    }

    /// The UIDs of the snapshot copies on this root (entries of another name are left out:
    /// nothing else is the provisioner's to judge there).
    pub fn snapshot_copies(&self) -> Result<Vec<String>, PoolError> {
        let Some(snapshots) = self.snapshots_root(false)? else { return Ok(Vec::new()) };
        let mut uids: Vec<String> = snapshots.list_entries()?.into_iter().filter(|name| layout::is_uid(name)).collect();
        uids.sort();
        Ok(uids)
    }
}

impl PoolRoot {
    /// The record written on snapshot copy `snapshot` (`deciding::snapshot::recreation`), as
    /// written; `None` when there is no copy or no record that reads as text.
    pub fn snapshot_record(&self, snapshot: &VolumeDirName) -> Result<Option<String>, PoolError> {
        match self.snapshots_root(false)? {
            Some(snapshots) => snapshots.directory_attribute(snapshot, RECORD_XATTR, MAX_RECORD_BYTES),
            None => Ok(None),
        }
    }

    /// Writes the record of snapshot copy `snapshot`, which must exist.
    pub fn set_snapshot_record(&self, snapshot: &VolumeDirName, record: &str) -> Result<(), PoolError> {
        let snapshots = self.snapshots_root(false)?.ok_or_else(|| missing(self))?;
        snapshots.set_directory_attribute(snapshot, RECORD_XATTR, record)
    }

    /// Gives copy `from` the name `to` (a snapshot made again adopting its earlier copy): one
    /// rename within the snapshots directory, never over an entry already there, refused when
    /// a filesystem is mounted on or inside the copy. `Ok(false)` when `from` is not there.
    pub fn rename_snapshot(&self, from: &VolumeDirName, to: &VolumeDirName) -> Result<bool, PoolError> {
        let Some(snapshots) = self.snapshots_root(false)? else { return Ok(false) };
        if !snapshots.check_renamable(from)? {
            return Ok(false);
        }
        let flags = rustix::fs::RenameFlags::NOREPLACE;
        match rustix::fs::renameat_with(&snapshots.fd, from.as_str(), &snapshots.fd, to.as_str(), flags) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(super::fs_error("rename the snapshot copy", snapshots.volume_path(to), e)),
        }
    }
}

fn missing(pool: &PoolRoot) -> PoolError {
    super::fs_error("open the snapshots directory", pool.path.join(SNAPSHOTS_DIR), rustix::io::Errno::NOENT)
}

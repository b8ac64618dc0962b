//! Fast reclaim (docs/architecture.md, deletion rules): a released volume is renamed into a trash directory on the
//! same filesystem, so its PV can go at once, and its data is removed in the background, with
//! the same fd-based walk as a direct removal. The trash survives restarts and is purged again.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;

use super::{PoolError, PoolRoot, Removal, VolumeDirName, fs_error, inode_at, read_mount_table};
use crate::deciding::layout;

/// Name of the trash directory directly under a pool root. It starts with a dot so that it never
/// matches a volume layout (and the orphan cleanup ignores it).
pub const TRASH_DIR: &str = ".hpp-trash";

/// Name of the directory directly under a pool root where volumes wait while their PV is being
/// deleted: `<node>/<pv>/<dir>`. Dot-named like the trash, so no layout or cleanup matches it;
/// the purge never enters it.
pub const STAGING_DIR: &str = ".hpp-deleting";

/// How often staging retries when another deletion's cleanup removed an empty staging level
/// between its mkdir and its open.
const MAX_STAGING_ATTEMPTS: u32 = 32;

/// Distinguishes trash entries made within the same nanosecond.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// What moving a volume to the trash did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Trashed {
    /// Renamed into the trash under this entry name; its data awaits [`PoolRoot::purge_trash`].
    Moved(String),
    /// Nothing to move: the entry was missing.
    AlreadyGone,
    /// Not a directory (a symlink or a file in place of the volume): unlinked at once.
    Unlinked,
}

/// A volume directory moved aside while its PV is deleted: `.hpp-deleting/<node>/<pv>/<dir>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedVolume {
    /// The node that staged it (a shared pool's staging holds every node's).
    pub node: VolumeDirName,
    /// The PV whose deletion decides its fate.
    pub pv: VolumeDirName,
    /// Its name at its place in the pool.
    pub dir: VolumeDirName,
}

/// What staging a volume for deletion did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Staged {
    /// Moved aside; committed or restored once the API server answered.
    Moved(StagedVolume),
    /// Nothing to move: the entry was missing.
    AlreadyGone,
    /// Not a directory (a symlink or a file in place of the volume): unlinked at once.
    Unlinked,
}

impl PoolRoot {
    /// Moves the volume directory into the pool's trash directory, atomically and without
    /// following symlinks. Refuses (and moves nothing) when a filesystem is mounted on or
    /// inside the volume, so that a later background removal never meets one.
    pub fn move_to_trash(&self, name: &VolumeDirName) -> Result<Trashed, PoolError> {
        if let Some(nothing_to_move) = self.check_movable(name)? {
            return Ok(nothing_to_move);
        }
        // The data keeps its project id until purged (so the id is not given out again while it
        // is charged); its limit goes now.
        self.clear_project_limit(name);
        let entry = self.rename_into_trash(self.fd.as_fd(), name)?;
        Ok(Trashed::Moved(entry))
    }

    /// Whether volume `name` can leave its place by a rename: `None` when it can; otherwise
    /// what was done instead (nothing there, or a non-directory unlinked). Refuses when a
    /// filesystem is mounted on or inside the volume.
    pub(super) fn check_movable(&self, name: &VolumeDirName) -> Result<Option<Trashed>, PoolError> {
        let path = self.volume_path(name);
        match inode_at(self.fd.as_fd(), name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => return Ok(Some(Trashed::AlreadyGone)),
            Err(e) => return Err(fs_error("stat the volume directory", path, e)),
            Ok(inode) if inode.file_type() != FileType::Directory => {
                return match self.remove_volume_dir(name)? {
                    Removal::AlreadyGone => Ok(Some(Trashed::AlreadyGone)),
                    Removal::Removed { .. } => Ok(Some(Trashed::Unlinked)),
                };
            }
            Ok(inode) if self.is_foreign_mount(&inode) && !self.is_own_subvolume(&inode) => {
                return Err(PoolError::MountInsideVolume { path });
            }
            Ok(_) => {}
        }
        if let Some(mount) = self.mount_under(&path)? {
            return Err(PoolError::MountInsideVolume { path: mount });
        }
        Ok(None)
    }

    /// Whether directory `name` is there and may be renamed within its parent (no filesystem
    /// mounted on or inside it); unlike [`PoolRoot::check_movable`], something else at its place
    /// is left as it is and answers `false`.
    pub(super) fn check_renamable(&self, name: &VolumeDirName) -> Result<bool, PoolError> {
        let path = self.volume_path(name);
        match inode_at(self.fd.as_fd(), name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => Ok(false),
            Err(e) => Err(fs_error("stat the directory", path, e)),
            Ok(inode) if inode.file_type() != FileType::Directory => Ok(false),
            Ok(inode) if self.is_foreign_mount(&inode) && !self.is_own_subvolume(&inode) => {
                Err(PoolError::MountInsideVolume { path })
            }
            Ok(_) => match self.mount_under(&path)? {
                Some(mount) => Err(PoolError::MountInsideVolume { path: mount }),
                None => Ok(true),
            },
        }
    }

    /// Renames `name` under `from` into the trash under a fresh entry name, and returns it.
    pub(super) fn rename_into_trash(
        &self,
        from: std::os::fd::BorrowedFd<'_>,
        name: &VolumeDirName,
    ) -> Result<String, PoolError> {
        let trash = self.open_trash(true)?;
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let entry = format!("{nanos}-{}", SEQUENCE.fetch_add(1, Ordering::Relaxed));
        rustix::fs::renameat(from, name.as_str(), &trash, entry.as_str())
            .map_err(|e| fs_error("move the volume to the trash", self.volume_path(name), e))?;
        Ok(entry)
    }

    /// Moves volume `dir` of PV `pv` aside while the API server is asked to delete the PV:
    /// renamed (atomically, never following a symlink) to `.hpp-deleting/<node>/<pv>/<dir>`,
    /// where the purge never looks. Its fate is [`PoolRoot::commit_staged`] once the PV is gone,
    /// or [`PoolRoot::restore_staged`] when the PV stays. The same checks as
    /// [`PoolRoot::move_to_trash`] apply; its project quota limit stays until committed.
    pub fn stage_deletion(
        &self,
        node: &VolumeDirName,
        pv: &VolumeDirName,
        dir: &VolumeDirName,
    ) -> Result<Staged, PoolError> {
        match self.check_movable(dir)? {
            Some(Trashed::AlreadyGone) => return Ok(Staged::AlreadyGone),
            Some(_) => return Ok(Staged::Unlinked),
            None => {}
        }
        let staged = StagedVolume { node: node.clone(), pv: pv.clone(), dir: dir.clone() };
        let pv_dir = self.open_staged_pv_dir(&staged, true)?;
        match rustix::fs::renameat(&self.fd, dir.as_str(), &pv_dir, dir.as_str()) {
            Ok(()) => Ok(Staged::Moved(staged)),
            // Another node of a shared pool moved it first: leave no empty staging level behind.
            Err(Errno::NOENT) => {
                drop(pv_dir);
                self.remove_staged_pv_dir(&staged);
                Ok(Staged::AlreadyGone)
            }
            Err(e) => Err(fs_error("stage the volume for deletion", self.volume_path(dir), e)),
        }
    }

    /// Refuses unless the staged volume carries the marker of its PV (a `pathPattern`
    /// directory; `filesystem::marker`).
    pub fn check_staged_marker(&self, staged: &StagedVolume) -> Result<(), PoolError> {
        let pv_dir = self.open_staged_pv_dir(staged, false)?;
        self.check_marker_beneath(pv_dir.as_fd(), staged.dir.as_str(), self.staged_path(staged), staged.pv.as_str())
    }

    /// The PV of a staged volume is gone: the volume moves into the trash (its project quota
    /// limit cleared) and its data is purged in the background. Returns the trash entry, or None
    /// when nothing was staged there (already committed or restored).
    pub fn commit_staged(&self, staged: &StagedVolume) -> Result<Option<String>, PoolError> {
        let pv_dir = match self.open_staged_pv_dir(staged, false) {
            Ok(fd) => fd,
            Err(PoolError::RootMissing { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let entry = match self.rename_into_trash(pv_dir.as_fd(), &staged.dir) {
            Ok(entry) => Some(entry),
            Err(PoolError::Io { source: Errno::NOENT, .. }) => None,
            Err(e) => return Err(e),
        };
        if let Some(entry) = &entry
            && let Ok(Some(trash)) = self.trash_root()
            && let Ok(name) = VolumeDirName::new(entry)
        {
            trash.clear_project_limit(&name);
        }
        self.remove_staged_pv_dir(staged);
        Ok(entry)
    }

    /// The PV of a staged volume stays (or may): the volume goes back to its place, unchanged.
    /// Something else at its place meanwhile is never replaced: the volume then stays staged
    /// and the error says where it is.
    pub fn restore_staged(&self, staged: &StagedVolume) -> Result<(), PoolError> {
        let pv_dir = match self.open_staged_pv_dir(staged, false) {
            Ok(fd) => fd,
            Err(PoolError::RootMissing { .. }) => return Ok(()),
            Err(e) => return Err(e),
        };
        let put_back = || {
            rustix::fs::renameat_with(
                &pv_dir,
                staged.dir.as_str(),
                &self.fd,
                staged.dir.as_str(),
                rustix::fs::RenameFlags::NOREPLACE,
            )
        };
        match put_back() {
            Ok(()) | Err(Errno::NOENT) => {}
            // Something took the place meanwhile. An empty directory there (a provisioner that
            // made the directory again) gives way, and an empty staged one is dropped: rmdir
            // removes nothing but an empty directory. Data on both sides stays as it is.
            Err(Errno::EXIST | Errno::NOTEMPTY) => {
                let occupant_gone = rustix::fs::unlinkat(&self.fd, staged.dir.as_str(), AtFlags::REMOVEDIR).is_ok();
                let settled = (occupant_gone && put_back().is_ok())
                    || rustix::fs::unlinkat(&pv_dir, staged.dir.as_str(), AtFlags::REMOVEDIR).is_ok();
                if !settled {
                    return Err(PoolError::StagedPlaceTaken {
                        path: self.volume_path(&staged.dir),
                        staged: self.staged_path(staged),
                    });
                }
            }
            Err(e) => return Err(fs_error("restore the staged volume", self.staged_path(staged), e)),
        }
        self.remove_staged_pv_dir(staged);
        Ok(())
    }

    /// Volumes this node left staged (a crash between staging and committing or restoring).
    /// Empty leftovers of a finished commit or restore are removed on the way.
    pub fn staged_deletions(&self, node: &VolumeDirName) -> Result<Vec<StagedVolume>, PoolError> {
        let mut path = self.path.join(STAGING_DIR);
        let Some(staging) = self.open_own_dir(self.fd.as_fd(), STAGING_DIR, &path, false)? else {
            return Ok(Vec::new());
        };
        path.push(node.as_str());
        let Some(node_dir) = self.open_own_dir(staging.as_fd(), node.as_str(), &path, false)? else {
            return Ok(Vec::new());
        };
        let mut staged = Vec::new();
        for pv in list_dir(&node_dir, &path)? {
            // Only what this provisioner stages: a level named after a PV, holding that PV's
            // directory under a name of a known layout. Anything else is not ours to move.
            let Ok(pv) = VolumeDirName::new(&pv) else { continue };
            if layout::uid_from_pv_name(pv.as_str()).is_none() {
                tracing::warn!(pool = %self.name, entry = %path.join(pv.as_str()).display(), "not a deletion this provisioner staged; left alone");
                continue;
            }
            let pv_path = path.join(pv.as_str());
            let pv_dir = match self.open_own_dir(node_dir.as_fd(), pv.as_str(), &pv_path, false) {
                Ok(Some(fd)) => fd,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(pool = %self.name, %error, "a deletion staging level is not ours; left alone");
                    continue;
                }
            };
            let dirs = list_dir(&pv_dir, &pv_path)?;
            if dirs.is_empty() {
                let _ = rustix::fs::unlinkat(&node_dir, pv.as_str(), AtFlags::REMOVEDIR);
            }
            for dir in dirs {
                let Ok(dir) = VolumeDirName::new(&dir) else { continue };
                let volume = StagedVolume { node: node.clone(), pv: pv.clone(), dir };
                if !layout::matches_layout(volume.dir.as_str(), pv.as_str()) {
                    // A pathPattern directory: settled as its PV's only while its marker names
                    // that PV. Taken over meanwhile (marked for another), it goes back to its
                    // place, never to the trash.
                    match self.check_marker_beneath(
                        pv_dir.as_fd(),
                        volume.dir.as_str(),
                        self.staged_path(&volume),
                        pv.as_str(),
                    ) {
                        Ok(()) => {}
                        Err(PoolError::NotMarkedFor { found: Some(other), .. }) => {
                            let back = self.restore_staged(&volume);
                            tracing::warn!(pool = %self.name, entry = %self.staged_path(&volume).display(), marked_for = %other, result = ?back, "a staged pathPattern directory was taken over by another volume; put back");
                            continue;
                        }
                        Err(_) => {
                            tracing::warn!(pool = %self.name, entry = %pv_path.join(volume.dir.as_str()).display(), "not a volume this provisioner staged; left alone");
                            continue;
                        }
                    }
                }
                staged.push(volume);
            }
        }
        if staged.is_empty() {
            drop(node_dir);
            self.remove_empty_staging(&staging, node);
        }
        Ok(staged)
    }

    /// Whether any node has the volume of PV `pv` staged for deletion on this pool (on a shared
    /// pool every node's staging is visible here): while one has, its fate is that node's to
    /// settle, and no other node may let the PV go for want of a directory.
    pub fn staged_by_any_node(&self, pv: &VolumeDirName) -> Result<bool, PoolError> {
        let path = self.path.join(STAGING_DIR);
        let Some(staging) = self.open_own_dir(self.fd.as_fd(), STAGING_DIR, &path, false)? else { return Ok(false) };
        for node in list_dir(&staging, &path)? {
            let node_path = path.join(&node);
            let Some(node_dir) = self.open_own_dir(staging.as_fd(), &node, &node_path, false)? else { continue };
            let pv_path = node_path.join(pv.as_str());
            if let Some(pv_dir) = self.open_own_dir(node_dir.as_fd(), pv.as_str(), &pv_path, false)?
                && !list_dir(&pv_dir, &pv_path)?.is_empty()
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Every staged volume of the pool (all nodes'), opened for reading: their project ids stay
    /// taken while they wait, since they may come back or go to the trash with their id.
    pub fn staged_volume_dirs(&self) -> Result<Vec<std::os::fd::OwnedFd>, PoolError> {
        let path = self.path.join(STAGING_DIR);
        let Some(staging) = self.open_own_dir(self.fd.as_fd(), STAGING_DIR, &path, false)? else {
            return Ok(Vec::new());
        };
        let mut dirs = Vec::new();
        for node in list_dir(&staging, &path)? {
            let node_path = path.join(&node);
            let Ok(Some(node_dir)) = self.open_own_dir(staging.as_fd(), &node, &node_path, false) else { continue };
            for pv in list_dir(&node_dir, &node_path)? {
                let pv_path = node_path.join(&pv);
                let Ok(Some(pv_dir)) = self.open_own_dir(node_dir.as_fd(), &pv, &pv_path, false) else { continue };
                for dir in list_dir(&pv_dir, &pv_path)? {
                    if let Ok(fd) = self.open_beneath(pv_dir.as_fd(), dir.as_str(), rustix::fs::OFlags::RDONLY) {
                        dirs.push(fd);
                    }
                }
            }
        }
        Ok(dirs)
    }

    /// Bytes a staged volume holds on disk (for reports of stranded data).
    pub fn staged_bytes(&self, staged: &StagedVolume) -> Result<u64, PoolError> {
        let pv_dir = self.open_staged_pv_dir(staged, false)?;
        let mut total = 0;
        self.add_bytes(pv_dir, &self.staged_path(staged), &mut total)?;
        Ok(total)
    }

    /// Makes sure the trash can take a volume (it exists, or is made, as a plain directory of the
    /// pool's own mount), before anything is let go: a deletion is refused while it cannot.
    pub fn ensure_trash(&self) -> Result<(), PoolError> {
        self.open_trash(true).map(|_| ())
    }

    /// Where a staged volume is, for messages.
    pub fn staged_path(&self, staged: &StagedVolume) -> std::path::PathBuf {
        self.path.join(STAGING_DIR).join(staged.node.as_str()).join(staged.pv.as_str()).join(staged.dir.as_str())
    }

    /// Opens `.hpp-deleting/<node>/<pv>` (creating each level when asked), refusing symlinks
    /// and mounts on the way. Levels emptied by another deletion's cleanup meanwhile (ENOENT)
    /// are made again.
    fn open_staged_pv_dir(&self, staged: &StagedVolume, create: bool) -> Result<std::os::fd::OwnedFd, PoolError> {
        let mut attempts = 0;
        loop {
            match self.try_open_staged_pv_dir(staged, create) {
                Err(PoolError::RootMissing { .. }) if create && attempts < MAX_STAGING_ATTEMPTS => attempts += 1,
                result => return result,
            }
        }
    }

    fn try_open_staged_pv_dir(&self, staged: &StagedVolume, create: bool) -> Result<std::os::fd::OwnedFd, PoolError> {
        let mut fd: Option<std::os::fd::OwnedFd> = None;
        let mut path = self.path.clone();
        for level in [STAGING_DIR, staged.node.as_str(), staged.pv.as_str()] {
            path.push(level);
            let parent = fd.as_ref().map_or(self.fd.as_fd(), |fd| fd.as_fd());
            match self.open_own_dir(parent, level, &path, create)? {
                Some(opened) => fd = Some(opened),
                None => return Err(PoolError::RootMissing { pool: self.name.clone(), path }),
            }
        }
        Ok(fd.expect("three levels opened"))
    }

    /// Removes the (now empty) `.hpp-deleting/<node>/<pv>` of a committed or restored volume,
    /// and the levels above when nothing else is staged, so that an idle pool holds no staging
    /// directory. rmdir never removes a non-empty directory; a failure leaves an empty one that
    /// the next deletion or start-up removes.
    fn remove_staged_pv_dir(&self, staged: &StagedVolume) {
        let path = self.path.join(STAGING_DIR);
        let Ok(Some(staging)) = self.open_own_dir(self.fd.as_fd(), STAGING_DIR, &path, false) else { return };
        let node_path = path.join(staged.node.as_str());
        if let Ok(Some(node)) = self.open_own_dir(staging.as_fd(), staged.node.as_str(), &node_path, false) {
            let _ = rustix::fs::unlinkat(&node, staged.pv.as_str(), AtFlags::REMOVEDIR);
        }
        self.remove_empty_staging(&staging, &staged.node);
    }

    /// Removes this node's staging directory and the staging root if they are empty.
    fn remove_empty_staging(&self, staging: &std::os::fd::OwnedFd, node: &VolumeDirName) {
        if rustix::fs::unlinkat(staging, node.as_str(), AtFlags::REMOVEDIR).is_ok() {
            let _ = rustix::fs::unlinkat(&self.fd, STAGING_DIR, AtFlags::REMOVEDIR);
        }
    }

    /// Removes everything in the trash; returns how many entries went. Entries that cannot be
    /// removed (e.g. a mount that appeared meanwhile) stay and are reported in the error of the
    /// first one; the others are still removed.
    pub fn purge_trash(&self) -> Result<u64, PoolError> {
        let Some(trash) = self.trash_root()? else { return Ok(0) };
        let mut removed = 0;
        let mut first_error = None;
        for entry in trash.list_entries()? {
            let Ok(name) = VolumeDirName::new(&entry) else { continue };
            if !is_trash_entry(&entry) {
                // Not a name this provisioner gives: someone else put it there. Left alone.
                tracing::warn!(pool = %self.name, entry, "an entry in the trash that this provisioner did not put there; left alone");
                continue;
            }
            match trash.remove_volume_dir(&name) {
                Ok(_) => removed += 1,
                Err(error) => {
                    tracing::warn!(pool = %self.name, entry, %error, "cannot remove a trashed volume");
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(removed),
        }
    }

    /// Bytes the trash holds on disk (allocated blocks, so sparse files count what they use).
    pub fn trash_bytes(&self) -> Result<u64, PoolError> {
        self.bytes_under(TRASH_DIR)
    }

    /// Bytes a directory directly under the root holds on disk. Read by path and never following
    /// a symlink: it only looks. 0 when there is no such directory.
    pub fn bytes_under(&self, entry: &str) -> Result<u64, PoolError> {
        let path = self.path.join(entry);
        let dir = match self.open_own_dir(self.fd.as_fd(), entry, &path, false) {
            Ok(Some(fd)) => fd,
            Ok(None) | Err(PoolError::BookkeepingReplaced { .. }) => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut total = 0;
        self.add_bytes(dir, &path, &mut total)?;
        Ok(total)
    }

    /// Adds the allocated bytes of everything below the open directory `dir`, descending only
    /// into directories of the pool's own mount (descriptor by descriptor, never by path).
    fn add_bytes(&self, dir: std::os::fd::OwnedFd, path: &std::path::Path, total: &mut u64) -> Result<(), PoolError> {
        for name in list_dir(&dir, path)? {
            let Ok(st) = rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) else { continue };
            *total += u64::try_from(st.st_blocks).unwrap_or(0) * 512;
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory
                && st.st_dev == self.dev
                && let Ok(sub) = self.open_beneath(dir.as_fd(), name.as_str(), rustix::fs::OFlags::RDONLY)
            {
                self.add_bytes(sub, &path.join(&name), total)?;
            }
        }
        Ok(())
    }

    /// The trash's entries with how long ago each last changed (for the doctor), read through
    /// the trash's descriptor.
    pub fn trash_entries(&self) -> Result<Vec<(String, Option<std::time::Duration>)>, PoolError> {
        let Some(trash) = self.trash_root()? else { return Ok(Vec::new()) };
        let mut entries = Vec::new();
        for entry in trash.list_entries()? {
            let age = VolumeDirName::new(&entry).ok().and_then(|name| trash.entry_age(&name).ok().flatten());
            entries.push((entry, age));
        }
        Ok(entries)
    }

    /// Entries waiting in the trash.
    pub fn trash_pending(&self) -> Result<usize, PoolError> {
        Ok(match self.trash_root()? {
            Some(trash) => trash.list_entries()?.len(),
            None => 0,
        })
    }

    /// The trash directory as a pool root of its own (so removal inside it has every guarantee
    /// of a volume removal), or None when there is no trash yet.
    pub(super) fn trash_root(&self) -> Result<Option<PoolRoot>, PoolError> {
        let path = self.path.join(TRASH_DIR);
        match self.open_own_dir(self.fd.as_fd(), TRASH_DIR, &path, false)? {
            Some(fd) => self.sub_root(fd, "trash", path).map(Some),
            None => Ok(None),
        }
    }

    /// Opens (creating it when asked) the trash directory beneath the root (see
    /// [`PoolRoot::open_own_dir`]).
    fn open_trash(&self, create: bool) -> Result<std::os::fd::OwnedFd, PoolError> {
        let path = self.path.join(TRASH_DIR);
        self.open_own_dir(self.fd.as_fd(), TRASH_DIR, &path, create)?
            .ok_or(PoolError::RootMissing { pool: self.name.clone(), path })
    }

    /// The first mount point at or below `path` in the mount table, if any.
    fn mount_under(&self, path: &std::path::Path) -> Result<Option<std::path::PathBuf>, PoolError> {
        let canonical =
            std::fs::canonicalize(&self.path).map(|root| root.join(path.strip_prefix(&self.path).unwrap_or(path)));
        let path = canonical.unwrap_or_else(|_| path.to_owned());
        let mounts = read_mount_table()?;
        Ok(crate::deciding::mount_table::first_mount_at_or_below(&mounts, &path).map(|m| m.mount_point.clone()))
    }
}

/// Whether `name` is of the form this provisioner gives trash entries: `<nanoseconds>-<sequence>`.
fn is_trash_entry(name: &str) -> bool {
    name.split_once('-').is_some_and(|(nanos, sequence)| {
        !nanos.is_empty()
            && !sequence.is_empty()
            && nanos.bytes().all(|b| b.is_ascii_digit())
            && sequence.bytes().all(|b| b.is_ascii_digit())
    })
}

/// Names in an opened directory ("." and ".." left out; names that are not UTF-8 skipped: this
/// provisioner never makes them).
fn list_dir(fd: &std::os::fd::OwnedFd, path: &std::path::Path) -> Result<Vec<String>, PoolError> {
    let list_error = |e| fs_error("list the deletion staging directory", path.to_owned(), e);
    let mut dir = rustix::fs::Dir::read_from(fd).map_err(list_error)?;
    let mut names = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(list_error)?;
        let name = entry.file_name();
        if name != c"."
            && name != c".."
            && let Ok(name) = name.to_str()
        {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn pool() -> (tempfile::TempDir, PoolRoot) {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir(tmp.path().join("pool")).unwrap();
        let pool = PoolRoot::open("legacy", &tmp.path().join("pool")).unwrap();
        (tmp, pool)
    }

    fn name(s: &str) -> VolumeDirName {
        VolumeDirName::new(s).unwrap()
    }

    #[test]
    fn a_volume_moves_to_the_trash_and_is_purged_later() {
        let (tmp, pool) = pool();
        let vol = tmp.path().join("pool/pvc-a");
        std::fs::create_dir_all(vol.join("deep/er")).unwrap();
        std::fs::write(vol.join("deep/er/file"), b"x").unwrap();
        let Trashed::Moved(entry) = pool.move_to_trash(&name("pvc-a")).unwrap() else { panic!("not moved") };
        assert!(!vol.exists(), "the volume name is free at once");
        assert!(tmp.path().join("pool").join(TRASH_DIR).join(&entry).join("deep/er/file").exists());
        assert_eq!(pool.trash_pending().unwrap(), 1);
        assert_eq!(pool.purge_trash().unwrap(), 1);
        assert_eq!(pool.trash_pending().unwrap(), 0);
        assert_eq!(pool.move_to_trash(&name("pvc-a")).unwrap(), Trashed::AlreadyGone);
    }

    /// A PV name of the form the API server's uids give (`pvc-<uid>`), made from a short tag.
    fn pvn(tag: &str) -> String {
        let hash = tag.bytes().fold(0u32, |a, b| a.wrapping_mul(31).wrapping_add(u32::from(b)));
        format!("pvc-{hash:08x}-0000-4000-8000-000000000000")
    }

    fn staged(pool: &PoolRoot, node: &str, pv: &str, dir: &str) -> Staged {
        pool.stage_deletion(&name(node), &name(pv), &name(dir)).unwrap()
    }

    fn volume_with_data(tmp: &tempfile::TempDir, dir: &str) -> std::path::PathBuf {
        let vol = tmp.path().join("pool").join(dir);
        std::fs::create_dir_all(vol.join("sub")).unwrap();
        std::fs::write(vol.join("sub/file"), b"data").unwrap();
        vol
    }

    #[test]
    fn a_staged_volume_leaves_its_place_and_is_never_purged_until_committed() {
        let (tmp, pool) = pool();
        let vol = volume_with_data(&tmp, "data-pvc-a");
        let Staged::Moved(entry) = staged(&pool, "node-a", "pvc-a", "data-pvc-a") else { panic!("not staged") };
        assert!(!vol.exists(), "the volume name is free at once");
        let at = tmp.path().join("pool").join(STAGING_DIR).join("node-a/pvc-a/data-pvc-a");
        assert_eq!(pool.staged_path(&entry), at);
        assert_eq!(std::fs::read(at.join("sub/file")).unwrap(), b"data");
        assert_eq!(pool.purge_trash().unwrap(), 0, "the purge never touches a staged volume");
        assert_eq!(pool.trash_pending().unwrap(), 0);
        assert!(at.join("sub/file").exists());
        let trash_entry = pool.commit_staged(&entry).unwrap().expect("committed");
        assert!(!at.exists());
        assert!(!tmp.path().join("pool").join(STAGING_DIR).exists(), "no empty leftover");
        assert!(tmp.path().join("pool").join(TRASH_DIR).join(&trash_entry).join("sub/file").exists());
        assert_eq!(pool.purge_trash().unwrap(), 1);
        assert_eq!(pool.commit_staged(&entry).unwrap(), None, "a second commit finds nothing");
    }

    #[test]
    fn a_restored_volume_is_back_in_its_place_with_its_data() {
        let (tmp, pool) = pool();
        let vol = volume_with_data(&tmp, "pvc-b");
        let Staged::Moved(entry) = staged(&pool, "node-a", "pvc-b", "pvc-b") else { panic!("not staged") };
        pool.restore_staged(&entry).unwrap();
        assert_eq!(std::fs::read(vol.join("sub/file")).unwrap(), b"data");
        assert!(!tmp.path().join("pool").join(STAGING_DIR).exists(), "no empty leftover");
        assert_eq!(pool.staged_deletions(&name("node-a")).unwrap(), Vec::new());
        pool.restore_staged(&entry).unwrap();
        assert!(vol.join("sub/file").exists(), "a second restore changes nothing");
    }

    #[test]
    fn a_restore_never_replaces_what_took_the_volumes_place() {
        let (tmp, pool) = pool();
        volume_with_data(&tmp, &pvn("c"));
        let Staged::Moved(entry) = staged(&pool, "node-a", &pvn("c"), &pvn("c")) else { panic!("not staged") };
        std::fs::create_dir(tmp.path().join("pool").join(pvn("c"))).unwrap();
        std::fs::write(tmp.path().join("pool").join(pvn("c")).join("newer"), b"n").unwrap();
        let result = pool.restore_staged(&entry);
        assert!(matches!(result, Err(PoolError::StagedPlaceTaken { .. })), "{result:?}");
        assert!(tmp.path().join("pool").join(pvn("c")).join("newer").exists(), "what is there stays");
        assert!(pool.staged_path(&entry).join("sub/file").exists(), "the staged volume stays staged");
        assert_eq!(pool.staged_deletions(&name("node-a")).unwrap(), vec![entry]);
    }

    #[test]
    fn leftovers_are_listed_per_node_and_empty_ones_cleared() {
        let (tmp, pool) = pool();
        volume_with_data(&tmp, &pvn("d"));
        volume_with_data(&tmp, &pvn("e"));
        let Staged::Moved(mine) = staged(&pool, "node-a", &pvn("d"), &pvn("d")) else { panic!("not staged") };
        let Staged::Moved(theirs) = staged(&pool, "node-b", &pvn("e"), &pvn("e")) else { panic!("not staged") };
        // A crash between a commit's rename and its cleanup leaves an empty PV directory.
        let empty = tmp.path().join("pool").join(STAGING_DIR).join("node-a").join(pvn("gone"));
        std::fs::create_dir(&empty).unwrap();
        assert_eq!(pool.staged_deletions(&name("node-a")).unwrap(), vec![mine.clone()]);
        assert!(!empty.exists());
        assert_eq!(pool.staged_deletions(&name("node-b")).unwrap(), vec![theirs.clone()]);
        assert_eq!(pool.staged_deletions(&name("node-c")).unwrap(), Vec::new());
        assert_eq!(pool.staged_volume_dirs().unwrap().len(), 2, "every node's staged volume counts");
        // Settling one node's leftover keeps the other node's staged.
        pool.restore_staged(&mine).unwrap();
        assert_eq!(pool.staged_deletions(&name("node-a")).unwrap(), Vec::new());
        assert!(!tmp.path().join("pool").join(STAGING_DIR).join("node-a").exists());
        assert_eq!(pool.staged_deletions(&name("node-b")).unwrap(), vec![theirs.clone()]);
        pool.commit_staged(&theirs).unwrap();
        assert!(!tmp.path().join("pool").join(STAGING_DIR).exists(), "an idle pool holds no staging directory");
        assert_eq!(pool.staged_volume_dirs().unwrap().len(), 0);
    }

    #[test]
    fn concurrent_deletions_never_lose_a_staging_level_to_each_others_cleanup() {
        let (tmp, pool) = pool();
        let per_thread = 25;
        for t in 0..4 {
            for i in 0..per_thread {
                volume_with_data(&tmp, &format!("pvc-{t}-{i}"));
            }
        }
        std::thread::scope(|scope| {
            for t in 0..4 {
                let pool = &pool;
                scope.spawn(move || {
                    for i in 0..per_thread {
                        let dir = format!("pvc-{t}-{i}");
                        let Staged::Moved(entry) = staged(pool, "node-a", &dir, &dir) else {
                            panic!("{dir} not staged")
                        };
                        if i % 2 == 0 {
                            pool.commit_staged(&entry).unwrap().expect("committed");
                        } else {
                            pool.restore_staged(&entry).unwrap();
                        }
                    }
                });
            }
        });
        let restored = entries_of(&tmp.path().join("pool")).into_iter().filter(|e| e.starts_with("pvc-")).count();
        assert_eq!(restored, 4 * (per_thread / 2), "every odd one is back");
        assert_eq!(pool.trash_pending().unwrap(), 4 * per_thread.div_ceil(2));
        assert!(!tmp.path().join("pool").join(STAGING_DIR).exists(), "nothing left staged");
    }

    fn entries_of(dir: &std::path::Path) -> Vec<String> {
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn staging_checks_like_the_trash() {
        let (tmp, pool) = pool();
        assert_eq!(staged(&pool, "node-a", "pvc-f", "pvc-f"), Staged::AlreadyGone);
        std::fs::create_dir(tmp.path().join("outside")).unwrap();
        std::fs::write(tmp.path().join("outside/keep"), b"k").unwrap();
        symlink(tmp.path().join("outside"), tmp.path().join("pool/pvc-g")).unwrap();
        assert_eq!(staged(&pool, "node-a", "pvc-g", "pvc-g"), Staged::Unlinked);
        assert!(tmp.path().join("outside/keep").exists(), "a symlink is never followed");
        // A symlinked staging directory is refused: nothing moves through it.
        volume_with_data(&tmp, "pvc-h");
        std::fs::create_dir(tmp.path().join("elsewhere")).unwrap();
        symlink(tmp.path().join("elsewhere"), tmp.path().join("pool").join(STAGING_DIR)).unwrap();
        assert!(pool.stage_deletion(&name("node-a"), &name("pvc-h"), &name("pvc-h")).is_err());
        assert!(pool.staged_deletions(&name("node-a")).is_err(), "never listed through a symlink");
        assert!(tmp.path().join("pool/pvc-h/sub/file").exists(), "nothing moved");
        assert_eq!(std::fs::read_dir(tmp.path().join("elsewhere")).unwrap().count(), 0);
    }

    #[test]
    fn a_symlinked_volume_is_unlinked_and_its_target_kept() {
        let (tmp, pool) = pool();
        std::fs::create_dir(tmp.path().join("outside")).unwrap();
        std::fs::write(tmp.path().join("outside/keep"), b"k").unwrap();
        symlink(tmp.path().join("outside"), tmp.path().join("pool/pvc-b")).unwrap();
        assert_eq!(pool.move_to_trash(&name("pvc-b")).unwrap(), Trashed::Unlinked);
        assert!(tmp.path().join("outside/keep").exists());
        assert_eq!(pool.trash_pending().unwrap(), 0);
    }

    #[test]
    fn a_symlinked_trash_directory_is_refused() {
        let (tmp, pool) = pool();
        std::fs::create_dir(tmp.path().join("elsewhere")).unwrap();
        symlink(tmp.path().join("elsewhere"), tmp.path().join("pool").join(TRASH_DIR)).unwrap();
        std::fs::create_dir(tmp.path().join("pool/pvc-c")).unwrap();
        assert!(pool.move_to_trash(&name("pvc-c")).is_err());
        assert!(tmp.path().join("pool/pvc-c").is_dir(), "nothing moved");
        assert!(pool.purge_trash().is_err(), "a symlinked trash is never walked");
    }

    #[test]
    fn a_mount_inside_the_volume_blocks_the_move() {
        let (tmp, pool) = pool();
        let mnt = tmp.path().join("pool/pvc-d/mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        rustix::mount::mount("tmpfs", &mnt, "tmpfs", rustix::mount::MountFlags::empty(), None).unwrap();
        let result = pool.move_to_trash(&name("pvc-d"));
        rustix::mount::unmount(&mnt, rustix::mount::UnmountFlags::DETACH).unwrap();
        assert!(matches!(result, Err(PoolError::MountInsideVolume { .. })), "{result:?}");
        assert!(tmp.path().join("pool/pvc-d").is_dir(), "nothing moved");
    }
}

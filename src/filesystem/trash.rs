//! Fast reclaim (docs/architecture.md, deletion rules): a released volume is renamed into a trash directory on the
//! same filesystem, so its PV can go at once, and its data is removed in the background, with
//! the same fd-based walk as a direct removal. The trash survives restarts and is purged again.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use rustix::fs::{AtFlags, FileType, Mode};
use rustix::io::Errno;

use super::{PoolError, PoolRoot, Removal, VolumeDirName, fs_error, inode_at, read_mount_table};

/// Name of the trash directory directly under a pool root. It starts with a dot so that it never
/// matches a volume layout (and the orphan cleanup ignores it).
pub const TRASH_DIR: &str = ".hpp-trash";

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

impl PoolRoot {
    /// Moves the volume directory into the pool's trash directory, atomically and without
    /// following symlinks. Refuses (and moves nothing) when a filesystem is mounted on or
    /// inside the volume, so that a later background removal never meets one.
    pub fn move_to_trash(&self, name: &VolumeDirName) -> Result<Trashed, PoolError> {
        let path = self.volume_path(name);
        match inode_at(self.fd.as_fd(), name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Err(Errno::NOENT) => return Ok(Trashed::AlreadyGone),
            Err(e) => return Err(fs_error("stat the volume directory", path, e)),
            Ok(inode) if inode.file_type() != FileType::Directory => {
                return match self.remove_volume_dir(name)? {
                    Removal::AlreadyGone => Ok(Trashed::AlreadyGone),
                    Removal::Removed { .. } => Ok(Trashed::Unlinked),
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
        // The data keeps its project id until purged (so the id is not given out again while it
        // is charged); its limit goes now.
        self.clear_project_limit(name);
        let trash = self.open_trash(true)?;
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let entry = format!("{nanos}-{}", SEQUENCE.fetch_add(1, Ordering::Relaxed));
        rustix::fs::renameat(&self.fd, name.as_str(), &trash, entry.as_str())
            .map_err(|e| fs_error("move the volume to the trash", path, e))?;
        Ok(Trashed::Moved(entry))
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
        fn walk(dir: &std::path::Path, total: &mut u64) -> std::io::Result<()> {
            for entry in std::fs::read_dir(dir)? {
                let entry = entry?;
                let meta = entry.path().symlink_metadata()?;
                *total += std::os::unix::fs::MetadataExt::blocks(&meta) * 512;
                if meta.file_type().is_dir() {
                    walk(&entry.path(), total)?;
                }
            }
            Ok(())
        }
        let dir = self.path.join(entry);
        match dir.symlink_metadata() {
            Ok(meta) if meta.file_type().is_dir() => {}
            _ => return Ok(0),
        }
        let mut total = 0;
        walk(&dir, &mut total)
            .map_err(|e| fs_error("measure a directory", dir.clone(), Errno::from_io_error(&e).unwrap_or(Errno::IO)))?;
        Ok(total)
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
        match self.open_trash(false) {
            Ok(_) => {}
            Err(PoolError::RootMissing { .. }) => return Ok(None),
            Err(e) => return Err(e),
        }
        let trash = PoolRoot::open(&format!("{}-trash", self.name), &self.path.join(TRASH_DIR))?;
        if trash.dev != self.dev {
            return Err(PoolError::MountInsideVolume { path: trash.path.clone() });
        }
        Ok(Some(trash))
    }

    /// Opens (creating it when asked) the trash directory beneath the root, refusing a symlink.
    fn open_trash(&self, create: bool) -> Result<std::os::fd::OwnedFd, PoolError> {
        let path = self.path.join(TRASH_DIR);
        if create {
            match rustix::fs::mkdirat(&self.fd, TRASH_DIR, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(fs_error("create the trash directory", path, e)),
            }
        }
        match self.open_beneath(self.fd.as_fd(), TRASH_DIR, rustix::fs::OFlags::RDONLY) {
            Ok(fd) => Ok(fd),
            Err(Errno::NOENT) => Err(PoolError::RootMissing { pool: self.name.clone(), path }),
            Err(Errno::LOOP | Errno::NOTDIR | Errno::XDEV) => Err(PoolError::VolumeNotDirectory { path }),
            Err(e) => Err(fs_error("open the trash directory", path, e)),
        }
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

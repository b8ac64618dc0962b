//! Quota volumes at the filesystem edge: what a pool can enforce, btrfs subvolumes with a
//! qgroup limit as volumes, and on XFS and ext4 directories with a project id of their own and a
//! project quota limit.
//!
//! A project quota volume's id lives on its directory (`FS_IOC_FSGETXATTR`), nowhere else: a new
//! volume takes the lowest id from [`PROJECT_ID_BASE`](crate::deciding::quota::PROJECT_ID_BASE) that no directory of the pool or its trash
//! carries, read under a lock held from the scan until the id is on the new directory. One
//! provisioner serves a node-local pool, so a lock in the process is enough; a restart reads the
//! ids back from the directories and never reuses a live one. Deletion clears the limit; the id
//! goes with the directory when the trash is purged.
//!
//! A quota volume on btrfs is a subvolume directly under the pool root (or, once released, under
//! the trash). Its contents are removed with the same descriptor walk as any volume, confined to
//! the subvolume (a mount nested inside stops the removal; a subvolume a workload made inside is
//! emptied and removed with it, its qgroup destroyed), and the emptied
//! subvolume itself goes with `rmdir(2)`, which deletes an empty subvolume. Its qgroup is then
//! destroyed, or left to the kernel when it still holds it (see [`btrfs::destroy_qgroup`]).

pub mod btrfs;
pub mod project;

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::{
    Created, Inode, MAX_ANCHORS, OPEN_DIR_WINDOW, PoolError, PoolRoot, Removal, VolumeDirName, Walker, fs_error,
    inode_at, inode_of,
};
use crate::deciding::quota::{self, FsKind, ProjectQuotaState, QuotaFacts, is_volume_project_id};

/// Held from the scan of used project ids until the chosen one is on the new directory.
static PROJECT_IDS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `XFS_SUPER_MAGIC`.
const XFS_MAGIC: u64 = 0x5846_5342;
/// `EXT4_SUPER_MAGIC` (shared by ext2 and ext3).
const EXT4_MAGIC: u64 = 0xef53;

impl PoolRoot {
    /// What the pool's filesystem, mount and kernel offer for quotas.
    pub fn quota_facts(&self) -> Result<QuotaFacts, PoolError> {
        let fs = self.fs_kind()?;
        let btrfs_quota_enabled = fs == FsKind::Btrfs && self.btrfs_fsid().is_ok_and(|id| btrfs::quota_enabled(&id));
        let project_quota = match fs {
            FsKind::Xfs | FsKind::Ext4 => match self.readable_root() {
                Ok(root) => project::state(&root),
                Err(e) => ProjectQuotaState::Unanswered(e.to_string()),
            },
            _ => ProjectQuotaState::NotAsked,
        };
        Ok(QuotaFacts {
            project_quota,
            project_quota_mounted: matches!(fs, FsKind::Xfs | FsKind::Ext4) && self.mounted_with_project_quota(),
            kernel_xfs_quota: std::path::Path::new("/proc/fs/xfs/xqmstat").exists(),
            btrfs_quota_enabled,
            cap_sys_admin: std::fs::read_to_string("/proc/self/status")
                .is_ok_and(|status| crate::deciding::quota::status_holds_cap_sys_admin(&status)),
            fs,
        })
    }

    /// The pool's filesystem, from `statfs(2)`.
    fn fs_kind(&self) -> Result<FsKind, PoolError> {
        let st = rustix::fs::fstatfs(&self.fd).map_err(|e| fs_error("statfs the pool root", self.path.clone(), e))?;
        #[allow(clippy::unnecessary_cast)] // f_type's width differs between architectures
        let magic = st.f_type as u64;
        Ok(match magic {
            btrfs::SUPER_MAGIC => FsKind::Btrfs,
            XFS_MAGIC => FsKind::Xfs,
            EXT4_MAGIC => FsKind::Ext4,
            other => FsKind::Other(format!("{other:#x}")),
        })
    }

    /// Creates (or finds, on a retry) the volume as a btrfs subvolume with exactly `mode`, and
    /// limits its referenced bytes to `limit_bytes`.
    ///
    /// A plain directory or anything else already at that name is refused and left untouched:
    /// it would silently carry no quota.
    pub fn create_quota_volume(&self, name: &VolumeDirName, mode: u32, limit_bytes: u64) -> Result<Created, PoolError> {
        if mode > 0o7777 {
            return Err(PoolError::InvalidMode { mode });
        }
        let path = self.volume_path(name);
        let root = self.readable_root()?;
        let created = match btrfs::create_subvolume(&root, name.as_str()) {
            Ok(()) => Created::New,
            Err(Errno::EXIST) => Created::Existing,
            Err(e) => return Err(fs_error("create the volume subvolume", path, e)),
        };
        let fd = self.open_subvolume(name)?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
            .map_err(|e| fs_error("set the volume directory mode", path.clone(), e))?;
        if let Err(e) = btrfs::limit_referenced(&fd, limit_bytes) {
            // A subvolume without its limit must not stay behind as a volume: a retry would find
            // it and, if the limit failed again, leave an unlimited subvolume on every attempt.
            // Only one this call made is removed; it is empty, so rmdir(2) takes it.
            if created == Created::New {
                drop(fd);
                if let Err(cleanup) = rustix::fs::unlinkat(&self.fd, name.as_str(), AtFlags::REMOVEDIR) {
                    tracing::warn!(pool = %self.name, volume = %name, error = %cleanup, "cannot remove the subvolume whose limit failed");
                }
            }
            return Err(fs_error("set the volume's qgroup limit", path, e));
        }
        Ok(created)
    }

    /// Whether `name` is a quota volume (a subvolume of this pool, or a directory with a project
    /// id this provisioner gave out), as opposed to a plain directory.
    pub fn is_quota_volume(&self, name: &VolumeDirName) -> bool {
        self.open_subvolume(name).is_ok() || self.volume_project_id(name).is_ok()
    }

    /// Sets the limit of an existing quota volume (expansion, clones): its qgroup limit on
    /// btrfs, its project's limit on XFS and ext4.
    pub fn set_quota_limit(&self, name: &VolumeDirName, limit_bytes: u64) -> Result<(), PoolError> {
        let fs = self.fs_kind()?;
        if matches!(fs, FsKind::Xfs | FsKind::Ext4) {
            let id = self.volume_project_id(name)?;
            return self.set_project_limit(&fs, name, id, limit_bytes);
        }
        let fd = self.open_subvolume(name)?;
        btrfs::limit_referenced(&fd, limit_bytes)
            .map_err(|e| fs_error("set the volume's qgroup limit", self.volume_path(name), e))
    }

    /// Creates (or finds, on a retry) the volume as a directory with exactly `mode` and a project
    /// id of its own, inherited by everything made in it, and limits the project to `limit_bytes`.
    ///
    /// A retry finds the id already on the directory and keeps it; a directory that exists with
    /// files but no id of ours is refused (its contents would not be charged).
    pub fn create_project_volume(
        &self,
        name: &VolumeDirName,
        mode: u32,
        limit_bytes: u64,
    ) -> Result<Created, PoolError> {
        let fs = self.fs_kind()?;
        let path = self.volume_path(name);
        let guard = PROJECT_IDS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let created = self.create_volume_dir(name, mode)?;
        let id = match self.volume_project_id(name) {
            Ok(id) => id,
            Err(_) => {
                let fd = self.open_volume_dir(name)?;
                if created == Created::Existing && !self.list_dir_is_empty(&fd) {
                    return Err(PoolError::NoProjectId { path });
                }
                let used = self.used_project_ids()?;
                let id = quota::free_project_id(&used)
                    .ok_or_else(|| PoolError::ProjectIdsExhausted { pool: self.name.clone() })?;
                project::set_project_id(&fd, id)
                    .map_err(|e| fs_error("set the volume's project id", path.clone(), e))?;
                id
            }
        };
        drop(guard);
        self.set_project_limit(&fs, name, id, limit_bytes)?;
        tracing::debug!(pool = %self.name, volume = %name, id, limit_bytes, "project quota volume ready");
        Ok(created)
    }

    /// The project id of volume `name` when it is one this provisioner gave out.
    fn volume_project_id(&self, name: &VolumeDirName) -> Result<u32, PoolError> {
        let path = self.volume_path(name);
        let fd = self.open_volume_dir(name)?;
        match project::project_id(&fd) {
            Ok(id) if is_volume_project_id(id) => Ok(id),
            Ok(_) | Err(Errno::NOTTY | Errno::NOTSUP | Errno::INVAL) => Err(PoolError::NoProjectId { path }),
            Err(e) => Err(fs_error("read the volume's project id", path, e)),
        }
    }

    fn set_project_limit(&self, fs: &FsKind, name: &VolumeDirName, id: u32, bytes: u64) -> Result<(), PoolError> {
        let root = self.readable_root()?;
        let set = if *fs == FsKind::Xfs {
            project::set_xfs_limit(&root, id, bytes)
        } else {
            project::set_ext4_limit(&root, id, bytes)
        };
        set.map_err(|e| fs_error("set the volume's project quota limit", self.volume_path(name), e))
    }

    /// Removes the project quota limit of volume `name`, if it is a project quota volume; called
    /// before it goes to the trash. A failure is logged: the id stays on the data until it is
    /// purged, and whoever gets the id next sets a limit of its own.
    pub(super) fn clear_project_limit(&self, name: &VolumeDirName) {
        let Ok(fs @ (FsKind::Xfs | FsKind::Ext4)) = self.fs_kind() else { return };
        let Ok(id) = self.volume_project_id(name) else { return };
        match self.set_project_limit(&fs, name, id, 0) {
            Ok(()) => tracing::debug!(pool = %self.name, volume = %name, id, "project quota limit cleared"),
            Err(error) => {
                tracing::warn!(pool = %self.name, volume = %name, id, %error, "cannot clear the project quota limit")
            }
        }
    }

    /// Project ids carried by the directories of the pool, of its deletion staging and of its
    /// trash (ours and others'), scanned in the order volumes move on deletion.
    fn used_project_ids(&self) -> Result<std::collections::BTreeSet<u32>, PoolError> {
        let mut used = std::collections::BTreeSet::new();
        let mut scan = |root: &PoolRoot| -> Result<(), PoolError> {
            for entry in root.list_entries()? {
                let Ok(name) = VolumeDirName::new(&entry) else { continue };
                let Ok(fd) = root.open_volume_dir(&name) else { continue };
                if let Ok(id) = project::project_id(&fd) {
                    used.insert(id);
                }
            }
            Ok(())
        };
        scan(self)?;
        let staged: Vec<u32> =
            self.staged_volume_dirs()?.iter().filter_map(|fd| project::project_id(fd).ok()).collect();
        if let Some(trash) = self.trash_root()? {
            scan(&trash)?;
        }
        used.extend(staged);
        Ok(used)
    }

    /// Opens directory `name` under the root for reading, without following a symlink.
    fn open_volume_dir(&self, name: &VolumeDirName) -> Result<OwnedFd, PoolError> {
        let path = self.volume_path(name);
        rustix::fs::openat(
            &self.fd,
            name.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::LOOP => PoolError::VolumeIsSymlink { path: path.clone() },
            Errno::NOTDIR => PoolError::VolumeNotDirectory { path: path.clone() },
            e => fs_error("open the volume directory", path.clone(), e),
        })
    }

    /// Whether the open directory has no entries besides `.` and `..`.
    fn list_dir_is_empty(&self, fd: &OwnedFd) -> bool {
        let Ok(dup) = rustix::io::fcntl_dupfd_cloexec(fd, 0) else { return false };
        let Ok(mut dir) = rustix::fs::Dir::new(dup) else { return false };
        !dir.any(|e| e.is_ok_and(|e| !matches!(e.file_name().to_bytes(), b"." | b"..")))
    }

    /// Bytes a quota volume holds as the quota accounting counts them: the referenced bytes of
    /// its qgroup on btrfs, its project's usage on XFS and ext4. `None` for a plain directory or
    /// when the filesystem keeps no accounting.
    pub fn quota_used_bytes(&self, name: &VolumeDirName) -> Option<u64> {
        if matches!(self.fs_kind().ok()?, FsKind::Xfs | FsKind::Ext4) {
            let id = self.volume_project_id(name).ok()?;
            return Some(self.project_quota(id).ok()?.unwrap_or_default().used_bytes);
        }
        let fd = self.open_subvolume(name).ok()?;
        let id = btrfs::subvolume_id(&fd).ok()?;
        btrfs::referenced_bytes(&self.btrfs_fsid().ok()?, id)
    }

    /// Project `id`'s limit and usage on the pool's XFS or ext4 filesystem; `None` when the
    /// filesystem keeps no record of it (XFS, for an id without limit or usage). Read with
    /// `Q_XGETQUOTA` or `Q_GETQUOTA`, the same interfaces `xfs_quota` and `repquota` use.
    pub fn project_quota(&self, id: u32) -> Result<Option<project::ProjectQuota>, PoolError> {
        let fs = self.fs_kind()?;
        let root = self.readable_root()?;
        let read = match fs {
            FsKind::Xfs => project::xfs_quota(&root, id),
            FsKind::Ext4 => project::ext4_quota(&root, id),
            _ => Err(Errno::NOTSUP),
        };
        read.map_err(|e| fs_error("read a project quota", self.path.clone(), e))
    }

    /// Every project id from [`PROJECT_ID_BASE`](crate::deciding::quota::PROJECT_ID_BASE) up
    /// that has a limit or usage on the pool's XFS or ext4 filesystem, with its quota (for leak
    /// checks and tests: after a volume is purged its id must not be among them).
    pub fn charged_project_ids(&self) -> Result<std::collections::BTreeMap<u32, project::ProjectQuota>, PoolError> {
        let fs = self.fs_kind()?;
        let root = self.readable_root()?;
        let mut charged = std::collections::BTreeMap::new();
        let mut from = quota::PROJECT_ID_BASE;
        loop {
            let next = match fs {
                FsKind::Xfs => project::xfs_next_quota(&root, from),
                FsKind::Ext4 => project::ext4_next_quota(&root, from),
                _ => Err(Errno::NOTSUP),
            };
            let next = next.map_err(|e| fs_error("list the project quotas", self.path.clone(), e))?;
            let Some((id, quota)) = next else { break };
            // ext4 may still hold an emptied entry until the quota file is tidied.
            if quota != project::ProjectQuota::default() {
                charged.insert(id, quota);
            }
            // An answer below the asked id would loop forever; the last id ends the walk.
            match id.checked_add(1) {
                Some(after) if id >= from => from = after,
                _ => break,
            }
        }
        Ok(charged)
    }

    /// Ids of the subvolume qgroups on the pool's filesystem (for leak checks and tests).
    pub fn subvolume_qgroups(&self) -> Result<Vec<u64>, PoolError> {
        Ok(btrfs::level0_qgroups(&self.btrfs_fsid()?))
    }

    /// Enables btrfs quota on the pool's filesystem. Never called by the provisioner: an admin's
    /// choice (it costs every write); tests use it instead of `btrfs quota enable`.
    pub fn enable_btrfs_quota(&self) -> Result<(), PoolError> {
        let root = self.readable_root()?;
        btrfs::enable_quota(&root).map_err(|e| fs_error("enable btrfs quota", self.path.clone(), e))
    }

    /// True for a btrfs subvolume root directly under this root, on this root's mount: the shape
    /// of a quota volume. A different device number alone would also fit a mount.
    pub(super) fn is_own_subvolume(&self, inode: &Inode) -> bool {
        inode.file_type() == FileType::Directory
            && inode.ino == btrfs::SUBVOLUME_ROOT_INO
            && inode.dev != self.dev
            && inode.mount_root != Some(true)
            && matches!((inode.mnt_id, self.mnt_id), (Some(a), Some(b)) if a == b)
            && self.fs_kind().is_ok_and(|fs| fs == FsKind::Btrfs)
    }

    /// Removes a quota volume (subvolume) `name` if that is what the entry is; `None` otherwise,
    /// for the plain removal to handle.
    pub(super) fn remove_if_subvolume(&self, name: &VolumeDirName) -> Result<Option<Removal>, PoolError> {
        let path = self.volume_path(name);
        let inode = match inode_at(self.fd.as_fd(), name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(inode) if self.is_own_subvolume(&inode) => inode,
            Ok(_) | Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(fs_error("stat the volume directory", path, e)),
        };
        let fd = self.open_subvolume(name)?;
        let id = btrfs::subvolume_id(&fd).map_err(|e| fs_error("read the volume's subvolume id", path.clone(), e))?;
        // The subvolume as a root of its own: the walk confined to it has every guarantee of a
        // volume removal; a mount nested inside is a boundary it stops at, a nested subvolume on
        // the same mount is removed with the rest.
        let sub = PoolRoot {
            name: format!("{}/{}", self.name, name),
            path: path.clone(),
            fd,
            dev: inode.dev,
            ino: inode.ino,
            mnt_id: inode.mnt_id,
            openat2: std::sync::atomic::AtomicBool::new(self.openat2.load(std::sync::atomic::Ordering::Relaxed)),
        };
        let mut entries = 1;
        for entry in sub.list_entries()? {
            let entry = VolumeDirName::new(&entry)?;
            if let Removal::Removed { entries: n } = Walker::new(&sub, OPEN_DIR_WINDOW, MAX_ANCHORS).remove(&entry)? {
                entries += n;
            }
        }
        // rmdir(2) deletes an empty subvolume (Linux 4.18+) and, like for any directory, never
        // a non-empty one: whatever appeared meanwhile stops it.
        match rustix::fs::unlinkat(&self.fd, name.as_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::NOTEMPTY | Errno::EXIST) => return Err(PoolError::TreeChanged { path }),
            Err(e) => return Err(fs_error("remove the volume subvolume", path, e)),
        }
        let root = self.readable_root()?;
        match btrfs::destroy_qgroup(&root, id) {
            Ok(true) => tracing::debug!(pool = %self.name, volume = %name, id, "qgroup destroyed"),
            Ok(false) => tracing::debug!(pool = %self.name, volume = %name, id, "qgroup left to the kernel's cleaner"),
            Err(e) => {
                tracing::warn!(pool = %self.name, volume = %name, id, error = %e, "cannot destroy the volume's qgroup")
            }
        }
        Ok(Some(Removal::Removed { entries }))
    }

    /// Opens the quota volume `name` (a subvolume root directly under this root) for reading,
    /// without following a symlink; anything else at that name is refused.
    fn open_subvolume(&self, name: &VolumeDirName) -> Result<OwnedFd, PoolError> {
        let path = self.volume_path(name);
        let fd = self.open_volume_dir(name)?;
        let inode = inode_of(fd.as_fd()).map_err(|e| fs_error("stat the volume subvolume", path.clone(), e))?;
        if inode.mount_root == Some(true) || matches!((inode.mnt_id, self.mnt_id), (Some(a), Some(b)) if a != b) {
            return Err(PoolError::MountInsideVolume { path });
        }
        if inode.ino != btrfs::SUBVOLUME_ROOT_INO || inode.dev == self.dev {
            return Err(PoolError::NotSubvolume { path });
        }
        Ok(fd)
    }

    /// The root opened for reading: ioctls refuse the `O_PATH` handle.
    pub(super) fn readable_root(&self) -> Result<OwnedFd, PoolError> {
        rustix::fs::openat(&self.fd, c".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| fs_error("open the pool root", self.path.clone(), e))
    }

    fn btrfs_fsid(&self) -> Result<String, PoolError> {
        let root = self.readable_root()?;
        btrfs::fsid(&root).map_err(|e| fs_error("read the btrfs filesystem id", self.path.clone(), e))
    }

    /// Whether the mount holding the root lists `prjquota`/`pquota` among its superblock options.
    fn mounted_with_project_quota(&self) -> bool {
        let Some(mnt_id) = self.mnt_id else { return false };
        let Ok(table) = std::fs::read("/proc/self/mountinfo") else { return false };
        table.split(|b| *b == b'\n').any(|line| {
            let fields: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
            let ours = fields.first().and_then(|f| std::str::from_utf8(f).ok()?.parse::<u64>().ok()) == Some(mnt_id);
            // After the " - " separator: fstype, source, superblock options.
            let super_options = fields.iter().position(|f| *f == b"-").and_then(|i| fields.get(i + 3));
            ours && super_options
                .is_some_and(|o| o.split(|b| *b == b',').any(|opt| matches!(opt, b"prjquota" | b"pquota")))
        })
    }
}

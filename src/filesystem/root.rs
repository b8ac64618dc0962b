//! A pool root: the directory opened once, and every operation on the volume directories
//! directly under it, taken relative to its descriptor.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{AtFlags, CWD, Dir, FileType, Gid, Mode, OFlags, ResolveFlags, Uid};
use rustix::io::Errno;

use super::walker::{MAX_ANCHORS, OPEN_DIR_WINDOW, Walker};
use super::{
    Created, Inode, PoolError, PoolStats, Removal, VolumeDirName, fs_error, inode_at, inode_of, quota, read_mount_table,
};

/// How often `openat2` is retried when the kernel reports a concurrent rename (`EAGAIN`).
const MAX_OPENAT2_RETRIES: u32 = 16;

/// Mode given to directories that lack owner read, write or search permission before emptying.
const OWNER_RWX: u32 = 0o700;

/// A pool root directory, opened once; all volume operations are relative to its descriptor.
#[derive(Debug)]
pub struct PoolRoot {
    pub(super) name: String,
    pub(super) path: PathBuf,
    /// `O_PATH` descriptor of the root: enough for `*at` calls, `statx` and `fstatvfs`, and needs
    /// no permission on the directory itself.
    pub(super) fd: OwnedFd,
    pub(super) dev: u64,
    pub(super) ino: u64,
    pub(super) mnt_id: Option<u64>,
    /// Cleared the first time `openat2` reports `ENOSYS` (kernels before 5.6).
    pub(super) openat2: AtomicBool,
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
pub(super) enum Subvolumes {
    /// The removal walk: a subvolume inside a volume is part of the volume's tree.
    Descend,
    /// Anything else: a different device number is refused like a mount.
    Refuse,
}

/// What opening a directory entry as a directory found.
pub(super) enum DirOpen {
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

    /// Whether something is mounted at the root path, bind mounts of another directory (of the
    /// same filesystem too) included, a bind mount of the root directory onto itself not: that is
    /// how a pod sees its hostPath volume of the pool path, whether or not the host has the
    /// pool's disk mounted there (see [`crate::deciding::mount_table::is_mounted_over`]).
    ///
    /// Uses `STATX_ATTR_MOUNT_ROOT` (Linux 5.8+) to skip the mount table for a plain directory;
    /// older kernels read the table every time.
    pub fn is_mountpoint(&self) -> Result<bool, PoolError> {
        let inode = inode_at(CWD, &self.path, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| fs_error("stat the pool root", self.path.clone(), e))?;
        match inode.mount_root {
            Some(false) => Ok(false),
            Some(true) | None => self.is_mountpoint_without_statx_attr(),
        }
    }

    /// [`PoolRoot::is_mountpoint`] from the mount table alone. mountinfo shows resolved paths,
    /// hence the canonical form.
    pub(super) fn is_mountpoint_without_statx_attr(&self) -> Result<bool, PoolError> {
        let canonical = std::fs::canonicalize(&self.path).map_err(|e| PoolError::Io {
            op: "resolve the pool root path",
            path: self.path.clone(),
            source: Errno::from_io_error(&e).unwrap_or(Errno::IO),
        })?;
        if canonical.parent().is_none() {
            return Ok(true); // "/" is always a mount point
        }
        let mounts = read_mount_table()?;
        Ok(crate::deciding::mount_table::is_mounted_over(&mounts, &canonical))
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

    /// Gives the volume directory `name` its class's owner and group (each `None`: unchanged), then
    /// exactly `mode`, through a descriptor opened beneath the root without following symlinks
    /// (chown first: it may clear a set-group-ID bit the mode then sets again). Only the
    /// directory itself; nothing inside is touched.
    pub fn set_ownership(
        &self,
        name: &VolumeDirName,
        uid: Option<u32>,
        gid: Option<u32>,
        mode: u32,
    ) -> Result<(), PoolError> {
        if mode > 0o7777 {
            return Err(PoolError::InvalidMode { mode });
        }
        let path = self.volume_path(name);
        // A quota volume on btrfs is a subvolume of the pool's own mount (another device
        // number): it is the volume itself, not something mounted in it.
        let fd = match self.open_dir_beneath(self.fd.as_fd(), name.as_str(), &|| path.clone(), Subvolumes::Descend)? {
            DirOpen::Opened(fd, _) => fd,
            DirOpen::NotDirectory => return Err(PoolError::VolumeNotDirectory { path }),
            DirOpen::Gone => return Err(fs_error("open the volume directory", path, Errno::NOENT)),
        };
        if uid.is_some() || gid.is_some() {
            rustix::fs::fchown(&fd, uid.map(Uid::from_raw), gid.map(Gid::from_raw))
                .map_err(|e| fs_error("set the volume directory's owner", path.clone(), e))?;
        }
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
            .map_err(|e| fs_error("set the volume directory mode", path.clone(), e))?;
        Ok(())
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
    pub(super) fn open_beneath<P: rustix::path::Arg + Copy>(
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

    /// Opens (and, when `create`, first makes, mode 0700) the directory `name` the provisioner
    /// keeps its own work in, under `parent` (the pool root or a level of such a directory),
    /// as a plain directory of the pool's own mount: no symlink is followed and no mount is
    /// entered at this component, whatever sits there now (`open_beneath`, then the mount
    /// checks of [`PoolRoot::inspect_dir`] on the descriptor itself, which is what every later
    /// step acts through). `None` when it does not exist. `path` is for messages only.
    pub(super) fn open_own_dir(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        path: &Path,
        create: bool,
    ) -> Result<Option<OwnedFd>, PoolError> {
        if create {
            match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(Errno::EXIST) => {}
                // The level above went meanwhile (another deletion's cleanup): the caller retries.
                Err(Errno::NOENT) => return Ok(None),
                Err(e) => return Err(fs_error("create a bookkeeping directory", path.to_owned(), e)),
            }
        }
        let replaced = |what| PoolError::BookkeepingReplaced { path: path.to_owned(), what };
        let fd = match self.open_beneath(parent, name, OFlags::RDONLY) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(Errno::LOOP | Errno::NOTDIR) => return Err(replaced("a symlink or a file")),
            Err(Errno::XDEV) => return Err(replaced("a mount")),
            Err(e) => return Err(fs_error("open a bookkeeping directory", path.to_owned(), e)),
        };
        match self.inspect_dir(fd.as_fd(), &|| path.to_owned(), Subvolumes::Refuse) {
            Ok(_) => Ok(Some(fd)),
            Err(PoolError::MountInsideVolume { .. }) => Err(replaced("a mount")),
            Err(e) => Err(e),
        }
    }

    /// A directory opened with [`PoolRoot::open_own_dir`] as a pool root of its own, so that
    /// what is done inside it has every guarantee of a volume operation. It is never reopened by
    /// path: its descriptor is the one checked.
    pub(super) fn sub_root(&self, fd: OwnedFd, name: &str, path: PathBuf) -> Result<PoolRoot, PoolError> {
        let inode = inode_of(fd.as_fd()).map_err(|e| fs_error("stat a bookkeeping directory", path.clone(), e))?;
        Ok(PoolRoot {
            name: format!("{}-{name}", self.name),
            path,
            fd,
            dev: inode.dev,
            ino: inode.ino,
            mnt_id: inode.mnt_id,
            openat2: AtomicBool::new(self.openat2.load(Ordering::Relaxed)),
        })
    }

    /// True for an inode on the pool root's own mount (same mount id, not a mount root) whose
    /// device number differs only because it sits in another btrfs subvolume: a subvolume a
    /// tenant created inside a volume (`btrfs subvolume create` needs no privilege), or inside
    /// one. Only the mount id tells this apart from a mount: without it (kernels before 5.8)
    /// the answer is false and such a volume stays refused as if it held a mount.
    pub(super) fn is_on_own_mount_in_another_subvolume(&self, inode: &Inode) -> bool {
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
    pub(super) fn is_foreign_mount(&self, inode: &Inode) -> bool {
        inode.dev != self.dev
            || inode.mount_root == Some(true)
            || matches!((inode.mnt_id, self.mnt_id), (Some(a), Some(b)) if a != b)
    }

    /// Opens a directory entry for listing, refusing mounts and making it writable by its owner.
    ///
    /// `path` is only for messages. Directories missing owner read, write or search permission are
    /// `fchmod`ed to 0700 through the opened descriptor, which matters when the provisioner runs
    /// without `CAP_DAC_OVERRIDE`.
    pub(super) fn open_dir_beneath<P: rustix::path::Arg + Copy>(
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
    pub(super) fn open_unreadable_dir<P: rustix::path::Arg + Copy>(
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
    pub(super) fn inspect_dir(
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

//! Copying one volume directory into a new one in the same pool (a clone, `deciding::clone`).
//!
//! The copy is made in a staging directory, `<pool>/.hpp-clones/<node>/<target>`, and renamed
//! into place only once complete, so a volume name exists only for a complete copy. A copy cut
//! short by a crash leaves only staging data, which the next attempt for the same target and the
//! start-up sweep ([`PoolRoot::sweep_clone_staging`]) remove. Each node stages under its own name
//! so that on a shared pool one node's sweep never removes another node's copy in progress.
//!
//! The walk follows the deletion code's rules (module docs of `filesystem`): every directory is
//! opened relative to its parent's descriptor without following a symlink (`openat2` with
//! `RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV` where available), non-directories are opened with
//! `O_NOFOLLOW` and checked to be the inode listed, and a mount met inside the source stops the
//! copy. Symlinks are copied as symlinks and never followed; FIFOs and sockets are recreated with
//! `mknodat`; device nodes are refused ([`PoolError::DeviceInVolume`]): recreating one needs
//! `CAP_MKNOD`, which the DaemonSet does not hold, and would hand the device to the clone's pods.
//! Hard links inside the volume stay hard links.
//! Owners, modes and access and modification times are copied, through descriptors or with
//! `AT_SYMLINK_NOFOLLOW`; holes stay holes. Extended attributes and ACLs are not copied.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, RenameFlags, SeekFrom, Stat, Timespec, Timestamps};
use rustix::io::Errno;

use super::{Created, PoolError, PoolRoot, VolumeDirName, fs_error, inode_of};
use crate::deciding::clone::{CopyMethod, FilesystemKind, copy_method};
use crate::deciding::layout;

/// Directory directly under a pool root that holds copies in progress (dot-prefixed, so it never
/// matches a volume layout and the orphan cleanup leaves it alone).
pub const CLONE_STAGING_DIR: &str = ".hpp-clones";

/// `statfs` magic numbers (linux/magic.h).
const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
const XFS_SUPER_MAGIC: i64 = 0x5846_5342;

/// Inode number of the root directory of every btrfs subvolume (`BTRFS_FIRST_FREE_OBJECTID`).
pub(super) const BTRFS_SUBVOLUME_ROOT_INO: u64 = 256;

/// Deepest directory nesting copied: each level holds two descriptors open (source and copy),
/// which keeps a copy within the usual 1024-descriptor limit with room to spare.
const MAX_DEPTH: usize = 256;

/// Bytes per `copy_file_range` call (it may copy less; the loop goes on).
const CHUNK: usize = 8 << 20;

/// What a clone did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CloneReport {
    /// Whether this call made the copy, or found it complete already (a retry after a crash
    /// between the rename and the PV, or another node of a shared pool got there first).
    pub created: Created,
    /// How the filesystem copied.
    pub method: CopyMethod,
    /// Regular files whose extents were shared (reflinked).
    pub reflinked: u64,
    /// Regular files copied byte by byte (the byte method, or a reflink the filesystem refused).
    pub byte_copied: u64,
    /// Bytes of file data copied or shared (apparent sizes).
    pub bytes: u64,
    /// Entries made (directories, files, links, special files), the volume itself excluded.
    pub entries: u64,
}

impl CloneReport {
    fn new(created: Created, method: CopyMethod) -> Self {
        CloneReport { created, method, reflinked: 0, byte_copied: 0, bytes: 0, entries: 0 }
    }
}

impl PoolRoot {
    /// Copies volume `source` into a new volume `target` of this pool, through a staging
    /// directory of `node`'s (see the module docs). An existing `target` directory is a copy
    /// completed before (only complete copies are ever renamed into place).
    pub fn clone_volume(
        &self,
        source: &VolumeDirName,
        target: &VolumeDirName,
        node: &VolumeDirName,
    ) -> Result<CloneReport, PoolError> {
        self.copy_in(self, source, target, node)
    }

    /// Copies directory `source` of `from` (this root, or a bookkeeping directory of its pool
    /// such as the snapshots) into a new directory `target` of this root, as
    /// [`PoolRoot::clone_volume`] does. `from` must be on this root's filesystem: a snapshot or
    /// reflink cannot cross filesystems, and a mount met on the way stops the copy.
    pub(super) fn copy_in(
        &self,
        from: &PoolRoot,
        source: &VolumeDirName,
        target: &VolumeDirName,
        node: &VolumeDirName,
    ) -> Result<CloneReport, PoolError> {
        let target_path = self.volume_path(target);
        let source_path = from.volume_path(source);
        match rustix::fs::statat(&self.fd, target.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                let kind = filesystem_kind(self.fd.as_fd());
                return Ok(CloneReport::new(Created::Existing, copy_method(kind, false)));
            }
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Symlink => {
                return Err(PoolError::VolumeIsSymlink { path: target_path });
            }
            Ok(_) => return Err(PoolError::VolumeNotDirectory { path: target_path }),
            Err(Errno::NOENT) => {}
            Err(e) => return Err(fs_error("stat the clone's directory", target_path, e)),
        }
        let src = match from.open_beneath(from.fd.as_fd(), source.as_str(), OFlags::RDONLY) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Err(fs_error("open the source volume", source_path, Errno::NOENT)),
            Err(Errno::LOOP | Errno::NOTDIR) => return Err(PoolError::VolumeNotDirectory { path: source_path }),
            Err(Errno::XDEV) => return Err(PoolError::MountInsideVolume { path: source_path }),
            Err(e) => return Err(fs_error("open the source volume", source_path, e)),
        };
        let src_stat =
            rustix::fs::fstat(&src).map_err(|e| fs_error("stat the source volume", source_path.clone(), e))?;
        let kind = filesystem_kind(src.as_fd());
        let is_subvolume = kind == FilesystemKind::Btrfs && src_stat.st_ino == BTRFS_SUBVOLUME_ROOT_INO;
        from.check_source_root(src.as_fd(), is_subvolume, &source_path)?;
        if from.mnt_id != self.mnt_id || (!is_subvolume && from.dev != self.dev) {
            return Err(PoolError::MountInsideVolume { path: source_path });
        }
        let method = copy_method(kind, is_subvolume);
        if method == CopyMethod::Snapshot {
            // A snapshot appears complete or not at all: it needs no staging.
            snapshot_subvolume(self.fd.as_fd(), src.as_fd(), target)
                .map_err(|e| fs_error("snapshot the source subvolume", target_path.clone(), e))?;
            let mut report = CloneReport::new(Created::New, method);
            report.bytes = u64::try_from(src_stat.st_size).unwrap_or(0);
            return Ok(report);
        }

        let staging = self.clone_staging_root(node, true)?.ok_or_else(|| {
            fs_error("create the clone staging directory", self.path.join(CLONE_STAGING_DIR), Errno::NOENT)
        })?;
        // A leftover from an attempt cut short (a crash, a kill) is never resumed: start afresh.
        staging.remove_volume_dir(target)?;
        let dst_path = staging.volume_path(target);
        rustix::fs::mkdirat(&staging.fd, target.as_str(), Mode::from_raw_mode(0o700))
            .map_err(|e| fs_error("create the clone's staging directory", dst_path.clone(), e))?;
        let report = match self.fill_staging(&staging, target, src.as_fd(), &src_stat, method, &source_path) {
            Ok(report) => report,
            Err(error) => {
                // A failed copy must not keep its space until the next attempt or restart (a
                // tenant could repeat it): remove it now, best effort.
                if let Err(cleanup) = staging.remove_volume_dir(target) {
                    tracing::warn!(path = %dst_path.display(), error = %cleanup, "could not remove a failed clone's staging copy; the start-up sweep removes it");
                }
                return Err(error);
            }
        };
        match rustix::fs::renameat_with(&staging.fd, target.as_str(), &self.fd, target.as_str(), RenameFlags::NOREPLACE)
        {
            Ok(()) => Ok(report),
            // Another node of a shared pool finished the same clone first: its copy stands.
            Err(Errno::EXIST | Errno::NOTEMPTY) => {
                staging.remove_volume_dir(target)?;
                Ok(CloneReport { created: Created::Existing, ..report })
            }
            Err(e) => Err(fs_error("move the complete copy into place", target_path, e)),
        }
    }

    /// Fills the staging directory `target` (just created) with a copy of `src`; returns what
    /// was copied, flushed to disk.
    fn fill_staging(
        &self,
        staging: &PoolRoot,
        target: &VolumeDirName,
        src: BorrowedFd<'_>,
        src_stat: &Stat,
        method: CopyMethod,
        source_path: &std::path::Path,
    ) -> Result<CloneReport, PoolError> {
        let dst_path = staging.volume_path(target);
        let dst = rustix::fs::openat(
            &staging.fd,
            target.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| fs_error("open the clone's staging directory", dst_path.clone(), e))?;
        let mut copier = Copier {
            pool: self,
            method,
            source_dev: src_stat.st_dev,
            staging_root: rustix::fs::openat(
                &staging.fd,
                target.as_str(),
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| fs_error("open the clone's staging directory", dst_path.clone(), e))?,
            links: HashMap::new(),
            report: CloneReport::new(Created::New, method),
            source_path: source_path.to_path_buf(),
        };
        copier.copy_dir(src, dst.as_fd(), &mut Vec::new())?;
        copy_attributes(dst.as_fd(), src_stat)
            .map_err(|e| attribute_error("copy the volume's owner, mode and times", dst_path.clone(), e))?;
        let report = copier.report;
        // Data and names must be on disk before the rename makes the copy visible as complete.
        rustix::fs::syncfs(&dst).map_err(|e| fs_error("flush the copy to disk", dst_path.clone(), e))?;
        Ok(report)
    }

    /// Removes every copy this node left unfinished (a crash or kill mid-copy); returns how
    /// many. Called at start-up, before any clone can be in progress on this node.
    pub fn sweep_clone_staging(&self, node: &VolumeDirName) -> Result<u64, PoolError> {
        self.sweep_staging(node, |name| layout::uid_of_dir(name).is_some())
    }

    /// Removes the entries of this node's staging directory named as `made_here` says this
    /// provisioner names its copies there (a volume's directory name, a snapshot's UID); others
    /// are left alone, with a warning.
    pub(super) fn sweep_staging(
        &self,
        node: &VolumeDirName,
        made_here: impl Fn(&str) -> bool,
    ) -> Result<u64, PoolError> {
        let Some(staging) = self.clone_staging_root(node, false)? else { return Ok(0) };
        let mut removed = 0;
        for entry in staging.list_entries()? {
            let Ok(name) = VolumeDirName::new(&entry) else { continue };
            if !made_here(name.as_str()) {
                tracing::warn!(pool = %self.name, entry = %staging.volume_path(&name).display(), "not a copy this provisioner made; left alone");
                continue;
            }
            staging.remove_volume_dir(&name)?;
            removed += 1;
        }
        Ok(removed)
    }

    /// `<root>/.hpp-clones/<node>` as a pool root of its own (made when `create`; `None` when
    /// missing otherwise), so that removing a leftover has every guarantee of a volume removal.
    /// Each level is opened from the descriptor of the one above and checked to be a plain
    /// directory of the pool's own mount (`PoolRoot::open_own_dir`), never reopened by path.
    fn clone_staging_root(&self, node: &VolumeDirName, create: bool) -> Result<Option<PoolRoot>, PoolError> {
        let outer_path = self.path.join(CLONE_STAGING_DIR);
        let Some(outer) = self.open_own_dir(self.fd.as_fd(), CLONE_STAGING_DIR, &outer_path, create)? else {
            return Ok(None);
        };
        let path = outer_path.join(node.as_str());
        let Some(inner) = self.open_own_dir(outer.as_fd(), node.as_str(), &path, create)? else { return Ok(None) };
        self.sub_root(inner, "clones", path).map(Some)
    }

    /// The source volume must sit on the pool's own mount: a btrfs subvolume has a device number
    /// of its own, so there only the mount id (and the mount-root attribute) can tell.
    fn check_source_root(
        &self,
        src: BorrowedFd<'_>,
        is_subvolume: bool,
        path: &std::path::Path,
    ) -> Result<(), PoolError> {
        let inode = inode_of(src).map_err(|e| fs_error("stat the source volume", path.to_owned(), e))?;
        let other_mount = inode.mount_root == Some(true)
            || matches!((inode.mnt_id, self.mnt_id), (Some(a), Some(b)) if a != b)
            || (!is_subvolume && inode.dev != self.dev);
        if other_mount {
            return Err(PoolError::MountInsideVolume { path: path.to_owned() });
        }
        Ok(())
    }
}

/// The filesystem of an open descriptor.
pub(super) fn filesystem_kind(fd: BorrowedFd<'_>) -> FilesystemKind {
    // `f_type` is i64 here and narrower on some targets.
    #[allow(clippy::useless_conversion)]
    let magic = rustix::fs::fstatfs(fd).map(|st| i64::from(st.f_type));
    match magic {
        Ok(BTRFS_SUPER_MAGIC) => FilesystemKind::Btrfs,
        Ok(XFS_SUPER_MAGIC) => FilesystemKind::Xfs,
        _ => FilesystemKind::Other,
    }
}

/// `struct btrfs_ioctl_vol_args_v2` (linux/btrfs.h): 4096 bytes.
#[repr(C)]
struct SnapshotArgs {
    fd: i64,
    transid: u64,
    flags: u64,
    unused: [u64; 4],
    name: [u8; 4040],
}

/// `BTRFS_IOC_SNAP_CREATE_V2 = _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)`.
const SNAP_CREATE_V2: rustix::ioctl::Opcode = rustix::ioctl::opcode::write::<SnapshotArgs>(0x94, 23);

/// Snapshots the subvolume `source` as `name` under `parent` (a writable snapshot).
fn snapshot_subvolume(parent: BorrowedFd<'_>, source: BorrowedFd<'_>, name: &VolumeDirName) -> Result<(), Errno> {
    // The ioctl wants a directory opened for reading, not the O_PATH root handle.
    let dir = rustix::fs::openat(parent, c".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let mut args = SnapshotArgs { fd: 0, transid: 0, flags: 0, unused: [0; 4], name: [0; 4040] };
    args.fd = i64::from(std::os::fd::AsRawFd::as_raw_fd(&source));
    let bytes = name.as_str().as_bytes();
    // A VolumeDirName has at most 255 bytes and no NUL: it fits with its terminator.
    args.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: the opcode encodes the size of `SnapshotArgs`, which matches the kernel's
    // `btrfs_ioctl_vol_args_v2` layout; the kernel only reads the struct.
    unsafe { rustix::ioctl::ioctl(&dir, rustix::ioctl::Setter::<SNAP_CREATE_V2, SnapshotArgs>::new(args)) }
}

/// The walk behind [`PoolRoot::clone_volume`].
struct Copier<'a> {
    pool: &'a PoolRoot,
    method: CopyMethod,
    /// Device of the source volume: every inode copied must be on it.
    source_dev: u64,
    /// The copy's top directory, for hard links (`linkat` by path inside our own staging tree).
    staging_root: OwnedFd,
    /// Source inode -> path (relative to the copy's top) of its first copy.
    links: HashMap<(u64, u64), PathBuf>,
    report: CloneReport,
    source_path: PathBuf,
}

impl Copier<'_> {
    fn path(&self, at: &[CString], name: &CStr) -> PathBuf {
        let mut path = self.source_path.clone();
        path.extend(at.iter().map(|c| std::ffi::OsStr::from_bytes(c.to_bytes())));
        path.push(std::ffi::OsStr::from_bytes(name.to_bytes()));
        path
    }

    /// Copies the entries of `src` into `dst`; `at` holds the names from the volume down.
    fn copy_dir(&mut self, src: BorrowedFd<'_>, dst: BorrowedFd<'_>, at: &mut Vec<CString>) -> Result<(), PoolError> {
        if at.len() >= MAX_DEPTH {
            return Err(PoolError::Io {
                op: "copy a directory nested deeper than 256 levels",
                path: self.path(&at[..at.len() - 1], &at[at.len() - 1]),
                source: Errno::NAMETOOLONG,
            });
        }
        let here = || {
            let mut p = self.source_path.clone();
            p.extend(at.iter().map(|c| std::ffi::OsStr::from_bytes(c.to_bytes())));
            p
        };
        let mut names = Vec::new();
        let mut dir = Dir::read_from(src).map_err(|e| fs_error("list directory", here(), e))?;
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(|e| fs_error("list directory", here(), e))?;
            let name = entry.file_name();
            if name != c"." && name != c".." {
                names.push(name.to_owned());
            }
        }
        drop(dir);
        for name in names {
            self.copy_entry(src, dst, &name, at)?;
        }
        Ok(())
    }

    fn copy_entry(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        name: &CStr,
        at: &mut Vec<CString>,
    ) -> Result<(), PoolError> {
        let st = match rustix::fs::statat(src, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Removed since listed: a live volume may change under the copy.
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(fs_error("stat", self.path(at, name), e)),
        };
        if st.st_dev != self.source_dev {
            return Err(PoolError::MountInsideVolume { path: self.path(at, name) });
        }
        let file_type = FileType::from_raw_mode(st.st_mode);
        if file_type != FileType::Directory && st.st_nlink > 1 {
            if let Some(first) = self.links.get(&(st.st_dev, st.st_ino)) {
                rustix::fs::linkat(&self.staging_root, first.as_path(), dst, name, AtFlags::empty())
                    .map_err(|e| fs_error("link", self.path(at, name), e))?;
                self.report.entries += 1;
                return Ok(());
            }
            let mut rel: PathBuf = at.iter().map(|c| std::ffi::OsStr::from_bytes(c.to_bytes())).collect();
            rel.push(std::ffi::OsStr::from_bytes(name.to_bytes()));
            self.links.insert((st.st_dev, st.st_ino), rel);
        }
        match file_type {
            FileType::Directory => self.copy_subdir(src, dst, name, &st, at)?,
            FileType::RegularFile => self.copy_file(src, dst, name, &st, at)?,
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(src, name, Vec::new())
                    .map_err(|e| fs_error("read symlink", self.path(at, name), e))?;
                rustix::fs::symlinkat(target.as_c_str(), dst, name)
                    .map_err(|e| fs_error("create symlink", self.path(at, name), e))?;
                self.copy_attributes_at(dst, name, &st, at, false)?;
            }
            FileType::CharacterDevice | FileType::BlockDevice => {
                return Err(PoolError::DeviceInVolume { path: self.path(at, name) });
            }
            FileType::Fifo | FileType::Socket => {
                rustix::fs::mknodat(dst, name, file_type, Mode::from_raw_mode(0o600), st.st_rdev)
                    .map_err(|e| fs_error("create special file", self.path(at, name), e))?;
                self.copy_attributes_at(dst, name, &st, at, true)?;
            }
            FileType::Unknown => {
                return Err(fs_error("copy an entry of unknown type", self.path(at, name), Errno::INVAL));
            }
        }
        self.report.entries += 1;
        Ok(())
    }

    fn copy_subdir(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        name: &CStr,
        st: &Stat,
        at: &mut Vec<CString>,
    ) -> Result<(), PoolError> {
        let sub_src = match self.pool.open_beneath(src, name, OFlags::RDONLY) {
            Ok(fd) => fd,
            Err(Errno::XDEV) => return Err(PoolError::MountInsideVolume { path: self.path(at, name) }),
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(fs_error("open directory", self.path(at, name), e)),
        };
        let opened = inode_of(sub_src.as_fd()).map_err(|e| fs_error("stat directory", self.path(at, name), e))?;
        if opened.mount_root == Some(true) || opened.dev != self.source_dev {
            return Err(PoolError::MountInsideVolume { path: self.path(at, name) });
        }
        if opened.ino != st.st_ino {
            return Err(PoolError::TreeChanged { path: self.path(at, name) });
        }
        rustix::fs::mkdirat(dst, name, Mode::from_raw_mode(0o700))
            .map_err(|e| fs_error("create directory", self.path(at, name), e))?;
        let sub_dst = rustix::fs::openat(
            dst,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| fs_error("open the copied directory", self.path(at, name), e))?;
        at.push(name.to_owned());
        let copied = self.copy_dir(sub_src.as_fd(), sub_dst.as_fd(), at);
        at.pop();
        copied?;
        // Last: filling the directory changed its times, and a read-only mode would have
        // stopped the filling.
        copy_attributes(sub_dst.as_fd(), st)
            .map_err(|e| attribute_error("copy owner, mode and times", self.path(at, name), e))
    }

    fn copy_file(
        &mut self,
        src: BorrowedFd<'_>,
        dst: BorrowedFd<'_>,
        name: &CStr,
        st: &Stat,
        at: &[CString],
    ) -> Result<(), PoolError> {
        let path = self.path(at, name);
        // O_NONBLOCK: should the name have become a FIFO meanwhile, opening it must not hang.
        let input = match rustix::fs::openat(
            src,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NOCTTY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(fs_error("open file", path.clone(), e)),
        };
        let now = rustix::fs::fstat(&input).map_err(|e| fs_error("stat file", path.clone(), e))?;
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino)
            || FileType::from_raw_mode(now.st_mode) != FileType::RegularFile
        {
            return Err(PoolError::TreeChanged { path: path.clone() });
        }
        let output = rustix::fs::openat(
            dst,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| fs_error("create file", path.clone(), e))?;
        let reflinked = self.method == CopyMethod::Reflink
            && match rustix::fs::ioctl_ficlone(&output, &input) {
                Ok(()) => true,
                // Not shareable here (XFS without reflink, a nodatacow file on btrfs, ...).
                Err(Errno::OPNOTSUPP | Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::NOTTY) => false,
                Err(e) => return Err(fs_error("share the file's extents (FICLONE)", path.clone(), e)),
            };
        if reflinked {
            self.report.reflinked += 1;
        } else {
            copy_data(input.as_fd(), output.as_fd(), u64::try_from(now.st_size).unwrap_or(0))
                .map_err(|e| fs_error("copy file data", path.clone(), e))?;
            self.report.byte_copied += 1;
        }
        self.report.bytes += u64::try_from(now.st_size).unwrap_or(0);
        copy_attributes(output.as_fd(), &now)
            .map_err(|e| attribute_error("copy owner, mode and times", path.clone(), e))
    }

    /// Owner, mode and times of an entry that cannot be opened (a symlink, a special file).
    fn copy_attributes_at(
        &self,
        dst: BorrowedFd<'_>,
        name: &CStr,
        st: &Stat,
        at: &[CString],
        chmod: bool,
    ) -> Result<(), PoolError> {
        let path = || self.path(at, name);
        let (uid, gid) = owner(st);
        rustix::fs::chownat(dst, name, Some(uid), Some(gid), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| attribute_error("copy the owner", path(), e))?;
        if chmod {
            // The special file was made by us a moment ago in our own staging tree: not a symlink.
            rustix::fs::chmodat(dst, name, Mode::from_raw_mode(st.st_mode & 0o7777), AtFlags::empty())
                .map_err(|e| fs_error("copy the mode", path(), e))?;
        }
        rustix::fs::utimensat(dst, name, &times(st), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| fs_error("copy the times", path(), e))
    }
}

fn owner(st: &Stat) -> (rustix::fs::Uid, rustix::fs::Gid) {
    (rustix::fs::Uid::from_raw(st.st_uid), rustix::fs::Gid::from_raw(st.st_gid))
}

fn times(st: &Stat) -> Timestamps {
    Timestamps {
        last_access: Timespec { tv_sec: st.st_atime as _, tv_nsec: st.st_atime_nsec as _ },
        last_modification: Timespec { tv_sec: st.st_mtime as _, tv_nsec: st.st_mtime_nsec as _ },
    }
}

/// EPERM while copying attributes means a missing capability (the owner, as a rule).
fn attribute_error(op: &'static str, path: PathBuf, e: Errno) -> PoolError {
    match e {
        Errno::PERM => PoolError::MissingCapability { op, path },
        e => fs_error(op, path, e),
    }
}

/// Owner, then mode (a change of owner clears set-id bits), then times, on an open descriptor.
fn copy_attributes(fd: BorrowedFd<'_>, st: &Stat) -> Result<(), Errno> {
    let (uid, gid) = owner(st);
    rustix::fs::fchown(fd, Some(uid), Some(gid))?;
    rustix::fs::fchmod(fd, Mode::from_raw_mode(st.st_mode & 0o7777))?;
    rustix::fs::futimens(fd, &times(st))
}

/// Copies `size` bytes, data regions only (`SEEK_DATA`/`SEEK_HOLE`), so holes stay holes.
fn copy_data(input: BorrowedFd<'_>, output: BorrowedFd<'_>, size: u64) -> Result<(), Errno> {
    let mut offset = 0;
    while offset < size {
        let data = match rustix::fs::seek(input, SeekFrom::Data(offset)) {
            Ok(data) => data,
            // No data after `offset`: the rest is a hole.
            Err(Errno::NXIO) => break,
            // A filesystem without SEEK_DATA: everything is data.
            Err(Errno::INVAL | Errno::OPNOTSUPP) => offset,
            Err(e) => return Err(e),
        };
        let hole = match rustix::fs::seek(input, SeekFrom::Hole(data)) {
            Ok(hole) => hole.min(size),
            Err(Errno::INVAL | Errno::OPNOTSUPP) => size,
            Err(e) => return Err(e),
        };
        copy_range(input, output, data, hole)?;
        offset = hole.max(data + 1);
    }
    // The size, and a trailing hole.
    rustix::fs::ftruncate(output, size)
}

/// Copies `[from, to)` at the same offsets, with `copy_file_range` or, where the kernel cannot,
/// plain reads and writes.
fn copy_range(input: BorrowedFd<'_>, output: BorrowedFd<'_>, from: u64, to: u64) -> Result<(), Errno> {
    let mut pos = from;
    while pos < to {
        let want = usize::try_from(to - pos).unwrap_or(CHUNK).min(CHUNK);
        let (mut off_in, mut off_out) = (pos, pos);
        match rustix::fs::copy_file_range(input, Some(&mut off_in), output, Some(&mut off_out), want) {
            Ok(0) => return Ok(()), // the file shrank meanwhile
            Ok(n) => pos += n as u64,
            Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                return read_write(input, output, pos, to);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_write(input: BorrowedFd<'_>, output: BorrowedFd<'_>, mut pos: u64, to: u64) -> Result<(), Errno> {
    let mut buf = vec![0u8; 1 << 20];
    while pos < to {
        let want = usize::try_from(to - pos).unwrap_or(buf.len()).min(buf.len());
        let n = rustix::io::pread(input, &mut buf[..want], pos)?;
        if n == 0 {
            return Ok(());
        }
        let mut written = 0;
        while written < n {
            written += rustix::io::pwrite(output, &buf[written..n], pos + written as u64)?;
        }
        pos += n as u64;
    }
    Ok(())
}

#[cfg(test)]
mod tests;

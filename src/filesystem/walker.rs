//! The iterative, descriptor-based removal of a volume's tree.

use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;

use rustix::fs::{AtFlags, Dir, FileType};
use rustix::io::Errno;

use super::{
    DirOpen, Inode, NESTED_SUBVOLUMES_REMOVED, PoolError, PoolRoot, Removal, Subvolumes, VolumeDirName, fs_error,
    inode_at, quota,
};

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
pub(super) const OPEN_DIR_WINDOW: usize = 64;

/// Cap on the anchor levels kept open above the window (see [`OPEN_DIR_WINDOW`]).
pub(super) const MAX_ANCHORS: usize = 64;

/// How often a directory is re-listed when entries keep appearing in it while it is emptied.
const MAX_RESCANS: u32 = 8;

/// How often an entry may change between file and directory under us before we give up.
const MAX_TYPE_CHANGES: u32 = 4;

/// One directory on the removal stack.
pub(super) struct Frame {
    /// Name within the parent (the volume name for the bottom frame).
    pub(super) name: CString,
    /// Identity recorded when first opened, checked again whenever the directory is re-opened.
    pub(super) dev: u64,
    pub(super) ino: u64,
    /// `None` while evicted to keep the number of open descriptors bounded.
    pub(super) dir: Option<Dir>,
    /// How often this directory has been re-listed because it was not empty at `rmdir`.
    pub(super) rescans: u32,
    /// Set when the directory is the root of a nested btrfs subvolume: its id, whose qgroup is
    /// destroyed once the subvolume is removed.
    pub(super) subvolume_id: Option<u64>,
}

/// What removing one directory entry did.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The name was unlinked.
    Unlinked,
    /// The entry is a directory and was pushed on the stack to be emptied first.
    Descended,
    /// The entry had already vanished (a concurrent deletion); nothing to do.
    Gone,
}

/// The iterative, descriptor-based tree removal behind [`PoolRoot::remove_volume_dir`].
pub(super) struct Walker<'a> {
    pub(super) pool: &'a PoolRoot,
    pub(super) stack: Vec<Frame>,
    /// Deepest levels kept open (see [`OPEN_DIR_WINDOW`]).
    pub(super) window: usize,
    /// Cap on open anchor levels below the window (see [`MAX_ANCHORS`]).
    pub(super) max_anchors: usize,
    /// Levels that are multiples of `stride` stay open as anchors once they leave the window.
    pub(super) stride: usize,
    pub(super) entries: u64,
    pub(super) open_dirs: usize,
    pub(super) max_open_dirs: usize,
    /// Directories opened again after eviction (for tests of the descriptor budget).
    pub(super) reopened: u64,
    /// Nested btrfs subvolumes removed (each one escaped a quota volume's limit).
    pub(super) nested_subvolumes: u64,
}

impl<'a> Walker<'a> {
    pub(super) fn new(pool: &'a PoolRoot, window: usize, max_anchors: usize) -> Self {
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

    pub(super) fn remove(&mut self, volume: &VolumeDirName) -> Result<Removal, PoolError> {
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
    pub(super) fn drain(&mut self) -> Result<(), PoolError> {
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
    pub(super) fn remove_entry(
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
    pub(super) fn finish_top(&mut self) -> Result<(), PoolError> {
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
    pub(super) fn nested_subvolume_removed(&mut self, parent: Option<usize>, name: &CStr, id: u64) {
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
    pub(super) fn push(&mut self, name: &CStr, fd: OwnedFd, inode: Inode, rescans: u32) -> Result<(), PoolError> {
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
    pub(super) fn install(&mut self, index: usize, fd: OwnedFd) -> Result<(), PoolError> {
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
    pub(super) fn close(&mut self, index: usize) {
        if self.stack[index].dir.take().is_some() {
            self.open_dirs -= 1;
        }
    }

    /// Re-opens frame `index` if it was evicted, walking down by name from the nearest open
    /// ancestor (never through `..`) and checking every directory is the one recorded.
    pub(super) fn ensure_open(&mut self, index: usize) -> Result<(), PoolError> {
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
    pub(super) fn parent_fd(&self, parent: Option<usize>) -> Result<BorrowedFd<'_>, PoolError> {
        match parent {
            None => Ok(self.pool.fd.as_fd()),
            Some(i) => match self.stack[i].dir.as_ref() {
                Some(dir) => dir.fd().map_err(|e| fs_error("use directory", self.path_of(Some(i), None), e)),
                None => Err(self.changed(Some(i))),
            },
        }
    }

    pub(super) fn changed(&self, frame: Option<usize>) -> PoolError {
        PoolError::TreeChanged { path: self.path_of(frame, None) }
    }

    /// Rebuilds a path for messages only: the pool root, the names of frames `0..=frame`, then
    /// `child`. Very deep paths keep their head and tail so an event note stays readable.
    pub(super) fn path_of(&self, frame: Option<usize>, child: Option<&CStr>) -> PathBuf {
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

//! The filesystem edge of Block volumes (issue #47): the backing file inside its volume
//! directory, the loop devices, and the device nodes on the host's devtmpfs. No `losetup`: the
//! loop driver's ioctls directly ([`loop_ioctl`]).
//!
//! Every step that exposes or detaches a loop first reads the facts and asks
//! [`crate::deciding::block::loop_safety`]; the loop is opened by number, checked against sysfs,
//! and its backing file read again through that descriptor right before the act, so a loop
//! detached and re-attached to another file in between is left alone ([`PoolError::LoopChanged`]).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FallocateFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::deciding::block::loop_safety::{
    self, Attachment, BackingFile, FileId, LoopFacts, LoopRefusal, NodeAction, NodeEntry, Volume,
};
use crate::deciding::block::{Allocation, BACKING_FILE, Birth};
use crate::filesystem::root::{DirOpen, Subvolumes};
use crate::filesystem::{PoolError, PoolRoot, VolumeDirName, fs_error};

mod loop_ioctl;

/// Where the host's loop devices are seen: `/dev` and `/sys/block`.
#[derive(Clone, Debug)]
pub struct LoopHost {
    dev: PathBuf,
    sys_block: PathBuf,
}

/// One attached loop device and the name the kernel gives its backing file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachedLoop {
    /// What the decisions read.
    pub facts: LoopFacts,
    /// sysfs `loop/backing_file` (as this process's mount namespace sees it; may end in
    /// " (deleted)"). For messages and the doctor only: never trusted as identity.
    pub backing_name: String,
    /// Whether I/O goes to the backing file with direct I/O.
    pub direct_io: bool,
}

/// What [`LoopHost::detach`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Detached {
    /// The loop is gone.
    Now,
    /// The device is still open (a pod, a mount): the kernel detaches it at its last close.
    /// The caller waits, with an event, before removing the backing file.
    AtLastClose,
}

impl LoopHost {
    /// The host's `/dev` and `/sys/block`.
    pub fn host() -> Self {
        LoopHost { dev: PathBuf::from("/dev"), sys_block: PathBuf::from("/sys/block") }
    }

    fn io(&self, op: &'static str, number: Option<u32>, e: Errno) -> PoolError {
        let path = match number {
            Some(n) => self.dev.join(format!("loop{n}")),
            None => self.dev.join("loop-control"),
        };
        fs_error(op, path, e)
    }

    /// Every attached loop device, its backing file read with `LOOP_GET_STATUS64`. A loop
    /// detached while it is being read is left out.
    pub fn loops(&self) -> Result<Vec<AttachedLoop>, PoolError> {
        let entries = std::fs::read_dir(&self.sys_block).map_err(|e| {
            fs_error("list block devices", self.sys_block.clone(), Errno::from_io_error(&e).unwrap_or(Errno::IO))
        })?;
        let mut loops = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(number) = name.to_str().and_then(|n| n.strip_prefix("loop")).and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // Only an attached loop has a backing file.
            let Ok(backing_name) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else {
                continue;
            };
            match self.read_loop(number) {
                Ok(Some(mut found)) => {
                    found.backing_name = backing_name.trim_end_matches('\n').to_owned();
                    loops.push(found);
                }
                Ok(None) => {}
                Err(e) => return Err(self.io("read a loop device's status", Some(number), e)),
            }
        }
        loops.sort_by_key(|l| l.facts.number);
        Ok(loops)
    }

    /// Loop `number`'s facts, `None` when nothing is attached to it (or it vanished). A loop
    /// still attached whose node cannot be opened (no `/dev/loopN`, or one of another device)
    /// is an error, never left out: a loop on a volume's file that went unseen would have the
    /// file attached a second time.
    fn read_loop(&self, number: u32) -> Result<Option<AttachedLoop>, Errno> {
        let fd = match loop_ioctl::open_loop(&self.dev, &self.sys_block, number, OFlags::RDONLY) {
            Ok(fd) => fd,
            Err(Errno::NXIO) => return Ok(None),
            Err(e @ (Errno::NOENT | Errno::NODEV)) => {
                let attached = self.sys_block.join(format!("loop{number}/loop/backing_file")).exists();
                return if attached { Err(e) } else { Ok(None) };
            }
            Err(e) => return Err(e),
        };
        Ok(self.facts_of(fd.as_fd(), number)?.map(|(facts, direct_io)| AttachedLoop {
            facts,
            backing_name: String::new(),
            direct_io,
        }))
    }

    /// The facts of the opened loop `number`, `None` when nothing is attached.
    fn facts_of(&self, fd: BorrowedFd<'_>, number: u32) -> Result<Option<(LoopFacts, bool)>, Errno> {
        let info = match loop_ioctl::status(fd) {
            Ok(info) => info,
            Err(Errno::NXIO) => return Ok(None),
            Err(e) => return Err(e),
        };
        let device = loop_ioctl::sysfs_device(&self.sys_block, number).ok_or(Errno::NODEV)?;
        // lo_device is the backing filesystem's device in the encoding stat uses.
        let backing = FileId {
            dev_major: rustix::fs::major(info.lo_device),
            dev_minor: rustix::fs::minor(info.lo_device),
            ino: info.lo_inode,
        };
        let facts = LoopFacts { number, device, backing, offset: info.lo_offset, size_limit: info.lo_sizelimit };
        Ok(Some((facts, info.lo_flags & loop_ioctl::LO_FLAGS_DIRECT_IO != 0)))
    }

    /// Attaches the open backing `file` to a free loop, whole, autoclear off, with direct I/O
    /// when `direct_io` and the filesystem allows it (else without). Returns the loop as read
    /// back from the kernel.
    pub fn attach(&self, file: BorrowedFd<'_>, direct_io: bool) -> Result<AttachedLoop, PoolError> {
        let control = rustix::fs::open(self.dev.join("loop-control"), OFlags::RDWR | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| self.io("open the loop control device", None, e))?;
        let expected = loop_ioctl::file_id(file).map_err(|e| self.io("stat the backing file", None, e))?;
        // Another process may take the free loop between GET_FREE and CONFIGURE: try again.
        for _ in 0..16 {
            let number =
                loop_ioctl::get_free(control.as_fd()).map_err(|e| self.io("find a free loop device", None, e))?;
            let device = match loop_ioctl::open_loop(&self.dev, &self.sys_block, number, OFlags::RDWR) {
                Ok(fd) => fd,
                // The node appears on devtmpfs shortly after the kernel makes the device.
                Err(Errno::NOENT | Errno::NODEV) => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    continue;
                }
                Err(e) => return Err(self.io("open a loop device", Some(number), e)),
            };
            let flags = if direct_io { loop_ioctl::LO_FLAGS_DIRECT_IO } else { 0 };
            let mut result = loop_ioctl::configure(device.as_fd(), file, flags);
            if result == Err(Errno::INVAL) && direct_io {
                // The filesystem cannot do direct I/O for this file (tmpfs, a block size the
                // loop cannot match): buffered I/O instead.
                result = loop_ioctl::configure(device.as_fd(), file, 0);
            }
            match result {
                Ok(()) => {}
                Err(Errno::BUSY) => continue,
                Err(e) => return Err(self.io("attach the backing file to a loop device", Some(number), e)),
            }
            let Some((facts, direct_io)) = self
                .facts_of(device.as_fd(), number)
                .map_err(|e| self.io("read a loop device's status", Some(number), e))?
            else {
                return Err(PoolError::LoopChanged { number });
            };
            if facts.backing != expected {
                return Err(PoolError::LoopChanged { number });
            }
            return Ok(AttachedLoop { facts, backing_name: String::new(), direct_io });
        }
        Err(self.io("attach the backing file to a loop device", None, Errno::BUSY))
    }

    /// Opens loop `number` and checks that its backing file is still `expected`, right before
    /// acting on it.
    fn open_checked(&self, number: u32, expected: FileId) -> Result<OwnedFd, PoolError> {
        let fd = match loop_ioctl::open_loop(&self.dev, &self.sys_block, number, OFlags::RDONLY) {
            Ok(fd) => fd,
            Err(Errno::NOENT | Errno::NXIO | Errno::NODEV) => return Err(PoolError::LoopChanged { number }),
            Err(e) => return Err(self.io("open a loop device", Some(number), e)),
        };
        match self.facts_of(fd.as_fd(), number) {
            Ok(Some((facts, _))) if facts.backing == expected && facts.offset == 0 => Ok(fd),
            Ok(_) => Err(PoolError::LoopChanged { number }),
            Err(e) => Err(self.io("read a loop device's status", Some(number), e)),
        }
    }

    /// Detaches loop `number`, only while its backing file is `expected` (the volume's, as
    /// [`loop_safety::decide_detach`] decided).
    pub fn detach(&self, number: u32, expected: FileId) -> Result<Detached, PoolError> {
        let fd = self.open_checked(number, expected)?;
        loop_ioctl::clear(fd.as_fd()).map_err(|e| self.io("detach a loop device", Some(number), e))?;
        drop(fd);
        let attached = self.sys_block.join(format!("loop{number}/loop/backing_file"));
        if attached.exists() && matches!(self.read_loop(number), Ok(Some(l)) if l.facts.backing == expected) {
            Ok(Detached::AtLastClose)
        } else {
            Ok(Detached::Now)
        }
    }

    /// Writes what loop `number` (still on `expected`) holds in its page cache to its backing
    /// file (`fsync` of the device): the writes a pod made through the device and did not flush
    /// itself are in the file before the file is copied.
    pub fn flush(&self, number: u32, expected: FileId) -> Result<(), PoolError> {
        let fd = self.open_checked(number, expected)?;
        rustix::fs::fsync(&fd).map_err(|e| self.io("flush a loop device", Some(number), e))
    }

    /// Makes loop `number`, still on `expected`, see its backing file's new size.
    pub fn refresh_capacity(&self, number: u32, expected: FileId) -> Result<(), PoolError> {
        let fd = self.open_checked(number, expected)?;
        loop_ioctl::set_capacity(fd.as_fd()).map_err(|e| self.io("resize a loop device", Some(number), e))
    }
}

/// What stands at the backing file's place in the volume directory `dir` (never following a
/// symlink), and the file opened read-write when it is a regular file. A device node, fifo or
/// socket is never opened.
pub fn open_backing(dir: BorrowedFd<'_>, dir_path: &Path) -> Result<(BackingFile, Option<OwnedFd>), PoolError> {
    let path = || dir_path.join(BACKING_FILE);
    let st = match rustix::fs::statat(dir, BACKING_FILE, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => st,
        Err(Errno::NOENT) => return Ok((BackingFile::Missing, None)),
        Err(e) => return Err(fs_error("stat the backing file", path(), e)),
    };
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Symlink => return Ok((BackingFile::Symlink, None)),
        FileType::RegularFile => {}
        _ => return Ok((BackingFile::Other, None)),
    }
    let fd = match rustix::fs::openat(
        dir,
        BACKING_FILE,
        OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok((BackingFile::Missing, None)),
        Err(Errno::LOOP) => return Ok((BackingFile::Symlink, None)),
        Err(e) => return Err(fs_error("open the backing file", path(), e)),
    };
    let opened = rustix::fs::fstat(&fd).map_err(|e| fs_error("stat the backing file", path(), e))?;
    if FileType::from_raw_mode(opened.st_mode) != FileType::RegularFile
        || (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino)
    {
        return Err(PoolError::TreeChanged { path: path() });
    }
    let id = loop_ioctl::file_id(&fd).map_err(|e| fs_error("stat the backing file", path(), e))?;
    Ok((BackingFile::Regular(id), Some(fd)))
}

/// Makes the backing file in the volume directory `dir` (or finds the one a crashed attempt
/// made), mode 0600, at least `size` bytes: sparse, or with every block allocated for
/// [`Allocation::Full`]. Returns it open and its inode, to be recorded on the PV.
pub fn create_backing(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    size: u64,
    allocation: Allocation,
) -> Result<(OwnedFd, FileId), PoolError> {
    let path = || dir_path.join(BACKING_FILE);
    let fd = match rustix::fs::openat(
        dir,
        BACKING_FILE,
        OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    ) {
        Ok(fd) => fd,
        Err(Errno::EXIST) => match open_backing(dir, dir_path)? {
            (BackingFile::Regular(_), Some(fd)) => fd,
            (found, _) => {
                let refusal = match found {
                    BackingFile::Symlink => LoopRefusal::Symlink,
                    BackingFile::Missing => return Err(PoolError::TreeChanged { path: path() }),
                    _ => LoopRefusal::NotRegular,
                };
                return Err(PoolError::BlockRefused { path: path(), refusal });
            }
        },
        Err(e) => return Err(fs_error("create the backing file", path(), e)),
    };
    grow_backing(fd.as_fd(), dir_path, size, allocation)?;
    let id = loop_ioctl::file_id(&fd).map_err(|e| fs_error("stat the backing file", path(), e))?;
    Ok((fd, id))
}

/// The backing file a copy (a clone, a restore) brought into the volume directory `dir`, grown
/// to `size` as [`create_backing`] would: refused when the copy holds none, or a symlink or
/// other in its place (a Filesystem volume's tree restored under a forged mode), never made
/// afresh: an empty device would stand for the copied data.
pub fn copied_backing(
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    size: u64,
    allocation: Allocation,
) -> Result<(OwnedFd, FileId), PoolError> {
    let refusal = match open_backing(dir, dir_path)? {
        (BackingFile::Regular(id), Some(fd)) => {
            grow_backing(fd.as_fd(), dir_path, size, allocation)?;
            return Ok((fd, id));
        }
        (BackingFile::Symlink, _) => LoopRefusal::Symlink,
        (BackingFile::Missing, _) => LoopRefusal::Missing,
        _ => LoopRefusal::NotRegular,
    };
    Err(PoolError::BlockRefused { path: dir_path.join(BACKING_FILE), refusal })
}

/// The birth time of the backing file in the volume directory `dir` (not following a symlink):
/// `None` when it is missing or the filesystem records no birth time.
pub fn backing_birth(dir: BorrowedFd<'_>, dir_path: &Path) -> Result<Option<Birth>, PoolError> {
    match rustix::fs::statx(dir, BACKING_FILE, AtFlags::SYMLINK_NOFOLLOW, rustix::fs::StatxFlags::BTIME) {
        Ok(st) if st.stx_mask & rustix::fs::StatxFlags::BTIME.bits() != 0 => {
            Ok(Some(Birth { seconds: st.stx_btime.tv_sec, nanoseconds: st.stx_btime.tv_nsec }))
        }
        Ok(_) | Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(fs_error("read the backing file's birth time", dir_path.join(BACKING_FILE), e)),
    }
}

/// Unlinks the backing file from the volume directory `dir` (as a name, never followed): the
/// undo of a Block volume whose provisioning failed, once [`release`] detached its loops.
pub fn remove_backing(dir: BorrowedFd<'_>, dir_path: &Path) -> Result<(), PoolError> {
    match rustix::fs::unlinkat(dir, BACKING_FILE, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(fs_error("remove the backing file", dir_path.join(BACKING_FILE), e)),
    }
}

/// Grows the open backing file to `size` bytes (never shrinks it): `ftruncate`, or `fallocate`
/// of the whole range for [`Allocation::Full`]. A loop on it sees the size after
/// [`LoopHost::refresh_capacity`].
pub fn grow_backing(file: BorrowedFd<'_>, dir_path: &Path, size: u64, allocation: Allocation) -> Result<(), PoolError> {
    let path = || dir_path.join(BACKING_FILE);
    let current = rustix::fs::fstat(file).map_err(|e| fs_error("stat the backing file", path(), e))?.st_size;
    match allocation {
        Allocation::Full => rustix::fs::fallocate(file, FallocateFlags::empty(), 0, size)
            .map_err(|e| fs_error("allocate the backing file", path(), e)),
        Allocation::Sparse if u64::try_from(current).unwrap_or(0) < size => {
            rustix::fs::ftruncate(file, size).map_err(|e| fs_error("size the backing file", path(), e))
        }
        Allocation::Sparse => Ok(()),
    }
}

/// The directory of device nodes on the host's devtmpfs
/// ([`crate::deciding::block::DEVICE_DIR`]), opened once; nodes are made and removed by name
/// relative to it, never by a path that could be redirected.
#[derive(Debug)]
pub struct DeviceDir {
    fd: OwnedFd,
    path: PathBuf,
}

impl DeviceDir {
    /// Opens (making it, mode 0700, when missing) the device directory at `path`. A symlink
    /// there is refused.
    pub fn open(path: &Path) -> Result<Self, PoolError> {
        match rustix::fs::mkdir(path, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(fs_error("create the device node directory", path.to_owned(), e)),
        }
        let fd = rustix::fs::open(
            path,
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
            Mode::empty(),
        )
        .map_err(|e| fs_error("open the device node directory", path.to_owned(), e))?;
        Ok(DeviceDir { fd, path: path.to_owned() })
    }

    /// What stands at node `name`, not following a symlink.
    pub fn entry(&self, name: &VolumeDirName) -> Result<NodeEntry, PoolError> {
        match rustix::fs::statat(&self.fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(match FileType::from_raw_mode(st.st_mode) {
                FileType::BlockDevice => {
                    NodeEntry::BlockDevice((rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev)))
                }
                FileType::Directory => NodeEntry::Directory,
                _ => NodeEntry::Other,
            }),
            Err(Errno::NOENT) => Ok(NodeEntry::Absent),
            Err(e) => Err(fs_error("stat a device node", self.path.join(name.as_str()), e)),
        }
    }

    /// Carries out `action` for node `name` of loop `device`: a block device node, mode 0600.
    pub fn apply(&self, name: &VolumeDirName, action: NodeAction, device: (u32, u32)) -> Result<(), PoolError> {
        let path = || self.path.join(name.as_str());
        match action {
            NodeAction::Keep => return Ok(()),
            NodeAction::Replace => self.remove(name)?,
            NodeAction::Make => {}
        }
        let mode = Mode::from_raw_mode(0o600);
        match rustix::fs::mknodat(
            &self.fd,
            name.as_str(),
            FileType::BlockDevice,
            mode,
            rustix::fs::makedev(device.0, device.1),
        ) {
            Ok(()) => Ok(()),
            // Made meanwhile: the next attempt decides again on what is there.
            Err(Errno::EXIST) => Err(PoolError::TreeChanged { path: path() }),
            Err(e) => Err(fs_error("make a device node", path(), e)),
        }
    }

    /// The names in the directory (for [`loop_safety::stale_nodes`]).
    pub fn names(&self) -> Result<Vec<String>, PoolError> {
        let listing =
            rustix::fs::openat(&self.fd, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
                .and_then(rustix::fs::Dir::new)
                .map_err(|e| fs_error("list the device node directory", self.path.clone(), e))?;
        let mut names = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|e| fs_error("list the device node directory", self.path.clone(), e))?;
            let name = entry.file_name().to_string_lossy();
            if name != "." && name != ".." {
                names.push(name.into_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    /// Unlinks node `name` (any non-directory, as a name: never followed or opened).
    pub fn remove(&self, name: &VolumeDirName) -> Result<(), PoolError> {
        match rustix::fs::unlinkat(&self.fd, name.as_str(), AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(Errno::ISDIR) => Err(PoolError::BlockRefused {
                path: self.path.join(name.as_str()),
                refusal: LoopRefusal::DirectoryAtNode,
            }),
            Err(e) => Err(fs_error("remove a device node", self.path.join(name.as_str()), e)),
        }
    }
}

impl PoolRoot {
    /// Opens the volume directory `name` that holds a Block volume's backing file, as every
    /// volume operation does: beneath the root, never following a symlink nor entering a
    /// mount. `None` when it is not there.
    pub fn open_block_volume_dir(&self, name: &VolumeDirName) -> Result<Option<OwnedFd>, PoolError> {
        let path = self.volume_path(name);
        match self.open_dir_beneath(self.fd.as_fd(), name.as_str(), &|| path.clone(), Subvolumes::Refuse)? {
            DirOpen::Opened(fd, _) => Ok(Some(fd)),
            DirOpen::Gone => Ok(None),
            DirOpen::NotDirectory => Err(PoolError::VolumeNotDirectory { path }),
        }
    }
}

/// Attaches (if needed) and exposes the Block volume whose directory is `dir`: the decisions of
/// [`loop_safety`] on the facts read, then the node `node` in `devices`. Returns the loop.
pub fn expose(
    host: &LoopHost,
    devices: &DeviceDir,
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    volume: Volume,
    node: &VolumeDirName,
    direct_io: bool,
) -> Result<AttachedLoop, PoolError> {
    let refused = |refusal| PoolError::BlockRefused { path: dir_path.join(BACKING_FILE), refusal };
    let _turn = take_turn(dir, dir_path)?;
    let (file, fd) = open_backing(dir, dir_path)?;
    let mut loops = host.loops()?;
    let facts: Vec<LoopFacts> = loops.iter().map(|l| l.facts.clone()).collect();
    let (number, device) = match loop_safety::decide_attachment(volume, file, &facts).map_err(refused)? {
        Attachment::Use { number, device } => (number, device),
        Attachment::Attach => {
            let fd = fd.ok_or(PoolError::TreeChanged { path: dir_path.join(BACKING_FILE) })?;
            let attached = host.attach(fd.as_fd(), direct_io)?;
            let number = attached.facts.number;
            loops.retain(|l| l.facts.number != number);
            loops.push(attached);
            // Decided again on the loops as they are now: were the file attached twice in the
            // meantime, nothing is exposed.
            let facts: Vec<LoopFacts> = host.loops()?.into_iter().map(|l| l.facts).collect();
            match loop_safety::decide_attachment(volume, file, &facts).map_err(refused)? {
                Attachment::Use { number, device } => (number, device),
                Attachment::Attach => return Err(PoolError::LoopChanged { number }),
            }
        }
    };
    let action = loop_safety::decide_node(devices.entry(node)?, device).map_err(refused)?;
    devices.apply(node, action, device)?;
    let mut found = loops.into_iter().find(|l| l.facts.number == number).ok_or(PoolError::LoopChanged { number })?;
    found.facts.device = device;
    Ok(found)
}

/// Two acts on one volume at once (a provisioner starting while the previous one still runs,
/// an expansion while the volume is exposed) would each read the loops before the other acted:
/// they take turns on a lock of the volume directory, held by a description of its own and
/// released when it is dropped. Not on the backing file: the loop keeps the very description it
/// was given, and a lock on it would be held for as long as the loop is attached.
fn take_turn(dir: BorrowedFd<'_>, dir_path: &Path) -> Result<OwnedFd, PoolError> {
    rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .and_then(|turn| rustix::fs::flock(&turn, rustix::fs::FlockOperation::LockExclusive).map(|()| turn))
        .map_err(|e| fs_error("lock the volume directory", dir_path.to_owned(), e))
}

/// Grows the Block volume whose directory is `dir` to `size` bytes while it stays attached:
/// the backing file first (checked to be the volume's by [`loop_safety::decide_attachment`]
/// before a byte is allocated), then its loop is told the new size (`LOOP_SET_CAPACITY`, on the
/// loop checked again by inode right before). Returns that loop, `None` when none is attached
/// (the next attach sees the new size). A file on several loops or on part of one is refused,
/// nothing grown.
pub fn grow_volume(
    host: &LoopHost,
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    volume: Volume,
    size: u64,
    allocation: Allocation,
) -> Result<Option<u32>, PoolError> {
    let refused = |refusal| PoolError::BlockRefused { path: dir_path.join(BACKING_FILE), refusal };
    let _turn = take_turn(dir, dir_path)?;
    let (file, fd) = open_backing(dir, dir_path)?;
    let facts: Vec<LoopFacts> = host.loops()?.into_iter().map(|l| l.facts).collect();
    let attachment = loop_safety::decide_attachment(volume, file, &facts).map_err(refused)?;
    let (BackingFile::Regular(id), Some(fd)) = (file, fd) else {
        return Err(PoolError::TreeChanged { path: dir_path.join(BACKING_FILE) });
    };
    grow_backing(fd.as_fd(), dir_path, size, allocation)?;
    match attachment {
        Attachment::Attach => Ok(None),
        Attachment::Use { number, .. } => {
            host.refresh_capacity(number, id)?;
            Ok(Some(number))
        }
    }
}

/// Before the backing file of the Block volume whose directory is `dir` is copied (a clone, a
/// snapshot): checks it is the volume's ([`loop_safety::check_backing`]), then flushes every
/// loop on it (see [`LoopHost::flush`]); returns how many. Anything else at its place is
/// refused: never copied as the volume.
pub fn flush_before_copy(
    host: &LoopHost,
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    volume: Volume,
) -> Result<usize, PoolError> {
    let (file, _fd) = open_backing(dir, dir_path)?;
    let id = loop_safety::check_backing(volume, file)
        .map_err(|refusal| PoolError::BlockRefused { path: dir_path.join(BACKING_FILE), refusal })?;
    let on_file: Vec<u32> =
        host.loops()?.into_iter().filter(|l| l.facts.backing == id).map(|l| l.facts.number).collect();
    for number in &on_file {
        host.flush(*number, id)?;
    }
    Ok(on_file.len())
}

/// Releases the Block volume whose directory is `dir`: removes its node, then detaches every
/// loop on its backing file and nothing else. `Detached::AtLastClose` when one is still open.
pub fn release(
    host: &LoopHost,
    devices: &DeviceDir,
    dir: BorrowedFd<'_>,
    dir_path: &Path,
    volume: Volume,
    node: &VolumeDirName,
) -> Result<Detached, PoolError> {
    let refused = |refusal| PoolError::BlockRefused { path: dir_path.join(BACKING_FILE), refusal };
    let (file, _fd) = open_backing(dir, dir_path)?;
    let facts: Vec<LoopFacts> = host.loops()?.into_iter().map(|l| l.facts).collect();
    let to_detach = loop_safety::decide_detach(volume, file, &facts).map_err(refused)?;
    // The node goes first, so that nothing new opens the device while it is detached. A
    // directory at its place is no node (it opens no device) and is never removed: the loops
    // are detached all the same, so that a volume undone after such a refusal keeps none.
    match loop_safety::remove_node(devices.entry(node)?) {
        Ok(true) => devices.remove(node)?,
        Ok(false) | Err(LoopRefusal::DirectoryAtNode) => {}
        Err(refusal) => return Err(refused(refusal)),
    }
    let BackingFile::Regular(id) = file else { return Ok(Detached::Now) };
    let mut outcome = Detached::Now;
    for number in to_detach {
        if host.detach(number, id)? == Detached::AtLastClose {
            outcome = Detached::AtLastClose;
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests;

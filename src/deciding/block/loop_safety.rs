//! May this loop device be exposed, or detached, as this Block volume's? Pure decisions over the
//! facts read about the volume's backing file (without following a symlink) and the attached
//! loops (sysfs and `LOOP_GET_STATUS64`).
//!
//! The one rule: a loop is this volume's only when its backing file is, by device and inode, the
//! regular file at the volume's path, and that file's inode is the one recorded on the PV when
//! the file was made. Names are never trusted: a loop whose backing file is *named* like ours
//! but is another inode is someone else's, used for nothing and never detached.

/// The identity of a file: the device of its filesystem (major, minor) and its inode number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    /// Major number of the filesystem's device.
    pub dev_major: u32,
    /// Minor number of the filesystem's device.
    pub dev_minor: u32,
    /// Inode number.
    pub ino: u64,
}

/// What is at a Block volume's backing path, read without following a symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackingFile {
    /// A regular file.
    Regular(FileId),
    /// A symbolic link: never followed, never attached.
    Symlink,
    /// A directory, device, fifo or socket.
    Other,
    /// Nothing.
    Missing,
}

/// One attached loop device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopFacts {
    /// N of `/dev/loopN`.
    pub number: u32,
    /// The loop's own device number (sysfs `dev`), what a device node for it must carry.
    pub device: (u32, u32),
    /// Its backing file (`lo_device`, `lo_inode`).
    pub backing: FileId,
    /// `lo_offset`: a loop that starts inside the file exposes part of it only.
    pub offset: u64,
    /// `lo_sizelimit` (0: the whole file).
    pub size_limit: u64,
}

/// What the volume says its backing file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Volume {
    /// The inode recorded on the PV; `None` while the volume is being provisioned (no PV yet,
    /// the file just made by this provisioning).
    pub recorded_inode: Option<u64>,
}

/// Why a loop is not exposed or not detached for a volume (an Event on the PV or claim, and a
/// log line; nothing is done until the facts change).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoopRefusal {
    /// The backing file is not there.
    #[error("the volume's backing file is missing")]
    Missing,
    /// A symlink stands where the backing file should be.
    #[error("the volume's backing file is a symbolic link; it is never followed")]
    Symlink,
    /// Something other than a regular file stands there.
    #[error("the volume's backing file is not a regular file")]
    NotRegular,
    /// A regular file, but not the one made for the volume.
    #[error(
        "the volume's backing file is inode {found}, not inode {recorded} made for this volume: it was replaced, and is neither attached nor detached"
    )]
    Replaced {
        /// Inode recorded on the PV.
        recorded: u64,
        /// Inode found at the path.
        found: u64,
    },
    /// The file is attached to several loops: someone else attached it too, and two loops on
    /// one file each cache its blocks, so neither is handed to a pod.
    #[error("the volume's backing file is attached to several loop devices ({0:?}); detach the extra ones")]
    AttachedMoreThanOnce(Vec<u32>),
    /// The one loop on the file exposes a part of it only (attached by someone else).
    #[error("loop{number} maps the backing file from offset {offset} with size limit {size_limit}, not the whole file")]
    Partial {
        /// The loop.
        number: u32,
        /// Its offset.
        offset: u64,
        /// Its size limit.
        size_limit: u64,
    },
    /// The file is gone while a loop still holds an inode of the recorded number: it cannot be
    /// told apart from another file that took the number, so it is left to an administrator.
    #[error(
        "the backing file is gone but loop devices {0:?} hold an inode of its number; check and detach them by hand"
    )]
    GoneWhileAttached(Vec<u32>),
    /// A directory stands where the device node goes: never removed.
    #[error("a directory stands where the volume's device node goes")]
    DirectoryAtNode,
}

/// How a Block volume gets its loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attachment {
    /// No loop holds the file: attach one.
    Attach,
    /// This loop holds the whole file, and only it: its node may be made.
    Use {
        /// N of `/dev/loopN`.
        number: u32,
        /// Its device number.
        device: (u32, u32),
    },
}

/// The backing file, checked to be the volume's: a regular file, with the recorded inode.
fn checked_file(volume: Volume, file: BackingFile) -> Result<FileId, LoopRefusal> {
    match file {
        BackingFile::Missing => Err(LoopRefusal::Missing),
        BackingFile::Symlink => Err(LoopRefusal::Symlink),
        BackingFile::Other => Err(LoopRefusal::NotRegular),
        BackingFile::Regular(id) => match volume.recorded_inode {
            Some(recorded) if recorded != id.ino => Err(LoopRefusal::Replaced { recorded, found: id.ino }),
            _ => Ok(id),
        },
    }
}

/// The backing file, checked to be `volume`'s (a regular file of the recorded inode), before it
/// is copied (a clone, a snapshot): a file put in its place is never copied as the volume.
pub fn check_backing(volume: Volume, file: BackingFile) -> Result<FileId, LoopRefusal> {
    checked_file(volume, file)
}

/// Which loop, if any, may be exposed as `volume`'s device (made into its node), or whether one
/// must be attached first.
pub fn decide_attachment(volume: Volume, file: BackingFile, loops: &[LoopFacts]) -> Result<Attachment, LoopRefusal> {
    let id = checked_file(volume, file)?;
    let on_file: Vec<&LoopFacts> = loops.iter().filter(|l| l.backing == id).collect();
    match on_file.as_slice() {
        [] => Ok(Attachment::Attach),
        [only] if only.offset != 0 || only.size_limit != 0 => {
            Err(LoopRefusal::Partial { number: only.number, offset: only.offset, size_limit: only.size_limit })
        }
        [only] => Ok(Attachment::Use { number: only.number, device: only.device }),
        several => Err(LoopRefusal::AttachedMoreThanOnce(several.iter().map(|l| l.number).collect())),
    }
}

/// The loops to detach when `volume` is deleted: every loop whose backing file is the volume's
/// (checked as for [`decide_attachment`]), and nothing else. A replaced or symlinked file
/// detaches nothing.
pub fn decide_detach(volume: Volume, file: BackingFile, loops: &[LoopFacts]) -> Result<Vec<u32>, LoopRefusal> {
    if file == BackingFile::Missing {
        let holding: Vec<u32> = match volume.recorded_inode {
            Some(recorded) => loops.iter().filter(|l| l.backing.ino == recorded).map(|l| l.number).collect(),
            None => Vec::new(),
        };
        return if holding.is_empty() { Ok(Vec::new()) } else { Err(LoopRefusal::GoneWhileAttached(holding)) };
    }
    let id = checked_file(volume, file)?;
    Ok(loops.iter().filter(|l| l.backing == id).map(|l| l.number).collect())
}

/// Loops that are not the volume's but whose backing file the kernel names with the volume's
/// path (`names_our_path` says which): reported, never used nor detached.
pub fn strangers(
    volume: Volume,
    file: BackingFile,
    loops: &[LoopFacts],
    names_our_path: impl Fn(u32) -> bool,
) -> Vec<u32> {
    let ours = checked_file(volume, file).ok();
    loops.iter().filter(|l| Some(l.backing) != ours && names_our_path(l.number)).map(|l| l.number).collect()
}

/// What stands at the volume's device node path, read without following a symlink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeEntry {
    /// Nothing.
    Absent,
    /// A block device node of this number.
    BlockDevice((u32, u32)),
    /// A directory.
    Directory,
    /// A symlink, regular file, character device, fifo or socket.
    Other,
}

/// What to do at the device node path, once a loop was checked to be the volume's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeAction {
    /// The node is there and names the loop.
    Keep,
    /// Nothing is there: make the node.
    Make,
    /// Something else carries the volume's name in our directory (a node of a loop number
    /// from before a restart, a symlink): unlink the name, never following it, then make it.
    Replace,
}

/// What to do at the node path for the checked loop `device`.
pub fn decide_node(entry: NodeEntry, device: (u32, u32)) -> Result<NodeAction, LoopRefusal> {
    match entry {
        NodeEntry::Absent => Ok(NodeAction::Make),
        NodeEntry::BlockDevice(found) if found == device => Ok(NodeAction::Keep),
        NodeEntry::BlockDevice(_) | NodeEntry::Other => Ok(NodeAction::Replace),
        NodeEntry::Directory => Err(LoopRefusal::DirectoryAtNode),
    }
}

/// Whether the entry at the volume's node path is unlinked when the volume is deleted or found
/// with no loop of its own: any non-directory (unlinked as a name, never followed or opened).
pub fn remove_node(entry: NodeEntry) -> Result<bool, LoopRefusal> {
    match entry {
        NodeEntry::Absent => Ok(false),
        NodeEntry::Directory => Err(LoopRefusal::DirectoryAtNode),
        NodeEntry::BlockDevice(_) | NodeEntry::Other => Ok(true),
    }
}

#[cfg(test)]
mod tests;

/// The entries of the device directory to unlink at start-up: every node named for no Block PV
/// this node serves (its volume was deleted while the provisioner was down, or a reboot kept
/// nothing but the name): left, it would name whatever loop later takes its number. Entries
/// not shaped like a PV name are not ours and stay.
pub fn stale_nodes<'a>(entries: &'a [String], served: &[&str]) -> Vec<&'a str> {
    entries
        .iter()
        .map(String::as_str)
        .filter(|name| crate::deciding::layout::uid_from_pv_name(name).is_some() && !served.contains(name))
        .collect()
}

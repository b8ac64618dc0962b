//! Raw block volumes from the pool (issue #47): where a Block volume's backing file and device
//! node live, and the PV that names the node. Pure.
//!
//! A Block volume is a volume directory like any other (`<pool>/<dir>/`), holding one file,
//! [`BACKING_FILE`], attached to a loop device. Keeping the directory, rather than a file
//! directly under the pool root, keeps every rule that already guards volumes: the directory's
//! name ties it to the PV ([`crate::deciding::layout::accept_delete_path`]), deletion moves the
//! directory to the trash and removes it by descriptor, the reaper and the capacity listings see
//! one more directory, a project quota applies to it.
//!
//! The PV names a device node on the host's devtmpfs, [`DEVICE_DIR`]`/<pv-name>`, never
//! `/dev/loopN`: loop numbers change across reboots and restarts, and a node on devtmpfs is gone
//! at reboot, so a pod started before the provisioner re-attached its file finds no device and
//! waits instead of opening whatever loop took the number. The node is made only after the
//! loop's backing file was checked by inode ([`loop_safety`]).

use std::path::{Path, PathBuf};

use crate::deciding::layout;
use crate::deciding::topology::Topology;

pub mod claim;
pub mod kept;
pub mod loop_safety;
pub mod released;

/// The node setting that turns Block volumes on: they need the host's `/dev` and
/// `/dev/loop-control`, more privilege than directory volumes, so each install opts in.
pub const SETTING: &str = "--block-volumes";

/// The directory on the host's devtmpfs holding one device node per attached Block volume (the
/// default of `BLOCK_DEVICE_DIR`; tests sharing one host give each provisioner its own).
pub const DEVICE_DIR: &str = "/dev/hostpath-provisioner";

/// The backing file's name inside its volume directory. Not `disk.img`, the name KubeVirt gives
/// a VM disk inside a Filesystem volume, so that the two are never confused in a listing.
pub const BACKING_FILE: &str = "block.img";

/// PV annotation: the backing file's inode number, recorded when the file was made. The file at
/// the path is this volume's only while it is a regular file with this inode on the pool's
/// filesystem: a file put in its place (same name, other inode) is never attached nor exposed.
pub const BACKING_INODE_ANNOTATION: &str = "hostpath-provisioner.kubevirt.io/block-backing-inode";

/// PV annotation: the backing file's birth time, `<seconds>.<nanoseconds>`, where the filesystem
/// records one. An inode number is free for reuse as soon as its file is gone (ext4 gives a file
/// made right after another's deletion the same number), so the number alone cannot tell the
/// volume's file from one made in its place later; its birth time can.
pub const BACKING_BIRTH_ANNOTATION: &str = "hostpath-provisioner.kubevirt.io/block-backing-birth";

/// A file's birth time (`statx` `stx_btime`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Birth {
    /// Seconds since the epoch.
    pub seconds: i64,
    /// Nanoseconds.
    pub nanoseconds: u32,
}

impl Birth {
    /// The annotation's value.
    pub fn to_annotation(self) -> String {
        format!("{}.{:09}", self.seconds, self.nanoseconds)
    }

    /// Reads an annotation's value back (`None` when it is not one this provisioner writes).
    pub fn parse(value: &str) -> Option<Birth> {
        let (seconds, nanoseconds) = value.split_once('.')?;
        if nanoseconds.len() != 9 || !nanoseconds.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let nanoseconds = nanoseconds.parse::<u32>().ok().filter(|n| *n < 1_000_000_000)?;
        Some(Birth { seconds: seconds.parse().ok()?, nanoseconds })
    }
}

/// PV annotation: the volume directory holding the backing file (as a hostPath PV's path), read
/// by deletion, which accepts it by the same rules as a directory volume's.
pub const BACKING_DIR_ANNOTATION: &str = "hostpath-provisioner.kubevirt.io/block-backing-dir";

/// The StorageClass parameter choosing how the backing file is allocated.
pub const ALLOCATION_PARAMETER: &str = "allocation";

/// How the backing file's blocks are allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// A sparse file: blocks are allocated as the workload writes (the default; the pool may be
    /// overcommitted, as directory volumes are).
    Sparse,
    /// Every block allocated up front (`fallocate`): a write never fails for want of room.
    Full,
}

impl Allocation {
    /// The class's `allocation` parameter (absent: sparse); the error lists what is accepted.
    pub fn parse(value: Option<&str>) -> Result<Self, &'static str> {
        match value {
            None | Some("sparse") => Ok(Self::Sparse),
            Some("full") => Ok(Self::Full),
            Some(_) => Err("sparse, full"),
        }
    }
}

/// Why a Block volume's path or PV is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BlockPathRefusal {
    /// The PV name is not `pvc-<uid>`, so no node name can be derived from it safely.
    #[error("PV name {0:?} is not pvc-<uid>; a block device node is only named after a claim UID")]
    ForeignPvName(String),
    /// A Block volume must be pinned to its node: the loop and its node exist there only.
    #[error("a Block volume lives on one node's loop device; topology {0} cannot hold it")]
    NotNodeTopology(Topology),
    /// The PV's path is not this volume's node (a host device, another volume's node, `..`).
    #[error("path {path:?} is not {expected:?}, the only device node a Block PV {pv} may name")]
    NotItsNode {
        /// The refused path.
        path: String,
        /// The node this PV's name gives.
        expected: String,
        /// The PV name.
        pv: String,
    },
}

/// The device node of PV `pv_name` in `device_dir`: `/dev/hostpath-provisioner/pvc-<uid>`. Only
/// a `pvc-<uid>` name is accepted, so the node is a single component of known characters.
pub fn device_node_path(device_dir: &Path, pv_name: &str) -> Result<PathBuf, BlockPathRefusal> {
    layout::uid_from_pv_name(pv_name)
        .map(|_| device_dir.join(pv_name))
        .ok_or_else(|| BlockPathRefusal::ForeignPvName(pv_name.to_owned()))
}

/// The backing file of a Block volume in directory `dir_name` of the pool at `pool_root`.
pub fn backing_file_path(pool_root: &Path, dir_name: &str) -> PathBuf {
    pool_root.join(dir_name).join(BACKING_FILE)
}

/// Accepts `path`, read from a PV's `spec.local.path`, as the device node of PV `pv_name`, or
/// refuses it. Compared as text after lexical normalisation: the only path a Block PV of ours
/// may name is its own node, so a forged PV naming `/dev/sda`, another volume's node or a path
/// climbing out of the device directory is refused before anything is made, detached or removed.
pub fn accept_device_path(path: &str, pv_name: &str, device_dir: &Path) -> Result<PathBuf, BlockPathRefusal> {
    let expected = device_node_path(device_dir, pv_name)?;
    match layout::normalise(path) {
        Ok(normal) if normal == expected => Ok(expected),
        _ => Err(BlockPathRefusal::NotItsNode {
            path: path.to_owned(),
            expected: expected.to_string_lossy().into_owned(),
            pv: pv_name.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests;

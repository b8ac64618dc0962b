//! btrfs ioctls for quota volumes: subvolume creation, the subvolume id of a descriptor, qgroup
//! limits and removal, and enabling quota (tests and admins; the provisioner never enables it).
//!
//! The structures mirror `include/uapi/linux/btrfs.h`; the kernel ABI is stable, so they are
//! spelled out here instead of pulling in a bindings crate for six calls.

use std::os::fd::AsFd;

use rustix::io::Errno;
use rustix::ioctl::{Getter, Updater, ioctl, opcode};

/// `BTRFS_IOCTL_MAGIC`.
const MAGIC: u8 = 0x94;
/// `BTRFS_FIRST_FREE_OBJECTID`: the inode number of every subvolume's root directory.
pub const SUBVOLUME_ROOT_INO: u64 = 256;
/// `BTRFS_SUPER_MAGIC`, the `f_type` of btrfs in `statfs(2)`.
pub const SUPER_MAGIC: u64 = 0x9123_683e;
/// `BTRFS_QGROUP_LIMIT_MAX_RFER`.
const LIMIT_MAX_RFER: u64 = 1;
/// `BTRFS_QUOTA_CTL_ENABLE`.
const QUOTA_CTL_ENABLE: u64 = 1;
/// `BTRFS_PATH_NAME_MAX`.
const PATH_NAME_MAX: usize = 4087;

/// `struct btrfs_ioctl_vol_args`.
#[repr(C)]
struct VolArgs {
    fd: i64,
    name: [u8; PATH_NAME_MAX + 1],
}

/// `struct btrfs_ioctl_ino_lookup_args`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `struct btrfs_qgroup_limit`.
#[repr(C)]
struct QgroupLimit {
    flags: u64,
    max_rfer: u64,
    max_excl: u64,
    rsv_rfer: u64,
    rsv_excl: u64,
}

/// `struct btrfs_ioctl_qgroup_limit_args`.
#[repr(C)]
struct QgroupLimitArgs {
    qgroupid: u64,
    lim: QgroupLimit,
}

/// `struct btrfs_ioctl_qgroup_create_args`.
#[repr(C)]
struct QgroupCreateArgs {
    create: u64,
    qgroupid: u64,
}

/// `struct btrfs_ioctl_quota_ctl_args`.
#[repr(C)]
struct QuotaCtlArgs {
    cmd: u64,
    status: u64,
}

/// `struct btrfs_ioctl_fs_info_args`: 1 KiB, the fsid at bytes 16..32.
#[repr(C)]
struct FsInfoArgs {
    bytes: [u8; 1024],
}

const SUBVOL_CREATE: rustix::ioctl::Opcode = opcode::write::<VolArgs>(MAGIC, 14);
const INO_LOOKUP: rustix::ioctl::Opcode = opcode::read_write::<InoLookupArgs>(MAGIC, 18);
const FS_INFO: rustix::ioctl::Opcode = opcode::read::<FsInfoArgs>(MAGIC, 31);
const QUOTA_CTL: rustix::ioctl::Opcode = opcode::read_write::<QuotaCtlArgs>(MAGIC, 40);
const QGROUP_CREATE: rustix::ioctl::Opcode = opcode::write::<QgroupCreateArgs>(MAGIC, 42);
// The kernel declares it _IOR although userspace passes the data in.
const QGROUP_LIMIT: rustix::ioctl::Opcode = opcode::read::<QgroupLimitArgs>(MAGIC, 43);

/// Creates subvolume `name` (a single component) in the directory `parent` (opened for reading).
pub fn create_subvolume(parent: impl AsFd, name: &str) -> Result<(), Errno> {
    if name.is_empty() || name.len() > PATH_NAME_MAX || name.contains(['/', '\0']) {
        return Err(Errno::INVAL);
    }
    let mut args = VolArgs { fd: 0, name: [0; PATH_NAME_MAX + 1] };
    args.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: VolArgs is the kernel's struct btrfs_ioctl_vol_args, NUL-terminated name.
    unsafe { ioctl(parent, Updater::<SUBVOL_CREATE, VolArgs>::new(&mut args)) }
}

/// The id of the subvolume (tree) that the open directory `fd` belongs to.
pub fn subvolume_id(fd: impl AsFd) -> Result<u64, Errno> {
    // treeid 0 with the subvolume root's objectid answers the descriptor's own tree without
    // walking any path, and needs no privilege.
    let mut args = InoLookupArgs { treeid: 0, objectid: SUBVOLUME_ROOT_INO, name: [0; 4080] };
    // SAFETY: InoLookupArgs is struct btrfs_ioctl_ino_lookup_args.
    unsafe { ioctl(fd, Updater::<INO_LOOKUP, InoLookupArgs>::new(&mut args))? };
    Ok(args.treeid)
}

/// Limits the referenced bytes of the subvolume that `fd` (its root directory, opened) belongs to.
pub fn limit_referenced(fd: impl AsFd, max_bytes: u64) -> Result<(), Errno> {
    let mut args = QgroupLimitArgs {
        // 0 means "the qgroup of the subvolume this descriptor is in".
        qgroupid: 0,
        lim: QgroupLimit { flags: LIMIT_MAX_RFER, max_rfer: max_bytes, max_excl: 0, rsv_rfer: 0, rsv_excl: 0 },
    };
    // SAFETY: QgroupLimitArgs is struct btrfs_ioctl_qgroup_limit_args.
    unsafe { ioctl(fd, Updater::<QGROUP_LIMIT, QgroupLimitArgs>::new(&mut args)) }
}

/// Destroys the level-0 qgroup of subvolume `id`; `fd` is any directory on the filesystem.
///
/// `Ok(false)` when the kernel still holds it (`EBUSY`: the subvolume is being dropped in the
/// background, and kernels since 6.10 remove its qgroup themselves once it is gone) or it is
/// already gone (`ENOENT`).
pub fn destroy_qgroup(fd: impl AsFd, id: u64) -> Result<bool, Errno> {
    let mut args = QgroupCreateArgs { create: 0, qgroupid: id };
    // SAFETY: QgroupCreateArgs is struct btrfs_ioctl_qgroup_create_args.
    match unsafe { ioctl(fd, Updater::<QGROUP_CREATE, QgroupCreateArgs>::new(&mut args)) } {
        Ok(()) => Ok(true),
        Err(Errno::BUSY | Errno::NOENT) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Enables quota on the filesystem of `fd`. The provisioner never calls it (enabling quota costs
/// every write on the filesystem, an admin's choice); tests and tools do.
pub fn enable_quota(fd: impl AsFd) -> Result<(), Errno> {
    let mut args = QuotaCtlArgs { cmd: QUOTA_CTL_ENABLE, status: 0 };
    // SAFETY: QuotaCtlArgs is struct btrfs_ioctl_quota_ctl_args.
    unsafe { ioctl(fd, Updater::<QUOTA_CTL, QuotaCtlArgs>::new(&mut args)) }
}

/// The filesystem id, as sysfs names the filesystem under `/sys/fs/btrfs/`.
pub fn fsid(fd: impl AsFd) -> Result<String, Errno> {
    // SAFETY: FsInfoArgs has the size and alignment-compatible layout of struct btrfs_ioctl_fs_info_args.
    let info = unsafe { ioctl(fd, Getter::<FS_INFO, FsInfoArgs>::new())? };
    let id = &info.bytes[16..32];
    let hex: Vec<String> = id.iter().map(|b| format!("{b:02x}")).collect();
    let hex = hex.concat();
    Ok(format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32]))
}

/// Whether quota is enabled on the filesystem with this fsid: sysfs lists `qgroups/` exactly then
/// (Documentation/ABI/testing/sysfs-fs-btrfs).
pub fn quota_enabled(fsid: &str) -> bool {
    std::path::Path::new(&format!("/sys/fs/btrfs/{fsid}/qgroups")).is_dir()
}

/// Bytes referenced by subvolume `id` as qgroup accounting counts them, from sysfs; `None` when
/// quota is off or the qgroup is gone.
pub fn referenced_bytes(fsid: &str, id: u64) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/fs/btrfs/{fsid}/qgroups/0_{id}/referenced")).ok()?.trim().parse().ok()
}

/// Ids of the level-0 qgroups of the filesystem (sysfs `qgroups/0_<id>`), the top level (5) left out.
pub fn level0_qgroups(fsid: &str) -> Vec<u64> {
    let Ok(dir) = std::fs::read_dir(format!("/sys/fs/btrfs/{fsid}/qgroups")) else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("0_")?.parse().ok()).filter(|id| *id != 5).collect()
}

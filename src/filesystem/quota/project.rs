//! Project quota on XFS and ext4 through the kernel interfaces: `quotactl_fd(2)` on the pool
//! root (no block device path needed, Linux 5.14+) and the `FS_IOC_FSGETXATTR`/`FS_IOC_FSSETXATTR`
//! ioctls that give a directory its project id.
//!
//! The structures mirror `include/uapi/linux/quota.h`, `dqblk_xfs.h` and `fs.h`; the ABI is
//! stable, so they are spelled out here instead of pulling in a bindings crate for four calls.

use std::os::fd::{AsFd, AsRawFd};

use rustix::io::Errno;
use rustix::ioctl::{Getter, Setter, ioctl, opcode};

use crate::deciding::quota::{ProjectQuotaState, quota_kib_blocks, xfs_basic_blocks};

/// `PRJQUOTA`: the quota type of projects.
const PRJQUOTA: u32 = 2;
/// `Q_GETQUOTA`, `Q_SETQUOTA` and `Q_GETNEXTQUOTA`: read, set and find the next dquot of a
/// quota-file filesystem (ext4).
const Q_GETQUOTA: u32 = 0x80_0007;
const Q_SETQUOTA: u32 = 0x80_0008;
const Q_GETNEXTQUOTA: u32 = 0x80_0009;
/// `Q_XGETQUOTA` and `Q_XGETNEXTQUOTA`: read an XFS dquot, and the next one that holds anything.
const Q_XGETQUOTA: u32 = (b'X' as u32) << 8 | 3;
const Q_XGETNEXTQUOTA: u32 = (b'X' as u32) << 8 | 9;
/// `Q_XSETQLIM`: set the limits of an XFS dquot.
const Q_XSETQLIM: u32 = (b'X' as u32) << 8 | 4;
/// `Q_XGETQSTATV`: quota state, answered by XFS and, through the VFS, by ext4 as well.
const Q_XGETQSTATV: u32 = (b'X' as u32) << 8 | 8;
/// `FS_QSTATV_VERSION1`.
const QSTATV_VERSION: i8 = 1;
/// `FS_QUOTA_PDQ_ACCT` and `FS_QUOTA_PDQ_ENFD` in `fs_quota_statv.qs_flags`.
const PDQ_ACCT: u16 = 1 << 4;
const PDQ_ENFD: u16 = 1 << 5;
/// `QIF_BLIMITS`: `if_dqblk` carries the block limits.
const QIF_BLIMITS: u32 = 1;
/// `QIF_SPACE`: `if_dqblk` carries the space in use.
const QIF_SPACE: u32 = 2;
/// `FS_DQUOT_VERSION`, `FS_PROJ_QUOTA`, `FS_DQ_BSOFT | FS_DQ_BHARD`.
const DQUOT_VERSION: i8 = 1;
const PROJ_QUOTA: i8 = 2;
const DQ_BLIMITS: u16 = (1 << 2) | (1 << 3);
/// `FS_XFLAG_PROJINHERIT`: files and directories made inside take the directory's project id.
const XFLAG_PROJINHERIT: u32 = 0x200;

/// `struct fs_qfilestatv`.
#[repr(C)]
#[derive(Default)]
struct QFileStatV {
    ino: u64,
    nblks: u64,
    nextents: u32,
    pad: u32,
}

/// `struct fs_quota_statv` (160 bytes).
#[repr(C)]
#[derive(Default)]
struct QuotaStatV {
    version: i8,
    pad1: u8,
    flags: u16,
    incoredqs: u32,
    uquota: QFileStatV,
    gquota: QFileStatV,
    pquota: QFileStatV,
    btimelimit: i32,
    itimelimit: i32,
    rtbtimelimit: i32,
    bwarnlimit: u16,
    iwarnlimit: u16,
    rtbwarnlimit: u16,
    pad3: u16,
    pad4: u32,
    pad2: [u64; 7],
}

/// `struct if_dqblk`.
#[repr(C)]
#[derive(Default)]
struct IfDqblk {
    bhardlimit: u64,
    bsoftlimit: u64,
    curspace: u64,
    ihardlimit: u64,
    isoftlimit: u64,
    curinodes: u64,
    btime: u64,
    itime: u64,
    valid: u32,
}

/// `struct if_nextdqblk`: the fields of `if_dqblk`, then the id found (in what is padding there).
#[repr(C)]
#[derive(Default)]
struct IfNextDqblk {
    bhardlimit: u64,
    bsoftlimit: u64,
    curspace: u64,
    ihardlimit: u64,
    isoftlimit: u64,
    curinodes: u64,
    btime: u64,
    itime: u64,
    valid: u32,
    id: u32,
}

/// `struct fs_disk_quota` (112 bytes).
#[repr(C)]
#[derive(Default)]
struct FsDiskQuota {
    version: i8,
    flags: i8,
    fieldmask: u16,
    id: u32,
    blk_hardlimit: u64,
    blk_softlimit: u64,
    ino_hardlimit: u64,
    ino_softlimit: u64,
    bcount: u64,
    icount: u64,
    itimer: i32,
    btimer: i32,
    iwarns: u16,
    bwarns: u16,
    itimer_hi: i8,
    btimer_hi: i8,
    rtbtimer_hi: i8,
    padding2: i8,
    rtb_hardlimit: u64,
    rtb_softlimit: u64,
    rtbcount: u64,
    rtbtimer: i32,
    rtbwarns: u16,
    padding3: i16,
    padding4: [u8; 8],
}

/// `struct fsxattr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

const FSGETXATTR: rustix::ioctl::Opcode = opcode::read::<FsXattr>(b'X', 31);
const FSSETXATTR: rustix::ioctl::Opcode = opcode::write::<FsXattr>(b'X', 32);

/// `QCMD(cmd, PRJQUOTA)`.
fn project_cmd(cmd: u32) -> libc::c_int {
    (cmd << 8 | PRJQUOTA) as libc::c_int
}

/// `quotactl_fd(fd, cmd, id, addr)`.
fn quotactl_fd(fd: impl AsFd, cmd: u32, id: u32, addr: *mut libc::c_void) -> Result<(), Errno> {
    // SAFETY: the caller passes `addr` pointing at the structure `cmd` reads or writes.
    let rc = unsafe {
        libc::syscall(libc::SYS_quotactl_fd, fd.as_fd().as_raw_fd(), project_cmd(cmd), id as libc::c_int, addr)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(Errno::from_raw_os_error(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)))
    }
}

/// What the kernel says about project quota on the filesystem of `root` (opened for reading).
pub fn state(root: impl AsFd) -> ProjectQuotaState {
    let mut stat = QuotaStatV { version: QSTATV_VERSION, ..QuotaStatV::default() };
    match quotactl_fd(root, Q_XGETQSTATV, 0, (&mut stat as *mut QuotaStatV).cast()) {
        Ok(()) if stat.flags & PDQ_ACCT != 0 && stat.flags & PDQ_ENFD != 0 => ProjectQuotaState::Enforced,
        Ok(()) if stat.flags & PDQ_ACCT != 0 => ProjectQuotaState::AccountingOnly,
        Ok(()) => ProjectQuotaState::Off,
        // ENOSYS comes from the syscall table (no quotactl_fd) or from a filesystem the kernel
        // gives no quota operations: a bad descriptor tells them apart (EBADF once the syscall exists).
        Err(Errno::NOSYS) if quotactl_fd_exists() => ProjectQuotaState::NoKernelSupport,
        Err(Errno::NOSYS) => ProjectQuotaState::NoQuotactlFd,
        Err(e) => ProjectQuotaState::Unanswered(format!("quotactl: {e}")),
    }
}

/// Whether the kernel has the `quotactl_fd(2)` system call at all.
fn quotactl_fd_exists() -> bool {
    // SAFETY: an invalid descriptor and a null address: the kernel returns before reading anything.
    let rc =
        unsafe { libc::syscall(libc::SYS_quotactl_fd, -1, project_cmd(Q_XGETQSTATV), 0, std::ptr::null_mut::<u8>()) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS)
}

/// Limits the blocks of project `id` to `bytes` (0 removes the limit) on the XFS filesystem of `root`.
pub fn set_xfs_limit(root: impl AsFd, id: u32, bytes: u64) -> Result<(), Errno> {
    let blocks = xfs_basic_blocks(bytes);
    let mut quota = FsDiskQuota {
        version: DQUOT_VERSION,
        flags: PROJ_QUOTA,
        fieldmask: DQ_BLIMITS,
        id,
        blk_hardlimit: blocks,
        blk_softlimit: blocks,
        ..FsDiskQuota::default()
    };
    quotactl_fd(root, Q_XSETQLIM, id, (&mut quota as *mut FsDiskQuota).cast())
}

/// Limits the blocks of project `id` to `bytes` (0 removes the limit) on the ext4 filesystem of `root`.
pub fn set_ext4_limit(root: impl AsFd, id: u32, bytes: u64) -> Result<(), Errno> {
    let blocks = quota_kib_blocks(bytes);
    let mut quota = IfDqblk { bhardlimit: blocks, bsoftlimit: blocks, valid: QIF_BLIMITS, ..IfDqblk::default() };
    quotactl_fd(root, Q_SETQUOTA, id, (&mut quota as *mut IfDqblk).cast())
}

/// One project's block limit and usage as the filesystem keeps them, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProjectQuota {
    /// The hard limit; 0 when the project has none.
    pub limit_bytes: u64,
    /// Bytes the project's files and directories hold on disk (delayed allocations included).
    pub used_bytes: u64,
}

/// Project `id`'s limit and usage on the XFS filesystem of `root`; `None` when XFS keeps no
/// record of it (no limit and nothing charged: `ENOENT`).
pub fn xfs_quota(root: impl AsFd, id: u32) -> Result<Option<ProjectQuota>, Errno> {
    let mut quota = FsDiskQuota::default();
    match quotactl_fd(root, Q_XGETQUOTA, id, (&mut quota as *mut FsDiskQuota).cast()) {
        // d_blk_hardlimit and d_bcount count 512-byte basic blocks.
        Ok(()) => Ok(Some(ProjectQuota {
            limit_bytes: quota.blk_hardlimit.saturating_mul(512),
            used_bytes: quota.bcount.saturating_mul(512),
        })),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Project `id`'s limit and usage on the ext4 filesystem of `root` (every id has a record, all
/// zeros when unused).
pub fn ext4_quota(root: impl AsFd, id: u32) -> Result<Option<ProjectQuota>, Errno> {
    let mut quota = IfDqblk::default();
    quotactl_fd(root, Q_GETQUOTA, id, (&mut quota as *mut IfDqblk).cast())?;
    // dqb_bhardlimit counts 1 KiB quota blocks, dqb_curspace bytes.
    let limit_bytes = if quota.valid & QIF_BLIMITS != 0 { quota.bhardlimit.saturating_mul(1024) } else { 0 };
    let used_bytes = if quota.valid & QIF_SPACE != 0 { quota.curspace } else { 0 };
    Ok(Some(ProjectQuota { limit_bytes, used_bytes }))
}

/// The first project at or after `id` that XFS keeps a record of (a limit or usage), with its
/// quota; `None` past the last.
pub fn xfs_next_quota(root: impl AsFd, id: u32) -> Result<Option<(u32, ProjectQuota)>, Errno> {
    let mut quota = FsDiskQuota::default();
    match quotactl_fd(root, Q_XGETNEXTQUOTA, id, (&mut quota as *mut FsDiskQuota).cast()) {
        Ok(()) => Ok(Some((
            quota.id,
            ProjectQuota {
                limit_bytes: quota.blk_hardlimit.saturating_mul(512),
                used_bytes: quota.bcount.saturating_mul(512),
            },
        ))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The first project at or after `id` that the ext4 quota file has an entry for, with its quota;
/// `None` past the last.
pub fn ext4_next_quota(root: impl AsFd, id: u32) -> Result<Option<(u32, ProjectQuota)>, Errno> {
    let mut next = IfNextDqblk::default();
    match quotactl_fd(root, Q_GETNEXTQUOTA, id, (&mut next as *mut IfNextDqblk).cast()) {
        Ok(()) => Ok(Some((
            next.id,
            ProjectQuota { limit_bytes: next.bhardlimit.saturating_mul(1024), used_bytes: next.curspace },
        ))),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The project id of the open file or directory `fd`.
pub fn project_id(fd: impl AsFd) -> Result<u32, Errno> {
    // SAFETY: FsXattr is struct fsxattr.
    let attr = unsafe { ioctl(fd, Getter::<FSGETXATTR, FsXattr>::new())? };
    Ok(attr.projid)
}

/// Gives the directory `fd` project `id`, inherited by everything made inside from now on.
pub fn set_project_id(fd: impl AsFd, id: u32) -> Result<(), Errno> {
    // SAFETY: FsXattr is struct fsxattr.
    let mut attr = unsafe { ioctl(fd.as_fd(), Getter::<FSGETXATTR, FsXattr>::new())? };
    attr.projid = id;
    attr.xflags |= XFLAG_PROJINHERIT;
    // SAFETY: as above; the kernel reads the structure.
    unsafe { ioctl(fd, Setter::<FSSETXATTR, FsXattr>::new(attr)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structures_have_the_kernel_sizes() {
        assert_eq!(size_of::<QuotaStatV>(), 160);
        assert_eq!(size_of::<FsDiskQuota>(), 112);
        assert_eq!(size_of::<IfDqblk>(), 72);
        assert_eq!(size_of::<IfNextDqblk>(), 72);
        assert_eq!(size_of::<FsXattr>(), 28);
    }

    #[test]
    fn commands_are_encoded_as_qcmd_with_the_project_type() {
        assert_eq!(project_cmd(Q_XGETQSTATV), 0x0058_0802);
        assert_eq!(project_cmd(Q_XSETQLIM), 0x0058_0402);
        assert_eq!(project_cmd(Q_SETQUOTA), 0x8000_0802_u32 as libc::c_int);
        assert_eq!(project_cmd(Q_GETQUOTA), 0x8000_0702_u32 as libc::c_int);
        assert_eq!(project_cmd(Q_XGETQUOTA), 0x0058_0302);
        assert_eq!(project_cmd(Q_GETNEXTQUOTA), 0x8000_0902_u32 as libc::c_int);
        assert_eq!(project_cmd(Q_XGETNEXTQUOTA), 0x0058_0902);
    }
}

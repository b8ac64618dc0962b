//! The loop driver's ioctls (`linux/loop.h`), through `rustix::ioctl`. Every loop device is
//! opened by number and checked to be a block device of the number sysfs gives for it, so a
//! `/dev/loopN` node replaced by another device is never acted on.

use std::ffi::c_void;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;
use rustix::ioctl::{Getter, IntegerSetter, Ioctl, IoctlOutput, NoArg, Opcode, Setter, ioctl};

const LOOP_SET_FD: Opcode = 0x4C00;
const LOOP_CLR_FD: Opcode = 0x4C01;
const LOOP_SET_STATUS64: Opcode = 0x4C04;
const LOOP_GET_STATUS64: Opcode = 0x4C05;
const LOOP_SET_CAPACITY: Opcode = 0x4C07;
const LOOP_SET_DIRECT_IO: Opcode = 0x4C08;
const LOOP_CONFIGURE: Opcode = 0x4C0A;
const LOOP_CTL_GET_FREE: Opcode = 0x4C82;

/// `LO_FLAGS_AUTOCLEAR`: the loop detaches itself on last close. Never set by us: a loop must
/// outlive every pod that opens it, until the volume is deleted (the tests check it is off).
#[cfg(test)]
pub(super) const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// `LO_FLAGS_DIRECT_IO`: I/O goes to the backing file with `O_DIRECT`, bypassing a second page
/// cache (the pod's writes are cached once, by the loop device).
pub(super) const LO_FLAGS_DIRECT_IO: u32 = 16;

/// `struct loop_info64`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct LoopInfo64 {
    pub lo_device: u64,
    pub lo_inode: u64,
    pub lo_rdevice: u64,
    pub lo_offset: u64,
    pub lo_sizelimit: u64,
    pub lo_number: u32,
    pub lo_encrypt_type: u32,
    pub lo_encrypt_key_size: u32,
    pub lo_flags: u32,
    pub lo_file_name: [u8; 64],
    pub lo_crypt_name: [u8; 64],
    pub lo_encrypt_key: [u8; 32],
    pub lo_init: [u64; 2],
}

impl LoopInfo64 {
    fn zeroed() -> Self {
        LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; 64],
            lo_crypt_name: [0; 64],
            lo_encrypt_key: [0; 32],
            lo_init: [0; 2],
        }
    }
}

/// `struct loop_config` (`LOOP_CONFIGURE`, Linux 5.8+).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// `LOOP_CTL_GET_FREE` returns the number in the ioctl's result.
struct GetFree;

// SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a non-negative int.
unsafe impl Ioctl for GetFree {
    type Output = u32;
    const IS_MUTATING: bool = false;
    fn opcode(&self) -> Opcode {
        LOOP_CTL_GET_FREE
    }
    fn as_ptr(&mut self) -> *mut c_void {
        std::ptr::null_mut()
    }
    unsafe fn output_from_ptr(out: IoctlOutput, _: *mut c_void) -> rustix::io::Result<u32> {
        u32::try_from(out).map_err(|_| Errno::RANGE)
    }
}

/// The number of a free loop device, made by the kernel if none is free.
pub(super) fn get_free(control: BorrowedFd<'_>) -> Result<u32, Errno> {
    // SAFETY: the opcode is LOOP_CTL_GET_FREE on /dev/loop-control.
    unsafe { ioctl(control, GetFree) }
}

/// The loop's status (`LOOP_GET_STATUS64`); `ENXIO` when nothing is attached.
pub(super) fn status(device: BorrowedFd<'_>) -> Result<LoopInfo64, Errno> {
    // SAFETY: LOOP_GET_STATUS64 writes one loop_info64.
    unsafe { ioctl(device, Getter::<LOOP_GET_STATUS64, LoopInfo64>::new()) }
}

/// Attaches `file` to the loop `device` with `flags`, whole (offset 0, no size limit):
/// `LOOP_CONFIGURE`, or `LOOP_SET_FD` then `LOOP_SET_STATUS64` on kernels before 5.8.
pub(super) fn configure(device: BorrowedFd<'_>, file: BorrowedFd<'_>, flags: u32) -> Result<(), Errno> {
    let raw = u32::try_from(rustix::fd::AsRawFd::as_raw_fd(&file)).map_err(|_| Errno::BADF)?;
    let mut info = LoopInfo64::zeroed();
    info.lo_flags = flags;
    // Block size 0: the kernel's default, with direct I/O the logical block size of the backing
    // file's disk (512 on most), as every Block volume has had since the first. Not the
    // filesystem's 4096: measured with the Block bench (issue #47, docs/performance.md) it moves
    // no figure beyond the noise, direct I/O is on either way, and the block size is part of what
    // a volume holds (a partition table at sector 1, a filesystem made with 512-byte sectors): a
    // volume exposed again with another would not read back.
    let config = LoopConfig { fd: raw, block_size: 0, info, reserved: [0; 8] };
    // SAFETY: LOOP_CONFIGURE reads one loop_config.
    match unsafe { ioctl(device, Setter::<LOOP_CONFIGURE, LoopConfig>::new(config)) } {
        Err(Errno::NOTTY) => {
            // SAFETY: LOOP_SET_FD takes the backing file's descriptor as its integer argument.
            unsafe { ioctl(device, IntegerSetter::<LOOP_SET_FD>::new_usize(raw as usize))? };
            // Before LOOP_CONFIGURE, direct I/O was its own ioctl.
            let mut info = info;
            info.lo_flags &= !LO_FLAGS_DIRECT_IO;
            // SAFETY: LOOP_SET_STATUS64 reads one loop_info64.
            let mut set = unsafe { ioctl(device, Setter::<LOOP_SET_STATUS64, LoopInfo64>::new(info)) };
            if set.is_ok() && flags & LO_FLAGS_DIRECT_IO != 0 {
                // SAFETY: LOOP_SET_DIRECT_IO takes 0 or 1 as its integer argument.
                set = unsafe { ioctl(device, IntegerSetter::<LOOP_SET_DIRECT_IO>::new_usize(1)) };
            }
            if set.is_err() {
                // Leave nothing half attached.
                let _ = clear(device);
            }
            set
        }
        other => other,
    }
}

/// Detaches the loop (`LOOP_CLR_FD`). While the device is open elsewhere the kernel defers the
/// detach to the last close (it sets autoclear and returns success).
pub(super) fn clear(device: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: LOOP_CLR_FD takes no argument.
    unsafe { ioctl(device, NoArg::<LOOP_CLR_FD>::new()) }
}

/// Makes the loop re-read its backing file's size (`LOOP_SET_CAPACITY`).
pub(super) fn set_capacity(device: BorrowedFd<'_>) -> Result<(), Errno> {
    // SAFETY: LOOP_SET_CAPACITY takes no argument.
    unsafe { ioctl(device, NoArg::<LOOP_SET_CAPACITY>::new()) }
}

/// The device number sysfs gives loop `number` (`/sys/block/loopN/dev`, "major:minor").
pub(super) fn sysfs_device(sys_block: &Path, number: u32) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(sys_block.join(format!("loop{number}/dev"))).ok()?;
    let (major, minor) = text.trim().split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Opens `/dev/loopN` (under `dev`) and checks it is the block device sysfs names for loop N.
/// `Errno::NODEV` when it is not (a node replaced by another device, or no such loop).
pub(super) fn open_loop(dev: &Path, sys_block: &Path, number: u32, flags: OFlags) -> Result<OwnedFd, Errno> {
    let expected = sysfs_device(sys_block, number).ok_or(Errno::NODEV)?;
    let fd = rustix::fs::open(
        dev.join(format!("loop{number}")),
        flags | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK,
        Mode::empty(),
    )?;
    let st = rustix::fs::fstat(&fd)?;
    let found = (rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev));
    if FileType::from_raw_mode(st.st_mode) != FileType::BlockDevice || found != expected {
        return Err(Errno::NODEV);
    }
    Ok(fd)
}

/// `fd`'s identity as the deciding layer compares it.
pub(super) fn file_id(fd: impl AsFd) -> Result<crate::deciding::block::loop_safety::FileId, Errno> {
    let st = rustix::fs::fstat(fd)?;
    Ok(crate::deciding::block::loop_safety::FileId {
        dev_major: rustix::fs::major(st.st_dev),
        dev_minor: rustix::fs::minor(st.st_dev),
        ino: st.st_ino,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's struct sizes: a wrong layout would make the kernel read or write past ours.
    #[test]
    fn the_structs_have_the_kernels_sizes() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }
}

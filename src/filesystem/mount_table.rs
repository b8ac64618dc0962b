//! Reads this process's mount table; [`crate::deciding::mount_table`] parses it and finds mounts.

use crate::deciding::mount_table::{Mount, parse_mountinfo};

/// This process's mount table (mounts as seen in its mount namespace).
pub const MOUNT_TABLE: &str = "/proc/self/mountinfo";

/// The mounts of this process's mount namespace, in table order.
pub fn read() -> std::io::Result<Vec<Mount>> {
    Ok(parse_mountinfo(&std::fs::read(MOUNT_TABLE)?))
}

//! Reads what [`crate::deciding::os_disk`] decides from: this process's mount table and a pool
//! root's resolved path. The metric and the doctor both ask here.

use std::path::Path;

use crate::deciding::os_disk::shares_os_disk;
use crate::filesystem::mount_table;

/// Whether the pool root at `root` is on the node's OS disk; `Ok(None)` when the mount table does
/// not tell (see [`crate::deciding::os_disk`] for the rule and its limits).
pub fn pool_shares_os_disk(root: &Path) -> std::io::Result<Option<bool>> {
    let mounts = mount_table::read()?;
    // mountinfo lists resolved paths.
    let resolved = std::fs::canonicalize(root)?;
    Ok(shares_os_disk(&mounts, &resolved))
}

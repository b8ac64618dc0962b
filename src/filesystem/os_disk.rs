//! Reads what [`crate::deciding::os_disk`] decides from: this process's mount table and a pool
//! root's resolved path.

use std::path::Path;

use crate::deciding::os_disk::{parse_mountinfo, shares_os_disk};

/// Whether the pool root at `root` is on the node's OS disk; `Ok(None)` when the mount table does
/// not tell (see [`crate::deciding::os_disk`] for the rule and its limits).
pub fn pool_shares_os_disk(root: &Path) -> std::io::Result<Option<bool>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    // mountinfo lists resolved paths.
    let resolved = std::fs::canonicalize(root)?;
    Ok(resolved.to_str().and_then(|path| shares_os_disk(&parse_mountinfo(&table), path)))
}

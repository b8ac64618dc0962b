//! Raw Block volumes in the end-to-end tests: the loops a test's pool holds, a device directory
//! of the test's own, a data pattern, and reads through a device.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Removes, on drop, every loop whose backing file lies under `pool` and the device directory.
pub struct BlockCleanup {
    pub pool: PathBuf,
    pub devices: PathBuf,
}

impl Drop for BlockCleanup {
    fn drop(&mut self) {
        for (number, _) in loops_under(&self.pool) {
            let _ = std::process::Command::new("losetup").arg("-d").arg(format!("/dev/loop{number}")).status();
        }
        let _ = std::fs::remove_dir_all(&self.devices);
    }
}

/// The attached loops whose backing file (as sysfs names it) lies under `dir`.
pub fn loops_under(dir: &Path) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/sys/block") else { return found };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(number) = name.strip_prefix("loop").and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) {
            let backing = backing.trim_end().to_owned();
            // By path component: a loop of `<dir>.img` (the pool's own filesystem) is not under it.
            if Path::new(&backing).starts_with(dir) {
                found.push((number, backing));
            }
        }
    }
    found
}

pub fn device_dir() -> PathBuf {
    PathBuf::from("/dev").join(testbed::unique_name("hpp-e2e-block"))
}

/// 1 MiB of a pattern no fresh sparse file holds.
pub fn pattern() -> Vec<u8> {
    (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8 | 1).collect()
}

pub fn read_start(path: &Path, len: usize) -> Vec<u8> {
    let mut file = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut read = vec![0; len];
    file.read_exact(&mut read).expect("read");
    read
}

/// The size of the block device at `path` (`blockdev --getsize64`: `BLKGETSIZE64`).
pub fn device_size(path: &Path) -> u64 {
    let out = std::process::Command::new("blockdev").arg("--getsize64").arg(path).output().expect("blockdev");
    assert!(out.status.success(), "blockdev --getsize64 {}: {out:?}", path.display());
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("a size")
}

/// A control plane whose one node serves Block volumes in a device directory of the test's own:
/// the node's name and pool, and the directory; its loops and the directory go when the
/// `_cleanup` is dropped (bind it last, so that it goes before the control plane).
pub struct BlockNode {
    pub env: super::TestEnv,
    pub node: String,
    pub pool: PathBuf,
    pub devices: PathBuf,
    pub _cleanup: BlockCleanup,
}

impl BlockNode {
    pub async fn start(group: &str) -> Self {
        let devices = device_dir();
        let devices_env = devices.to_string_lossy().into_owned();
        let env = super::TestEnv::start_with(group, 1, |spec| {
            spec.env("BLOCK_VOLUMES", "true").env("BLOCK_DEVICE_DIR", &devices_env)
        })
        .await;
        let node = env.nodes[0].name.clone();
        let pool = env.nodes[0].pool_root.clone();
        let _cleanup = BlockCleanup { pool: pool.clone(), devices: devices.clone() };
        BlockNode { env, node, pool, devices, _cleanup }
    }
}

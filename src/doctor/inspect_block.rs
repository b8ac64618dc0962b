//! The doctor's I/O edge for Block volumes: this node's Block PVs (from the API), their backing
//! files, the host's loop devices and the device directory, read without changing anything (no
//! directory made, nothing attached, no volume's file opened). The decisions are in [`crate::doctor::assess_block`].

use std::os::fd::AsFd;
use std::path::Path;

use rustix::fs::{AtFlags, FileType};
use rustix::io::Errno;

use crate::config::Config;
use crate::deciding::block::loop_safety::{BackingFile, FileId, NodeEntry};
use crate::deciding::block::{BACKING_FILE, Birth, kept};
use crate::deciding::identity::Identity;
use crate::doctor::assess_block::{self, SeenLoop, VolumeFacts};
use crate::doctor::inspect::ClusterFacts;
use crate::doctor::report::BlockReport;
use crate::doctor::report::Finding;
use crate::filesystem::block::{LoopHost, backing_birth};
use crate::filesystem::{PoolRoot, VolumeDirName};

/// With Block volumes on and the API asked: the Block report and its findings.
pub fn block_report(config: &Config, cluster: &ClusterFacts) -> Option<(BlockReport, Vec<Finding>)> {
    let device_dir = config.block_device_dir.as_deref()?;
    let me = Identity {
        provisioner: config.provisioner_name.clone(),
        node: config.node_name.clone(),
        affinity: cluster.affinity.clone(),
        capacity_provisioner: config.capacity_provisioner_name.clone(),
    };
    let volumes: Vec<VolumeFacts> = kept::served_here(&cluster.pvs, &me, &cluster.hostname)
        .into_iter()
        .map(|pv| {
            let name = pv.metadata.name.clone().unwrap_or_default();
            let found = kept::block_volume(pv, &config.pools, device_dir).expect("served_here keeps Block PVs only");
            let (file, node) = match &found {
                Ok(found) => (
                    read_backing(&found.backing_dir.root, &found.backing_dir.pool, &found.backing_dir.dir_name),
                    read_node(&found.node_path),
                ),
                Err(_) => (Err(String::new()), Err(String::new())),
            };
            VolumeFacts { pv: name, found, file, node }
        })
        .collect();
    let loops = LoopHost::host()
        .loops()
        .map(|loops| loops.into_iter().map(|l| SeenLoop { facts: l.facts, backing_name: l.backing_name }).collect())
        .map_err(|e| e.to_string());
    let entries = match std::fs::read_dir(device_dir) {
        Ok(listing) => listing.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    Some(assess_block::assess(&device_dir.display().to_string(), &volumes, &loops, &entries))
}

/// The backing file in volume directory `dir_name` of the pool root `root`, and its birth.
fn read_backing(root: &Path, pool: &str, dir_name: &str) -> Result<(BackingFile, Option<Birth>), String> {
    let root = PoolRoot::open(pool, root).map_err(|e| e.to_string())?;
    let name = VolumeDirName::new(dir_name).map_err(|e| e.to_string())?;
    let dir_path = root.volume_path(&name);
    let Some(dir) = root.open_block_volume_dir(&name).map_err(|e| e.to_string())? else {
        return Ok((BackingFile::Missing, None));
    };
    // Stat alone, as the daemon's open checks it (the doctor opens no volume's file).
    let file = match rustix::fs::statat(&dir, BACKING_FILE, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => BackingFile::Regular(FileId {
                dev_major: rustix::fs::major(st.st_dev),
                dev_minor: rustix::fs::minor(st.st_dev),
                ino: st.st_ino,
            }),
            FileType::Symlink => BackingFile::Symlink,
            _ => BackingFile::Other,
        },
        Err(Errno::NOENT) => BackingFile::Missing,
        Err(e) => return Err(format!("stat {}: {e}", dir_path.join(BACKING_FILE).display())),
    };
    let birth = backing_birth(dir.as_fd(), &dir_path).map_err(|e| e.to_string())?;
    Ok((file, birth))
}

/// What stands at a device node path, not following a symlink.
fn read_node(path: &Path) -> Result<NodeEntry, String> {
    match rustix::fs::statat(rustix::fs::CWD, path, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(match FileType::from_raw_mode(st.st_mode) {
            FileType::BlockDevice => {
                NodeEntry::BlockDevice((rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev)))
            }
            FileType::Directory => NodeEntry::Directory,
            _ => NodeEntry::Other,
        }),
        Err(Errno::NOENT) => Ok(NodeEntry::Absent),
        Err(e) => Err(format!("stat {}: {e}", path.display())),
    }
}

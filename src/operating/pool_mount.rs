//! `hostpath-provisioner pool-mount`: the per-node mounter of a pool on a claim. It runs in a pod
//! pinned to one node, with the pool's claim as an ordinary volume (the kubelet mounts it at
//! `--source`) and a hostPath volume of exactly the pool path at `--target`, with Bidirectional
//! propagation; it bind-mounts the claim onto the pool path, so that the mount reaches the host
//! and, from there, the node provisioner. Narrower than the kubevirt operator's mounter, which
//! mounts the host's whole `/` Bidirectionally.
//!
//! The operator runs it as the mounter Deployment of each pool on a claim, one per node
//! (`crate::deciding::operator::pool_claims::PoolObjects::mounter`; docs/operator.md, "Pools on
//! a claim").
//!
//! Safety choices:
//! - It never mounts over a non-empty directory: that would hide whatever is there (volumes of an
//!   earlier directory pool at that path) from their PVs. It exits with the reason instead.
//! - On SIGTERM it removes the mount only when the pool holds no volume: then the kubelet can
//!   unmount and detach the claim cleanly. While volumes live there (a drain, an eviction, a
//!   rollout of the mounter; the operator itself removes a mounter only when no PV of ours is
//!   left, the hold-back rule) it leaves the mount in place and says so: unmounting would show the
//!   node provisioner an empty pool and new pods missing directories, the worse hazard. The next
//!   mounter finds the mount in place and adopts it.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use clap::Parser;

/// The subcommand's name, the first argument.
pub const SUBCOMMAND: &str = "pool-mount";

/// `hostpath-provisioner pool-mount` arguments.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "hostpath-provisioner pool-mount",
    bin_name = "hostpath-provisioner pool-mount",
    version,
    about = "Bind-mounts a pool's claim (--source) onto the pool path (--target) and keeps it there; see docs/operator.md"
)]
pub struct PoolMountArgs {
    /// Where the kubelet mounted the pool's claim in this pod.
    #[arg(long)]
    pub source: PathBuf,
    /// The pool path, a hostPath volume of the same path with Bidirectional propagation.
    #[arg(long)]
    pub target: PathBuf,
    /// Only check: exit 0 when the claim is mounted on the pool path, 1 when not (the probe).
    #[arg(long)]
    pub check: bool,
}

/// Whether `target` shows the directory `source` is: the same device and inode, which is what a
/// bind mount of `source` onto `target` looks like.
pub fn is_mounted(source: &Path, target: &Path) -> std::io::Result<bool> {
    let (source, target) = (std::fs::metadata(source)?, std::fs::metadata(target)?);
    Ok(source.dev() == target.dev() && source.ino() == target.ino())
}

/// Whether the pool holds volumes: any entry but the provisioner's hidden ones (`.trash` and
/// the like) and `lost+found` counts, since only volume directories are made visible there.
/// mkfs puts `lost+found` at the root of an ext2/3/4 filesystem, the claim's: counted, it would
/// keep an emptied pool mounted on the host after its claim was deleted.
fn holds_volumes(target: &Path) -> std::io::Result<bool> {
    Ok(std::fs::read_dir(target)?.flatten().any(|entry| {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        !name.starts_with('.') && name != "lost+found"
    }))
}

/// Runs the subcommand; returns the process exit code.
pub async fn main(argv: impl IntoIterator<Item = OsString>) -> i32 {
    let args = PoolMountArgs::parse_from(argv);
    let (source, target) = (args.source.as_path(), args.target.as_path());
    if args.check {
        return match is_mounted(source, target) {
            Ok(true) => 0,
            _ => 1,
        };
    }
    match mount(source, target) {
        Ok(()) => {}
        Err(message) => {
            eprintln!("hostpath-provisioner pool-mount: {message}");
            return 1;
        }
    }
    wait_for_termination().await;
    match holds_volumes(target) {
        Ok(false) => match rustix::mount::unmount(target, rustix::mount::UnmountFlags::empty()) {
            Ok(()) => eprintln!("pool-mount: {} held no volume: unmounted", target.display()),
            Err(error) => eprintln!("pool-mount: cannot unmount {} ({error}); it stays mounted", target.display()),
        },
        Ok(true) => eprintln!(
            "pool-mount: volumes live in {}: the mount stays (the next mounter adopts it; the operator removes it once no volume of ours is left)",
            target.display()
        ),
        Err(error) => eprintln!("pool-mount: cannot list {} ({error}); the mount stays", target.display()),
    }
    0
}

fn mount(source: &Path, target: &Path) -> Result<(), String> {
    std::fs::create_dir_all(target).map_err(|e| format!("cannot create the pool path {}: {e}", target.display()))?;
    if is_mounted(source, target)
        .map_err(|e| format!("cannot stat {} or {}: {e}", source.display(), target.display()))?
    {
        eprintln!("pool-mount: {} is already mounted on {}: adopted", source.display(), target.display());
        return Ok(());
    }
    if holds_volumes(target).map_err(|e| format!("cannot list {}: {e}", target.display()))? {
        return Err(format!(
            "{} is not empty: mounting the claim over it would hide what is there from the volumes that point to it; move its contents away or pick another pool path",
            target.display()
        ));
    }
    rustix::mount::mount_bind(source, target)
        .map_err(|e| format!("cannot bind-mount {} onto {}: {e}", source.display(), target.display()))?;
    eprintln!("pool-mount: {} mounted on {}", source.display(), target.display());
    Ok(())
}

async fn wait_for_termination() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = tokio::signal::ctrl_c() => {},
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_volume_directories_hold_a_pool() {
        let pool = tempfile::tempdir().unwrap();
        assert!(!holds_volumes(pool.path()).unwrap(), "empty");
        // What an emptied pool on a fresh ext4 claim shows.
        for name in ["lost+found", ".hpp-trash", ".hpp-deleting"] {
            std::fs::create_dir(pool.path().join(name)).unwrap();
        }
        assert!(!holds_volumes(pool.path()).unwrap(), "lost+found and the provisioner's own directories");
        std::fs::create_dir(pool.path().join("pvc-0b1c")).unwrap();
        assert!(holds_volumes(pool.path()).unwrap(), "a volume");
    }
}

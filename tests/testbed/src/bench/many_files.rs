//! Reclaiming a volume that holds many files: how long from the PV's phase Released (the
//! moment its node's provisioner may act) to the PV gone, and to the directory gone.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use testbed::fixtures;

use super::setup::{Env, IMMEDIATE_CLASS};

const NAMESPACE: &str = "bench-many-files";
const TIMEOUT: Duration = Duration::from_secs(600);

pub struct ManyFiles {
    pub files: usize,
    pub write_time: Duration,
    /// Claim delete request -> PV phase Released (the PV controller's part).
    pub delete_to_released: Option<Duration>,
    /// Released -> PV gone (the target figure).
    pub released_to_pv_gone: Option<Duration>,
    /// Released -> the volume directory gone from its path (polled every 2 ms).
    pub released_to_dir_gone: Option<Duration>,
    /// Released -> the data gone from the pool (the directory's inode no longer found within
    /// two levels of the pool root; polled every 2 ms).
    pub released_to_data_gone: Option<Duration>,
}

pub async fn run(env: &Env) -> Result<ManyFiles> {
    let client = env.client.clone();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace(NAMESPACE)).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let node = env.nodes.first().context("no nodes")?;
    let claim = fixtures::claim(NAMESPACE, "many-files", IMMEDIATE_CLASS, "1Gi").provision_on_node(&node.name).build();
    let uid = claims.create(&PostParams::default(), &claim).await?.metadata.uid.unwrap_or_default();
    env.calls.add("create", "namespaces");
    env.calls.add("create", "persistentvolumeclaims");
    let pv_name = format!("pvc-{uid}");
    let started = Instant::now();
    while env.observer.with(|o| o.claims.get(&uid).and_then(|c| c.bound).is_none()) {
        if started.elapsed() > TIMEOUT {
            bail!("claim {NAMESPACE}/many-files not Bound after {TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pv = Api::<PersistentVolume>::all(client.clone()).get(&pv_name).await?;
    env.calls.add("get", "persistentvolumes");
    let dir = PathBuf::from(pv.spec.and_then(|s| s.host_path).context("hostPath")?.path);

    let files = env.args.files;
    let written = Instant::now();
    let target = dir.clone();
    tokio::task::spawn_blocking(move || -> Result<()> {
        for i in 0..files {
            std::fs::File::create(target.join(format!("f{i:07}")))?;
            if i > 0 && i % 25_000 == 0 {
                eprintln!("bench: {i} files written");
            }
        }
        Ok(())
    })
    .await??;
    let write_time = written.elapsed();
    eprintln!("bench: wrote {files} files in {:.1} s; deleting the claim", write_time.as_secs_f64());

    // Renaming keeps the inode: find the data by it wherever the provisioner moves it within
    // the pool (e.g. a trash directory for removal in the background).
    let inode = std::fs::metadata(&dir)?.ino();
    let pool_root = node.pool_root.clone();
    let deleted_at = Instant::now();
    claims.delete("many-files", &DeleteParams::default()).await?;
    env.calls.add("delete", "persistentvolumeclaims");
    // A blocking poll on its own thread, so that its 2 ms resolution holds.
    let watch_dir = dir.clone();
    let disk = tokio::task::spawn_blocking(move || {
        let mut dir_gone = None;
        while deleted_at.elapsed() < TIMEOUT {
            if dir_gone.is_none() && !watch_dir.exists() {
                dir_gone = Some(Instant::now());
            }
            if dir_gone.is_some() && !inode_in_pool(&pool_root, inode) {
                return (dir_gone, Some(Instant::now()));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        (dir_gone, None)
    });
    while env.observer.with(|o| o.pvs.get(&pv_name).and_then(|p| p.gone).is_none()) {
        if deleted_at.elapsed() > TIMEOUT {
            bail!("PV {pv_name} not deleted {TIMEOUT:?} after its claim");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (dir_gone, data_gone) = disk.await?;
    let (Some(dir_gone), Some(data_gone)) = (dir_gone, data_gone) else {
        bail!("the data of {} is still on disk {TIMEOUT:?} after its claim was deleted", dir.display());
    };
    let (released, gone) = env.observer.with(|o| o.pvs.get(&pv_name).map(|p| (p.released, p.gone)).unwrap_or_default());
    Ok(ManyFiles {
        files,
        write_time,
        delete_to_released: released.map(|r| r.saturating_duration_since(deleted_at)),
        released_to_pv_gone: released.zip(gone).map(|(r, g)| g.saturating_duration_since(r)),
        released_to_dir_gone: released.map(|r| dir_gone.saturating_duration_since(r)),
        released_to_data_gone: released.map(|r| data_gone.saturating_duration_since(r)),
    })
}

/// Whether a directory with `inode` is the pool root's child or grandchild, not descending
/// into volume directories (`*pvc-*`), which may hold many files.
fn inode_in_pool(root: &Path, inode: u64) -> bool {
    // The volume directory is at the pool root, in the trash (`.hpp-trash/<entry>`), or staged
    // for deletion (`.hpp-deleting/<node>/<pv>/<dir>`); a volume itself is never searched.
    let dirs = |dir: &Path| -> Vec<(std::path::PathBuf, u64)> {
        let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| e.metadata().ok().filter(|m| m.is_dir()).map(|m| (e.path(), m.ino())))
            .collect()
    };
    let mut candidates = dirs(root);
    candidates.extend(dirs(&root.join(".hpp-trash")));
    for (node, _) in dirs(&root.join(".hpp-deleting")) {
        for (pv, _) in dirs(&node) {
            candidates.extend(dirs(&pv));
        }
    }
    candidates.iter().any(|(_, ino)| *ino == inode)
}

fn secs(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

impl ManyFiles {
    pub fn json(&self) -> Value {
        json!({
            "files": self.files,
            "write_s": self.write_time.as_secs_f64(),
            "claim_delete_to_released_s": secs(self.delete_to_released),
            "released_to_pv_gone_s": secs(self.released_to_pv_gone),
            "released_to_dir_gone_s": secs(self.released_to_dir_gone),
            "released_to_data_gone_s": secs(self.released_to_data_gone),
        })
    }
}

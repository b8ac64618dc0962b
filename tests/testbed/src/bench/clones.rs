//! Cloning a 1 GiB volume: clone claim created -> Bound, once with reflinks (an XFS pool) and
//! once with a byte copy (an ext4 pool), each on a loop filesystem mounted over the last node's
//! pool root for the measurement and unmounted afterwards (the provisioner re-opens its root).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, TypedLocalObjectReference};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use testbed::fixtures;

use super::setup::{Env, IMMEDIATE_CLASS};

const TIMEOUT: Duration = Duration::from_secs(600);
/// The source's data: 8 files of 128 MiB.
const FILES: usize = 8;
const FILE_BYTES: usize = 128 << 20;

/// One clone measured.
pub struct CloneTime {
    /// `reflink` or `bytes`.
    pub method: &'static str,
    /// The pool's filesystem.
    pub fstype: &'static str,
    /// Bytes in the source volume.
    pub bytes: u64,
    /// Clone claim created -> Bound.
    pub create_to_bound: Duration,
}

pub struct Clones {
    pub times: Vec<CloneTime>,
}

pub async fn run(env: &Env) -> Result<Clones> {
    let node = env.nodes.last().context("no nodes")?;
    let mut times = Vec::new();
    for (fstype, method) in [("xfs", "reflink"), ("ext4", "bytes")] {
        let mount = LoopMount::new(&node.pool_root, fstype)?;
        let measured = measure(env, &node.name, fstype, method).await;
        drop(mount);
        times.push(measured?);
    }
    Ok(Clones { times })
}

async fn measure(env: &Env, node: &str, fstype: &'static str, method: &'static str) -> Result<CloneTime> {
    let namespace = format!("bench-clone-{fstype}");
    let client = env.client.clone();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace(&namespace)).await?;
    env.calls.add("create", "namespaces");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let source = fixtures::claim(&namespace, "source", IMMEDIATE_CLASS, "1Gi").provision_on_node(node).build();
    let source_uid = claims.create(&PostParams::default(), &source).await?.metadata.uid.unwrap_or_default();
    env.calls.add("create", "persistentvolumeclaims");
    wait_bound(env, &source_uid).await?;
    let pv = Api::<PersistentVolume>::all(client.clone()).get(&format!("pvc-{source_uid}")).await?;
    env.calls.add("get", "persistentvolumes");
    let dir = PathBuf::from(pv.spec.and_then(|s| s.host_path).context("hostPath")?.path);
    tokio::task::spawn_blocking(move || fill(&dir)).await??;

    let mut clone = fixtures::claim(&namespace, "clone", IMMEDIATE_CLASS, "1Gi").build();
    clone.spec.as_mut().context("spec")?.data_source = Some(TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: "source".into(),
    });
    let started = Instant::now();
    let clone_uid = claims.create(&PostParams::default(), &clone).await?.metadata.uid.unwrap_or_default();
    env.calls.add("create", "persistentvolumeclaims");
    wait_bound(env, &clone_uid).await?;
    let create_to_bound = started.elapsed();
    eprintln!("bench: {method} clone of 1 GiB on {fstype}: {:.2} s", create_to_bound.as_secs_f64());

    // Remove both before the pool is unmounted: the deletion must finish on this filesystem.
    for (name, uid) in [("clone", &clone_uid), ("source", &source_uid)] {
        claims.delete(name, &DeleteParams::default()).await?;
        env.calls.add("delete", "persistentvolumeclaims");
        let pv = format!("pvc-{uid}");
        let deleted = Instant::now();
        while env.observer.with(|o| o.pvs.get(&pv).and_then(|p| p.gone).is_none()) {
            if deleted.elapsed() > TIMEOUT {
                bail!("PV {pv} not deleted {TIMEOUT:?} after its claim");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    Ok(CloneTime { method, fstype, bytes: (FILES * FILE_BYTES) as u64, create_to_bound })
}

async fn wait_bound(env: &Env, uid: &str) -> Result<()> {
    let started = Instant::now();
    while env.observer.with(|o| o.claims.get(uid).and_then(|c| c.bound).is_none()) {
        if started.elapsed() > TIMEOUT {
            bail!("claim {uid} not Bound after {TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// 1 GiB of data that no filesystem compresses or deduplicates away, flushed to the disk.
fn fill(dir: &Path) -> Result<()> {
    let mut block = vec![0u8; FILE_BYTES];
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in 0..FILES {
        for chunk in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        std::fs::write(dir.join(format!("data-{i}")), &block)?;
    }
    command(&mut Command::new("sync"))
}

/// A loop filesystem over `dir`, unmounted (and its image removed) when dropped.
struct LoopMount {
    dir: PathBuf,
    image: PathBuf,
}

impl LoopMount {
    fn new(dir: &Path, fstype: &str) -> Result<LoopMount> {
        let image = dir.with_extension(format!("{fstype}.img"));
        // Sparse: room for the source, its copy and the filesystem's own needs.
        std::fs::File::create(&image)?.set_len(3 << 30)?;
        let mut mkfs = Command::new(format!("mkfs.{fstype}"));
        match fstype {
            "xfs" => mkfs.args(["-q", "-f", "-m", "reflink=1"]),
            _ => mkfs.args(["-q", "-F"]),
        };
        command(mkfs.arg(&image)).with_context(|| format!("mkfs.{fstype} (install btrfs-progs / xfsprogs)"))?;
        command(Command::new("mount").arg("-o").arg("loop").arg(&image).arg(dir))?;
        Ok(LoopMount { dir: dir.to_owned(), image })
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

fn command(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

impl Clones {
    pub fn json(&self) -> Value {
        Value::Array(
            self.times
                .iter()
                .map(|t| {
                    json!({
                        "method": t.method,
                        "filesystem": t.fstype,
                        "bytes": t.bytes,
                        "create_to_bound_s": t.create_to_bound.as_secs_f64(),
                    })
                })
                .collect(),
        )
    }
}

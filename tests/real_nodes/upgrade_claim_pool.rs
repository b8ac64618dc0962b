//! A pool on a claim (`pvcTemplate`) through the operator path's upgrade and rollback
//! (`upgrade_operator.rs`): one claim per node on a disk of that node (a local PV on a loop
//! device), mounted by the operator's pool mounter at the pool path, with a volume in it that a
//! pod keeps writing. After each release's apply the operator must still use the same claims
//! (same UID, no other made), its mounters must run its own image with the disk still mounted
//! under the volume, the pod must run on with its data, and a volume made then lands on the
//! disk. The pool's path is under the lane's edge pool, a directory of each node's own; on the
//! second node only its own mount namespace sees the mount, so its volumes are read through it.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

use k8s_openapi::api::apps::v1::Deployment;
use serde_json::json;
use testbed::real_nodes::NODE2_NAME;

use super::drain::{LoopDisk, run};
use super::upgrade_helm::*;
use super::upgrade_operator::NAMESPACE;
use super::*;

/// The pool's name in the resource.
pub(super) const POOL: &str = "claimed";
/// The class of the disks' local PVs, which the pool's template names.
const DISK_CLASS: &str = "upgrade-claimed-disk";
/// The class of volumes in the pool.
pub(super) const CLASS: &str = "upgrade-operator-claimed";

pub(super) struct ClaimPool {
    path: PathBuf,
    /// Each node's name and disk.
    disks: Vec<(String, LoopDisk)>,
    /// The pool claims' UIDs as first seen, by node.
    uids: BTreeMap<String, String>,
}

impl ClaimPool {
    /// The disks, their class and local PVs, and the pool's directory on each node.
    pub(super) async fn create(ctx: &Ctx, work: &Path) -> Result<ClaimPool> {
        let path = ctx.lane.edge_pool().join(POOL);
        let mut disks = Vec::new();
        for node in [ctx.lane.node_name(), NODE2_NAME] {
            std::fs::create_dir_all(ctx.lane.host_path_on(node, &path))?;
            let disk = LoopDisk::create(&work.join(format!("claimed-disk-{node}.img")))?;
            disks.push((node.to_owned(), disk));
        }
        let class = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": DISK_CLASS},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
        });
        Api::<StorageClass>::all(ctx.lane.client())
            .create(&PostParams::default(), &serde_json::from_value(class)?)
            .await?;
        for (node, disk) in &disks {
            let pv = json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": format!("{DISK_CLASS}-{node}")},
                "spec": {
                    "capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                    "persistentVolumeReclaimPolicy": "Retain", "storageClassName": DISK_CLASS,
                    "local": {"path": disk.device, "fsType": "ext4"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
                    ]}]}},
                },
            });
            Api::<PersistentVolume>::all(ctx.lane.client())
                .create(&PostParams::default(), &serde_json::from_value(pv)?)
                .await?;
        }
        Ok(ClaimPool { path, disks, uids: BTreeMap::new() })
    }

    /// Its entry in the resource's `storagePools`.
    pub(super) fn resource_entry(&self) -> serde_json::Value {
        json!({
            "name": POOL, "path": self.path,
            "pvcTemplate": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": DISK_CLASS,
                "resources": {"requests": {"storage": "32Mi"}},
            },
        })
    }

    /// Each node's claim and mounter, as both releases name them.
    fn claim_name(node: &str) -> String {
        format!("hpp-pool-{POOL}-{node}")
    }

    fn disk(&self, node: &str) -> Result<&LoopDisk> {
        self.disks.iter().find(|(n, _)| n == node).map(|(_, d)| d).with_context(|| format!("no disk on {node}"))
    }

    /// Each node's pool claim bound, the same claim as first seen; its mounter rolled out with
    /// `image` and available; the disk mounted at the pool path on the node; no other claim
    /// made for the pool.
    pub(super) async fn served_by(&mut self, ctx: &Ctx, image: &str) -> Result<()> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), NAMESPACE);
        let deployments: Api<Deployment> = Api::namespaced(ctx.lane.client(), NAMESPACE);
        for (node, disk) in &self.disks {
            let name = Self::claim_name(node);
            wait_bound(ctx, NAMESPACE, &name).await?;
            let uid = claims.get(&name).await?.metadata.uid.context("uid")?;
            let first = self.uids.entry(node.clone()).or_insert_with(|| uid.clone());
            ensure!(*first == uid, "{name} kept through the release's apply: uid {uid}, first {first}");
            testbed::wait_until(
                &format!("the pool mounter {name} rolled out with {image}"),
                Duration::from_secs(240),
                || async { Ok::<_, kube::Error>(deployments.get_opt(&name).await?.unwrap_or_default()) },
                |d| {
                    let spec_image = d
                        .spec
                        .as_ref()
                        .and_then(|s| s.template.spec.as_ref())
                        .and_then(|s| s.containers.first())
                        .and_then(|c| c.image.clone());
                    spec_image.as_deref() == Some(image)
                        && d.status.as_ref().is_some_and(|s| {
                            s.observed_generation == d.metadata.generation
                                && s.updated_replicas == s.replicas
                                && s.available_replicas.unwrap_or(0) >= 1
                                && s.unavailable_replicas.unwrap_or(0) == 0
                        })
                },
            )
            .await
            .map_err(|e| e.context(release_logs(ctx)))?;
            let (path, disk) = (&self.path, disk);
            testbed::wait_for(&format!("{node}'s disk mounted at {}", path.display()), LANE_TIMEOUT, || async {
                anyhow::Ok(mounted(ctx, node, disk, path)?.then_some(()))
            })
            .await?;
        }
        let all = claims.list(&ListParams::default()).await?.items;
        let made: Vec<String> = all
            .iter()
            .filter_map(|c| c.metadata.name.clone())
            .filter(|n| n.starts_with(&format!("hpp-pool-{POOL}")))
            .collect();
        ensure!(made.len() == self.disks.len(), "one claim per node for the pool, no other: {made:?}");
        Ok(())
    }

    /// `claim`'s volume directory as its node sees it, checked to be in the pool on that
    /// node's disk.
    pub(super) async fn volume_dir(&self, ctx: &Ctx, ns: &str, claim: &str, node: &str) -> Result<PathBuf> {
        let dir = ctx.lane.volume_dir(ns, claim).await?;
        ensure!(dir.parent() == Some(self.path.as_path()), "{claim}'s volume {} in the pool", dir.display());
        let seen = if node == NODE2_NAME { ctx.lane.path_in_second_node(&dir)? } else { dir };
        let dev = std::fs::metadata(&seen).with_context(|| format!("{}", seen.display()))?.dev();
        ensure!(dev == self.disk(node)?.dev, "{claim}'s volume on {node}'s claim disk");
        Ok(seen)
    }

    /// What `claim`'s volume on `node` holds in its `note`.
    pub(super) async fn note(&self, ctx: &Ctx, ns: &str, claim: &str, node: &str) -> Result<String> {
        let dir = self.volume_dir(ctx, ns, claim, node).await?;
        Ok(std::fs::read_to_string(dir.join("note"))?)
    }

    /// After the resource is gone: its claims and mounters removed by the operator. The disks
    /// stay mounted at the pool path, as docs/operator.md says of a mount that a mounter took
    /// over from an earlier one (here, at each release's apply): its copy of the mount is its
    /// container's own, and unmounting it leaves the node's. The admin's step, unmounting the
    /// pool path on the node, lets the kubelet release the disk. Then the disks' PVs, the classes
    /// and the disks themselves go.
    pub(super) async fn remove(self, ctx: &Ctx) -> Result<()> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), NAMESPACE);
        let deployments: Api<Deployment> = Api::namespaced(ctx.lane.client(), NAMESPACE);
        for (node, disk) in &self.disks {
            let name = Self::claim_name(node);
            testbed::wait_for(&format!("{name} and its mounter removed"), LANE_TIMEOUT, || async {
                let gone = claims.get_opt(&name).await?.is_none() && deployments.get_opt(&name).await?.is_none();
                anyhow::Ok(gone.then_some(()))
            })
            .await
            .map_err(|e| e.context(release_logs(ctx)))?;
            ensure!(
                mounted(ctx, node, disk, &self.path)?,
                "{node}'s pool mount, taken over by later mounters, left in place (docs/operator.md); if it is gone now, update the doc and this check"
            );
            let path = self.path.display().to_string();
            if node == NODE2_NAME {
                ctx.lane.run_on_second_node(&["umount", &path])?;
            } else {
                run(std::process::Command::new("umount").arg(&path))?;
            }
            testbed::wait_for(&format!("{node}'s disk released by the kubelet"), LANE_TIMEOUT, || async {
                anyhow::Ok(mounts_of(ctx, node, disk)?.is_empty().then_some(()))
            })
            .await?;
        }
        let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
        for (node, _) in &self.disks {
            pvs.delete(&format!("{DISK_CLASS}-{node}"), &DeleteParams::default()).await?;
        }
        for class in [DISK_CLASS, CLASS] {
            Api::<StorageClass>::all(ctx.lane.client()).delete(class, &DeleteParams::default()).await?;
        }
        testbed::wait_for("the disks' PVs gone", LANE_TIMEOUT, || async {
            for (node, _) in &self.disks {
                if pvs.get_opt(&format!("{DISK_CLASS}-{node}")).await?.is_some() {
                    return anyhow::Ok(None);
                }
            }
            anyhow::Ok(Some(()))
        })
        .await?;
        for (node, disk) in &self.disks {
            disk.detach()?;
            std::fs::remove_dir(ctx.lane.host_path_on(node, &self.path))?;
        }
        Ok(())
    }
}

/// Whether `disk` is mounted at `path` in `node`'s mount namespace.
fn mounted(ctx: &Ctx, node: &str, disk: &LoopDisk, path: &Path) -> Result<bool> {
    Ok(mounts_of(ctx, node, disk)?.contains(&path.display().to_string()))
}

/// Where `disk` is mounted in `node`'s mount namespace.
fn mounts_of(ctx: &Ctx, node: &str, disk: &LoopDisk) -> Result<Vec<String>> {
    let table = if node == NODE2_NAME {
        ctx.lane.path_in_second_node(Path::new("/proc/1/mountinfo"))?
    } else {
        PathBuf::from("/proc/self/mountinfo")
    };
    let text = std::fs::read_to_string(&table).with_context(|| format!("reading {}", table.display()))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            (fields.get(2) == Some(&disk.id.as_str())).then(|| fields.get(4).map(|m| (*m).to_owned()))?
        })
        .collect())
}

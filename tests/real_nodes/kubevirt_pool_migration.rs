//! A kubevirt operator cluster whose pools sit on claims (`pvcTemplate`), moved to this
//! operator by docs/operator.md's steps and back (the install, the move and the way back are
//! `kubevirt_migration.rs`'s).
//!
//! Its `pvcTemplate` example with two pools, a claim per node and a shared (ReadWriteMany) one,
//! each on a disk of the node (a local PV on a loop device): its mounter mounts each claim at
//! `<pool path>/csi` and a pod writes into a CSI volume there; this operator adopts the claims
//! and their mounts (same claim, same mount, the mounter Deployments replaced), its new volumes
//! land on the claims' disks beside the CSI volumes, and back again the kubevirt mounters keep
//! the mounts. Run by `make test-kubevirt-migration`, as the other.

use k8s_openapi::api::apps::v1::Deployment;
use serde_json::json;
use testbed::real_nodes::NODE2_NAME;
use testbed::real_nodes::kubevirt::{CSI_DAEMONSET, CSI_DRIVER, NAMESPACE};

use super::drain::LoopDisk;
use super::kubevirt_migration::{
    CSI_CLASS, Install, RESOURCE, SECTION, Volumes, create_resource, csi_driver_of, edit, go_back, install_kubevirt,
    kubectl, move_to_this_operator, pod_logs, uninstall_kubevirt, wait_driver_registered, wait_gone, wait_rolled_out,
};
use super::swap::made_by_us;
use super::*;

/// The pool of the kubevirt operator's `pvcTemplate` example.
const POOL: &str = "local";
/// A second pool on a claim, ReadWriteMany.
const SHARED_POOL: &str = "vms";
/// What this operator writes on a pool claim it adopted from the kubevirt operator.
const MOUNT_TARGET: &str = "hostpathprovisioner.kubevirt.io/mount-target";

pub(super) async fn a_kubevirt_operator_cluster_with_a_pool_on_a_claim_moves_and_back_with_its_mount_two_nodes(
    ctx: &Ctx,
) -> Result<()> {
    // In this operator's namespace: pools on a claim cannot move to another one (a pod mounts
    // only a claim of its own namespace; docs/operator.md says so).
    let Some(install) = install_kubevirt(ctx, NAMESPACE).await? else { return Ok(()) };
    let Install { build, dir, our_image, theirs, started, .. } = &install;
    // Two pools on claims, each on a disk of the node: one claim per node (ReadWriteOnce) and
    // one for all nodes (ReadWriteMany, named `-shared`).
    let mut pools = Vec::new();
    for (name, shared) in [(POOL, false), (SHARED_POOL, true)] {
        let pool = ClaimPool::create(ctx, dir, name, shared).await?;
        pools.push(pool);
    }
    // Its `pvcTemplate` example, its pool list made of those two (the template of each given
    // the disk's class and a size that fits).
    let resource = build.resource("hostpathprovisioner_pvctemplate_cr.yaml", &pools[0].path)?;
    let (before, rest) = resource.split_once("  storagePools:\n").context("the example has storagePools")?;
    let (_, after) = rest.split_once("  workload:\n").context("the example has a workload")?;
    let entries: String = pools.iter().map(ClaimPool::resource_entry).collect();
    create_resource(ctx, dir, NAMESPACE, format!("{before}  storagePools:\n{entries}  workload:\n{after}"))?;
    wait_rolled_out(ctx, NAMESPACE, CSI_DAEMONSET).await?;
    wait_driver_registered(ctx, NAMESPACE).await?;
    let csi_example = std::fs::read_to_string(build.source.join("deploy/storageclass-wffc-csi.yaml"))?;
    let mut theirs_by_pool = Vec::new();
    for pool in &pools {
        let mounter = wait_mounter_available(ctx, &pool.mounter_name(), "the kubevirt pool mounter").await?;
        pool.wait_mounted(ctx).await?;
        let claim = pool.claims(ctx).get(&pool.claim_name()).await?;
        theirs_by_pool.push((mounter, claim));
        let class = edit(
            csi_example.clone(),
            &[
                (&format!("name: {CSI_CLASS}"), &format!("name: {}", pool.csi_class())),
                (&format!("storagePool: {POOL}"), &format!("storagePool: {}", pool.name)),
            ],
        )?;
        std::fs::write(dir.join(format!("{}.yaml", pool.csi_class())), class)?;
        kubectl(ctx, dir, &["create", "-f", &format!("{}.yaml", pool.csi_class())])?;
    }
    println!("    kubevirt operator, CSI driver and pool mounters running in {:.1} s", started.elapsed().as_secs_f64());

    // A CSI volume of each pool, written by a pod: on the claim's disk.
    for pool in &pools {
        let csi = pool.volumes.claim_with_writer("csi-theirs", &pool.csi_class()).await?;
        ensure!(csi_driver_of(&csi) == Some(CSI_DRIVER), "csi-theirs is a CSI volume: {:?}", csi.spec);
        pool.volumes.on_the_disk(&pool.disk, "csi-theirs").await?;
    }

    let (docs, work) = move_to_this_operator(ctx, dir, our_image, NAMESPACE).await?;
    let documented = documented_class(&ctx.repo)?;
    for (pool, (mounter, claim)) in pools.iter().zip(&theirs_by_pool) {
        // The same claim, adopted where it is mounted; this operator's mounter in place of the
        // kubevirt one, on the same mount.
        let adopted = pool.claims(ctx).get(&pool.claim_name()).await?;
        ensure!(adopted.metadata.uid == claim.metadata.uid, "{} kept (same uid)", pool.claim_name());
        let mount_target = adopted.metadata.annotations.unwrap_or_default().get(MOUNT_TARGET).cloned();
        ensure!(
            mount_target.as_deref() == Some(&*pool.target().display().to_string()),
            "{} marked as mounted at {}: {mount_target:?}",
            pool.claim_name(),
            pool.target().display()
        );
        let ours = wait_mounter_available(ctx, &pool.mounter_name(), "this operator's pool mounter").await?;
        ensure!(
            ours.spec.as_ref().map(|s| &s.selector) != mounter.spec.as_ref().map(|s| &s.selector),
            "the kubevirt mounter Deployment {} replaced by this operator's",
            pool.mounter_name()
        );
        pool.wait_mounted(ctx).await?;
        let volumes = &pool.volumes;
        volumes.still_running_with_their_data(&["csi-theirs"]).await?;
        volumes.mounts_again("csi-theirs").await?;
        // New volumes: the documented class of this provisioner (for the other pool, the same
        // class naming it), and the CSI class.
        let class = edit(
            documented.0.clone(),
            &[
                (&format!("name: {}\n", documented.1), &format!("name: {}\n", pool.our_class(&documented.1))),
                (&format!("storagePool: {POOL} "), &format!("storagePool: {} ", pool.name)),
            ],
        )?;
        let file = format!("{}.yaml", pool.our_class(&documented.1));
        std::fs::write(work.join(&file), class)?;
        kubectl(ctx, &work, &["create", "-f", &file])?;
        let volume = volumes.claim_with_writer("ours-on-the-claim", &pool.our_class(&documented.1)).await?;
        ensure!(made_by_us(&volume), "ours-on-the-claim made by this provisioner");
        volumes.on_the_disk(&pool.disk, "ours-on-the-claim").await?;
        let csi_after = volumes.claim_with_writer("csi-after", &pool.csi_class()).await?;
        ensure!(csi_driver_of(&csi_after) == Some(CSI_DRIVER), "csi-after made by the kept CSI driver");
        volumes.on_the_disk(&pool.disk, "csi-after").await?;
        // "Going back" keeps this provisioner's volumes of a pool but nothing would delete
        // them: released here first.
        volumes.reclaim("ours-on-the-claim").await?;
    }
    println!("    moved to this operator in {:.1} s", started.elapsed().as_secs_f64());

    go_back(ctx, dir, &work, &docs, theirs, NAMESPACE).await?;
    for (pool, (mounter, claim)) in pools.iter().zip(&theirs_by_pool) {
        let back = wait_mounter_available(ctx, &pool.mounter_name(), "the kubevirt pool mounter, back").await?;
        ensure!(
            back.spec.as_ref().map(|s| &s.selector) == mounter.spec.as_ref().map(|s| &s.selector),
            "the kubevirt mounter Deployment {} again",
            pool.mounter_name()
        );
        pool.wait_mounted(ctx).await?;
        let kept = pool.claims(ctx).get(&pool.claim_name()).await?;
        ensure!(kept.metadata.uid == claim.metadata.uid, "{} kept going back (same uid)", pool.claim_name());
        let volumes = &pool.volumes;
        volumes.still_running_with_their_data(&["csi-theirs", "csi-after"]).await?;
        volumes.mounts_again("csi-after").await?;
        let csi_back = volumes.claim_with_writer("csi-back", &pool.csi_class()).await?;
        ensure!(csi_driver_of(&csi_back) == Some(CSI_DRIVER), "csi-back made by the CSI driver");
        volumes.on_the_disk(&pool.disk, "csi-back").await?;
        // Released, for the resource to delete with its pools.
        for volume in ["csi-theirs", "csi-after", "csi-back"] {
            volumes.reclaim(volume).await?;
        }
    }
    kubectl(ctx, dir, &["delete", "hostpathprovisioner", RESOURCE, "--timeout=180s"])
        .map_err(|e| e.context(pod_logs(ctx, NAMESPACE, "")))?;
    // Its cleanup Jobs unmounted the pools; the claims stay, as the kubevirt operator leaves
    // its pool claims (it never deletes one).
    for (pool, (_, claim)) in pools.iter().zip(&theirs_by_pool) {
        wait_gone::<Deployment>(ctx, NAMESPACE, &pool.mounter_name()).await?;
        ensure!(!pool.mounted(ctx)?, "the kubevirt cleanup Job unmounted {}", pool.target().display());
        let left = pool.claims(ctx).get(&pool.claim_name()).await?;
        ensure!(
            left.metadata.uid == claim.metadata.uid,
            "{} left in place by the kubevirt operator",
            pool.claim_name()
        );
    }
    println!("    back to the kubevirt operator and deleted in {:.1} s", started.elapsed().as_secs_f64());

    // As the lane was: the claims, the disks and their PVs, the classes, the kubevirt install.
    for pool in &pools {
        pool.remove(ctx, dir, &work, &documented.1).await?;
    }
    uninstall_kubevirt(ctx, dir, NAMESPACE).await
}

/// A pool of the resource on a claim of a disk of its own on the storage node.
struct ClaimPool<'a> {
    name: &'static str,
    /// ReadWriteMany: one claim for all nodes (`hpp-pool-<pool>-shared`), else one per node.
    shared: bool,
    /// A loop device with ext4, a local PV of a no-provisioner class: the node's kubelet mounts
    /// it for the pool's claim (the kubevirt mounter finds the claim by that mount: it must be
    /// a filesystem of its own).
    disk: LoopDisk,
    /// The pool's path.
    path: PathBuf,
    /// Its users' volumes, in a namespace of their own.
    volumes: Volumes<'a>,
}

impl<'a> ClaimPool<'a> {
    async fn create(ctx: &'a Ctx, dir: &Path, name: &'static str, shared: bool) -> Result<ClaimPool<'a>> {
        let disk = LoopDisk::create(&dir.join(format!("disk-{name}.img")))?;
        let path = dir.join(format!("pool-{name}"));
        std::fs::create_dir_all(&path)?;
        let volumes =
            Volumes { ctx, ns: ctx.namespace(&format!("kubevirt-{name}")).await?, csi_root: path.join("csi") };
        let pool = ClaimPool { name, shared, disk, path, volumes };
        let class = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": pool.disk_class()},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "WaitForFirstConsumer",
        });
        let pv = json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": pool.disk_class()},
            "spec": {
                "capacity": {"storage": "64Mi"}, "accessModes": [pool.access_mode()], "volumeMode": "Filesystem",
                "persistentVolumeReclaimPolicy": "Retain", "storageClassName": pool.disk_class(),
                "local": {"path": pool.disk.device, "fsType": "ext4"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE2_NAME]}
                ]}]}},
            },
        });
        std::fs::write(dir.join(pool.disk_file()), format!("{class}\n{pv}"))?;
        kubectl(ctx, dir, &["create", "-f", &pool.disk_file()])?;
        Ok(pool)
    }

    fn access_mode(&self) -> &'static str {
        if self.shared { "ReadWriteMany" } else { "ReadWriteOnce" }
    }
    fn disk_class(&self) -> String {
        format!("kubevirt-disk-{}", self.name)
    }
    fn disk_file(&self) -> String {
        format!("disk-{}.json", self.name)
    }
    /// Its claim, as both operators name it.
    fn claim_name(&self) -> String {
        if self.shared {
            format!("hpp-pool-{}-shared", self.name)
        } else {
            format!("hpp-pool-{}-{NODE2_NAME}", self.name)
        }
    }
    /// Its mounter Deployment on the storage node (same name under both operators).
    fn mounter_name(&self) -> String {
        format!("hpp-pool-{}-{NODE2_NAME}", self.name)
    }
    /// Where the kubevirt operator mounts the claim, and this one keeps it.
    fn target(&self) -> PathBuf {
        self.path.join("csi")
    }
    /// Its CSI class: the kubevirt example's for the example's pool, named after the pool for
    /// the other.
    fn csi_class(&self) -> String {
        if self.name == POOL { CSI_CLASS.to_owned() } else { format!("{CSI_CLASS}-{}", self.name) }
    }
    /// Its class of this provisioner: the documented one for the pool the doc names.
    fn our_class(&self, documented: &str) -> String {
        if self.name == POOL { documented.to_owned() } else { format!("hostpath-{}", self.name) }
    }
    fn claims(&self, ctx: &Ctx) -> Api<PersistentVolumeClaim> {
        Api::namespaced(ctx.lane.client(), NAMESPACE)
    }

    /// Its entry in the resource's `storagePools`.
    fn resource_entry(&self) -> String {
        format!(
            "    - name: \"{}\"\n      pvcTemplate:\n        accessModes:\n        - {}\n        storageClassName: {}\n        resources:\n          requests:\n            storage: 32Mi\n      path: \"{}\"\n",
            self.name,
            self.access_mode(),
            self.disk_class(),
            self.path.display()
        )
    }

    fn mounted(&self, ctx: &Ctx) -> Result<bool> {
        let target = self.target().display().to_string();
        Ok(node2_mounts_of(ctx, &self.disk)?.contains(&target))
    }

    /// The claim's disk mounted at the target on the storage node.
    async fn wait_mounted(&self, ctx: &Ctx) -> Result<()> {
        testbed::wait_for(
            &format!("{}'s disk mounted at {}", self.name, self.target().display()),
            LANE_TIMEOUT,
            || async { anyhow::Ok(self.mounted(ctx)?.then_some(())) },
        )
        .await
        .map_err(|e| e.context(pod_logs(ctx, NAMESPACE, "hpp-pool")))
    }

    /// The claim, the disk's PV and class, this provisioner's class of the pool and the disk
    /// itself gone.
    async fn remove(&self, ctx: &Ctx, dir: &Path, work: &Path, documented: &str) -> Result<()> {
        kubectl(ctx, dir, &["delete", "pvc", "-n", NAMESPACE, &self.claim_name(), "--wait"])?;
        kubectl(ctx, dir, &["delete", "-f", &self.disk_file(), "--wait"])?;
        kubectl(ctx, work, &["delete", "-f", &format!("{}.yaml", self.our_class(documented))])?;
        kubectl(ctx, dir, &["delete", "storageclass", &self.csi_class(), "--ignore-not-found"])?;
        testbed::wait_for(&format!("{}'s disk unmounted on the node", self.name), LANE_TIMEOUT, || async {
            anyhow::Ok(node2_mounts_of(ctx, &self.disk)?.is_empty().then_some(()))
        })
        .await?;
        self.disk.detach()
    }
}

/// The pool mounter Deployment `name` (same name under both operators) available.
async fn wait_mounter_available(ctx: &Ctx, name: &str, what: &str) -> Result<Deployment> {
    let deployments: Api<Deployment> = Api::namespaced(ctx.lane.client(), NAMESPACE);
    testbed::wait_until(
        &format!("{what} {name} available"),
        Duration::from_secs(240),
        || async { Ok::<_, kube::Error>(deployments.get_opt(name).await?.unwrap_or_default()) },
        |d| d.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0) >= 1,
    )
    .await
    .map_err(|e| e.context(pod_logs(ctx, NAMESPACE, name)).context(ctx.lane.log_tails(30)))
}

/// Mount points of `disk`'s filesystem on the storage node, from the node's own mount table.
fn node2_mounts_of(ctx: &Ctx, disk: &LoopDisk) -> Result<Vec<String>> {
    let table = ctx.lane.path_in_second_node(Path::new("/proc/1/mountinfo"))?;
    let text = std::fs::read_to_string(&table).with_context(|| format!("reading {}", table.display()))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            (fields.get(2) == Some(&disk.id.as_str())).then(|| fields.get(4).map(|m| m.to_string()))?
        })
        .collect())
}

/// The StorageClass docs/operator.md gives for new volumes of a storage pool ("Coming from the
/// kubevirt operator", its first `yaml` block), and its name.
fn documented_class(repo: &Path) -> Result<(String, String)> {
    let doc = std::fs::read_to_string(repo.join("docs/operator.md"))?;
    let section = doc.split(&format!("## {SECTION}\n")).nth(1).context("docs/operator.md has no such section")?;
    let block = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .context("no yaml block in the section")?;
    ensure!(block.contains(&format!("storagePool: {POOL}")), "the documented class names the pool {POOL}: {block}");
    let name = block
        .lines()
        .find_map(|l| l.trim().strip_prefix("name:"))
        .map(|n| n.trim().to_owned())
        .context("the documented class has a name")?;
    Ok((block.to_owned(), name))
}

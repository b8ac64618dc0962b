//! `kubectl drain` of the node a pool on a claim is mounted on, run as docs/draining.md tells
//! users (the commands are read from that page). The pool's claim is a local PV on a block
//! device (a loop device with ext4), so that the kubelet mounts and unmounts a device for it as
//! it does for a disk of a storage driver. A pod wrote into a volume of the pool and another
//! keeps it in use; the drain evicts that pod and the mounter. What is checked: the bind mount
//! never leaves the pool path, the mounter comes back on the cordoned node and adopts it, a claim
//! made meanwhile lands on the pool's disk, and after a reboot-like loss of the mount a claim
//! gets an Event instead of a directory on the root disk until the mounter mounts the claim
//! again; after `kubectl uncordon` the workload runs again, the data is intact and no volume
//! moved. Everything it made goes at the end, the mount and the loop device included.

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::api::DynamicObject;
use serde_json::json;

use super::*;

const OPERATOR_NAMESPACE: &str = "hostpath-provisioner";
const RESOURCE: &str = "lane-drain";
const POOL: &str = "drained";
/// The page whose commands the scenario runs.
const DOC: &str = "docs/draining.md";
const POOL_LABEL: &str = "hostpathprovisioner.kubevirt.io/pool";

/// The operator process on the host (as in tests/e2e_operator.rs), stopped when dropped.
struct OperatorProcess(std::process::Child);

impl OperatorProcess {
    /// Starts the operator; its output goes (appended) to `drain-operator.log` in the lane directory.
    fn start(ctx: &Ctx, image: &str) -> Result<OperatorProcess> {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(ctx.lane.dir().join("drain-operator.log"))?;
        Ok(OperatorProcess(
            std::process::Command::new(env!("CARGO_BIN_EXE_hostpath-provisioner"))
                .args(["operator", "--namespace", OPERATOR_NAMESPACE, "--node-image", image])
                .arg("--kubeconfig")
                .arg(ctx.lane.cp().kubeconfig_path())
                .env("POD_NAME", "lane-drain-operator")
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()?,
        ))
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `kubectl <verb> ...` line of docs/draining.md as kubectl's arguments, `<node>` replaced:
/// the scenario runs what the page tells users to run.
fn documented_kubectl(repo: &Path, verb: &str, node: &str) -> Result<Vec<String>> {
    let doc = std::fs::read_to_string(repo.join(DOC)).with_context(|| format!("reading {DOC}"))?;
    let prefix = format!("kubectl {verb} ");
    let line = doc
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with(&prefix))
        .with_context(|| format!("no `{prefix}...` command in {DOC}"))?;
    ensure!(line.contains("<node>"), "the command names <node>: {line}");
    Ok(line.split_whitespace().skip(1).map(|w| if w == "<node>" { node.to_owned() } else { w.to_owned() }).collect())
}

/// A block device with ext4 on it (a loop device over a file in the lane directory, which the
/// lane's cleanup detaches if the scenario does not get to it).
pub(super) struct LoopDisk {
    pub(super) device: PathBuf,
    /// `major:minor` as /proc/self/mountinfo shows the filesystem's mounts.
    pub(super) id: String,
    /// `st_dev` of the files on it.
    pub(super) dev: u64,
}

impl LoopDisk {
    pub(super) fn create(image: &Path) -> Result<LoopDisk> {
        std::fs::File::create(image)?.set_len(64 << 20)?;
        run(std::process::Command::new("mkfs.ext4").args(["-q", "-F"]).arg(image))?;
        let device = run(std::process::Command::new("losetup").args(["--find", "--show"]).arg(image))?;
        let device = PathBuf::from(device.trim());
        let dev = std::fs::metadata(&device)?.rdev();
        let id = format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev));
        Ok(LoopDisk { device, id, dev })
    }

    /// The loop device detached (once nothing mounts it).
    pub(super) fn detach(&self) -> Result<()> {
        run(std::process::Command::new("losetup").arg("-d").arg(&self.device))?;
        Ok(())
    }

    /// Mount points of its filesystem on the host.
    fn mounts(&self) -> Vec<String> {
        mountinfo().into_iter().filter(|m| m.device == self.id).map(|m| m.mount_point).collect()
    }

    /// Whether the kubelet holds its own mount of the device (the local volume plugin's global
    /// mount, the counterpart of a CSI driver's staging path).
    fn staged(&self) -> bool {
        self.mounts().iter().any(|m| m.contains("/plugins/kubernetes.io/local-volume/mounts/"))
    }

    /// Whether the filesystem is mounted at `path` on the host.
    fn mounted_at(&self, path: &Path) -> bool {
        let path = path.display().to_string();
        mountinfo().iter().any(|m| m.device == self.id && m.mount_point == path)
    }
}

pub(super) fn run(command: &mut std::process::Command) -> Result<String> {
    let output = command.output().with_context(|| format!("running {command:?}"))?;
    ensure!(output.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

struct Mount {
    device: String,
    mount_point: String,
}

/// The host's mounts, from /proc/self/mountinfo (no path here needs unescaping).
fn mountinfo() -> Vec<Mount> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            Some(Mount { device: fields.get(2)?.to_string(), mount_point: fields.get(4)?.to_string() })
        })
        .collect()
}

/// Samples, every 20 ms on a thread of its own, whether the disk is mounted at the pool path and
/// by the kubelet; [`MountWatch::stop`] says how many samples were taken and which missed one.
struct MountWatch {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(usize, Vec<Duration>)>,
}

impl MountWatch {
    fn start(disk: &LoopDisk, pool: &Path) -> MountWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let (id, pool, flag) = (disk.id.clone(), pool.to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            let disk = LoopDisk { device: PathBuf::new(), id, dev: 0 };
            let started = Instant::now();
            let (mut samples, mut missed) = (0, Vec::new());
            while !flag.load(Ordering::Relaxed) {
                samples += 1;
                if !disk.mounted_at(&pool) || !disk.staged() {
                    missed.push(started.elapsed());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (samples, missed)
        });
        MountWatch { stop, thread }
    }

    fn stop(self) -> (usize, Vec<Duration>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

async fn wait_status(ctx: &Ctx, what: &str, done: impl Fn(&serde_json::Value) -> bool) -> Result<serde_json::Value> {
    let api = resources(ctx);
    testbed::wait_for(what, LANE_TIMEOUT, || async {
        let found = api.get_opt(RESOURCE).await?;
        anyhow::Ok(found.map(|r| r.data["status"].clone()).filter(|s| done(s)))
    })
    .await
    .map_err(|e| e.context(operator_logs(ctx)))
}

fn pool_ready(status: &serde_json::Value) -> bool {
    status["storagePoolStatuses"]
        .as_array()
        .is_some_and(|p| p.iter().any(|p| p["name"] == POOL && p["phase"] == "Ready" && p["currentReady"] == 1))
}

/// The operator's log and the logs of the pods in its namespace, for failure messages.
fn operator_logs(ctx: &Ctx) -> String {
    let mut out = format!(
        "operator log:\n{}\n",
        std::fs::read_to_string(ctx.lane.dir().join("drain-operator.log")).unwrap_or_default()
    );
    for entry in std::fs::read_dir(ctx.lane.dir().join("pod-logs")).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with(&format!("{OPERATOR_NAMESPACE}_")) {
            for file in walk(&entry.path()) {
                out.push_str(&format!("--- {}\n", file.display()));
                out.push_str(&std::fs::read_to_string(file).unwrap_or_default());
            }
        }
    }
    out
}

/// What the cluster and the node provisioner show about `claim`, for a failure message.
async fn diagnose(ctx: &Ctx, ns: &str, claim: &str, pool: &Path) -> String {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
    let mut out = format!(
        "claim: {:?}\n",
        claims.get_opt(claim).await.ok().flatten().map(|c| (c.metadata.annotations, c.status))
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(ctx.lane.client(), ns);
    for e in events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
        let about = e.regarding.and_then(|r| r.name).unwrap_or_default();
        out.push_str(&format!("event {about} {:?} {:?}: {:?}\n", e.type_, e.reason, e.note));
    }
    out.push_str(&format!(
        "pool entries: {:?}\n",
        std::fs::read_dir(pool).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    ));
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), OPERATOR_NAMESPACE);
    let tasks = ctx.lane.container_pids().unwrap_or_default();
    for pod in pods.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default() {
        for status in pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()) {
            let id = status.container_id.clone().unwrap_or_default().trim_start_matches("containerd://").to_owned();
            if let Some((_, pid)) = tasks.iter().find(|(task, _)| *task == id) {
                let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
                let name = pod.metadata.name.clone().unwrap_or_default();
                for line in mounts.lines().filter(|l| l.contains("drain-pool")) {
                    out.push_str(&format!("{name} {}: {line}\n", status.name));
                }
            }
        }
    }
    out.push_str(&format!(
        "host: {:?}\n",
        mountinfo()
            .iter()
            .filter(|m| m.mount_point.contains("drain-pool"))
            .map(|m| (&m.device, &m.mount_point))
            .collect::<Vec<_>>()
    ));
    out
}

/// The pool's mounter pods, Ready or not.
async fn mounters(ctx: &Ctx) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), OPERATOR_NAMESPACE);
    Ok(pods.list(&ListParams::default().labels(&format!("{POOL_LABEL}={POOL}"))).await?.items)
}

fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).sum())
}

/// Waits for a Ready mounter on the node that `accept` takes.
async fn ready_mounter(ctx: &Ctx, what: &str, accept: impl Fn(&Pod) -> bool) -> Result<Pod> {
    testbed::wait_for(what, LANE_TIMEOUT, || async {
        let found = mounters(ctx).await?.into_iter().find(|p| is_ready(p) && accept(p));
        anyhow::Ok(found)
    })
    .await
    .map_err(|e| e.context(operator_logs(ctx)))
}

/// The workload: a Deployment whose pod keeps the claim in use, notes in `/data/log` when it
/// starts and when it is asked to stop.
fn workload(ns: &str, node: &str) -> Result<Deployment> {
    let script = "echo \"started $(hostname)\" >> /data/log; \
                  trap 'echo \"stopped $(hostname)\" >> /data/log; exit 0' TERM; \
                  while true; do sleep 1 & wait $!; done";
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "app", "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "drained"}},
            "template": {
                "metadata": {"labels": {"app": "drained"}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 10,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [{
                        "name": "main", "image": images::BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", script],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
                },
            },
        },
    }))?)
}

async fn workload_pods(ctx: &Ctx, ns: &str) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), ns);
    Ok(pods.list(&ListParams::default().labels("app=drained")).await?.items)
}

fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

/// Whether the scheduler said the pod cannot go anywhere (the cordoned node is the only one
/// it may use).
fn unschedulable(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")))
}

/// The entries of the pool's trash and deletion staging directories (none exist: none).
fn trash_entries(pool: &Path) -> Vec<String> {
    [".hpp-trash", ".hpp-deleting"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(pool.join(dir)).into_iter().flatten().flatten())
        .map(|e| e.path().display().to_string())
        .collect()
}

/// What the scenario made, for the steps and the cleanup.
struct Setup {
    ns: String,
    node: String,
    pool: PathBuf,
    disk: LoopDisk,
    /// The disk's class and its PV's name.
    disk_class: String,
    /// The pool's class, once made.
    class: String,
}

impl Setup {
    /// A claim of the pool's class pinned to the node (`kubevirt.io/provisionOnNode`).
    fn pinned(&self, name: &str) -> PersistentVolumeClaim {
        fixtures::claim(&self.ns, name, &self.class, "16Mi").provision_on_node(&self.node).build()
    }

    fn claims(&self, ctx: &Ctx) -> Api<PersistentVolumeClaim> {
        Api::namespaced(ctx.lane.client(), &self.ns)
    }

    /// The pool's claim in the operator's namespace.
    async fn pool_claim(&self, ctx: &Ctx) -> Result<PersistentVolumeClaim> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), OPERATOR_NAMESPACE);
        Ok(claims.get(&format!("hpp-pool-{POOL}-{}", self.node)).await?)
    }
}

/// The volume of the pool and who wrote into it before the drain.
struct Written {
    data_dir: PathBuf,
    data_pv: String,
    /// The workload's pod before the drain.
    first_app: String,
    /// The mounter before the drain.
    first_mounter: String,
}

pub(super) async fn kubectl_drain_of_a_node_whose_pool_sits_on_a_claim_loses_nothing_and_the_pool_comes_back(
    ctx: &Ctx,
) -> Result<()> {
    let image = ctx.deployed().await?;
    let node = ctx.lane.node_name().to_owned();
    // One node provisioner per node: deploy/legacy's steps aside, and comes back at the end.
    ctx.lane
        .cp()
        .run_kubectl(&ctx.repo, &["delete", "daemonset", "-n", DEPLOY_NAMESPACE, DEPLOY_DAEMONSET, "--wait"])?;
    ctx.lane.cp().run_kubectl(&ctx.repo, &["apply", "--server-side", "--force-conflicts", "-k", "deploy/operator"])?;
    ctx.lane.cp().run_kubectl(
        &ctx.repo,
        &[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            "crd/hostpathprovisioners.hostpathprovisioner.kubevirt.io",
        ],
    )?;
    // deploy/operator's Deployment names a registry placeholder: the operator runs on the host.
    ctx.lane.cp().run_kubectl(
        &ctx.repo,
        &["scale", "deployment", "-n", OPERATOR_NAMESPACE, "hostpath-provisioner-operator", "--replicas=0"],
    )?;
    let mut operator = Some(OperatorProcess::start(ctx, &image)?);

    let ns = ctx.namespace("drain").await?;
    let pool = ctx.lane.dir().join("drain-pool");
    std::fs::create_dir_all(&pool)?;
    // containerd refuses Bidirectional and HostToContainer mounts of a private mount.
    testbed::real_nodes::host::make_shared_mount(&pool)?;
    let disk = LoopDisk::create(&ctx.lane.dir().join("drain-disk.img"))?;
    let disk_class = format!("{ns}-disk");
    let mut setup = Setup { ns, node, pool, disk, disk_class, class: String::new() };

    let outcome = async {
        let written = a_pool_on_the_disk_with_a_volume_in_use(ctx, &mut setup).await?;
        the_drain(ctx, &setup, &written).await?;
        the_mounter_away(ctx, &setup, &written, &mut operator, &image).await?;
        after_a_reboot(ctx, &setup).await?;
        back_in_service(ctx, &setup, &written).await
    }
    .await;
    match outcome {
        Ok(()) => {
            let cleaned = clean_up(ctx, &setup).await;
            drop(operator.take());
            let restored = ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await.map(|_| ());
            cleaned.and(restored)
        }
        Err(err) => {
            let logs = operator_logs(ctx);
            // The next scenarios need the node schedulable and deploy/legacy's provisioner alone on it.
            let _ = ctx.lane.cp().run_kubectl(&ctx.repo, &["uncordon", &setup.node]);
            drop(operator.take());
            let _ = ctx.lane.cp().run_kubectl(
                &ctx.repo,
                &["delete", "daemonset", "-n", OPERATOR_NAMESPACE, DEPLOY_DAEMONSET, "--ignore-not-found", "--wait"],
            );
            let _ = ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await;
            Err(err.context(logs))
        }
    }
}

/// The disk as a local PV, the operator's pool on a claim of it, a volume of the pool a pod
/// wrote into and a Deployment's pod that keeps it in use.
async fn a_pool_on_the_disk_with_a_volume_in_use(ctx: &Ctx, setup: &mut Setup) -> Result<Written> {
    let Setup { ns, node, pool, disk, disk_class, .. } = &*setup;
    // The disk: a local PV of a no-provisioner class on the block device.
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": disk_class},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))?;
    Api::<StorageClass>::all(ctx.lane.client()).create(&PostParams::default(), &class).await?;
    let disk_pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": disk_class},
        "spec": {
            "capacity": {"storage": "64Mi"}, "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": disk_class,
            "local": {"path": disk.device, "fsType": "ext4"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
            ]}]}},
        },
    }))?;
    Api::<PersistentVolume>::all(ctx.lane.client()).create(&PostParams::default(), &disk_pv).await?;
    let resource: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
        "metadata": {"name": RESOURCE},
        "spec": {
            "imagePullPolicy": "IfNotPresent",
            "workload": {"nodeSelector": {"kubernetes.io/hostname": node}},
            "storagePools": [{"name": POOL, "path": pool, "pvcTemplate": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": disk_class,
                "resources": {"requests": {"storage": "64Mi"}},
            }}],
        },
    }))?;
    resources(ctx).create(&PostParams::default(), &resource).await?;
    wait_status(ctx, "the pool on the claim Ready", pool_ready).await?;
    ensure!(disk.mounted_at(pool), "the claim's device is mounted at the pool path: {:?}", disk.mounts());

    // A volume of the pool, written by one pod and kept in use by a Deployment's.
    let class = ctx.class(ns, &[("storagePool", POOL)]).await?;
    setup.class = class;
    let Setup { ns, node, pool, disk, disk_class, .. } = &*setup;
    setup.claims(ctx).create(&PostParams::default(), &setup.pinned("data")).await?;
    let outcome = ctx
        .lane
        .run_pod(&PodRun::new(ns, "writer", "echo written before the drain > /data/file").claim("data").on_node(node))
        .await?;
    ensure!(outcome.exit_code == Some(0), "writer exited {:?}: {}", outcome.exit_code, outcome.logs);
    ctx.lane.delete_pod(ns, "writer").await?;
    let data_pv = ctx.pv_of(ns, "data").await?.metadata.name.unwrap_or_default();
    let data_dir = ctx.lane.volume_dir(ns, "data").await?;
    ensure!(data_dir.parent() == Some(pool.as_path()), "the volume is in the pool: {}", data_dir.display());
    ensure!(std::fs::metadata(&data_dir)?.dev() == disk.dev, "the volume is on the claim's disk");
    let deployments: Api<Deployment> = Api::namespaced(ctx.lane.client(), ns);
    deployments.create(&PostParams::default(), &workload(ns, node)?).await?;
    let first_app = testbed::wait_for("the workload pod running", LANE_TIMEOUT, || async {
        anyhow::Ok(workload_pods(ctx, ns).await?.into_iter().find(|p| phase(p) == "Running"))
    })
    .await?;
    let first_app = first_app.metadata.name.unwrap_or_default();
    let first_mounter = ready_mounter(ctx, "the mounter Ready", |_| true).await?;
    let pool_claim_pv = setup.pool_claim(ctx).await?.spec.and_then(|s| s.volume_name);
    ensure!(
        pool_claim_pv.as_deref() == Some(disk_class.as_str()),
        "the pool's claim is on the disk: {pool_claim_pv:?}"
    );

    Ok(Written { data_dir, data_pv, first_app, first_mounter: first_mounter.metadata.name.unwrap_or_default() })
}

/// `kubectl drain`, as the page says, and what it does to the mount, the mounter, the claim, the
/// workload and new claims.
async fn the_drain(ctx: &Ctx, setup: &Setup, written: &Written) -> Result<()> {
    let Setup { ns, node, pool, disk, disk_class, .. } = setup;
    let Written { data_dir, first_app, first_mounter, .. } = written;
    // The drain, as the page says.
    let watch = MountWatch::start(disk, pool);
    let mut drain = documented_kubectl(&ctx.repo, "drain", node)?;
    // Bounded here (kubectl waits forever by default), so that a stuck eviction fails the test.
    drain.push("--timeout=120s".into());
    let drain: Vec<&str> = drain.iter().map(String::as_str).collect();
    let said = ctx.lane.cp().run_kubectl(&ctx.repo, &drain)?;
    println!("kubectl {}:\n{said}", drain.join(" "));
    ensure!(said.contains(&format!("pod/{first_mounter} evicted")), "the drain evicts the mounter: {said}");
    ensure!(said.contains(&format!("pod/{first_app} evicted")), "the drain evicts the workload: {said}");
    let unschedulable_node =
        Api::<Node>::all(ctx.lane.client()).get(node).await?.spec.and_then(|s| s.unschedulable).unwrap_or(false);
    ensure!(unschedulable_node, "the node is cordoned");

    // The mounter comes back on the cordoned node at once and adopts the mount in place.
    let second_mounter = ready_mounter(ctx, "a new mounter Ready on the drained node", |p| {
        p.metadata.name.as_deref() != Some(first_mounter.as_str())
            && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node.as_str())
    })
    .await?;
    let mounter_log = ctx.lane.container_logs(&second_mounter, "mounter");
    ensure!(mounter_log.contains("adopted"), "the new mounter adopts the mount in place: {mounter_log}");
    println!("the new mounter said: {}", mounter_log.trim());
    wait_status(ctx, "the pool Ready again during the drain", pool_ready).await?;

    // The workload's new pod waits for the node.
    let pending = testbed::wait_for("the workload's new pod Pending, unschedulable", LANE_TIMEOUT, || async {
        let pods = workload_pods(ctx, ns).await?;
        anyhow::Ok(pods.into_iter().find(|p| phase(p) == "Pending" && unschedulable(p)))
    })
    .await?;
    let message = pending
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    println!("the workload's new pod: {message}");
    ensure!(message.contains("unschedulable"), "the scheduler says why: {message}");

    // The claim, its volume and what the evicted pod wrote on its way out.
    let bound_to = setup.pool_claim(ctx).await?;
    ensure!(
        bound_to.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(disk_class.as_str())
            && bound_to.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
        "the pool's claim stays Bound to the disk"
    );
    ensure!(std::fs::metadata(data_dir)?.dev() == disk.dev, "the volume is still on the claim's disk");
    let log = std::fs::read_to_string(data_dir.join("log"))?;
    ensure!(log == format!("started {first_app}\nstopped {first_app}\n"), "the evicted pod's notes: {log:?}");

    // A claim pinned to the drained node meanwhile: made on the pool's disk.
    let claims = setup.claims(ctx);
    claims.create(&PostParams::default(), &setup.pinned("during-drain")).await?;
    testbed::wait_until(
        "the claim made during the drain Bound",
        LANE_TIMEOUT,
        || claims.get("during-drain"),
        |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
    )
    .await?;
    let during = ctx.lane.volume_dir(ns, "during-drain").await?;
    ensure!(std::fs::metadata(&during)?.dev() == disk.dev, "made on the claim's disk: {}", during.display());

    let (samples, missed) = watch.stop();
    ensure!(
        samples > 50 && missed.is_empty(),
        "the device stayed mounted at the pool path and by the kubelet ({samples} samples): missing at {missed:?}"
    );

    Ok(())
}

/// The mounter away for a while with the volume's pod gone (here: the operator stopped and the
/// mounter scaled to zero): the kubelet tears the mounter's pod volume down but leaves the
/// claim's device mounted, since the pool's bind mount on the host refers to it.
async fn the_mounter_away(
    ctx: &Ctx,
    setup: &Setup,
    written: &Written,
    operator: &mut Option<OperatorProcess>,
    image: &str,
) -> Result<()> {
    let Setup { node, pool, disk, disk_class, .. } = setup;
    let kubelet_log = ctx.lane.log_paths().into_iter().find(|(name, _)| name == "kubelet").context("kubelet log")?.1;
    // The mounter away for a while with the volume's pod gone (here: the operator stopped and
    // the mounter scaled to zero): the kubelet tears the mounter's pod volume down but leaves
    // the claim's device mounted, since the pool's bind mount on the host refers to it.
    *operator = None;
    let mounter_deployment = format!("deployment/hpp-pool-{POOL}-{node}");
    ctx.lane.cp().run_kubectl(&ctx.repo, &["scale", "-n", OPERATOR_NAMESPACE, &mounter_deployment, "--replicas=0"])?;
    testbed::wait_for("no mounter pod", LANE_TIMEOUT, || async {
        anyhow::Ok(mounters(ctx).await?.is_empty().then_some(()))
    })
    .await?;
    let refused = testbed::wait_for("the kubelet declining to unmount the claim's device", LANE_TIMEOUT, || async {
        let log = std::fs::read_to_string(&kubelet_log)?;
        let line =
            log.lines().find(|l| l.contains("still mounted by other references") && l.contains(disk_class.as_str()));
        anyhow::Ok(line.map(str::to_owned))
    })
    .await?;
    println!("the kubelet with the mounter away: {refused}");
    ensure!(refused.contains(&pool.display().to_string()), "the reference is the pool's mount: {refused}");
    ensure!(disk.mounted_at(pool), "the pool stays mounted: {:?}", disk.mounts());
    ensure!(disk.staged(), "the kubelet's own mount of the device stays: {:?}", disk.mounts());
    let file = std::fs::read_to_string(written.data_dir.join("file"))?;
    ensure!(file == "written before the drain\n", "readable meanwhile: {file:?}");
    *operator = Some(OperatorProcess::start(ctx, image)?);
    let back = ready_mounter(ctx, "the mounter back with the operator", |_| true).await?;
    let said = ctx.lane.container_logs(&back, "mounter");
    ensure!(said.contains("adopted"), "adopts the mount in place: {said}");
    wait_status(ctx, "the pool Ready with the mounter back", pool_ready).await?;

    Ok(())
}

/// The node back from a reboot, as the pool sees it: the mount is gone (a lazy unmount here, the
/// node provisioner holds the pool open) until the mounter starts again.
async fn after_a_reboot(ctx: &Ctx, setup: &Setup) -> Result<()> {
    let Setup { ns, pool, disk, .. } = setup;
    let claims = setup.claims(ctx);
    // The node back from a reboot, as the pool sees it: the mount is gone (a lazy unmount here,
    // the node provisioner holds the pool open) and the mounter starts again.
    let pool_c = std::ffi::CString::new(pool.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid NUL-terminated path.
    ensure!(unsafe { libc::umount2(pool_c.as_ptr(), libc::MNT_DETACH) } == 0, "unmounting {}", pool.display());
    ensure!(!disk.mounted_at(pool), "the pool's mount is gone");
    claims.create(&PostParams::default(), &setup.pinned("while-unmounted")).await?;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(ctx.lane.client(), ns);
    let note = testbed::wait_for("the Event of the claim made while the pool is not mounted", LANE_TIMEOUT, || async {
        let list = events.list(&ListParams::default()).await?;
        anyhow::Ok(list.items.into_iter().find_map(|e| {
            let regarding = e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("while-unmounted");
            let failed = e.reason.as_deref() == Some("ProvisioningFailed") && e.type_.as_deref() == Some("Warning");
            (regarding && failed).then(|| e.note.unwrap_or_default())
        }))
    })
    .await;
    let note = match note {
        Ok(note) => note,
        Err(err) => return Err(err.context(diagnose(ctx, ns, "while-unmounted", pool).await)),
    };
    println!("the claim made while the pool is not mounted: {note}");
    ensure!(note.contains("nothing is mounted at") && note.contains(&pool.display().to_string()), "says why: {note}");
    let on_root_disk: Vec<_> = std::fs::read_dir(pool)?.flatten().map(|e| e.file_name()).collect();
    ensure!(
        on_root_disk.iter().all(|n| n.to_string_lossy().starts_with('.')),
        "nothing made on the root disk under the pool path: {on_root_disk:?}"
    );
    let claim_phase = claims.get("while-unmounted").await?.status.and_then(|s| s.phase);
    ensure!(claim_phase.as_deref() == Some("Pending"), "the claim waits: {claim_phase:?}");
    // The mounter's container starts again, as after a reboot (SIGKILL: no goodbye).
    let mounter_now = mounters(ctx).await?.into_iter().find(|p| p.metadata.deletion_timestamp.is_none());
    let mounter_now = mounter_now.context("a mounter pod")?;
    let id = container_id(&mounter_now, "mounter")?;
    let pid = ctx
        .lane
        .container_pids()?
        .into_iter()
        .find(|(task, _)| *task == id)
        .map(|(_, pid)| pid)
        .context("the mounter's task in containerd")?;
    let before = restarts(&mounter_now);
    // SAFETY: kill(2) of a PID containerd just listed as the mounter's.
    ensure!(unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) } == 0, "killing the mounter");
    let restarted = mounter_now.metadata.name.clone();
    ready_mounter(ctx, "the mounter Ready after its restart", |p| p.metadata.name == restarted && restarts(p) > before)
        .await?;
    ensure!(disk.mounted_at(pool), "the restarted mounter mounts the claim again: {:?}", disk.mounts());
    testbed::wait_until(
        "the claim made while the pool was not mounted Bound",
        LANE_TIMEOUT,
        || claims.get("while-unmounted"),
        |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
    )
    .await?;
    let late = ctx.lane.volume_dir(ns, "while-unmounted").await?;
    ensure!(std::fs::metadata(&late)?.dev() == disk.dev, "made on the claim's disk once mounted: {}", late.display());

    Ok(())
}

/// `kubectl uncordon`, as the page says: the workload runs again and finds its data where it was.
async fn back_in_service(ctx: &Ctx, setup: &Setup, written: &Written) -> Result<()> {
    let Setup { ns, node, pool, disk, .. } = setup;
    let Written { data_dir, data_pv, first_app, .. } = written;
    // Uncordon, as the page says: the workload runs again and finds its data.
    let uncordon = documented_kubectl(&ctx.repo, "uncordon", node)?;
    let uncordon: Vec<&str> = uncordon.iter().map(String::as_str).collect();
    ctx.lane.cp().run_kubectl(&ctx.repo, &uncordon)?;
    let second_app = testbed::wait_for("the workload running again", LANE_TIMEOUT, || async {
        anyhow::Ok(workload_pods(ctx, ns).await?.into_iter().find(|p| phase(p) == "Running"))
    })
    .await?;
    let second_app = second_app.metadata.name.unwrap_or_default();
    let read = "cat /data/file /data/log";
    let reader = PodRun::new(ns, "reader", read).claim("data").on_node(node);
    let outcome = ctx.lane.run_pod(&reader).await?;
    ensure!(outcome.exit_code == Some(0), "reader exited {:?}: {}", outcome.exit_code, outcome.logs);
    let expected =
        format!("written before the drain\nstarted {first_app}\nstopped {first_app}\nstarted {second_app}\n");
    ensure!(outcome.logs == expected, "the data is intact: {:?}", outcome.logs);
    ctx.lane.delete_pod(ns, "reader").await?;
    let now = ctx.pv_of(ns, "data").await?;
    ensure!(now.metadata.name.as_deref() == Some(data_pv.as_str()), "the same volume");
    ensure!(&ctx.lane.volume_dir(ns, "data").await? == data_dir, "in the same place");
    ensure!(trash_entries(pool).is_empty(), "nothing moved to the trash: {:?}", trash_entries(pool));
    wait_status(ctx, "the pool Ready", pool_ready).await?;
    ensure!(disk.mounted_at(pool), "the pool is mounted");
    Ok(())
}

/// Removes what the scenario made and checks that the mount and the device go with the pool.
async fn clean_up(ctx: &Ctx, setup: &Setup) -> Result<()> {
    let Setup { ns, pool, disk, class, disk_class, .. } = setup;
    let deployments: Api<Deployment> = Api::namespaced(ctx.lane.client(), ns);
    deployments.delete("app", &DeleteParams::default()).await?;
    testbed::wait_for("the workload's pods gone", LANE_TIMEOUT, || async {
        anyhow::Ok(workload_pods(ctx, ns).await?.is_empty().then_some(()))
    })
    .await?;
    for claim in ["data", "during-drain", "while-unmounted"] {
        ctx.delete_claim_and_wait_reclaimed(ns, claim).await?;
    }
    resources(ctx).delete(RESOURCE, &DeleteParams::default()).await?;
    testbed::wait_for("the resource gone", LANE_TIMEOUT, || async {
        anyhow::Ok(resources(ctx).get_opt(RESOURCE).await?.is_none().then_some(()))
    })
    .await?;
    // The last mounter unmounts the emptied pool; the kubelet then unmounts the device.
    testbed::wait_for("the pool unmounted and the device's mounts gone", LANE_TIMEOUT, || async {
        anyhow::Ok(disk.mounts().is_empty().then_some(()))
    })
    .await
    .map_err(|e| {
        let entries = std::fs::read_dir(pool).map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>());
        e.context(format!("still mounted: {:?}, pool entries {entries:?}\n{}", disk.mounts(), operator_logs(ctx)))
    })?;
    let left: Vec<_> = std::fs::read_dir(pool)?.flatten().map(|e| e.file_name()).collect();
    ensure!(left.iter().all(|n| n.to_string_lossy().starts_with('.')), "no volume left under the pool path: {left:?}");
    disk.detach()?;
    Api::<PersistentVolume>::all(ctx.lane.client()).delete(disk_class, &DeleteParams::default()).await?;
    let classes: Api<StorageClass> = Api::all(ctx.lane.client());
    for name in [class, disk_class] {
        classes.delete(name, &DeleteParams::default()).await?;
    }
    Api::<Namespace>::all(ctx.lane.client()).delete(ns, &DeleteParams::default()).await?;
    Ok(())
}

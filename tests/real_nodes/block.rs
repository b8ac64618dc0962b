//! Block volumes (issue #47) on a real kubelet: the DaemonSet turned to `BLOCK_VOLUMES` the way
//! docs/install.md tells a kustomize admin (the env, a privileged container, the host's `/dev`
//! mounted at `/dev`, as the Helm chart renders it with `config.blockVolumes`). A pod with
//! `volumeDevices` writes a pattern on the raw device and a second pod reads it back. A Block
//! clone of the claim (`dataSource`, the same class and node) gives its pod the pattern, and the
//! clone's pod's write stays out of the source; a `HostPathSnapshot` of the claim restored into a
//! Block claim (`dataSourceRef`) gives its pod the pattern; then the claim grows online (its class
//! has `allowVolumeExpansion`) under a running pod, which sees the new size without restarting,
//! reads the pattern and writes past the old end into the grown file (`block_lifecycle.rs`). A
//! reboot is simulated (the provisioner stopped, every loop of ours detached and the device nodes gone,
//! other files' loops taking the freed numbers) and the volume's pod started before the
//! provisioner: it waits, never reads another file's data, and runs on its own once the
//! provisioner is back, on a loop of the grown size; deleting the three claims leaves no loop,
//! no device node and no file.
//!
//! What the kubelet (v1.36) does with a `local` PV of `volumeMode: Block`, as observed here
//! (the scenario prints it):
//! - nothing at PV creation: the path is first looked at when a pod is mapped. Mapping resolves
//!   the PV's path (`EvalHostSymlinks`); while it is missing that fails (`FailedMapVolume:
//!   MapVolume.EvalHostSymlinks failed ... lstat /dev/hpp-lane-block: no such file or
//!   directory`), the pod stays `ContainerCreating` and the kubelet retries with a doubling
//!   back-off (0.5 s, 1 s, 2 s, ... up to about 2 minutes);
//! - once the path resolves it bind-mounts the device node at
//!   `<kubelet root>/plugins/kubernetes.io~local-volume/volumeDevices/<pv>/<pod uid>` and gives
//!   the container the device at the `devicePath`; it attaches no loop device of its own on the
//!   node (older kubelets did, as a lock); all of it is undone when the pod goes, so the
//!   provisioner's loop is closed again and its release detaches it at once;
//! - a clone and a restore are pods like any other: the PV is bound with its device node made,
//!   and the kubelet maps it as above (a clone bound, read and written in about 3 s);
//! - the growth is not the kubelet's at all. On the patch the controller-manager's expand
//!   controller only waits for an external resizer (`ExternalExpanding`); the provisioner puts
//!   `Resizing=True` and `allocatedResourceStatuses.storage=ControllerResizeInProgress` on the
//!   claim, grows the file, sets the loop's capacity, then the PV's and the claim's capacity and
//!   clears both (`Resizing`, `VolumeResizeSuccessful` events), 0.2 s after the patch. No
//!   `FileSystemResizePending`, nothing on the pod, no word of a resize in the kubelet's log: the
//!   container's device is the node's loop itself, so the running pod's `blockdev --getsize64`
//!   reads the new size as soon as the loop has it (within its 0.2 s polling, 1.7 s after the
//!   patch), restart count 0. Checked once with `LOOP_SET_CAPACITY` made a no-op in the
//!   provisioner: the claim and the PV still reach the new size, but the pod never sees it and
//!   the scenario fails waiting for it ("timed out after 120.2s waiting for pod .../holder
//!   finished").
//!
//! And of the loop devices: sysfs `loop/backing_file` is a name as the attaching process saw it.
//! Once the provisioner's container that attached a loop is gone, its mount namespace with it,
//! the name becomes relative to the pool's bind mount (`/pvc-<uid>/block.img`): a name never
//! tells which file a loop holds, its device and inode (`LOOP_GET_STATUS64`) do, and that is
//! what the provisioner and this scenario read.
//!
//! Why the order matters, and what fails when it is wrong: a node on the host's devtmpfs is gone
//! at reboot, so the pod's path does not resolve until the provisioner, having checked the
//! loop's backing file by inode, made it again. Were the node to survive (made outside
//! devtmpfs) or be made before that check, the kubelet would map whatever loop took the number:
//! here an unrelated file's loop, whose pattern the reader would print, and the pod would run
//! while the provisioner is stopped: both are asserted against below. Checked once by leaving the
//! device directory in place through the reboot (a node that outlived it): the scenario then
//! fails with "the pod ran before the provisioner re-exposed its volume (phase Running):
//! UNRELATED-DATA-9".

use std::os::unix::fs::{FileTypeExt, MetadataExt};

use hostpath_provisioner::deciding::block::loop_safety::FileId;
use hostpath_provisioner::filesystem::block::LoopHost;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, PodTemplateSpec, VolumeDevice};

use super::block_lifecycle::{self, BlockVolume, FIRST_SIZE};
use super::*;

/// The lane's device directory, its own so that no other provisioner on the host (a
/// control-plane test's) removes its nodes as naming none of its volumes.
const DEVICE_DIR: &str = "/dev/hpp-lane-block";
/// Where the pod sees the raw device.
pub(super) const DEVICE_PATH: &str = "/dev/xvda";
/// What the volume's pods write at offset 0 (16 bytes: one `dd bs=16` read).
pub(super) const OWN_PATTERN: &str = "hpp-block-own-01";
/// What the unrelated files hold at offset 0.
const UNRELATED_PATTERN: &str = "UNRELATED-DATA-9";
/// A DaemonSet node selector no node has: the provisioner stops on every node.
const STOPPED_LABEL: &str = "hpp-testbed/provisioner-stopped";

/// The loops whose backing file is `file` (by device and inode, `LOOP_GET_STATUS64`, as the
/// provisioner reads them), with the name sysfs gives that file.
pub(super) fn loops_of(file: FileId) -> Result<Vec<(u32, String)>> {
    let loops = LoopHost::host().loops()?;
    Ok(loops.into_iter().filter(|l| l.facts.backing == file).map(|l| (l.facts.number, l.backing_name)).collect())
}

pub(super) fn file_id(path: &Path) -> Result<FileId> {
    let meta = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
    Ok(FileId { dev_major: rustix::fs::major(meta.dev()), dev_minor: rustix::fs::minor(meta.dev()), ino: meta.ino() })
}

/// The attached loops whose backing file (as sysfs names it) starts with `prefix`: for the
/// loops this scenario attaches from the host itself, whose names stay the host's.
fn loops_backed_under(prefix: &Path) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/block").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(number) = name.strip_prefix("loop").and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) {
            let backing = backing.trim_end().to_owned();
            if Path::new(&backing).starts_with(prefix) {
                found.push((number, backing));
            }
        }
    }
    found.sort();
    found
}

fn losetup(args: &[&str]) -> Result<String> {
    let out = std::process::Command::new("losetup").args(args).output().context("running losetup")?;
    ensure!(out.status.success(), "losetup {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Files of another kind than ours on loop devices, detached (and removed) on drop, passed or
/// failed.
struct UnrelatedLoops {
    dir: PathBuf,
}

impl UnrelatedLoops {
    /// Attaches files holding [`UNRELATED_PATTERN`] until one took `freed` (the number our loop
    /// had) or eight are attached; returns the numbers taken.
    fn attach(&self, freed: u32) -> Result<Vec<u32>> {
        std::fs::create_dir_all(&self.dir)?;
        let mut numbers = Vec::new();
        for i in 0..8 {
            let file = self.dir.join(format!("unrelated-{i}.img"));
            let mut data = UNRELATED_PATTERN.as_bytes().to_vec();
            data.resize(1 << 20, 0);
            std::fs::write(&file, &data)?;
            let device = losetup(&["-f", "--show", &file.to_string_lossy()])?;
            let number: u32 = device.trim_start_matches("/dev/loop").parse().context("losetup's device")?;
            numbers.push(number);
            if number == freed {
                break;
            }
        }
        Ok(numbers)
    }
}

impl Drop for UnrelatedLoops {
    fn drop(&mut self) {
        for (number, _) in loops_backed_under(&self.dir) {
            let _ = std::process::Command::new("losetup").arg("-d").arg(format!("/dev/loop{number}")).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A busybox pod on the lane's node running `script` with `claim` as the raw device
/// [`DEVICE_PATH`].
pub(super) fn device_pod(ctx: &Ctx, ns: &str, name: &str, claim: &str, script: &str) -> Pod {
    let mut pod = PodRun::new(ns, name, script).claim(claim).on_node(ctx.lane.node_name()).build();
    for container in pod.spec.as_mut().into_iter().flat_map(|s| s.containers.iter_mut()) {
        container.volume_mounts = None;
        container.volume_devices = Some(vec![VolumeDevice { name: "claim-0".into(), device_path: DEVICE_PATH.into() }]);
    }
    pod
}

pub(super) fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default()
}

/// Creates the pod and waits until it finished; returns its main container's output.
pub(super) async fn run_device_pod(ctx: &Ctx, pod: Pod) -> Result<String> {
    let ns = pod.metadata.namespace.clone().context("namespace")?;
    let name = pod.metadata.name.clone().context("name")?;
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), &ns);
    pods.create(&PostParams::default(), &pod).await?;
    finished(ctx, &ns, &name).await
}

pub(super) async fn finished(ctx: &Ctx, ns: &str, name: &str) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), ns);
    let done = testbed::wait_until(
        &format!("pod {ns}/{name} finished"),
        LANE_TIMEOUT,
        || pods.get(name),
        |p| matches!(phase(p), "Succeeded" | "Failed"),
    )
    .await
    .map_err(|e| e.context(format!("{}\n{}", pod_events(ctx, ns, name), ctx.provisioner_logs())))?;
    let logs = ctx.lane.container_logs(&done, "main");
    ensure!(phase(&done) == "Succeeded", "pod {name} failed: {logs}\n{}", pod_events(ctx, ns, name));
    Ok(logs)
}

/// The events of pod `name`, one a line, for messages.
pub(super) fn pod_events(ctx: &Ctx, ns: &str, name: &str) -> String {
    let selector = format!("involvedObject.name={name}");
    ctx.lane
        .cp()
        .run_kubectl(&ctx.repo, &["get", "events", "-n", ns, "--field-selector", &selector, "-o", "json"])
        .ok()
        .and_then(|raw| serde_json::from_str::<kube::core::ObjectList<Event>>(&raw).ok())
        .map(|list| {
            list.items
                .iter()
                .map(|e| {
                    format!("{}: {}", e.reason.as_deref().unwrap_or_default(), e.message.as_deref().unwrap_or_default())
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn daemonsets(ctx: &Ctx) -> Api<DaemonSet> {
    Api::namespaced(ctx.lane.client(), DEPLOY_NAMESPACE)
}

async fn json_patch(ctx: &Ctx, patch: serde_json::Value) -> Result<()> {
    daemonsets(ctx)
        .patch(DEPLOY_DAEMONSET, &PatchParams::default(), &Patch::<()>::Json(serde_json::from_value(patch)?))
        .await?;
    Ok(())
}

/// Turns `BLOCK_VOLUMES` on in the deployed DaemonSet as docs/install.md tells a kustomize admin:
/// the env, the container privileged, the host's `/dev` at `/dev`. Returns the template before.
async fn turn_block_volumes_on(ctx: &Ctx) -> Result<PodTemplateSpec> {
    let before = daemonsets(ctx).get(DEPLOY_DAEMONSET).await?.spec.context("spec")?.template;
    let container = "/spec/template/spec/containers/0";
    json_patch(
        ctx,
        serde_json::json!([
            {"op": "add", "path": format!("{container}/env/-"), "value": {"name": "BLOCK_VOLUMES", "value": "true"}},
            {"op": "add", "path": format!("{container}/env/-"), "value": {"name": "BLOCK_DEVICE_DIR", "value": DEVICE_DIR}},
            {"op": "replace", "path": format!("{container}/securityContext"), "value": {
                "runAsUser": 0, "privileged": true, "allowPrivilegeEscalation": true, "readOnlyRootFilesystem": true}},
            {"op": "add", "path": format!("{container}/volumeMounts/-"), "value": {"name": "host-dev", "mountPath": "/dev"}},
            {"op": "add", "path": "/spec/template/spec/volumes/-", "value": {
                "name": "host-dev", "hostPath": {"path": "/dev", "type": "Directory"}}},
        ]),
    )
    .await?;
    ctx.lane.wait_daemonset_rolled_out().await?;
    Ok(before)
}

async fn restore_template(ctx: &Ctx, template: PodTemplateSpec) -> Result<()> {
    let mut ds = daemonsets(ctx).get(DEPLOY_DAEMONSET).await?;
    ds.spec.as_mut().context("spec")?.template = template;
    ds.status = None;
    daemonsets(ctx).replace(DEPLOY_DAEMONSET, &PostParams::default(), &ds).await?;
    ctx.lane.wait_daemonset_rolled_out().await?;
    Ok(())
}

/// Stops the provisioner on the node: the DaemonSet selects no node, its pod goes.
async fn stop_provisioner(ctx: &Ctx) -> Result<()> {
    let path = format!("/spec/template/spec/nodeSelector/{}", STOPPED_LABEL.replace('/', "~1"));
    json_patch(ctx, serde_json::json!([{"op": "add", "path": path, "value": "true"}])).await?;
    testbed::wait_for("the provisioner's pod gone", LANE_TIMEOUT, || async {
        anyhow::Ok(ctx.provisioner_pods().await?.is_empty().then_some(()))
    })
    .await
}

async fn start_provisioner(ctx: &Ctx) -> Result<()> {
    let path = format!("/spec/template/spec/nodeSelector/{}", STOPPED_LABEL.replace('/', "~1"));
    json_patch(ctx, serde_json::json!([{"op": "remove", "path": path}])).await?;
    ctx.lane.wait_daemonset_rolled_out().await?;
    Ok(())
}

pub(super) async fn a_block_volume_keeps_its_data_across_pods_clones_snapshots_growth_and_a_reboot_never_mapping_another_file(
    ctx: &Ctx,
) -> Result<()> {
    ctx.deployed().await?;
    let before = turn_block_volumes_on(ctx).await?;
    let unrelated = UnrelatedLoops { dir: ctx.lane.dir().join("block-unrelated") };
    let mut made = Vec::new();
    let mut class = None;
    let outcome = block_scenario(ctx, &unrelated, &mut made, &mut class).await;
    drop(unrelated);
    if outcome.is_err() {
        // A failure before the claims' deletion leaves the volumes' loops holding their files
        // after the lane removed them: detached here, by inode.
        for file in made {
            for (number, _) in loops_of(file).unwrap_or_default() {
                let _ = losetup(&["-d", &format!("/dev/loop{number}")]);
            }
        }
    }
    if let Some(class) = class {
        let _ = Api::<StorageClass>::all(ctx.lane.client()).delete(&class, &DeleteParams::default()).await;
    }
    // Back to deploy/legacy's template for the scenarios after this one (the first scenario's
    // capability check among them), and no device directory left on the host.
    let restored = restore_template(ctx, before).await;
    let _ = std::fs::remove_dir_all(DEVICE_DIR);
    outcome.and(restored)
}

async fn block_scenario(
    ctx: &Ctx,
    unrelated: &UnrelatedLoops,
    made: &mut Vec<FileId>,
    class_made: &mut Option<String>,
) -> Result<()> {
    let ns = ctx.namespace("block").await?;
    // deploy/legacy's class but for allowVolumeExpansion, which the growth needs (clones and
    // restores take their source's class).
    let class = format!("{ns}-class");
    let expandable = fixtures::storage_class(&class, "kubevirt.io/hostpath-provisioner").allow_expansion().build();
    Api::<StorageClass>::all(ctx.lane.client()).create(&PostParams::default(), &expandable).await?;
    *class_made = Some(class.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    claims.create(&PostParams::default(), &fixtures::claim(&ns, "disk", &class, FIRST_SIZE).block().build()).await?;

    // Written by one pod, which stays a moment so the kubelet's side can be looked at.
    let write = format!(
        "printf {OWN_PATTERN} | dd of={DEVICE_PATH} conv=fsync 2>&1 && echo written; \
         until [ -f /tmp/stop ]; do sleep 1; done"
    );
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), &ns);
    pods.create(&PostParams::default(), &device_pod(ctx, &ns, "writer", "disk", &write)).await?;
    testbed::wait_until("pod writer running", LANE_TIMEOUT, || pods.get("writer"), |p| phase(p) == "Running")
        .await
        .map_err(|e| e.context(format!("{}\n{}", pod_events(ctx, &ns, "writer"), ctx.provisioner_logs())))?;
    let writer = testbed::wait_for("the writer wrote", LANE_TIMEOUT, || async {
        let pod = pods.get("writer").await?;
        anyhow::Ok(ctx.lane.container_logs(&pod, "main").contains("written").then_some(pod))
    })
    .await?;

    let disk = BlockVolume::of(ctx, &ns, "disk").await?;
    made.push(disk.file);
    let node_path = disk.node.clone();
    ensure!(node_path == Path::new(DEVICE_DIR).join(&disk.pv), "the PV names its node: {}", node_path.display());
    ensure!(std::fs::metadata(&node_path)?.file_type().is_block_device(), "{} is a block device", node_path.display());
    let backing = disk.backing();
    let ours = loops_of(disk.file)?;
    ensure!(ours.len() == 1, "one loop on {}: {ours:?}", backing.display());
    let own_number = ours[0].0;
    // The kubelet's side while the pod runs: its bind mount of the node and its lock loop.
    let kubelet_map = ctx
        .lane
        .dir()
        .join("kubelet/plugins/kubernetes.io~local-volume/volumeDevices")
        .join(&disk.pv)
        .join(writer.metadata.uid.as_deref().unwrap_or_default());
    let kubelet_loops = loops_backed_under(&node_path);
    println!(
        "    kubelet: global map {} exists={}, its loops on the device node {kubelet_loops:?}; ours loop{own_number} ({})",
        kubelet_map.display(),
        kubelet_map.exists(),
        ours[0].1
    );
    let mut on_disk = vec![0u8; OWN_PATTERN.len()];
    std::io::Read::read_exact(&mut std::fs::File::open(&backing)?, &mut on_disk)?;
    ensure!(on_disk == OWN_PATTERN.as_bytes(), "the pattern is in the backing file: {on_disk:?}");
    ctx.lane.delete_pod(&ns, "writer").await?;
    ensure!(loops_backed_under(&node_path).is_empty(), "the kubelet's loop goes with the pod");

    // Read back by a new pod on the same node.
    let read = format!("dd if={DEVICE_PATH} bs=16 count=1 2>/dev/null");
    let logs = run_device_pod(ctx, device_pod(ctx, &ns, "reader", "disk", &read)).await?;
    ensure!(logs.trim() == OWN_PATTERN, "the reader reads what the writer wrote: {logs:?}");
    ctx.lane.delete_pod(&ns, "reader").await?;

    let copies = block_lifecycle::clone_and_restore(ctx, &ns, &class, &disk, made).await?;
    block_lifecycle::grows_under_its_running_pod(ctx, &ns, &disk).await?;

    simulated_reboot(ctx, &ns, &node_path, disk.file, own_number, unrelated).await?;

    // Deleted: no loop, no node, no file, of the clone, the restore and the source.
    for volume in copies.iter().chain([&disk]) {
        volume.delete_leaving_nothing(ctx, &ns).await?;
    }
    ensure!(loops_backed_under(&node_path).is_empty(), "no loop on the node");
    Ok(())
}

/// A reboot, simulated: the provisioner stopped, our loops detached and the device directory
/// gone (a fresh devtmpfs), unrelated files on the freed loop numbers, and the volume's pod
/// created before the provisioner starts.
async fn simulated_reboot(
    ctx: &Ctx,
    ns: &str,
    node_path: &Path,
    backing: FileId,
    own_number: u32,
    unrelated: &UnrelatedLoops,
) -> Result<()> {
    stop_provisioner(ctx).await?;
    // Found by inode: once the container that attached it is gone, sysfs names the file
    // relative to the pool's bind mount (`/pvc-<uid>/block.img`), no longer under the pool.
    let ours = loops_of(backing)?;
    println!("    reboot: the provisioner stopped; sysfs names our file {ours:?}");
    for (number, _) in &ours {
        losetup(&["-d", &format!("/dev/loop{number}")])?;
    }
    std::fs::remove_dir_all(DEVICE_DIR)?;
    ensure!(loops_of(backing)?.is_empty(), "our loop detached");
    let taken = unrelated.attach(own_number)?;
    if !taken.contains(&own_number) {
        // Another process of the host (a control-plane Block test of `make test`) took it.
        println!("    reboot: loop{own_number} was taken by another process, not by an unrelated file here");
    }
    println!("    reboot: loop{own_number} freed; unrelated files now on loops {taken:?}");

    // The pod first: it must wait, not run, while the provisioner is down.
    let read = format!("dd if={DEVICE_PATH} bs=16 count=1 2>/dev/null");
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), ns);
    pods.create(&PostParams::default(), &device_pod(ctx, ns, "after-reboot", "disk", &read)).await?;
    let waited = Instant::now();
    while waited.elapsed() < Duration::from_secs(15) {
        let pod = pods.get("after-reboot").await?;
        let started = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.state.as_ref().is_some_and(|s| s.waiting.is_none())));
        ensure!(
            phase(&pod) == "Pending" && !started,
            "the pod ran before the provisioner re-exposed its volume (phase {}): {}",
            phase(&pod),
            ctx.lane.container_logs(&pod, "main")
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let events = pod_events(ctx, ns, "after-reboot");
    let waiting = events.lines().find(|l| l.contains("MapVolume")).unwrap_or_default().to_owned();
    ensure!(!waiting.is_empty(), "the kubelet says why the pod waits: {events}");
    println!("    reboot: the pod waits while the provisioner is down: {waiting}");

    start_provisioner(ctx).await?;
    let started = Instant::now();
    let logs = finished(ctx, ns, "after-reboot").await?;
    ensure!(!logs.contains(UNRELATED_PATTERN), "the pod read another file's data: {logs:?}");
    ensure!(logs.trim() == OWN_PATTERN, "the pod reads its own data after the reboot: {logs:?}");
    println!(
        "    reboot: the pod ran {:.1} s after the provisioner was ready; node {}",
        started.elapsed().as_secs_f64(),
        node_path.display()
    );
    let ours = loops_of(backing)?;
    ensure!(ours.len() == 1, "re-attached once: {ours:?}");
    let size = block_lifecycle::loop_size(ours[0].0)?;
    ensure!(size == block_lifecycle::GROWN_BYTES, "re-attached with the grown file's size: {size}");
    ctx.lane.delete_pod(ns, "after-reboot").await?;
    Ok(())
}

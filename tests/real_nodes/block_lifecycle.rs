//! The Block volume scenario's clone, snapshot and online growth (issue #47), on the claim whose
//! pattern its first pods wrote: each read by real pods with `volumeDevices` on the lane's
//! kubelet. What the kubelet does along the way is in `block.rs`'s header.

use hostpath_provisioner::deciding::snapshot::{GROUP, HostPathSnapshot, KIND};
use k8s_openapi::api::core::v1::{Event, TypedObjectReference};

use super::block::{
    DEVICE_PATH, OWN_PATTERN, device_pod, file_id, finished, loops_of, phase, pod_events, run_device_pod,
};
use super::*;
use hostpath_provisioner::deciding::block::loop_safety::FileId;
use hostpath_provisioner::deciding::block::{BACKING_DIR_ANNOTATION, BACKING_FILE};

/// What the clone's pod writes over the pattern it read (16 bytes).
const CLONE_PATTERN: &str = "hpp-block-clone2";
/// What the growing pod writes past the device's old end (16 bytes).
const GROWN_PATTERN: &str = "hpp-block-grown3";
/// The claims' first size, and what the growth asks for.
pub(super) const FIRST_SIZE: &str = "64Mi";
const FIRST_BYTES: u64 = 64 << 20;
const GROWN_SIZE: &str = "96Mi";
pub(super) const GROWN_BYTES: u64 = 96 << 20;
/// Where past the old end the growing pod writes: 1 MiB past 64 MiB.
const PAST_OLD_END: u64 = 65 << 20;

/// A bound Block claim's volume as the host sees it.
pub(super) struct BlockVolume {
    pub(super) claim: String,
    pub(super) pv: String,
    pub(super) node: PathBuf,
    pub(super) backing_dir: PathBuf,
    pub(super) file: FileId,
}

impl BlockVolume {
    pub(super) async fn of(ctx: &Ctx, ns: &str, claim: &str) -> Result<BlockVolume> {
        let pv = ctx.pv_of(ns, claim).await?;
        let name = pv.metadata.name.clone().context("PV name")?;
        let spec = pv.spec.as_ref().context("spec")?;
        ensure!(spec.volume_mode.as_deref() == Some("Block"), "a Block PV: {spec:?}");
        let node = PathBuf::from(&spec.local.as_ref().context("a local PV")?.path);
        let backing_dir = PathBuf::from(
            pv.metadata.annotations.as_ref().and_then(|a| a.get(BACKING_DIR_ANNOTATION)).context("backing dir")?,
        );
        let file = file_id(&backing_dir.join(BACKING_FILE))?;
        Ok(BlockVolume { claim: claim.into(), pv: name, node, backing_dir, file })
    }

    pub(super) fn backing(&self) -> PathBuf {
        self.backing_dir.join(BACKING_FILE)
    }

    /// The one loop holding the volume's file: its number.
    pub(super) fn only_loop(&self) -> Result<u32> {
        let ours = loops_of(self.file)?;
        ensure!(ours.len() == 1, "one loop on {}: {ours:?}", self.backing().display());
        Ok(ours[0].0)
    }

    /// Deletes the claim and waits until its PV and file are gone; then no device node and no
    /// loop holding the file is left.
    pub(super) async fn delete_leaving_nothing(&self, ctx: &Ctx, ns: &str) -> Result<()> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
        claims.delete(&self.claim, &DeleteParams::default()).await?;
        let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
        let what = format!("PV {} and {} gone", self.pv, self.backing_dir.display());
        testbed::wait_for(&what, LANE_TIMEOUT, || async {
            anyhow::Ok((pvs.get_opt(&self.pv).await?.is_none() && !self.backing_dir.exists()).then_some(()))
        })
        .await
        .map_err(|e| e.context(ctx.provisioner_logs()))?;
        ensure!(!self.node.exists(), "the device node {} is gone", self.node.display());
        ensure!(loops_of(self.file)?.is_empty(), "no loop on {}: {:?}", self.claim, loops_of(self.file)?);
        Ok(())
    }
}

/// The size of loop `number` in bytes, as the kernel has it.
pub(super) fn loop_size(number: u32) -> Result<u64> {
    let sectors = std::fs::read_to_string(format!("/sys/block/loop{number}/size"))?;
    Ok(sectors.trim().parse::<u64>()? * 512)
}

/// Reads the 16 bytes at `offset` of a file on the host.
fn read_file_at(path: &Path, offset: u64) -> Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut read = vec![0u8; 16];
    file.read_exact(&mut read)?;
    Ok(read)
}

/// The value of `key=` in a pod's log.
fn logged(logs: &str, key: &str) -> Option<String> {
    logs.lines().find_map(|l| l.strip_prefix(&format!("{key}=")).map(str::to_owned))
}

/// Where a copy's data comes from.
enum CopyOf<'a> {
    /// A clone of this claim (`dataSource`).
    Claim(&'a str),
    /// A restore of this `HostPathSnapshot` (`dataSourceRef`).
    Snapshot(&'a str),
}

/// A Block claim of `class` in `ns` whose data comes from `from`.
fn copy_claim(ns: &str, name: &str, class: &str, from: CopyOf) -> PersistentVolumeClaim {
    let mut claim = fixtures::claim(ns, name, class, FIRST_SIZE).block().build();
    let spec = claim.spec.as_mut().expect("a claim has a spec");
    match from {
        CopyOf::Claim(source) => {
            spec.data_source = Some(TypedLocalObjectReference {
                api_group: None,
                kind: "PersistentVolumeClaim".into(),
                name: source.into(),
            })
        }
        CopyOf::Snapshot(snapshot) => {
            spec.data_source_ref = Some(TypedObjectReference {
                api_group: Some(GROUP.into()),
                kind: KIND.into(),
                name: snapshot.into(),
                namespace: None,
            })
        }
    }
    claim
}

/// A Block clone of `source` read by a pod (the pattern), then written by it: the source still
/// reads the pattern. Then a `HostPathSnapshot` of the source restored into a Block claim read
/// by a pod (the pattern); the snapshot deleted, its copy leaves the pool. Returns the clone's
/// and the restore's volumes, for the scenario to delete.
pub(super) async fn clone_and_restore(
    ctx: &Ctx,
    ns: &str,
    class: &str,
    source: &BlockVolume,
    made: &mut Vec<FileId>,
) -> Result<Vec<BlockVolume>> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
    claims.create(&PostParams::default(), &copy_claim(ns, "copy", class, CopyOf::Claim(&source.claim))).await?;
    let script = format!(
        "echo read=$(dd if={DEVICE_PATH} bs=16 count=1 2>/dev/null); \
         printf {CLONE_PATTERN} | dd of={DEVICE_PATH} conv=fsync 2>/dev/null && \
         echo now=$(dd if={DEVICE_PATH} bs=16 count=1 2>/dev/null)"
    );
    let started = Instant::now();
    let logs = run_device_pod(ctx, device_pod(ctx, ns, "clone-reader", "copy", &script)).await?;
    let clone_took = started.elapsed();
    let clone = BlockVolume::of(ctx, ns, "copy").await?;
    made.push(clone.file);
    ensure!(logged(&logs, "read").as_deref() == Some(OWN_PATTERN), "the clone reads the source's pattern: {logs:?}");
    ensure!(logged(&logs, "now").as_deref() == Some(CLONE_PATTERN), "the clone takes a write: {logs:?}");
    ensure!(clone.node != source.node && clone.file != source.file, "a node and a file of its own");
    let clone_loop = clone.only_loop()?;
    ensure!(clone_loop != source.only_loop()?, "a loop of its own");
    ensure!(read_file_at(&clone.backing(), 0)? == CLONE_PATTERN.as_bytes(), "the write is in the clone's file");

    // Independent: the source's pod still reads the pattern.
    let read = format!("dd if={DEVICE_PATH} bs=16 count=1 2>/dev/null");
    let logs = run_device_pod(ctx, device_pod(ctx, ns, "source-reader", &source.claim, &read)).await?;
    ensure!(logs.trim() == OWN_PATTERN, "the clone's write is not the source's: {logs:?}");
    println!(
        "    clone: bound, read and written by its pod in {:.1} s on loop{clone_loop}; the source still reads {OWN_PATTERN}",
        clone_took.as_secs_f64()
    );

    // A snapshot of the source, restored into a Block claim.
    let snapshots: Api<HostPathSnapshot> = Api::namespaced(ctx.lane.client(), ns);
    snapshots.create(&PostParams::default(), &HostPathSnapshot::new("before", &source.claim)).await?;
    let snapshot = testbed::wait_for("snapshot ready", LANE_TIMEOUT, || async {
        let snapshot = snapshots.get("before").await?;
        anyhow::Ok(snapshot.status.as_ref().is_some_and(|s| s.ready_to_use).then_some(snapshot))
    })
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;
    let mode =
        snapshot.metadata.annotations.as_ref().and_then(|a| a.get("hostpath-provisioner.kubevirt.io/volume-mode"));
    ensure!(mode.map(String::as_str) == Some("Block"), "the snapshot says its mode: {mode:?}");
    let method = snapshot.status.as_ref().and_then(|s| s.method.clone()).unwrap_or_default();
    claims.create(&PostParams::default(), &copy_claim(ns, "restored", class, CopyOf::Snapshot("before"))).await?;
    let logs = run_device_pod(ctx, device_pod(ctx, ns, "restore-reader", "restored", &read)).await?;
    ensure!(logs.trim() == OWN_PATTERN, "the restore reads the source's pattern: {logs:?}");
    let restored = BlockVolume::of(ctx, ns, "restored").await?;
    made.push(restored.file);
    restored.only_loop()?;
    println!("    snapshot: copied by {method}, restored into a Block claim whose pod reads {OWN_PATTERN}");

    // Deleted: its copy leaves the pool's snapshots directory.
    let uid = snapshot.metadata.uid.clone().context("uid")?;
    let copy = source.backing_dir.parent().context("pool root")?.join(".hpp-snapshots").join(&uid);
    ensure!(copy.is_dir(), "the snapshot's copy is at {}", copy.display());
    snapshots.delete("before", &DeleteParams::default()).await?;
    testbed::wait_for("snapshot gone", LANE_TIMEOUT, || async {
        anyhow::Ok(snapshots.get_opt("before").await?.is_none().then_some(()))
    })
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;
    ensure!(!copy.exists(), "the snapshot's copy went");
    for pod in ["clone-reader", "source-reader", "restore-reader"] {
        ctx.lane.delete_pod(ns, pod).await?;
    }
    Ok(vec![clone, restored])
}

/// A pod holds the device and polls its size; the claim is asked for more while it runs. The
/// same pod, never restarted, sees the new size, reads the pattern written before and writes
/// past the old end, which lands in the grown file.
pub(super) async fn grows_under_its_running_pod(ctx: &Ctx, ns: &str, volume: &BlockVolume) -> Result<()> {
    let number = volume.only_loop()?;
    let script = format!(
        "old=$(blockdev --getsize64 {DEVICE_PATH}); echo size=$old; \
         while [ \"$(blockdev --getsize64 {DEVICE_PATH})\" = \"$old\" ]; do sleep 0.2; done; \
         echo grown=$(blockdev --getsize64 {DEVICE_PATH}); \
         echo read=$(dd if={DEVICE_PATH} bs=16 count=1 2>/dev/null); \
         printf {GROWN_PATTERN} | dd of={DEVICE_PATH} bs=16 seek={} conv=fsync 2>/dev/null && echo wrote-past-old-end",
        PAST_OLD_END / 16
    );
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), ns);
    pods.create(&PostParams::default(), &device_pod(ctx, ns, "holder", &volume.claim, &script)).await?;
    let holder = testbed::wait_for("the holder read its size", LANE_TIMEOUT, || async {
        let pod = pods.get("holder").await?;
        anyhow::Ok(logged(&ctx.lane.container_logs(&pod, "main"), "size").map(|size| (pod, size)))
    })
    .await
    .map_err(|e| e.context(format!("{}\n{}", pod_events(ctx, ns, "holder"), ctx.provisioner_logs())))?;
    let (holder, size) = holder;
    ensure!(phase(&holder) == "Running", "the holder runs: {}", phase(&holder));
    ensure!(size == FIRST_BYTES.to_string(), "the pod sees {FIRST_SIZE} first: {size}");

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
    let grow = serde_json::json!({"spec": {"resources": {"requests": {"storage": GROWN_SIZE}}}});
    claims.patch(&volume.claim, &PatchParams::default(), &Patch::Merge(&grow)).await?;
    let asked = Instant::now();
    let grown = Quantity(GROWN_SIZE.into());
    let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
    // Every condition and allocated-resource status the claim shows on the way, as seen.
    let seen = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let claim = testbed::wait_for("the PV and the claim at the new size", LANE_TIMEOUT, || async {
        let pv = pvs.get(&volume.pv).await?;
        let claim = claims.get(&volume.claim).await?;
        let status = claim.status.clone().unwrap_or_default();
        for condition in status.conditions.iter().flatten() {
            seen.lock().expect("seen").insert(format!("condition {}={}", condition.type_, condition.status));
        }
        for (resource, state) in status.allocated_resource_statuses.iter().flatten() {
            seen.lock().expect("seen").insert(format!("allocatedResourceStatuses {resource}={state}"));
        }
        let pv_done = pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")) == Some(&grown);
        let claim_done = status.capacity.as_ref().and_then(|c| c.get("storage")) == Some(&grown);
        anyhow::Ok((pv_done && claim_done).then_some(claim))
    })
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;
    let resized_in = asked.elapsed();
    let seen = seen.into_inner().expect("seen");
    let status = claim.status.clone().unwrap_or_default();
    let left: Vec<_> = status.conditions.iter().flatten().map(|c| c.type_.clone()).collect();
    ensure!(left.is_empty(), "no resize condition left on the claim: {left:?}");

    let done = finished(ctx, ns, "holder").await?;
    let seen_in = asked.elapsed();
    let pod = pods.get("holder").await?;
    ensure!(pod.metadata.uid == holder.metadata.uid, "the same pod saw the growth");
    let restarts: i32 =
        pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()).map(|c| c.restart_count).sum();
    ensure!(restarts == 0, "the pod restarted {restarts} times");
    ensure!(logged(&done, "grown") == Some(GROWN_BYTES.to_string()), "the pod sees the new size: {done:?}");
    ensure!(logged(&done, "read").as_deref() == Some(OWN_PATTERN), "the data written before is intact: {done:?}");
    ensure!(done.contains("wrote-past-old-end"), "the pod writes past the old end: {done:?}");
    ensure!(std::fs::metadata(volume.backing())?.len() == GROWN_BYTES, "the file grew");
    ensure!(read_file_at(&volume.backing(), PAST_OLD_END)? == GROWN_PATTERN.as_bytes(), "the grown part is the file's");
    ensure!(volume.only_loop()? == number, "the same loop, never detached");
    ensure!(loop_size(number)? == GROWN_BYTES, "the loop has the new size");
    let claim_events = events_of(ctx, ns, claim.metadata.uid.as_deref().unwrap_or_default());
    let pod_said = pod_events(ctx, ns, "holder");
    println!(
        "    growth: PV and claim at {GROWN_SIZE} {:.1} s after the patch, seen by the running pod (restarts 0) after {:.1} s; \
         on the claim on the way: {seen:?}; its events: {claim_events}; the pod's events: {}",
        resized_in.as_secs_f64(),
        seen_in.as_secs_f64(),
        pod_said.replace('\n', " | ")
    );
    ctx.lane.delete_pod(ns, "holder").await?;
    Ok(())
}

/// The reasons of the events about the object of `uid`, joined, for what the scenario prints.
fn events_of(ctx: &Ctx, ns: &str, uid: &str) -> String {
    let selector = format!("involvedObject.uid={uid}");
    ctx.lane
        .cp()
        .run_kubectl(&ctx.repo, &["get", "events", "-n", ns, "--field-selector", &selector, "-o", "json"])
        .ok()
        .and_then(|raw| serde_json::from_str::<kube::core::ObjectList<Event>>(&raw).ok())
        .map(|list| {
            let reasons: Vec<_> = list
                .items
                .iter()
                .map(|e| {
                    format!(
                        "{} ({})",
                        e.reason.as_deref().unwrap_or_default(),
                        e.source
                            .as_ref()
                            .and_then(|s| s.component.as_deref())
                            .or(e.reporting_component.as_deref())
                            .unwrap_or_default()
                    )
                })
                .collect();
            reasons.join(", ")
        })
        .unwrap_or_default()
}

//! What users get from `volumeType: local` on a real kubelet, next to a hostPath volume of the
//! same pool: the pod's `fsGroup` on the volume, and the volume in the kubelet's stats summary
//! with its used bytes; `nodeLocalSharing`: two pods of the node writing one volume; and a
//! class's owner, group and mode.

use std::os::unix::fs::MetadataExt;

use super::*;

const FS_GROUP: i64 = 2345;

/// The kubelet's stats summary of the lane's node, through the API server's nodes/proxy.
fn stats_summary(ctx: &Ctx) -> Result<serde_json::Value> {
    let path = format!("/api/v1/nodes/{}/proxy/stats/summary", ctx.lane.node_name());
    let raw = ctx.lane.cp().run_kubectl(&ctx.repo, &["get", "--raw", &path])?;
    Ok(serde_json::from_str(&raw)?)
}

/// The kubelet's `usedBytes` and `capacityBytes` for volume `volume` (the pod's volume name) of
/// pod `pod`.
fn volume_stats(summary: &serde_json::Value, ns: &str, pod: &str, volume: &str) -> Option<(u64, u64)> {
    let pods = summary["pods"].as_array()?;
    let entry = pods.iter().find(|p| p["podRef"]["namespace"] == ns && p["podRef"]["name"] == pod)?;
    let volumes = entry["volume"].as_array()?;
    let stats = volumes.iter().find(|v| v["name"] == volume)?;
    Some((stats["usedBytes"].as_u64()?, stats["capacityBytes"].as_u64()?))
}

/// The size of the filesystem holding `dir`, as `df` reports it.
fn filesystem_size(dir: &Path) -> Result<u64> {
    let out = std::process::Command::new("df").args(["-B1", "--output=size"]).arg(dir).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().nth(1).context("df output")?.trim().parse().context("df size")
}

pub(super) async fn a_local_volume_gets_the_pods_fs_group_and_shows_in_the_kubelets_volume_stats(
    ctx: &Ctx,
) -> Result<()> {
    ctx.deployed().await?;
    let ns = ctx.namespace("local").await?;
    let local_class = ctx.class(&ns, &[("volumeType", "local")]).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    let node = ctx.lane.node_name().to_owned();
    for (name, class) in [("local", local_class.as_str()), ("plain", CLASS)] {
        let mut claim = fixtures::claim(&ns, name, class, "16Mi");
        if class != CLASS {
            claim = claim.provision_on_node(&node);
        }
        claims.create(&PostParams::default(), &claim.build()).await?;
    }
    // A non-root user whose own group is not the fsGroup writes 1 MiB into each volume.
    let script = "dd if=/dev/zero of=/data/blob bs=1024 count=1024 2>/dev/null \
                  && dd if=/dev/zero of=/data1/blob bs=1024 count=1024 2>/dev/null; sleep 3600";
    let run = PodRun::new(&ns, "writer", script).claim("local").claim("plain").as_user(1000, 1000).fs_group(FS_GROUP);
    // The hostPath volume is 0777 (the Go build's mode), so the user can write into both.
    ctx.lane.run_pod(&run.keep_running()).await?;

    let local_pv = ctx.pv_of(&ns, "local").await?;
    let spec = local_pv.spec.as_ref().context("spec")?;
    ensure!(spec.local.is_some() && spec.host_path.is_none(), "a local PV: {spec:?}");
    let local_dir = ctx.lane.volume_dir(&ns, "local").await?;
    let plain_dir = ctx.lane.volume_dir(&ns, "plain").await?;
    testbed::wait_for("both files written", LANE_TIMEOUT, || async {
        let done = [&local_dir, &plain_dir]
            .iter()
            .all(|d| std::fs::metadata(d.join("blob")).is_ok_and(|m| m.len() == 1 << 20));
        anyhow::Ok(done.then_some(()))
    })
    .await?;
    // fsGroup: the kubelet gives the local volume (and what is written in it) the pod's group,
    // and leaves the hostPath volume as it is.
    let local_meta = std::fs::metadata(&local_dir)?;
    ensure!(local_meta.gid() == FS_GROUP as u32, "local volume's group {} is the fsGroup", local_meta.gid());
    ensure!(local_meta.mode() & 0o2000 != 0, "setgid, so new files get the group: {:o}", local_meta.mode());
    let blob = std::fs::metadata(local_dir.join("blob"))?;
    ensure!(blob.gid() == FS_GROUP as u32, "the file written has the fsGroup: {}", blob.gid());
    let plain_meta = std::fs::metadata(&plain_dir)?;
    ensure!(plain_meta.gid() != FS_GROUP as u32, "a hostPath volume does not get the fsGroup");

    // Volume stats: the kubelet lists the local volume; it has no stats for hostPath volumes.
    // It measures a local volume with statfs, so a directory on a shared pool filesystem reports
    // that filesystem's capacity and use (per volume only where each volume is a filesystem or
    // carries an XFS/ext4 project quota, which statfs reports): docs/volumes.md says so.
    let (used, capacity) =
        testbed::wait_for("the local volume in the kubelet's stats summary", LANE_TIMEOUT, || async {
            let summary = stats_summary(ctx)?;
            anyhow::Ok(volume_stats(&summary, &ns, "writer", "claim-0").filter(|(used, _)| *used >= 1 << 20))
        })
        .await?;
    let pool_size = filesystem_size(&local_dir)?;
    ensure!(
        capacity.abs_diff(pool_size) <= pool_size / 100,
        "capacity {capacity} is the pool filesystem's {pool_size}"
    );
    let summary = stats_summary(ctx)?;
    ensure!(volume_stats(&summary, &ns, "writer", "claim-1").is_none(), "no stats for the hostPath volume");
    println!("    kubelet reports the local volume: {used} bytes used of {capacity}");

    ctx.lane.delete_pod(&ns, "writer").await?;
    for name in ["local", "plain"] {
        ctx.delete_claim_and_wait_reclaimed(&ns, name).await?;
    }
    Ok(())
}

pub(super) async fn two_pods_of_the_node_share_a_node_volume_with_node_local_sharing(ctx: &Ctx) -> Result<()> {
    ctx.deployed().await?;
    let ns = ctx.namespace("sharing").await?;
    let class = ctx.class(&ns, &[("nodeLocalSharing", "true")]).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    let claim = fixtures::claim(&ns, "team", &class, "16Mi")
        .provision_on_node(ctx.lane.node_name())
        .access_modes(&["ReadWriteMany"])
        .build();
    claims.create(&PostParams::default(), &claim).await?;
    ctx.lane
        .run_pod(&PodRun::new(&ns, "first", "echo first > /data/first && sleep 3600").claim("team").keep_running())
        .await?;
    let second = PodRun::new(&ns, "second", "echo second > /data/second && cat /data/first").claim("team");
    let outcome = ctx.lane.run_pod(&second).await?;
    ensure!(
        outcome.exit_code == Some(0) && outcome.logs.contains("first"),
        "the second pod reads the first's file: {}",
        outcome.logs
    );
    let pv = ctx.pv_of(&ns, "team").await?;
    let spec = pv.spec.as_ref().context("spec")?;
    ensure!(spec.access_modes.as_deref() == Some(&["ReadWriteMany".to_owned()][..]), "RWX PV: {spec:?}");
    ensure!(spec.node_affinity.is_some(), "still pinned to its node");
    ctx.lane.delete_pod(&ns, "first").await?;
    ctx.lane.delete_pod(&ns, "second").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "team").await?;
    Ok(())
}

/// A class's `uid`, `gid` and `mode`: the directory is the class's user's and group's, and a pod
/// of a third user, in neither, writes into the `2770` directory because the kubelet adds the
/// PV's `pv.beta.kubernetes.io/gid` to its groups.
pub(super) async fn a_pod_of_another_user_writes_into_a_class_owned_volume_through_its_group(ctx: &Ctx) -> Result<()> {
    const OWNER: u32 = 1000;
    const GROUP: u32 = 2000;
    ctx.deployed().await?;
    let ns = ctx.namespace("ownership").await?;
    let class = ctx.class(&ns, &[("uid", "1000"), ("gid", "2000"), ("mode", "2770")]).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    let claim = fixtures::claim(&ns, "owned", &class, "16Mi").provision_on_node(ctx.lane.node_name());
    claims.create(&PostParams::default(), &claim.build()).await?;
    let writer = PodRun::new(&ns, "writer", "id && echo written > /data/file && ls -ln /data/file")
        .claim("owned")
        .as_user(3000, 3000);
    let outcome = ctx.lane.run_pod(&writer).await?;
    ensure!(
        outcome.exit_code == Some(0) && outcome.logs.contains("2000"),
        "uid 3000 writes with the volume's group among its groups: {}",
        outcome.logs
    );
    let dir = ctx.lane.volume_dir(&ns, "owned").await?;
    let meta = std::fs::metadata(&dir)?;
    ensure!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777) == (OWNER, GROUP, 0o2770),
        "the directory is {}:{} mode {:o}",
        meta.uid(),
        meta.gid(),
        meta.mode() & 0o7777
    );
    let file = std::fs::metadata(dir.join("file"))?;
    ensure!((file.uid(), file.gid()) == (3000, GROUP), "the file is the writer's, in the volume's group (setgid)");
    ctx.lane.delete_pod(&ns, "writer").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "owned").await?;
    Ok(())
}

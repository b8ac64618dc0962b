//! `nodeAffinityKey` on real kubelets: a volume pinned to a disk's label, written on node 1;
//! the disk "moves" to node 2 (its directory moved into node 2's own pool, the label moved with
//! it, the provisioner pods restarted to read their labels, as docs/volumes.md says); the pod
//! made again is placed on node 2 by the PV's affinity and reads the file; deleting the claim
//! makes node 2's provisioner remove the directory.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use testbed::fixtures;
use testbed::real_nodes::{DEPLOY_DAEMONSET, DEPLOY_NAMESPACE, LANE_TIMEOUT, NODE2_NAME, PodRun};

use super::Ctx;

const KEY: &str = "node-restriction.kubernetes.io/hpp-test-disk";

/// Sets (Some) or removes (None) the disk label on `node`.
async fn label(ctx: &Ctx, node: &str, value: Option<&str>) -> Result<()> {
    let patch = serde_json::json!({"metadata": {"labels": {KEY: value}}});
    Api::<Node>::all(ctx.lane.client()).patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

fn kubectl(ctx: &Ctx, args: &[&str]) -> Result<String> {
    ctx.lane.cp().run_kubectl(&ctx.repo, args)
}

/// `kubectl rollout restart` of the provisioner DaemonSet, and its rollout: each pod reads its
/// Node's labels again.
async fn restart_provisioners(ctx: &Ctx) -> Result<()> {
    kubectl(ctx, &["-n", DEPLOY_NAMESPACE, "rollout", "restart", &format!("daemonset/{DEPLOY_DAEMONSET}")])?;
    ctx.lane.wait_daemonset_rolled_out().await?;
    Ok(())
}

pub(super) async fn a_volume_pinned_to_a_disk_label_follows_the_disk_to_the_other_node_two_nodes(
    ctx: &Ctx,
) -> Result<()> {
    super::two_nodes::two_nodes(ctx).await?;
    let node1 = ctx.lane.node_name().to_owned();
    let ns = ctx.namespace("disklabel").await?;
    let serial = ns.clone();
    label(ctx, &node1, Some(&serial)).await?;
    kubectl(
        ctx,
        &[
            "-n",
            DEPLOY_NAMESPACE,
            "set",
            "env",
            &format!("daemonset/{DEPLOY_DAEMONSET}"),
            &format!("NODE_AFFINITY_KEYS={KEY}"),
        ],
    )?;
    ctx.lane.wait_daemonset_rolled_out().await?;
    let class = ctx.class(&ns, &[("nodeAffinityKey", KEY)]).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    claims
        .create(&PostParams::default(), &fixtures::claim(&ns, "disk", &class, "16Mi").provision_on_node(&node1).build())
        .await?;
    let written = ctx
        .lane
        .run_pod(&PodRun::new(&ns, "writer", "echo moved with the disk > /data/f && cat /data/f").claim("disk"))
        .await?;
    ensure!(written.exit_code == Some(0), "the writer failed: {}", written.logs);
    ensure!(
        super::two_nodes::node_of(&written.pod) == node1,
        "the writer ran on {}",
        super::two_nodes::node_of(&written.pod)
    );
    let pv = ctx.pv_of(&ns, "disk").await?;
    let expression = pv
        .spec
        .as_ref()
        .and_then(|s| {
            s.node_affinity.as_ref()?.required.as_ref()?.node_selector_terms.first()?.match_expressions.clone()
        })
        .and_then(|e| e.into_iter().next())
        .context("the PV's node affinity")?;
    ensure!(expression.key == KEY && expression.values == Some(vec![serial.clone()]), "pinned to {expression:?}");

    // The disk moves: its directory into node 2's pool, the label with it.
    let dir = ctx.lane.volume_dir(&ns, "disk").await?;
    let on_node2 = ctx.lane.host_path_on(NODE2_NAME, &dir);
    let moved = std::process::Command::new("mv").arg(&dir).arg(&on_node2).status()?;
    ensure!(moved.success(), "mv {} {}", dir.display(), on_node2.display());
    label(ctx, &node1, None).await?;
    label(ctx, NODE2_NAME, Some(&serial)).await?;
    restart_provisioners(ctx).await?;

    let read = ctx.lane.run_pod(&PodRun::new(&ns, "reader", "cat /data/f").claim("disk")).await?;
    ensure!(read.exit_code == Some(0) && read.logs.contains("moved with the disk"), "the reader: {}", read.logs);
    ensure!(
        super::two_nodes::node_of(&read.pod) == NODE2_NAME,
        "the PV's affinity placed the reader on {}",
        super::two_nodes::node_of(&read.pod)
    );

    // Node 2's provisioner reclaims it as its own.
    for pod in ["writer", "reader"] {
        ctx.lane.delete_pod(&ns, pod).await?;
    }
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    claims.delete("disk", &DeleteParams::default()).await?;
    let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
    testbed::wait_for(&format!("PV {pv_name} and {} gone", on_node2.display()), LANE_TIMEOUT, || async {
        anyhow::Ok((pvs.get_opt(&pv_name).await?.is_none() && !on_node2.exists()).then_some(()))
    })
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;

    // As it was, for the scenarios after this one.
    label(ctx, NODE2_NAME, None).await?;
    kubectl(
        ctx,
        &["-n", DEPLOY_NAMESPACE, "set", "env", &format!("daemonset/{DEPLOY_DAEMONSET}"), "NODE_AFFINITY_KEYS-"],
    )?;
    ctx.lane.wait_daemonset_rolled_out().await?;
    Ok(())
}

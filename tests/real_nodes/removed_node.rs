//! A node removed from the cluster with a StatefulSet's volume on it: with
//! `--release-claims-of-removed-nodes`, the StatefulSet's pod comes back on the other real node
//! with a new volume, and the old PV is kept (`Retain`) for the data on the removed node.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use testbed::real_nodes::images::BUSYBOX_IMAGE;
use testbed::real_nodes::{DEPLOY_DAEMONSET, DEPLOY_NAMESPACE, LANE_TIMEOUT, NODE2_NAME};

use super::{CLASS, Ctx};

/// The deploy's ClusterRole (deploy/legacy/rbac.yaml).
const CLUSTER_ROLE: &str = "kubevirt-hostpath-provisioner";
const GRACE: &str = "5s";

/// Adds or takes back `delete` on claims in the deploy's ClusterRole, as docs/operating.md
/// tells an admin of `deploy/legacy` to.
async fn claims_delete_verb(ctx: &Ctx, granted: bool) -> Result<()> {
    let roles: Api<ClusterRole> = Api::all(ctx.lane.client());
    let mut role = roles.get(CLUSTER_ROLE).await?;
    let rule = role
        .rules
        .iter_mut()
        .flatten()
        .find(|r| r.resources.iter().flatten().any(|r| r == "persistentvolumeclaims"))
        .context("the ClusterRole's rule for claims")?;
    rule.verbs.retain(|v| v != "delete");
    if granted {
        rule.verbs.push("delete".into());
    }
    roles.replace(CLUSTER_ROLE, &PostParams::default(), &role).await?;
    Ok(())
}

/// `kubectl set env` on the deploy's DaemonSet, then its rollout.
async fn set_release_env(ctx: &Ctx, value: Option<&str>) -> Result<()> {
    let setting = match value {
        Some(value) => format!("RELEASE_CLAIMS_OF_REMOVED_NODES={value}"),
        None => "RELEASE_CLAIMS_OF_REMOVED_NODES-".to_string(),
    };
    ctx.lane.cp().run_kubectl(
        &ctx.repo,
        &["-n", DEPLOY_NAMESPACE, "set", "env", &format!("daemonset/{DEPLOY_DAEMONSET}"), &setting],
    )?;
    ctx.lane.wait_daemonset_rolled_out().await?;
    Ok(())
}

/// One replica that prefers node 2, writes the node it first ran on into its volume and stays.
fn stateful_set(ns: &str) -> Result<StatefulSet> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "serviceName": "web",
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "automountServiceAccountToken": false,
                    "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "preference": {"matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE2_NAME]}]}
                    }]}},
                    "containers": [{
                        "name": "main",
                        "image": BUSYBOX_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c",
                            "[ -f /data/first-node ] || echo \"$NODE\" > /data/first-node; sleep 3600"],
                        "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]
                    }]
                }
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": CLASS,
                    "resources": {"requests": {"storage": "1Mi"}}
                }
            }]
        }
    }))?)
}

/// Waits until pod `web-0` runs on `node` with its volume's file written, and returns the
/// claim `data-web-0` and its PV.
async fn running_on(ctx: &Ctx, ns: &str, node: &str) -> Result<(PersistentVolumeClaim, PersistentVolume)> {
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), ns);
    testbed::wait_until(
        &format!("pod web-0 running on {node}"),
        LANE_TIMEOUT,
        || pods.get("web-0"),
        |p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        },
    )
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;
    let claim = Api::<PersistentVolumeClaim>::namespaced(ctx.lane.client(), ns).get("data-web-0").await?;
    let pv = ctx.pv_of(ns, "data-web-0").await?;
    let dir = ctx.lane.host_path_on(node, &ctx.lane.volume_dir(ns, "data-web-0").await?);
    let written = testbed::wait_for(&format!("{}/first-node", dir.display()), LANE_TIMEOUT, || async {
        anyhow::Ok(std::fs::read_to_string(dir.join("first-node")).ok().filter(|s| !s.is_empty()))
    })
    .await?;
    ensure!(written.trim() == node, "the pod on {node} wrote into a volume of its own: {written:?}");
    Ok((claim, pv))
}

pub async fn a_statefulset_whose_node_is_removed_comes_back_on_the_other_node_with_a_new_volume_two_nodes(
    ctx: &Ctx,
) -> Result<()> {
    super::two_nodes::two_nodes(ctx).await?;
    let node1 = ctx.lane.node_name().to_string();
    claims_delete_verb(ctx, true).await?;
    set_release_env(ctx, Some(GRACE)).await?;
    let ns = ctx.namespace("removed").await?;
    let sets: Api<StatefulSet> = Api::namespaced(ctx.lane.client(), &ns);
    sets.create(&PostParams::default(), &stateful_set(&ns)?).await?;
    let (old_claim, old_pv) = running_on(ctx, &ns, NODE2_NAME).await?;
    let old_pv_name = old_pv.metadata.name.clone().context("PV name")?;
    ensure!(
        old_pv.metadata.annotations.as_ref().and_then(|a| a.get("kubevirt.io/provisionOnNode")).map(String::as_str)
            == Some(NODE2_NAME),
        "the first volume is node 2's"
    );

    // Node 2 leaves: its pods go, its kubelet stops, its Node object is deleted. The
    // StatefulSet's new pod waits for a claim whose volume is on a node that is gone.
    ctx.lane.remove_second_node().await?;
    let (new_claim, new_pv) = running_on(ctx, &ns, &node1).await?;
    ensure!(new_claim.metadata.uid != old_claim.metadata.uid, "a new claim of the same name");
    ensure!(new_pv.metadata.name.as_deref() != Some(old_pv_name.as_str()), "a new volume");

    let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
    let kept = pvs.get(&old_pv_name).await.context("the old PV stays")?;
    let policy = kept.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
    ensure!(policy == Some("Retain"), "the old PV is kept for node 2's data: {policy:?}");
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(ctx.lane.client(), &ns)
        .list(&ListParams::default())
        .await?;
    let released = events
        .items
        .iter()
        .find(|e| e.reason.as_deref() == Some("RemovedNodeClaimReleased"))
        .and_then(|e| e.note.clone())
        .context("a RemovedNodeClaimReleased event on the claim")?;
    ensure!(released.contains(NODE2_NAME) && released.contains(&old_pv_name), "names the node and PV: {released}");

    // Back to the deploy as installed; the volumes go with their claims and by hand.
    sets.delete("web", &DeleteParams::default()).await?;
    ctx.lane.delete_pod(&ns, "web-0").await?;
    let dir = ctx.delete_claim_and_wait_reclaimed(&ns, "data-web-0").await?;
    ensure!(!dir.exists(), "the new volume is reclaimed as usual");
    pvs.delete(&old_pv_name, &DeleteParams::default()).await?;
    set_release_env(ctx, None).await?;
    claims_delete_verb(ctx, false).await?;
    Ok(())
}

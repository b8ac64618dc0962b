//! A node removed from the cluster with a StatefulSet's volume on it: with the claim releaser
//! (deploy/components/release-claims-of-removed-nodes, its own Deployment and ServiceAccount) on
//! the remaining node, the StatefulSet's pod comes back on the other real node with a new volume,
//! and the old PV is kept (`Retain`) for the data on the removed node. The node pods' own
//! ServiceAccount may not delete claims.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use testbed::real_nodes::images::BUSYBOX_IMAGE;
use testbed::real_nodes::{DEPLOY_NAMESPACE, LANE_TIMEOUT, NODE2_NAME};

use super::{CLASS, Ctx};

const GRACE: &str = "5s";
/// The claim releaser's objects, as the kustomize component adds them.
const CLAIM_RELEASER: &str = "deploy/components/release-claims-of-removed-nodes/claim-releaser.yaml";
const RELEASER: &str = "kubevirt-hostpath-provisioner-claim-releaser";
/// deploy/legacy's ServiceAccount, the node pods'.
const NODE_SERVICE_ACCOUNT: &str = "kubevirt-hostpath-provisioner-admin";

/// Applies the claim releaser's objects of the component's file with the lane's image and
/// `GRACE`, its pod kept on the first node (the second is the one removed), and waits until it
/// runs.
async fn deploy_claim_releaser(ctx: &Ctx) -> Result<()> {
    let image = ctx.deployed().await?;
    let text = std::fs::read_to_string(ctx.repo.join(CLAIM_RELEASER))?;
    let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text)?;
    let node1 = ctx.lane.node_name().to_string();
    for mut object in documents.into_iter().filter(|d| d.is_object()) {
        if object["kind"] == "Deployment" {
            let pod = &mut object["spec"]["template"]["spec"];
            pod["nodeSelector"]["kubernetes.io/hostname"] = json!(node1);
            let container = &mut pod["containers"][0];
            container["image"] = json!(image);
            container["imagePullPolicy"] = json!("Never");
            for variable in container["env"].as_array_mut().into_iter().flatten() {
                if variable["name"] == "RELEASE_CLAIMS_OF_REMOVED_NODES" {
                    variable["value"] = json!(GRACE);
                }
            }
        }
        let file = tempfile::NamedTempFile::new()?;
        std::fs::write(file.path(), serde_json::to_string(&object)?)?;
        let path = file.path().to_str().context("utf-8 path")?;
        ctx.lane.cp().run_kubectl(&ctx.repo, &["apply", "--server-side", "--force-conflicts", "-f", path])?;
    }
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), DEPLOY_NAMESPACE);
    let selector = ListParams::default().labels(&format!("k8s-app={RELEASER}"));
    testbed::wait_for("the claim releaser running", LANE_TIMEOUT, || async {
        let running = pods
            .list(&selector)
            .await?
            .items
            .into_iter()
            .any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        anyhow::Ok(running.then_some(()))
    })
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;
    Ok(())
}

/// Removes what [`deploy_claim_releaser`] applied.
async fn remove_claim_releaser(ctx: &Ctx) -> Result<()> {
    for what in [
        vec!["-n", DEPLOY_NAMESPACE, "delete", "deployment", RELEASER, "--ignore-not-found"],
        vec!["-n", DEPLOY_NAMESPACE, "delete", "serviceaccount", RELEASER, "--ignore-not-found"],
        vec!["delete", "clusterrolebinding", RELEASER, "--ignore-not-found"],
        vec!["delete", "clusterrole", RELEASER, "--ignore-not-found"],
    ] {
        ctx.lane.cp().run_kubectl(&ctx.repo, &what)?;
    }
    Ok(())
}

/// Whether the API server lets ServiceAccount `account` of the deploy's namespace delete claims
/// in `ns`.
async fn may_delete_claims(ctx: &Ctx, ns: &str, account: &str) -> Result<bool> {
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": format!("system:serviceaccount:{DEPLOY_NAMESPACE}:{account}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{DEPLOY_NAMESPACE}")],
            "resourceAttributes": {"verb": "delete", "resource": "persistentvolumeclaims", "namespace": ns}
        }
    }))?;
    let answer = Api::<SubjectAccessReview>::all(ctx.lane.client()).create(&PostParams::default(), &review).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
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
    deploy_claim_releaser(ctx).await?;
    let ns = ctx.namespace("removed").await?;
    ensure!(!may_delete_claims(ctx, &ns, NODE_SERVICE_ACCOUNT).await?, "the node pods may not delete claims");
    ensure!(may_delete_claims(ctx, &ns, RELEASER).await?, "the claim releaser may");
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
    remove_claim_releaser(ctx).await?;
    Ok(())
}

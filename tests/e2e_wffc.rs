//! End-to-end: under WaitForFirstConsumer a node provisions as soon as the scheduler selected it
//! (`volume.kubernetes.io/selected-node`), without waiting for the PV controller to copy the
//! provisioner onto the claim. The cases that annotation would protect still hold.

mod common;

use common::*;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use testbed::fixtures;

const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// PVs made for this claim uid.
async fn pvs_for(env: &TestEnv, uid: &str) -> Vec<PersistentVolume> {
    let all = env.pvs().list(&ListParams::default()).await.expect("list PVs").items;
    all.into_iter().filter(|pv| pv.metadata.name.as_deref() == Some(&format!("pvc-{uid}"))).collect()
}

async fn select(env: &TestEnv, claim: &str, node: &str) {
    let patch = serde_json::json!({"metadata": {"annotations": {SELECTED_NODE: node}}});
    env.claims().patch(claim, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("select node");
}

/// Creates a 1Gi static hostPath PV of `class` on `node` (optionally naming a claim of the test
/// namespace in its claimRef) and waits until the PV controller has seen it (Available).
async fn static_pv(env: &TestEnv, class: &str, node: &str, claim: Option<&str>) -> String {
    let name = format!("{}-static", env.group);
    let path = env.cp.temp_dir().join(&name);
    std::fs::create_dir_all(&path).unwrap();
    let mut pv = fixtures::host_path_volume(&name, &path.display().to_string(), "1Gi")
        .storage_class(class)
        .on_hostname(node)
        .build();
    pv.spec.as_mut().unwrap().claim_ref = claim.map(|claim| k8s_openapi::api::core::v1::ObjectReference {
        namespace: Some(env.ns.clone()),
        name: Some(claim.into()),
        ..Default::default()
    });
    env.pvs().create(&PostParams::default(), &pv).await.expect("static PV");
    env.wait_pv_phase(&name, "Available").await;
    name
}

#[tokio::test(flavor = "multi_thread")]
async fn a_matching_static_pv_is_bound_instead_and_no_volume_is_provisioned() {
    let env = TestEnv::start("static", 2).await;
    let class = env.class("wffc", |c| c).await;
    let node = env.nodes[0].name.clone();
    // The case this protects is a PV that exists when the pod is scheduled: wait until the PV
    // controller has seen it (Available), and give the scheduler's informer as long again. A PV
    // created in the same instant as the pod can be missed by the scheduler's cache on a loaded
    // machine (the next test covers what the node does then).
    let name = static_pv(&env, &class, &node, None).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "data", &class, "64Mi")).await;
    // On the node where the static PV is, the scheduler finds it and binds it rather than
    // selecting the node for provisioning.
    let pod = fixtures::pod_using_claim(&env.ns, "app", "data").on_hostname(&node).build();
    env.pods().create(&PostParams::default(), &pod).await.expect("pod");
    let bound = env.wait_bound("data").await;
    assert_eq!(bound.metadata.name.as_deref(), Some(name.as_str()), "the existing PV is bound");
    // Give every provisioner a chance to (wrongly) act.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(pvs_for(&env, &uid(&claim)).await.is_empty(), "no PV provisioned");
    for n in &env.nodes {
        assert!(entries(&n.pool_root).is_empty(), "nothing created on {}", n.name);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pv_pre_bound_to_the_claim_is_bound_even_when_the_node_was_selected_first() {
    // The scheduler's cache can miss a PV created in the same moment as the pod and select a node
    // for provisioning. The PV controller still binds a PV pre-bound to the claim (claimRef
    // naming it); the node must leave such a claim alone rather than provision a second PV.
    let env = TestEnv::start("prebound", 1).await;
    let class = env.class("wffc", |c| c).await;
    let node = env.nodes[0].name.clone();
    let name = static_pv(&env, &class, &node, Some("data")).await;
    // Let the provisioner's PV watch deliver it too.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "data", &class, "64Mi").annotation(SELECTED_NODE, &node)).await;
    let bound = env.wait_bound("data").await;
    assert_eq!(bound.metadata.name.as_deref(), Some(name.as_str()), "the pre-bound PV is bound");
    // Give the provisioner a chance to (wrongly) act.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(pvs_for(&env, &uid(&claim)).await.is_empty(), "no PV provisioned");
    assert!(entries(&env.nodes[0].pool_root).is_empty(), "nothing created in the pool");
    // A second PV made and then reclaimed would leave nothing behind by now: the events tell.
    let provisioned: Vec<_> = env
        .events_for(&env.ns, &uid(&claim))
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("ProvisioningSucceeded"))
        .collect();
    assert!(provisioned.is_empty(), "no volume was provisioned for the claim: {provisioned:?}\n{}", env.log_tails());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_moved_to_another_node_before_provisioning_leaves_nothing_on_the_first() {
    let mut env = TestEnv::start("moved", 2).await;
    let class = env.class("wffc", |c| c).await;
    let (first, second) = (env.nodes[0].name.clone(), env.nodes[1].name.clone());
    env.node_mut(&first).provisioner.terminate();
    let claim = env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi")).await;
    // The scheduler picked the first node, then (its provisioner not answering) the second.
    select(&env, "data", &first).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    select(&env, "data", &second).await;
    let pv = env.wait_bound("data").await;
    let owner = pv.metadata.annotations.unwrap_or_default()["kubevirt.io/provisionOnNode"].clone();
    assert_eq!(owner, second);
    // The first node comes back: the claim is no longer its.
    env.node_mut(&first).provisioner.restart().expect("restart");
    env.node_mut(&first).provisioner.wait_ready(TIMEOUT).await.expect("ready");
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert!(entries(&env.node(&first).pool_root).is_empty(), "nothing left on the first node");
    assert_eq!(pvs_for(&env, &uid(&claim)).await.len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_deleted_right_after_selection_leaves_no_pv_and_no_directory() {
    let env = TestEnv::start("gone", 1).await;
    let class = env.class("wffc", |c| c).await;
    let node = env.nodes[0].name.clone();
    let mut uids = Vec::new();
    for i in 0..5 {
        let name = format!("data-{i}");
        let claim =
            env.create_claim(fixtures::claim(&env.ns, &name, &class, "1Mi").annotation(SELECTED_NODE, &node)).await;
        env.delete_claim(&name).await;
        uids.push(uid(&claim));
    }
    // Whether it was provisioned in between or not, everything converges to nothing.
    testbed::wait_for("no PV and no directory left", TIMEOUT, || async {
        let mut left = 0;
        for uid in &uids {
            left += pvs_for(&env, uid).await.len();
        }
        let dirs = entries(&env.nodes[0].pool_root).len();
        anyhow::Ok((left == 0 && dirs == 0).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    wait_trash_empty(&env.nodes[0].pool_root).await;
}

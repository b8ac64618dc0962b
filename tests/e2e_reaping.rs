//! End-to-end: volumes of removed nodes. A node is removed from the cluster (its provisioner
//! stopped, its Node object deleted).
//! - `--reap-volumes-of-removed-nodes`: while claims of its volumes are deleted, past the grace
//!   period the remaining node deletes the Released PVs of reclaim policy Delete, with an event
//!   naming the node, keeps those of Retain, and touches no data.
//! - `--release-claims-of-removed-nodes`: its claims stay bound; past the grace period the
//!   remaining node sets each PV to Retain and deletes the claim, with an event naming the node
//!   on both; the node, back under its name, keeps its directories.

mod common;

use common::*;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
use testbed::fixtures;

/// Two nodes of a provisioner name of the test's own, each with `variable` set to 3 s.
async fn two_nodes_with(test: &str, variable: &str) -> TestEnv {
    let mut env = TestEnv::start(test, 0).await;
    env.own_provisioner();
    for i in 1..=2 {
        let name = format!("{}-{i}", env.group);
        env.add_node(&name, &|spec| spec.env(variable, "3s")).await;
    }
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn the_released_volumes_of_a_removed_node_are_deleted_after_the_grace_period_and_retained_ones_kept() {
    let mut env = two_nodes_with("reap", "REAP_VOLUMES_OF_REMOVED_NODES").await;
    let removed = env.nodes[1].name.clone();
    let delete = env.class("imm", |c| c.immediate()).await;
    let retain = env.class("keep", |c| c.immediate().reclaim_policy("Retain")).await;
    let mut volumes = Vec::new();
    for (claim, class) in [("gone", &delete), ("kept", &retain)] {
        env.create_claim(fixtures::claim(&env.ns, claim, class, "1Mi").provision_on_node(&removed)).await;
        let pv = env.wait_bound(claim).await;
        let dir = std::path::PathBuf::from(pv.spec.as_ref().unwrap().host_path.as_ref().unwrap().path.clone());
        std::fs::write(dir.join("data"), claim).unwrap();
        volumes.push((pv.metadata.name.clone().unwrap(), dir));
    }

    // The node leaves the cluster: its provisioner stops, its Node object is deleted.
    env.node_mut(&removed).provisioner.terminate();
    Api::<Node>::all(env.client.clone()).delete(&removed, &DeleteParams::default()).await.expect("delete Node");
    for claim in ["gone", "kept"] {
        env.delete_claim(claim).await;
    }
    let (gone_pv, gone_dir) = &volumes[0];
    let gone_uid = env.wait_pv_phase(gone_pv, "Released").await.metadata.uid.unwrap();
    env.wait_pv_gone(gone_pv).await;
    let note = env.wait_event("default", &gone_uid, "RemovedNodeVolumeDeleted").await;
    assert!(note.contains(&removed) && note.contains("--reap-volumes-of-removed-nodes"), "names the node: {note}");

    let (kept_pv, kept_dir) = &volumes[1];
    let kept = env.pvs().get(kept_pv).await.expect("the Retain PV stays");
    assert_eq!(kept.status.and_then(|s| s.phase).as_deref(), Some("Released"));
    // The removed node's disk is never touched from here (on a real cluster it is gone).
    assert_eq!(std::fs::read_to_string(gone_dir.join("data")).unwrap(), "gone");
    assert_eq!(std::fs::read_to_string(kept_dir.join("data")).unwrap(), "kept");
    let metrics = env.nodes[0].provisioner.metrics().await.expect("metrics");
    assert!(metrics.lines().any(|l| l.starts_with("hostpath_provisioner_reaped_volumes_total 1")), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_bound_claims_of_a_removed_node_are_released_their_volumes_kept_and_a_returning_node_keeps_its_data() {
    let mut env = two_nodes_with("release", "RELEASE_CLAIMS_OF_REMOVED_NODES").await;
    let (live, removed) = (env.nodes[0].name.clone(), env.nodes[1].name.clone());
    let class = env.class("imm", |c| c.immediate()).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&removed)).await;
    let claim_uid = uid(&claim);
    let pv = env.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let pv_uid = pv.metadata.uid.clone().unwrap();
    assert_eq!(pv.spec.as_ref().unwrap().persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
    let dir = std::path::PathBuf::from(pv.spec.as_ref().unwrap().host_path.as_ref().unwrap().path.clone());
    std::fs::write(dir.join("data"), "written before the node left").unwrap();

    // The node leaves the cluster: its provisioner stops, its Node object is deleted. The claim
    // stays bound to a volume no pod can reach any more.
    env.node_mut(&removed).provisioner.terminate();
    Api::<Node>::all(env.client.clone()).delete(&removed, &DeleteParams::default()).await.expect("delete Node");
    testbed::wait_for("the claim released", TIMEOUT, || async {
        anyhow::Ok(env.claims().get_opt("data").await?.is_none().then_some(()))
    })
    .await
    .expect("the claim of the removed node's volume is deleted");
    let released = env.wait_pv_phase(&pv_name, "Released").await;
    assert_eq!(
        released.spec.as_ref().unwrap().persistent_volume_reclaim_policy.as_deref(),
        Some("Retain"),
        "the PV is kept, so that nothing deletes the data"
    );
    for (namespace, uid) in [(env.ns.as_str(), claim_uid.as_str()), ("default", pv_uid.as_str())] {
        let note = env.wait_event(namespace, uid, "RemovedNodeClaimReleased").await;
        assert!(
            note.contains(&removed) && note.contains("--release-claims-of-removed-nodes") && note.contains(&pv_name),
            "names the node, the flag and the PV: {note}"
        );
    }
    let metrics = env.nodes[0].provisioner.metrics().await.expect("metrics");
    assert!(metrics.lines().any(|l| l.starts_with("hostpath_provisioner_released_claims_total 1")), "{metrics}");

    // The workload's new claim of the same name is provisioned on a node that runs.
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&live)).await;
    let new_pv = env.wait_bound("data").await;
    assert_ne!(new_pv.metadata.name.as_deref(), Some(pv_name.as_str()));

    // The node comes back under its name: its provisioner finds its volume Released and Retain,
    // and keeps the directory and the data.
    env.cp.add_node_labeled(&removed, &removed, &[(GROUP_LABEL, &env.group)]).await.expect("the Node again");
    let returning = env.node_mut(&removed);
    returning.provisioner.restart().expect("restart");
    returning.provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("ready");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(std::fs::read_to_string(dir.join("data")).unwrap(), "written before the node left");
    let kept = env.pvs().get(&pv_name).await.expect("the PV stays for an admin");
    assert_eq!(kept.spec.and_then(|s| s.persistent_volume_reclaim_policy).as_deref(), Some("Retain"));
    let still_bound = env.claims().get("data").await.expect("the new claim stays");
    assert_eq!(still_bound.spec.and_then(|s| s.volume_name), new_pv.metadata.name, "the new claim is not released");
}

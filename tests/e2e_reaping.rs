//! End-to-end: `--reap-volumes-of-removed-nodes`. A node is removed from the cluster (its
//! provisioner stopped, its Node object deleted) while claims of its volumes are deleted: past
//! the grace period the remaining node deletes the Released PVs of reclaim policy Delete, with an
//! event naming the node, keeps those of Retain, and touches no data.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams};
use testbed::fixtures;

#[tokio::test(flavor = "multi_thread")]
async fn the_released_volumes_of_a_removed_node_are_deleted_after_the_grace_period_and_retained_ones_kept() {
    let mut env = TestEnv::start("reap", 0).await;
    env.own_provisioner();
    for i in 1..=2 {
        let name = format!("{}-{i}", env.group);
        env.add_node(&name, &|spec| spec.env("REAP_VOLUMES_OF_REMOVED_NODES", "3s")).await;
    }
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

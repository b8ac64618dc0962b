//! End-to-end: `volumeType: local` writes a local PV of the same directory and node, reclaimed
//! like any other; `nodeLocalSharing` lets a node volume take ReadWriteMany; what cannot work is
//! refused on the claim with the reason. (What the kubelet does with a local PV, fsGroup and
//! volume stats, is proven on the real-node lane.)

mod common;

use common::*;
use testbed::fixtures;

#[tokio::test(flavor = "multi_thread")]
async fn a_local_volume_is_made_and_reclaimed_like_a_host_path_one() {
    let env = TestEnv::start("localpv", 1).await;
    let class = env.class("local", |c| c.immediate().parameter("volumeType", "local")).await;
    let node = env.nodes[0].name.clone();
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("data").await;
    let spec = pv.spec.clone().unwrap();
    assert!(spec.host_path.is_none(), "{spec:?}");
    let dir = std::path::PathBuf::from(spec.local.expect("spec.local").path);
    assert_eq!(dir.parent(), Some(env.nodes[0].pool_root.as_path()));
    assert!(dir.is_dir());
    let values =
        spec.node_affinity.unwrap().required.unwrap().node_selector_terms[0].match_expressions.clone().unwrap();
    assert_eq!(values[0].values, Some(vec![node.clone()]));
    std::fs::write(dir.join("file"), b"x").unwrap();
    env.delete_claim("data").await;
    env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    wait_path_gone(&dir).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn node_local_sharing_takes_read_write_many_and_what_cannot_work_is_explained() {
    let env = TestEnv::start("sharing", 1).await;
    let node = env.nodes[0].name.clone();
    let shared = env.class("share", |c| c.immediate().parameter("nodeLocalSharing", "true")).await;
    let plain = env.class("plain", |c| c.immediate()).await;
    let rwx = |name: &str, class: &str| {
        fixtures::claim(&env.ns, name, class, "1Mi").provision_on_node(&node).access_modes(&["ReadWriteMany"])
    };
    env.create_claim(rwx("team", &shared)).await;
    let pv = env.wait_bound("team").await;
    assert_eq!(pv.spec.as_ref().unwrap().access_modes, Some(vec!["ReadWriteMany".to_owned()]));
    assert!(pv.spec.as_ref().unwrap().node_affinity.is_some(), "every user is on its node");

    let refused = env.create_claim(rwx("alone", &plain)).await;
    let note = env.wait_event(&env.ns, &uid(&refused), "ProvisioningFailed").await;
    assert!(note.contains("ReadWriteMany") && note.contains("nodeLocalSharing"), "says how to allow it: {note}");

    let local_shared =
        env.class("badlocal", |c| c.immediate().parameter("volumeType", "local").parameter("topology", "shared")).await;
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "nowhere", &local_shared, "1Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("volumeType") && note.contains("a local PV belongs to one node"), "{note}");
}

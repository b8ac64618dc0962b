//! End-to-end: PVs written by the Go kubevirt provisioner (every historical directory layout,
//! with and without the owner annotation) are deleted by the owning node and only by it, and
//! PVs whose paths break the rules of docs/architecture.md, deletion rules are refused and left alone.

mod common;

use std::path::Path;

use common::*;
use k8s_openapi::api::core::v1::{LocalVolumeSource, PersistentVolume, PersistentVolumeClaim};
use kube::api::PostParams;
use testbed::fixtures;

/// A PV exactly as the Go build writes it: no labels, hostPath without `type`, identity and
/// owner annotations, node affinity on the node name.
fn go_pv(claim: &PersistentVolumeClaim, path: &Path, owner: &str, owner_annotation: bool) -> PersistentVolume {
    let name = format!("pvc-{}", uid(claim));
    let mut builder = fixtures::host_path_volume(&name, &path.display().to_string(), "1Gi")
        .provisioned_by(PROVISIONER)
        .annotation("hostPathProvisionerIdentity", PROVISIONER)
        .bound_to(claim)
        .on_hostname(owner);
    if owner_annotation {
        builder = builder.annotation("kubevirt.io/provisionOnNode", owner);
    }
    let mut pv = builder.build();
    pv.spec.as_mut().unwrap().host_path.as_mut().unwrap().type_ = None;
    pv
}

/// Creates a claim nobody provisions (Immediate, no node) and binds `pv` (built from it) to it.
async fn bound_claim(
    env: &TestEnv,
    class: &str,
    name: &str,
    pv: impl FnOnce(&PersistentVolumeClaim) -> PersistentVolume,
) -> PersistentVolume {
    let claim = env.create_claim(fixtures::claim(&env.ns, name, class, "1Gi")).await;
    let pv = env.pvs().create(&PostParams::default(), &pv(&claim)).await.expect("create PV");
    env.wait_bound(name).await;
    pv
}

#[tokio::test(flavor = "multi_thread")]
async fn go_built_pvs_are_deleted_by_the_owning_node_in_every_layout() {
    let env = TestEnv::start("compat", 2).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let (a, b) = (env.nodes[0].name.clone(), env.nodes[1].name.clone());
    // (claim name, layout from (namespace, claim, uid), owner, owner annotation present)
    type Layout = fn(&str, &str, &str) -> String;
    let cases: [(&str, Layout, &str, bool); 6] = [
        ("plain", |_, _, uid| format!("pvc-{uid}"), &a, true),
        ("prefixed", |_, claim, uid| format!("{claim}-pvc-{uid}"), &b, true),
        ("nsprefixed", |ns, claim, uid| format!("{ns}-{claim}-pvc-{uid}"), &a, true),
        ("plain2", |_, _, uid| format!("pvc-{uid}"), &b, true),
        ("prefixed2", |_, claim, uid| format!("{claim}-pvc-{uid}"), &a, true),
        ("pre2019", |_, _, uid| format!("pvc-{uid}"), &b, false),
    ];
    let mut volumes = Vec::new();
    for (claim_name, layout, owner, annotated) in cases {
        let owner_node = env.node(owner);
        let other_node = env.nodes.iter().find(|n| n.name != owner).unwrap();
        let pv = bound_claim(&env, &class, claim_name, |claim| {
            let dir = layout(&env.ns, claim_name, &uid(claim));
            go_pv(claim, &owner_node.pool_root.join(&dir), owner, annotated)
        })
        .await;
        let dir_name =
            Path::new(&pv.spec.as_ref().unwrap().host_path.as_ref().unwrap().path).file_name().unwrap().to_owned();
        // Data on the owner, and a same-named directory on the other node that must survive.
        let owner_dir = owner_node.pool_root.join(&dir_name);
        std::fs::create_dir_all(owner_dir.join("sub")).unwrap();
        std::fs::write(owner_dir.join("sub/disk.img"), b"vm disk").unwrap();
        let decoy = other_node.pool_root.join(&dir_name);
        std::fs::create_dir_all(&decoy).unwrap();
        std::fs::write(decoy.join("keep"), b"not yours").unwrap();
        volumes.push((claim_name, pv.metadata.name.clone().unwrap(), owner_dir, decoy));
    }
    for (claim_name, _, _, _) in &volumes {
        env.delete_claim(claim_name).await;
    }
    for (_, pv, owner_dir, decoy) in &volumes {
        env.wait_pv_gone(pv).await;
        wait_path_gone(owner_dir).await;
        assert_eq!(std::fs::read(decoy.join("keep")).unwrap(), b"not yours", "other node left its directory alone");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pv_pointing_outside_the_pool_is_refused_and_left_alone() {
    let env = TestEnv::start("outside", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    // A directory outside any pool, named like a volume, holding a file that must survive.
    let outside = env.cp.temp_dir().join(format!("{}-elsewhere", env.group));
    let pv = bound_claim(&env, &class, "evil", |claim| {
        let dir = outside.join(format!("pvc-{}", uid(claim)));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("canary"), b"alive").unwrap();
        go_pv(claim, &dir, &node, true)
    })
    .await;
    let pv_uid = pv.metadata.uid.clone().unwrap();
    let pv_name = pv.metadata.name.clone().unwrap();
    env.delete_claim("evil").await;
    let note = env.wait_event("default", &pv_uid, "VolumeFailedDelete").await;
    assert!(note.contains("not directly under a pool root"), "{note}");
    let canary = outside.join(&pv_name).join("canary");
    assert_eq!(std::fs::read(&canary).unwrap(), b"alive");
    let pv = env.pvs().get(&pv_name).await.expect("PV left for an admin");
    assert_eq!(pv.status.and_then(|s| s.phase).as_deref(), Some("Released"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_local_pv_naming_the_pool_root_itself_is_refused_without_a_crash() {
    let env = TestEnv::start("nohostpath", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    let pool = env.nodes[0].pool_root.clone();
    let pv = bound_claim(&env, &class, "local", |claim| {
        let mut pv = go_pv(claim, &pool.join(format!("pvc-{}", uid(claim))), &node, true);
        let spec = pv.spec.as_mut().unwrap();
        spec.host_path = None;
        spec.local = Some(LocalVolumeSource { path: pool.display().to_string(), fs_type: None });
        pv
    })
    .await;
    env.delete_claim("local").await;
    let note = env.wait_event("default", pv.metadata.uid.as_deref().unwrap(), "VolumeFailedDelete").await;
    // A local PV's path is read like a hostPath's (volumeType: local), and the pool root itself
    // is no volume directory: refused by the path rules, nothing removed.
    assert!(note.contains("refusing to delete") && note.contains(&pool.display().to_string()), "{note}");
    assert!(env.nodes[0].provisioner.log_tail(1000).contains("refusing to delete"));
    let mut node = env.nodes.into_iter().next().unwrap();
    assert!(node.provisioner.is_running(), "the provisioner did not crash");
    assert!(pool.is_dir(), "the pool root is untouched");
}

//! End-to-end: provisioners killed (SIGKILL) at arbitrary moments converge on restart with no
//! duplicate PV and no orphan directory.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::ListParams;
use testbed::fixtures;

const CLAIMS: usize = 24;

async fn our_pvs(env: &TestEnv, class: &str) -> Vec<PersistentVolume> {
    let all = env.pvs().list(&ListParams::default()).await.expect("list PVs").items;
    all.into_iter().filter(|pv| pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) == Some(class)).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn provisioner_killed_mid_way_converges_without_duplicates_or_orphans() {
    let mut env = TestEnv::start("crash", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    let pool = env.nodes[0].pool_root.clone();

    // Create claims while killing the provisioner every few claims, at varying moments.
    let mut uids = BTreeSet::new();
    for i in 0..CLAIMS {
        let claim =
            env.create_claim(fixtures::claim(&env.ns, &format!("c{i}"), &class, "1Mi").provision_on_node(&node)).await;
        uids.insert(uid(&claim));
        if i % 6 == 5 {
            tokio::time::sleep(Duration::from_millis(37 * i as u64 % 300)).await;
            let provisioner = &mut env.node_mut(&node).provisioner;
            provisioner.kill();
            provisioner.restart().expect("restart");
        }
    }
    for i in 0..CLAIMS {
        env.wait_bound(&format!("c{i}")).await;
    }
    let pvs = our_pvs(&env, &class).await;
    let bound_uids: BTreeSet<String> =
        pvs.iter().filter_map(|pv| pv.spec.as_ref()?.claim_ref.as_ref()?.uid.clone()).collect();
    assert_eq!(pvs.len(), CLAIMS, "exactly one PV per claim");
    assert_eq!(bound_uids, uids);
    let expected_dirs: BTreeSet<String> = uids.iter().map(|u| format!("pvc-{u}")).collect();
    assert_eq!(entries(&pool), expected_dirs, "one directory per claim, no orphan");

    // Delete them all, killing the provisioner in the middle of it.
    for i in 0..CLAIMS {
        env.delete_claim(&format!("c{i}")).await;
        if i == CLAIMS / 2 {
            let provisioner = &mut env.node_mut(&node).provisioner;
            provisioner.kill();
            provisioner.restart().expect("restart");
        }
    }
    testbed::wait_for("all PVs deleted", TIMEOUT * 2, || async {
        anyhow::Ok(our_pvs(&env, &class).await.is_empty().then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    testbed::wait_for("pool empty", TIMEOUT, || async { anyhow::Ok(entries(&pool).is_empty().then_some(())) })
        .await
        .unwrap_or_else(|e| panic!("{e:#}: left {:?}", entries(&pool)));
    wait_trash_empty(&pool).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn directory_left_by_a_crash_before_the_pv_is_reused_or_cleaned_up() {
    let mut env = TestEnv::start("orphan", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    let pool = env.nodes[0].pool_root.clone();
    env.node_mut(&node).provisioner.kill();

    // As if the provisioner died right after mkdir: once for a claim that still exists (the
    // directory is reused), once for a claim deleted while it was down (the empty directory is
    // removed), and a non-empty directory without claim or PV (kept: it may hold data).
    let reused = env.create_claim(fixtures::claim(&env.ns, "reused", &class, "1Mi").provision_on_node(&node)).await;
    std::fs::create_dir(pool.join(format!("pvc-{}", uid(&reused)))).unwrap();
    let gone = env.create_claim(fixtures::claim(&env.ns, "gone", &class, "1Mi").provision_on_node(&node)).await;
    let gone_dir = pool.join(format!("pvc-{}", uid(&gone)));
    std::fs::create_dir(&gone_dir).unwrap();
    env.delete_claim("gone").await;
    let data_dir = pool.join("pvc-00000000-0000-4000-8000-000000000000");
    std::fs::create_dir(&data_dir).unwrap();
    std::fs::write(data_dir.join("data"), b"unknown but maybe precious").unwrap();

    env.node_mut(&node).provisioner.restart().expect("restart");
    let pv = env.wait_bound("reused").await;
    assert_eq!(pv.metadata.name.as_deref(), Some(format!("pvc-{}", uid(&reused)).as_str()));
    wait_path_gone(&gone_dir).await;
    assert!(data_dir.join("data").exists(), "a non-empty directory is never removed by the cleanup");
    assert_eq!(
        entries(&pool),
        BTreeSet::from([format!("pvc-{}", uid(&reused)), "pvc-00000000-0000-4000-8000-000000000000".to_owned()])
    );
}

//! End-to-end: deletion with one request. A released volume is moved aside (staged) while its
//! PV is deleted with the preconditions of the object decided on, then committed to the trash or
//! put back. A provisioner killed in between finds its staged volumes at start-up: put back when
//! their PV still exists, purged when it is gone.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use testbed::fixtures;

/// The provisioner's deletion staging directory under a pool root.
const STAGING: &str = ".hpp-deleting";

/// Where a volume staged by `node` for PV `pv` sits.
fn staged_at(pool: &Path, node: &str, pv: &str) -> PathBuf {
    pool.join(STAGING).join(node).join(pv).join(pv)
}

/// Moves a volume aside exactly as the provisioner stages it before deleting its PV (what a
/// crash between staging and the API server's answer leaves behind).
fn stage_by_hand(pool: &Path, node: &str, pv: &str) -> PathBuf {
    let to = staged_at(pool, node, pv);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::rename(pool.join(pv), &to).unwrap();
    to
}

/// Entries of this node's staging directory (empty when there is none).
fn staging_entries(pool: &Path, node: &str) -> Vec<String> {
    std::fs::read_dir(pool.join(STAGING).join(node))
        .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
        .unwrap_or_default()
}

/// A bound claim's volume, holding a file.
async fn volume_with_data(env: &TestEnv, class: &str, claim: &str, node: &str) -> (String, PathBuf) {
    env.create_claim(fixtures::claim(&env.ns, claim, class, "1Mi").provision_on_node(node)).await;
    let pv = env.wait_bound(claim).await;
    let name = pv.metadata.name.clone().expect("PV name");
    let dir = env.node(node).pool_root.join(&name);
    std::fs::write(dir.join("data"), b"payload").unwrap();
    (name, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn released_volumes_go_with_their_pvs_and_leave_nothing_staged() {
    let env = TestEnv::start("delone", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    let pool = env.nodes[0].pool_root.clone();
    let mut volumes = Vec::new();
    for i in 0..4 {
        volumes.push(volume_with_data(&env, &class, &format!("c{i}"), &node).await);
    }
    for i in 0..4 {
        env.delete_claim(&format!("c{i}")).await;
    }
    for (pv, dir) in &volumes {
        env.wait_pv_gone(pv).await;
        wait_path_gone(dir).await;
    }
    wait_trash_empty(&pool).await;
    assert_eq!(staging_entries(&pool, &node), Vec::<String>::new(), "nothing left staged");
    assert!(!pool.join(STAGING).exists(), "an idle pool holds no staging directory");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_left_staged_for_a_pv_that_still_exists_is_put_back_at_start_up() {
    let mut env = TestEnv::start("delback", 1).await;
    // Retain: once the claim goes, the restored volume must stay where it is, with its data.
    let class = env.class("keep", |c| c.immediate().reclaim_policy("Retain")).await;
    let node = env.nodes[0].name.clone();
    let pool = env.nodes[0].pool_root.clone();
    let (bound_pv, bound_dir) = volume_with_data(&env, &class, "bound", &node).await;
    let (released_pv, released_dir) = volume_with_data(&env, &class, "released", &node).await;
    env.delete_claim("released").await;
    env.wait_pv_phase(&released_pv, "Released").await;

    env.node_mut(&node).provisioner.kill();
    for pv in [&bound_pv, &released_pv] {
        stage_by_hand(&pool, &node, pv);
    }
    assert!(!bound_dir.exists() && !released_dir.exists());
    env.node_mut(&node).provisioner.restart().expect("restart");
    env.node_mut(&node).provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("ready");

    for dir in [&bound_dir, &released_dir] {
        assert_eq!(std::fs::read(dir.join("data")).unwrap(), b"payload", "{} back with its data", dir.display());
    }
    assert_eq!(staging_entries(&pool, &node), Vec::<String>::new(), "nothing left staged");
    assert!(env.pvs().get_opt(&bound_pv).await.unwrap().is_some());
    assert!(env.pvs().get_opt(&released_pv).await.unwrap().is_some(), "Retain keeps the PV");
    assert_eq!(env.wait_bound("bound").await.metadata.name.as_deref(), Some(bound_pv.as_str()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_left_staged_for_a_pv_that_is_gone_is_purged_at_start_up() {
    let mut env = TestEnv::start("delgone", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    let pool = env.nodes[0].pool_root.clone();
    let (pv, dir) = volume_with_data(&env, &class, "gone", &node).await;

    // As if the provisioner died after its DELETE went through and before it committed the
    // staged volume to the trash.
    env.node_mut(&node).provisioner.kill();
    env.delete_claim("gone").await;
    env.wait_pv_phase(&pv, "Released").await;
    let staged = stage_by_hand(&pool, &node, &pv);
    env.pvs().delete(&pv, &Default::default()).await.expect("delete PV");
    env.wait_pv_gone(&pv).await;

    env.node_mut(&node).provisioner.restart().expect("restart");
    env.node_mut(&node).provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("ready");
    wait_path_gone(&staged).await;
    wait_trash_empty(&pool).await;
    assert!(!dir.exists(), "not put back: its PV is gone");
    assert_eq!(staging_entries(&pool, &node), Vec::<String>::new(), "nothing left staged");
    assert_eq!(entries(&pool).into_iter().collect::<Vec<_>>(), Vec::<String>::new(), "no staging directory left");
}

/// The safety of deciding on the cached PV rests on the API server refusing (409) the one
/// request made with the resourceVersion of a PV that changed since: the DELETE with
/// preconditions, and the finalizer removal patch that carries the resourceVersion. Pinned here
/// on the real API server, exactly as `reconciling/volumes.rs` sends them.
#[tokio::test(flavor = "multi_thread")]
async fn the_api_server_refuses_a_deletion_decided_on_a_stale_pv() {
    use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
    let env = TestEnv::start("delstale", 0).await;
    let name = format!("{}-stale", env.group);
    let mut pv = fixtures::host_path_volume(&name, &format!("/tmp/{name}"), "1Mi").reclaim_policy("Delete").build();
    pv.metadata.finalizers = Some(vec!["external-provisioner.volume.kubernetes.io/finalizer".into()]);
    let cached = env.pvs().create(&PostParams::default(), &pv).await.expect("create PV");
    // An admin switches it to Retain after the provisioner's cache saw it.
    let retain = serde_json::json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}});
    env.pvs().patch(&name, &PatchParams::default(), &Patch::Merge(&retain)).await.expect("switch to Retain");

    let stale =
        Preconditions { uid: cached.metadata.uid.clone(), resource_version: cached.metadata.resource_version.clone() };
    let refused = env.pvs().delete(&name, &DeleteParams { preconditions: Some(stale), ..Default::default() }).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 409), "{refused:?}");
    let live = env.pvs().get(&name).await.expect("PV still there");
    assert!(live.metadata.deletion_timestamp.is_none(), "not deleted");

    // Deleted by hand meanwhile: our finalizer holds it; removing it with the stale version is
    // refused too, and the PV keeps waiting.
    env.pvs().delete(&name, &DeleteParams::default()).await.expect("delete by hand");
    let drop_protection = serde_json::json!({"metadata": {
        "resourceVersion": cached.metadata.resource_version.clone(),
        "$deleteFromPrimitiveList/finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"],
    }});
    let refused = env.pvs().patch(&name, &PatchParams::default(), &Patch::Strategic(&drop_protection)).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 409), "{refused:?}");
    let held = env.pvs().get(&name).await.expect("PV still held");
    assert!(held.metadata.finalizers.unwrap_or_default().iter().any(|f| f.starts_with("external-provisioner")));

    // With the current version both go through (the provisioner's next event carries it). The PV
    // controller may update the PV's status between the read and the patch: read again then.
    let mut current_version = held.metadata.resource_version;
    for attempt in 0.. {
        let current = serde_json::json!({"metadata": {
            "resourceVersion": current_version,
            "$deleteFromPrimitiveList/finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"],
        }});
        match env.pvs().patch(&name, &PatchParams::default(), &Patch::Strategic(&current)).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 409 && attempt < 10 => {
                current_version = env.pvs().get(&name).await.expect("PV").metadata.resource_version;
            }
            Err(e) => panic!("finalizer removal with the current version: {e}"),
        }
    }
    env.wait_pv_gone(&name).await;
}

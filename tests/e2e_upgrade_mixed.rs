//! End-to-end: the rollout's mixed window with real processes. One node runs the provisioner of
//! a pinned earlier commit (the static binary its image carries, built from git history), the
//! other this checkout's, side by side on the control plane, sharing a `shared` pool while each
//! has its node pool: a burst of node and shared claims, Immediate and WaitForFirstConsumer,
//! made by both. Every claim is bound once, one PV and one directory each. Half are deleted in
//! the mixed window; then the earlier node is upgraded in place (same flags, this checkout's
//! binary) and the rest, volumes the earlier release made included, are reclaimed by this
//! version. Volumes this version then makes on both nodes are reclaimed after the first node is
//! rolled back to the earlier release. Nothing is left at the end, on either node or in the shared pool
//! (tests/mixed_window.rs enumerates the decisions that differ between the two releases; this
//! is its end-to-end case).
//!
//! The earlier binary costs a build of its own (one compile of the top crate in the image
//! build's target dir, whose dependencies the two commits share), so this is not part of `make
//! test`: `make test-upgrade` builds it and runs this with `HPP_EARLIER_PROVISIONER` naming it.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::ListParams;
use testbed::{ProvisionerSpec, fixtures};

fn host_path(pv: &PersistentVolume) -> String {
    pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone()).expect("hostPath")
}

/// The pinned earlier commit HPP_EARLIER_PROVISIONER is built from (its start-up log line says
/// the commit).
const EARLIER_COMMIT: &str = "12b82d297bdf2511c5dcb4140a08407fe805fe2d";

#[tokio::test(flavor = "multi_thread")]
async fn an_earlier_and_a_current_node_side_by_side_serve_each_claim_once_and_leave_nothing() {
    let Some(earlier) = std::env::var_os("HPP_EARLIER_PROVISIONER").map(PathBuf::from) else {
        // Not run by `make test` (see the top of this file), as the kubevirt migration.
        println!("not here: run by `make test-upgrade` (HPP_EARLIER_PROVISIONER; its build is long)");
        return;
    };
    assert!(earlier.is_file(), "HPP_EARLIER_PROVISIONER={}: no such file", earlier.display());
    let mut env = TestEnv::start("upgrade-mixed", 0).await;
    env.own_provisioner();
    let shared = env.cp.temp_dir().join(format!("{}-nfs", env.group));
    std::fs::create_dir_all(&shared).expect("shared pool");
    for (i, binary) in [(1, Some(earlier.clone())), (2, None)] {
        let pool = format!("nfs={},shared", shared.display());
        env.add_node(&format!("{}-{i}", env.group), &move |spec: ProvisionerSpec| {
            let spec = spec.arg("--pool").arg(pool.clone());
            match &binary {
                Some(binary) => ProvisionerSpec { binary: binary.clone(), ..spec },
                None => spec,
            }
        })
        .await;
    }
    let started = std::fs::read_to_string(env.nodes[0].provisioner.log_path()).expect("the earlier node's log");
    assert!(started.contains(EARLIER_COMMIT), "the first node runs the earlier commit's binary:\n{started}");
    // Each node's view of the live nodes includes the other (a view is reused for a quarter of
    // the lease duration).
    tokio::time::sleep(std::time::Duration::from_secs(u64::from(LEASE_SECONDS) / 4 + 1)).await;
    let node_class = env.class("node", |c| c).await;
    let shared_wffc =
        env.class("shared-wffc", |c| c.parameter("storagePool", "nfs").parameter("topology", "shared")).await;
    let shared_immediate = env
        .class("shared-imm", |c| c.immediate().parameter("storagePool", "nfs").parameter("topology", "shared"))
        .await;

    let mut claims: Vec<PersistentVolumeClaim> = Vec::new();
    let mut with_pods = Vec::new();
    for i in 0..8 {
        for (prefix, class) in [("n", &node_class), ("s", &shared_wffc)] {
            let name = format!("{prefix}{i}");
            claims.push(env.create_claim(fixtures::claim(&env.ns, &name, class, "1Mi")).await);
            env.create_pod(&name, &name).await;
            with_pods.push(name);
        }
        let name = format!("i{i}");
        claims.push(env.create_claim(fixtures::claim(&env.ns, &name, &shared_immediate, "1Mi")).await);
    }
    for claim in &claims {
        env.wait_bound(claim.metadata.name.as_deref().expect("name")).await;
    }
    let pvs: Vec<PersistentVolume> = env
        .pvs()
        .list(&ListParams::default())
        .await
        .expect("list PVs")
        .items
        .into_iter()
        .filter(|pv| {
            pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.namespace.as_deref())
                == Some(env.ns.as_str())
        })
        .collect();
    assert_eq!(pvs.len(), claims.len(), "one PV per claim");
    let bound_to: BTreeSet<String> =
        pvs.iter().filter_map(|pv| pv.spec.as_ref()?.claim_ref.as_ref()?.uid.clone()).collect();
    assert_eq!(bound_to, claims.iter().map(uid).collect(), "no claim bound twice, none left out");
    // One directory per claim, where its shape puts it, and on no other node.
    let shared_dirs = entries(&shared);
    let expected_shared: BTreeSet<String> = claims
        .iter()
        .filter(|c| !c.metadata.name.as_deref().unwrap_or_default().starts_with('n'))
        .map(|c| format!("pvc-{}", uid(c)))
        .collect();
    assert_eq!(shared_dirs, expected_shared, "exactly one shared directory per shared claim");
    let mut node_dirs = BTreeSet::new();
    for node in &env.nodes {
        for dir in entries(&node.pool_root).into_iter().filter(|d| d.starts_with("pvc-")) {
            assert!(node_dirs.insert(dir.clone()), "{dir} on two nodes");
        }
    }
    let expected_node: BTreeSet<String> = claims
        .iter()
        .filter(|c| c.metadata.name.as_deref().unwrap_or_default().starts_with('n'))
        .map(|c| format!("pvc-{}", uid(c)))
        .collect();
    assert_eq!(node_dirs, expected_node, "exactly one node directory per node claim");
    for pv in &pvs {
        let path = host_path(pv);
        assert!(Path::new(&path).is_dir(), "{path} exists");
    }
    // Both releases made volumes: the window was mixed.
    let mut makers = BTreeSet::new();
    for claim in &claims {
        let reported = env.events_for(&env.ns, &uid(claim)).await;
        makers.extend(
            reported
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("ProvisioningSucceeded"))
                .filter_map(|e| e.reporting_instance),
        );
    }
    assert_eq!(makers.len(), 2, "both nodes provisioned: {makers:?}");

    // Deletions in the mixed window: the first half of the claims, each reclaimed once.
    let (first_half, second_half) = claims.split_at(claims.len() / 2);
    delete(&env, first_half, &pvs, &with_pods).await;

    // The earlier node upgraded in place: the volumes it made are reclaimed by this version.
    let node1 = env.nodes[0].name.clone();
    env.node_mut(&node1).provisioner.restart_as(&binary()).expect("upgrade the first node");
    env.node_mut(&node1).provisioner.wait_ready(TIMEOUT).await.expect("ready after the upgrade");
    delete(&env, second_half, &pvs, &with_pods).await;

    // Volumes made by this version, on both nodes, then the first node rolled back to the
    // earlier release: it reclaims them as its own (same PV shape and layout).
    let mut made_after = Vec::new();
    for i in 0..4 {
        for (prefix, class) in [("after-n", &node_class), ("after-s", &shared_wffc)] {
            let name = format!("{prefix}{i}");
            made_after.push(env.create_claim(fixtures::claim(&env.ns, &name, class, "1Mi")).await);
            env.create_pod(&name, &name).await;
        }
    }
    let mut after_pvs = Vec::new();
    for claim in &made_after {
        after_pvs.push(env.wait_bound(claim.metadata.name.as_deref().expect("name")).await);
    }
    env.node_mut(&node1).provisioner.restart_as(&earlier).expect("roll the first node back");
    env.node_mut(&node1).provisioner.wait_ready(TIMEOUT).await.expect("ready after the rollback");
    let after_pods: Vec<String> = made_after.iter().filter_map(|c| c.metadata.name.clone()).collect();
    delete(&env, &made_after, &after_pvs, &after_pods).await;
    wait_trash_empty(&shared).await;
    assert!(entries(&shared).is_empty(), "nothing left in the shared pool: {:?}", entries(&shared));
    for node in &env.nodes {
        wait_trash_empty(&node.pool_root).await;
        let left: BTreeSet<String> = entries(&node.pool_root).into_iter().filter(|d| d.starts_with("pvc-")).collect();
        assert!(left.is_empty(), "nothing left on {}: {left:?}", node.name);
    }
}

/// Deletes `claims` (their pods first) and waits until their PVs are gone.
async fn delete(env: &TestEnv, claims: &[PersistentVolumeClaim], pvs: &[PersistentVolume], with_pods: &[String]) {
    for claim in claims {
        let name = claim.metadata.name.as_deref().expect("name");
        if with_pods.iter().any(|p| p == name) {
            env.delete_pod(name).await;
        }
        env.delete_claim(name).await;
    }
    for claim in claims {
        let uid = uid(claim);
        let pv = pvs
            .iter()
            .find(|pv| pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.uid.as_deref()) == Some(&uid))
            .and_then(|pv| pv.metadata.name.as_deref())
            .expect("the claim's PV");
        env.wait_pv_gone(pv).await;
    }
}

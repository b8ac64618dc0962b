//! End-to-end: nodes that disagree about who is alive all act on the same shared volumes at
//! once, and nothing is lost, orphaned or duplicated (docs/architecture.md, deletion protocol;
//! the exhaustive model of the same steps is `deciding::deletion::model`).
//!
//! Each node keeps its liveness in a namespace of its own, so each one sees only itself alive
//! and acts on every shared claim and PV: the worst disagreement there is.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use common::*;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use kube::api::{ListParams, PostParams};
use testbed::{ProvisionerSpec, fixtures};

fn shared_pool(env: &TestEnv) -> PathBuf {
    let dir = env.cp.temp_dir().join(format!("{}-nfs", env.group));
    std::fs::create_dir_all(&dir).expect("mkdir shared pool");
    dir
}

/// Volume directories at their place (not the provisioner's own dot directories).
fn volumes_in(pool: &Path) -> BTreeSet<String> {
    entries(pool).into_iter().filter(|e| e.starts_with("pvc-")).collect()
}

async fn pvs_of(env: &TestEnv) -> Vec<PersistentVolume> {
    env.pvs()
        .list(&ListParams::default())
        .await
        .expect("list PVs")
        .items
        .into_iter()
        .filter(|pv| {
            pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.namespace.as_deref())
                == Some(env.ns.as_str())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn three_nodes_that_each_believe_they_are_alone_make_and_remove_shared_volumes_once() {
    let mut env = TestEnv::start("disagree", 0).await;
    env.own_provisioner();
    let pool = shared_pool(&env);
    for i in 1..=3 {
        // Each node's liveness in a namespace of its own: it sees no other node alive.
        let lease_ns = format!("{}-lease-{i}", env.group);
        kube::Api::<Namespace>::all(env.client.clone())
            .create(&PostParams::default(), &fixtures::namespace(&lease_ns))
            .await
            .expect("create lease namespace");
        let arg = format!("nfs={},shared", pool.display());
        env.add_node(&format!("{}-{i}", env.group), &move |spec: ProvisionerSpec| {
            spec.arg("--pool").arg(arg.clone()).arg("--namespace").arg(lease_ns.clone())
        })
        .await;
    }
    let class =
        env.class("imm", |c| c.immediate().parameter("storagePool", "nfs").parameter("topology", "shared")).await;

    for round in 0..3 {
        let mut claims: Vec<PersistentVolumeClaim> = Vec::new();
        for i in 0..15 {
            let claim =
                fixtures::claim(&env.ns, &format!("r{round}-c{i}"), &class, "1Mi").access_modes(&["ReadWriteMany"]);
            claims.push(env.create_claim(claim).await);
        }
        for claim in &claims {
            env.wait_bound(claim.metadata.name.as_deref().unwrap()).await;
        }
        // Every node made each volume (all believe they act): still one PV and one directory.
        let uids: BTreeSet<String> = claims.iter().map(uid).collect();
        let pvs = pvs_of(&env).await;
        assert_eq!(pvs.len(), claims.len(), "round {round}: one PV per claim");
        let expected: BTreeSet<String> = uids.iter().map(|u| format!("pvc-{u}")).collect();
        assert_eq!(volumes_in(&pool), expected, "round {round}: one directory per claim");
        for dir in &expected {
            std::fs::write(pool.join(dir).join("data"), dir.as_bytes()).expect("write data");
        }
        // A node restarts in the middle of the deletions of the second round.
        for (i, claim) in claims.iter().enumerate() {
            env.delete_claim(claim.metadata.name.as_deref().unwrap()).await;
            if round == 1 && i == 7 {
                let node = env.nodes[1].name.clone();
                env.node_mut(&node).provisioner.restart().expect("restart");
            }
        }
        for pv in &pvs {
            env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
        }
        // Every node deleted each volume at once: no directory is left behind, at its place or
        // staged, and every one went through the trash.
        testbed::wait_for("no volume directory left", TIMEOUT, || async {
            let left = volumes_in(&pool);
            let staged = entries(&pool.join(".hpp-deleting"));
            anyhow::Ok((left.is_empty() && staged.is_empty()).then_some(()))
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e:#}: left {:?}, staged {:?}\n{}",
                volumes_in(&pool),
                entries(&pool.join(".hpp-deleting")),
                env.log_tails()
            )
        });
        wait_trash_empty(&pool).await;
    }
}

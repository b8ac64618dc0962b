//! End-to-end: volumes of removed nodes. A node is removed from the cluster (its provisioner
//! stopped, its Node object deleted).
//! - `--reap-volumes-of-removed-nodes`: while claims of its volumes are deleted, past the grace
//!   period the remaining node deletes the Released PVs of reclaim policy Delete, with an event
//!   naming the node, keeps those of Retain, and touches no data.
//! - `--release-claims-of-removed-nodes`: its claims stay bound; past the grace period the
//!   remaining node sets each PV to Retain and deletes the claim, with an event naming the node
//!   on both; the node, back under its name, keeps its directories.
//! - Under the RBAC of deploy/legacy alone, releasing is refused and reported; with the kustomize
//!   component `release-claims-of-removed-nodes` (docs/install.md) it goes through.

mod common;

use common::*;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
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

/// The namespace and ServiceAccount of deploy/legacy.
const DEPLOY_NAMESPACE: &str = "kubevirt-hostpath-provisioner";
const DEPLOY_SERVICE_ACCOUNT: &str = "kubevirt-hostpath-provisioner-admin";

/// `kubectl apply -k` of a user's kustomization (docs/install.md, "Optional features: kustomize
/// components"): deploy/legacy, its settings, and `components` of deploy/components.
fn apply_user_kustomization(env: &TestEnv, components: &[&str]) {
    let dir = tempfile::tempdir().expect("temp dir");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    std::os::unix::fs::symlink(repo.join("deploy"), dir.path().join("deploy")).expect("link deploy");
    let user = dir.path().join("user");
    std::fs::create_dir(&user).expect("mkdir");
    let mut kustomization = "resources:\n  - ../deploy/legacy\n  - settings.yaml\n".to_owned();
    if !components.is_empty() {
        kustomization.push_str("components:\n");
        kustomization.extend(components.iter().map(|c| format!("  - ../deploy/components/{c}\n")));
    }
    std::fs::write(user.join("kustomization.yaml"), kustomization).expect("write");
    let settings = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hostpath-provisioner-settings\n  \
                    annotations: {config.kubernetes.io/local-config: \"true\"}\ndata:\n  \
                    RELEASE_CLAIMS_OF_REMOVED_NODES: 24h\n";
    std::fs::write(user.join("settings.yaml"), settings).expect("write");
    env.cp.run_kubectl(dir.path(), &["apply", "-k", "user"]).unwrap_or_else(|e| panic!("{e:#}"));
}

/// A kubeconfig with a token of deploy/legacy's ServiceAccount, as the kubelet would mount it.
async fn deploy_service_account_kubeconfig(env: &TestEnv) -> std::path::PathBuf {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(env.client.clone(), DEPLOY_NAMESPACE)
        .create_token_request(DEPLOY_SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .and_then(|s| s.token)
        .expect("a TokenRequest answer carries the token");
    let kubeconfig = env.cp.temp_dir().join(format!("{}-sa.kubeconfig", env.group));
    env.cp.write_kubeconfig_for_token(&token, &kubeconfig).expect("kubeconfig");
    kubeconfig
}

#[tokio::test(flavor = "multi_thread")]
async fn releasing_claims_is_refused_under_deploy_legacy_and_done_with_its_kustomize_component() {
    let mut env = TestEnv::start("component", 0).await;
    env.own_provisioner();
    apply_user_kustomization(&env, &[]);
    let kubeconfig = deploy_service_account_kubeconfig(&env).await;
    for i in 1..=2 {
        let name = format!("{}-{i}", env.group);
        let kubeconfig = kubeconfig.clone();
        env.add_node(&name, &move |mut spec| {
            spec.kubeconfig = kubeconfig.clone();
            // deploy/legacy's Role keeps the liveness leases in its own namespace.
            spec.env("POD_NAMESPACE", DEPLOY_NAMESPACE).env("RELEASE_CLAIMS_OF_REMOVED_NODES", "3s")
        })
        .await;
    }
    let removed = env.nodes[1].name.clone();
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&removed)).await;
    let pv = env.wait_bound("data").await;
    let (pv_name, pv_uid) = (pv.metadata.name.clone().unwrap(), pv.metadata.uid.clone().unwrap());
    env.node_mut(&removed).provisioner.terminate();
    Api::<Node>::all(env.client.clone()).delete(&removed, &DeleteParams::default()).await.expect("delete Node");

    // deploy/legacy alone: the PV is kept, the claim stays, and the warning names the rule.
    let note = env.wait_event("default", &pv_uid, "RemovedNodeClaimNotReleased").await;
    assert!(note.contains("forbidden") && note.contains("`delete` on persistentvolumeclaims"), "{note}");
    assert!(env.claims().get_opt("data").await.expect("get claim").is_some(), "the claim stays without the right");

    // With the component, the next pass releases it.
    apply_user_kustomization(&env, &["release-claims-of-removed-nodes"]);
    testbed::wait_for("the claim released", TIMEOUT, || async {
        anyhow::Ok(env.claims().get_opt("data").await?.is_none().then_some(()))
    })
    .await
    .expect("the claim of the removed node's volume is deleted under the component's rule");
    let kept = env.pvs().get(&pv_name).await.expect("the PV stays");
    assert_eq!(kept.spec.and_then(|s| s.persistent_volume_reclaim_policy).as_deref(), Some("Retain"));
}

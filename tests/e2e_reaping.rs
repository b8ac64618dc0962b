//! End-to-end: volumes of removed nodes. A node is removed from the cluster (its provisioner
//! stopped, its Node object deleted).
//! - `--reap-volumes-of-removed-nodes`: while claims of its volumes are deleted, past the grace
//!   period the remaining node deletes the Released PVs of reclaim policy Delete, with an event
//!   naming the node, keeps those of Retain, and touches no data.
//! - The claim releaser (`hostpath-provisioner release-claims-of-removed-nodes`, under the
//!   ServiceAccount the kustomize component `release-claims-of-removed-nodes` makes): its claims
//!   stay bound; past the grace period each PV is set to Retain and the claim deleted, with an
//!   event naming the node on both; the node, back under its name, keeps its directories.
//! - No node pod may delete claims, with the component or without: a node whose DaemonSet still
//!   sets `RELEASE_CLAIMS_OF_REMOVED_NODES` ignores it, says so (Event on its Node, metric) and
//!   keeps provisioning.

mod common;

use common::*;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
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

/// The namespace and ServiceAccounts of deploy/legacy and of the component.
const DEPLOY_NAMESPACE: &str = "kubevirt-hostpath-provisioner";
const DEPLOY_SERVICE_ACCOUNT: &str = "kubevirt-hostpath-provisioner-admin";
const RELEASER_SERVICE_ACCOUNT: &str = "kubevirt-hostpath-provisioner-claim-releaser";

/// `kubectl apply -k` of a user's kustomization (docs/install.md, "Optional features: kustomize
/// components"): deploy/legacy, its settings, and `components` of deploy/components.
///
/// The tests of this file share the control plane and run at once: two first applies of the
/// same objects race (the loser's create fails with AlreadyExists), so they take turns.
fn apply_user_kustomization(env: &TestEnv, components: &[&str]) {
    static ONE_APPLY_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_APPLY_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
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

/// A kubeconfig with a token of `account` (in deploy/legacy's namespace), as the kubelet would
/// mount it: exactly that ServiceAccount's rights.
async fn service_account_kubeconfig(env: &TestEnv, account: &str) -> std::path::PathBuf {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(env.client.clone(), DEPLOY_NAMESPACE)
        .create_token_request(account, &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .and_then(|s| s.token)
        .expect("a TokenRequest answer carries the token");
    let kubeconfig = env.cp.temp_dir().join(format!("{}-{account}.kubeconfig", env.group));
    env.cp.write_kubeconfig_for_token(&token, &kubeconfig).expect("kubeconfig");
    kubeconfig
}

/// Whether the API server lets ServiceAccount `account` of `namespace` delete claims (in any
/// namespace), as its authorizer answers for that identity.
async fn may_delete_claims(env: &TestEnv, namespace: &str, account: &str) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(format!("system:serviceaccount:{namespace}:{account}")),
            groups: Some(vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{namespace}")]),
            resource_attributes: Some(ResourceAttributes {
                verb: Some("delete".into()),
                resource: Some("persistentvolumeclaims".into()),
                namespace: Some(env.ns.clone()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(env.client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview");
    answer.status.is_some_and(|s| s.allowed)
}

/// `hostpath-provisioner release-claims-of-removed-nodes`, run as its Deployment's pod would be:
/// with a token of the component's ServiceAccount, serving its probes and metrics on a port of
/// its own. Stopped when dropped.
struct Releaser {
    child: std::process::Child,
    log: std::path::PathBuf,
    addr: std::net::SocketAddr,
}

impl Releaser {
    async fn start(env: &TestEnv, after: &str) -> Releaser {
        Releaser::start_as(env, after, RELEASER_SERVICE_ACCOUNT).await
    }

    /// The releaser under ServiceAccount `account` of deploy/legacy's namespace.
    async fn start_as(env: &TestEnv, after: &str, account: &str) -> Releaser {
        let kubeconfig = service_account_kubeconfig(env, account).await;
        let log =
            std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-releaser-{account}.log", env.group));
        let file = std::fs::File::create(&log).expect("releaser log");
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], testbed::free_port().expect("a free port")));
        let child = std::process::Command::new(binary())
            .args(["release-claims-of-removed-nodes", "--after", after, "--kubeconfig"])
            .arg(&kubeconfig)
            .arg("--listen")
            .arg(addr.to_string())
            .env("PROVISIONER_NAME", &env.provisioner)
            .env("POD_NAME", format!("{}-releaser", env.group))
            .env("RUST_LOG", "info,hostpath_provisioner=debug")
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start the releaser");
        Releaser { child, log, addr }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until GET `path` answers `status` with a body `accept` returns something for.
    async fn wait_answer<T>(&self, path: &str, status: u16, accept: impl Fn(&str) -> Option<T>) -> T {
        testbed::wait_for(&format!("the releaser's {path} answering {status}"), TIMEOUT, || async {
            let (code, body) = testbed::http_get(self.addr, path).await?;
            anyhow::Ok(if code == status { accept(&body) } else { None })
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", self.log()))
    }
}

/// The value of `series` (a name with its labels, if any) in a `/metrics` text.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

impl Drop for Releaser {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two nodes under deploy/legacy's ServiceAccount (its rights alone), each adjusted by `adjust`.
async fn two_nodes_under_deploy_legacy(test: &str, variable: Option<&'static str>) -> TestEnv {
    let mut env = TestEnv::start(test, 0).await;
    env.own_provisioner();
    apply_user_kustomization(&env, &["release-claims-of-removed-nodes"]);
    let kubeconfig = service_account_kubeconfig(&env, DEPLOY_SERVICE_ACCOUNT).await;
    for i in 1..=2 {
        let name = format!("{}-{i}", env.group);
        let kubeconfig = kubeconfig.clone();
        env.add_node(&name, &move |mut spec| {
            spec.kubeconfig = kubeconfig.clone();
            // deploy/legacy's Role keeps the liveness leases in its own namespace.
            let spec = spec.env("POD_NAMESPACE", DEPLOY_NAMESPACE);
            match variable {
                Some(value) => spec.env("RELEASE_CLAIMS_OF_REMOVED_NODES", value),
                None => spec,
            }
        })
        .await;
    }
    env
}

#[tokio::test(flavor = "multi_thread")]
async fn the_claim_releaser_releases_the_bound_claims_of_a_removed_node_keeps_their_volumes_and_a_returning_node_keeps_its_data()
 {
    let mut env = two_nodes_under_deploy_legacy("release", None).await;
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

    // Only the releaser's identity may delete claims.
    assert!(!may_delete_claims(&env, DEPLOY_NAMESPACE, DEPLOY_SERVICE_ACCOUNT).await, "the node pods may not");
    assert!(may_delete_claims(&env, DEPLOY_NAMESPACE, RELEASER_SERVICE_ACCOUNT).await, "the releaser may");

    // The node leaves the cluster: its provisioner stops, its Node object is deleted. The claim
    // stays bound to a volume no pod can reach any more.
    env.node_mut(&removed).provisioner.terminate();
    Api::<Node>::all(env.client.clone()).delete(&removed, &DeleteParams::default()).await.expect("delete Node");

    // Run under the node pods' ServiceAccount, the releaser cannot delete the claim: it is
    // alive (/healthz), not ready, /readyz says the last error, and /metrics counts it.
    let refused = Releaser::start_as(&env, "3s", DEPLOY_SERVICE_ACCOUNT).await;
    refused.wait_answer("/healthz", 200, |body| (body == "ok\n").then_some(())).await;
    let why = refused
        .wait_answer("/readyz", 503, |body| body.contains("the last pass failed").then(|| body.to_owned()))
        .await;
    assert!(why.contains("forbidden"), "says why: {why}");
    let metrics = refused.wait_answer("/metrics", 200, |body| Some(body.to_owned())).await;
    assert!(sample(&metrics, "hostpath_provisioner_claim_release_failed_passes_total") >= Some(1.0), "{metrics}");
    assert!(
        sample(&metrics, "hostpath_provisioner_claim_release_last_error_timestamp_seconds") > Some(1e9),
        "{metrics}"
    );
    assert_eq!(sample(&metrics, "hostpath_provisioner_claims_released_total"), Some(0.0), "{metrics}");
    assert_eq!(sample(&metrics, "hostpath_provisioner_ready"), Some(0.0), "{metrics}");
    assert!(env.claims().get_opt("data").await.unwrap().is_some(), "the node pods' account deletes no claim");
    drop(refused);

    let releaser = Releaser::start(&env, "3s").await;
    testbed::wait_for("the claim released", TIMEOUT, || async {
        anyhow::Ok(env.claims().get_opt("data").await?.is_none().then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("the claim of the removed node's volume is deleted: {e:#}\n{}", releaser.log()));
    // Its metrics count the claim released; its passes succeed, so it is ready.
    let metrics = releaser
        .wait_answer("/metrics", 200, |body| {
            (sample(body, "hostpath_provisioner_claims_released_total") == Some(1.0)).then(|| body.to_owned())
        })
        .await;
    assert_eq!(sample(&metrics, "hostpath_provisioner_claim_release_failed_passes_total"), Some(0.0), "{metrics}");
    assert_eq!(sample(&metrics, "hostpath_provisioner_claim_release_last_error_timestamp_seconds"), Some(0.0));
    assert!(metrics.contains("hostpath_provisioner_build_info{") && metrics.contains("process_cpu_seconds_total"));
    releaser.wait_answer("/readyz", 200, |body| (body == "ok\n").then_some(())).await;
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
            "names the node, the setting and the PV: {note}"
        );
    }

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

/// An install from before: the DaemonSet still sets the variable. The node pods ignore it, say so
/// on their Node, in a metric and in `doctor`, keep provisioning, and release nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_pod_still_given_the_setting_ignores_it_says_so_and_keeps_provisioning() {
    let mut env = two_nodes_under_deploy_legacy("ignored", Some("3s")).await;
    let (live, removed) = (env.nodes[0].name.clone(), env.nodes[1].name.clone());
    let node_uid = Api::<Node>::all(env.client.clone()).get(&live).await.expect("Node").metadata.uid.unwrap();
    let note = env.wait_event("default", &node_uid, "ReleaseClaimsSettingIgnored").await;
    assert!(note.contains("RELEASE_CLAIMS_OF_REMOVED_NODES=3s") && note.contains("ignored"), "{note}");
    let metrics = env.nodes[0].provisioner.metrics().await.expect("metrics");
    assert!(
        metrics.lines().any(|l| l.starts_with("hostpath_provisioner_release_claims_setting_ignored 1")),
        "{metrics}"
    );
    let doctor = std::process::Command::new(binary())
        .args(["doctor", "--node-name", &live, "--pv-dir", "/nonexistent-pool", "--kubeconfig", "/nonexistent"])
        .env_clear()
        .env("RELEASE_CLAIMS_OF_REMOVED_NODES", "3s")
        .output()
        .expect("doctor");
    let said = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        said.contains("release_claims_setting_ignored") && said.contains("RELEASE_CLAIMS_OF_REMOVED_NODES=3s"),
        "{said}"
    );

    // Provisioning goes on, and the claim of a removed node's volume stays: no node pod deletes
    // claims (nor may it).
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&removed)).await;
    let pv = env.wait_bound("data").await;
    env.node_mut(&removed).provisioner.terminate();
    Api::<Node>::all(env.client.clone()).delete(&removed, &DeleteParams::default()).await.expect("delete Node");
    env.create_claim(fixtures::claim(&env.ns, "fresh", &class, "1Mi").provision_on_node(&live)).await;
    env.wait_bound("fresh").await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let still = env.claims().get("data").await.expect("the claim stays");
    assert_eq!(still.spec.and_then(|s| s.volume_name), pv.metadata.name);
    let kept = env.pvs().get(pv.metadata.name.as_deref().unwrap()).await.expect("the PV stays");
    assert_eq!(kept.spec.and_then(|s| s.persistent_volume_reclaim_policy).as_deref(), Some("Delete"), "untouched");
    assert!(!may_delete_claims(&env, DEPLOY_NAMESPACE, DEPLOY_SERVICE_ACCOUNT).await);
}

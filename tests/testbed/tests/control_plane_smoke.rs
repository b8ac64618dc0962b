//! The harness against the real binaries: the WaitForFirstConsumer protocol end to end with the
//! test itself playing an external provisioner, ServiceAccount tokens and RBAC, and an API
//! server outage and restart.

use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use testbed::fixtures::{self, annotations};
use testbed::{ControlPlane, Result, shared_control_plane, unique_name, wait_for, wait_until};

const FAKE_PROVISIONER: &str = "example.com/fake";
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

fn phase_of_claim(claim: &PersistentVolumeClaim) -> Option<&str> {
    claim.status.as_ref()?.phase.as_deref()
}

fn phase_of_volume(volume: &PersistentVolume) -> Option<&str> {
    volume.status.as_ref()?.phase.as_deref()
}

#[tokio::test]
async fn wffc_claim_goes_through_scheduler_binder_and_release() -> Result<()> {
    let cp = shared_control_plane().await?;
    let logs = cp.logs_on_failure();
    let client = cp.admin_client();

    // Our own nodes, under a group label our pod selects, so other tests' nodes stay out of it.
    // Hostname labels differ from node names on purpose: PV affinity must use the label.
    let group = unique_name("smoke");
    let node_names = [format!("{group}-a"), format!("{group}-b")];
    for name in &node_names {
        let hostname = format!("host-{name}");
        cp.add_node_labeled(name, &hostname, &[("testbed/group", &group)]).await?;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for name in &node_names {
        let node = nodes.get(name).await?;
        let allocatable = node.status.and_then(|s| s.allocatable).expect("node status kept");
        assert_eq!(allocatable["pods"].0, "110", "node {name} allocatable");
    }

    let namespace = group.clone();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace(&namespace)).await?;
    let class = unique_name("fake-wffc");
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &fixtures::storage_class(&class, FAKE_PROVISIONER).build())
        .await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    claims.create(&PostParams::default(), &fixtures::claim(&namespace, "data", &class, "1Gi").build()).await?;

    // Without a consumer, WaitForFirstConsumer keeps the claim unassigned.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = claims.get("data").await?;
    assert_eq!(phase_of_claim(&waiting), Some("Pending"));
    assert_eq!(annotation(&waiting.metadata, annotations::SELECTED_NODE), None);

    pods.create(
        &PostParams::default(),
        &fixtures::pod_using_claim(&namespace, "app", "data").node_selector("testbed/group", &group).build(),
    )
    .await?;

    let flow_started = Instant::now();
    let claim = wait_until(
        "scheduler to select a node and the PV controller to hand the claim to our provisioner",
        STEP_TIMEOUT,
        || claims.get("data"),
        |claim| {
            annotation(&claim.metadata, annotations::SELECTED_NODE).is_some()
                && annotation(&claim.metadata, annotations::STORAGE_PROVISIONER).is_some()
        },
    )
    .await?;
    let selected = annotation(&claim.metadata, annotations::SELECTED_NODE).expect("checked above").to_string();
    assert!(node_names.contains(&selected), "selected node {selected} is not one of ours: {node_names:?}");
    assert_eq!(annotation(&claim.metadata, annotations::STORAGE_PROVISIONER), Some(FAKE_PROVISIONER));
    assert_eq!(annotation(&claim.metadata, annotations::BETA_STORAGE_PROVISIONER), Some(FAKE_PROVISIONER));
    assert!(
        claim.metadata.finalizers.iter().flatten().any(|f| f == "kubernetes.io/pvc-protection"),
        "admission adds the claim protection finalizer"
    );

    // Play the external provisioner on the selected node.
    let uid = claim.metadata.uid.clone().expect("claim from the API has a uid");
    let selected_hostname = format!("host-{selected}");
    let volume_name = format!("pvc-{uid}");
    volumes
        .create(
            &PostParams::default(),
            &fixtures::host_path_volume(&volume_name, &format!("/nonexistent/{volume_name}"), "1Gi")
                .bound_to(&claim)
                .on_hostname(&selected_hostname)
                .provisioned_by(FAKE_PROVISIONER)
                .build(),
        )
        .await?;

    let bound = wait_until(
        "the binder to bind the claim to our PV",
        STEP_TIMEOUT,
        || claims.get("data"),
        |claim| phase_of_claim(claim) == Some("Bound"),
    )
    .await?;
    assert_eq!(bound.spec.as_ref().and_then(|s| s.volume_name.as_deref()), Some(volume_name.as_str()));
    assert_eq!(annotation(&bound.metadata, annotations::BIND_COMPLETED), Some("yes"));
    let pod = wait_until(
        "the scheduler to bind the pod",
        STEP_TIMEOUT,
        || pods.get("app"),
        |pod| pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some(),
    )
    .await?;
    assert_eq!(
        pod.spec.and_then(|s| s.node_name).as_deref(),
        Some(selected.as_str()),
        "the pod runs where its volume is"
    );
    eprintln!("pod scheduled and claim bound {:.1?} after the pod was created", flow_started.elapsed());

    // Release: the pod goes first (no kubelet, so delete it at once), then the claim; the claim
    // protection controller lets the claim go once no pod uses it.
    pods.delete("app", &DeleteParams::default().grace_period(0)).await?;
    claims.delete("data", &DeleteParams::default()).await?;
    wait_for("the claim to be gone", STEP_TIMEOUT, || async {
        Ok::<_, kube::Error>(claims.get_opt("data").await?.is_none().then_some(()))
    })
    .await?;
    let released = wait_until(
        "the PV to be Released",
        STEP_TIMEOUT,
        || volumes.get(&volume_name),
        |pv| phase_of_volume(pv) == Some("Released"),
    )
    .await?;
    assert_eq!(annotation(&released.metadata, annotations::PROVISIONED_BY), Some(FAKE_PROVISIONER));

    // The external provisioner's deletion; the PV protection controller lets it go.
    volumes.delete(&volume_name, &DeleteParams::default()).await?;
    wait_for("the PV to be gone", STEP_TIMEOUT, || async {
        Ok::<_, kube::Error>(volumes.get_opt(&volume_name).await?.is_none().then_some(()))
    })
    .await?;
    logs.passed();
    Ok(())
}

#[tokio::test]
async fn service_account_token_authenticates_and_rbac_restricts_it() -> Result<()> {
    let cp = shared_control_plane().await?;
    let logs = cp.logs_on_failure();
    let client = cp.admin_client();
    let namespace = unique_name("token");
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace(&namespace)).await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &namespace);
    let account = ServiceAccount {
        metadata: ObjectMeta { name: Some("provisioner".into()), ..ObjectMeta::default() },
        ..ServiceAccount::default()
    };
    accounts.create(&PostParams::default(), &account).await?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..TokenRequestSpec::default() }),
        ..TokenRequest::default()
    };
    let token = accounts
        .create_token_request("provisioner", &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .expect("a TokenRequest answer carries the token");

    // Exercise the kubeconfig file a provisioner process would get.
    let kubeconfig_path = cp.temp_dir().join(format!("{namespace}.kubeconfig"));
    cp.write_kubeconfig_for_token(&token, &kubeconfig_path)?;
    let config =
        kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(&kubeconfig_path)?, &KubeConfigOptions::default())
            .await?;
    let as_account = kube::Client::try_from(config)?;

    let review = Api::<SelfSubjectReview>::all(as_account.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let user = review.status.and_then(|s| s.user_info).expect("a SelfSubjectReview answer names the user");
    assert_eq!(user.username.as_deref(), Some(format!("system:serviceaccount:{namespace}:provisioner").as_str()));

    let nodes_as_account: Api<Node> = Api::all(as_account);
    match nodes_as_account.list(&Default::default()).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("listing nodes without RBAC must be forbidden, got {other:?}"),
    }

    // Positive control: the same token lists nodes once RBAC allows it.
    let role_name = format!("{namespace}-node-reader");
    Api::<ClusterRole>::all(client.clone())
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: ObjectMeta { name: Some(role_name.clone()), ..ObjectMeta::default() },
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["nodes".into()]),
                    verbs: vec!["list".into()],
                    ..PolicyRule::default()
                }]),
                ..ClusterRole::default()
            },
        )
        .await?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: ObjectMeta { name: Some(role_name.clone()), ..ObjectMeta::default() },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: role_name.clone(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "provisioner".into(),
                    namespace: Some(namespace.clone()),
                    ..Subject::default()
                }]),
            },
        )
        .await?;
    wait_for("RBAC to allow the token to list nodes", STEP_TIMEOUT, || async {
        Ok::<_, kube::Error>(nodes_as_account.list(&Default::default()).await.ok())
    })
    .await?;
    logs.passed();
    Ok(())
}

#[tokio::test]
async fn own_control_plane_survives_an_apiserver_restart_and_cleans_up() -> Result<()> {
    let mut cp = ControlPlane::start().await?;
    eprintln!("own control plane started in {:.1?}", cp.started_in());
    let logs = cp.logs_on_failure();
    let namespace = unique_name("outage");
    Api::<Namespace>::all(cp.admin_client()).create(&PostParams::default(), &fixtures::namespace(&namespace)).await?;

    cp.stop_apiserver();
    let namespaces: Api<Namespace> = Api::all(cp.admin_client());
    assert!(namespaces.get(&namespace).await.is_err(), "the API must be unreachable while kube-apiserver is stopped");
    let restarted = Instant::now();
    cp.start_apiserver().await?;
    eprintln!("kube-apiserver restarted in {:.1?}", restarted.elapsed());
    let namespaces: Api<Namespace> = Api::all(cp.admin_client());
    assert!(namespaces.get_opt(&namespace).await?.is_some(), "objects survive the restart (same etcd)");

    // etcd down and back: the API server reconnects and writes work again.
    cp.stop_etcd();
    cp.start_etcd().await?;
    let after_etcd_restart = unique_name("after-etcd");
    wait_for("a write after the etcd restart", STEP_TIMEOUT, || async {
        Ok::<_, kube::Error>(
            namespaces.create(&PostParams::default(), &fixtures::namespace(&after_etcd_restart)).await.ok(),
        )
    })
    .await?;

    let pids: Vec<u32> = cp.pids().into_iter().map(|(_, pid)| pid).collect();
    assert_eq!(pids.len(), 4, "all four components run");
    let dir = cp.temp_dir().to_path_buf();
    logs.passed();
    drop(cp);
    for pid in pids {
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        assert!(!alive, "pid {pid} still exists after drop");
    }
    if std::env::var_os("TESTBED_KEEP_TEMP").is_none() {
        assert!(!dir.exists(), "{} removed after drop", dir.display());
    }
    Ok(())
}

//! End-to-end: the manifests in deploy/ render and pass server-side dry-run, and the provisioner
//! does its whole job under exactly the RBAC of deploy/legacy, which denies everything else.

mod common;

use std::path::PathBuf;

use common::*;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use testbed::fixtures;

const NAMESPACE: &str = "kubevirt-hostpath-provisioner";
const SERVICE_ACCOUNT: &str = "kubevirt-hostpath-provisioner-admin";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kubectl(env: &TestEnv, args: &[&str]) -> String {
    env.cp.run_kubectl(&repo(), args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Applies of deploy/legacy, real or dry-run, go one at a time: the tests of this binary share a
/// control plane, and kubectl's apply reads then creates, so two applies racing to create the same
/// object make one fail with AlreadyExists (seen in a CI run for the StorageClass, and on the
/// oldest-Kubernetes lane for a dry run overtaken by a real apply).
static ONE_APPLY_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `kubectl apply -k deploy/legacy`.
fn apply_deploy_legacy(env: &TestEnv) {
    let _turn = ONE_APPLY_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    kubectl(env, &["apply", "-k", "deploy/legacy"]);
}

async fn ensure_namespace(env: &TestEnv) {
    match Api::<Namespace>::all(env.client.clone())
        .create(&PostParams::default(), &fixtures::namespace(NAMESPACE))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("create namespace: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn deploy_manifests_render_and_pass_server_side_dry_run() {
    let env = TestEnv::start("dryrun", 0).await;
    let rendered = kubectl(&env, &["kustomize", "deploy/legacy"]);
    for kind in ["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "StorageClass"] {
        assert!(rendered.contains(&format!("kind: {kind}")), "rendered deploy/legacy lacks a {kind}");
    }
    assert!(rendered.contains("rbac.authorization.k8s.io/v1\n"), "RBAC in rbac/v1");
    assert!(rendered.contains("volumeBindingMode: WaitForFirstConsumer"));
    let openshift = kubectl(&env, &["kustomize", "deploy/openshift"]);
    assert!(openshift.contains("kind: SecurityContextConstraints") && openshift.contains("kind: DaemonSet"));

    // Namespaced objects can only be dry-run once their namespace exists.
    ensure_namespace(&env).await;
    let out = {
        let _turn = ONE_APPLY_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        kubectl(&env, &["apply", "--dry-run=server", "-k", "deploy/legacy"])
    };
    for object in [
        "daemonset.apps/kubevirt-hostpath-provisioner",
        "clusterrole.rbac.authorization.k8s.io/kubevirt-hostpath-provisioner",
    ] {
        assert!(out.contains(object), "{object} missing from dry-run output:\n{out}");
    }
    assert!(out.lines().all(|l| l.trim().is_empty() || l.contains("(server dry run)")), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_opt_in_network_policy_passes_server_side_dry_run_and_stays_out_of_the_kustomization() {
    let env = TestEnv::start("netpol", 0).await;
    let rendered = kubectl(&env, &["kustomize", "deploy/legacy"]);
    assert!(!rendered.contains("kind: NetworkPolicy"), "the policy is opt-in: it could cut existing scrapers");
    ensure_namespace(&env).await;
    let out = kubectl(&env, &["apply", "--dry-run=server", "-f", "deploy/legacy/networkpolicy.yaml"]);
    assert!(out.contains("networkpolicy.networking.k8s.io/kubevirt-hostpath-provisioner"), "{out}");
    assert!(out.contains("(server dry run)"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_opt_in_csidriver_passes_server_side_dry_run_and_stays_out_of_the_kustomization() {
    let env = TestEnv::start("csidriver", 0).await;
    let rendered = kubectl(&env, &["kustomize", "deploy/legacy"]);
    assert!(!rendered.contains("kind: CSIDriver"), "capacity publishing is opt-in");
    let file = "deploy/components/published-capacity/csidriver.yaml";
    let out = kubectl(&env, &["apply", "--dry-run=server", "-f", file]);
    assert!(out.contains("csidriver.storage.k8s.io/hostpath.example.org"), "{out}");
    assert!(out.lines().all(|l| l.trim().is_empty() || l.contains("(server dry run)")), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_is_published_and_withdrawn_under_exactly_the_deploy_rbac() {
    let mut env = TestEnv::start("rbaccap", 0).await;
    apply_deploy_legacy(&env);
    let kubeconfig = service_account_kubeconfig(&env).await;
    env.provisioner = format!("{}.hostpath.test", env.group);
    let node = format!("{}-1", env.group);
    env.add_node(&node, &move |mut spec| {
        spec.kubeconfig = kubeconfig.clone();
        spec.env("POD_NAMESPACE", NAMESPACE).env("PUBLISH_CAPACITY", "true")
    })
    .await;
    let class = env.class("wffc", |c| c).await;
    let capacities: Api<CSIStorageCapacity> = Api::namespaced(env.client.clone(), NAMESPACE);
    let of_class = |list: Vec<CSIStorageCapacity>| list.into_iter().filter(|c| c.storage_class_name == class).count();
    testbed::wait_for("capacity published", TIMEOUT, || async {
        anyhow::Ok((of_class(capacities.list(&ListParams::default()).await?.items) == 1).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let status = env.node_mut(&node).provisioner.terminate();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let left = of_class(capacities.list(&ListParams::default()).await.expect("list").items);
    assert_eq!(left, 0, "withdrawn on shutdown\n{}", env.log_tails());
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_that_cannot_be_written_is_reported_on_the_node() {
    let mut env = TestEnv::start("capdenied", 0).await;
    apply_deploy_legacy(&env);
    let kubeconfig = service_account_kubeconfig(&env).await;
    env.provisioner = format!("{}.hostpath.test", env.group);
    let node = format!("{}-1", env.group);
    // The test's namespace, where the deploy's Role does not apply: nothing may be written there.
    let namespace = env.ns.clone();
    env.add_node(&node, &move |mut spec| {
        spec.kubeconfig = kubeconfig.clone();
        spec.env("POD_NAMESPACE", &namespace).env("PUBLISH_CAPACITY", "true")
    })
    .await;
    env.class("wffc", |c| c).await;
    let node_uid = Api::<Node>::all(env.client.clone()).get(&node).await.expect("node").metadata.uid.expect("uid");
    let note = env.wait_event("default", &node_uid, "CapacityPublishFailed").await;
    assert!(note.contains("csistoragecapacities") && note.contains(&env.ns), "{note}");
    assert!(note.contains("forbidden"), "says why: {note}");
    env.node_mut(&node).provisioner.terminate();
}

/// A kubeconfig with a token of the DaemonSet's ServiceAccount, as the kubelet would mount it.
async fn service_account_kubeconfig(env: &TestEnv) -> PathBuf {
    let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), NAMESPACE);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let token = accounts
        .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
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
async fn provisioner_works_under_exactly_the_deploy_rbac() {
    let mut env = TestEnv::start("rbac", 0).await;
    apply_deploy_legacy(&env);

    // A token of the DaemonSet's ServiceAccount, as the kubelet would mount it.
    let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), NAMESPACE);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let token = accounts
        .create_token_request(SERVICE_ACCOUNT, &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .and_then(|s| s.token)
        .expect("a TokenRequest answer carries the token");
    let kubeconfig = env.cp.temp_dir().join(format!("{}-sa.kubeconfig", env.group));
    env.cp.write_kubeconfig_for_token(&token, &kubeconfig).expect("kubeconfig");
    let node = format!("{}-1", env.group);
    let sa_kubeconfig = kubeconfig.clone();
    env.add_node(&node, &move |mut spec| {
        spec.kubeconfig = sa_kubeconfig.clone();
        // The DaemonSet's namespace, where the Role lets it keep its liveness lease.
        spec.env("POD_NAMESPACE", NAMESPACE)
    })
    .await;
    // The role covers the node's liveness lease.
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), NAMESPACE);
    let lease = testbed::wait_for("node lease written", TIMEOUT, || async {
        let list = leases.list(&ListParams::default()).await?;
        anyhow::Ok(
            list.items.into_iter().find(|l| l.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(&node)),
        )
    })
    .await
    .expect("lease");
    assert!(
        lease.metadata.annotations.unwrap_or_default()["hostpath-provisioner.kubevirt.io/pools"].starts_with("legacy=")
    );

    // Provision with the deployed WaitForFirstConsumer class and delete again.
    let claim = env.create_claim(fixtures::claim(&env.ns, "data", "hostpath-provisioner", "1Mi")).await;
    env.create_pod("app", "data").await;
    let pv = env.wait_bound("data").await;
    let dir = env.node(&node).pool_root.join(format!("pvc-{}", uid(&claim)));
    assert!(dir.is_dir());
    env.wait_event(&env.ns, &uid(&claim), "ProvisioningSucceeded").await;
    env.delete_pod("app").await;
    env.delete_claim("data").await;
    env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    wait_path_gone(&dir).await;

    // Anything outside the role is denied.
    let as_provisioner = env.cp.client_for_token(&token).expect("client");
    let forbidden = |result: Result<(), kube::Error>, what: &str| match result {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{what}: {status:?}"),
        other => panic!("{what} must be forbidden, got {other:?}"),
    };
    forbidden(
        Api::<Secret>::all(as_provisioner.clone()).list(&ListParams::default()).await.map(|_| ()),
        "list secrets",
    );
    forbidden(Api::<Node>::all(as_provisioner.clone()).list(&ListParams::default()).await.map(|_| ()), "list nodes");
    // A claim's namespace may be read (a pathPattern volume records its UID), never listed.
    Api::<Namespace>::all(as_provisioner.clone()).get_metadata(&env.ns).await.expect("get the claim's namespace");
    forbidden(
        Api::<Namespace>::all(as_provisioner.clone()).list(&ListParams::default()).await.map(|_| ()),
        "list namespaces",
    );
    let label = serde_json::json!({"metadata": {"labels": {"evil": "yes"}}});
    forbidden(
        Api::<Node>::all(as_provisioner.clone())
            .patch(&node, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .map(|_| ()),
        "patch a node",
    );
    let pod = fixtures::pod_using_claim(&env.ns, "sneaky", "data").build();
    forbidden(
        Api::<Pod>::namespaced(as_provisioner.clone(), &env.ns).create(&PostParams::default(), &pod).await.map(|_| ()),
        "create a pod",
    );
    forbidden(
        env_claims(&as_provisioner, &env.ns).delete("data", &Default::default()).await.map(|_| ()),
        "delete a claim",
    );
}

fn env_claims(client: &kube::Client, ns: &str) -> Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> {
    Api::namespaced(client.clone(), ns)
}

/// deploy/node-groups, the kustomize form of node groups: it passes server-side dry-run and
/// gives two DaemonSets that each mount at the host path they name in PV_DIR, select their own
/// pods only, and split any node set between them: every node, labelled or not, gets exactly
/// one provisioner (two would make two volumes for one claim; none leaves claims waiting).
#[tokio::test(flavor = "multi_thread")]
async fn the_node_groups_overlay_gives_each_node_exactly_one_provisioner_with_its_own_pool() {
    let env = TestEnv::start("nodegroups", 0).await;
    ensure_namespace(&env).await;
    let out = {
        // The overlay holds deploy/legacy's RBAC and classes too.
        let _turn = ONE_APPLY_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        kubectl(&env, &["apply", "--dry-run=server", "-o", "json", "-k", "deploy/node-groups"])
    };
    let list: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let daemonsets: Vec<&serde_json::Value> =
        list["items"].as_array().expect("a List").iter().filter(|o| o["kind"] == "DaemonSet").collect();
    assert_eq!(daemonsets.len(), 2, "{out}");
    let mut pools = Vec::new();
    for ds in &daemonsets {
        let name = ds["metadata"]["name"].as_str().unwrap();
        let pod = &ds["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let pv_dir =
            container["env"].as_array().unwrap().iter().find(|e| e["name"] == "PV_DIR").unwrap()["value"].clone();
        assert_eq!(container["volumeMounts"][0]["mountPath"], pv_dir, "{name}: mounted where PV_DIR says");
        assert_eq!(pod["volumes"][0]["hostPath"]["path"], pv_dir, "{name}: the host path is the same path");
        pools.push(pv_dir);
        for other in &daemonsets {
            let selects =
                labels_match(&other["spec"]["selector"]["matchLabels"], &ds["spec"]["template"]["metadata"]["labels"]);
            assert_eq!(
                selects,
                std::ptr::eq(*other, *ds),
                "{name}'s pods and {}'s selector",
                other["metadata"]["name"]
            );
        }
    }
    assert_ne!(pools[0], pools[1], "each group has its own pool");
    let linux = serde_json::json!({"kubernetes.io/os": "linux"});
    let nvme = serde_json::json!({"kubernetes.io/os": "linux", "hostpath-provisioner.kubevirt.io/node-group": "nvme"});
    let other = serde_json::json!({"kubernetes.io/os": "linux", "hostpath-provisioner.kubevirt.io/node-group": "ssd"});
    for node in [&linux, &nvme, &other] {
        let serving: Vec<&str> = daemonsets
            .iter()
            .filter(|ds| runs_on(&ds["spec"]["template"]["spec"], node))
            .map(|ds| ds["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(serving.len(), 1, "node {node} is served by {serving:?}");
    }
}

/// Whether every label of `selector` is in `labels`.
fn labels_match(selector: &serde_json::Value, labels: &serde_json::Value) -> bool {
    selector.as_object().unwrap().iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// Whether a pod spec's nodeSelector and required node affinity admit a node with `labels`
/// (the operators the overlay may use: In, NotIn, Exists, DoesNotExist).
fn runs_on(pod: &serde_json::Value, labels: &serde_json::Value) -> bool {
    let selector_ok = pod["nodeSelector"].as_object().is_none_or(|s| s.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let affinity_ok = terms.as_array().is_none_or(|terms| {
        terms.iter().any(|term| {
            term["matchExpressions"].as_array().into_iter().flatten().all(|e| {
                let value = labels.get(e["key"].as_str().unwrap());
                let listed = || e["values"].as_array().unwrap().iter().any(|v| Some(v) == value);
                match e["operator"].as_str().unwrap() {
                    "In" => listed(),
                    "NotIn" => !listed(),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    op => panic!("operator {op}"),
                }
            })
        })
    });
    selector_ok && affinity_ok
}

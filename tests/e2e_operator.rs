//! End-to-end: the `HostPathProvisioner` resource on the real control plane. The CRD of
//! deploy/operator applies; the example resources (whose specs are the kubevirt operator's examples,
//! unchanged) are accepted; each bad resource is refused at admission with the message that says what to
//! change; the operator process renders the node DaemonSet for a resource, rolls it when the
//! resource changes, and removes what it made when the resource is deleted.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

/// deploy/operator's namespace and the operator's ServiceAccount.
const OPERATOR_NAMESPACE: &str = "hostpath-provisioner";
const OPERATOR_ACCOUNT: &str = "hostpath-provisioner-operator";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kubectl(env: &TestEnv, args: &[&str]) -> String {
    env.cp.run_kubectl(&repo(), args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Applies deploy/operator, CRD included (idempotent, one at a time: the tests of this binary
/// share a control plane), and waits until the API server serves the CRD.
fn apply_crd(env: &TestEnv) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    kubectl(env, &["apply", "--server-side", "-k", "deploy/operator"]);
    kubectl(
        env,
        &[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            "crd/hostpathprovisioners.hostpathprovisioner.kubevirt.io",
        ],
    );
}

fn resources(env: &TestEnv) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("hostpathprovisioner.kubevirt.io", "v1beta1", "HostPathProvisioner");
    Api::all_with(env.client.clone(), &ApiResource::from_gvk_with_plural(&gvk, "hostpathprovisioners"))
}

fn resource(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1",
        "kind": "HostPathProvisioner",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("resource")
}

/// Server-side dry-run create: admission runs in full (CEL rules included), nothing is stored,
/// so tests of this binary never collide on the cluster-scoped names.
async fn try_create(env: &TestEnv, object: &DynamicObject) -> Result<(), String> {
    let params = PostParams { dry_run: true, ..PostParams::default() };
    resources(env).create(&params, object).await.map(|_| ()).map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread")]
async fn crd_accepts_every_example_resource() {
    let env = TestEnv::start("hpp-crd", 0).await;
    apply_crd(&env);
    let dir = repo().join("deploy/operator/examples");
    let mut applied = 0;
    for entry in std::fs::read_dir(&dir).expect("examples") {
        let path = entry.expect("entry").path();
        let out = kubectl(&env, &["apply", "--dry-run=server", "-f", path.to_str().expect("utf-8 path")]);
        assert!(out.contains("hostpathprovisioner.kubevirt.io/hostpath-provisioner"), "{}: {out}", path.display());
        applied += 1;
    }
    assert_eq!(applied, 4, "four examples in {}", dir.display());
}

#[tokio::test(flavor = "multi_thread")]
async fn crd_refuses_bad_resources_with_a_message_saying_what_to_change() {
    let env = TestEnv::start("hpp-refuse", 0).await;
    apply_crd(&env);
    let pool = |name: &str, path: &str| json!({"name": name, "path": path});
    let cases: Vec<(&str, Value, &str)> = vec![
        ("relative pool path", json!({"storagePools": [pool("a", "var/hp")]}), "must be an absolute path"),
        (
            "relative legacy path",
            json!({"pathConfig": {"path": "hp"}}),
            "spec.pathConfig.path must be an absolute path",
        ),
        ("dot-dot segment", json!({"storagePools": [pool("a", "/var/../etc")]}), "without . or .. segments"),
        ("root as a pool", json!({"storagePools": [pool("a", "/")]}), "a directory other than /"),
        (
            "duplicate names",
            json!({"storagePools": [pool("a", "/var/a"), pool("a", "/var/b")]}),
            "spec.storagePools[].name must be unique",
        ),
        (
            "duplicate paths",
            json!({"storagePools": [pool("a", "/var/a"), pool("b", "/var/a")]}),
            "spec.storagePools[].path must be unique",
        ),
        (
            "pool inside another",
            json!({"storagePools": [pool("a", "/var/a"), pool("b", "/var/a/b")]}),
            "lies inside another pool's path",
        ),
        (
            "pathConfig and storagePools",
            json!({"pathConfig": {"path": "/var/hp"}, "storagePools": [pool("a", "/var/a")]}),
            "spec.pathConfig and spec.storagePools cannot both be set",
        ),
        ("neither", json!({"imagePullPolicy": "Always"}), "set spec.pathConfig.path"),
        (
            "unknown pull policy",
            json!({"imagePullPolicy": "always", "pathConfig": {"path": "/var/hp"}}),
            "spec.imagePullPolicy must be Always, IfNotPresent or Never",
        ),
    ];
    for (case, spec, message) in cases {
        let error = try_create(&env, &resource("bad", spec)).await.err().unwrap_or_else(|| panic!("{case}: accepted"));
        assert!(error.contains(message), "{case}: refused with {error:?}, expected {message:?}");
    }
    // Near misses that must pass: siblings sharing a prefix, a trailing slash, an empty list.
    let fine = [
        json!({"storagePools": [pool("a", "/var/a"), pool("b", "/var/ab")]}),
        json!({"storagePools": [pool("a", "/var/a/")]}),
        json!({"pathConfig": {"path": "/var/hp"}, "storagePools": []}),
        json!({"imagePullPolicy": "", "pathConfig": {"path": "/var/hp"}}),
    ];
    for spec in fine {
        try_create(&env, &resource("fine", spec.clone())).await.unwrap_or_else(|e| panic!("{spec} refused: {e}"));
    }
}

/// The operator process, stopped (SIGTERM, then SIGKILL) when dropped; its log is kept in a
/// file and printed when the test fails.
struct Operator {
    child: std::process::Child,
    log: PathBuf,
}

impl Operator {
    /// Runs `hostpath-provisioner operator` in deploy/operator's namespace with a token of its
    /// ServiceAccount: exactly the rights of deploy/operator/rbac.yaml.
    async fn start(env: &TestEnv, image: &str, replica: &str) -> Operator {
        let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
            ..Default::default()
        };
        let token = accounts
            .create_token_request(OPERATOR_ACCOUNT, &PostParams::default(), &request)
            .await
            .expect("TokenRequest")
            .status
            .and_then(|s| s.token)
            .expect("a token");
        let kubeconfig = env.cp.temp_dir().join(format!("{}-operator.kubeconfig", env.group));
        env.cp.write_kubeconfig_for_token(&token, &kubeconfig).expect("kubeconfig");
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-operator-{replica}.log", env.ns));
        let file = std::fs::File::create(&log).expect("operator log");
        let child = std::process::Command::new(binary())
            .args(["operator", "--namespace", OPERATOR_NAMESPACE, "--node-image", image, "--lease-seconds", "6"])
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env("RUST_LOG", "info,hostpath_provisioner=debug")
            // The replica's name in the Lease, as the downward API gives it in a pod.
            .env("POD_NAME", format!("{}-{replica}", env.group))
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start the operator");
        Operator { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        for _ in 0..50 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- operator log ---\n{}", self.log());
        }
    }
}

async fn wait_log(operator: &Operator, line: &str) {
    testbed::wait_for(line, WAIT, || async {
        Ok::<_, std::convert::Infallible>(operator.log().contains(line).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", operator.log()));
}

const WAIT: std::time::Duration = std::time::Duration::from_secs(60);
const NODE_DAEMONSET: &str = "kubevirt-hostpath-provisioner";

/// The node DaemonSet's container env as NAME=VALUE lines, and its pull policy and image.
fn node_container(daemonset: &DaemonSet) -> (BTreeMap<String, String>, Option<String>, Option<String>) {
    let pod = daemonset.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod spec");
    let container = pod.containers.iter().find(|c| c.name == NODE_DAEMONSET).expect("node container");
    let env = container.env.iter().flatten().filter_map(|e| Some((e.name.clone(), e.value.clone()?))).collect();
    (env, container.image.clone(), container.image_pull_policy.clone())
}

async fn wait_daemonset(env: &TestEnv, what: &str, done: impl Fn(&DaemonSet) -> bool) -> DaemonSet {
    let api: Api<DaemonSet> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
    testbed::wait_for(what, WAIT, || {
        let api = api.clone();
        let done = &done;
        async move { api.get_opt(NODE_DAEMONSET).await.map(|d| d.filter(|d| done(d))) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

fn condition<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a Value> {
    object.data["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

async fn wait_resource(env: &TestEnv, name: &str, what: &str, done: impl Fn(&DynamicObject) -> bool) -> DynamicObject {
    let api = resources(env);
    testbed::wait_for(what, WAIT, || {
        let api = api.clone();
        let done = &done;
        async move { api.get_opt(name).await.map(|r| r.filter(|r| done(r))) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

/// One test for the whole life of a resource: a cluster has one acting resource, and the tests
/// of this binary share a control plane.
#[tokio::test(flavor = "multi_thread")]
async fn the_operator_deploys_rolls_reports_and_removes_the_node_provisioner() {
    let env = TestEnv::start("hpp-operator", 0).await;
    apply_crd(&env);
    // Two replicas: the first takes the Lease, the second stands by.
    let first = Operator::start(&env, "registry.example/hostpath-provisioner:e2e", "a").await;
    wait_log(&first, "holding the operator Lease").await;
    let second = Operator::start(&env, "registry.example/hostpath-provisioner:e2e", "b").await;
    wait_log(&second, "another replica holds the operator Lease").await;
    let name = env.group.clone();
    let example = repo().join("deploy/operator/examples/storage-pool.yaml");
    let mut resource: DynamicObject =
        serde_saphyr::from_str(&std::fs::read_to_string(example).expect("example")).expect("example parses");
    resource.metadata.name = Some(name.clone());
    resources(&env).create(&PostParams::default(), &resource).await.expect("create the resource");

    // The storage pool example: one pool, the operator's image, the resource's pull policy.
    let daemonset = wait_daemonset(&env, "the node DaemonSet", |_| true).await;
    let (vars, image, pull) = node_container(&daemonset);
    assert_eq!(vars.get("STORAGE_POOLS").map(String::as_str), Some("local=/var/hpvolumes"));
    assert!(!vars.contains_key("PV_DIR"));
    assert_eq!(image.as_deref(), Some("registry.example/hostpath-provisioner:e2e"));
    assert_eq!(pull.as_deref(), Some("Always"));
    let owner = &daemonset.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("HostPathProvisioner", name.as_str()));
    let selector = format!("hostpathprovisioner.kubevirt.io/resource={name}");
    for kind in ["serviceaccount", "role", "rolebinding"] {
        let made = kubectl(&env, &["get", "-n", OPERATOR_NAMESPACE, kind, "-o", "name", "-l", &selector]);
        assert_eq!(made.lines().count(), 1, "{kind}: {made}");
    }
    let labelled = kubectl(
        &env,
        &[
            "get",
            "clusterrole,clusterrolebinding",
            "-o",
            "name",
            "-l",
            &format!("hostpathprovisioner.kubevirt.io/resource={name}"),
        ],
    );
    assert_eq!(labelled.lines().count(), 2, "{labelled}");
    let reported = wait_resource(&env, &name, "a status", |r| condition(r, "Degraded").is_some()).await;
    assert_eq!(condition(&reported, "Degraded").expect("Degraded")["status"], "False", "{:#}", reported.data["status"]);
    assert_eq!(reported.data["status"]["storagePoolStatuses"][0]["name"], "local");
    assert_eq!(reported.data["status"]["operatorVersion"], env!("CARGO_PKG_VERSION"));
    assert!(reported.metadata.finalizers.iter().flatten().any(|f| f == "hostpathprovisioner.kubevirt.io/cleanup"));

    // Editing the resource rolls the DaemonSet: a new pool is a new template.
    let generation = daemonset.metadata.generation.expect("generation");
    let patch = json!({"spec": {"storagePools": [
        {"name": "local", "path": "/var/hpvolumes"},
        {"name": "fast", "path": "/mnt/fast"},
    ]}});
    resources(&env).patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("add a pool");
    let rolled = wait_daemonset(&env, "the second pool in the DaemonSet", |d| {
        node_container(d).0.get("STORAGE_POOLS").map(String::as_str) == Some("local=/var/hpvolumes,fast=/mnt/fast")
    })
    .await;
    assert!(rolled.metadata.generation.expect("generation") > generation, "the template changed");

    // The acting replica stops (it releases the Lease); the standby takes over and acts.
    assert!(!second.log().contains("holding the operator Lease"), "two replicas acting:\n{}", second.log());
    drop(first);
    wait_log(&second, "holding the operator Lease").await;

    pools_on_a_claim_are_mounted_per_node_and_held_back_by_volumes(&env, &name).await;

    // The legacy form: PV_DIR and the naming prefix, no named pools.
    let patch = json!({"spec": {"storagePools": null, "pathConfig": {"path": "/srv/hp", "useNamingPrefix": true}}});
    resources(&env).patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("to pathConfig");
    let legacy = wait_daemonset(&env, "the legacy layout", |d| {
        node_container(d).0.get("PV_DIR").map(String::as_str) == Some("/srv/hp")
    })
    .await;
    let (vars, _, _) = node_container(&legacy);
    assert_eq!(vars.get("USE_NAMING_PREFIX").map(String::as_str), Some("true"));
    assert!(!vars.contains_key("STORAGE_POOLS"));
    // The legacy form has no pool statuses (as with the kubevirt operator): the old ones go.
    wait_resource(&env, &name, "the pool statuses gone", |r| {
        r.data["status"].get("storagePoolStatuses").is_none()
            && condition(r, "Degraded").is_some_and(|c| c["observedGeneration"] == json!(r.metadata.generation))
    })
    .await;

    // A malformed affinity passes the schema (a free-form object) but not the operator: the
    // status and an Event say what to fix, and the running DaemonSet is left as it was.
    let patch = json!({"spec": {"workload": {"affinity": {"nodeAffinity": "everywhere"}}}});
    resources(&env).patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("bad affinity");
    let degraded = wait_resource(&env, &name, "Degraded InvalidAffinity", |r| {
        condition(r, "Degraded").is_some_and(|c| c["reason"] == "InvalidAffinity")
    })
    .await;
    let message =
        condition(&degraded, "Degraded").expect("Degraded")["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("spec.workload.affinity"), "{message}");
    let uid = degraded.metadata.uid.clone().expect("uid");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), "default");
    testbed::wait_for("the InvalidAffinity Event", WAIT, || {
        let events = events.clone();
        let uid = uid.clone();
        async move {
            let list = events.list(&Default::default()).await?;
            Ok::<_, kube::Error>(list.items.into_iter().find(|e| {
                e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str())
                    && e.reason.as_deref() == Some("InvalidAffinity")
            }))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let unchanged = wait_daemonset(&env, "the DaemonSet", |_| true).await;
    assert_eq!(node_container(&unchanged).0.get("PV_DIR").map(String::as_str), Some("/srv/hp"));

    // A PV of ours, standing for a volume's data: deleting the resource must leave it.
    let pv: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-pv")},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": "/srv/hp/pvc-kept"},
            "storageClassName": "hostpath-provisioner",
        },
    }))
    .expect("pv");
    env.pvs().create(&PostParams::default(), &pv).await.expect("create a PV");

    resources(&env).delete(&name, &Default::default()).await.expect("delete the resource");
    testbed::wait_for("the resource to be gone", WAIT, || {
        let api = resources(&env);
        let name = name.clone();
        async move { api.get_opt(&name).await.map(|r| r.is_none().then_some(())) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    let left = kubectl(
        &env,
        &[
            "get",
            "daemonset,serviceaccount,role,rolebinding",
            "-n",
            OPERATOR_NAMESPACE,
            "-o",
            "name",
            "-l",
            &format!("hostpathprovisioner.kubevirt.io/resource={name}"),
        ],
    );
    assert_eq!(left.trim(), "", "namespaced objects left behind");
    let left = kubectl(
        &env,
        &[
            "get",
            "clusterrole,clusterrolebinding",
            "-o",
            "name",
            "-l",
            &format!("hostpathprovisioner.kubevirt.io/resource={name}"),
        ],
    );
    assert_eq!(left.trim(), "", "cluster objects left behind");
    assert!(env.pvs().get_opt(&format!("{name}-pv")).await.expect("read the PV").is_some(), "the PV was kept");
    env.pvs().delete(&format!("{name}-pv"), &Default::default()).await.expect("remove the test PV");
}

/// A pool on a claim: each node the placement selects gets its claim and mounter Deployment,
/// the DaemonSet serves the pool only while it is a mount point; removing the pool while a PV
/// of ours lives there keeps that node's claim and mounter, and the status names the PV; they
/// go when the PV goes. (No kubelet here: the mounters never run, the pool stays Mounting.)
async fn pools_on_a_claim_are_mounted_per_node_and_held_back_by_volumes(env: &TestEnv, name: &str) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
    let nodes_api: Api<Node> = Api::all(env.client.clone());
    let nodes = [format!("{}-n1", env.group), format!("{}-n2", env.group)];
    for node in &nodes {
        let mut object = testbed::fixtures::node(node, node);
        object.metadata.labels.get_or_insert_default().insert("hpp-e2e".into(), env.group.clone());
        nodes_api.create(&PostParams::default(), &object).await.expect("create a node");
    }
    let claimed = json!({"name": "claimed", "path": "/mnt/claimed", "pvcTemplate": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "san",
    }});
    let patch = json!({"spec": {
        "workload": {"nodeSelector": {"hpp-e2e": env.group}},
        "storagePools": [{"name": "local", "path": "/var/hpvolumes"}, claimed],
    }});
    resources(env).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("add a pool on a claim");
    wait_daemonset(env, "the pool on a claim served only while mounted", |d| {
        node_container(d).0.get("STORAGE_POOLS").map(String::as_str)
            == Some("local=/var/hpvolumes,claimed=/mnt/claimed,mountpoint")
    })
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
    let mounters: Api<Deployment> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
    let object_names = |node: &str| format!("hpp-pool-claimed-{node}");
    for node in &nodes {
        let claim = wait_present(&claims, &object_names(node), true).await;
        let spec = claim.spec.expect("claim spec");
        assert_eq!(spec.storage_class_name.as_deref(), Some("san"), "the template's class");
        assert!(claim.metadata.owner_references.is_none(), "never collected with the resource");
        let mounter = wait_present(&mounters, &object_names(node), true).await;
        let pod = mounter.spec.and_then(|s| s.template.spec).expect("mounter pod");
        let affinity = serde_json::to_string(&pod.affinity).expect("affinity");
        assert!(affinity.contains(node.as_str()), "pinned to its node: {affinity}");
    }
    let reported = wait_resource(env, name, "the pool Mounting on both nodes", |r| {
        r.data["status"]["storagePoolStatuses"].as_array().is_some_and(|pools| {
            pools.iter().any(|p| p["name"] == "claimed" && p["phase"] == "Mounting" && p["desiredReady"] == 2)
        })
    })
    .await;
    let pools = reported.data["status"]["storagePoolStatuses"].to_string();
    assert!(pools.contains(&object_names(&nodes[0])), "the claims' statuses: {pools}");

    // A volume of ours in the pool on the first node, then the pool is removed.
    let pv_name = format!("{}-in-claimed", env.group);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": pv_name, "annotations": {
            "pv.kubernetes.io/provisioned-by": "kubevirt.io/hostpath-provisioner",
            "kubevirt.io/provisionOnNode": nodes[0],
        }},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "hostPath": {"path": "/mnt/claimed/pvc-held"}, "storageClassName": "hostpath-provisioner"},
    }))
    .expect("pv");
    env.pvs().create(&PostParams::default(), &pv).await.expect("create a PV in the pool");
    let patch = json!({"spec": {"storagePools": [{"name": "local", "path": "/var/hpvolumes"}]}});
    resources(env).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("remove the pool");
    let held = wait_resource(env, name, "Degraded PoolHeldBack", |r| {
        condition(r, "Degraded").is_some_and(|c| c["reason"] == "PoolHeldBack")
    })
    .await;
    let message = condition(&held, "Degraded").expect("Degraded")["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains(&pv_name) && message.contains(&nodes[0]), "names the PV and node: {message}");
    wait_present(&mounters, &object_names(&nodes[1]), false).await;
    wait_present(&claims, &object_names(&nodes[1]), false).await;
    // The DaemonSet keeps serving the held pool, so that its volume can still be used and released.
    let served = wait_daemonset(env, "the DaemonSet", |_| true).await;
    assert_eq!(
        node_container(&served).0.get("STORAGE_POOLS").map(String::as_str),
        Some("local=/var/hpvolumes,claimed=/mnt/claimed,mountpoint")
    );
    assert!(mounters.get_opt(&object_names(&nodes[0])).await.expect("read").is_some(), "held: {message}");
    assert!(claims.get_opt(&object_names(&nodes[0])).await.expect("read").is_some(), "held: {message}");

    // The volume goes: so do the claim and the mounter.
    env.pvs().delete(&pv_name, &Default::default()).await.expect("delete the PV");
    wait_present(&mounters, &object_names(&nodes[0]), false).await;
    wait_present(&claims, &object_names(&nodes[0]), false).await;
    wait_resource(env, name, "no longer held back", |r| {
        condition(r, "Degraded").is_some_and(|c| c["reason"] != "PoolHeldBack")
    })
    .await;
    wait_daemonset(env, "the released pool no longer served", |d| {
        node_container(d).0.get("STORAGE_POOLS").map(String::as_str) == Some("local=/var/hpvolumes")
    })
    .await;
    let patch = json!({"spec": {"workload": null}});
    resources(env).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("placement back");
    for node in &nodes {
        nodes_api.delete(node, &Default::default()).await.expect("remove the test node");
    }
}

/// Waits until `name` exists (`present`) or is gone or being deleted (a claim's protection
/// finalizer may outlive the test's control plane controllers).
async fn wait_present<K>(api: &Api<K>, name: &str, present: bool) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Default,
{
    let what = format!("{name} {}", if present { "made" } else { "removed" });
    testbed::wait_for(&what, WAIT, || async {
        let found = api.get_opt(name).await?;
        let live = found.clone().filter(|o| o.meta().deletion_timestamp.is_none());
        Ok::<_, kube::Error>(match (present, live) {
            (true, Some(object)) => Some(object),
            (false, None) => Some(found.unwrap_or_default()),
            _ => None,
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

/// deploy/operator/install.yaml is deploy/operator rendered (`make manifests` regenerates it),
/// and the one file applies.
#[tokio::test(flavor = "multi_thread")]
async fn the_one_file_install_is_the_kustomization_rendered_and_applies() {
    let env = TestEnv::start("hpp-onefile", 0).await;
    let rendered = kubectl(&env, &["kustomize", "deploy/operator"]);
    let file = std::fs::read_to_string(repo().join("deploy/operator/install.yaml")).expect("install.yaml");
    let body: String = file.lines().skip_while(|l| l.starts_with('#')).map(|l| format!("{l}\n")).collect();
    assert!(body == rendered, "deploy/operator/install.yaml is stale: run `make manifests` and commit the result");
    apply_crd(&env);
    let out = kubectl(&env, &["apply", "--server-side", "--dry-run=server", "-f", "deploy/operator/install.yaml"]);
    assert!(out.contains("deployment.apps/hostpath-provisioner-operator"), "{out}");
}

/// The chart's copy of the CRD is deploy/operator's.
#[test]
fn the_charts_crd_is_deploy_operators() {
    let read = |path: &str| std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(
        read("deploy/helm/hostpath-provisioner/files/operator-crd.yaml") == read("deploy/operator/crd.yaml"),
        "copy deploy/operator/crd.yaml to deploy/helm/hostpath-provisioner/files/operator-crd.yaml"
    );
}

/// `operator.enabled`: the chart installs the operator (and a resource from values) instead of
/// the node DaemonSet, and what it renders passes server-side dry-run.
#[tokio::test(flavor = "multi_thread")]
async fn the_chart_installs_the_operator_instead_of_the_daemonset() {
    let env = TestEnv::start("hpp-chart", 0).await;
    apply_crd(&env);
    let helm = testbed::deploy_tool(testbed::DeployTool::Helm).unwrap_or_else(|e| panic!("{e:#}"));
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("helm-home");
    let output = std::process::Command::new(helm)
        .args(["template", "hpp", "deploy/helm/hostpath-provisioner", "--namespace", &env.ns])
        .args(["--set", "operator.enabled=true", "--set-json"])
        .arg(r#"operator.resource={"storagePools":[{"name":"local","path":"/var/hpvolumes"}]}"#)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .current_dir(repo())
        .output()
        .expect("helm");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let rendered = String::from_utf8_lossy(&output.stdout).into_owned();
    let kinds: Vec<&str> = rendered.lines().filter_map(|l| l.strip_prefix("kind: ")).collect();
    for kind in ["CustomResourceDefinition", "Deployment", "HostPathProvisioner", "ClusterRole", "Role"] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
    assert!(!kinds.contains(&"DaemonSet"), "the operator makes the DaemonSet, not the chart");
    assert!(rendered.contains("helm.sh/resource-policy: keep"), "the CRD outlives the release");
    let file = env.cp.temp_dir().join(format!("{}-chart.yaml", env.group));
    std::fs::write(&file, &rendered).expect("write");
    let out = kubectl(&env, &["apply", "--server-side", "--dry-run=server", "-f", file.to_str().expect("utf-8")]);
    assert!(out.contains("hostpathprovisioner.hostpathprovisioner.kubevirt.io/hostpath-provisioner"), "{out}");
}

/// Unmounts (lazily) what a pool-mount test left mounted, whatever happened.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let umount = || {
            std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        while umount() {}
    }
}

fn pool_mount(source: &std::path::Path, target: &std::path::Path, extra: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(binary());
    command.arg("pool-mount").arg("--source").arg(source).arg("--target").arg(target).args(extra);
    command
}

/// `pool-mount` bind-mounts the claim onto the pool path, answers its probe, never mounts over a
/// non-empty directory, and on SIGTERM unmounts only a pool that holds no volume.
#[tokio::test(flavor = "multi_thread")]
async fn pool_mount_mounts_the_claim_and_keeps_it_while_volumes_live_there() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(testbed::unique_name("pool-mount"));
    let (claim, pool) = (dir.join("claim"), dir.join("pool"));
    // Dropped last, after both mounts are gone.
    let _remove = RemoveDir(dir.clone());
    let _claim_fs = Tmpfs::mount(&claim);
    let _cleanup = Unmount(pool.clone());
    std::fs::write(claim.join(".marker"), "on the claim").expect("marker");
    let probe = |pool: &std::path::Path| pool_mount(&claim, pool, &["--check"]).status().expect("probe").success();

    // Mounted, probed, then unmounted on SIGTERM since no volume lives there.
    let mut mounter = pool_mount(&claim, &pool, &[]).spawn().expect("pool-mount");
    testbed::wait_for("the claim on the pool path", WAIT, || async {
        Ok::<_, std::convert::Infallible>(pool.join(".marker").exists().then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(probe(&pool));
    // SAFETY: kill(2) on our own child, not reaped yet.
    unsafe { libc::kill(mounter.id() as i32, libc::SIGTERM) };
    assert!(mounter.wait().expect("wait").success());
    assert!(!pool.join(".marker").exists(), "an empty pool is unmounted on SIGTERM");
    assert!(!probe(&pool));

    // With a volume in it, the mount outlives the mounter, and the next one adopts it.
    let mut mounter = pool_mount(&claim, &pool, &[]).spawn().expect("pool-mount");
    testbed::wait_for("the claim on the pool path", WAIT, || async {
        Ok::<_, std::convert::Infallible>(probe(&pool).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    std::fs::create_dir(pool.join("pvc-0b5c4a1e")).expect("a volume");
    // SAFETY: as above.
    unsafe { libc::kill(mounter.id() as i32, libc::SIGTERM) };
    assert!(mounter.wait().expect("wait").success());
    assert!(probe(&pool), "the mount stays while a volume lives there");
    let log = dir.join("adopter.log");
    let adopter =
        pool_mount(&claim, &pool, &[]).stderr(std::fs::File::create(&log).expect("log")).spawn().expect("pool-mount");
    let mut adopted = KillOnDrop(adopter);
    testbed::wait_for("the next mounter to adopt the mount", WAIT, || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        Ok::<_, std::convert::Infallible>(text.contains("adopted").then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(adopted.0.try_wait().expect("try_wait").is_none(), "the adopter keeps running");
    drop(adopted);
    let unmounted = std::process::Command::new("umount").arg(&pool).status().expect("umount");
    assert!(unmounted.success(), "the adopted mount was in place");

    // A non-empty pool path is never mounted over.
    std::fs::create_dir_all(pool.join("pvc-old")).expect("old data");
    let output = pool_mount(&claim, &pool, &[]).output().expect("pool-mount");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("is not empty"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!probe(&pool));
}

/// Removes a test's directory when dropped.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child killed (SIGKILL) and reaped when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

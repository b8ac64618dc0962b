//! End-to-end: the `HostPathProvisioner` resource on the real control plane. The CRD of
//! deploy/operator applies; the example resources (whose specs are the kubevirt operator's examples,
//! unchanged) are accepted; each bad resource is refused at admission with the message that says what to
//! change; the operator process renders the node DaemonSet for a resource, rolls it when the
//! resource changes, and removes what it made when the resource is deleted; the chart installs
//! the operator and a resource in one `helm install` on a fresh cluster, and that operator,
//! acting with the chart's RBAC alone, brings the resource to Available.

#[path = "operator/claim_releaser.rs"]
mod claim_releaser;
mod common;
#[path = "operator/pools_on_a_claim.rs"]
mod pools_on_a_claim;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::*;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
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
    resources_of(&env.client)
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
            "a comma in a pool path",
            json!({"storagePools": [pool("a", "/var/a,b")]}),
            "spec.storagePools[].path must not contain a comma",
        ),
        (
            "a comma in the legacy path",
            json!({"pathConfig": {"path": "/var/hp,shared"}}),
            "spec.pathConfig.path must not contain a comma",
        ),
        (
            "a name twice, one of them on a claim",
            json!({"storagePools": [
                {"name": "a", "path": "/var/a", "pvcTemplate": {"resources": {"requests": {"storage": "1Gi"}}}},
                pool("a", "/var/b"),
            ]}),
            "which a pool on a claim cannot be",
        ),
        (
            "unknown pool accounting",
            json!({"storagePools": [{"name": "a", "path": "/var/a", "accounting": "Requests"}]}),
            "spec.storagePools[].accounting must be free or requests",
        ),
        (
            "published capacity under the default provisioner name",
            json!({"storagePools": [pool("a", "/var/a")], "config": {"publishCapacity": true}}),
            "spec.config.publishCapacity needs spec.config.capacityProvisionerName, or spec.config.provisionerName, to be an object name",
        ),
        (
            "unknown capacity accounting",
            json!({"storagePools": [pool("a", "/var/a")], "config": {"capacityAccounting": "promises"}}),
            "spec.config.capacityAccounting",
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
        (
            "Block volumes' device nodes outside the host's /dev",
            json!({"storagePools": [pool("a", "/var/a")], "config": {"blockVolumes": true, "blockDeviceDir": "/var/dev"}}),
            "spec.config.blockDeviceDir",
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
        // One pool over two disks, with its options; capacity published under an object name.
        json!({"storagePools": [
            {"name": "data", "path": "/mnt/disk1", "reserve": "10Gi", "accounting": "requests"},
            {"name": "data", "path": "/mnt/disk2", "reserve": 1048576, "requireMountpoint": true},
        ], "config": {"publishCapacity": true, "provisionerName": "hostpath.example.org"}, "quota": {"enabled": true}}),
        json!({"storagePools": [pool("a", "/var/a")], "config": {"blockVolumes": true, "blockDeviceDir": "/dev/hpp-block"}}),
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
    /// Where it serves /healthz, /readyz and /metrics (`--listen`, LISTEN_ADDR in its pod).
    addr: std::net::SocketAddr,
}

/// How an operator process runs: as which ServiceAccount, in which namespace, as which pod.
struct OperatorRun<'a> {
    cp: &'a testbed::ControlPlane,
    client: Client,
    namespace: &'a str,
    account: &'a str,
    /// `--node-image`; None: the image of the pod `pod_name`, as in a cluster.
    node_image: Option<&'a str>,
    /// POD_NAME: the replica's name in the Lease, and the pod whose image and pull secrets the
    /// operator reads, as the downward API gives it in a pod.
    pod_name: String,
}

impl Operator {
    /// Runs `hostpath-provisioner operator` in deploy/operator's namespace with a token of its
    /// ServiceAccount: exactly the rights of deploy/operator/rbac.yaml.
    async fn start(env: &TestEnv, image: &str, replica: &str) -> Operator {
        let run = OperatorRun {
            cp: env.cp,
            client: env.client.clone(),
            namespace: OPERATOR_NAMESPACE,
            account: OPERATOR_ACCOUNT,
            node_image: Some(image),
            pod_name: format!("{}-{replica}", env.group),
        };
        Operator::start_as(&run).await
    }

    /// Runs `hostpath-provisioner operator` with a token of `run.account`: exactly that
    /// ServiceAccount's rights, as in its pod.
    async fn start_as(run: &OperatorRun<'_>) -> Operator {
        let accounts: Api<ServiceAccount> = Api::namespaced(run.client.clone(), run.namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
            ..Default::default()
        };
        let token = accounts
            .create_token_request(run.account, &PostParams::default(), &request)
            .await
            .expect("TokenRequest")
            .status
            .and_then(|s| s.token)
            .expect("a token");
        let kubeconfig = run.cp.temp_dir().join(format!("{}.kubeconfig", run.pod_name));
        run.cp.write_kubeconfig_for_token(&token, &kubeconfig).expect("kubeconfig");
        let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{}-operator.log", run.pod_name));
        let file = std::fs::File::create(&log).expect("operator log");
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], testbed::free_port().expect("a free port")));
        let mut command = std::process::Command::new(binary());
        command.args(["operator", "--namespace", run.namespace, "--lease-seconds", "6", "--listen", &addr.to_string()]);
        if let Some(image) = run.node_image {
            command.args(["--node-image", image]);
        }
        let child = command
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env("RUST_LOG", "info,hostpath_provisioner=debug")
            .env("POD_NAME", &run.pod_name)
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start the operator");
        Operator { child, log, addr }
    }

    /// Waits until its /metrics shows `series` (a name and its labels) at a value `accept` takes.
    async fn wait_metric(&self, series: &str, accept: impl Fn(f64) -> bool) -> f64 {
        testbed::wait_for(&format!("the operator's {series}"), TIMEOUT, || async {
            let (code, body) = testbed::http_get(self.addr, "/metrics").await?;
            let value = body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse::<f64>().ok());
            anyhow::Ok(value.filter(|v| code == 200 && accept(*v)))
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", self.log()))
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

/// Whether the node container runs privileged with the host's /dev mounted at /dev (Block
/// volumes); checked all or nothing.
fn block_privileged(daemonset: &DaemonSet) -> bool {
    let pod = daemonset.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod spec");
    let container = pod.containers.iter().find(|c| c.name == NODE_DAEMONSET).expect("node container");
    let privileged = container.security_context.as_ref().and_then(|c| c.privileged) == Some(true);
    let mounted = container.volume_mounts.iter().flatten().any(|m| m.mount_path == "/dev");
    let volume = pod.volumes.iter().flatten().any(|v| v.host_path.as_ref().is_some_and(|h| h.path == "/dev"));
    assert!(privileged == mounted && mounted == volume, "privileged, /dev mounted, /dev a volume: all or none");
    privileged
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

fn resources_of(client: &Client) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("hostpathprovisioner.kubevirt.io", "v1beta1", "HostPathProvisioner");
    Api::all_with(client.clone(), &ApiResource::from_gvk_with_plural(&gvk, "hostpathprovisioners"))
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

/// The pull secret the operator's pods carry, which the node pods and mounters must get too.
const PULL_SECRET: &str = "regcred";

/// A stand-in for an operator replica's pod, as its ReplicaSet would make it (no kubelet runs
/// it): the operator reads its image and pull secrets through POD_NAME.
async fn stand_in_pod(client: &Client, namespace: &str, name: &str, mut spec: k8s_openapi::api::core::v1::PodSpec) {
    // Never bound to another test's node.
    spec.node_selector = Some([("hpp-e2e/stand-in".to_owned(), "nowhere".to_owned())].into());
    let pod = Pod {
        metadata: kube::api::ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
        spec: Some(spec),
        ..Default::default()
    };
    match Api::<Pod>::namespaced(client.clone(), namespace).create(&PostParams::default(), &pod).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => panic!("stand-in pod {name}: {error}"),
    }
}

/// Makes the API server serve SecurityContextConstraints (OpenShift's own CRD, from the deploy
/// tools' cache): the operator then makes its SCCs too, with rights limited to their names.
fn serve_scc_api(env: &TestEnv) {
    let dir = testbed::deploy_tool(testbed::DeployTool::Crds).unwrap_or_else(|e| panic!("{e:#}"));
    let file = dir.join("security.openshift.io_securitycontextconstraints.yaml");
    kubectl(env, &["apply", "--server-side", "-f", file.to_str().expect("utf-8 path")]);
    kubectl(
        env,
        &[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            "crd/securitycontextconstraints.security.openshift.io",
        ],
    );
}

/// One test for the whole life of a resource: a cluster has one acting resource, and the tests
/// of this binary share a control plane. The cluster serves the SCC API, as OpenShift does.
#[tokio::test(flavor = "multi_thread")]
async fn the_operator_deploys_rolls_reports_and_removes_the_node_provisioner() {
    let env = TestEnv::start("hpp-operator", 0).await;
    apply_crd(&env);
    serve_scc_api(&env);
    for replica in ["a", "b"] {
        let spec = serde_json::from_value(json!({
            "containers": [{"name": "operator", "image": "registry.example/hostpath-provisioner:e2e"}],
            "imagePullSecrets": [{"name": PULL_SECRET}],
        }))
        .expect("pod spec");
        stand_in_pod(&env.client, OPERATOR_NAMESPACE, &format!("{}-{replica}", env.group), spec).await;
    }
    // Two replicas: the first takes the Lease, the second stands by.
    let first = Operator::start(&env, "registry.example/hostpath-provisioner:e2e", "a").await;
    wait_log(&first, "holding the operator Lease").await;
    let second = Operator::start(&env, "registry.example/hostpath-provisioner:e2e", "b").await;
    wait_log(&second, "another replica holds the operator Lease").await;
    // Both answer scrapes (what HostpathProvisionerOperatorDown counts); the metrics say which acts.
    first.wait_metric("hostpath_provisioner_operator_leader", |v| v == 1.0).await;
    second.wait_metric("hostpath_provisioner_operator_leader", |v| v == 0.0).await;
    for operator in [&first, &second] {
        let (code, body) = testbed::http_get(operator.addr, "/healthz").await.expect("/healthz");
        assert_eq!(code, 200, "{body}");
        let (code, body) = testbed::http_get(operator.addr, "/readyz").await.expect("/readyz");
        assert_eq!(code, 200, "{body}");
    }
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
    let template = &daemonset.spec.as_ref().expect("spec").template;
    let pod = template.spec.as_ref().expect("pod spec");
    let secrets: Vec<_> = pod.image_pull_secrets.iter().flatten().map(|s| s.name.as_str()).collect();
    assert_eq!(secrets, [PULL_SECRET], "the operator pod's pull secrets");
    assert_eq!(pod.tolerations, None, "no toleration the resource does not ask for");
    let annotations = template.metadata.as_ref().and_then(|m| m.annotations.clone()).unwrap_or_default();
    assert_eq!(annotations.get("openshift.io/required-scc").map(String::as_str), Some("kubevirt-hostpath-provisioner"));
    let selector = format!("hostpathprovisioner.kubevirt.io/resource={name}");
    for (kind, count) in [("serviceaccount", 2), ("role", 1), ("rolebinding", 1)] {
        let made = kubectl(&env, &["get", "-n", OPERATOR_NAMESPACE, kind, "-o", "name", "-l", &selector]);
        assert_eq!(made.lines().count(), count, "{kind}: {made}");
    }
    // Made under rights limited to these names (deploy/operator/rbac.yaml), each granted to its
    // own ServiceAccount only.
    let sccs = kubectl(&env, &["get", "securitycontextconstraints", "-l", &selector, "-o", "json"]);
    let sccs: Value = serde_json::from_str(&sccs).expect("SCC list");
    let granted: Vec<(String, Value)> = sccs["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|scc| (scc["metadata"]["name"].as_str().unwrap_or_default().to_owned(), scc["users"].clone()))
        .collect();
    let user = |account: &str| json!([format!("system:serviceaccount:{OPERATOR_NAMESPACE}:{account}")]);
    assert_eq!(
        granted,
        [
            ("kubevirt-hostpath-provisioner".to_owned(), user("kubevirt-hostpath-provisioner-admin")),
            (
                "kubevirt-hostpath-provisioner-pool-mounter".to_owned(),
                user("kubevirt-hostpath-provisioner-pool-mounter")
            ),
        ]
    );
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

    // spec.releaseClaimsOfRemovedNodes: the claim releaser, with rights no node pod holds.
    claim_releaser::is_made_with_its_own_rights_and_removed_with_the_field(&env, &name).await;

    // The acting replica stops (it releases the Lease); the standby takes over and acts.
    assert!(!second.log().contains("holding the operator Lease"), "two replicas acting:\n{}", second.log());
    first.wait_metric("hostpath_provisioner_operator_reconciles_total", |v| v > 0.0).await;
    drop(first);
    wait_log(&second, "holding the operator Lease").await;
    second.wait_metric("hostpath_provisioner_operator_leader", |v| v == 1.0).await;

    pools_on_a_claim::are_mounted_per_node_and_held_back_by_volumes(&env, &name).await;
    pools_on_a_claim::of_the_kubevirt_operator_are_adopted_where_it_mounted_them_and_held_by_its_csi_volumes(
        &env, &name,
    )
    .await;

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
    wait_event(&env, &uid, "InvalidAffinity").await;
    let unchanged = wait_daemonset(&env, "the DaemonSet", |_| true).await;
    assert_eq!(node_container(&unchanged).0.get("PV_DIR").map(String::as_str), Some("/srv/hp"));

    // A misspelt field inside an embedded core object (here a toleration's `operator`) is not
    // dropped: the status and an Event name it, and the DaemonSet is left as it was.
    let patch = json!({"spec": {"workload": {"affinity": null, "tolerations": [
        {"key": "dedicated", "operater": "Exists", "effect": "NoSchedule"},
    ]}}});
    resources(&env).patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("misspelt toleration");
    let degraded = wait_resource(&env, &name, "Degraded InvalidTolerations", |r| {
        condition(r, "Degraded").is_some_and(|c| c["reason"] == "InvalidTolerations")
    })
    .await;
    let message =
        condition(&degraded, "Degraded").expect("Degraded")["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("spec.workload.tolerations[0].operater"), "names the field: {message}");
    let note = wait_event(&env, &uid, "InvalidTolerations").await;
    assert!(note.contains("spec.workload.tolerations[0].operater"), "{note}");
    let unchanged = wait_daemonset(&env, "the DaemonSet", |_| true).await;
    let pod = unchanged.spec.and_then(|s| s.template.spec).expect("pod spec");
    assert_eq!(pod.tolerations, None, "the toleration was not applied without its operator");

    a_newer_observed_version_is_left_alone_until_handed_back(&env, &name, &uid).await;

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
            "clusterrole,clusterrolebinding,securitycontextconstraints",
            "-o",
            "name",
            "-l",
            &format!("hostpathprovisioner.kubevirt.io/resource={name}"),
        ],
    );
    assert_eq!(left.trim(), "", "cluster objects left behind");
    assert!(env.pvs().get_opt(&format!("{name}-pv")).await.expect("read the PV").is_some(), "the PV was kept");
    env.pvs().delete(&format!("{name}-pv"), &Default::default()).await.expect("remove the test PV");
    for replica in ["a", "b"] {
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
        pods.delete(&format!("{}-{replica}", env.group), &DeleteParams::default()).await.expect("stand-in pod");
    }
}

/// A rollback of the operator: a resource a newer operator of this project brought to its
/// version (status.observedVersion above ours) is left alone: a spec change is not applied, the
/// Degraded condition and an Event say why. The documented hand-back (docs/upgrading.md), run as
/// written, lets the operator act again; the kubevirt operator's version (`v0.99.0`, as a
/// take-over leaves it) never stops it.
async fn a_newer_observed_version_is_left_alone_until_handed_back(env: &TestEnv, name: &str, uid: &str) {
    let set_observed = |version: &'static str| async move {
        // A newer operator's completed rollout names its version in both.
        let patch = json!({"status": {"observedVersion": version, "targetVersion": version}});
        resources(env).patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("status");
    };
    let pv_dir = |d: &DaemonSet| node_container(d).0.get("PV_DIR").cloned();
    set_observed("99.0.0").await;
    let patch = json!({"spec": {"pathConfig": {"path": "/srv/hp-newer"}, "workload": {"tolerations": null}}});
    resources(env).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("change the spec");
    let refused = wait_resource(env, name, "Degraded NewerVersionObserved", |r| {
        condition(r, "Degraded").is_some_and(|c| c["reason"] == "NewerVersionObserved")
    })
    .await;
    let message = condition(&refused, "Degraded").expect("Degraded")["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("99.0.0") && message.contains(env!("CARGO_PKG_VERSION")), "{message}");
    assert_eq!(refused.data["status"]["observedVersion"], "99.0.0", "never lowered");
    let note = wait_event(env, uid, "NewerVersionObserved").await;
    assert!(note.contains("newer operator"), "{note}");
    // Long enough for a reconcile that would apply the change to have done it.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let kept = wait_daemonset(env, "the DaemonSet", |_| true).await;
    assert_eq!(pv_dir(&kept).as_deref(), Some("/srv/hp"), "the newer operator's DaemonSet left as it was");

    let docs = testbed::documented_commands::documented_commands(&repo()).unwrap_or_else(|e| panic!("{e:#}"));
    let hand_back = docs
        .iter()
        .find(|c| c.file == "docs/upgrading.md" && c.text.starts_with("kubectl patch hostpathprovisioner <name>"))
        .expect("docs/upgrading.md hands a resource back to an older operator");
    let command = hand_back.text.replace("<name>", name);
    let kubectl_dir = env.cp.kubectl().parent().expect("kubectl's directory").to_owned();
    let path = format!("{}:{}", kubectl_dir.display(), std::env::var("PATH").unwrap_or_default());
    let ran = std::process::Command::new("bash")
        .args(["-euc", &command])
        .env("PATH", path)
        .env("KUBECONFIG", env.cp.kubeconfig_path())
        .output()
        .expect("bash");
    assert!(ran.status.success(), "{command}: {}", String::from_utf8_lossy(&ran.stderr));
    wait_daemonset(env, "the change applied once handed back", |d| pv_dir(d).as_deref() == Some("/srv/hp-newer")).await;
    wait_resource(env, name, "Degraded no longer NewerVersionObserved", |r| {
        condition(r, "Degraded").is_some_and(|c| c["reason"] != "NewerVersionObserved")
    })
    .await;

    set_observed("v0.99.0").await;
    let patch = json!({"spec": {"pathConfig": {"path": "/srv/hp"}}});
    resources(env).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("change the spec");
    wait_daemonset(env, "the change applied under the kubevirt operator's version", |d| {
        pv_dir(d).as_deref() == Some("/srv/hp")
    })
    .await;
}

/// Waits for the Event of `reason` on the resource `uid` (Events of cluster-scoped objects are in
/// `default`) and returns its note.
async fn wait_event(env: &TestEnv, uid: &str, reason: &str) -> String {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), "default");
    testbed::wait_for(&format!("the {reason} Event"), WAIT, || {
        let events = events.clone();
        async move {
            let list = events.list(&Default::default()).await?;
            Ok::<_, kube::Error>(list.items.into_iter().find_map(|e| {
                let ours = e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid)
                    && e.reason.as_deref() == Some(reason);
                ours.then(|| e.note.unwrap_or_default())
            }))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
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

const CHART: &str = "deploy/helm/hostpath-provisioner";

/// helm with its caches under the target directory, run in the repository; panics with its
/// output when it fails.
fn helm(args: &[&str]) -> String {
    let bin = testbed::deploy_tool(testbed::DeployTool::Helm).unwrap_or_else(|e| panic!("{e:#}"));
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("helm-home");
    let output = std::process::Command::new(bin)
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .current_dir(repo())
        .output()
        .expect("helm");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    assert!(output.status.success(), "helm {}:\n{}\n{}", args.join(" "), text(&output.stdout), text(&output.stderr));
    text(&output.stdout)
}

/// The chart's copies of the CRDs are deploy/operator's and deploy/snapshots'.
#[test]
fn the_charts_crd_is_deploy_operators() {
    let read = |path: &str| std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert!(
        read("deploy/helm/hostpath-provisioner/crds/hostpathprovisioners.yaml") == read("deploy/operator/crd.yaml"),
        "copy deploy/operator/crd.yaml to deploy/helm/hostpath-provisioner/crds/hostpathprovisioners.yaml"
    );
    assert!(
        read("deploy/helm/hostpath-provisioner/crds/hostpathsnapshots.yaml") == read("deploy/snapshots/crd.yaml"),
        "copy deploy/snapshots/crd.yaml to deploy/helm/hostpath-provisioner/crds/hostpathsnapshots.yaml"
    );
}

/// `helm install` in operator mode with `operator.resource`, on a fresh control plane where
/// nothing was applied before (the CRD comes from the chart's crds/). The operator then runs
/// as the chart's ServiceAccount (its token: exactly the chart's RBAC) and as a stand-in for the
/// chart's pod (its image and pull secrets), and brings the resource to Available with no
/// problem. There is no kubelet here, so the test plays the DaemonSet controller: it reports the
/// node DaemonSet rolled out on one node, which is what Available waits for.
#[tokio::test(flavor = "multi_thread")]
async fn the_chart_installs_the_operator_and_its_resource_in_one_install_and_reaches_available_under_its_rbac() {
    let cp = testbed::ControlPlane::start().await.unwrap_or_else(|e| panic!("{e:#}"));
    let logs = cp.logs_on_failure();
    let client = cp.admin_client();
    let namespace = "hpp-system";
    let kubeconfig = cp.kubeconfig_path().to_str().expect("utf-8 path").to_owned();
    let out = helm(&[
        "install",
        "hpp",
        CHART,
        "--namespace",
        namespace,
        "--create-namespace",
        "--kubeconfig",
        &kubeconfig,
        "--set",
        "operator.enabled=true",
        "--set",
        &format!("imagePullSecrets[0].name={PULL_SECRET}"),
        "--set-json",
        r#"operator.resource={"storagePools":[{"name":"local","path":"/var/hpvolumes"}]}"#,
    ]);
    assert!(out.contains("STATUS: deployed"), "{out}");
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let made = daemonsets.list(&Default::default()).await.expect("list DaemonSets");
    assert!(made.items.is_empty(), "the operator makes the DaemonSet, not the chart");

    let operator = "hpp-hostpath-provisioner-operator";
    let deployment = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), namespace)
        .get(operator)
        .await
        .expect("the chart's operator Deployment");
    let template = deployment.spec.expect("spec").template.spec.expect("pod spec");
    let image = template.containers[0].image.clone().expect("image");
    let pod_name = format!("{operator}-stand-in");
    stand_in_pod(&client, namespace, &pod_name, template).await;
    let run = OperatorRun { cp: &cp, client: client.clone(), namespace, account: operator, node_image: None, pod_name };
    let _operator = Operator::start_as(&run).await;

    let api = resources_of(&client);
    let available = testbed::wait_for("the chart's resource Available", WAIT, || {
        let (daemonsets, api) = (daemonsets.clone(), api.clone());
        async move {
            if let Some(daemonset) = daemonsets.get_opt(NODE_DAEMONSET).await? {
                report_rolled_out(&daemonsets, &daemonset).await?;
            }
            let resource = api.get_opt("hostpath-provisioner").await?;
            Ok::<_, kube::Error>(resource.filter(|r| condition(r, "Available").is_some_and(|c| c["status"] == "True")))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", _operator.log()));
    let degraded = condition(&available, "Degraded").expect("Degraded");
    assert_eq!(degraded["status"], "False", "every object applied under the chart's RBAC: {degraded}");
    let daemonset = daemonsets.get(NODE_DAEMONSET).await.expect("the node DaemonSet");
    let (_, node_image, _) = node_container(&daemonset);
    assert_eq!(node_image, Some(image), "the chart pod's image");
    let pod = daemonset.spec.and_then(|s| s.template.spec).expect("pod spec");
    let secrets: Vec<_> = pod.image_pull_secrets.iter().flatten().map(|s| s.name.clone()).collect();
    assert_eq!(secrets, [PULL_SECRET], "the chart's imagePullSecrets");
    logs.passed();
}

/// Writes what the DaemonSet controller reports once the current template runs, available, on
/// one node (the controllers of this control plane do not include it).
async fn report_rolled_out(api: &Api<DaemonSet>, daemonset: &DaemonSet) -> Result<(), kube::Error> {
    let generation = daemonset.metadata.generation.unwrap_or(0);
    if daemonset.status.as_ref().and_then(|s| s.observed_generation) == Some(generation) {
        return Ok(());
    }
    let status = json!({"status": {
        "observedGeneration": generation,
        "desiredNumberScheduled": 1, "currentNumberScheduled": 1, "updatedNumberScheduled": 1,
        "numberReady": 1, "numberAvailable": 1, "numberMisscheduled": 0,
    }});
    let name = daemonset.metadata.name.as_deref().unwrap_or_default();
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.map(|_| ())
}

/// The node provisioner's features through Helm operator mode on a fresh cluster: the chart
/// carries config.*, quota.enabled and pools (one pool over two disks, with options) into the
/// resource; the operator, under the chart's RBAC, renders them into the node DaemonSet (each
/// setting's env var, SYS_ADMIN, a mount per disk) and makes the CSIDriver of published capacity,
/// owned by the resource; `helm upgrade` turning publishing off removes it. A setting the node
/// binary would refuse is refused in the status naming the field, the DaemonSet left as it was;
/// a field the resource does not have is refused by `kubectl apply`.
#[tokio::test(flavor = "multi_thread")]
async fn operator_mode_turns_on_the_node_features_and_the_operator_renders_them() {
    let cp = testbed::ControlPlane::start().await.unwrap_or_else(|e| panic!("{e:#}"));
    let logs = cp.logs_on_failure();
    let client = cp.admin_client();
    let namespace = "hpp-features";
    let kubeconfig = cp.kubeconfig_path().to_str().expect("utf-8 path").to_owned();
    let dir = tempfile::tempdir().expect("temp dir");
    let values = dir.path().join("values.yaml");
    // The upgrade turns publishing off and Block volumes on.
    let write_values = |publish: bool| {
        let publish_off = !publish;
        std::fs::write(
            &values,
            format!(
                "operator: {{enabled: true, resource: {{workload: {{nodeSelector: {{kubernetes.io/os: linux}}}}}}}}\n\
                 config: {{provisionerName: hostpath.example.org, publishCapacity: {publish}, \
                 nodeAffinityKeys: example.com/disk-serial, capacityAccounting: requests, maxConcurrency: 4, \
                 logFormat: json, blockVolumes: {publish_off}, blockDeviceDir: /dev/hpp-block}}\n\
                 quota: {{enabled: true}}\n\
                 pools: [{{name: data, path: /mnt/disk1, reserve: 1Gi}}, {{name: data, path: /mnt/disk2, requireMountpoint: true}}]\n"
            ),
        )
        .expect("values");
    };
    write_values(true);
    let values_path = values.to_str().expect("utf-8 path").to_owned();
    let helm_in = |verb: &str| {
        helm(&[
            verb,
            "hpp",
            CHART,
            "--namespace",
            namespace,
            "--create-namespace",
            "--kubeconfig",
            &kubeconfig,
            "-f",
            &values_path,
        ])
    };
    let out = helm_in("install");
    assert!(out.contains("STATUS: deployed"), "{out}");
    let operator = "hpp-hostpath-provisioner-operator";
    let deployment = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), namespace)
        .get(operator)
        .await
        .expect("the chart's operator Deployment");
    let template = deployment.spec.expect("spec").template.spec.expect("pod spec");
    let pod_name = format!("{operator}-stand-in");
    stand_in_pod(&client, namespace, &pod_name, template).await;
    let run = OperatorRun { cp: &cp, client: client.clone(), namespace, account: operator, node_image: None, pod_name };
    let operator_process = Operator::start_as(&run).await;

    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let daemonset = testbed::wait_for("the node DaemonSet", WAIT, || {
        let daemonsets = daemonsets.clone();
        async move { daemonsets.get_opt(NODE_DAEMONSET).await }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", operator_process.log()));
    let (vars, _, _) = node_container(&daemonset);
    for (variable, value) in [
        ("PROVISIONER_NAME", "hostpath.example.org"),
        ("PUBLISH_CAPACITY", "true"),
        ("NODE_AFFINITY_KEYS", "example.com/disk-serial"),
        ("CAPACITY_ACCOUNTING", "requests"),
        ("MAX_CONCURRENCY", "4"),
        ("LOG_FORMAT", "json"),
        ("BLOCK_DEVICE_DIR", "/dev/hpp-block"),
        ("STORAGE_POOLS", "data=/mnt/disk1,reserve=1Gi,data=/mnt/disk2,mountpoint"),
    ] {
        assert_eq!(vars.get(variable).map(String::as_str), Some(value), "{variable}");
    }
    let pod = daemonset.spec.as_ref().and_then(|s| s.template.spec.clone()).expect("pod spec");
    let container = pod.containers.iter().find(|c| c.name == NODE_DAEMONSET).expect("node container");
    let added = container.security_context.as_ref().and_then(|s| s.capabilities.as_ref()).and_then(|c| c.add.clone());
    assert!(added.unwrap_or_default().iter().any(|c| c == "SYS_ADMIN"), "quota.enabled: SYS_ADMIN");
    let mounts: Vec<_> = container.volume_mounts.iter().flatten().map(|m| m.mount_path.as_str()).collect();
    assert!(mounts.contains(&"/mnt/disk1") && mounts.contains(&"/mnt/disk2"), "{mounts:?}");
    // blockVolumes false is the chart's default, so not carried: unset, off.
    assert_eq!(vars.get("BLOCK_VOLUMES"), None);
    assert!(!block_privileged(&daemonset), "Block volumes off: unprivileged, no /dev");
    let drivers: Api<k8s_openapi::api::storage::v1::CSIDriver> = Api::all(client.clone());
    let driver = wait_present(&drivers, "hostpath.example.org", true).await;
    assert_eq!(driver.spec.storage_capacity, Some(true));
    let owner = &driver.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("HostPathProvisioner", "hostpath-provisioner"));
    // The chart's classes name the provisioner the DaemonSet serves.
    let class = kubectl_on(&cp, &["get", "storageclass", "hostpath-provisioner", "-o", "jsonpath={.provisioner}"]);
    assert_eq!(class, "hostpath.example.org");
    // One status per pool, though listed once per disk.
    let api = resources_of(&client);
    let reported = testbed::wait_for("the pool statuses", WAIT, || {
        let api = api.clone();
        async move {
            let resource = api.get_opt("hostpath-provisioner").await?;
            Ok::<_, kube::Error>(resource.filter(|r| r.data["status"]["storagePoolStatuses"].is_array()))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(reported.data["status"]["storagePoolStatuses"].as_array().map(Vec::len), Some(1));

    // Publishing turned off by the documented upgrade: the operator removes its CSIDriver.
    write_values(false);
    let out = helm_in("upgrade");
    assert!(out.contains("STATUS: deployed"), "{out}");
    wait_present(&drivers, "hostpath.example.org", false).await;
    // Block volumes turned on by the same upgrade: the operator makes the node container
    // privileged with the host's /dev mounted (loop devices, device nodes).
    let block = testbed::wait_for("the privileged node DaemonSet", WAIT, || {
        let daemonsets = daemonsets.clone();
        async move { daemonsets.get_opt(NODE_DAEMONSET).await.map(|d| d.filter(block_privileged)) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", operator_process.log()));
    assert_eq!(node_container(&block).0.get("BLOCK_VOLUMES").map(String::as_str), Some("true"));

    // A value the node binary refuses (the schema cannot say it): refused in the status, naming
    // the field, and the DaemonSet left as it was.
    let before = daemonsets.get(NODE_DAEMONSET).await.expect("DaemonSet").metadata.generation;
    let patch = json!({"spec": {"config": {"orphanSnapshotCopyGrace": "soon"}}});
    api.patch("hostpath-provisioner", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    let degraded = testbed::wait_for("Degraded InvalidNodeSetting", WAIT, || {
        let api = api.clone();
        async move {
            let resource = api.get_opt("hostpath-provisioner").await?;
            Ok::<_, kube::Error>(
                resource.filter(|r| condition(r, "Degraded").is_some_and(|c| c["reason"] == "InvalidNodeSetting")),
            )
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", operator_process.log()));
    let message =
        condition(&degraded, "Degraded").expect("Degraded")["message"].as_str().unwrap_or_default().to_owned();
    assert!(message.contains("spec.config.orphanSnapshotCopyGrace") && message.contains("soon"), "{message}");
    let after = daemonsets.get(NODE_DAEMONSET).await.expect("DaemonSet");
    assert_eq!(after.metadata.generation, before, "the DaemonSet was left as it was");
    assert_eq!(node_container(&after).0.get("ORPHAN_SNAPSHOT_COPY_GRACE"), None);

    // A setting the resource has no field for: kubectl refuses the unknown field (docs/install.md,
    // "What each path can turn on").
    let file = dir.path().join("unknown.yaml");
    std::fs::write(
        &file,
        "apiVersion: hostpathprovisioner.kubevirt.io/v1beta1\nkind: HostPathProvisioner\nmetadata: {name: unknown-field}\n\
         spec: {storagePools: [{name: a, path: /var/a}], config: {nodeLeaseSeconds: 60}}\n",
    )
    .expect("file");
    let refused = cp
        .run_kubectl(&repo(), &["apply", "--dry-run=server", "-f", file.to_str().expect("utf-8 path")])
        .expect_err("an unknown field is refused");
    assert!(format!("{refused:#}").contains("nodeLeaseSeconds"), "{refused:#}");
    drop(operator_process);
    logs.passed();
}

fn kubectl_on(cp: &testbed::ControlPlane, args: &[&str]) -> String {
    cp.run_kubectl(&repo(), args).unwrap_or_else(|e| panic!("{e:#}"))
}

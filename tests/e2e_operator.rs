//! End-to-end: the `HostPathProvisioner` resource on the real control plane. The CRD of
//! deploy/operator applies; the example resources (whose specs are the kubevirt operator's examples,
//! unchanged) are accepted; each bad resource is refused at admission with the message that says what to
//! change; the operator process renders the node DaemonSet for a resource, rolls it when the
//! resource changes, and removes what it made when the resource is deleted.

mod common;

use std::path::PathBuf;

use common::*;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

const CRD: &str = "deploy/operator/crd.yaml";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn kubectl(env: &TestEnv, args: &[&str]) -> String {
    env.cp.run_kubectl(&repo(), args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Applies the CRD (idempotent; the tests of this binary share a control plane) and waits until
/// the API server serves it.
fn apply_crd(env: &TestEnv) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    kubectl(env, &["apply", "--server-side", "-f", CRD]);
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

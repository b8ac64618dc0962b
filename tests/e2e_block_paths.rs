//! End-to-end: Block volumes (issue #47) turned on by each install path. What the chart
//! (`config.blockVolumes`), the kustomize component `block-volumes` and the operator's resource
//! (`spec.config.blockVolumes`) render for the node container, its Block settings given to a
//! provisioner process as the node (root, real loop devices): each serves a Block claim, a loop
//! device of its file exposed in the device directory the path named.
//!
//! Each path names a device directory of its own under the host's /dev (a provisioner removes
//! the nodes there that name none of its volumes). Every loop on a file of the node's pool and the
//! device directory are removed when a case ends, passed or failed.

mod common;
mod helm;

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use common::*;
use hostpath_provisioner::deciding::operator::render::{Environment, NODE_CONTAINER, render};
use hostpath_provisioner::deciding::operator::resource::HostPathProvisioner;
use serde_json::{Value, json};
use testbed::fixtures;

/// The Block settings of the node container (BLOCK_VOLUMES, BLOCK_DEVICE_DIR), checked to come
/// with the privilege they need: privileged, the host's /dev mounted at /dev.
fn block_settings(daemonset: &Value) -> Vec<(String, String)> {
    let pod = &daemonset["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().expect("containers");
    let container = containers.iter().find(|c| c["name"] == NODE_CONTAINER).unwrap_or(&containers[0]);
    assert_eq!(container["securityContext"]["privileged"], true, "{container}");
    let dev = pod["volumes"].as_array().expect("volumes").iter().find(|v| v["hostPath"]["path"] == "/dev");
    let dev = dev.expect("the host's /dev is a volume");
    let mounts = container["volumeMounts"].as_array().expect("mounts");
    assert!(mounts.iter().any(|m| m["mountPath"] == "/dev" && m["name"] == dev["name"]), "{mounts:?}");
    let settings: Vec<(String, String)> = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter(|e| e["name"].as_str().is_some_and(|n| n.starts_with("BLOCK_")))
        .map(|e| {
            (e["name"].as_str().unwrap_or_default().to_owned(), e["value"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    assert_eq!(settings.len(), 2, "{settings:?}");
    settings
}

/// The attached loops whose backing file (as sysfs names it) lies under `dir`.
fn loops_under(dir: &Path) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/block").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(number) = name.strip_prefix("loop").and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file"))
            && backing.starts_with(&*dir.to_string_lossy())
        {
            found.push(number);
        }
    }
    found
}

/// Detaches, on drop, every loop on a file of `pool`, and removes the device directory.
struct BlockCleanup {
    pool: PathBuf,
    devices: PathBuf,
}

impl Drop for BlockCleanup {
    fn drop(&mut self) {
        for number in loops_under(&self.pool) {
            let _ = std::process::Command::new("losetup").arg("-d").arg(format!("/dev/loop{number}")).status();
        }
        let _ = std::fs::remove_dir_all(&self.devices);
    }
}

/// A node started with `settings` serves a Block claim in `devices`, and deleting it leaves no
/// node and no loop.
async fn serves_a_block_claim(test: &str, settings: &[(String, String)], devices: &Path) {
    let mut env = TestEnv::start(test, 0).await;
    let node = format!("{}-1", env.group);
    env.add_node(&node, &|spec| settings.iter().fold(spec, |spec, (name, value)| spec.env(name, value))).await;
    let pool = env.nodes[0].pool_root.clone();
    let _cleanup = BlockCleanup { pool: pool.clone(), devices: devices.to_owned() };
    let class = env.class("block", |c| c).await;
    env.create_claim(fixtures::claim(&env.ns, "disk", &class, "8Mi").provision_on_node(&node).block()).await;
    let pv = env.wait_bound("disk").await;
    let pv_name = pv.metadata.name.clone().expect("name");
    let path = PathBuf::from(&pv.spec.expect("spec").local.expect("a local PV").path);
    assert_eq!(path, devices.join(&pv_name), "{test}: the node in the path's device directory");
    assert!(std::fs::metadata(&path).expect("device node").file_type().is_block_device(), "{test}");
    assert_eq!(loops_under(&pool).len(), 1, "{test}: one loop on the volume's file");
    env.delete_claim("disk").await;
    env.wait_pv_gone(&pv_name).await;
    assert!(!path.exists() && loops_under(&pool).is_empty(), "{test}: no node, no loop left");
}

fn unique_device_dir(test: &str) -> PathBuf {
    PathBuf::from("/dev").join(testbed::unique_name(test))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_charts_block_volumes_serve_a_block_claim() {
    let devices = unique_device_dir("hpp-e2e-chart-block");
    let rendered = helm::helm(&[
        "template",
        "hpp",
        helm::CHART,
        "--set",
        "config.blockVolumes=true",
        "--set",
        &format!("config.blockDeviceDir={}", devices.display()),
    ]);
    let objects: Vec<Value> = serde_saphyr::from_multiple(&rendered).expect("rendered YAML");
    let daemonset = objects.iter().find(|o| o["kind"] == "DaemonSet").expect("the node DaemonSet");
    let settings = block_settings(daemonset);
    assert!(settings.contains(&("BLOCK_VOLUMES".into(), "true".into())), "{settings:?}");
    serves_a_block_claim("chart-block", &settings, &devices).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kustomize_components_block_volumes_serve_a_block_claim() {
    let devices = unique_device_dir("hpp-e2e-kustomize-block");
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // A user's kustomization of deploy/legacy with the component, in the checkout (kustomize
    // takes relative paths only).
    let dir = tempfile::Builder::new().prefix(".block-paths-").tempdir_in(&repo).expect("temp dir in the checkout");
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "resources: [../deploy/legacy, settings.yaml]\ncomponents: [../deploy/components/block-volumes]\n",
    )
    .expect("kustomization");
    std::fs::write(
        dir.path().join("settings.yaml"),
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hostpath-provisioner-settings\n  \
             annotations: {{config.kubernetes.io/local-config: \"true\"}}\ndata: {{BLOCK_DEVICE_DIR: {}}}\n",
            devices.display()
        ),
    )
    .expect("settings");
    let cp = testbed::shared_control_plane().await.expect("control plane");
    let output = std::process::Command::new(cp.kubectl())
        .args(["kustomize", dir.path().to_str().expect("utf-8 path")])
        .output()
        .expect("kubectl kustomize");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let objects: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8_lossy(&output.stdout)).expect("rendered YAML");
    let daemonset = objects.iter().find(|o| o["kind"] == "DaemonSet").expect("the node DaemonSet");
    let settings = block_settings(daemonset);
    assert!(settings.contains(&("BLOCK_DEVICE_DIR".into(), devices.display().to_string())), "{settings:?}");
    serves_a_block_claim("kustomize-block", &settings, &devices).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operators_block_volumes_serve_a_block_claim() {
    let devices = unique_device_dir("hpp-e2e-operator-block");
    let resource: HostPathProvisioner = serde_json::from_value(json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1",
        "kind": "HostPathProvisioner",
        "metadata": {"name": "hostpath-provisioner"},
        "spec": {
            "storagePools": [{"name": "local", "path": "/var/hpvolumes"}],
            "config": {"blockVolumes": true, "blockDeviceDir": devices.display().to_string()},
        },
    }))
    .expect("resource");
    let environment = Environment {
        namespace: "hpp".into(),
        image: "registry.example.com/hostpath-provisioner:0.1.0".into(),
        openshift: false,
        prometheus: false,
        held_pools: Vec::new(),
        pool_roots: Vec::new(),
        image_pull_secrets: Vec::new(),
    };
    let rendered = render(&resource, &environment);
    assert!(rendered.problems.is_empty(), "{:?}", rendered.problems);
    let daemonset = &rendered.objects.iter().find(|o| o.kind == "DaemonSet").expect("the node DaemonSet").body;
    let settings = block_settings(daemonset);
    serves_a_block_claim("operator-block", &settings, &devices).await;
}

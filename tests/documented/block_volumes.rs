//! docs/volumes.md, "Turning Block volumes on": the Helm command on an installed release and the
//! operator resource's patch, run as written. Each turns BLOCK_VOLUMES on and, with it, the
//! privilege Block volumes need (a privileged node container with the host's /dev mounted);
//! before, the node container is unprivileged. The kustomize path is the component, run as
//! written by `the_kustomize_components_install_and_upgrade_as_written`.

use hostpath_provisioner::deciding::operator::render::{Environment, NODE_CONTAINER, render};
use hostpath_provisioner::deciding::operator::resource::HostPathProvisioner;

use super::*;

const SECTION: &str = "Turning Block volumes on";
const HELM_DAEMONSET: [&str; 4] = ["daemonset", "hostpath-provisioner", "-n", "hostpath-provisioner"];

/// The node container is privileged with the host's /dev mounted at /dev, all or nothing.
fn privileged_with_dev(pod: &Value, container: &Value) -> bool {
    let dev_volume = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["hostPath"]["path"] == "/dev")
        .map(|v| v["name"].clone());
    let mounted = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["mountPath"] == "/dev" && Some(&m["name"]) == dev_volume.as_ref());
    let privileged = container["securityContext"]["privileged"] == true;
    assert_eq!(privileged, mounted, "privileged and /dev mounted go together: {container}");
    privileged
}

#[tokio::test(flavor = "multi_thread")]
async fn turning_block_volumes_on_runs_as_written_by_helm_and_the_operators_resource() {
    let docs = Docs::load();
    let mut shell =
        Shell::with_cluster("turning_block_volumes_on_runs_as_written_by_helm_and_the_operators_resource").await;

    // An installed release (the harness's install, not a step of this section).
    let installed = shell.bash(
        "helm install hostpath-provisioner deploy/helm/hostpath-provisioner -n hostpath-provisioner \
         --create-namespace --set image.registry=registry.example.com",
    );
    assert!(installed.success, "{}\n{}", installed.stdout, installed.stderr);
    let before = shell.must_get(&HELM_DAEMONSET);
    assert!(!privileged_with_dev(&before["spec"]["template"]["spec"], container(&before)), "off by default");
    assert_eq!(env_value(container(&before), "BLOCK_VOLUMES"), Some("false"));

    let out = shell.run(&docs.command("docs/volumes.md", SECTION, "helm upgrade"));
    assert!(out.contains("STATUS: deployed"), "{out}");
    let after = shell.must_get(&HELM_DAEMONSET);
    assert!(privileged_with_dev(&after["spec"]["template"]["spec"], container(&after)), "{after}");
    assert_eq!(env_value(container(&after), "BLOCK_VOLUMES"), Some("true"));
    assert_eq!(env_value(container(&after), "BLOCK_DEVICE_DIR"), Some("/dev/hostpath-provisioner"));
    // --reuse-values kept the install's own values.
    assert_eq!(container(&after)["image"], container(&before)["image"]);

    // The operator's resource: the CRD and a resource (the harness's), then the documented patch.
    shell.kubectl(&["apply", "--server-side", "-f", "deploy/operator/crd.yaml"]);
    shell.kubectl(&[
        "wait",
        "--for",
        "condition=Established",
        "--timeout=90s",
        "crd/hostpathprovisioners.hostpathprovisioner.kubevirt.io",
    ]);
    let resource = shell.dir().join("resource.yaml");
    std::fs::write(
        &resource,
        "apiVersion: hostpathprovisioner.kubevirt.io/v1beta1\nkind: HostPathProvisioner\n\
         metadata: {name: hostpath-provisioner}\nspec: {storagePools: [{name: local, path: /var/hpvolumes}]}\n",
    )
    .expect("resource");
    shell.kubectl(&["apply", "-f", resource.to_str().expect("utf-8 path")]);
    shell.run(&docs.command("docs/volumes.md", SECTION, "kubectl patch hostpathprovisioner"));
    let patched = shell.must_get(&["hostpathprovisioner", "hostpath-provisioner"]);
    assert_eq!(patched["spec"]["config"]["blockVolumes"], true, "{patched}");
    // What the operator makes of it (tests/e2e_operator.rs runs the operator on the same field).
    let patched: HostPathProvisioner = serde_json::from_value(patched).expect("the operator reads the resource");
    let environment = Environment {
        namespace: "hostpath-provisioner".into(),
        image: "registry.example.com/hostpath-provisioner:0.1.0".into(),
        openshift: false,
        prometheus: false,
        held_pools: Vec::new(),
        pool_roots: Vec::new(),
        image_pull_secrets: Vec::new(),
    };
    let rendered = render(&patched, &environment);
    assert!(rendered.problems.is_empty(), "{:?}", rendered.problems);
    let daemonset = &rendered.objects.iter().find(|o| o.kind == "DaemonSet").expect("the node DaemonSet").body;
    let pod = &daemonset["spec"]["template"]["spec"];
    let node = pod["containers"].as_array().expect("containers").iter().find(|c| c["name"] == NODE_CONTAINER);
    let node = node.expect("the node container");
    assert!(privileged_with_dev(pod, node), "{daemonset}");
    assert_eq!(env_value(node, "BLOCK_VOLUMES"), Some("true"));
    shell.finish();
}

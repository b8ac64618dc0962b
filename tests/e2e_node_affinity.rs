//! End-to-end: a class's `nodeAffinityKey` (docs/volumes.md) against a real control plane: the
//! volume is pinned to the label's value, not to the node's name; after the node is reinstalled
//! under a new name with the same label and disk, the new node's provisioner reclaims the volume
//! as its own; a node that does not serve the key, or lacks the label, refuses with the reason;
//! the volumes of plain classes on a serving node are reclaimed as before.

mod common;

use std::path::Path;

use common::*;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::api::{Api, DeleteParams};
use testbed::{ProvisionerSpec, SimNode, fixtures};

// A key a kubelet cannot set on its own Node (docs/volumes.md).
const KEY: &str = "node-restriction.kubernetes.io/disk";

/// A simulated node named `name` whose Node carries `labels`, with a provisioner on `pool` set
/// up by `adjust`, ready.
async fn node_on(
    env: &mut TestEnv,
    name: &str,
    labels: &[(&str, &str)],
    pool: &Path,
    adjust: impl Fn(ProvisionerSpec) -> ProvisionerSpec,
) {
    let mut all = vec![(GROUP_LABEL, env.group.as_str())];
    all.extend_from_slice(labels);
    env.cp.add_node_labeled(name, name, &all).await.expect("add node");
    let spec = adjust(
        ProvisionerSpec::new(binary(), name, pool, env.cp.kubeconfig_path())
            .env("PROVISIONER_NAME", &env.provisioner)
            .env("NODE_LEASE_SECONDS", "4"),
    );
    let mut provisioner = testbed::Provisioner::spawn(spec, env.cp.temp_dir()).expect("spawn provisioner");
    provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("provisioner ready");
    env.nodes.push(SimNode {
        name: name.to_owned(),
        hostname: name.to_owned(),
        pool_root: pool.to_owned(),
        provisioner,
    });
}

fn host_path(pv: &PersistentVolume) -> std::path::PathBuf {
    pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone().into()).expect("hostPath")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_pinned_to_a_disk_label_is_reclaimed_by_the_node_reinstalled_under_a_new_name() {
    let mut env = TestEnv::start("affinity", 0).await;
    let disk = testbed::pool_root_for(env.cp, &format!("{}-disk", env.group));
    std::fs::create_dir_all(&disk).unwrap();
    let serial = env.group.clone();
    let serving = |spec: ProvisionerSpec| spec.env("NODE_AFFINITY_KEYS", KEY);
    let old = format!("{}-old", env.group);
    node_on(&mut env, &old, &[(KEY, &serial)], &disk, serving).await;
    let pinned = env.class("disk", |c| c.immediate().parameter("nodeAffinityKey", KEY)).await;
    let plain = env.class("plain", |c| c.immediate()).await;

    env.create_claim(fixtures::claim(&env.ns, "data", &pinned, "1Mi").provision_on_node(&old)).await;
    let pv = env.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let term =
        &pv.spec.as_ref().unwrap().node_affinity.as_ref().unwrap().required.as_ref().unwrap().node_selector_terms[0];
    let expression = &term.match_expressions.as_ref().unwrap()[0];
    assert_eq!(
        (expression.key.as_str(), expression.values.clone().unwrap_or_default()),
        (KEY, vec![serial.clone()]),
        "pinned to the disk's label, not the node's name"
    );
    let annotations = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get("hostpath-provisioner.kubevirt.io/node-affinity"), Some(&format!("{KEY}={serial}")));
    let dir = host_path(&pv);
    std::fs::write(dir.join("data"), b"on the disk").unwrap();
    // A plain class's volume on the same node: its own watch still sees it.
    env.create_claim(fixtures::claim(&env.ns, "plain", &plain, "1Mi").provision_on_node(&old)).await;
    let plain_pv = env.wait_bound("plain").await;
    let plain_dir = host_path(&plain_pv);

    // The node is reinstalled under a new name: the old provisioner and Node go, the disk and
    // its label come back on the new one.
    env.nodes[0].provisioner.terminate();
    Api::<Node>::all(env.client.clone()).delete(&old, &DeleteParams::default()).await.expect("delete Node");
    let new = format!("{}-new", env.group);
    node_on(&mut env, &new, &[(KEY, &serial)], &disk, serving).await;
    assert_eq!(std::fs::read(dir.join("data")).unwrap(), b"on the disk");

    // Its provisioner takes the volume as its own: the claim goes, the data and PV with it.
    env.delete_claim("data").await;
    env.wait_pv_gone(&pv_name).await;
    wait_path_gone(&dir).await;
    // The plain volume stays named after the old node: not the new node's to reclaim.
    assert!(plain_dir.is_dir());

    // A node not serving the key, and one serving it without the label, each say why.
    let other_pool = testbed::pool_root_for(env.cp, &format!("{}-other", env.group));
    std::fs::create_dir_all(&other_pool).unwrap();
    let unserving = format!("{}-unserving", env.group);
    node_on(&mut env, &unserving, &[(KEY, "sn-elsewhere")], &other_pool, |spec| spec).await;
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "unserved", &pinned, "1Mi").provision_on_node(&unserving)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains(&format!("add {KEY} to the provisioner's NODE_AFFINITY_KEYS")), "{note}");
    let unlabelled_pool = testbed::pool_root_for(env.cp, &format!("{}-unlabelled", env.group));
    std::fs::create_dir_all(&unlabelled_pool).unwrap();
    let unlabelled = format!("{}-unlabelled", env.group);
    node_on(&mut env, &unlabelled, &[], &unlabelled_pool, serving).await;
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "unlabelled", &pinned, "1Mi").provision_on_node(&unlabelled)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains(&format!("has no label {KEY}")), "{note}");
}

/// A second node with a copied label and no directory (a kubelet setting a label on its own
/// Node, docs/volumes.md): while the real holder is live (here crashed, its lease still valid),
/// the copy never lets the PV go: it stays Released with the data on the holder, and the
/// duplicate is reported on the PV. Once the holder runs again, it deletes data and PV as before.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_with_a_copied_disk_label_and_no_directory_never_lets_the_holders_volume_go() {
    let mut env = TestEnv::start("affinity-dup", 0).await;
    let disk = testbed::pool_root_for(env.cp, &format!("{}-disk", env.group));
    std::fs::create_dir_all(&disk).unwrap();
    let serial = env.group.clone();
    let holder = format!("{}-holder", env.group);
    // A lease long enough that the crashed holder stays live for the copy's whole look.
    node_on(&mut env, &holder, &[(KEY, &serial)], &disk, |spec| {
        spec.env("NODE_AFFINITY_KEYS", KEY).env("NODE_LEASE_SECONDS", "120")
    })
    .await;
    let pinned = env.class("disk", |c| c.immediate().parameter("nodeAffinityKey", KEY)).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &pinned, "1Mi").provision_on_node(&holder)).await;
    let pv = env.wait_bound("data").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let pv_uid = pv.metadata.uid.clone().unwrap();
    let dir = host_path(&pv);
    std::fs::write(dir.join("data"), b"the holder's").unwrap();

    // The copy: same label value, its own (empty) disk at the same path, as on another machine.
    let copy_disk = testbed::pool_root_for(env.cp, &format!("{}-copy-disk", env.group));
    std::fs::create_dir_all(&copy_disk).unwrap();
    let copy = format!("{}-copy", env.group);
    let (common, own) = (disk.clone(), copy_disk.clone());
    node_on(&mut env, &copy, &[(KEY, &serial)], &copy_disk, move |mut spec| {
        spec.pool_root = common.clone();
        spec.env("NODE_AFFINITY_KEYS", KEY).private_mount(own.clone(), common.clone())
    })
    .await;

    // The holder crashes (its lease stays), then the claim goes.
    env.nodes[0].provisioner.kill();
    env.delete_claim("data").await;
    let note = env.wait_event("default", &pv_uid, "DuplicateAffinityLabel").await;
    assert!(note.contains(&copy) && note.contains(&format!("live node(s) {holder}")), "{note}");
    for _ in 0..10 {
        let now = env.pvs().get_opt(&pv_name).await.unwrap().expect("the PV stays while the holder is live");
        assert_eq!(now.status.and_then(|s| s.phase).as_deref(), Some("Released"));
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
    assert_eq!(std::fs::read(dir.join("data")).unwrap(), b"the holder's", "data intact on the holder");
    let log = env.nodes[1].provisioner.log_tail(200);
    assert!(log.lines().any(|l| l.contains("WARN") && l.contains("carry it too") && l.contains(&pv_name)), "{log}");
    let metrics = env.nodes[1].provisioner.metrics().await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("hostpath_provisioner_duplicate_affinity_labels_total ") && !l.ends_with(" 0")),
        "counted:\n{metrics}"
    );

    // The holder back: it deletes its data and the PV, as before.
    env.nodes[0].provisioner.restart().expect("restart holder");
    env.wait_pv_gone(&pv_name).await;
    wait_path_gone(&dir).await;
}

/// Two live nodes carrying one value are reported before any volume is reclaimed: the node that
/// starts second finds the first at once and says so on its Node, in its log and metrics, and
/// `doctor` on it says so too.
#[tokio::test(flavor = "multi_thread")]
async fn two_live_nodes_with_one_value_are_reported_at_start_before_any_volume_is_reclaimed() {
    let mut env = TestEnv::start("affinity-shared", 0).await;
    let serial = env.group.clone();
    let (first, second) = (format!("{}-a", env.group), format!("{}-b", env.group));
    let mut pools = Vec::new();
    for name in [&first, &second] {
        let pool = testbed::pool_root_for(env.cp, name);
        std::fs::create_dir_all(&pool).unwrap();
        node_on(&mut env, name, &[(KEY, &serial)], &pool, |spec| spec.env("NODE_AFFINITY_KEYS", KEY)).await;
        pools.push(pool);
    }
    let node_uid = Api::<Node>::all(env.client.clone()).get(&second).await.unwrap().metadata.uid.unwrap();
    let note = env.wait_event("default", &node_uid, "DuplicateAffinityLabel").await;
    assert!(
        note.contains(&format!("{KEY}={serial}")) && note.contains(&format!("live node(s) {first}")),
        "names the label and the other node: {note}"
    );
    let log = env.nodes[1].provisioner.log_tail(200);
    assert!(log.lines().any(|l| l.contains("WARN") && l.contains(&format!("so do live node(s) {first}"))), "{log}");
    let metrics = env.nodes[1].provisioner.metrics().await.unwrap();
    assert!(metrics.lines().any(|l| l == "hostpath_provisioner_affinity_labels_shared 1"), "{metrics}");

    let output = std::process::Command::new(binary())
        .args(["doctor", "--output", "json", "--node-name", &second, "--kubeconfig"])
        .arg(env.cp.kubeconfig_path())
        .arg("--pv-dir")
        .arg(&pools[1])
        .env_clear()
        .env("NODE_AFFINITY_KEYS", KEY)
        .env("PROVISIONER_NAME", &env.provisioner)
        .env("NODE_LEASE_SECONDS", "4")
        .output()
        .expect("doctor");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stderr)));
    let finding = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["check"] == "affinity_label_shared")
        .unwrap_or_else(|| panic!("no affinity_label_shared finding: {report:#}"));
    assert_eq!(finding["severity"], "warning");
    assert!(finding["message"].as_str().unwrap_or_default().contains(&first), "{finding}");
}

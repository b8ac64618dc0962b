use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
use serde_json::json;

use super::*;
use crate::deciding::kept_volume::KeptVolume;

fn pool(name: &str, path: &str, modes: &[&str]) -> PoolOnClaim {
    let template: PersistentVolumeClaimSpec =
        serde_json::from_value(json!({"accessModes": modes, "resources": {"requests": {"storage": "5Gi"}}}))
            .expect("template");
    PoolOnClaim { name: name.into(), path: path.into(), template }
}

fn node(name: &str, labels: Value) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).expect("node")
}

fn linux_nodes() -> Vec<Node> {
    vec![node("n1", json!({"kubernetes.io/os": "linux"})), node("n2", json!({"kubernetes.io/os": "linux"}))]
}

fn placement() -> NodePlacement {
    NodePlacement {
        node_selector: [("kubernetes.io/os".to_owned(), "linux".to_owned())].into(),
        ..NodePlacement::default()
    }
}

fn pv(name: &str, path: &str, node: &str) -> KeptVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {
            "pv.kubernetes.io/provisioned-by": PROVISIONER, "kubevirt.io/provisionOnNode": node,
        }},
        "spec": {"hostPath": {"path": path}},
    }))
    .expect("pv")
}

fn objects() -> PoolObjects<'static> {
    PoolObjects {
        resource: "hpp",
        namespace: "ops",
        image: "img",
        pool: "",
        path: "",
        mount_target: "",
        image_pull_secrets: &[],
    }
}

fn existing(kind: Kind, name: &str, node: Option<&str>, path: &str) -> Existing {
    Existing {
        kind,
        name: name.into(),
        pool: "local".into(),
        node: node.map(Into::into),
        path: path.into(),
        mount_target: None,
    }
}

fn names(plan: &Plan) -> Vec<(Kind, &str)> {
    plan.apply.iter().map(|a| (a.kind, a.name.as_str())).collect()
}

#[test]
fn each_selected_node_gets_its_claim_and_mounter() {
    let mut nodes = linux_nodes();
    nodes.push(node("windows", json!({"kubernetes.io/os": "windows"})));
    let plan = plan(
        &[pool("local", "/mnt/local", &["ReadWriteOnce"])],
        &placement(),
        &Cluster { nodes: &nodes, ..Cluster::default() },
        &objects(),
    );
    assert_eq!(
        names(&plan),
        [
            (Kind::Claim, "hpp-pool-local-n1"),
            (Kind::Claim, "hpp-pool-local-n2"),
            (Kind::Mounter, "hpp-pool-local-n1"),
            (Kind::Mounter, "hpp-pool-local-n2"),
        ]
    );
    assert_eq!(
        plan.apply[2].body["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
        "hpp-pool-local-n1"
    );
    assert!(plan.delete.is_empty() && plan.held_back.is_empty());
}

#[test]
fn a_shared_claim_is_mounted_by_every_selected_node() {
    let plan = plan(
        &[pool("big", "/mnt/big", &["ReadWriteMany"])],
        &placement(),
        &Cluster { nodes: &linux_nodes(), ..Cluster::default() },
        &objects(),
    );
    assert_eq!(
        names(&plan),
        [(Kind::Claim, "hpp-pool-big-shared"), (Kind::Mounter, "hpp-pool-big-n1"), (Kind::Mounter, "hpp-pool-big-n2")]
    );
    for mounter in &plan.apply[1..] {
        assert_eq!(
            mounter.body["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "hpp-pool-big-shared"
        );
    }
}

#[test]
fn a_node_not_ready_keeps_its_claim_as_the_daemonset_keeps_its_pod() {
    let tainted: Node = serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"kubernetes.io/os": "linux"}},
        "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]},
    }))
    .expect("node");
    let plan = plan(
        &[pool("local", "/mnt/local", &["ReadWriteOnce"])],
        &placement(),
        &Cluster { nodes: &[tainted], ..Cluster::default() },
        &objects(),
    );
    assert_eq!(plan.nodes["local"], ["n1"]);
}

/// The kubevirt operator puts no control-plane toleration on its node pods or mounters: a
/// tainted control-plane node gets no pool claim or mounter unless the resource tolerates it.
#[test]
fn a_tainted_control_plane_node_gets_no_claim_or_mounter_unless_the_resource_tolerates_it() {
    let control_plane: Node = serde_json::from_value(json!({
        "metadata": {"name": "cp", "labels": {"kubernetes.io/os": "linux"}},
        "spec": {"taints": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}]},
    }))
    .expect("node");
    let mut nodes = linux_nodes();
    nodes.push(control_plane);
    let pools = [pool("local", "/mnt/local", &["ReadWriteOnce"])];
    let plain = plan(&pools, &placement(), &Cluster { nodes: &nodes, ..Cluster::default() }, &objects());
    assert_eq!(plain.nodes["local"], ["n1", "n2"]);
    assert!(!names(&plain).iter().any(|(_, name)| name.ends_with("-cp")), "{:?}", names(&plain));
    for mounter in plain.apply.iter().filter(|a| a.kind == Kind::Mounter) {
        let tolerations = &mounter.body["spec"]["template"]["spec"]["tolerations"];
        assert!(!tolerations.to_string().contains("control-plane"), "{tolerations}");
        let every_taint = tolerations.as_array().expect("tolerations").iter().any(|t| t.get("key").is_none());
        assert!(!every_taint, "no toleration of every taint: {tolerations}");
    }
    let tolerating = NodePlacement {
        tolerations: vec![
            serde_json::from_value(json!({"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}))
                .expect("toleration"),
        ],
        ..placement()
    };
    let asked = plan(&pools, &tolerating, &Cluster { nodes: &nodes, ..Cluster::default() }, &objects());
    assert_eq!(asked.nodes["local"], ["n1", "n2", "cp"]);
    let on_cp = asked.apply.iter().find(|a| a.kind == Kind::Mounter && a.name.ends_with("-cp")).expect("mounter");
    assert!(on_cp.body["spec"]["template"]["spec"]["tolerations"].to_string().contains("control-plane"));
}

#[test]
fn a_removed_pool_goes_unless_a_volume_of_ours_lives_there_and_the_pvs_are_named() {
    let found = [
        existing(Kind::Claim, "hpp-pool-local-n1", Some("n1"), "/mnt/local"),
        existing(Kind::Mounter, "hpp-pool-local-n1", Some("n1"), "/mnt/local"),
        existing(Kind::Claim, "hpp-pool-local-n2", Some("n2"), "/mnt/local"),
        existing(Kind::Mounter, "hpp-pool-local-n2", Some("n2"), "/mnt/local"),
    ];
    let pvs = [
        pv("pvc-b", "/mnt/local/pvc-b", "n1"),
        pv("pvc-a", "/mnt/local/pvc-a", "n1"),
        pv("elsewhere", "/other/pvc-c", "n2"),
    ];
    let plan = plan(
        &[],
        &placement(),
        &Cluster { nodes: &linux_nodes(), existing: &found, pvs: &pvs, ..Cluster::default() },
        &objects(),
    );
    assert!(plan.apply.is_empty());
    assert_eq!(
        plan.delete,
        [(Kind::Mounter, "hpp-pool-local-n2".to_owned()), (Kind::Claim, "hpp-pool-local-n2".to_owned())],
        "mounter first, and only on the node without volumes"
    );
    assert_eq!(plan.held_back.len(), 2);
    assert_eq!(plan.held_back[0].pvs, ["pvc-a", "pvc-b"]);
    let message = plan.held_back[0].message();
    assert!(message.contains("pvc-a, pvc-b") && message.contains("n1") && message.contains("\"local\""), "{message}");
}

#[test]
fn a_moved_pool_keeps_its_old_mount_while_held_and_is_replaced_once_free() {
    let found = [existing(Kind::Mounter, "hpp-pool-local-n1", Some("n1"), "/mnt/old")];
    let moved = [pool("local", "/mnt/new", &["ReadWriteOnce"])];
    let nodes = &linux_nodes()[..1];
    let held = plan(
        &moved,
        &placement(),
        &Cluster { nodes, existing: &found, pvs: &[pv("pvc-a", "/mnt/old/pvc-a", "n1")], ..Cluster::default() },
        &objects(),
    );
    assert_eq!(names(&held), [(Kind::Claim, "hpp-pool-local-n1")], "the old mounter is not replaced");
    assert_eq!(held.held_back[0].path, "/mnt/old");
    let free = plan(&moved, &placement(), &Cluster { nodes, existing: &found, ..Cluster::default() }, &objects());
    assert_eq!(names(&free), [(Kind::Claim, "hpp-pool-local-n1"), (Kind::Mounter, "hpp-pool-local-n1")]);
    assert!(free.delete.is_empty(), "replaced in place, not deleted");
}

/// An earlier release named the shared claim `hpp-pool-<pool>` and cut long names with another
/// hash: its claims and mounters keep their names (a new claim would be empty, and a second
/// mounter would mount it over the first), while new ones take the kubevirt operator's names.
#[test]
fn objects_made_under_an_earlier_name_keep_it() {
    let long_node = "n".repeat(60);
    let mut nodes = linux_nodes();
    nodes.push(node(&long_node, json!({"kubernetes.io/os": "linux"})));
    let existing = |kind, name: &str, node: Option<&str>, path: &str| Existing {
        pool: "big".into(),
        ..existing(kind, name, node, path)
    };
    let found = [
        existing(Kind::Claim, "hpp-pool-big", None, "/mnt/big"),
        existing(Kind::Mounter, "hpp-pool-big-nnnn-0a1b2c3d4e", Some(&long_node), "/mnt/big"),
        // Same pool, another path: not the same object.
        existing(Kind::Mounter, "hpp-pool-big-n1-old", Some("n1"), "/mnt/elsewhere"),
    ];
    let plan = plan(
        &[pool("big", "/mnt/big", &["ReadWriteMany"])],
        &placement(),
        &Cluster { nodes: &nodes, existing: &found, ..Cluster::default() },
        &objects(),
    );
    let applied: Vec<(Kind, &str)> = plan.apply.iter().map(|a| (a.kind, a.name.as_str())).collect();
    assert_eq!(
        applied,
        [
            (Kind::Claim, "hpp-pool-big"),
            (Kind::Mounter, "hpp-pool-big-n1"),
            (Kind::Mounter, "hpp-pool-big-n2"),
            (Kind::Mounter, "hpp-pool-big-nnnn-0a1b2c3d4e"),
        ]
    );
    for mounter in &plan.apply[1..] {
        assert_eq!(
            mounter.body["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "hpp-pool-big",
            "every mounter mounts the kept claim"
        );
        assert_eq!(mounter.body["metadata"]["name"], mounter.name);
    }
    assert_eq!(plan.delete, [(Kind::Mounter, "hpp-pool-big-n1-old".to_owned())], "the moved one goes, as before");
}

/// A claim taken over from the kubevirt operator holds its CSI driver's volumes of that pool
/// (in its `csi` directory): removing the pool keeps claim and mounter while one exists, on
/// every node, whatever our own PVs say.
#[test]
fn the_kubevirt_csi_volumes_of_a_pool_hold_its_claims() {
    let found = [
        existing(Kind::Claim, "hpp-pool-local-n1", Some("n1"), "/mnt/local"),
        existing(Kind::Mounter, "hpp-pool-local-n1", Some("n1"), "/mnt/local"),
    ];
    let csi = [
        CsiVolume { name: "pvc-csi-a".into(), pool: "local".into() },
        CsiVolume { name: "pvc-csi-other".into(), pool: "other".into() },
    ];
    let held = plan(
        &[],
        &placement(),
        &Cluster { nodes: &linux_nodes(), existing: &found, csi_pvs: &csi, ..Cluster::default() },
        &objects(),
    );
    assert!(held.delete.is_empty(), "{:?}", held.delete);
    assert_eq!(held.held_back.len(), 2);
    assert!(held.held_back.iter().all(|h| h.pvs == ["pvc-csi-a"]), "{:?}", held.held_back);
    let free = plan(
        &[],
        &placement(),
        &Cluster { nodes: &linux_nodes(), existing: &found, csi_pvs: &csi[1..], ..Cluster::default() },
        &objects(),
    );
    assert_eq!(free.delete.len(), 2, "another pool's CSI volume holds nothing");
}

#[test]
fn a_csi_volume_is_read_from_the_kubevirt_drivers_attributes() {
    let pv = |driver: &str, attributes: Value| -> k8s_openapi::api::core::v1::PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": "pvc-1"}, "spec": {"csi": {
            "driver": driver, "volumeHandle": "pvc-1", "volumeAttributes": attributes,
        }}}))
        .expect("pv")
    };
    assert_eq!(
        CsiVolume::of(&pv("kubevirt.io.hostpath-provisioner", json!({"storagePool": "local"}))),
        Some(CsiVolume { name: "pvc-1".into(), pool: "local".into() })
    );
    assert_eq!(CsiVolume::of(&pv("other.csi.example", json!({"storagePool": "local"}))), None);
    assert_eq!(CsiVolume::of(&pv("kubevirt.io.hostpath-provisioner", json!({}))), None);
}

/// A pool whose claim the kubevirt operator made (its name, its label, not ours): the claim is
/// adopted and annotated with the kubevirt mount point `<path>/csi`, which every claim and
/// mounter of the pool then uses (a new node's too) and the DaemonSet serves; the kubevirt
/// mounter of that name is replaced, never applied over (its selector differs).
#[test]
fn a_kubevirt_pool_keeps_its_mount_point_and_its_mounters_are_replaced() {
    let kubevirt = [(Kind::Claim, "hpp-pool-local-n1".to_owned()), (Kind::Mounter, "hpp-pool-local-n1".to_owned())];
    let cluster = Cluster { nodes: &linux_nodes(), kubevirt: &kubevirt, ..Cluster::default() };
    let first = plan(&[pool("local", "/mnt/local", &["ReadWriteOnce"])], &placement(), &cluster, &objects());
    assert_eq!(first.replace, ["hpp-pool-local-n1"]);
    assert_eq!(
        names(&first),
        [(Kind::Claim, "hpp-pool-local-n1"), (Kind::Claim, "hpp-pool-local-n2"), (Kind::Mounter, "hpp-pool-local-n2")],
        "n1's mounter once the kubevirt one is gone"
    );
    assert_eq!(first.roots.get("local").map(String::as_str), Some("/mnt/local/csi"));
    for claim in first.apply.iter().filter(|a| a.kind == Kind::Claim) {
        assert_eq!(
            claim.body["metadata"]["annotations"][super::super::pool_claims::MOUNT_TARGET_ANNOTATION],
            "/mnt/local/csi"
        );
    }
    let mounter = &first.apply[2].body;
    assert_eq!(mounter["spec"]["template"]["spec"]["containers"][0]["args"][4], "/mnt/local/csi");
    assert_eq!(mounter["spec"]["template"]["spec"]["volumes"][1]["hostPath"]["path"], "/mnt/local/csi");
    assert_eq!(mounter["metadata"]["annotations"][super::super::pool_claims::PATH_ANNOTATION], "/mnt/local");

    // Adopted (ours now, annotated) and the kubevirt mounter gone: the layout stays.
    let adopted = [Existing {
        mount_target: Some("/mnt/local/csi".into()),
        ..existing(Kind::Claim, "hpp-pool-local-n1", Some("n1"), "/mnt/local")
    }];
    let cluster = Cluster { nodes: &linux_nodes(), existing: &adopted, ..Cluster::default() };
    let later = plan(&[pool("local", "/mnt/local", &["ReadWriteOnce"])], &placement(), &cluster, &objects());
    assert!(later.replace.is_empty());
    assert_eq!(later.roots.get("local").map(String::as_str), Some("/mnt/local/csi"));
    assert_eq!(names(&later).len(), 4);

    // A pool of this operator's own keeps its path as root.
    let own = plan(
        &[pool("local", "/mnt/local", &["ReadWriteOnce"])],
        &placement(),
        &Cluster { nodes: &linux_nodes(), ..Cluster::default() },
        &objects(),
    );
    assert!(own.roots.is_empty());
    assert!(
        own.apply[0].body["metadata"]["annotations"].get(super::super::pool_claims::MOUNT_TARGET_ANNOTATION).is_none()
    );
}

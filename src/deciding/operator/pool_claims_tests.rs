use serde_json::json;

use super::*;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::snapshot::HostPathSnapshot;

const OURS: &str = "kubevirt.io/hostpath-provisioner";

fn template(modes: &[&str]) -> PersistentVolumeClaimSpec {
    serde_json::from_value(json!({"accessModes": modes, "resources": {"requests": {"storage": "5Gi"}}}))
        .expect("template")
}

fn node(name: &str, labels: serde_json::Value, taints: serde_json::Value) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}))
        .expect("node")
}

fn pv(name: &str, path: &str, node: Option<&str>, provisioner: &str) -> KeptVolume {
    let mut annotations = json!({"pv.kubernetes.io/provisioned-by": provisioner});
    if let Some(node) = node {
        annotations["kubevirt.io/provisionOnNode"] = json!(node);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"hostPath": {"path": path}, "capacity": {"storage": "1Gi"}},
    }))
    .expect("pv")
}

#[test]
fn a_read_write_once_template_gives_one_claim_per_selected_node() {
    let nodes = vec!["worker-1".to_owned(), "worker-2".to_owned()];
    let claims = pool_claims("local", &template(&["ReadWriteOnce"]), &nodes);
    assert_eq!(
        claims,
        [
            ("hpp-pool-local-worker-1".to_owned(), Some("worker-1".to_owned())),
            ("hpp-pool-local-worker-2".to_owned(), Some("worker-2".to_owned())),
        ]
    );
}

#[test]
fn a_read_write_many_template_gives_one_claim_for_all_nodes() {
    let nodes = vec!["worker-1".to_owned(), "worker-2".to_owned()];
    let claims = pool_claims("nfs-backend", &template(&["ReadWriteMany"]), &nodes);
    assert_eq!(claims, [("hpp-pool-nfs-backend-shared".to_owned(), None)]);
    assert_eq!(pool_claims("nfs-backend", &template(&["ReadWriteMany"]), &[]).len(), 1, "even before any node");
}

/// Names the kubevirt operator at 03d4d671 gives, printed by its own `getStoragePoolPVCName`
/// and `getSharedStoragePoolPVCName` (a Go test calling them): a cluster coming from it must
/// find the same claims, or a pool's data stays in a claim nobody mounts.
#[test]
fn claims_are_named_exactly_as_the_kubevirt_operator_names_them() {
    let n60 = "n".repeat(60);
    let cases: [(&str, Option<String>, &str); 8] = [
        ("local", Some("worker-1".to_owned()), "hpp-pool-local-worker-1"),
        ("local", Some(n60.clone()), "hpp-pool-129feb0d"),
        ("local", Some(format!("{n60}.example.org")), "hpp-pool-08c942d5"),
        // 63 characters and 64: the limit is the DNS label's.
        ("a-pool-name-of-twenty", Some("node-with-a-longer-name-of-33-chr".to_owned()), "hpp-pool-79f30186"),
        ("a-pool-name-of-twenty", Some("node-with-a-longer-name-of-34-chrs".to_owned()), "hpp-pool-2364ac74"),
        ("nfs", None, "hpp-pool-nfs-shared"),
        (&"p".repeat(47), None, "hpp-pool-ppppppppppppppppppppppppppppppppppppppppppppppp-shared"),
        (&"p".repeat(48), None, "hpp-pool-fb8ff80f"),
    ];
    for (pool, node, expected) in cases {
        assert_eq!(claim_name(pool, node.as_deref()), expected, "pool {pool}, node {node:?}");
    }
    let at_limit = claim_name("a", Some(&"n".repeat(52)));
    assert_eq!(at_limit.len(), 63, "63 characters stay whole: {at_limit}");
}

#[test]
fn placement_selects_by_labels_affinity_and_taints() {
    let nodes = vec![
        node("plain", json!({"kubernetes.io/os": "linux", "zone": "a"}), json!([])),
        node("other-zone", json!({"kubernetes.io/os": "linux", "zone": "b"}), json!([])),
        node("windows", json!({"kubernetes.io/os": "windows", "zone": "a"}), json!([])),
        node(
            "dedicated",
            json!({"kubernetes.io/os": "linux", "zone": "a"}),
            json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]),
        ),
        node(
            "soft-taint",
            json!({"kubernetes.io/os": "linux", "zone": "a"}),
            json!([{"key": "x", "effect": "PreferNoSchedule"}]),
        ),
    ];
    let linux = BTreeMap::from([("kubernetes.io/os".to_owned(), "linux".to_owned())]);
    assert_eq!(selected_nodes(&nodes, &linux, None, &[]), ["plain", "other-zone", "soft-taint"]);
    let zone_a: Affinity =
        serde_json::from_value(json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]
        }}}))
        .expect("affinity");
    assert_eq!(selected_nodes(&nodes, &linux, Some(&zone_a), &[]), ["plain", "soft-taint"]);
    let tolerate: Toleration =
        serde_json::from_value(json!({"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}))
            .expect("t");
    assert_eq!(selected_nodes(&nodes, &linux, Some(&zone_a), &[tolerate]), ["plain", "dedicated", "soft-taint"]);
    let everything: Toleration = serde_json::from_value(json!({"operator": "Exists"})).expect("t");
    assert_eq!(selected_nodes(&nodes, &BTreeMap::new(), None, &[everything]).len(), 5);
    let by_name: Affinity =
        serde_json::from_value(json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["plain"]}]}]
        }}}))
        .expect("affinity");
    assert_eq!(selected_nodes(&nodes, &linux, Some(&by_name), &[]), ["other-zone", "soft-taint"]);
}

#[test]
fn a_pool_with_a_volume_of_ours_on_that_node_is_held_back_and_names_it() {
    let pvs = vec![
        pv("pvc-b", "/var/hpvolumes/pvc-b", Some("worker-1"), OURS),
        pv("pvc-a", "/var/hpvolumes/pvc-a", Some("worker-1"), OURS),
        pv("pvc-other-node", "/var/hpvolumes/pvc-c", Some("worker-2"), OURS),
        pv("pvc-other-pool", "/mnt/ssd/pvc-d", Some("worker-1"), OURS),
        pv("pvc-csi", "/var/hpvolumes/csi/pvc-e", Some("worker-3"), "kubevirt.io.hostpath-provisioner"),
    ];
    assert_eq!(
        may_release("/var/hpvolumes", Some("worker-1"), &pvs, &[], OURS),
        Release::HoldBack(vec!["pvc-a".into(), "pvc-b".into()])
    );
    assert_eq!(
        may_release("/var/hpvolumes", Some("worker-3"), &pvs, &[], OURS),
        Release::Release,
        "the CSI driver's PVs are not ours"
    );
    assert_eq!(may_release("/var/hpvolumes/", Some("worker-4"), &pvs, &[], OURS), Release::Release);
}

#[test]
fn a_shared_claim_is_held_by_any_nodes_volume() {
    let pvs = vec![pv("pvc-x", "/nfs-vol/pvc-x", Some("worker-9"), OURS)];
    assert_eq!(may_release("/nfs-vol", None, &pvs, &[], OURS), Release::HoldBack(vec!["pvc-x".into()]));
    assert_eq!(may_release("/nfs-vol-2", None, &pvs, &[], OURS), Release::Release, "a sibling path is another pool");
}

#[test]
fn a_volume_whose_node_cannot_be_read_holds_every_node() {
    let pvs = vec![pv("pvc-old", "/var/hpvolumes/pvc-old", None, OURS)];
    assert_eq!(
        may_release("/var/hpvolumes", Some("worker-1"), &pvs, &[], OURS),
        Release::HoldBack(vec!["pvc-old".into()])
    );
}

fn snapshot(name: &str, node: Option<&str>, pool_root: Option<&str>) -> HostPathSnapshot {
    serde_json::from_value(json!({
        "apiVersion": "hostpath-provisioner.kubevirt.io/v1alpha1",
        "kind": "HostPathSnapshot",
        "metadata": {"name": name, "namespace": "tenant"},
        "spec": {"source": {"persistentVolumeClaimName": "data"}},
        "status": {"readyToUse": true, "node": node, "poolRoot": pool_root},
    }))
    .expect("snapshot")
}

#[test]
fn a_pool_holding_a_snapshot_copy_on_that_node_is_held_back_and_names_it() {
    let copies: Vec<SnapshotCopy> = [
        snapshot("on-pool", Some("worker-1"), Some("/var/hpvolumes")),
        snapshot("in-kubevirt-layout", Some("worker-1"), Some("/var/hpvolumes/csi")),
        snapshot("other-node", Some("worker-2"), Some("/var/hpvolumes")),
        snapshot("other-pool", Some("worker-1"), Some("/mnt/ssd")),
        snapshot("sibling-path", Some("worker-1"), Some("/var/hpvolumes-2")),
        snapshot("never-started", None, None),
    ]
    .iter()
    .filter_map(SnapshotCopy::of)
    .collect();
    assert_eq!(copies.len(), 5, "a snapshot no node has named holds no copy");
    let pvs = vec![pv("pvc-a", "/var/hpvolumes/pvc-a", Some("worker-1"), OURS)];
    assert_eq!(
        may_release("/var/hpvolumes", Some("worker-1"), &pvs, &copies, OURS),
        Release::HoldBack(vec![
            "pvc-a".into(),
            "HostPathSnapshot tenant/in-kubevirt-layout".into(),
            "HostPathSnapshot tenant/on-pool".into(),
        ])
    );
    assert_eq!(
        may_release("/var/hpvolumes", Some("worker-1"), &[], &copies, OURS),
        Release::HoldBack(vec![
            "HostPathSnapshot tenant/in-kubevirt-layout".into(),
            "HostPathSnapshot tenant/on-pool".into()
        ]),
        "copies alone hold the claim: no PV is left, the data is"
    );
    assert_eq!(may_release("/var/hpvolumes", Some("worker-3"), &[], &copies, OURS), Release::Release);
    assert_eq!(
        may_release("/var/hpvolumes", None, &[], &copies, OURS),
        Release::HoldBack(vec![
            "HostPathSnapshot tenant/in-kubevirt-layout".into(),
            "HostPathSnapshot tenant/on-pool".into(),
            "HostPathSnapshot tenant/other-node".into(),
        ]),
        "a shared claim is held by a copy on any node"
    );
}

#[test]
fn a_copy_whose_pool_root_is_unknown_holds_every_pool_of_its_node() {
    // A snapshot of an earlier release names its node only.
    let copies: Vec<SnapshotCopy> =
        [snapshot("old", Some("worker-1"), None)].iter().filter_map(SnapshotCopy::of).collect();
    for pool in ["/var/hpvolumes", "/mnt/ssd"] {
        assert_eq!(
            may_release(pool, Some("worker-1"), &[], &copies, OURS),
            Release::HoldBack(vec!["HostPathSnapshot tenant/old".into()]),
            "{pool}"
        );
    }
    assert_eq!(may_release("/mnt/ssd", Some("worker-2"), &[], &copies, OURS), Release::Release);
}

fn objects() -> PoolObjects<'static> {
    PoolObjects {
        resource: "hpp",
        namespace: "ops",
        image: "img:1",
        pool: "local",
        path: "/var/hpvolumes",
        mount_target: "/var/hpvolumes",
        image_pull_secrets: &[],
    }
}

#[test]
fn a_pool_claim_is_the_template_labelled_and_never_owned() {
    let claim = objects().claim("hpp-pool-local-worker-1", Some("worker-1"), &template(&["ReadWriteOnce"]));
    assert_eq!(claim["metadata"]["namespace"], "ops");
    assert_eq!(claim["metadata"]["labels"][POOL_LABEL], "local");
    assert_eq!(claim["metadata"]["labels"][super::super::render::OWNER_LABEL], "hpp");
    assert_eq!(claim["metadata"]["annotations"][NODE_ANNOTATION], "worker-1");
    assert_eq!(claim["metadata"]["annotations"][PATH_ANNOTATION], "/var/hpvolumes");
    assert!(claim["metadata"].get("ownerReferences").is_none(), "the garbage collector must not take it");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "5Gi");
    let shared = objects().claim("hpp-pool-local-shared", None, &template(&["ReadWriteMany"]));
    assert!(shared["metadata"]["annotations"].get(NODE_ANNOTATION).is_none());
}

#[test]
fn a_mounter_is_pinned_to_its_node_and_sees_only_the_pool_path_and_its_claim() {
    let mounter = objects().mounter("hpp-pool-local-worker-1", "worker-1", "hpp-pool-local-shared", &[]);
    assert_eq!(mounter["metadata"]["name"], "hpp-pool-local-worker-1");
    let pod = &mounter["spec"]["template"]["spec"];
    let term =
        &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0];
    assert_eq!(term["matchFields"][0], json!({"key": "metadata.name", "operator": "In", "values": ["worker-1"]}));
    let container = &pod["containers"][0];
    assert_eq!(container["args"], json!(["pool-mount", "--source", "/claim", "--target", "/var/hpvolumes"]));
    assert_eq!(
        container["readinessProbe"]["exec"]["command"],
        json!(["/hostpath-provisioner", "pool-mount", "--check", "--source", "/claim", "--target", "/var/hpvolumes"])
    );
    assert_eq!(
        container["volumeMounts"][1],
        json!({"name": "pool", "mountPath": "/var/hpvolumes", "mountPropagation": "Bidirectional"})
    );
    assert_eq!(pod["volumes"][0]["persistentVolumeClaim"]["claimName"], "hpp-pool-local-shared", "the shared claim");
    assert_eq!(pod["volumes"][1]["hostPath"]["path"], "/var/hpvolumes", "the pool path, not /");
    assert_eq!(pod["automountServiceAccountToken"], false, "no API access");
    assert_eq!(mounter["spec"]["strategy"]["type"], "Recreate");
    // Distinct nodes, distinct selectors.
    let other = objects().mounter("hpp-pool-local-worker-2", "worker-2", "hpp-pool-local-shared", &[]);
    assert_ne!(mounter["spec"]["selector"], other["spec"]["selector"]);
}

#[test]
fn a_mounter_runs_as_its_own_account_pins_its_scc_and_pulls_with_the_operators_secrets() {
    let secrets = ["regcred".to_owned(), "mirror".to_owned()];
    let objects = PoolObjects { image_pull_secrets: &secrets, ..objects() };
    let mounter = objects.mounter("hpp-pool-local-worker-1", "worker-1", "hpp-pool-local-shared", &[]);
    let template = &mounter["spec"]["template"];
    assert_eq!(template["spec"]["serviceAccountName"], MOUNTER_SERVICE_ACCOUNT, "not the namespace's default");
    assert_eq!(template["metadata"]["annotations"]["openshift.io/required-scc"], MOUNTER_SCC);
    assert_eq!(template["spec"]["imagePullSecrets"], json!([{"name": "regcred"}, {"name": "mirror"}]));
    for kubevirt_scc in ["hostpath-provisioner", "hostpath-provisioner-csi"] {
        assert_ne!(MOUNTER_SCC, kubevirt_scc, "never one of the kubevirt operator's SCCs");
    }
}

#[test]
fn a_mounter_tolerates_what_it_is_given_and_nothing_else() {
    let dedicated: Toleration = serde_json::from_value(
        json!({"key": "dedicated", "operator": "Equal", "value": "storage", "effect": "NoSchedule"}),
    )
    .expect("toleration");
    let mounter = objects().mounter(
        "hpp-pool-local-worker-1",
        "worker-1",
        "hpp-pool-local-shared",
        std::slice::from_ref(&dedicated),
    );
    let tolerations = &mounter["spec"]["template"]["spec"]["tolerations"];
    assert_eq!(tolerations, &json!([serde_json::to_value(&dedicated).expect("toleration")]));
    assert_eq!(
        objects().mounter("hpp-pool-local-worker-1", "worker-1", "hpp-pool-local-shared", &[])["spec"]["template"]["spec"]
            ["tolerations"],
        json!([])
    );
}

//! The operator's pools on a claim (`pvcTemplate`), on the control plane of the operator's life
//! test (`e2e_operator.rs`): claims and mounters per node, the hold-back rule, and the claims and
//! mounters of the kubevirt operator taken over. No kubelet runs here: mounts are not made.

use hostpath_provisioner::deciding::snapshot::HostPathSnapshot;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::*;

/// A pool on a claim: each node the placement selects gets its claim and mounter Deployment,
/// the DaemonSet serves the pool only while it is a mount point; removing the pool while a PV
/// of ours or a snapshot's copy lives there keeps that node's claim and mounter, and the status
/// names them; they go when both are gone. (No kubelet here: the mounters never run, the pool stays Mounting.)
pub(crate) async fn are_mounted_per_node_and_held_back_by_volumes(env: &TestEnv, name: &str) {
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
        let template = mounter.spec.map(|s| s.template).expect("mounter template");
        let pod = template.spec.expect("mounter pod");
        let affinity = serde_json::to_string(&pod.affinity).expect("affinity");
        assert!(affinity.contains(node.as_str()), "pinned to its node: {affinity}");
        // Its own ServiceAccount and SCC, the operator's pull secrets.
        assert_eq!(pod.service_account_name.as_deref(), Some("kubevirt-hostpath-provisioner-pool-mounter"));
        let annotations = template.metadata.and_then(|m| m.annotations).unwrap_or_default();
        assert_eq!(
            annotations.get("openshift.io/required-scc").map(String::as_str),
            Some("kubevirt-hostpath-provisioner-pool-mounter")
        );
        let secrets: Vec<_> = pod.image_pull_secrets.iter().flatten().map(|s| s.name.as_str()).collect();
        assert_eq!(secrets, [PULL_SECRET]);
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

    // A snapshot's copy in that pool on that node (its status as the node writes it), and the
    // volume goes: the copy still holds the claim and the mounter, and the status names it.
    let snapshots: Api<HostPathSnapshot> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
    let snapshot_name = format!("{}-copy-in-claimed", env.group);
    let snapshot: HostPathSnapshot = serde_json::from_value(json!({
        "apiVersion": "hostpath-provisioner.kubevirt.io/v1alpha1", "kind": "HostPathSnapshot",
        "metadata": {"name": snapshot_name},
        "spec": {"source": {"persistentVolumeClaimName": "gone"}},
    }))
    .expect("snapshot");
    snapshots.create(&PostParams::default(), &snapshot).await.expect("create a snapshot");
    let status =
        json!({"status": {"readyToUse": true, "node": nodes[0], "poolRoot": "/mnt/claimed", "method": "bytes"}});
    snapshots.patch_status(&snapshot_name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("its status");
    env.pvs().delete(&pv_name, &Default::default()).await.expect("delete the PV");
    let copy = format!("HostPathSnapshot {OPERATOR_NAMESPACE}/{snapshot_name}");
    let held = wait_resource(env, name, "held back by the snapshot copy alone", |r| {
        condition(r, "Degraded").is_some_and(|c| {
            c["reason"] == "PoolHeldBack"
                && c["message"].as_str().is_some_and(|m| m.contains(&copy) && !m.contains(&pv_name))
        })
    })
    .await;
    let message = condition(&held, "Degraded").expect("Degraded")["message"].to_string();
    assert!(mounters.get_opt(&object_names(&nodes[0])).await.expect("read").is_some(), "held: {message}");
    assert!(claims.get_opt(&object_names(&nodes[0])).await.expect("read").is_some(), "held: {message}");

    // The copy goes: so do the claim and the mounter.
    snapshots.delete(&snapshot_name, &Default::default()).await.expect("delete the snapshot");
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

/// A shared pool claim the kubevirt operator made (`hpp-pool-<pool>-shared`, its labels, not
/// ours) is the claim this operator uses for that pool: adopted, not doubled. A PV of the
/// kubevirt CSI driver in that pool holds it when the pool is removed, as our own PVs do.
pub(crate) async fn of_the_kubevirt_operator_are_adopted_where_it_mounted_them_and_held_by_its_csi_volumes(
    env: &TestEnv,
    name: &str,
) {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
    let nodes_api: Api<Node> = Api::all(env.client.clone());
    let nodes = [format!("{}-k1", env.group), format!("{}-k2", env.group)];
    for node in &nodes {
        let mut object = testbed::fixtures::node(node, node);
        object.metadata.labels.get_or_insert_default().insert("hpp-e2e".into(), env.group.clone());
        nodes_api.create(&PostParams::default(), &object).await.expect("create a node");
    }
    let template = json!({"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "nfs"});
    // As the kubevirt operator made it (storagepool.go: name, labels, the template as spec).
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
    let theirs: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "hpp-pool-shared-shared", "labels": {
            "kubevirt.io.hostpath-provisioner/storagePool": "shared-hpp",
            "app.kubernetes.io/component": "storage",
        }},
        "spec": template,
    }))
    .expect("claim");
    let made = claims.create(&PostParams::default(), &theirs).await.expect("the kubevirt operator's claim");
    // Its mounter on the first node, as it made it: its own selector, mounting at <path>/csi.
    let mounters: Api<Deployment> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
    let their_mounter: Deployment = serde_json::from_value(json!({
        "metadata": {"name": format!("hpp-pool-shared-{}", nodes[0]), "labels": {
            "kubevirt.io.hostpath-provisioner/storagePool": "shared-hpp", "hpp-pool": "shared-hpp",
        }},
        "spec": {
            "selector": {"matchLabels": {"hpp-pool": "shared-hpp"}},
            "template": {
                "metadata": {"labels": {"hpp-pool": "shared-hpp"}},
                "spec": {"containers": [{"name": "mounter", "image": "quay.io/kubevirt/hostpath-provisioner-operator",
                    "command": ["/usr/bin/mounter", "--storagePoolPath", "/source", "--mountPath", "/mnt/vms/csi", "--hostPath", "/host"]}]},
            },
        },
    }))
    .expect("mounter");
    let their_mounter = mounters.create(&PostParams::default(), &their_mounter).await.expect("the kubevirt mounter");
    let csi_pv = format!("{}-csi", env.group);
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": csi_pv},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "hostpath-csi",
                 "csi": {"driver": "kubevirt.io.hostpath-provisioner", "volumeHandle": csi_pv,
                         "volumeAttributes": {"storagePool": "shared"}}},
    }))
    .expect("pv");
    env.pvs().create(&PostParams::default(), &pv).await.expect("a CSI PV of the pool");

    let patch = json!({"spec": {
        "workload": {"nodeSelector": {"hpp-e2e": env.group}},
        "storagePools": [{"name": "local", "path": "/var/hpvolumes"},
                         {"name": "shared", "path": "/mnt/vms", "pvcTemplate": template}],
    }});
    resources(env).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("the shared pool");
    let adopted = testbed::wait_for("the kubevirt claim adopted", WAIT, || async {
        let claim = claims.get("hpp-pool-shared-shared").await?;
        let labelled =
            claim.metadata.labels.as_ref().and_then(|l| l.get("hostpathprovisioner.kubevirt.io/pool")).is_some();
        Ok::<_, kube::Error>(labelled.then_some(claim))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(adopted.metadata.uid, made.metadata.uid, "the same claim, not a new one");
    let target =
        adopted.metadata.annotations.as_ref().and_then(|a| a.get("hostpathprovisioner.kubevirt.io/mount-target"));
    assert_eq!(target.map(String::as_str), Some("/mnt/vms/csi"), "the kubevirt mount point stays");
    // The node DaemonSet serves the pool where the kubevirt operator mounted it, only while mounted.
    wait_daemonset(env, "the kubevirt pool served at <path>/csi", |d| {
        node_container(d).0.get("STORAGE_POOLS").map(String::as_str)
            == Some("local=/var/hpvolumes,shared=/mnt/vms/csi,mountpoint")
    })
    .await;
    let of_pool =
        claims.list(&kube::api::ListParams::default().labels("hostpathprovisioner.kubevirt.io/pool=shared")).await;
    assert_eq!(of_pool.expect("list").items.len(), 1, "one shared claim");
    // Each node's mounter is this operator's, the kubevirt one replaced (a new object: its
    // selector could not change), mounting at the kubevirt mount point.
    for node in &nodes {
        let name = format!("hpp-pool-shared-{node}");
        let mounter = testbed::wait_for(&format!("{name} of this operator"), WAIT, || async {
            let found = mounters.get_opt(&name).await?;
            Ok::<_, kube::Error>(found.filter(|d| {
                d.metadata.labels.as_ref().is_some_and(|l| l.contains_key("hostpathprovisioner.kubevirt.io/pool"))
                    && d.metadata.deletion_timestamp.is_none()
            }))
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
        assert_ne!(mounter.metadata.uid, their_mounter.metadata.uid);
        let pod = mounter.spec.and_then(|s| s.template.spec).expect("mounter pod");
        let volumes = serde_json::to_value(&pod.volumes).expect("volumes");
        assert_eq!(volumes[0]["persistentVolumeClaim"]["claimName"], "hpp-pool-shared-shared");
        assert_eq!(volumes[1]["hostPath"]["path"], "/mnt/vms/csi");
    }

    // The pool removed: the CSI volume holds the claim and names itself; gone, it frees it.
    let patch = json!({"spec": {"storagePools": [{"name": "local", "path": "/var/hpvolumes"}]}});
    resources(env).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("remove the pool");
    let held = wait_resource(env, name, "Degraded PoolHeldBack by the CSI PV", |r| {
        condition(r, "Degraded").is_some_and(|c| {
            c["reason"] == "PoolHeldBack" && c["message"].as_str().is_some_and(|m| m.contains(&csi_pv))
        })
    })
    .await;
    let message = condition(&held, "Degraded").expect("Degraded")["message"].to_string();
    assert!(claims.get_opt("hpp-pool-shared-shared").await.expect("read").is_some(), "held: {message}");
    env.pvs().delete(&csi_pv, &Default::default()).await.expect("delete the CSI PV");
    wait_present(&claims, "hpp-pool-shared-shared", false).await;
    for node in &nodes {
        wait_present(&mounters, &format!("hpp-pool-shared-{node}"), false).await;
    }
    let patch = json!({"spec": {"workload": null}});
    resources(env).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("placement back");
    for node in &nodes {
        nodes_api.delete(node, &Default::default()).await.expect("remove the test node");
    }
}

//! docs/snapshots.md, "Snapshots made again", as written: a snapshot lost without its node's say
//! and its namespace deleted and made again (a cluster rebuilt from a backup), then the
//! snapshot made again from its saved manifest. It is refused until the admin's Namespace
//! annotation names the copy, and then gets that copy back, of its own point in time. Deleted
//! as usual, its copy leaves; made again once more, it is refused until the annotations are
//! removed as the doc says, and then a new snapshot is taken.

use super::*;

const NAMESPACE: &str = "vault";
const NODE: &str = "worker-6";

/// A saved manifest of the snapshot as a backup keeps it: no UID, status or finalizers.
fn saved_manifest(shell: &Shell) -> Value {
    let mut snapshot = shell.must_get(&["hostpathsnapshot", "nightly", "-n", NAMESPACE]);
    let metadata = snapshot["metadata"].as_object_mut().expect("metadata");
    for field in ["uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "finalizers"] {
        metadata.remove(field);
    }
    snapshot.as_object_mut().expect("object").remove("status");
    snapshot
}

async fn wait_ready(shell: &Shell, what: &str) -> Value {
    testbed::wait_for(what, WAIT, || async {
        let snapshot = shell.get(&["hostpathsnapshot", "nightly", "-n", NAMESPACE]);
        anyhow::Ok(snapshot.filter(|s| s["status"]["readyToUse"] == true))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

async fn wait_event_saying(shell: &Shell, what: &str, needle: &str) {
    testbed::wait_for(what, WAIT, || async {
        let events = shell.kubectl(&["get", "events", "-n", NAMESPACE, "-o", "json"]);
        anyhow::Ok(events.contains(needle).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
}

fn uid(snapshot: &Value) -> String {
    snapshot["metadata"]["uid"].as_str().expect("uid").to_owned()
}

pub async fn snapshots_made_again_follow_the_doc(shell: &mut Shell, docs: &Docs) {
    let crd = repo().join("deploy/snapshots/crd.yaml");
    shell.kubectl(&["apply", "--server-side", "-f", crd.to_str().expect("utf-8 path")]);
    shell.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/hostpathsnapshots.hostpath-provisioner.kubevirt.io",
    ]);
    shell.cp().add_node_labeled(NODE, NODE, &[]).await.expect("Node");
    let pool = testbed::pool_root_for(shell.cp(), NODE);
    std::fs::create_dir_all(&pool).expect("pool root");
    let spec = testbed::ProvisionerSpec::new(
        env!("CARGO_BIN_EXE_hostpath-provisioner"),
        NODE,
        &pool,
        shell.cp().kubeconfig_path(),
    );
    let mut provisioner = testbed::Provisioner::spawn(spec, shell.cp().temp_dir()).expect("spawn provisioner");
    provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("provisioner ready");

    shell.kubectl(&["create", "namespace", NAMESPACE]);
    let class = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "vault"},
        "provisioner": "kubevirt.io/hostpath-provisioner",
    });
    let claim = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": NAMESPACE, "annotations": {"kubevirt.io/provisionOnNode": NODE}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "vault", "resources": {"requests": {"storage": "1Mi"}}},
    });
    let snapshot = serde_json::json!({
        "apiVersion": "hostpath-provisioner.kubevirt.io/v1alpha1", "kind": "HostPathSnapshot",
        "metadata": {"name": "nightly", "namespace": NAMESPACE},
        "spec": {"source": {"persistentVolumeClaimName": "data"}},
    });
    std::fs::write(shell.dir().join("vault.json"), format!("{class}\n{claim}\n{snapshot}")).expect("write");
    std::fs::write(shell.dir().join("claim.json"), claim.to_string()).expect("write");
    shell.kubectl(&["create", "-f", "vault.json"]);
    let taken = wait_ready(shell, "snapshot nightly ready").await;
    let first_uid = uid(&taken);
    let copies = pool.join(".hpp-snapshots");
    assert!(copies.join(&first_uid).is_dir(), "the copy");
    std::fs::write(shell.dir().join("backup.json"), saved_manifest(shell).to_string()).expect("write");

    // The cluster "rebuilt": the snapshot goes without its node's say, its namespace is deleted
    // and made again.
    shell.kubectl(&[
        "patch",
        "hostpathsnapshot",
        "nightly",
        "-n",
        NAMESPACE,
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"finalizers":null}}"#,
    ]);
    shell.kubectl(&["delete", "namespace", NAMESPACE]);
    shell.wait_gone(&["namespace", NAMESPACE]).await;
    assert!(copies.join(&first_uid).is_dir(), "the copy outlives its namespace");
    shell.kubectl(&["create", "namespace", NAMESPACE]);
    // The claim made again too (restored by the same backup), with a volume of its own.
    shell.kubectl(&["create", "-f", "claim.json"]);
    shell.kubectl(&["create", "-f", "backup.json"]);
    wait_event_saying(shell, "refused in a namespace made again", "adopt-snapshot-copy").await;
    shell.run_with(
        &docs.command("docs/snapshots.md", "Snapshots made again", "kubectl annotate namespace NAMESPACE"),
        &[("NAMESPACE", NAMESPACE), ("COPY-UID", &first_uid)],
    );
    let adopted = wait_ready(shell, "snapshot nightly given its copy back").await;
    assert_eq!(adopted["status"]["creationTime"], taken["status"]["creationTime"], "{adopted}");
    assert!(copies.join(uid(&adopted)).is_dir() && !copies.join(&first_uid).exists());

    // Deleted as usual: its copy leaves; made again, refused until the annotations go.
    std::fs::write(shell.dir().join("backup.json"), saved_manifest(shell).to_string()).expect("write");
    shell.kubectl(&["delete", "hostpathsnapshot", "nightly", "-n", NAMESPACE]);
    shell.wait_gone(&["hostpathsnapshot", "nightly", "-n", NAMESPACE]).await;
    shell.kubectl(&["create", "-f", "backup.json"]);
    wait_event_saying(shell, "refused: its copy is gone", "no longer on its node").await;
    shell.run_with(
        &docs.command("docs/snapshots.md", "Snapshots made again", "kubectl annotate hostpathsnapshot NAME"),
        &[("NAMESPACE", NAMESPACE), ("NAME", "nightly")],
    );
    let new = wait_ready(shell, "a new snapshot taken").await;
    assert_ne!(new["status"]["creationTime"], taken["status"]["creationTime"], "{new}");
    assert!(copies.join(uid(&new)).is_dir());
    provisioner.terminate();
}

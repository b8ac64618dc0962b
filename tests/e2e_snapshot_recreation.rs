//! End-to-end: a `HostPathSnapshot` made again from a saved copy of itself, as a backup tool or a
//! re-applied manifest makes it (name, namespace, annotations and spec kept; UID and status
//! not), against a real control plane (docs/snapshots.md, "Snapshots made again"). While its
//! copy is on the node, the object gets that copy back: the same point in time, not today's
//! data. Once the copy is gone, the object is refused with an event saying how to take a new
//! snapshot, and nothing is copied; removing the annotations, as the message says, takes one.
//! Annotations naming another snapshot's copy, in the same namespace or another, are refused
//! and that copy stays its owner's.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use hostpath_provisioner::deciding::snapshot::recreation::{COPY_NODE, COPY_UID};
use hostpath_provisioner::deciding::snapshot::{GROUP, HostPathSnapshot, KIND};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use testbed::fixtures;

const CRD: &str = "hostpathsnapshots.hostpath-provisioner.kubevirt.io";

fn install_crd(env: &TestEnv) {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let run = |args: &[&str]| env.cp.run_kubectl(&repo, args).unwrap_or_else(|e| panic!("{e:#}"));
    run(&["apply", "--server-side", "-f", "deploy/snapshots/crd.yaml"]);
    run(&["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{CRD}")]);
}

fn host_path(pv: &PersistentVolume) -> PathBuf {
    PathBuf::from(pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone()).expect("hostPath"))
}

fn snapshots(env: &TestEnv, namespace: &str) -> Api<HostPathSnapshot> {
    Api::namespaced(env.client.clone(), namespace)
}

async fn wait_ready(env: &TestEnv, name: &str) -> HostPathSnapshot {
    testbed::wait_for(&format!("snapshot {name} ready"), TIMEOUT, || async {
        let snapshot = snapshots(env, &env.ns).get(name).await?;
        anyhow::Ok(snapshot.status.as_ref().is_some_and(|s| s.ready_to_use).then_some(snapshot))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()))
}

async fn wait_gone(env: &TestEnv, name: &str) {
    testbed::wait_for(&format!("snapshot {name} gone"), TIMEOUT, || async {
        anyhow::Ok(snapshots(env, &env.ns).get_opt(name).await?.is_none().then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
}

/// What a backup keeps of a snapshot: its name, namespace, labels, annotations and spec.
fn saved(snapshot: &HostPathSnapshot) -> HostPathSnapshot {
    HostPathSnapshot {
        metadata: ObjectMeta {
            name: snapshot.metadata.name.clone(),
            namespace: snapshot.metadata.namespace.clone(),
            labels: snapshot.metadata.labels.clone(),
            annotations: snapshot.metadata.annotations.clone(),
            ..Default::default()
        },
        spec: snapshot.spec.clone(),
        ..Default::default()
    }
}

fn naming(namespace: &str, name: &str, copy_uid: &str, node: &str) -> HostPathSnapshot {
    let mut snapshot = HostPathSnapshot::new(name, "data");
    snapshot.metadata.namespace = Some(namespace.to_owned());
    snapshot.metadata.annotations =
        Some([(COPY_UID.to_owned(), copy_uid.to_owned()), (COPY_NODE.to_owned(), node.to_owned())].into());
    snapshot
}

/// Restores `snapshot` into a new claim `claim` and returns what its `data` file holds.
async fn restored_data(env: &TestEnv, class: &str, node: &str, claim: &str, snapshot: &str) -> String {
    let restoring =
        fixtures::claim(&env.ns, claim, class, "8Mi").provision_on_node(node).data_source_ref(GROUP, KIND, snapshot);
    env.create_claim(restoring).await;
    let path = host_path(&env.wait_bound(claim).await);
    String::from_utf8(std::fs::read(path.join("data")).expect("restored data")).unwrap()
}

fn uid_of(snapshot: &HostPathSnapshot) -> String {
    snapshot.metadata.uid.clone().expect("uid")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_made_again_gets_its_own_copy_back_or_is_refused_never_a_new_copy() {
    let mut env = TestEnv::start("snap-again", 0).await;
    // A provisioner name of its own: the cluster-wide answers come from this test's node.
    env.own_provisioner();
    install_crd(&env);
    let node = format!("{}-n", env.group);
    env.add_node(&node, &|spec| spec).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "8Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    std::fs::write(source.join("data"), b"at the snapshot").unwrap();
    let copies: PathBuf = env.node(&node).pool_root.join(".hpp-snapshots");
    let api = snapshots(&env, &env.ns);

    // Taken: the object names its own copy.
    api.create(&PostParams::default(), &HostPathSnapshot::new("nightly", "data")).await.expect("create");
    let first = wait_ready(&env, "nightly").await;
    let first_uid = uid_of(&first);
    let annotations = first.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get(COPY_UID), Some(&first_uid), "{annotations:?}");
    assert_eq!(annotations.get(COPY_NODE), Some(&node), "{annotations:?}");
    let backup = saved(&first);
    std::fs::write(source.join("data"), b"today").unwrap();

    // Lost without its deletion's work (a cluster rebuilt, its finalizer stripped): the copy
    // stays on the node (its orphan grace is the default hour).
    let strip = serde_json::json!({"metadata": {"finalizers": null}});
    api.patch("nightly", &PatchParams::default(), &Patch::Merge(&strip)).await.expect("strip");
    api.delete("nightly", &DeleteParams::default()).await.expect("delete");
    wait_gone(&env, "nightly").await;
    assert!(copies.join(&first_uid).is_dir(), "the copy outlives its object");

    // Made again from the backup: the same copy, at the same point in time.
    api.create(&PostParams::default(), &backup).await.expect("made again");
    wait_ready(&env, "nightly").await;
    // The status first, then the annotations name the object's own copy.
    let again = testbed::wait_for("the annotations name the adopted copy", TIMEOUT, || async {
        let snapshot = api.get("nightly").await?;
        let own = snapshot.metadata.uid.clone();
        let named = snapshot.metadata.annotations.as_ref().and_then(|a| a.get(COPY_UID)).cloned();
        anyhow::Ok((named == own).then_some(snapshot))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let again_uid = uid_of(&again);
    assert_ne!(again_uid, first_uid);
    let (was, is) = (first.status.clone().unwrap(), again.status.clone().unwrap());
    assert_eq!(is.creation_time, was.creation_time, "the point in time it names");
    assert_eq!((is.method, is.restore_size, is.size_bytes), (was.method, was.restore_size, was.size_bytes));
    assert!(copies.join(&again_uid).is_dir() && !copies.join(&first_uid).exists(), "renamed, not copied");
    let note = env.wait_event(&env.ns, &again_uid, "SnapshotReady").await;
    assert!(note.contains(&first_uid), "{note}");
    assert_eq!(restored_data(&env, &class, &node, "restored", "nightly").await, "at the snapshot");

    // Deleted as usual, its copy leaves; made again from the same backup, it is refused and
    // nothing is copied.
    api.delete("nightly", &DeleteParams::default()).await.expect("delete");
    wait_gone(&env, "nightly").await;
    wait_path_gone(&copies.join(&again_uid)).await;
    let refused = api.create(&PostParams::default(), &saved(&again)).await.expect("made again");
    let refused_uid = uid_of(&refused);
    let note = env.wait_event(&env.ns, &refused_uid, "SnapshotFailed").await;
    assert!(note.contains("no longer") && note.contains(COPY_UID), "{note}");
    let now = api.get("nightly").await.expect("get");
    assert!(!now.status.as_ref().is_some_and(|s| s.ready_to_use), "{:?}", now.status);
    assert!(!copies.join(&refused_uid).exists(), "no new copy of today's data under its name");

    // The way out the message gives: without the annotations, a new snapshot, taken now.
    let unnamed = serde_json::json!({"metadata": {"annotations": {COPY_UID: null, COPY_NODE: null}}});
    api.patch("nightly", &PatchParams::default(), &Patch::Merge(&unnamed)).await.expect("unname");
    wait_ready(&env, "nightly").await;
    assert_eq!(restored_data(&env, &class, &node, "restored-today", "nightly").await, "today");

    // Annotations naming a live snapshot's copy: refused in its namespace, refused in
    // another; the copy stays its owner's.
    let owner = wait_ready(&env, "nightly").await;
    let owner_uid = uid_of(&owner);
    api.create(&PostParams::default(), &naming(&env.ns, "thief", &owner_uid, &node)).await.expect("create");
    let thief = api.get("thief").await.expect("get");
    let note = env.wait_event(&env.ns, &uid_of(&thief), "SnapshotFailed").await;
    assert!(note.contains("belongs to snapshot \"nightly\""), "{note}");
    let other_ns = format!("{}-other", env.ns);
    Api::<Namespace>::all(env.client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta { name: Some(other_ns.clone()), ..Default::default() },
                ..Default::default()
            },
        )
        .await
        .expect("namespace");
    let elsewhere = snapshots(&env, &other_ns)
        .create(&PostParams::default(), &naming(&other_ns, "nightly", &owner_uid, &node))
        .await
        .expect("create");
    let note = env.wait_event(&other_ns, &uid_of(&elsewhere), "SnapshotFailed").await;
    assert!(note.contains("belongs to snapshot") || note.contains("was taken for snapshot"), "{note}");
    assert!(copies.join(&owner_uid).is_dir(), "the owner's copy stays");
    let owner_now = api.get("nightly").await.expect("get");
    assert_eq!(owner_now.status.as_ref().and_then(|s| s.node.as_deref()), Some(node.as_str()));
    assert!(owner_now.status.as_ref().is_some_and(|s| s.ready_to_use));
    assert_eq!(restored_data(&env, &class, &node, "restored-again", "nightly").await, "today");
    let _ = Api::<Namespace>::all(env.client.clone()).delete(&other_ns, &DeleteParams::default()).await;
    assert!(Path::new(&copies).is_dir());
}

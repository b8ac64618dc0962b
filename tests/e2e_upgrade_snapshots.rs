//! End-to-end: `HostPathSnapshot` copies across an upgrade of their node and back. A node of a
//! pinned earlier commit, the last before snapshots carried `status.volumeMode`, takes a snapshot
//! under that release's CRD. The node is then upgraded in place before the CRD (the order
//! docs/upgrading.md warns against): the snapshot says `SnapshotCrdOutdated` and a claim
//! restoring it waits, saying why, instead of guessing the copy's mode. Once this release's CRD
//! is applied, the node writes the mode from the copy's record and the claim gets the files as
//! they were when the earlier release took the copy. A snapshot this release takes is then
//! restored by the earlier release after a rollback, which also deletes every claim and snapshot
//! of both releases, leaving nothing in the pool.
//!
//! Like the mixed window (`e2e_upgrade_mixed.rs`), the earlier binary costs a build of its own,
//! so `make test-upgrade` builds it (hack/build-earlier-provisioner.sh) and runs this with
//! `HPP_EARLIER_SNAPSHOTS_PROVISIONER` naming it; `make test` does not.

mod common;

use std::path::{Path, PathBuf};

use common::snapshots::*;
use common::*;
use kube::api::DeleteParams;
use testbed::{ProvisionerSpec, fixtures};

/// The pinned commit `HPP_EARLIER_SNAPSHOTS_PROVISIONER` is built from (its start-up log line
/// says the commit): snapshots, but no `status.volumeMode` in their CRD.
const EARLIER_COMMIT: &str = "f97ac4e2008c69a35201a27d3fac850c02ba09fc";

/// The earlier release's CRD, as its install left it (applied from that commit's files).
fn apply_the_earlier_crd(env: &TestEnv) {
    let shown = std::process::Command::new("git")
        .args(["show", &format!("{EARLIER_COMMIT}:deploy/snapshots/crd.yaml")])
        .current_dir(repo())
        .output()
        .expect("git show");
    assert!(shown.status.success(), "the earlier CRD from git history: {}", String::from_utf8_lossy(&shown.stderr));
    let text = String::from_utf8(shown.stdout).expect("UTF-8");
    assert!(!text.contains("volumeMode"), "the pinned commit's CRD predates status.volumeMode");
    let file = env.cp.temp_dir().join(format!("{}-earlier-crd.yaml", env.group));
    std::fs::write(&file, text).expect("write the earlier CRD");
    let run = |args: &[&str]| env.cp.run_kubectl(&repo(), args).unwrap_or_else(|e| panic!("{e:#}"));
    run(&["apply", "--server-side", "-f", &file.display().to_string()]);
    run(&["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{CRD}")]);
}

/// The files under `root` with their contents, sorted.
fn contents(root: &Path) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the volume") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let text = std::fs::read_to_string(&path).expect("read a file");
                found.push((path.strip_prefix(root).expect("under the root").to_owned(), text));
            }
        }
    }
    found.sort();
    found
}

async fn wait_snapshot_gone(env: &TestEnv, name: &str) {
    testbed::wait_for(&format!("snapshot {name} gone"), TIMEOUT, || async {
        anyhow::Ok(snapshots(env).get_opt(name).await?.is_none().then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_of_the_earlier_release_restores_after_the_upgrade_and_one_of_this_release_after_a_rollback() {
    let Some(earlier) = std::env::var_os("HPP_EARLIER_SNAPSHOTS_PROVISIONER").map(PathBuf::from) else {
        // Not run by `make test` (see the top of this file), as the mixed window.
        println!("not here: run by `make test-upgrade` (HPP_EARLIER_SNAPSHOTS_PROVISIONER; its build is long)");
        return;
    };
    assert!(earlier.is_file(), "HPP_EARLIER_SNAPSHOTS_PROVISIONER={}: no such file", earlier.display());
    let mut env = TestEnv::start("upgrade-snap", 0).await;
    env.own_provisioner();
    apply_the_earlier_crd(&env);
    let node = format!("{}-n", env.group);
    let earlier_binary = earlier.clone();
    env.add_node(&node, &move |spec: ProvisionerSpec| ProvisionerSpec { binary: earlier_binary.clone(), ..spec }).await;
    let started = std::fs::read_to_string(env.nodes[0].provisioner.log_path()).expect("the node's log");
    assert!(started.contains(EARLIER_COMMIT), "the node runs the earlier commit's binary:\n{started}");
    let class = env.class("imm", |c| c.immediate()).await;

    // The earlier release's snapshot of a volume with files in a subdirectory.
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "8Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    std::fs::write(source.join("note"), "before").expect("write");
    std::fs::create_dir(source.join("sub")).expect("mkdir");
    std::fs::write(source.join("sub/more"), "kept").expect("write");
    let before = contents(&source);
    take(&env, "taken-before", "data").await;
    let taken_before = wait_ready(&env, "taken-before").await;
    let status = taken_before.status.clone().expect("status");
    assert_eq!(status.node.as_deref(), Some(node.as_str()));
    assert_eq!(status.volume_mode, None, "the earlier release's CRD has no status.volumeMode");
    let before_uid = taken_before.metadata.uid.clone().expect("uid");
    let copies = env.nodes[0].pool_root.join(".hpp-snapshots");
    assert!(copies.join(&before_uid).is_dir(), "the earlier release's copy in the pool");
    std::fs::write(source.join("note"), "after").expect("write");

    // The node upgraded before the CRD: no mode can be written, and nothing is guessed.
    env.node_mut(&node).provisioner.restart_as(&binary()).expect("upgrade the node");
    env.node_mut(&node).provisioner.wait_ready(TIMEOUT).await.expect("ready after the upgrade");
    let note = env.wait_event(&env.ns, &before_uid, "SnapshotCrdOutdated").await;
    assert!(note.contains("apply this release's CRD"), "{note}");
    let restored = env.create_claim(restoring(&env, "restored", &class, "8Mi", "taken-before", &node)).await;
    let note = env.wait_event(&env.ns, &uid(&restored), "CloneSourceNotReady").await;
    assert!(note.contains("no status.volumeMode yet"), "{note}");
    let waiting = env.claims().get("restored").await.expect("read");
    assert!(waiting.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_none_or(str::is_empty), "not bound yet");

    // This release's CRD: the mode is read back from the copy, and the restore goes on.
    install_crd(&env);
    testbed::wait_for("the earlier snapshot's mode written from its copy", TIMEOUT, || async {
        let now = snapshots(&env).get("taken-before").await?;
        anyhow::Ok((now.status.and_then(|s| s.volume_mode).as_deref() == Some("Filesystem")).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let restored = host_path(&env.wait_bound("restored").await);
    assert_eq!(contents(&restored), before, "the earlier release's copy restored as it was taken");

    // A snapshot of this release, restored by the earlier one after a rollback.
    let after = contents(&source);
    take(&env, "taken-after", "data").await;
    let taken_after = wait_ready(&env, "taken-after").await;
    let after_uid = taken_after.metadata.uid.clone().expect("uid");
    assert!(copies.join(&after_uid).is_dir(), "this release's copy in the pool");
    assert_eq!(taken_after.status.and_then(|s| s.volume_mode).as_deref(), Some("Filesystem"));
    env.node_mut(&node).provisioner.restart_as(&earlier).expect("roll the node back");
    env.node_mut(&node).provisioner.wait_ready(TIMEOUT).await.expect("ready after the rollback");
    env.create_claim(restoring(&env, "restored-by-earlier", &class, "8Mi", "taken-after", &node)).await;
    let restored_by_earlier = host_path(&env.wait_bound("restored-by-earlier").await);
    assert_eq!(contents(&restored_by_earlier), after, "this release's copy restored by the earlier one");

    // The earlier release deletes what both made: claims, snapshots and their copies.
    for name in ["taken-before", "taken-after"] {
        snapshots(&env).delete(name, &DeleteParams::default()).await.expect("delete snapshot");
    }
    for name in ["taken-before", "taken-after"] {
        wait_snapshot_gone(&env, name).await;
    }
    for claim in ["restored", "restored-by-earlier", "data"] {
        let pv = env.claims().get(claim).await.expect("read").spec.and_then(|s| s.volume_name).expect("bound");
        env.delete_claim(claim).await;
        env.wait_pv_gone(&pv).await;
    }
    let pool = env.nodes[0].pool_root.clone();
    wait_trash_empty(&pool).await;
    // (Hidden entries are the copies' own staging, kept by the pool.)
    let copies_left: Vec<String> = entries(&copies).into_iter().filter(|e| !e.starts_with('.')).collect();
    assert!(copies_left.is_empty(), "no snapshot copy left: {copies_left:?}");
    assert!(!copies.join(&before_uid).exists() && !copies.join(&after_uid).exists(), "both copies gone");
    let left: Vec<String> = entries(&pool).into_iter().filter(|e| e.starts_with("pvc-")).collect();
    assert!(left.is_empty(), "no volume left: {left:?}");
}

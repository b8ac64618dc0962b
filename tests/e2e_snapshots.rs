//! End-to-end: `HostPathSnapshot` (docs/snapshots.md) against a real control plane, on btrfs,
//! XFS and ext4 pools (loop-mounted): a snapshot of a volume is taken on its node (a reflink
//! copy on btrfs and XFS, bytes on ext4; a btrfs snapshot of a quota volume), a claim naming it
//! in `dataSourceRef` gets the files as they were, with their owners and modes; a restore too
//! small, of a snapshot that does not exist, or of a claim that does not exist, says why; a
//! deleted snapshot waits for the claims restoring from it, then its copy goes to the trash;
//! the doc's own examples, as written, and what its warning about `dataSource:` says; copies
//! whose snapshot is gone; byte copies that wait for room and count as promised space.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;
use hostpath_provisioner::deciding::snapshot::{GROUP, HostPathSnapshot, KIND};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use testbed::fixtures;

const CRD: &str = "hostpathsnapshots.hostpath-provisioner.kubevirt.io";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Installs the CRD as the manifests do (idempotent: the tests of this binary share the control
/// plane).
fn install_crd(env: &TestEnv) {
    let run = |args: &[&str]| env.cp.run_kubectl(&repo(), args).unwrap_or_else(|e| panic!("{e:#}"));
    run(&["apply", "--server-side", "-f", "deploy/snapshots/crd.yaml"]);
    run(&["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{CRD}")]);
}

fn host_path(pv: &PersistentVolume) -> PathBuf {
    PathBuf::from(pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone()).expect("hostPath"))
}

fn snapshots(env: &TestEnv) -> Api<HostPathSnapshot> {
    Api::namespaced(env.client.clone(), &env.ns)
}

async fn take(env: &TestEnv, name: &str, source: &str) -> HostPathSnapshot {
    snapshots(env).create(&PostParams::default(), &HostPathSnapshot::new(name, source)).await.expect("create snapshot")
}

async fn wait_ready(env: &TestEnv, name: &str) -> HostPathSnapshot {
    testbed::wait_for(&format!("snapshot {name} ready"), TIMEOUT, || async {
        let snapshot = snapshots(env).get(name).await?;
        anyhow::Ok(snapshot.status.as_ref().is_some_and(|s| s.ready_to_use).then_some(snapshot))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()))
}

fn restoring(env: &TestEnv, name: &str, class: &str, size: &str, snapshot: &str, node: &str) -> fixtures::ClaimBuilder {
    fixtures::claim(&env.ns, name, class, size).provision_on_node(node).data_source_ref(GROUP, KIND, snapshot)
}

/// What a volume holds, for comparing a restore with its source: each entry's path, type,
/// owner, mode and content (or link target).
fn listing(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_owned()];
    while let Some(dir) = stack.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for path in entries {
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let what = if meta.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir".into()
            } else {
                String::from_utf8_lossy(&std::fs::read(&path).unwrap()).into_owned()
            };
            let relative = path.strip_prefix(root).unwrap().display();
            out.push(format!("{relative} {}:{} {:o} {what}", meta.uid(), meta.gid(), meta.mode() & 0o7777));
        }
    }
    out.sort();
    out
}

/// Files with owners, modes, a subdirectory and a symlink.
fn fill(dir: &Path) {
    std::fs::write(dir.join("data"), b"before").unwrap();
    std::fs::create_dir(dir.join("private")).unwrap();
    std::fs::write(dir.join("private/key"), b"secret").unwrap();
    std::os::unix::fs::chown(dir.join("private"), Some(1234), Some(5678)).unwrap();
    std::os::unix::fs::chown(dir.join("private/key"), Some(1234), Some(5678)).unwrap();
    std::fs::set_permissions(dir.join("private"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(dir.join("private/key"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::symlink("private/key", dir.join("link")).unwrap();
}

/// One filesystem: snapshot, change the source, restore, compare; then the refusals and the
/// deletion. `mount` makes the pool's filesystem; `method` is what the copy must be.
async fn snapshot_and_restore_on(fs: &str, mount: impl Fn(&Path) -> LoopFs, method: &str) {
    let mut env = TestEnv::start(&format!("snap-{fs}"), 0).await;
    // A provisioner name of its own: the cluster-wide answers (a snapshot of nothing) come
    // from this test's node, not from a node of another test whose lease outlives it.
    env.own_provisioner();
    install_crd(&env);
    let node = format!("{}-n", env.group);
    let disk = mount(&testbed::pool_root_for(env.cp, &node));
    env.add_node(&node, &|spec| spec).await;
    let class = env.class("imm", |c| c.immediate()).await;

    env.create_claim(fixtures::claim(&env.ns, "data", &class, "8Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    fill(&source);
    let before = listing(&source);

    take(&env, "before-upgrade", "data").await;
    let snapshot = wait_ready(&env, "before-upgrade").await;
    let status = snapshot.status.clone().unwrap();
    assert_eq!(status.node.as_deref(), Some(node.as_str()));
    assert_eq!(status.method.as_deref(), Some(method), "{fs}");
    assert_eq!(status.restore_size.as_deref(), Some("8Mi"));
    let snapshot_uid = snapshot.metadata.uid.clone().unwrap();
    let copy = disk.dir.join(".hpp-snapshots").join(&snapshot_uid);
    assert!(copy.is_dir(), "the copy sits in the pool's snapshots directory");
    // The status names the pool root holding it: the operator keeps that pool's claim for it.
    assert_eq!(status.pool_root.as_deref().map(Path::new), Some(disk.dir.as_path()), "{fs}");
    // The source changes after the snapshot: the restore has it as it was.
    std::fs::write(source.join("data"), b"after").unwrap();

    env.create_claim(restoring(&env, "restored", &class, "8Mi", "before-upgrade", &node)).await;
    let restored = host_path(&env.wait_bound("restored").await);
    assert_eq!(listing(&restored), before, "{fs}: the files, owners and modes of the snapshot");

    // Refusals, each with what to change.
    let small = env.create_claim(restoring(&env, "small", &class, "1Mi", "before-upgrade", &node)).await;
    let note = env.wait_event(&env.ns, &uid(&small), "ProvisioningFailed").await;
    assert!(note.contains("at least"), "{note}");
    let missing = env.create_claim(restoring(&env, "missing", &class, "8Mi", "no-such-snapshot", &node)).await;
    let note = env.wait_event(&env.ns, &uid(&missing), "CloneSourceNotReady").await;
    assert!(note.contains("does not exist"), "{note}");
    let orphan = take(&env, "of-nothing", "no-such-claim").await;
    let note = env.wait_event(&env.ns, orphan.metadata.uid.as_deref().unwrap(), "SnapshotFailed").await;
    assert!(note.contains("no-such-claim"), "{note}");

    // Deleted while a claim waits to be restored from it: the copy stays for it (a pending
    // claim naming it counts, whatever keeps it pending: the event names them).
    env.delete_claim("small").await;
    env.create_claim(restoring(&env, "later", &class, "8Mi", "before-upgrade", "no-such-node")).await;
    snapshots(&env).delete("before-upgrade", &DeleteParams::default()).await.expect("delete snapshot");
    let note = env.wait_event(&env.ns, &snapshot_uid, "SnapshotDeleteWaiting").await;
    assert!(note.contains("later") && !note.contains("small"), "{note}");
    assert!(copy.is_dir());
    env.delete_claim("later").await;
    testbed::wait_for("snapshot gone", TIMEOUT, || async {
        anyhow::Ok(snapshots(&env).get_opt("before-upgrade").await?.is_none().then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    assert!(!copy.exists(), "the copy left for the trash");
    assert_eq!(listing(&restored), before, "the restored volume is its own");
    // A clean shutdown with the snapshot watch running ends in time (SIGKILL would show here).
    for node in &mut env.nodes {
        let status = node.provisioner.terminate();
        assert!(status.is_some_and(|s| s.success()), "{status:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn on_btrfs_a_snapshot_is_a_reflink_copy_and_restores_as_it_was() {
    snapshot_and_restore_on("btrfs", |dir| LoopFs::mount_btrfs(dir, 160), "reflink").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_xfs_a_snapshot_is_a_reflink_copy_and_restores_as_it_was() {
    snapshot_and_restore_on("xfs", LoopFs::mount_xfs, "reflink").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn on_ext4_a_snapshot_is_a_byte_copy_and_restores_as_it_was() {
    snapshot_and_restore_on("ext4", |dir| LoopFs::mount(dir, 64, None), "bytes").await;
}

/// On btrfs with quota, a `quota: enforce` volume is a subvolume: its snapshot is a btrfs
/// snapshot, and a claim of the same class restored from it is limited to its own request.
#[tokio::test(flavor = "multi_thread")]
async fn on_btrfs_with_quota_a_snapshot_is_a_subvolume_snapshot_and_its_restore_is_limited() {
    let mut env = TestEnv::start("snap-qgroup", 0).await;
    // A provisioner name of its own: the cluster-wide answers (a snapshot of nothing) come
    // from this test's node, not from a node of another test whose lease outlives it.
    env.own_provisioner();
    install_crd(&env);
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount_btrfs(&testbed::pool_root_for(env.cp, &node), 256);
    hostpath_provisioner::filesystem::PoolRoot::open("legacy", &disk.dir)
        .expect("open pool")
        .enable_btrfs_quota()
        .expect("enable quota");
    env.add_node(&node, &|spec| spec).await;
    let class = env.class("enforced", |c| c.immediate().parameter("quota", "enforce")).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "8Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    fill(&source);
    let before = listing(&source);

    take(&env, "snap", "data").await;
    let status = wait_ready(&env, "snap").await.status.unwrap();
    assert_eq!(status.method.as_deref(), Some("snapshot"));

    env.create_claim(restoring(&env, "restored", &class, "16Mi", "snap", &node)).await;
    let restored = host_path(&env.wait_bound("restored").await);
    assert_eq!(listing(&restored), before);
    // Limited to its request: writing 64 MiB stops near 16 MiB.
    let chunk = vec![0x5au8; 1 << 20];
    let mut written = 0u64;
    {
        use std::io::Write;
        let mut file = std::fs::File::create(restored.join("fill")).unwrap();
        while written < 64 << 20 {
            if file.write_all(&chunk).and_then(|()| file.sync_data()).is_err() {
                break;
            }
            written += 1 << 20;
        }
    }
    assert!(written < 20 << 20, "the restore's limit holds: {written} bytes written");
    // A clean shutdown with the snapshot watch running ends in time (SIGKILL would show here).
    for node in &mut env.nodes {
        let status = node.provisioner.terminate();
        assert!(status.is_some_and(|s| s.success()), "{status:?}");
    }
}

/// How long the tests below let a copy without its snapshot stay: long enough to see it
/// reported and counted (a sweep every 5 s), short enough to see it go.
const ORPHAN_GRACE: &str = "20s";

/// The UID of the Node `name`: events about a node's disks are on its Node object.
async fn node_uid(client: &kube::Client, name: &str) -> String {
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone()).get(name).await.expect("node");
    node.metadata.uid.expect("uid")
}

/// The orphaned-copies gauge of a node's pool root, from its /metrics.
async fn orphaned_copies(provisioner: &testbed::Provisioner) -> Option<f64> {
    let metrics = provisioner.metrics().await.ok()?;
    metrics
        .lines()
        .filter(|l| l.starts_with("hostpath_provisioner_orphaned_snapshot_copies{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .reduce(f64::max)
}

/// A copy whose snapshot went without its node's say is found by the node that holds it, from
/// its disk: a snapshot whose finalizer was stripped, and one whose status named another node
/// (the deletion went there, which had nothing). Each is reported on the Node with an Event and
/// counted, then moved to the trash after the grace; a copy cut short (its staging, named by
/// the snapshot's UID) is removed when the node starts again. A live snapshot's copy stays.
#[tokio::test(flavor = "multi_thread")]
async fn copies_whose_snapshot_is_gone_are_reported_then_trashed_and_cut_copies_swept_at_start() {
    let mut env = TestEnv::start("snap-orphans", 0).await;
    // A provisioner name of its own: the cluster-wide answers (a snapshot of nothing) come
    // from this test's node, not from a node of another test whose lease outlives it.
    env.own_provisioner();
    install_crd(&env);
    let (holder, other) = (format!("{}-a", env.group), format!("{}-b", env.group));
    for node in [&holder, &other] {
        env.add_node(node, &|spec| spec.env("ORPHAN_SNAPSHOT_COPY_GRACE", ORPHAN_GRACE)).await;
    }
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "8Mi").provision_on_node(&holder)).await;
    fill(&host_path(&env.wait_bound("data").await));
    let copies = env.node(&holder).pool_root.join(".hpp-snapshots");
    let mut orphaned = Vec::new();
    for name in ["stripped", "forged", "kept"] {
        take(&env, name, "data").await;
        let snapshot = wait_ready(&env, name).await;
        let uid = snapshot.metadata.uid.clone().unwrap();
        assert!(copies.join(&uid).is_dir(), "{name}: its copy");
        if name != "kept" {
            orphaned.push(uid);
        }
    }
    // Its finalizer stripped by someone who may patch snapshots, then deleted.
    let patch = serde_json::json!({"metadata": {"finalizers": null}});
    snapshots(&env).patch("stripped", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("strip");
    snapshots(&env).delete("stripped", &DeleteParams::default()).await.expect("delete");
    // Its status names the other node (only the provisioner and cluster admins may write
    // status), then deleted: the other node has no copy and lets the object go.
    let forged = serde_json::json!({"status": {"node": other}});
    snapshots(&env).patch_status("forged", &PatchParams::default(), &Patch::Merge(&forged)).await.expect("forge");
    snapshots(&env).delete("forged", &DeleteParams::default()).await.expect("delete");
    testbed::wait_for("both snapshots gone", TIMEOUT, || async {
        let gone =
            snapshots(&env).get_opt("stripped").await?.is_none() && snapshots(&env).get_opt("forged").await?.is_none();
        anyhow::Ok(gone.then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    assert!(orphaned.iter().all(|uid| copies.join(uid).is_dir()), "the deletions left both copies");

    // Reported on the holder's Node, and counted while they wait.
    let node = node_uid(&env.client, &holder).await;
    let note = env.wait_event("default", &node, "SnapshotCopyOrphaned").await;
    assert!(orphaned.iter().any(|uid| note.contains(uid.as_str())) && note.contains("trash"), "{note}");
    let counted = orphaned_copies(&env.node(&holder).provisioner).await;
    assert!(counted.is_some_and(|n| n >= 1.0), "the gauge counts them: {counted:?}");
    // The doctor on that node names them too (it lists the copies against the cluster's
    // snapshots as the node does); the live snapshot's copy is not named.
    let index = env.nodes.iter().position(|n| n.name == holder).unwrap();
    let report = doctor_report(&env, index, &[]).await;
    let findings = report["findings"].to_string();
    let named: Vec<&String> = orphaned.iter().filter(|uid| findings.contains(uid.as_str())).collect();
    assert!(findings.contains("orphan_snapshot_copy") && !named.is_empty(), "{findings}");
    // Then moved to the trash, and the live snapshot's copy stays.
    for uid in &orphaned {
        wait_path_gone(&copies.join(uid)).await;
    }
    env.wait_event("default", &node, "SnapshotCopyRemoved").await;
    let kept = snapshots(&env).get("kept").await.expect("kept").metadata.uid.unwrap();
    assert!(copies.join(&kept).is_dir(), "a live snapshot's copy is never touched");
    let other_copies = env.node(&other).pool_root.join(".hpp-snapshots");
    assert!(!other_copies.exists() || entries(&other_copies).is_empty(), "nothing was ever on the other node");

    // A copy cut short (a kill mid-copy) stays in this node's staging under the snapshot's UID;
    // the next start removes it, and nothing else there.
    let staging = copies.join(".hpp-clones").join(&holder);
    let cut = staging.join("3f0e1c2a-0000-4000-8000-00000000c0de");
    std::fs::create_dir_all(&cut).unwrap();
    std::fs::write(cut.join("half"), b"half a copy").unwrap();
    let foreign = staging.join("not-a-copy");
    std::fs::create_dir_all(&foreign).unwrap();
    env.node_mut(&holder).provisioner.restart().expect("restart");
    wait_path_gone(&cut).await;
    assert!(foreign.is_dir(), "an entry the provisioner never names so is left alone");
    assert!(copies.join(&kept).is_dir());
}

/// The CustomResourceDefinition deleted while a node is down (an admin strips the finalizers
/// its deletion waits for) takes every snapshot with it: the node, back without the CRD, finds
/// the copies on its disks without an object and trashes them after the grace. On a control
/// plane of its own (the other tests share the CRD).
#[tokio::test(flavor = "multi_thread")]
async fn copies_left_by_a_deleted_crd_are_found_on_the_disk_and_trashed() {
    let mut spec = testbed::ClusterSpec::new(binary(), 1);
    spec.provisioner_args = vec!["--orphan-snapshot-copy-grace".into(), ORPHAN_GRACE.into()];
    let mut cluster = testbed::Cluster::start_with(spec).await.expect("cluster");
    let _logs = cluster.logs_on_failure();
    let run = |args: &[&str]| cluster.cp.run_kubectl(&repo(), args).unwrap_or_else(|e| panic!("{e:#}"));
    run(&["apply", "--server-side", "-f", "deploy/snapshots/crd.yaml"]);
    run(&["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{CRD}")]);
    // Snapshots are looked for at start: the node starts again with the CRD there.
    cluster.nodes[0].provisioner.restart().expect("restart");
    let client = cluster.client();
    let node = cluster.nodes[0].name.clone();
    let ns = "crd-gone";
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &fixtures::namespace(ns))
        .await
        .expect("namespace");
    let class = fixtures::storage_class("imm", "kubevirt.io/hostpath-provisioner").immediate().build();
    Api::<k8s_openapi::api::storage::v1::StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .expect("class");
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    claims
        .create(&PostParams::default(), &fixtures::claim(ns, "data", "imm", "8Mi").provision_on_node(&node).build())
        .await
        .expect("claim");
    let snapshots: Api<HostPathSnapshot> = Api::namespaced(client.clone(), ns);
    let uid = testbed::wait_for("the claim bound, then its snapshot ready", TIMEOUT, || async {
        if claims.get("data").await?.status.and_then(|s| s.phase).as_deref() != Some("Bound") {
            return anyhow::Ok(None);
        }
        let Some(snapshot) = snapshots.get_opt("snap").await? else {
            snapshots.create(&PostParams::default(), &HostPathSnapshot::new("snap", "data")).await?;
            return Ok(None);
        };
        Ok(snapshot.status.is_some_and(|s| s.ready_to_use).then_some(snapshot.metadata.uid).flatten())
    })
    .await
    .expect("snapshot ready");
    let copy = cluster.nodes[0].pool_root.join(".hpp-snapshots").join(&uid);
    assert!(copy.is_dir());
    // The CRD is deleted while the node is down: its deletion waits for the snapshot's
    // finalizer, which an admin then strips so that the deletion ends.
    cluster.nodes[0].provisioner.kill();
    run(&["delete", "crd", CRD, "--wait=false"]);
    let patch = serde_json::json!({"metadata": {"finalizers": null}});
    snapshots.patch("snap", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("strip the finalizer");
    run(&["wait", "--for=delete", "--timeout=120s", &format!("crd/{CRD}")]);
    assert!(copy.is_dir(), "the objects went with the CRD, the copy stayed");
    // The node comes back without the CRD (snapshots off), and still finds the copy.
    cluster.nodes[0].provisioner.restart().expect("restart");
    wait_path_gone(&copy).await;
    let removed = cluster.nodes[0].provisioner.log_tail(200);
    assert!(removed.contains("moved a snapshot copy without its snapshot to the trash"), "{removed}");
}

/// The fenced `yaml` block of docs/snapshots.md under the heading `section` that holds
/// `kind: <kind>`, as the doc writes it.
fn doc_example(section: &str, kind: &str) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/snapshots.md")).expect("docs/snapshots.md");
    let (mut heading, mut block, mut blocks) = ("", None::<String>, Vec::new());
    for line in doc.lines() {
        match (&mut block, line) {
            (None, l) if l.starts_with("## ") => heading = l.trim_start_matches("## "),
            (None, "```yaml") => block = Some(String::new()),
            (Some(text), "```") => {
                blocks.push((heading, std::mem::take(text)));
                block = None;
            }
            (Some(text), l) => {
                text.push_str(l);
                text.push('\n');
            }
            (None, _) => {}
        }
    }
    let found: Vec<String> = blocks
        .into_iter()
        .filter(|(h, text)| *h == section && text.lines().any(|l| l == format!("kind: {kind}")))
        .map(|(_, text)| text)
        .collect();
    assert_eq!(found.len(), 1, "docs/snapshots.md, {section:?}: one example of kind {kind}: {found:#?}");
    found.into_iter().next().unwrap_or_default()
}

/// A claim of `namespace` once it is Bound, and its PV's directory.
async fn bound_directory(env: &TestEnv, namespace: &str, claim: &str) -> PathBuf {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), namespace);
    let pv = testbed::wait_for(&format!("claim {namespace}/{claim} Bound"), TIMEOUT, || async {
        let claim = claims.get(claim).await?;
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        anyhow::Ok(bound.then(|| claim.spec.and_then(|s| s.volume_name)).flatten())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    host_path(&env.pvs().get(&pv).await.expect("PV"))
}

/// docs/snapshots.md's examples as written (its namespace `team-a`, its claim `db`, the class of
/// the installs, `hostpath-provisioner`, WaitForFirstConsumer): the snapshot of "Taking a
/// snapshot" is taken, and the claim of "Restoring" gets its files once a pod on the snapshot's
/// node uses it. Then the doc's warning: the same claim with `dataSource:` in place of
/// `dataSourceRef:` is stored by the API server with neither field and becomes an empty volume.
#[tokio::test(flavor = "multi_thread")]
async fn the_documented_snapshot_and_restore_run_as_written_and_data_source_gives_an_empty_volume() {
    let mut env = TestEnv::start("snap-doc", 0).await;
    install_crd(&env);
    let kubectl = |args: &[&str]| env.cp.run_kubectl(&repo(), args).unwrap_or_else(|e| panic!("{e:#}"));
    // The class deploy/legacy installs (the chart's default class is the same).
    kubectl(&["apply", "-f", "deploy/legacy/storageclass-wffc.yaml"]);
    kubectl(&["create", "namespace", "team-a"]);
    let node = format!("{}-n", env.group);
    env.add_node(&node, &|spec| spec).await;
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), "team-a");
    let pod_on_node =
        |name: &str, claim: &str| fixtures::pod_using_claim("team-a", name, claim).on_hostname(&node).build();

    // The source claim `db` the example snapshots, written by its pod.
    let db = fixtures::claim("team-a", "db", "hostpath-provisioner", "10Gi").build();
    Api::<PersistentVolumeClaim>::namespaced(env.client.clone(), "team-a")
        .create(&PostParams::default(), &db)
        .await
        .expect("create db");
    pods.create(&PostParams::default(), &pod_on_node("db-user", "db")).await.expect("pod");
    let source = bound_directory(&env, "team-a", "db").await;
    fill(&source);
    let before = listing(&source);

    let dir = tempfile::tempdir().expect("temp dir");
    let apply = |name: &str, yaml: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, yaml).expect("write example");
        kubectl(&["apply", "-f", file.to_str().expect("utf-8 path")])
    };
    apply("snapshot.yaml", &doc_example("Taking a snapshot", "HostPathSnapshot"));
    let snapshots: Api<HostPathSnapshot> = Api::namespaced(env.client.clone(), "team-a");
    testbed::wait_for("db-before-upgrade ready", TIMEOUT, || async {
        let snapshot = snapshots.get("db-before-upgrade").await?;
        anyhow::Ok(snapshot.status.as_ref().is_some_and(|s| s.ready_to_use).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    std::fs::write(source.join("data"), b"after").unwrap();

    let restore = doc_example("Restoring", "PersistentVolumeClaim");
    apply("restore.yaml", &restore);
    pods.create(&PostParams::default(), &pod_on_node("db-restored-user", "db-restored")).await.expect("pod");
    let restored = bound_directory(&env, "team-a", "db-restored").await;
    assert_eq!(listing(&restored), before, "the restore has the snapshot's files");

    // The warning: `dataSource:` naming the snapshot. The API server drops a dataSource of any
    // kind but PersistentVolumeClaim and VolumeSnapshot before copying it to dataSourceRef, so
    // nothing tells the provisioner of the snapshot.
    let wrong = restore.replace("dataSourceRef:", "dataSource:").replace("name: db-restored\n", "name: db-empty\n");
    assert!(wrong.contains("dataSource:\n") && wrong.contains("name: db-empty\n"), "{wrong}");
    apply("wrong.yaml", &wrong);
    let stored: PersistentVolumeClaim =
        Api::namespaced(env.client.clone(), "team-a").get("db-empty").await.expect("db-empty");
    let spec = stored.spec.expect("spec");
    assert!(spec.data_source.is_none() && spec.data_source_ref.is_none(), "stored as: {spec:?}");
    pods.create(&PostParams::default(), &pod_on_node("db-empty-user", "db-empty")).await.expect("pod");
    let empty = bound_directory(&env, "team-a", "db-empty").await;
    let entries = std::fs::read_dir(&empty).expect("read the volume").count();
    assert_eq!(entries, 0, "an empty volume, not the snapshot's files");
}

/// Writes `mib` MiB of data that is neither sparse nor zeros (a byte copy copies every block).
fn write_mib(path: &Path, mib: usize) {
    let block: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    let mut file = std::fs::File::create(path).unwrap();
    for _ in 0..mib {
        std::io::Write::write_all(&mut file, &block).unwrap();
    }
    file.sync_all().unwrap();
}

/// The pool's reserve for the room tests below.
const RESERVE_MIB: u64 = 16;

/// Samples the free space of `dir` every few milliseconds until told to stop; returns the least
/// seen.
fn sample_free_space(
    dir: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut least = u64::MAX;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            least = least.min(common::capacity::available_bytes(&dir));
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        least
    })
}

/// Byte copies never take a pool below its reserve: four snapshots of a 12 MiB volume asked at
/// once on a 64 MiB ext4 pool with a 16 MiB reserve are copied only as far as they fit beside
/// each other (the others wait, saying why), and a restore into a 1Mi claim of a snapshot that
/// holds 12 MiB checks those 12 MiB, not the claim's request: it waits with an event, then
/// proceeds once snapshots are deleted. The free space is sampled throughout.
#[tokio::test(flavor = "multi_thread")]
async fn byte_copies_wait_for_room_and_never_take_the_pool_below_its_reserve() {
    let mut env = TestEnv::start("snap-room", 0).await;
    // A provisioner name of its own: the cluster-wide answers (a snapshot of nothing) come
    // from this test's node, not from a node of another test whose lease outlives it.
    env.own_provisioner();
    install_crd(&env);
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    let reserve = format!("{RESERVE_MIB}Mi");
    env.add_node(&node, &|spec| spec.env("RESERVED_SPACE", &reserve)).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    // 12 MiB of data a pod wrote (past its 1Mi request: no quota), not sparse.
    write_mib(&source.join("data"), 12);
    let reserve_bytes = RESERVE_MIB << 20;
    let free_before = common::capacity::available_bytes(&disk.dir);
    let fits = (free_before - reserve_bytes) / (12 << 20);
    assert!((1..4).contains(&fits), "the disk holds some of the four copies, not all: {fits}");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_free_space(disk.dir.clone(), stop.clone());
    let names = ["s1", "s2", "s3", "s4"];
    futures::future::join_all(names.iter().map(|name| take(&env, name, "data"))).await;
    // Each either completes or waits for room, saying so.
    let outcomes = testbed::wait_for("every snapshot copied or waiting for room", TIMEOUT, || async {
        let mut outcomes = Vec::new();
        for name in names {
            let status = snapshots(&env).get(name).await?.status.unwrap_or_default();
            match (status.ready_to_use, status.message) {
                (true, _) => outcomes.push((name, true)),
                (false, Some(m)) if m.contains("waits until there is room") => outcomes.push((name, false)),
                _ => return anyhow::Ok(None),
            }
        }
        Ok(Some(outcomes))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let ready: Vec<&str> = outcomes.iter().filter(|(_, ready)| *ready).map(|(name, _)| *name).collect();
    // A copy in flight counts in full until it ends, whatever it wrote already: one started
    // while another is half done may wait although it would fit, never the other way round.
    assert!(
        (1..=fits).contains(&(ready.len() as u64)),
        "at least one copy and no more than fit beside the reserve ({fits}): {outcomes:?}"
    );
    let waiting = outcomes.iter().find(|(_, ready)| !ready).map(|(name, _)| *name).unwrap();
    let waiting_uid = snapshots(&env).get(waiting).await.unwrap().metadata.uid.unwrap();
    let note = env.wait_event(&env.ns, &waiting_uid, "SnapshotFailed").await;
    assert!(note.contains("12 MiB") && note.contains("reserve"), "says what it needs and why it waits: {note}");

    // A restore of 12 MiB into a 1Mi claim: checked against what the snapshot holds.
    let restore = env.create_claim(restoring(&env, "restored", &class, "1Mi", ready[0], &node)).await;
    let note = env.wait_event(&env.ns, &uid(&restore), "ProvisioningFailed").await;
    assert!(note.contains("the restore of snapshot") && note.contains("waits until there is room"), "{note}");
    let least = {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.join().unwrap()
    };
    // A little slack for the filesystem's own metadata of the directories made.
    assert!(least + (1 << 20) >= reserve_bytes, "free space fell to {least} bytes, below the reserve {reserve_bytes}");
    assert!(
        !source.parent().unwrap().join(format!("pvc-{}", uid(&restore))).exists(),
        "nothing of the restore written"
    );

    // Room made: the waiting snapshots go, and the restore proceeds.
    for (name, _) in &outcomes {
        if *name != ready[0] {
            snapshots(&env).delete(name, &DeleteParams::default()).await.expect("delete");
        }
    }
    // Once the copies' data has left the trash, the room is there; the claim retries with a
    // backoff grown meanwhile, so a change to it looks again now.
    testbed::wait_for("the deleted snapshots' room given back", TIMEOUT, || async {
        let free = common::capacity::available_bytes(&disk.dir);
        anyhow::Ok((free > reserve_bytes + (13 << 20)).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let nudge = serde_json::json!({"metadata": {"annotations": {"hpp-test/nudge": "room"}}});
    env.claims().patch("restored", &PatchParams::default(), &Patch::Merge(&nudge)).await.expect("nudge");
    let restored = host_path(&env.wait_bound("restored").await);
    assert_eq!(std::fs::metadata(restored.join("data")).unwrap().len(), 12 << 20, "the snapshot's data");
}

/// With requests accounting, a snapshot's byte copy is space promised too: no claim's request
/// counts it, and a pool whose volumes' requests and copies already fill it refuses a claim it
/// would have taken had the copy not been counted; the claim is made once the snapshot goes.
#[tokio::test(flavor = "multi_thread")]
async fn requests_accounting_counts_a_snapshots_byte_copy_as_promised() {
    let mut env = TestEnv::start("snap-requests", 0).await;
    // A provisioner name of its own: the cluster-wide answers (a snapshot of nothing) come
    // from this test's node, not from a node of another test whose lease outlives it.
    env.own_provisioner();
    install_crd(&env);
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    env.add_node(&node, &|spec| spec.env("CAPACITY_ACCOUNTING", "requests").env("RESERVED_SPACE", "0")).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    write_mib(&source.join("data"), 12);
    // A volume that promises all but 4 MiB of the pool once the 1Mi volume and the 12 MiB copy
    // are counted (its directory is empty: the free space does not see its promise), then the
    // copy (it fits in the free space).
    let st = rustix::fs::statvfs(&disk.dir).unwrap();
    let total_mib = (st.f_blocks * st.f_bsize) >> 20;
    let big = total_mib - 1 - 12 - 4;
    env.create_claim(fixtures::claim(&env.ns, "big", &class, &format!("{big}Mi")).provision_on_node(&node)).await;
    env.wait_bound("big").await;
    take(&env, "copy", "data").await;
    let status = wait_ready(&env, "copy").await.status.unwrap();
    assert_eq!(status.method.as_deref(), Some("bytes"));
    // 10Mi: room for it if the copy were not counted (16 MiB unpromised), not with it (4 MiB).
    let claim = env.create_claim(fixtures::claim(&env.ns, "more", &class, "10Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("unpromised space") && note.contains("promised to the pool's volumes"), "{note}");
    // The snapshot goes: its copy's room is given back.
    snapshots(&env).delete("copy", &DeleteParams::default()).await.expect("delete");
    env.wait_bound("more").await;
}

/// With requests accounting, a byte copy may not take room promised to a volume its pod has not
/// written yet: free space alone would let it, and that pod's writes, within its request, would
/// then take the pool below its reserve. The copy waits, saying why, and is made once the
/// promise goes.
#[tokio::test(flavor = "multi_thread")]
async fn requests_accounting_keeps_a_byte_copy_out_of_room_promised_to_unwritten_volumes() {
    let mut env = TestEnv::start("snap-promised", 0).await;
    // A provisioner name of its own: the cluster-wide answers (a snapshot of nothing) come
    // from this test's node, not from a node of another test whose lease outlives it.
    env.own_provisioner();
    install_crd(&env);
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    env.add_node(&node, &|spec| spec.env("CAPACITY_ACCOUNTING", "requests").env("RESERVED_SPACE", "0")).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    // A volume that leaves 8 MiB unpromised and writes nothing, then 12 MiB in the source: the
    // free space still holds a 12 MiB copy, the unpromised room does not.
    let st = rustix::fs::statvfs(&disk.dir).unwrap();
    let total_mib = (st.f_blocks * st.f_bsize) >> 20;
    let big = total_mib - 1 - 8;
    env.create_claim(fixtures::claim(&env.ns, "big", &class, &format!("{big}Mi")).provision_on_node(&node)).await;
    env.wait_bound("big").await;
    write_mib(&source.join("data"), 12);
    let free = common::capacity::available_bytes(&disk.dir);
    assert!(free > 14 << 20, "the free space alone would hold the copy: {free}");
    take(&env, "copy", "data").await;
    let waiting = testbed::wait_for("the copy waiting for room", TIMEOUT, || async {
        let status = snapshots(&env).get("copy").await?.status.unwrap_or_default();
        assert!(!status.ready_to_use, "copied into room promised to volume big");
        anyhow::Ok(status.message.filter(|m| m.contains("waits until there is room")))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    assert!(waiting.contains("12 MiB") && waiting.contains("not promised"), "{waiting}");
    // The promise goes: the copy is made.
    env.delete_claim("big").await;
    wait_ready(&env, "copy").await;
}

/// Published capacity offers what a claim can get: with requests accounting a snapshot's byte
/// copy is promised space there too, as in the provisioning check, so kube-scheduler is not
/// offered room the node would refuse.
#[tokio::test(flavor = "multi_thread")]
async fn published_capacity_counts_a_snapshots_byte_copy_as_promised() {
    let mut env = TestEnv::start("snap-pubcap", 0).await;
    install_crd(&env);
    let _driver = common::capacity::publishing_provisioner(&mut env).await;
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    env.add_node(&node, &|spec| {
        spec.env("CAPACITY_ACCOUNTING", "requests").env("RESERVED_SPACE", "0").env("PUBLISH_CAPACITY", "true")
    })
    .await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    write_mib(&source.join("data"), 12);
    // A volume that leaves 16 MiB unpromised, then a byte copy of the 12 MiB.
    let st = rustix::fs::statvfs(&disk.dir).unwrap();
    let total_mib = (st.f_blocks * st.f_bsize) >> 20;
    let big = total_mib - 1 - 16;
    env.create_claim(fixtures::claim(&env.ns, "big", &class, &format!("{big}Mi")).provision_on_node(&node)).await;
    env.wait_bound("big").await;
    let offered = |want_mib: u64| {
        let (env, class) = (&env, &class);
        async move {
            testbed::wait_for(&format!("about {want_mib} MiB offered"), TIMEOUT, || async {
                let objects = common::capacity::published(env, class).await;
                let bytes = objects.values().next().map(|c| common::capacity::bytes_of(c.capacity.as_ref()));
                anyhow::Ok(bytes.filter(|b| b.abs_diff(want_mib << 20) <= 1 << 20))
            })
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()))
        }
    };
    offered(16).await;
    take(&env, "copy", "data").await;
    assert_eq!(wait_ready(&env, "copy").await.status.unwrap().method.as_deref(), Some("bytes"));
    offered(4).await;
    snapshots(&env).delete("copy", &DeleteParams::default()).await.expect("delete");
    offered(16).await;
}

/// With requests accounting, a volume counts the byte copies in flight as promised (and a copy
/// the volumes being made: deciding::copy_room, whose model enumerates the orders of both). A
/// snapshot of 39 MiB in 10,000 small files (a copy that lasts), then, while it is being copied,
/// three 24Mi claims, on a 128 MiB pool with a 16 MiB reserve: the copy fits and the claims do
/// not beside it. Each claim let through is written to its request, as its pod may; the free
/// space, sampled throughout, never falls below the reserve. Volumes blind to the copy in flight
/// are let through and take the pool below its reserve.
#[tokio::test(flavor = "multi_thread")]
async fn volumes_planned_during_a_byte_copy_never_take_the_pool_below_its_reserve() {
    let mut env = TestEnv::start("snap-inflight", 0).await;
    env.own_provisioner();
    install_crd(&env);
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 128, None);
    let reserve = format!("{RESERVE_MIB}Mi");
    env.add_node(&node, &|spec| spec.env("CAPACITY_ACCOUNTING", "requests").env("RESERVED_SPACE", &reserve)).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "40Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    // 10,000 files of 4 KiB (39 MiB, within the claim's request): a byte copy of them takes a
    // while, long enough for the claims below to be planned while it is in flight.
    let files = source.join("files");
    std::fs::create_dir(&files).unwrap();
    for i in 0..10_000 {
        std::fs::write(files.join(format!("f{i}")), [b'x'; 4096]).unwrap();
    }
    // On disk now, so that the free space read below is what the node reads.
    assert!(std::process::Command::new("sync").status().unwrap().success());
    let reserve_bytes = RESERVE_MIB << 20;
    let free = common::capacity::available_bytes(&disk.dir);
    assert!(free > reserve_bytes + (40 << 20), "the copy fits: {free}");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_free_space(disk.dir.clone(), stop.clone());
    take(&env, "copy", "data").await;
    testbed::wait_for("the copy in flight", TIMEOUT, || async {
        let status = snapshots(&env).get("copy").await?.status.unwrap_or_default();
        assert!(!status.ready_to_use, "the copy ended before the claims were asked: make it last longer");
        anyhow::Ok((status.message.as_deref() == Some("being copied")).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let claims = ["v1", "v2", "v3"];
    let made = futures::future::join_all(
        claims
            .iter()
            .map(|name| env.create_claim(fixtures::claim(&env.ns, name, &class, "24Mi").provision_on_node(&node))),
    )
    .await;
    let claim_uids: Vec<String> = made.iter().map(uid).collect();
    wait_ready(&env, "copy").await;
    // Each claim is bound or refused for room.
    let bound = testbed::wait_for("every claim bound or refused", TIMEOUT, || async {
        let mut bound = Vec::new();
        for (name, claim_uid) in claims.iter().zip(&claim_uids) {
            let claim = env.claims().get(name).await?;
            if claim.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
                bound.push(*name);
            } else if env.our_event(&env.ns, claim_uid, "ProvisioningFailed").await.is_none() {
                return anyhow::Ok(None);
            }
        }
        Ok(Some(bound))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    // Every volume let through is written to its request, as its pod may.
    for name in &bound {
        let written = std::fs::write(host_path(&env.wait_bound(name).await).join("data"), vec![0x5a; 24 << 20]);
        assert!(written.is_ok(), "volume {name} could not be written to its request: {written:?} (bound: {bound:?})");
    }
    let least = {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.join().unwrap()
    };
    // A little slack for the filesystem's own metadata of the directories made.
    assert!(
        least + (1 << 20) >= reserve_bytes,
        "free space fell to {least} bytes, below the reserve {reserve_bytes}: claims bound {bound:?}"
    );
    let refused = env.wait_event(&env.ns, &claim_uids[0], "ProvisioningFailed").await;
    assert!(refused.contains("unpromised space"), "{refused}");
}

//! End-to-end: `HostPathSnapshot` (docs/snapshots.md) against a real control plane, on btrfs,
//! XFS and ext4 pools (loop-mounted): a snapshot of a volume is taken on its node (a reflink
//! copy on btrfs and XFS, bytes on ext4; a btrfs snapshot of a quota volume), a claim naming it
//! in `dataSourceRef` gets the files as they were, with their owners and modes; a restore too
//! small, of a snapshot that does not exist, or of a claim that does not exist, says why; a
//! deleted snapshot waits for the claims restoring from it, then its copy goes to the trash;
//! the doc's own examples, as written, and what its warning about `dataSource:` says; copies
//! whose snapshot is gone. Room for byte copies: e2e_snapshot_room.rs.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::snapshots::*;
use common::*;
use hostpath_provisioner::deciding::snapshot::HostPathSnapshot;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use testbed::fixtures;

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

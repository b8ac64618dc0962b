//! End-to-end: copies of raw Block volumes (issue #47) on loop-mounted btrfs, XFS and ext4
//! pools, the provisioner as the node (root, real loop devices). A Block claim cloning another
//! Block claim gets a copy of its backing file (extents shared where the filesystem can, data
//! copied with its holes kept where not), attached to a loop of its own: what was written
//! through the source's device is read back through the clone's, and the two are independent.
//! A snapshot of a Block claim (its backing file copied into the snapshot store) restores into
//! a Block claim as the source was. A Filesystem claim cloning a Block claim, or restoring its
//! snapshot, is refused naming both modes.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::block::*;
use common::snapshots;
use common::*;
use hostpath_provisioner::deciding::snapshot::HostPathSnapshot;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, TypedLocalObjectReference};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use testbed::fixtures;

const VOLUME_MODE: &str = "hostpath-provisioner.kubevirt.io/volume-mode";

/// Where the data pattern is written through the source's device: its start, and a stretch
/// beyond a hole.
const OFFSETS: [u64; 2] = [0, 8 << 20];

/// A test env with one node whose pool is the filesystem `mount` makes, Block volumes on and a
/// device directory of its own. Dropped in field order: the loops first, then the provisioner,
/// then the mount.
struct BlockEnv {
    cleanup: BlockCleanup,
    env: TestEnv,
    _disk: LoopFs,
}

async fn block_env_on(test: &str, mount: impl FnOnce(&Path) -> LoopFs) -> BlockEnv {
    let devices = device_dir();
    let devices_env = devices.to_string_lossy().into_owned();
    let mut env = TestEnv::start(test, 0).await;
    // A provisioner name of its own: the cluster-wide answers come from this test's node.
    env.own_provisioner();
    // Snapshots are served by a provisioner that finds their CRD at start.
    common::snapshots::install_crd(&env);
    let node = format!("{}-1", env.group);
    let pool = testbed::pool_root_for(env.cp, &node);
    let disk = mount(&pool);
    env.add_node(&node, &|spec| spec.env("BLOCK_VOLUMES", "true").env("BLOCK_DEVICE_DIR", &devices_env)).await;
    BlockEnv { cleanup: BlockCleanup { pool, devices }, env, _disk: disk }
}

async fn wait_snapshot_gone(env: &TestEnv) {
    testbed::wait_for("snapshot gone", TIMEOUT, || async {
        anyhow::Ok(snapshots::snapshots(env).get_opt("before").await?.is_none().then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
}

fn node_path(pv: &PersistentVolume) -> PathBuf {
    PathBuf::from(&pv.spec.as_ref().and_then(|s| s.local.as_ref()).expect("a local PV").path)
}

fn backing_file(pv: &PersistentVolume) -> PathBuf {
    let annotations = pv.metadata.annotations.as_ref().expect("annotations");
    PathBuf::from(&annotations["hostpath-provisioner.kubevirt.io/block-backing-dir"]).join("block.img")
}

/// A claim of `class` on `node` cloning claim `source`, of volume mode `mode`.
fn clone_claim(env: &TestEnv, name: &str, class: &str, size: &str, source: &str, node: &str) -> PersistentVolumeClaim {
    let mut claim = fixtures::claim(&env.ns, name, class, size).provision_on_node(node).build();
    claim.spec.as_mut().expect("spec").data_source =
        Some(TypedLocalObjectReference { api_group: None, kind: "PersistentVolumeClaim".into(), name: source.into() });
    claim
}

fn write_at(device: &Path, offset: u64, data: &[u8]) {
    let mut file = std::fs::OpenOptions::new().write(true).open(device).expect("open the device for writing");
    file.seek(SeekFrom::Start(offset)).expect("seek");
    file.write_all(data).expect("write the device");
    file.sync_all().expect("flush the device");
}

fn read_at(device: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::io::Read;
    let mut file = std::fs::File::open(device).expect("open the device");
    file.seek(SeekFrom::Start(offset)).expect("seek");
    let mut read = vec![0; len];
    file.read_exact(&mut read).expect("read the device");
    read
}

/// A 16Mi Block source with the pattern written through its device, then a 24Mi Block clone of
/// it: the clone's device holds the pattern, has its own size and loop, and writes to either
/// stay there. Then a snapshot of the source, restored into a Block claim after the source
/// changed, holds the source as it was; a Filesystem claim restoring it is refused. `reflinked`: the copy shares the source's extents (btrfs, XFS) or holds copied
/// data with its holes kept (ext4).
async fn a_block_clone_reads_back_what_was_written_through_its_source(
    test: &str,
    mount: impl FnOnce(&Path) -> LoopFs,
    reflinked: bool,
) -> (BlockEnv, String) {
    let block_env = block_env_on(test, mount).await;
    let (env, cleanup) = (&block_env.env, &block_env.cleanup);
    let node = env.nodes[0].name.clone();
    let class = env.class("block", |c| c).await;
    env.create_claim(fixtures::claim(&env.ns, "src", &class, "16Mi").provision_on_node(&node).block()).await;
    let source = env.wait_bound("src").await;
    let source_node = node_path(&source);
    let data = pattern();
    for offset in OFFSETS {
        // Written and flushed through the device; the loop writes it to the backing file.
        write_at(&source_node, offset, &data);
    }

    let mut copy = clone_claim(env, "copy", &class, "24Mi", "src", &node);
    copy.spec.as_mut().expect("spec").volume_mode = Some("Block".into());
    env.claims().create(&PostParams::default(), &copy).await.expect("create the clone");
    let clone = env.wait_bound("copy").await;
    let clone_node = node_path(&clone);
    assert_ne!(clone_node, source_node);
    for offset in OFFSETS {
        assert!(read_at(&clone_node, offset, data.len()) == data, "the clone's device holds the pattern at {offset}");
    }
    assert_eq!(device_size(&clone_node), 24 << 20, "the clone has its request's size");
    assert_eq!(device_size(&source_node), 16 << 20, "the source keeps its own");
    let (source_file, clone_file) = (backing_file(&source), backing_file(&clone));
    let (source_meta, clone_meta) = (std::fs::metadata(&source_file).unwrap(), std::fs::metadata(&clone_file).unwrap());
    assert_ne!(source_meta.ino(), clone_meta.ino(), "a file of its own");
    assert!(clone_meta.blocks() * 512 < 8 << 20, "holes kept: {} bytes allocated", clone_meta.blocks() * 512);
    let loops = loops_under(&cleanup.pool);
    assert_eq!(loops.len(), 2, "a loop each: {loops:?}");
    assert!(loops.iter().any(|(_, backing)| Path::new(backing) == clone_file), "{loops:?}");
    // Extents shared (reflink) or data copied (bytes), as the filesystem allows.
    let frag = Command::new("filefrag").arg("-v").arg(&clone_file).output().expect("filefrag");
    let frag = String::from_utf8_lossy(&frag.stdout);
    assert_eq!(frag.contains("shared"), reflinked, "{test}: filefrag -v says\n{frag}");

    // Independent: a write to the clone is not the source's.
    let other: Vec<u8> = data.iter().map(|b| !b).collect();
    write_at(&clone_node, 0, &other);
    assert!(read_at(&source_node, 0, data.len()) == data, "the source is untouched by the clone's writes");
    assert!(read_at(&clone_node, 0, data.len()) == other);

    // A snapshot of the source, then the source changed: a restore has it as it was.
    snapshots::take(env, "before", "src").await;
    let snapshot = snapshots::wait_ready(env, "before").await;
    let method = snapshot.status.as_ref().and_then(|s| s.method.as_deref());
    assert_eq!(method, Some(if reflinked { "reflink" } else { "bytes" }), "{test}");
    let annotations = snapshot.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get(VOLUME_MODE).map(String::as_str), Some("Block"), "the snapshot says its mode");
    write_at(&source_node, 0, &other);
    env.create_claim(snapshots::restoring(env, "restored", &class, "16Mi", "before", &node).block()).await;
    let restored = env.wait_bound("restored").await;
    let restored_node = node_path(&restored);
    for offset in OFFSETS {
        assert!(read_at(&restored_node, offset, data.len()) == data, "the restore holds the snapshot at {offset}");
    }
    assert_eq!(device_size(&restored_node), 16 << 20);
    // A Filesystem claim restoring the Block snapshot: refused naming both modes, nothing made.
    let as_files = env.create_claim(snapshots::restoring(env, "restored-files", &class, "16Mi", "before", &node)).await;
    let note = env.wait_event(&env.ns, &uid(&as_files), "ProvisioningFailed").await;
    assert!(note.contains("volumeMode Block") && note.contains("volumeMode Filesystem"), "{note}");
    env.delete_claim("restored-files").await;

    // Lost with its finalizer stripped, then made again from a manifest without the mode
    // annotation: its copy's record gives the mode back before it is ready again.
    let api = snapshots::snapshots(env);
    let mut again = HostPathSnapshot::new("before", "src");
    again.metadata.annotations = Some(
        annotations.iter().filter(|(k, _)| k.as_str() != VOLUME_MODE).map(|(k, v)| (k.clone(), v.clone())).collect(),
    );
    let strip = serde_json::json!({"metadata": {"finalizers": null}});
    api.patch("before", &PatchParams::default(), &Patch::Merge(&strip)).await.expect("strip");
    api.delete("before", &DeleteParams::default()).await.expect("delete");
    wait_snapshot_gone(env).await;
    api.create(&PostParams::default(), &again).await.expect("made again");
    let again = snapshots::wait_ready(env, "before").await;
    let mode = again.metadata.annotations.as_ref().and_then(|a| a.get(VOLUME_MODE)).map(String::as_str);
    assert_eq!(mode, Some("Block"), "the mode is back with the copy");
    env.create_claim(snapshots::restoring(env, "restored-again", &class, "16Mi", "before", &node).block()).await;
    let restored_again = node_path(&env.wait_bound("restored-again").await);
    assert!(read_at(&restored_again, 0, data.len()) == data, "the same point in time");
    env.delete_claim("restored-again").await;

    api.delete("before", &DeleteParams::default()).await.expect("delete the snapshot");
    wait_snapshot_gone(env).await;

    // All go on deletion, leaving no loop.
    for claim in ["copy", "src", "restored"] {
        env.delete_claim(claim).await;
    }
    for pv in [&clone, &source, &restored] {
        env.wait_pv_gone(pv.metadata.name.as_deref().expect("name")).await;
    }
    assert!(loops_under(&cleanup.pool).is_empty(), "no loop left: {:?}", loops_under(&cleanup.pool));
    (block_env, class)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_clone_on_btrfs_shares_the_source_files_extents() {
    a_block_clone_reads_back_what_was_written_through_its_source(
        "block-clone-btrfs",
        |p| LoopFs::mount_btrfs(p, 256),
        true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_clone_on_xfs_shares_the_source_files_extents() {
    a_block_clone_reads_back_what_was_written_through_its_source("block-clone-xfs", LoopFs::mount_xfs, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_clone_on_ext4_is_a_sparse_byte_copy_and_a_filesystem_clone_of_it_is_refused() {
    let (block_env, class) = a_block_clone_reads_back_what_was_written_through_its_source(
        "block-clone-ext4",
        |p| LoopFs::mount(p, 128, None),
        false,
    )
    .await;
    // A Filesystem claim cloning a Block claim: refused, naming both modes, nothing made.
    let env = &block_env.env;
    let node = env.nodes[0].name.clone();
    env.create_claim(fixtures::claim(&env.ns, "disk", &class, "16Mi").provision_on_node(&node).block()).await;
    env.wait_bound("disk").await;
    let refused = clone_claim(env, "as-files", &class, "16Mi", "disk", &node);
    let refused = env.claims().create(&PostParams::default(), &refused).await.expect("create the clone");
    let note = env.wait_event(&env.ns, &uid(&refused), "ProvisioningFailed").await;
    assert!(note.contains("volumeMode Block") && note.contains("volumeMode Filesystem"), "{note}");
    let pool_entries = entries(&env.nodes[0].pool_root);
    assert_eq!(pool_entries.iter().filter(|e| e.starts_with("pvc-")).count(), 1, "only the source: {pool_entries:?}");
}

/// The volume mode a restore goes by is `status.volumeMode`, which only the provisioner writes;
/// the annotation is the tenant's to edit and changes nothing. A Block snapshot whose annotation
/// is removed is still refused to a Filesystem claim (before the annotation is put back: the
/// claim is made right after the edit), and a Filesystem snapshot with a forged `Block`
/// annotation is refused to a Block claim, naming both modes; both annotations are put back
/// with a `SnapshotModeAnnotationRestored` event.
#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_editing_a_snapshots_mode_annotation_changes_nothing() {
    let block_env = block_env_on("block-mode-forged", |p| LoopFs::mount(p, 128, None)).await;
    let env = &block_env.env;
    let node = env.nodes[0].name.clone();
    let class = env.class("block", |c| c).await;
    env.create_claim(fixtures::claim(&env.ns, "disk", &class, "16Mi").provision_on_node(&node).block()).await;
    env.create_claim(fixtures::claim(&env.ns, "files", &class, "16Mi").provision_on_node(&node)).await;
    env.wait_bound("disk").await;
    env.wait_bound("files").await;
    snapshots::take(env, "of-disk", "disk").await;
    snapshots::take(env, "of-files", "files").await;
    let of_disk = snapshots::wait_ready(env, "of-disk").await;
    let of_files = snapshots::wait_ready(env, "of-files").await;
    let status_mode = |s: &HostPathSnapshot| s.status.as_ref().and_then(|s| s.volume_mode.clone());
    assert_eq!(status_mode(&of_disk).as_deref(), Some("Block"));
    assert_eq!(status_mode(&of_files).as_deref(), Some("Filesystem"));
    let api = snapshots::snapshots(env);
    let set_mode = |mode: Option<&str>| serde_json::json!({ "metadata": { "annotations": { VOLUME_MODE: mode } } });

    // The Block snapshot's annotation removed, then a Filesystem claim restoring it at once.
    api.patch("of-disk", &PatchParams::default(), &Patch::Merge(&set_mode(None))).await.expect("remove");
    let as_files = env.create_claim(snapshots::restoring(env, "files-of-disk", &class, "16Mi", "of-disk", &node)).await;
    let note = env.wait_event(&env.ns, &uid(&as_files), "ProvisioningFailed").await;
    assert!(
        note.contains("a copy of a volumeMode Block volume and this claim asks for volumeMode Filesystem"),
        "{note}"
    );
    let note =
        env.wait_event(&env.ns, of_disk.metadata.uid.as_deref().expect("uid"), "SnapshotModeAnnotationRestored").await;
    assert!(note.contains("volumeMode Block"), "{note}");
    let of_disk = api.get("of-disk").await.expect("read");
    let mode = of_disk.metadata.annotations.as_ref().and_then(|a| a.get(VOLUME_MODE)).map(String::as_str);
    assert_eq!(mode, Some("Block"), "put back");

    // The Filesystem snapshot forged as Block, then a Block claim restoring it.
    api.patch("of-files", &PatchParams::default(), &Patch::Merge(&set_mode(Some("Block")))).await.expect("forge");
    let as_disk =
        env.create_claim(snapshots::restoring(env, "disk-of-files", &class, "16Mi", "of-files", &node).block()).await;
    let note = env.wait_event(&env.ns, &uid(&as_disk), "ProvisioningFailed").await;
    assert!(
        note.contains("a copy of a volumeMode Filesystem volume and this claim asks for volumeMode Block"),
        "{note}"
    );
    let note =
        env.wait_event(&env.ns, of_files.metadata.uid.as_deref().expect("uid"), "SnapshotModeAnnotationRestored").await;
    assert!(note.contains("volumeMode Filesystem"), "{note}");
    testbed::wait_for("the forged annotation removed", TIMEOUT, || async {
        let now = api.get("of-files").await?;
        anyhow::Ok(now.metadata.annotations.as_ref().is_none_or(|a| !a.contains_key(VOLUME_MODE)).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));

    // A snapshot of an earlier build, without the status's mode: its copy's record gives it.
    let unset = serde_json::json!({ "status": { "volumeMode": null } });
    api.patch_status("of-disk", &PatchParams::default(), &Patch::Merge(&unset)).await.expect("unset the mode");
    testbed::wait_for("the mode read back from the copy's record", TIMEOUT, || async {
        let now = api.get("of-disk").await?;
        anyhow::Ok((status_mode(&now).as_deref() == Some("Block")).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));

    // Neither restore made anything: only the two sources are in the pool.
    for claim in ["files-of-disk", "disk-of-files"] {
        let claim = env.claims().get(claim).await.expect("read");
        assert!(claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_none_or(str::is_empty), "not bound");
    }
    let pool_entries = entries(&env.nodes[0].pool_root);
    assert_eq!(pool_entries.iter().filter(|e| e.starts_with("pvc-")).count(), 2, "only the sources: {pool_entries:?}");
}

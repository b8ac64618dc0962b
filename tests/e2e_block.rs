//! End-to-end: raw Block volumes (issue #47) on the control-plane testbed, the provisioner as
//! the node (root, real loop devices). A Block claim becomes a `local` PV whose path is a block
//! device backed by the volume's file; a restart after the loop and node are gone (a reboot,
//! simulated) exposes the same data again; deletion leaves no loop, no node and no file; with
//! the setting off the claim is refused naming it.
//!
//! Each test gives its provisioner a device directory of its own (`BLOCK_DEVICE_DIR`): a
//! provisioner removes the nodes there that name none of its volumes, so tests sharing the
//! host's `/dev` must not share one. Every loop on a file of the test's pool and the device
//! directory are removed when the test ends, passed or failed.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use common::block::*;
use common::*;
use k8s_openapi::api::core::v1::{LocalVolumeSource, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Patch, PatchParams, PostParams};
use testbed::fixtures;

const BACKING_DIR: &str = "hostpath-provisioner.kubevirt.io/block-backing-dir";
const BACKING_INODE: &str = "hostpath-provisioner.kubevirt.io/block-backing-inode";

#[tokio::test(flavor = "multi_thread")]
async fn a_block_claim_is_a_loop_device_of_its_file_exposed_again_after_a_restart_and_released_on_deletion() {
    let BlockNode { mut env, node, pool, devices, _cleanup } = BlockNode::start("block").await;
    let class = env.class("block", |c| c).await;
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "disk", &class, "16Mi").provision_on_node(&node).block()).await;
    let pv = env.wait_bound("disk").await;
    let pv_name = pv.metadata.name.clone().expect("name");
    assert_eq!(pv_name, format!("pvc-{}", uid(&claim)));
    let spec = pv.spec.clone().expect("spec");
    assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
    assert!(spec.host_path.is_none());
    let node_path = PathBuf::from(&spec.local.as_ref().expect("a local PV").path);
    assert_eq!(node_path, devices.join(&pv_name), "the node is named after the PV, in the device directory");
    let dir = PathBuf::from(&pv.metadata.annotations.as_ref().expect("annotations")[BACKING_DIR]);
    assert_eq!(dir, pool.join(&pv_name));
    let file = dir.join("block.img");
    assert_eq!(std::fs::metadata(&file).expect("backing file").len(), 16 << 20, "sized to the request");

    // The node is a block device of the loop holding the volume's file.
    let meta = std::fs::metadata(&node_path).expect("device node");
    assert!(meta.file_type().is_block_device(), "{} is a block device", node_path.display());
    let attached = loops_under(&pool);
    assert_eq!(attached.len(), 1, "one loop on the volume's file: {attached:?}");
    assert_eq!(attached[0].1, file.to_string_lossy());
    // Its metrics: exposed, and direct I/O as the kernel runs the loop.
    let dio = |number: u32| std::fs::read_to_string(format!("/sys/block/loop{number}/loop/dio")).expect("loop/dio");
    let metrics = env.nodes[0].provisioner.metrics().await.expect("scrape");
    assert_eq!(block_series(&metrics, "block_volume_exposed", &pv_name), Some(1.0), "{metrics}");
    let direct_io = block_series(&metrics, "block_volume_direct_io", &pv_name);
    assert_eq!(direct_io, dio(attached[0].0).trim().parse().ok(), "as sysfs says: {metrics}");

    // A pattern written to the device is read back through the file.
    let data = pattern();
    {
        let mut device = std::fs::OpenOptions::new().write(true).open(&node_path).expect("open the device");
        device.seek(SeekFrom::Start(0)).expect("seek");
        device.write_all(&data).expect("write the device");
        device.sync_all().expect("flush the device");
    }
    assert!(read_start(&file, data.len()) == data, "the file holds what was written to the device");

    // A reboot, simulated: the provisioner stopped, the node gone, the loop detached.
    env.node_mut(&node).provisioner.terminate();
    std::fs::remove_file(&node_path).expect("remove the node by hand");
    for (number, _) in loops_under(&pool) {
        let status = std::process::Command::new("losetup").arg("-d").arg(format!("/dev/loop{number}")).status();
        assert!(status.expect("losetup").success(), "detach loop{number}");
    }
    testbed::wait_for("loop detached", TIMEOUT, || async { anyhow::Ok(loops_under(&pool).is_empty().then_some(())) })
        .await
        .expect("loop detached");
    // A stale node left in the directory (a volume deleted while the provisioner was down).
    let stale = devices.join("pvc-00000000-0000-0000-0000-000000000001");
    std::fs::write(&stale, b"").expect("stale entry");
    let provisioner = &mut env.node_mut(&node).provisioner;
    provisioner.restart().expect("restart");
    provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("ready again");
    // Exposed before ready: no waiting here.
    let meta = std::fs::metadata(&node_path).expect("device node made again before ready");
    assert!(meta.file_type().is_block_device());
    assert!(!stale.exists(), "a node naming no volume of this node is removed at start");
    assert!(read_start(&node_path, data.len()) == data, "the device holds the same data after the restart");
    assert_eq!(loops_under(&pool).len(), 1);
    let metrics = env.node_mut(&node).provisioner.metrics().await.expect("scrape");
    assert_eq!(block_series(&metrics, "block_volume_exposed", &pv_name), Some(1.0), "exposed at start: {metrics}");

    // Deletion: no node, no loop, no file.
    env.delete_claim("disk").await;
    env.wait_pv_gone(&pv_name).await;
    assert!(!node_path.exists(), "the device node is removed");
    assert!(loops_under(&pool).is_empty(), "no loop left: {:?}", loops_under(&pool));
    assert!(!dir.exists(), "the volume directory went to the trash");
    wait_trash_empty(&pool).await;
    assert!(loops_under(&pool).is_empty());
    let metrics = env.node_mut(&node).provisioner.metrics().await.expect("scrape");
    assert!(!metrics.contains(&format!("pv=\"{pv_name}\"")), "no series once released: {metrics}");
}

/// The value of the Block volume series `name` of PV `pv` in a scrape (any pool).
fn block_series(metrics: &str, name: &str, pv: &str) -> Option<f64> {
    let prefix = format!("hostpath_provisioner_{name}{{");
    let label = format!("pv=\"{pv}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(&label))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_claim_is_refused_naming_the_setting_while_block_volumes_are_off() {
    let env = TestEnv::start("block-off", 1).await;
    let node = env.nodes[0].name.clone();
    let pool = env.nodes[0].pool_root.clone();
    let class = env.class("block", |c| c).await;
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "disk", &class, "16Mi").provision_on_node(&node).block()).await;
    let message = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(message.contains("--block-volumes"), "names the setting: {message}");
    assert!(entries(&pool).iter().all(|e| e.starts_with('.')), "nothing made: {:?}", entries(&pool));
    assert!(loops_under(&pool).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_device_still_open_is_waited_for_with_an_event_before_its_file_goes() {
    let BlockNode { env, node, pool, _cleanup, .. } = BlockNode::start("block-open").await;
    let class = env.class("block", |c| c).await;
    env.create_claim(fixtures::claim(&env.ns, "disk", &class, "8Mi").provision_on_node(&node).block()).await;
    let pv = env.wait_bound("disk").await;
    let pv_name = pv.metadata.name.clone().expect("name");
    let pv_uid = pv.metadata.uid.clone().expect("uid");
    let node_path = PathBuf::from(&pv.spec.as_ref().and_then(|s| s.local.as_ref()).expect("local").path);
    let dir = pool.join(&pv_name);

    // A workload still holding the device: the PV and the file stay until it lets go.
    let holder = std::fs::File::open(&node_path).expect("open the device");
    env.delete_claim("disk").await;
    let note = env.wait_event("default", &pv_uid, "BlockDeviceInUse").await;
    assert!(note.contains("still open"), "{note}");
    assert!(env.pvs().get_opt(&pv_name).await.expect("get PV").is_some(), "the PV waits");
    assert!(dir.join("block.img").exists(), "the file stays while the device is open");
    assert!(!node_path.exists(), "no new opener: the node is gone at once");

    drop(holder);
    env.wait_pv_gone(&pv_name).await;
    assert!(loops_under(&pool).is_empty(), "detached at its last close: {:?}", loops_under(&pool));
    assert!(!dir.exists(), "then the directory went to the trash");
}

/// A Block PV written by hand for `claim`, on `node`: its device node `device` and backing
/// directory `backing_dir` as given (a forgery), the inode annotation `inode`.
fn forged_block_pv(
    claim: &PersistentVolumeClaim,
    node: &str,
    device: &str,
    backing_dir: &Path,
    inode: u64,
) -> PersistentVolume {
    let name = format!("pvc-{}", uid(claim));
    let mut pv = fixtures::host_path_volume(&name, "/unused", "8Mi")
        .provisioned_by(PROVISIONER)
        .annotation("hostPathProvisionerIdentity", PROVISIONER)
        .annotation("kubevirt.io/provisionOnNode", node)
        .annotation(BACKING_DIR, &backing_dir.to_string_lossy())
        .annotation(BACKING_INODE, &inode.to_string())
        .bound_to(claim)
        .on_hostname(node)
        .build();
    let spec = pv.spec.as_mut().expect("spec");
    spec.host_path = None;
    spec.local = Some(LocalVolumeSource { path: device.to_owned(), fs_type: None });
    spec.volume_mode = Some("Block".into());
    pv
}

#[tokio::test(flavor = "multi_thread")]
async fn a_forged_block_pv_naming_another_volumes_node_file_or_a_host_device_is_refused_and_nothing_is_touched() {
    use std::os::unix::fs::MetadataExt;
    let BlockNode { env, node, pool, _cleanup, .. } = BlockNode::start("block-forged").await;
    let class = env.class("block", |c| c).await;
    let immediate = env.class("imm", |c| c.immediate()).await;
    // The victim: a real Block volume holding data.
    env.create_claim(fixtures::claim(&env.ns, "victim", &class, "8Mi").provision_on_node(&node).block()).await;
    let victim = env.wait_bound("victim").await;
    let victim_node = PathBuf::from(&victim.spec.as_ref().and_then(|s| s.local.as_ref()).expect("local").path);
    let victim_dir = pool.join(victim.metadata.name.as_deref().expect("name"));
    let victim_inode = std::fs::metadata(victim_dir.join("block.img")).expect("backing file").ino();
    let data = pattern();
    {
        let mut device = std::fs::OpenOptions::new().write(true).open(&victim_node).expect("open");
        device.write_all(&data).expect("write");
        device.sync_all().expect("flush");
    }
    let (victim_loop, _) = loops_under(&pool).into_iter().next().expect("the victim's loop");

    // Forgeries, each bound to a Block claim nobody provisions, then released.
    type Forge<'a> = Box<dyn Fn(&PersistentVolumeClaim) -> PersistentVolume + 'a>;
    let cases: [(&str, Forge, &str); 2] = [
        (
            "its-dir",
            Box::new(|claim| forged_block_pv(claim, &node, &victim_node.to_string_lossy(), &victim_dir, victim_inode)),
            "refusing to delete",
        ),
        (
            "its-loop",
            Box::new(|claim| {
                let own = pool.join(format!("pvc-{}", uid(claim)));
                forged_block_pv(claim, &node, &format!("/dev/loop{victim_loop}"), &own, victim_inode)
            }),
            "the only device node a Block PV",
        ),
    ];
    for (name, forge, says) in cases {
        let claim = env.create_claim(fixtures::claim(&env.ns, name, &immediate, "8Mi").block()).await;
        let pv = env.pvs().create(&PostParams::default(), &forge(&claim)).await.expect("create PV");
        env.wait_bound(name).await;
        env.delete_claim(name).await;
        let note = env.wait_event("default", pv.metadata.uid.as_deref().expect("uid"), "VolumeFailedDelete").await;
        assert!(note.contains(says), "{name}: {note}");
    }
    // The victim is untouched: its node, its loop, its file and its data.
    assert!(std::fs::metadata(&victim_node).expect("node").file_type().is_block_device());
    assert_eq!(loops_under(&pool).into_iter().map(|(n, _)| n).collect::<Vec<_>>(), vec![victim_loop]);
    assert!(read_start(&victim_dir.join("block.img"), data.len()) == data);
    assert!(read_start(&victim_node, data.len()) == data);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retained_block_pv_deleted_by_hand_leaves_its_file_but_no_node_nor_loop() {
    let BlockNode { env, node, pool, _cleanup, .. } = BlockNode::start("block-retain").await;
    let class = env.class("keep", |c| c.reclaim_policy("Retain")).await;
    env.create_claim(fixtures::claim(&env.ns, "disk", &class, "8Mi").provision_on_node(&node).block()).await;
    let pv = env.wait_bound("disk").await;
    let pv_name = pv.metadata.name.clone().expect("name");
    let node_path = PathBuf::from(&pv.spec.as_ref().and_then(|s| s.local.as_ref()).expect("local").path);
    let file = pool.join(&pv_name).join("block.img");
    assert_eq!(loops_under(&pool).len(), 1);

    env.delete_claim("disk").await;
    env.wait_pv_phase(&pv_name, "Released").await;
    assert!(node_path.exists() && loops_under(&pool).len() == 1, "Retain keeps the volume exposed");
    env.pvs().delete(&pv_name, &Default::default()).await.expect("delete the PV by hand");
    env.wait_pv_gone(&pv_name).await;
    testbed::wait_for("node and loop released", TIMEOUT, || async {
        anyhow::Ok((!node_path.exists() && loops_under(&pool).is_empty()).then_some(()))
    })
    .await
    .expect("node and loop released with the PV");
    assert!(file.exists(), "the data stays, reported as an orphan, never removed");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_volume_that_cannot_be_exposed_is_undone_leaving_no_loop_file_nor_directory() {
    let BlockNode { mut env, node, pool, devices, _cleanup } = BlockNode::start("block-undo").await;
    let class = env.class("block", |c| c).await;
    // The claim is made while the node is down, and a directory put where its device node goes:
    // a directory is never removed from there, so the volume cannot be exposed.
    env.node_mut(&node).provisioner.terminate();
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "disk", &class, "8Mi").provision_on_node(&node).block()).await;
    let pv_name = format!("pvc-{}", uid(&claim));
    std::fs::create_dir_all(devices.join(&pv_name)).expect("a directory at the node's place");
    let provisioner = &mut env.node_mut(&node).provisioner;
    provisioner.restart().expect("restart");
    provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("ready");
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("a directory stands where the volume's device node goes"), "{note}");
    assert!(loops_under(&pool).is_empty(), "the loop attached for it is detached: {:?}", loops_under(&pool));
    assert!(!pool.join(&pv_name).exists(), "its file and directory are removed");
    assert!(env.pvs().get_opt(&pv_name).await.expect("get PV").is_none(), "no PV");
    assert!(devices.join(&pv_name).is_dir(), "the directory found there is left alone");
}

/// A Block volume whose backing file `replace` swaps while the node is down (its loop and node
/// gone, as after a reboot): at start it is neither attached nor exposed, with an event saying
/// `says`, and the node still becomes ready.
async fn replaced_while_down_is_not_exposed(test: &str, replace: fn(&Path), says: &str) {
    let BlockNode { mut env, node, pool, _cleanup, .. } = BlockNode::start(test).await;
    let class = env.class("block", |c| c).await;
    env.create_claim(fixtures::claim(&env.ns, "disk", &class, "8Mi").provision_on_node(&node).block()).await;
    let pv = env.wait_bound("disk").await;
    let pv_uid = pv.metadata.uid.clone().expect("uid");
    let node_path = PathBuf::from(&pv.spec.as_ref().and_then(|s| s.local.as_ref()).expect("local").path);
    let file = pool.join(pv.metadata.name.as_deref().expect("name")).join("block.img");

    env.node_mut(&node).provisioner.terminate();
    std::fs::remove_file(&node_path).expect("remove the node");
    for (number, _) in loops_under(&pool) {
        let status = std::process::Command::new("losetup").arg("-d").arg(format!("/dev/loop{number}")).status();
        assert!(status.expect("losetup").success());
    }
    testbed::wait_for("loop detached", TIMEOUT, || async { anyhow::Ok(loops_under(&pool).is_empty().then_some(())) })
        .await
        .expect("loop detached");
    replace(&file);
    let provisioner = &mut env.node_mut(&node).provisioner;
    provisioner.restart().expect("restart");
    provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("ready: one volume does not hold the node");
    let note = env.wait_event("default", &pv_uid, "BlockVolumeNotExposed").await;
    assert!(note.contains(says), "{note}");
    assert!(!node_path.exists(), "no device node: a pod of it waits");
    assert!(loops_under(&pool).is_empty(), "the stranger file is not attached: {:?}", loops_under(&pool));
    let pv_name = pv.metadata.name.as_deref().expect("name");
    let metrics = env.node_mut(&node).provisioner.metrics().await.expect("scrape");
    assert_eq!(block_series(&metrics, "block_volume_exposed", pv_name), Some(0.0), "not exposed: {metrics}");
    assert_eq!(block_series(&metrics, "block_volume_direct_io", pv_name), None, "no loop: {metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backing_file_replaced_while_the_node_was_down_is_not_exposed_at_start() {
    // Made before the old file goes: another inode number.
    replaced_while_down_is_not_exposed(
        "block-replaced",
        |file| {
            let other = file.with_extension("other");
            std::fs::write(&other, vec![7u8; 8 << 20]).expect("another file");
            std::fs::rename(&other, file).expect("put in the backing file's place");
        },
        "replaced",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_backing_file_made_again_under_its_freed_inode_number_is_not_exposed_at_start() {
    // Made after the old file went: ext4 gives it the freed inode number, so only its birth
    // time tells it from the volume's.
    replaced_while_down_is_not_exposed(
        "block-reborn",
        |file| {
            use std::os::unix::fs::MetadataExt;
            let inode = std::fs::metadata(file).expect("the file").ino();
            std::fs::remove_file(file).expect("remove the file");
            std::fs::write(file, vec![7u8; 8 << 20]).expect("another file of the same name");
            if std::fs::metadata(file).expect("the new file").ino() != inode {
                eprintln!("the filesystem gave the new file another inode number: refused by the inode alone");
            }
        },
        "born",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_block_claim_grows_online_while_its_device_is_open_keeping_its_data_and_its_loop() {
    let BlockNode { env, node, pool, _cleanup, .. } = BlockNode::start("block-grow").await;
    let class = env.class("block-grow", |c| c.allow_expansion()).await;
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "disk", &class, "16Mi").provision_on_node(&node).block()).await;
    let pv = env.wait_bound("disk").await;
    let pv_name = pv.metadata.name.clone().expect("name");
    let node_path = PathBuf::from(&pv.spec.as_ref().and_then(|s| s.local.as_ref()).expect("local").path);
    let file = pool.join(&pv_name).join("block.img");
    assert_eq!(device_size(&node_path), 16 << 20);
    let before = loops_under(&pool);
    assert_eq!(before.len(), 1, "{before:?}");

    // A workload holds the device open and writes to it.
    let data = pattern();
    let mut holder = std::fs::OpenOptions::new().read(true).write(true).open(&node_path).expect("open the device");
    holder.write_all(&data).expect("write the device");
    holder.sync_all().expect("flush the device");

    let patch = serde_json::json!({ "spec": { "resources": { "requests": { "storage": "40Mi" } } } });
    env.claims().patch("disk", &PatchParams::default(), &Patch::Merge(patch)).await.expect("expansion accepted");
    let pvs = env.pvs();
    let claims = env.claims();
    testbed::wait_for("PV and claim at 40Mi", TIMEOUT, || async {
        let pv = pvs.get(&pv_name).await?.spec.and_then(|s| s.capacity).and_then(|c| c.get("storage").cloned());
        let status = claims.get("disk").await?.status.unwrap_or_default();
        let done = status.capacity.and_then(|c| c.get("storage").cloned()).map(|q| q.0) == Some("40Mi".into())
            && status.allocated_resource_statuses.is_none()
            && status.conditions.unwrap_or_default().is_empty()
            && pv.map(|q| q.0) == Some("40Mi".into());
        anyhow::Ok(done.then_some(()))
    })
    .await
    .expect("expanded");
    env.wait_event(&env.ns, &uid(&claim), "VolumeResizeSuccessful").await;

    // The device has the new size without being detached: the same loop, still open.
    assert_eq!(std::fs::metadata(&file).expect("backing file").len(), 40 << 20, "the file grew");
    assert_eq!(device_size(&node_path), 40 << 20, "the device has the new size (LOOP_SET_CAPACITY)");
    assert_eq!(loops_under(&pool), before, "the same loop, never detached");
    assert_eq!(holder.seek(SeekFrom::End(0)).expect("seek to the end"), 40 << 20, "the open device sees it too");
    // What was written before is intact, and the grown part is written through the same opener.
    holder.seek(SeekFrom::Start(0)).expect("seek");
    let mut read = vec![0; data.len()];
    holder.read_exact(&mut read).expect("read the device");
    assert!(read == data, "the data written before the growth is intact");
    holder.seek(SeekFrom::Start(36 << 20)).expect("seek past the old end");
    holder.write_all(&data).expect("write past the old end");
    holder.sync_all().expect("flush the device");
    let mut backing = std::fs::File::open(&file).expect("open the file");
    backing.seek(SeekFrom::Start(36 << 20)).expect("seek");
    backing.read_exact(&mut read).expect("read the file");
    assert!(read == data, "the grown part is the file's");
    drop(holder);

    env.delete_claim("disk").await;
    env.wait_pv_gone(&pv_name).await;
    assert!(loops_under(&pool).is_empty(), "no loop left: {:?}", loops_under(&pool));
}

/// A Block volume released for a deletion that then failed (a file in place of the trash) is
/// exposed again, without a restart, once its PV is kept (`Retain`), with a
/// `BlockVolumeExposedAgain` event and its data; switched back to `Delete` with the trash
/// fixed, the retried deletion releases it again and completes.
#[tokio::test(flavor = "multi_thread")]
async fn a_block_volume_released_for_a_failed_deletion_is_exposed_again_once_its_pv_is_kept() {
    let BlockNode { env, node, pool, _cleanup, .. } = BlockNode::start("block-failed-delete").await;
    let class = env.class("block", |c| c).await;
    env.create_claim(fixtures::claim(&env.ns, "disk", &class, "8Mi").provision_on_node(&node).block()).await;
    let pv = env.wait_bound("disk").await;
    let pv_name = pv.metadata.name.clone().expect("name");
    let pv_uid = pv.metadata.uid.clone().expect("uid");
    let node_path = PathBuf::from(&pv.spec.as_ref().and_then(|s| s.local.as_ref()).expect("local").path);
    let data = pattern();
    {
        let mut device = std::fs::OpenOptions::new().write(true).open(&node_path).expect("open the device");
        device.write_all(&data).expect("write the device");
        device.sync_all().expect("flush the device");
    }

    // The trash cannot take the directory: the deletion fails after the volume was released.
    let _ = std::fs::remove_dir(pool.join(TRASH));
    std::fs::write(pool.join(TRASH), b"not a trash").expect("a file in place of the trash");
    env.delete_claim("disk").await;
    env.wait_pv_phase(&pv_name, "Released").await;
    let note = env.wait_event("default", &pv_uid, "VolumeFailedDelete").await;
    assert!(note.contains(".hpp-trash"), "{note}");
    assert!(!node_path.exists() && loops_under(&pool).is_empty(), "released for the deletion");

    // The admin keeps it: exposed again at once, with its data.
    let retain = serde_json::json!({ "spec": { "persistentVolumeReclaimPolicy": "Retain" } });
    env.pvs().patch(&pv_name, &PatchParams::default(), &Patch::Merge(&retain)).await.expect("Retain");
    let note = env.wait_event("default", &pv_uid, "BlockVolumeExposedAgain").await;
    assert!(note.contains("no longer Delete"), "{note}");
    let meta = std::fs::metadata(&node_path).expect("device node back");
    assert!(meta.file_type().is_block_device(), "{} is a block device", node_path.display());
    assert_eq!(loops_under(&pool).len(), 1, "one loop again");
    assert!(read_start(&node_path, data.len()) == data, "the device holds the volume's data");

    // Back to Delete with the trash fixed: the retry releases it again and the PV goes.
    std::fs::remove_file(pool.join(TRASH)).expect("the admin moves the file away");
    let delete = serde_json::json!({ "spec": { "persistentVolumeReclaimPolicy": "Delete" } });
    env.pvs().patch(&pv_name, &PatchParams::default(), &Patch::Merge(&delete)).await.expect("Delete");
    env.wait_pv_gone(&pv_name).await;
    assert!(!node_path.exists() && loops_under(&pool).is_empty(), "no node and no loop left");
}

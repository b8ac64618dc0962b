//! Enforced quotas (`quota: enforce`) on real loop-mounted filesystems: btrfs subvolumes with a
//! qgroup limit, refusals on pools that cannot enforce, and nothing left behind by deletions.
//!
//! The first tests drive the filesystem edge directly (`PoolRoot`), since 1,000 create/delete
//! cycles or 200 concurrent volumes through the API would take minutes on a busy machine; the
//! last ones go through the real control plane and the provisioner binary.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::*;
use hostpath_provisioner::filesystem::{PoolRoot, VolumeDirName};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Patch, PatchParams};
use testbed::fixtures;

const MIB: u64 = 1 << 20;

/// A btrfs pool with quota enabled, mounted under a fresh temp dir.
fn btrfs_pool(dir: &Path, size_mib: u64) -> (LoopFs, PoolRoot) {
    let disk = LoopFs::mount_btrfs(&dir.join("pool"), size_mib);
    let pool = PoolRoot::open("fast", &disk.dir).expect("open pool");
    pool.enable_btrfs_quota().expect("enable quota");
    (disk, pool)
}

/// Writes 1 MiB chunks (fsynced) into `file` until the kernel refuses; returns the bytes written
/// and the refusal's errno.
fn write_until_refused(file: &Path, cap: u64) -> (u64, Option<i32>) {
    let mut out = std::fs::File::create(file).expect("create file");
    let chunk = vec![0x5a_u8; MIB as usize];
    let mut written = 0;
    while written < cap {
        if let Err(e) = out.write_all(&chunk).and_then(|()| out.sync_data()) {
            return (written, e.raw_os_error());
        }
        written += MIB;
    }
    (written, None)
}

/// Waits until the filesystem holds no subvolume qgroup any more (the kernel drops a deleted
/// subvolume, and its qgroup, in the background after a commit).
fn wait_no_qgroups(pool: &PoolRoot) -> Vec<u64> {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let left = pool.subvolume_qgroups().expect("qgroups");
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        let _ = std::process::Command::new("sync").arg("-f").arg(pool.path()).status();
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `EDQUOT` and `ENOSPC` on Linux: btrfs answers a qgroup limit with the former.
const EDQUOT: i32 = 122;
const ENOSPC: i32 = 28;

fn quota_errno(errno: Option<i32>) -> bool {
    matches!(errno, Some(EDQUOT | ENOSPC))
}

#[test]
fn a_writer_stops_at_the_quota_of_a_btrfs_volume_not_at_the_disk_size() {
    let tmp = tempfile::tempdir().unwrap();
    let (_disk, pool) = btrfs_pool(tmp.path(), 256);
    let name = VolumeDirName::new("pvc-writer").unwrap();
    pool.create_quota_volume(&name, 0o777, 10 * MIB).expect("quota volume");

    let (written, errno) = write_until_refused(&pool.volume_path(&name).join("data"), 200 * MIB);
    assert!(quota_errno(errno), "refused with EDQUOT/ENOSPC, got {errno:?} after {written} bytes");
    assert!((5 * MIB..=10 * MIB).contains(&written), "stopped near the 10 MiB limit: {written}");
    let used = pool.quota_used_bytes(&name).expect("qgroup accounting");
    assert!((5 * MIB..=10 * MIB).contains(&used), "accounted usage {used}");
}

#[test]
fn two_hundred_concurrent_quota_volumes_get_distinct_qgroups() {
    let tmp = tempfile::tempdir().unwrap();
    let (_disk, pool) = btrfs_pool(tmp.path(), 256);
    let pool = std::sync::Arc::new(pool);
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let pool = pool.clone();
            std::thread::spawn(move || {
                for i in (w..200).step_by(8) {
                    let name = VolumeDirName::new(&format!("pvc-{i}")).unwrap();
                    pool.create_quota_volume(&name, 0o777, MIB * (1 + i as u64)).expect("quota volume");
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    let ids = pool.subvolume_qgroups().unwrap();
    let distinct: std::collections::BTreeSet<u64> = ids.iter().copied().collect();
    assert_eq!(distinct.len(), 200, "one qgroup per volume: {ids:?}");
    // Each qgroup carries its own volume's limit.
    for i in [0_u64, 77, 199] {
        let name = VolumeDirName::new(&format!("pvc-{i}")).unwrap();
        let (written, errno) = write_until_refused(&pool.volume_path(&name).join("f"), 300 * MIB);
        assert!(quota_errno(errno) && written <= MIB * (1 + i), "volume {i}: {written} bytes, {errno:?}");
    }
}

#[test]
fn a_thousand_quota_create_delete_cycles_leave_no_subvolume_or_qgroup() {
    let tmp = tempfile::tempdir().unwrap();
    let (_disk, pool) = btrfs_pool(tmp.path(), 256);
    for i in 0..1000 {
        let name = VolumeDirName::new(&format!("pvc-cycle-{i}")).unwrap();
        pool.create_quota_volume(&name, 0o777, MIB).expect("quota volume");
        let dir = pool.volume_path(&name);
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/file"), b"data").unwrap();
        // Half go through the trash (the provisioner's path), half are removed directly.
        if i % 2 == 0 {
            pool.move_to_trash(&name).expect("trash");
        } else {
            pool.remove_volume_dir(&name).expect("remove");
        }
        if i % 100 == 99 {
            pool.purge_trash().expect("purge");
        }
    }
    pool.purge_trash().expect("purge");
    let left: Vec<String> = entries(pool.path()).into_iter().filter(|e| e != ".hpp-trash").collect();
    assert!(left.is_empty(), "no volume left: {left:?}");
    assert_eq!(pool.trash_pending().unwrap(), 0);
    assert_eq!(wait_no_qgroups(&pool), Vec::<u64>::new(), "no qgroup left");
}

#[test]
fn a_quota_volume_with_a_symlink_and_a_mount_inside_is_removed_without_leaving_the_volume() {
    let tmp = tempfile::tempdir().unwrap();
    let (_disk, pool) = btrfs_pool(tmp.path(), 256);
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("keep"), b"keep").unwrap();
    let name = VolumeDirName::new("pvc-evil").unwrap();
    pool.create_quota_volume(&name, 0o777, 10 * MIB).unwrap();
    let dir = pool.volume_path(&name);
    std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();
    let mount = Tmpfs::mount(&dir.join("mnt"));
    std::fs::write(mount.0.join("other-fs"), b"x").unwrap();

    let refused = pool.remove_volume_dir(&name).expect_err("a mount inside stops the removal");
    assert!(refused.to_string().contains("mounted"), "{refused}");
    assert!(mount.0.join("other-fs").exists(), "the other filesystem is untouched");
    drop(mount);
    pool.remove_volume_dir(&name).expect("removed once unmounted");
    assert!(!dir.exists());
    assert!(outside.join("keep").exists(), "the symlink was not followed");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_enforce_class_on_btrfs_limits_the_volume_to_its_request_and_deletion_leaves_no_qgroup() {
    let mut env = TestEnv::start("quota-btrfs", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount_btrfs(&testbed::pool_root_for(env.cp, &node), 256);
    let pool = PoolRoot::open("check", &disk.dir).unwrap();
    pool.enable_btrfs_quota().unwrap();
    env.add_node(&node, &|spec| spec).await;
    let class = env.class("enforce", |c| c.immediate().parameter("quota", "enforce")).await;
    env.create_claim(fixtures::claim(&env.ns, "limited", &class, "10Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("limited").await;
    let path = std::path::PathBuf::from(pv.spec.as_ref().unwrap().host_path.as_ref().unwrap().path.clone());

    let (written, errno) = write_until_refused(&path.join("data"), 200 * MIB);
    assert!(quota_errno(errno), "writer refused at the quota, got {errno:?} after {written} bytes");
    assert!(written <= 10 * MIB, "stopped at the 10Mi request: {written}");
    assert_eq!(pool.subvolume_qgroups().unwrap().len(), 1);

    // The capability shows in /readyz and the metrics, and the volume's usage is exported.
    let provisioner = &env.nodes[0].provisioner;
    let (_, ready) = testbed::http_get(provisioner.health_addr(), "/readyz").await.unwrap();
    assert!(ready.contains("(btrfs at ") && ready.contains("): quota btrfs-qgroup"), "{ready}");
    let dir = path.file_name().unwrap().to_str().unwrap().to_owned();
    let used = testbed::wait_for("volume usage exported", TIMEOUT, || async {
        let metrics = provisioner.metrics().await?;
        let capable = metrics.lines().any(|l| {
            l.starts_with("hostpath_provisioner_pool_quota_capability{")
                && l.contains("mechanism=\"btrfs-qgroup\"")
                && l.ends_with(" 1")
        });
        let used = metrics
            .lines()
            .find(|l| l.starts_with("hostpath_provisioner_volume_used_bytes{") && l.contains(&dir))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
        anyhow::Ok(used.filter(|_| capable))
    })
    .await
    .expect("usage metric");
    assert!((5 * MIB..=10 * MIB).contains(&used), "exported usage {used}");

    env.delete_claim("limited").await;
    env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    wait_trash_empty(&disk.dir).await;
    assert!(!path.exists());
    assert_eq!(tokio::task::block_in_place(|| wait_no_qgroups(&pool)), Vec::<u64>::new());
    env.nodes[0].provisioner.terminate();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_enforce_class_on_a_pool_that_cannot_enforce_is_refused_with_the_reason() {
    let mut env = TestEnv::start("quota-ext4", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 32, None);
    env.add_node(&node, &|spec| spec).await;
    let class = env.class("enforce", |c| c.immediate().parameter("quota", "enforce")).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "refused", &class, "10Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    // Without quota support for ext4 (this machine's kernel) that is the reason; with it, the
    // missing prjquota mount option is. The kernel tells by mounting an ext4 with quota itself.
    let ext4_missing = if kernel_mounts_ext4_with_quota(&env.cp.temp_dir().join(format!("{}-probe", env.group))) {
        "it is mounted without prjquota"
    } else {
        "the kernel has no quota support for ext4 (CONFIG_QUOTA and CONFIG_QFMT_V2)"
    };
    assert!(note.contains(&format!("(ext4 at {}) cannot enforce quota: {ext4_missing}", disk.dir.display())), "{note}");
    let left: Vec<String> = entries(&disk.dir).into_iter().filter(|e| e != "lost+found").collect();
    assert!(left.is_empty(), "nothing created: {left:?}");
    let (_, ready) = testbed::http_get(env.nodes[0].provisioner.health_addr(), "/readyz").await.unwrap();
    assert!(ready.contains("(ext4 at ") && ready.contains(&format!("): quota none ({ext4_missing}")), "{ready}");
    // One series per mechanism, the pool's own at 1: `project` is 0 here, `none` 1.
    let metrics = env.nodes[0].provisioner.metrics().await.unwrap();
    let capability = |mechanism: &str| {
        metrics
            .lines()
            .find(|l| {
                l.starts_with("hostpath_provisioner_pool_quota_capability{")
                    && l.contains(&format!("mechanism=\"{mechanism}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .map(str::to_owned)
    };
    assert_eq!(
        [capability("btrfs-qgroup"), capability("project"), capability("none")],
        [Some("0".into()), Some("0".into()), Some("1".into())],
        "{metrics}"
    );

    // XFS: without the kernel's XFS quota support (this machine's kernel) that is the reason;
    // with it, the missing prjquota mount option is.
    let xfs_node = format!("{}-2", env.group);
    let xfs = LoopFs::mount_xfs(&testbed::pool_root_for(env.cp, &xfs_node));
    env.add_node(&xfs_node, &|spec| spec).await;
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "refused-xfs", &class, "10Mi").provision_on_node(&xfs_node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    let missing = if Path::new("/proc/fs/xfs/xqmstat").exists() {
        "it is mounted without prjquota (mount it with the prjquota or pquota option)"
    } else {
        "the kernel has no XFS quota support (CONFIG_XFS_QUOTA)"
    };
    assert!(note.contains(&format!("(xfs at {}) cannot enforce quota: {missing}", xfs.dir.display())), "{note}");
    assert!(entries(&xfs.dir).is_empty(), "nothing created: {:?}", entries(&xfs.dir));
    for node in &mut env.nodes {
        node.provisioner.terminate();
    }
}

/// Whether the kernel mounts an ext4 with the `quota` feature (it refuses without quota support).
fn kernel_mounts_ext4_with_quota(dir: &Path) -> bool {
    let image = dir.with_extension("img");
    std::fs::create_dir_all(dir).expect("probe mount point");
    std::fs::File::create(&image).and_then(|f| f.set_len(32 << 20)).expect("probe image");
    let ok = |c: &mut std::process::Command| c.output().is_ok_and(|o| o.status.success());
    let mkfs = ok(std::process::Command::new("mkfs.ext4").args(["-q", "-F", "-O", "quota,project"]).arg(&image));
    assert!(mkfs, "mkfs.ext4 -O quota,project");
    let mounted = ok(std::process::Command::new("mount").arg("-o").arg("loop").arg(&image).arg(dir));
    if mounted {
        let _ = std::process::Command::new("umount").arg(dir).status();
    }
    let _ = std::fs::remove_file(&image);
    let _ = std::fs::remove_dir(dir);
    mounted
}

/// Sets the claim's storage request (a merge patch, as `kubectl edit` would).
async fn request(env: &TestEnv, claim: &str, size: &str) -> Result<PersistentVolumeClaim, kube::Error> {
    let patch = serde_json::json!({ "spec": { "resources": { "requests": { "storage": size } } } });
    env.claims().patch(claim, &PatchParams::default(), &Patch::Merge(patch)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn expansion_grows_the_quota_online_and_refuses_an_oversize_grow_and_a_shrink() {
    let mut env = TestEnv::start("quota-grow", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount_btrfs(&testbed::pool_root_for(env.cp, &node), 256);
    PoolRoot::open("check", &disk.dir).unwrap().enable_btrfs_quota().unwrap();
    env.add_node(&node, &|spec| spec).await;
    let class = env.class("grow", |c| c.immediate().allow_expansion().parameter("quota", "enforce")).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "growing", &class, "10Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("growing").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    let path = std::path::PathBuf::from(pv.spec.as_ref().unwrap().host_path.as_ref().unwrap().path.clone());
    let (first, errno) = write_until_refused(&path.join("first"), 200 * MIB);
    assert!(quota_errno(errno) && first <= 10 * MIB, "stopped at 10Mi: {first} bytes, {errno:?}");

    // Grow to 20Mi: the PV and the claim show it, and the same writer may go on (no restart).
    request(&env, "growing", "20Mi").await.expect("expansion accepted by the API");
    let pvs = env.pvs();
    let claims = env.claims();
    testbed::wait_for("PV and claim at 20Mi", TIMEOUT, || async {
        let pv = pvs.get(&pv_name).await?;
        let claim = claims.get("growing").await?;
        let pv_size = pv.spec.and_then(|s| s.capacity).and_then(|c| c.get("storage").cloned());
        let claim_size = claim.status.and_then(|s| s.capacity).and_then(|c| c.get("storage").cloned());
        anyhow::Ok(
            (pv_size.as_ref().map(|q| q.0.as_str()) == Some("20Mi")
                && claim_size.as_ref().map(|q| q.0.as_str()) == Some("20Mi"))
            .then_some(()),
        )
    })
    .await
    .expect("expanded");
    let (more, errno) = write_until_refused(&path.join("second"), 200 * MIB);
    assert!(quota_errno(errno), "refused at the new limit: {errno:?}");
    assert!(more >= 5 * MIB && first + more <= 20 * MIB, "about 10Mi more fit: {first} + {more}");
    env.wait_event(&env.ns, &uid(&claim), "VolumeResizeSuccessful").await;

    // Past the free space of the pool: refused, recorded on the claim, nothing changed.
    request(&env, "growing", "10Gi").await.expect("the API accepts any growth");
    let note = env.wait_event(&env.ns, &uid(&claim), "VolumeResizeFailed").await;
    assert!(note.contains("cannot grow volume by") && note.contains("available in the pool"), "{note}");
    let status = testbed::wait_for("claim status records the failure", TIMEOUT, || async {
        let status = claims.get("growing").await?.status.unwrap_or_default();
        let failed = status.allocated_resource_statuses.as_ref().and_then(|s| s.get("storage")).map(String::as_str)
            == Some("ControllerResizeInfeasible");
        anyhow::Ok(failed.then_some(status))
    })
    .await
    .expect("failure on the claim");
    let condition = status.conditions.unwrap_or_default().into_iter().find(|c| c.type_ == "ControllerResizeError");
    assert!(condition.is_some_and(|c| c.message.unwrap_or_default().contains("cannot grow volume")));
    assert_eq!(status.capacity.unwrap()["storage"].0, "20Mi");
    let pv = pvs.get(&pv_name).await.unwrap();
    assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "20Mi");

    // Recovery from the failure (RecoverVolumeExpansionFailure): a smaller growth that fits.
    request(&env, "growing", "30Mi").await.expect("lowering a failed expansion above the capacity is allowed");
    testbed::wait_for("PV and claim at 30Mi", TIMEOUT, || async {
        let pv = pvs.get(&pv_name).await?.spec.and_then(|s| s.capacity).and_then(|c| c.get("storage").cloned());
        let claim = claims.get("growing").await?.status.unwrap_or_default();
        let done = claim.capacity.and_then(|c| c.get("storage").cloned()).map(|q| q.0) == Some("30Mi".into())
            && claim.allocated_resource_statuses.is_none()
            && pv.map(|q| q.0) == Some("30Mi".into());
        anyhow::Ok(done.then_some(()))
    })
    .await
    .expect("recovered");

    // A shrink below the volume's size: the API server refuses it before any controller sees it.
    let shrink = request(&env, "growing", "5Mi").await;
    assert!(matches!(&shrink, Err(kube::Error::Api(s)) if s.code == 422), "{shrink:?}");
    env.nodes[0].provisioner.terminate();
}

/// `btrfs subvolume create`, as a workload inside a volume can run it (the ioctl needs no
/// capability).
fn tenant_subvolume(path: &Path) {
    let out = std::process::Command::new("btrfs").args(["-q", "subvolume", "create"]).arg(path).output().unwrap();
    assert!(
        out.status.success(),
        "btrfs subvolume create {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_subvolume_a_tenant_nests_in_a_quota_volume_is_removed_with_it_and_its_qgroup_destroyed() {
    let tmp = tempfile::tempdir().unwrap();
    let (_disk, pool) = btrfs_pool(tmp.path(), 256);
    let name = VolumeDirName::new("pvc-escape").unwrap();
    pool.create_quota_volume(&name, 0o777, MIB).unwrap();
    let dir = pool.volume_path(&name);
    // The escape: a nested subvolume has its own, unlimited qgroup.
    tenant_subvolume(&dir.join("x"));
    let (written, errno) = write_until_refused(&dir.join("x/big"), 4 * MIB);
    assert_eq!((written, errno), (4 * MIB, None), "the nested subvolume is not limited by the volume's quota");
    std::fs::create_dir_all(dir.join("x/deep/dir")).unwrap();
    tenant_subvolume(&dir.join("x/deep/dir/y"));
    std::fs::write(dir.join("x/deep/dir/y/file"), b"data").unwrap();
    std::fs::set_permissions(dir.join("x/deep"), std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    assert_eq!(pool.subvolume_qgroups().unwrap().len(), 3);

    // Through the trash, as the provisioner deletes it.
    pool.move_to_trash(&name).expect("trash");
    assert_eq!(pool.purge_trash().expect("the nested subvolumes do not stop the removal"), 1);
    assert!(!dir.exists());
    assert_eq!(pool.trash_pending().unwrap(), 0);
    assert_eq!(wait_no_qgroups(&pool), Vec::<u64>::new(), "no qgroup left");
}

#[test]
fn a_subvolume_nested_in_a_plain_volume_on_btrfs_is_removed_but_a_mount_inside_it_stops_the_removal() {
    let tmp = tempfile::tempdir().unwrap();
    let (_disk, pool) = btrfs_pool(tmp.path(), 256);
    let name = VolumeDirName::new("pvc-plain").unwrap();
    pool.create_volume_dir(&name, 0o777).unwrap();
    let dir = pool.volume_path(&name);
    tenant_subvolume(&dir.join("x"));
    std::fs::write(dir.join("x/file"), b"data").unwrap();
    // A bind mount of another directory of the same filesystem inside the nested subvolume: same
    // device numbers as a subvolume, but another mount, which the removal never enters.
    let elsewhere = pool.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("keep"), b"keep").unwrap();
    let mount = BindMount::new(&elsewhere, &dir.join("x/mnt"));

    let refused = pool.remove_volume_dir(&name).expect_err("a mount inside stops the removal");
    assert!(refused.to_string().contains("mounted"), "{refused}");
    assert!(elsewhere.join("keep").exists(), "the mounted directory is untouched");
    drop(mount);
    pool.remove_volume_dir(&name).expect("removed once unmounted");
    assert!(!dir.exists());
    assert!(elsewhere.join("keep").exists());
    assert_eq!(wait_no_qgroups(&pool), Vec::<u64>::new(), "no qgroup left");
}

/// A bind mount, unmounted when dropped.
struct BindMount(std::path::PathBuf);

impl BindMount {
    fn new(source: &Path, target: &Path) -> BindMount {
        std::fs::create_dir_all(target).unwrap();
        let ok = std::process::Command::new("mount").arg("--bind").arg(source).arg(target).status().unwrap();
        assert!(ok.success(), "bind mount");
        BindMount(target.to_owned())
    }
}

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_subvolume_whose_limit_cannot_be_set_is_removed_again() {
    let tmp = tempfile::tempdir().unwrap();
    // Quota not enabled: the kernel refuses the limit, as it does without CAP_SYS_ADMIN.
    let disk = LoopFs::mount_btrfs(&tmp.path().join("pool"), 128);
    let pool = PoolRoot::open("fast", &disk.dir).unwrap();
    let name = VolumeDirName::new("pvc-unlimited").unwrap();
    let error = pool.create_quota_volume(&name, 0o777, MIB).expect_err("no limit without quota");
    assert!(error.to_string().contains("qgroup limit"), "{error}");
    assert!(!pool.volume_path(&name).exists(), "no unlimited subvolume left behind");
}

/// A wrapper that runs the provisioner without `CAP_SYS_ADMIN`, as the default DaemonSet does.
fn without_cap_sys_admin(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("hpp-without-sys-admin");
    // Quoted for the shell: the checkout may live under a path with spaces.
    let quoted = format!("'{}'", binary().display().to_string().replace('\'', "'\\''"));
    let text = format!("#!/bin/sh\nexec setpriv --inh-caps -sys_admin --bounding-set -sys_admin -- {quoted} \"$@\"\n");
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[tokio::test(flavor = "multi_thread")]
async fn without_cap_sys_admin_an_enforce_claim_is_refused_naming_the_capability() {
    let mut env = TestEnv::start("quota-nocap", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount_btrfs(&testbed::pool_root_for(env.cp, &node), 128);
    let pool = PoolRoot::open("check", &disk.dir).unwrap();
    pool.enable_btrfs_quota().unwrap();
    let scripts = tempfile::tempdir().unwrap();
    let wrapper = without_cap_sys_admin(scripts.path());
    env.add_node(&node, &|mut spec| {
        spec.binary = wrapper.clone();
        spec
    })
    .await;
    let class = env.class("enforce", |c| c.immediate().parameter("quota", "enforce")).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "refused", &class, "10Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("cannot enforce quota: the provisioner lacks CAP_SYS_ADMIN"), "{note}");
    assert!(entries(&disk.dir).is_empty(), "no subvolume created: {:?}", entries(&disk.dir));
    assert_eq!(pool.subvolume_qgroups().unwrap(), Vec::<u64>::new());
    let (_, ready) = testbed::http_get(env.nodes[0].provisioner.health_addr(), "/readyz").await.unwrap();
    assert!(ready.contains("quota none (the provisioner lacks CAP_SYS_ADMIN"), "{ready}");
    env.nodes[0].provisioner.terminate();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_whose_volume_holds_a_tenant_subvolume_is_deleted_completely_and_counted() {
    let mut env = TestEnv::start("quota-nested", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount_btrfs(&testbed::pool_root_for(env.cp, &node), 128);
    let pool = PoolRoot::open("check", &disk.dir).unwrap();
    pool.enable_btrfs_quota().unwrap();
    env.add_node(&node, &|spec| spec).await;
    let class = env.class("enforce", |c| c.immediate().parameter("quota", "enforce")).await;
    env.create_claim(fixtures::claim(&env.ns, "escaping", &class, "10Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("escaping").await;
    let path = std::path::PathBuf::from(pv.spec.as_ref().unwrap().host_path.as_ref().unwrap().path.clone());
    tenant_subvolume(&path.join("x"));
    std::fs::write(path.join("x/data"), b"outside the quota").unwrap();

    env.delete_claim("escaping").await;
    env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    wait_trash_empty(&disk.dir).await;
    assert!(!path.exists());
    assert_eq!(tokio::task::block_in_place(|| wait_no_qgroups(&pool)), Vec::<u64>::new());
    let provisioner = &env.nodes[0].provisioner;
    testbed::wait_for("nested subvolume counted", TIMEOUT, || async {
        let metrics = provisioner.metrics().await?;
        anyhow::Ok(metrics.lines().any(|l| l == "hostpath_provisioner_nested_subvolumes_removed_total 1").then_some(()))
    })
    .await
    .expect("nested_subvolumes_removed_total 1");
    env.nodes[0].provisioner.terminate();
}

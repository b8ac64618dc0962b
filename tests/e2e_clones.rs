//! End-to-end: clones (a claim whose dataSource is another claim) on loop-mounted btrfs, XFS
//! and ext4 pools: the copy is identical, shares extents where the filesystem can, is refused
//! when too small, is made only on the source's node, and survives a crash mid-copy.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, TypedLocalObjectReference};
use kube::api::{Patch, PatchParams, PostParams};
use testbed::fixtures;

const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
const STAGING: &str = ".hpp-clones";
const CLONING_PROTECTION: &str = "provisioner.storage.kubernetes.io/cloning-protection";

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Installs the mkfs of `fstype` when missing (Debian packages; CI installs them in `.ci/run`).
fn ensure_mkfs(fstype: &str) {
    let tool = format!("mkfs.{fstype}");
    let found =
        Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|o| o.status.success());
    if !found {
        let package = match fstype {
            "btrfs" => "btrfs-progs",
            "xfs" => "xfsprogs",
            _ => "e2fsprogs",
        };
        run(Command::new("apt-get").args(["install", "-y", "-qq", "--no-install-recommends", package]));
    }
}

/// A loop filesystem mounted on a node's pool root before its provisioner starts.
struct LoopMount {
    dir: PathBuf,
    image: PathBuf,
}

impl LoopMount {
    fn new(dir: &Path, fstype: &str, size_mib: u64) -> LoopMount {
        ensure_mkfs(fstype);
        std::fs::create_dir_all(dir).expect("pool root");
        let image = dir.with_extension(format!("{fstype}.img"));
        std::fs::File::create(&image).expect("image").set_len(size_mib << 20).expect("size");
        let mut mkfs = Command::new(format!("mkfs.{fstype}"));
        match fstype {
            "ext4" => mkfs.args(["-q", "-F"]),
            "xfs" => mkfs.args(["-q", "-f", "-m", "reflink=1"]),
            _ => mkfs.args(["-q", "-f"]),
        };
        run(mkfs.arg(&image));
        run(Command::new("mount").arg("-o").arg("loop").arg(&image).arg(dir));
        LoopMount { dir: dir.to_owned(), image }
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// A test namespace with one node per entry of `fstypes`, each with its pool on a loop
/// filesystem of that type. The mounts are dropped after the env (declared first, dropped last).
async fn env_on(test: &str, fstypes: &[&str]) -> (Vec<LoopMount>, TestEnv) {
    let mut env = TestEnv::start(test, 0).await;
    let mut mounts = Vec::new();
    for (i, fstype) in fstypes.iter().enumerate() {
        let name = format!("{}-{}", env.group, i + 1);
        mounts.push(LoopMount::new(&testbed::pool_root_for(env.cp, &name), fstype, 1024));
        env.add_node(&name, &|spec| spec).await;
    }
    (mounts, env)
}

/// A claim cloning `source`.
fn clone_claim(env: &TestEnv, name: &str, class: &str, size: &str, source: &str) -> PersistentVolumeClaim {
    let mut claim = fixtures::claim(&env.ns, name, class, size).build();
    claim.spec.as_mut().expect("spec").data_source =
        Some(TypedLocalObjectReference { api_group: None, kind: "PersistentVolumeClaim".into(), name: source.into() });
    claim
}

fn host_path(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> PathBuf {
    PathBuf::from(&pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).expect("hostPath").path)
}

const SPARSE_SIZE: u64 = 64 << 20;

/// Files, a symlink pointing outside, a hard-link pair, a sparse file, owners, modes, old times.
fn fill(volume: &Path, outside: &Path) {
    std::fs::create_dir_all(volume.join("dir/sub")).expect("dirs");
    std::fs::write(volume.join("dir/sub/data"), vec![42u8; 1 << 20]).expect("data");
    std::fs::write(volume.join("a"), b"first of a hard-link pair").expect("a");
    std::fs::hard_link(volume.join("a"), volume.join("dir/b")).expect("hard link");
    std::fs::write(outside, b"outside the volume").expect("outside");
    symlink(outside, volume.join("escape")).expect("symlink");
    let sparse = std::fs::File::create(volume.join("sparse")).expect("sparse");
    sparse.set_len(SPARSE_SIZE).expect("size");
    std::os::unix::fs::FileExt::write_at(&sparse, &[1u8; 4096], 16 << 20).expect("write");
    drop(sparse);
    std::fs::set_permissions(volume.join("a"), std::fs::Permissions::from_mode(0o640)).expect("chmod");
    run(Command::new("chown").args(["-h", "1001:2002"]).arg(volume.join("dir/sub/data")));
    for entry in ["a", "escape", "sparse", "dir/sub/data", "dir/sub", "dir"] {
        run(Command::new("touch").args(["-h", "-d", "2002-03-04 05:06:07.5"]).arg(volume.join(entry)));
    }
}

/// Every entry agrees in type, content, mode, owner, mtime, link count and symlink target.
fn assert_identical(a: &Path, b: &Path) {
    let (ma, mb) = (std::fs::symlink_metadata(a).expect("a"), std::fs::symlink_metadata(b).expect("b"));
    let what = b.display();
    assert_eq!(ma.file_type(), mb.file_type(), "{what}: type");
    assert_eq!(ma.mode(), mb.mode(), "{what}: mode");
    assert_eq!((ma.uid(), ma.gid()), (mb.uid(), mb.gid()), "{what}: owner");
    if ma.file_type().is_dir() {
        let list = |p: &Path| {
            let mut v: Vec<_> = std::fs::read_dir(p).expect("list").map(|e| e.expect("entry").file_name()).collect();
            v.sort();
            v
        };
        assert_eq!(list(a), list(b), "{what}: entries");
        for n in list(a) {
            assert_identical(&a.join(&n), &b.join(&n));
        }
        return;
    }
    assert_eq!((ma.mtime(), ma.mtime_nsec()), (mb.mtime(), mb.mtime_nsec()), "{what}: mtime");
    assert_eq!(ma.nlink(), mb.nlink(), "{what}: link count");
    if ma.file_type().is_symlink() {
        assert_eq!(std::fs::read_link(a).expect("a"), std::fs::read_link(b).expect("b"), "{what}: target");
    } else {
        assert!(std::fs::read(a).expect("a") == std::fs::read(b).expect("b"), "{what}: content");
    }
}

/// An Immediate source pinned to the first node, bound, with `fill`ed data.
async fn bound_source(env: &TestEnv, class: &str) -> PathBuf {
    let node = env.nodes[0].name.clone();
    env.create_claim(fixtures::claim(&env.ns, "src", class, "100Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("src").await;
    let dir = host_path(&pv);
    fill(&dir, &env.cp.temp_dir().join(format!("{}-outside", env.group)));
    dir
}

/// Clones a filled source on a pool of `fstype`; checks the copy and whether extents are shared.
async fn clone_is_identical(fstype: &str, shared_extents: bool) {
    let (_mounts, env) = env_on(&format!("clone-{fstype}"), &[fstype]).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let source = bound_source(&env, &class).await;
    let outside = env.cp.temp_dir().join(format!("{}-outside", env.group));
    // No node named: the source's node makes the copy.
    env.claims()
        .create(&PostParams::default(), &clone_claim(&env, "copy", &class, "100Mi", "src"))
        .await
        .expect("clone");
    let pv = env.wait_bound("copy").await;
    let owner = pv.metadata.annotations.clone().unwrap_or_default()["kubevirt.io/provisionOnNode"].clone();
    assert_eq!(owner, env.nodes[0].name);
    let copy = host_path(&pv);
    assert_identical(&source, &copy);
    let finalizers = env.claims().get("src").await.expect("source").metadata.finalizers.unwrap_or_default();
    assert!(!finalizers.iter().any(|f| f == CLONING_PROTECTION), "released after the copy: {finalizers:?}");
    assert_eq!(std::fs::read(&outside).expect("outside"), b"outside the volume", "outside target untouched");
    let sparse = std::fs::metadata(copy.join("sparse")).expect("sparse");
    assert_eq!(sparse.len(), SPARSE_SIZE);
    assert!(sparse.blocks() * 512 < 1 << 20, "the sparse copy allocates {} bytes", sparse.blocks() * 512);
    run(&mut Command::new("sync"));
    let frag = run(Command::new("filefrag").arg("-v").arg(copy.join("dir/sub/data")));
    assert_eq!(frag.contains("shared"), shared_extents, "{fstype}: filefrag -v says\n{frag}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clone_on_btrfs_is_identical_and_reflinked() {
    clone_is_identical("btrfs", true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clone_on_xfs_is_identical_and_reflinked() {
    clone_is_identical("xfs", true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clone_on_ext4_is_an_identical_byte_copy() {
    clone_is_identical("ext4", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clone_smaller_than_its_source_is_refused_with_the_reason() {
    let env = TestEnv::start("clone-small", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    env.create_claim(fixtures::claim(&env.ns, "src", &class, "100Mi").provision_on_node(&node)).await;
    env.wait_bound("src").await;
    let claim = env
        .claims()
        .create(&PostParams::default(), &clone_claim(&env, "copy", &class, "50Mi", "src"))
        .await
        .expect("clone");
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("requests 50Mi") && note.contains("request at least 100Mi"), "{note}");
    let phase = env.claims().get("copy").await.expect("claim").status.and_then(|s| s.phase);
    assert_eq!(phase.as_deref(), Some("Pending"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wffc_clone_scheduled_to_another_node_gets_the_event_and_is_handed_back() {
    let env = TestEnv::start("clone-wffc", 2).await;
    let class = env.class("wffc", |c| c).await;
    let (first, second) = (env.nodes[0].name.clone(), env.nodes[1].name.clone());
    env.create_claim(fixtures::claim(&env.ns, "src", &class, "10Mi").provision_on_node(&first)).await;
    env.wait_bound("src").await;
    let claim = env
        .claims()
        .create(&PostParams::default(), &clone_claim(&env, "copy", &class, "10Mi", "src"))
        .await
        .expect("clone");
    // What the scheduler writes when it places the clone's pod on the second node.
    let patch = serde_json::json!({"metadata": {"annotations": {SELECTED_NODE: second}}});
    env.claims().patch("copy", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("select");
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains(&format!("lives on node {first}")) && note.contains("Run the pod on node"), "{note}");
    let annotations = env.claims().get("copy").await.expect("claim").metadata.annotations.unwrap_or_default();
    assert!(!annotations.contains_key(SELECTED_NODE), "handed back to the scheduler: {annotations:?}");
    assert!(entries(&env.nodes[1].pool_root).is_empty(), "nothing made on the second node");
    // Scheduled to the source's node, the clone is made there.
    let patch = serde_json::json!({"metadata": {"annotations": {SELECTED_NODE: first}}});
    env.claims().patch("copy", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("select");
    let pv = env.wait_bound("copy").await;
    assert!(host_path(&pv).starts_with(&env.nodes[0].pool_root));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_mid_copy_leaves_no_pv_and_no_partial_volume_and_the_clone_then_completes() {
    let (_mounts, mut env) = env_on("clone-crash", &["ext4"]).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    env.create_claim(fixtures::claim(&env.ns, "src", &class, "350Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("src").await);
    // Many files, so the byte copy takes a while.
    for i in 0..1200 {
        std::fs::write(source.join(format!("f{i:04}")), vec![(i % 251) as u8; 256 << 10]).expect("file");
    }
    let claim = env
        .claims()
        .create(&PostParams::default(), &clone_claim(&env, "copy", &class, "350Mi", "src"))
        .await
        .expect("clone");
    let pool = env.nodes[0].pool_root.clone();
    let staging = pool.join(STAGING).join(&node);
    let in_staging = || std::fs::read_dir(&staging).map(|rd| rd.count()).unwrap_or(0);
    let deadline = std::time::Instant::now() + TIMEOUT;
    while in_staging() == 0 {
        assert!(std::time::Instant::now() < deadline, "the copy never started\n{}", env.log_tails());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    env.node_mut(&node).provisioner.kill();
    // Still in staging after the kill: the copy was cut short (a finished one is renamed out).
    assert_eq!(in_staging(), 1, "the copy finished before the kill; give the source more data");
    // The source was protected from deletion while it was read.
    let finalizers = env.claims().get("src").await.expect("source").metadata.finalizers.unwrap_or_default();
    assert!(finalizers.iter().any(|f| f == CLONING_PROTECTION), "{finalizers:?}");
    let pv_name = format!("pvc-{}", uid(&claim));
    let clone_dir = pool.join(&pv_name);
    assert!(!clone_dir.exists(), "no volume directory for an unfinished copy");
    assert!(env.pvs().get_opt(&pv_name).await.expect("get PV").is_none(), "no PV for an unfinished copy");
    // After the restart the unfinished copy goes and the clone is made again, complete.
    env.node_mut(&node).provisioner.restart().expect("restart");
    let pv = env.wait_bound("copy").await;
    assert_identical(&source, &host_path(&pv));
    let left = std::fs::read_dir(&staging).map(|rd| rd.count()).unwrap_or(0);
    assert_eq!(left, 0, "nothing left in staging");
    let finalizers = env.claims().get("src").await.expect("source").metadata.finalizers.unwrap_or_default();
    assert!(!finalizers.iter().any(|f| f == CLONING_PROTECTION), "released after the copy: {finalizers:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clone_on_a_shared_pool_is_made_by_whichever_node_acts() {
    let mut env = TestEnv::start("clone-shared", 0).await;
    env.own_provisioner();
    let shared = env.cp.temp_dir().join(format!("{}-nfs", env.group));
    let _mount = LoopMount::new(&shared, "xfs", 1024);
    for i in 1..=2 {
        let arg = format!("nfs={},shared", shared.display());
        env.add_node(&format!("{}-{i}", env.group), &move |spec: testbed::ProvisionerSpec| {
            spec.arg("--pool").arg(arg.clone())
        })
        .await;
    }
    let class =
        env.class("imm", |c| c.immediate().parameter("storagePool", "nfs").parameter("topology", "shared")).await;
    env.create_claim(fixtures::claim(&env.ns, "src", &class, "100Mi")).await;
    let source = host_path(&env.wait_bound("src").await);
    fill(&source, &env.cp.temp_dir().join(format!("{}-outside", env.group)));
    env.claims()
        .create(&PostParams::default(), &clone_claim(&env, "copy", &class, "100Mi", "src"))
        .await
        .expect("clone");
    let pv = env.wait_bound("copy").await;
    let copy = host_path(&pv);
    assert_eq!(copy.parent(), Some(shared.as_path()), "the clone is in the shared pool");
    assert!(pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).is_none(), "a shared clone is not pinned");
    assert_identical(&source, &copy);
    run(&mut Command::new("sync"));
    let frag = run(Command::new("filefrag").arg("-v").arg(copy.join("dir/sub/data")));
    assert!(frag.contains("shared"), "filefrag -v says\n{frag}");
    // Removed while the pool is still mounted (the mount is dropped before the env).
    let source_pv = env.claims().get("src").await.expect("source").spec.and_then(|s| s.volume_name).expect("bound");
    for claim in ["copy", "src"] {
        env.delete_claim(claim).await;
    }
    env.wait_pv_gone(pv.metadata.name.as_deref().expect("name")).await;
    env.wait_pv_gone(&source_pv).await;
    wait_trash_empty(&shared).await;
}

/// Whether the source claim carries the cloning-protection finalizer.
async fn source_protected(env: &TestEnv) -> bool {
    let finalizers = env.claims().get("src").await.expect("source").metadata.finalizers.unwrap_or_default();
    finalizers.iter().any(|f| f == CLONING_PROTECTION)
}

async fn wait_source_released(env: &TestEnv) {
    testbed::wait_for("the source's cloning protection released", TIMEOUT, || async {
        anyhow::Ok((!source_protected(env).await).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.log_tails()));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_source_stays_protected_while_another_clone_waits_for_its_copy() {
    let env = TestEnv::start("clone-pending", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    env.create_claim(fixtures::claim(&env.ns, "src", &class, "100Mi").provision_on_node(&node)).await;
    env.wait_bound("src").await;
    // A clone that stays pending (refused: too small), as a clone another node of a shared pool
    // still copies would: the first copy done must not release the source under it.
    let waiting = env
        .claims()
        .create(&PostParams::default(), &clone_claim(&env, "waiting", &class, "50Mi", "src"))
        .await
        .expect("waiting clone");
    env.wait_event(&env.ns, &uid(&waiting), "ProvisioningFailed").await;
    env.claims()
        .create(&PostParams::default(), &clone_claim(&env, "copy", &class, "100Mi", "src"))
        .await
        .expect("clone");
    env.wait_bound("copy").await;
    assert!(source_protected(&env).await, "released while another clone of the source is pending");
    // Once no clone waits, the source's own look releases it.
    env.delete_claim("waiting").await;
    wait_source_released(&env).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leftover_cloning_protection_without_a_pending_clone_is_removed() {
    let env = TestEnv::start("clone-leftover", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    env.create_claim(fixtures::claim(&env.ns, "src", &class, "10Mi").provision_on_node(&node)).await;
    env.wait_bound("src").await;
    // What a copy killed before its clone claim was deleted, or a failed release, leaves.
    let source = env.claims().get("src").await.expect("source");
    let mut finalizers = source.metadata.finalizers.unwrap_or_default();
    finalizers.push(CLONING_PROTECTION.to_owned());
    let patch = serde_json::json!({"metadata": {"finalizers": finalizers}});
    env.claims().patch("src", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("protect");
    wait_source_released(&env).await;
    // The source can go.
    let pv = env.claims().get("src").await.expect("source").spec.and_then(|s| s.volume_name).expect("bound");
    env.delete_claim("src").await;
    env.wait_pv_gone(&pv).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_enforced_quota_clone_of_a_plain_directory_is_refused_before_copying() {
    let mut env = TestEnv::start("clone-quota-plain", 0).await;
    let name = format!("{}-1", env.group);
    let _mount = LoopMount::new(&testbed::pool_root_for(env.cp, &name), "btrfs", 1024);
    run(Command::new("btrfs").args(["quota", "enable"]).arg(testbed::pool_root_for(env.cp, &name)));
    env.add_node(&name, &|spec| spec).await;
    let class = env.class("enforce", |c| c.immediate().parameter("quota", "enforce")).await;
    let node = env.nodes[0].name.clone();
    env.create_claim(fixtures::claim(&env.ns, "src", &class, "100Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("src").await);
    // A source made as a plain directory (before the class enforced quota, or by the Go build):
    // the subvolume is set aside and a plain directory with its data takes its place.
    let aside = source.with_extension("subvolume");
    std::fs::rename(&source, &aside).expect("set the subvolume aside");
    std::fs::create_dir(&source).expect("plain directory");
    std::fs::write(source.join("data"), vec![7u8; 1 << 20]).expect("data");
    let claim = env
        .claims()
        .create(&PostParams::default(), &clone_claim(&env, "copy", &class, "100Mi", "src"))
        .await
        .expect("clone");
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("plain directory") && note.contains("quota"), "{note}");
    let pool = &env.nodes[0].pool_root;
    assert!(!pool.join(format!("pvc-{}", uid(&claim))).exists(), "no copy made");
    let staged = std::fs::read_dir(pool.join(STAGING).join(&node)).map(|rd| rd.count()).unwrap_or(0);
    assert_eq!(staged, 0, "nothing copied into staging");
    assert!(!source_protected(&env).await, "the source was never read");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_copy_killed_then_its_clone_deleted_does_not_keep_the_source_protected() {
    let (_mounts, mut env) = env_on("clone-killed-gone", &["ext4"]).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    env.create_claim(fixtures::claim(&env.ns, "src", &class, "350Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("src").await);
    // Many files, so the byte copy takes a while.
    for i in 0..1200 {
        std::fs::write(source.join(format!("f{i:04}")), vec![(i % 251) as u8; 256 << 10]).expect("file");
    }
    env.claims()
        .create(&PostParams::default(), &clone_claim(&env, "copy", &class, "350Mi", "src"))
        .await
        .expect("clone");
    let staging = env.nodes[0].pool_root.join(STAGING).join(&node);
    let in_staging = || std::fs::read_dir(&staging).map(|rd| rd.count()).unwrap_or(0);
    let deadline = std::time::Instant::now() + TIMEOUT;
    while in_staging() == 0 {
        assert!(std::time::Instant::now() < deadline, "the copy never started\n{}", env.log_tails());
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    env.node_mut(&node).provisioner.kill();
    assert!(source_protected(&env).await, "protected while read");
    // The clone goes while its provisioner is down: nothing will retry that copy.
    env.delete_claim("copy").await;
    testbed::wait_for("the clone claim gone", TIMEOUT, || async {
        anyhow::Ok(env.claims().get_opt("copy").await?.is_none().then_some(()))
    })
    .await
    .expect("clone deleted");
    env.node_mut(&node).provisioner.restart().expect("restart");
    wait_source_released(&env).await;
    assert_eq!(in_staging(), 0, "the unfinished copy was swept at start-up");
}

/// A clone's byte copy writes what its source holds, whatever the claim requests, so it is
/// checked for room as a snapshot's or a restore's copy is (deciding::copy_room): a 1Mi clone of
/// a claim whose pod wrote 30 MiB (no quota), on a 64 MiB ext4 pool with a 16 MiB reserve, waits
/// with `ProvisioningFailed` saying so; nothing of it is written and the free space, sampled
/// throughout, never falls below the reserve.
#[tokio::test(flavor = "multi_thread")]
async fn a_clone_whose_source_holds_more_than_fits_waits_for_room_and_never_takes_the_pool_below_its_reserve() {
    let mut env = TestEnv::start("clone-room", 0).await;
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    env.add_node(&node, &|spec| spec.env("RESERVED_SPACE", "16Mi")).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "source", &class, "1Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("source").await);
    let block: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    let mut file = std::fs::File::create(source.join("data")).expect("data");
    for _ in 0..30 {
        std::io::Write::write_all(&mut file, &block).expect("write");
    }
    file.sync_all().expect("sync");
    let reserve = 16u64 << 20;
    let free = common::capacity::available_bytes(&disk.dir);
    assert!(free > reserve && free - reserve < 30 << 20, "the copy does not fit beside the reserve: {free}");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (dir, stop) = (disk.dir.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut least = u64::MAX;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                least = least.min(common::capacity::available_bytes(&dir));
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            least
        })
    };
    let mut clone = clone_claim(&env, "copy", &class, "1Mi", "source");
    clone.metadata.annotations = Some([("kubevirt.io/provisionOnNode".to_owned(), node.clone())].into());
    let clone = env.claims().create(&PostParams::default(), &clone).await.expect("create clone");
    let note = env.wait_event(&env.ns, clone.metadata.uid.as_deref().unwrap(), "ProvisioningFailed").await;
    assert!(note.contains("the clone of claim \"source\"") && note.contains("waits until there is room"), "{note}");
    let least = {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.join().unwrap()
    };
    assert!(least + (1 << 20) >= reserve, "free space fell to {least} bytes, below the reserve {reserve}");
    let clone_dir = disk.dir.join(format!("pvc-{}", clone.metadata.uid.as_deref().unwrap()));
    assert!(!clone_dir.exists(), "nothing of the clone written: {}", clone_dir.display());
}

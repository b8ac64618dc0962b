//! End-to-end: a class's `pathPattern` (docs/volumes.md, predictable directory names) against a
//! real control plane: the directory is named from the claim and carries the provisioner's
//! marker; a claim made again gets its directory and data back once the old PV is gone, never
//! before; a planted directory is refused; a forged PV pointing at another volume's pattern
//! directory removes nothing; a volume under Delete goes as any other.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Patch, PatchParams, PostParams};
use testbed::fixtures;

const PATTERN: &str = "{namespace}_{claim}";
const MARKER: &str = "user.hostpath-provisioner.pv";

fn host_path(pv: &PersistentVolume) -> PathBuf {
    PathBuf::from(pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone()).expect("hostPath"))
}

fn marker_of(dir: &Path) -> Option<String> {
    let mut buf = [0u8; 300];
    let len = rustix::fs::lgetxattr(dir, MARKER, &mut buf[..]).ok()?;
    Some(String::from_utf8_lossy(&buf[..len]).into_owned())
}

/// Makes the provisioner look at a claim now rather than at its next recheck (a minute).
async fn nudge(env: &TestEnv, claim: &str) {
    let patch = serde_json::json!({"metadata": {"annotations": {"hpp-test/nudge": testbed::unique_name("n")}}});
    env.claims().patch(claim, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("annotate claim");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_made_again_gets_its_directory_and_data_back_once_the_old_pv_is_gone() {
    let env = TestEnv::start("pattern", 1).await;
    let node = env.nodes[0].name.clone();
    let class = env.class("named", |c| c.immediate().reclaim_policy("Retain").parameter("pathPattern", PATTERN)).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "db", &class, "1Mi").provision_on_node(&node)).await;
    let first = env.wait_bound("db").await;
    let first_name = first.metadata.name.clone().expect("name");
    let dir = host_path(&first);
    assert_eq!(dir, env.nodes[0].pool_root.join(format!("{}_db", env.ns)));
    assert_eq!(first_name, format!("pvc-{}", uid(&claim)));
    let annotations: BTreeMap<_, _> = first.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get("hostpath-provisioner.kubevirt.io/path-pattern").map(String::as_str), Some(PATTERN));
    assert_eq!(marker_of(&dir).as_deref(), Some(first_name.as_str()), "the directory carries its PV's marker");
    std::fs::write(dir.join("table"), b"rows").unwrap();

    // Made again while the Released PV still holds the directory: refused, saying what to do.
    env.delete_claim("db").await;
    env.wait_pv_phase(&first_name, "Released").await;
    let again = env.create_claim(fixtures::claim(&env.ns, "db", &class, "1Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&again), "ProvisioningFailed").await;
    assert!(
        note.contains(&format!("belongs to PV {first_name}")) && note.contains("once that PV is deleted"),
        "{note}"
    );
    assert_eq!(marker_of(&dir).as_deref(), Some(first_name.as_str()));

    // The admin deletes the old PV (its data stays, under Retain): the doctor reports the
    // directory as data without a PV, then the claim takes it over.
    env.pvs().delete(&first_name, &Default::default()).await.expect("delete the Released PV");
    env.wait_pv_gone(&first_name).await;
    let report = doctor_report(&env, 0, &[]).await;
    let orphans = report["pools"][0]["volumes"]["orphan_directories"].as_array().cloned().unwrap_or_default();
    assert!(orphans.iter().any(|o| o["name"] == format!("{}_db", env.ns)), "the doctor's orphans: {orphans:?}");
    nudge(&env, "db").await;
    let second = env.wait_bound("db").await;
    let second_name = second.metadata.name.clone().expect("name");
    assert_eq!(second_name, format!("pvc-{}", uid(&again)));
    assert_eq!(host_path(&second), dir, "the same directory");
    assert_eq!(std::fs::read(dir.join("table")).unwrap(), b"rows", "with its data");
    assert_eq!(marker_of(&dir).as_deref(), Some(second_name.as_str()), "now marked for the new PV");
    let note = env.wait_event(&env.ns, &uid(&again), "DirectoryReused").await;
    assert!(note.contains(&first_name) && note.contains(&dir.display().to_string()), "{note}");
}

#[tokio::test(flavor = "multi_thread")]
async fn planted_directories_and_forged_pvs_reach_no_data_and_delete_removes_only_its_own() {
    let env = TestEnv::start("patternsafe", 1).await;
    let node = env.nodes[0].name.clone();
    let class = env.class("named", |c| c.immediate().parameter("pathPattern", PATTERN)).await;
    let root = env.nodes[0].pool_root.clone();

    // A directory someone else put where a claim's name points: never taken.
    let planted = root.join(format!("{}_planted", env.ns));
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::write(planted.join("theirs"), b"not a volume").unwrap();
    let claim = env.create_claim(fixtures::claim(&env.ns, "planted", &class, "1Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("does not carry the provisioner's marker"), "{note}");
    assert_eq!(std::fs::read(planted.join("theirs")).unwrap(), b"not a volume");
    assert_eq!(marker_of(&planted), None);
    // A symlink planted at a claim's name, to a directory carrying a marker: never followed.
    let outside = env.cp.temp_dir().join(format!("{}-outside", env.group));
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"outside").unwrap();
    rustix::fs::setxattr(&outside, MARKER, b"pvc-gone", rustix::fs::XattrFlags::empty()).unwrap();
    std::os::unix::fs::symlink(&outside, root.join(format!("{}_linked", env.ns))).unwrap();
    let claim = env.create_claim(fixtures::claim(&env.ns, "linked", &class, "1Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("does not carry the provisioner's marker"), "{note}");
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"outside");
    assert_eq!(marker_of(&outside).as_deref(), Some("pvc-gone"), "the target was not taken over");

    // A live volume, and a forged PV (a copy of another volume's, pointing at it) let go.
    env.create_claim(fixtures::claim(&env.ns, "live", &class, "1Mi").provision_on_node(&node)).await;
    let live = env.wait_bound("live").await;
    let live_dir = host_path(&live);
    std::fs::write(live_dir.join("data"), b"live data").unwrap();
    // A clone of a pattern volume is named by its own claim, and copied from the marked source.
    env.create_claim(fixtures::claim(&env.ns, "copy", &class, "1Mi").data_source("", "PersistentVolumeClaim", "live"))
        .await;
    let copy = env.wait_bound("copy").await;
    let copy_dir = host_path(&copy);
    assert_eq!(copy_dir, root.join(format!("{}_copy", env.ns)));
    assert_eq!(std::fs::read(copy_dir.join("data")).unwrap(), b"live data");
    assert_eq!(marker_of(&copy_dir), copy.metadata.name.clone());
    env.create_claim(fixtures::claim(&env.ns, "other", &class, "1Mi").provision_on_node(&node)).await;
    let other = env.wait_bound("other").await;
    let mut forged = other.clone();
    let forged_name = format!("pvc-{}", "0f0f0f0f-1111-4222-8333-444444444444");
    forged.metadata = kube::api::ObjectMeta {
        name: Some(forged_name.clone()),
        labels: other.metadata.labels.clone(),
        annotations: other.metadata.annotations.clone(),
        ..Default::default()
    };
    forged.status = None;
    let spec = forged.spec.as_mut().expect("spec");
    spec.host_path.as_mut().expect("hostPath").path = live_dir.display().to_string();
    let claim_ref = spec.claim_ref.as_mut().expect("claimRef");
    claim_ref.name = Some("ghost".into());
    claim_ref.uid = Some("0e0e0e0e-1111-4222-8333-444444444444".into());
    claim_ref.resource_version = None;
    let created = env.pvs().create(&PostParams::default(), &forged).await.expect("create the forged PV");
    let note = env.wait_event("default", created.metadata.uid.as_deref().unwrap(), "VolumeFailedDelete").await;
    assert!(note.contains(&format!("does not carry the marker of PV {forged_name}")), "{note}");
    assert_eq!(std::fs::read(live_dir.join("data")).unwrap(), b"live data", "the live volume keeps its data");
    assert_eq!(marker_of(&live_dir), live.metadata.name.clone());

    // Under Delete, a pattern volume goes with its claim, as any other.
    let other_dir = host_path(&other);
    env.delete_claim("other").await;
    env.wait_pv_gone(other.metadata.name.as_deref().unwrap()).await;
    wait_path_gone(&other_dir).await;
    assert!(live_dir.join("data").is_file());
    env.pvs().delete(&forged_name, &Default::default()).await.expect("clean up the forged PV");
}

/// On btrfs with `quota: enforce` (and a class owner): the volume is a subvolume made aside,
/// owned and renamed into place, limited to its request; taken over by a claim made again, it
/// keeps its data and gets the new claim's limit.
#[tokio::test(flavor = "multi_thread")]
async fn a_quota_volume_named_by_a_pattern_is_limited_and_taken_over_with_the_new_limit() {
    use std::io::Write;
    const MIB: u64 = 1 << 20;
    let mut env = TestEnv::start("patternquota", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount_btrfs(&testbed::pool_root_for(env.cp, &node), 256);
    let pool = hostpath_provisioner::filesystem::PoolRoot::open("check", &disk.dir).unwrap();
    pool.enable_btrfs_quota().unwrap();
    env.add_node(&node, &|spec| spec).await;
    let class = env
        .class("named", |c| {
            c.immediate()
                .reclaim_policy("Retain")
                .parameter("quota", "enforce")
                .parameter("pathPattern", PATTERN)
                .parameter("uid", "1000")
        })
        .await;
    let fill = |file: &Path, cap: u64| {
        let mut out = std::fs::File::create(file).expect("create");
        let chunk = vec![0x5a_u8; MIB as usize];
        let mut written = 0;
        while written < cap && out.write_all(&chunk).and_then(|()| out.sync_data()).is_ok() {
            written += MIB;
        }
        written
    };
    env.create_claim(fixtures::claim(&env.ns, "db", &class, "8Mi").provision_on_node(&node)).await;
    let first = env.wait_bound("db").await;
    let dir = host_path(&first);
    assert_eq!(dir, disk.dir.join(format!("{}_db", env.ns)));
    // The class's owner on a subvolume (it once failed there as "a mount inside the volume").
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&dir).unwrap()), 1000);
    assert!(fill(&dir.join("a"), 64 * MIB) <= 8 * MIB, "stopped at the 8Mi request");
    assert_eq!(pool.subvolume_qgroups().unwrap().len(), 1, "one subvolume, renamed into place");

    env.delete_claim("db").await;
    let first_name = first.metadata.name.clone().unwrap();
    env.wait_pv_phase(&first_name, "Released").await;
    env.pvs().delete(&first_name, &Default::default()).await.expect("delete the Released PV");
    env.wait_pv_gone(&first_name).await;
    env.create_claim(fixtures::claim(&env.ns, "db", &class, "32Mi").provision_on_node(&node)).await;
    let second = env.wait_bound("db").await;
    assert_eq!(host_path(&second), dir);
    assert!(dir.join("a").is_file(), "the data is still there");
    let more = fill(&dir.join("b"), 64 * MIB);
    assert!((8 * MIB..=32 * MIB).contains(&more), "the new claim's 32Mi limit holds: {more}");
    drop(disk);
}

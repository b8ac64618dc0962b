//! End-to-end: a class's `pathPattern` (docs/volumes.md, predictable directory names) against a
//! real control plane: the directory is named from the claim and carries the provisioner's
//! marker; a claim made again gets its directory and data back once the old PV is gone, never
//! before; a planted directory is refused; a forged PV pointing at another volume's pattern
//! directory removes nothing; a volume under Delete goes as any other. A directory goes back
//! only to the claim it was made for (issue #44): not to another tenant's claim that another
//! class's pattern resolves to the same name, not to a namespace made again under the same name,
//! unless an admin hands it over on the Namespace.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::*;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, Patch, PatchParams, PostParams};
use testbed::fixtures;

const PATTERN: &str = "{namespace}_{claim}";
const MARKER: &str = "user.hostpath-provisioner.pv";
const OWNER: &str = "user.hostpath-provisioner.owner";
const ADOPT_DIRECTORY: &str = "hostpath-provisioner.kubevirt.io/adopt-directory";

fn host_path(pv: &PersistentVolume) -> PathBuf {
    PathBuf::from(pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone()).expect("hostPath"))
}

fn marker_of(dir: &Path) -> Option<String> {
    xattr_of(dir, MARKER)
}

fn xattr_of(dir: &Path, name: &str) -> Option<String> {
    let mut buf = [0u8; 1024];
    let len = rustix::fs::lgetxattr(dir, name, &mut buf[..]).ok()?;
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

fn claims_in(env: &TestEnv, namespace: &str) -> Api<PersistentVolumeClaim> {
    Api::namespaced(env.client.clone(), namespace)
}

async fn create_namespace(env: &TestEnv, name: &str) -> Namespace {
    Api::<Namespace>::all(env.client.clone())
        .create(&PostParams::default(), &fixtures::namespace(name))
        .await
        .expect("create namespace")
}

/// Waits until the claim `namespace/name` is Bound and returns its PV.
async fn wait_bound_in(env: &TestEnv, namespace: &str, name: &str) -> PersistentVolume {
    let claims = claims_in(env, namespace);
    let bound = testbed::wait_until(
        &format!("claim {namespace}/{name} Bound"),
        TIMEOUT,
        || async { claims.get(name).await },
        |c: &PersistentVolumeClaim| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
    )
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let pv = bound.spec.and_then(|s| s.volume_name).expect("bound claim names its volume");
    env.pvs().get(&pv).await.expect("get PV")
}

/// The Released PV of a deleted claim deleted too, as docs/volumes.md tells an admin to do so
/// that the claim made again gets its data back.
async fn release_and_delete_pv(env: &TestEnv, namespace: &str, claim: &str, pv: &str) {
    claims_in(env, namespace).delete(claim, &Default::default()).await.expect("delete claim");
    env.wait_pv_phase(pv, "Released").await;
    env.pvs().delete(pv, &Default::default()).await.expect("delete the Released PV");
    env.wait_pv_gone(pv).await;
}

async fn phase_of(env: &TestEnv, namespace: &str, claim: &str) -> String {
    let claim = claims_in(env, namespace).get(claim).await.expect("get claim");
    claim.status.and_then(|s| s.phase).unwrap_or_default()
}

/// Two classes of one pool whose patterns mirror each other: claim `v` of namespace `t` under
/// `{namespace}_{claim}` and claim `t` of namespace `v` under `{claim}_{namespace}` name the same
/// directory. Once the victim's Released PV is deleted, the other tenant's claim is refused,
/// naming both; the victim's claim made again gets its data back.
#[tokio::test(flavor = "multi_thread")]
async fn another_tenants_claim_whose_pattern_names_the_same_directory_is_refused_and_the_owner_gets_it_back() {
    let env = TestEnv::start("patmirror", 1).await;
    let node = env.nodes[0].name.clone();
    let (t, v) = (env.ns.clone(), testbed::unique_name("patv"));
    let v_uid = create_namespace(&env, &v).await.metadata.uid.expect("namespace uid");
    let t_uid = Api::<Namespace>::all(env.client.clone()).get(&t).await.unwrap().metadata.uid.expect("uid");
    let by_namespace =
        env.class("bynamespace", |c| c.immediate().reclaim_policy("Retain").parameter("pathPattern", PATTERN)).await;
    let by_claim = env
        .class("byclaim", |c| c.immediate().reclaim_policy("Retain").parameter("pathPattern", "{claim}_{namespace}"))
        .await;

    // The victim: claim `v` of namespace `t`, with data.
    env.create_claim(fixtures::claim(&t, &v, &by_namespace, "1Mi").provision_on_node(&node)).await;
    let first = env.wait_bound(&v).await;
    let first_name = first.metadata.name.clone().expect("name");
    let dir = host_path(&first);
    assert_eq!(dir, env.nodes[0].pool_root.join(format!("{t}_{v}")));
    let record = xattr_of(&dir, OWNER).expect("the directory records its owner");
    for part in [format!("namespace-uid={t_uid}"), format!("namespace={t}"), format!("claim={v}")] {
        assert!(record.contains(&part), "{part} missing from {record}");
    }
    assert_eq!(marker_of(&dir).as_deref(), Some(first_name.as_str()), "the marker stays the bare PV name");
    std::fs::write(dir.join("secret"), b"t's data").unwrap();
    release_and_delete_pv(&env, &t, &v, &first_name).await;

    // The other tenant: claim `t` of namespace `v`, whose class resolves to the same name.
    let thief = claims_in(&env, &v)
        .create(&PostParams::default(), &fixtures::claim(&v, &t, &by_claim, "1Mi").provision_on_node(&node).build())
        .await
        .expect("create the other tenant's claim");
    let note = env.wait_event(&v, &uid(&thief), "ProvisioningFailed").await;
    for part in [
        format!("was made for claim {t}/{v} of StorageClass {by_namespace} (namespace uid {t_uid})"),
        format!("not for claim {v}/{t} of StorageClass {by_claim} (namespace uid {v_uid})"),
        format!("PV {first_name}"),
        format!("{ADOPT_DIRECTORY}={t}_{v}"),
    ] {
        assert!(note.contains(&part), "{part:?} missing from: {note}");
    }
    assert_eq!(phase_of(&env, &v, &t).await, "Pending");
    assert_eq!(std::fs::read(dir.join("secret")).unwrap(), b"t's data", "the victim's files are intact");
    assert_eq!(marker_of(&dir).as_deref(), Some(first_name.as_str()), "nothing was rewritten");
    assert_eq!(xattr_of(&dir, OWNER), Some(record.clone()));

    // The victim's own claim made again gets its directory and data back.
    let again = env.create_claim(fixtures::claim(&t, &v, &by_namespace, "1Mi").provision_on_node(&node)).await;
    let second = env.wait_bound(&v).await;
    assert_eq!(host_path(&second), dir);
    assert_eq!(std::fs::read(dir.join("secret")).unwrap(), b"t's data");
    assert_eq!(marker_of(&dir), second.metadata.name.clone());
    env.wait_event(&t, &uid(&again), "DirectoryReused").await;
    // The other tenant's claim is still waiting, and was given nothing.
    assert_eq!(phase_of(&env, &v, &t).await, "Pending");
}

/// A namespace deleted and made again under the same name (a new UID) is someone else: its claim
/// of the same name does not get the old directory, until an admin annotates the new Namespace
/// with `hostpath-provisioner.kubevirt.io/adopt-directory`.
#[tokio::test(flavor = "multi_thread")]
async fn a_namespace_made_again_under_its_name_gets_the_old_directory_only_when_an_admin_hands_it_over() {
    let env = TestEnv::start("patrenamed", 1).await;
    let node = env.nodes[0].name.clone();
    let class = env.class("named", |c| c.immediate().reclaim_policy("Retain").parameter("pathPattern", PATTERN)).await;
    let ns = testbed::unique_name("patreused");
    let old_uid = create_namespace(&env, &ns).await.metadata.uid.expect("uid");
    claims_in(&env, &ns)
        .create(&PostParams::default(), &fixtures::claim(&ns, "db", &class, "1Mi").provision_on_node(&node).build())
        .await
        .expect("create claim");
    let first = wait_bound_in(&env, &ns, "db").await;
    let first_name = first.metadata.name.clone().expect("name");
    let dir = host_path(&first);
    assert_eq!(dir, env.nodes[0].pool_root.join(format!("{ns}_db")));
    std::fs::write(dir.join("rows"), b"old tenant").unwrap();
    release_and_delete_pv(&env, &ns, "db", &first_name).await;

    // The namespace goes. This control plane runs no namespace controller: the test finalizes
    // it as that controller would once the namespace is empty.
    let namespaces = Api::<Namespace>::all(env.client.clone());
    namespaces.delete(&ns, &Default::default()).await.expect("delete namespace");
    let mut finalized = namespaces.get(&ns).await.expect("get namespace");
    finalized.spec = Some(Default::default());
    namespaces.replace_subresource("finalize", &ns, &PostParams::default(), &finalized).await.expect("finalize");
    testbed::wait_for("namespace gone", TIMEOUT, || async {
        anyhow::Ok(namespaces.get_opt(&ns).await?.is_none().then_some(()))
    })
    .await
    .expect("namespace gone");

    // Made again under the same name: a new UID, and its claim `db` is refused.
    let new_uid = create_namespace(&env, &ns).await.metadata.uid.expect("uid");
    assert_ne!(new_uid, old_uid);
    let again = claims_in(&env, &ns)
        .create(&PostParams::default(), &fixtures::claim(&ns, "db", &class, "1Mi").provision_on_node(&node).build())
        .await
        .expect("create claim");
    let note = env.wait_event(&ns, &uid(&again), "ProvisioningFailed").await;
    assert!(
        note.contains(&format!("namespace uid {old_uid}")) && note.contains(&format!("namespace uid {new_uid}")),
        "{note}"
    );
    assert_eq!(phase_of(&env, &ns, "db").await, "Pending");
    assert_eq!(std::fs::read(dir.join("rows")).unwrap(), b"old tenant");
    assert_eq!(marker_of(&dir).as_deref(), Some(first_name.as_str()));

    // An annotation on the claim is not enough: the claim's tenant could name anyone's directory.
    let on_claim = serde_json::json!({"metadata": {"annotations": {ADOPT_DIRECTORY: format!("{ns}_db")}}});
    claims_in(&env, &ns).patch("db", &PatchParams::default(), &Patch::Merge(&on_claim)).await.expect("annotate");
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(phase_of(&env, &ns, "db").await, "Pending");
    assert_eq!(marker_of(&dir).as_deref(), Some(first_name.as_str()));

    // The admin hands it over on the Namespace (which the tenant cannot write).
    let handed = serde_json::json!({"metadata": {"annotations": {ADOPT_DIRECTORY: format!("{ns}_db")}}});
    namespaces.patch(&ns, &PatchParams::default(), &Patch::Merge(&handed)).await.expect("annotate the namespace");
    let nudge = serde_json::json!({"metadata": {"annotations": {"hpp-test/nudge": "1"}}});
    claims_in(&env, &ns).patch("db", &PatchParams::default(), &Patch::Merge(&nudge)).await.expect("nudge");
    let second = wait_bound_in(&env, &ns, "db").await;
    assert_eq!(host_path(&second), dir);
    assert_eq!(std::fs::read(dir.join("rows")).unwrap(), b"old tenant", "handed over with its data");
    assert_eq!(marker_of(&dir), second.metadata.name.clone());
    let record = xattr_of(&dir, OWNER).expect("owner record");
    assert!(record.contains(&format!("namespace-uid={new_uid}")), "now recorded for the new namespace: {record}");
    let note = env.wait_event(&ns, &uid(&again), "DirectoryReused").await;
    assert!(note.contains(ADOPT_DIRECTORY) && note.contains(&old_uid), "{note}");
}

/// A directory of the earlier version (its marker names its PV, it records no owner) is given
/// its record when its node starts, read from the PV's claim and the namespace that still is
/// the one the PV was made in: after the upgrade, the claim deleted under Retain and made again
/// gets its data back without an admin, as before.
#[tokio::test(flavor = "multi_thread")]
async fn a_directory_of_the_earlier_version_is_recorded_at_start_and_goes_back_to_its_claim() {
    let mut env = TestEnv::start("pattern-upgrade", 1).await;
    let node = env.nodes[0].name.clone();
    let class = env.class("named", |c| c.immediate().reclaim_policy("Retain").parameter("pathPattern", PATTERN)).await;
    env.create_claim(fixtures::claim(&env.ns, "db", &class, "1Mi").provision_on_node(&node)).await;
    let first = env.wait_bound("db").await;
    let first_name = first.metadata.name.clone().expect("name");
    let dir = host_path(&first);
    std::fs::write(dir.join("table"), b"rows").unwrap();
    let recorded = xattr_of(&dir, OWNER).expect("recorded at creation");
    // As the earlier version left it: the marker alone.
    rustix::fs::removexattr(&dir, OWNER).expect("remove the record");
    assert_eq!(xattr_of(&dir, OWNER), None);
    env.nodes[0].provisioner.restart().expect("restart");
    testbed::wait_for("the record written at start", TIMEOUT, || async {
        anyhow::Ok(xattr_of(&dir, OWNER).filter(|r| *r == recorded))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    release_and_delete_pv(&env, &env.ns, "db", &first_name).await;
    env.create_claim(fixtures::claim(&env.ns, "db", &class, "1Mi").provision_on_node(&node)).await;
    let second = env.wait_bound("db").await;
    assert_eq!(host_path(&second), dir, "the same directory");
    assert_eq!(std::fs::read(dir.join("table")).unwrap(), b"rows", "with its data");
}

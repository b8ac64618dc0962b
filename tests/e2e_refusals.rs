//! End-to-end: no refusal without a word on the PV side. A shared or every-node PV whose
//! directory is in no pool a live node serves, one whose directory is in a served pool but is no
//! volume of it (the pool's root, or deeper than directly under it), and an expansion the API
//! server accepts but no disk can hold, are each declined with an event that says why and what
//! to change.

mod common;

use common::*;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams, PostParams};
use testbed::fixtures;

const TOPOLOGY_LABEL: &str = "hostpath-provisioner.kubevirt.io/topology";

/// A released PV of `topology` at `path`, as this test's provisioner would have written it,
/// whose claim is gone (the PV controller marks it Released).
async fn released_pv(env: &TestEnv, name: &str, topology: &str, path: &str) -> String {
    let mut pv = fixtures::host_path_volume(name, path, "1Mi")
        .provisioned_by(&env.provisioner)
        .label(TOPOLOGY_LABEL, topology)
        .build();
    pv.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(env.ns.clone()),
        name: Some(format!("{name}-gone")),
        uid: Some("00000000-0000-0000-0000-00000000dead".into()),
        ..Default::default()
    });
    let created = env.pvs().create(&PostParams::default(), &pv).await.expect("create PV");
    env.wait_pv_phase(name, "Released").await;
    created.metadata.uid.expect("uid")
}

#[tokio::test(flavor = "multi_thread")]
async fn shared_and_every_node_volumes_in_no_served_pool_are_refused_with_a_reason() {
    let mut env = TestEnv::start("notserved", 0).await;
    env.own_provisioner();
    env.add_node(&format!("{}-1", env.group), &|spec| spec).await;
    let elsewhere = env.cp.temp_dir().join(format!("{}-unserved", env.group));
    let parent = elsewhere.display().to_string();
    // PVs named as this provisioner names them, so that the path is all that is wrong.
    for (i, topology) in ["shared", "everyNode"].into_iter().enumerate() {
        let name = volume_name(i);
        let dir = name.clone();
        std::fs::create_dir_all(elsewhere.join(&dir)).expect("mkdir");
        std::fs::write(elsewhere.join(&dir).join("data"), b"keep").expect("write");
        let uid = released_pv(&env, &name, topology, &format!("{parent}/{dir}")).await;
        let note = env.wait_event("default", &uid, "VolumeNotServed").await;
        assert!(
            note.contains(&parent) && note.contains("--pool NAME="),
            "{topology}: says which pool to serve: {note}"
        );
        assert!(
            note.contains(&env.nodes[0].pool_root.display().to_string()),
            "{topology}: names the served roots: {note}"
        );
        assert!(env.pvs().get_opt(&name).await.expect("get").is_some(), "{topology}: the PV stays");
        assert_eq!(std::fs::read(elsewhere.join(&dir).join("data")).ok().as_deref(), Some(&b"keep"[..]), "{topology}");
        env.pvs().delete(&name, &Default::default()).await.expect("clean up");
    }
    // Next to the served pool root: its parent holds that root, and serving it would nest the
    // pools, so no pool is advised.
    let pool = env.nodes[0].pool_root.clone();
    let holder = pool.parent().expect("the pool root has a parent").display().to_string();
    let name = volume_name(2);
    let uid = released_pv(&env, &name, "shared", &format!("{holder}/{name}")).await;
    let note = env.wait_event("default", &uid, "VolumeNotServed").await;
    assert!(note.contains("no pool can be configured for it") && note.contains(&holder), "says why: {note}");
    assert!(!note.contains("--pool"), "no pool advised: {note}");
    env.pvs().delete(&name, &Default::default()).await.expect("clean up");
}

/// A PV name as this provisioner makes them (`pvc-<uid>`), unique to this run.
fn volume_name(i: usize) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("pvc-{:08x}-0000-4000-8000-{:012x}", nanos as u32, i)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pv_at_a_served_pool_root_or_deeper_inside_it_is_refused_as_no_volume_of_that_pool() {
    let mut env = TestEnv::start("notavolume", 0).await;
    env.own_provisioner();
    // Two nodes with pools at different paths: the node speaking for a PV may be the one that
    // serves its pool or the other one; both must say the same.
    for i in 1..=2 {
        env.add_node(&format!("{}-{i}", env.group), &|spec| spec).await;
    }
    let pool = env.nodes[0].pool_root.clone();
    let root = pool.display().to_string();
    std::fs::write(pool.join("keep"), b"pool data").expect("write");
    let nested_dir = pool.join("sub");
    let cases = [
        ("shared", root.clone(), "is the root of pool legacy, not a volume directory in it".to_owned()),
        ("everyNode", root.clone(), "is the root of pool legacy, not a volume directory in it".to_owned()),
        ("shared", String::new(), format!("is inside pool legacy ({root}) but not directly under its root")),
        ("everyNode", String::new(), format!("is inside pool legacy ({root}) but not directly under its root")),
    ];
    for (i, (topology, path, says)) in cases.into_iter().enumerate() {
        let name = volume_name(i);
        let path = if path.is_empty() {
            std::fs::create_dir_all(nested_dir.join(&name)).expect("mkdir");
            std::fs::write(nested_dir.join(&name).join("data"), b"keep").expect("write");
            nested_dir.join(&name).display().to_string()
        } else {
            path
        };
        let uid = released_pv(&env, &name, topology, &path).await;
        let note = env.wait_event("default", &uid, "VolumeFailedDelete").await;
        assert!(note.contains(&path) && note.contains(&says), "{topology} {path}: says why: {note}");
        assert!(
            !note.contains("--pool") && !note.contains("in no pool"),
            "{topology} {path}: no advice to serve it: {note}"
        );
        assert_eq!(
            env.our_event("default", &uid, "VolumeNotServed").await,
            None,
            "{topology} {path}: not called unserved"
        );
        assert!(env.pvs().get_opt(&name).await.expect("get").is_some(), "{topology}: the PV stays");
        env.pvs().delete(&name, &Default::default()).await.expect("clean up");
    }
    assert_eq!(std::fs::read(pool.join("keep")).ok().as_deref(), Some(&b"pool data"[..]), "the pool is untouched");
    for entry in std::fs::read_dir(&nested_dir).expect("nested directory stays") {
        let dir = entry.expect("entry").path();
        assert_eq!(std::fs::read(dir.join("data")).ok().as_deref(), Some(&b"keep"[..]), "{}", dir.display());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_expansion_the_api_accepts_but_no_disk_holds_is_refused_on_the_claim() {
    let env = TestEnv::start("hugegrow", 1).await;
    let class = env.class("grow", |c| c.immediate().allow_expansion()).await;
    let node = env.nodes[0].name.clone();
    let claim = env.create_claim(fixtures::claim(&env.ns, "growing", &class, "1Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("growing").await;
    let patch = serde_json::json!({ "spec": { "resources": { "requests": { "storage": "1e30" } } } });
    env.claims().patch("growing", &PatchParams::default(), &Patch::Merge(patch)).await.expect("the API accepts it");
    let note = env.wait_event(&env.ns, &uid(&claim), "VolumeResizeFailed").await;
    assert!(note.contains("1e30") && note.contains("too large"), "says what is wrong: {note}");
    let pv = env.pvs().get(pv.metadata.name.as_deref().unwrap()).await.expect("PV");
    assert_eq!(pv.spec.unwrap().capacity.unwrap()["storage"].0, "1Mi", "nothing changed");
    // The claim is deleted as usual afterwards, and its volume goes.
    env.delete_claim("growing").await;
    env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
}

/// Every refusal reaches its object whatever the length of the object's name: a claim named with
/// the 253 characters a name may have is refused for a directory name over 255 bytes
/// (`pathPattern`) and for an unknown class parameter, each with a Warning Event on it. (kube's
/// recorder would name the Event `<claim name>.<time>`, over the API server's limit, and the
/// refusal would reach the log only.)
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_with_the_longest_name_still_gets_its_refusal_as_an_event() {
    let env = TestEnv::start("longname", 1).await;
    let node = env.nodes[0].name.clone();
    let pattern = env.class("pattern", |c| c.immediate().parameter("pathPattern", "{namespace}_{claim}")).await;
    let typo = env.class("typo", |c| c.immediate().parameter("storagepool", "legacy")).await;
    for (class, prefix, says) in [(&pattern, "a", "255"), (&typo, "b", "storagepool")] {
        let name = format!("{prefix}{}", "x".repeat(252));
        assert_eq!(name.len(), 253);
        let claim = env.create_claim(fixtures::claim(&env.ns, &name, class, "1Mi").provision_on_node(&node)).await;
        let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
        assert!(note.contains(says), "says why: {note}");
        let claim = env.claims().get(&name).await.expect("claim");
        assert_eq!(claim.status.and_then(|s| s.phase).as_deref(), Some("Pending"), "refused, not provisioned");
        env.delete_claim(&name).await;
    }
}

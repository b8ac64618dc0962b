//! End-to-end: storage pools, and the two shapes without an owning node: `shared` (one
//! directory on a filesystem every node mounts at the same path, the torchbox shape) and
//! `everyNode` (a directory of the same name on every node, the kubeboost shape).
//!
//! Simulated nodes all run on this host, so a shared pool is one directory given to every node's
//! provisioner, and an every-node pool is one path under which each provisioner sees a directory
//! of its own (a bind mount in a private mount namespace per process).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use common::*;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use testbed::{ProvisionerSpec, fixtures};

fn host_path(pv: &PersistentVolume) -> String {
    pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone()).expect("hostPath")
}

/// A directory of this test outside every node's pool.
fn test_dir(env: &TestEnv, name: &str) -> PathBuf {
    let dir = env.cp.temp_dir().join(format!("{}-{name}", env.group));
    std::fs::create_dir_all(&dir).expect("test dir");
    dir
}

async fn wait_scheduled(env: &TestEnv, pod: &str) -> String {
    testbed::wait_for(&format!("pod {pod} scheduled"), TIMEOUT, || async {
        anyhow::Ok(env.pods().get(pod).await?.spec.and_then(|s| s.node_name))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()))
}

async fn wait_until_path(path: &Path, exists: bool) {
    testbed::wait_for(&format!("{} {}", path.display(), if exists { "exists" } else { "gone" }), TIMEOUT, || async {
        anyhow::Ok((path.exists() == exists).then_some(()))
    })
    .await
    .expect("path state");
}

/// Reporting nodes of the events with `reason` about the object `uid`.
async fn reporters(env: &TestEnv, uid: &str, reason: &str) -> BTreeSet<String> {
    env.events_for(&env.ns, uid)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.reporting_instance)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn each_class_lands_in_its_pool_and_a_missing_pool_goes_back_to_the_scheduler() {
    let mut env = TestEnv::start("pools", 0).await;
    env.own_provisioner();
    let ssd = test_dir(&env, "ssd");
    let with_ssd = format!("{}-1", env.group);
    let ssd_arg = format!("ssd={}", ssd.display());
    env.add_node(&with_ssd, &move |spec: ProvisionerSpec| spec.arg("--pool").arg(ssd_arg.clone())).await;
    let without = format!("{}-2", env.group);
    env.add_node(&without, &|spec| spec).await;
    let also_without = format!("{}-3", env.group);
    env.add_node(&also_without, &|spec| spec).await;
    let legacy_class = env.class("legacy", |c| c).await;
    let ssd_class = env.class("ssd", |c| c.parameter("storagePool", "ssd")).await;

    // Two claims on the node with both pools: each in its own pool.
    for (claim, class) in [("in-legacy", &legacy_class), ("in-ssd", &ssd_class)] {
        env.create_claim(fixtures::claim(&env.ns, claim, class, "8Mi")).await;
        let pod = fixtures::pod_using_claim(&env.ns, claim, claim).on_hostname(&with_ssd).build();
        env.pods().create(&PostParams::default(), &pod).await.expect("pod");
    }
    let legacy_pv = env.wait_bound("in-legacy").await;
    let ssd_pv = env.wait_bound("in-ssd").await;
    let legacy_root = env.node(&with_ssd).pool_root.clone();
    assert_eq!(Path::new(&host_path(&legacy_pv)).parent(), Some(legacy_root.as_path()));
    assert_eq!(Path::new(&host_path(&ssd_pv)).parent(), Some(ssd.as_path()));
    assert!(Path::new(&host_path(&ssd_pv)).is_dir());

    // A node without the pool gets the claim first (the one with it is cordoned), gives it back
    // with an event naming its pools, and the claim lands where the pool is.
    env.set_unschedulable(&with_ssd, true).await;
    env.set_unschedulable(&also_without, true).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "wants-ssd", &ssd_class, "8Mi")).await;
    env.create_pod("wants-ssd", "wants-ssd").await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("ssd") && note.contains("legacy") && note.contains(&without), "{note}");
    assert!(note.contains("volume.kubernetes.io/selected-node"), "says it was handed back: {note}");
    env.set_unschedulable(&without, true).await;
    env.set_unschedulable(&with_ssd, false).await;
    let pv = env.wait_bound("wants-ssd").await;
    assert_eq!(Path::new(&host_path(&pv)).parent(), Some(ssd.as_path()));
    for node in [&without, &also_without] {
        assert!(entries(&env.node(node).pool_root).is_empty(), "nothing left on {node}, which lacks the pool");
    }

    for claim in ["in-legacy", "in-ssd", "wants-ssd"] {
        env.delete_pod(claim).await;
        env.delete_claim(claim).await;
    }
    for pv in [&legacy_pv, &ssd_pv, &pv] {
        env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    }
    wait_trash_empty(&ssd).await;
    assert!(entries(&ssd).is_empty(), "{:?}", entries(&ssd));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_class_asking_for_shared_on_a_local_pool_is_refused_with_the_reason() {
    let env = TestEnv::start("mismatch", 1).await;
    let class = env.class("shared-on-local", |c| c.parameter("topology", "shared")).await;
    let node = env.nodes[0].name.clone();
    let claim = env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("topology shared") && note.contains("node-local pool"), "{note}");
    assert!(entries(&env.nodes[0].pool_root).is_empty());
}

/// Three nodes sharing one pool directory (the network filesystem).
async fn shared_env(test: &str, nodes: usize) -> (TestEnv, PathBuf) {
    let mut env = TestEnv::start(test, 0).await;
    env.own_provisioner();
    let shared = test_dir(&env, "nfs");
    for i in 1..=nodes {
        let arg = format!("nfs={},shared", shared.display());
        env.add_node(&format!("{}-{i}", env.group), &move |spec: ProvisionerSpec| spec.arg("--pool").arg(arg.clone()))
            .await;
    }
    (env, shared)
}

#[tokio::test(flavor = "multi_thread")]
async fn shared_volumes_are_made_and_removed_once_even_when_a_node_dies_mid_batch() {
    let (mut env, shared) = shared_env("shared", 3).await;
    let immediate =
        env.class("imm", |c| c.immediate().parameter("storagePool", "nfs").parameter("topology", "shared")).await;
    let wffc = env.class("wffc", |c| c.parameter("storagePool", "nfs").parameter("topology", "shared")).await;
    let modes = |i: usize| if i.is_multiple_of(2) { "ReadWriteMany" } else { "ReadWriteOnce" };
    // "The normal case": every node's view of who is alive includes every node. A view is reused
    // for up to a quarter of the lease duration, so a node that joined just now may be missing
    // from another's view for that long (two nodes would then both act, safely).
    tokio::time::sleep(std::time::Duration::from_secs(u64::from(LEASE_SECONDS) / 4 + 1)).await;
    let mut claims: Vec<PersistentVolumeClaim> = Vec::new();

    // 20 WaitForFirstConsumer claims, each used by a pod: the chosen node makes the volume.
    for i in 0..20 {
        let name = format!("w{i}");
        let claim = fixtures::claim(&env.ns, &name, &wffc, "1Mi").access_modes(&[modes(i)]);
        claims.push(env.create_claim(claim).await);
        env.create_pod(&name, &name).await;
    }
    // 15 Immediate claims: no node is named; one live node makes each.
    for i in 0..15 {
        let claim = fixtures::claim(&env.ns, &format!("i{i}"), &immediate, "1Mi").access_modes(&[modes(i)]);
        claims.push(env.create_claim(claim).await);
    }
    for claim in &claims {
        env.wait_bound(claim.metadata.name.as_deref().unwrap()).await;
    }
    // In the normal case exactly one node acts for each claim.
    for claim in &claims {
        let actors = reporters(&env, &uid(claim), "ProvisioningSucceeded").await;
        assert_eq!(actors.len(), 1, "{}: {actors:?}", claim.metadata.name.as_deref().unwrap());
    }

    // A node dies (SIGKILL: its lease stays until it expires) in the middle of the next batch.
    let dead = env.nodes[0].name.clone();
    for i in 15..30 {
        let claim = fixtures::claim(&env.ns, &format!("i{i}"), &immediate, "1Mi").access_modes(&[modes(i)]);
        claims.push(env.create_claim(claim).await);
        if i == 20 {
            env.node_mut(&dead).provisioner.kill();
        }
    }
    for claim in &claims {
        env.wait_bound(claim.metadata.name.as_deref().unwrap()).await;
    }

    // One PV and one directory per claim, in the shared pool, with no node affinity.
    let uids: BTreeSet<String> = claims.iter().map(uid).collect();
    let pvs: Vec<PersistentVolume> = env
        .pvs()
        .list(&ListParams::default())
        .await
        .expect("list PVs")
        .items
        .into_iter()
        .filter(|pv| {
            pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.namespace.as_deref())
                == Some(env.ns.as_str())
        })
        .collect();
    assert_eq!(pvs.len(), 50, "one PV per claim");
    for pv in &pvs {
        let spec = pv.spec.as_ref().unwrap();
        assert!(spec.node_affinity.is_none(), "shared volumes are not pinned");
        assert_eq!(Path::new(&host_path(pv)).parent(), Some(shared.as_path()));
    }
    let dirs = entries(&shared);
    let expected: BTreeSet<String> = uids.iter().map(|u| format!("pvc-{u}")).collect();
    assert_eq!(dirs, expected, "exactly one directory per claim");
    for node in &env.nodes {
        assert!(entries(&node.pool_root).is_empty(), "nothing in {}'s local pool", node.name);
    }
    let rwx = pvs
        .iter()
        .filter(|pv| pv.spec.as_ref().unwrap().access_modes.as_deref() == Some(&["ReadWriteMany".to_owned()][..]))
        .count();
    assert_eq!(rwx, 25);

    // Delete everything while the dead node is still dead: the others take over its share.
    for claim in &claims {
        let name = claim.metadata.name.as_deref().unwrap();
        if name.starts_with('w') {
            env.delete_pod(name).await;
        }
        env.delete_claim(name).await;
    }
    for pv in &pvs {
        env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    }
    wait_trash_empty(&shared).await;
    assert!(entries(&shared).is_empty(), "nothing left: {:?}", entries(&shared));

    // The node comes back to an empty pool and changes nothing.
    env.node_mut(&dead).provisioner.restart().expect("restart");
    env.node_mut(&dead).provisioner.wait_ready(TIMEOUT).await.expect("ready");
    assert!(entries(&shared).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_torchbox_shaped_volume_on_a_shared_pool_is_deleted() {
    let (env, shared) = shared_env("torchbox", 2).await;
    // A class nobody provisions from (Immediate, node topology, no node named): the PV is made
    // by hand as the torchbox provisioner made them: <pvDir>/<pv name>, no node affinity.
    let class = env.class("imm", |c| c.immediate()).await;
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Gi").access_modes(&["ReadWriteMany"])).await;
    let name = format!("pvc-{}", uid(&claim));
    let dir = shared.join(&name);
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/file"), b"data").unwrap();
    let outside = test_dir(&env, "outside");
    std::fs::write(outside.join("keep"), b"keep").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("link-out")).unwrap();
    let pv = fixtures::host_path_volume(&name, &dir.display().to_string(), "1Gi")
        .provisioned_by(&env.provisioner)
        .bound_to(&claim)
        .build();
    let mut pv = pv;
    pv.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
    env.pvs().create(&PostParams::default(), &pv).await.expect("create PV");
    env.wait_bound("data").await;
    env.delete_claim("data").await;
    env.wait_pv_gone(&name).await;
    wait_until_path(&dir, false).await;
    wait_trash_empty(&shared).await;
    assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"keep", "the symlink was not followed");
}

/// Nodes whose `legacy` pool is the same path everywhere, each seeing its own directory there.
struct EveryNodeEnv {
    env: TestEnv,
    /// The path every node's pool has.
    common: PathBuf,
}

impl EveryNodeEnv {
    async fn start(test: &str, nodes: usize) -> EveryNodeEnv {
        let mut env = TestEnv::start(test, 0).await;
        env.own_provisioner();
        let common = test_dir(&env, "pool");
        let mut this = EveryNodeEnv { env, common };
        for i in 1..=nodes {
            this.add_node(i).await;
        }
        this
    }

    async fn add_node(&mut self, i: usize) {
        let name = format!("{}-{i}", self.env.group);
        let own = testbed::pool_root_for(self.env.cp, &name);
        let common = self.common.clone();
        self.env
            .add_node(&name, &move |mut spec: ProvisionerSpec| {
                spec.pool_root = common.clone();
                spec.private_mount(own.clone(), common.clone())
            })
            .await;
    }

    /// What node `i` sees under the common path.
    fn copy(&self, i: usize, dir: &str) -> PathBuf {
        self.env.nodes[i - 1].pool_root.join(dir)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_node_volume_reaches_every_node_late_joiners_and_returning_ones() {
    let mut e = EveryNodeEnv::start("every", 3).await;
    let class = e.env.class("every", |c| c.immediate().parameter("topology", "everyNode")).await;
    let claim =
        e.env.create_claim(fixtures::claim(&e.env.ns, "data", &class, "1Mi").access_modes(&["ReadWriteMany"])).await;
    let pv = e.env.wait_bound("data").await;
    let dir = format!("pvc-{}", uid(&claim));
    assert_eq!(host_path(&pv), e.common.join(&dir).display().to_string());
    assert!(pv.spec.as_ref().unwrap().node_affinity.is_none());

    // A pod on each node (a DaemonSet's shape): all schedule, each node has its own directory.
    let names: Vec<String> = e.env.nodes.iter().map(|n| n.name.clone()).collect();
    for name in &names {
        let pod = fixtures::pod_using_claim(&e.env.ns, name, "data").on_hostname(name).build();
        e.env.pods().create(&PostParams::default(), &pod).await.expect("pod");
    }
    for name in &names {
        assert_eq!(&wait_scheduled(&e.env, name).await, name);
    }
    for i in 1..=3 {
        wait_until_path(&e.copy(i, &dir), true).await;
        std::fs::write(e.copy(i, &dir).join("written-on"), format!("node {i}")).unwrap();
    }
    // Each copy is its own directory.
    assert_eq!(std::fs::read_to_string(e.copy(2, &dir).join("written-on")).unwrap(), "node 2");
    // Something next to the volumes that must survive everything below.
    for i in 1..=3 {
        std::fs::create_dir_all(e.env.nodes[i - 1].pool_root.join("keep-me")).unwrap();
    }

    // A node that joins later gets its copy.
    e.add_node(4).await;
    wait_until_path(&e.copy(4, &dir), true).await;

    // Node 3 is down while the claim is deleted: the others remove their copies, the PV waits
    // for node 3 (its finalizer) and says so; when node 3 returns it removes its copy and the
    // PV goes.
    let down = e.env.nodes[2].name.clone();
    e.env.node_mut(&down).provisioner.terminate();
    for name in &names {
        e.env.delete_pod(name).await;
    }
    e.env.delete_claim("data").await;
    for i in [1, 2, 4] {
        wait_until_path(&e.copy(i, &dir), false).await;
    }
    let pv_name = pv.metadata.name.clone().unwrap();
    let note = e.env.wait_event("default", pv.metadata.uid.as_deref().unwrap(), "WaitingForNodes").await;
    assert!(note.contains(&down), "{note}\n{}", e.env.log_tails());
    let held = e.env.pvs().get(&pv_name).await.expect("PV still there while node 3's copy is");
    assert!(held.metadata.deletion_timestamp.is_some());
    assert!(e.copy(3, &dir).is_dir(), "node 3's copy waits for node 3");

    e.env.node_mut(&down).provisioner.restart().expect("restart");
    e.env.wait_pv_gone(&pv_name).await;
    wait_until_path(&e.copy(3, &dir), false).await;
    for i in 1..=4 {
        wait_trash_empty(&e.env.nodes[i - 1].pool_root).await;
    }
    for i in 1..=3 {
        assert!(e.env.nodes[i - 1].pool_root.join("keep-me").is_dir(), "nothing else touched on node {i}");
    }
    assert!(entries(&e.common).is_empty(), "the shared mount point itself is untouched");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kubeboost_shaped_volume_is_removed_from_every_node() {
    let e = EveryNodeEnv::start("kubeboost", 2).await;
    let class = e.env.class("imm", |c| c.immediate()).await;
    let claim =
        e.env.create_claim(fixtures::claim(&e.env.ns, "data", &class, "1Gi").access_modes(&["ReadWriteMany"])).await;
    // The kubeboost build's layout: <namespace>-<claim>-pvc-<uid> on every node, no affinity.
    let dir = format!("{}-data-pvc-{}", e.env.ns, uid(&claim));
    for i in 1..=2 {
        std::fs::create_dir_all(e.copy(i, &dir)).unwrap();
        std::fs::write(e.copy(i, &dir).join("file"), b"data").unwrap();
    }
    let name = format!("pvc-{}", uid(&claim));
    let pv = fixtures::host_path_volume(&name, &e.common.join(&dir).display().to_string(), "1Gi")
        .provisioned_by(&e.env.provisioner)
        .bound_to(&claim)
        .build();
    let mut pv = pv;
    pv.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteMany".into()]);
    e.env.pvs().create(&PostParams::default(), &pv).await.expect("create PV");
    e.env.wait_bound("data").await;
    e.env.delete_claim("data").await;
    e.env.wait_pv_gone(&name).await;
    for i in 1..=2 {
        wait_until_path(&e.copy(i, &dir), false).await;
    }
    let leftovers: BTreeMap<usize, BTreeSet<String>> =
        (1..=2).map(|i| (i, entries(&e.env.nodes[i - 1].pool_root))).collect();
    assert!(leftovers.values().all(BTreeSet::is_empty), "{leftovers:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shared_volume_is_grown_once_by_the_node_the_ranking_picks() {
    let (env, shared) = shared_env("shared-grow", 2).await;
    let class = env
        .class("grow", |c| {
            c.immediate().allow_expansion().parameter("storagePool", "nfs").parameter("topology", "shared")
        })
        .await;
    // Every node's view of the live nodes must include the other, or both would act (safely).
    tokio::time::sleep(std::time::Duration::from_secs(u64::from(LEASE_SECONDS) / 4 + 1)).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "growing", &class, "10Mi")).await;
    let pv = env.wait_bound("growing").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    assert_eq!(Path::new(&host_path(&pv)).parent(), Some(shared.as_path()));

    let patch = serde_json::json!({ "spec": { "resources": { "requests": { "storage": "20Mi" } } } });
    env.claims().patch("growing", &PatchParams::default(), &Patch::Merge(patch)).await.expect("expansion accepted");
    let (pvs, claims) = (env.pvs(), env.claims());
    testbed::wait_for("PV and claim at 20Mi", TIMEOUT, || async {
        let pv = pvs.get(&pv_name).await?.spec.and_then(|s| s.capacity).and_then(|c| c.get("storage").cloned());
        let status = claims.get("growing").await?.status.unwrap_or_default();
        let done = pv.map(|q| q.0) == Some("20Mi".into())
            && status.capacity.and_then(|c| c.get("storage").cloned()).map(|q| q.0) == Some("20Mi".into())
            && status.allocated_resource_statuses.is_none();
        anyhow::Ok(done.then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));

    env.wait_event(&env.ns, &uid(&claim), "VolumeResizeSuccessful").await;
    let resizing = reporters(&env, &uid(&claim), "Resizing").await;
    let succeeded = reporters(&env, &uid(&claim), "VolumeResizeSuccessful").await;
    assert_eq!(resizing.len(), 1, "one node grew it: {resizing:?}");
    assert_eq!(resizing, succeeded, "the node that started it finished it");
    assert!(reporters(&env, &uid(&claim), "VolumeResizeFailed").await.is_empty());

    env.delete_claim("growing").await;
    env.wait_pv_gone(&pv_name).await;
    wait_trash_empty(&shared).await;
    assert!(entries(&shared).is_empty(), "nothing left: {:?}", entries(&shared));
}

//! End-to-end: capacity-aware placement on real (loop-mounted) filesystems that fill up.

mod common;

use common::*;
use kube::api::{Api, ListParams};
use testbed::fixtures;

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_too_big_for_the_chosen_node_goes_back_to_the_scheduler_and_lands_where_there_is_room() {
    let mut env = TestEnv::start("resched", 0).await;
    let (small, big) = (format!("{}-small", env.group), format!("{}-big", env.group));
    let small_disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &small), 32, None);
    env.add_node(&small, &|spec| spec).await;
    env.add_node(&big, &|spec| spec).await;
    let class = env.class("wffc", |c| c).await;

    // Only the small node is schedulable at first, so the scheduler must pick it.
    env.set_unschedulable(&big, true).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "large", &class, "100Mi")).await;
    env.create_pod("app", "large").await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("not enough free space") && note.contains("selected-node"), "{note}");

    // The claim was handed back; once the big node is available it lands there.
    env.set_unschedulable(&small, true).await;
    env.set_unschedulable(&big, false).await;
    let pv = env.wait_bound("large").await;
    let owner = pv.metadata.annotations.unwrap()["kubevirt.io/provisionOnNode"].clone();
    assert_eq!(owner, big);
    let left: Vec<String> = entries(&small_disk.dir).into_iter().filter(|e| e != "lost+found").collect();
    assert!(left.is_empty(), "nothing left on the small node: {left:?}");
    env.nodes[0].provisioner.terminate();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_while_creating_leaves_nothing_behind_and_recovers() {
    let mut env = TestEnv::start("full", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 16, Some(64));
    // Use up every inode: plenty of bytes free, but no directory can be created.
    let mut fillers = Vec::new();
    for i in 0.. {
        let path = disk.dir.join(format!("filler-{i}"));
        if std::fs::write(&path, b"").is_err() {
            break;
        }
        fillers.push(path);
    }
    assert!(!fillers.is_empty());
    env.add_node(&node, &|spec| spec).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "nospace", &class, "1Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.to_lowercase().contains("no space"), "{note}");
    let pvs = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(env.client.clone());
    let name = format!("pvc-{}", uid(&claim));
    assert!(pvs.get_opt(&name).await.unwrap().is_none(), "no PV without a directory");
    assert!(!disk.dir.join(&name).exists(), "no partial directory");

    // Space comes back: the retry (with backoff) provisions the claim.
    for path in fillers.iter().take(4) {
        std::fs::remove_file(path).unwrap();
    }
    env.wait_bound("nospace").await;
    assert!(disk.dir.join(&name).is_dir());
    let _ = pvs.list(&ListParams::default()).await;
    env.nodes[0].provisioner.terminate();
}

//! End-to-end: provisioning and deletion against a real control plane (etcd, kube-apiserver,
//! the PV controllers, kube-scheduler) with provisioner processes as simulated nodes.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;

use common::*;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Patch, PatchParams};
use testbed::fixtures;

fn annotations(pv: &PersistentVolume) -> BTreeMap<String, String> {
    pv.metadata.annotations.clone().unwrap_or_default()
}

fn host_path(pv: &PersistentVolume) -> String {
    pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone()).expect("hostPath")
}

#[tokio::test(flavor = "multi_thread")]
async fn wffc_claim_is_provisioned_on_the_scheduler_chosen_node() {
    let env = TestEnv::start("wffc", 2).await;
    let class = env.class("wffc", |c| c).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "data", &class, "64Mi")).await;
    env.create_pod("app", "data").await;

    let pv = env.wait_bound("data").await;
    let pod = testbed::wait_for("pod scheduled", TIMEOUT, || async {
        anyhow::Ok(env.pods().get("app").await?.spec.and_then(|s| s.node_name))
    })
    .await
    .expect("pod scheduled");
    let chosen = env.node(&pod);
    let other = env.nodes.iter().find(|n| n.name != pod).expect("second node");

    // The PV is shaped as docs/architecture.md, what a provisioned volume looks like says and points at the chosen node.
    let uid = uid(&claim);
    assert_eq!(pv.metadata.name.as_deref(), Some(format!("pvc-{uid}").as_str()));
    let ann = annotations(&pv);
    assert_eq!(ann["pv.kubernetes.io/provisioned-by"], PROVISIONER);
    assert_eq!(ann["hostPathProvisionerIdentity"], PROVISIONER);
    assert_eq!(ann["kubevirt.io/provisionOnNode"], chosen.name);
    assert_eq!(pv.metadata.labels.as_ref().unwrap()["hostpath-provisioner.kubevirt.io/node"], chosen.name);
    assert!(pv.metadata.finalizers.clone().unwrap_or_default().iter().all(|f| f == "kubernetes.io/pv-protection"));
    let spec = pv.spec.clone().unwrap();
    assert_eq!(spec.capacity.unwrap()["storage"].0, "64Mi", "capacity is the request");
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_owned()]));
    assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(spec.mount_options, None);
    assert_eq!(spec.storage_class_name.as_deref(), Some(class.as_str()));
    assert_eq!(spec.claim_ref.as_ref().unwrap().uid.as_deref(), Some(uid.as_str()));
    assert_eq!(spec.host_path.as_ref().unwrap().type_.as_deref(), Some("Directory"));
    let term = &spec.node_affinity.unwrap().required.unwrap().node_selector_terms[0];
    let expr = &term.match_expressions.as_ref().unwrap()[0];
    assert_eq!(
        (expr.key.as_str(), expr.values.clone()),
        ("kubernetes.io/hostname", Some(vec![chosen.hostname.clone()]))
    );

    // The directory exists on the chosen node only, world-writable whatever the umask.
    let dir = chosen.pool_root.join(format!("pvc-{uid}"));
    assert_eq!(host_path(&pv), dir.display().to_string());
    let mode = std::fs::metadata(&dir).expect("volume directory").permissions().mode() & 0o7777;
    assert_eq!(mode, 0o777);
    assert!(entries(&other.pool_root).is_empty(), "the other node created nothing: {:?}", entries(&other.pool_root));

    // Deleting the claim removes the data and the PV.
    std::fs::write(dir.join("file"), b"data").unwrap();
    env.delete_pod("app").await;
    env.delete_claim("data").await;
    env.wait_pv_gone(&format!("pvc-{uid}")).await;
    wait_path_gone(&dir).await;
    wait_trash_empty(&chosen.pool_root).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn provision_on_node_claim_under_immediate_binds_on_that_node() {
    let env = TestEnv::start("pin", 2).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let target = env.nodes[1].name.clone();
    let claim = env.create_claim(fixtures::claim(&env.ns, "pinned", &class, "1Mi").provision_on_node(&target)).await;
    let pv = env.wait_bound("pinned").await;
    assert_eq!(annotations(&pv)["kubevirt.io/provisionOnNode"], target);
    assert!(env.node(&target).pool_root.join(format!("pvc-{}", uid(&claim))).is_dir());
    assert!(entries(&env.nodes[0].pool_root).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn naming_prefix_puts_the_claim_name_in_the_directory() {
    let env = TestEnv::start_with("prefix", 1, |spec| spec.env("USE_NAMING_PREFIX", "TRUE")).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    let claim = env.create_claim(fixtures::claim(&env.ns, "named", &class, "1Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("named").await;
    let dir = env.nodes[0].pool_root.join(format!("named-pvc-{}", uid(&claim)));
    assert_eq!(host_path(&pv), dir.display().to_string());
    assert!(dir.is_dir());
    env.delete_claim("named").await;
    wait_path_gone(&dir).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn retain_keeps_the_volume_and_its_data() {
    let env = TestEnv::start("retain", 1).await;
    let class = env.class("retain", |c| c.immediate().reclaim_policy("Retain")).await;
    let node = env.nodes[0].name.clone();
    let claim = env.create_claim(fixtures::claim(&env.ns, "keep", &class, "1Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("keep").await;
    assert_eq!(pv.spec.as_ref().unwrap().persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
    let dir = env.nodes[0].pool_root.join(format!("pvc-{}", uid(&claim)));
    std::fs::write(dir.join("precious"), b"keep me").unwrap();

    env.delete_claim("keep").await;
    let pv_name = pv.metadata.name.unwrap();
    env.wait_pv_phase(&pv_name, "Released").await;
    // Give the provisioner every chance to (wrongly) act on the Released PV.
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    assert!(env.pvs().get_opt(&pv_name).await.unwrap().is_some(), "Retain keeps the PV");
    assert_eq!(std::fs::read(dir.join("precious")).unwrap(), b"keep me", "Retain keeps the data");
}

#[tokio::test(flavor = "multi_thread")]
async fn unsupported_claims_get_provisioning_failed_with_the_reason() {
    let env = TestEnv::start("unsupported", 1).await;
    let node = env.nodes[0].name.clone();
    let class = env.class("imm", |c| c.immediate()).await;
    let odd_class = env.class("odd", |c| c.immediate().parameter("pvdir", "/etc")).await;
    let torchbox_class = env.class("torchbox", |c| c.immediate().parameter("pvDir", "/etc")).await;
    let mount_class = env.class("mnt", |c| c.immediate().mount_option("noatime")).await;
    let cases = [
        (fixtures::claim(&env.ns, "block", &class, "1Mi").block(), "turn them on with --block-volumes"),
        (fixtures::claim(&env.ns, "rwx", &class, "1Mi").access_modes(&["ReadWriteMany"]), "ReadWriteMany"),
        (fixtures::claim(&env.ns, "selector", &class, "1Mi").selector("a", "b"), "spec.selector"),
        (fixtures::claim(&env.ns, "param", &odd_class, "1Mi"), "unknown parameter \"pvdir\""),
        (fixtures::claim(&env.ns, "pvdir", &torchbox_class, "1Mi"), "the root of a configured shared pool (none"),
        (fixtures::claim(&env.ns, "mountopts", &mount_class, "1Mi"), "sets mountOptions"),
    ];
    for (claim, expected) in cases {
        let claim = env.create_claim(claim.provision_on_node(&node)).await;
        let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
        assert!(note.contains(expected), "{note:?} should mention {expected:?}");
    }
    assert!(entries(&env.nodes[0].pool_root).is_empty(), "nothing created for refused claims");
}

/// Every claim this node declines for its class's parameters, its data source or its size says why
/// and what to change (issue: no refusal without a word).
#[tokio::test(flavor = "multi_thread")]
async fn refused_parameters_data_sources_and_sizes_are_each_explained_on_the_claim() {
    let env = TestEnv::start("refusals", 1).await;
    let node = env.nodes[0].name.clone();
    let class = env.class("imm", |c| c.immediate()).await;
    let topology = env.class("topo", |c| c.immediate().parameter("topology", "everywhere")).await;
    let quota = env.class("quota", |c| c.immediate().parameter("quota", "strict")).await;
    let pool = env.class("pool", |c| c.immediate().parameter("storagePool", "fast")).await;
    let mode = env.class("mode", |c| c.immediate().parameter("mode", "0778")).await;
    let cases = [
        (
            fixtures::claim(&env.ns, "mode", &mode, "1Mi"),
            "mode=\"0778\"; accepted: an octal mode up to 07777, such as 0770 or 2775",
        ),
        (
            fixtures::claim(&env.ns, "topology", &topology, "1Mi"),
            "topology=\"everywhere\"; accepted: node, shared, everyNode",
        ),
        (fixtures::claim(&env.ns, "quota", &quota, "1Mi"), "quota=\"strict\"; accepted: none, enforce"),
        (fixtures::claim(&env.ns, "pool", &pool, "1Mi"), "storage pool \"fast\", which node"),
        (
            fixtures::claim(&env.ns, "snapshot", &class, "1Mi").data_source(
                "snapshot.storage.k8s.io",
                "VolumeSnapshot",
                "s",
            ),
            "have no CSI snapshots; name a HostPathSnapshot",
        ),
        (
            fixtures::claim(&env.ns, "populator", &class, "1Mi").data_source_ref("example.com", "Backup", "b"),
            "needs a volume populator",
        ),
        (fixtures::claim(&env.ns, "huge", &class, "1e30"), "\"1e30\" is too large"),
    ];
    for (claim, expected) in cases {
        let claim = env.create_claim(claim.provision_on_node(&node)).await;
        let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
        assert!(note.contains(expected), "{note:?} should mention {expected:?}");
    }
    assert!(entries(&env.nodes[0].pool_root).is_empty(), "nothing created for refused claims");
}

/// A class's `uid`, `gid` and `mode` make the new directory's owner, group and mode, and the
/// group reaches pods through the PV's `pv.beta.kubernetes.io/gid`.
#[tokio::test(flavor = "multi_thread")]
async fn a_class_gives_its_volumes_their_owner_group_and_mode() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let env = TestEnv::start("ownership", 1).await;
    let node = env.nodes[0].name.clone();
    let owned = env
        .class("owned", |c| c.immediate().parameter("uid", "1000").parameter("gid", "2000").parameter("mode", "2770"))
        .await;
    let plain = env.class("plain", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "owned", &owned, "1Mi").provision_on_node(&node)).await;
    env.create_claim(fixtures::claim(&env.ns, "plain", &plain, "1Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("owned").await;
    let dir =
        std::path::PathBuf::from(pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).expect("hostPath").path.clone());
    let meta = std::fs::metadata(&dir).expect("the volume's directory");
    assert_eq!((meta.uid(), meta.gid(), meta.permissions().mode() & 0o7777), (1000, 2000, 0o2770), "{}", dir.display());
    let annotations = pv.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get("pv.beta.kubernetes.io/gid").map(String::as_str), Some("2000"));
    // Without the parameters: root's, the provisioner's DIR_MODE, no gid annotation.
    let pv = env.wait_bound("plain").await;
    let dir =
        std::path::PathBuf::from(pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).expect("hostPath").path.clone());
    let meta = std::fs::metadata(&dir).expect("the volume's directory");
    assert_eq!((meta.uid(), meta.gid(), meta.permissions().mode() & 0o7777), (0, 0, 0o777), "{}", dir.display());
    assert!(!pv.metadata.annotations.unwrap_or_default().contains_key("pv.beta.kubernetes.io/gid"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_pinned_by_annotation_where_the_cluster_denies_it_is_explained() {
    let env = TestEnv::start_with("pindeny", 1, |spec| spec.arg("--provision-on-node=deny")).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "pinned", &class, "1Mi").provision_on_node(&env.nodes[0].name)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(
        note.contains("kubevirt.io/provisionOnNode is not allowed") && note.contains("WaitForFirstConsumer"),
        "{note}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn immediate_claim_without_node_gets_exactly_one_explanation_from_the_cluster() {
    let env = TestEnv::start("explain", 2).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "orphan", &class, "1Mi")).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "NodeSelectionRequired").await;
    assert!(note.contains("WaitForFirstConsumer") && note.contains("kubevirt.io/provisionOnNode"), "{note}");
    // Every provisioner of the cluster (this test's and the others') has seen the claim by now.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let count = env
        .events_for(&env.ns, &uid(&claim))
        .await
        .iter()
        .filter(|e| e.reason.as_deref() == Some("NodeSelectionRequired"))
        .count();
    assert_eq!(count, 1, "one event for the whole cluster, not one per node");
}

/// Posts an event about `claim` as `controller` would, with `reason` and `note`.
async fn report(
    env: &TestEnv,
    claim: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
    controller: &str,
    reason: &str,
    note: &str,
) {
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let event = Event {
        metadata: kube::api::ObjectMeta { generate_name: Some("test-".into()), ..Default::default() },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        reporting_controller: Some(controller.into()),
        reporting_instance: Some(format!("{controller}-test")),
        action: Some("Provision".into()),
        reason: Some(reason.into()),
        note: Some(note.into()),
        type_: Some("Warning".into()),
        regarding: Some(k8s_openapi::api::core::v1::ObjectReference {
            kind: Some("PersistentVolumeClaim".into()),
            namespace: claim.metadata.namespace.clone(),
            name: claim.metadata.name.clone(),
            uid: claim.metadata.uid.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    kube::Api::<Event>::namespaced(env.client.clone(), &env.ns)
        .create(&kube::api::PostParams::default(), &event)
        .await
        .expect("post event");
}

/// The tests read this provisioner's events: kube-controller-manager reports
/// `ProvisioningFailed` too (a conflict while it saves a claim), and a test that took it for the
/// provisioner's answer passed or failed by chance.
#[tokio::test(flavor = "multi_thread")]
async fn a_test_reading_events_takes_only_the_provisioners_own() {
    let mut env = TestEnv::start("reporter", 0).await;
    env.own_provisioner();
    // A class of this test's provisioner name, which no node runs: nobody answers the claim.
    let class = env.class("quiet", |c| c.immediate()).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "quiet", &class, "1Mi")).await;
    let conflict = "Error saving claim: Operation cannot be fulfilled: the object has been modified";
    report(&env, &claim, "persistentvolume-controller", "ProvisioningFailed", conflict).await;
    let all = env.all_events_for(&env.ns, &uid(&claim)).await;
    assert!(all.iter().any(|e| reporting_controller(e) == "persistentvolume-controller"), "posted: {all:?}");
    assert_eq!(env.our_event(&env.ns, &uid(&claim), "ProvisioningFailed").await, None, "not the provisioner's");
    report(&env, &claim, &env.provisioner.clone(), "ProvisioningFailed", "the provisioner's reason").await;
    assert_eq!(env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await, "the provisioner's reason");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_annotated_later_is_provisioned() {
    // The Go build reacted to annotation changes; so must we (a watch on metadata).
    let env = TestEnv::start("late", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "late", &class, "1Mi")).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let patch = serde_json::json!({"metadata": {"annotations": {"kubevirt.io/provisionOnNode": env.nodes[0].name}}});
    env.claims().patch("late", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    env.wait_bound("late").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_waiting_for_a_node_without_a_provisioner_is_explained_once() {
    let env = TestEnv::start("stranded", 2).await;
    let class = env.class("imm", |c| c.immediate()).await;
    // A typo in the annotation: no provisioner runs on that node.
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "typo", &class, "1Mi").provision_on_node("no-such-node")).await;
    // One that a live node serves gets no such word.
    let served =
        env.create_claim(fixtures::claim(&env.ns, "served", &class, "1Mi").provision_on_node(&env.nodes[1].name)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "NoProvisionerOnNode").await;
    assert!(note.contains("no-such-node") && note.contains("DaemonSet"), "{note}");
    env.wait_bound("served").await;
    // Every node looked (each at least a lease duration); still one event for the cluster.
    tokio::time::sleep(std::time::Duration::from_secs(u64::from(LEASE_SECONDS) + 3)).await;
    let count = |events: Vec<k8s_openapi::api::events::v1::Event>| {
        events.iter().filter(|e| e.reason.as_deref() == Some("NoProvisionerOnNode")).count()
    };
    assert_eq!(count(env.events_for(&env.ns, &uid(&claim)).await), 1);
    assert_eq!(count(env.events_for(&env.ns, &uid(&served)).await), 0);
}

use std::collections::BTreeMap;

use super::*;
use crate::deciding::settings::ProvisionOnNodePolicy;
use crate::test_fixtures::*;

fn interest(claim: ClaimBuilder) -> Interest {
    claim_interest(&claim.build().metadata, &me())
}

fn decide(claim: ClaimBuilder, class: Option<&StorageClass>) -> Decision {
    decide_claim(&claim.build(), class, &me(), &config(), &[])
}

fn wffc() -> StorageClass {
    class("hpp", "WaitForFirstConsumer")
}

fn immediate() -> StorageClass {
    class("hpp", "Immediate")
}

fn provisioned(d: Decision) -> ProvisionPlan {
    match d {
        Decision::Provision(plan) => *plan,
        other => panic!("expected Provision, got {other:?}"),
    }
}

// ---- stage 1: metadata ----

#[test]
fn metadata_provision_on_node_for_us_is_a_candidate() {
    assert_eq!(interest(claim("hpp").on_node(NODE)), Interest::Candidate);
}

#[test]
fn metadata_provision_on_node_for_another_node_wins_over_selected_node() {
    assert_eq!(interest(claim("hpp").on_node(OTHER_NODE).selected(NODE)), Interest::Elsewhere(OTHER_NODE.into()));
}

#[test]
fn metadata_selected_node_with_ga_or_beta_provisioner_key_is_a_candidate() {
    assert_eq!(interest(claim("hpp").selected(NODE)), Interest::Candidate);
    let beta_only = claim("hpp")
        .annotation(crate::keys::SELECTED_NODE, NODE)
        .annotation(crate::keys::STORAGE_PROVISIONER_BETA, PROVISIONER);
    assert_eq!(interest(beta_only), Interest::Candidate);
    let ga_only = claim("hpp")
        .annotation(crate::keys::SELECTED_NODE, NODE)
        .annotation(crate::keys::STORAGE_PROVISIONER, PROVISIONER);
    assert_eq!(interest(ga_only), Interest::Candidate);
}

#[test]
fn metadata_selected_for_another_node_is_that_nodes() {
    assert_eq!(interest(claim("hpp").selected(OTHER_NODE)), Interest::Elsewhere(OTHER_NODE.into()));
}

#[test]
fn metadata_other_provisioner_or_no_annotation_is_ignored() {
    assert_eq!(interest(claim("hpp")), Interest::Ignore);
    let other_elsewhere = claim("hpp")
        .annotation(crate::keys::STORAGE_PROVISIONER, "example.com/other")
        .annotation(crate::keys::SELECTED_NODE, OTHER_NODE);
    assert_eq!(interest(other_elsewhere), Interest::Ignore);
    // Placed on this node: stage 2 reads the class (which says whose it is).
    let other_here = || {
        claim("hpp")
            .annotation(crate::keys::STORAGE_PROVISIONER, "example.com/other")
            .annotation(crate::keys::SELECTED_NODE, NODE)
    };
    assert_eq!(interest(other_here()), Interest::Candidate);
    let mut others = wffc();
    others.provisioner = "example.com/other".into();
    assert_eq!(decide(other_here(), Some(&others)), Decision::Skip(SkipReason::OtherProvisioner));
}

#[test]
fn metadata_immediate_claim_without_node_is_a_candidate_for_the_explanation() {
    assert_eq!(interest(claim("hpp").provisioner_annotations()), Interest::Candidate);
}

#[test]
fn metadata_bound_or_deleting_claims_are_ignored() {
    assert_eq!(interest(claim("hpp").on_node(NODE).annotation(crate::keys::BIND_COMPLETED, "yes")), Interest::Ignore);
    let mut deleting = claim("hpp").on_node(NODE).build();
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
    assert_eq!(claim_interest(&deleting.metadata, &me()), Interest::Ignore);
}

// ---- stage 2: Go unit-test table (isCorrectNodeByBindingMode) ----

#[test]
fn provision_on_node_for_us_under_immediate_provisions() {
    provisioned(decide(claim("hpp").on_node(NODE), Some(&immediate())));
}

#[test]
fn provision_on_node_for_another_node_under_immediate_is_skipped() {
    assert_eq!(decide(claim("hpp").on_node(OTHER_NODE), Some(&immediate())), Decision::Skip(SkipReason::OtherNode));
}

#[test]
fn no_annotations_under_immediate_is_nobodys_and_gets_the_explanation_once_annotated_by_the_pv_controller() {
    assert_eq!(decide(claim("hpp"), Some(&immediate())), Decision::Skip(SkipReason::NotYetSelected));
    assert_eq!(decide(claim("hpp").provisioner_annotations(), Some(&immediate())), Decision::ExplainImmediate);
}

#[test]
fn selected_node_for_us_under_wffc_provisions() {
    let plan = provisioned(decide(claim("hpp").selected(NODE), Some(&wffc())));
    assert_eq!(plan.binding_mode, BindingMode::WaitForFirstConsumer);
    assert!(!plan.pinned_by_annotation);
}

#[test]
fn provision_on_node_for_us_under_wffc_without_selected_node_provisions() {
    let plan = provisioned(decide(claim("hpp").on_node(NODE), Some(&wffc())));
    assert!(plan.pinned_by_annotation);
}

#[test]
fn no_annotations_under_wffc_waits() {
    assert_eq!(decide(claim("hpp"), Some(&wffc())), Decision::Skip(SkipReason::NotYetSelected));
}

#[test]
fn provision_on_node_for_us_wins_over_selected_node_for_another() {
    provisioned(decide(claim("hpp").on_node(NODE).selected(OTHER_NODE), Some(&wffc())));
}

#[test]
fn selected_node_for_us_loses_to_provision_on_node_for_another() {
    // The case the Go test meant to cover but did not (typo in its node name).
    assert_eq!(
        decide(claim("hpp").on_node(OTHER_NODE).selected(NODE), Some(&wffc())),
        Decision::Skip(SkipReason::OtherNode)
    );
}

#[test]
fn selected_node_for_another_node_is_skipped() {
    assert_eq!(decide(claim("hpp").selected(OTHER_NODE), Some(&wffc())), Decision::Skip(SkipReason::OtherNode));
}

#[test]
fn selected_node_alone_is_enough_under_wait_for_first_consumer() {
    // The scheduler's choice, before the PV controller copied the provisioner onto the claim.
    let c = || claim("hpp").annotation(crate::keys::SELECTED_NODE, NODE);
    assert_eq!(interest(c()), Interest::Candidate);
    let plan = provisioned(decide(c(), Some(&wffc())));
    assert_eq!(plan.binding_mode, BindingMode::WaitForFirstConsumer);
    // Under Immediate the PV controller's mark is still what makes a claim ours.
    assert_eq!(decide(c(), Some(&immediate())), Decision::Skip(SkipReason::NotYetSelected));
}

#[test]
fn ga_and_beta_storage_provisioner_keys_are_both_read() {
    for key in [crate::keys::STORAGE_PROVISIONER, crate::keys::STORAGE_PROVISIONER_BETA] {
        let c = claim("hpp").annotation(crate::keys::SELECTED_NODE, NODE).annotation(key, PROVISIONER);
        provisioned(decide(c, Some(&wffc())));
    }
}

// ---- class ----

#[test]
fn bound_claims_are_skipped() {
    let c = claim("hpp").on_node(NODE).spec(|s| s.volume_name = Some("pv-1".into()));
    assert_eq!(decide(c, Some(&wffc())), Decision::Skip(SkipReason::AlreadyBound));
}

#[test]
fn claims_marked_bind_completed_are_skipped_like_stage_one_does() {
    let c = claim("hpp").on_node(NODE).annotation(crate::keys::BIND_COMPLETED, "yes");
    assert_eq!(decide(c, Some(&wffc())), Decision::Skip(SkipReason::AlreadyBound));
}

#[test]
fn claims_without_class_or_with_a_missing_class_are_skipped() {
    let no_class = claim("hpp").on_node(NODE).spec(|s| s.storage_class_name = None);
    assert_eq!(decide(no_class, None), Decision::Skip(SkipReason::NoClass));
    assert_eq!(decide(claim("hpp").on_node(NODE), None), Decision::Skip(SkipReason::ClassNotFound("hpp".into())));
}

#[test]
fn classes_of_other_provisioners_are_skipped_even_with_provision_on_node() {
    let mut other = wffc();
    other.provisioner = "example.com/other".into();
    assert_eq!(decide(claim("hpp").on_node(NODE), Some(&other)), Decision::Skip(SkipReason::OtherProvisioner));
}

#[test]
fn beta_class_annotation_wins_over_spec_class_name() {
    let c = claim("ignored").on_node(NODE).annotation(crate::keys::STORAGE_CLASS_BETA, "hpp").build();
    assert_eq!(claim_class_name(&c), Some("hpp"));
    let plan = provisioned(decide_claim(&c, Some(&wffc()), &me(), &config(), &[]));
    assert_eq!(plan.class_name, "hpp");
}

// ---- unsupported claims ----

#[test]
fn unsupported_claims_are_refused_with_the_reason() {
    type Check = fn(&Refusal) -> bool;
    let cases: Vec<(ClaimBuilder, Check)> = vec![
        (claim("hpp").on_node(NODE).block(), |r| matches!(r, Refusal::Block { .. })),
        (claim("hpp").on_node(NODE).selector(), |r| matches!(r, Refusal::Selector)),
        (
            claim("hpp").on_node(NODE).spec(|s| {
                s.data_source_ref = Some(k8s_openapi::api::core::v1::TypedObjectReference {
                    api_group: Some("snapshot.storage.k8s.io".into()),
                    kind: "VolumeSnapshot".into(),
                    name: "snap".into(),
                    namespace: None,
                })
            }),
            |r| matches!(r, Refusal::DataSource(_)),
        ),
        (
            claim("hpp").on_node(NODE).access_modes(&["ReadWriteMany"]),
            |r| matches!(r, Refusal::AccessMode { mode: m, .. } if m == "ReadWriteMany"),
        ),
        (
            claim("hpp").on_node(NODE).access_modes(&["ReadWriteOnce", "ReadOnlyMany"]),
            |r| matches!(r, Refusal::AccessMode { mode: m, .. } if m == "ReadOnlyMany"),
        ),
        (claim("hpp").on_node(NODE).access_modes(&[]), |r| matches!(r, Refusal::NoAccessModes)),
        (claim("hpp").on_node(NODE).spec(|s| s.resources = None), |r| matches!(r, Refusal::BadRequest(_))),
    ];
    for (c, check) in cases {
        match decide(c, Some(&wffc())) {
            Decision::Refuse(r) => assert!(check(&r), "unexpected refusal {r:?}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}

#[test]
fn a_claim_cloning_another_claim_is_planned_as_a_clone() {
    let plan = provisioned(decide(claim("hpp").on_node(NODE).data_source(), Some(&wffc())));
    assert_eq!(plan.clone_of.as_deref(), Some("src"));
    let plain = provisioned(decide(claim("hpp").on_node(NODE), Some(&wffc())));
    assert_eq!(plain.clone_of, None);
}

#[test]
fn block_refusal_message_starts_as_the_go_builds_and_names_the_setting() {
    let Decision::Refuse(r) = decide(claim("hpp").on_node(NODE).block(), Some(&wffc())) else { panic!() };
    let message = r.to_string();
    assert!(
        message.starts_with("kubevirt.io/hostpath-provisioner does not support block volume provisioning"),
        "{message}"
    );
    assert!(message.contains("turn them on with --block-volumes"), "{message}");
    // Each install path's own switch, so the admin needs no other page.
    for switch in ["config.blockVolumes", "the component block-volumes", "spec.config.blockVolumes"] {
        assert!(message.contains(switch), "{switch}: {message}");
    }
}

fn block_config() -> DecisionConfig {
    DecisionConfig { block_device_dir: Some("/dev/hostpath-provisioner".into()), ..config() }
}

#[test]
fn with_block_volumes_on_a_block_claim_of_a_node_class_is_planned_as_block() {
    let block = claim("hpp").on_node(NODE).block().build();
    let Decision::Provision(plan) = decide_claim(&block, Some(&wffc()), &me(), &block_config(), &[]) else {
        panic!("provisioned")
    };
    assert_eq!(
        plan.block,
        Some(crate::deciding::block::claim::BlockRequest { allocation: crate::deciding::block::Allocation::Sparse })
    );
    let full = class_with("WaitForFirstConsumer", &[("allocation", "full")]);
    let Decision::Provision(plan) = decide_claim(&block, Some(&full), &me(), &block_config(), &[]) else {
        panic!("provisioned")
    };
    assert_eq!(plan.block.map(|b| b.allocation), Some(crate::deciding::block::Allocation::Full));
    // A filesystem claim of the same class ignores the parameter and is no Block volume.
    let plain = claim_of_filesystem();
    let Decision::Provision(plan) = decide_claim(&plain, Some(&full), &me(), &block_config(), &[]) else {
        panic!("provisioned")
    };
    assert_eq!(plan.block, None);
}

fn claim_of_filesystem() -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
    claim("hpp").on_node(NODE).build()
}

#[test]
fn with_block_volumes_on_what_a_block_volume_cannot_be_is_refused() {
    let shared = class_with("WaitForFirstConsumer", &[("topology", "shared"), ("storagePool", "nfs")]);
    let cfg = DecisionConfig { block_device_dir: Some("/dev/hostpath-provisioner".into()), ..pools_config() };
    let block = claim("hpp").on_node(NODE).block().build();
    let Decision::Refuse(refusal) = decide_claim(&block, Some(&shared), &me(), &cfg, &[]) else { panic!("refused") };
    assert!(refusal.to_string().contains("use topology node"), "{refusal}");
    // A clone or a restore is planned (its source's mode is checked by deciding::clone and
    // deciding::snapshot).
    let clone = claim("hpp").on_node(NODE).block().data_source().build();
    let Decision::Provision(plan) = decide_claim(&clone, Some(&wffc()), &me(), &block_config(), &[]) else {
        panic!("a Block clone is planned")
    };
    assert_eq!(plan.clone_of.as_deref(), Some("src"));
    assert!(plan.block.is_some());
    let restore = claim("hpp")
        .on_node(NODE)
        .block()
        .spec(|s| {
            s.data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
                api_group: Some(crate::deciding::snapshot::GROUP.into()),
                kind: crate::deciding::snapshot::KIND.into(),
                name: "snap".into(),
            })
        })
        .build();
    let Decision::Provision(plan) = decide_claim(&restore, Some(&wffc()), &me(), &block_config(), &[]) else {
        panic!("a Block restore is planned")
    };
    assert!(plan.block.is_some());
}

#[test]
fn unknown_class_parameters_are_refused_with_the_known_list() {
    let mut c = wffc();
    c.parameters = Some(BTreeMap::from([("storagepool".to_owned(), "/x".to_owned())]));
    let Decision::Refuse(r) = decide(claim("hpp").on_node(NODE), Some(&c)) else { panic!() };
    assert!(matches!(&r, Refusal::UnknownParameter { key, .. } if key == "storagepool"));
    assert!(r.to_string().contains("storagePool"), "{r}");
}

#[test]
fn storage_pool_parameter_picks_a_configured_pool_or_is_refused() {
    let mut c = wffc();
    c.parameters = Some(BTreeMap::from([("storagePool".to_owned(), "legacy".to_owned())]));
    assert_eq!(provisioned(decide(claim("hpp").on_node(NODE), Some(&c))).pool.name, "legacy");
    c.parameters = Some(BTreeMap::from([("storagePool".to_owned(), "fast".to_owned())]));
    assert!(matches!(decide(claim("hpp").on_node(NODE), Some(&c)), Decision::Refuse(Refusal::UnknownPool { .. })));
}

// ---- plan contents ----

#[test]
fn plan_carries_class_policy_and_claim_modes() {
    let mut c = wffc();
    c.reclaim_policy = Some("Retain".into());
    let plan = provisioned(decide(claim("hpp").on_node(NODE).access_modes(&["ReadWriteOncePod"]), Some(&c)));
    assert_eq!(plan.reclaim_policy, "Retain");
    assert_eq!(plan.access_modes, vec!["ReadWriteOncePod".to_owned()]);
    assert_eq!(plan.pv_name, format!("pvc-{UID}"));
    assert_eq!(plan.dir_name, format!("pvc-{UID}"));
    assert_eq!(plan.request, "1Gi");
    assert_eq!(plan.request_bytes, 1 << 30);
}

#[test]
fn classes_with_mount_options_are_refused_because_hostpath_cannot_use_them() {
    let mut c = wffc();
    c.mount_options = Some(vec!["noatime".into()]);
    assert_eq!(decide(claim("hpp").on_node(NODE), Some(&c)), Decision::Refuse(Refusal::MountOptions("hpp".into())));
    c.mount_options = Some(vec![]);
    provisioned(decide(claim("hpp").on_node(NODE), Some(&c)));
}

#[test]
fn unset_reclaim_policy_means_delete() {
    let mut c = wffc();
    c.reclaim_policy = None;
    assert_eq!(provisioned(decide(claim("hpp").on_node(NODE), Some(&c))).reclaim_policy, "Delete");
}

#[test]
fn naming_prefix_puts_the_claim_name_first() {
    let mut cfg = config();
    cfg.use_naming_prefix = true;
    let plan = provisioned(decide_claim(&claim("hpp").on_node(NODE).build(), Some(&wffc()), &me(), &cfg, &[]));
    assert_eq!(plan.dir_name, format!("data-pvc-{UID}"));
}

#[test]
fn provision_on_node_policy_restricts_who_may_pin_claims() {
    let mut cfg = config();
    cfg.provision_on_node = ProvisionOnNodePolicy::Deny;
    let d = decide_claim(&claim("hpp").on_node(NODE).build(), Some(&wffc()), &me(), &cfg, &[]);
    assert!(matches!(d, Decision::Refuse(Refusal::ProvisionOnNodeNotAllowed(_))));
    // WFFC claims are unaffected.
    provisioned(decide_claim(&claim("hpp").selected(NODE).build(), Some(&wffc()), &me(), &cfg, &[]));
    cfg.provision_on_node = ProvisionOnNodePolicy::Namespaces(vec!["vms".into()]);
    provisioned(decide_claim(&claim("hpp").on_node(NODE).namespace("vms").build(), Some(&wffc()), &me(), &cfg, &[]));
    let d = decide_claim(&claim("hpp").on_node(NODE).build(), Some(&wffc()), &me(), &cfg, &[]);
    assert!(matches!(d, Decision::Refuse(Refusal::ProvisionOnNodeNotAllowed(ns)) if ns == "default"));
}

// ---- pools and topologies ----

use crate::deciding::layout::PoolPath;
use crate::deciding::topology::{LiveNode, PoolKey, Topology};

fn pools_config() -> DecisionConfig {
    DecisionConfig {
        pools: vec![
            PoolPath::local("legacy", "/var/hpvolumes"),
            PoolPath::local("ssd", "/mnt/ssd"),
            PoolPath::shared("nfs", "/mnt/nfs"),
        ],
        ..config()
    }
}

fn class_with(binding: &str, params: &[(&str, &str)]) -> StorageClass {
    let mut c = class("hpp", binding);
    c.parameters = Some(params.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
    c
}

fn live_nodes(names: &[&str], pools: &[PoolKey]) -> Vec<LiveNode> {
    names
        .iter()
        .map(|n| LiveNode { node: (*n).into(), pools: pools.to_vec(), expires_in: std::time::Duration::from_secs(30) })
        .collect()
}

fn decide_with(claim: ClaimBuilder, class: &StorageClass, config: &DecisionConfig, live: &[LiveNode]) -> Decision {
    decide_claim(&claim.build(), Some(class), &me(), config, live)
}

#[test]
fn storage_pool_picks_the_pool_and_legacy_is_the_default() {
    let cfg = pools_config();
    let ssd = class_with("WaitForFirstConsumer", &[("storagePool", "ssd")]);
    let plan = provisioned(decide_with(claim("hpp").selected(NODE), &ssd, &cfg, &[]));
    assert_eq!((plan.pool.name.as_str(), plan.topology), ("ssd", Topology::Node));
    let plain = class_with("WaitForFirstConsumer", &[]);
    assert_eq!(provisioned(decide_with(claim("hpp").selected(NODE), &plain, &cfg, &[])).pool.name, "legacy");
}

#[test]
fn a_pool_this_node_lacks_goes_back_to_the_scheduler_but_is_refused_when_pinned() {
    let cfg = pools_config();
    let hdd = class_with("WaitForFirstConsumer", &[("storagePool", "hdd")]);
    match decide_with(claim("hpp").selected(NODE), &hdd, &cfg, &[]) {
        Decision::HandBack(r @ Refusal::UnknownPool { .. }) => {
            let text = r.to_string();
            assert!(text.contains("hdd") && text.contains("legacy, ssd, nfs") && text.contains(NODE), "{text}");
        }
        other => panic!("expected a hand-back, got {other:?}"),
    }
    match decide_with(claim("hpp").on_node(NODE), &hdd, &cfg, &[]) {
        Decision::Refuse(r @ Refusal::UnknownPool { .. }) => assert!(r.to_string().contains("legacy, ssd, nfs")),
        other => panic!("expected a refusal naming the configured pools, got {other:?}"),
    }
}

#[test]
fn several_pools_without_legacy_need_a_named_pool() {
    let cfg = DecisionConfig {
        pools: vec![PoolPath::local("ssd", "/mnt/ssd"), PoolPath::local("hdd", "/mnt/hdd")],
        default_pool: None,
        ..config()
    };
    let plain = class_with("WaitForFirstConsumer", &[]);
    assert!(matches!(
        decide_with(claim("hpp").selected(NODE), &plain, &cfg, &[]),
        Decision::Refuse(Refusal::NoDefaultPool { .. })
    ));
}

#[test]
fn topology_and_pool_kinds_must_match() {
    let cfg = pools_config();
    let shared_on_local = class_with("WaitForFirstConsumer", &[("storagePool", "ssd"), ("topology", "shared")]);
    let node_on_shared = class_with("WaitForFirstConsumer", &[("storagePool", "nfs")]);
    let every_on_shared = class_with("WaitForFirstConsumer", &[("storagePool", "nfs"), ("topology", "everyNode")]);
    for class in [shared_on_local, node_on_shared, every_on_shared] {
        match decide_with(claim("hpp").selected(NODE), &class, &cfg, &[]) {
            Decision::Refuse(r @ Refusal::TopologyPoolMismatch { .. }) => {
                assert!(r.to_string().contains("topology"), "{r}")
            }
            other => panic!("expected a mismatch refusal, got {other:?}"),
        }
    }
    let bad = class_with("WaitForFirstConsumer", &[("topology", "cluster")]);
    match decide_with(claim("hpp").selected(NODE), &bad, &cfg, &[]) {
        Decision::Refuse(r @ Refusal::BadParameter { .. }) => {
            assert!(r.to_string().contains("node, shared, everyNode"), "{r}")
        }
        other => panic!("expected a bad-parameter refusal, got {other:?}"),
    }
}

#[test]
fn access_modes_follow_the_topology() {
    let cfg = pools_config();
    let nfs = PoolKey::new("nfs", "/mnt/nfs");
    let shared = class_with("WaitForFirstConsumer", &[("storagePool", "nfs"), ("topology", "shared")]);
    let every = class_with("WaitForFirstConsumer", &[("topology", "everyNode")]);
    let node = class_with("WaitForFirstConsumer", &[]);
    let rwx = || claim("hpp").selected(NODE).access_modes(&["ReadWriteMany"]);
    let rox = || claim("hpp").selected(NODE).access_modes(&["ReadOnlyMany"]);
    assert_eq!(
        provisioned(decide_with(rwx(), &shared, &cfg, &live_nodes(&[NODE], std::slice::from_ref(&nfs)))).topology,
        Topology::Shared
    );
    assert!(matches!(decide_with(rox(), &shared, &cfg, &[]), Decision::Provision(_)));
    assert_eq!(provisioned(decide_with(rwx(), &every, &cfg, &[])).topology, Topology::EveryNode);
    assert!(matches!(decide_with(rox(), &every, &cfg, &[]), Decision::Refuse(Refusal::AccessMode { .. })));
    assert!(matches!(decide_with(rwx(), &node, &cfg, &[]), Decision::Refuse(Refusal::AccessMode { .. })));
}

#[test]
fn immediate_shared_claims_are_provisioned_by_exactly_one_live_node() {
    let cfg = pools_config();
    let nfs = PoolKey::new("nfs", "/mnt/nfs");
    let shared = class_with("Immediate", &[("storagePool", "nfs"), ("topology", "shared")]);
    let live = live_nodes(&[NODE, OTHER_NODE, "node-c"], &[nfs]);
    let mut mine = 0;
    for i in 0..60 {
        let uid = format!("0b5c7f8e-6a4d-4e1f-9c2b-{i:012}");
        let c = claim("hpp").provisioner_annotations().access_modes(&["ReadWriteMany"]);
        let c = ClaimBuilder(PersistentVolumeClaim { metadata: ObjectMeta { uid: Some(uid), ..c.0.metadata }, ..c.0 });
        match decide_with(c, &shared, &cfg, &live) {
            Decision::Provision(plan) => {
                mine += 1;
                assert_eq!(plan.topology, Topology::Shared);
            }
            Decision::Skip(SkipReason::ActedOnBy { node, .. }) => assert_ne!(node, NODE),
            other => panic!("{other:?}"),
        }
    }
    assert!(mine > 5 && mine < 40, "about a third of 60: {mine}");
}

#[test]
fn immediate_node_claims_still_get_the_single_explanation() {
    let c = class_with("Immediate", &[]);
    assert_eq!(
        decide_with(claim("hpp").provisioner_annotations(), &c, &pools_config(), &[]),
        Decision::ExplainImmediate
    );
}

#[test]
fn immediate_shared_claim_with_no_node_serving_the_pool_is_explained_by_one_node() {
    let cfg = pools_config();
    let shared = class_with("Immediate", &[("storagePool", "nfs"), ("topology", "shared")]);
    // Nobody advertises the shared pool (this node's is unusable right now).
    let live = live_nodes(&[NODE, OTHER_NODE], &[]);
    let verdicts: Vec<Decision> = [NODE, OTHER_NODE]
        .iter()
        .map(|node| {
            let me = Identity { node: (*node).into(), ..me() };
            decide_claim(&claim("hpp").provisioner_annotations().build(), Some(&shared), &me, &cfg, &live)
        })
        .collect();
    let refusals = verdicts.iter().filter(|d| matches!(d, Decision::Refuse(Refusal::NoNodeServesPool { .. }))).count();
    assert_eq!(refusals, 1, "{verdicts:?}");
}

#[test]
fn torchbox_pv_dir_selects_the_shared_pool_or_is_refused() {
    let cfg = pools_config();
    let torchbox = class_with("Immediate", &[("pvDir", "/mnt/nfs/")]);
    let live = live_nodes(&[NODE], &[PoolKey::new("nfs", "/mnt/nfs")]);
    let plan = provisioned(decide_with(claim("hpp").provisioner_annotations(), &torchbox, &cfg, &live));
    assert_eq!((plan.pool.name.as_str(), plan.topology), ("nfs", Topology::Shared));
    let elsewhere = class_with("Immediate", &[("pvDir", "/ceph/pvs")]);
    match decide_with(claim("hpp").on_node(NODE), &elsewhere, &cfg, &live) {
        Decision::Refuse(r @ Refusal::BadParameter { .. }) => assert!(r.to_string().contains("/mnt/nfs"), "{r}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn wffc_shared_and_every_node_claims_are_made_by_the_selected_node() {
    let cfg = pools_config();
    let every = class_with("WaitForFirstConsumer", &[("topology", "everyNode")]);
    assert!(matches!(decide_with(claim("hpp").selected(NODE), &every, &cfg, &[]), Decision::Provision(_)));
    assert_eq!(
        decide_with(claim("hpp").selected(OTHER_NODE), &every, &cfg, &[]),
        Decision::Skip(SkipReason::OtherNode)
    );
}

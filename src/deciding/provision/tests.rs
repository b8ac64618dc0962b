use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::deciding::capacity::CapacityAccounting;
use crate::deciding::kept_volume::{KeptDirectory, KeptVolume, KeptVolumeFields, KeptVolumeSpec};
use crate::deciding::layout::PoolPath;
use crate::deciding::quota::{FsKind, ProjectQuotaState};
use crate::deciding::refusal::CloneRefusal;
use crate::deciding::settings::PvCapacity;
use crate::deciding::topology::PoolKey;
use crate::test_fixtures::*;

const GIB: u64 = 1 << 30;
const SOURCE_UID: &str = "11111111-2222-3333-4444-555555555555";

fn wffc() -> StorageClass {
    class("hpp", "WaitForFirstConsumer")
}

fn immediate() -> StorageClass {
    class("hpp", "Immediate")
}

fn with_params(mut class: StorageClass, params: &[(&str, &str)]) -> StorageClass {
    class.parameters = Some(params.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
    class
}

fn roomy() -> PoolFacts {
    PoolFacts {
        available_bytes: 100 * GIB,
        total_bytes: 200 * GIB,
        dir_exists: false,
        quota: None,
        promised_bytes: None,
        pattern: None,
        snapshot_here: false,
        snapshot_subvolume: false,
    }
}

fn btrfs_with_quota() -> QuotaFacts {
    QuotaFacts {
        fs: FsKind::Btrfs,
        btrfs_quota_enabled: true,
        project_quota_mounted: false,
        kernel_xfs_quota: false,
        project_quota: ProjectQuotaState::NotAsked,
        cap_sys_admin: true,
    }
}

/// The pool read as `pool` on each root the tests' configurations declare (a root the
/// configuration in use does not declare is passed over, as an undeclared root would be).
fn ready(pool: &PoolFacts) -> PoolState<'static> {
    let roots = ["/var/hpvolumes", "/mnt/nfs"].map(|root| RootFacts { root: root.into(), read: Some(pool.clone()) });
    PoolState::Ready(Box::leak(Box::new(roots)))
}

/// The facts of a claim placed here, its pool read as `pool`, nothing else known.
fn facts<'a>(
    claim: &'a PersistentVolumeClaim,
    class: Option<&'a StorageClass>,
    config: &'a DecisionConfig,
    me: &'a Identity,
    pool: PoolState<'a>,
) -> ClaimFacts<'a> {
    ClaimFacts {
        claim,
        class,
        me,
        config,
        live: &[],
        source: None,
        existing_pv: None,
        pre_bound_pv: None,
        pool,
        restore: None,
    }
}

fn plan(claim: &PersistentVolumeClaim, class: &StorageClass, pool: &PoolFacts) -> ClaimPlan {
    plan_claim(&facts(claim, Some(class), &config(), &me(), ready(pool)))
}

fn provision(plan: ClaimPlan) -> Provision {
    match plan {
        ClaimPlan::Provision(provision) => *provision,
        other => panic!("expected Provision, got {other:?}"),
    }
}

// ---- which facts are read ----

#[test]
fn a_node_class_reads_no_live_nodes_and_a_shared_class_does() {
    let cfg = DecisionConfig {
        pools: vec![PoolPath::local("legacy", "/var/hpvolumes"), PoolPath::shared("nfs", "/mnt/nfs")],
        ..config()
    };
    let claim = claim("hpp").selected(NODE).build();
    let needs = facts_needed(&claim, Some(&wffc()), &me(), &cfg);
    assert!(!needs.live_nodes);
    assert_eq!(needs.pool.as_deref(), Some("legacy"));
    assert_eq!(needs.dir_name.as_deref(), Some(format!("pvc-{UID}").as_str()));
    let shared = with_params(immediate(), &[("storagePool", "nfs"), ("topology", "shared")]);
    assert!(facts_needed(&claim, Some(&shared), &me(), &cfg).live_nodes);
}

#[test]
fn quota_facts_are_read_only_for_an_enforce_class_on_a_pool_of_this_node() {
    let claim = claim("hpp").selected(NODE).build();
    assert!(!facts_needed(&claim, Some(&wffc()), &me(), &config()).quota_facts);
    let enforce = with_params(wffc(), &[("quota", "enforce")]);
    assert!(facts_needed(&claim, Some(&enforce), &me(), &config()).quota_facts);
    let elsewhere = with_params(wffc(), &[("quota", "enforce"), ("storagePool", "fast")]);
    let needs = facts_needed(&claim, Some(&elsewhere), &me(), &config());
    assert!(!needs.quota_facts && needs.pool.is_none(), "{needs:?}");
}

#[test]
fn pre_bound_pvs_are_looked_for_only_while_the_pv_controller_has_not_handed_the_claim_over() {
    let scheduled = claim("hpp").annotation(crate::keys::SELECTED_NODE, NODE).build();
    assert!(facts_needed(&scheduled, Some(&wffc()), &me(), &config()).pre_bound_pvs);
    let handed_over = claim("hpp").selected(NODE).build();
    assert!(!facts_needed(&handed_over, Some(&wffc()), &me(), &config()).pre_bound_pvs);
    let pinned = claim("hpp").on_node(NODE).build();
    assert!(!facts_needed(&pinned, Some(&wffc()), &me(), &config()).pre_bound_pvs);
    assert!(!facts_needed(&pinned, Some(&immediate()), &me(), &config()).pre_bound_pvs);
}

#[test]
fn a_class_of_another_provisioner_needs_nothing() {
    let mut other = wffc();
    other.provisioner = "example.com/other".into();
    let claim = claim("hpp").data_source().selected(NODE).build();
    assert_eq!(facts_needed(&claim, Some(&other), &me(), &config()), FactsNeeded::default());
    assert_eq!(facts_needed(&claim, None, &me(), &config()), FactsNeeded::default());
}

#[test]
fn a_clone_reads_its_source() {
    let claim = claim("hpp").data_source().selected(NODE).build();
    assert_eq!(facts_needed(&claim, Some(&wffc()), &me(), &config()).clone_source.as_deref(), Some("src"));
}

// ---- the plan ----

#[test]
fn a_claim_placed_here_on_a_pool_with_room_gets_a_plain_directory_and_its_request_as_capacity() {
    let claim = claim("hpp").selected(NODE).build();
    let provision = provision(plan(&claim, &wffc(), &roomy()));
    assert_eq!(provision.make, MakeVolume::Plain);
    assert_eq!(provision.capacity, "1Gi");
    assert_eq!(provision.plan.pv_name, format!("pvc-{UID}"));
}

#[test]
fn a_missing_class_is_looked_at_again_later() {
    let claim = claim("hpp").selected(NODE).build();
    let plan = plan_claim(&facts(&claim, None, &config(), &me(), PoolState::Missing));
    assert_eq!(plan, ClaimPlan::LookAgain { why: Later::ClassNotFound("hpp".into()), after: CLASS_RECHECK });
}

#[test]
fn an_immediate_node_claim_naming_no_node_is_explained_once_for_the_cluster() {
    let claim = claim("hpp").provisioner_annotations().build();
    let plan = plan(&claim, &immediate(), &roomy());
    assert_eq!(
        plan,
        ClaimPlan::Explain { explanation: Explanation::NodeSelectionRequired { class: "hpp".into() }, recheck: None }
    );
}

#[test]
fn a_refusal_is_looked_at_again_only_when_a_node_may_start_serving_the_pool() {
    let block = claim("hpp").selected(NODE).block().build();
    assert!(matches!(
        plan(&block, &wffc(), &roomy()),
        ClaimPlan::Refuse { refusal: Refusal::Block { .. }, recheck: None }
    ));
    let shared = with_params(immediate(), &[("storagePool", "nfs"), ("topology", "shared")]);
    let claim = claim("hpp").provisioner_annotations().build();
    let plan = plan(&claim, &shared, &roomy());
    assert!(
        matches!(plan, ClaimPlan::Refuse { refusal: Refusal::NoNodeServesPool { .. }, recheck: Some(NO_NODE_RECHECK) }),
        "{plan:?}"
    );
}

#[test]
fn a_pool_this_node_lacks_under_wffc_goes_back_to_the_scheduler() {
    let claim = claim("hpp").selected(NODE).build();
    let fast = with_params(wffc(), &[("storagePool", "fast")]);
    assert!(matches!(plan(&claim, &fast, &roomy()), ClaimPlan::HandBack { label: "unknown_pool", .. }));
}

#[test]
fn a_pv_pre_bound_to_a_scheduled_claim_is_left_to_the_pv_controller() {
    let claim = claim("hpp").annotation(crate::keys::SELECTED_NODE, NODE).build();
    let pool = roomy();
    let (cfg, me) = (config(), me());
    let class = wffc();
    let mut f = facts(&claim, Some(&class), &cfg, &me, ready(&pool));
    f.pre_bound_pv = Some("static-pv");
    assert_eq!(
        plan_claim(&f),
        ClaimPlan::LookAgain { why: Later::PreBound("static-pv".into()), after: STATIC_RECHECK }
    );
    // Once the PV controller handed the claim to a provisioner, no PV can bind it any more.
    let handed_over = crate::test_fixtures::claim("hpp").selected(NODE).build();
    f.claim = &handed_over;
    assert!(matches!(plan_claim(&f), ClaimPlan::Provision(_)));
}

#[test]
fn the_claims_own_pv_means_done_and_a_pv_of_its_name_bound_elsewhere_is_a_conflict() {
    let claim = claim("hpp").selected(NODE).build();
    let pool = roomy();
    let (cfg, me) = (config(), me());
    let mut mine = pv("/var/hpvolumes/pvc-x", "Bound").build();
    mine.spec.as_mut().expect("spec").claim_ref = Some(KeptClaimRef { uid: Some(UID.into()), ..Default::default() });
    let class = wffc();
    let mut f = facts(&claim, Some(&class), &cfg, &me, ready(&pool));
    f.existing_pv = Some(&mine);
    assert_eq!(plan_claim(&f), ClaimPlan::AlreadyProvisioned);
    let mut theirs = mine.clone();
    theirs.spec.as_mut().expect("spec").claim_ref =
        Some(KeptClaimRef { uid: Some("other".into()), ..Default::default() });
    f.existing_pv = Some(&theirs);
    assert_eq!(
        plan_claim(&f),
        ClaimPlan::Fail(Failure::PvConflict { pv: format!("pvc-{UID}"), other_uid: "other".into() })
    );
    // The existing PV wins over a pool that cannot be read: nothing is to be made.
    f.existing_pv = Some(&mine);
    f.pool = PoolState::Unusable;
    assert_eq!(plan_claim(&f), ClaimPlan::AlreadyProvisioned);
}

#[test]
fn a_pool_that_cannot_be_read_or_is_not_configured_fails_to_be_retried() {
    let claim = claim("hpp").selected(NODE).build();
    let (cfg, me) = (config(), me());
    let class = wffc();
    let f = facts(&claim, Some(&class), &cfg, &me, PoolState::Unusable);
    assert_eq!(plan_claim(&f), ClaimPlan::Fail(Failure::PoolUnusable));
    let f = facts(&claim, Some(&class), &cfg, &me, PoolState::Missing);
    assert_eq!(plan_claim(&f), ClaimPlan::Fail(Failure::UnknownPool("legacy".into())));
}

#[test]
fn short_of_space_a_scheduled_claim_goes_back_to_the_scheduler_and_a_pinned_one_fails() {
    let tight = PoolFacts { available_bytes: GIB / 2, ..roomy() };
    let scheduled = claim("hpp").selected(NODE).build();
    match plan(&scheduled, &wffc(), &tight) {
        ClaimPlan::HandBack { why, label } => {
            assert_eq!(label, "insufficient_space");
            assert!(why.contains("not enough free space in pool legacy on node node-a"), "{why}");
        }
        other => panic!("expected HandBack, got {other:?}"),
    }
    let pinned = claim("hpp").on_node(NODE).build();
    assert!(matches!(plan(&pinned, &wffc(), &tight), ClaimPlan::Fail(Failure::ShortOfSpace(_))));
}

#[test]
fn a_directory_made_by_an_earlier_attempt_is_reused_whatever_the_free_space() {
    let full_but_made = PoolFacts { available_bytes: 0, dir_exists: true, ..roomy() };
    let claim = claim("hpp").selected(NODE).build();
    assert_eq!(provision(plan(&claim, &wffc(), &full_but_made)).make, MakeVolume::Plain);
}

#[test]
fn the_reserve_of_the_pool_wins_over_the_global_one() {
    let claim = claim("hpp").on_node(NODE).build();
    let pool = PoolFacts { available_bytes: 3 * GIB, ..roomy() };
    let me = me();
    let mut cfg = DecisionConfig { reserved_bytes: 2 * GIB + 1, ..config() };
    let class = wffc();
    let f = facts(&claim, Some(&class), &cfg, &me, ready(&pool));
    match plan_claim(&f) {
        ClaimPlan::Fail(Failure::ShortOfSpace(short)) => {
            assert_eq!((short.available, short.reserved), (GIB - 1, 2 * GIB + 1));
        }
        other => panic!("expected ShortOfSpace, got {other:?}"),
    }
    cfg.pools[0].reserve = Some(GIB);
    let f = facts(&claim, Some(&class), &cfg, &me, ready(&pool));
    assert!(matches!(plan_claim(&f), ClaimPlan::Provision(_)));
}

#[test]
fn an_enforce_class_makes_a_limited_volume_where_the_pool_can_and_fails_with_the_reason_where_not() {
    let claim = claim("hpp").selected(NODE).build();
    let enforce = with_params(wffc(), &[("quota", "enforce")]);
    let able = PoolFacts { quota: Some(btrfs_with_quota()), ..roomy() };
    assert_eq!(provision(plan(&claim, &enforce, &able)).make, MakeVolume::BtrfsQuota { limit_bytes: GIB });
    let unable = PoolFacts { quota: Some(QuotaFacts { btrfs_quota_enabled: false, ..btrfs_with_quota() }), ..roomy() };
    match plan(&claim, &enforce, &unable) {
        ClaimPlan::Fail(Failure::QuotaUnsupported(refusal)) => {
            assert!(refusal.missing.contains("btrfs quota enable"), "{refusal}")
        }
        other => panic!("expected QuotaUnsupported, got {other:?}"),
    }
}

#[test]
fn only_a_plain_volume_advertises_the_filesystem_size_under_pv_capacity_filesystem() {
    let claim = claim("hpp").selected(NODE).build();
    let me = me();
    let cfg = DecisionConfig { pv_capacity: PvCapacity::Filesystem, ..config() };
    let plain = roomy();
    let class = wffc();
    let f = facts(&claim, Some(&class), &cfg, &me, ready(&plain));
    assert_eq!(provision(plan_claim(&f)).capacity, "200Gi");
    let enforce = with_params(wffc(), &[("quota", "enforce")]);
    let able = PoolFacts { quota: Some(btrfs_with_quota()), ..roomy() };
    let f = facts(&claim, Some(&enforce), &cfg, &me, ready(&able));
    assert_eq!(provision(plan_claim(&f)).capacity, "1Gi");
}

// ---- clones ----

/// A bound source claim `src` of class `hpp` requesting 1Gi.
fn bound_source() -> PersistentVolumeClaim {
    let mut source = claim("hpp").build();
    source.metadata.name = Some("src".into());
    source.metadata.uid = Some(SOURCE_UID.into());
    source.spec.as_mut().expect("spec").volume_name = Some(format!("pvc-{SOURCE_UID}"));
    source.status = Some(PersistentVolumeClaimStatus { phase: Some("Bound".into()), ..Default::default() });
    source
}

/// Its PV, made by us on `node` in the legacy pool.
fn source_pv(node: &str) -> KeptVolume {
    let name = format!("pvc-{SOURCE_UID}");
    KeptVolume::from(KeptVolumeFields {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        labels: KeptMap::default(),
        annotations: KeptMap::from([
            (crate::keys::PROVISIONED_BY, PROVISIONER),
            (crate::keys::PROVISION_ON_NODE, node),
        ]),
        spec: Some(KeptVolumeSpec {
            claim_ref: Some(KeptClaimRef { uid: Some(SOURCE_UID.into()), ..Default::default() }),
            host_path: Some(KeptDirectory { path: format!("/var/hpvolumes/{name}") }),
            ..Default::default()
        }),
        status: None,
    })
}

fn clone_plan(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    source: Option<&PersistentVolumeClaim>,
    pv: Option<&KeptVolume>,
    is_quota_volume: Option<bool>,
    pool: &PoolFacts,
) -> ClaimPlan {
    let (cfg, me) = (config(), me());
    let mut f = facts(claim, Some(class), &cfg, &me, ready(pool));
    f.source = Some(SourceFacts { name: "src", claim: source, pv, is_quota_volume });
    plan_claim(&f)
}

#[test]
fn a_clone_whose_source_lives_here_copies_its_directory() {
    let claim = claim("hpp").data_source().selected(NODE).build();
    let (source, pv) = (bound_source(), source_pv(NODE));
    let provision = provision(clone_plan(&claim, &wffc(), Some(&source), Some(&pv), None, &roomy()));
    assert_eq!(
        provision.make,
        MakeVolume::Clone {
            source_dir: format!("pvc-{SOURCE_UID}"),
            source_marked_for: None,
            source_claim: "src".into(),
            limit_bytes: None
        }
    );
}

#[test]
fn a_block_clone_of_a_block_source_copies_its_backing_directory_and_of_a_directory_is_refused() {
    let cfg = DecisionConfig { block_device_dir: Some("/dev/hostpath-provisioner".into()), ..config() };
    let me = me();
    let claim = claim("hpp").block().data_source().selected(NODE).build();
    let name = format!("pvc-{SOURCE_UID}");
    let backing_dir = format!("/var/hpvolumes/{name}");
    let block_pv = KeptVolume::from(KeptVolumeFields {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        labels: KeptMap::default(),
        annotations: KeptMap::from([
            (crate::keys::PROVISIONED_BY, PROVISIONER),
            (crate::keys::PROVISION_ON_NODE, NODE),
            (crate::deciding::block::BACKING_DIR_ANNOTATION, backing_dir.as_str()),
        ]),
        spec: Some(KeptVolumeSpec {
            claim_ref: Some(KeptClaimRef { uid: Some(SOURCE_UID.into()), ..Default::default() }),
            local: Some(KeptDirectory { path: format!("/dev/hostpath-provisioner/{name}") }),
            volume_mode: Some("Block".into()),
            ..Default::default()
        }),
        status: None,
    });
    let (source, roomy, class) = (bound_source(), roomy(), wffc());
    let mut f = facts(&claim, Some(&class), &cfg, &me, ready(&roomy));
    f.source = Some(SourceFacts { name: "src", claim: Some(&source), pv: Some(&block_pv), is_quota_volume: None });
    let provision = provision(plan_claim(&f));
    assert!(provision.plan.block.is_some());
    assert!(
        matches!(&provision.make, MakeVolume::Clone { source_dir, limit_bytes: None, .. } if *source_dir == format!("pvc-{SOURCE_UID}")),
        "{provision:?}"
    );
    let directory = source_pv(NODE);
    f.source = Some(SourceFacts { name: "src", claim: Some(&source), pv: Some(&directory), is_quota_volume: None });
    let ClaimPlan::Refuse { refusal, .. } = plan_claim(&f) else { panic!("refused") };
    assert!(refusal.to_string().contains("use volumeMode Filesystem"), "{refusal}");
}

#[test]
fn a_clone_waits_with_a_word_while_its_source_is_missing() {
    let claim = claim("hpp").data_source().selected(NODE).build();
    match clone_plan(&claim, &wffc(), None, None, None, &roomy()) {
        ClaimPlan::WaitForSource(why) => assert!(why.contains("does not exist"), "{why}"),
        other => panic!("expected WaitForSource, got {other:?}"),
    }
}

#[test]
fn a_clone_scheduled_away_from_its_source_goes_back_and_a_pinned_one_is_refused() {
    let (source, pv) = (bound_source(), source_pv(OTHER_NODE));
    let scheduled = claim("hpp").data_source().selected(NODE).build();
    match clone_plan(&scheduled, &wffc(), Some(&source), Some(&pv), None, &roomy()) {
        ClaimPlan::HandBack { why, label } => {
            assert_eq!(label, "clone_wrong_node");
            assert!(why.contains(&format!("lives on node {OTHER_NODE}")), "{why}");
        }
        other => panic!("expected HandBack, got {other:?}"),
    }
    let pinned = claim("hpp").data_source().on_node(NODE).build();
    assert!(matches!(
        clone_plan(&pinned, &wffc(), Some(&source), Some(&pv), None, &roomy()),
        ClaimPlan::Refuse { refusal: Refusal::DataSource(CloneRefusal::PinnedElsewhere { .. }), .. }
    ));
}

#[test]
fn an_immediate_clone_is_made_by_the_node_of_its_source_and_explained_while_the_source_has_no_pv() {
    let claim = claim("hpp").data_source().provisioner_annotations().build();
    let source = bound_source();
    let here = source_pv(NODE);
    assert!(matches!(
        clone_plan(&claim, &immediate(), Some(&source), Some(&here), None, &roomy()),
        ClaimPlan::Provision(_)
    ));
    let there = source_pv(OTHER_NODE);
    assert_eq!(
        clone_plan(&claim, &immediate(), Some(&source), Some(&there), None, &roomy()),
        ClaimPlan::Idle(SkipReason::OtherNode)
    );
    match clone_plan(&claim, &immediate(), None, None, None, &roomy()) {
        ClaimPlan::Explain { explanation: Explanation::CloneSourceNotReady(why), recheck: Some(SOURCE_RECHECK) } => {
            assert!(why.contains("does not exist"), "{why}")
        }
        other => panic!("expected a cluster-wide explanation, got {other:?}"),
    }
}

#[test]
fn an_enforce_clone_of_a_plain_source_is_refused_and_of_a_quota_volume_is_limited() {
    let claim = claim("hpp").data_source().selected(NODE).build();
    let enforce = with_params(wffc(), &[("quota", "enforce")]);
    let (source, pv) = (bound_source(), source_pv(NODE));
    let able = PoolFacts { quota: Some(btrfs_with_quota()), ..roomy() };
    assert!(matches!(
        clone_plan(&claim, &enforce, Some(&source), Some(&pv), Some(false), &able),
        ClaimPlan::Refuse { refusal: Refusal::DataSource(CloneRefusal::SourceWithoutQuota(_)), .. }
    ));
    let provision = provision(clone_plan(&claim, &enforce, Some(&source), Some(&pv), Some(true), &able));
    assert!(matches!(provision.make, MakeVolume::Clone { limit_bytes: Some(GIB), .. }), "{provision:?}");
}

#[test]
fn an_enforce_clone_into_a_project_quota_pool_fails_with_the_clones_path() {
    let claim = claim("hpp").data_source().selected(NODE).build();
    let enforce = with_params(wffc(), &[("quota", "enforce")]);
    let (source, pv) = (bound_source(), source_pv(NODE));
    let xfs = QuotaFacts {
        fs: FsKind::Xfs,
        btrfs_quota_enabled: false,
        project_quota_mounted: true,
        kernel_xfs_quota: true,
        project_quota: ProjectQuotaState::Enforced,
        cap_sys_admin: true,
    };
    let pool = PoolFacts { quota: Some(xfs), ..roomy() };
    assert_eq!(
        clone_plan(&claim, &enforce, Some(&source), Some(&pv), Some(true), &pool),
        ClaimPlan::Fail(Failure::ProjectQuotaClone { path: format!("/var/hpvolumes/pvc-{UID}").into() })
    );
}

#[test]
fn an_immediate_clone_whose_source_node_runs_no_provisioner_is_explained_by_one_node() {
    let claim = claim("hpp").data_source().provisioner_annotations().build();
    let (source, there) = (bound_source(), source_pv("gone-node"));
    let (cfg, pool, class) = (config(), roomy(), immediate());
    let live: Vec<LiveNode> = [NODE, OTHER_NODE]
        .iter()
        .map(|n| LiveNode { node: (*n).into(), pools: vec![], expires_in: std::time::Duration::from_secs(60) })
        .collect();
    let plans: Vec<ClaimPlan> = [NODE, OTHER_NODE]
        .iter()
        .map(|node| {
            let me = Identity {
                provisioner: PROVISIONER.into(),
                node: (*node).into(),
                affinity: Vec::new(),
                capacity_provisioner: None,
            };
            let mut f = facts(&claim, Some(&class), &cfg, &me, ready(&pool));
            f.live = &live;
            f.source = Some(SourceFacts { name: "src", claim: Some(&source), pv: Some(&there), is_quota_volume: None });
            plan_claim(&f)
        })
        .collect();
    let absent = ClaimPlan::Explain {
        explanation: Explanation::CloneSourceNodeAbsent { source: "src".into(), node: "gone-node".into() },
        recheck: Some(SOURCE_NODE_RECHECK),
    };
    assert_eq!(plans.iter().filter(|p| **p == absent).count(), 1, "{plans:?}");
    assert_eq!(plans.iter().filter(|p| **p == ClaimPlan::Idle(SkipReason::OtherNode)).count(), 1, "{plans:?}");
    // Its node alive: that node makes it, the others stay silent.
    let mut with_owner = live.clone();
    with_owner.push(LiveNode {
        node: "gone-node".into(),
        pools: vec![],
        expires_in: std::time::Duration::from_secs(60),
    });
    let me = me();
    let mut f = facts(&claim, Some(&class), &cfg, &me, ready(&pool));
    f.live = &with_owner;
    f.source = Some(SourceFacts { name: "src", claim: Some(&source), pv: Some(&there), is_quota_volume: None });
    assert_eq!(plan_claim(&f), ClaimPlan::Idle(SkipReason::OtherNode));
}

// ---- shared volumes: who acts ----

#[test]
fn a_shared_immediate_claim_is_made_by_one_live_node_and_the_others_look_again() {
    let cfg = DecisionConfig { pools: vec![PoolPath::shared("nfs", "/mnt/nfs")], default_pool: None, ..config() };
    let shared = with_params(immediate(), &[("storagePool", "nfs"), ("topology", "shared")]);
    let claim = claim("hpp").provisioner_annotations().build();
    let key = PoolKey::new("nfs", "/mnt/nfs");
    let live: Vec<LiveNode> = [NODE, OTHER_NODE]
        .iter()
        .map(|n| LiveNode {
            node: (*n).into(),
            pools: vec![key.clone()],
            expires_in: std::time::Duration::from_secs(60),
        })
        .collect();
    let pool = roomy();
    let plans: Vec<ClaimPlan> = [NODE, OTHER_NODE]
        .iter()
        .map(|node| {
            let me = Identity {
                provisioner: PROVISIONER.into(),
                node: (*node).into(),
                affinity: Vec::new(),
                capacity_provisioner: None,
            };
            let mut f = facts(&claim, Some(&shared), &cfg, &me, ready(&pool));
            f.live = &live;
            plan_claim(&f)
        })
        .collect();
    let makers = plans.iter().filter(|p| matches!(p, ClaimPlan::Provision(_))).count();
    let waiters = plans.iter().filter(|p| matches!(p, ClaimPlan::LookAgain { why: Later::ActedOnBy(_), .. })).count();
    assert_eq!((makers, waiters), (1, 1), "{plans:?}");
}

#[test]
fn a_directory_is_undone_only_when_made_now_refused_by_the_api_and_not_shared() {
    for made_now in [false, true] {
        for refused in [false, true] {
            for topology in Topology::ALL {
                let expected = made_now && refused && topology != Topology::Shared;
                assert_eq!(
                    may_undo_directory(made_now, refused, topology),
                    expected,
                    "{made_now} {refused} {topology}"
                );
            }
        }
    }
}

#[test]
fn with_requests_accounting_a_claim_is_refused_when_the_promises_would_exceed_the_pool() {
    // 100 GiB free of 200 GiB: plenty of free space, but 150 GiB already promised.
    let big = claim("hpp").on_node(NODE).request("60Gi").build();
    let pool = PoolFacts { promised_bytes: Some(150 * GIB), ..roomy() };
    let me = me();
    let mut cfg = config();
    let class = wffc();
    // Counted by free space (the default), it fits; the promises are not even read.
    let f = facts(&big, Some(&class), &cfg, &me, ready(&pool));
    assert!(matches!(plan_claim(&f), ClaimPlan::Provision(_)));
    cfg.pools[0].accounting = Some(CapacityAccounting::Requests);
    let needs = facts_needed(&big, Some(&class), &me, &cfg);
    assert!(needs.promised, "the promises are gathered");
    assert!(!needs.shared_promises, "a node-local pool: this node's caches and ledger are the whole truth");
    let f = facts(&big, Some(&class), &cfg, &me, ready(&pool));
    match plan_claim(&f) {
        ClaimPlan::Fail(Failure::ShortOfSpace(short)) => {
            assert_eq!((short.available, short.promised), (50 * GIB, Some(150 * GIB)));
            let text = short.to_string();
            assert!(text.contains("not enough unpromised space") && text.contains("150 GiB promised"), "{text}");
        }
        other => panic!("expected ShortOfSpace, got {other:?}"),
    }
    // 50 GiB still fits, and free space still counts: a full disk refuses whatever is promised.
    let fits = claim("hpp").on_node(NODE).request("50Gi").build();
    let f = facts(&fits, Some(&class), &cfg, &me, ready(&pool));
    assert!(matches!(plan_claim(&f), ClaimPlan::Provision(_)));
    let full = PoolFacts { available_bytes: GIB, promised_bytes: Some(0), ..roomy() };
    let f = facts(&fits, Some(&class), &cfg, &me, ready(&full));
    assert!(matches!(plan_claim(&f), ClaimPlan::Fail(Failure::ShortOfSpace(_))));
}

#[test]
fn the_promises_of_a_pool_are_the_capacities_of_the_pvs_in_it() {
    let sized = |path: &str, size: &str| {
        let mut pv = pv(path, "Bound").build();
        pv.spec.as_mut().unwrap().capacity = Some(
            BTreeMap::from([(
                "storage".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(size.into()),
            )])
            .into(),
        );
        pv
    };
    let pvs = [
        sized("/var/hpvolumes/pvc-a", "10Gi"),
        sized("/var/hpvolumes/pvc-b", "5Gi"),
        sized("/var/hpvolumes/sub/pvc-c", "100Gi"),
        sized("/mnt/other/pvc-d", "100Gi"),
    ];
    let promised = crate::deciding::volume::promised_bytes(pvs.iter(), std::path::Path::new("/var/hpvolumes"));
    assert_eq!(promised, 15 * GIB);
}

#[test]
fn the_promises_of_a_shared_pool_with_requests_accounting_go_through_its_shared_record() {
    let claim = claim("hpp").on_node(NODE).request("1Gi").build();
    let me = me();
    let mut cfg = config();
    cfg.pools[0].shared = true;
    let class = wffc();
    let needs = facts_needed(&claim, Some(&class), &me, &cfg);
    assert!(!needs.promised && !needs.shared_promises, "free-space accounting counts no promises");
    cfg.pools[0].accounting = Some(CapacityAccounting::Requests);
    let needs = facts_needed(&claim, Some(&class), &me, &cfg);
    assert!(needs.promised && needs.shared_promises, "{needs:?}");
}

// ---- pathPattern directories ----

fn patterned() -> StorageClass {
    with_params(wffc(), &[("pathPattern", "{namespace}_{claim}")])
}

fn pool_with(pattern: DirectoryFacts) -> PoolFacts {
    PoolFacts { pattern: Some(pattern), ..roomy() }
}

/// The claim of these tests (`default/data` of class `hpp`).
fn asker() -> path_pattern::ClaimIdentity {
    path_pattern::ClaimIdentity {
        namespace_uid: "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d".into(),
        namespace: "default".into(),
        claim: "data".into(),
        class: "hpp".into(),
    }
}

/// What is at the directory, recorded (when marked) for the claim asking.
fn found(found: path_pattern::Found, marked_pv_exists: bool, held_by: Option<&str>) -> DirectoryFacts {
    let recorded = match &found {
        path_pattern::Found::MarkedFor(pv) => Some(path_pattern::OwnerRecord { pv: pv.clone(), owner: asker() }),
        _ => None,
    };
    DirectoryFacts {
        found,
        marked_pv_exists,
        held_by: held_by.map(str::to_owned),
        recorded,
        asker: asker(),
        handed_over: false,
    }
}

#[test]
fn a_pattern_class_names_the_directory_from_the_claim_and_reads_what_is_there() {
    let claim = claim("hpp").selected(NODE).build();
    let needs = facts_needed(&claim, Some(&patterned()), &me(), &config());
    assert_eq!(needs.dir_name.as_deref(), Some("default_data"));
    assert!(needs.pattern_dir);
    assert!(!facts_needed(&claim, Some(&wffc()), &me(), &config()).pattern_dir);
    let made = provision(plan(&claim, &patterned(), &pool_with(found(path_pattern::Found::Absent, false, None))));
    assert_eq!(made.plan.dir_name, "default_data");
    assert_eq!(made.plan.path_pattern.as_deref(), Some("{namespace}_{claim}"));
    assert_eq!(made.pattern, Some(Placing::Make { owner: asker() }));
    assert_eq!(provision(plan(&claim, &wffc(), &roomy())).pattern, None);
}

#[test]
fn a_pattern_directory_of_a_gone_pv_is_taken_over_even_when_the_pool_is_short_of_room() {
    let claim = claim("hpp").selected(NODE).build();
    let gone = found(path_pattern::Found::MarkedFor("pvc-old".into()), false, None);
    let full = PoolFacts { available_bytes: 0, ..pool_with(gone) };
    let taken = provision(plan(&claim, &patterned(), &full));
    assert_eq!(taken.pattern, Some(Placing::Adopt { from: "pvc-old".into(), owner: asker(), handed_from: None }));
}

#[test]
fn a_held_or_foreign_pattern_directory_is_refused_and_looked_at_again() {
    let claim = claim("hpp").selected(NODE).build();
    for facts in [
        found(path_pattern::Found::MarkedFor("pvc-old".into()), true, None),
        found(path_pattern::Found::Absent, false, Some("pvc-old")),
        found(path_pattern::Found::Unmarked, false, None),
        DirectoryFacts { recorded: None, ..found(path_pattern::Found::MarkedFor("pvc-old".into()), false, None) },
    ] {
        match plan(&claim, &patterned(), &pool_with(facts.clone())) {
            ClaimPlan::Refuse { refusal: Refusal::DirectoryOccupied(_), recheck: Some(PATTERN_RECHECK) } => {}
            other => panic!("{facts:?}: expected a refusal, got {other:?}"),
        }
    }
    // Without the facts (the pool could not say) nothing is made.
    assert_eq!(plan(&claim, &patterned(), &roomy()), ClaimPlan::Fail(Failure::PoolUnusable));
}

#[test]
fn a_clone_is_never_copied_into_a_directory_it_would_take_over() {
    let claim = claim("hpp").data_source().selected(NODE).build();
    let (source, pv) = (bound_source(), source_pv(NODE));
    let gone = pool_with(found(path_pattern::Found::MarkedFor("pvc-old".into()), false, None));
    match clone_plan(&claim, &patterned(), Some(&source), Some(&pv), None, &gone) {
        ClaimPlan::Refuse { refusal: Refusal::DirectoryOccupied(why), .. } => {
            assert!(why.to_string().contains("a clone is copied into a new directory only"), "{why}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

mod restores;
mod several_roots;

//! The plan over a pool of several roots (`deciding::pool_roots`): which root a new volume goes
//! to, and what keeps a volume on the root it started on.

use super::*;

/// The pool `data` over two disks, the default pool of the node.
fn two_disks() -> DecisionConfig {
    DecisionConfig {
        pools: vec![PoolPath::local("data", "/mnt/disk1"), PoolPath::local("data", "/mnt/disk2")],
        default_pool: Some("data".into()),
        ..config()
    }
}

fn disks(first: Option<PoolFacts>, second: Option<PoolFacts>) -> Vec<RootFacts> {
    vec![RootFacts { root: "/mnt/disk1".into(), read: first }, RootFacts { root: "/mnt/disk2".into(), read: second }]
}

fn free(gib: u64) -> PoolFacts {
    PoolFacts { available_bytes: gib * GIB, ..roomy() }
}

fn planned_root(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    cfg: &DecisionConfig,
    roots: &[RootFacts],
) -> String {
    let me = me();
    let f = facts(claim, Some(class), cfg, &me, PoolState::Ready(roots));
    provision(plan_claim(&f)).plan.pool.root.display().to_string()
}

#[test]
fn a_volume_goes_to_the_disk_with_the_most_room_and_its_pv_names_that_disk() {
    let (cfg, claim) = (two_disks(), claim("hpp").selected(NODE).build());
    assert_eq!(planned_root(&claim, &wffc(), &cfg, &disks(Some(free(3)), Some(free(7)))), "/mnt/disk2");
    assert_eq!(planned_root(&claim, &wffc(), &cfg, &disks(Some(free(7)), Some(free(3)))), "/mnt/disk1");
    assert_eq!(
        planned_root(&claim, &wffc(), &cfg, &disks(Some(free(5)), Some(free(5)))),
        "/mnt/disk1",
        "first among equals"
    );
    // A disk that cannot be read (not mounted yet, say) is passed over.
    assert_eq!(planned_root(&claim, &wffc(), &cfg, &disks(None, Some(free(1)))), "/mnt/disk2");
    let (me, class) = (me(), wffc());
    let roots = disks(Some(free(3)), Some(free(7)));
    let f = facts(&claim, Some(&class), &cfg, &me, PoolState::Ready(&roots));
    let plan = provision(plan_claim(&f)).plan;
    // The PV's path is the root joined with the directory (`volume_spec::build_pv`).
    assert_eq!(plan.pool.root.join(&plan.dir_name).display().to_string(), format!("/mnt/disk2/pvc-{UID}"));
}

#[test]
fn each_disk_counts_its_own_reserve_and_promises() {
    let claim = claim("hpp").on_node(NODE).request("4Gi").build();
    let mut cfg = two_disks();
    // Disk 1 has more free space but keeps 5 GiB back: disk 2 has more room.
    cfg.pools[0].reserve = Some(5 * GIB);
    assert_eq!(planned_root(&claim, &wffc(), &cfg, &disks(Some(free(8)), Some(free(6)))), "/mnt/disk2");
    // Disk 2 counts requests and has promised nearly all of its 200 GiB.
    cfg.pools[0].reserve = None;
    cfg.pools[1].accounting = Some(CapacityAccounting::Requests);
    let promised = PoolFacts { promised_bytes: Some(199 * GIB), ..free(50) };
    assert_eq!(planned_root(&claim, &wffc(), &cfg, &disks(Some(free(8)), Some(promised))), "/mnt/disk1");
}

#[test]
fn when_no_disk_has_room_the_refusal_names_the_roomiest() {
    let cfg = two_disks();
    let big = claim("hpp").on_node(NODE).request("10Gi").build();
    let (me, class) = (me(), wffc());
    let roots = disks(Some(free(3)), Some(free(7)));
    let f = facts(&big, Some(&class), &cfg, &me, PoolState::Ready(&roots));
    match plan_claim(&f) {
        ClaimPlan::Fail(Failure::ShortOfSpace(short)) => assert_eq!(short.available, 7 * GIB, "{short}"),
        other => panic!("expected ShortOfSpace, got {other:?}"),
    }
    let none_read = disks(None, None);
    let f = facts(&big, Some(&class), &cfg, &me, PoolState::Ready(&none_read));
    assert_eq!(plan_claim(&f), ClaimPlan::Fail(Failure::PoolUnusable));
}

#[test]
fn a_directory_an_earlier_attempt_made_keeps_the_volume_on_its_disk() {
    let (cfg, claim) = (two_disks(), claim("hpp").selected(NODE).build());
    // The attempt before a crash chose disk 1; disk 2 has more room now.
    let made = PoolFacts { dir_exists: true, ..free(1) };
    assert_eq!(planned_root(&claim, &wffc(), &cfg, &disks(Some(made), Some(free(90)))), "/mnt/disk1");
}

#[test]
fn a_quota_class_goes_to_a_disk_that_can_enforce_it_even_with_less_room() {
    let (cfg, claim) = (two_disks(), claim("hpp").selected(NODE).build());
    let enforce = with_params(wffc(), &[("quota", "enforce")]);
    let able = PoolFacts { quota: Some(btrfs_with_quota()), ..free(2) };
    let unable = PoolFacts { quota: Some(QuotaFacts { btrfs_quota_enabled: false, ..btrfs_with_quota() }), ..free(90) };
    assert_eq!(planned_root(&claim, &enforce, &cfg, &disks(Some(unable.clone()), Some(able))), "/mnt/disk2");
    // No disk can: the refusal says why, from the first.
    let me = me();
    let roots = disks(Some(unable.clone()), Some(unable));
    let f = facts(&claim, Some(&enforce), &cfg, &me, PoolState::Ready(&roots));
    assert!(matches!(plan_claim(&f), ClaimPlan::Fail(Failure::QuotaUnsupported(_))), "{:?}", plan_claim(&f));
}

#[test]
fn a_clone_is_made_on_the_disk_of_its_source_whatever_the_room() {
    let cfg = two_disks();
    let claim = claim("hpp").selected(NODE).data_source().build();
    let source = bound_source();
    let mut pv = source_pv(NODE);
    pv.spec.as_mut().expect("spec").host_path = Some(KeptDirectory { path: format!("/mnt/disk1/pvc-{SOURCE_UID}") });
    let me = me();
    let roots = disks(Some(free(20)), Some(free(90)));
    let class = wffc();
    let mut f = facts(&claim, Some(&class), &cfg, &me, PoolState::Ready(&roots));
    f.source = Some(SourceFacts { name: "src", claim: Some(&source), pv: Some(&pv), is_quota_volume: None });
    let provision = provision(plan_claim(&f));
    assert_eq!(provision.plan.pool.root.display().to_string(), "/mnt/disk1");
    assert!(
        matches!(&provision.make, MakeVolume::Clone { source_dir, .. } if *source_dir == format!("pvc-{SOURCE_UID}"))
    );
    // Its disk unreadable: the clone waits for it, never copies across.
    let roots = disks(None, Some(free(90)));
    let mut f = facts(&claim, Some(&class), &cfg, &me, PoolState::Ready(&roots));
    f.source = Some(SourceFacts { name: "src", claim: Some(&source), pv: Some(&pv), is_quota_volume: None });
    assert_eq!(plan_claim(&f), ClaimPlan::Fail(Failure::PoolUnusable));
}

#[test]
fn an_every_node_class_is_refused_a_pool_of_several_roots() {
    let cfg = two_disks();
    let claim = claim("hpp").on_node(NODE).build();
    let everywhere = with_params(wffc(), &[("topology", "everyNode")]);
    let me = me();
    let roots = disks(Some(free(3)), Some(free(7)));
    let f = facts(&claim, Some(&everywhere), &cfg, &me, PoolState::Ready(&roots));
    match plan_claim(&f) {
        ClaimPlan::Refuse { refusal: refusal @ Refusal::SeveralRoots { .. }, .. } => {
            let text = refusal.to_string();
            assert!(text.contains("/mnt/disk1, /mnt/disk2") && text.contains("a pool of one root"), "{text}");
        }
        other => panic!("expected SeveralRoots, got {other:?}"),
    }
}

//! The plan of a claim restored from a `HostPathSnapshot`: made on the snapshot's node and root,
//! waiting while the snapshot is not ready, refused with what to change.

use k8s_openapi::api::core::v1::TypedObjectReference;

use super::*;
use crate::deciding::snapshot::{GROUP, HostPathSnapshot, KIND, SnapshotSpec, SnapshotStatus};

const SNAPSHOT_UID: &str = "5a5a5a5a-1111-2222-3333-444444444444";

fn restoring(claim: crate::test_fixtures::ClaimBuilder) -> PersistentVolumeClaim {
    claim
        .spec(|s| {
            s.data_source_ref = Some(TypedObjectReference {
                api_group: Some(GROUP.into()),
                kind: KIND.into(),
                name: "snap".into(),
                namespace: None,
            })
        })
        .build()
}

fn snapshot_on(node: &str, method: &str) -> HostPathSnapshot {
    HostPathSnapshot {
        api_version: String::new(),
        kind: String::new(),
        metadata: ObjectMeta {
            name: Some("snap".into()),
            namespace: Some("default".into()),
            uid: Some(SNAPSHOT_UID.into()),
            ..Default::default()
        },
        spec: SnapshotSpec::default(),
        status: Some(SnapshotStatus {
            ready_to_use: true,
            node: Some(node.into()),
            restore_size: Some("1Gi".into()),
            method: Some(method.into()),
            volume_mode: Some(crate::deciding::snapshot::FILESYSTEM_MODE.into()),
            ..Default::default()
        }),
    }
}

/// Two roots of the default pool; the snapshot is on the second, which has less room.
fn roots() -> Vec<RootFacts> {
    vec![
        RootFacts { root: "/var/hpvolumes".into(), read: Some(roomy()) },
        RootFacts {
            root: "/mnt/disk2".into(),
            read: Some(PoolFacts { available_bytes: 2 * GIB, snapshot_here: true, ..roomy() }),
        },
    ]
}

fn two_roots() -> DecisionConfig {
    let mut cfg = config();
    cfg.pools.push(PoolPath::local("legacy", "/mnt/disk2"));
    cfg
}

fn plan_restore(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    snapshot: Option<&HostPathSnapshot>,
    roots: &[RootFacts],
) -> ClaimPlan {
    let (cfg, me) = (two_roots(), me());
    let mut f = facts(claim, Some(class), &cfg, &me, PoolState::Ready(roots));
    f.restore = Some(RestoreFacts { name: "snap", snapshot });
    plan_claim(&f)
}

#[test]
fn a_restore_is_made_from_the_snapshot_on_the_root_that_holds_it() {
    let claim = restoring(claim("hpp").selected(NODE));
    let snap = snapshot_on(NODE, "reflink");
    let provision = provision(plan_restore(&claim, &wffc(), Some(&snap), &roots()));
    assert_eq!(provision.plan.pool.root.display().to_string(), "/mnt/disk2", "beside the snapshot, not the roomiest");
    assert_eq!(
        provision.make,
        MakeVolume::Restore { snapshot_dir: SNAPSHOT_UID.into(), snapshot: "snap".into(), limit_bytes: None }
    );
}

#[test]
fn a_restore_waits_for_its_snapshot_and_goes_back_when_scheduled_elsewhere() {
    let scheduled = restoring(claim("hpp").selected(NODE));
    assert!(
        matches!(plan_restore(&scheduled, &wffc(), None, &roots()), ClaimPlan::WaitForSource(why) if why.contains("does not exist"))
    );
    let mut not_ready = snapshot_on(NODE, "reflink");
    not_ready.status = Some(SnapshotStatus { message: Some("being copied".into()), ..Default::default() });
    assert!(
        matches!(plan_restore(&scheduled, &wffc(), Some(&not_ready), &roots()), ClaimPlan::WaitForSource(why) if why.contains("being copied"))
    );
    let elsewhere = snapshot_on(OTHER_NODE, "reflink");
    assert!(matches!(
        plan_restore(&scheduled, &wffc(), Some(&elsewhere), &roots()),
        ClaimPlan::HandBack { label: "restore_wrong_node", .. }
    ));
    // Immediate and unplaced: the snapshot's node makes it, the others stay silent.
    let unplaced = restoring(claim("hpp").provisioner_annotations());
    assert!(matches!(
        plan_restore(&unplaced, &immediate(), Some(&snapshot_on(NODE, "reflink")), &roots()),
        ClaimPlan::Provision(_)
    ));
    assert_eq!(
        plan_restore(&unplaced, &immediate(), Some(&elsewhere), &roots()),
        ClaimPlan::Idle(SkipReason::OtherNode)
    );
}

#[test]
fn a_restore_is_refused_when_it_cannot_be_made_as_asked() {
    let refused = |plan: ClaimPlan| match plan {
        ClaimPlan::Refuse { refusal, .. } => refusal.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let scheduled = restoring(claim("hpp").selected(NODE));
    // Smaller than the snapshot's volume.
    let small = restoring(claim("hpp").selected(NODE).request("512Mi"));
    assert!(refused(plan_restore(&small, &wffc(), Some(&snapshot_on(NODE, "reflink")), &roots())).contains("at least"));
    // A class of a pool without the snapshot on this node.
    let elsewhere_roots = vec![RootFacts { root: "/var/hpvolumes".into(), read: Some(roomy()) }];
    let why = refused(plan_restore(&scheduled, &wffc(), Some(&snapshot_on(NODE, "reflink")), &elsewhere_roots));
    assert!(why.contains("not in pool legacy"), "{why}");
    // A quota class from a plain copy.
    let enforce = with_params(wffc(), &[("quota", "enforce")]);
    let with_quota: Vec<RootFacts> = roots()
        .into_iter()
        .map(|r| RootFacts { read: r.read.map(|f| PoolFacts { quota: Some(btrfs_with_quota()), ..f }), ..r })
        .collect();
    let why = refused(plan_restore(&scheduled, &enforce, Some(&snapshot_on(NODE, "reflink")), &with_quota));
    assert!(why.contains("quota"), "{why}");
    // A status saying `snapshot` (written by whoever may write the status) over a plain copy on
    // the disk: refused at once, not copied and then failed for ever at setting the limit.
    let why = refused(plan_restore(&scheduled, &enforce, Some(&snapshot_on(NODE, "snapshot")), &with_quota));
    assert!(why.contains("quota"), "{why}");
    // From a btrfs snapshot of a quota volume (a subvolume on the disk) it is limited to the
    // claim's request, whatever the status says.
    let subvolume: Vec<RootFacts> = with_quota
        .iter()
        .cloned()
        .map(|r| RootFacts { read: r.read.map(|f| PoolFacts { snapshot_subvolume: true, ..f }), ..r })
        .collect();
    for method in ["snapshot", "reflink"] {
        let limited = provision(plan_restore(&scheduled, &enforce, Some(&snapshot_on(NODE, method)), &subvolume));
        assert!(matches!(limited.make, MakeVolume::Restore { limit_bytes: Some(GIB), .. }), "{:?}", limited.make);
    }
}

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{TypedLocalObjectReference, TypedObjectReference};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::*;
use crate::deciding::kept_volume::{KeptClaimRef, KeptDirectory, KeptMap, KeptVolumeFields, KeptVolumeSpec};
use crate::test_fixtures::{NODE, OTHER_NODE, PROVISIONER, UID, claim, config, me};

const SNAPSHOT_UID: &str = "5a5a5a5a-1111-2222-3333-444444444444";

/// The source claim `data`, bound to its PV.
fn source() -> PersistentVolumeClaim {
    claim("hpp").spec(|s| s.volume_name = Some(format!("pvc-{UID}"))).build()
}

/// Its PV, made by `provisioner` on `node` at `path`, 2Gi.
fn volume(provisioner: &str, node: &str, path: &str) -> KeptVolume {
    KeptVolume::from(KeptVolumeFields {
        metadata: ObjectMeta { name: Some(format!("pvc-{UID}")), ..Default::default() },
        labels: KeptMap::default(),
        annotations: KeptMap::from(BTreeMap::from([
            (keys::PROVISIONED_BY.to_owned(), provisioner.to_owned()),
            (keys::PROVISION_ON_NODE.to_owned(), node.to_owned()),
        ])),
        spec: Some(KeptVolumeSpec {
            claim_ref: Some(KeptClaimRef { uid: Some(UID.into()), ..Default::default() }),
            host_path: Some(KeptDirectory { path: path.to_owned() }),
            capacity: Some(BTreeMap::from([("storage".to_owned(), Quantity("2Gi".into()))]).into()),
            ..Default::default()
        }),
        status: None,
    })
}

fn ours(node: &str) -> KeptVolume {
    volume(PROVISIONER, node, &format!("/var/hpvolumes/pvc-{UID}"))
}

fn state(claim: Option<&PersistentVolumeClaim>, pv: Option<&KeptVolume>) -> SourceState {
    source_state("data", "default", claim, pv, &me(), NODE, &config().pools)
}

#[test]
fn a_block_volume_is_copied_from_its_backing_directory_never_from_its_device() {
    let claim = source();
    let mut pv = ours(NODE);
    let spec = pv.spec.as_mut().expect("spec");
    spec.volume_mode = Some("Block".into());
    spec.host_path = None;
    spec.local = Some(KeptDirectory { path: format!("/dev/hostpath-provisioner/pvc-{UID}") });
    pv.annotations.insert(crate::deciding::block::BACKING_DIR_ANNOTATION, &format!("/var/hpvolumes/pvc-{UID}"));
    assert_eq!(
        state(Some(&claim), Some(&pv)),
        SourceState::Here {
            root: "/var/hpvolumes".into(),
            dir_name: format!("pvc-{UID}"),
            marked_for: None,
            restore_size: "2Gi".into(),
            block: true,
        }
    );
}

/// What a tenant may have done to a snapshot's volume-mode annotation.
#[derive(Clone, Copy, Debug)]
enum Annotation {
    /// As the provisioner left it (`Block` on a Block copy, none on a Filesystem one).
    AsWritten,
    /// Removed.
    Absent,
    /// Set to say the other mode (`Block` on a Filesystem copy, `Filesystem` on a Block one).
    Forged,
}

/// A ready snapshot whose status says `status_mode` (`None`: an earlier release's), with its
/// annotation as `annotation` says.
fn moded(status_mode: Option<&str>, annotation: Annotation) -> HostPathSnapshot {
    let mut snap = snapshot(Some(NODE), "1Gi");
    snap.status.as_mut().expect("status").volume_mode = status_mode.map(str::to_owned);
    let block = status_mode == Some(BLOCK_MODE);
    let value = match annotation {
        Annotation::AsWritten => block.then_some(BLOCK_MODE),
        Annotation::Absent => None,
        Annotation::Forged => Some(if block { FILESYSTEM_MODE } else { BLOCK_MODE }),
    };
    snap.metadata.annotations = value.map(|v| [(VOLUME_MODE_ANNOTATION.to_owned(), v.to_owned())].into());
    snap
}

/// Every combination of annotation (as written, removed, forged), status mode (Block,
/// Filesystem, absent) and claim mode: the restore goes by the status alone (and waits while it
/// has no mode), and an annotation that differs from it is put back.
#[test]
fn a_restore_keeps_the_volume_mode_the_provisioner_wrote_whatever_the_annotation_says() {
    const GIB: u64 = 1 << 30;
    for status_mode in [Some(BLOCK_MODE), Some(FILESYSTEM_MODE), None] {
        let copy_is_block = status_mode == Some(BLOCK_MODE);
        for annotation in [Annotation::AsWritten, Annotation::Absent, Annotation::Forged] {
            let snap = moded(status_mode, annotation);
            for claim_is_block in [true, false] {
                let verdict = restore_verdict("before-upgrade", "default", Some(&snap), GIB, claim_is_block);
                let case = format!("status {status_mode:?}, annotation {annotation:?}, claim Block {claim_is_block}");
                if status_mode.is_none() {
                    // An earlier release's copy: no mode is guessed, the node writes it first.
                    assert!(
                        matches!(&verdict, RestoreVerdict::Wait(why) if why.contains("no status.volumeMode yet")),
                        "{case}: {verdict:?}"
                    );
                } else if copy_is_block == claim_is_block {
                    assert!(matches!(verdict, RestoreVerdict::Ready { .. }), "{case}: {verdict:?}");
                } else {
                    let says = if copy_is_block {
                        "a copy of a volumeMode Block volume and this claim asks for volumeMode Filesystem"
                    } else {
                        "a copy of a volumeMode Filesystem volume and this claim asks for volumeMode Block"
                    };
                    assert!(
                        matches!(&verdict, RestoreVerdict::Refuse(why) if why.contains(says)),
                        "{case}: {verdict:?}"
                    );
                }
            }
            let fix = mode_annotation_fix(&snap);
            let changed = match annotation {
                // No mode in the status yet: its copy's record is read first.
                _ if status_mode.is_none() => false,
                Annotation::AsWritten => false,
                Annotation::Absent => copy_is_block,
                Annotation::Forged => true,
            };
            let wanted = copy_is_block.then_some(BLOCK_MODE);
            assert_eq!(fix, changed.then_some(wanted), "status {status_mode:?}, annotation {annotation:?}");
        }
    }
}

#[test]
fn a_snapshot_not_ready_yet_keeps_its_annotation_as_it_is() {
    let mut snap = moded(Some(BLOCK_MODE), Annotation::Forged);
    snap.status.as_mut().expect("status").ready_to_use = false;
    assert_eq!(mode_annotation_fix(&snap), None);
    snap.status = None;
    assert_eq!(mode_annotation_fix(&snap), None);
}

#[test]
fn the_status_mode_is_written_and_read_as_volume_mode() {
    let snap = moded(Some(BLOCK_MODE), Annotation::Absent);
    let json = serde_json::to_value(&snap).expect("serialized");
    assert_eq!(json["status"]["volumeMode"], "Block");
    assert!(snapshot_is_block(&serde_json::from_value(json).expect("read back")));
    assert_eq!(volume_mode_name(true), BLOCK_MODE);
    assert_eq!(volume_mode_name(false), FILESYSTEM_MODE);
}

#[test]
fn this_nodes_volume_is_copied_from_its_own_root_and_directory() {
    let claim = source();
    let pv = ours(NODE);
    assert_eq!(
        state(Some(&claim), Some(&pv)),
        SourceState::Here {
            root: "/var/hpvolumes".into(),
            dir_name: format!("pvc-{UID}"),
            marked_for: None,
            restore_size: "2Gi".into(),
            block: false,
        }
    );
    assert_eq!(state(Some(&claim), Some(&ours(OTHER_NODE))), SourceState::Elsewhere(OTHER_NODE.into()));
}

#[test]
fn a_missing_or_unbound_source_waits_and_a_foreign_or_unsafe_one_is_refused() {
    assert!(matches!(state(None, None), SourceState::Wait(why) if why.contains("does not exist")));
    let claim = source();
    assert!(matches!(state(Some(&claim), None), SourceState::Wait(why) if why.contains("no volume yet")));
    let foreign = volume("other.example.org/x", NODE, &format!("/var/hpvolumes/pvc-{UID}"));
    // Another provisioner's volume is that provisioner's to answer: silence, never a status.
    assert_eq!(state(Some(&claim), Some(&foreign)), SourceState::Elsewhere("provisioner other.example.org/x".into()));
    let mut by_hand = ours(NODE);
    by_hand.annotations.remove(keys::PROVISIONED_BY);
    assert!(matches!(state(Some(&claim), Some(&by_hand)), SourceState::Refuse(why) if why.contains("no provisioner")));
    // A PV (forged or edited) pointing outside this node's pools, or at the root itself.
    for path in ["/etc".to_owned(), "/var/hpvolumes".to_owned(), format!("/var/hpvolumes/../pvc-{UID}")] {
        let forged = volume(PROVISIONER, NODE, &path);
        assert!(matches!(state(Some(&claim), Some(&forged)), SourceState::Refuse(_)), "{path}");
    }
    let mut other_claim = source();
    other_claim.metadata.uid = Some("99999999-8888-7777-6666-555555555555".into());
    assert!(
        matches!(state(Some(&other_claim), Some(&ours(NODE))), SourceState::Wait(why) if why.contains("not bound"))
    );
}

fn snapshot(ready_on: Option<&str>, restore_size: &str) -> HostPathSnapshot {
    HostPathSnapshot {
        api_version: String::new(),
        kind: String::new(),
        metadata: ObjectMeta {
            name: Some("before-upgrade".into()),
            namespace: Some("default".into()),
            uid: Some(SNAPSHOT_UID.into()),
            ..Default::default()
        },
        spec: SnapshotSpec { source: SnapshotSource { persistent_volume_claim_name: "data".into() } },
        status: Some(SnapshotStatus {
            ready_to_use: ready_on.is_some(),
            node: ready_on.map(str::to_owned),
            restore_size: Some(restore_size.into()),
            method: Some("reflink".into()),
            // Written with the readiness, as this release does.
            volume_mode: ready_on.map(|_| FILESYSTEM_MODE.to_owned()),
            ..Default::default()
        }),
    }
}

#[test]
fn a_restore_waits_for_a_ready_snapshot_and_needs_its_size() {
    const GIB: u64 = 1 << 30;
    assert!(
        matches!(restore_verdict("before-upgrade", "default", None, GIB, false), RestoreVerdict::Wait(why) if why.contains("does not exist"))
    );
    assert!(matches!(
        restore_verdict("before-upgrade", "default", Some(&snapshot(None, "1Gi")), GIB, false),
        RestoreVerdict::Wait(_)
    ));
    assert_eq!(
        restore_verdict("before-upgrade", "default", Some(&snapshot(Some(NODE), "1Gi")), GIB, false),
        RestoreVerdict::Ready { node: NODE.into(), dir_name: SNAPSHOT_UID.into(), method: Some("reflink".into()) }
    );
    assert!(matches!(
        restore_verdict("before-upgrade", "default", Some(&snapshot(Some(NODE), "2Gi")), GIB, false),
        RestoreVerdict::Refuse(why) if why.contains("at least")
    ));
    // The directory is the UID, checked: an object whose UID is no UID names no directory.
    let mut odd = snapshot(Some(NODE), "1Gi");
    odd.metadata.uid = Some("../../etc".into());
    assert!(matches!(restore_verdict("before-upgrade", "default", Some(&odd), GIB, false), RestoreVerdict::Wait(_)));
    assert_eq!(odd.dir_name(), None);
}

#[test]
fn a_claim_restores_from_a_snapshot_named_by_data_source_ref_or_data_source() {
    let by_ref = claim("hpp")
        .spec(|s| {
            s.data_source_ref = Some(TypedObjectReference {
                api_group: Some(GROUP.into()),
                kind: KIND.into(),
                name: "before-upgrade".into(),
                namespace: None,
            })
        })
        .build();
    assert_eq!(requested_snapshot(&by_ref), Some("before-upgrade"));
    assert!(awaits_restore_of(&by_ref, "before-upgrade"));
    let by_source = claim("hpp")
        .spec(|s| {
            s.data_source =
                Some(TypedLocalObjectReference { api_group: Some(GROUP.into()), kind: KIND.into(), name: "x".into() })
        })
        .build();
    assert_eq!(requested_snapshot(&by_source), Some("x"));
    // Another group's kind of that name, or a plain clone, is no restore.
    let other_group = claim("hpp")
        .spec(|s| {
            s.data_source = Some(TypedLocalObjectReference {
                api_group: Some("example.org".into()),
                kind: KIND.into(),
                name: "x".into(),
            })
        })
        .build();
    assert_eq!(requested_snapshot(&other_group), None);
    assert_eq!(requested_snapshot(&claim("hpp").data_source().build()), None);
    // A bound claim no longer waits for its restore.
    let bound = {
        let mut c = by_ref.clone();
        c.spec.as_mut().unwrap().volume_name = Some("pvc-x".into());
        c
    };
    assert!(!awaits_restore_of(&bound, "before-upgrade"));
}

#[test]
fn a_cross_namespace_restore_is_refused_not_ignored() {
    let other_ns = claim("hpp")
        .spec(|s| {
            s.data_source_ref = Some(TypedObjectReference {
                api_group: Some(GROUP.into()),
                kind: KIND.into(),
                name: "s".into(),
                namespace: Some("elsewhere".into()),
            })
        })
        .build();
    assert!(matches!(
        crate::deciding::clone::claim_source(&other_ns),
        Err(crate::deciding::refusal::CloneRefusal::OtherNamespace { .. })
    ));
}

#[test]
fn a_node_keeps_the_pending_snapshots_and_its_own_and_drops_the_others() {
    let mut pending = snapshot(None, "1Gi");
    assert!(keep(&mut pending, NODE));
    let mut mine = snapshot(Some(NODE), "1Gi");
    mine.metadata.managed_fields = Some(vec![Default::default()]);
    assert!(keep(&mut mine, NODE));
    assert_eq!(mine.metadata.managed_fields, None, "trimmed");
    let mut theirs = snapshot(Some(OTHER_NODE), "1Gi");
    assert!(!keep(&mut theirs, NODE));
    // Being copied by another node (its name written, not ready yet): that node's.
    let mut copying = snapshot(None, "1Gi");
    copying.status.as_mut().unwrap().node = Some(OTHER_NODE.into());
    assert!(!keep(&mut copying, NODE));
}

/// A restore and a deletion of its snapshot, one API call or disk step at a time, in every
/// order: the claim is created (C), the restore's plan reads the snapshot (P), copies it (X)
/// and binds (B); the user deletes the snapshot (D), its node lists the namespace's claims (L)
/// and, when none waits, moves the copy to the trash (T). The decisions are the real ones
/// (`restore_verdict`, `awaits_restore_of`). Invariant: no copy starts from, or runs over, a
/// snapshot already in the trash; a restore that read a deleting snapshot makes no copy.
#[test]
fn no_order_of_a_restore_and_a_deletion_copies_a_trashed_snapshot() {
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Step {
        Create,
        Plan,
        Copy,
        Bind,
        Delete,
        List,
        Trash,
    }
    let restore = [Step::Create, Step::Plan, Step::Copy, Step::Bind];
    let deletion = [Step::Delete, Step::List, Step::Trash];
    let mut orders = 0;
    // Every merge of the two sequences: choose the positions of the restore's steps.
    for mask in 0u32..(1 << 7) {
        if mask.count_ones() != 4 {
            continue;
        }
        orders += 1;
        let (mut r, mut d) = (0, 0);
        let mut order = Vec::new();
        for position in 0..7 {
            if mask & (1 << position) != 0 {
                order.push(restore[r]);
                r += 1;
            } else {
                order.push(deletion[d]);
                d += 1;
            }
        }
        let mut snap = snapshot(Some(NODE), "1Gi");
        let mut claim: Option<PersistentVolumeClaim> = None;
        let (mut planned, mut copied, mut trashed, mut waits) = (false, false, false, false);
        for step in &order {
            match step {
                Step::Create => {
                    claim = Some(
                        crate::test_fixtures::claim("hpp")
                            .spec(|s| {
                                s.data_source_ref = Some(TypedObjectReference {
                                    api_group: Some(GROUP.into()),
                                    kind: KIND.into(),
                                    name: "before-upgrade".into(),
                                    namespace: None,
                                })
                            })
                            .build(),
                    )
                }
                Step::Plan => {
                    planned = matches!(
                        restore_verdict("before-upgrade", "default", Some(&snap), 1 << 30, false),
                        RestoreVerdict::Ready { .. }
                    )
                }
                Step::Copy if planned => {
                    assert!(!trashed, "{order:?}: the copy starts from a trashed snapshot");
                    copied = true;
                }
                Step::Copy => {}
                Step::Bind if copied => {
                    let bound = claim.as_mut().expect("created").spec.as_mut().expect("spec");
                    bound.volume_name = Some("pvc-restored".into());
                }
                Step::Bind => {}
                Step::Delete => {
                    snap.metadata.deletion_timestamp =
                        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()))
                }
                Step::List => waits = claim.as_ref().is_some_and(|c| awaits_restore_of(c, "before-upgrade")),
                Step::Trash if !waits => {
                    assert!(
                        !(copied && claim.as_ref().is_some_and(|c| awaits_restore_of(c, "before-upgrade"))),
                        "{order:?}: trashed while a copy from it is under way"
                    );
                    trashed = true;
                }
                Step::Trash => {}
            }
        }
    }
    assert_eq!(orders, 35, "7! / (4! 3!) merges");
}

#[test]
fn names_that_are_no_object_names_are_refused_before_any_request() {
    for name in ["../secrets", "a/b", "Data", "x?watch=1", "", &"a".repeat(254)] {
        assert!(name_refusal("source claim", name).is_some(), "{name:?}");
        assert!(
            matches!(restore_verdict(name, "default", None, 1, false), RestoreVerdict::Refuse(why) if why.contains("not a valid object name")),
            "{name:?}"
        );
    }
    assert_eq!(name_refusal("source claim", "data.v1-2"), None);
}

#[test]
fn an_object_of_another_namespace_or_name_than_asked_is_refused() {
    const GIB: u64 = 1 << 30;
    let mut elsewhere = snapshot(Some(NODE), "1Gi");
    elsewhere.metadata.namespace = Some("tenant-b".into());
    assert!(matches!(
        restore_verdict("before-upgrade", "default", Some(&elsewhere), GIB, false),
        RestoreVerdict::Refuse(why) if why.contains("tenant-b")
    ));
    assert!(matches!(
        restore_verdict("other", "default", Some(&snapshot(Some(NODE), "1Gi")), GIB, false),
        RestoreVerdict::Refuse(_)
    ));
    let mut claim = source();
    claim.metadata.namespace = Some("tenant-b".into());
    assert!(matches!(state(Some(&claim), Some(&ours(NODE))), SourceState::Refuse(why) if why.contains("tenant-b")));
}

#[test]
fn a_snapshot_of_another_provisioners_claim_is_left_to_it() {
    let mut claim = source();
    claim.metadata.annotations =
        Some([(keys::STORAGE_PROVISIONER.to_owned(), "other.example.org/x".to_owned())].into());
    // Unbound yet, or bound: either way the other provisioner answers, this one stays silent.
    assert_eq!(state(Some(&claim), None), SourceState::Elsewhere("provisioner other.example.org/x".into()));
    assert_eq!(
        state(Some(&claim), Some(&ours(NODE))),
        SourceState::Elsewhere("provisioner other.example.org/x".into())
    );
    claim.metadata.annotations = Some([(keys::STORAGE_PROVISIONER.to_owned(), PROVISIONER.to_owned())].into());
    assert!(matches!(state(Some(&claim), Some(&ours(NODE))), SourceState::Here { .. }));
}

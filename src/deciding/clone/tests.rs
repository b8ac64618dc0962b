use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaimStatus, TypedLocalObjectReference, TypedObjectReference};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::*;
use crate::deciding::kept_volume::{
    KeptClaimRef, KeptDirectory, KeptMap, KeptVolume, KeptVolumeFields, KeptVolumeSpec,
};
use crate::test_fixtures::{NODE, OTHER_NODE, PROVISIONER, claim, me};

const SOURCE_UID: &str = "11111111-2222-3333-4444-555555555555";

fn pool() -> PoolPath {
    PoolPath::local("legacy", "/var/hpvolumes")
}

fn request<'a>(pool: &'a PoolPath, size: &'a str) -> CloneRequest<'a> {
    CloneRequest {
        source_name: "src",
        class_name: "hpp",
        request: size,
        request_bytes: parse_bytes(size).expect("size"),
        pools: std::slice::from_ref(pool),
        block: false,
    }
}

/// A bound source claim of class `hpp` requesting 1Gi.
fn bound_source() -> PersistentVolumeClaim {
    let mut source = claim("hpp").build();
    source.metadata.name = Some("src".into());
    source.metadata.uid = Some(SOURCE_UID.into());
    source.spec.as_mut().expect("spec").volume_name = Some(format!("pvc-{SOURCE_UID}"));
    source.status = Some(PersistentVolumeClaimStatus { phase: Some("Bound".into()), ..Default::default() });
    source
}

/// Its PV, provisioned by us on `node` in the legacy pool.
fn source_pv(node: &str) -> KeptVolume {
    let name = format!("pvc-{SOURCE_UID}");
    KeptVolume::from(KeptVolumeFields {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        labels: KeptMap::default(),
        annotations: KeptMap::from([(keys::PROVISIONED_BY, PROVISIONER), (keys::PROVISION_ON_NODE, node)]),
        spec: Some(KeptVolumeSpec {
            claim_ref: Some(KeptClaimRef { uid: Some(SOURCE_UID.into()), ..Default::default() }),
            host_path: Some(KeptDirectory { path: format!("/var/hpvolumes/{name}") }),
            capacity: Some(BTreeMap::from([("storage".to_owned(), Quantity("1Gi".into()))]).into()),
            ..Default::default()
        }),
        status: None,
    })
}

#[test]
fn a_claim_data_source_in_the_same_namespace_is_a_clone() {
    let spec = claim("hpp").data_source().build().spec.expect("spec");
    assert_eq!(requested_source(&spec, "default"), Ok(Some("src".into())));
}

#[test]
fn a_claim_without_data_source_is_no_clone() {
    let spec = claim("hpp").build().spec.expect("spec");
    assert_eq!(requested_source(&spec, "default"), Ok(None));
}

#[test]
fn a_data_source_ref_to_a_claim_is_a_clone_too() {
    let spec = claim("hpp")
        .spec(|s| {
            s.data_source_ref =
                Some(TypedObjectReference { kind: CLAIM_KIND.into(), name: "src".into(), ..Default::default() })
        })
        .build()
        .spec
        .expect("spec");
    assert_eq!(requested_source(&spec, "default"), Ok(Some("src".into())));
}

#[test]
fn snapshots_populators_and_other_namespaces_are_refused_with_the_reason() {
    let with_ref = |group: Option<&str>, kind: &str, ns: Option<&str>| {
        claim("hpp")
            .spec(|s| {
                s.data_source_ref = Some(TypedObjectReference {
                    api_group: group.map(str::to_owned),
                    kind: kind.into(),
                    name: "x".into(),
                    namespace: ns.map(str::to_owned),
                })
            })
            .build()
            .spec
            .expect("spec")
    };
    let snapshot = requested_source(&with_ref(Some("snapshot.storage.k8s.io"), "VolumeSnapshot", None), "default");
    assert!(matches!(snapshot, Err(CloneRefusal::Snapshot { .. })), "{snapshot:?}");
    let populator = requested_source(&with_ref(Some("example.io"), "Populator", None), "default");
    assert!(matches!(populator, Err(CloneRefusal::Populator { .. })), "{populator:?}");
    let foreign_group = requested_source(&with_ref(Some("example.io"), CLAIM_KIND, None), "default");
    assert!(matches!(foreign_group, Err(CloneRefusal::Populator { .. })), "{foreign_group:?}");
    let other_ns = requested_source(&with_ref(None, CLAIM_KIND, Some("elsewhere")), "default");
    assert!(matches!(other_ns, Err(CloneRefusal::OtherNamespace { .. })), "{other_ns:?}");
    let same_ns = requested_source(&with_ref(None, CLAIM_KIND, Some("default")), "default");
    assert_eq!(same_ns, Ok(Some("x".into())));
}

#[test]
fn disagreeing_data_source_and_ref_are_refused() {
    let spec = claim("hpp")
        .data_source()
        .spec(|s| {
            s.data_source_ref =
                Some(TypedObjectReference { kind: CLAIM_KIND.into(), name: "other".into(), ..Default::default() })
        })
        .build()
        .spec
        .expect("spec");
    assert_eq!(requested_source(&spec, "default"), Err(CloneRefusal::Ambiguous));
    let same = claim("hpp")
        .spec(|s| {
            s.data_source =
                Some(TypedLocalObjectReference { api_group: None, kind: CLAIM_KIND.into(), name: "src".into() });
            s.data_source_ref =
                Some(TypedObjectReference { kind: CLAIM_KIND.into(), name: "src".into(), ..Default::default() });
        })
        .build()
        .spec
        .expect("spec");
    assert_eq!(requested_source(&same, "default"), Ok(Some("src".into())));
}

#[test]
fn a_bound_source_of_ours_is_ready_on_its_owning_node_only() {
    let pool = pool();
    let verdict = check_source(request(&pool, "1Gi"), Some(&bound_source()), Some(&source_pv(NODE)), &me());
    assert_eq!(
        verdict,
        SourceVerdict::Ready { root: pool.root.clone(), dir_name: format!("pvc-{SOURCE_UID}"), marked_for: None }
    );
    // Another node's source is that node's to check and copy (its pool root may differ).
    let mut elsewhere = source_pv(OTHER_NODE);
    elsewhere.spec.as_mut().expect("spec").host_path.as_mut().expect("hostPath").path =
        format!("/mnt/node-b/pvc-{SOURCE_UID}");
    let verdict = check_source(request(&pool, "1Gi"), Some(&bound_source()), Some(&elsewhere), &me());
    assert_eq!(verdict, SourceVerdict::Elsewhere(OTHER_NODE.into()));
}

/// The source's PV as a Block volume: its device node, its backing directory annotated.
fn block_source_pv() -> KeptVolume {
    let name = format!("pvc-{SOURCE_UID}");
    let backing_dir = format!("/var/hpvolumes/{name}");
    KeptVolume::from(KeptVolumeFields {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        labels: KeptMap::default(),
        annotations: KeptMap::from([
            (keys::PROVISIONED_BY, PROVISIONER),
            (keys::PROVISION_ON_NODE, NODE),
            (crate::deciding::block::BACKING_DIR_ANNOTATION, backing_dir.as_str()),
        ]),
        spec: Some(KeptVolumeSpec {
            claim_ref: Some(KeptClaimRef { uid: Some(SOURCE_UID.into()), ..Default::default() }),
            local: Some(KeptDirectory { path: format!("/dev/hostpath-provisioner/{name}") }),
            volume_mode: Some("Block".into()),
            capacity: Some(BTreeMap::from([("storage".to_owned(), Quantity("1Gi".into()))]).into()),
            ..Default::default()
        }),
        status: None,
    })
}

#[test]
fn a_block_source_is_cloned_from_its_backing_directory_and_never_from_its_device() {
    let pool = pool();
    let block = CloneRequest { block: true, ..request(&pool, "1Gi") };
    let verdict = check_source(block, Some(&bound_source()), Some(&block_source_pv()), &me());
    assert_eq!(
        verdict,
        SourceVerdict::Ready { root: pool.root.clone(), dir_name: format!("pvc-{SOURCE_UID}"), marked_for: None }
    );
}

#[test]
fn a_clone_of_another_volume_mode_is_refused_naming_both_modes() {
    let pool = pool();
    let filesystem_from_block =
        check_source(request(&pool, "1Gi"), Some(&bound_source()), Some(&block_source_pv()), &me());
    let SourceVerdict::Refuse(refusal) = filesystem_from_block else { panic!("{filesystem_from_block:?}") };
    assert_eq!(
        refusal,
        CloneRefusal::VolumeMode { source_claim: "src".into(), source_mode: "Block", mode: "Filesystem" }
    );
    assert!(refusal.to_string().contains("use volumeMode Block"), "{refusal}");
    let block = CloneRequest { block: true, ..request(&pool, "1Gi") };
    let block_from_filesystem = check_source(block, Some(&bound_source()), Some(&source_pv(NODE)), &me());
    let SourceVerdict::Refuse(refusal) = block_from_filesystem else { panic!("{block_from_filesystem:?}") };
    assert_eq!(
        refusal,
        CloneRefusal::VolumeMode { source_claim: "src".into(), source_mode: "Filesystem", mode: "Block" }
    );
}

#[test]
fn a_smaller_request_is_refused() {
    let pool = pool();
    let verdict = check_source(request(&pool, "512Mi"), Some(&bound_source()), Some(&source_pv(NODE)), &me());
    assert!(matches!(verdict, SourceVerdict::Refuse(CloneRefusal::Smaller { .. })), "{verdict:?}");
    let bigger = check_source(request(&pool, "2Gi"), Some(&bound_source()), Some(&source_pv(NODE)), &me());
    assert!(matches!(bigger, SourceVerdict::Ready { .. }), "{bigger:?}");
}

#[test]
fn a_missing_deleting_or_unbound_source_waits_with_a_reason() {
    let pool = pool();
    let missing = check_source(request(&pool, "1Gi"), None, None, &me());
    assert!(matches!(&missing, SourceVerdict::Wait(why) if why.contains("does not exist")), "{missing:?}");

    let mut deleting = bound_source();
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let verdict = check_source(request(&pool, "1Gi"), Some(&deleting), Some(&source_pv(NODE)), &me());
    assert!(matches!(&verdict, SourceVerdict::Wait(why) if why.contains("being deleted")), "{verdict:?}");

    let mut pending = bound_source();
    pending.spec.as_mut().expect("spec").volume_name = None;
    pending.status = None;
    let verdict = check_source(request(&pool, "1Gi"), Some(&pending), None, &me());
    assert!(matches!(&verdict, SourceVerdict::Wait(why) if why.contains("not bound")), "{verdict:?}");

    let verdict = check_source(request(&pool, "1Gi"), Some(&bound_source()), None, &me());
    assert!(matches!(&verdict, SourceVerdict::Wait(why) if why.contains("not visible")), "{verdict:?}");
}

#[test]
fn a_source_of_another_class_or_provisioner_or_pool_is_refused() {
    let pool = pool();
    let mut other_class = bound_source();
    other_class.spec.as_mut().expect("spec").storage_class_name = Some("other".into());
    let verdict = check_source(request(&pool, "1Gi"), Some(&other_class), Some(&source_pv(NODE)), &me());
    assert!(matches!(verdict, SourceVerdict::Refuse(CloneRefusal::OtherClass { .. })), "{verdict:?}");

    let mut foreign = source_pv(NODE);
    foreign.annotations.insert(keys::PROVISIONED_BY, "other.io/x");
    let verdict = check_source(request(&pool, "1Gi"), Some(&bound_source()), Some(&foreign), &me());
    assert!(matches!(verdict, SourceVerdict::Refuse(CloneRefusal::NotOurs { .. })), "{verdict:?}");

    let mut elsewhere = source_pv(NODE);
    elsewhere.spec.as_mut().expect("spec").host_path.as_mut().expect("hostPath").path =
        format!("/mnt/other/pvc-{SOURCE_UID}");
    let verdict = check_source(request(&pool, "1Gi"), Some(&bound_source()), Some(&elsewhere), &me());
    assert!(matches!(verdict, SourceVerdict::Refuse(CloneRefusal::OtherPool { .. })), "{verdict:?}");
}

#[test]
fn a_shared_source_can_be_copied_by_any_node() {
    let pool = PoolPath::shared("nfs", "/var/hpvolumes");
    let mut pv = source_pv(NODE);
    pv.annotations.remove(keys::PROVISION_ON_NODE);
    pv.labels = KeptMap::from([(keys::TOPOLOGY_LABEL, "shared")]);
    let verdict = check_source(request(&pool, "1Gi"), Some(&bound_source()), Some(&pv), &me());
    assert_eq!(
        verdict,
        SourceVerdict::Ready { root: pool.root.clone(), dir_name: format!("pvc-{SOURCE_UID}"), marked_for: None }
    );
    assert_eq!(clone_actor(None, Placement::Pinned, &me()), CloneActor::Me);
}

#[test]
fn the_node_holding_the_source_copies_it() {
    assert_eq!(clone_actor(Some(NODE), Placement::Unplaced, &me()), CloneActor::Me);
    assert_eq!(clone_actor(Some(NODE), Placement::Scheduled, &me()), CloneActor::Me);
    assert_eq!(clone_actor(Some(OTHER_NODE), Placement::Unplaced, &me()), CloneActor::Other(OTHER_NODE.into()));
    assert_eq!(
        clone_actor(Some(OTHER_NODE), Placement::Scheduled, &me()),
        CloneActor::WrongNode { source_node: OTHER_NODE.into() }
    );
    assert!(matches!(
        clone_actor(Some(OTHER_NODE), Placement::Pinned, &me()),
        CloneActor::Refuse(CloneRefusal::PinnedElsewhere { .. })
    ));
}

#[test]
fn each_filesystem_copies_its_own_way() {
    assert_eq!(copy_method(FilesystemKind::Btrfs, true), CopyMethod::Snapshot);
    assert_eq!(copy_method(FilesystemKind::Btrfs, false), CopyMethod::Reflink);
    assert_eq!(copy_method(FilesystemKind::Xfs, false), CopyMethod::Reflink);
    assert_eq!(copy_method(FilesystemKind::Xfs, true), CopyMethod::Reflink);
    assert_eq!(copy_method(FilesystemKind::Other, false), CopyMethod::Bytes);
}

/// A pending clone of `src` with `uid`.
fn pending_clone(uid: &str) -> PersistentVolumeClaim {
    let mut clone = claim("hpp").data_source().build();
    clone.metadata.uid = Some(uid.into());
    clone.status = Some(PersistentVolumeClaimStatus { phase: Some("Pending".into()), ..Default::default() });
    clone
}

#[test]
fn the_source_stays_protected_while_another_clone_waits_for_its_copy() {
    // Two clones of one source on a shared pool, copied by two nodes: the first done must not
    // release the source while the other still copies.
    let claims = vec![bound_source(), pending_clone("clone-a"), pending_clone("clone-b")];
    assert!(!may_release_source("src", &claims, Some("clone-a")));
    assert!(!may_release_source("src", &claims, None), "a pass over the source keeps it too");
}

#[test]
fn the_source_is_released_once_no_clone_waits_for_it() {
    let mut bound = pending_clone("clone-b");
    bound.spec.as_mut().expect("spec").volume_name = Some("pvc-clone-b".into());
    bound.status = Some(PersistentVolumeClaimStatus { phase: Some("Bound".into()), ..Default::default() });
    let mut deleting = pending_clone("clone-c");
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    let mut other_source = pending_clone("clone-d");
    other_source.spec.as_mut().expect("spec").data_source.as_mut().expect("source").name = "other".into();
    let plain = claim("hpp").build();
    let claims = vec![bound_source(), pending_clone("clone-a"), bound, deleting, other_source, plain];
    assert!(may_release_source("src", &claims, Some("clone-a")), "only the finished clone named it");
    assert!(!may_release_source("src", &claims, None), "clone-a itself still waits");
    assert!(may_release_source("src", &claims[2..], None), "bound, deleted or other clones do not hold it");
}

#[test]
fn an_enforced_quota_clone_of_a_plain_directory_is_refused_before_copying() {
    assert_eq!(
        check_quota_source(QuotaMode::Enforce, "src", false),
        Err(CloneRefusal::SourceWithoutQuota("src".into()))
    );
    assert_eq!(check_quota_source(QuotaMode::Enforce, "src", true), Ok(()));
    assert_eq!(check_quota_source(QuotaMode::None, "src", false), Ok(()));
}

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;

const OLD: &str = "0a5b8a3e-1111-4c3d-8e9f-000000000001";
const NEW: &str = "0a5b8a3e-2222-4c3d-8e9f-000000000002";
const NS_UID: &str = "0a5b8a3e-3333-4c3d-8e9f-000000000003";
const OTHER_NS_UID: &str = "0a5b8a3e-4444-4c3d-8e9f-000000000004";

fn record() -> CopyRecord {
    CopyRecord {
        snapshot_uid: OLD.into(),
        namespace_uid: NS_UID.into(),
        namespace: "team-a".into(),
        name: "db-before-upgrade".into(),
        taken: "2026-11-28T10:00:00Z".into(),
        method: "reflink".into(),
        restore_size: "10Gi".into(),
        size_bytes: 4096,
        block: false,
    }
}

#[test]
fn a_block_copys_record_says_so_and_reads_back_and_a_filesystem_ones_reads_as_before() {
    let block = CopyRecord { block: true, ..record() };
    assert!(block.to_xattr().ends_with(" volume-mode=Block"), "{}", block.to_xattr());
    assert_eq!(CopyRecord::parse(&block.to_xattr()), Some(block));
    assert!(!record().to_xattr().contains("volume-mode"), "unchanged for a Filesystem volume's copy");
    assert_eq!(CopyRecord::parse(&record().to_xattr()), Some(record()));
    let odd = format!("{} volume-mode=Filesystem", record().to_xattr());
    assert_eq!(CopyRecord::parse(&odd), None, "only Block is ever written");
}

fn object(namespace: &str, name: &str, annotations: &[(&str, &str)]) -> HostPathSnapshot {
    let annotations: BTreeMap<String, String> =
        annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    HostPathSnapshot {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(NEW.into()),
            annotations: Some(annotations),
            ..Default::default()
        },
        ..HostPathSnapshot::new(name, "db")
    }
}

#[test]
fn a_record_reads_back_as_written_and_nothing_else_reads_as_one() {
    let written = record();
    assert_eq!(CopyRecord::parse(&written.to_xattr()), Some(written.clone()));
    let good = written.to_xattr();
    let bad = [
        String::new(),
        good.replace("name=db-before-upgrade", "name=../x"),
        good.replace("size-bytes=4096", "size-bytes=lots"),
        good.replace(&format!("snapshot-uid={OLD}"), "snapshot-uid=nope"),
        format!("{good} name=again"),
        format!("{good} extra=1"),
        good.replace(" method=reflink", ""),
        good.replace("method=reflink", "method="),
    ];
    for value in bad {
        assert_eq!(CopyRecord::parse(&value), None, "{value}");
    }
    assert!(good.len() < MAX_RECORD_BYTES);
}

#[test]
fn provenance_tells_a_new_snapshot_its_own_copy_and_a_made_again_one_apart() {
    assert_eq!(provenance(&object("team-a", "s", &[])), Provenance::Own);
    assert_eq!(provenance(&object("team-a", "s", &[(COPY_UID, NEW), (COPY_NODE, "n1")])), Provenance::Own);
    assert_eq!(
        provenance(&object("team-a", "s", &[(COPY_UID, OLD), (COPY_NODE, "n1")])),
        Provenance::MadeAgain { copy_uid: OLD.into(), node: "n1".into() }
    );
    for broken in
        [vec![(COPY_UID, OLD)], vec![(COPY_UID, "../x"), (COPY_NODE, "n1")], vec![(COPY_UID, OLD), (COPY_NODE, "a/b")]]
    {
        assert!(matches!(provenance(&object("team-a", "s", &broken)), Provenance::Malformed(_)), "{broken:?}");
    }
    let snapshot = object("team-a", "s", &[(COPY_UID, NEW), (COPY_NODE, "n1")]);
    assert!(annotated(&snapshot, NEW, "n1"));
    assert!(!annotated(&snapshot, NEW, "n2"));
}

/// Every combination of what the node may find, and who may ask: a copy is adopted exactly when
/// no object of its UID lives, it is there, its record reads and names the asker's namespace
/// and name, and the namespace is the one it was taken in or an admin handed the copy over.
/// A refusal always says how to take a new snapshot.
#[test]
fn a_copy_goes_back_only_to_its_own_namespace_and_name_and_never_to_two_snapshots() {
    let mut adopted = 0;
    let mut cases = 0;
    let among_others = format!("x, {OLD}");
    let records = [
        ("none", None),
        ("own", Some(record())),
        ("renamed by an adoption cut short", Some(CopyRecord { snapshot_uid: NEW.into(), ..record() })),
        ("of another copy", Some(CopyRecord { snapshot_uid: NS_UID.into(), ..record() })),
        ("of another namespace", Some(CopyRecord { namespace: "team-b".into(), ..record() })),
        ("of another name", Some(CopyRecord { name: "other".into(), ..record() })),
    ];
    for owner_alive in [None, Some("db-before-upgrade")] {
        for found in [FoundAt::Nowhere, FoundAt::Earlier, FoundAt::Own] {
            for (what, record) in &records {
                for namespace_uid in [NS_UID, OTHER_NS_UID] {
                    for adopt in [None, Some("x"), Some(OLD), Some(among_others.as_str())] {
                        cases += 1;
                        let snapshot = object("team-a", "db-before-upgrade", &[(COPY_UID, OLD), (COPY_NODE, "n1")]);
                        let facts = AdoptionFacts {
                            snapshot: &snapshot,
                            copy_uid: OLD,
                            found,
                            record: record.as_ref(),
                            owner_alive,
                            namespace_uid,
                            adopt_annotation: adopt,
                        };
                        let right_record = match found {
                            FoundAt::Nowhere => false,
                            FoundAt::Earlier => *what == "own",
                            FoundAt::Own => matches!(*what, "own" | "renamed by an adoption cut short"),
                        };
                        let handed = adopt.is_some_and(|a| a.contains(OLD));
                        // Under its own UID the copy is the object's whoever lives.
                        let unclaimed = owner_alive.is_none() || found == FoundAt::Own;
                        let expected = unclaimed && right_record && (namespace_uid == NS_UID || handed);
                        match adoption(&facts) {
                            Adoption::Adopt(got) => {
                                assert!(
                                    expected,
                                    "adopted: {what}, {owner_alive:?}, {found:?}, {namespace_uid}, {adopt:?}"
                                );
                                assert_eq!(
                                    (got.namespace.as_str(), got.name.as_str()),
                                    ("team-a", "db-before-upgrade")
                                );
                                adopted += 1;
                            }
                            Adoption::Refuse(why) => {
                                assert!(!expected, "refused: {what}, {owner_alive:?}, {found:?}: {why}");
                                assert!(why.contains(COPY_UID) && why.contains(OLD), "{why}");
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(cases, 2 * 3 * 6 * 2 * 4);
    // In its namespace (4 annotations) or handed over in one made again (2): under the earlier
    // UID its own record with nobody alive (1 x 1), under its own UID either record whoever lives
    // (2 x 2).
    assert_eq!(adopted, (1 + 2 * 2) * (4 + 2));
}

#[test]
fn a_refusal_for_a_namespace_made_again_names_the_admins_annotation() {
    let snapshot = object("team-a", "db-before-upgrade", &[(COPY_UID, OLD), (COPY_NODE, "n1")]);
    let record = record();
    let facts = AdoptionFacts {
        snapshot: &snapshot,
        copy_uid: OLD,
        found: FoundAt::Earlier,
        record: Some(&record),
        owner_alive: None,
        namespace_uid: OTHER_NS_UID,
        adopt_annotation: None,
    };
    let Adoption::Refuse(why) = adoption(&facts) else { panic!("adopted") };
    assert!(why.contains(&format!("{ADOPT_COPY}={OLD}")), "{why}");
}

//! Whose a pattern directory is (issue #44): names are unique within one pattern only, so the
//! owner record decides which claim may take a directory over. Unit cases of the rule, then an
//! enumeration over every collision a small world of patterns, classes, namespaces (made once
//! or twice under one name) and claims produces.

use std::collections::HashSet;

use super::super::*;
use super::identity;

const PATH: &str = "/pool/t_v";
const GONE_PV: &str = "pvc-11111111-2222-4333-8444-555555555555";
const OWN_PV: &str = "pvc-0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182";
const UID_1: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";
const UID_2: &str = "22222222-3333-4444-8555-666666666666";

fn victim() -> ClaimIdentity {
    identity(UID_1, "t", "v", "by-namespace")
}

fn thief() -> ClaimIdentity {
    identity(UID_2, "v", "t", "by-claim")
}

/// A directory marked for a PV that is gone, recorded as `recorded` (if any), asked for by
/// `asker`.
fn gone(recorded: Option<ClaimIdentity>, asker: ClaimIdentity, handed_over: bool) -> DirectoryFacts {
    DirectoryFacts {
        found: Found::MarkedFor(GONE_PV.into()),
        marked_pv_exists: false,
        held_by: None,
        recorded: recorded.map(|owner| OwnerRecord { pv: GONE_PV.into(), owner }),
        asker,
        handed_over,
    }
}

#[test]
fn a_directory_goes_back_only_to_the_claim_it_was_recorded_for() {
    let placing = place(OWN_PV, PATH, &gone(Some(victim()), victim(), false));
    assert_eq!(placing, Placing::Adopt { from: GONE_PV.into(), owner: victim(), handed_from: None });
    // Each part of the identity on its own is enough to refuse.
    let v = victim();
    for other in [
        ClaimIdentity { namespace_uid: UID_2.into(), ..v.clone() },
        ClaimIdentity { namespace: "v".into(), ..v.clone() },
        ClaimIdentity { claim: "t".into(), ..v.clone() },
        ClaimIdentity { class: "by-claim".into(), ..v.clone() },
    ] {
        let placing = place(OWN_PV, PATH, &gone(Some(v.clone()), other.clone(), false));
        assert!(matches!(placing, Placing::Refuse(Occupied::OtherOwner(_))), "{other}: {placing:?}");
    }
}

#[test]
fn the_refusal_names_the_claim_asking_and_whose_the_directory_is_and_how_to_hand_it_over() {
    let Placing::Refuse(why) = place(OWN_PV, PATH, &gone(Some(victim()), thief(), false)) else {
        panic!("a thief is refused");
    };
    let text = why.to_string();
    for part in [
        "claim t/v of StorageClass by-namespace (namespace uid 9a8b7c6d",
        "not for claim v/t of StorageClass by-claim (namespace uid 22222222",
        GONE_PV,
        "/pool/t_v",
        "annotates Namespace v with hostpath-provisioner.kubevirt.io/adopt-directory=t_v",
    ] {
        assert!(text.contains(part), "{part:?} missing from: {text}");
    }
}

#[test]
fn a_directory_of_the_earlier_version_or_with_a_stale_record_goes_to_nobody_without_the_admin() {
    // No record: made by the version that recorded only the PV.
    let Placing::Refuse(why) = place(OWN_PV, PATH, &gone(None, victim(), false)) else {
        panic!("an unrecorded directory is refused");
    };
    assert!(why.to_string().contains("recorded only its PV"), "{why}");
    // A record of another PV than the marker's: the earlier version took it over after a
    // rollback and rewrote the marker only. It proves nothing about the claim now.
    let mut stale = gone(Some(victim()), victim(), false);
    stale.recorded = Some(OwnerRecord { pv: "pvc-other".into(), owner: victim() });
    assert!(matches!(place(OWN_PV, PATH, &stale), Placing::Refuse(Occupied::OtherOwner(_))));
    // Its own PV's marker is its own, whatever the record says; the record is rewritten.
    let mut own = gone(None, victim(), false);
    own.found = Found::MarkedFor(OWN_PV.into());
    assert_eq!(place(OWN_PV, PATH, &own), Placing::Reuse { record: Some(victim()) });
    own.recorded = Some(OwnerRecord { pv: OWN_PV.into(), owner: victim() });
    assert_eq!(place(OWN_PV, PATH, &own), Placing::Reuse { record: None });
}

#[test]
fn an_admin_hands_a_directory_over_on_the_namespace_and_never_past_a_pv_that_holds_it() {
    for recorded in [Some(victim()), None] {
        let placing = place(OWN_PV, PATH, &gone(recorded.clone(), thief(), true));
        let Placing::Adopt { from, owner, handed_from: Some(previous) } = placing else {
            panic!("handed over: {placing:?}");
        };
        assert_eq!((from.as_str(), owner), (GONE_PV, thief()));
        assert!(previous.contains(if recorded.is_some() { "claim t/v" } else { "recorded only its PV" }), "{previous}");
    }
    // The hand-over lifts the identity check only: a PV still holding it, no marker, still refuse.
    let mut held = gone(Some(victim()), thief(), true);
    held.marked_pv_exists = true;
    assert!(matches!(place(OWN_PV, PATH, &held), Placing::Refuse(Occupied::HeldBy { .. })));
    held.marked_pv_exists = false;
    held.held_by = Some("pvc-other".into());
    assert!(matches!(place(OWN_PV, PATH, &held), Placing::Refuse(Occupied::HeldBy { .. })));
    let mut unmarked = gone(None, thief(), true);
    unmarked.found = Found::Unmarked;
    assert!(matches!(place(OWN_PV, PATH, &unmarked), Placing::Refuse(Occupied::NotMarked { .. })));
}

#[test]
fn the_namespace_annotation_names_exact_directories() {
    assert!(handed_over(Some("t_v"), "t_v"));
    assert!(handed_over(Some("a_b, t_v"), "t_v"));
    assert!(!handed_over(Some("t_v2,xt_v"), "t_v"));
    assert!(!handed_over(Some("*"), "t_v"));
    assert!(!handed_over(Some(""), "t_v"));
    assert!(!handed_over(None, "t_v"));
}

#[test]
fn an_owner_record_reads_back_only_whole_and_well_formed() {
    let record = OwnerRecord { pv: GONE_PV.into(), owner: victim() };
    let text = record.to_xattr();
    assert_eq!(text, format!("pv={GONE_PV} namespace-uid={UID_1} namespace=t claim=v class=by-namespace"));
    assert_eq!(OwnerRecord::parse(&text), Some(record.clone()));
    assert!(text.len() <= MAX_OWNER_RECORD_BYTES);
    let longest = OwnerRecord {
        pv: "p".repeat(253),
        owner: identity(UID_1, &"n".repeat(63), &"c".repeat(253), &"s".repeat(253)),
    };
    assert!(longest.to_xattr().len() <= MAX_OWNER_RECORD_BYTES, "{}", longest.to_xattr().len());
    for broken in [
        String::new(),
        GONE_PV.to_owned(),
        text.replace(" class=by-namespace", ""),
        format!("{text} class=other"),
        format!("{text} extra=1"),
        text.replace("namespace=t ", "namespace=T "),
        text.replace(UID_1, "not-a-uid"),
        text.replace(' ', "\n"),
    ] {
        assert_eq!(OwnerRecord::parse(&broken), None, "{broken:?}");
    }
}

/// Every claim of a small world that resolves to a directory already made for another: two
/// classes of one pool for each pair of patterns (mirrored ones, one with a literal beside the
/// namespace), namespaces whose names are another's with a prefix, each made once or twice
/// (deleted and made again: a new UID under the same name), and claims named like namespaces.
/// Once the PV that made the directory is gone, whichever claim resolves to it is given it only
/// when it is the very claim recorded; the victim's own claim made again always gets it back.
#[test]
fn no_claim_ever_adopts_a_directory_recorded_for_another_identity() {
    let patterns = [
        "{namespace}_{claim}",
        "{claim}_{namespace}",
        "x{namespace}_{claim}",
        "{namespace}_{claim}x",
        "{namespace}_x{claim}",
        "{uid}",
    ];
    let names = ["t", "v", "xt", "tx", "xv"];
    let namespace_uids = [UID_1, UID_2];
    let claim_uids = ["aaaaaaaa-0000-4000-8000-000000000001", "aaaaaaaa-0000-4000-8000-000000000002"];
    // A class per pattern, twice (two classes may share a pattern too).
    let classes: Vec<(String, PathPattern)> = patterns
        .iter()
        .enumerate()
        .flat_map(|(i, p)| (0..2).map(move |copy| (format!("class-{i}-{copy}"), p)))
        .map(|(name, p)| (name, PathPattern::parse(p).unwrap_or_else(|e| panic!("{p}: {e}"))))
        .collect();
    // Each claim of the world and the directory its class names.
    let mut claims = Vec::new();
    for (class, pattern) in &classes {
        for namespace in names {
            for namespace_uid in namespace_uids {
                for claim in names {
                    for claim_uid in claim_uids {
                        let Ok(dir) = pattern.resolve(namespace, claim, claim_uid) else { continue };
                        claims.push((identity(namespace_uid, namespace, claim, class), dir));
                    }
                }
            }
        }
    }
    let (mut collisions, mut given_back, mut mirrored, mut renamed) = (0u64, 0u64, false, false);
    for (creator, dir) in &claims {
        for (asker, asked) in &claims {
            if asked != dir {
                continue;
            }
            let path = format!("/pool/{dir}");
            let facts = gone(Some(creator.clone()), asker.clone(), false);
            let placing = place(OWN_PV, &path, &facts);
            if asker == creator {
                assert_eq!(
                    placing,
                    Placing::Adopt { from: GONE_PV.into(), owner: creator.clone(), handed_from: None },
                    "{creator} does not get {dir} back"
                );
                given_back += 1;
                continue;
            }
            collisions += 1;
            mirrored |= creator.namespace == asker.claim && creator.claim == asker.namespace;
            renamed |= creator.namespace == asker.namespace && creator.namespace_uid != asker.namespace_uid;
            match &placing {
                Placing::Refuse(Occupied::OtherOwner(refused)) => {
                    assert_eq!(&refused.asker, asker);
                    assert_eq!(refused.owner, creator.to_string());
                }
                other => panic!("{asker} was given {dir}, recorded for {creator}: {other:?}"),
            }
            // The directory of the earlier version, and a hand-over of another directory, refuse too.
            let unrecorded = gone(None, asker.clone(), false);
            assert!(matches!(place(OWN_PV, &path, &unrecorded), Placing::Refuse(_)), "{asker}: {dir} unrecorded");
            let elsewhere = handed_over(Some(&format!("{dir}x,x{dir}")), dir);
            let handed_elsewhere = gone(Some(creator.clone()), asker.clone(), elsewhere);
            assert!(matches!(place(OWN_PV, &path, &handed_elsewhere), Placing::Refuse(_)), "{asker}: {dir}");
        }
    }
    // The world does collide, in both ways the issue names: the check is not vacuous.
    assert!(mirrored, "no mirrored collision");
    assert!(renamed, "no namespace made again");
    assert!(collisions > 1000, "{collisions} collisions");
    // Each claim its own (at least), and a claim made again under a new UID its predecessor's.
    assert!(given_back as usize > claims.len(), "{given_back} given back of {}", claims.len());
    let distinct: HashSet<_> = claims.iter().map(|(_, dir)| dir).collect();
    assert!(distinct.len() < claims.len());
}

mod earlier_directories {
    use crate::deciding::path_pattern::{EarlierDirectory, OwnerRecord, record_for_earlier_directory};

    const NS_UID: &str = "5b0c1e2a-0000-4000-8000-0000000000a1";

    fn at(second: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(second).unwrap()
    }

    fn earlier(namespace: Option<(&'static str, jiff::Timestamp)>) -> EarlierDirectory<'static> {
        EarlierDirectory {
            pv: "pvc-1",
            marker_names: Some("pvc-1"),
            record: None,
            claim_namespace: "shop",
            claim: "data",
            class: "pattern",
            pv_created: at(1_000),
            namespace,
        }
    }

    #[test]
    fn a_directory_of_the_earlier_version_is_recorded_for_its_pvs_claim_while_its_namespace_is_the_same() {
        let record = record_for_earlier_directory(&earlier(Some((NS_UID, at(500))))).expect("recorded");
        assert_eq!(record.pv, "pvc-1");
        assert_eq!(
            (record.owner.namespace_uid.as_str(), record.owner.namespace.as_str(), record.owner.claim.as_str()),
            (NS_UID, "shop", "data")
        );
        assert_eq!(record.owner.class, "pattern");
        assert!(record_for_earlier_directory(&earlier(Some((NS_UID, at(1_000))))).is_some(), "made the same second");
    }

    #[test]
    fn a_namespace_made_again_since_the_pv_or_gone_gets_no_record() {
        assert_eq!(record_for_earlier_directory(&earlier(Some((NS_UID, at(1_001))))), None, "younger than the PV");
        assert_eq!(record_for_earlier_directory(&earlier(None)), None, "gone");
    }

    #[test]
    fn a_directory_recorded_already_or_marked_for_another_pv_is_left_alone() {
        let mut dir = earlier(Some((NS_UID, at(500))));
        let record = record_for_earlier_directory(&dir).unwrap();
        dir.record = Some(&record);
        assert_eq!(record_for_earlier_directory(&dir), None, "recorded for this PV");
        let stale = OwnerRecord { pv: "pvc-0".into(), ..record.clone() };
        dir.record = Some(&stale);
        assert!(record_for_earlier_directory(&dir).is_some(), "a record of another PV is stale: written anew");
        dir.record = None;
        dir.marker_names = Some("pvc-2");
        assert_eq!(record_for_earlier_directory(&dir), None, "taken over by another PV meanwhile");
        dir.marker_names = None;
        assert_eq!(record_for_earlier_directory(&dir), None, "no marker");
    }
}

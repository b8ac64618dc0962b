use super::*;

const UID: &str = "0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182";
const OTHER_UID: &str = "11111111-2222-4333-8444-555555555555";

fn pattern(value: &str) -> PathPattern {
    PathPattern::parse(value).unwrap_or_else(|e| panic!("{value}: {e}"))
}

#[test]
fn tokens_resolve_to_the_claims_namespace_name_and_uid() {
    assert_eq!(pattern("{namespace}_{claim}").resolve("team-a", "data", UID).unwrap(), "team-a_data");
    assert_eq!(pattern("vol_{claim}_{namespace}").resolve("team-a", "db.0", UID).unwrap(), "vol_db.0_team-a");
    assert_eq!(pattern("{claim}-{uid}").resolve("ns", "data", UID).unwrap(), format!("data-{UID}"));
    assert_eq!(pattern("{uid}").resolve("ns", "data", UID).unwrap(), UID);
}

#[test]
fn a_pattern_reaching_outside_one_directory_or_naming_nothing_is_refused() {
    for (value, error) in [
        ("", PatternError::Empty),
        ("{namespace}/{claim}", PatternError::Separator),
        ("../{uid}", PatternError::Separator),
        ("/abs/{uid}", PatternError::Separator),
        ("{uid} x", PatternError::Character(' ')),
        ("{uid}\\", PatternError::Character('\\')),
        ("{uid}%2f", PatternError::Character('%')),
        ("{node}_{uid}", PatternError::UnknownToken("node".into())),
        ("{{uid}}", PatternError::UnknownToken("{uid".into())),
        ("{.PVC.Name}_{uid}", PatternError::UnknownToken(".PVC.Name".into())),
        ("{uid", PatternError::Unclosed),
        ("{uid}_{uid}", PatternError::Repeated("uid")),
        (".{uid}", PatternError::Leading('.')),
        ("..{uid}", PatternError::Leading('.')),
        ("-{uid}", PatternError::Leading('-')),
        ("{claim}", PatternError::NotUnique),
        ("{namespace}-{claim}", PatternError::NotUnique),
        ("{namespace}.{claim}", PatternError::NotUnique),
        ("{claim}_x", PatternError::NotUnique),
        ("x_{namespace}{claim}", PatternError::NotUnique),
        ("fixed", PatternError::NotUnique),
    ] {
        assert_eq!(PathPattern::parse(value), Err(error.clone()), "{value:?}");
        assert!(!error.to_string().is_empty());
    }
    assert!(PatternError::NotUnique.to_string().contains("{namespace}_{claim}"));
}

/// Every accepted pattern gives distinct claims distinct directories: checked over every
/// namespace and claim name of a small alphabet holding the characters that could blur a split
/// (`-`, `.`), for patterns that place literal text around and between the tokens.
#[test]
fn no_two_claims_get_the_same_directory_from_an_accepted_pattern() {
    let words = |max: usize, dots: bool| {
        let alphabet: &[char] = if dots { &['a', 'b', '-', '.'] } else { &['a', 'b', '-'] };
        let mut all = vec![String::new()];
        let mut out = Vec::new();
        for _ in 0..max {
            all = all.iter().flat_map(|w| alphabet.iter().map(move |c| format!("{w}{c}"))).collect();
            out.extend(all.iter().cloned());
        }
        out
    };
    let namespaces: Vec<String> = words(3, false).into_iter().filter(|n| layout::is_dns_label(n)).collect();
    let claims: Vec<String> = words(4, true).into_iter().filter(|c| layout::is_dns_subdomain(c)).collect();
    assert!(namespaces.len() > 10 && claims.len() > 30, "{} {}", namespaces.len(), claims.len());
    for value in ["{namespace}_{claim}", "{claim}_{namespace}", "a-{namespace}-_-{claim}.b", "{claim}._{namespace}_"] {
        let pattern = pattern(value);
        let mut seen = std::collections::HashMap::new();
        for namespace in &namespaces {
            for claim in &claims {
                let name = pattern.resolve(namespace, claim, UID).unwrap();
                if let Some(first) = seen.insert(name.clone(), (namespace.clone(), claim.clone())) {
                    panic!("{value}: {first:?} and {:?} both get {name}", (namespace, claim));
                }
            }
        }
    }
}

#[test]
fn values_from_the_api_are_checked_again_before_forming_a_name() {
    let p = pattern("{namespace}_{claim}");
    assert!(matches!(p.resolve("ns", "../etc", UID), Err(layout::NameError::BadClaimName(_))));
    assert!(matches!(p.resolve("ns", "a/b", UID), Err(layout::NameError::BadClaimName(_))));
    assert!(matches!(p.resolve("..", "data", UID), Err(layout::NameError::BadNamespace(_))));
    assert!(matches!(p.resolve("a.b", "data", UID), Err(layout::NameError::BadNamespace(_))));
    assert!(matches!(p.resolve("ns", "data", "../../x"), Err(layout::NameError::BadUid(_))));
}

#[test]
fn a_name_too_long_or_reading_as_another_volumes_directory_is_refused() {
    let long_claim = format!("{}.{}.{}.{}", "a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61));
    let refusal = pattern("{namespace}_{claim}").resolve("ns", &long_claim, UID).unwrap_err();
    assert_eq!(refusal, layout::NameError::PatternTooLong { name_bytes: 256 });
    assert!(refusal.to_string().contains("shorten"), "{refusal}");
    // A claim named after another volume's directory: deletion would read it as that volume's.
    let forged = format!("x-pvc-{OTHER_UID}");
    let refusal = pattern("{namespace}_{claim}").resolve("ns", &forged, UID).unwrap_err();
    assert!(matches!(refusal, layout::NameError::PatternLooksLikeVolume { ref uid, .. } if uid == OTHER_UID));
    // Its own UID in that shape is one of the usual layouts, and fine.
    let own = pattern("{namespace}_{claim}-pvc-{uid}").resolve("ns", "data", UID).unwrap();
    assert_eq!(layout::uid_of_dir(&own), Some(UID));
}

const NS_UID: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";

/// A claim asking for (or recorded on) a directory.
pub(super) fn identity(namespace_uid: &str, namespace: &str, claim: &str, class: &str) -> ClaimIdentity {
    ClaimIdentity {
        namespace_uid: namespace_uid.to_owned(),
        namespace: namespace.to_owned(),
        claim: claim.to_owned(),
        class: class.to_owned(),
    }
}

fn asker() -> ClaimIdentity {
    identity(NS_UID, "ns", "data", "retain")
}

/// The facts of the claim [`asker`], a directory found there recorded for that same claim.
fn facts(found: Found, marked_pv_exists: bool, held_by: Option<&str>) -> DirectoryFacts {
    let recorded = match &found {
        Found::MarkedFor(pv) => Some(OwnerRecord { pv: pv.clone(), owner: asker() }),
        Found::Absent | Found::Unmarked => None,
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

fn adopt(from: &str) -> Placing {
    Placing::Adopt { from: from.into(), owner: asker(), handed_from: None }
}

#[test]
fn an_existing_directory_is_taken_over_only_when_marked_and_held_by_no_pv() {
    let path = "/pool/ns_data";
    let marked = |pv: &str| Found::MarkedFor(pv.to_owned());
    assert_eq!(place("pvc-2", path, &facts(Found::Absent, false, None)), Placing::Make { owner: asker() });
    assert_eq!(place("pvc-2", path, &facts(marked("pvc-2"), true, None)), Placing::Reuse { record: None });
    assert_eq!(place("pvc-2", path, &facts(marked("pvc-1"), false, None)), adopt("pvc-1"));
    let refused = place("pvc-2", path, &facts(Found::Unmarked, false, None));
    assert_eq!(refused, Placing::Refuse(Occupied::NotMarked { path: path.into() }));
    // The marker's PV exists (Released under Retain): its data is its own until it is deleted.
    let held = Placing::Refuse(Occupied::HeldBy { path: path.into(), pv: "pvc-1".into() });
    assert_eq!(place("pvc-2", path, &facts(marked("pvc-1"), true, None)), held);
    // Another PV names the path (being deleted, its directory moved aside for a moment).
    assert_eq!(place("pvc-2", path, &facts(Found::Absent, false, Some("pvc-1"))), held);
    assert_eq!(place("pvc-2", path, &facts(marked("pvc-2"), true, Some("pvc-1"))), held);
    if let Placing::Refuse(why) = held {
        assert!(why.to_string().contains("once that PV is deleted"), "{why}");
    }
}

#[test]
fn a_directory_is_deleted_only_for_the_pv_its_marker_names() {
    assert!(marker_allows_deletion("pvc-1", Some("pvc-1")));
    assert!(!marker_allows_deletion("pvc-1", Some("pvc-2")));
    assert!(!marker_allows_deletion("pvc-1", None));
}

mod identity;
mod model;

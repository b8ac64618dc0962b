//! Property tests of the path rules (docs/architecture.md, deletion rules): directory names derived from any valid
//! claim are short, stable, single components that the deletion rules give back, the deletion
//! rules refuse anything that is not a direct child of the pool root, and a PV in no served pool
//! is never told to serve a pool that would nest with a served one.
//!
//! Only the crate's public API is used. The case counts are kept moderate so this file runs in a
//! few seconds as part of `cargo test`; the fuzz targets in fuzz/ cover the same rules at length.

use std::path::PathBuf;

use hostpath_provisioner::deciding::layout::{self, AcceptedPath, PathRefusal, PoolPath};
use hostpath_provisioner::deciding::unserved::{self, Placement, ServeAdvice};
use hostpath_provisioner::deciding::volume::DeleteRefusal;
use hostpath_provisioner::filesystem::VolumeDirName;
use proptest::prelude::*;

const ROOT: &str = "/var/hpvolumes";

fn pools() -> Vec<PoolPath> {
    vec![PoolPath::local("legacy", PathBuf::from(ROOT))]
}

/// A DNS-1123 label: 1 to 63 of `[a-z0-9-]`, starting and ending with a letter or digit.
fn label() -> impl Strategy<Value = String> {
    prop::string::string_regex("[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?").expect("label regex")
}

/// Labels to start a name with: any, or three long ones so that names reach the shortening.
fn leading_labels() -> impl Strategy<Value = Vec<String>> {
    let long_label = prop::string::string_regex("[a-z0-9]{55,63}").expect("long label regex");
    prop_oneof![prop::collection::vec(label(), 0..=3), prop::collection::vec(long_label, 3)]
}

/// A DNS-1123 subdomain (what claim names are), up to 253 bytes; long names are drawn often so
/// that shortening is exercised.
fn claim_name() -> impl Strategy<Value = String> {
    (leading_labels(), label())
        .prop_map(|(mut labels, last)| {
            labels.push(last);
            labels.join(".")
        })
        .prop_filter("at most 253 bytes", |n| n.len() <= 253)
}

/// A Kubernetes UID (lowercase RFC 4122 text form).
fn uid() -> impl Strategy<Value = String> {
    "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
}

/// One path component that is neither empty, `.` nor `..`.
fn component() -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9._-]{1,12}", Just("var".to_owned()), Just("hpvolumes".to_owned())]
        .prop_filter("a normal component", |c| c != "." && c != "..")
}

/// Any path-like text: components of every kind, absolute or not.
fn path_text() -> impl Strategy<Value = String> {
    let part = prop_oneof![
        component(),
        Just(String::new()),
        Just(".".to_owned()),
        Just("..".to_owned()),
        Just("var/hpvolumes".to_owned()),
    ];
    (any::<bool>(), prop::collection::vec(part, 0..8), any::<bool>()).prop_map(|(absolute, parts, trailing)| {
        let mut path = if absolute { "/".to_owned() } else { String::new() };
        path.push_str(&parts.join("/"));
        if trailing {
            path.push('/');
        }
        path
    })
}

/// An absolute path of `count` components drawn from a few names (and some with ',' or spaces),
/// so that two of them are often one inside the other, equal, or siblings sharing a prefix.
fn near_path(count: std::ops::Range<usize>) -> impl Strategy<Value = String> {
    let part = prop_oneof![
        Just("a".to_owned()),
        Just("ab".to_owned()),
        Just("var".to_owned()),
        Just("hpvolumes".to_owned()),
        Just("x,y".to_owned()),
        Just("sp ".to_owned()),
        "[a-c]{1,2}",
    ];
    prop::collection::vec(part, count).prop_map(|parts| format!("/{}", parts.join("/")))
}

/// A directory name as either build writes it for `uid`.
fn dir_for(name: &str, uid: &str, prefix: bool) -> String {
    layout::dir_name(name, uid, prefix).expect("valid claim name and UID")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn dir_name_is_short_stable_and_deleted_back(name in claim_name(), uid in uid(), prefix in any::<bool>()) {
        let dir = dir_for(&name, &uid, prefix);
        let pv = layout::pv_name(&uid);
        prop_assert!(dir.len() <= layout::MAX_DIR_NAME_BYTES, "{} bytes: {dir}", dir.len());
        prop_assert_eq!(&dir, &dir_for(&name, &uid, prefix), "not deterministic");
        prop_assert!(VolumeDirName::new(&dir).is_ok(), "{dir} is not a single safe component");
        prop_assert!(layout::matches_layout(&dir, &pv), "{dir} does not match the layouts of {pv}");
        prop_assert!(dir.ends_with(&pv));
        if !prefix {
            prop_assert_eq!(&dir, &pv);
        }
        let accepted = layout::accept_delete_path(&format!("{ROOT}/{dir}"), &pv, &pools());
        prop_assert_eq!(accepted, Ok(AcceptedPath { pool: "legacy".into(), root: ROOT.into(), dir_name: dir, marked: false }));
    }

    /// Up to the 32-bit hash of shortened names: a name can be crafted to collide (the 214-byte
    /// `<cut>-<hash>` of a long name gets the long name's directory), which is harmless because
    /// the directory also carries the UID and a UID names a single claim.
    #[test]
    fn distinct_claim_names_get_distinct_prefixed_dirs(
        common in leading_labels(),
        shared in "[a-z0-9]{0,40}",
        tail_a in "[a-z0-9]{1,20}",
        tail_b in "[a-z0-9]{1,20}",
        uid in uid(),
    ) {
        // Names alike up to their last few bytes, often long enough that both are shortened and
        // differ only past the cut, where the hash alone keeps them apart.
        let name = |tail: &str| {
            let mut labels = common.clone();
            labels.push(format!("{shared}{tail}"));
            labels.join(".")
        };
        let (a, b) = (name(&tail_a), name(&tail_b));
        prop_assume!(a != b);
        prop_assert_ne!(dir_for(&a, &uid, true), dir_for(&b, &uid, true), "{} and {} collide", a, b);
    }

    #[test]
    fn a_parent_component_anywhere_is_refused(
        before in prop::collection::vec(component(), 0..4),
        after in prop::collection::vec(component(), 0..4),
        name in claim_name(),
        uid in uid(),
        prefix in any::<bool>(),
    ) {
        let dir = dir_for(&name, &uid, prefix);
        // Put `..` in, around and after a path that would otherwise be accepted.
        let variants = [
            format!("{ROOT}/../{}/{dir}", before.join("/")),
            format!("/{}/../{ROOT}/{dir}", before.join("/")),
            format!("{ROOT}/{dir}/.."),
            format!("{ROOT}/{dir}/../{dir}"),
            format!("{ROOT}/{}/../{dir}", after.join("/")),
        ];
        for path in variants {
            prop_assert!(
                matches!(
                    layout::accept_delete_path(&path, &layout::pv_name(&uid), &pools()),
                    Err(PathRefusal::ParentComponent(_))
                ),
                "{} was not refused for its '..'", path
            );
        }
    }

    #[test]
    fn paths_not_under_the_pool_root_are_refused(
        parents in prop::collection::vec(component(), 0..4),
        name in claim_name(),
        uid in uid(),
        prefix in any::<bool>(),
        relative in any::<bool>(),
    ) {
        let parent = format!("/{}", parents.join("/"));
        prop_assume!(layout::normalise(&parent).ok() != Some(PathBuf::from(ROOT)));
        let dir = dir_for(&name, &uid, prefix);
        let path = if relative { format!("var/hpvolumes/{dir}") } else { format!("{parent}/{dir}") };
        let result = layout::accept_delete_path(&path, &layout::pv_name(&uid), &pools());
        // Deeper inside the pool, it is refused naming the pool; elsewhere, as in no pool.
        let inside = !relative && layout::normalise(&parent).is_ok_and(|p| p.starts_with(ROOT));
        if inside {
            prop_assert!(matches!(result, Err(PathRefusal::NestedInPool { .. })), "{} was not refused: {:?}", path, result);
        } else {
            prop_assert!(
                matches!(result, Err(PathRefusal::OutsidePools { .. }) | Err(PathRefusal::NotAbsolute(_))),
                "{} was not refused: {:?}", path, result
            );
        }
    }

    #[test]
    fn an_extra_nested_component_is_refused(
        extra in component(),
        name in claim_name(),
        uid in uid(),
        prefix in any::<bool>(),
    ) {
        let dir = dir_for(&name, &uid, prefix);
        let pv = layout::pv_name(&uid);
        for path in [format!("{ROOT}/{extra}/{dir}"), format!("{ROOT}/{dir}/{extra}"), format!("{ROOT}/{dir}/{dir}")] {
            prop_assert!(
                matches!(
                    layout::accept_delete_path(&path, &pv, &pools()),
                    Err(PathRefusal::NestedInPool { ref pool, .. }) if pool == "legacy"
                ),
                "{} was not refused as inside pool legacy", path
            );
        }
    }

    #[test]
    fn another_claims_directory_is_refused(name in claim_name(), uid in uid(), other in uid(), prefix in any::<bool>()) {
        prop_assume!(uid != other);
        let dir = dir_for(&name, &other, prefix);
        let result = layout::accept_delete_path(&format!("{ROOT}/{dir}"), &layout::pv_name(&uid), &pools());
        prop_assert!(matches!(result, Err(PathRefusal::UnknownLayout { .. })), "{}: {:?}", dir, result);
    }

    /// The advice rule: whatever the served pools and the PV's path, a path in or at the root of
    /// a served pool is never "in no pool", and the only pool ever advised is the path's parent,
    /// one the configuration accepts and that neither contains nor lies in a served pool.
    #[test]
    fn no_pool_is_advised_that_would_nest_with_a_served_one(
        roots in prop::collection::vec(near_path(1..4), 1..4),
        path in near_path(0..6),
        name_it in any::<bool>(),
        uid in uid(),
    ) {
        let pv = layout::pv_name(&uid);
        let path = if name_it { format!("{path}/{pv}") } else { path };
        let served: Vec<PoolPath> =
            roots.iter().enumerate().map(|(i, root)| PoolPath::local(&format!("pool{i}"), PathBuf::from(root))).collect();
        let normalised = layout::normalise(&path).expect("generated paths are absolute, without '..'");
        let in_a_served_pool = served.iter().any(|pool| normalised.starts_with(&pool.root));
        let placement = unserved::place(&path, &pv, &served);
        let text = match &placement {
            Placement::ServedVolume(accepted) => {
                let root = &served.iter().find(|p| p.name == accepted.pool).expect("a served pool").root;
                prop_assert_eq!(normalised.parent(), Some(root.as_path()));
                String::new()
            }
            Placement::NotAVolume(refusal) => {
                prop_assert!(in_a_served_pool, "{} is in no served pool but refused as {:?}", path, refusal);
                DeleteRefusal::UnsafePath { path: path.clone(), refusal: refusal.clone() }.to_string()
            }
            Placement::Unserved(advice) => {
                prop_assert!(!in_a_served_pool, "{} is in a served pool, yet called unserved", path);
                if let ServeAdvice::ServeParent(parent) = advice {
                    prop_assert_eq!(Some(PathBuf::from(parent)), normalised.parent().map(PathBuf::from));
                    prop_assert_eq!(layout::pool_root(parent), Some(PathBuf::from(parent)), "not a valid pool root");
                }
                let refusal = DeleteRefusal::NoNodeServesPath { path: path.clone(), roots: roots.join(", "), advice: advice.clone() };
                refusal.to_string()
            }
        };
        // Whatever the event says, every pool it advises is clear of the served ones.
        for advised in text.split("--pool NAME=").skip(1) {
            let advised = PathBuf::from(advised.split(')').next().unwrap_or_default());
            for pool in &served {
                prop_assert!(
                    !advised.starts_with(&pool.root) && !pool.root.starts_with(&advised),
                    "{}: advises {} next to served {}", path, advised.display(), pool.root.display()
                );
            }
        }
    }

    #[test]
    fn normalise_is_idempotent(path in path_text()) {
        if let Ok(once) = layout::normalise(&path) {
            let text = once.to_str().expect("UTF-8 in, UTF-8 out");
            prop_assert_eq!(layout::normalise(text), Ok(once.clone()), "normalise({}) = {:?}", path, once);
            prop_assert!(!text.contains("//") && !text.split('/').any(|c| c == "." || c == ".."), "{}", text);
        }
    }
}

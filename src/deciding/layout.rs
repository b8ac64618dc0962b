//! Volume layout: PV names, directory names, the node label, and which `hostPath` paths may be
//! deleted (docs/architecture.md: compatibility contract, volume shape, deletion rules). Pure functions over plain data.

use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// Longest name a directory entry may have on Linux filesystems.
pub const MAX_DIR_NAME_BYTES: usize = 255;
/// Longest label value Kubernetes accepts.
const MAX_LABEL_VALUE_BYTES: usize = 63;

/// A configured pool: a name, an absolute root directory, and whether it is a network
/// filesystem mounted at the same path on every node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolPath {
    /// Pool name (`legacy` for `PV_DIR`, as in the kubevirt CSI driver).
    pub name: String,
    /// Absolute, lexically normalised root directory.
    pub root: PathBuf,
    /// Declared shared (`--pool NAME=PATH,shared`): serves only the `shared` topology.
    pub shared: bool,
    /// Bytes kept free in this pool (`reserve=SIZE`), instead of `RESERVED_SPACE`.
    pub reserve: Option<u64>,
    /// How room is counted in this pool (`accounting=free|requests`), instead of
    /// `--capacity-accounting`.
    pub accounting: Option<crate::deciding::capacity::CapacityAccounting>,
    /// Usable only while its root is a mount point (`mountpoint`), as `REQUIRE_MOUNTPOINT` for
    /// every pool: a pool on a disk mounted later (a claim the operator mounts) never receives
    /// volumes on the root disk beneath it.
    pub require_mountpoint: bool,
}

impl PoolPath {
    /// A node-local pool.
    pub fn local(name: &str, root: impl Into<PathBuf>) -> PoolPath {
        PoolPath {
            name: name.to_owned(),
            root: root.into(),
            shared: false,
            reserve: None,
            accounting: None,
            require_mountpoint: false,
        }
    }

    /// A pool on a network filesystem mounted at the same path on every node.
    pub fn shared(name: &str, root: impl Into<PathBuf>) -> PoolPath {
        PoolPath { shared: true, ..PoolPath::local(name, root) }
    }

    /// How the pool is advertised to, and matched against, other nodes.
    pub fn key(&self) -> crate::deciding::topology::PoolKey {
        crate::deciding::topology::PoolKey::new(&self.name, &self.root.to_string_lossy())
    }
}

/// `pvc-<uid>`: the PV name both builds derive from the claim UID.
pub fn pv_name(claim_uid: &str) -> String {
    format!("pvc-{claim_uid}")
}

/// The UID inside a PV name `pvc-<uid>`, if it has that shape.
pub fn uid_from_pv_name(pv_name: &str) -> Option<&str> {
    pv_name.strip_prefix("pvc-").filter(|uid| is_uid(uid))
}

/// A Kubernetes UID as the API server generates it (RFC 4122 text form, lowercase hex).
pub fn is_uid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_digit() || ('a'..='f').contains(&c),
        })
}

/// The claim UID in a directory name of any known layout (`...pvc-<uid>`).
pub fn uid_of_dir(name: &str) -> Option<&str> {
    let uid = name.get(name.len().checked_sub(36)?..)?;
    let rest = &name[..name.len() - 36];
    (is_uid(uid) && (rest == "pvc-" || rest.ends_with("-pvc-"))).then_some(uid)
}

/// A DNS-1123 subdomain (what claim names and namespaces are), checked again because a path is
/// built from it and the API is not trusted. As the API server checks it: up to 253 characters,
/// with no limit on the parts between dots (a claim named with 253 letters is valid, and must
/// be served, or refused for what it asks, not for its name).
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && label.as_bytes()[0] != b'-'
                && label.as_bytes()[label.len() - 1] != b'-'
        })
}

/// A DNS-1123 label (what namespaces and pool names are).
pub fn is_dns_label(s: &str) -> bool {
    is_dns_subdomain(s) && s.len() <= 63 && !s.contains('.')
}

/// Why a directory name could not be derived.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The claim UID is not a UID.
    #[error("claim UID {0:?} is not a valid UID")]
    BadUid(String),
    /// The claim name is not a DNS-1123 subdomain.
    #[error("claim name {0:?} is not a valid DNS-1123 name")]
    BadClaimName(String),
    /// The namespace is not a DNS-1123 label.
    #[error("namespace {0:?} is not a valid DNS-1123 label")]
    BadNamespace(String),
    /// A `pathPattern` name longer than a directory name may be.
    #[error(
        "the class's pathPattern gives this claim a directory name of {name_bytes} bytes, over the 255 a directory name may have; shorten the claim's name or the pattern"
    )]
    PatternTooLong {
        /// Its length.
        name_bytes: usize,
    },
    /// A `pathPattern` name that reads as the `pvc-<uid>` directory of another volume.
    #[error(
        "the class's pathPattern gives this claim the directory name {name:?}, which reads as the directory of the volume of claim UID {uid}; rename the claim or change the pattern"
    )]
    PatternLooksLikeVolume {
        /// The name.
        name: String,
        /// The UID it reads as.
        uid: String,
    },
}

/// The directory name for a claim: `pvc-<uid>`, or `<claim>-pvc-<uid>` with the naming prefix.
///
/// A prefixed name over 255 bytes (claim names reach 253) is shortened deterministically: the
/// claim name is cut and a hash of the full name keeps distinct claims distinct. The suffix
/// `-pvc-<uid>` is always kept whole, because deletion recognises volumes by it.
pub fn dir_name(claim_name: &str, claim_uid: &str, use_naming_prefix: bool) -> Result<String, NameError> {
    if !is_uid(claim_uid) {
        return Err(NameError::BadUid(claim_uid.to_owned()));
    }
    let pv = pv_name(claim_uid);
    if !use_naming_prefix {
        return Ok(pv);
    }
    if !is_dns_subdomain(claim_name) {
        return Err(NameError::BadClaimName(claim_name.to_owned()));
    }
    let full = format!("{claim_name}-{pv}");
    if full.len() <= MAX_DIR_NAME_BYTES {
        return Ok(full);
    }
    let hash = short_hash(claim_name);
    // <cut claim>-<hash>-pvc-<uid>
    let keep = MAX_DIR_NAME_BYTES - pv.len() - hash.len() - 2;
    // Claim names are ASCII, so any byte index is a char boundary.
    let cut = claim_name[..keep].trim_end_matches(['-', '.']);
    Ok(format!("{cut}-{hash}-{pv}"))
}

fn short_hash(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of our node label on PVs: the node name when it is a valid label value, otherwise a
/// stable hash of it (node names may be 253 bytes, label values only 63).
pub fn node_label_value(node_name: &str) -> String {
    let valid = !node_name.is_empty()
        && node_name.len() <= MAX_LABEL_VALUE_BYTES
        && node_name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && node_name.as_bytes()[0].is_ascii_alphanumeric()
        && node_name.as_bytes()[node_name.len() - 1].is_ascii_alphanumeric();
    if valid {
        node_name.to_owned()
    } else {
        let digest = Sha256::digest(node_name.as_bytes());
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256-{hex}")
    }
}

/// The finalizer by which `node` keeps an `everyNode` PV alive while it may hold a copy.
pub fn copy_finalizer(node: &str) -> String {
    format!("{}/{}", crate::keys::COPY_FINALIZER_PREFIX, node_label_value(node))
}

/// Why a PV's `hostPath.path` is not accepted for deletion.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathRefusal {
    /// Not an absolute path.
    #[error("path {0:?} is not absolute")]
    NotAbsolute(String),
    /// Contains `..`, which cannot be resolved lexically without trusting symlinks.
    #[error("path {0:?} contains '..'")]
    ParentComponent(String),
    /// In no pool at all: neither a pool root nor inside one.
    #[error("path {path:?} is not directly under a pool root ({roots})")]
    OutsidePools {
        /// The refused path.
        path: String,
        /// The configured roots, for the message.
        roots: String,
    },
    /// The root of a pool itself: it holds the pool's volumes and is none of them.
    #[error(
        "path {path:?} is the root of pool {pool}, not a volume directory in it (a volume is a directory directly under its pool's root)"
    )]
    PoolRoot {
        /// The refused path.
        path: String,
        /// The pool it is the root of.
        pool: String,
    },
    /// Inside a pool, but deeper than directly under its root.
    #[error(
        "path {path:?} is inside pool {pool} ({root}) but not directly under its root, where the pool's volume directories are"
    )]
    NestedInPool {
        /// The refused path.
        path: String,
        /// The pool it is inside.
        pool: String,
        /// That pool's root.
        root: String,
    },
    /// The last component is not one of the known directory layouts for this PV.
    #[error(
        "directory name {name:?} does not match the layouts for PV {pv} (pvc-<uid>, <claim>-pvc-<uid>, <namespace>-<claim>-pvc-<uid>)"
    )]
    UnknownLayout {
        /// The last path component.
        name: String,
        /// The PV name.
        pv: String,
    },
    /// The PV name is not `pvc-<uid>`, so no layout can match.
    #[error("PV name {0:?} is not pvc-<uid>; only volumes named by a claim UID are deleted")]
    ForeignPvName(String),
}

/// A path accepted for deletion: which pool and which entry directly under its root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptedPath {
    /// Pool name.
    pub pool: String,
    /// The pool root holding it (a pool of several roots has one per disk).
    pub root: PathBuf,
    /// Directory name directly under the pool root.
    pub dir_name: String,
    /// The name alone does not tie the directory to the PV (a `pathPattern` name): the
    /// provisioner's marker on the directory must name the PV, read before anything is done to
    /// it and again once it is moved aside (`deciding::path_pattern`).
    pub marked: bool,
}

/// Lexically normalises an absolute path: drops `.` and duplicate or trailing slashes. Refuses
/// `..` (resolving it lexically could disagree with the kernel when a symlink is involved).
pub fn normalise(path: &str) -> Result<PathBuf, PathRefusal> {
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(PathRefusal::NotAbsolute(path.to_owned()));
    }
    let mut out = PathBuf::from("/");
    for component in p.components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => out.push(part),
            Component::ParentDir => return Err(PathRefusal::ParentComponent(path.to_owned())),
            Component::Prefix(_) => return Err(PathRefusal::NotAbsolute(path.to_owned())),
        }
    }
    Ok(out)
}

/// A directory that can be a pool root (`PV_DIR`, `--pool`): absolute, without `..`, not `/`,
/// and free of ',' (the separator of pool lists and of the pools a node advertises in its
/// lease). Normalised.
pub fn pool_root(path: &str) -> Option<PathBuf> {
    normalise(path).ok().filter(|p| p.parent().is_some() && !path.contains(','))
}

/// Decides whether `host_path` of PV `pv_name` may be deleted: it must be a direct child of a
/// pool root and named in one of the layouts either build ever wrote, with the PV's own UID.
/// A path in a pool but not directly under its root (the root itself, or deeper) is refused
/// saying which pool, so that no one is told to serve it as a pool of its own.
pub fn accept_delete_path(host_path: &str, pv_name: &str, pools: &[PoolPath]) -> Result<AcceptedPath, PathRefusal> {
    accept_volume_path(host_path, pv_name, pools, false)
}

/// As [`accept_delete_path`], for a PV that says its directory was named by a `pathPattern`
/// (`named_by_pattern`): a name of none of the `pvc-<uid>` layouts is then accepted when it
/// could be a pattern's (letters, digits, `.`, `_`, `-`, not hidden), as [`AcceptedPath::marked`],
/// to be checked against the directory's marker. A name of those layouts is still checked by
/// name.
pub fn accept_volume_path(
    host_path: &str,
    pv_name: &str,
    pools: &[PoolPath],
    named_by_pattern: bool,
) -> Result<AcceptedPath, PathRefusal> {
    if uid_from_pv_name(pv_name).is_none() {
        return Err(PathRefusal::ForeignPvName(pv_name.to_owned()));
    }
    let path = normalise(host_path)?;
    if let Some(pool) = pools.iter().find(|pool| pool.root == path) {
        return Err(PathRefusal::PoolRoot { path: host_path.to_owned(), pool: pool.name.clone() });
    }
    let parent = path.parent().unwrap_or(&path);
    let Some(pool) = pools.iter().find(|pool| pool.root == parent) else {
        // The innermost pool holding it, when pools of several nodes nest.
        let holding =
            pools.iter().filter(|pool| path.starts_with(&pool.root)).max_by_key(|pool| pool.root.as_os_str().len());
        return Err(match holding {
            Some(pool) => PathRefusal::NestedInPool {
                path: host_path.to_owned(),
                pool: pool.name.clone(),
                root: pool.root.display().to_string(),
            },
            None => outside(host_path, pools),
        });
    };
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
        return Err(outside(host_path, pools));
    };
    let marked = if matches_layout(name, pv_name) {
        false
    } else if named_by_pattern && could_be_pattern_name(name) && uid_of_dir(name).is_none() {
        true
    } else {
        return Err(PathRefusal::UnknownLayout { name: name.to_owned(), pv: pv_name.to_owned() });
    };
    Ok(AcceptedPath { pool: pool.name.clone(), root: pool.root.clone(), dir_name: name.to_owned(), marked })
}

fn outside(host_path: &str, pools: &[PoolPath]) -> PathRefusal {
    let roots = pools.iter().map(|p| p.root.display().to_string()).collect::<Vec<_>>().join(", ");
    PathRefusal::OutsidePools { path: host_path.to_owned(), roots }
}

/// A name a `pathPattern` can give: starts with a letter or digit, then letters, digits, `.`,
/// `_`, `-` (never a hidden bookkeeping entry such as `.hpp-trash`).
fn could_be_pattern_name(name: &str) -> bool {
    name.len() <= MAX_DIR_NAME_BYTES
        && name.as_bytes().first().is_some_and(u8::is_ascii_alphanumeric)
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// `pvc-<uid>`, or `<prefix>-pvc-<uid>` where the prefix looks like a claim name, possibly
/// preceded by a namespace (both DNS-1123 characters) or shortened with a hash.
pub fn matches_layout(dir_name: &str, pv_name: &str) -> bool {
    if dir_name == pv_name {
        return true;
    }
    let Some(prefix) = dir_name.strip_suffix(pv_name).and_then(|p| p.strip_suffix('-')) else {
        return false;
    };
    !prefix.is_empty()
        && dir_name.len() <= MAX_DIR_NAME_BYTES
        && prefix.as_bytes()[0].is_ascii_alphanumeric()
        && prefix.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182";
    const OTHER_UID: &str = "11111111-2222-4333-8444-555555555555";

    fn pools() -> Vec<PoolPath> {
        vec![PoolPath::local("legacy", PathBuf::from("/var/hpvolumes"))]
    }

    #[test]
    fn pv_name_is_pvc_dash_uid() {
        assert_eq!(pv_name(UID), format!("pvc-{UID}"));
        assert_eq!(uid_from_pv_name(&pv_name(UID)), Some(UID));
        assert_eq!(uid_from_pv_name("pvc-not-a-uid"), None);
        assert_eq!(uid_from_pv_name("my-volume"), None);
    }

    #[test]
    fn directory_without_prefix_is_the_pv_name() {
        assert_eq!(dir_name("data", UID, false).unwrap(), format!("pvc-{UID}"));
    }

    #[test]
    fn directory_with_prefix_is_claim_dash_pv_name_without_namespace() {
        assert_eq!(dir_name("data", UID, true).unwrap(), format!("data-pvc-{UID}"));
    }

    #[test]
    fn long_claim_name_is_shortened_deterministically_below_255_bytes() {
        let long = format!("{}.{}.{}.{}", "a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61));
        assert_eq!(long.len(), 253);
        let name = dir_name(&long, UID, true).unwrap();
        assert!(name.len() <= MAX_DIR_NAME_BYTES, "{} bytes", name.len());
        assert!(name.ends_with(&format!("-pvc-{UID}")));
        assert_eq!(name, dir_name(&long, UID, true).unwrap(), "deterministic");
        // Two claims differing only past the cut get different directories.
        let other = format!("{}e", &long[..252]);
        assert_ne!(name, dir_name(&other, UID, true).unwrap());
        // And deletion recognises the shortened name.
        assert!(matches_layout(&name, &pv_name(UID)));
    }

    #[test]
    fn claim_name_at_the_limit_is_kept_whole() {
        // 214 + "-pvc-<uid>" (41) = 255 bytes exactly.
        let fits = format!("{x}.{x}.{x}.{y}", x = "x".repeat(60), y = "y".repeat(31));
        assert_eq!(fits.len(), 214);
        let name = dir_name(&fits, UID, true).unwrap();
        assert_eq!(name.len(), MAX_DIR_NAME_BYTES);
        assert_eq!(name, format!("{fits}-pvc-{UID}"));
    }

    #[test]
    fn invalid_names_never_reach_a_path() {
        assert!(matches!(dir_name("../etc", UID, true), Err(NameError::BadClaimName(_))));
        assert!(matches!(dir_name("a/b", UID, true), Err(NameError::BadClaimName(_))));
        assert!(matches!(dir_name("data", "../../x", false), Err(NameError::BadUid(_))));
        assert!(matches!(dir_name("data", "0B5C7F8E-6A4D-4E1F-9C2B-3D4E5F607182", false), Err(NameError::BadUid(_))));
    }

    #[test]
    fn node_label_value_is_the_name_or_a_stable_hash() {
        assert_eq!(node_label_value("node-1"), "node-1");
        let long = "n".repeat(100);
        let v = node_label_value(&long);
        assert!(v.len() <= 63 && v.starts_with("sha256-"));
        assert_eq!(v, node_label_value(&long));
        assert_ne!(v, node_label_value(&"m".repeat(100)));
    }

    #[test]
    fn each_go_layout_under_the_pool_is_accepted() {
        let pv = pv_name(UID);
        for name in [pv.clone(), format!("data-{pv}"), format!("default-data-{pv}"), format!("ns.with.dots-claim-{pv}")]
        {
            let accepted = accept_delete_path(&format!("/var/hpvolumes/{name}"), &pv, &pools()).unwrap();
            assert_eq!(
                accepted,
                AcceptedPath { pool: "legacy".into(), root: "/var/hpvolumes".into(), dir_name: name, marked: false }
            );
        }
    }

    #[test]
    fn redundant_slashes_and_dots_are_normalised() {
        let pv = pv_name(UID);
        let accepted = accept_delete_path(&format!("/var//hpvolumes/./{pv}/"), &pv, &pools()).unwrap();
        assert_eq!(accepted.dir_name, pv);
    }

    #[test]
    fn paths_outside_the_pool_are_refused() {
        let pv = pv_name(UID);
        for path in ["/", "/etc", "/var", "/var/other/pvc-x", "/var/hpvolumes-evil/pvc-x"] {
            let path = path.replace("pvc-x", &pv);
            assert!(
                matches!(accept_delete_path(&path, &pv, &pools()), Err(PathRefusal::OutsidePools { .. })),
                "{path}"
            );
        }
    }

    #[test]
    fn the_pool_root_and_paths_deeper_in_the_pool_are_refused_naming_the_pool() {
        let pv = pv_name(UID);
        for root in ["/var/hpvolumes", "/var/hpvolumes/", "/var//hpvolumes/."] {
            let refusal = accept_delete_path(root, &pv, &pools()).unwrap_err();
            assert_eq!(refusal, PathRefusal::PoolRoot { path: root.into(), pool: "legacy".into() });
            assert!(refusal.to_string().contains("is the root of pool legacy"), "{refusal}");
        }
        // Nested one level deeper or more is not "directly under".
        for nested in
            [format!("/var/hpvolumes/sub/{pv}"), format!("/var/hpvolumes/{pv}/{pv}"), "/var/hpvolumes/a/b/c".into()]
        {
            let refusal = accept_delete_path(&nested, &pv, &pools()).unwrap_err();
            assert_eq!(
                refusal,
                PathRefusal::NestedInPool {
                    path: nested.clone(),
                    pool: "legacy".into(),
                    root: "/var/hpvolumes".into()
                }
            );
            assert!(
                refusal.to_string().contains("inside pool legacy (/var/hpvolumes) but not directly under its root")
            );
        }
        // Pools of several nodes may nest: the innermost one holding the path is named.
        let nesting = vec![PoolPath::local("outer", "/mnt"), PoolPath::local("inner", "/mnt/nfs")];
        assert!(matches!(
            accept_delete_path(&format!("/mnt/nfs/sub/{pv}"), &pv, &nesting),
            Err(PathRefusal::NestedInPool { ref pool, .. }) if pool == "inner"
        ));
        assert!(matches!(
            accept_delete_path("/mnt/nfs", &pv, &nesting),
            Err(PathRefusal::PoolRoot { ref pool, .. }) if pool == "inner"
        ));
    }

    #[test]
    fn a_pool_root_is_absolute_normalised_and_neither_slash_nor_listed_with_commas() {
        assert_eq!(pool_root("/var/hpvolumes/"), Some(PathBuf::from("/var/hpvolumes")));
        for bad in ["/", "//", "/.", "relative", "/a/../b", "/a,b", ""] {
            assert_eq!(pool_root(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn traversal_and_relative_paths_are_refused() {
        let pv = pv_name(UID);
        let up = format!("/var/hpvolumes/../hpvolumes/{pv}");
        assert!(matches!(accept_delete_path(&up, &pv, &pools()), Err(PathRefusal::ParentComponent(_))));
        let rel = format!("var/hpvolumes/{pv}");
        assert!(matches!(accept_delete_path(&rel, &pv, &pools()), Err(PathRefusal::NotAbsolute(_))));
        assert!(matches!(accept_delete_path("", &pv, &pools()), Err(PathRefusal::NotAbsolute(_))));
    }

    #[test]
    fn a_directory_of_another_uid_or_unknown_shape_is_refused() {
        let pv = pv_name(UID);
        let other = format!("/var/hpvolumes/pvc-{OTHER_UID}");
        assert!(matches!(accept_delete_path(&other, &pv, &pools()), Err(PathRefusal::UnknownLayout { .. })));
        for name in ["data", "lost+found", &format!("-{pv}"), &format!("DATA-{pv}"), &format!("{pv}-x")] {
            let path = format!("/var/hpvolumes/{name}");
            assert!(accept_delete_path(&path, &pv, &pools()).is_err(), "{path}");
        }
    }

    #[test]
    fn a_pattern_name_is_accepted_only_for_a_pv_named_by_a_pattern_and_only_to_be_checked_by_its_marker() {
        let pv = pv_name(UID);
        let path = "/var/hpvolumes/team-a_data";
        assert!(matches!(accept_delete_path(path, &pv, &pools()), Err(PathRefusal::UnknownLayout { .. })));
        let accepted = accept_volume_path(path, &pv, &pools(), true).unwrap();
        assert_eq!(
            accepted,
            AcceptedPath {
                pool: "legacy".into(),
                root: "/var/hpvolumes".into(),
                dir_name: "team-a_data".into(),
                marked: true
            }
        );
        // Its own layout name needs no marker; another volume's, bookkeeping, or anything
        // outside or deeper than directly under the root is refused as before.
        let own = accept_volume_path(&format!("/var/hpvolumes/{pv}"), &pv, &pools(), true).unwrap();
        assert!(!own.marked);
        for refused in [
            format!("/var/hpvolumes/pvc-{OTHER_UID}"),
            format!("/var/hpvolumes/x-pvc-{OTHER_UID}"),
            "/var/hpvolumes/.hpp-trash".to_owned(),
            "/var/hpvolumes/.hpp-deleting".to_owned(),
            "/var/hpvolumes/_x".to_owned(),
            "/var/hpvolumes/a b".to_owned(),
            "/var/hpvolumes".to_owned(),
            "/var/hpvolumes/a/b".to_owned(),
            "/var/hpvolumes/../etc".to_owned(),
            "/etc".to_owned(),
        ] {
            assert!(accept_volume_path(&refused, &pv, &pools(), true).is_err(), "{refused}");
        }
    }

    #[test]
    fn a_pv_not_named_after_a_claim_uid_is_refused() {
        assert!(matches!(
            accept_delete_path("/var/hpvolumes/pvc-foo", "pvc-foo", &pools()),
            Err(PathRefusal::ForeignPvName(_))
        ));
    }

    #[test]
    fn uid_is_read_from_every_layout_and_nothing_else() {
        assert_eq!(uid_of_dir(&format!("pvc-{UID}")), Some(UID));
        assert_eq!(uid_of_dir(&format!("data-pvc-{UID}")), Some(UID));
        assert_eq!(uid_of_dir(&format!("ns-data-pvc-{UID}")), Some(UID));
        assert_eq!(uid_of_dir(&format!("x{UID}")), None);
        assert_eq!(uid_of_dir("lost+found"), None);
        assert_eq!(uid_of_dir(""), None);
        assert_eq!(uid_of_dir("é"), None);
    }
}

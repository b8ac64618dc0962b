//! A shared or every-node PV whose directory is in none of this node's pools: is it a volume
//! of a pool another live node serves, a path inside a served pool that is no volume (its root,
//! or deeper than directly under it), or in no served pool at all, and then which pool an admin
//! could configure for it. Pure.
//!
//! The advice never names a directory that could not be a pool next to the served ones: an
//! ancestor of a served pool's root, or a directory inside a served pool, would nest pools (and
//! make what is not a volume look like one), so for such a path the only advice is to fix or
//! remove the PV.

use std::path::Path;

use crate::deciding::layout::{self, AcceptedPath, PathRefusal, PoolPath};
use crate::deciding::topology::LiveNode;

/// Where a PV's directory lies among the pools served in the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// A volume directory of a served pool: the nodes serving that pool act on it.
    ServedVolume(AcceptedPath),
    /// In a served pool (its root, or deeper than directly under it), or directly under its
    /// root with a name that is not one of the PV's: no volume of any pool.
    NotAVolume(PathRefusal),
    /// In no served pool.
    Unserved(ServeAdvice),
}

/// What an admin can do about a PV whose directory is in no served pool.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ServeAdvice {
    /// Serving the PV's parent directory as a pool makes the directory a volume of it.
    #[error("configure its pool on the nodes that should serve it (--pool NAME={0}), or fix or remove the PV")]
    ServeParent(String),
    /// The parent directory and a served pool's root would nest.
    #[error(
        "no pool can be configured for it, because its parent directory {parent} and the served pool root {root} would be nested pools; fix or remove the PV"
    )]
    ParentNestsWithServedPool {
        /// The PV's parent directory.
        parent: String,
        /// The served root it contains or lies in.
        root: String,
    },
    /// The path is `/`.
    #[error("no pool can be configured for it, because it has no parent directory; fix or remove the PV")]
    NoParent,
    /// The parent directory cannot be a pool root at all.
    #[error(
        "no pool can be configured for it, because its parent directory {0:?} cannot be a pool root (an absolute path other than /, without ',' or surrounding spaces); fix or remove the PV"
    )]
    ParentCannotBeAPool(String),
}

/// The pools served in the cluster: this node's and those the live nodes advertise.
pub fn served_pools(mine: &[PoolPath], live: &[LiveNode]) -> Vec<PoolPath> {
    let mut served = mine.to_vec();
    for key in live.iter().flat_map(|node| &node.pools) {
        if !served.iter().any(|pool| pool.root.as_os_str() == key.root.as_str()) {
            served.push(PoolPath::local(&key.name, key.root.as_str()));
        }
    }
    served
}

/// Where the directory `path` of PV `pv_name` lies among the `served` pools, by the deletion
/// rules (`layout::accept_delete_path`).
pub fn place(path: &str, pv_name: &str, served: &[PoolPath]) -> Placement {
    match layout::accept_delete_path(path, pv_name, served) {
        Ok(accepted) => Placement::ServedVolume(accepted),
        Err(PathRefusal::OutsidePools { .. }) => Placement::Unserved(serve_advice(path, served)),
        Err(refusal) => Placement::NotAVolume(refusal),
    }
}

/// Which pool to configure so that `path` becomes a volume directory: its parent directory,
/// only when that can be a pool root (as `--pool NAME=<parent>` reads it back) and neither
/// contains nor lies in a served pool's root.
pub fn serve_advice(path: &str, served: &[PoolPath]) -> ServeAdvice {
    let parent = layout::normalise(path).ok().and_then(|p| p.parent().map(Path::to_path_buf));
    let Some(parent) = parent else {
        return ServeAdvice::NoParent;
    };
    let text = parent.to_string_lossy().into_owned();
    // `--pool` values are trimmed when read: a parent with surrounding spaces would name another path.
    if layout::pool_root(text.trim()).as_deref() != Some(parent.as_path()) {
        return ServeAdvice::ParentCannotBeAPool(text);
    }
    match served.iter().find(|pool| pool.root.starts_with(&parent) || parent.starts_with(&pool.root)) {
        Some(pool) => ServeAdvice::ParentNestsWithServedPool { parent: text, root: pool.root.display().to_string() },
        None => ServeAdvice::ServeParent(text),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::deciding::topology::PoolKey;

    const PV: &str = "pvc-0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182";

    fn served() -> Vec<PoolPath> {
        vec![PoolPath::local("legacy", "/var/hpvolumes"), PoolPath::shared("nfs", "/mnt/nfs")]
    }

    #[test]
    fn a_volume_of_a_served_pool_is_that_pools() {
        assert_eq!(
            place(&format!("/mnt/nfs/{PV}"), PV, &served()),
            Placement::ServedVolume(AcceptedPath {
                pool: "nfs".into(),
                root: "/mnt/nfs".into(),
                dir_name: PV.into(),
                marked: false
            })
        );
    }

    #[test]
    fn a_served_pool_root_is_not_a_volume_of_it() {
        for root in ["/mnt/nfs", "/mnt/nfs/"] {
            assert_eq!(
                place(root, PV, &served()),
                Placement::NotAVolume(PathRefusal::PoolRoot { path: root.into(), pool: "nfs".into() })
            );
        }
    }

    #[test]
    fn a_directory_inside_a_served_pool_is_not_a_volume_of_it_and_says_why() {
        let nested = format!("/mnt/nfs/sub/{PV}");
        assert_eq!(
            place(&nested, PV, &served()),
            Placement::NotAVolume(PathRefusal::NestedInPool {
                path: nested.clone(),
                pool: "nfs".into(),
                root: "/mnt/nfs".into()
            })
        );
        // Directly under the root, but named for no PV of this name.
        assert_eq!(
            place("/mnt/nfs/scratch", PV, &served()),
            Placement::NotAVolume(PathRefusal::UnknownLayout { name: "scratch".into(), pv: PV.into() })
        );
    }

    #[test]
    fn a_path_in_no_served_pool_gets_its_parent_as_the_pool_to_serve() {
        assert_eq!(
            place(&format!("/data/{PV}"), PV, &served()),
            Placement::Unserved(ServeAdvice::ServeParent("/data".into()))
        );
        assert_eq!(
            place(&format!("/srv//volumes/./{PV}/"), PV, &served()),
            Placement::Unserved(ServeAdvice::ServeParent("/srv/volumes".into()))
        );
        // A sibling whose name starts like a served root is no ancestor of it.
        assert_eq!(
            place(&format!("/mnt/nfs2/{PV}"), PV, &served()),
            Placement::Unserved(ServeAdvice::ServeParent("/mnt/nfs2".into()))
        );
    }

    #[test]
    fn no_advice_to_serve_an_ancestor_of_a_served_pool() {
        // /mnt/x's parent /mnt holds the served /mnt/nfs.
        assert_eq!(
            place("/mnt/x", PV, &served()),
            Placement::Unserved(ServeAdvice::ParentNestsWithServedPool {
                parent: "/mnt".into(),
                root: "/mnt/nfs".into()
            })
        );
        // The parent of /var/x is /var, holding /var/hpvolumes.
        assert!(matches!(
            place("/var/x", PV, &served()),
            Placement::Unserved(ServeAdvice::ParentNestsWithServedPool { .. })
        ));
    }

    #[test]
    fn no_advice_for_a_parent_that_cannot_be_a_pool_root() {
        // Directly under /: serving / is refused by the configuration.
        assert_eq!(
            place(&format!("/{PV}"), PV, &served()),
            Placement::Unserved(ServeAdvice::ParentCannotBeAPool("/".into()))
        );
        assert_eq!(place("/", PV, &served()), Placement::Unserved(ServeAdvice::NoParent));
        // ',' separates pools in --pool and STORAGE_POOLS; spaces around a value are trimmed off.
        for parent in ["/a,b", "/data "] {
            assert_eq!(
                serve_advice(&format!("{parent}/{PV}"), &served()),
                ServeAdvice::ParentCannotBeAPool(parent.into()),
                "{parent:?}"
            );
        }
    }

    #[test]
    fn the_advice_reads_as_a_pool_flag_only_when_there_is_one_to_give() {
        let serve = ServeAdvice::ServeParent("/data".into()).to_string();
        assert!(serve.contains("--pool NAME=/data"), "{serve}");
        for none in [
            ServeAdvice::ParentNestsWithServedPool { parent: "/mnt".into(), root: "/mnt/nfs".into() },
            ServeAdvice::ParentCannotBeAPool("/".into()),
            ServeAdvice::NoParent,
        ] {
            let text = none.to_string();
            assert!(!text.contains("--pool") && text.contains("fix or remove the PV"), "{text}");
        }
    }

    #[test]
    fn served_pools_are_this_nodes_and_the_live_nodes_once_each() {
        let live = vec![
            LiveNode {
                node: "b".into(),
                pools: vec![PoolKey::new("legacy", "/var/hpvolumes"), PoolKey::new("data", "/data")],
                expires_in: Duration::from_secs(30),
            },
            LiveNode { node: "c".into(), pools: vec![PoolKey::new("data", "/data")], expires_in: Duration::ZERO },
        ];
        let roots: Vec<_> = served_pools(&served(), &live).into_iter().map(|p| p.root).collect();
        assert_eq!(roots, ["/var/hpvolumes", "/mnt/nfs", "/data"].map(std::path::PathBuf::from));
    }
}

//! The configured pools of this node, each re-checked before every operation and re-opened when
//! its root directory was replaced (for example a disk mounted on it after start-up).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use crate::deciding::layout::PoolPath;
use crate::filesystem::{PoolError, PoolRoot, RootOrigin};

struct Slot {
    name: String,
    root: RwLock<Arc<PoolRoot>>,
    /// Where the root was at startup: a re-opened root must be reached the same way.
    origin: RootOrigin,
    /// Usable only while the root is a mount point (`REQUIRE_MOUNTPOINT`, or this pool's
    /// `mountpoint` option).
    require_mountpoint: bool,
}

/// Open pool roots, by root directory: a pool of several roots (the same name declared for
/// several directories, one per disk) has a slot for each.
pub struct Pools {
    slots: BTreeMap<PathBuf, Slot>,
}

/// A pool root that could not be opened at start-up.
#[derive(Debug, thiserror::Error)]
#[error("pool {pool} at {path}: {source}")]
pub struct OpenError {
    /// Pool name.
    pub pool: String,
    /// Root path.
    pub path: String,
    /// Why.
    #[source]
    pub source: Box<PoolError>,
}

impl Pools {
    /// Opens every pool root; each must exist and be a directory (the DaemonSet creates it).
    /// `require_mountpoint` applies to every pool; a pool's own `require_mountpoint` to it alone.
    pub fn open(paths: &[PoolPath], require_mountpoint: bool) -> Result<Pools, OpenError> {
        let mut slots = BTreeMap::new();
        for pool in paths {
            let root = PoolRoot::open(&pool.name, &pool.root).map_err(|source| OpenError {
                pool: pool.name.clone(),
                path: pool.root.display().to_string(),
                source: Box::new(source),
            })?;
            let origin = root.origin().map_err(|source| OpenError {
                pool: pool.name.clone(),
                path: pool.root.display().to_string(),
                source: Box::new(source),
            })?;
            let slot = Slot {
                name: pool.name.clone(),
                root: RwLock::new(Arc::new(root)),
                origin,
                require_mountpoint: require_mountpoint || pool.require_mountpoint,
            };
            slots.insert(pool.root.clone(), slot);
        }
        Ok(Pools { slots })
    }

    /// The pool roots, in path order.
    pub fn roots(&self) -> impl Iterator<Item = &std::path::Path> {
        self.slots.keys().map(PathBuf::as_path)
    }

    /// The pool root at `root`, checked for use right now: it still exists, is the directory we
    /// hold (re-opened once if it was replaced, e.g. by a mount), and is a mount point when
    /// required. `None` when no pool has that root.
    pub fn usable(&self, root: &std::path::Path) -> Option<Result<Arc<PoolRoot>, PoolError>> {
        let (path, slot) = self.slots.get_key_value(root)?;
        let current = slot.root.read().unwrap_or_else(|e| e.into_inner()).clone();
        Some(match current.check(slot.require_mountpoint) {
            Ok(()) => Ok(current),
            Err(PoolError::RootChanged { .. }) => self.reopen(path, slot),
            Err(error) => Err(error),
        })
    }

    /// Re-opens a root whose directory was replaced, which is what mounting a disk on it after
    /// startup looks like. Only the root itself may have changed: a root now reached through
    /// other symlinks or from another parent directory is refused until it is reached as at
    /// startup again, or the process restarts.
    fn reopen(&self, path: &std::path::Path, slot: &Slot) -> Result<Arc<PoolRoot>, PoolError> {
        let name = slot.name.as_str();
        let fresh = Arc::new(PoolRoot::open(name, path)?);
        let origin = fresh.origin()?;
        if origin != slot.origin {
            return Err(PoolError::RootRedirected {
                pool: name.to_owned(),
                path: path.to_owned(),
                now: origin.resolved,
                was: slot.origin.resolved.clone(),
            });
        }
        fresh.check(slot.require_mountpoint)?;
        tracing::info!(pool = name, path = %path.display(), "pool root was replaced; re-opened it");
        *slot.root.write().unwrap_or_else(|e| e.into_inner()) = fresh.clone();
        Ok(fresh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_root_is_reopened_and_a_missing_one_reported() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("pool");
        std::fs::create_dir(&root).unwrap();
        let pools = Pools::open(&[PoolPath::local("legacy", root.clone())], false).unwrap();
        let first = pools.usable(&root).unwrap().unwrap();
        assert!(pools.usable(&dir.path().join("other")).is_none());

        // Replace the directory (what a mount on top of it looks like to a path lookup).
        std::fs::rename(&root, dir.path().join("old")).unwrap();
        assert!(pools.usable(&root).unwrap().is_err(), "missing root is an error");
        std::fs::create_dir(&root).unwrap();
        let second = pools.usable(&root).unwrap().unwrap();
        assert!(!Arc::ptr_eq(&first, &second), "re-opened");
        second.create_volume_dir(&crate::filesystem::VolumeDirName::new("pvc-x").unwrap(), 0o777).unwrap();
        assert!(root.join("pvc-x").is_dir(), "operations go to the new directory");
    }

    #[test]
    fn a_root_reached_through_a_replaced_parent_is_refused_until_restored() {
        // <tmp>/var/pool is the pool; a volume lives in it.
        let dir = tempfile::tempdir().unwrap();
        let var = dir.path().join("var");
        let root = var.join("pool");
        std::fs::create_dir_all(root.join("pvc-x")).unwrap();
        let pools = Pools::open(&[PoolPath::local("legacy", root.clone())], false).unwrap();
        pools.usable(&root).unwrap().unwrap();

        // The parent is moved away and a symlink to another tree put in its place.
        let other = dir.path().join("other");
        std::fs::create_dir_all(other.join("pool/pvc-x")).unwrap();
        std::fs::rename(&var, dir.path().join("var.moved")).unwrap();
        std::os::unix::fs::symlink(&other, &var).unwrap();
        let err = pools.usable(&root).unwrap().expect_err("redirected through a symlink");
        assert!(matches!(err, PoolError::RootRedirected { .. }), "{err}");
        assert!(err.to_string().contains("other"), "says where it leads now: {err}");

        // A real directory in its place: same path string, another parent: still refused.
        std::fs::remove_file(&var).unwrap();
        std::fs::create_dir_all(var.join("pool")).unwrap();
        let err = pools.usable(&root).unwrap().expect_err("another parent");
        assert!(matches!(err, PoolError::RootRedirected { .. }), "{err}");

        // Restored: usable again, and the original volume is the one seen.
        std::fs::remove_dir_all(&var).unwrap();
        std::fs::rename(dir.path().join("var.moved"), &var).unwrap();
        let pool = pools.usable(&root).unwrap().expect("restored");
        assert!(pool.volume_dir_exists(&crate::filesystem::VolumeDirName::new("pvc-x").unwrap()).unwrap());
    }

    #[test]
    fn a_required_mount_point_is_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let pools = Pools::open(&[PoolPath::local("legacy", dir.path().to_owned())], true).unwrap();
        assert!(matches!(pools.usable(dir.path()), Some(Err(PoolError::RootNotMountpoint { .. }))));
    }

    #[test]
    fn a_pools_own_mount_point_option_holds_for_it_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (plain, claimed) = (dir.path().join("plain"), dir.path().join("claimed"));
        std::fs::create_dir(&plain).unwrap();
        std::fs::create_dir(&claimed).unwrap();
        let on_claim = PoolPath { require_mountpoint: true, ..PoolPath::local("claimed", &claimed) };
        let pools = Pools::open(&[PoolPath::local("plain", &plain), on_claim], false).unwrap();
        assert!(pools.usable(&plain).unwrap().is_ok(), "the option of another pool does not apply");
        let err = pools.usable(&claimed).unwrap().expect_err("not a mount point yet");
        assert!(matches!(err, PoolError::RootNotMountpoint { .. }), "{err}");
        assert!(err.to_string().contains("nothing is mounted"), "says why: {err}");
    }
}

//! What this node remembers about the volumes it staged for deletion, shared by the deletions
//! (which hold their stage while in flight) and the settling passes (`reconciling::settling`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What the settling remembers between its passes.
#[derive(Default)]
pub struct Settling {
    /// `(pool root, pv)` of deletions this node is carrying out right now: their stage is theirs.
    in_flight: Mutex<HashSet<(PathBuf, String)>>,
    /// `(pool root, pv)` of staged volumes whose PV this node saw go: committed without a lookup.
    pv_gone: Mutex<HashSet<(PathBuf, String)>>,
    /// Wakes the settling early (a deletion left a volume staged).
    pub wake: tokio::sync::Notify,
}

/// Marks a deletion in flight until dropped.
pub struct InFlight<'a> {
    settling: &'a Settling,
    key: (PathBuf, String),
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.settling.in_flight.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.key);
    }
}

impl Settling {
    /// Claims the stage of PV `pv` in the pool root `root` for the deletion in flight.
    pub fn hold(&self, root: &Path, pv: &str) -> InFlight<'_> {
        let key = (root.to_owned(), pv.to_owned());
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone());
        InFlight { settling: self, key }
    }

    /// Remembers that the PV of a volume left staged is gone (the trash could not take it).
    pub fn pv_gone(&self, root: &Path, pv: &str) {
        self.pv_gone.lock().unwrap_or_else(|e| e.into_inner()).insert((root.to_owned(), pv.to_owned()));
        self.wake.notify_one();
    }

    pub(super) fn is_in_flight(&self, root: &Path, pv: &str) -> bool {
        self.in_flight.lock().unwrap_or_else(|e| e.into_inner()).contains(&(root.to_owned(), pv.to_owned()))
    }

    pub(super) fn known_gone(&self, root: &Path, pv: &str) -> bool {
        self.pv_gone.lock().unwrap_or_else(|e| e.into_inner()).contains(&(root.to_owned(), pv.to_owned()))
    }

    pub(super) fn forget(&self, root: &Path, pv: &str) {
        self.pv_gone.lock().unwrap_or_else(|e| e.into_inner()).remove(&(root.to_owned(), pv.to_owned()));
    }
}

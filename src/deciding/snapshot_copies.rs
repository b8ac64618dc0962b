//! Snapshot copies without a snapshot: a copy under `<root>/.hpp-snapshots/<uid>` whose
//! `HostPathSnapshot` no longer exists holds a tenant's data that its owner believes deleted,
//! and room nobody counts. It happens when the object goes without its node's say: a finalizer
//! stripped by someone who may patch snapshots, a status naming another node (the deletion then
//! goes there, which has nothing), the node gone when the object was deleted and back later, or
//! the CustomResourceDefinition deleted with every object in it.
//!
//! Each node decides from its own disks, never from a snapshot's `status.node`: it lists the
//! copies on its roots first, then every snapshot's UID in the cluster. UIDs never recur, so a
//! copy whose UID is missing from a list read after the copy was seen has no object, now or
//! later. Such a copy is reported when first seen and moved to the trash once it has been seen
//! unowned for a grace period (an admin who restores the object from a backup restores a new
//! UID, which cannot own it: the grace is the time to copy the data out by hand).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How long a copy without a snapshot stays before it is moved to the trash, by default.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

/// What one sweep of a root does with its copies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepPlan {
    /// Copies without a snapshot seen for the first time: reported.
    pub newly_unowned: Vec<String>,
    /// Copies without a snapshot for the whole grace period: moved to the trash.
    pub trash: Vec<String>,
    /// Copies without a snapshot still within their grace period (the newly found included).
    pub waiting: usize,
}

/// Plans a sweep of one root. `on_disk`: the UIDs of the copies listed on the root;
/// `snapshots`: every HostPathSnapshot UID of the cluster, listed after the disk (`None`: the
/// list failed, and nothing is decided); `unowned_since`: when each copy was first seen
/// without a snapshot (seconds on a monotonic clock), updated here: a copy that is owned again
/// or gone from the disk is forgotten.
pub fn plan_sweep(
    on_disk: &[String],
    snapshots: Option<&BTreeSet<String>>,
    unowned_since: &mut BTreeMap<String, u64>,
    now: u64,
    grace: Duration,
) -> SweepPlan {
    let Some(snapshots) = snapshots else { return SweepPlan::default() };
    let unowned: BTreeSet<&String> = on_disk.iter().filter(|uid| !snapshots.contains(*uid)).collect();
    unowned_since.retain(|uid, _| unowned.contains(uid));
    let mut plan = SweepPlan::default();
    for uid in unowned {
        let since = *unowned_since.entry(uid.clone()).or_insert_with(|| {
            plan.newly_unowned.push(uid.clone());
            now
        });
        if now.saturating_sub(since) >= grace.as_secs() {
            plan.trash.push(uid.clone());
            unowned_since.remove(uid);
        } else {
            plan.waiting += 1;
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(60);

    fn uids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn set(list: &[&str]) -> BTreeSet<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_copy_of_a_live_snapshot_is_never_touched() {
        let mut seen = BTreeMap::new();
        for now in [0, 60, 6000] {
            let plan = plan_sweep(&uids(&["a", "b"]), Some(&set(&["a", "b", "c"])), &mut seen, now, GRACE);
            assert_eq!(plan, SweepPlan::default());
        }
        assert!(seen.is_empty());
    }

    #[test]
    fn a_copy_without_its_snapshot_is_reported_once_then_trashed_after_the_grace() {
        let mut seen = BTreeMap::new();
        let live = set(&["a"]);
        let first = plan_sweep(&uids(&["a", "orphan"]), Some(&live), &mut seen, 100, GRACE);
        assert_eq!(first, SweepPlan { newly_unowned: uids(&["orphan"]), trash: vec![], waiting: 1 });
        let within = plan_sweep(&uids(&["a", "orphan"]), Some(&live), &mut seen, 159, GRACE);
        assert_eq!(within, SweepPlan { newly_unowned: vec![], trash: vec![], waiting: 1 }, "reported once");
        let after = plan_sweep(&uids(&["a", "orphan"]), Some(&live), &mut seen, 160, GRACE);
        assert_eq!(after.trash, uids(&["orphan"]));
        assert!(seen.is_empty(), "forgotten once trashed");
    }

    #[test]
    fn a_failed_list_decides_nothing_and_keeps_what_was_seen() {
        let mut seen = BTreeMap::from([("orphan".to_owned(), 0)]);
        let plan = plan_sweep(&uids(&["orphan"]), None, &mut seen, 10_000, GRACE);
        assert_eq!(plan, SweepPlan::default());
        assert_eq!(seen.get("orphan"), Some(&0));
    }

    #[test]
    fn a_copy_owned_again_or_gone_is_forgotten_and_starts_its_grace_anew() {
        let mut seen = BTreeMap::new();
        plan_sweep(&uids(&["x", "y"]), Some(&set(&[])), &mut seen, 0, GRACE);
        // x is listed again (an object appeared: a list read between a create and its copy
        // cannot happen, but the rule does not rely on it); y left the disk (its node's own
        // deletion moved it).
        plan_sweep(&uids(&["x"]), Some(&set(&["x"])), &mut seen, 30, GRACE);
        assert!(seen.is_empty());
        let plan = plan_sweep(&uids(&["x"]), Some(&set(&[])), &mut seen, 61, GRACE);
        assert_eq!(plan.newly_unowned, uids(&["x"]), "its grace starts anew");
        assert!(plan.trash.is_empty());
    }

    #[test]
    fn without_the_crd_every_copy_is_unowned() {
        // No CRD: the list is empty, not failed (every object went with it).
        let mut seen = BTreeMap::new();
        let plan = plan_sweep(&uids(&["a", "b"]), Some(&BTreeSet::new()), &mut seen, 0, Duration::ZERO);
        assert_eq!(plan.trash, uids(&["a", "b"]));
    }
}

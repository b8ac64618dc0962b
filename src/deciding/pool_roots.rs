//! A pool of several roots: one pool name declared for several directories of a node, one per
//! disk (`--pool data=/mnt/disk1 --pool data=/mnt/disk2`), so that one StorageClass uses every
//! disk of the node. Which root a new volume goes to, and the room the pool offers the
//! scheduler. Pure functions over plain data.
//!
//! Each root keeps what a pool has on its own: its reserve, its capacity accounting, its quota
//! capability, its trash. A volume lives on one root for its whole life (its PV names the path),
//! so the choice is made once, when the volume is made.

use crate::deciding::layout::PoolPath;

/// One root of the pool, as the plan for a new volume sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootCandidate {
    /// The root could be read now (exists, mounted when required, statfs answered).
    pub usable: bool,
    /// The claim's directory is on this root already: an earlier attempt made it before a
    /// crash or a failed PV create, or it is the claim's `pathPattern` directory.
    pub holds_claim: bool,
    /// The root can make this kind of volume (a `quota: enforce` class: it can enforce quota).
    pub can_make: bool,
    /// Bytes a new volume may take on it: free space less its reserve, and with requests
    /// accounting no more than its size less its reserve less what it promised.
    pub room: u64,
}

/// The root a new volume goes to, by index into `roots` (in the order the roots are declared).
///
/// 1. The usable root that holds the claim's directory already, whatever the room elsewhere:
///    an attempt that made a directory and then failed must find it again, or that directory
///    (and, for a `pathPattern` directory, its data) would be left behind.
/// 2. Otherwise the usable root that can make the volume with the most room; the first declared
///    among equals. Whether the request fits is checked afterwards against that root: when the
///    roomiest root is short, every root is.
/// 3. Otherwise (no usable root can make it) the first usable root, so that the refusal names
///    why (its quota capability).
///
/// `None` when no root is usable.
pub fn choose(roots: &[RootCandidate]) -> Option<usize> {
    let usable = || roots.iter().enumerate().filter(|(_, root)| root.usable);
    if let Some((index, _)) = usable().find(|(_, root)| root.holds_claim) {
        return Some(index);
    }
    let mut best: Option<(usize, u64)> = None;
    for (index, root) in usable().filter(|(_, root)| root.can_make) {
        if best.is_none_or(|(_, room)| root.room > room) {
            best = Some((index, root.room));
        }
    }
    best.map(|(index, _)| index).or_else(|| usable().next().map(|(index, _)| index))
}

/// What the pool offers the scheduler as one figure: the largest volume that fits on a single
/// root (a volume cannot span disks), over the roots that are usable and can make the class's
/// volumes. `None` when no root qualifies.
pub fn largest_single_fit(rooms: impl IntoIterator<Item = Option<u64>>) -> Option<u64> {
    rooms.into_iter().flatten().max()
}

/// The roots of the pool `name` on this node, in declared order.
pub fn roots_of<'a>(pools: &'a [PoolPath], name: &str) -> Vec<&'a PoolPath> {
    pools.iter().filter(|pool| pool.name == name).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn root(room: u64) -> RootCandidate {
        RootCandidate { usable: true, holds_claim: false, can_make: true, room }
    }

    #[test]
    fn a_new_volume_goes_to_the_root_with_the_most_room_the_first_among_equals() {
        assert_eq!(choose(&[root(GIB), root(3 * GIB), root(2 * GIB)]), Some(1));
        assert_eq!(choose(&[root(2 * GIB), root(2 * GIB)]), Some(0), "first declared among equals");
        assert_eq!(choose(&[root(0), root(0)]), Some(0), "a full pool still names a root to refuse from");
        assert_eq!(choose(&[root(GIB)]), Some(0), "a pool of one root");
    }

    #[test]
    fn an_unusable_root_is_never_chosen_and_none_usable_is_none() {
        let gone = RootCandidate { usable: false, ..root(100 * GIB) };
        assert_eq!(choose(&[gone, root(GIB)]), Some(1));
        assert_eq!(choose(&[gone, gone]), None);
        assert_eq!(choose(&[]), None);
        // A root that cannot be read holds nothing this attempt can see.
        let gone_holding = RootCandidate { holds_claim: true, ..gone };
        assert_eq!(choose(&[gone_holding, root(GIB)]), Some(1));
    }

    #[test]
    fn the_root_holding_the_claims_directory_wins_whatever_the_room_elsewhere() {
        let holding = RootCandidate { holds_claim: true, ..root(0) };
        assert_eq!(choose(&[root(10 * GIB), holding]), Some(1));
        // Even when it cannot make this kind of volume now: the refusal then comes from it, and
        // nothing is made on another root beside the directory left behind.
        let holding_no_quota = RootCandidate { can_make: false, ..holding };
        assert_eq!(choose(&[root(10 * GIB), holding_no_quota]), Some(1));
    }

    #[test]
    fn a_root_that_cannot_make_the_volume_is_passed_over_unless_none_can() {
        let no_quota = RootCandidate { can_make: false, ..root(10 * GIB) };
        assert_eq!(choose(&[no_quota, root(GIB)]), Some(1));
        assert_eq!(choose(&[no_quota, no_quota]), Some(0), "the first usable root says why");
        let gone = RootCandidate { usable: false, ..root(GIB) };
        assert_eq!(choose(&[gone, no_quota]), Some(1));
    }

    /// Every combination of three roots over small values: the choice is a usable root; it
    /// holds the claim whenever a usable root does; otherwise no usable root that can make the
    /// volume has more room than the chosen one, and none declared before it has as much.
    #[test]
    fn the_choice_holds_its_rules_over_every_small_combination() {
        let mut candidates = Vec::new();
        for usable in [false, true] {
            for holds_claim in [false, true] {
                for can_make in [false, true] {
                    for room in [0, 1, 2] {
                        candidates.push(RootCandidate { usable, holds_claim, can_make, room });
                    }
                }
            }
        }
        let mut checked = 0;
        for a in &candidates {
            for b in &candidates {
                for c in &candidates {
                    let roots = [*a, *b, *c];
                    checked += 1;
                    let Some(chosen) = choose(&roots) else {
                        assert!(roots.iter().all(|r| !r.usable), "{roots:?}");
                        continue;
                    };
                    let pick = roots[chosen];
                    assert!(pick.usable, "{roots:?}");
                    if roots.iter().any(|r| r.usable && r.holds_claim) {
                        assert!(pick.holds_claim, "{roots:?}");
                        continue;
                    }
                    if !pick.can_make {
                        assert!(roots.iter().all(|r| !r.usable || !r.can_make), "{roots:?}");
                        continue;
                    }
                    for (index, other) in roots.iter().enumerate().filter(|(_, r)| r.usable && r.can_make) {
                        assert!(other.room <= pick.room, "{roots:?}");
                        assert!(index >= chosen || other.room < pick.room, "first among equals: {roots:?}");
                    }
                }
            }
        }
        assert_eq!(checked, 24 * 24 * 24, "2 × 2 × 2 × 3 kinds of root, three roots");
    }

    #[test]
    fn the_pool_offers_its_largest_single_fit() {
        assert_eq!(largest_single_fit([Some(GIB), None, Some(3 * GIB)]), Some(3 * GIB));
        assert_eq!(largest_single_fit([None, None]), None);
        assert_eq!(largest_single_fit(std::iter::empty()), None);
    }

    #[test]
    fn the_roots_of_a_pool_are_its_declared_directories_in_order() {
        let pools = [
            PoolPath::local("data", "/mnt/disk1"),
            PoolPath::local("legacy", "/var/hpvolumes"),
            PoolPath::local("data", "/mnt/disk2"),
        ];
        let roots: Vec<_> = roots_of(&pools, "data").iter().map(|p| p.root.display().to_string()).collect();
        assert_eq!(roots, ["/mnt/disk1", "/mnt/disk2"]);
        assert!(roots_of(&pools, "other").is_empty());
    }
}

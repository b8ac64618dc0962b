//! A Block volume released for its deletion whose deletion then did not go through (issue #47).
//!
//! Before a Block PV's directory goes to the trash, its device node is removed and its loop
//! detached (`reconciling::block_volumes::release_for_deletion`). If the deletion then fails
//! (the trash cannot take the directory, the PV changed since it was read) the PV stays, and
//! what happens next decides what the volume must be:
//!
//! - still to be deleted (Released, `Delete`, ours): the retry releases again (a release finds
//!   nothing left to remove and goes on) and deletes; nothing is exposed in between, or the
//!   retry would have to take the device away from a pod that opened it meanwhile;
//! - kept (an admin switched it to `Retain` after the `VolumeFailedDelete` event, cleared its
//!   claimRef to bind it again, or it is not `Released` any more): exposed again, now, as at
//!   start, so that a pod of it gets its device without waiting for the provisioner's restart;
//! - being deleted by hand, not this node's or refused: left as it is (its deletion releases
//!   it anyway; a refused PV's paths are never acted on).

use crate::deciding::volume::{Ignore, VolumeDecision};

/// What to do with a Block volume this process released for a deletion, on the next look at
/// its PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AfterRelease {
    /// Its deletion goes on: stays released (the retry releases again, finding nothing).
    StayReleased,
    /// Its PV stays: exposed again (attach, node), with an event saying why.
    ExposeAgain(String),
    /// Nothing to do with it here any more: forgotten.
    Forget,
}

/// What is known of a Block PV besides the volume decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReleasedFacts {
    /// This process released it for its deletion, and has not exposed it again since.
    pub released_here: bool,
    /// It is this provisioner's and this node's ([`super::kept::served_here`]): the volume
    /// decision says "not to delete" before it asks whose a PV is.
    pub served_here: bool,
    /// It has a deletion timestamp (deleted by hand, held by a finalizer).
    pub being_deleted: bool,
}

/// Decides on a Block PV that this process may have released for its deletion, given what the
/// volume decision now says about it (`decision`).
pub fn after_release(facts: ReleasedFacts, decision: &VolumeDecision) -> AfterRelease {
    if !facts.released_here {
        return AfterRelease::Forget;
    }
    if !facts.served_here || facts.being_deleted {
        return AfterRelease::Forget;
    }
    match decision {
        VolumeDecision::Delete(_) => AfterRelease::StayReleased,
        VolumeDecision::Ignore(Ignore::NotDeletePolicy) => AfterRelease::ExposeAgain(
            "its deletion failed and its reclaim policy is no longer Delete: the data is kept".into(),
        ),
        VolumeDecision::Ignore(Ignore::NotReleased) => AfterRelease::ExposeAgain(
            "its deletion failed and it is no longer Released (bound again or made Available)".into(),
        ),
        // Being deleted by hand (released again when it is gone), another node's or
        // provisioner's, or refused: not this node's to expose.
        VolumeDecision::Ignore(_) | VolumeDecision::Refuse(_) => AfterRelease::Forget,
        // Every-node and shared decisions never concern a Block volume (a node volume).
        VolumeDecision::EnsureCopy { .. }
        | VolumeDecision::RemoveCopy { .. }
        | VolumeDecision::DropProtection
        | VolumeDecision::KeepCopy
        | VolumeDecision::DeleteObject => AfterRelease::Forget,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::deciding::layout::AcceptedPath;
    use crate::deciding::volume::DeleteRefusal;

    fn every_decision() -> Vec<VolumeDecision> {
        let accepted = AcceptedPath {
            pool: "local".into(),
            root: "/var/hpvolumes".into(),
            dir_name: "pvc-x".into(),
            marked: false,
        };
        let ignores = [
            Ignore::BeingDeleted,
            Ignore::NotReleased,
            Ignore::NotDeletePolicy,
            Ignore::NotOurs,
            Ignore::OtherNode,
            Ignore::ActedOnBy { node: "other".into(), recheck_after: Duration::from_secs(1) },
            Ignore::NotMyPool,
        ];
        let mut all: Vec<VolumeDecision> = ignores.into_iter().map(VolumeDecision::Ignore).collect();
        all.extend([
            VolumeDecision::Delete(accepted.clone()),
            VolumeDecision::Refuse(DeleteRefusal::NoHostPath),
            VolumeDecision::EnsureCopy { accepted: accepted.clone(), add_finalizer: false },
            VolumeDecision::RemoveCopy { accepted, remove_finalizer: false, report_waiting: false },
            VolumeDecision::DropProtection,
            VolumeDecision::KeepCopy,
            VolumeDecision::DeleteObject,
        ]);
        all
    }

    const RELEASED: ReleasedFacts = ReleasedFacts { released_here: true, served_here: true, being_deleted: false };

    /// Every combination of the facts but the one released, served, live PV.
    fn other_facts() -> Vec<ReleasedFacts> {
        let mut all = Vec::new();
        for released_here in [true, false] {
            for served_here in [true, false] {
                for being_deleted in [true, false] {
                    let facts = ReleasedFacts { released_here, served_here, being_deleted };
                    if facts != RELEASED {
                        all.push(facts);
                    }
                }
            }
        }
        all
    }

    #[test]
    fn a_volume_not_released_here_or_not_served_here_or_being_deleted_is_never_touched() {
        for facts in other_facts() {
            for decision in every_decision() {
                assert_eq!(after_release(facts, &decision), AfterRelease::Forget, "{facts:?} {decision:?}");
            }
        }
    }

    #[test]
    fn a_released_volume_stays_released_while_its_deletion_goes_on_and_is_exposed_again_once_kept() {
        for decision in every_decision() {
            let after = after_release(RELEASED, &decision);
            match &decision {
                VolumeDecision::Delete(_) => assert_eq!(after, AfterRelease::StayReleased),
                VolumeDecision::Ignore(Ignore::NotDeletePolicy) => {
                    assert!(matches!(&after, AfterRelease::ExposeAgain(why) if why.contains("no longer Delete")))
                }
                VolumeDecision::Ignore(Ignore::NotReleased) => {
                    assert!(matches!(&after, AfterRelease::ExposeAgain(why) if why.contains("no longer Released")))
                }
                // By hand, elsewhere or refused: never exposed by this node.
                _ => assert_eq!(after, AfterRelease::Forget, "{decision:?}"),
            }
        }
    }
}

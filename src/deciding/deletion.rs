//! The deletion protocol, as pure decisions: how a volume's directory and its PV go together,
//! with no agreement between nodes needed for safety (docs/architecture.md, deletion protocol).
//!
//! Where the directory can be: at its place in the pool, staged by one node
//! (`.hpp-deleting/<node>/<pv>/<dir>`, visible to every node of a shared pool), in the trash, or
//! gone. It moves only by atomic renames: place -> staged (a node deleting it), staged -> trash
//! (commit, only once the PV is known to be gone), staged -> place (restore, only once the PV was
//! confirmed to exist by a request that gave it a new resourceVersion). Every request that lets a
//! PV go carries the resourceVersion its node decided on. So the rules below hold whatever the
//! other nodes do at the same moment, which node the liveness view picks, or when a node crashes:
//!
//! - data reaches the trash only when its PV is gone: no volume of a live PV is lost;
//! - a node that finds no directory at the place lets the PV go only when no node has it staged
//!   and it is not back at its place; a volume that comes back after those looks came back
//!   through a confirmation, which makes that node's request fail: a volume is never left without
//!   its PV by another node's deletion;
//! - a node that does not know whether its request deleted the PV keeps the directory staged
//!   (never purged) and settles it later: an answer lost on the network never puts a directory
//!   back for a PV that another node, or the request itself, deleted.
//!
//! The exhaustive model in `deletion/model.rs` checks these rules over every interleaving of
//! three nodes' steps, with crashes and lost answers between any two.

use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::volume::is_protected;

/// The one request that lets a PV go once its directory is moved aside, sent with the uid and
/// resourceVersion of the object the deletion was decided on, so that the API server refuses it
/// (409) when the PV changed since: an admin may have switched it to Retain or cleared its
/// claimRef a moment ago, and the watch cache may not show it yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LetGo {
    /// DELETE the PV; with `--pv-finalizer` (`then_drop_protection`), our finalizer holds it
    /// until the data is committed to the trash, and is removed afterwards.
    DeleteObject {
        /// Our protection finalizer is on the PV.
        then_drop_protection: bool,
    },
    /// The PV was deleted by hand while our finalizer held it: removing the finalizer (a patch
    /// carrying the resourceVersion) lets it go.
    DropProtection,
}

/// How a PV decided for deletion is let go.
pub fn how_to_let_go(pv: &KeptVolume) -> LetGo {
    if pv.metadata.deletion_timestamp.is_some() {
        LetGo::DropProtection
    } else {
        LetGo::DeleteObject { then_drop_protection: is_protected(pv) }
    }
}

/// How the API server answered the [`LetGo`] request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LetGoAnswer {
    /// Done: the PV is gone or going.
    Done,
    /// 404: the PV is gone already (another node of a shared pool, or an admin, was first).
    Gone,
    /// 409: the PV changed since it was read, or another object now has its name: it exists,
    /// and the decision may be stale.
    Changed,
    /// Anything else (no answer, a server error): it may or may not have happened.
    Unknown,
}

impl LetGoAnswer {
    /// Reads the HTTP status of a refused request.
    pub fn from_status(code: u16) -> Self {
        match code {
            404 => Self::Gone,
            409 => Self::Changed,
            _ => Self::Unknown,
        }
    }
}

/// What becomes of a volume moved aside (staged) while its PV is let go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StagedFate {
    /// Its PV is gone: into the trash, purged in the background.
    Commit,
    /// Its PV exists, or did a moment ago: confirm it with a request that changes the PV's
    /// resourceVersion ([`fate_after_confirm`]) before putting the volume back. Any other node
    /// that decided to let the PV go on what it saw before the volume came back then holds an
    /// older resourceVersion, and the API server refuses its request: a volume put back is
    /// never left without its PV.
    Confirm,
    /// Put back at its place (after a confirmation), and the next event decides again.
    Restore,
    /// Nobody knows yet whether its PV exists: it stays staged (never purged) until the PV is
    /// confirmed or known gone (`reconciling::settling`, every minute).
    Keep,
}

/// After the [`LetGo`] request.
pub fn fate_after_answer(answer: LetGoAnswer) -> StagedFate {
    match answer {
        LetGoAnswer::Done | LetGoAnswer::Gone => StagedFate::Commit,
        LetGoAnswer::Changed => StagedFate::Confirm,
        // Putting it back could leave a directory without PV, if the request did delete it (or
        // another node did meanwhile): wait until the PV is confirmed or known gone.
        LetGoAnswer::Unknown => StagedFate::Keep,
    }
}

/// How the API server answered the confirmation of a staged volume's PV (a patch of one of its
/// annotations, which gives it a new resourceVersion).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Confirmed {
    /// The PV exists, with a new resourceVersion.
    Present,
    /// 404: no PV of that name.
    Absent,
    /// No answer, or a server error.
    Unknown,
}

/// After the confirmation: the volume goes back only for a PV confirmed to exist.
pub fn fate_after_confirm(answer: Confirmed) -> StagedFate {
    match answer {
        Confirmed::Present => StagedFate::Restore,
        Confirmed::Absent => StagedFate::Commit,
        Confirmed::Unknown => StagedFate::Keep,
    }
}

/// What a node that found no directory at the volume's place (someone else moved it, or it is
/// gone) sees when it looks again. The looks need not be atomic: a volume that comes back to its
/// place after them came back through a confirmation ([`StagedFate::Confirm`]), which makes this
/// node's request to let the PV go fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotInPlace {
    /// Some node (this one included) has the volume staged for deletion.
    pub staged_by_a_node: bool,
    /// The directory is back at its place (a node put it back meanwhile).
    pub back_in_place: bool,
}

/// What to do when the directory was not at its place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenNotInPlace {
    /// It is nowhere a node may bring it back from (in the trash, or removed by hand): let the
    /// PV go.
    LetGo,
    /// A node holds it staged: that node settles it (commits it when the PV goes, or puts it
    /// back); look again later, and let nothing go now.
    WaitForTheNodeHoldingIt,
    /// It came back: stage it again.
    StageAgain,
}

/// Decides for a node that found no directory at the volume's place.
pub fn when_not_in_place(seen: NotInPlace) -> WhenNotInPlace {
    match seen {
        NotInPlace { back_in_place: true, .. } => WhenNotInPlace::StageAgain,
        NotInPlace { staged_by_a_node: true, .. } => WhenNotInPlace::WaitForTheNodeHoldingIt,
        NotInPlace { staged_by_a_node: false, back_in_place: false } => WhenNotInPlace::LetGo,
    }
}

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::keys;
    use crate::test_fixtures::{NODE, pv};

    #[test]
    fn a_released_pv_is_let_go_by_its_delete_and_a_protected_one_then_drops_its_finalizer() {
        let mut pv = pv("/var/hpvolumes/pvc-x", "Released").owner_annotation(NODE).build();
        assert_eq!(how_to_let_go(&pv), LetGo::DeleteObject { then_drop_protection: false });
        pv.metadata.finalizers = Some(vec![keys::PROTECTION_FINALIZER.into()]);
        assert_eq!(how_to_let_go(&pv), LetGo::DeleteObject { then_drop_protection: true });
        pv.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(how_to_let_go(&pv), LetGo::DropProtection, "deleted by hand: removing the finalizer lets it go");
    }

    #[test]
    fn a_staged_volume_is_committed_only_once_its_pv_is_gone_and_restored_only_once_it_exists() {
        assert_eq!(fate_after_answer(LetGoAnswer::Done), StagedFate::Commit);
        assert_eq!(fate_after_answer(LetGoAnswer::Gone), StagedFate::Commit);
        assert_eq!(fate_after_answer(LetGoAnswer::Changed), StagedFate::Confirm, "it exists: confirm, then put back");
        assert_eq!(fate_after_answer(LetGoAnswer::Unknown), StagedFate::Keep, "doubt keeps the data staged");
    }

    #[test]
    fn refused_requests_are_read_by_their_status() {
        assert_eq!(LetGoAnswer::from_status(404), LetGoAnswer::Gone);
        assert_eq!(LetGoAnswer::from_status(409), LetGoAnswer::Changed);
        for code in [400, 403, 422, 429, 500, 503] {
            assert_eq!(LetGoAnswer::from_status(code), LetGoAnswer::Unknown, "{code}");
        }
    }

    #[test]
    fn a_staged_volume_goes_back_only_for_a_pv_confirmed_to_exist() {
        assert_eq!(fate_after_confirm(Confirmed::Present), StagedFate::Restore);
        assert_eq!(fate_after_confirm(Confirmed::Absent), StagedFate::Commit);
        assert_eq!(fate_after_confirm(Confirmed::Unknown), StagedFate::Keep);
    }

    #[test]
    fn a_node_finding_no_directory_lets_the_pv_go_only_when_no_node_can_bring_it_back() {
        let seen = |staged_by_a_node, back_in_place| when_not_in_place(NotInPlace { staged_by_a_node, back_in_place });
        assert_eq!(seen(false, false), WhenNotInPlace::LetGo);
        assert_eq!(seen(true, false), WhenNotInPlace::WaitForTheNodeHoldingIt);
        assert_eq!(seen(false, true), WhenNotInPlace::StageAgain);
        assert_eq!(seen(true, true), WhenNotInPlace::StageAgain);
    }
}

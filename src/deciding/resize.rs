//! Volume expansion: this provisioner acts as the external resizer for its own PVs (the
//! expand controller of kube-controller-manager reports `ExternalExpanding` for hostPath PVs and
//! leaves them to one). Pure: what to do with a claim whose request differs from its volume.

use crate::deciding::capacity::Size;
use crate::deciding::volume::VolumeShape;

/// Everything the decision reads, gathered by the reconciler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResizeFacts {
    /// The claim's `spec.resources.requests.storage`, in bytes.
    pub requested: u64,
    /// The claim's `status.capacity.storage`, in bytes (0 when unset).
    pub claim_capacity: u64,
    /// The PV's `spec.capacity.storage`, in bytes.
    pub pv_capacity: u64,
    /// The class has `allowVolumeExpansion: true`.
    pub class_allows: bool,
    /// The PV's shape.
    pub shape: VolumeShape,
    /// This node owns the volume (node-shaped PVs).
    pub owned_here: bool,
}

/// What the pool holding the volume offers, read only when the decision needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolRoom {
    /// Bytes available to the volume's pool, the reserve already taken off.
    pub available: u64,
    /// The pool's reserve.
    pub reserve: u64,
}

/// What to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResizeDecision {
    /// Nothing asked, or already done.
    Unchanged,
    /// Another node (or nobody) acts on this volume.
    NotHere,
    /// Grow the volume (its quota, if it has one), then the PV, then the claim's status.
    Grow {
        /// New size in bytes.
        to: u64,
    },
    /// The PV already has the size (an earlier attempt stopped before the claim's status).
    RecordOnClaim,
    /// Refuse: recorded on the claim's status and in an event.
    Refuse(ResizeRefusal),
}

/// Why an expansion is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ResizeRefusal {
    /// Smaller than the volume already is.
    #[error(
        "cannot shrink volume: the claim requests {}, the volume already has {}; a hostPath volume can only grow",
        Size(*.requested), Size(*.current)
    )]
    Shrink {
        /// Requested bytes.
        requested: u64,
        /// Current PV capacity.
        current: u64,
    },
    /// The growth does not fit in the pool.
    #[error(
        "cannot grow volume by {} to {}: only {} is available in the pool (reserve {} kept free); \
         lower the request back to a size that fits",
        Size(*.growth), Size(*.requested), Size(*.available), Size(*.reserve)
    )]
    NoSpace {
        /// Bytes the growth adds.
        growth: u64,
        /// Requested bytes.
        requested: u64,
        /// Available bytes after the reserve.
        available: u64,
        /// The reserve.
        reserve: u64,
    },
    /// Shared and every-node volumes are not expanded (yet).
    #[error("expansion of {shape} volumes is not supported: only node volumes (topology: node) can be expanded")]
    Shape {
        /// `shared` or `everyNode`.
        shape: &'static str,
    },
}

/// Decides one claim's expansion. `room` is asked for only when growing.
pub fn decide_resize(facts: &ResizeFacts, room: impl FnOnce() -> Option<PoolRoom>) -> ResizeDecision {
    if !facts.class_allows || facts.requested <= facts.claim_capacity {
        // The API server only lets a request exceed the claim's capacity on expandable classes.
        return ResizeDecision::Unchanged;
    }
    match facts.shape {
        VolumeShape::Node if !facts.owned_here => return ResizeDecision::NotHere,
        VolumeShape::Node => {}
        // Deciding who acts needs the live nodes; refusing is the same answer from every node.
        VolumeShape::Shared => return ResizeDecision::Refuse(ResizeRefusal::Shape { shape: "shared" }),
        VolumeShape::EveryNode => return ResizeDecision::Refuse(ResizeRefusal::Shape { shape: "everyNode" }),
    }
    if facts.requested < facts.pv_capacity {
        return ResizeDecision::Refuse(ResizeRefusal::Shrink {
            requested: facts.requested,
            current: facts.pv_capacity,
        });
    }
    if facts.requested == facts.pv_capacity {
        return ResizeDecision::RecordOnClaim;
    }
    let growth = facts.requested - facts.pv_capacity;
    match room() {
        Some(room) if growth > room.available => ResizeDecision::Refuse(ResizeRefusal::NoSpace {
            growth,
            requested: facts.requested,
            available: room.available,
            reserve: room.reserve,
        }),
        _ => ResizeDecision::Grow { to: facts.requested },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;

    fn facts(requested: u64, claim: u64, pv: u64) -> ResizeFacts {
        ResizeFacts {
            requested,
            claim_capacity: claim,
            pv_capacity: pv,
            class_allows: true,
            shape: VolumeShape::Node,
            owned_here: true,
        }
    }

    fn room(available: u64) -> impl FnOnce() -> Option<PoolRoom> {
        move || Some(PoolRoom { available, reserve: MI })
    }

    #[test]
    fn a_larger_request_on_an_owned_node_volume_grows_it() {
        assert_eq!(
            decide_resize(&facts(20 * MI, 10 * MI, 10 * MI), room(100 * MI)),
            ResizeDecision::Grow { to: 20 * MI }
        );
    }

    #[test]
    fn nothing_to_do_when_the_claim_already_has_its_request() {
        assert_eq!(decide_resize(&facts(10 * MI, 10 * MI, 10 * MI), room(0)), ResizeDecision::Unchanged);
    }

    #[test]
    fn classes_without_allow_volume_expansion_are_left_alone() {
        let f = ResizeFacts { class_allows: false, ..facts(20 * MI, 10 * MI, 10 * MI) };
        assert_eq!(decide_resize(&f, room(100 * MI)), ResizeDecision::Unchanged);
    }

    #[test]
    fn only_the_owning_node_acts() {
        let f = ResizeFacts { owned_here: false, ..facts(20 * MI, 10 * MI, 10 * MI) };
        assert_eq!(decide_resize(&f, room(100 * MI)), ResizeDecision::NotHere);
    }

    #[test]
    fn growth_beyond_the_free_space_after_the_reserve_is_refused() {
        let decision = decide_resize(&facts(1024 * MI, 10 * MI, 10 * MI), room(100 * MI));
        let ResizeDecision::Refuse(refusal @ ResizeRefusal::NoSpace { .. }) = decision else { panic!("{decision:?}") };
        assert_eq!(
            refusal.to_string(),
            "cannot grow volume by 1014 MiB to 1 GiB: only 100 MiB is available in the pool (reserve 1 MiB kept free); \
             lower the request back to a size that fits"
        );
    }

    #[test]
    fn growth_that_exactly_fits_is_accepted() {
        assert_eq!(
            decide_resize(&facts(20 * MI, 10 * MI, 10 * MI), room(10 * MI)),
            ResizeDecision::Grow { to: 20 * MI }
        );
    }

    #[test]
    fn a_request_below_the_volume_size_is_refused_as_a_shrink() {
        // Possible after a failed expansion: the claim's capacity lags behind the PV's.
        let decision = decide_resize(&facts(15 * MI, 10 * MI, 20 * MI), room(100 * MI));
        assert_eq!(decision, ResizeDecision::Refuse(ResizeRefusal::Shrink { requested: 15 * MI, current: 20 * MI }));
    }

    #[test]
    fn a_pv_already_grown_only_needs_the_claim_status() {
        assert_eq!(decide_resize(&facts(20 * MI, 10 * MI, 20 * MI), room(0)), ResizeDecision::RecordOnClaim);
    }

    #[test]
    fn shared_and_every_node_volumes_are_refused_with_the_reason() {
        for (shape, name) in [(VolumeShape::Shared, "shared"), (VolumeShape::EveryNode, "everyNode")] {
            let f = ResizeFacts { shape, owned_here: false, ..facts(20 * MI, 10 * MI, 10 * MI) };
            assert_eq!(decide_resize(&f, room(100 * MI)), ResizeDecision::Refuse(ResizeRefusal::Shape { shape: name }));
        }
    }
}

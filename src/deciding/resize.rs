//! Volume expansion: this provisioner acts as the external resizer for its own PVs (the
//! expand controller of kube-controller-manager reports `ExternalExpanding` for hostPath PVs and
//! leaves them to one). Pure: what to do with a claim whose request differs from its volume.

use crate::deciding::block::Allocation;
use crate::deciding::capacity::Size;
use crate::deciding::topology::Acting;
use crate::deciding::volume::VolumeShape;

/// Everything the decision reads, gathered by the reconciler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResizeFacts {
    /// The claim's `spec.resources.requests.storage`, in bytes.
    pub requested: u64,
    /// The request as written and why it cannot be served as a size, when the API server
    /// accepted a quantity this provisioner cannot read as bytes (`1e30`: beyond any disk).
    pub unreadable_request: Option<String>,
    /// The claim's `status.capacity.storage`, in bytes (0 when unset).
    pub claim_capacity: u64,
    /// The PV's `spec.capacity.storage`, in bytes.
    pub pv_capacity: u64,
    /// The class has `allowVolumeExpansion: true`.
    pub class_allows: bool,
    /// The PV's shape.
    pub shape: VolumeShape,
    /// This node is the one to act: for a node volume, it owns the volume; for a shared volume,
    /// the ranking over the live nodes serving its pool picks it (as for deletion; see
    /// [`shared_actor_is_me`]).
    pub acting_here: bool,
    /// A Block volume (a backing file on a loop device, issue #47): its class's `allocation`
    /// parameter as written (`None`: not set), how the grown part of the file is allocated.
    /// `None` for a directory volume.
    pub block: Option<Option<String>>,
    /// This node serves Block volumes (`--block-volumes`): only then can it reach their loops.
    pub block_volumes_on: bool,
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
    /// Grow the volume (its quota, if it has one; a Block volume's backing file, then its
    /// loop), then the PV, then the claim's status.
    Grow {
        /// New size in bytes.
        to: u64,
        /// A Block volume: how the file's new part is allocated. Its loop is told the new size
        /// while attached (no detach, the pod keeps the device open), and its claim's capacity
        /// is set directly: a raw device has no filesystem for kubelet to resize.
        block: Option<Allocation>,
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
    /// The request is a quantity the API server accepts but no disk can serve.
    #[error("cannot grow volume: {0}; request a size in bytes a pool can hold (for example 20Gi)")]
    UnreadableRequest(String),
    /// Every-node volumes are not expanded (yet).
    #[error(
        "expansion of {shape} volumes is not supported: only node and shared volumes (topology: node or shared) can be expanded"
    )]
    Shape {
        /// `everyNode`.
        shape: &'static str,
    },
    /// A Block volume on a node where Block volumes are off: its loop cannot be told its size.
    #[error(
        "cannot grow Block volume: Block volumes are off on this node, so its loop device cannot be reached; turn them on with {}",
        crate::deciding::block::SETTING
    )]
    BlockVolumesOff,
    /// A Block volume whose class's `allocation` parameter is no longer one this provisioner
    /// reads (the class was replaced under the same name): the file's growth is not guessed.
    #[error(
        "cannot grow Block volume: StorageClass parameter allocation={value:?} is not one of {accepted}; \
         the volume keeps its size until the class names how its file is allocated"
    )]
    BlockAllocation {
        /// The parameter as written.
        value: String,
        /// What is accepted.
        accepted: &'static str,
    },
}

/// Whether this node grows a shared volume: the node [`acting_node`](crate::deciding::topology::acting_node) picks for the PV's
/// name among the live nodes serving the pool, or this one when no live node is listed for it
/// (this node has the pool, so it tries and reports what it finds, as deletion does).
pub fn shared_actor_is_me(acting: &Acting) -> bool {
    matches!(acting, Acting::Me | Acting::Nobody)
}

/// Decides one claim's expansion. `room` is asked for only when growing.
pub fn decide_resize(facts: &ResizeFacts, room: impl FnOnce() -> Option<PoolRoom>) -> ResizeDecision {
    if facts.class_allows
        && let Some(why) = &facts.unreadable_request
    {
        return match facts.shape {
            VolumeShape::Node | VolumeShape::Shared if facts.acting_here => {
                ResizeDecision::Refuse(ResizeRefusal::UnreadableRequest(why.clone()))
            }
            VolumeShape::Node | VolumeShape::Shared => ResizeDecision::NotHere,
            VolumeShape::EveryNode => ResizeDecision::Refuse(ResizeRefusal::Shape { shape: "everyNode" }),
        };
    }
    if !facts.class_allows || facts.requested <= facts.claim_capacity {
        // The API server only lets a request exceed the claim's capacity on expandable classes.
        return ResizeDecision::Unchanged;
    }
    match facts.shape {
        // A shared pool is one filesystem for every node: one node checks its free space and
        // updates the PV and the claim, like a node volume's owner does.
        VolumeShape::Node | VolumeShape::Shared if !facts.acting_here => return ResizeDecision::NotHere,
        VolumeShape::Node | VolumeShape::Shared => {}
        // One copy per node, each on its own disk: growing would need every node's room at once.
        VolumeShape::EveryNode => return ResizeDecision::Refuse(ResizeRefusal::Shape { shape: "everyNode" }),
    }
    let block = match &facts.block {
        None => None,
        Some(_) if !facts.block_volumes_on => return ResizeDecision::Refuse(ResizeRefusal::BlockVolumesOff),
        Some(allocation) => match Allocation::parse(allocation.as_deref()) {
            Ok(allocation) => Some(allocation),
            Err(accepted) => {
                let value = allocation.clone().unwrap_or_default();
                return ResizeDecision::Refuse(ResizeRefusal::BlockAllocation { value, accepted });
            }
        },
    };
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
        _ => ResizeDecision::Grow { to: facts.requested, block },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;

    fn facts(requested: u64, claim: u64, pv: u64) -> ResizeFacts {
        ResizeFacts {
            block: None,
            block_volumes_on: true,
            requested,
            unreadable_request: None,
            claim_capacity: claim,
            pv_capacity: pv,
            class_allows: true,
            shape: VolumeShape::Node,
            acting_here: true,
        }
    }

    fn room(available: u64) -> impl FnOnce() -> Option<PoolRoom> {
        move || Some(PoolRoom { available, reserve: MI })
    }

    #[test]
    fn a_larger_request_on_an_owned_node_volume_grows_it() {
        assert_eq!(
            decide_resize(&facts(20 * MI, 10 * MI, 10 * MI), room(100 * MI)),
            ResizeDecision::Grow { to: 20 * MI, block: None }
        );
    }

    #[test]
    fn a_request_the_api_server_accepts_but_no_disk_can_hold_is_refused_by_the_acting_node_only() {
        let unreadable =
            ResizeFacts { unreadable_request: Some("\"1e30\" is too large".into()), ..facts(0, 10 * MI, 10 * MI) };
        assert_eq!(
            decide_resize(&unreadable, room(100 * MI)),
            ResizeDecision::Refuse(ResizeRefusal::UnreadableRequest("\"1e30\" is too large".into()))
        );
        let elsewhere = ResizeFacts { acting_here: false, ..unreadable.clone() };
        assert_eq!(decide_resize(&elsewhere, room(100 * MI)), ResizeDecision::NotHere);
        let not_expandable = ResizeFacts { class_allows: false, ..unreadable };
        assert_eq!(decide_resize(&not_expandable, room(100 * MI)), ResizeDecision::Unchanged);
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
        let f = ResizeFacts { acting_here: false, ..facts(20 * MI, 10 * MI, 10 * MI) };
        assert_eq!(decide_resize(&f, room(100 * MI)), ResizeDecision::NotHere);
    }

    #[test]
    fn a_shared_volume_is_grown_by_the_acting_node_only() {
        let here = ResizeFacts { shape: VolumeShape::Shared, ..facts(20 * MI, 10 * MI, 10 * MI) };
        assert_eq!(decide_resize(&here, room(100 * MI)), ResizeDecision::Grow { to: 20 * MI, block: None });
        let elsewhere = ResizeFacts { acting_here: false, ..here.clone() };
        assert_eq!(decide_resize(&elsewhere, room(100 * MI)), ResizeDecision::NotHere);
    }

    #[test]
    fn a_shared_volume_checks_the_pool_room_and_shrinks_like_a_node_volume() {
        let f = ResizeFacts { shape: VolumeShape::Shared, ..facts(1024 * MI, 10 * MI, 10 * MI) };
        assert!(matches!(
            decide_resize(&f, room(100 * MI)),
            ResizeDecision::Refuse(ResizeRefusal::NoSpace { available, .. }) if available == 100 * MI
        ));
        let shrink = ResizeFacts { shape: VolumeShape::Shared, ..facts(15 * MI, 10 * MI, 20 * MI) };
        assert_eq!(
            decide_resize(&shrink, room(100 * MI)),
            ResizeDecision::Refuse(ResizeRefusal::Shrink { requested: 15 * MI, current: 20 * MI })
        );
        // Refusals too come from the acting node only: one event, not one per node.
        let elsewhere = ResizeFacts { acting_here: false, ..f };
        assert_eq!(decide_resize(&elsewhere, room(100 * MI)), ResizeDecision::NotHere);
    }

    #[test]
    fn the_shared_actor_is_the_ranked_node_or_this_one_when_none_is_live() {
        let other = Acting::Other { node: "b".into(), recheck_after: std::time::Duration::from_secs(1) };
        assert!(shared_actor_is_me(&Acting::Me));
        assert!(shared_actor_is_me(&Acting::Nobody));
        assert!(!shared_actor_is_me(&other));
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
            ResizeDecision::Grow { to: 20 * MI, block: None }
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
    fn every_node_volumes_are_refused_with_the_reason() {
        let f = ResizeFacts { shape: VolumeShape::EveryNode, acting_here: false, ..facts(20 * MI, 10 * MI, 10 * MI) };
        let decision = decide_resize(&f, room(100 * MI));
        assert_eq!(decision, ResizeDecision::Refuse(ResizeRefusal::Shape { shape: "everyNode" }));
        let ResizeDecision::Refuse(refusal) = decision else { unreachable!() };
        assert_eq!(
            refusal.to_string(),
            "expansion of everyNode volumes is not supported: only node and shared volumes (topology: node or shared) can be expanded"
        );
    }

    #[test]
    fn a_block_volume_grows_by_its_node_with_its_class_allocation() {
        let sparse = ResizeFacts { block: Some(None), ..facts(20 * MI, 10 * MI, 10 * MI) };
        assert_eq!(
            decide_resize(&sparse, room(100 * MI)),
            ResizeDecision::Grow { to: 20 * MI, block: Some(Allocation::Sparse) }
        );
        let full = ResizeFacts { block: Some(Some("full".into())), ..sparse.clone() };
        assert_eq!(
            decide_resize(&full, room(100 * MI)),
            ResizeDecision::Grow { to: 20 * MI, block: Some(Allocation::Full) }
        );
        let elsewhere = ResizeFacts { acting_here: false, ..full.clone() };
        assert_eq!(decide_resize(&elsewhere, room(100 * MI)), ResizeDecision::NotHere);
        // The same room and shrink rules as a directory's.
        assert!(matches!(
            decide_resize(&ResizeFacts { requested: 1024 * MI, ..full.clone() }, room(100 * MI)),
            ResizeDecision::Refuse(ResizeRefusal::NoSpace { .. })
        ));
        let shrink = ResizeFacts { requested: 15 * MI, pv_capacity: 20 * MI, ..full.clone() };
        assert!(matches!(decide_resize(&shrink, room(100 * MI)), ResizeDecision::Refuse(ResizeRefusal::Shrink { .. })));
        let recorded = ResizeFacts { pv_capacity: 20 * MI, ..full };
        assert_eq!(decide_resize(&recorded, room(0)), ResizeDecision::RecordOnClaim);
    }

    #[test]
    fn a_block_volume_on_a_node_with_block_volumes_off_is_refused_naming_the_setting() {
        let f = ResizeFacts { block: Some(None), block_volumes_on: false, ..facts(20 * MI, 10 * MI, 10 * MI) };
        let decision = decide_resize(&f, room(100 * MI));
        assert_eq!(decision, ResizeDecision::Refuse(ResizeRefusal::BlockVolumesOff));
        let ResizeDecision::Refuse(refusal) = decision else { unreachable!() };
        assert!(refusal.to_string().contains("--block-volumes"), "{refusal}");
    }

    #[test]
    fn a_block_volume_whose_class_allocation_is_unreadable_keeps_its_size() {
        let f = ResizeFacts { block: Some(Some("thick".into())), ..facts(20 * MI, 10 * MI, 10 * MI) };
        let decision = decide_resize(&f, room(100 * MI));
        let ResizeDecision::Refuse(refusal @ ResizeRefusal::BlockAllocation { .. }) = decision else {
            panic!("{decision:?}")
        };
        assert!(refusal.to_string().contains("allocation=\"thick\" is not one of sparse, full"), "{refusal}");
    }
}

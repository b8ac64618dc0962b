//! `volume_decision::decide_volume` on PVs built from fuzz input, compared with a model of
//! docs/architecture.md: compatibility contract item 6, deletion rules: only a released, Delete-policy PV of ours owned by this node is
//! acted on, and only a path the deletion rules accept is deleted.
#![no_main]

use hostpath_provisioner::deciding::layout;
use hostpath_provisioner::deciding::volume::{self as volume_decision, DeleteRefusal, VolumeDecision, VolumeShape};
use hostpath_provisioner::keys;
use hostpath_provisioner_fuzz::{
    HOSTNAME, PROVISIONER, VolumeInput, check_accepted, me, model_accept, model_owned_here, two_pools,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: VolumeInput| {
    let pv = input.pv();
    let pools = two_pools();
    let decision = volume_decision::decide_volume(&pv, &me(), HOSTNAME, &pools, &[]);

    // The model: act only on a released Delete-policy PV of ours, not being deleted, owned here.
    let spec = pv.spec.as_ref();
    let ours = pv.metadata.deletion_timestamp.is_none()
        && pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
        && spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete")
        && pv.metadata.annotations.as_ref().and_then(|a| a.get(keys::PROVISIONED_BY)).map(String::as_str)
            == Some(PROVISIONER)
        && model_owned_here(&pv);
    let host_path = spec.and_then(|s| s.host_path.as_ref()).map(|h| h.path.as_str());
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();

    // The model covers node-owned volumes. Shared and every-node volumes (no owning node; a
    // topology label, or a path in a pool) follow the leases of other nodes, which this target
    // does not generate: for them only path safety is checked.
    if volume_decision::volume_shape(&pv, &pools) != VolumeShape::Node {
        let accepted = match &decision {
            VolumeDecision::Delete(accepted)
            | VolumeDecision::EnsureCopy { accepted, .. }
            | VolumeDecision::RemoveCopy { accepted, .. } => accepted,
            VolumeDecision::Refuse(DeleteRefusal::UnsafePath { path, refusal }) => {
                assert_eq!(model_accept(path, pv_name, &pools), None, "refused {path:?}: {refusal}");
                return;
            }
            _ => return,
        };
        let path = host_path.expect("acting on a directory without a hostPath");
        check_accepted(path, pv_name, accepted, &pools);
        return;
    }
    match &decision {
        VolumeDecision::EnsureCopy { .. }
        | VolumeDecision::RemoveCopy { .. }
        | VolumeDecision::KeepCopy
        | VolumeDecision::DeleteObject => panic!("every-node decision {decision:?} for a node-owned PV"),
        // The generated PVs carry no finalizers and no node label.
        VolumeDecision::DropProtection => panic!("protection decision for a PV without our finalizer"),
        VolumeDecision::Ignore(why) => assert!(!ours, "ignored ({why:?}) a PV this node must handle"),
        VolumeDecision::Delete(accepted) => {
            assert!(ours, "deleting a PV this node must leave alone");
            let path = host_path.expect("deleting without a hostPath");
            check_accepted(path, pv_name, accepted, &pools);
            assert_eq!(layout::accept_delete_path(path, pv_name, &pools).as_ref(), Ok(accepted));
        }
        VolumeDecision::Refuse(refusal) => {
            assert!(ours, "refusal ({refusal}) reported for a PV this node must leave alone");
            match refusal {
                DeleteRefusal::NoHostPath => assert!(host_path.is_none()),
                DeleteRefusal::OwnerMismatch { .. } => {
                    panic!("owner mismatch reported for a PV without our node label")
                }
                DeleteRefusal::NoNodeServesPath { .. } => {
                    panic!("a node-owned PV refused for want of a node serving its pool: {refusal}")
                }
                DeleteRefusal::UnsafePath { path, refusal } => {
                    assert_eq!(Some(path.as_str()), host_path);
                    assert_eq!(model_accept(path, pv_name, &pools), None, "refused {path:?}: {refusal}");
                }
            }
        }
    }
});

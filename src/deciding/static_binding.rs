//! Whether a WaitForFirstConsumer claim placed on this node is already spoken for by an existing
//! PV.
//!
//! The scheduler writes `volume.kubernetes.io/selected-node` only when it found no existing PV for
//! the claim, so this node provisions at once rather than waiting for kube-controller-manager to
//! copy the class's provisioner onto the claim (seconds under load). Before annotating, the PV
//! controller looks once more for a PV to bind (`FindMatchingVolume`); for a WaitForFirstConsumer
//! claim that look binds only a PV pre-bound to the claim (its `spec.claimRef` names it), since
//! unclaimed PVs are the scheduler's to match. A pre-bound PV the scheduler's cache missed (created
//! in the same moment) is that case's only rescue, so this node makes the same check on the PVs it
//! watches, and leaves such a claim to the PV controller.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::deciding::capacity::parse_bytes;
use crate::deciding::kept_volume::KeptVolume;

/// The name of a PV the PV controller would bind `claim` to rather than have one provisioned:
/// pre-bound to the claim (namespace and name; the uid, if set, the claim's), not being deleted,
/// of the claim's volume mode and at least its request, as the PV controller requires.
pub fn pre_bound_volume<'a>(
    claim: &PersistentVolumeClaim,
    volumes: impl IntoIterator<Item = &'a KeptVolume>,
) -> Option<String> {
    let spec = claim.spec.as_ref()?;
    let bytes = |quantity: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        quantity.and_then(|q| parse_bytes(&q.0).ok()).unwrap_or(0)
    };
    let request = bytes(spec.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage")));
    let mode = spec.volume_mode.as_deref().unwrap_or("Filesystem");
    volumes.into_iter().find_map(|pv| {
        let pv_spec = pv.spec.as_ref()?;
        let claim_ref = pv_spec.claim_ref.as_ref()?;
        let names_claim = claim_ref.namespace == claim.metadata.namespace
            && claim_ref.name == claim.metadata.name
            && claim_ref.uid.as_deref().is_none_or(|uid| uid.is_empty() || Some(uid) == claim.metadata.uid.as_deref());
        let fits = names_claim
            && pv.metadata.deletion_timestamp.is_none()
            && pv_spec.volume_mode.as_deref().unwrap_or("Filesystem") == mode
            && bytes(pv_spec.capacity.as_ref().and_then(|c| c.get("storage"))) >= request;
        fits.then(|| pv.metadata.name.clone().unwrap_or_default())
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::deciding::kept_volume::{KeptClaimRef, KeptVolumeFields, KeptVolumeSpec};
    use crate::test_fixtures::*;

    fn static_pv(size: &str, claim_ref: Option<(&str, &str, Option<&str>)>) -> KeptVolume {
        KeptVolume::from(KeptVolumeFields {
            metadata: ObjectMeta { name: Some("static".into()), ..Default::default() },
            labels: Default::default(),
            annotations: Default::default(),
            spec: Some(KeptVolumeSpec {
                capacity: Some(BTreeMap::from([("storage".to_owned(), Quantity(size.into()))]).into()),
                claim_ref: claim_ref.map(|(namespace, name, uid)| KeptClaimRef {
                    namespace: Some(namespace.into()),
                    name: Some(name.into()),
                    uid: uid.map(Into::into),
                }),
                ..Default::default()
            }),
            status: None,
        })
    }

    #[test]
    fn a_pv_pre_bound_to_the_claim_is_found() {
        let claim = claim("hpp").selected(NODE).build();
        for uid in [None, Some(""), Some(UID)] {
            let pv = static_pv("1Gi", Some(("default", "data", uid)));
            assert_eq!(pre_bound_volume(&claim, [&pv]).as_deref(), Some("static"), "{uid:?}");
        }
    }

    #[test]
    fn other_pvs_are_the_scheduler_s_or_nobody_s() {
        let claim = claim("hpp").selected(NODE).build();
        let unclaimed = static_pv("2Gi", None);
        let for_another = static_pv("1Gi", Some(("default", "other", None)));
        let other_namespace = static_pv("1Gi", Some(("elsewhere", "data", None)));
        let earlier_claim = static_pv("1Gi", Some(("default", "data", Some("another-uid"))));
        let too_small = static_pv("512Mi", Some(("default", "data", None)));
        let mut block = static_pv("1Gi", Some(("default", "data", None)));
        block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let mut deleting = static_pv("1Gi", Some(("default", "data", None)));
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
        for pv in [unclaimed, for_another, other_namespace, earlier_claim, too_small, block, deleting] {
            assert_eq!(pre_bound_volume(&claim, [&pv]), None, "{:?} {:?}", pv.spec, pv.metadata);
        }
    }
}

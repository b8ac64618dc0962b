//! Whether this node deletes a PV and its directory (DESIGN.md sections 1.6 and 6). Pure.

use k8s_openapi::api::core::v1::PersistentVolume;

use crate::deciding::claim::Identity;
use crate::deciding::layout::{self, AcceptedPath, PathRefusal, PoolPath};
use crate::keys;

/// Why a PV is left alone silently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ignore {
    /// Already being deleted (by an admin, or by us).
    BeingDeleted,
    /// Not `Released`.
    NotReleased,
    /// Reclaim policy is not `Delete` (Retain keeps PV and data).
    NotDeletePolicy,
    /// Made by another provisioner.
    NotOurs,
    /// Owned by another node, or owner unknown (other nodes stay silent: no event, no retry).
    OtherNode,
}

/// What to do with a PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeDecision {
    /// Nothing, silently.
    Ignore(Ignore),
    /// Remove this directory, then the PV.
    Delete(AcceptedPath),
    /// Ours to delete, but the path is unsafe: Warning event, nothing removed.
    Refuse(DeleteRefusal),
}

/// Why the owning node refuses to delete a PV's data.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DeleteRefusal {
    /// No `spec.hostPath` (the Go build crashed here).
    #[error("PV has no spec.hostPath; refusing to delete anything. Remove the PV by hand once its data is dealt with")]
    NoHostPath,
    /// The path failed the rules of DESIGN.md section 6.
    #[error("refusing to delete {path:?}: {refusal}. Nothing was removed; check the PV and remove it by hand")]
    UnsafePath {
        /// The PV's hostPath.
        path: String,
        /// Which rule.
        refusal: PathRefusal,
    },
}

/// The node that owns a PV: the `kubevirt.io/provisionOnNode` annotation, or for PVs lacking it
/// (written before August 2019) the single value of its `kubernetes.io/hostname` node affinity.
pub fn owner_node(pv: &PersistentVolume) -> Option<&str> {
    if let Some(node) = pv.metadata.annotations.as_ref().and_then(|a| a.get(keys::PROVISION_ON_NODE)) {
        return Some(node);
    }
    let terms = &pv.spec.as_ref()?.node_affinity.as_ref()?.required.as_ref()?.node_selector_terms;
    let [term] = terms.as_slice() else { return None };
    let [expr] = term.match_expressions.as_deref()? else { return None };
    if expr.key != keys::HOSTNAME_LABEL || expr.operator != "In" {
        return None;
    }
    match expr.values.as_deref()? {
        [value] => Some(value),
        _ => None,
    }
}

/// Decides for one PV. `my_hostname` is this node's `kubernetes.io/hostname` label value, which
/// legacy affinity-only PVs may carry instead of the node name.
pub fn decide_volume(pv: &PersistentVolume, me: &Identity, my_hostname: &str, pools: &[PoolPath]) -> VolumeDecision {
    if pv.metadata.deletion_timestamp.is_some() {
        return VolumeDecision::Ignore(Ignore::BeingDeleted);
    }
    if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Released") {
        return VolumeDecision::Ignore(Ignore::NotReleased);
    }
    let spec = pv.spec.as_ref();
    if spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) != Some("Delete") {
        return VolumeDecision::Ignore(Ignore::NotDeletePolicy);
    }
    let provisioned_by = pv.metadata.annotations.as_ref().and_then(|a| a.get(keys::PROVISIONED_BY));
    if provisioned_by != Some(&me.provisioner) {
        return VolumeDecision::Ignore(Ignore::NotOurs);
    }
    match owner_node(pv) {
        Some(owner) if owner == me.node || (!has_owner_annotation(pv) && owner == my_hostname) => {}
        _ => return VolumeDecision::Ignore(Ignore::OtherNode),
    }
    let Some(host_path) = spec.and_then(|s| s.host_path.as_ref()) else {
        return VolumeDecision::Refuse(DeleteRefusal::NoHostPath);
    };
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    match layout::accept_delete_path(&host_path.path, pv_name, pools) {
        Ok(accepted) => VolumeDecision::Delete(accepted),
        Err(refusal) => VolumeDecision::Refuse(DeleteRefusal::UnsafePath { path: host_path.path.clone(), refusal }),
    }
}

fn has_owner_annotation(pv: &PersistentVolume) -> bool {
    pv.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(keys::PROVISION_ON_NODE))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{
        HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeSpec,
        PersistentVolumeStatus, VolumeNodeAffinity,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    use super::*;
    use crate::test_fixtures::*;

    /// A PV shaped exactly like the Go build writes it (no labels, no hostPath type).
    fn go_pv(dir: &str, owner_annotation: Option<&str>, affinity_node: &str) -> PersistentVolume {
        let mut annotations = BTreeMap::from([
            (keys::PROVISIONED_BY.to_owned(), PROVISIONER.to_owned()),
            (keys::PROVISIONER_IDENTITY.to_owned(), PROVISIONER.to_owned()),
        ]);
        if let Some(node) = owner_annotation {
            annotations.insert(keys::PROVISION_ON_NODE.into(), node.into());
        }
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(format!("pvc-{UID}")),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                persistent_volume_reclaim_policy: Some("Delete".into()),
                host_path: Some(HostPathVolumeSource { path: format!("/var/hpvolumes/{dir}"), type_: None }),
                node_affinity: Some(VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "kubernetes.io/hostname".into(),
                                operator: "In".into(),
                                values: Some(vec![affinity_node.into()]),
                            }]),
                            match_fields: None,
                        }],
                    }),
                }),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus { phase: Some("Released".into()), ..Default::default() }),
        }
    }

    fn decide(pv: &PersistentVolume) -> VolumeDecision {
        decide_volume(pv, &me(), "node-a-host", &config().pools)
    }

    fn pv_dir() -> String {
        format!("pvc-{UID}")
    }

    #[test]
    fn released_delete_pv_of_ours_on_this_node_is_deleted_in_every_go_layout() {
        for dir in [pv_dir(), format!("data-{}", pv_dir()), format!("default-data-{}", pv_dir())] {
            let d = decide(&go_pv(&dir, Some(NODE), NODE));
            assert_eq!(d, VolumeDecision::Delete(AcceptedPath { pool: "legacy".into(), dir_name: dir }));
        }
    }

    #[test]
    fn other_nodes_stay_silent() {
        assert_eq!(decide(&go_pv(&pv_dir(), Some(OTHER_NODE), OTHER_NODE)), VolumeDecision::Ignore(Ignore::OtherNode));
        // The annotation wins over the affinity.
        assert_eq!(decide(&go_pv(&pv_dir(), Some(OTHER_NODE), NODE)), VolumeDecision::Ignore(Ignore::OtherNode));
    }

    #[test]
    fn pv_without_owner_annotation_falls_back_to_node_affinity() {
        assert!(matches!(decide(&go_pv(&pv_dir(), None, NODE)), VolumeDecision::Delete(_)));
        assert!(matches!(decide(&go_pv(&pv_dir(), None, "node-a-host")), VolumeDecision::Delete(_)));
        assert_eq!(decide(&go_pv(&pv_dir(), None, OTHER_NODE)), VolumeDecision::Ignore(Ignore::OtherNode));
    }

    #[test]
    fn pv_without_any_owner_is_nobodys() {
        let mut pv = go_pv(&pv_dir(), None, NODE);
        pv.spec.as_mut().unwrap().node_affinity = None;
        assert_eq!(decide(&pv), VolumeDecision::Ignore(Ignore::OtherNode));
    }

    #[test]
    fn only_released_delete_pvs_of_ours_without_deletion_timestamp_qualify() {
        let mut bound = go_pv(&pv_dir(), Some(NODE), NODE);
        bound.status.as_mut().unwrap().phase = Some("Bound".into());
        assert_eq!(decide(&bound), VolumeDecision::Ignore(Ignore::NotReleased));

        let mut retain = go_pv(&pv_dir(), Some(NODE), NODE);
        retain.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        assert_eq!(decide(&retain), VolumeDecision::Ignore(Ignore::NotDeletePolicy));

        let mut foreign = go_pv(&pv_dir(), Some(NODE), NODE);
        foreign.metadata.annotations.as_mut().unwrap().insert(keys::PROVISIONED_BY.into(), "other".into());
        assert_eq!(decide(&foreign), VolumeDecision::Ignore(Ignore::NotOurs));

        let mut deleting = go_pv(&pv_dir(), Some(NODE), NODE);
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(decide(&deleting), VolumeDecision::Ignore(Ignore::BeingDeleted));
    }

    #[test]
    fn pv_without_host_path_is_refused_not_a_crash() {
        let mut pv = go_pv(&pv_dir(), Some(NODE), NODE);
        pv.spec.as_mut().unwrap().host_path = None;
        assert_eq!(decide(&pv), VolumeDecision::Refuse(DeleteRefusal::NoHostPath));
    }

    #[test]
    fn pv_pointing_outside_the_pool_is_refused() {
        let mut pv = go_pv(&pv_dir(), Some(NODE), NODE);
        for path in ["/", "/etc", "/var/hpvolumes", "/var/hpvolumes/../../etc"] {
            pv.spec.as_mut().unwrap().host_path.as_mut().unwrap().path = path.into();
            assert!(matches!(decide(&pv), VolumeDecision::Refuse(DeleteRefusal::UnsafePath { .. })), "{path}");
        }
    }

    #[test]
    fn refusals_on_other_nodes_stay_silent() {
        // An unsafe PV of another node is that node's to report.
        let mut pv = go_pv(&pv_dir(), Some(OTHER_NODE), OTHER_NODE);
        pv.spec.as_mut().unwrap().host_path = None;
        assert_eq!(decide(&pv), VolumeDecision::Ignore(Ignore::OtherNode));
    }
}

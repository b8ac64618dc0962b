//! The PersistentVolume we write for a provisioned claim (docs/architecture.md, what a provisioned volume looks like). Pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, LocalVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::deciding::claim::ProvisionPlan;
use crate::deciding::class::VolumeType;
use crate::deciding::identity::Identity;
use crate::deciding::layout;
use crate::deciding::node_affinity;
use crate::deciding::quota::VolumeQuota;
use crate::deciding::settings::PvCapacity;
use crate::deciding::topology::Topology;
use crate::keys;

/// Whether a new volume's PV reports the whole filesystem's size as its capacity: only a plain
/// volume under `PV_CAPACITY=filesystem`. A quota volume's size is its limit, the request: were
/// the PV (and so the claim's status) to say the disk size, every expansion below it would be
/// judged already done and silently do nothing.
pub fn pv_reports_filesystem_size(setting: PvCapacity, volume: VolumeQuota) -> bool {
    setting == PvCapacity::Filesystem && volume == VolumeQuota::Unlimited
}

/// The `hostPathProvisionerIdentity` a volume of `volume_type` carries: the provisioner name, as
/// the Go build writes it, except on a local PV, which the Go build must leave alone
/// ([`keys::LOCAL_IDENTITY_SUFFIX`]).
pub fn identity_of(volume_type: VolumeType, provisioner: &str) -> String {
    match volume_type {
        VolumeType::HostPath => provisioner.to_owned(),
        VolumeType::Local => format!("{provisioner}{}", keys::LOCAL_IDENTITY_SUFFIX),
    }
}

/// The identity `pv` should carry instead of the one it has, if it is a local PV of this node
/// made by an earlier release (with the plain provisioner name, which the Go build acts on).
/// Only the owning node rewrites it, so that nodes do not write the same PV together.
pub fn identity_to_rewrite(pv: &crate::deciding::kept_volume::KeptVolume, me: &Identity) -> Option<String> {
    let local = pv.spec.as_ref().is_some_and(|s| s.local.is_some());
    let provisioned_by = pv.annotations.get(keys::PROVISIONED_BY).filter(|p| me.serves(p))?;
    let plain = pv.annotations.get(keys::PROVISIONER_IDENTITY) == Some(provisioned_by);
    let mine = crate::deciding::node_affinity::holds(pv, &me.affinity)
        .unwrap_or_else(|| crate::deciding::volume::owner_node(pv) == Some(me.node.as_str()));
    (local && plain && mine).then(|| identity_of(VolumeType::Local, provisioned_by))
}

/// The node a volume is placed on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    /// Node object name.
    pub name: String,
    /// Value of the Node's `kubernetes.io/hostname` label (the node name when it has none).
    pub hostname: String,
}

/// Builds the PV for `claim` as planned. `capacity` is what the PV advertises (the request, or
/// the Go build's rounded filesystem size).
pub fn build_pv(
    plan: &ProvisionPlan,
    claim: &PersistentVolumeClaim,
    node: &NodeFacts,
    capacity: Quantity,
) -> PersistentVolume {
    let mut annotations = BTreeMap::from([
        (keys::PROVISIONED_BY.to_owned(), plan.provisioner.clone()),
        (keys::PROVISIONER_IDENTITY.to_owned(), identity_of(plan.volume_type, &plan.provisioner)),
    ]);
    // The kubelet adds this gid to the supplemental groups of every pod using the volume, so a
    // class's group reaches its pods without each pod naming it.
    if let Some(gid) = plan.ownership.gid {
        annotations.insert(keys::VOLUME_GID.to_owned(), gid.to_string());
    }
    // Tells deletion, expansion and clones to check the directory's marker (its name alone does
    // not tie it to this PV).
    if let Some(pattern) = &plan.path_pattern {
        annotations.insert(keys::PATH_PATTERN.to_owned(), pattern.clone());
    }
    let mut finalizers = plan.protect.then(|| vec![keys::PROTECTION_FINALIZER.to_owned()]);
    let labels = match plan.topology {
        // The node that made it stays named (the Go build reads it); a volume pinned to a label
        // is labelled with the label's token, so every node carrying the label watches it.
        Topology::Node => {
            annotations.insert(keys::PROVISION_ON_NODE.to_owned(), node.name.clone());
            let node_label = match &plan.affinity {
                Some(label) => {
                    annotations.insert(node_affinity::ANNOTATION.to_owned(), label.annotation());
                    label.token()
                }
                None => layout::node_label_value(&node.name),
            };
            BTreeMap::from([(keys::NODE_LABEL.to_owned(), node_label)])
        }
        Topology::Shared => BTreeMap::from([(keys::TOPOLOGY_LABEL.to_owned(), plan.topology.as_str().to_owned())]),
        Topology::EveryNode => {
            // This node's copy exists before the PV does: its finalizer comes with the PV.
            finalizers = Some(vec![layout::copy_finalizer(&node.name)]);
            BTreeMap::from([(keys::TOPOLOGY_LABEL.to_owned(), plan.topology.as_str().to_owned())])
        }
    };
    // Only a node-shaped volume is pinned; the others are reachable from every node.
    let node_affinity = (plan.topology == Topology::Node).then(|| VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![match &plan.affinity {
                    Some(label) => NodeSelectorRequirement {
                        key: label.key.clone(),
                        operator: "In".into(),
                        values: Some(vec![label.value.clone()]),
                    },
                    None => NodeSelectorRequirement {
                        key: keys::HOSTNAME_LABEL.into(),
                        operator: "In".into(),
                        values: Some(vec![node.hostname.clone()]),
                    },
                }]),
                match_fields: None,
            }],
        }),
    });
    let path = plan.pool.root.join(&plan.dir_name).to_string_lossy().into_owned();
    let (host_path, local) = match plan.volume_type {
        VolumeType::HostPath => (
            Some(HostPathVolumeSource {
                path,
                // A missing directory must fail the pod, not silently create one on the root disk.
                type_: Some("Directory".into()),
            }),
            None,
        ),
        // The kubelet mounts a local PV's directory as it is (a missing one fails the pod) and
        // needs the node affinity above, which every node volume has.
        VolumeType::Local => (None, Some(LocalVolumeSource { path, fs_type: None })),
    };
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(plan.pv_name.clone()),
            annotations: Some(annotations),
            labels: Some(labels),
            finalizers,
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(plan.access_modes.clone()),
            capacity: Some(BTreeMap::from([("storage".to_owned(), capacity)])),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: claim.metadata.namespace.clone(),
                name: claim.metadata.name.clone(),
                uid: claim.metadata.uid.clone(),
                resource_version: claim.metadata.resource_version.clone(),
                ..Default::default()
            }),
            storage_class_name: Some(plan.class_name.clone()),
            persistent_volume_reclaim_policy: Some(plan.reclaim_policy.clone()),
            volume_mode: Some("Filesystem".into()),
            host_path,
            local,
            node_affinity,
            ..Default::default()
        }),
        status: None,
    }
}

/// The PV of a Block volume (`deciding::block`): as [`build_pv`] would write it for a `local` volume, with
/// `volumeMode: Block`, `spec.local.path` its device node, pinned to the node, and the
/// annotations that tie it to its backing file (`backing_inode` and `backing_birth` as made); its node in
/// `device_dir`.
pub fn build_block_pv(
    plan: &ProvisionPlan,
    claim: &PersistentVolumeClaim,
    node: &NodeFacts,
    capacity: Quantity,
    backing_inode: u64,
    backing_birth: Option<crate::deciding::block::Birth>,
    device_dir: &std::path::Path,
) -> Result<PersistentVolume, crate::deciding::block::BlockPathRefusal> {
    if plan.topology != crate::deciding::topology::Topology::Node {
        return Err(crate::deciding::block::BlockPathRefusal::NotNodeTopology(plan.topology));
    }
    let device = crate::deciding::block::device_node_path(device_dir, &plan.pv_name)?;
    let local_plan =
        ProvisionPlan { volume_type: crate::deciding::class::VolumeType::Local, block: None, ..plan.clone() };
    let mut pv = build_pv(&local_plan, claim, node, capacity);
    let annotations = pv.metadata.annotations.get_or_insert_default();
    annotations.insert(crate::deciding::block::BACKING_INODE_ANNOTATION.to_owned(), backing_inode.to_string());
    if let Some(birth) = backing_birth {
        annotations.insert(crate::deciding::block::BACKING_BIRTH_ANNOTATION.to_owned(), birth.to_annotation());
    }
    annotations.insert(
        crate::deciding::block::BACKING_DIR_ANNOTATION.to_owned(),
        plan.pool.root.join(&plan.dir_name).to_string_lossy().into_owned(),
    );
    // An fsGroup means nothing to a raw device, and the kubelet would try to apply it.
    annotations.remove(keys::VOLUME_GID);
    let spec = pv.spec.get_or_insert_default();
    spec.volume_mode = Some("Block".into());
    spec.host_path = None;
    spec.local = Some(k8s_openapi::api::core::v1::LocalVolumeSource {
        path: device.to_string_lossy().into_owned(),
        fs_type: None,
    });
    Ok(pv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deciding::claim::{Decision, decide_claim};
    use crate::deciding::class::BindingMode;
    use crate::test_fixtures::*;

    fn plan_for(claim: &PersistentVolumeClaim) -> ProvisionPlan {
        let mut c = class("hpp", "WaitForFirstConsumer");
        c.reclaim_policy = Some("Retain".into());
        match decide_claim(claim, Some(&c), &me(), &config(), &[]) {
            Decision::Provision(plan) => *plan,
            other => panic!("{other:?}"),
        }
    }

    fn node() -> NodeFacts {
        NodeFacts { name: NODE.into(), hostname: "node-a.example.com".into() }
    }

    #[test]
    fn pv_has_the_shape_of_design_section_5() {
        let claim = claim("hpp").selected(NODE).access_modes(&["ReadWriteOncePod"]).build();
        let plan = plan_for(&claim);
        assert_eq!(plan.binding_mode, BindingMode::WaitForFirstConsumer);
        let pv = build_pv(&plan, &claim, &node(), Quantity("1Gi".into()));

        assert_eq!(pv.metadata.name.as_deref(), Some(format!("pvc-{UID}").as_str()));
        let ann = pv.metadata.annotations.as_ref().unwrap();
        assert_eq!(ann[keys::PROVISIONED_BY], PROVISIONER);
        assert_eq!(ann[keys::PROVISIONER_IDENTITY], PROVISIONER);
        assert_eq!(ann[keys::PROVISION_ON_NODE], NODE);
        assert_eq!(pv.metadata.labels.as_ref().unwrap()[keys::NODE_LABEL], NODE);
        assert!(pv.metadata.finalizers.is_none(), "no finalizers (docs/architecture.md, contract item 7)");

        let spec = pv.spec.unwrap();
        let claim_ref = spec.claim_ref.unwrap();
        assert_eq!(claim_ref.uid.as_deref(), Some(UID));
        assert_eq!(claim_ref.name.as_deref(), Some("data"));
        assert_eq!(claim_ref.namespace.as_deref(), Some("default"));
        assert_eq!(claim_ref.kind.as_deref(), Some("PersistentVolumeClaim"));
        assert_eq!(spec.storage_class_name.as_deref(), Some("hpp"));
        assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
        assert_eq!(spec.mount_options, None, "the kubelet refuses mount options on hostPath");
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOncePod".to_owned()]));
        assert_eq!(spec.capacity.unwrap()["storage"], Quantity("1Gi".into()));
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        let host_path = spec.host_path.unwrap();
        assert_eq!(host_path.path, format!("/var/hpvolumes/pvc-{UID}"));
        assert_eq!(host_path.type_.as_deref(), Some("Directory"));
        let terms = spec.node_affinity.unwrap().required.unwrap().node_selector_terms;
        assert_eq!(terms.len(), 1);
        let exprs = terms[0].match_expressions.as_ref().unwrap();
        assert_eq!(exprs.len(), 1);
        assert_eq!(exprs[0].key, "kubernetes.io/hostname");
        assert_eq!(exprs[0].operator, "In");
        assert_eq!(exprs[0].values, Some(vec!["node-a.example.com".to_owned()]), "hostname label value, not node name");
    }

    fn decide_in(class: &k8s_openapi::api::storage::v1::StorageClass, claim: &PersistentVolumeClaim) -> Decision {
        decide_claim(claim, Some(class), &me(), &config(), &[])
    }

    fn with_params(params: &[(&str, &str)]) -> k8s_openapi::api::storage::v1::StorageClass {
        let mut c = class("hpp", "WaitForFirstConsumer");
        c.parameters = Some(params.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        c
    }

    #[test]
    fn a_local_volume_type_writes_a_local_pv_of_the_same_directory_and_node() {
        let claim = claim("hpp").selected(NODE).build();
        let Decision::Provision(plan) = decide_in(&with_params(&[("volumeType", "local")]), &claim) else {
            panic!("provisioned")
        };
        let pv = build_pv(&plan, &claim, &node(), Quantity("1Gi".into()));
        let spec = pv.spec.as_ref().unwrap();
        assert!(spec.host_path.is_none(), "one volume source only");
        assert_eq!(spec.local.as_ref().unwrap().path, format!("/var/hpvolumes/pvc-{UID}"));
        assert!(spec.node_affinity.is_some(), "a local PV needs its node affinity");
        assert_eq!(pv.metadata.annotations.as_ref().unwrap()[keys::PROVISION_ON_NODE], NODE);
        // Its path is read, and accepted for deletion, like a hostPath PV's.
        assert_eq!(
            crate::deciding::volume::volume_path(&pv.clone().into()),
            Some(format!("/var/hpvolumes/pvc-{UID}").as_str())
        );
        assert!(
            layout::accept_delete_path(&format!("/var/hpvolumes/pvc-{UID}"), &plan.pv_name, &config().pools).is_ok()
        );
        let hostpath = match decide_in(&with_params(&[("volumeType", "hostPath")]), &claim) {
            Decision::Provision(plan) => build_pv(&plan, &claim, &node(), Quantity("1Gi".into())),
            other => panic!("{other:?}"),
        };
        assert!(hostpath.spec.as_ref().unwrap().local.is_none());
        // The Go build acts on the plain identity only: a hostPath PV keeps it, a local PV not.
        let identity =
            |pv: &PersistentVolume| pv.metadata.annotations.as_ref().unwrap()[keys::PROVISIONER_IDENTITY].clone();
        assert_eq!(identity(&hostpath), PROVISIONER);
        assert_eq!(identity(&pv), format!("{PROVISIONER}/local"));
    }

    /// A local PV an earlier release wrote with the plain identity is rewritten by its own node,
    /// and only it; a hostPath PV, another provisioner's or another node's PV is left.
    #[test]
    fn a_local_pv_of_an_earlier_release_gets_the_local_identity_from_its_node() {
        let claim = claim("hpp").selected(NODE).build();
        let Decision::Provision(plan) = decide_in(&with_params(&[("volumeType", "local")]), &claim) else {
            panic!("provisioned")
        };
        let mut old = build_pv(&plan, &claim, &node(), Quantity("1Gi".into()));
        old.metadata.annotations.as_mut().unwrap().insert(keys::PROVISIONER_IDENTITY.into(), PROVISIONER.into());
        let kept = |pv: &PersistentVolume| crate::deciding::kept_volume::KeptVolume::from(pv.clone());
        assert_eq!(identity_to_rewrite(&kept(&old), &me()), Some(format!("{PROVISIONER}/local")));
        let other_node = Identity { node: "elsewhere".into(), ..me() };
        assert_eq!(identity_to_rewrite(&kept(&old), &other_node), None, "not its node");
        let other_provisioner = Identity { provisioner: "example.com/other".into(), ..me() };
        assert_eq!(identity_to_rewrite(&kept(&old), &other_provisioner), None);
        let current = build_pv(&plan, &claim, &node(), Quantity("1Gi".into()));
        assert_eq!(identity_to_rewrite(&kept(&current), &me()), None, "already rewritten");
        let Decision::Provision(plain) = decide_in(&with_params(&[]), &claim) else { panic!("provisioned") };
        let hostpath = build_pv(&plain, &claim, &node(), Quantity("1Gi".into()));
        assert_eq!(identity_to_rewrite(&kept(&hostpath), &me()), None, "a hostPath PV keeps the plain name");
    }

    /// `CAPACITY_PROVISIONER_NAME`: a class of the second name is provisioned under that name
    /// (so kube-scheduler's capacity check and the PV's deletion follow it), and that PV, once
    /// Released, is deleted by this node; a node serving only the first name leaves it alone.
    #[test]
    fn a_class_of_the_capacity_name_gets_a_pv_of_that_name_which_this_node_deletes() {
        const CAPACITY: &str = "hostpath.example.org";
        let both = Identity { capacity_provisioner: Some(CAPACITY.into()), ..me() };
        let mut c = class("placed", "WaitForFirstConsumer");
        c.provisioner = CAPACITY.into();
        let claim = claim("placed").selected(NODE).build();
        let Decision::Provision(plan) = decide_claim(&claim, Some(&c), &both, &config(), &[]) else {
            panic!("a class of the second name is ours")
        };
        assert!(matches!(decide_claim(&claim, Some(&c), &me(), &config(), &[]), Decision::Skip(_)), "not without it");
        let mut pv = build_pv(&plan, &claim, &node(), Quantity("1Gi".into()));
        let annotations = pv.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[keys::PROVISIONED_BY], CAPACITY);
        assert_eq!(annotations[keys::PROVISIONER_IDENTITY], CAPACITY);
        pv.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        });
        pv.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Delete".into());
        let kept = crate::deciding::kept_volume::KeptVolume::from(pv);
        let pools = config().pools;
        let decide =
            |me: &Identity| crate::deciding::volume::decide_volume(&kept, me, "node-a.example.com", &pools, &[]);
        assert!(matches!(decide(&both), crate::deciding::volume::VolumeDecision::Delete(_)), "{:?}", decide(&both));
        assert!(matches!(decide(&me()), crate::deciding::volume::VolumeDecision::Ignore(_)), "{:?}", decide(&me()));
    }

    #[test]
    fn volume_type_and_node_local_sharing_refuse_what_they_cannot_do_with_the_reason() {
        let claim = claim("hpp").selected(NODE).build();
        for (params, says) in [
            (vec![("volumeType", "block")], "accepted: hostPath, local"),
            (vec![("volumeType", "local"), ("topology", "shared")], "a local PV belongs to one node"),
            (vec![("volumeType", "local"), ("topology", "everyNode")], "a local PV belongs to one node"),
            (vec![("nodeLocalSharing", "yes")], "accepted: true, false"),
            (vec![("nodeLocalSharing", "true"), ("topology", "shared")], "take ReadWriteMany already"),
        ] {
            match decide_in(&with_params(&params), &claim) {
                Decision::Refuse(refusal) => assert!(refusal.to_string().contains(says), "{params:?}: {refusal}"),
                other => panic!("{params:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn node_local_sharing_lets_pods_of_the_node_share_a_node_volume() {
        for mode in ["ReadWriteMany", "ReadOnlyMany"] {
            let claim = claim("hpp").selected(NODE).access_modes(&[mode]).build();
            match decide_in(&class("hpp", "WaitForFirstConsumer"), &claim) {
                Decision::Refuse(refusal) => {
                    let text = refusal.to_string();
                    assert!(text.contains(mode) && text.contains("nodeLocalSharing"), "{text}")
                }
                other => panic!("{mode} without sharing: {other:?}"),
            }
            let Decision::Provision(plan) = decide_in(&with_params(&[("nodeLocalSharing", "true")]), &claim) else {
                panic!("{mode} with sharing is provisioned")
            };
            let pv = build_pv(&plan, &claim, &node(), Quantity("1Gi".into()));
            let spec = pv.spec.unwrap();
            assert_eq!(spec.access_modes, Some(vec![mode.to_owned()]));
            assert!(spec.node_affinity.is_some(), "every user of the volume is on its node");
        }
    }

    #[test]
    fn the_written_path_is_accepted_for_deletion() {
        // What we write must be what we later agree to delete.
        let claim = claim("hpp").selected(NODE).build();
        let plan = plan_for(&claim);
        let pv = build_pv(&plan, &claim, &node(), Quantity("1Gi".into()));
        let path = pv.spec.unwrap().host_path.unwrap().path;
        let accepted = layout::accept_delete_path(&path, &plan.pv_name, &config().pools).unwrap();
        assert_eq!(accepted.dir_name, plan.dir_name);
    }
}

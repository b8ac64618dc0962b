//! Builders for unit tests: claims, classes and PVs as the API server would return them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, TypedLocalObjectReference, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use crate::deciding::identity::Identity;
pub use crate::deciding::kept_volume::{KeptClaimRef, KeptMap};
use crate::deciding::kept_volume::{
    KeptDirectory, KeptNodeAffinity, KeptNodeSelector, KeptNodeSelectorRequirement, KeptNodeSelectorTerm, KeptVolume,
    KeptVolumeFields, KeptVolumeSpec, KeptVolumeStatus,
};
use crate::deciding::layout::PoolPath;
use crate::deciding::settings::{DecisionConfig, ProvisionOnNodePolicy, PvCapacity};

pub const PROVISIONER: &str = "kubevirt.io/hostpath-provisioner";
pub const NODE: &str = "node-a";
pub const OTHER_NODE: &str = "node-b";
pub const UID: &str = "0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182";

pub fn me() -> Identity {
    Identity { provisioner: PROVISIONER.into(), node: NODE.into(), affinity: Vec::new(), capacity_provisioner: None }
}

pub fn config() -> DecisionConfig {
    DecisionConfig {
        use_naming_prefix: false,
        pools: vec![PoolPath::local("legacy", "/var/hpvolumes")],
        default_pool: Some("legacy".into()),
        pv_finalizer: false,
        provision_on_node: ProvisionOnNodePolicy::Allow,
        reserved_bytes: 0,
        pv_capacity: PvCapacity::Request,
        affinity_keys: Vec::new(),
        block_device_dir: None,
    }
}

pub fn class(name: &str, binding_mode: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        provisioner: PROVISIONER.into(),
        volume_binding_mode: Some(binding_mode.into()),
        reclaim_policy: Some("Delete".into()),
        ..Default::default()
    }
}

/// A claim builder.
pub struct ClaimBuilder(pub PersistentVolumeClaim);

pub fn claim(class: &str) -> ClaimBuilder {
    ClaimBuilder(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("default".into()),
            uid: Some(UID.into()),
            annotations: Some(BTreeMap::new()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some(class.into()),
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([("storage".to_owned(), Quantity("1Gi".into()))])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    })
}

impl ClaimBuilder {
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.0.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(key.into(), value.into());
        self
    }
    /// What the PV controller writes once the claim is ours to provision.
    pub fn provisioner_annotations(self) -> Self {
        self.annotation(crate::keys::STORAGE_PROVISIONER, PROVISIONER)
            .annotation(crate::keys::STORAGE_PROVISIONER_BETA, PROVISIONER)
    }
    pub fn selected(self, node: &str) -> Self {
        self.annotation(crate::keys::SELECTED_NODE, node).provisioner_annotations()
    }
    pub fn on_node(self, node: &str) -> Self {
        self.annotation(crate::keys::PROVISION_ON_NODE, node)
    }
    pub fn spec(mut self, f: impl FnOnce(&mut PersistentVolumeClaimSpec)) -> Self {
        f(self.0.spec.get_or_insert_with(Default::default));
        self
    }
    pub fn namespace(mut self, ns: &str) -> Self {
        self.0.metadata.namespace = Some(ns.into());
        self
    }
    /// `resources.requests.storage`.
    pub fn request(self, size: &str) -> Self {
        let size = size.to_owned();
        self.spec(move |s| {
            s.resources.get_or_insert_with(Default::default).requests = Some(BTreeMap::from([(
                "storage".to_owned(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(size),
            )]))
        })
    }
    pub fn access_modes(self, modes: &[&str]) -> Self {
        self.spec(|s| s.access_modes = Some(modes.iter().map(|m| (*m).to_owned()).collect()))
    }
    pub fn block(self) -> Self {
        self.spec(|s| s.volume_mode = Some("Block".into()))
    }
    pub fn selector(self) -> Self {
        self.spec(|s| s.selector = Some(LabelSelector::default()))
    }
    pub fn data_source(self) -> Self {
        self.spec(|s| {
            s.data_source = Some(TypedLocalObjectReference {
                api_group: None,
                kind: "PersistentVolumeClaim".into(),
                name: "src".into(),
            })
        })
    }
    pub fn build(self) -> PersistentVolumeClaim {
        self.0
    }
}

/// A PV builder.
pub struct PvBuilder(pub KeptVolume);

/// A PV of ours named after [`UID`], shaped as the Go build writes it (provisioned-by and identity
/// annotations, a hostPath without type, reclaim policy Delete, no labels), in `phase`, pinned to
/// no node until [`PvBuilder::owner_annotation`] or [`PvBuilder::hostname_affinity`] says so.
pub fn pv(host_path: &str, phase: &str) -> PvBuilder {
    PvBuilder(KeptVolume::from(KeptVolumeFields {
        metadata: ObjectMeta { name: Some(format!("pvc-{UID}")), ..Default::default() },
        labels: KeptMap::default(),
        annotations: KeptMap::from([
            (crate::keys::PROVISIONED_BY, PROVISIONER),
            (crate::keys::PROVISIONER_IDENTITY, PROVISIONER),
        ]),
        spec: Some(KeptVolumeSpec {
            persistent_volume_reclaim_policy: Some("Delete".into()),
            host_path: Some(KeptDirectory { path: host_path.to_owned() }),
            ..Default::default()
        }),
        status: Some(KeptVolumeStatus { phase: Some(phase.into()) }),
    }))
}

impl PvBuilder {
    /// `kubevirt.io/provisionOnNode`: the node that made it.
    pub fn owner_annotation(mut self, node: &str) -> Self {
        self.0.annotations.insert(crate::keys::PROVISION_ON_NODE, node);
        self
    }
    /// Required node affinity on `kubernetes.io/hostname`, as every PV of the Go build has.
    pub fn hostname_affinity(mut self, hostname: &str) -> Self {
        self.0.spec.get_or_insert_with(Default::default).node_affinity = Some(KeptNodeAffinity {
            required: Some(KeptNodeSelector {
                node_selector_terms: Box::new([KeptNodeSelectorTerm {
                    match_expressions: Some(Box::new([KeptNodeSelectorRequirement {
                        key: crate::keys::HOSTNAME_LABEL.into(),
                        operator: "In".into(),
                        values: Some(Box::new([hostname.into()])),
                    }])),
                }]),
            }),
        });
        self
    }
    pub fn build(self) -> KeptVolume {
        self.0
    }
}

//! Builders for the objects end-to-end tests create, so tests state only what matters to them.
//!
//! Every builder starts from the smallest valid object and ends with `build()`.
//!
//! ```no_run
//! use testbed::fixtures::{claim, pod_using_claim, storage_class};
//! let class = storage_class("e2e-wffc", "kubevirt.io/hostpath-provisioner").build();
//! let pvc = claim("ns1", "data", "e2e-wffc", "1Gi").annotation("a", "b").build();
//! let pod = pod_using_claim("ns1", "app", "data").build();
//! ```

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, Namespace, Node, NodeCondition, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, NodeSpec,
    NodeStatus, ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, Pod, PodSpec, Volume, VolumeMount, VolumeNodeAffinity,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// Label every Node carries and hostPath PVs are pinned to.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

fn meta(namespace: Option<&str>, name: &str) -> ObjectMeta {
    ObjectMeta { name: Some(name.to_string()), namespace: namespace.map(str::to_string), ..ObjectMeta::default() }
}

fn insert(map: &mut Option<BTreeMap<String, String>>, key: &str, value: &str) {
    map.get_or_insert_with(BTreeMap::new).insert(key.to_string(), value.to_string());
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect()
}

/// A namespace with nothing in it.
pub fn namespace(name: &str) -> Namespace {
    Namespace { metadata: meta(None, name), ..Namespace::default() }
}

/// A StorageClass; defaults: `WaitForFirstConsumer`, reclaim `Delete`, no parameters.
pub fn storage_class(name: &str, provisioner: &str) -> StorageClassBuilder {
    StorageClassBuilder(StorageClass {
        metadata: meta(None, name),
        provisioner: provisioner.to_string(),
        volume_binding_mode: Some("WaitForFirstConsumer".to_string()),
        reclaim_policy: Some("Delete".to_string()),
        ..StorageClass::default()
    })
}

/// See [`storage_class`].
#[derive(Clone, Debug)]
pub struct StorageClassBuilder(StorageClass);

impl StorageClassBuilder {
    /// Binding mode `Immediate` instead of `WaitForFirstConsumer`.
    pub fn immediate(mut self) -> Self {
        self.0.volume_binding_mode = Some("Immediate".to_string());
        self
    }
    /// `Delete`, `Retain` (or anything else, to test validation).
    pub fn reclaim_policy(mut self, policy: &str) -> Self {
        self.0.reclaim_policy = Some(policy.to_string());
        self
    }
    pub fn parameter(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.0.parameters, key, value);
        self
    }
    pub fn mount_option(mut self, option: &str) -> Self {
        self.0.mount_options.get_or_insert_with(Vec::new).push(option.to_string());
        self
    }
    pub fn allow_expansion(mut self) -> Self {
        self.0.allow_volume_expansion = Some(true);
        self
    }
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.0.metadata.annotations, key, value);
        self
    }
    pub fn build(self) -> StorageClass {
        self.0
    }
}

/// A Filesystem claim of `size` (e.g. `"1Gi"`) in `class`, access mode `ReadWriteOnce`.
pub fn claim(namespace: &str, name: &str, class: &str, size: &str) -> ClaimBuilder {
    ClaimBuilder(PersistentVolumeClaim {
        metadata: meta(Some(namespace), name),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            storage_class_name: Some(class.to_string()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(quantities(&[("storage", size)])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    })
}

/// See [`claim`].
#[derive(Clone, Debug)]
pub struct ClaimBuilder(PersistentVolumeClaim);

impl ClaimBuilder {
    fn spec(&mut self) -> &mut PersistentVolumeClaimSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.0.metadata.annotations, key, value);
        self
    }
    pub fn label(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.0.metadata.labels, key, value);
        self
    }
    /// Replaces the access modes (`"ReadWriteOnce"`, `"ReadWriteMany"`, ...).
    pub fn access_modes(mut self, modes: &[&str]) -> Self {
        self.spec().access_modes = Some(modes.iter().map(|m| m.to_string()).collect());
        self
    }
    /// `volumeMode: Block`.
    pub fn block(mut self) -> Self {
        self.spec().volume_mode = Some("Block".to_string());
        self
    }
    /// Class named only by the deprecated beta annotation, as old manifests do.
    pub fn class_by_beta_annotation(mut self) -> Self {
        if let Some(class) = self.spec().storage_class_name.take() {
            self = self.annotation("volume.beta.kubernetes.io/storage-class", &class);
        }
        self
    }
    /// Pins the claim to a node the way the Go build allows (`kubevirt.io/provisionOnNode`).
    pub fn provision_on_node(self, node: &str) -> Self {
        self.annotation("kubevirt.io/provisionOnNode", node)
    }
    /// A `spec.selector` with one `matchLabels` entry.
    pub fn selector(mut self, key: &str, value: &str) -> Self {
        let selector = self.spec().selector.get_or_insert_with(Default::default);
        insert(&mut selector.match_labels, key, value);
        self
    }
    pub fn volume_name(mut self, name: &str) -> Self {
        self.spec().volume_name = Some(name.to_string());
        self
    }
    /// `spec.dataSource`: `kind` `name` of API group `group` (empty for the core group).
    pub fn data_source(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.spec().data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
            api_group: (!group.is_empty()).then(|| group.to_string()),
            kind: kind.to_string(),
            name: name.to_string(),
        });
        self
    }
    /// `spec.dataSourceRef` (the API server keeps a `dataSource` only for claims and snapshots;
    /// a populator's kind goes here).
    pub fn data_source_ref(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.spec().data_source_ref = Some(k8s_openapi::api::core::v1::TypedObjectReference {
            api_group: (!group.is_empty()).then(|| group.to_string()),
            kind: kind.to_string(),
            name: name.to_string(),
            namespace: None,
        });
        self
    }
    pub fn build(self) -> PersistentVolumeClaim {
        self.0
    }
}

/// A pod mounting `claim`, never run (there is no kubelet): it only gets scheduled, which is what
/// makes the scheduler pick a node for a `WaitForFirstConsumer` claim.
pub fn pod_using_claim(namespace: &str, name: &str, claim: &str) -> PodBuilder {
    PodBuilder(Pod {
        metadata: meta(Some(namespace), name),
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".to_string(),
                // Never pulled: no kubelet runs pods here.
                image: Some("registry.invalid/testbed/never-pulled:1".to_string()),
                volume_mounts: Some(vec![VolumeMount {
                    name: "data".to_string(),
                    mount_path: "/data".to_string(),
                    ..VolumeMount::default()
                }]),
                ..Container::default()
            }],
            volumes: Some(vec![Volume {
                name: "data".to_string(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.to_string(),
                    read_only: None,
                }),
                ..Volume::default()
            }]),
            termination_grace_period_seconds: Some(0),
            ..PodSpec::default()
        }),
        ..Pod::default()
    })
}

/// See [`pod_using_claim`].
#[derive(Clone, Debug)]
pub struct PodBuilder(Pod);

impl PodBuilder {
    fn spec(&mut self) -> &mut PodSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }
    /// Restricts scheduling to nodes whose `kubernetes.io/hostname` label is `hostname`.
    pub fn on_hostname(self, hostname: &str) -> Self {
        self.node_selector(HOSTNAME_LABEL, hostname)
    }
    /// Restricts scheduling to nodes labelled `key=value`.
    pub fn node_selector(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.spec().node_selector, key, value);
        self
    }
    pub fn label(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.0.metadata.labels, key, value);
        self
    }
    pub fn build(self) -> Pod {
        self.0
    }
}

/// A Node the scheduler accepts: hostname/os/arch labels, capacity and allocatable for plenty of
/// pods, no taints, condition Ready. Status is part of the object, but whether the API server
/// keeps it on create is not something to rely on: [`crate::ControlPlane::add_node`] also writes
/// it through the status subresource.
pub fn node(name: &str, hostname: &str) -> Node {
    let mut metadata = meta(None, name);
    for (key, value) in [(HOSTNAME_LABEL, hostname), ("kubernetes.io/os", "linux"), ("kubernetes.io/arch", "amd64")] {
        insert(&mut metadata.labels, key, value);
    }
    let resources = quantities(&[("cpu", "8"), ("memory", "32Gi"), ("pods", "110"), ("ephemeral-storage", "100Gi")]);
    let now = Time(Timestamp::now());
    Node {
        metadata,
        spec: Some(NodeSpec::default()),
        status: Some(NodeStatus {
            capacity: Some(resources.clone()),
            allocatable: Some(resources),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_string(),
                status: "True".to_string(),
                reason: Some("TestbedSimulatedNode".to_string()),
                message: Some("simulated by the testbed; no kubelet runs here".to_string()),
                last_heartbeat_time: Some(now.clone()),
                last_transition_time: Some(now),
            }]),
            ..NodeStatus::default()
        }),
    }
}

/// A hostPath PV of `size`, reclaim `Delete`, mode Filesystem, access `ReadWriteOnce`.
///
/// For tests that play the provisioner's part or plant PVs a provisioner must refuse to touch.
pub fn host_path_volume(name: &str, path: &str, size: &str) -> VolumeBuilder {
    VolumeBuilder(PersistentVolume {
        metadata: meta(None, name),
        spec: Some(PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            capacity: Some(quantities(&[("storage", size)])),
            host_path: Some(k8s_openapi::api::core::v1::HostPathVolumeSource {
                path: path.to_string(),
                type_: Some("Directory".to_string()),
            }),
            persistent_volume_reclaim_policy: Some("Delete".to_string()),
            volume_mode: Some("Filesystem".to_string()),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    })
}

/// See [`host_path_volume`].
#[derive(Clone, Debug)]
pub struct VolumeBuilder(PersistentVolume);

impl VolumeBuilder {
    fn spec(&mut self) -> &mut PersistentVolumeSpec {
        self.0.spec.get_or_insert_with(Default::default)
    }
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.0.metadata.annotations, key, value);
        self
    }
    pub fn label(mut self, key: &str, value: &str) -> Self {
        insert(&mut self.0.metadata.labels, key, value);
        self
    }
    /// `pv.kubernetes.io/provisioned-by`, which the PV controller and provisioners key on.
    pub fn provisioned_by(self, provisioner: &str) -> Self {
        self.annotation("pv.kubernetes.io/provisioned-by", provisioner)
    }
    pub fn storage_class(mut self, class: &str) -> Self {
        self.spec().storage_class_name = Some(class.to_string());
        self
    }
    pub fn reclaim_policy(mut self, policy: &str) -> Self {
        self.spec().persistent_volume_reclaim_policy = Some(policy.to_string());
        self
    }
    /// Pre-binds the PV to `claim`, including its uid as a provisioner does (the claim must
    /// come from the API server, so that it has one).
    pub fn bound_to(mut self, claim: &PersistentVolumeClaim) -> Self {
        self.spec().claim_ref = Some(ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("PersistentVolumeClaim".to_string()),
            namespace: claim.metadata.namespace.clone(),
            name: claim.metadata.name.clone(),
            uid: claim.metadata.uid.clone(),
            resource_version: claim.metadata.resource_version.clone(),
            ..ObjectReference::default()
        });
        if let Some(class) = claim.spec.as_ref().and_then(|s| s.storage_class_name.clone()) {
            self.spec().storage_class_name = Some(class);
        }
        self
    }
    /// Node affinity `kubernetes.io/hostname In [hostname]`.
    pub fn on_hostname(mut self, hostname: &str) -> Self {
        self.spec().node_affinity = Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key: HOSTNAME_LABEL.to_string(),
                        operator: "In".to_string(),
                        values: Some(vec![hostname.to_string()]),
                    }]),
                    ..NodeSelectorTerm::default()
                }],
            }),
        });
        self
    }
    pub fn build(self) -> PersistentVolume {
        self.0
    }
}

/// Annotation keys of the claim/PV protocol, named once.
pub mod annotations {
    /// Written by the scheduler on a `WaitForFirstConsumer` claim.
    pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
    /// Written by the PV controller once the claim needs an external provisioner.
    pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
    /// The beta spelling of [`STORAGE_PROVISIONER`], which the Go provisioner reads.
    pub const BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
    /// Names the provisioner that made a PV.
    pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
    /// Set by the binder when it completed binding.
    pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_builder_sets_what_it_says() {
        let pvc = claim("ns", "c", "cls", "2Gi").annotation("k", "v").block().access_modes(&["ReadWriteMany"]).build();
        let spec = pvc.spec.expect("spec");
        assert_eq!(pvc.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(pvc.metadata.annotations.expect("annotations")["k"], "v");
        assert_eq!(spec.volume_mode.as_deref(), Some("Block"));
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteMany".to_string()]));
        assert_eq!(spec.resources.expect("resources").requests.expect("requests")["storage"], Quantity("2Gi".into()));
    }

    #[test]
    fn beta_class_annotation_replaces_the_spec_field() {
        let pvc = claim("ns", "c", "cls", "1Gi").class_by_beta_annotation().build();
        assert_eq!(pvc.spec.expect("spec").storage_class_name, None);
        assert_eq!(pvc.metadata.annotations.expect("annotations")["volume.beta.kubernetes.io/storage-class"], "cls");
    }

    #[test]
    fn node_is_schedulable_shape() {
        let node = node("n1", "host-1");
        let labels = node.metadata.labels.expect("labels");
        assert_eq!(labels[HOSTNAME_LABEL], "host-1");
        let status = node.status.expect("status");
        assert_eq!(status.allocatable.expect("allocatable")["pods"], Quantity("110".into()));
        assert!(node.spec.expect("spec").taints.is_none());
    }
}

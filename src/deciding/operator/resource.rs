//! The `HostPathProvisioner` resource (`hostpathprovisioner.kubevirt.io/v1beta1`, cluster-scoped)
//! as plain serde types: the fields the kubevirt operator's users already write, and the status
//! this operator reports.
//!
//! The big core sub-objects (`workload.affinity`, `workload.tolerations`, `pvcTemplate`) are kept
//! as JSON here and parsed into k8s-openapi types when rendering, strictly ([`super::embedded`]):
//! one malformed affinity or misspelt field must not make the whole resource unreadable nor
//! vanish, it must be reported in a condition on that resource. `deploy/operator/crd.yaml` is the schema; a unit test below
//! reads every example of `deploy/operator/examples/` through these types.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// API group of the resource.
pub const GROUP: &str = "hostpathprovisioner.kubevirt.io";
/// API version of the resource.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` as written in manifests.
pub const API_VERSION: &str = "hostpathprovisioner.kubevirt.io/v1beta1";
/// Kind of the resource.
pub const KIND: &str = "HostPathProvisioner";
/// Plural, the URL segment.
pub const PLURAL: &str = "hostpathprovisioners";

/// One `HostPathProvisioner`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct HostPathProvisioner {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Spec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

/// What the user asks for.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// Always, IfNotPresent or Never; unset or empty keeps the DaemonSet's own (IfNotPresent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// The legacy form: one directory, served as the pool named "legacy" (`PV_DIR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_config: Option<PathConfig>,
    /// Where the node pods run.
    #[serde(default)]
    pub workload: Workload,
    /// The operator's feature gates; none of them changes what this provisioner does.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feature_gates: Vec<String>,
    /// Named pools, each a directory on the nodes (or a claim mounted there).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_pools: Vec<StoragePool>,
    /// Our extension: how long a node's Node object is gone before the claims bound to its PVs
    /// are released, by the claim releaser Deployment (`render::claim_releaser`); unset, empty
    /// or `off`: none is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_claims_of_removed_nodes: Option<String>,
}

/// `spec.pathConfig`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PathConfig {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub use_naming_prefix: bool,
}

/// `spec.workload`: node placement of the node pods.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Workload {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// A core `Affinity`, parsed when rendering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Value>,
    /// Core `Toleration`s, parsed when rendering.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Value>,
}

/// `spec.storagePools[]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StoragePool {
    pub name: String,
    #[serde(default)]
    pub path: String,
    /// A core `PersistentVolumeClaimSpec`, parsed when rendering.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_template: Option<Value>,
    /// The CSI driver's snapshots; accepted, not acted upon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_provider: Option<String>,
    /// The CSI driver's overlay class; accepted, not acted upon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay_class_name: Option<String>,
}

/// What the operator reports.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_pool_statuses: Vec<StoragePoolStatus>,
}

/// One condition, shaped as the kubevirt operator's (OpenShift's custom-resource-status) plus
/// `observedGeneration`, so tools written for either read it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Available, Progressing, Degraded, or one of ours ([`super::status`]).
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// RFC 3339; kept while the status does not change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// RFC 3339; the last time the operator wrote this condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_time: Option<String>,
}

/// `status.storagePoolStatuses[]`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StoragePoolStatus {
    pub name: String,
    /// Preparing, Mounting or Ready.
    pub phase: String,
    #[serde(default)]
    pub desired_ready: i32,
    #[serde(default)]
    pub current_ready: i32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claim_statuses: Vec<ClaimStatus>,
}

/// `status.storagePoolStatuses[].claimStatuses[]`: a pool claim and its core status.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    pub name: String,
    pub status: Value,
}

impl k8s_openapi::Resource for HostPathProvisioner {
    const API_VERSION: &'static str = API_VERSION;
    const GROUP: &'static str = GROUP;
    const KIND: &'static str = KIND;
    const VERSION: &'static str = VERSION;
    const URL_PATH_SEGMENT: &'static str = PLURAL;
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for HostPathProvisioner {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The example resources shipped in deploy/operator/examples/, by file name.
pub const EXAMPLES: [(&str, &str); 4] = [
    ("legacy.yaml", include_str!("../../../deploy/operator/examples/legacy.yaml")),
    ("storage-pool.yaml", include_str!("../../../deploy/operator/examples/storage-pool.yaml")),
    ("pvc-template.yaml", include_str!("../../../deploy/operator/examples/pvc-template.yaml")),
    ("shared-pvc-template.yaml", include_str!("../../../deploy/operator/examples/shared-pvc-template.yaml")),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> HostPathProvisioner {
        serde_saphyr::from_str(text).expect("example parses")
    }

    #[test]
    fn every_example_reads_into_the_types() {
        for (name, text) in EXAMPLES {
            let resource = parse(text);
            assert!(
                resource.spec.path_config.is_some() || !resource.spec.storage_pools.is_empty(),
                "{name}: no pool read"
            );
            assert_eq!(resource.spec.workload.node_selector.get("kubernetes.io/os").map(String::as_str), Some("linux"));
        }
        let shared = parse(EXAMPLES[3].1);
        assert_eq!(shared.spec.feature_gates, ["Snapshotting"]);
        assert_eq!(shared.spec.storage_pools[0].snapshot_provider.as_deref(), Some("reflink"));
        assert!(shared.spec.storage_pools[0].pvc_template.is_some());
    }

    /// The CRD's schema names every field these types read, and the reverse: a field added to
    /// one and not the other fails here.
    #[test]
    fn crd_schema_and_types_name_the_same_spec_fields() {
        let crd: Value = serde_saphyr::from_str(CRD).expect("crd parses");
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
        let keys = |v: &Value| {
            let mut keys = v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
            keys.sort();
            keys
        };
        assert_eq!(
            keys(spec),
            [
                "featureGates",
                "imagePullPolicy",
                "pathConfig",
                "releaseClaimsOfRemovedNodes",
                "storagePools",
                "workload"
            ]
        );
        assert_eq!(keys(&spec["pathConfig"]["properties"]), ["path", "useNamingPrefix"]);
        assert_eq!(keys(&spec["workload"]["properties"]), ["affinity", "nodeSelector", "tolerations"]);
        assert_eq!(
            keys(&spec["storagePools"]["items"]["properties"]),
            ["name", "overlayClassName", "path", "pvcTemplate", "snapshotProvider"]
        );
        let full = StoragePool {
            name: "a".into(),
            path: "/a".into(),
            pvc_template: Some(Value::Null),
            snapshot_provider: Some(String::new()),
            overlay_class_name: Some(String::new()),
        };
        let written = serde_json::to_value(&full).expect("serialises");
        assert_eq!(keys(&written), ["name", "overlayClassName", "path", "pvcTemplate", "snapshotProvider"]);
        let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
        assert_eq!(
            keys(status),
            ["conditions", "observedVersion", "operatorVersion", "storagePoolStatuses", "targetVersion"]
        );
    }

    const CRD: &str = include_str!("../../../deploy/operator/crd.yaml");
}

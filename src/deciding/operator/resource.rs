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
pub use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
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
    // --- The node provisioner's features (the chart's `config` and `quota`) ---
    /// Settings of the node provisioner, named as the chart's `config` values.
    #[serde(default, skip_serializing_if = "NodeConfig::is_empty")]
    pub config: NodeConfig,
    /// The quota capability (`quota: enforce` classes on btrfs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<Quota>,
    /// Our extension: how long a node's Node object is gone before the claims bound to its PVs
    /// are released, by the claim releaser Deployment (`render::claim_releaser`); unset, empty
    /// or `off`: none is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_claims_of_removed_nodes: Option<String>,
}

/// `spec.config`: the node provisioner's settings, each named as the chart's `config` value it
/// matches and written into the node DaemonSet as that setting's env var
/// ([`super::render::CONFIG_FIELDS`]). Unset keeps the binary's default.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioner_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_provisioner_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_capacity: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity_keys: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pv_capacity: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_mountpoint: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pv_finalizer: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provision_on_node: Option<String>,
    /// A quantity; the chart writes it as a string, YAML users may write a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved_space: Option<IntOrString>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_accounting: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orphan_snapshot_copy_grace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reap_volumes_of_removed_nodes: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_level: Option<String>,
    /// Block volumes: also makes the node container privileged with the host's /dev mounted
    /// (`render::features::apply_block_volumes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_volumes: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_device_dir: Option<String>,
}

impl NodeConfig {
    pub fn is_empty(&self) -> bool {
        *self == NodeConfig::default()
    }
}

/// `spec.quota`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Quota {
    /// Gives the node pods CAP_SYS_ADMIN, which btrfs asks to set and destroy qgroup limits.
    #[serde(default)]
    pub enabled: bool,
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
    // --- Per-pool options of STORAGE_POOLS (the chart's pools[]) ---
    /// Free space kept unallocated in this pool instead of `spec.config.reservedSpace`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserve: Option<IntOrString>,
    /// free or requests, instead of `spec.config.capacityAccounting`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounting: Option<String>,
    /// Serve the pool only while a filesystem is mounted at its path (a pool on a claim always is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_mountpoint: Option<bool>,
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
                "config",
                "featureGates",
                "imagePullPolicy",
                "pathConfig",
                "quota",
                "releaseClaimsOfRemovedNodes",
                "storagePools",
                "workload"
            ]
        );
        assert_eq!(keys(&spec["pathConfig"]["properties"]), ["path", "useNamingPrefix"]);
        assert_eq!(keys(&spec["workload"]["properties"]), ["affinity", "nodeSelector", "tolerations"]);
        assert_eq!(keys(&spec["quota"]["properties"]), ["enabled"]);
        let pool_fields = [
            "accounting",
            "name",
            "overlayClassName",
            "path",
            "pvcTemplate",
            "requireMountpoint",
            "reserve",
            "snapshotProvider",
        ];
        assert_eq!(keys(&spec["storagePools"]["items"]["properties"]), pool_fields);
        let full = StoragePool {
            name: "a".into(),
            path: "/a".into(),
            pvc_template: Some(Value::Null),
            snapshot_provider: Some(String::new()),
            overlay_class_name: Some(String::new()),
            reserve: Some(IntOrString::String("1Gi".into())),
            accounting: Some(String::new()),
            require_mountpoint: Some(true),
        };
        let written = serde_json::to_value(&full).expect("serialises");
        assert_eq!(keys(&written), pool_fields);
        // spec.config: every field of the schema is one the types read and the reverse.
        let config: NodeConfig = serde_json::from_value(serde_json::json!({
            "provisionerName": "a", "capacityProvisionerName": "b", "publishCapacity": true, "nodeAffinityKeys": "k",
            "pvCapacity": "request",
            "dirMode": "0777", "requireMountpoint": true, "pvFinalizer": true, "provisionOnNode": "allow",
            "reservedSpace": "1Gi", "capacityAccounting": "free", "maxConcurrency": 4,
            "orphanSnapshotCopyGrace": "1h", "reapVolumesOfRemovedNodes": "24h", "logFormat": "text",
            "logLevel": "info", "blockVolumes": true, "blockDeviceDir": "/dev/hostpath-provisioner"
        }))
        .expect("config reads");
        assert_eq!(keys(&spec["config"]["properties"]), keys(&serde_json::to_value(&config).expect("serialises")));
        let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
        assert_eq!(
            keys(status),
            ["conditions", "observedVersion", "operatorVersion", "storagePoolStatuses", "targetVersion"]
        );
    }

    const CRD: &str = include_str!("../../../deploy/operator/crd.yaml");
}

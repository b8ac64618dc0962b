//! The node provisioner's features a `HostPathProvisioner` turns on besides its pools and
//! placement: `spec.config` (the chart's `config` values, each one env var of the binary),
//! per-pool options of STORAGE_POOLS, published capacity (its CSIDriver), the quota
//! capability and Block volumes' privilege. Kept apart from the rest of rendering, which is the kubevirt operator's API.

use k8s_openapi::api::core::v1::{
    Capabilities, Container, HostPathVolumeSource, PodSpec, SecurityContext, Volume, VolumeMount,
};
use serde_json::{Value, json};

use super::super::resource::{HostPathProvisioner, IntOrString, NodeConfig, StoragePool};
use super::{Desired, desired, set_env, untyped};

/// `spec.config`'s fields and the env var of the node binary each one sets, in the schema's
/// order. The chart's `config` values of the same names set the same variables.
pub const CONFIG_FIELDS: [(&str, &str); 18] = [
    ("provisionerName", "PROVISIONER_NAME"),
    ("capacityProvisionerName", "CAPACITY_PROVISIONER_NAME"),
    ("publishCapacity", "PUBLISH_CAPACITY"),
    ("nodeAffinityKeys", "NODE_AFFINITY_KEYS"),
    ("pvCapacity", "PV_CAPACITY"),
    ("dirMode", "DIR_MODE"),
    ("requireMountpoint", "REQUIRE_MOUNTPOINT"),
    ("pvFinalizer", "PV_FINALIZER"),
    ("provisionOnNode", "PROVISION_ON_NODE"),
    ("reservedSpace", "RESERVED_SPACE"),
    ("capacityAccounting", "CAPACITY_ACCOUNTING"),
    ("maxConcurrency", "MAX_CONCURRENCY"),
    ("orphanSnapshotCopyGrace", "ORPHAN_SNAPSHOT_COPY_GRACE"),
    ("reapVolumesOfRemovedNodes", "REAP_VOLUMES_OF_REMOVED_NODES"),
    ("logFormat", "LOG_FORMAT"),
    ("logLevel", "RUST_LOG"),
    ("blockVolumes", "BLOCK_VOLUMES"),
    ("blockDeviceDir", "BLOCK_DEVICE_DIR"),
];

/// The capability btrfs asks to set and destroy qgroup limits (`spec.quota.enabled`).
pub const QUOTA_CAPABILITY: &str = "SYS_ADMIN";

const CAPACITY_DRIVER: &str = include_str!("../../../deploy/components/published-capacity/csidriver.yaml");

/// The spec field that sets `env` (`spec.config.pvCapacity` for PV_CAPACITY), for messages.
pub fn field_of_env(env: &str) -> Option<String> {
    match env {
        "STORAGE_POOLS" | "PV_DIR" => Some("spec.storagePools (or spec.pathConfig)".into()),
        _ => CONFIG_FIELDS.iter().find(|(_, e)| *e == env).map(|(field, _)| format!("spec.config.{field}")),
    }
}

/// The values `config` sets, as env vars (unset fields: none).
pub fn config_env(config: &NodeConfig) -> Vec<(&'static str, String)> {
    let text = |v: &Option<String>| v.clone();
    let switch = |v: &Option<bool>| v.map(|b| b.to_string());
    let values: [Option<String>; 18] = [
        text(&config.provisioner_name),
        text(&config.capacity_provisioner_name),
        switch(&config.publish_capacity),
        text(&config.node_affinity_keys),
        text(&config.pv_capacity),
        text(&config.dir_mode),
        switch(&config.require_mountpoint),
        switch(&config.pv_finalizer),
        text(&config.provision_on_node),
        config.reserved_space.as_ref().map(quantity),
        text(&config.capacity_accounting),
        config.max_concurrency.map(|n| n.to_string()),
        text(&config.orphan_snapshot_copy_grace),
        text(&config.reap_volumes_of_removed_nodes),
        text(&config.log_format),
        text(&config.log_level),
        switch(&config.block_volumes),
        text(&config.block_device_dir),
    ];
    CONFIG_FIELDS.iter().zip(values).filter_map(|((_, env), value)| Some((*env, value?))).collect()
}

fn quantity(value: &IntOrString) -> String {
    match value {
        IntOrString::Int(n) => n.to_string(),
        IntOrString::String(s) => s.clone(),
    }
}

/// The options of a pool's STORAGE_POOLS entry (`,reserve=20Gi,accounting=requests,mountpoint`);
/// `mountpoint` also for pools the operator mounts (`mounted`).
pub fn pool_options(pool: Option<&StoragePool>, mounted: bool) -> String {
    let mut options = String::new();
    if let Some(reserve) = pool.and_then(|p| p.reserve.as_ref()) {
        options.push_str(&format!(",reserve={}", quantity(reserve)));
    }
    if let Some(accounting) = pool.and_then(|p| p.accounting.as_deref()) {
        options.push_str(&format!(",accounting={accounting}"));
    }
    if mounted || pool.and_then(|p| p.require_mountpoint) == Some(true) {
        options.push_str(",mountpoint");
    }
    options
}

/// Sets `spec.config`'s env vars and the quota capability on the node container.
pub fn apply_to_container(resource: &HostPathProvisioner, container: &mut Container) {
    for (env, value) in config_env(&resource.spec.config) {
        set_env(container, env, Some(&value));
    }
    if quota_enabled(resource) {
        let capabilities = container
            .security_context
            .get_or_insert_default()
            .capabilities
            .get_or_insert_with(Capabilities::default)
            .add
            .get_or_insert_default();
        if !capabilities.iter().any(|c| c == QUOTA_CAPABILITY) {
            capabilities.push(QUOTA_CAPABILITY.to_owned());
        }
    }
}

/// The host's /dev volume of Block volumes' node pods.
pub const HOST_DEV_VOLUME: &str = "host-dev";

pub fn block_volumes_enabled(resource: &HostPathProvisioner) -> bool {
    resource.spec.config.block_volumes == Some(true)
}

/// With `spec.config.blockVolumes`: the node container runs privileged with the host's /dev
/// mounted at /dev, as the chart's `config.blockVolumes` and the kustomize component
/// `block-volumes` make it. Attaching a loop device (/dev/loop-control) and making a device node
/// where the kubelet finds it need both. A privileged container has every capability, so the
/// file's capability list (and the quota's) go with its unprivileged context. Off: the
/// DaemonSet stays as unprivileged as deploy/legacy's.
pub fn apply_block_volumes(resource: &HostPathProvisioner, pod: &mut PodSpec, container_name: &str) {
    if !block_volumes_enabled(resource) {
        return;
    }
    let Some(container) = pod.containers.iter_mut().find(|c| c.name == container_name) else {
        return;
    };
    container.security_context = Some(SecurityContext {
        run_as_user: Some(0),
        privileged: Some(true),
        allow_privilege_escalation: Some(true),
        read_only_root_filesystem: Some(true),
        ..SecurityContext::default()
    });
    let mounts = container.volume_mounts.get_or_insert_default();
    if !mounts.iter().any(|m| m.name == HOST_DEV_VOLUME) {
        mounts.push(VolumeMount { name: HOST_DEV_VOLUME.into(), mount_path: "/dev".into(), ..VolumeMount::default() });
    }
    let volumes = pod.volumes.get_or_insert_default();
    if !volumes.iter().any(|v| v.name == HOST_DEV_VOLUME) {
        volumes.push(Volume {
            name: HOST_DEV_VOLUME.into(),
            host_path: Some(HostPathVolumeSource { path: "/dev".into(), type_: Some("Directory".into()) }),
            ..Volume::default()
        });
    }
}

pub fn quota_enabled(resource: &HostPathProvisioner) -> bool {
    resource.spec.quota.as_ref().is_some_and(|q| q.enabled)
}

/// The node pods' SCC allows the quota capability, and a privileged container for Block
/// volumes, when the resource turns them on.
pub fn apply_to_scc(resource: &HostPathProvisioner, scc: &mut Value) {
    if block_volumes_enabled(resource) {
        scc["allowPrivilegedContainer"] = json!(true);
        scc["allowPrivilegeEscalation"] = json!(true);
    }
    if !quota_enabled(resource) {
        return;
    }
    let allowed = scc["allowedCapabilities"].as_array_mut();
    match allowed {
        Some(list) if !list.iter().any(|c| c == QUOTA_CAPABILITY) => list.push(json!(QUOTA_CAPABILITY)),
        Some(_) => {}
        None => scc["allowedCapabilities"] = json!([QUOTA_CAPABILITY]),
    }
}

/// With `spec.config.publishCapacity`: the CSIDriver named like the provisioner that makes
/// kube-scheduler read the published capacity (the kustomize component's, renamed).
pub fn capacity_driver(resource: &HostPathProvisioner) -> Result<Option<Desired>, String> {
    let config = &resource.spec.config;
    if config.publish_capacity != Some(true) {
        return Ok(None);
    }
    // Named after the second name when there is one: the first may keep its '/'.
    let name = (config.capacity_provisioner_name.clone())
        .or_else(|| config.provisioner_name.clone())
        .ok_or("spec.config.publishCapacity: no capacityProvisionerName or provisionerName")?;
    let mut driver = untyped(CAPACITY_DRIVER, "csidriver.yaml")?;
    driver["metadata"]["name"] = json!(name);
    desired(resource, "csidrivers", &driver).map(Some)
}

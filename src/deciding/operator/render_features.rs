//! The node provisioner's features a `HostPathProvisioner` turns on besides its pools and
//! placement: `spec.config` (the chart's `config` values, each one env var of the binary),
//! per-pool options of STORAGE_POOLS, published capacity (its CSIDriver) and the quota
//! capability. Kept apart from the rest of rendering, which is the kubevirt operator's API.

use k8s_openapi::api::core::v1::{Capabilities, Container};
use serde_json::{Value, json};

use super::super::resource::{HostPathProvisioner, IntOrString, NodeConfig, StoragePool};
use super::{Desired, desired, set_env, untyped};

/// `spec.config`'s fields and the env var of the node binary each one sets, in the schema's
/// order. The chart's `config` values of the same names set the same variables.
pub const CONFIG_FIELDS: [(&str, &str); 16] = [
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
    let values: [Option<String>; 16] = [
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

pub fn quota_enabled(resource: &HostPathProvisioner) -> bool {
    resource.spec.quota.as_ref().is_some_and(|q| q.enabled)
}

/// The node pods' SCC allows the quota capability when the resource turns it on.
pub fn apply_to_scc(resource: &HostPathProvisioner, scc: &mut Value) {
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

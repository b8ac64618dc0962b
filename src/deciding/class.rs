//! What a StorageClass asks for: its binding mode and its parameters, read the same way on
//! every node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::deciding::layout;
use crate::deciding::quota::{self, QuotaMode};
use crate::deciding::refusal::Refusal;
use crate::deciding::settings::DecisionConfig;
use crate::deciding::topology::{self, Topology};
use crate::keys;

/// Binding mode of a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingMode {
    /// Provision as soon as the claim exists.
    Immediate,
    /// Provision on the node the scheduler picked for the first pod.
    WaitForFirstConsumer,
}

impl BindingMode {
    /// The class's mode (Immediate when unset, as the API server defaults it).
    pub fn of(class: &StorageClass) -> BindingMode {
        match class.volume_binding_mode.as_deref() {
            Some("WaitForFirstConsumer") => BindingMode::WaitForFirstConsumer,
            _ => BindingMode::Immediate,
        }
    }
}

/// The class name of a claim: the beta annotation wins over `spec.storageClassName`.
pub fn claim_class_name(claim: &PersistentVolumeClaim) -> Option<&str> {
    keys::annotation(&claim.metadata, keys::STORAGE_CLASS_BETA)
        .or_else(|| claim.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()))
        .filter(|name| !name.is_empty())
}

/// StorageClass parameters we understand. Anything else is refused so that a typo never
/// silently provisions something other than what the admin asked for. `pvDir` is the torchbox
/// provisioner's parameter, accepted when it names a configured shared pool's root.
pub const KNOWN_PARAMETERS: &[&str] =
    &["storagePool", topology::PARAMETER, "pvDir", quota::PARAMETER, VOLUME_TYPE, NODE_LOCAL_SHARING];

/// Class parameter: which kind of PV is written (`hostPath`, the default, or `local`).
pub const VOLUME_TYPE: &str = "volumeType";
/// Class parameter: `"true"` lets several pods of the volume's node share a node volume
/// (ReadWriteMany and ReadOnlyMany accepted; the PV keeps its node affinity).
pub const NODE_LOCAL_SHARING: &str = "nodeLocalSharing";

/// The kind of PV written for a volume. The directory, the node affinity and the reclaim are the
/// same; what differs is what the kubelet does with it: a `local` PV gets the pod's `fsGroup`
/// applied and its usage reported in the kubelet's volume stats, and file-system backup tools
/// that skip hostPath volumes back it up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VolumeType {
    /// `spec.hostPath` (the Go build's PVs).
    #[default]
    HostPath,
    /// `spec.local`, bound to its node by the node affinity.
    Local,
}

impl VolumeType {
    /// Accepted parameter values.
    pub const ALL: [VolumeType; 2] = [VolumeType::HostPath, VolumeType::Local];

    /// The parameter value.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeType::HostPath => "hostPath",
            VolumeType::Local => "local",
        }
    }

    fn parse(value: &str) -> Option<VolumeType> {
        Self::ALL.into_iter().find(|t| t.as_str() == value)
    }
}

/// What a class asks for, once its parameters are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassRequest {
    /// The shape.
    pub topology: Topology,
    /// The pool name (`storagePool`, the pool whose root `pvDir` names, or the default).
    pub pool: Option<String>,
    /// The `quota` parameter.
    pub quota: QuotaMode,
    /// The `volumeType` parameter.
    pub volume_type: VolumeType,
    /// The `nodeLocalSharing` parameter.
    pub node_local_sharing: bool,
}

impl ClassRequest {
    /// Access modes a volume of this class can honour: the shape's, and for a node volume shared
    /// by the pods of its node, the many-pod modes too (every user is on that node).
    pub fn access_modes(&self) -> &'static [&'static str] {
        match self.topology {
            Topology::Node if self.node_local_sharing => {
                &["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany", "ReadOnlyMany"]
            }
            topology => topology.access_modes(),
        }
    }
}

/// Reads a class's parameters: unknown keys and values are refusals. Needs no pool of this node
/// except to resolve `pvDir` and the default pool, so every node reads a class the same way.
pub fn class_request(class: &StorageClass, class_name: &str, config: &DecisionConfig) -> Result<ClassRequest, Refusal> {
    let empty = BTreeMap::new();
    let params = class.parameters.as_ref().unwrap_or(&empty);
    if let Some(key) = params.keys().find(|k| !KNOWN_PARAMETERS.contains(&k.as_str())) {
        return Err(Refusal::UnknownParameter {
            class: class_name.to_owned(),
            key: key.clone(),
            known: KNOWN_PARAMETERS.join(", "),
        });
    }
    let bad = |key: &str, value: &str, accepted: String| Refusal::BadParameter {
        class: class_name.to_owned(),
        key: key.to_owned(),
        value: value.to_owned(),
        accepted,
    };
    let mut topology = match params.get(topology::PARAMETER) {
        None => None,
        Some(value) => Some(
            Topology::parse(value)
                .ok_or_else(|| bad(topology::PARAMETER, value, Topology::ALL.map(Topology::as_str).join(", ")))?,
        ),
    };
    let quota = QuotaMode::parse(params.get(quota::PARAMETER).map(String::as_str))
        .map_err(|value| bad(quota::PARAMETER, &value, "none, enforce".to_owned()))?;
    let mut pool = params.get("storagePool").cloned();
    if let Some(pv_dir) = params.get("pvDir") {
        // The torchbox provisioner's class: its directory must be one of our shared pools.
        let shared = config
            .pools
            .iter()
            .find(|p| p.shared && layout::normalise(pv_dir).is_ok_and(|dir| dir == p.root))
            .ok_or_else(|| {
                let roots: Vec<String> =
                    config.pools.iter().filter(|p| p.shared).map(|p| p.root.display().to_string()).collect();
                let roots = if roots.is_empty() { "none on this node".to_owned() } else { roots.join(", ") };
                bad("pvDir", pv_dir, format!("the root of a configured shared pool ({roots})"))
            })?;
        if pool.as_ref().is_some_and(|p| *p != shared.name) {
            return Err(bad("pvDir", pv_dir, "the root of the pool storagePool names, or no storagePool".to_owned()));
        }
        pool = Some(shared.name.clone());
        topology = Some(topology.unwrap_or(Topology::Shared));
    }
    let topology = topology.unwrap_or(Topology::Node);
    let volume_type = match params.get(VOLUME_TYPE) {
        None => VolumeType::HostPath,
        Some(value) => VolumeType::parse(value)
            .ok_or_else(|| bad(VOLUME_TYPE, value, VolumeType::ALL.map(VolumeType::as_str).join(", ")))?,
    };
    if volume_type == VolumeType::Local && topology != Topology::Node {
        let accepted = format!(
            "hostPath for topology {topology} (a local PV belongs to one node; a {topology} volume is reached from every node)"
        );
        return Err(bad(VOLUME_TYPE, volume_type.as_str(), accepted));
    }
    let node_local_sharing = match params.get(NODE_LOCAL_SHARING).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(value) => return Err(bad(NODE_LOCAL_SHARING, value, "true, false".to_owned())),
    };
    if node_local_sharing && topology != Topology::Node {
        let accepted = format!("false for topology {topology}, whose volumes take ReadWriteMany already");
        return Err(bad(NODE_LOCAL_SHARING, "true", accepted));
    }
    Ok(ClassRequest {
        topology,
        pool: pool.or_else(|| config.default_pool.clone()),
        quota,
        volume_type,
        node_local_sharing,
    })
}

/// The class's topology when its parameters parse (the reconciler asks for the live nodes only
/// when a class needs them).
pub fn class_topology(class: &StorageClass, config: &DecisionConfig) -> Option<Topology> {
    class_request(class, "", config).ok().map(|r| r.topology)
}

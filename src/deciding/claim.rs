//! Which node provisions a claim (DESIGN.md section 4), as pure functions.
//!
//! Two stages: [`claim_interest`] looks only at metadata (what every node receives for every
//! claim in the cluster), and [`decide_claim`] looks at the full claim and its class for the few
//! claims that pass.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::deciding::capacity::parse_bytes;
use crate::deciding::layout;
use crate::keys;

/// Who we are: the provisioner name and this pod's node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Provisioner name (StorageClass `provisioner`).
    pub provisioner: String,
    /// Node object name (`NODE_NAME`).
    pub node: String,
}

/// Who may use `kubevirt.io/provisionOnNode` (any user who can create a claim could otherwise
/// place data on any node, control-plane nodes included).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ProvisionOnNodePolicy {
    /// Anyone (the Go build's behaviour).
    #[default]
    Allow,
    /// Nobody: the annotation is refused with an event.
    Deny,
    /// Only claims in these namespaces.
    Namespaces(Vec<String>),
}

impl ProvisionOnNodePolicy {
    fn allows(&self, namespace: &str) -> bool {
        match self {
            Self::Allow => true,
            Self::Deny => false,
            Self::Namespaces(list) => list.iter().any(|n| n == namespace),
        }
    }
}

/// What the metadata says about a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Interest {
    /// Not ours to act on (silently).
    Ignore,
    /// Possibly ours: read the full claim and its class.
    Candidate,
}

fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

/// The storage-provisioner annotation the PV controller writes (GA key first, then beta).
fn storage_provisioner(meta: &ObjectMeta) -> Option<&str> {
    annotation(meta, keys::STORAGE_PROVISIONER).or_else(|| annotation(meta, keys::STORAGE_PROVISIONER_BETA))
}

/// Stage 1, from metadata alone. Errs on the side of `Candidate`: stage 2 decides.
pub fn claim_interest(meta: &ObjectMeta, me: &Identity) -> Interest {
    if meta.deletion_timestamp.is_some() || annotation(meta, keys::BIND_COMPLETED).is_some() {
        return Interest::Ignore;
    }
    if let Some(node) = annotation(meta, keys::PROVISION_ON_NODE) {
        // provisionOnNode wins over selected-node under any binding mode (as in the Go build).
        return if node == me.node { Interest::Candidate } else { Interest::Ignore };
    }
    match storage_provisioner(meta) {
        Some(p) if p == me.provisioner => match annotation(meta, keys::SELECTED_NODE) {
            Some(node) if node != me.node => Interest::Ignore,
            // Ours on this node, or an Immediate claim that needs the one explanatory event.
            _ => Interest::Candidate,
        },
        _ => Interest::Ignore,
    }
}

/// Binding mode of a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingMode {
    /// Provision as soon as the claim exists.
    Immediate,
    /// Provision on the node the scheduler picked for the first pod.
    WaitForFirstConsumer,
}

/// The class name of a claim: the beta annotation wins over `spec.storageClassName`.
pub fn claim_class_name(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, keys::STORAGE_CLASS_BETA)
        .or_else(|| claim.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()))
        .filter(|name| !name.is_empty())
}

/// StorageClass parameters we understand. Anything else is refused so that a typo never
/// silently provisions something other than what the admin asked for.
pub const KNOWN_PARAMETERS: &[&str] = &["storagePool"];

/// Settings that shape decisions.
#[derive(Clone, Debug)]
pub struct DecisionConfig {
    /// `USE_NAMING_PREFIX`.
    pub use_naming_prefix: bool,
    /// Pools by name; the first is the default.
    pub pools: Vec<layout::PoolPath>,
    /// Who may use `kubevirt.io/provisionOnNode`.
    pub provision_on_node: ProvisionOnNodePolicy,
}

/// Everything needed to create the directory and the PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvisionPlan {
    /// `pvc-<uid>`.
    pub pv_name: String,
    /// Directory name under the pool root.
    pub dir_name: String,
    /// Pool to provision in.
    pub pool: layout::PoolPath,
    /// Class name to record on the PV.
    pub class_name: String,
    /// Reclaim policy from the class (`Delete` when unset).
    pub reclaim_policy: String,
    /// The claim's access modes.
    pub access_modes: Vec<String>,
    /// The claim's storage request, verbatim.
    pub request: String,
    /// The request in bytes.
    pub request_bytes: u64,
    /// How the node was chosen (so the reconciler knows whether it may hand the claim back).
    pub binding_mode: BindingMode,
    /// True when placed by `kubevirt.io/provisionOnNode` (the scheduler cannot pick another node).
    pub pinned_by_annotation: bool,
}

/// Why a claim is skipped silently.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// `spec.volumeName` is set.
    AlreadyBound,
    /// Claim is being deleted.
    Deleting,
    /// No class named.
    NoClass,
    /// The named class does not exist (yet); look again later.
    ClassNotFound(String),
    /// The class belongs to another provisioner.
    OtherProvisioner,
    /// Another node provisions it.
    OtherNode,
    /// Waiting for the PV controller / scheduler to annotate the claim.
    NotYetSelected,
}

/// Why a claim meant for us is refused (a `ProvisioningFailed` event, no retry until it changes).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Raw block volumes are out of scope.
    #[error("{0} does not support block volume provisioning")]
    Block(String),
    /// Label selectors only make sense for pre-existing volumes.
    #[error(
        "claims with spec.selector are not supported: a dynamically provisioned volume cannot match a selector; remove the selector"
    )]
    Selector,
    /// Cloning and restoring are not supported yet.
    #[error(
        "claims with a dataSource or dataSourceRef (clone or snapshot restore) are not supported; remove it to get an empty volume"
    )]
    DataSource,
    /// A mode a node-local directory cannot honour.
    #[error("access mode {0} is not supported by node-local volumes (supported: ReadWriteOnce, ReadWriteOncePod)")]
    AccessMode(String),
    /// No access mode at all.
    #[error("the claim has no access modes")]
    NoAccessModes,
    /// Unknown or invalid StorageClass parameter.
    #[error("StorageClass {class} has unknown parameter {key:?}; known parameters: {known}")]
    UnknownParameter {
        /// Class name.
        class: String,
        /// Offending key.
        key: String,
        /// Known keys, for the message.
        known: String,
    },
    /// `storagePool` names a pool this node does not have.
    #[error("StorageClass {class} asks for storage pool {pool:?}, which is not configured (configured: {configured})")]
    UnknownPool {
        /// Class name.
        class: String,
        /// Requested pool.
        pool: String,
        /// Configured pools.
        configured: String,
    },
    /// Missing or unreadable storage request.
    #[error("the claim's storage request is missing or invalid: {0}")]
    BadRequest(String),
    /// Name or UID that cannot form a directory name.
    #[error("{0}")]
    BadName(#[from] layout::NameError),
    /// The kubelet refuses to mount a hostPath PV that carries mount options, so pods using it
    /// would never start: refused up front instead.
    #[error(
        "StorageClass {0} sets mountOptions, which hostPath volumes cannot use (the kubelet refuses to mount them); remove mountOptions from the class"
    )]
    MountOptions(String),
    /// `kubevirt.io/provisionOnNode` is not allowed for this namespace.
    #[error(
        "annotation kubevirt.io/provisionOnNode is not allowed in namespace {0} on this cluster; use a WaitForFirstConsumer StorageClass instead"
    )]
    ProvisionOnNodeNotAllowed(String),
}

/// The outcome of stage 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do.
    Skip(SkipReason),
    /// An Immediate claim without `kubevirt.io/provisionOnNode`: nobody can provision it; emit
    /// the single explanatory Warning (from whichever node gets there first).
    ExplainImmediate,
    /// Ours, but unsupported.
    Refuse(Refusal),
    /// Ours: provision it.
    Provision(Box<ProvisionPlan>),
}

/// Stage 2: decides from the full claim and its class (None when the class does not exist).
pub fn decide_claim(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    me: &Identity,
    config: &DecisionConfig,
) -> Decision {
    let meta = &claim.metadata;
    let spec = claim.spec.clone().unwrap_or_default();
    // Either sign of binding means done; stage 1 treats them the same way, and the two stages
    // must agree (a fuzz target checks it).
    if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) || annotation(meta, keys::BIND_COMPLETED).is_some() {
        return Decision::Skip(SkipReason::AlreadyBound);
    }
    if meta.deletion_timestamp.is_some() {
        return Decision::Skip(SkipReason::Deleting);
    }
    let Some(class_name) = claim_class_name(claim) else {
        return Decision::Skip(SkipReason::NoClass);
    };
    let Some(class) = class else {
        return Decision::Skip(SkipReason::ClassNotFound(class_name.to_owned()));
    };
    if class.provisioner != me.provisioner {
        return Decision::Skip(SkipReason::OtherProvisioner);
    }
    let binding_mode = match class.volume_binding_mode.as_deref() {
        Some("WaitForFirstConsumer") => BindingMode::WaitForFirstConsumer,
        _ => BindingMode::Immediate,
    };

    let pinned_by_annotation = match annotation(meta, keys::PROVISION_ON_NODE) {
        Some(node) if node == me.node => true,
        Some(_) => return Decision::Skip(SkipReason::OtherNode),
        None => false,
    };
    if !pinned_by_annotation {
        if storage_provisioner(meta) != Some(me.provisioner.as_str()) {
            return Decision::Skip(SkipReason::NotYetSelected);
        }
        match binding_mode {
            BindingMode::Immediate => return Decision::ExplainImmediate,
            BindingMode::WaitForFirstConsumer => match annotation(meta, keys::SELECTED_NODE) {
                Some(node) if node == me.node => {}
                Some(_) => return Decision::Skip(SkipReason::OtherNode),
                None => return Decision::Skip(SkipReason::NotYetSelected),
            },
        }
    }

    let namespace = meta.namespace.clone().unwrap_or_default();
    if pinned_by_annotation && !config.provision_on_node.allows(&namespace) {
        return Decision::Refuse(Refusal::ProvisionOnNodeNotAllowed(namespace));
    }
    match plan(claim, &spec, class, class_name, me, config, binding_mode, pinned_by_annotation) {
        Ok(plan) => Decision::Provision(Box::new(plan)),
        Err(refusal) => Decision::Refuse(refusal),
    }
}

#[allow(clippy::too_many_arguments)]
fn plan(
    claim: &PersistentVolumeClaim,
    spec: &k8s_openapi::api::core::v1::PersistentVolumeClaimSpec,
    class: &StorageClass,
    class_name: &str,
    me: &Identity,
    config: &DecisionConfig,
    binding_mode: BindingMode,
    pinned_by_annotation: bool,
) -> Result<ProvisionPlan, Refusal> {
    if spec.volume_mode.as_deref() == Some("Block") {
        return Err(Refusal::Block(me.provisioner.clone()));
    }
    if spec.selector.is_some() {
        return Err(Refusal::Selector);
    }
    if spec.data_source.is_some() || spec.data_source_ref.is_some() {
        return Err(Refusal::DataSource);
    }
    let access_modes = spec.access_modes.clone().unwrap_or_default();
    if access_modes.is_empty() {
        return Err(Refusal::NoAccessModes);
    }
    if let Some(mode) = access_modes.iter().find(|m| !matches!(m.as_str(), "ReadWriteOnce" | "ReadWriteOncePod")) {
        return Err(Refusal::AccessMode(mode.clone()));
    }
    if class.mount_options.as_ref().is_some_and(|o| !o.is_empty()) {
        return Err(Refusal::MountOptions(class_name.to_owned()));
    }
    let pool = choose_pool(class, class_name, config)?;
    let request = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .ok_or_else(|| Refusal::BadRequest("no resources.requests.storage".into()))?;
    let request_bytes = parse_bytes(&request).map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let dir_name = layout::dir_name(name, uid, config.use_naming_prefix)?;
    Ok(ProvisionPlan {
        pv_name: layout::pv_name(uid),
        dir_name,
        pool,
        class_name: class_name.to_owned(),
        reclaim_policy: class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
        access_modes,
        request,
        request_bytes,
        binding_mode,
        pinned_by_annotation,
    })
}

fn choose_pool(class: &StorageClass, class_name: &str, config: &DecisionConfig) -> Result<layout::PoolPath, Refusal> {
    let empty = BTreeMap::new();
    let params = class.parameters.as_ref().unwrap_or(&empty);
    if let Some(key) = params.keys().find(|k| !KNOWN_PARAMETERS.contains(&k.as_str())) {
        return Err(Refusal::UnknownParameter {
            class: class_name.to_owned(),
            key: key.clone(),
            known: KNOWN_PARAMETERS.join(", "),
        });
    }
    let configured = || config.pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
    match params.get("storagePool") {
        None => config.pools.first().cloned().ok_or_else(|| Refusal::UnknownPool {
            class: class_name.to_owned(),
            pool: String::new(),
            configured: configured(),
        }),
        Some(wanted) => config.pools.iter().find(|p| &p.name == wanted).cloned().ok_or_else(|| Refusal::UnknownPool {
            class: class_name.to_owned(),
            pool: wanted.clone(),
            configured: configured(),
        }),
    }
}

#[cfg(test)]
mod tests;

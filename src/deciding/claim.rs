//! Which node provisions a claim (docs/architecture.md, which node acts), as pure functions.
//!
//! Two stages: [`claim_interest`] looks only at metadata (what every node receives for every
//! claim in the cluster), and [`decide_claim`] looks at the full claim and its class for the few
//! claims that pass.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::deciding::capacity::parse_bytes;
use crate::deciding::class::{BindingMode, ClassRequest, claim_class_name, class_request};
use crate::deciding::identity::Identity;
use crate::deciding::layout;
use crate::deciding::quota::QuotaMode;
use crate::deciding::refusal::Refusal;
use crate::deciding::settings::DecisionConfig;
use crate::deciding::topology::{self, Acting, LiveNode, Topology};
use crate::keys;
use crate::keys::annotation;

/// What the metadata says about a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Interest {
    /// Not ours to act on (silently).
    Ignore,
    /// Possibly ours: read the full claim and its class.
    Candidate,
    /// Placed on another node (by `kubevirt.io/provisionOnNode`, or by the scheduler for our
    /// provisioner): that node's to provision. Read only to notice a node with no running
    /// provisioner, where the claim would otherwise wait without a word.
    Elsewhere(String),
}

/// The storage-provisioner annotation the PV controller writes (GA key first, then beta).
fn storage_provisioner(meta: &ObjectMeta) -> Option<&str> {
    annotation(meta, keys::STORAGE_PROVISIONER).or_else(|| annotation(meta, keys::STORAGE_PROVISIONER_BETA))
}

/// Whether the PV controller has handed the claim to a provisioner (it writes the annotation
/// only after finding no existing PV to bind).
pub fn annotated_for_provisioning(meta: &ObjectMeta) -> bool {
    storage_provisioner(meta).is_some()
}

/// Stage 1, from metadata alone. Errs on the side of `Candidate`: stage 2 decides.
pub fn claim_interest(meta: &ObjectMeta, me: &Identity) -> Interest {
    if meta.deletion_timestamp.is_some() || annotation(meta, keys::BIND_COMPLETED).is_some() {
        return Interest::Ignore;
    }
    if let Some(node) = annotation(meta, keys::PROVISION_ON_NODE) {
        // provisionOnNode wins over selected-node under any binding mode (as in the Go build).
        return if node == me.node { Interest::Candidate } else { Interest::Elsewhere(node.to_owned()) };
    }
    let ours = storage_provisioner(meta).is_some_and(|p| me.serves(p));
    match annotation(meta, keys::SELECTED_NODE) {
        // The scheduler placed it here: stage 2 reads the class rather than waiting for the PV
        // controller to copy its provisioner onto the claim (docs/architecture.md, which node acts).
        Some(node) if node == me.node => Interest::Candidate,
        Some(node) if ours => Interest::Elsewhere(node.to_owned()),
        // An Immediate claim of ours: provisioned here, or it needs the one explanatory event.
        None if ours => Interest::Candidate,
        _ => Interest::Ignore,
    }
}

/// Everything needed to create the directory and the PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvisionPlan {
    /// `pvc-<uid>`.
    pub pv_name: String,
    /// Directory name under the pool root.
    pub dir_name: String,
    /// The class's `pathPattern`, when it named the directory (`deciding::path_pattern`): the
    /// directory carries the provisioner's marker, and may be one made for an earlier claim.
    pub path_pattern: Option<String>,
    /// The label the volume is pinned to (the class's `nodeAffinityKey` and this node's value),
    /// instead of this node's name.
    pub affinity: Option<crate::deciding::node_affinity::AffinityLabel>,
    /// Pool to provision in.
    pub pool: layout::PoolPath,
    /// Class name to record on the PV.
    pub class_name: String,
    /// The class's `provisioner`, one of the names this process serves: the PV's
    /// `provisioned-by`, so that the volume stays with that name.
    pub provisioner: String,
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
    /// The volume's shape.
    pub topology: Topology,
    /// The PV gets the deletion-protection finalizer.
    pub protect: bool,
    /// True when placed by `kubevirt.io/provisionOnNode` (the scheduler cannot pick another node).
    pub pinned_by_annotation: bool,
    /// The source claim's name when the claim is a clone (`deciding::clone`).
    pub clone_of: Option<String>,
    /// The class's `quota` parameter.
    pub quota: QuotaMode,
    /// The kind of PV to write (the class's `volumeType`).
    pub volume_type: crate::deciding::class::VolumeType,
    /// Owner, group and mode of the new directory (the class's `uid`, `gid`, `mode`).
    pub ownership: crate::deciding::class::Ownership,
    /// A `volumeMode: Block` claim accepted (`deciding::block::claim`): a backing file on a
    /// loop device instead of a directory for the pod.
    pub block: Option<crate::deciding::block::claim::BlockRequest>,
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
    /// A shared or every-node volume that another live node provisions; look again when its
    /// lease would have expired.
    ActedOnBy {
        /// The acting node.
        node: String,
        /// When to look again.
        recheck_after: std::time::Duration,
    },
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
    /// Placed here by the scheduler, but this node cannot serve it (say, it lacks the pool):
    /// give the claim back to the scheduler with the reason.
    HandBack(Refusal),
    /// Ours: provision it.
    Provision(Box<ProvisionPlan>),
}

/// Stage 2: decides from the full claim and its class (None when the class does not exist).
/// `live` are the nodes whose provisioner is alive, this one included when it serves a pool;
/// only shared and every-node classes under Immediate binding read it.
pub fn decide_claim(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    me: &Identity,
    config: &DecisionConfig,
    live: &[LiveNode],
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
    if !me.serves(&class.provisioner) {
        return Decision::Skip(SkipReason::OtherProvisioner);
    }
    let binding_mode = BindingMode::of(class);
    let request = class_request(class, class_name, config);
    let uid = meta.uid.as_deref().unwrap_or_default();

    let pinned_by_annotation = match annotation(meta, keys::PROVISION_ON_NODE) {
        Some(node) if node == me.node => true,
        Some(_) => return Decision::Skip(SkipReason::OtherNode),
        None => false,
    };
    if !pinned_by_annotation {
        match binding_mode {
            // The PV controller marks an Immediate claim of ours once it gave up binding it to an
            // existing PV; only then is it ours to provision.
            BindingMode::Immediate if !storage_provisioner(meta).is_some_and(|p| me.serves(p)) => {
                return Decision::Skip(SkipReason::NotYetSelected);
            }
            BindingMode::Immediate => match &request {
                Ok(ClassRequest { topology: Topology::Node, .. }) => return Decision::ExplainImmediate,
                // No node is named: the live nodes serving the pool agree on one (see topology).
                Ok(ClassRequest { pool: Some(pool), .. }) => {
                    let Some(key) = pool_key_anywhere(pool, config, live) else {
                        return speak_for_cluster(uid, me, live, || Refusal::NoNodeServesPool {
                            pool: pool.clone(),
                            root: String::from("(no live node has it)"),
                        });
                    };
                    match topology::acting_node(uid, &key, &me.node, live) {
                        Acting::Me => {}
                        Acting::Other { node, recheck_after } => {
                            return Decision::Skip(SkipReason::ActedOnBy { node, recheck_after });
                        }
                        Acting::Nobody => {
                            return speak_for_cluster(uid, me, live, || Refusal::NoNodeServesPool {
                                pool: key.name.clone(),
                                root: key.root.clone(),
                            });
                        }
                    }
                }
                // A class without a resolvable pool or with bad parameters: one node explains.
                Ok(ClassRequest { pool: None, .. }) | Err(_) => {
                    if topology::spokesman(uid, &me.node, live) != Acting::Me && !live.is_empty() {
                        return Decision::Skip(SkipReason::OtherNode);
                    }
                }
            },
            // The scheduler writes selected-node only after finding no existing PV to bind, so
            // the claim is ours at once; the PV controller's storage-provisioner annotation, which
            // follows seconds later under load, adds no safety (docs/architecture.md, which node acts).
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
    let request = match request {
        Ok(request) => request,
        Err(refusal) => return Decision::Refuse(refusal),
    };
    let placed_by_scheduler = binding_mode == BindingMode::WaitForFirstConsumer && !pinned_by_annotation;
    let pool = match choose_pool(&request, class_name, me, config) {
        Ok(pool) => pool,
        // The scheduler does not know our pools: let it try another node.
        Err(refusal @ Refusal::UnknownPool { .. }) if placed_by_scheduler => return Decision::HandBack(refusal),
        Err(refusal) => return Decision::Refuse(refusal),
    };
    match plan(claim, &spec, class_name, me, config, &request, pool, class, binding_mode, pinned_by_annotation) {
        Ok(plan) => Decision::Provision(Box::new(plan)),
        // Another node may carry the label: let the scheduler try one.
        Err(refusal @ Refusal::NoAffinityLabel { .. }) if placed_by_scheduler => Decision::HandBack(refusal),
        Err(refusal) => Decision::Refuse(refusal),
    }
}

/// The directory a claim's volume gets under its pool root: from the class's `pathPattern`, or
/// `pvc-<uid>` (`<claim>-pvc-<uid>` with the naming prefix).
pub fn claim_dir_name(
    claim: &PersistentVolumeClaim,
    request: &ClassRequest,
    config: &DecisionConfig,
) -> Result<String, layout::NameError> {
    let meta = &claim.metadata;
    let uid = meta.uid.as_deref().unwrap_or_default();
    let name = meta.name.as_deref().unwrap_or_default();
    match &request.path_pattern {
        Some(pattern) => pattern.resolve(meta.namespace.as_deref().unwrap_or_default(), name, uid),
        None => layout::dir_name(name, uid, config.use_naming_prefix),
    }
}

/// This node's label for a class's `nodeAffinityKey`: refused when the node does not serve the
/// key (`NODE_AFFINITY_KEYS`) or does not carry the label.
fn affinity_label(
    key: &str,
    class_name: &str,
    me: &Identity,
    config: &DecisionConfig,
) -> Result<crate::deciding::node_affinity::AffinityLabel, Refusal> {
    if !config.affinity_keys.iter().any(|k| k == key) {
        return Err(Refusal::AffinityKeyNotServed {
            class: class_name.to_owned(),
            key: key.to_owned(),
            node: me.node.clone(),
        });
    }
    me.affinity
        .iter()
        .find(|label| label.key == key)
        .cloned()
        .ok_or_else(|| Refusal::NoAffinityLabel { key: key.to_owned(), node: me.node.clone() })
}

/// One node speaks for the cluster about a claim nobody can serve; the others stay silent.
fn speak_for_cluster(uid: &str, me: &Identity, live: &[LiveNode], refusal: impl FnOnce() -> Refusal) -> Decision {
    match topology::spokesman(uid, &me.node, live) {
        Acting::Me | Acting::Nobody => Decision::Refuse(refusal()),
        Acting::Other { .. } => Decision::Skip(SkipReason::OtherNode),
    }
}

/// The pool `name` as the cluster serves it: this node's when it has one of that name, else the
/// one some live node advertises (for choosing the actor, never for a path).
fn pool_key_anywhere(name: &str, config: &DecisionConfig, live: &[LiveNode]) -> Option<topology::PoolKey> {
    if let Some(pool) = config.pools.iter().find(|p| p.name == name) {
        return Some(pool.key());
    }
    let mut keys: Vec<_> = live.iter().flat_map(|n| n.pools.iter()).filter(|k| k.name == name).collect();
    keys.sort();
    keys.first().map(|k| (*k).clone())
}

#[allow(clippy::too_many_arguments)]
fn plan(
    claim: &PersistentVolumeClaim,
    spec: &k8s_openapi::api::core::v1::PersistentVolumeClaimSpec,
    class_name: &str,
    me: &Identity,
    config: &DecisionConfig,
    request: &ClassRequest,
    pool: layout::PoolPath,
    class: &StorageClass,
    binding_mode: BindingMode,
    pinned_by_annotation: bool,
) -> Result<ProvisionPlan, Refusal> {
    let block = if spec.volume_mode.as_deref() == Some("Block") {
        let allocation = class
            .parameters
            .as_ref()
            .and_then(|p| p.get(crate::deciding::block::ALLOCATION_PARAMETER))
            .map(String::as_str);
        let request = crate::deciding::block::claim::accept_block_claim(
            config.block_device_dir.is_some(),
            class_name,
            request,
            allocation,
        )
        .map_err(|refusal| Refusal::Block { provisioner: class.provisioner.clone(), refusal })?;
        Some(request)
    } else {
        None
    };
    if spec.selector.is_some() {
        return Err(Refusal::Selector);
    }
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let clone_of = crate::deciding::clone::requested_source(spec, namespace)?;
    let access_modes = spec.access_modes.clone().unwrap_or_default();
    if access_modes.is_empty() {
        return Err(Refusal::NoAccessModes);
    }
    let supported = request.access_modes();
    if let Some(mode) = access_modes.iter().find(|m| !supported.contains(&m.as_str())) {
        let many = mode == "ReadWriteMany" || mode == "ReadOnlyMany";
        let hint = if many && request.topology == Topology::Node {
            "; to let several pods of the volume's node share it, set nodeLocalSharing: \"true\" on the class"
        } else {
            ""
        };
        return Err(Refusal::AccessMode {
            mode: mode.clone(),
            topology: request.topology,
            supported: supported.join(", "),
            hint,
        });
    }
    if class.mount_options.as_ref().is_some_and(|o| !o.is_empty()) {
        return Err(Refusal::MountOptions(class_name.to_owned()));
    }
    let storage = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .map(|q| q.0.clone())
        .ok_or_else(|| Refusal::BadRequest("no resources.requests.storage".into()))?;
    let request_bytes = parse_bytes(&storage).map_err(|e| Refusal::BadRequest(e.to_string()))?;
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    let dir_name = claim_dir_name(claim, request, config)?;
    let affinity = match &request.node_affinity_key {
        None => None,
        Some(key) => Some(affinity_label(key, class_name, me, config)?),
    };
    Ok(ProvisionPlan {
        pv_name: layout::pv_name(uid),
        dir_name,
        path_pattern: request.path_pattern.as_ref().map(|p| p.as_str().to_owned()),
        affinity,
        pool,
        class_name: class_name.to_owned(),
        provisioner: class.provisioner.clone(),
        reclaim_policy: class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
        access_modes,
        request: storage,
        request_bytes,
        binding_mode,
        topology: request.topology,
        // Every-node PVs already wait for each node's copy through their own finalizers.
        protect: config.pv_finalizer && request.topology != Topology::EveryNode,
        pinned_by_annotation,
        clone_of,
        quota: request.quota,
        volume_type: request.volume_type,
        ownership: request.ownership,
        block,
    })
}

/// This node's pool for the request, checked against the topology.
fn choose_pool(
    request: &ClassRequest,
    class_name: &str,
    me: &Identity,
    config: &DecisionConfig,
) -> Result<layout::PoolPath, Refusal> {
    let configured = || config.pools.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", ");
    let Some(wanted) = &request.pool else {
        return Err(Refusal::NoDefaultPool {
            class: class_name.to_owned(),
            node: me.node.clone(),
            configured: configured(),
        });
    };
    let pool = config.pools.iter().find(|p| &p.name == wanted).cloned().ok_or_else(|| Refusal::UnknownPool {
        class: class_name.to_owned(),
        pool: wanted.clone(),
        node: me.node.clone(),
        configured: configured(),
    })?;
    if pool.shared != request.topology.needs_shared_pool() {
        let (kind, hint) = if pool.shared {
            ("a shared pool", "use topology: shared, or a node-local pool")
        } else {
            ("a node-local pool", "topology shared needs a pool declared with --pool NAME=PATH,shared")
        };
        return Err(Refusal::TopologyPoolMismatch {
            class: class_name.to_owned(),
            topology: request.topology,
            pool: pool.name.clone(),
            kind,
            hint,
        });
    }
    let roots = crate::deciding::pool_roots::roots_of(&config.pools, wanted);
    if roots.len() > 1 && request.topology != Topology::Node {
        return Err(Refusal::SeveralRoots {
            class: class_name.to_owned(),
            topology: request.topology,
            pool: pool.name.clone(),
            node: me.node.clone(),
            roots: roots.iter().map(|p| p.root.display().to_string()).collect::<Vec<_>>().join(", "),
        });
    }
    Ok(pool)
}

#[cfg(test)]
mod tests;

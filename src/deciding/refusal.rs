//! Why a claim meant for this provisioner is refused: each refusal is the note of the claim's
//! `ProvisioningFailed` event, so it says what to change.

use crate::deciding::block::{ALLOCATION_PARAMETER, SETTING};
use crate::deciding::layout;
use crate::deciding::topology::Topology;

/// Why a claim meant for us is refused (a `ProvisioningFailed` event, no retry until it changes).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A `volumeMode: Block` claim this install or class cannot serve (`deciding::block::claim`).
    /// The message starts as the Go build's did, for whoever matches on it, then says why.
    #[error("{provisioner} does not support block volume provisioning here: {refusal}")]
    Block {
        /// The class's provisioner.
        provisioner: String,
        /// Why.
        refusal: BlockClaimRefusal,
    },
    /// Label selectors only make sense for pre-existing volumes.
    #[error(
        "claims with spec.selector are not supported: a dynamically provisioned volume cannot match a selector; remove the selector"
    )]
    Selector,
    /// A data source other than a claim of the same namespace (see `deciding::clone`).
    #[error("{0}")]
    DataSource(#[from] CloneRefusal),
    /// A mode the volume's shape cannot honour.
    #[error("access mode {mode} is not supported by topology {topology} (supported: {supported}){hint}")]
    AccessMode {
        /// The refused mode.
        mode: String,
        /// The class's topology.
        topology: Topology,
        /// Modes it supports, for the message.
        supported: String,
        /// What would make it supported, if anything.
        hint: &'static str,
    },
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
    /// A parameter with a value outside its accepted set.
    #[error("StorageClass {class} has {key}={value:?}; accepted: {accepted}")]
    BadParameter {
        /// Class name.
        class: String,
        /// Offending key.
        key: String,
        /// Its value.
        value: String,
        /// What is accepted.
        accepted: String,
    },
    /// The class names no pool and this node has several, none of them `legacy`.
    #[error("StorageClass {class} names no storagePool and node {node} has several ({configured}); set storagePool")]
    NoDefaultPool {
        /// Class name.
        class: String,
        /// This node.
        node: String,
        /// Configured pools.
        configured: String,
    },
    /// The topology needs a shared pool and the pool is local, or the other way round.
    #[error("StorageClass {class} asks for topology {topology} on pool {pool}, which is {kind}; {hint}")]
    TopologyPoolMismatch {
        /// Class name.
        class: String,
        /// Requested topology.
        topology: Topology,
        /// Pool name.
        pool: String,
        /// "a shared pool" or "a node-local pool".
        kind: &'static str,
        /// What to change.
        hint: &'static str,
    },
    /// An every-node class on a pool of several roots: its volume is one path on every node,
    /// and which root each node would choose cannot be agreed.
    #[error(
        "StorageClass {class} asks for topology {topology}, whose volume has the same path on every node, but pool {pool} has several roots on node {node} ({roots}); a pool of several roots serves topology node only: give this class a pool of one root"
    )]
    SeveralRoots {
        /// Class name.
        class: String,
        /// Requested topology.
        topology: Topology,
        /// Pool name.
        pool: String,
        /// This node.
        node: String,
        /// The pool's roots on this node.
        roots: String,
    },
    /// No live node serves the pool of a shared or every-node class.
    #[error(
        "no node with a running provisioner serves pool {pool} at {root}; configure the pool (--pool {pool}={root}) on the nodes that should serve it"
    )]
    NoNodeServesPool {
        /// Pool name.
        pool: String,
        /// Its root.
        root: String,
    },
    /// `storagePool` names a pool this node does not have.
    #[error(
        "StorageClass {class} asks for storage pool {pool:?}, which node {node} does not have (configured: {configured})"
    )]
    UnknownPool {
        /// Class name.
        class: String,
        /// Requested pool.
        pool: String,
        /// This node.
        node: String,
        /// Configured pools.
        configured: String,
    },
    /// Missing or unreadable storage request.
    #[error("the claim's storage request is missing or invalid: {0}")]
    BadRequest(String),
    /// Name or UID that cannot form a directory name.
    #[error("{0}")]
    BadName(#[from] layout::NameError),
    /// The class's `nodeAffinityKey` is not one this node serves.
    #[error(
        "StorageClass {class} pins its volumes to node label {key}, which node {node} does not serve; add {key} to the provisioner's NODE_AFFINITY_KEYS (every node's)"
    )]
    AffinityKeyNotServed {
        /// Class name.
        class: String,
        /// The key.
        key: String,
        /// This node.
        node: String,
    },
    /// This node does not carry the label the class pins volumes to.
    #[error(
        "node {node} has no label {key}, which the StorageClass pins its volumes to (nodeAffinityKey); label the node (kubectl label node {node} {key}=<value>) and restart its provisioner pod, or run the pod on a labelled node"
    )]
    NoAffinityLabel {
        /// The key.
        key: String,
        /// This node.
        node: String,
    },
    /// The class's `pathPattern` names a directory the claim cannot be given (yet).
    #[error("{0}")]
    DirectoryOccupied(#[from] crate::deciding::path_pattern::Occupied),
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

/// Why a Block claim is refused (a `ProvisioningFailed` event saying what to change).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BlockClaimRefusal {
    /// The install did not opt in.
    #[error(
        "Block volumes are off on this install: the provisioner needs the host's /dev and loop devices for them; turn them on with {SETTING} (Helm: config.blockVolumes; kustomize: the component block-volumes; the operator: spec.config.blockVolumes), or use volumeMode Filesystem"
    )]
    Disabled,
    /// Not a node volume: the loop device exists on one node only.
    #[error(
        "a Block volume is a loop device of one node; StorageClass {class} has topology {topology}, use topology node"
    )]
    Topology {
        /// The class.
        class: String,
        /// Its topology.
        topology: Topology,
    },
    /// A quota class: the backing file's size already is the volume's limit.
    #[error(
        "StorageClass {0} sets quota=enforce; a Block volume's size is its backing file's and needs no quota: use a class without quota"
    )]
    Quota(String),
    /// A `pathPattern` class: a Block volume's directory is named after its claim UID only.
    #[error(
        "StorageClass {0} sets pathPattern; Block volumes are named after their claim UID only: use a class without pathPattern"
    )]
    PathPattern(String),
    /// An `allocation` value outside its set.
    #[error("StorageClass {class} has {ALLOCATION_PARAMETER}={value:?}; accepted: {accepted}")]
    Allocation {
        /// The class.
        class: String,
        /// Its value.
        value: String,
        /// What is accepted.
        accepted: &'static str,
    },
}

impl Refusal {
    /// A short stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Block { .. } => "block",
            Self::Selector => "selector",
            Self::DataSource(refusal) => refusal.label(),
            Self::AccessMode { .. } | Self::NoAccessModes => "access_mode",
            Self::UnknownParameter { .. }
            | Self::BadParameter { .. }
            | Self::NoDefaultPool { .. }
            | Self::TopologyPoolMismatch { .. }
            | Self::SeveralRoots { .. } => "parameters",
            Self::UnknownPool { .. } => "unknown_pool",
            Self::NoNodeServesPool { .. } => "no_node_serves_pool",
            Self::BadRequest(_) => "request",
            Self::BadName(_) => "name",
            Self::DirectoryOccupied(_) => "directory_occupied",
            Self::AffinityKeyNotServed { .. } => "parameters",
            Self::NoAffinityLabel { .. } => "no_affinity_label",
            Self::ProvisionOnNodeNotAllowed(_) => "provision_on_node_denied",
            Self::MountOptions(_) => "mount_options",
        }
    }
}

/// Why a claim's data source cannot be filled (the note of the claim's `ProvisioningFailed` event).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CloneRefusal {
    /// A CSI snapshot (`snapshot.storage.k8s.io`): hostPath volumes have none.
    #[error(
        "dataSource {kind} {name:?} cannot be restored: this provisioner's volumes have no CSI snapshots; name a HostPathSnapshot (apiGroup hostpath-provisioner.kubevirt.io) in dataSourceRef, or a PersistentVolumeClaim of the same namespace to clone"
    )]
    Snapshot {
        /// The kind named.
        kind: String,
        /// The object named.
        name: String,
    },
    /// A volume populator (any other kind, or a claim of another API group).
    #[error(
        "dataSource {kind} {name:?} (apiGroup {group:?}) needs a volume populator, which this provisioner does not run; only a PersistentVolumeClaim in the same namespace can be cloned"
    )]
    Populator {
        /// The kind named.
        kind: String,
        /// Its API group.
        group: String,
        /// The object named.
        name: String,
    },
    /// `dataSourceRef.namespace` names another namespace.
    #[error(
        "dataSourceRef names claim {name:?} in namespace {namespace:?}: cross-namespace clones are not supported; clone a claim of namespace {own:?}"
    )]
    OtherNamespace {
        /// The source's namespace.
        namespace: String,
        /// The source claim.
        name: String,
        /// The clone's namespace.
        own: String,
    },
    /// `dataSource` and `dataSourceRef` disagree (the API server normally keeps them equal).
    #[error("dataSource and dataSourceRef name different objects; name one source")]
    Ambiguous,
    /// The source claim uses another class.
    #[error(
        "source claim {source_claim:?} uses StorageClass {source_class:?} but the clone asks for {class:?}; a clone must use the class of its source"
    )]
    OtherClass {
        /// The source claim.
        source_claim: String,
        /// Its class.
        source_class: String,
        /// The clone's class.
        class: String,
    },
    /// The source is bound to a PV this provisioner did not make.
    #[error(
        "source claim {source_claim:?} is bound to PV {pv:?}, which provisioner {provisioner} did not provision; only volumes of this provisioner can be cloned"
    )]
    NotOurs {
        /// The source claim.
        source_claim: String,
        /// Its PV.
        pv: String,
        /// Our provisioner name.
        provisioner: String,
    },
    /// The source volume's directory is not one this node can copy from the clone's pool.
    #[error(
        "source volume {pv:?} at {path:?} is not a volume directory of pool {pool} (the clone's pool): {why}; a clone is made in the pool of its source"
    )]
    OtherPool {
        /// The source PV.
        pv: String,
        /// Its hostPath.
        path: String,
        /// The clone's pool.
        pool: String,
        /// What the path check said.
        why: String,
    },
    /// The request is smaller than the source.
    #[error(
        "the clone requests {requested} but source claim {source_claim:?} requests {source_request}; request at least {source_request}"
    )]
    Smaller {
        /// The clone's request.
        requested: String,
        /// The source claim.
        source_claim: String,
        /// The source's request.
        source_request: String,
    },
    /// Every-node volumes have one copy per node, none of which is "the" source.
    #[error("source claim {0:?} is an everyNode volume (one copy per node); cloning it is not supported")]
    EveryNode(String),
    /// The source's volume mode is not the clone's: a Block volume's data is one device image
    /// (its backing file), a Filesystem volume's a tree of files; neither becomes the other.
    #[error(
        "source claim {source_claim:?} is a volumeMode {source_mode} volume and this claim asks for volumeMode {mode}: a clone keeps its source's volume mode (a Block volume is one device image, a Filesystem volume a tree of files); use volumeMode {source_mode}"
    )]
    VolumeMode {
        /// The source claim.
        source_claim: String,
        /// The source's mode.
        source_mode: &'static str,
        /// The clone's mode.
        mode: &'static str,
    },
    /// Pinned by `kubevirt.io/provisionOnNode` to another node than the source's.
    #[error(
        "the clone is pinned to node {pinned} (kubevirt.io/provisionOnNode) but its source volume lives on node {source_node}; a clone is made on its source's node: set the annotation to {source_node} or remove it"
    )]
    PinnedElsewhere {
        /// The annotation's node.
        pinned: String,
        /// The source's node.
        source_node: String,
    },
    /// A `quota: enforce` clone of a source that is a plain directory (made before the class
    /// enforced quota, or by the Go build): the copy could not be given a limit.
    #[error(
        "source claim {0:?} is a plain directory, not a quota volume (made before its class enforced quota, or by the Go provisioner), so its copy cannot be limited to the clone's request; clone it with a class without quota: enforce, or copy the data into a new quota volume yourself"
    )]
    SourceWithoutQuota(String),
    /// A restore from a `HostPathSnapshot` that cannot be made as asked (the reason says what
    /// to change).
    #[error("{0}")]
    Restore(String),
}

impl CloneRefusal {
    /// A short stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::Snapshot { .. } | Self::Populator { .. } | Self::OtherNamespace { .. } | Self::Ambiguous => {
                "data_source"
            }
            Self::Smaller { .. } => "clone_smaller",
            Self::OtherClass { .. }
            | Self::NotOurs { .. }
            | Self::OtherPool { .. }
            | Self::EveryNode(_)
            | Self::VolumeMode { .. }
            | Self::PinnedElsewhere { .. }
            | Self::SourceWithoutQuota(_) => "clone_source",
            Self::Restore(_) => "restore_source",
        }
    }
}

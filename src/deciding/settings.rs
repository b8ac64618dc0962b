//! The settings that shape claim decisions, as plain data taken from the configuration.

use crate::deciding::layout;

/// What the PV advertises as its capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PvCapacity {
    /// The claim's request (honest, default).
    Request,
    /// The whole filesystem rounded like the Go build, for tooling that depends on it.
    Filesystem,
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
    /// Whether claims of `namespace` may use the annotation.
    pub fn allows(&self, namespace: &str) -> bool {
        match self {
            Self::Allow => true,
            Self::Deny => false,
            Self::Namespaces(list) => list.iter().any(|n| n == namespace),
        }
    }
}

/// Settings that shape decisions.
#[derive(Clone, Debug)]
pub struct DecisionConfig {
    /// `USE_NAMING_PREFIX`.
    pub use_naming_prefix: bool,
    /// This node's pools.
    pub pools: Vec<layout::PoolPath>,
    /// The pool of a class that names none.
    pub default_pool: Option<String>,
    /// `--pv-finalizer`: node and shared PVs get the deletion-protection finalizer.
    pub pv_finalizer: bool,
    /// Who may use `kubevirt.io/provisionOnNode`.
    pub provision_on_node: ProvisionOnNodePolicy,
    /// Bytes kept free in each pool that sets no reserve of its own.
    pub reserved_bytes: u64,
    /// What a new PV advertises as its capacity.
    pub pv_capacity: PvCapacity,
    /// `NODE_AFFINITY_KEYS`: the node label keys a class's `nodeAffinityKey` may name.
    pub affinity_keys: Vec<String>,
    /// `BLOCK_VOLUMES`: when on, the directory of Block volumes' device nodes
    /// (`BLOCK_DEVICE_DIR`); `None` refuses Block claims.
    pub block_device_dir: Option<std::path::PathBuf>,
}

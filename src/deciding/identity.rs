//! Who this process is: the provisioner name it serves and the node it runs on.

/// Who we are: the provisioner name and this pod's node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Provisioner name (StorageClass `provisioner`).
    pub provisioner: String,
    /// Node object name (`NODE_NAME`).
    pub node: String,
    /// The labels of this node that volumes can be pinned to (`NODE_AFFINITY_KEYS` and the
    /// Node's values, read at start; `deciding::node_affinity`).
    pub affinity: Vec<crate::deciding::node_affinity::AffinityLabel>,
}

//! Who this process is: the provisioner name it serves and the node it runs on.

/// Who we are: the provisioner name and this pod's node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Provisioner name (StorageClass `provisioner`).
    pub provisioner: String,
    /// Node object name (`NODE_NAME`).
    pub node: String,
}

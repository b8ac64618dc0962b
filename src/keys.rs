//! Annotation and label keys shared with Kubernetes and with the Go build (DESIGN.md section 1).

/// PV annotation naming the provisioner that made it (set by the sig-storage controller in Go).
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// PV annotation the Go build checks on delete; its value is the provisioner name.
pub const PROVISIONER_IDENTITY: &str = "hostPathProvisionerIdentity";
/// Claim annotation pinning a claim to a node; PV annotation naming the owning node.
pub const PROVISION_ON_NODE: &str = "kubevirt.io/provisionOnNode";
/// Set by the scheduler under WaitForFirstConsumer.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Set by the PV controller to the class's provisioner (GA key).
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Beta key of the same, the only one the Go build reads.
pub const STORAGE_PROVISIONER_BETA: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Beta storage-class annotation, which wins over `spec.storageClassName` (as in the Go build).
pub const STORAGE_CLASS_BETA: &str = "volume.beta.kubernetes.io/storage-class";
/// Set by the PV controller once a claim is bound.
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// Node label whose value goes into the PV's node affinity.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Our label on PVs naming the owning node, so each node can watch only its own volumes.
pub const NODE_LABEL: &str = "hostpath-provisioner.kubevirt.io/node";

//! Annotation and label keys shared with Kubernetes and with the Go build (docs/architecture.md, compatibility contract).

/// PV annotation naming the provisioner that made it (set by the sig-storage controller in Go).
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// PV annotation the Go build checks on delete; its value is the provisioner name (on a local
/// PV, the provisioner name and [`LOCAL_IDENTITY_SUFFIX`], which the Go build leaves alone).
pub const PROVISIONER_IDENTITY: &str = "hostPathProvisionerIdentity";
/// Added to the provisioner name in a local PV's `hostPathProvisionerIdentity`. The Go build
/// compares that annotation with its provisioner name before it reads `spec.hostPath` to delete
/// a released volume, with no check that there is one: a local PV with the plain name would
/// crash it at each start after a rollback. Another name and it logs "volume deletion ignored"
/// and leaves the PV, and its data, to this build.
pub const LOCAL_IDENTITY_SUFFIX: &str = "/local";
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
/// PV annotation the kubelet reads: a gid added to the supplemental groups of every pod that
/// uses the volume.
pub const VOLUME_GID: &str = "pv.beta.kubernetes.io/gid";
/// Node label whose value goes into the PV's node affinity.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// Our label on PVs naming the owning node, so each node can watch only its own volumes.
pub const NODE_LABEL: &str = "hostpath-provisioner.kubevirt.io/node";

/// Our label on PVs of the `shared` and `everyNode` topologies (they have no owning node, so no
/// node label, and every node watches them through the watch of PVs without a node label).
pub const TOPOLOGY_LABEL: &str = "hostpath-provisioner.kubevirt.io/topology";
/// The deletion-protection finalizer of the Kubernetes external provisioner (the
/// HonorPVReclaimPolicy feature): with `--pv-finalizer`, a PV deleted by hand stays until its
/// data was removed (Delete policy) or let go (Retain).
pub const PROTECTION_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// Prefix of the per-node finalizers of `everyNode` PVs: `<prefix>/<node label value>` says that
/// node may hold a copy, so the PV outlives every copy.
pub const COPY_FINALIZER_PREFIX: &str = "copies.hostpath-provisioner.kubevirt.io";
/// Label on the liveness Leases, with a hash of the provisioner name (several provisioners may
/// share a namespace).
pub const LEASE_PROVISIONER_LABEL: &str = "hostpath-provisioner.kubevirt.io/provisioner";
/// Lease annotation listing the pools a node can use now: `name=root` entries, comma-separated.
pub const LEASE_POOLS: &str = "hostpath-provisioner.kubevirt.io/pools";

/// Annotation on our CSIStorageCapacity objects naming the pool whose free space they publish.
pub const PUBLISHED_POOL: &str = "hostpath-provisioner.kubevirt.io/pool";

/// Claim annotations the metadata stage of the claim decision reads.
const CLAIM_KEYS: [&str; 6] = [
    PROVISION_ON_NODE,
    SELECTED_NODE,
    STORAGE_PROVISIONER,
    STORAGE_PROVISIONER_BETA,
    BIND_COMPLETED,
    STORAGE_CLASS_BETA,
];

/// A claim a node keeps in memory keeps only this of its metadata (name, namespace, uid, resource
/// version, deletion timestamp, the annotations above and our cloning protection finalizer, which the
/// source claim's reconcile removes once no clone waits): a `kubectl apply`-ed claim alone carries
/// its whole manifest in an annotation, and managedFields are often half of an object.
pub fn trim_claim_metadata(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
    meta.managed_fields = None;
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = meta
        .finalizers
        .take()
        .map(|f| f.into_iter().filter(|f| f == CLONE_PROTECTION_FINALIZER).collect::<Vec<_>>())
        .filter(|f| !f.is_empty());
    meta.creation_timestamp = None;
    meta.generate_name = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|key, _| CLAIM_KEYS.contains(&key.as_str()));
    }
}

/// Finalizer on a clone's source claim while it is being copied, so that it cannot go away
/// mid-copy (the name the CSI external-provisioner uses for the same purpose).
pub const CLONE_PROTECTION_FINALIZER: &str = "provisioner.storage.kubernetes.io/cloning-protection";

/// PV annotation written when a volume staged for deletion is kept because its PV stays: the
/// write gives the PV a new resourceVersion, so that no node lets the PV go on what it saw
/// before the volume was put back (`deciding::deletion`).
pub const VOLUME_KEPT_AT: &str = "hostpath-provisioner.kubevirt.io/volume-kept-at";

/// PV annotation: the class's `pathPattern` named the volume's directory (the value is the
/// pattern). Such a directory is deleted, resized or copied only when its marker names the PV
/// (`deciding::path_pattern`).
pub const PATH_PATTERN: &str = "hostpath-provisioner.kubevirt.io/path-pattern";

/// The value of annotation `key`, if the object has it.
pub fn annotation<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    meta.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trimming_keeps_everything_the_metadata_decision_reads() {
        use crate::deciding::claim::{Interest, claim_interest};
        use crate::test_fixtures::*;
        let full = claim("hpp")
            .selected(NODE)
            .annotation("kubectl.kubernetes.io/last-applied-configuration", &"x".repeat(4096))
            .build();
        let mut meta = full.metadata.clone();
        trim_claim_metadata(&mut meta);
        assert_eq!(claim_interest(&meta, &me()), claim_interest(&full.metadata, &me()));
        assert_eq!(claim_interest(&meta, &me()), Interest::Candidate);
        let kept = meta.annotations.unwrap();
        assert!(!kept.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
        assert_eq!(kept.len(), 3, "selected-node and both storage-provisioner keys");
        assert_eq!(meta.uid, full.metadata.uid);
    }

    #[test]
    fn trimming_keeps_the_clone_protection_finalizer_only() {
        let mut meta = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            finalizers: Some(vec!["kubernetes.io/pvc-protection".into(), CLONE_PROTECTION_FINALIZER.into()]),
            ..Default::default()
        };
        trim_claim_metadata(&mut meta);
        assert_eq!(meta.finalizers, Some(vec![CLONE_PROTECTION_FINALIZER.to_owned()]));
        meta.finalizers = Some(vec!["kubernetes.io/pvc-protection".into()]);
        trim_claim_metadata(&mut meta);
        assert_eq!(meta.finalizers, None);
    }
}

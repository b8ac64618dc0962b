//! Pools on a claim (`pvcTemplate`), the decisions: which nodes the placement selects, which
//! claims a pool needs (one per selected node, or one shared by all for a ReadWriteMany
//! template, named as the kubevirt operator names them), and when a pool's claim and mount may
//! go: never while a PersistentVolume of ours or a snapshot's copy lives in it on that node (the
//! hold-back rule).
//! The objects themselves ([`PoolObjects`]) are planned per reconcile by [`super::pool_plan`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Node, NodeSelectorRequirement, PersistentVolumeClaimSpec, Toleration};
use sha2::{Digest, Sha256};

pub use super::render::{MOUNTER_SCC, MOUNTER_SERVICE_ACCOUNT};
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout;
use crate::deciding::snapshot::HostPathSnapshot;
use crate::deciding::volume::{owner_node, volume_path};
use crate::keys;

/// The claim of `pool` for `node` (None: the shared claim), named exactly as the kubevirt
/// operator names it, so that a cluster coming from it finds its claims adopted rather than
/// doubled: `hpp-pool-<pool>-<node>` or `hpp-pool-<pool>-shared`; a name over 63 characters
/// becomes `hpp-pool-` and the FNV-1a hash of the whole name (its `getResourceNameWithMaxLength`
/// with base `hpp-pool`, which always drops the whole suffix at that length). A claim of ours
/// made under another name by an earlier release keeps its name ([`super::pool_plan`]).
pub fn claim_name(pool: &str, node: Option<&str>) -> String {
    let full = match node {
        Some(node) => format!("hpp-pool-{pool}-{node}"),
        None => format!("hpp-pool-{pool}-shared"),
    };
    if full.len() <= KUBEVIRT_MAX_NAME {
        return full;
    }
    format!("hpp-pool-{:08x}", fnv1a_32(full.as_bytes()))
}

/// The kubevirt operator keeps its pool objects' names within a DNS label.
const KUBEVIRT_MAX_NAME: usize = 63;

/// 32-bit FNV-1a, the hash the kubevirt operator shortens names with (Go's `hash/fnv`
/// `New32a`). Eight lines, so no crate: the `fnv` crate offers the 64-bit variant only.
fn fnv1a_32(bytes: &[u8]) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    bytes.iter().fold(OFFSET_BASIS, |hash, byte| (hash ^ u32::from(*byte)).wrapping_mul(PRIME))
}

/// Whether a template gives one claim shared by every node (ReadWriteMany).
pub fn is_shared(template: &PersistentVolumeClaimSpec) -> bool {
    template.access_modes.iter().flatten().any(|m| m == "ReadWriteMany")
}

/// The claims a pool on a claim needs: (claim name, node it serves; None for the shared one).
pub fn pool_claims(
    pool: &str,
    template: &PersistentVolumeClaimSpec,
    nodes: &[String],
) -> Vec<(String, Option<String>)> {
    if is_shared(template) {
        return vec![(claim_name(pool, None), None)];
    }
    nodes.iter().map(|node| (claim_name(pool, Some(node)), Some(node.clone()))).collect()
}

/// The nodes the workload placement selects, by name: the node selector's labels, the required
/// node affinity, and the taints (NoSchedule and NoExecute ones must be tolerated, by the
/// resource's tolerations or the DaemonSet's own). The DaemonSet controller decides the same
/// way; the operator needs it to know which nodes get a claim.
pub fn selected_nodes(
    nodes: &[Node],
    node_selector: &BTreeMap<String, String>,
    affinity: Option<&Affinity>,
    tolerations: &[Toleration],
) -> Vec<String> {
    let required = affinity
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    nodes
        .iter()
        .filter(|node| {
            let labels = node.metadata.labels.clone().unwrap_or_default();
            let name = node.metadata.name.clone().unwrap_or_default();
            let selected = node_selector.iter().all(|(k, v)| labels.get(k) == Some(v));
            // Terms are ORed, the requirements of a term ANDed; no term selects nothing.
            let affine = required.is_none_or(|r| {
                r.node_selector_terms.iter().any(|term| {
                    let expressions =
                        term.match_expressions.iter().flatten().all(|e| requirement_holds(e, labels.get(&e.key)));
                    let fields = term.match_fields.iter().flatten().all(|e| {
                        let value = (e.key == "metadata.name").then_some(&name);
                        requirement_holds(e, value)
                    });
                    (term.match_expressions.is_some() || term.match_fields.is_some()) && expressions && fields
                })
            });
            let tolerated = node.spec.iter().flat_map(|s| s.taints.iter().flatten()).all(|taint| {
                taint.effect == "PreferNoSchedule"
                    || tolerations.iter().any(|t| {
                        let key = t.key.as_deref().unwrap_or("");
                        let exists = t.operator.as_deref() == Some("Exists");
                        let key_matches = key.is_empty() && exists || key == taint.key;
                        let value_matches =
                            exists || t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("");
                        let effect_matches = t.effect.as_deref().is_none_or(|e| e.is_empty() || e == taint.effect);
                        key_matches && value_matches && effect_matches
                    })
            });
            selected && affine && tolerated
        })
        .filter_map(|node| node.metadata.name.clone())
        .collect()
}

fn requirement_holds(requirement: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((value.and_then(|v| number(v)), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// Whether a pool's claim and mount on a node may go (the pool was removed or moved, the node
/// left the placement, or the resource is being deleted).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Release {
    /// No PV of ours and no snapshot copy lives there: the claim and the mounter may be removed.
    Release,
    /// These PVs and snapshot copies live there: keep the claim, the mount and the data; the
    /// status names them.
    HoldBack(Vec<String>),
}

/// The hold-back rule for the pool at `pool_path` on `node` (None: a shared claim, which every
/// node's volumes hold). A PV of ours (`provisioner` wrote it) lives there when its directory is
/// inside the pool path and, for a per-node claim, it belongs to that node. Any phase counts: a
/// Released PV's data is still there until its deletion is done. A snapshot copy lives there
/// when its pool root is the pool path or inside it (a kubevirt claim's `<path>/csi`) on that
/// node; one whose root is not known holds every pool of its node. Holders are named PVs first,
/// then snapshots, each sorted.
pub fn may_release(
    pool_path: &str,
    node: Option<&str>,
    pvs: &[KeptVolume],
    snapshots: &[SnapshotCopy],
    provisioner: &str,
) -> Release {
    let Ok(root) = layout::normalise(pool_path) else { return Release::HoldBack(Vec::new()) };
    // A holder whose node cannot be read holds every node: better a claim kept than data lost.
    let on_this_node = |holder: Option<&str>| match node {
        None => true,
        Some(node) => holder.is_none_or(|owner| owner == node),
    };
    let mut holding: Vec<String> = pvs
        .iter()
        .filter(|pv| pv.annotations.get(keys::PROVISIONED_BY) == Some(provisioner))
        .filter(|pv| {
            volume_path(pv).and_then(|p| layout::normalise(p).ok()).is_some_and(|p| p.starts_with(&root) && p != root)
        })
        .filter(|pv| on_this_node(owner_node(pv)))
        .filter_map(|pv| pv.metadata.name.clone())
        .collect();
    holding.sort();
    let mut copies: Vec<String> = snapshots
        .iter()
        .filter(|copy| on_this_node(Some(&copy.node)))
        .filter(|copy| match &copy.pool_root {
            None => true,
            Some(copy_root) => layout::normalise(copy_root).is_ok_and(|p| p.starts_with(&root)),
        })
        .map(|copy| format!("HostPathSnapshot {}", copy.name))
        .collect();
    copies.sort();
    holding.extend(copies);
    if holding.is_empty() { Release::Release } else { Release::HoldBack(holding) }
}

/// A snapshot's copy as the hold-back rule reads it: the node holding it and, where the node
/// wrote it, the root of the pool it is in (`status.poolRoot`). Status only: a tenant who may
/// edit snapshots cannot write their status (docs/snapshots.md), so cannot move a copy's hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotCopy {
    /// `namespace/name`.
    pub name: String,
    pub node: String,
    pub pool_root: Option<String>,
}

impl SnapshotCopy {
    /// The copy `snapshot` may have on a node: none until a node has named itself in the status
    /// (it does so before it starts copying, so a copy cut short is held too).
    pub fn of(snapshot: &HostPathSnapshot) -> Option<SnapshotCopy> {
        let status = snapshot.status.as_ref()?;
        Some(SnapshotCopy {
            name: format!(
                "{}/{}",
                snapshot.metadata.namespace.as_deref().unwrap_or_default(),
                snapshot.metadata.name.as_deref().unwrap_or_default()
            ),
            node: status.node.clone().filter(|n| !n.is_empty())?,
            pool_root: status.pool_root.clone().filter(|r| !r.is_empty()),
        })
    }
}

/// The kubevirt CSI driver's name: its PVs (`spec.csi`) carry the pool in their attributes.
pub const KUBEVIRT_CSI_DRIVER: &str = "kubevirt.io.hostpath-provisioner";

/// A PV of the kubevirt CSI driver: its data lives in that driver's directory of a pool, which
/// on a claim the kubevirt operator made is in that claim. Taken over, such a claim must never
/// go while these PVs exist: this provisioner cannot see where on the claim they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CsiVolume {
    pub name: String,
    /// The pool of the class that made it (its `storagePool` parameter, copied into the
    /// volume's attributes).
    pub pool: String,
}

impl CsiVolume {
    /// The CSI volume of the kubevirt driver `pv` is, if it is one with a pool.
    pub fn of(pv: &k8s_openapi::api::core::v1::PersistentVolume) -> Option<CsiVolume> {
        let csi = pv.spec.as_ref()?.csi.as_ref()?;
        (csi.driver == KUBEVIRT_CSI_DRIVER).then_some(())?;
        let pool = csi.volume_attributes.as_ref()?.get("storagePool")?.clone();
        Some(CsiVolume { name: pv.metadata.name.clone()?, pool })
    }
}

#[cfg(test)]
#[path = "pool_claims_tests.rs"]
mod tests;

/// Label on a pool's claims and mounters: the pool's name.
pub const POOL_LABEL: &str = "hostpathprovisioner.kubevirt.io/pool";
/// Annotation on a pool's claims and mounters: the node it serves (absent on a shared claim);
/// an annotation, as a node name may be longer than a label value.
pub const NODE_ANNOTATION: &str = "hostpathprovisioner.kubevirt.io/node";
/// Annotation on a pool's claims and mounters: the pool path, for the hold-back rule after the
/// pool was removed from the resource or moved.
pub const PATH_ANNOTATION: &str = "hostpathprovisioner.kubevirt.io/pool-path";
/// Annotation on a pool's claims and mounters whose claim is mounted elsewhere than at the pool
/// path: a claim taken over from the kubevirt operator stays at `<path>/csi`, where its CSI
/// driver finds its volumes, and the node DaemonSet serves the pool there.
pub const MOUNT_TARGET_ANNOTATION: &str = "hostpathprovisioner.kubevirt.io/mount-target";
/// Label the kubevirt operator puts on its pool claims and mounters.
pub const KUBEVIRT_POOL_LABEL: &str = "kubevirt.io.hostpath-provisioner/storagePool";
/// Where the image has the binary (the Dockerfile's entrypoint), for the mounter's probe.
const BINARY: &str = "/hostpath-provisioner";
/// Where the mounter's pod sees the claim.
const CLAIM_MOUNT: &str = "/claim";

/// What the pool's claim and mounter objects share.
pub struct PoolObjects<'a> {
    /// The resource's name, for [`super::render::OWNER_LABEL`].
    pub resource: &'a str,
    pub namespace: &'a str,
    pub image: &'a str,
    pub pool: &'a str,
    pub path: &'a str,
    /// Where the claim is mounted: the pool path, or `<path>/csi` for a pool of the kubevirt
    /// operator's layout.
    pub mount_target: &'a str,
    /// The mounter pods' pull secrets (names in `namespace`).
    pub image_pull_secrets: &'a [String],
}

impl PoolObjects<'_> {
    fn metadata(&self, name: &str, node: Option<&str>) -> serde_json::Value {
        let mut annotations = serde_json::json!({ PATH_ANNOTATION: self.path });
        if self.mount_target != self.path {
            annotations[MOUNT_TARGET_ANNOTATION] = serde_json::json!(self.mount_target);
        }
        if let Some(node) = node {
            annotations[NODE_ANNOTATION] = serde_json::json!(node);
        }
        // No owner reference: the garbage collector would take a claim away under live volumes;
        // the operator removes claims and mounters itself, under the hold-back rule.
        serde_json::json!({
            "name": name,
            "namespace": self.namespace,
            "labels": {
                super::render::OWNER_LABEL: self.resource,
                POOL_LABEL: self.pool,
                "app.kubernetes.io/managed-by": "hostpath-provisioner-operator",
            },
            "annotations": annotations,
        })
    }

    /// The claim `name` from the template (None for `node`: the shared claim).
    pub fn claim(&self, name: &str, node: Option<&str>, template: &PersistentVolumeClaimSpec) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": self.metadata(name, node),
            "spec": template,
        })
    }

    /// The mounter `name` of `claim` on `node`: one replica pinned to the node, the claim as a volume,
    /// exactly the pool path as a Bidirectional hostPath (which Kubernetes allows only to a
    /// privileged container), running `pool-mount`. It tolerates what the node pods tolerate
    /// (`tolerations`: the resource's and those the DaemonSet controller adds), so that the mount
    /// holds wherever the node provisioner runs, and nothing more.
    pub fn mounter(&self, name: &str, node: &str, claim: &str, tolerations: &[Toleration]) -> serde_json::Value {
        let digest = Sha256::digest(name.as_bytes());
        let selector_value: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
        let selector = serde_json::json!({ "hostpathprovisioner.kubevirt.io/mounter": selector_value });
        let mut pod_labels = selector.clone();
        pod_labels[POOL_LABEL] = serde_json::json!(self.pool);
        let mount_args = ["--source", CLAIM_MOUNT, "--target", self.mount_target];
        let mut probe = vec![BINARY, "pool-mount", "--check"];
        probe.extend(mount_args);
        let mut args = vec!["pool-mount"];
        args.extend(mount_args);
        let pull_secrets: Vec<serde_json::Value> =
            self.image_pull_secrets.iter().map(|name| serde_json::json!({ "name": name })).collect();
        serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": self.metadata(name, Some(node)),
            "spec": {
                "replicas": 1,
                // Never two mounters of one pool on one node.
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": selector},
                "template": {
                    // On OpenShift, admitted by the mounters' SCC and no other.
                    "metadata": {"labels": pod_labels, "annotations": {super::render::REQUIRED_SCC: MOUNTER_SCC}},
                    "spec": {
                        "serviceAccountName": MOUNTER_SERVICE_ACCOUNT,
                        "automountServiceAccountToken": false,
                        "imagePullSecrets": pull_secrets,
                        "priorityClassName": "system-node-critical",
                        "terminationGracePeriodSeconds": 30,
                        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [{"matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]}]
                        }}},
                        "tolerations": tolerations,
                        "containers": [{
                            "name": "mounter",
                            "image": self.image,
                            "args": args,
                            "readinessProbe": {"exec": {"command": probe}, "periodSeconds": 10},
                            "resources": {"requests": {"cpu": "1m", "memory": "8Mi"}, "limits": {"memory": "32Mi"}},
                            "securityContext": {
                                // Required by Bidirectional propagation; the only host path it
                                // sees is the pool's.
                                "privileged": true,
                                "runAsUser": 0,
                                "readOnlyRootFilesystem": true,
                            },
                            "volumeMounts": [
                                {"name": "claim", "mountPath": CLAIM_MOUNT},
                                {"name": "pool", "mountPath": self.mount_target, "mountPropagation": "Bidirectional"},
                            ],
                        }],
                        "volumes": [
                            {"name": "claim", "persistentVolumeClaim": {"claimName": claim}},
                            {"name": "pool", "hostPath": {"path": self.mount_target, "type": "DirectoryOrCreate"}},
                        ],
                    },
                },
            },
        })
    }
}

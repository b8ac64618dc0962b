//! What the operator does with the claims and mounters of pools on a claim at one reconcile:
//! which to apply (one claim per selected node, or one shared; one mounter per selected node),
//! which to delete, and which to keep because a PersistentVolume of ours lives in the pool there
//! (the hold-back rule, [`super::pool_claims::may_release`]). Pure: the cluster's state comes in
//! as plain data, the operator applies and deletes what comes out.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use super::pool_claims::{
    CsiVolume, PoolObjects, Release, SnapshotCopy, claim_name, may_release, pool_claims, selected_nodes,
};
use super::render::{NodePlacement, PoolOnClaim};
use crate::deciding::kept_volume::KeptVolume;

/// The provisioner name of the node DaemonSet the operator runs (deploy/legacy's
/// PROVISIONER_NAME): the PVs it writes are the ones that hold a pool back.
pub const PROVISIONER: &str = "kubevirt.io/hostpath-provisioner";

/// The kinds of a pool's objects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    #[default]
    /// The PersistentVolumeClaim the pool lives on.
    Claim,
    /// The per-node Deployment that mounts the claim at the pool path.
    Mounter,
}

/// A claim or mounter of ours found in the cluster, read from its labels and annotations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Existing {
    pub kind: Kind,
    pub name: String,
    pub pool: String,
    /// The node it serves; None for a shared claim.
    pub node: Option<String>,
    /// The pool path it was made for.
    pub path: String,
    /// Where the claim is mounted, when not at the pool path: a claim taken over from the
    /// kubevirt operator stays at its `<path>/csi` ([`super::pool_claims::MOUNT_TARGET_ANNOTATION`]).
    pub mount_target: Option<String>,
}

/// What the cluster holds that decides about the pool objects.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cluster<'a> {
    pub nodes: &'a [Node],
    /// The claims and mounters of ours.
    pub existing: &'a [Existing],
    /// The kubevirt operator's claims and mounter Deployments in the namespace (kind, name):
    /// a claim of the name this operator gives is adopted, a mounter replaced.
    pub kubevirt: &'a [(Kind, String)],
    pub pvs: &'a [KeptVolume],
    /// The kubevirt CSI driver's PVs, which hold every claim of their pool (a claim taken
    /// over from the kubevirt operator holds their data).
    pub csi_pvs: &'a [CsiVolume],
    /// The snapshots' copies, which hold the pool they are in.
    pub snapshots: &'a [SnapshotCopy],
}

/// One object to apply.
#[derive(Clone, Debug, PartialEq)]
pub struct ToApply {
    pub kind: Kind,
    pub name: String,
    pub pool: String,
    pub node: Option<String>,
    pub body: Value,
}

/// A pool's claim or mounter kept against the spec: PVs of ours or snapshot copies live there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldBack {
    pub kind: Kind,
    pub name: String,
    pub pool: String,
    pub node: Option<String>,
    pub path: String,
    /// What holds it: PV names, then `HostPathSnapshot <namespace>/<name>` (each sorted).
    pub pvs: Vec<String>,
    /// Where its claim is mounted (the pool path, or a kubevirt claim's `<path>/csi`): what the
    /// DaemonSet keeps serving.
    pub root: String,
}

impl HeldBack {
    /// What the status and the Event say.
    pub fn message(&self) -> String {
        let what = match self.kind {
            Kind::Claim => "claim",
            Kind::Mounter => "mounter",
        };
        let place = match &self.node {
            Some(node) => format!("on node {node}"),
            None => "shared by the nodes".to_owned(),
        };
        let pvs = if self.pvs.is_empty() { "PVs whose path cannot be checked".to_owned() } else { self.pvs.join(", ") };
        format!(
            "storage pool {:?} at {}: its {what} {} {place} is kept, with its data, while these PersistentVolumes or snapshot copies live there: {pvs}; it goes once they are deleted",
            self.pool, self.path, self.name
        )
    }
}

/// The outcome of one plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub apply: Vec<ToApply>,
    /// (kind, name): mounters before claims, so that a claim is not deleted under its mounter.
    pub delete: Vec<(Kind, String)>,
    pub held_back: Vec<HeldBack>,
    /// Per pool on a claim: the nodes that get a mounter.
    pub nodes: BTreeMap<String, Vec<String>>,
    /// The kubevirt operator's mounters to delete before this operator's take their names
    /// (applied at a later pass, once they are gone).
    pub replace: Vec<String>,
    /// Pools served at another root than their path (name, root): claims of the kubevirt
    /// operator's layout, mounted at `<path>/csi`.
    pub roots: BTreeMap<String, String>,
}

/// Plans the claims and mounters of `pools` (empty when the resource is being deleted) for the
/// nodes the placement selects, against what `cluster` already holds.
pub fn plan(pools: &[PoolOnClaim], placement: &NodePlacement, cluster: &Cluster, objects: &PoolObjects) -> Plan {
    let Cluster { nodes, existing, kubevirt, pvs, csi_pvs, snapshots } = *cluster;
    let mut tolerations = placement.tolerations.clone();
    tolerations.extend(daemonset_tolerations());
    let selected = selected_nodes(nodes, &placement.node_selector, placement.affinity.as_ref(), &tolerations);
    let mut plan = Plan::default();
    for pool in pools {
        // An object of ours already made for this pool, node and path keeps its name: an
        // earlier release named the shared claim `hpp-pool-<pool>` and cut long names another
        // way, and a second claim or mounter would leave the first one's data aside.
        let kept = |kind: Kind, node: Option<&str>| {
            existing
                .iter()
                .find(|e| e.kind == kind && e.pool == pool.name && e.node.as_deref() == node && e.path == pool.path)
        };
        let claims: Vec<(String, Option<String>)> = pool_claims(&pool.name, &pool.template, &selected)
            .into_iter()
            .map(|(name, node)| (kept(Kind::Claim, node.as_deref()).map_or(name, |e| e.name.clone()), node))
            .collect();
        // The kubevirt operator mounts a pool's claims at `<path>/csi`, where its CSI driver
        // finds its volumes: a pool with one of its claims keeps that layout on every node
        // (the DaemonSet serves one root per pool), new claims included.
        let kubevirt_layout = existing
            .iter()
            .any(|e| e.kind == Kind::Claim && e.pool == pool.name && e.path == pool.path && e.mount_target.is_some())
            || claims.iter().any(|(name, _)| kubevirt.contains(&(Kind::Claim, name.clone())));
        let target = if kubevirt_layout { kubevirt_mount_target(&pool.path) } else { pool.path.clone() };
        let objects = PoolObjects { pool: &pool.name, path: &pool.path, mount_target: &target, ..*objects };
        for (name, node) in &claims {
            let body = objects.claim(name, node.as_deref(), &pool.template);
            plan.apply.push(ToApply {
                kind: Kind::Claim,
                name: name.clone(),
                pool: pool.name.clone(),
                node: node.clone(),
                body,
            });
        }
        for node in &selected {
            let claim = claims
                .iter()
                .find(|(_, serves)| serves.is_none() || serves.as_ref() == Some(node))
                .map_or_else(|| claim_name(&pool.name, Some(node)), |(name, _)| name.clone());
            let name =
                kept(Kind::Mounter, Some(node)).map_or_else(|| claim_name(&pool.name, Some(node)), |e| e.name.clone());
            // Its mount stays on the node when its pod goes (the kubevirt mounter never
            // unmounts): this operator's mounter adopts it at the same place.
            if kubevirt.contains(&(Kind::Mounter, name.clone())) {
                plan.replace.push(name);
                continue;
            }
            plan.apply.push(ToApply {
                kind: Kind::Mounter,
                body: objects.mounter(&name, node, &claim, &tolerations),
                name,
                pool: pool.name.clone(),
                node: Some(node.clone()),
            });
        }
        if kubevirt_layout {
            plan.roots.insert(pool.name.clone(), target);
        }
        plan.nodes.insert(pool.name.clone(), selected.clone());
    }
    let wanted_path = |found: &Existing| {
        plan.apply
            .iter()
            .find(|a| a.kind == found.kind && a.name == found.name)
            .map(|a| pools.iter().find(|p| p.name == a.pool).map(|p| p.path.clone()).unwrap_or_default())
    };
    let mut keep_as_is = Vec::new();
    for found in existing {
        let wanted = wanted_path(found);
        if wanted.as_deref() == Some(found.path.as_str()) {
            continue;
        }
        // Gone from the spec, off the placement, or moved: the old pool path is released only
        // when no PV of ours lives there.
        let mut release = may_release(&found.path, found.node.as_deref(), pvs, snapshots, PROVISIONER);
        let mut csi: Vec<String> = csi_pvs.iter().filter(|v| v.pool == found.pool).map(|v| v.name.clone()).collect();
        if !csi.is_empty() {
            if let Release::HoldBack(ours) = release {
                csi.extend(ours);
            }
            csi.sort();
            release = Release::HoldBack(csi);
        }
        match release {
            Release::Release if wanted.is_none() => plan.delete.push((found.kind, found.name.clone())),
            // Moved and free: the new object replaces it in place.
            Release::Release => {}
            Release::HoldBack(holding) => {
                if wanted.is_some() {
                    keep_as_is.push((found.kind, found.name.clone()));
                }
                plan.held_back.push(HeldBack {
                    kind: found.kind,
                    name: found.name.clone(),
                    pool: found.pool.clone(),
                    node: found.node.clone(),
                    path: found.path.clone(),
                    pvs: holding,
                    root: found.mount_target.clone().unwrap_or_else(|| found.path.clone()),
                });
            }
        }
    }
    plan.apply.retain(|a| !keep_as_is.contains(&(a.kind, a.name.clone())));
    plan.delete.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
    plan
}

/// Where the kubevirt operator mounts a pool's claim: `<path>/csi`.
pub fn kubevirt_mount_target(path: &str) -> String {
    format!("{}/csi", path.trim_end_matches('/'))
}

/// The tolerations the DaemonSet controller adds to every DaemonSet pod: a node with these
/// taints still runs the node provisioner, so it needs its pools. A node not ready or
/// unreachable, whatever the effect, keeps them too: a kubelet restart must not move claims.
fn daemonset_tolerations() -> Vec<k8s_openapi::api::core::v1::Toleration> {
    [
        ("node.kubernetes.io/not-ready", ""),
        ("node.kubernetes.io/unreachable", ""),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ]
    .into_iter()
    .map(|(key, effect)| k8s_openapi::api::core::v1::Toleration {
        key: Some(key.to_owned()),
        operator: Some("Exists".to_owned()),
        effect: Some(effect.to_owned()).filter(|e| !e.is_empty()),
        ..Default::default()
    })
    .collect()
}

#[cfg(test)]
#[path = "pool_plan_tests.rs"]
mod tests;

//! The claims and per-node mounters of pools on a claim (`pvcTemplate`): read what exists, plan
//! ([`crate::deciding::operator::pool_plan`]), apply and delete, and tell the status what the
//! cluster shows. Neither object carries an owner reference (the garbage collector would take a
//! claim away under live volumes): the operator removes them itself, under the hold-back rule.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};

use super::error::OperatorError;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::operator::pool_claims::{
    CsiVolume, KUBEVIRT_POOL_LABEL, MOUNT_TARGET_ANNOTATION, NODE_ANNOTATION, PATH_ANNOTATION, POOL_LABEL, PoolObjects,
    SnapshotCopy,
};
use crate::deciding::operator::pool_plan::{self, Existing, Kind};
use crate::deciding::operator::render::{NodePlacement, OWNER_LABEL, PoolOnClaim};
use crate::deciding::operator::resource::ClaimStatus;
use crate::deciding::operator::status::PoolOnClaimState;
use crate::deciding::snapshot::HostPathSnapshot;

/// What one pass over the pools on a claim found and did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub states: Vec<PoolOnClaimState>,
    /// What keeps which claim or mounter (messages naming the PVs).
    pub held_back: Vec<String>,
    /// The first object that could not be applied or deleted.
    pub failure: Option<String>,
    /// A kubevirt mounter was deleted; this operator's comes at a later pass.
    pub replacing: bool,
}

/// Where the pool objects go and what they run.
pub struct Target<'a> {
    pub client: &'a Client,
    pub namespace: &'a str,
    pub image: &'a str,
    /// The mounters' pull secrets.
    pub image_pull_secrets: &'a [String],
    /// The resource's name: its pool objects carry it in [`OWNER_LABEL`].
    pub resource: &'a str,
    pub field_manager: &'a str,
}

/// PersistentVolumes read whole per list call (the operator's memory limit is 128Mi).
const PV_PAGE: u32 = 500;

/// The pool objects of a resource and what decides about them, read from the cluster.
#[derive(Debug, Default)]
pub struct Found {
    claims: Vec<PersistentVolumeClaim>,
    mounters: Vec<Deployment>,
    nodes: Vec<Node>,
    pvs: Vec<KeptVolume>,
    csi_pvs: Vec<CsiVolume>,
    snapshots: Vec<SnapshotCopy>,
    /// The kubevirt operator's claims and mounters (its label, not ours).
    kubevirt: Vec<(Kind, String)>,
}

/// Reads the resource's pool claims and mounters, and when there are any (or `pools` is not
/// empty) the nodes and PVs that decide about them.
pub async fn read(target: &Target<'_>, any_pools: bool) -> Result<Found, OperatorError> {
    let selector = ListParams::default().labels(&format!("{OWNER_LABEL}={},{POOL_LABEL}", target.resource));
    let claims =
        claims_api(target).list(&selector).await.map_err(|e| OperatorError::api("list the pool claims", e))?.items;
    let mounters = mounters_api(target)
        .list(&selector)
        .await
        .map_err(|e| OperatorError::api("list the pool mounter Deployments", e))?
        .items;
    if !any_pools && claims.is_empty() && mounters.is_empty() {
        return Ok(Found::default());
    }
    // The kubevirt operator's pool objects, by its label: a claim of the name this operator
    // gives is adopted, a mounter of that name replaced. Never another object of the namespace.
    let theirs = ListParams::default().labels(&format!("{KUBEVIRT_POOL_LABEL},!{OWNER_LABEL}"));
    let mut kubevirt: Vec<(Kind, String)> = claims_api(target)
        .list_metadata(&theirs)
        .await
        .map_err(|e| OperatorError::api("list the kubevirt operator's pool claims", e))?
        .items
        .into_iter()
        .map(|c| (Kind::Claim, c.name_any()))
        .collect();
    kubevirt.extend(
        mounters_api(target)
            .list_metadata(&theirs)
            .await
            .map_err(|e| OperatorError::api("list the kubevirt operator's pool mounters", e))?
            .items
            .into_iter()
            .map(|d| (Kind::Mounter, d.name_any())),
    );
    let nodes = Api::<Node>::all(target.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| OperatorError::api("list the nodes for the pool claims", e))?
        .items;
    // Whole PVs, a page at a time: the kubevirt CSI driver's keep their pool in `spec.csi`, which
    // the kept form of a volume leaves out, and a page bounds how many the operator holds whole.
    let api = Api::<PersistentVolume>::all(target.client.clone());
    let (mut pvs, mut csi_pvs) = (Vec::new(), Vec::new());
    let mut params = ListParams::default().limit(PV_PAGE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| OperatorError::api("list the PersistentVolumes that may hold a pool back", e))?;
        csi_pvs.extend(page.items.iter().filter_map(CsiVolume::of));
        for pv in page.items {
            // A PV that cannot be read stops the pass: a claim is never released past a volume
            // unseen.
            let kept = serde_json::to_value(pv).and_then(serde_json::from_value::<KeptVolume>).map_err(|e| {
                OperatorError::Config(format!("read a PersistentVolume that may hold a pool back: {e}"))
            })?;
            pvs.push(kept);
        }
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    let snapshots = snapshot_copies(target).await?;
    Ok(Found { claims, mounters, nodes, pvs, csi_pvs, snapshots, kubevirt })
}

/// The snapshots' copies, every namespace: each holds the pool it is in. Without the
/// HostPathSnapshot CRD there are none; any other failure stops the pass, as for the PVs.
async fn snapshot_copies(target: &Target<'_>) -> Result<Vec<SnapshotCopy>, OperatorError> {
    let api = Api::<HostPathSnapshot>::all(target.client.clone());
    let mut copies = Vec::new();
    let mut params = ListParams::default().limit(PV_PAGE);
    loop {
        let page = match api.list(&params).await {
            Ok(page) => page,
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Vec::new()),
            Err(e) => return Err(OperatorError::api("list the snapshots that may hold a pool back", e)),
        };
        copies.extend(page.items.iter().filter_map(SnapshotCopy::of));
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(copies),
        }
    }
}

fn claims_api(target: &Target<'_>) -> Api<PersistentVolumeClaim> {
    Api::namespaced(target.client.clone(), target.namespace)
}

fn mounters_api(target: &Target<'_>) -> Api<Deployment> {
    Api::namespaced(target.client.clone(), target.namespace)
}

fn plan(target: &Target<'_>, found: &Found, pools: &[PoolOnClaim], placement: &NodePlacement) -> pool_plan::Plan {
    let mut existing: Vec<Existing> = found.claims.iter().filter_map(|c| read_existing(Kind::Claim, c)).collect();
    existing.extend(found.mounters.iter().filter_map(|d| read_existing(Kind::Mounter, d)));
    let objects = PoolObjects {
        resource: target.resource,
        namespace: target.namespace,
        image: target.image,
        pool: "",
        path: "",
        mount_target: "",
        image_pull_secrets: target.image_pull_secrets,
    };
    let cluster = pool_plan::Cluster {
        nodes: &found.nodes,
        existing: &existing,
        kubevirt: &found.kubevirt,
        pvs: &found.pvs,
        csi_pvs: &found.csi_pvs,
        snapshots: &found.snapshots,
    };
    pool_plan::plan(pools, placement, &cluster, &objects)
}

/// Pools by name, each with the root the node serves it at.
pub type PoolRoots = Vec<(String, String)>;

/// What the DaemonSet serves besides the spec's pools as written: the pools held back against
/// `pools`, which it keeps serving, and the pools served at another root than their path (a
/// claim of the kubevirt operator's layout).
pub fn served_roots(
    target: &Target<'_>,
    found: &Found,
    pools: &[PoolOnClaim],
    placement: &NodePlacement,
) -> (PoolRoots, PoolRoots) {
    let plan = plan(target, found, pools, placement);
    let mut held: PoolRoots = plan.held_back.into_iter().map(|h| (h.pool, h.root)).collect();
    held.sort();
    held.dedup();
    (held, plan.roots.into_iter().collect())
}

/// Brings the claims and mounters of `pools` (empty: the resource is being deleted) to what
/// the placement asks, keeping those that PVs of ours still need.
pub async fn reconcile(
    target: &Target<'_>,
    found: &Found,
    pools: &[PoolOnClaim],
    placement: &NodePlacement,
) -> Outcome {
    let (claims, mounters) = (claims_api(target), mounters_api(target));
    let (found_claims, found_mounters) = (&found.claims, &found.mounters);
    if pools.is_empty() && found_claims.is_empty() && found_mounters.is_empty() {
        return Outcome::default();
    }
    let plan = plan(target, found, pools, placement);

    let mut outcome = Outcome { held_back: plan.held_back.iter().map(|h| h.message()).collect(), ..Outcome::default() };
    // The kubevirt operator's mounters go first; this operator's take their names at a later
    // pass, and adopt their mounts, which stay on the nodes.
    for name in &plan.replace {
        match mounters.delete(name, &DeleteParams::background()).await {
            Ok(_) => {
                tracing::info!(resource = target.resource, %name, "removed the kubevirt operator's mounter: this operator's mounter adopts its mount")
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                let message = format!("delete the kubevirt operator's mounter Deployment {name}: {error}");
                tracing::warn!(resource = target.resource, %message, "cannot replace a pool mounter");
                outcome.failure.get_or_insert(message);
            }
        }
    }
    outcome.replacing = !plan.replace.is_empty();
    let params = PatchParams::apply(target.field_manager).force();
    for object in &plan.apply {
        let result = match object.kind {
            Kind::Claim => claims.patch(&object.name, &params, &Patch::Apply(&object.body)).await.map(|_| ()),
            Kind::Mounter => mounters.patch(&object.name, &params, &Patch::Apply(&object.body)).await.map(|_| ()),
        };
        if let Err(error) = result {
            let message = format!("{} {}: {error}", kind_name(object.kind), object.name);
            tracing::warn!(resource = target.resource, %message, "cannot apply a pool object");
            outcome.failure.get_or_insert(message);
        }
    }
    for (kind, name) in &plan.delete {
        let result = match kind {
            Kind::Claim => claims.delete(name, &DeleteParams::background()).await.map(|_| ()),
            Kind::Mounter => mounters.delete(name, &DeleteParams::background()).await.map(|_| ()),
        };
        match result {
            Ok(()) => {
                tracing::info!(resource = target.resource, kind = kind_name(*kind), %name, "removed: no volume of ours lives there")
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                let message = format!("delete {} {name}: {error}", kind_name(*kind));
                tracing::warn!(resource = target.resource, %message, "cannot remove a pool object");
                outcome.failure.get_or_insert(message);
            }
        }
    }
    for held in &outcome.held_back {
        tracing::info!(resource = target.resource, "{held}");
    }
    outcome.states = pools
        .iter()
        .map(|pool| {
            let nodes = plan.nodes.get(&pool.name).cloned().unwrap_or_default();
            let ours = |labels: &std::collections::BTreeMap<String, String>| labels.get(POOL_LABEL) == Some(&pool.name);
            let wanted_claims: Vec<&str> = plan
                .apply
                .iter()
                .filter(|a| a.kind == Kind::Claim && a.pool == pool.name)
                .map(|a| a.name.as_str())
                .collect();
            let pool_claims: Vec<&PersistentVolumeClaim> = found_claims.iter().filter(|c| ours(c.labels())).collect();
            let ready = found_mounters
                .iter()
                .filter(|d| ours(d.labels()))
                .filter(|d| d.annotations().get(PATH_ANNOTATION) == Some(&pool.path))
                .filter(|d| d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0) >= 1)
                .count();
            PoolOnClaimState {
                name: pool.name.clone(),
                desired: i32::try_from(nodes.len()).unwrap_or(i32::MAX),
                ready: i32::try_from(ready).unwrap_or(i32::MAX),
                claims_made: wanted_claims.iter().all(|name| pool_claims.iter().any(|c| c.name_any() == *name)),
                claim_statuses: pool_claims
                    .iter()
                    .map(|c| ClaimStatus {
                        name: c.name_any(),
                        status: serde_json::to_value(&c.status).unwrap_or_default(),
                    })
                    .collect(),
            }
        })
        .collect();
    outcome
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Claim => "PersistentVolumeClaim",
        Kind::Mounter => "Deployment",
    }
}

/// A pool object read back: its pool label and path annotation (without them, not ours).
fn read_existing<K: kube::Resource>(kind: Kind, object: &K) -> Option<Existing> {
    let meta = object.meta();
    let annotation = |key: &str| meta.annotations.as_ref().and_then(|a| a.get(key)).cloned();
    Some(Existing {
        kind,
        name: meta.name.clone()?,
        pool: meta.labels.as_ref()?.get(POOL_LABEL)?.clone(),
        node: annotation(NODE_ANNOTATION),
        path: annotation(PATH_ANNOTATION)?,
        mount_target: annotation(MOUNT_TARGET_ANNOTATION),
    })
}

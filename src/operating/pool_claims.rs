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
use crate::deciding::operator::pool_claims::{CsiVolume, NODE_ANNOTATION, PATH_ANNOTATION, POOL_LABEL, PoolObjects};
use crate::deciding::operator::pool_plan::{self, Existing, Kind};
use crate::deciding::operator::render::{NodePlacement, OWNER_LABEL, PoolOnClaim};
use crate::deciding::operator::resource::ClaimStatus;
use crate::deciding::operator::status::PoolOnClaimState;

/// What one pass over the pools on a claim found and did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub states: Vec<PoolOnClaimState>,
    /// What keeps which claim or mounter (messages naming the PVs).
    pub held_back: Vec<String>,
    /// The first object that could not be applied or deleted.
    pub failure: Option<String>,
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

/// The pool objects of a resource and what decides about them, read from the cluster.
#[derive(Debug, Default)]
pub struct Found {
    claims: Vec<PersistentVolumeClaim>,
    mounters: Vec<Deployment>,
    nodes: Vec<Node>,
    pvs: Vec<KeptVolume>,
    csi_pvs: Vec<CsiVolume>,
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
    let nodes = Api::<Node>::all(target.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| OperatorError::api("list the nodes for the pool claims", e))?
        .items;
    // Whole PVs: the kubevirt CSI driver's keep their pool in `spec.csi`, which the kept form
    // of a volume leaves out. The operator holds them for this pass only.
    let listed = Api::<PersistentVolume>::all(target.client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| OperatorError::api("list the PersistentVolumes that may hold a pool back", e))?
        .items;
    let csi_pvs = listed.iter().filter_map(CsiVolume::of).collect();
    // A PV that cannot be read stops the pass: a claim is never released past a volume unseen.
    let pvs = listed
        .into_iter()
        .map(|pv| serde_json::to_value(pv).and_then(serde_json::from_value::<KeptVolume>))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| OperatorError::Config(format!("read a PersistentVolume that may hold a pool back: {e}")))?;
    Ok(Found { claims, mounters, nodes, pvs, csi_pvs })
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
        image_pull_secrets: target.image_pull_secrets,
    };
    pool_plan::plan(pools, placement, &found.nodes, &existing, &found.pvs, &found.csi_pvs, &objects)
}

/// The pools (name, path) held back against `pools`: the DaemonSet keeps serving them.
pub fn held_pools(
    target: &Target<'_>,
    found: &Found,
    pools: &[PoolOnClaim],
    placement: &NodePlacement,
) -> Vec<(String, String)> {
    let mut held: Vec<(String, String)> =
        plan(target, found, pools, placement).held_back.into_iter().map(|h| (h.pool, h.path)).collect();
    held.sort();
    held.dedup();
    held
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
    Some(Existing {
        kind,
        name: meta.name.clone()?,
        pool: meta.labels.as_ref()?.get(POOL_LABEL)?.clone(),
        node: meta.annotations.as_ref().and_then(|a| a.get(NODE_ANNOTATION)).cloned(),
        path: meta.annotations.as_ref()?.get(PATH_ANNOTATION)?.clone(),
    })
}

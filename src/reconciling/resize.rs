//! Expansion of bound claims: the external-resizer's part for this node's PVs and for the shared
//! PVs this node is picked for (one node per volume, by the same ranking as deletion).
//!
//! Trigger: a bound claim whose request differs from its capacity stays in the claim cache
//! (deciding::claim_retention); when its PV (`pvc-<uid>`) is in this node's PV cache,
//! [`decide_resize`] decides on the cached claim. The protocol is the
//! external-resizer's: while resizing, the claim's status carries the `Resizing` condition and
//! `allocatedResourceStatuses.storage = ControllerResizeInProgress`; on success the PV's capacity,
//! then the claim's `status.capacity`, take the new size and the resize fields are cleared; a
//! refusal sets `ControllerResizeError` and `ControllerResizeInfeasible`, with a Warning event.
//! Nothing needs the pod to restart: a quota grows in place, a plain directory has no size, and a
//! Block volume's backing file grows under its attached loop, which is then told its new size
//! (`LOOP_SET_CAPACITY`). No `FileSystemResizePending` either: a raw device has no filesystem
//! for kubelet to grow, so the claim's capacity is set as soon as the loop has the size.

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;

use crate::deciding::capacity::parse_bytes;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout;
use crate::deciding::resize::{PoolRoom, ResizeDecision, ResizeFacts, decide_resize, shared_actor_is_me};
use crate::deciding::topology;
use crate::deciding::volume::{VolumeShape, owner_node, volume_shape};
use crate::filesystem::VolumeDirName;
use crate::reconciling::context::Context;

/// Event reasons, as the external-resizer writes them.
const RESIZING: &str = "Resizing";
const RESIZE_SUCCEEDED: &str = "VolumeResizeSuccessful";
const RESIZE_FAILED: &str = "VolumeResizeFailed";

/// Something went wrong while growing; reported on the claim and retried with the next event or
/// the periodic resync.
#[derive(Debug, thiserror::Error)]
enum ResizeError {
    #[error("Kubernetes API error: {0}")]
    Api(#[from] kube::Error),
    #[error("{0}")]
    Pool(#[from] crate::filesystem::PoolError),
    #[error("the PV's path {0:?} is not a volume directory of a pool of this node")]
    Path(String),
    #[error("{0}")]
    Block(#[from] crate::error::VolumeError),
}

/// The PV of this node bound to the claim with `uid`, when its class allows expansion.
pub fn bound_volume(ctx: &Context, uid: &str) -> Option<std::sync::Arc<KeptVolume>> {
    let pv = ctx.known_volume(&layout::pv_name(uid))?;
    let spec = pv.spec.as_ref()?;
    let bound = spec.claim_ref.as_ref()?.uid.as_deref() == Some(uid);
    let class = ctx.classes.get(&ObjectRef::new(spec.storage_class_name.as_deref()?))?;
    (bound && class.allow_volume_expansion == Some(true)).then_some(pv)
}

/// Looks at a bound claim of one of this node's PVs and expands its volume if asked.
pub async fn reconcile(ctx: &Context, claim: &PersistentVolumeClaim, pv: &KeptVolume) {
    let (Some(namespace), Some(name)) = (claim.metadata.namespace.as_deref(), claim.metadata.name.as_deref()) else {
        return;
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(facts) = facts(ctx, claim, pv).await else { return };
    let regarding = claim.object_ref(&());
    let decision = decide_resize(&facts, || room(ctx, pv));
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let requested = request_quantity(claim).unwrap_or_default();
    let outcome = match decision {
        ResizeDecision::Unchanged | ResizeDecision::NotHere => return,
        ResizeDecision::Refuse(refusal) => {
            let note = refusal.to_string();
            tracing::warn!(pv = %pv_name, %note, "refusing volume expansion");
            if !already_refused(claim, &note)
                && let Err(error) = patch_claim_status(&claims, name, failed_status(&requested, &note)).await
            {
                tracing::warn!(pv = %pv_name, %error, "cannot record the refused expansion on the claim");
            }
            ctx.warn(&regarding, RESIZE_FAILED, "Resize", note).await;
            return;
        }
        ResizeDecision::RecordOnClaim => finish(ctx, &claims, name, &regarding, &pv_name, &requested).await,
        ResizeDecision::Grow { to, block } => grow(ctx, &claims, name, &regarding, pv, &requested, to, block).await,
    };
    if let Err(error) = outcome {
        let note = format!("resize volume {pv_name} failed: {error}");
        tracing::warn!(pv = %pv_name, %error, "volume expansion failed; retried with the next change or resync");
        ctx.warn(&regarding, RESIZE_FAILED, "Resize", note).await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn grow(
    ctx: &Context,
    claims: &Api<PersistentVolumeClaim>,
    name: &str,
    regarding: &ObjectReference,
    pv: &KeptVolume,
    requested: &str,
    to: u64,
    block: Option<crate::deciding::block::Allocation>,
) -> Result<(), ResizeError> {
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    patch_claim_status(
        claims,
        name,
        json!({
            "allocatedResources": { "storage": requested },
            "allocatedResourceStatuses": { "storage": "ControllerResizeInProgress" },
            "conditions": [condition("Resizing", "", "")],
        }),
    )
    .await?;
    ctx.normal(regarding, RESIZING, "Resize", format!("External resizer is resizing volume {pv_name}")).await;
    let mut quota = false;
    match block {
        Some(allocation) => {
            let told = crate::reconciling::block_volumes::grow(ctx, pv, to, allocation)?;
            tracing::info!(pv = %pv_name, size = to, loop_number = ?told, "Block volume's backing file grown and its loop told");
        }
        None => {
            let (pool, dir) = locate(ctx, pv)?;
            quota = pool.is_quota_volume(&dir);
            if quota {
                pool.set_quota_limit(&dir, to)?;
            }
        }
    }
    let pvs: Api<KeptVolume> = Api::all(ctx.client.clone());
    pvs.patch(
        &pv_name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "capacity": { "storage": requested } } })),
    )
    .await?;
    tracing::info!(pv = %pv_name, size = requested, quota, "volume expanded");
    finish(ctx, claims, name, regarding, &pv_name, requested).await
}

/// Records the new size on the claim and clears the resize fields.
async fn finish(
    ctx: &Context,
    claims: &Api<PersistentVolumeClaim>,
    name: &str,
    regarding: &ObjectReference,
    pv_name: &str,
    requested: &str,
) -> Result<(), ResizeError> {
    patch_claim_status(
        claims,
        name,
        json!({
            "capacity": { "storage": requested },
            "allocatedResources": { "storage": requested },
            "allocatedResourceStatuses": null,
            "conditions": [],
        }),
    )
    .await?;
    if let Some(uid) = regarding.uid.as_deref() {
        ctx.forget_warnings(uid);
    }
    ctx.normal(regarding, RESIZE_SUCCEEDED, "Resize", format!("resize volume {pv_name} to {requested} succeeded"))
        .await;
    Ok(())
}

async fn facts(ctx: &Context, claim: &PersistentVolumeClaim, pv: &KeptVolume) -> Option<ResizeFacts> {
    let bytes = |q: Option<&str>| q.and_then(|q| parse_bytes(q).ok());
    let request = request_quantity(claim)?;
    let (requested, unreadable_request) = match parse_bytes(&request) {
        Ok(bytes) => (bytes, None),
        Err(why) => (0, Some(why.to_string())),
    };
    let claim_capacity = bytes(
        claim.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")).map(|q| q.0.as_str()),
    )
    .unwrap_or(0);
    let pv_capacity =
        bytes(pv.spec.as_ref()?.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.as_str())).unwrap_or(0);
    let class_name = claim.spec.as_ref()?.storage_class_name.clone()?;
    let class_allows = ctx
        .classes
        .get(&ObjectRef::new(&class_name))
        .is_some_and(|c| ctx.me.serves(&c.provisioner) && c.allow_volume_expansion == Some(true));
    let shape = volume_shape(pv, &ctx.config.pools);
    let acting_here = match shape {
        VolumeShape::Node => match crate::deciding::node_affinity::holds(pv, &ctx.me.affinity) {
            Some(held) => held,
            None => match owner_node(pv) {
                Some(node) => node == ctx.me.node || node == ctx.my_hostname().await,
                None => false,
            },
        },
        VolumeShape::Shared => shared_acting_here(ctx, pv).await,
        VolumeShape::EveryNode => false,
    };
    // A Block volume's file grows as its class allocates it (the parameter is read again here:
    // a PV does not record it).
    let block = crate::deciding::volume::is_block(pv).then(|| {
        ctx.classes
            .get(&ObjectRef::new(&class_name))
            .and_then(|c| c.parameters.as_ref()?.get(crate::deciding::block::ALLOCATION_PARAMETER).cloned())
    });
    Some(ResizeFacts {
        requested,
        unreadable_request,
        claim_capacity,
        pv_capacity,
        class_allows,
        shape,
        acting_here,
        block,
        block_volumes_on: ctx.config.block_device_dir.is_some(),
    })
}

/// Whether this node is the one the ranking picks for a shared PV (the key is the PV's name, as
/// for its deletion). A PV outside this node's pools, or live nodes that cannot be read, leave it
/// to another node or the next event.
async fn shared_acting_here(ctx: &Context, pv: &KeptVolume) -> bool {
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    let path = crate::deciding::volume::volume_path(pv).unwrap_or_default();
    let named_by_pattern = pv.annotations.contains_key(crate::keys::PATH_PATTERN);
    let Ok(accepted) = layout::accept_volume_path(path, pv_name, &ctx.config.pools, named_by_pattern) else {
        return false;
    };
    let Some(pool) = ctx.config.pools.iter().find(|p| p.root == accepted.root).map(|p| p.key()) else { return false };
    match ctx.live_nodes().await {
        Ok(live) => shared_actor_is_me(&topology::acting_node(pv_name, &pool, &ctx.me.node, &live)),
        Err(error) => {
            tracing::warn!(pv = %pv_name, %error, "cannot read the live nodes to choose who grows the shared volume");
            false
        }
    }
}

fn request_quantity(claim: &PersistentVolumeClaim) -> Option<String> {
    let requests = claim.spec.as_ref()?.resources.as_ref()?.requests.as_ref()?;
    requests.get("storage").map(|q| q.0.clone())
}

/// The room left in the volume's pool for growth, the reserve taken off.
fn room(ctx: &Context, pv: &KeptVolume) -> Option<PoolRoom> {
    let (pool, _) = locate(ctx, pv).ok()?;
    let stats = pool.stats().ok()?;
    let reserve = ctx
        .config
        .pools
        .iter()
        .find(|p| p.root == pool.path())
        .and_then(|p| p.reserve)
        .unwrap_or(ctx.config.reserved_bytes);
    Some(PoolRoom { available: stats.available_bytes.saturating_sub(reserve), reserve })
}

/// The pool and directory of the PV, by the same path rules as deletion.
fn locate(
    ctx: &Context,
    pv: &KeptVolume,
) -> Result<(std::sync::Arc<crate::filesystem::PoolRoot>, VolumeDirName), ResizeError> {
    let path = crate::deciding::volume::volume_path(pv).unwrap_or_default().to_owned();
    let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
    let named_by_pattern = pv.annotations.contains_key(crate::keys::PATH_PATTERN);
    let accepted = layout::accept_volume_path(&path, pv_name, &ctx.config.pools, named_by_pattern)
        .map_err(|_| ResizeError::Path(path.clone()))?;
    let pool = ctx.pools.usable(&accepted.root).ok_or_else(|| ResizeError::Path(path.clone()))??;
    let dir = VolumeDirName::new(&accepted.dir_name).map_err(crate::filesystem::PoolError::from)?;
    // A pathPattern directory is grown only for the PV its marker names.
    if accepted.marked {
        pool.check_marked_for(&dir, pv_name)?;
    }
    Ok((pool, dir))
}

fn condition(type_: &str, reason: &str, message: &str) -> serde_json::Value {
    json!({
        "type": type_,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": Time(k8s_openapi::jiff::Timestamp::now()),
    })
}

fn failed_status(requested: &str, note: &str) -> serde_json::Value {
    json!({
        "allocatedResources": { "storage": requested },
        "allocatedResourceStatuses": { "storage": "ControllerResizeInfeasible" },
        "conditions": [condition("ControllerResizeError", "VolumeResizeFailed", note)],
    })
}

/// The claim already records this refusal: no need to write it again on every event.
fn already_refused(claim: &PersistentVolumeClaim, note: &str) -> bool {
    claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "ControllerResizeError" && c.message.as_deref() == Some(note)))
}

async fn patch_claim_status(
    claims: &Api<PersistentVolumeClaim>,
    name: &str,
    status: serde_json::Value,
) -> Result<(), kube::Error> {
    claims.patch_status(name, &PatchParams::default(), &Patch::Merge(json!({ "status": status }))).await.map(|_| ())
}

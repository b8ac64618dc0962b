//! The clone step of the claim reconciler (`deciding::clone`): once the claim decision is made
//! for a claim whose data source is another claim, check the source, let the node holding it
//! copy, and explain every wait and refusal on the claim.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;

use crate::deciding::claim::{self as claim_decision, BindingMode, Decision, ProvisionPlan, Refusal};
use crate::deciding::clone::{self, CloneActor, CloneRequest, Placement, SourceVerdict};
use crate::deciding::quota::QuotaMode;
use crate::deciding::topology::LiveNode;
use crate::error::{ClaimError, reason};
use crate::filesystem::{Created, PoolError, PoolRoot, VolumeDirName};
use crate::keys;
use crate::reconciling::claims::{claim_ref, explain_once, handback};
use crate::reconciling::context::Context;

/// How often a clone waiting for its source looks again (the source changing does not wake the
/// clone's reconciler).
const SOURCE_RECHECK: Duration = Duration::from_secs(10);

/// What the clone step leaves to the claim reconciler.
pub enum Prepared {
    /// Go on with this decision; for a clone to provision, copy from this source directory.
    Decided(Decision, Option<VolumeDirName>),
    /// Handled here (a wait, a hand-back, another node's work): return this action.
    Done(Action),
}

/// The clone step: a claim that is no clone passes through unchanged.
pub async fn prepare(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    live: &[LiveNode],
    decision: Decision,
) -> Result<Prepared, ClaimError> {
    let Ok(Some(source_name)) = clone::claim_source(claim) else { return Ok(Prepared::Decided(decision, None)) };
    match decision {
        Decision::ExplainImmediate => unplaced(ctx, claim, class, live, &source_name).await,
        Decision::Provision(plan) => {
            let placement = if plan.binding_mode == BindingMode::WaitForFirstConsumer && !plan.pinned_by_annotation {
                Placement::Scheduled
            } else {
                Placement::Pinned
            };
            placed(ctx, claim, *plan, &source_name, placement).await
        }
        other => Ok(Prepared::Decided(other, None)),
    }
}

/// An Immediate node-shaped clone names no node: the node that holds the source provisions it,
/// as if the claim were pinned there (a clone cannot be anywhere else, so this is no placement
/// by the user and the provisionOnNode policy does not apply).
async fn unplaced(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    live: &[LiveNode],
    source_name: &str,
) -> Result<Prepared, ClaimError> {
    let (source, pv) = fetch_source(ctx, claim, source_name).await?;
    let owner = pv.as_ref().and_then(|pv| crate::deciding::volume::owner_node(pv)).map(str::to_owned);
    match owner {
        Some(owner) if owner == ctx.me.node => {}
        // The owner speaks for this clone: it has the data and the pool.
        Some(_) => return Ok(Prepared::Done(Action::await_change())),
        None => {
            // No PV yet, so no owner to speak: one event for the whole cluster.
            let verdict = check_unplaced_source(ctx, claim, source_name, source.as_ref());
            explain_once(ctx, claim, "clone-source-not-ready", reason::CLONE_SOURCE_NOT_READY, verdict).await;
            return Ok(Prepared::Done(Action::requeue(SOURCE_RECHECK)));
        }
    }
    let mut pinned = claim.clone();
    pinned
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(keys::PROVISION_ON_NODE.into(), ctx.me.node.clone());
    let config = claim_decision::DecisionConfig {
        provision_on_node: claim_decision::ProvisionOnNodePolicy::Allow,
        ..ctx.decision.clone()
    };
    match claim_decision::decide_claim(&pinned, class, &ctx.me, &config, live) {
        Decision::Provision(plan) => checked(ctx, claim, *plan, source_name, Placement::Unplaced, source, pv).await,
        other => Ok(Prepared::Decided(other, None)),
    }
}

/// Why an Immediate clone without a source PV waits.
fn check_unplaced_source(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    source_name: &str,
    source: Option<&PersistentVolumeClaim>,
) -> String {
    let class_name = claim_decision::claim_class_name(claim).unwrap_or_default();
    let pool = crate::deciding::layout::PoolPath::local("", "/");
    let request = CloneRequest { source_name, class_name, request: "", request_bytes: u64::MAX, pool: &pool };
    match clone::check_source(request, source, None, &ctx.me) {
        SourceVerdict::Wait(why) => why,
        SourceVerdict::Refuse(refusal) => refusal.to_string(),
        SourceVerdict::Ready { .. } | SourceVerdict::Elsewhere(_) => {
            format!("waiting for source claim {source_name:?}")
        }
    }
}

async fn placed(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    plan: ProvisionPlan,
    source_name: &str,
    placement: Placement,
) -> Result<Prepared, ClaimError> {
    let (source, pv) = fetch_source(ctx, claim, source_name).await?;
    checked(ctx, claim, plan, source_name, placement, source, pv).await
}

async fn checked(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    plan: ProvisionPlan,
    source_name: &str,
    placement: Placement,
    source: Option<PersistentVolumeClaim>,
    pv: Option<PersistentVolume>,
) -> Result<Prepared, ClaimError> {
    let request = CloneRequest {
        source_name,
        class_name: &plan.class_name,
        request: &plan.request,
        request_bytes: plan.request_bytes,
        pool: &plan.pool,
    };
    let (dir_name, owner) = match clone::check_source(request, source.as_ref(), pv.as_ref(), &ctx.me) {
        SourceVerdict::Wait(why) => {
            tracing::info!(claim = %claim_name(claim), %why, "clone waits for its source");
            ctx.warn(&claim_ref(claim), reason::CLONE_SOURCE_NOT_READY, "Provision", why).await;
            return Ok(Prepared::Done(Action::requeue(SOURCE_RECHECK)));
        }
        SourceVerdict::Refuse(refusal) => {
            return Ok(Prepared::Decided(Decision::Refuse(Refusal::DataSource(refusal)), None));
        }
        SourceVerdict::Ready { dir_name } => (dir_name, None),
        SourceVerdict::Elsewhere(node) => (String::new(), Some(node)),
    };
    match clone::clone_actor(owner.as_deref(), placement, &ctx.me) {
        CloneActor::Me => {
            let source_dir = VolumeDirName::new(&dir_name).map_err(|e| ClaimError::Pool(e.into()))?;
            // The filesystem fact is asked only when it matters; an unusable pool fails later,
            // in provisioning, with its own reason.
            let source_is_quota_volume = plan.quota != QuotaMode::Enforce
                || ctx
                    .pools
                    .usable(&plan.pool.name)
                    .and_then(Result::ok)
                    .is_some_and(|pool| pool.is_quota_volume(&source_dir));
            if let Err(refusal) = clone::check_quota_source(plan.quota, source_name, source_is_quota_volume) {
                return Ok(Prepared::Decided(Decision::Refuse(Refusal::DataSource(refusal)), None));
            }
            Ok(Prepared::Decided(Decision::Provision(Box::new(plan)), Some(source_dir)))
        }
        CloneActor::Other(_) => Ok(Prepared::Done(Action::await_change())),
        CloneActor::Refuse(refusal) => Ok(Prepared::Decided(Decision::Refuse(Refusal::DataSource(refusal)), None)),
        CloneActor::WrongNode { source_node } => {
            // Keeping selected-node would strand the claim here for good; without it the
            // scheduler places the pod again, and a pod the user pins to the source's node
            // (recreated with a nodeSelector) can use this very claim.
            let why = format!(
                "this claim clones claim {source_name:?}, whose volume lives on node {source_node}; a clone is made on the \
                 node that holds its source, but the pod was scheduled to node {}. Run the pod on node {source_node} \
                 (nodeSelector kubernetes.io/hostname of that node, or a matching nodeAffinity; recreate the pod)",
                ctx.me.node
            );
            handback(ctx, claim, &why, "clone_wrong_node").await?;
            Ok(Prepared::Done(Action::await_change()))
        }
    }
}

/// The source claim and the PV it is bound to, when they exist.
async fn fetch_source(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    source_name: &str,
) -> Result<(Option<PersistentVolumeClaim>, Option<PersistentVolume>), kube::Error> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let source = claims.get_opt(source_name).await?;
    let pv_name =
        source.as_ref().and_then(|s| s.spec.as_ref()).and_then(|s| s.volume_name.clone()).filter(|n| !n.is_empty());
    let pv = match pv_name {
        None => None,
        Some(name) => match ctx.known_volume(&name) {
            Some(pv) => Some((*pv).clone()),
            None => Api::<PersistentVolume>::all(ctx.client.clone()).get_opt(&name).await?,
        },
    };
    Ok((source, pv))
}

/// Makes the copy off the async threads; returns whether this call made it. The source claim
/// carries the cloning-protection finalizer while its data is read: deleting it then would
/// release its volume, whose removal would empty the source under the copy.
pub async fn copy(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    source_claim: &str,
    pool: &Arc<PoolRoot>,
    source: &VolumeDirName,
    target: &VolumeDirName,
) -> Result<Created, ClaimError> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let copied = match protect_source(&claims, source_claim).await {
        Ok(()) => copy_protected(ctx, claim, pool, source, target).await,
        Err(error) => Err(error),
    };
    // Only once the copy is complete (or failed), and no other clone of the source (this node's
    // or, on a shared pool, another node's) still waits for its copy: a crash before this keeps
    // the finalizer until the source's next look ([`release_unread_source`]).
    release_unread_source(&claims, source_claim, claim.metadata.uid.as_deref()).await?;
    copied
}

/// How often a source claim that keeps its cloning-protection finalizer for pending clones is
/// looked at again (a clone binding does not wake the source's reconciler).
const PROTECTION_RECHECK: Duration = Duration::from_secs(30);

/// The source claim's own look at its cloning-protection finalizer: removes it once no clone
/// waits for a copy (a copy cut short by a kill, a clone deleted meanwhile, a release that
/// failed), and otherwise looks again later.
pub async fn check_source_protection(ctx: &Context, namespace: &str, name: &str) -> Result<Action, ClaimError> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    if release_unread_source(&claims, name, None).await? {
        Ok(Action::await_change())
    } else {
        Ok(Action::requeue(PROTECTION_RECHECK))
    }
}

/// Removes the source's cloning-protection finalizer when no claim of the namespace other than
/// `finished` waits for a copy of it (`deciding::clone::may_release_source`); returns whether
/// the source is now unprotected. The source is read before the claims are listed and the
/// removal tests its resourceVersion: a clone that protected the source after the read (and so
/// perhaps after the list) makes the removal fail instead of losing its protection.
async fn release_unread_source(
    claims: &Api<PersistentVolumeClaim>,
    source_claim: &str,
    finished: Option<&str>,
) -> Result<bool, ClaimError> {
    let Some(source) = claims.get_opt(source_claim).await? else { return Ok(true) };
    let finalizers = source.metadata.finalizers.clone().unwrap_or_default();
    if !finalizers.iter().any(|f| f == keys::CLONE_PROTECTION_FINALIZER) {
        return Ok(true);
    }
    let all = claims.list(&Default::default()).await?;
    if !clone::may_release_source(source_claim, &all.items, finished) {
        tracing::debug!(source = %source_claim, "source keeps its cloning protection: another clone waits for its copy");
        return Ok(false);
    }
    let wanted: Vec<&String> = finalizers.iter().filter(|f| *f != keys::CLONE_PROTECTION_FINALIZER).collect();
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        { "op": "test", "path": "/metadata/uid", "value": source.metadata.uid },
        { "op": "test", "path": "/metadata/resourceVersion", "value": source.metadata.resource_version },
        { "op": "replace", "path": "/metadata/finalizers", "value": wanted },
    ]))
    .map_err(|e| ClaimError::Api(kube::Error::SerdeError(e)))?;
    match claims.patch(source_claim, &PatchParams::default(), &Patch::<()>::Json(patch)).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(true),
        // The source changed meanwhile (a new clone protected it, another node released it):
        // that change is an event of the source claim, whose reconcile looks again.
        Err(kube::Error::Api(status)) if status.code == 409 || status.code == 422 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Adds the cloning-protection finalizer. The API server refuses new finalizers on an object
/// being deleted, so once this succeeds the source stays until the finalizer is removed.
async fn protect_source(claims: &Api<PersistentVolumeClaim>, name: &str) -> Result<(), ClaimError> {
    let source = claims.get(name).await?;
    let finalizers = source.metadata.finalizers.clone().unwrap_or_default();
    if finalizers.iter().any(|f| f == keys::CLONE_PROTECTION_FINALIZER) {
        return Ok(());
    }
    let mut wanted = finalizers.clone();
    wanted.push(keys::CLONE_PROTECTION_FINALIZER.to_owned());
    // Test-and-set on the whole list, so a concurrent change of the finalizers is not lost.
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        { "op": "test", "path": "/metadata/uid", "value": source.metadata.uid },
        { "op": if source.metadata.finalizers.is_some() { "replace" } else { "add" }, "path": "/metadata/finalizers", "value": wanted },
        { "op": "test", "path": "/metadata/resourceVersion", "value": source.metadata.resource_version },
    ]))
    .map_err(|e| ClaimError::Api(kube::Error::SerdeError(e)))?;
    claims.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch)).await?;
    Ok(())
}

async fn copy_protected(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    pool: &Arc<PoolRoot>,
    source: &VolumeDirName,
    target: &VolumeDirName,
) -> Result<Created, ClaimError> {
    let node = VolumeDirName::new(&ctx.me.node).map_err(|e| ClaimError::Pool(e.into()))?;
    let started = Instant::now();
    let (pool, source_dir, target_dir) = (pool.clone(), source.clone(), target.clone());
    let report = tokio::task::spawn_blocking(move || pool.clone_volume(&source_dir, &target_dir, &node))
        .await
        .map_err(|e| {
            ClaimError::Pool(PoolError::Io {
                op: "run the copy",
                path: target.as_str().into(),
                source: if e.is_cancelled() { rustix::io::Errno::CANCELED } else { rustix::io::Errno::IO },
            })
        })?
        .map_err(|error| ClaimError::Clone { source_dir: source.as_str().to_owned(), error })?;
    tracing::info!(
        claim = %claim_name(claim),
        from = %source,
        to = %target,
        method = report.method.as_str(),
        created = ?report.created,
        reflinked = report.reflinked,
        byte_copied = report.byte_copied,
        bytes = report.bytes,
        elapsed = ?started.elapsed(),
        "cloned volume"
    );
    Ok(report.created)
}

fn claim_name(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

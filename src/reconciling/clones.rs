//! The copy a planned clone makes (`deciding::provision`, `MakeVolume::Clone`), under the source
//! claim's cloning-protection finalizer, and the source's own look at that finalizer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;

use crate::deciding::clone;
use crate::error::ClaimError;
use crate::filesystem::{Created, PoolError, PoolRoot, VolumeDirName};
use crate::keys;
use crate::reconciling::claim_actions::claim_key;
use crate::reconciling::context::Context;

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
        claim = %claim_key(claim),
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

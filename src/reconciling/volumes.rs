//! The volume reconciler: when a PV of this node is released under the Delete policy, remove its
//! directory (safely, DESIGN.md section 6) and then the PV.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume};
use kube::Resource;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::controller::Action;

use crate::deciding::volume::{VolumeDecision, decide_volume};
use crate::error::{Retry, VolumeError, reason};
use crate::filesystem::{Trashed, VolumeDirName};
use crate::reconciling::context::{Context, MAX_RETRY};
use crate::serving::metrics::Metrics;

/// Reconciles one PV.
pub async fn reconcile(pv: Arc<PersistentVolume>, ctx: Arc<Context>) -> Result<Action, VolumeError> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let hostname = ctx.my_hostname().await;
    match decide_volume(&pv, &ctx.me, &hostname, &ctx.config.pools) {
        VolumeDecision::Ignore(why) => {
            tracing::trace!(pv = %name, ?why, "nothing to do");
            ctx.reset_retry(&name);
            Ok(Action::await_change())
        }
        VolumeDecision::Refuse(refusal) => {
            tracing::warn!(pv = %name, %refusal, "refusing to delete");
            ctx.metrics.refused_paths.inc();
            Metrics::outcome(&ctx.metrics.deletions, "refused", "unsafe_path");
            ctx.warn(&pv_ref(&pv), reason::VOLUME_FAILED_DELETE, "Delete", refusal.to_string()).await;
            Ok(Action::await_change())
        }
        VolumeDecision::Delete(_) => {
            // The cache may be stale: decide again on the live object (as the Go build does).
            let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
            let Some(live) = api.get_opt(&name).await? else {
                return Ok(Action::await_change());
            };
            let VolumeDecision::Delete(accepted) = decide_volume(&live, &ctx.me, &hostname, &ctx.config.pools) else {
                return Ok(Action::await_change());
            };
            let started = Instant::now();
            let pool =
                ctx.pools.usable(&accepted.pool).ok_or_else(|| VolumeError::UnknownPool(accepted.pool.clone()))??;
            let dir = VolumeDirName::new(&accepted.dir_name).map_err(|e| VolumeError::Pool(e.into()))?;
            // Fast reclaim: the rename frees the volume at once; the data goes in the background.
            let trashed = pool.move_to_trash(&dir)?;
            let preconditions = Preconditions { uid: live.metadata.uid.clone(), resource_version: None };
            match api.delete(&name, &DeleteParams { preconditions: Some(preconditions), ..Default::default() }).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            let path = pool.path().join(dir.as_str());
            match trashed {
                Trashed::Moved(entry) => {
                    tracing::info!(pv = %name, path = %path.display(), trash = %entry, "deleted volume; data is removed in the background");
                    ctx.purge.notify_one();
                }
                Trashed::Unlinked => {
                    tracing::info!(pv = %name, path = %path.display(), "volume was not a directory; unlinked it and deleted the PV")
                }
                Trashed::AlreadyGone => {
                    tracing::info!(pv = %name, path = %path.display(), "directory already gone; deleted PV")
                }
            }
            ctx.metrics.delete_seconds.observe(started.elapsed().as_secs_f64());
            Metrics::outcome(&ctx.metrics.deletions, "success", "none");
            ctx.reset_retry(&name);
            if let Some(uid) = live.metadata.uid.as_deref() {
                ctx.forget_warnings(uid);
            }
            Ok(Action::await_change())
        }
    }
}

/// Decides when to retry after an error, and reports it on the PV.
pub fn error_policy(pv: Arc<PersistentVolume>, error: &VolumeError, ctx: Arc<Context>) -> Action {
    let name = pv.metadata.name.clone().unwrap_or_default();
    Metrics::outcome(&ctx.metrics.deletions, "error", error.metric_label());
    let delay = match error.retry() {
        Retry::Backoff => ctx.next_retry(&name),
        Retry::AfterChange => MAX_RETRY,
    };
    tracing::warn!(pv = %name, %error, retry_in = ?delay, "deleting volume failed");
    let regarding = pv_ref(&pv);
    let note = format!("failed to delete volume: {error}");
    let reason = error.reason();
    tokio::spawn(async move { ctx.warn(&regarding, reason, "Delete", note).await });
    Action::requeue(delay)
}

fn pv_ref(pv: &PersistentVolume) -> ObjectReference {
    pv.object_ref(&())
}

//! The volume reconciler: when a PV of this node is released under the Delete policy, remove its
//! directory (safely: the deletion rules of `docs/architecture.md`) and then the PV. For every-node
//! volumes, keep this node's copy in step with the PV: created while it lives, removed when it
//! goes, with this node's finalizer holding the PV until its copy is gone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::Action;

use crate::deciding::deletion::{
    LetGo, LetGoAnswer, NotInPlace, StagedFate, WhenNotInPlace, fate_after_answer, fate_after_confirm, how_to_let_go,
    when_not_in_place,
};
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout::{self, AcceptedPath};
use crate::deciding::node_affinity::{self, AffinityLabel, duplicate, duplicate::WhenPinnedMissing};
use crate::deciding::volume::{DeleteRefusal, Ignore, VolumeDecision, VolumeShape, decide_volume, volume_shape};
use crate::error::{Retry, VolumeError, reason};
use crate::filesystem::{Created, PoolRoot, Staged, Trashed, VolumeDirName};
use crate::keys;
use crate::reconciling::context::{Context, MAX_RETRY};
use crate::reconciling::settling;
use crate::serving::metrics::{Metrics, VolumeClass};

/// How often the node that speaks for a terminating every-node PV looks again at the nodes
/// whose copies hold it.
const WAITING_RECHECK: Duration = Duration::from_secs(60);

/// How soon a PV whose volume another node holds staged is looked at again (that node settles
/// the volume within a minute, or at its next start).
const STAGED_ELSEWHERE_RECHECK: Duration = Duration::from_secs(5);

/// How soon a PV whose pool no node serves is looked at again.
const NOT_SERVED_RECHECK: Duration = Duration::from_secs(300);

/// How soon a label-pinned PV kept because other live nodes carry its value is looked at again.
const DUPLICATE_RECHECK: Duration = Duration::from_secs(30);

/// When a PV whose deletion the API server refused (it changed since it was read) is looked at
/// again if no event brought its new state by then.
const CHANGED_RECHECK: Duration = Duration::from_secs(30);

/// How soon a released Block PV whose device is still open is looked at again.
const BLOCK_DEVICE_RECHECK: Duration = Duration::from_secs(10);

/// Whether a released Block PV's device is released, so that its directory may go.
async fn block_released(ctx: &Context, pv: &KeptVolume) -> Result<bool, VolumeError> {
    match crate::reconciling::block_volumes::release_for_deletion(ctx, pv).await {
        Ok(crate::reconciling::block_volumes::Release::Done) => Ok(true),
        Ok(crate::reconciling::block_volumes::Release::Waiting) => Ok(false),
        Err(error) => {
            ctx.metrics.library.delete_failed(&library_labels(pv));
            Err(error)
        }
    }
}

/// Reconciles one PV.
pub async fn reconcile(pv: Arc<KeptVolume>, ctx: Arc<Context>) -> Result<Action, VolumeError> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    // The watch cache shows the PV now: a volume this node was making counts from the cache from
    // here on. Its reservation goes, or it would count again once the PV is deleted (for up to
    // deciding::reservations::RESERVATION_TTL), holding room no volume uses.
    ctx.reservations.lock().unwrap_or_else(|e| e.into_inner()).release(&name);
    let hostname = ctx.my_hostname().await;
    let live = match volume_shape(&pv, &ctx.config.pools) {
        VolumeShape::Node => Vec::new(),
        VolumeShape::Shared | VolumeShape::EveryNode => ctx.live_nodes().await?,
    };
    let decision = decide_volume(&pv, &ctx.me, &hostname, &ctx.config.pools, &live);
    if crate::deciding::volume::is_block(&pv) {
        crate::reconciling::block_volumes::after_release(&ctx, &pv, &decision, &hostname).await;
    }
    let action = match decision {
        VolumeDecision::Ignore(Ignore::ActedOnBy { node, recheck_after }) => {
            tracing::trace!(pv = %name, %node, "another live node acts on it");
            Action::requeue(recheck_after)
        }
        VolumeDecision::Ignore(why) => {
            tracing::trace!(pv = %name, ?why, "nothing to do");
            Action::await_change()
        }
        VolumeDecision::Refuse(refusal @ DeleteRefusal::NoNodeServesPath { .. }) => {
            tracing::warn!(pv = %name, %refusal, "no node serves the volume's pool");
            // Looked at again: a node serving the pool may start later.
            ctx.warn(&pv_ref(&pv), reason::VOLUME_NOT_SERVED, "Serve", refusal.to_string()).await;
            Action::requeue(NOT_SERVED_RECHECK)
        }
        VolumeDecision::Refuse(refusal) => {
            tracing::warn!(pv = %name, %refusal, "refusing to delete");
            let label = match refusal {
                DeleteRefusal::OwnerMismatch { .. } => "owner_mismatch",
                DeleteRefusal::NoHostPath
                | DeleteRefusal::UnsafePath { .. }
                | DeleteRefusal::NoNodeServesPath { .. } => {
                    ctx.metrics.refused_paths.inc();
                    "unsafe_path"
                }
            };
            Metrics::outcome(&ctx.metrics.deletions, "refused", label);
            ctx.metrics.library.delete_failed(&library_labels(&pv));
            ctx.warn(&pv_ref(&pv), reason::VOLUME_FAILED_DELETE, "Delete", refusal.to_string()).await;
            Action::await_change()
        }
        // A Block volume's device node goes and its loop is detached before its directory
        // (the backing-dir annotation, deciding::volume::volume_path) is staged for the trash.
        VolumeDecision::Delete(_) if crate::deciding::volume::is_block(&pv) && !block_released(&ctx, &pv).await? => {
            Action::requeue(BLOCK_DEVICE_RECHECK)
        }
        VolumeDecision::Delete(accepted) => match delete_volume(&ctx, &pv, &accepted).await {
            Ok(action) => action,
            Err(error) => {
                // The library counts every failed deletion attempt of a PV it decided to delete.
                ctx.metrics.library.delete_failed(&library_labels(&pv));
                return Err(error);
            }
        },
        VolumeDecision::EnsureCopy { accepted, add_finalizer } => {
            ensure_copy(&ctx, &pv, &accepted, add_finalizer).await?;
            Action::await_change()
        }
        VolumeDecision::RemoveCopy { accepted, remove_finalizer, report_waiting } => {
            remove_copy(&ctx, &pv, &accepted, remove_finalizer).await?;
            if report_waiting {
                // Who is alive decides whom the PV waits for: look afresh, not at a cached view.
                ctx.membership.invalidate().await;
                let live = ctx.live_nodes().await?;
                report_waiting_copies(&ctx, &pv, &live).await?
            } else {
                Action::await_change()
            }
        }
        VolumeDecision::DropProtection => {
            remove_finalizer(&ctx, &name, keys::PROTECTION_FINALIZER).await?;
            tracing::info!(pv = %name, "retained volume deleted by hand; its data is kept");
            Action::await_change()
        }
        VolumeDecision::KeepCopy => {
            remove_finalizer(&ctx, &name, &layout::copy_finalizer(&ctx.me.node)).await?;
            tracing::info!(pv = %name, "retained volume deleted; this node's copy is kept");
            Action::await_change()
        }
        VolumeDecision::DeleteObject => {
            // Each node's finalizer holds the PV until that node removed its copy.
            delete_pv(&ctx, &name, pv.metadata.uid.clone()).await?;
            tracing::info!(pv = %name, "released every-node volume: deleting the PV; each node removes its copy");
            Action::await_change()
        }
    };
    ctx.reset_retry(&name);
    Ok(action)
}

/// Removes the directory of a released node or shared volume, then its PV, with one request,
/// following the deletion protocol (`deciding::deletion`): the directory is moved aside
/// (staged), the PV let go with the preconditions of the object decided on, and the staged
/// directory committed to the trash or put back by the answer, or kept staged until a lookup of
/// the PV settles it (`reconciling::settling`). The cached object suffices: a PV changed since (an
/// admin switching it to Retain, clearing its claimRef) makes the API server refuse, and the next
/// event decides on the new one.
async fn delete_volume(ctx: &Context, pv: &KeptVolume, accepted: &AcceptedPath) -> Result<Action, VolumeError> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let started = Instant::now();
    let (pool, dir) = pool_and_dir(ctx, accepted)?;
    let node = VolumeDirName::new(&ctx.me.node).map_err(|e| VolumeError::Pool(e.into()))?;
    let pv_name = VolumeDirName::new(name).map_err(|e| VolumeError::Pool(e.into()))?;
    // Refused before anything is let go while the trash cannot take the volume (replaced by a
    // file, a symlink or a mount): the PV stays, with this error as its event.
    pool.ensure_trash()?;
    let _in_flight = ctx.settling.hold(pool.path(), name);
    let path = pool.path().join(dir.as_str());
    // A pathPattern directory is this PV's only while its marker says so: checked before it is
    // moved, and again once moved aside, when a claim taking it over meanwhile has rewritten
    // it; then it goes back (deciding::path_pattern, the model in its tests).
    if accepted.marked {
        pool.check_marked_for(&dir, name)?;
    }
    let staged = match pool.stage_deletion(&node, &pv_name, &dir)? {
        Staged::Moved(staged) if accepted.marked => {
            if let Err(error) = pool.check_staged_marker(&staged) {
                pool.restore_staged(&staged)?;
                return Err(error.into());
            }
            Some(staged)
        }
        Staged::Moved(staged) => Some(staged),
        Staged::Unlinked => {
            tracing::info!(pv = %name, path = %path.display(), "volume was not a directory; unlinked it");
            None
        }
        Staged::AlreadyGone => {
            // Another live node carrying a label-pinned volume's value may have the disk: its
            // data would be stranded if this node took "not here" for "deleted".
            if let Some(label) = node_affinity::pinned_label(pv) {
                let carriers = live_carriers(ctx, &label).await?;
                if let WhenPinnedMissing::Wait { others } =
                    duplicate::when_pinned_missing(&ctx.me.node, carriers.iter().map(String::as_str))
                {
                    let note = duplicate::duplicate_note(&ctx.me.node, &label.annotation(), &others);
                    tracing::warn!(pv = %name, others = ?others, "{note}");
                    ctx.metrics.duplicate_affinity_labels.inc();
                    ctx.warn(&pv_ref(pv), reason::DUPLICATE_AFFINITY_LABEL, "Delete", note).await;
                    return Ok(Action::requeue(DUPLICATE_RECHECK));
                }
            }
            // Another node of a shared pool may hold it staged, and put it back if its PV stays:
            // the PV goes only when no node can bring the directory back.
            let seen = NotInPlace {
                staged_by_a_node: pool.staged_by_any_node(&pv_name)?,
                back_in_place: pool.volume_dir_exists(&dir)?,
            };
            match when_not_in_place(seen) {
                WhenNotInPlace::LetGo => {
                    tracing::info!(pv = %name, path = %path.display(), "directory already gone; deleting the PV");
                    None
                }
                WhenNotInPlace::StageAgain => return Ok(Action::requeue(Duration::from_millis(100))),
                WhenNotInPlace::WaitForTheNodeHoldingIt => {
                    tracing::info!(pv = %name, path = %path.display(), "a node holds the volume staged for deletion; it settles it, looking again later");
                    return Ok(Action::requeue(STAGED_ELSEWHERE_RECHECK));
                }
            }
        }
    };
    let let_go = how_to_let_go(pv);
    let result = match let_go {
        LetGo::DeleteObject { .. } => delete_pv_as_read(ctx, pv).await,
        LetGo::DropProtection => drop_protection_as_read(ctx, pv).await,
    };
    let answer = match &result {
        Ok(()) => LetGoAnswer::Done,
        Err(kube::Error::Api(status)) => LetGoAnswer::from_status(status.code),
        Err(_) => LetGoAnswer::Unknown,
    };
    if let Some(staged) = &staged {
        let mut fate = fate_after_answer(answer);
        if fate == StagedFate::Confirm {
            fate = fate_after_confirm(settling::confirm_pv(ctx, name).await);
        }
        match fate {
            StagedFate::Commit => match pool.commit_staged(staged) {
                Ok(entry) => {
                    tracing::info!(pv = %name, path = %path.display(), trash = ?entry, "deleted volume; data is removed in the background");
                    ctx.purge.notify_one();
                }
                Err(error) => {
                    // Past the point of no return: the PV is gone. The data waits staged and is
                    // reported until the trash takes it.
                    ctx.settling.pv_gone(pool.path(), name);
                    let bytes = pool.staged_bytes(staged).unwrap_or(0);
                    settling::report_stranded(ctx, &pool, staged, bytes, &error).await;
                }
            },
            StagedFate::Restore => {
                pool.restore_staged(staged).inspect_err(|error| {
                    tracing::error!(pv = %name, staged = %pool.staged_path(staged).display(), %error, "cannot put the volume back; it stays staged (never purged) and is settled every minute");
                })?;
                tracing::debug!(pv = %name, path = %path.display(), ?answer, "volume put back: its PV stays for now");
            }
            StagedFate::Keep | StagedFate::Confirm => {
                tracing::warn!(pv = %name, staged = %pool.staged_path(staged).display(), "not known whether the PV is gone; the volume stays staged (never purged) until the PV is confirmed or known gone");
                ctx.settling.wake.notify_one();
            }
        }
    }
    match (answer, result) {
        (LetGoAnswer::Changed, _) => {
            tracing::info!(pv = %name, "PV changed since it was read; its volume stays and is decided again on the new object");
            return Ok(Action::requeue(CHANGED_RECHECK));
        }
        (LetGoAnswer::Unknown, Err(error)) => return Err(error.into()),
        _ => {}
    }
    // With --pv-finalizer the PV waited for its data: gone now.
    if answer == LetGoAnswer::Done && let_go == (LetGo::DeleteObject { then_drop_protection: true }) {
        remove_finalizer(ctx, name, keys::PROTECTION_FINALIZER).await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    ctx.metrics.delete_seconds.observe(seconds);
    ctx.metrics.library.deleted(&library_labels(pv), seconds);
    Metrics::outcome(&ctx.metrics.deletions, "success", "none");
    if let Some(uid) = pv.metadata.uid.as_deref() {
        ctx.forget_warnings(uid);
        ctx.block_released.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
    Ok(Action::await_change())
}

/// The live nodes whose Node carries `label` (this node included when it does). One GET per
/// live node (the provisioner may only get Nodes, not list them), only when a label-pinned
/// volume's directory is missing: rare, and never on the path of a volume found in place.
async fn live_carriers(ctx: &Context, label: &AffinityLabel) -> Result<Vec<String>, VolumeError> {
    // Who is alive decides whether the PV may go: look afresh, not at a cached view.
    ctx.membership.invalidate().await;
    let live = ctx.live_nodes().await?;
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let mut carriers = Vec::new();
    for node in live {
        let carries = nodes.get_opt(&node.node).await?.is_some_and(|n| {
            n.metadata.labels.as_ref().and_then(|l| l.get(&label.key)).is_some_and(|v| *v == label.value)
        });
        if carries {
            carriers.push(node.node);
        }
    }
    Ok(carriers)
}

/// DELETEs the PV only if it is still exactly the object decided on (uid and resourceVersion).
async fn delete_pv_as_read(ctx: &Context, pv: &KeptVolume) -> Result<(), kube::Error> {
    let api: Api<KeptVolume> = Api::all(ctx.client.clone());
    let preconditions =
        Preconditions { uid: pv.metadata.uid.clone(), resource_version: pv.metadata.resource_version.clone() };
    let params = DeleteParams { preconditions: Some(preconditions), ..Default::default() };
    api.delete(pv.metadata.name.as_deref().unwrap_or_default(), &params).await.map(|_| ())
}

/// Removes our protection finalizer only if the PV is still exactly the object decided on: a
/// patch carrying a resourceVersion is refused (409) when the object has another.
async fn drop_protection_as_read(ctx: &Context, pv: &KeptVolume) -> Result<(), kube::Error> {
    let api: Api<KeptVolume> = Api::all(ctx.client.clone());
    let patch = serde_json::json!({"metadata": {
        "resourceVersion": pv.metadata.resource_version,
        "$deleteFromPrimitiveList/finalizers": [keys::PROTECTION_FINALIZER],
    }});
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch)).await.map(|_| ())
}

/// The usable pool and the validated directory name of an accepted path.
fn pool_and_dir(ctx: &Context, accepted: &AcceptedPath) -> Result<(Arc<PoolRoot>, VolumeDirName), VolumeError> {
    let pool = ctx.pools.usable(&accepted.root).ok_or_else(|| VolumeError::UnknownPool(accepted.pool.clone()))??;
    let dir = VolumeDirName::new(&accepted.dir_name).map_err(|e| VolumeError::Pool(e.into()))?;
    Ok((pool, dir))
}

/// Deletes a PV if it is still the one we decided on (its uid).
async fn delete_pv(ctx: &Context, name: &str, uid: Option<String>) -> Result<(), VolumeError> {
    let api: Api<KeptVolume> = Api::all(ctx.client.clone());
    let preconditions = Preconditions { uid, resource_version: None };
    match api.delete(name, &DeleteParams { preconditions: Some(preconditions), ..Default::default() }).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// This node's copy of a live every-node volume: finalizer first, then the directory, so a copy
/// never exists that the PV does not wait for.
async fn ensure_copy(
    ctx: &Context,
    pv: &KeptVolume,
    accepted: &AcceptedPath,
    add_finalizer: bool,
) -> Result<(), VolumeError> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let (pool, dir) = pool_and_dir(ctx, accepted)?;
    if add_finalizer {
        let patch = serde_json::json!({"metadata": {"finalizers": [layout::copy_finalizer(&ctx.me.node)]}});
        let api: Api<KeptVolume> = Api::all(ctx.client.clone());
        match api.patch(name, &PatchParams::default(), &Patch::Strategic(&patch)).await {
            Ok(_) => {}
            // Gone, or being deleted meanwhile (no new finalizer may join then): the next event
            // says what to do.
            Err(kube::Error::Api(status)) if matches!(status.code, 404 | 409 | 422) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
    if pool.create_volume_dir(&dir, ctx.config.dir_mode)? == Created::New {
        tracing::info!(pv = %name, path = %pool.path().join(dir.as_str()).display(), "created this node's copy of an every-node volume");
    }
    Ok(())
}

/// Removes this node's copy of an every-node volume on its way out, then lets go of the PV.
async fn remove_copy(
    ctx: &Context,
    pv: &KeptVolume,
    accepted: &AcceptedPath,
    has_finalizer: bool,
) -> Result<(), VolumeError> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let (pool, dir) = pool_and_dir(ctx, accepted)?;
    if accepted.marked {
        pool.check_marked_for(&dir, name)?;
    }
    match pool.move_to_trash(&dir)? {
        Trashed::Moved(_) => {
            tracing::info!(pv = %name, path = %pool.path().join(dir.as_str()).display(), "removed this node's copy of an every-node volume");
            ctx.purge.notify_one();
        }
        Trashed::Unlinked | Trashed::AlreadyGone => {}
    }
    if has_finalizer {
        remove_finalizer(ctx, name, &layout::copy_finalizer(&ctx.me.node)).await?;
    }
    Ok(())
}

async fn remove_finalizer(ctx: &Context, pv: &str, finalizer: &str) -> Result<(), VolumeError> {
    let patch = serde_json::json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [finalizer]}});
    let api: Api<KeptVolume> = Api::all(ctx.client.clone());
    match api.patch(pv, &PatchParams::default(), &Patch::Strategic(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The node speaking for a terminating every-node PV says which nodes' copies still hold it,
/// and lets go for nodes whose Node object is gone (their copies went with the machine).
async fn report_waiting_copies(
    ctx: &Context,
    pv: &KeptVolume,
    live: &[crate::deciding::topology::LiveNode],
) -> Result<Action, VolumeError> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let mine = layout::copy_finalizer(&ctx.me.node);
    let prefix = format!("{}/", keys::COPY_FINALIZER_PREFIX);
    let holders: Vec<&str> = pv
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| **f != mine)
        .filter_map(|f| f.strip_prefix(&prefix))
        .collect();
    let live_labels: Vec<String> = live.iter().map(|n| layout::node_label_value(&n.node)).collect();
    let mut waiting = Vec::new();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    for holder in holders {
        if live_labels.iter().any(|l| l == holder) {
            continue; // a live node removes its own copy
        }
        // The finalizer names the node (or a hash of a name too long for a label value).
        match nodes.get_opt(holder).await {
            Ok(None) if layout::is_dns_subdomain(holder) => {
                remove_finalizer(ctx, name, &format!("{prefix}{holder}")).await?;
                tracing::info!(pv = %name, node = holder, "node is gone from the cluster; let go of its copy");
            }
            Ok(_) => waiting.push(holder.to_owned()),
            Err(e) => return Err(e.into()),
        }
    }
    if waiting.is_empty() {
        return Ok(Action::await_change());
    }
    let note = format!(
        "waiting for node(s) {} to remove their copies: their provisioner is not running. The PV goes once each has; a node removed from the cluster is let go",
        waiting.join(", ")
    );
    ctx.warn(&pv_ref(pv), reason::WAITING_FOR_NODES, "Delete", note).await;
    Ok(Action::requeue(WAITING_RECHECK))
}

/// Decides when to retry after an error, and reports it on the PV.
pub fn error_policy(pv: Arc<KeptVolume>, error: &VolumeError, ctx: Arc<Context>) -> Action {
    let name = pv.metadata.name.clone().unwrap_or_default();
    Metrics::outcome(&ctx.metrics.deletions, "error", error.metric_label());
    let delay = match error.retry() {
        Retry::Backoff => ctx.next_retry(&name),
        Retry::AfterChange => MAX_RETRY,
    };
    tracing::warn!(pv = %name, %error, retry_in = ?delay, "volume operation failed");
    let regarding = pv_ref(&pv);
    let note = format!("failed to delete volume: {error}");
    let reason = error.reason();
    tokio::spawn(async move { ctx.warn(&regarding, reason, "Delete", note).await });
    Action::requeue(delay)
}

/// The label the sig-storage library puts on its deletion metrics: the PV's `storageClassName`.
fn library_labels(pv: &KeptVolume) -> VolumeClass {
    VolumeClass { class: pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()).unwrap_or_default().to_owned() }
}

fn pv_ref(pv: &KeptVolume) -> ObjectReference {
    pv.object_ref(&())
}

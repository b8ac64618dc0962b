//! Takes and removes `HostPathSnapshot` copies (`deciding::snapshot`): the node holding the
//! source volume copies it into its pool root's snapshots directory and says so in the
//! snapshot's status; once the snapshot is deleted, that node moves the copy to the trash when
//! no claim still restores from it, then lets the object go.
//!
//! The resource is optional: without its CustomResourceDefinition when the provisioner starts
//! (an install that predates it), snapshots stay off until the next start, and it says so once.
//! Looking again would cost requests at rest, for ever, on every node of a cluster that does
//! not want snapshots.

use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};

use crate::deciding::clone::CopyMethod;
use crate::deciding::copy_room::NoRoomForCopy;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::snapshot::recreation::{CopyRecord, Provenance, annotated, annotations_for, provenance};
use crate::deciding::snapshot::{self, FINALIZER, HostPathSnapshot, SourceState};
use crate::deciding::topology::{self, Acting};
use crate::error::reason;
use crate::filesystem::{PoolError, Trashed, VolumeDirName};
use crate::reconciling::context::Context;
use crate::reconciling::watches;

mod recreation;

/// How soon a snapshot waiting for its source, or a deletion waiting for restores, looks again
/// (neither the source nor the restoring claims wake the snapshot's reconciler).
const RECHECK: Duration = Duration::from_secs(15);

/// A snapshot could not be taken or removed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// An API call failed.
    #[error("Kubernetes API error: {0}")]
    Api(#[from] kube::Error),
    /// The pool refused or failed.
    #[error("{0}")]
    Pool(#[from] PoolError),
    /// The source's pool root is not open on this node.
    #[error("no pool of this node has the root {}", .0.display())]
    UnknownRoot(std::path::PathBuf),
    /// The copy's task ended abnormally.
    #[error("the copy task failed: {0}")]
    Task(String),
    /// A Block source was not copied: its PV's paths, or the file at its backing path, are not
    /// the volume's (or its loops could not be flushed).
    #[error("the source Block volume is not copied: {0}")]
    BlockSource(#[from] crate::error::VolumeError),
    /// The served HostPathSnapshot CRD is an earlier release's: it has no `status.volumeMode`,
    /// which the API server then drops from every write.
    #[error(
        "the HostPathSnapshot CustomResourceDefinition has no status.volumeMode (an earlier release's): apply this release's CRD (docs/upgrading.md); until then this snapshot is not restored"
    )]
    CrdOutdated,
}

/// Whether the API server serves `HostPathSnapshot`s: asked once at start (discovery, which
/// every authenticated client may read), retried on errors for about a minute.
async fn served(ctx: &Context) -> bool {
    use backon::Retryable;
    let version = format!("{}/{}", snapshot::GROUP, snapshot::VERSION);
    let backoff = backon::ExponentialBuilder::default().with_max_delay(Duration::from_secs(16)).with_max_times(6);
    let asked = (|| ctx.client.list_api_group_resources(&version))
        .retry(backoff)
        .when(|error| !matches!(error, kube::Error::Api(status) if status.code == 404))
        .await;
    match asked {
        Ok(list) if list.resources.iter().any(|r| r.name == snapshot::PLURAL) => true,
        Ok(_) | Err(kube::Error::Api(_)) => {
            tracing::info!(
                "the HostPathSnapshot CustomResourceDefinition is not installed: snapshots are off until the provisioner restarts with it (docs/snapshots.md)"
            );
            false
        }
        Err(error) => {
            tracing::warn!(%error, "cannot tell whether HostPathSnapshots are installed: snapshots are off until the provisioner restarts");
            false
        }
    }
}

/// Runs the snapshot controller until `shutdown`.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Clone + Send + Sync + 'static) {
    if !served(&ctx).await {
        return;
    }
    let api = Api::<HostPathSnapshot>::all(ctx.client.clone());
    let reported = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Only the snapshots this node may act on stay in memory (`deciding::snapshot::keep`).
    let (store, writer) = reflector::store::<HostPathSnapshot>();
    let node = ctx.me.node.clone();
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .filter_map(move |event| {
            let keep = |snapshot: &mut HostPathSnapshot| snapshot::keep(snapshot, &node);
            futures::future::ready(watches::retain(event, keep, |_| {}))
        })
        .reflect(writer)
        .applied_objects();
    let listed = store.clone();
    let controller = Controller::for_stream(events, store)
        .with_config(controller::Config::default().concurrency(ctx.config.max_concurrency))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx)
        .for_each(move |result| {
            let reported = reported.clone();
            async move {
                match result {
                    Err(controller::Error::ObjectNotFound(_)) | Ok(_) => {}
                    Err(error) if !reported.swap(true, std::sync::atomic::Ordering::Relaxed) => {
                        tracing::warn!(%error, "cannot watch HostPathSnapshots (is their CustomResourceDefinition installed?); snapshots are off until it is");
                    }
                    Err(error) => tracing::debug!(%error, "snapshot controller"),
                }
            }
        });
    tokio::pin!(controller);
    tokio::select! {
        () = &mut controller => {}
        () = shutdown => {
            // Reconciles start only once the store holds the first list. Without it (no CRD)
            // none is in flight, and the controller would wait for that list for ever instead
            // of ending; with it, the copies in flight finish first.
            if listed.wait_until_ready().now_or_never().is_some() {
                controller.await;
            }
        }
    }
}

async fn reconcile(snap: Arc<HostPathSnapshot>, ctx: Arc<Context>) -> Result<Action, SnapshotError> {
    let Some(dir_name) = snap.dir_name().map(str::to_owned) else { return Ok(Action::await_change()) };
    if snap.metadata.deletion_timestamp.is_some() {
        return remove(&ctx, &snap, &dir_name).await;
    }
    // Made again from a saved copy (a backup, a manifest): the copy it names, or a refusal;
    // never a new copy of today's data under its name.
    match provenance(&snap) {
        Provenance::Own => {}
        Provenance::MadeAgain { copy_uid, node } => return recreation::adopt(&ctx, &snap, &copy_uid, &node).await,
        Provenance::Malformed(why) => {
            say_not_ready(&ctx, &snap, why, Speaker::OneForTheCluster).await?;
            return Ok(Action::await_change());
        }
    }
    if let Some(status) = snap.status.as_ref().filter(|s| s.ready_to_use) {
        if status.node.as_deref() == Some(ctx.me.node.as_str()) {
            recreation::keep_status_mode(&ctx, &snap).await?;
            recreation::keep_mode_annotation(&ctx, &snap).await?;
            recreation::keep_current(&ctx, &snap).await?;
        }
        // A byte copy kept on this node (also one taken before a restart): requests accounting
        // counts it as space promised on its root.
        if status.node.as_deref() == Some(ctx.me.node.as_str())
            && status.method.as_deref() == Some(CopyMethod::Bytes.as_str())
            && let (Some(root), Some(uid)) = (status.pool_root.as_deref(), snap.metadata.uid.as_deref())
        {
            let bytes = status.size_bytes.unwrap_or(0);
            ctx.copies.lock().unwrap_or_else(|e| e.into_inner()).keep(uid, std::path::Path::new(root), bytes);
        }
        return Ok(Action::await_change());
    }
    let namespace = snap.namespace().unwrap_or_default();
    let source_name = snap.spec.source.persistent_volume_claim_name.clone();
    if let Some(why) = snapshot::name_refusal("source claim", &source_name) {
        tracing::warn!(snapshot = %key(&snap), %why, "refusing the snapshot");
        say_not_ready(&ctx, &snap, why, Speaker::OneForTheCluster).await?;
        return Ok(Action::await_change());
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &namespace);
    let claim = claims.get_opt(&source_name).await?;
    let pv_name = claim.as_ref().and_then(|c| c.spec.as_ref()?.volume_name.clone()).filter(|n| !n.is_empty());
    let pv = match pv_name {
        Some(name) => Api::<KeptVolume>::all(ctx.client.clone()).get_opt(&name).await?,
        None => None,
    };
    let hostname = ctx.my_hostname().await;
    match snapshot::source_state(
        &source_name,
        &namespace,
        claim.as_ref(),
        pv.as_ref(),
        &ctx.me,
        &hostname,
        &ctx.config.pools,
    ) {
        SourceState::Elsewhere(_) => Ok(Action::await_change()),
        SourceState::Wait(why) => {
            say_not_ready(&ctx, &snap, why, Speaker::OneForTheCluster).await?;
            Ok(Action::requeue(RECHECK))
        }
        SourceState::Refuse(why) => {
            say_not_ready(&ctx, &snap, why, Speaker::OneForTheCluster).await?;
            Ok(Action::requeue(RECHECK * 4))
        }
        SourceState::Here { root, dir_name: source_dir, marked_for, restore_size, block } => {
            let pool = ctx.pools.usable(&root).ok_or_else(|| SnapshotError::UnknownRoot(root.clone()))??;
            let source = VolumeDirName::new(&source_dir).map_err(PoolError::from)?;
            let target = VolumeDirName::new(&dir_name).map_err(PoolError::from)?;
            let node = VolumeDirName::new(&ctx.me.node).map_err(PoolError::from)?;
            if let Some(pv) = &marked_for {
                pool.check_marked_for(&source, pv)?;
            }
            // A byte copy takes as much room again: it must fit beside the pool's reserve and the
            // other byte copies being made on that disk (deciding::copy_room).
            let uid = snap.metadata.uid.clone().unwrap_or_default();
            let byte_copy = !pool.shares_extents() && !pool.has_snapshot(&target)?;
            if byte_copy {
                let needed = pool.bytes_under(&source_dir)?;
                let reserve = ctx.reserve_of(&root);
                let stats = pool.stats()?;
                let started = ctx.start_copy(&uid, &root, needed, "", stats.available_bytes, stats.go_total_bytes);
                if let Err((free_beyond_reserve, in_flight)) = started {
                    let why = NoRoomForCopy {
                        what: format!("a copy of claim {source_name:?}"),
                        pool: pool.name().to_owned(),
                        root: root.clone(),
                        node: ctx.me.node.clone(),
                        needed,
                        free_beyond_reserve,
                        reserve,
                        in_flight,
                    };
                    say_not_ready(&ctx, &snap, why.to_string(), Speaker::SourceHolder).await?;
                    return Ok(Action::requeue(RECHECK * 4));
                }
            }
            // The finalizer and this node's name first: a deletion from now on finds the node
            // that may hold a copy, even one cut short.
            let mut held = hold(&ctx, &snap, &root, true).await;
            // A Block volume: its file checked to be the volume's, and the writes still in its
            // loop's cache written to it, right before the copy.
            if let (true, Ok(()), Some(pv)) = (block, &held, &pv) {
                held = crate::reconciling::block_volumes::check_and_flush_source(&ctx, &pool, &source, pv)
                    .map_err(SnapshotError::from);
            }
            let copy_name = target.clone();
            let copied = match held {
                Ok(()) => tokio::task::spawn_blocking(move || pool.take_snapshot(&source, &copy_name, &node))
                    .await
                    .map_err(|e| SnapshotError::Task(e.to_string())),
                Err(error) => Err(error),
            };
            // Kept as it stops being in flight (one step): no check in between counts it nowhere.
            {
                let mut copies = ctx.copies.lock().unwrap_or_else(|e| e.into_inner());
                match &copied {
                    Ok(Ok(report)) if report.method == CopyMethod::Bytes => {
                        copies.end_and_keep(&uid, &uid, &root, report.bytes)
                    }
                    _ => copies.end(&uid),
                }
            }
            let report = copied??;
            let taken = now_rfc3339();
            // Whose the copy is, on the copy: what gives it back to this snapshot made again.
            let ns = Api::<Namespace>::all(ctx.client.clone()).get_metadata_opt(&namespace).await?;
            if let (Some(namespace_uid), Some(pool)) =
                (ns.and_then(|n| n.metadata.uid), ctx.pools.usable(&root).and_then(Result::ok))
            {
                let record = CopyRecord {
                    snapshot_uid: uid.clone(),
                    namespace_uid,
                    namespace: namespace.clone(),
                    name: snap.name_any(),
                    taken: taken.clone(),
                    method: report.method.as_str().to_owned(),
                    restore_size: restore_size.clone(),
                    size_bytes: report.bytes,
                    block,
                };
                recreation::write_record(&pool, &target, &record, &snap);
            }
            if block {
                // Information for whoever reads the object; a restore goes by the status.
                let mode =
                    serde_json::json!({ "metadata": { "annotations": { snapshot::VOLUME_MODE_ANNOTATION: "Block" } } });
                api_of(&ctx, &snap).patch(&snap.name_any(), &PatchParams::default(), &Patch::Merge(&mode)).await?;
            }
            let status = serde_json::json!({ "status": {
                "readyToUse": true,
                "node": ctx.me.node,
                "restoreSize": restore_size,
                "method": report.method.as_str(),
                "sizeBytes": report.bytes,
                "creationTime": taken,
                "volumeMode": snapshot::volume_mode_name(block),
                "message": null,
            }});
            api_of(&ctx, &snap).patch_status(&snap.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await?;
            let note = format!(
                "copy of claim {source_name:?} taken on node {} ({}, {} of data)",
                ctx.me.node,
                report.method.as_str(),
                crate::deciding::capacity::format_size(report.bytes)
            );
            tracing::info!(snapshot = %key(&snap), %note, "snapshot ready");
            ctx.normal(&snap.object_ref(&()), reason::SNAPSHOT_READY, "Snapshot", note).await;
            Ok(Action::await_change())
        }
    }
}

/// Names this node and the pool root in the status (not ready yet), then adds the finalizer: a
/// finalizer is never there without the node that removes it, and the copy starts only after
/// both. With `annotate`, the object is annotated with its own copy in the same write
/// (`deciding::snapshot::recreation`); an adoption annotates only once the status is written.
async fn hold(
    ctx: &Context,
    snap: &HostPathSnapshot,
    root: &std::path::Path,
    annotate: bool,
) -> Result<(), SnapshotError> {
    let api = api_of(ctx, snap);
    let name = snap.name_any();
    // The pool root too: the operator keeps that pool's claim while the copy lives.
    let status = serde_json::json!({ "status": {
        "readyToUse": false,
        "node": ctx.me.node,
        "poolRoot": root.display().to_string(),
        "message": "being copied",
    }});
    let now = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await?;
    let uid = now.metadata.uid.clone().unwrap_or_default();
    let annotations = annotate && !annotated(&now, &uid, &ctx.me.node);
    if !now.finalizers().iter().any(|f| f == FINALIZER) || annotations {
        let mut wanted = now.finalizers().to_vec();
        if !wanted.iter().any(|f| f == FINALIZER) {
            wanted.push(FINALIZER.to_owned());
        }
        // Test-and-set on the list read: a concurrent change of the finalizers is a conflict,
        // retried, not lost. The API server refuses a new finalizer on an object being deleted.
        let mut patch =
            serde_json::json!({ "metadata": { "finalizers": wanted, "resourceVersion": now.resource_version() } });
        if annotations {
            let named: serde_json::Map<String, serde_json::Value> =
                annotations_for(&uid, &ctx.me.node).into_iter().map(|(k, v)| (k.to_owned(), v.into())).collect();
            patch["metadata"]["annotations"] = named.into();
        }
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    }
    Ok(())
}

/// Which node says why a snapshot is not ready.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Speaker {
    /// This node holds the source: it alone can tell, whatever its view of the live nodes (a
    /// node just started may not see its own lease yet).
    SourceHolder,
    /// No node holds it (yet): one node for the cluster, ranked by the snapshot.
    OneForTheCluster,
}

/// Says why the snapshot is not ready, in its status and an event.
async fn say_not_ready(
    ctx: &Context,
    snap: &HostPathSnapshot,
    why: String,
    speaker: Speaker,
) -> Result<(), SnapshotError> {
    let uid = snap.metadata.uid.as_deref().unwrap_or_default();
    if speaker == Speaker::OneForTheCluster {
        let live = ctx.live_nodes().await?;
        if matches!(topology::spokesman(uid, &ctx.me.node, &live), Acting::Other { .. }) {
            return Ok(());
        }
    }
    if snap.status.as_ref().and_then(|s| s.message.as_deref()) == Some(why.as_str()) {
        return Ok(());
    }
    tracing::info!(snapshot = %key(snap), %why, "snapshot not taken");
    let status = serde_json::json!({ "status": { "readyToUse": false, "message": why } });
    api_of(ctx, snap).patch_status(&snap.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await?;
    ctx.warn(&snap.object_ref(&()), reason::SNAPSHOT_FAILED, "Snapshot", why).await;
    Ok(())
}

/// A deleted snapshot: the node named in its status moves the copy to the trash once no claim
/// restores from it, then removes the finalizer.
async fn remove(ctx: &Context, snap: &HostPathSnapshot, dir_name: &str) -> Result<Action, SnapshotError> {
    if !snap.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    if snap.status.as_ref().and_then(|s| s.node.as_deref()) != Some(ctx.me.node.as_str()) {
        return Ok(Action::await_change());
    }
    let name = snap.name_any();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &snap.namespace().unwrap_or_default());
    let restoring: Vec<String> = claims
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|claim| snapshot::awaits_restore_of(claim, &name))
        .map(|claim| claim.name_any())
        .collect();
    if !restoring.is_empty() {
        let note = format!("the copy stays until these claims are restored from it: {}", restoring.join(", "));
        ctx.warn(&snap.object_ref(&()), reason::SNAPSHOT_DELETE_WAITING, "Delete", note).await;
        return Ok(Action::requeue(RECHECK));
    }
    let target = VolumeDirName::new(dir_name).map_err(PoolError::from)?;
    for pool_path in &ctx.config.pools {
        let Some(pool) = ctx.pools.usable(&pool_path.root) else { continue };
        let pool = pool?;
        if let Trashed::Moved(entry) = pool.trash_snapshot(&target)? {
            tracing::info!(snapshot = %key(snap), pool = %pool_path.name, root = %pool_path.root.display(), %entry, "snapshot moved to the trash");
            ctx.purge.notify_one();
        }
    }
    if let Some(uid) = snap.metadata.uid.as_deref() {
        ctx.copies.lock().unwrap_or_else(|e| e.into_inner()).forget(uid);
    }
    let wanted: Vec<&String> = snap.finalizers().iter().filter(|f| *f != FINALIZER).collect();
    let patch = serde_json::json!({ "metadata": { "finalizers": wanted, "resourceVersion": snap.resource_version() } });
    match api_of(ctx, snap).patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(Action::await_change()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Action::await_change()),
        Err(error) => Err(error.into()),
    }
}

fn error_policy(snap: Arc<HostPathSnapshot>, error: &SnapshotError, ctx: Arc<Context>) -> Action {
    let key = key(&snap);
    // A write on a copy of the object older than the server's (another writer, or this node's
    // own status write not in the cache yet): look again at once, nothing to report.
    if let SnapshotError::Api(kube::Error::Api(status)) = error
        && status.code == 409
    {
        tracing::debug!(snapshot = %key, "conflict; looking again");
        return Action::requeue(Duration::from_secs(1));
    }
    let delay = ctx.next_retry(&key);
    tracing::warn!(snapshot = %key, %error, retry_in = ?delay, "snapshot failed");
    let regarding = snap.object_ref(&());
    let deleting = snap.metadata.deletion_timestamp.is_some();
    let (reason, note) = match error {
        SnapshotError::CrdOutdated => (reason::SNAPSHOT_CRD_OUTDATED, error.to_string()),
        _ if deleting => (reason::SNAPSHOT_DELETE_WAITING, format!("cannot remove the copy: {error}")),
        _ => (reason::SNAPSHOT_FAILED, format!("cannot take the copy: {error}")),
    };
    tokio::spawn(async move { ctx.warn(&regarding, reason, "Snapshot", note).await });
    Action::requeue(delay)
}

fn api_of(ctx: &Context, snap: &HostPathSnapshot) -> Api<HostPathSnapshot> {
    Api::namespaced(ctx.client.clone(), &snap.namespace().unwrap_or_default())
}

fn key(snap: &HostPathSnapshot) -> String {
    format!("{}/{}", snap.namespace().unwrap_or_default(), snap.name_any())
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

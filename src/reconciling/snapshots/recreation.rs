//! Snapshots made again from a saved copy of themselves (`deciding::snapshot::recreation`): the
//! node the object names finds the copy on its pool roots, gathers whose it is, and either gives
//! it back (renamed to the object's UID, the status rebuilt from the copy's record) or says why
//! not. Also keeps the annotations and the record current on the copies this node holds, so
//! that a backup of any snapshot, taken by this version or an earlier one, can be told apart.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};

use super::{RECHECK, SnapshotError, Speaker, api_of, hold, key, say_not_ready};
use crate::deciding::snapshot::HostPathSnapshot;
use crate::deciding::snapshot::recreation::{
    ADOPT_COPY, Adoption, AdoptionFacts, CopyRecord, FoundAt, adoption, annotated, annotations_for,
};
use crate::error::reason;
use crate::filesystem::{PoolError, PoolRoot, VolumeDirName};
use crate::reconciling::context::Context;

/// A made-again object naming copy `copy_uid` on `node`.
pub(super) async fn adopt(
    ctx: &Context,
    snap: &HostPathSnapshot,
    copy_uid: &str,
    node: &str,
) -> Result<Action, SnapshotError> {
    if node != ctx.me.node {
        let live = ctx.live_nodes().await?;
        if live.iter().any(|n| n.node == node) {
            return Ok(Action::await_change());
        }
        // Nobody can look: one node for the cluster says so, and the object waits.
        let why = format!(
            "made again naming copy {copy_uid} on node {node}, where no provisioner runs now: it waits for that node"
        );
        say_not_ready(ctx, snap, why, Speaker::OneForTheCluster).await?;
        return Ok(Action::requeue(RECHECK * 4));
    }
    let own_uid = snap.metadata.uid.clone().unwrap_or_default();
    let (own, earlier) = (VolumeDirName::new(&own_uid), VolumeDirName::new(copy_uid));
    let (Ok(own), Ok(earlier)) = (own, earlier) else { return Ok(Action::await_change()) };
    let mut found = None;
    for pool_path in &ctx.config.pools {
        let Some(pool) = ctx.pools.usable(&pool_path.root) else { continue };
        let pool = pool?;
        if pool.has_snapshot(&own)? {
            found = Some((pool, pool_path.root.clone(), FoundAt::Own));
        } else if pool.has_snapshot(&earlier)? {
            found = Some((pool, pool_path.root.clone(), FoundAt::Earlier));
        }
        if found.is_some() {
            break;
        }
    }
    let at = found.as_ref().map_or(FoundAt::Nowhere, |(_, _, at)| *at);
    let record = match &found {
        Some((pool, _, at)) => {
            let dir = if *at == FoundAt::Own { &own } else { &earlier };
            pool.snapshot_record(dir)?.as_deref().and_then(CopyRecord::parse)
        }
        None => None,
    };
    let namespace = snap.namespace().unwrap_or_default();
    let siblings = api_of(ctx, snap).list_metadata(&Default::default()).await?;
    let owner_alive = siblings.items.iter().find(|s| s.metadata.uid.as_deref() == Some(copy_uid)).map(|s| s.name_any());
    let ns = Api::<Namespace>::all(ctx.client.clone()).get_metadata_opt(&namespace).await?;
    let namespace_uid = ns.as_ref().and_then(|n| n.metadata.uid.clone()).unwrap_or_default();
    let adopt_annotation = ns.as_ref().and_then(|n| n.annotations().get(ADOPT_COPY).cloned());
    let decision = adoption(&AdoptionFacts {
        snapshot: snap,
        copy_uid,
        found: at,
        record: record.as_ref(),
        owner_alive: owner_alive.as_deref(),
        namespace_uid: &namespace_uid,
        adopt_annotation: adopt_annotation.as_deref(),
    });
    let (Adoption::Adopt(record), Some((pool, root, at))) = (decision.clone(), found) else {
        if let Adoption::Refuse(why) = decision {
            tracing::warn!(snapshot = %key(snap), %why, "a snapshot made again does not get the copy it names");
            say_not_ready(ctx, snap, why, Speaker::SourceHolder).await?;
        }
        return Ok(Action::requeue(RECHECK * 4));
    };
    // This node and the finalizer first, as for a new copy; the annotations stay as they are
    // until the status is written, so a stop in between finds the object made again still.
    hold(ctx, snap, &root, false).await?;
    if at == FoundAt::Earlier && !pool.rename_snapshot(&earlier, &own)? {
        // Gone since it was looked at (its orphan grace ran out): the next pass says so.
        return Ok(Action::requeue(RECHECK));
    }
    let record = CopyRecord { snapshot_uid: own_uid.clone(), ..record };
    write_record(&pool, &own, &record, snap);
    if record.block {
        // Information for whoever reads the object; a restore goes by the status.
        let mode = serde_json::json!({ "metadata": { "annotations": {
            crate::deciding::snapshot::VOLUME_MODE_ANNOTATION: "Block"
        } } });
        api_of(ctx, snap).patch(&snap.name_any(), &PatchParams::default(), &Patch::Merge(&mode)).await?;
    }
    let status = serde_json::json!({ "status": {
        "readyToUse": true,
        "node": ctx.me.node,
        "poolRoot": root.display().to_string(),
        "restoreSize": record.restore_size,
        "method": record.method,
        "sizeBytes": record.size_bytes,
        "creationTime": record.taken,
        "volumeMode": crate::deciding::snapshot::volume_mode_name(record.block),
        "message": null,
    }});
    api_of(ctx, snap).patch_status(&snap.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await?;
    annotate(ctx, snap, &own_uid).await?;
    let note =
        format!("made again: copy {copy_uid}, taken at {}, is this snapshot's again (now {own_uid})", record.taken);
    tracing::info!(snapshot = %key(snap), %note, "snapshot copy given back");
    ctx.normal(&snap.object_ref(&()), reason::SNAPSHOT_READY, "Snapshot", note).await;
    Ok(Action::await_change())
}

/// A ready snapshot this node holds: its annotations name its copy and the copy has its
/// record (copies of earlier versions get both here, once).
pub(super) async fn keep_current(ctx: &Context, snap: &HostPathSnapshot) -> Result<(), SnapshotError> {
    let Some(uid) = snap.metadata.uid.as_deref() else { return Ok(()) };
    if annotated(snap, uid, &ctx.me.node) {
        return Ok(());
    }
    let dir = VolumeDirName::new(uid).map_err(PoolError::from)?;
    let status = snap.status.clone().unwrap_or_default();
    let namespace = snap.namespace().unwrap_or_default();
    let ns = Api::<Namespace>::all(ctx.client.clone()).get_metadata_opt(&namespace).await?;
    for pool_path in &ctx.config.pools {
        let Some(pool) = ctx.pools.usable(&pool_path.root) else { continue };
        let pool = pool?;
        if !pool.has_snapshot(&dir)? || pool.snapshot_record(&dir)?.as_deref().and_then(CopyRecord::parse).is_some() {
            continue;
        }
        let Some(namespace_uid) = ns.as_ref().and_then(|n| n.metadata.uid.clone()) else { continue };
        let record = CopyRecord {
            snapshot_uid: uid.to_owned(),
            namespace_uid,
            namespace: namespace.clone(),
            name: snap.name_any(),
            taken: status.creation_time.clone().unwrap_or_default(),
            method: status.method.clone().unwrap_or_default(),
            restore_size: status.restore_size.clone().unwrap_or_else(|| "0".into()),
            size_bytes: status.size_bytes.unwrap_or(0),
            block: crate::deciding::snapshot::snapshot_is_block(snap),
            // (the status's mode, which only the provisioner writes)
        };
        write_record(&pool, &dir, &record, snap);
    }
    annotate(ctx, snap, uid).await
}

/// A ready snapshot this node holds without `status.volumeMode` (taken by an earlier build):
/// the mode its copy's record says (written by the provisioner on the copy, out of the
/// tenant's reach; no record or none saying Block: Filesystem), written to the status.
pub(super) async fn keep_status_mode(ctx: &Context, snap: &HostPathSnapshot) -> Result<(), SnapshotError> {
    if snap.status.as_ref().is_none_or(|s| s.volume_mode.is_some()) {
        return Ok(());
    }
    let Some(uid) = snap.metadata.uid.as_deref() else { return Ok(()) };
    let dir = VolumeDirName::new(uid).map_err(PoolError::from)?;
    let mut block = false;
    for pool_path in &ctx.config.pools {
        let Some(pool) = ctx.pools.usable(&pool_path.root) else { continue };
        let pool = pool?;
        if pool.has_snapshot(&dir)? {
            block = pool.snapshot_record(&dir)?.as_deref().and_then(CopyRecord::parse).is_some_and(|r| r.block);
            break;
        }
    }
    let mode = crate::deciding::snapshot::volume_mode_name(block);
    let status = serde_json::json!({ "status": { "volumeMode": mode } });
    match api_of(ctx, snap).patch_status(&snap.name_any(), &PatchParams::default(), &Patch::Merge(&status)).await {
        // The API server drops a field its CRD does not have, and answers as if all went well:
        // an earlier release's CRD, not applied again before this release's pods started.
        Ok(written) if written.status.as_ref().is_none_or(|s| s.volume_mode.is_none()) => {
            return Err(SnapshotError::CrdOutdated);
        }
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
        Err(error) => return Err(error.into()),
    }
    tracing::info!(snapshot = %key(snap), mode, "snapshot's volume mode written to its status from its copy's record");
    Ok(())
}

/// A ready snapshot this node holds whose volume-mode annotation someone changed (added,
/// removed, edited): put back as the status says, with an Event. Nothing goes by the
/// annotation; it is kept true only so that whoever reads the object is not misled.
pub(super) async fn keep_mode_annotation(ctx: &Context, snap: &HostPathSnapshot) -> Result<(), SnapshotError> {
    let Some(wanted) = crate::deciding::snapshot::mode_annotation_fix(snap) else { return Ok(()) };
    let key_name = crate::deciding::snapshot::VOLUME_MODE_ANNOTATION;
    let patch = serde_json::json!({ "metadata": { "annotations": { key_name: wanted } } });
    match api_of(ctx, snap).patch(&snap.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
        Err(error) => return Err(error.into()),
    }
    let mode = crate::deciding::snapshot::volume_mode_name(wanted.is_some());
    let note = format!(
        "annotation {key_name} put back: this is a copy of a volumeMode {mode} volume (status.volumeMode, written by the provisioner); a restore goes by the status, never by the annotation"
    );
    tracing::warn!(snapshot = %key(snap), %note, "snapshot volume-mode annotation was changed");
    ctx.warn(&snap.object_ref(&()), reason::SNAPSHOT_MODE_ANNOTATION_RESTORED, "Snapshot", note).await;
    Ok(())
}

/// Records on a copy whose it is. A copy without a record is only never given back to an
/// object made again: said in the log, not failed.
pub(super) fn write_record(pool: &PoolRoot, dir: &VolumeDirName, record: &CopyRecord, snap: &HostPathSnapshot) {
    if let Err(error) = pool.set_snapshot_record(dir, &record.to_xattr()) {
        tracing::warn!(snapshot = %key(snap), %error, "cannot record whose the snapshot copy is: a snapshot made again from a backup of this one will not get it back");
    }
}

/// Names the object's own copy on it.
async fn annotate(ctx: &Context, snap: &HostPathSnapshot, uid: &str) -> Result<(), SnapshotError> {
    let annotations: serde_json::Map<String, serde_json::Value> =
        annotations_for(uid, &ctx.me.node).into_iter().map(|(k, v)| (k.to_owned(), v.into())).collect();
    let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
    match api_of(ctx, snap).patch(&snap.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error.into()),
    }
}

//! Directories without a PV.
//!
//! At start-up, an *empty* directory named in our layout, with neither a PV nor a claim of its
//! UID, is removed: a crash between creating a volume directory and its PV left it, and removal
//! is a plain rmdir, which fails on a non-empty one. A directory *with data* and no PV (its PV was
//! deleted by hand, `kubectl delete pv`, or by another tool) is never removed: it is reported, at
//! start-up and when this node sees one of its PVs deleted while the directory still holds data,
//! with a log line, a Warning on the Node and the bytes in `orphaned_volume_bytes`.

use std::collections::HashSet;

use kube::api::Api;

use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout;
use crate::deciding::volume::{VolumeDecision, decide_volume};
use crate::error::reason;
use crate::filesystem::{PoolError, PoolRoot, VolumeDirName};
use crate::reconciling::context::Context;
use crate::serving::metrics::PoolLabel;

/// On a shared pool, another node may be between creating a directory and its PV for a claim
/// this node has not seen yet: only directories untouched for this long count as orphans there.
const SHARED_ORPHAN_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes empty orphan directories in every pool. Errors are logged, never fatal.
pub async fn remove_orphan_directories(ctx: &Context) {
    let pvs: Api<KeptVolume> = Api::all(ctx.client.clone());
    for pool_path in &ctx.config.pools {
        let pool_name = pool_path.name.as_str();
        let Some(Ok(pool)) = ctx.pools.usable(&pool_path.root) else { continue };
        let entries = match pool.list_entries() {
            Ok(entries) => entries,
            Err(error) => {
                tracing::warn!(pool = %pool_name, %error, "cannot list pool for orphan cleanup");
                continue;
            }
        };
        let mut orphans = Vec::new();
        // Snapshot claims only after listing: a directory being provisioned right now belongs to
        // a claim that was already in the store when its directory was made.
        let mut claim_uids: HashSet<String> =
            ctx.claims.state().iter().filter_map(|c| c.metadata.uid.clone()).collect();
        // Claims placed on another node are in the compact record, not the cache.
        claim_uids.extend(ctx.waiting().uids());
        for entry in entries {
            let Some(uid) = layout::uid_of_dir(&entry) else { continue };
            // A claim without its PV is either being provisioned (its directory still empty) or
            // lost its PV by hand: only the latter holds data, and only a local pool's can be told
            // apart safely (a shared one's claim may be another node's work in progress).
            if claim_uids.contains(uid) && (pool_path.shared || pool.bytes_under(&entry).unwrap_or(0) == 0) {
                continue;
            }
            match pvs.get_opt(&layout::pv_name(uid)).await {
                Ok(None) => {}
                Ok(Some(_)) => continue,
                Err(error) => {
                    tracing::warn!(%error, "cannot check PVs for orphan cleanup; skipping it");
                    return;
                }
            }
            let Ok(dir) = VolumeDirName::new(&entry) else { continue };
            if pool_path.shared && !matches!(pool.entry_age(&dir), Ok(Some(age)) if age >= SHARED_ORPHAN_AGE) {
                continue;
            }
            match pool.remove_empty_volume_dir(&dir) {
                Ok(()) => {
                    tracing::info!(pool = %pool_name, dir = %entry, "removed empty directory with no claim and no PV")
                }
                Err(PoolError::VolumeNotEmpty { .. }) => orphans.push(entry.clone()),
                Err(error) => {
                    tracing::info!(pool = %pool_name, dir = %entry, %error, "kept directory with no claim and no PV")
                }
            }
        }
        report_orphans(ctx, &pool, &orphans).await;
    }
}

/// After this node's PV `pv` was deleted: if its directory still holds data, the PV was not
/// deleted by us (we empty the path before deleting a PV) and the data is now nobody's.
pub async fn check_deleted_volume(ctx: &Context, pv: &KeptVolume) {
    let hostname = ctx.my_hostname().await;
    let mut released = pv.clone();
    // Decide as if it were released for deletion, to get the path this node would own.
    released.metadata.deletion_timestamp = None;
    let status = released.status.get_or_insert_with(Default::default);
    status.phase = Some("Released".into());
    let spec = released.spec.get_or_insert_with(Default::default);
    spec.persistent_volume_reclaim_policy = Some("Delete".into());
    let VolumeDecision::Delete(accepted) = decide_volume(&released, &ctx.me, &hostname, &ctx.config.pools, &[]) else {
        return;
    };
    // A Block volume's node and loop go with its PV; its file stays, reported below.
    if crate::deciding::volume::is_block(pv) {
        crate::reconciling::block_volumes::release_without_pv(ctx, pv);
    }
    let Some(Ok(pool)) = ctx.pools.usable(&accepted.root) else { return };
    // A pathPattern directory taken over by a newer claim is that claim's, not an orphan.
    if accepted.marked
        && let Ok(dir) = crate::filesystem::VolumeDirName::new(&accepted.dir_name)
        && pool.check_marked_for(&dir, pv.metadata.name.as_deref().unwrap_or_default()).is_err()
    {
        return;
    }
    if pool.bytes_under(&accepted.dir_name).unwrap_or(0) > 0 {
        report_orphans(ctx, &pool, &[accepted.dir_name]).await;
    }
}

/// Logs, counts and tells the Node about directories with data and no PV.
async fn report_orphans(ctx: &Context, pool: &PoolRoot, dirs: &[String]) {
    if dirs.is_empty() {
        return;
    }
    let mut total = 0;
    for dir in dirs {
        let bytes = pool.bytes_under(dir).unwrap_or(0);
        total += bytes;
        tracing::warn!(pool = %pool.name(), %dir, bytes, "directory holds data but has no PV (deleted by hand?); kept");
    }
    let label = PoolLabel::new(pool.name(), pool.path());
    ctx.metrics.orphaned_volume_bytes.get_or_create(&label).inc_by(total as i64);
    let shown: Vec<&str> = dirs.iter().take(10).map(String::as_str).collect();
    let note = format!(
        "{} director{} in pool {} ({}) hold data ({}) but have no PV: {}{}. Their PVs were deleted by hand or by another \
         tool. Nothing was removed: re-create the PV to use the data, or remove the directories",
        dirs.len(),
        if dirs.len() == 1 { "y" } else { "ies" },
        pool.name(),
        pool.path().display(),
        crate::deciding::capacity::format_size(total),
        shown.join(", "),
        if dirs.len() > shown.len() { ", ..." } else { "" },
    );
    match ctx.node_ref().await {
        Ok(node) => ctx.warn(&node, reason::ORPHANED_VOLUME, "Delete", note).await,
        Err(error) => tracing::warn!(%error, "cannot read this node's Node object to report on it"),
    }
}

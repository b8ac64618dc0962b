//! Finds snapshot copies whose `HostPathSnapshot` is gone on this node's roots, reports them and
//! moves them to the trash after their grace period (`deciding::snapshot_copies`). Runs whether
//! or not the resource is installed (a CRD deleted with its objects leaves copies behind), and
//! costs nothing at rest: the API is asked only while a root holds copies.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::{Api, ListParams};

use crate::deciding::snapshot::HostPathSnapshot;
use crate::deciding::snapshot_copies::{SweepPlan, plan_sweep};
use crate::error::reason;
use crate::filesystem::{Trashed, VolumeDirName};
use crate::reconciling::context::Context;
use crate::serving::metrics::PoolLabel;

/// Most time between two sweeps (a shorter grace sweeps more often, so that a copy goes about
/// when its grace ends).
const MOST_BETWEEN_SWEEPS: Duration = Duration::from_secs(300);

/// Snapshots listed per request.
const PAGE: u32 = 500;

/// Sweeps this node's roots for copies without a snapshot, for ever.
pub async fn sweep(ctx: Arc<Context>) {
    let grace = ctx.config.orphan_snapshot_copy_grace;
    let every = (grace / 4).clamp(Duration::from_secs(1), MOST_BETWEEN_SWEEPS);
    let clock = Instant::now();
    let mut unowned_since: HashMap<PathBuf, BTreeMap<String, u64>> = HashMap::new();
    loop {
        tokio::time::sleep(every).await;
        // Listed once a pass, after the disks, and only when some root holds copies.
        let mut snapshots: Option<Option<BTreeSet<String>>> = None;
        for pool_path in &ctx.config.pools {
            let Some(Ok(pool)) = ctx.pools.usable(&pool_path.root) else { continue };
            let label = PoolLabel::new(&pool_path.name, &pool_path.root);
            let listed = tokio::task::spawn_blocking({
                let pool = pool.clone();
                move || pool.snapshot_copies()
            })
            .await;
            let on_disk = match listed {
                Ok(Ok(uids)) => uids,
                Ok(Err(error)) => {
                    tracing::warn!(pool = %pool_path.name, %error, "cannot list the snapshot copies");
                    continue;
                }
                Err(error) => {
                    tracing::error!(%error, "snapshot copy listing task failed");
                    continue;
                }
            };
            if on_disk.is_empty() {
                unowned_since.remove(&pool_path.root);
                ctx.metrics.orphaned_snapshot_copies.get_or_create(&label).set(0);
                continue;
            }
            if snapshots.is_none() {
                snapshots = Some(snapshot_uids(&ctx).await);
            }
            let seen = unowned_since.entry(pool_path.root.clone()).or_default();
            let now = clock.elapsed().as_secs();
            let plan = plan_sweep(&on_disk, snapshots.as_ref().and_then(Option::as_ref), seen, now, grace);
            carry_out(&ctx, &pool, &plan, grace).await;
            let waiting = unowned_since.get(&pool_path.root).map_or(0, BTreeMap::len);
            ctx.metrics.orphaned_snapshot_copies.get_or_create(&label).set(waiting as i64);
        }
    }
}

/// Every `HostPathSnapshot` UID of the cluster; empty without the resource (its objects went
/// with it); `None` when they cannot be listed, and nothing is decided.
async fn snapshot_uids(ctx: &Context) -> Option<BTreeSet<String>> {
    let api = Api::<HostPathSnapshot>::all(ctx.client.clone());
    let mut uids = BTreeSet::new();
    let mut params = ListParams::default().limit(PAGE);
    loop {
        let page = match api.list_metadata(&params).await {
            Ok(page) => page,
            Err(kube::Error::Api(status)) if status.code == 404 => return Some(BTreeSet::new()),
            Err(error) => {
                tracing::warn!(%error, "cannot list the HostPathSnapshots: snapshot copies without one are not looked for this time");
                return None;
            }
        };
        uids.extend(page.items.into_iter().filter_map(|s| s.metadata.uid));
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Some(uids),
        }
    }
}

async fn carry_out(ctx: &Context, pool: &Arc<crate::filesystem::PoolRoot>, plan: &SweepPlan, grace: Duration) {
    let copies = pool.path().join(crate::filesystem::SNAPSHOTS_DIR);
    for uid in &plan.newly_unowned {
        let copy = copies.join(uid);
        tracing::warn!(pool = %pool.name(), copy = %copy.display(), ?grace, "snapshot copy without its HostPathSnapshot");
        let note = format!(
            "the snapshot copy {} on node {} has no HostPathSnapshot any more (its finalizer was removed, or its \
             status named another node, or the resource was deleted): it goes to the trash in {}; copy its data \
             out before then if it is still wanted",
            copy.display(),
            ctx.me.node,
            jiff::SignedDuration::try_from(grace).map_or_else(|_| format!("{grace:?}"), |d| format!("{d:#}")),
        );
        report(ctx, reason::SNAPSHOT_COPY_ORPHANED, note, true).await;
    }
    for uid in &plan.trash {
        let copy = copies.join(uid);
        let Ok(name) = VolumeDirName::new(uid) else { continue };
        let moved = tokio::task::spawn_blocking({
            let pool = pool.clone();
            move || pool.trash_snapshot(&name)
        })
        .await;
        match moved {
            Ok(Ok(Trashed::Moved(_))) => {
                ctx.copies.lock().unwrap_or_else(|e| e.into_inner()).forget(uid);
                ctx.purge.notify_one();
                tracing::info!(pool = %pool.name(), copy = %copy.display(), "moved a snapshot copy without its snapshot to the trash");
                let note = format!(
                    "the snapshot copy {} on node {}, without a HostPathSnapshot since its grace began, was moved to the trash",
                    copy.display(),
                    ctx.me.node
                );
                report(ctx, reason::SNAPSHOT_COPY_REMOVED, note, false).await;
            }
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::warn!(pool = %pool.name(), copy = %copy.display(), %error, "cannot move a snapshot copy without its snapshot to the trash");
                let note = format!(
                    "the snapshot copy {} without its HostPathSnapshot cannot be moved to the trash: {error}",
                    copy.display()
                );
                report(ctx, reason::SNAPSHOT_COPY_ORPHANED, note, true).await;
            }
            Err(error) => tracing::error!(%error, "snapshot copy removal task failed"),
        }
    }
}

/// An Event on this node's Node object: the copy's snapshot is gone, the node is what remains.
async fn report(ctx: &Context, reason: &str, note: String, warning: bool) {
    match ctx.node_ref().await {
        Ok(node) if warning => ctx.warn(&node, reason, "Delete", note).await,
        Ok(node) => ctx.normal(&node, reason, "Delete", note).await,
        Err(error) => tracing::warn!(%error, "cannot read this node's Node object to report on it"),
    }
}

//! Volumes this node left staged for deletion whose fate is not settled (`deciding::deletion`):
//! an answer lost on the network, a crash between staging and the answer, or a PV gone while the
//! trash cannot take its volume (stranded). At start-up and then every minute, each is looked
//! at: committed to the trash once its PV is known gone, put back once it is known to exist,
//! kept staged (never purged) while nobody knows. A stranded volume is reported where an admin
//! looks (an event on this node's Node object with its path and size, a gauge, `doctor`) and
//! goes to the trash as soon as the trash can take it again, without a restart.
//!
//! Idle cost: a look at the staging directories on local disk; API requests only for volumes
//! staged there.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};

use crate::deciding::deletion::{Confirmed, StagedFate, fate_after_confirm};
use crate::deciding::kept_volume::KeptVolume;
use crate::error::reason;
use crate::filesystem::{PoolRoot, StagedVolume, VolumeDirName};
use crate::reconciling::context::Context;
use crate::serving::metrics::PoolLabel;

/// How often staged volumes are looked at without being woken.
const SETTLE_INTERVAL: Duration = Duration::from_secs(60);

/// Settles staged volumes at once and then every minute (or when woken), for as long as the
/// process runs.
pub async fn keep_settling(ctx: Arc<Context>) {
    loop {
        let _ = tokio::time::timeout(SETTLE_INTERVAL, ctx.settling.wake.notified()).await;
        settle(&ctx).await;
    }
}

/// One pass over every pool's volumes this node holds staged.
pub async fn settle(ctx: &Context) {
    let Ok(node) = VolumeDirName::new(&ctx.me.node) else { return };
    for pool_path in &ctx.config.pools {
        let (pool_name, root) = (pool_path.name.as_str(), pool_path.root.as_path());
        let Some(Ok(pool)) = ctx.pools.usable(root) else { continue };
        let staged = match pool.staged_deletions(&node) {
            Ok(staged) => staged,
            Err(error) => {
                tracing::warn!(pool = pool_name, %error, "cannot list volumes staged for deletion; they stay where they are");
                continue;
            }
        };
        let mut waiting = 0;
        let mut stranded_bytes = 0;
        for staged in staged {
            if ctx.settling.is_in_flight(root, staged.pv.as_str()) {
                continue;
            }
            match settle_one(ctx, &pool, &staged).await {
                Settled::Done => ctx.settling.forget(root, staged.pv.as_str()),
                Settled::Waiting => waiting += 1,
                Settled::Stranded(bytes) => {
                    waiting += 1;
                    stranded_bytes += bytes;
                }
            }
        }
        let label = PoolLabel::new(pool_name, root);
        ctx.metrics.staged_volumes.get_or_create(&label).set(waiting);
        ctx.metrics.stranded_volume_bytes.get_or_create(&label).set(i64::try_from(stranded_bytes).unwrap_or(i64::MAX));
    }
}

enum Settled {
    Done,
    Waiting,
    /// Its PV is gone but the trash cannot take it: this many bytes wait.
    Stranded(u64),
}

async fn settle_one(ctx: &Context, pool: &PoolRoot, staged: &StagedVolume) -> Settled {
    let pool_name = pool.name();
    let fate = if ctx.settling.known_gone(pool.path(), staged.pv.as_str()) {
        StagedFate::Commit
    } else {
        fate_after_confirm(confirm_pv(ctx, staged.pv.as_str()).await)
    };
    let place = pool.volume_path(&staged.dir);
    match fate {
        StagedFate::Commit => match pool.commit_staged(staged) {
            Ok(entry) => {
                tracing::info!(pool = pool_name, pv = %staged.pv, path = %place.display(), trash = ?entry, "PV gone: staged volume moved to the trash");
                ctx.purge.notify_one();
                Settled::Done
            }
            Err(error) => {
                ctx.settling.pv_gone(pool.path(), staged.pv.as_str());
                let bytes = pool.staged_bytes(staged).unwrap_or(0);
                report_stranded(ctx, pool, staged, bytes, &error).await;
                Settled::Stranded(bytes)
            }
        },
        StagedFate::Restore => match pool.restore_staged(staged) {
            Ok(()) => {
                tracing::info!(pool = pool_name, pv = %staged.pv, path = %place.display(), "PV still there: staged volume put back");
                Settled::Done
            }
            Err(error) => {
                tracing::error!(pool = pool_name, pv = %staged.pv, staged = %pool.staged_path(staged).display(), %error, "cannot put a staged volume back; it stays staged, never purged");
                Settled::Waiting
            }
        },
        StagedFate::Keep | StagedFate::Confirm => Settled::Waiting,
    }
}

/// Confirms that PV `name` exists with a request that gives it a new resourceVersion (an
/// annotation saying when its volume was last kept), so that any node which decided to let it go
/// on an older view has its request refused (`deciding::deletion`, [`StagedFate::Confirm`]).
pub async fn confirm_pv(ctx: &Context, name: &str) -> Confirmed {
    let api: Api<KeptVolume> = Api::all(ctx.client.clone());
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let patch = serde_json::json!({"metadata": {"annotations": {crate::keys::VOLUME_KEPT_AT: now}}});
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Confirmed::Present,
        Err(kube::Error::Api(status)) if status.code == 404 => Confirmed::Absent,
        Err(error) => {
            tracing::warn!(pv = name, %error, "cannot confirm the PV of a volume staged for deletion; it stays staged");
            Confirmed::Unknown
        }
    }
}

/// A deleted volume (its PV gone) that the trash cannot take: an event on this node's Node
/// object with where it waits and its size, and a log line; retried every minute.
pub async fn report_stranded(
    ctx: &Context,
    pool: &PoolRoot,
    staged: &StagedVolume,
    bytes: u64,
    error: &crate::filesystem::PoolError,
) {
    let path = pool.staged_path(staged);
    tracing::error!(pool = pool.name(), pv = %staged.pv, staged = %path.display(), bytes, %error, "PV deleted but its volume cannot move to the trash; it waits staged (never purged) and is retried every minute");
    let note = format!(
        "PV {} is deleted but its volume's data ({}) cannot move to the trash of pool {}: {error}. It waits at {} on \
         node {} (never purged) and moves to the trash by itself, within a minute, once the trash can take it",
        staged.pv,
        crate::deciding::capacity::format_size(bytes),
        pool.name(),
        path.display(),
        ctx.me.node
    );
    match ctx.node_ref().await {
        Ok(node) => ctx.warn(&node, reason::STRANDED_VOLUME_DATA, "Delete", note).await,
        Err(error) => tracing::warn!(%error, "cannot read this node's Node object to report stranded volume data"),
    }
}

//! Background upkeep while the provisioner runs: the trash purge, the pool, OS-disk, quota and
//! cache gauges with pool readiness, and the node's liveness lease.

use std::sync::Arc;
use std::time::Duration;

use crate::deciding::quota::{self, QuotaCapability};
use crate::error::reason;
use crate::filesystem::VolumeDirName;
use crate::reconciling::context::Context;
use crate::serving::metrics::{PoolLabel, QuotaCapabilityLabel, StuckLabel, VolumeLabel, WatchLabel};

/// How often pool gauges and pool readiness are refreshed (local statvfs only, no API calls).
const POOL_REFRESH: Duration = Duration::from_secs(15);

/// How often the trash is looked at without being woken (it is also purged at start-up, which
/// resumes removals interrupted by a restart).
const PURGE_INTERVAL: Duration = Duration::from_secs(60);

/// Removes trashed volumes in the background, one pool at a time, off the async threads. Data
/// that cannot be removed (an immutable file, say) is reported where an admin looks: a Warning
/// event on this node's Node object (the PV is already gone), and the bytes stuck by reason.
pub async fn purge_trash(ctx: Arc<Context>) {
    // The reason last reported per pool root, to clear its gauge once the trash empties.
    let mut stuck: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    loop {
        for pool_path in &ctx.config.pools {
            let name = pool_path.name.as_str();
            let Some(Ok(pool)) = ctx.pools.usable(&pool_path.root) else { continue };
            let label = PoolLabel::new(name, &pool_path.root);
            if let Ok(pending) = pool.trash_pending() {
                ctx.metrics.background_deletions_pending.get_or_create(&label).set(pending as i64);
            }
            let started = std::time::Instant::now();
            let result = tokio::task::spawn_blocking({
                let pool = pool.clone();
                move || pool.purge_trash()
            })
            .await;
            match result {
                Ok(Ok(n)) => {
                    if n > 0 {
                        tracing::info!(pool = name, volumes = n, elapsed = ?started.elapsed(), "removed trashed volume data");
                    }
                    if let Some(reason) = stuck.remove(&label.root) {
                        let gauge = StuckLabel { pool: label.pool.clone(), root: label.root.clone(), reason };
                        ctx.metrics.trash_stuck_bytes.get_or_create(&gauge).set(0);
                        tracing::info!(pool = name, "the trash could be emptied again");
                    }
                }
                Ok(Err(error)) => report_stuck_trash(&ctx, &pool, &error, &mut stuck).await,
                Err(error) => tracing::error!(pool = name, %error, "trash removal task failed"),
            }
            if let Ok(pending) = pool.trash_pending() {
                ctx.metrics.background_deletions_pending.get_or_create(&label).set(pending as i64);
            }
        }
        let nested = crate::filesystem::nested_subvolumes_removed();
        let counted = ctx.metrics.nested_subvolumes_removed.get();
        ctx.metrics.nested_subvolumes_removed.inc_by(nested.saturating_sub(counted));
        let _ = tokio::time::timeout(PURGE_INTERVAL, ctx.purge.notified()).await;
    }
}

async fn report_stuck_trash(
    ctx: &Context,
    pool: &crate::filesystem::PoolRoot,
    error: &crate::filesystem::PoolError,
    stuck: &mut std::collections::HashMap<String, String>,
) {
    let name = pool.name().to_owned();
    let root = pool.path().display().to_string();
    let bytes = pool.trash_bytes().unwrap_or(0);
    let reason = error.label().to_owned();
    let label = |reason| StuckLabel { pool: name.clone(), root: root.clone(), reason };
    if let Some(previous) = stuck.insert(root.clone(), reason.clone())
        && previous != reason
    {
        ctx.metrics.trash_stuck_bytes.get_or_create(&label(previous)).set(0);
    }
    ctx.metrics.trash_stuck_bytes.get_or_create(&label(reason)).set(bytes as i64);
    let trash = pool.path().join(crate::filesystem::TRASH_DIR);
    tracing::warn!(pool = %name, %error, bytes, trash = %trash.display(), "deleted volumes' data cannot be removed; retrying every minute");
    let note = format!(
        "{} of deleted volumes in pool {name} ({}) cannot be removed: {error}. If files there are immutable or \
         append-only, run `chattr -R -i -a {}` on node {}; removal is retried every minute",
        crate::deciding::capacity::format_size(bytes),
        trash.display(),
        trash.display(),
        ctx.me.node
    );
    match ctx.node_ref().await {
        Ok(node) => ctx.warn(&node, reason::TRASH_PURGE_FAILED, "Delete", note).await,
        Err(error) => tracing::warn!(%error, "cannot read this node's Node object to report on it"),
    }
}

/// Keeps pool gauges, pool readiness and the pools this node advertises current (local statvfs
/// only; the lease is renewed at once when the usable pools change).
pub async fn refresh_pools(ctx: Arc<Context>) {
    let mut ticker = tokio::time::interval(POOL_REFRESH);
    let mut previous: Option<Vec<String>> = None;
    let mut os_disk = std::collections::HashMap::new();
    let mut previous_quota = QuotaState::default();
    loop {
        ticker.tick().await;
        refresh_os_disk_gauges(&ctx, &mut os_disk);
        refresh_cache_gauges(&ctx);
        let mut problems = Vec::new();
        let mut usable = Vec::new();
        for pool in &ctx.config.pools {
            let label = PoolLabel::new(&pool.name, &pool.root);
            match ctx.pools.usable(&pool.root).map(|root| root.and_then(|root| root.stats())) {
                Some(Ok(stats)) => {
                    ctx.metrics.pool_capacity_bytes.get_or_create(&label).set(stats.total_bytes as i64);
                    ctx.metrics.pool_free_bytes.get_or_create(&label).set(stats.available_bytes as i64);
                    ctx.metrics.pool_usable.get_or_create(&label).set(1);
                    usable.push(pool.key());
                }
                Some(Err(error)) => {
                    ctx.metrics.pool_usable.get_or_create(&label).set(0);
                    problems.push(format!("pool {} at {}: {error}", pool.name, pool.root.display()));
                }
                None => {}
            }
        }
        if previous.as_ref() != Some(&problems) {
            for problem in &problems {
                tracing::warn!(%problem, "pool unusable; provisioning and deletion in it wait");
            }
            if problems.is_empty() && previous.is_some() {
                tracing::info!("every pool is usable again");
            }
        }
        ctx.health.set_pool_problems(problems.clone());
        previous = Some(problems);
        refresh_quota(&ctx, &mut previous_quota);
        if ctx.membership.set_pools(usable) {
            ctx.membership.renew_now.notify_one();
        }
    }
}

/// Sets how many objects each watch cache holds (the claims cache shows that memory follows this
/// node's claims, not the cluster's), and how many claims placed on other nodes are recorded
/// compactly (deciding::waiting).
fn refresh_cache_gauges(ctx: &Context) {
    let waiting = ctx.waiting().len();
    let sizes = [("claims", ctx.claims.len()), ("claims-placed-elsewhere", waiting), ("classes", ctx.classes.len())]
        .into_iter()
        .chain(["volumes", "legacyvolumes"].into_iter().zip(ctx.volumes.iter().map(|store| store.len())));
    for (watch, size) in sizes {
        let label = WatchLabel { watch: watch.to_owned() };
        ctx.metrics.cached_objects.get_or_create(&label).set(i64::try_from(size).unwrap_or(i64::MAX));
    }
}

/// Sets the gauges of pools on the node's OS disk, and logs when a pool's answer changes
/// (`last`: the previous answer per pool root).
fn refresh_os_disk_gauges(ctx: &Context, last: &mut std::collections::HashMap<String, Option<bool>>) {
    let mut any_shared = false;
    for pool in &ctx.config.pools {
        let shared = crate::filesystem::os_disk::pool_shares_os_disk(&pool.root).unwrap_or_else(|error| {
            tracing::debug!(pool = %pool.name, %error, "cannot tell whether the pool is on the OS disk");
            None
        });
        let label = PoolLabel::new(&pool.name, &pool.root);
        match shared {
            Some(shared) => {
                ctx.metrics.pool_shares_os_disk.get_or_create(&label).set(i64::from(shared));
            }
            None => {
                ctx.metrics.pool_shares_os_disk.remove(&label);
            }
        }
        any_shared |= shared == Some(true);
        if last.insert(pool.root.display().to_string(), shared) != Some(shared) {
            let root = pool.root.display();
            match shared {
                Some(true) => {
                    tracing::warn!(pool = %pool.name, %root, "the pool is on the node's OS disk: volumes can fill it and make the kubelet evict pods (DiskPressure); give the pool a disk of its own")
                }
                Some(false) => tracing::info!(pool = %pool.name, %root, "the pool is not on the node's OS disk"),
                None => {
                    tracing::info!(pool = %pool.name, %root, "cannot tell from the mount table whether the pool is on the node's OS disk")
                }
            }
        }
    }
    ctx.metrics.kubevirt_pool_path_shared_with_os.set(i64::from(any_shared));
}

/// What the last quota refresh reported, to log changes only and drop gauges of gone volumes.
#[derive(Default)]
struct QuotaState {
    lines: Vec<String>,
    volumes: Vec<VolumeLabel>,
}

/// Logs (on change), shows in `/readyz` and exports each pool's quota capability, and the used
/// bytes of every quota volume (btrfs qgroup accounting, XFS and ext4 project quota usage).
fn refresh_quota(ctx: &Context, previous: &mut QuotaState) {
    let mut lines = Vec::new();
    let mut volumes = Vec::new();
    for pool in &ctx.config.pools {
        let Some(Ok(root)) = ctx.pools.usable(&pool.root) else { continue };
        let Ok(facts) = root.quota_facts() else { continue };
        let capability = quota::capability(&facts);
        let line = match &capability {
            QuotaCapability::Unable(missing) => {
                format!("pool {} ({} at {}): quota none ({missing})", pool.name, facts.fs, pool.root.display())
            }
            able => format!("pool {} ({} at {}): quota {}", pool.name, facts.fs, pool.root.display(), able.label()),
        };
        for mechanism in QuotaCapability::LABELS {
            let label = QuotaCapabilityLabel {
                pool: pool.name.clone(),
                root: pool.root.display().to_string(),
                mechanism: mechanism.to_owned(),
            };
            ctx.metrics.pool_quota_capability.get_or_create(&label).set(i64::from(capability.label() == mechanism));
        }
        lines.push(line);
        if matches!(capability, QuotaCapability::Unable(_)) {
            continue;
        }
        for entry in root.list_entries().unwrap_or_default() {
            let Ok(name) = VolumeDirName::new(&entry) else { continue };
            let Some(used) = root.quota_used_bytes(&name) else { continue };
            let label = VolumeLabel { pool: pool.name.clone(), volume: entry };
            ctx.metrics.volume_used_bytes.get_or_create(&label).set(i64::try_from(used).unwrap_or(i64::MAX));
            volumes.push(label);
        }
    }
    for gone in previous.volumes.iter().filter(|v| !volumes.contains(v)) {
        ctx.metrics.volume_used_bytes.remove(gone);
    }
    if lines != previous.lines {
        for line in &lines {
            tracing::info!(capability = %line, "pool quota capability");
        }
        ctx.health.set_quota_capabilities(lines.clone());
    }
    *previous = QuotaState { lines, volumes };
}

/// Keeps this node's lease renewed (when liveness comes from it) and its usable pools advertised:
/// written again at once when they change, and otherwise only to renew.
pub async fn keep_lease(ctx: Arc<Context>) {
    let mut failing = false;
    loop {
        let delay = match ctx.membership.renew().await {
            Ok(()) => {
                if failing {
                    tracing::info!("node lease renewed again");
                }
                failing = false;
                ctx.membership.renew_interval()
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(%error, namespace = %ctx.config.namespace, "cannot renew this node's lease; other nodes will not hand it shared or every-node work");
                }
                failing = true;
                Some(LEASE_RETRY)
            }
        };
        match delay {
            Some(delay) => {
                let _ = tokio::time::timeout(delay, ctx.membership.renew_now.notified()).await;
            }
            // Liveness from readiness: nothing to renew, the Lease changes with the pools only.
            None => ctx.membership.renew_now.notified().await,
        }
    }
}

/// Retry delay after a failed lease renewal.
const LEASE_RETRY: Duration = Duration::from_secs(5);

/// Gives this node's local PVs made by an earlier release the local identity
/// ([`crate::keys::LOCAL_IDENTITY_SUFFIX`]), so that a rollback to the Go build leaves them
/// alone instead of crashing on them. Once, after the initial lists (a new local PV has it from
/// the start); a PV that cannot be written is logged and looked at again at the next start.
pub async fn give_local_volumes_their_identity(ctx: &Context) {
    let api: kube::Api<crate::deciding::kept_volume::KeptVolume> = kube::Api::all(ctx.client.clone());
    let rewrites: Vec<(String, String)> = ctx
        .volumes
        .iter()
        .flat_map(|store| store.state())
        .filter_map(|pv| {
            let identity = crate::deciding::volume_spec::identity_to_rewrite(&pv, &ctx.me)?;
            Some((pv.metadata.name.clone()?, identity))
        })
        .collect();
    for (name, identity) in rewrites {
        let patch = serde_json::json!({"metadata": {"annotations": {crate::keys::PROVISIONER_IDENTITY: identity}}});
        match api.patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await {
            Ok(_) => tracing::info!(pv = %name, %identity, "local PV: identity the Go build leaves alone"),
            Err(error) => {
                tracing::warn!(pv = %name, %error, "cannot give the local PV its identity; retried at the next start")
            }
        }
    }
}

//! Wiring: watches, stores, the two reconcilers, health and metrics, graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};

use crate::config::Config;
use crate::deciding::quota::{self, QuotaCapability};
use crate::deciding::{layout, retention, watch_list};
use crate::error::reason;
use crate::filesystem::VolumeDirName;
use crate::filesystem::pools::{OpenError, Pools};
use crate::keys;
use crate::reconciling::context::Context;
use crate::reconciling::published_capacity::{self, Publisher};
use crate::reconciling::watch_backoff::{self, OutageBackoff, WatchHealth};
use crate::reconciling::{claims, orphans, volumes};
use crate::serving::health::{self, Health, Watch};
use crate::serving::metrics::{Metrics, PoolLabel, QuotaCapabilityLabel, StuckLabel, VolumeLabel, WatchLabel};

/// Why the provisioner could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A pool root is missing or not a directory.
    #[error(transparent)]
    Pool(#[from] OpenError),
    /// The health or metrics address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// How often pool gauges and pool readiness are refreshed (local statvfs only, no API calls).
const POOL_REFRESH: Duration = Duration::from_secs(15);

/// Runs until `shutdown` resolves, then lets in-flight reconciles finish.
pub async fn run(
    client: Client,
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let pools = Pools::open(&config.pools, config.require_mountpoint)?;
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    health.set_pool_problems(pool_problems(&pools, &config));
    serve_http(&config, &health, &metrics).await?;

    let shutdown = shutdown.shared();

    // Readiness comes from the watch events themselves (InitDone), not from
    // `Store::wait_until_ready`: in kube-runtime 5.0 only the last of several concurrent waiters
    // on a store is woken, and the controller's own runner is one of them.

    let list = initial_list_config(&client).await;
    // StorageClasses: few, watched whole.
    let (classes, class_writer) = reflector::store::<StorageClass>();
    let class_events = observe(
        Watch::Classes,
        watcher(Api::<StorageClass>::all(client.clone()), list.clone()),
        &health,
        &metrics,
    )
    .reflect(class_writer);
    tokio::spawn(class_events.for_each(|_| async {}));

    let (claim_store, claim_writer) = reflector::store::<PersistentVolumeClaim>();
    let (own_store, own_writer) = reflector::store::<PersistentVolume>();
    let (legacy_store, legacy_writer) = reflector::store::<PersistentVolume>();
    let ctx = Arc::new(Context::new(
        client.clone(),
        config.clone(),
        pools,
        classes,
        claim_store.clone(),
        vec![own_store.clone(), legacy_store.clone()],
        metrics.clone(),
        health.clone(),
    ));

    // Claims: whole objects, so that deciding needs no GET, but only the few this node may act on
    // stay in memory (deciding::retention); the others are forgotten as their events pass.
    let claim_events = observe(
        Watch::Claims,
        watcher(Api::<PersistentVolumeClaim>::all(client.clone()), list.clone()),
        &health,
        &metrics,
    )
    .filter_map({
        let ctx = ctx.clone();
        move |event| {
            let keep = |claim: &mut PersistentVolumeClaim| {
                let kept = retention::keep_claim(claim, &ctx.me);
                if kept {
                    retention::trim_claim(claim);
                }
                kept
            };
            futures::future::ready(retain(event, keep, |claim| ctx.forget_claim(&claim.metadata)))
        }
    })
    .reflect(claim_writer)
    .applied_objects();

    // Volumes: ours carry a node label, so each node watches only its own. PVs the Go build
    // made, shared and every-node ones have no node label and come through a second watch, of
    // unlabelled PVs: the two are disjoint, so together they deliver less than one watch of all
    // PVs would.
    let pv_api = Api::<PersistentVolume>::all(client.clone());
    let own_selector = format!("{}={}", keys::NODE_LABEL, layout::node_label_value(&config.node_name));
    let legacy_selector = format!("!{}", keys::NODE_LABEL);
    let (deleted_tx, mut deleted_rx) = tokio::sync::mpsc::unbounded_channel::<PersistentVolume>();
    let own_events = observe(
        Watch::Volumes,
        watcher(pv_api.clone(), list.clone().labels(&own_selector)),
        &health,
        &metrics,
    )
    .reflect(own_writer)
    // A deleted PV of this node whose directory still holds data was deleted by someone else:
    // reported by a task of its own.
    .inspect({
        let deleted = deleted_tx.clone();
        move |event| {
            if let Ok(watcher::Event::Delete(pv)) = event {
                let _ = deleted.send(pv.clone());
            }
        }
    })
    .applied_objects();
    let legacy_events = observe(
        Watch::LegacyVolumes,
        watcher(pv_api, list.labels(&legacy_selector)),
        &health,
        &metrics,
    )
    // Other provisioners' PVs have no node label of ours either: only ours stay (deciding::retention).
    .filter_map({
        let me = ctx.me.clone();
        move |event| {
            let keep = |pv: &mut PersistentVolume| retention::keep_unlabelled_volume(pv, &me);
            futures::future::ready(retain(event, keep, |_| {}))
        }
    })
    .reflect(legacy_writer)
    .applied_objects();

    let controller_config = controller::Config::default().concurrency(config.max_concurrency);
    let claim_controller = Controller::for_stream(claim_events, claim_store)
        .with_config(controller_config.clone())
        .graceful_shutdown_on(shutdown.clone())
        .run(claims::reconcile, claims::error_policy, ctx.clone())
        .for_each(log_controller_error);
    let own_volumes = Controller::for_stream(own_events, own_store)
        .with_config(controller_config.clone())
        .graceful_shutdown_on(shutdown.clone())
        .run(volumes::reconcile, volumes::error_policy, ctx.clone())
        .for_each(log_controller_error);
    let legacy_volumes = Controller::for_stream(legacy_events, legacy_store)
        .with_config(controller_config)
        .graceful_shutdown_on(shutdown.clone())
        .run(volumes::reconcile, volumes::error_policy, ctx.clone())
        .for_each(log_controller_error);

    tokio::spawn(after_initial_lists(ctx.clone()));
    let usable_now = config.pools.iter().filter(|p| matches!(ctx.pools.usable(&p.name), Some(Ok(_)))).map(|p| p.key());
    ctx.membership.set_pools(usable_now.collect());
    // Announce this node before acting, so that no other node's view of who is alive lacks it
    // while it already holds work (best effort: the renewal loop keeps trying).
    if let Err(error) = ctx.membership.renew().await {
        tracing::warn!(%error, "cannot write this node's lease yet; retrying in the background");
    }
    tokio::spawn(keep_lease(ctx.clone()));
    let publisher = config.publish_capacity.then(|| Arc::new(Publisher::new(&ctx)));
    if let Some(publisher) = &publisher {
        tokio::spawn(published_capacity::run(ctx.clone(), publisher.clone()));
    } else {
        let ctx = ctx.clone();
        tokio::spawn(async move { published_capacity::withdraw_leftovers(&ctx).await });
    }
    tokio::spawn({
        let ctx = ctx.clone();
        async move {
            while let Some(pv) = deleted_rx.recv().await {
                orphans::check_deleted_volume(&ctx, &pv).await;
            }
        }
    });
    tokio::spawn(refresh_pools(ctx.clone()));
    // Before the claim controller first runs, so no copy of this node is in progress.
    sweep_clone_staging(&ctx).await;
    // Before the volume controllers first run: a volume this node left staged for deletion goes
    // back to its place or to the trash before anything decides about its PV.
    volumes::resolve_staged_deletions(&ctx).await;
    tokio::spawn(purge_trash(ctx.clone()));

    tracing::info!(node = %config.node_name, provisioner = %config.provisioner_name, "hostpath-provisioner running");
    futures::join!(claim_controller, own_volumes, legacy_volumes);
    // The scheduler stops offering this node before other nodes take over its work.
    if let Some(publisher) = &publisher {
        published_capacity::withdraw(&ctx, publisher).await;
    }
    // Other nodes take over this node's shared and every-node work at once.
    ctx.membership.release().await;
    tracing::info!("in-flight operations finished; exiting");
    Ok(())
}

/// Once every watch has delivered its initial list: log it and clean up after earlier crashes.
async fn after_initial_lists(ctx: Arc<Context>) {
    while !ctx.health.all_synced() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tracing::info!(node = %ctx.me.node, "initial lists received; ready");
    orphans::remove_orphan_directories(&ctx).await;
}

/// How the watches fetch their initial state: streamed one object at a time where the API server
/// serves that by default, else in small pages (deciding::watch_list). One request at start-up.
async fn initial_list_config(client: &Client) -> watcher::Config {
    match client.apiserver_version().await {
        Ok(info) if watch_list::streaming_lists_by_default(&info.major, &info.minor) => {
            tracing::info!(version = %info.git_version, "the API server streams initial lists: watches use them");
            watcher::Config::default().streaming_lists()
        }
        Ok(info) => {
            tracing::info!(version = %info.git_version, page = watch_list::PAGE_SIZE, "initial lists are paginated");
            watcher::Config::default().page_size(watch_list::PAGE_SIZE)
        }
        Err(error) => {
            tracing::warn!(%error, page = watch_list::PAGE_SIZE, "cannot read the API server's version; initial lists are paginated");
            watcher::Config::default().page_size(watch_list::PAGE_SIZE)
        }
    }
}

/// Lets through the watch events of objects this node keeps (`keep` decides, and trims what it
/// keeps); an object it does not keep leaves the cache as a deletion, and `forget` drops what
/// this node remembered about it (deciding::retention).
fn retain<K>(
    event: Result<watcher::Event<K>, watcher::Error>,
    keep: impl Fn(&mut K) -> bool,
    forget: impl Fn(&K),
) -> Option<Result<watcher::Event<K>, watcher::Error>> {
    use watcher::Event;
    let Ok(event) = event else { return Some(event) };
    let kept = match event {
        Event::Apply(mut object) => {
            if keep(&mut object) {
                Event::Apply(object)
            } else {
                forget(&object);
                Event::Delete(object)
            }
        }
        Event::InitApply(mut object) => {
            if !keep(&mut object) {
                forget(&object);
                return None;
            }
            Event::InitApply(object)
        }
        Event::Delete(object) => {
            forget(&object);
            Event::Delete(object)
        }
        other @ (Event::Init | Event::InitDone) => other,
    };
    Some(Ok(kept))
}

/// Reconcile errors are reported by the error policies; what surfaces here are watch and
/// queue errors of the controller machinery.
async fn log_controller_error<T: std::fmt::Debug, E: std::fmt::Display>(result: Result<T, E>) {
    if let Err(error) = result {
        tracing::debug!(%error, "controller");
    }
}

/// Marks the initial list of `watch` received, the API reachable or not, and counts restarts.
/// Retries back off up to [`watch_backoff::MAX_DELAY`] across an outage, and the log says when
/// the API server stops and starts answering, not every attempt.
fn observe<K, S>(
    watch: Watch,
    stream: S,
    health: &Arc<Health>,
    metrics: &Arc<Metrics>,
) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + use<K, S>
where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
    K: kube::Resource + Send,
{
    let (health, metrics) = (health.clone(), metrics.clone());
    let watch_health = WatchHealth::default();
    let backoff = OutageBackoff::new(watch_health.clone());
    let mut failing = false;
    // managedFields are half of a claim's metadata and never read here: dropping them keeps the
    // per-object cost of the caches down.
    stream
        .modify(|object: &mut K| object.meta_mut().managed_fields = None)
        .inspect(move |item| watch_health.observe(item))
        .backoff(backoff)
        .inspect(move |result| match result {
            Ok(event) => {
                health.set_api_reachable(true);
                if failing && !matches!(event, watcher::Event::Init) {
                    tracing::info!(?watch, "watch works again");
                    failing = false;
                }
                if matches!(event, watcher::Event::InitDone) {
                    tracing::debug!(?watch, "initial list received");
                    health.synced(watch);
                }
            }
            Err(error) => {
                if !failing {
                    tracing::warn!(?watch, %error, max_delay = ?watch_backoff::MAX_DELAY, "watch failed; retrying with backoff until the API server answers");
                    failing = true;
                } else {
                    tracing::debug!(?watch, %error, "watch still failing");
                }
                health.set_api_reachable(false);
                metrics.watch_restarts.get_or_create(&WatchLabel { watch: format!("{watch:?}").to_lowercase() }).inc();
            }
        })
}

async fn serve_http(config: &Config, health: &Arc<Health>, metrics: &Arc<Metrics>) -> Result<(), StartError> {
    let mut addrs = Vec::new();
    addrs.extend(config.health_addr);
    addrs.extend(config.metrics_addr.filter(|m| Some(*m) != config.health_addr));
    for addr in addrs {
        let listener = health::bind(addr).await.map_err(|source| StartError::Listen { addr, source })?;
        tokio::spawn(health::serve(listener, health.clone(), metrics.clone()));
    }
    Ok(())
}

/// Removes the copies this node left unfinished when it stopped (a crash or kill mid-clone): a
/// copy becomes a volume only when complete, so what stays in staging is never needed. The
/// clones themselves start afresh when their claims are reconciled.
async fn sweep_clone_staging(ctx: &Arc<Context>) {
    let Ok(node) = crate::filesystem::VolumeDirName::new(&ctx.me.node) else { return };
    for name in ctx.pools.names() {
        let Some(Ok(pool)) = ctx.pools.usable(name) else { continue };
        let node = node.clone();
        match tokio::task::spawn_blocking(move || pool.sweep_clone_staging(&node)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(removed)) => tracing::info!(pool = name, removed, "removed unfinished clone copies"),
            Ok(Err(error)) => tracing::warn!(pool = name, %error, "cannot remove unfinished clone copies"),
            Err(error) => tracing::error!(pool = name, %error, "clone staging sweep failed"),
        }
    }
}

/// How often the trash is looked at without being woken (it is also purged at start-up, which
/// resumes removals interrupted by a restart).
const PURGE_INTERVAL: Duration = Duration::from_secs(60);

/// Removes trashed volumes in the background, one pool at a time, off the async threads. Data
/// that cannot be removed (an immutable file, say) is reported where an admin looks: a Warning
/// event on this node's Node object (the PV is already gone), and the bytes stuck by reason.
async fn purge_trash(ctx: Arc<Context>) {
    // The reason last reported per pool, to clear its gauge once the trash empties.
    let mut stuck: std::collections::HashMap<String, String> = std::collections::HashMap::new();
    loop {
        for name in ctx.pools.names() {
            let Some(Ok(pool)) = ctx.pools.usable(name) else { continue };
            let label = PoolLabel { pool: name.to_owned() };
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
                    if let Some(reason) = stuck.remove(name) {
                        let gauge = StuckLabel { pool: name.to_owned(), reason };
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
    let bytes = pool.trash_bytes().unwrap_or(0);
    let reason = error.label().to_owned();
    if let Some(previous) = stuck.insert(name.clone(), reason.clone())
        && previous != reason
    {
        ctx.metrics.trash_stuck_bytes.get_or_create(&StuckLabel { pool: name.clone(), reason: previous }).set(0);
    }
    ctx.metrics.trash_stuck_bytes.get_or_create(&StuckLabel { pool: name.clone(), reason }).set(bytes as i64);
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

/// One line per unusable pool (which and why); logs each.
fn pool_problems(pools: &Pools, config: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    for pool in &config.pools {
        if let Some(Err(error)) = pools.usable(&pool.name) {
            tracing::warn!(pool = %pool.name, %error, "pool unusable; provisioning and deletion in it wait");
            problems.push(format!("pool {} at {}: {error}", pool.name, pool.root.display()));
        }
    }
    problems
}

/// Keeps pool gauges, pool readiness and the pools this node advertises current (local statvfs
/// only; the lease is renewed at once when the usable pools change).
async fn refresh_pools(ctx: Arc<Context>) {
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
            let label = PoolLabel { pool: pool.name.clone() };
            match ctx.pools.usable(&pool.name).map(|root| root.and_then(|root| root.stats())) {
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
/// node's claims, not the cluster's).
fn refresh_cache_gauges(ctx: &Context) {
    let sizes = [("claims", ctx.claims.len()), ("classes", ctx.classes.len())]
        .into_iter()
        .chain(["volumes", "legacyvolumes"].into_iter().zip(ctx.volumes.iter().map(|store| store.len())));
    for (watch, size) in sizes {
        let label = WatchLabel { watch: watch.to_owned() };
        ctx.metrics.cached_objects.get_or_create(&label).set(i64::try_from(size).unwrap_or(i64::MAX));
    }
}

/// Sets the gauges of pools on the node's OS disk, and logs when a pool's answer changes
/// (`last`: the previous answer per pool).
fn refresh_os_disk_gauges(ctx: &Context, last: &mut std::collections::HashMap<String, Option<bool>>) {
    let mut any_shared = false;
    for pool in &ctx.config.pools {
        let shared = crate::filesystem::os_disk::pool_shares_os_disk(&pool.root).unwrap_or_else(|error| {
            tracing::debug!(pool = %pool.name, %error, "cannot tell whether the pool is on the OS disk");
            None
        });
        let label = PoolLabel { pool: pool.name.clone() };
        match shared {
            Some(shared) => {
                ctx.metrics.pool_shares_os_disk.get_or_create(&label).set(i64::from(shared));
            }
            None => {
                ctx.metrics.pool_shares_os_disk.remove(&label);
            }
        }
        any_shared |= shared == Some(true);
        if last.insert(pool.name.clone(), shared) != Some(shared) {
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
        let Some(Ok(root)) = ctx.pools.usable(&pool.name) else { continue };
        let Ok(facts) = root.quota_facts() else { continue };
        let capability = quota::capability(&facts);
        let line = match &capability {
            QuotaCapability::Unable(missing) => {
                format!("pool {} ({} at {}): quota none ({missing})", pool.name, facts.fs, pool.root.display())
            }
            able => format!("pool {} ({} at {}): quota {}", pool.name, facts.fs, pool.root.display(), able.label()),
        };
        for mechanism in QuotaCapability::LABELS {
            let label = QuotaCapabilityLabel { pool: pool.name.clone(), mechanism: mechanism.to_owned() };
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

/// Keeps this node's liveness lease renewed (and its usable pools advertised).
async fn keep_lease(ctx: Arc<Context>) {
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
                LEASE_RETRY
            }
        };
        let _ = tokio::time::timeout(delay, ctx.membership.renew_now.notified()).await;
    }
}

/// Retry delay after a failed lease renewal.
const LEASE_RETRY: Duration = Duration::from_secs(5);

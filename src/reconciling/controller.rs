//! Wiring: watches, stores, the two reconcilers, health and metrics, graceful shutdown.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};

use crate::config::Config;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::node_affinity;
use crate::deciding::retention::{self, Retention};
use crate::filesystem::pools::{OpenError, Pools};
use crate::keys;
use crate::reconciling::claim_actions::object_key;
use crate::reconciling::context::Context;
use crate::reconciling::published_capacity::{self, Publisher};
use crate::reconciling::{
    affinity_duplicates, block_volumes, claims, orphans, pattern_records, reaping, settling, snapshot_copies,
    snapshots, stranded, upkeep, volumes, watches,
};
use crate::serving::health::{self, Health, Watch};
use crate::serving::heap;
use crate::serving::metrics::Metrics;

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
    /// With NODE_AFFINITY_KEYS, this node's Node object could not be read for its labels.
    #[error("cannot read the labels of Node {node} for NODE_AFFINITY_KEYS: {source}")]
    NodeLabels {
        /// This node.
        node: String,
        /// Why.
        source: kube::Error,
    },
}

/// The labels of this node volumes can be pinned to (`deciding::node_affinity`): none without
/// NODE_AFFINITY_KEYS; else read from the Node object, retried for about a minute (the API
/// server may be restarting with the node).
async fn affinity_labels(client: &Client, config: &Config) -> Result<Vec<node_affinity::AffinityLabel>, StartError> {
    use backon::Retryable;
    if config.node_affinity_keys.is_empty() {
        return Ok(Vec::new());
    }
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    let backoff =
        backon::ExponentialBuilder::default().with_max_delay(std::time::Duration::from_secs(16)).with_max_times(6);
    let node = (|| nodes.get(&config.node_name))
        .retry(backoff)
        .await
        .map_err(|source| StartError::NodeLabels { node: config.node_name.clone(), source })?;
    let labels = node.metadata.labels.unwrap_or_default();
    let served = node_affinity::served_labels(&config.node_affinity_keys, &labels);
    tracing::info!(node = %config.node_name, keys = ?config.node_affinity_keys, served = ?served.iter().map(|l| l.annotation()).collect::<Vec<_>>(), "node affinity labels");
    Ok(served)
}

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

    let list = watches::initial_list_config(&client, &config.node_name).await;
    let affinity = affinity_labels(&client, &config).await?;
    // StorageClasses: few, watched whole.
    let (classes, class_writer) = reflector::store::<StorageClass>();
    let class_events = watches::observe(
        Watch::Classes,
        watcher(Api::<StorageClass>::all(client.clone()), list.clone()),
        &health,
        &metrics,
    )
    .reflect(class_writer);
    tokio::spawn(class_events.for_each(|_| async {}));

    let (claim_store, claim_writer) = reflector::store::<PersistentVolumeClaim>();
    let (own_store, own_writer) = reflector::store::<KeptVolume>();
    let (legacy_store, legacy_writer) = reflector::store::<KeptVolume>();
    let ctx = Arc::new(Context::new(
        client.clone(),
        config.clone(),
        pools,
        classes,
        claim_store.clone(),
        vec![own_store.clone(), legacy_store.clone()],
        metrics.clone(),
        health.clone(),
        affinity,
    ));

    // Claims: whole objects, so that deciding needs no GET, but only the few this node may act on
    // stay in memory (deciding::retention); claims placed on another node are recorded compactly
    // (deciding::waiting), the others forgotten as their events pass.
    let claim_events = watches::observe(
        Watch::Claims,
        watcher(Api::<PersistentVolumeClaim>::all(client.clone()), list.clone()),
        &health,
        &metrics,
    )
    .filter_map({
        let ctx = ctx.clone();
        move |event| {
            match &event {
                Ok(watcher::Event::Init) => ctx.waiting().listing(),
                Ok(watcher::Event::InitDone) => {
                    let gone = ctx.waiting().listed();
                    for uid in gone {
                        ctx.metrics.waiting_claims.forget(&uid);
                    }
                }
                _ => {}
            }
            let keep = |claim: &mut PersistentVolumeClaim| keep_claim(&ctx, claim);
            futures::future::ready(watches::retain(event, keep, |claim| ctx.forget_claim(&claim.metadata)))
        }
    })
    .reflect(claim_writer)
    .applied_objects();

    // Volumes: ours carry a node label, so each node watches only its own. PVs the Go build
    // made, shared and every-node ones have no node label and come through a second watch, of
    // unlabelled PVs: the two are disjoint, so together they deliver less than one watch of all
    // PVs would.
    let pv_api = Api::<KeptVolume>::all(client.clone());
    // With NODE_AFFINITY_KEYS, also the PVs pinned to a label this node carries.
    let own_selector = node_affinity::own_volumes_selector(&config.node_name, &ctx.me.affinity);
    let legacy_selector = format!("!{}", keys::NODE_LABEL);
    let (deleted_tx, mut deleted_rx) = tokio::sync::mpsc::unbounded_channel::<KeptVolume>();
    let own_events = watches::observe(
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
    let legacy_events =
        watches::observe(Watch::LegacyVolumes, watcher(pv_api, list.labels(&legacy_selector)), &health, &metrics)
            // Other provisioners' PVs have no node label of ours either: only ours stay (deciding::retention).
            .filter_map({
                let me = ctx.me.clone();
                move |event| {
                    let keep = |pv: &mut KeptVolume| retention::keep_unlabelled_volume(pv, &me);
                    futures::future::ready(watches::retain(event, keep, |_| {}))
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
    let usable_now = config.pools.iter().filter(|p| matches!(ctx.pools.usable(&p.root), Some(Ok(_)))).map(|p| p.key());
    ctx.membership.set_pools(usable_now.collect());
    // Announce this node before acting, so that no other node's view of who is alive lacks it
    // while it already holds work (best effort: the renewal loop keeps trying).
    if let Err(error) = ctx.membership.renew().await {
        tracing::warn!(%error, "cannot write this node's lease yet; retrying in the background");
    }
    tokio::spawn(upkeep::keep_lease(ctx.clone()));
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
    tokio::spawn(upkeep::refresh_pools(ctx.clone()));
    tokio::spawn(heap::return_freed_memory());
    // Before the claim controller first runs, so no copy of this node is in progress.
    sweep_clone_staging(&ctx).await;
    // Before the volume controllers first run: a volume this node left staged for deletion goes
    // back to its place or to the trash before anything decides about its PV.
    settling::settle(&ctx).await;
    // Before any controller runs, and so before the watches they drive report ready: this
    // node's Block volumes are attached and exposed again (a reboot detached them all), and
    // device nodes naming none of them are removed.
    // A stop asked for meanwhile (the API unreachable, the pass retrying) ends it.
    tokio::select! {
        () = block_volumes::expose_at_start(&ctx) => {}
        () = shutdown.clone() => tracing::info!("stopping before this node's Block volumes were exposed"),
    }
    tokio::spawn(settling::keep_settling(ctx.clone()));
    tokio::spawn(upkeep::purge_trash(ctx.clone()));
    tokio::spawn(snapshot_copies::sweep(ctx.clone()));
    tokio::spawn(reaping::run(ctx.clone()));
    tokio::spawn(affinity_duplicates::run(ctx.clone()));
    tokio::spawn(stranded::watch_for_no_provisioner(ctx.clone()));

    tracing::info!(node = %config.node_name, provisioner = %config.provisioner_name, "hostpath-provisioner running");
    let snapshot_controller = snapshots::run(ctx.clone(), shutdown.clone());
    futures::join!(claim_controller, own_volumes, legacy_volumes, snapshot_controller);
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
    upkeep::give_local_volumes_their_identity(&ctx).await;
    pattern_records::record_earlier_directories(&ctx).await;
    orphans::remove_orphan_directories(&ctx).await;
}

/// Reconcile errors are reported by the error policies; what surfaces here are watch and
/// queue errors of the controller machinery.
async fn log_controller_error<T: std::fmt::Debug, E: std::fmt::Display>(result: Result<T, E>) {
    if let Err(error) = result {
        tracing::debug!(%error, "controller");
    }
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
    for pool_path in &ctx.config.pools {
        let name = pool_path.name.as_str();
        let Some(Ok(pool)) = ctx.pools.usable(&pool_path.root) else { continue };
        let node = node.clone();
        let swept = move || {
            Ok::<_, crate::filesystem::PoolError>(
                pool.sweep_clone_staging(&node)? + pool.sweep_snapshot_staging(&node)?,
            )
        };
        match tokio::task::spawn_blocking(swept).await {
            Ok(Ok(0)) => {}
            Ok(Ok(removed)) => tracing::info!(pool = name, removed, "removed unfinished clone copies"),
            Ok(Err(error)) => tracing::warn!(pool = name, %error, "cannot remove unfinished clone copies"),
            Err(error) => tracing::error!(pool = name, %error, "clone staging sweep failed"),
        }
    }
}

/// One line per unusable pool (which and why); logs each.
fn pool_problems(pools: &Pools, config: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    for pool in &config.pools {
        if let Some(Err(error)) = pools.usable(&pool.root) {
            tracing::warn!(pool = %pool.name, %error, "pool unusable; provisioning and deletion in it wait");
            problems.push(format!("pool {} at {}: {error}", pool.name, pool.root.display()));
        }
    }
    problems
}

/// Keeps a claim this node may act on (trimmed), records one placed on another node, forgets the
/// others (deciding::retention).
fn keep_claim(ctx: &Context, claim: &mut PersistentVolumeClaim) -> bool {
    match retention::claim_retention(claim, &ctx.me) {
        Retention::Keep => {
            if let Some(uid) = claim.metadata.uid.as_deref() {
                ctx.waiting().forget(uid);
                ctx.metrics.waiting_claims.forget(uid);
            }
            retention::trim_claim(claim);
            true
        }
        Retention::Waiting(record) => {
            // It may have been a candidate here before the scheduler moved it.
            ctx.reset_retry(&object_key(&claim.metadata));
            ctx.waiting().record(record, Instant::now(), ctx.config.node_lease);
            false
        }
        Retention::Forget => {
            ctx.forget_claim(&claim.metadata);
            false
        }
    }
}

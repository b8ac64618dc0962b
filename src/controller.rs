//! Wiring: watches, stores, the two reconcilers, health and metrics, graceful shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::controller::{self, Controller};
use kube::runtime::{WatchStreamExt, reflector, watcher};

use crate::config::Config;
use crate::context::Context;
use crate::health::{self, Health, Watch};
use crate::metrics::{Metrics, PoolLabel, WatchLabel};
use crate::pool::{PoolError, PoolRoot};
use crate::{claims, keys, layout, orphans, volumes};

/// Why the provisioner could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A pool root is unusable.
    #[error("pool {pool} at {path}: {source}")]
    Pool {
        /// Pool name.
        pool: String,
        /// Root path.
        path: String,
        /// Why.
        source: PoolError,
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
    let mut pools = HashMap::new();
    for pool in &config.pools {
        let root = PoolRoot::open(&pool.name, &pool.root)
            .and_then(|root| root.check(config.require_mountpoint).map(|()| root))
            .map_err(|source| StartError::Pool {
                pool: pool.name.clone(),
                path: pool.root.display().to_string(),
                source,
            })?;
        pools.insert(pool.name.clone(), root);
    }
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    health.set_pools_usable(true);
    serve_http(&config, &health, &metrics);

    let shutdown = shutdown.shared();

    // StorageClasses: few, watched whole.
    let (classes, class_writer) = reflector::store::<StorageClass>();
    let class_events = watcher(Api::<StorageClass>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(class_writer);
    tokio::spawn(observe("storageclasses", class_events, health.clone(), metrics.clone()).for_each(|_| async {}));

    // Claims: metadata only; the annotations decide ownership (DESIGN.md section 4).
    let (claim_store, claim_writer) = reflector::store::<PartialObjectMeta<PersistentVolumeClaim>>();
    let claim_events =
        watcher(Api::<PartialObjectMeta<PersistentVolumeClaim>>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .reflect(claim_writer);
    let claim_trigger =
        observe("persistentvolumeclaims", claim_events, health.clone(), metrics.clone()).applied_objects();

    let ctx = Arc::new(Context::new(
        client.clone(),
        config.clone(),
        pools,
        classes.clone(),
        claim_store.clone(),
        metrics.clone(),
        health.clone(),
    ));

    let controller_config = controller::Config::default().concurrency(config.max_concurrency);
    let claim_controller = Controller::for_stream(claim_trigger, claim_store.clone())
        .with_config(controller_config.clone())
        .graceful_shutdown_on(shutdown.clone())
        .run(claims::reconcile, claims::error_policy, ctx.clone())
        .for_each(|_| async {});

    // Volumes: ours carry a node label, so each node watches only its own. PVs the Go build
    // made have no label and get a second watch of unlabelled PVs.
    let pv_api = Api::<PersistentVolume>::all(client.clone());
    let own = watcher::Config::default().labels(&format!(
        "{}={}",
        keys::NODE_LABEL,
        layout::node_label_value(&config.node_name)
    ));
    let unlabelled = watcher::Config::default().labels(&format!("!{}", keys::NODE_LABEL));
    let own_volumes = Controller::new(pv_api.clone(), own).with_config(controller_config.clone());
    let legacy_volumes = Controller::new(pv_api, unlabelled).with_config(controller_config);
    let own_store = own_volumes.store();
    let legacy_store = legacy_volumes.store();
    let own_volumes = own_volumes
        .graceful_shutdown_on(shutdown.clone())
        .run(volumes::reconcile, volumes::error_policy, ctx.clone())
        .for_each(|_| async {});
    let legacy_volumes = legacy_volumes
        .graceful_shutdown_on(shutdown.clone())
        .run(volumes::reconcile, volumes::error_policy, ctx.clone())
        .for_each(|_| async {});

    {
        let health = health.clone();
        let ctx = ctx.clone();
        tokio::spawn(async move {
            if classes.wait_until_ready().await.is_ok() {
                health.synced(Watch::Classes);
            }
            if claim_store.wait_until_ready().await.is_ok() {
                health.synced(Watch::Claims);
            }
            if own_store.wait_until_ready().await.is_ok() && legacy_store.wait_until_ready().await.is_ok() {
                health.synced(Watch::Volumes);
            }
            tracing::info!(node = %ctx.me.node, "initial lists received; ready");
            orphans::remove_orphan_directories(&ctx).await;
        });
    }
    tokio::spawn(refresh_pools(ctx.clone()));

    tracing::info!(node = %config.node_name, provisioner = %config.provisioner_name, "hostpath-provisioner running");
    futures::join!(claim_controller, own_volumes, legacy_volumes);
    tracing::info!("in-flight operations finished; exiting");
    Ok(())
}

/// Marks the API reachable or not from a watch stream's results, and counts restarts.
fn observe<S, T>(
    watch: &'static str,
    stream: S,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
) -> impl futures::Stream<Item = Result<T, watcher::Error>> + Send
where
    S: futures::Stream<Item = Result<T, watcher::Error>> + Send,
{
    stream.inspect(move |result| match result {
        Ok(_) => health.set_api_reachable(true),
        Err(error) => {
            tracing::warn!(watch, %error, "watch failed; retrying with backoff");
            health.set_api_reachable(false);
            metrics.watch_restarts.get_or_create(&WatchLabel { watch: watch.into() }).inc();
        }
    })
}

fn serve_http(config: &Config, health: &Arc<Health>, metrics: &Arc<Metrics>) {
    let mut addrs = Vec::new();
    addrs.extend(config.health_addr);
    addrs.extend(config.metrics_addr.filter(|m| Some(*m) != config.health_addr));
    for addr in addrs {
        let (health, metrics) = (health.clone(), metrics.clone());
        tokio::spawn(async move {
            if let Err(error) = health::serve(addr, health, metrics).await {
                tracing::error!(%addr, %error, "HTTP endpoint failed");
            }
        });
    }
}

/// Keeps pool gauges and pool readiness current.
async fn refresh_pools(ctx: Arc<Context>) {
    let mut ticker = tokio::time::interval(POOL_REFRESH);
    loop {
        ticker.tick().await;
        let mut usable = true;
        for (name, pool) in &ctx.pools {
            let label = PoolLabel { pool: name.clone() };
            match pool.check(ctx.config.require_mountpoint).and_then(|()| pool.stats()) {
                Ok(stats) => {
                    ctx.metrics.pool_capacity_bytes.get_or_create(&label).set(stats.total_bytes as i64);
                    ctx.metrics.pool_free_bytes.get_or_create(&label).set(stats.available_bytes as i64);
                }
                Err(error) => {
                    usable = false;
                    tracing::warn!(pool = %name, %error, "pool unusable");
                }
            }
        }
        ctx.health.set_pools_usable(usable);
    }
}

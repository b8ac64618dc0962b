//! `--publish-capacity`: keeps this node's `CSIStorageCapacity` objects (one per class it can
//! serve, in the provisioner's namespace) in step with its pools' free space, removes them on a
//! clean shutdown, and removes those of nodes whose provisioner is gone (killed: its lease
//! expired). `deciding::published_capacity` decides what, when and which; this task measures,
//! lists and writes.
//!
//! Cost: local statvfs every few seconds; a write only when a figure moved enough (and at most
//! once per object per minimum interval), so an idle cluster writes nothing; one list of this
//! provisioner's objects and of the leases per lease duration.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

use crate::deciding::capacity::{CapacityAccounting, PoolRoom, format_binary_si, format_size, parse_bytes};
use crate::deciding::layout;
use crate::deciding::published_capacity::{self, Listed, PoolSpace, Published, Wanted, Write};
use crate::deciding::quota::{self, QuotaCapability};
use crate::deciding::volume::promised_bytes;
use crate::error::reason;
use crate::keys;
use crate::reconciling::context::Context;

/// How often free space is measured (local statvfs, no API call).
const MEASURE_INTERVAL: Duration = Duration::from_secs(5);
/// Longest the removal of this node's objects may hold up a shutdown.
const WITHDRAW_TIMEOUT: Duration = Duration::from_secs(3);
/// Key of the publisher's backoff among the context's retry delays.
const RETRY_KEY: &str = "published-capacity";
/// Field manager of our server-side applies.
const FIELD_MANAGER: &str = "hostpath-provisioner";

/// What this node wrote for one object.
#[derive(Clone, Debug)]
struct Record {
    pool: String,
    bytes: u64,
    /// `None`: found on the server, written before this process started.
    written_at: Option<Instant>,
}

#[derive(Default)]
struct State {
    published: BTreeMap<String, Record>,
    /// Set on shutdown: nothing is written after the objects were withdrawn.
    stopped: bool,
    /// A write failed last time (log and event once per failing spell, not per attempt).
    failing: bool,
    /// While writes fail, the next round waits until then (backoff up to 5 min).
    retry_at: Option<Instant>,
}

/// This node's publisher of CSIStorageCapacity objects.
pub struct Publisher {
    api: Api<CSIStorageCapacity>,
    namespace: String,
    selector: String,
    state: tokio::sync::Mutex<State>,
}

impl Publisher {
    /// A publisher writing into the provisioner's namespace (that of the liveness leases).
    pub fn new(ctx: &Context) -> Publisher {
        Publisher {
            api: Api::namespaced(ctx.client.clone(), &ctx.config.namespace),
            namespace: ctx.config.namespace.clone(),
            selector: format!("{}={}", keys::LEASE_PROVISIONER_LABEL, ctx.membership.provisioner_hash()),
            state: tokio::sync::Mutex::new(State::default()),
        }
    }
}

/// Publishes until [`withdraw`] is called: waits for the initial lists (an empty view of the
/// classes would withdraw every object), then measures every few seconds and looks at the
/// objects on the server when [`sweep_due`] says.
pub async fn run(ctx: Arc<Context>, publisher: Arc<Publisher>) {
    while !ctx.health.all_synced() {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::info!(namespace = %publisher.namespace, "publishing free space per class as CSIStorageCapacity objects");
    let mut last_sweep: Option<(Instant, u64)> = None;
    let mut was_ready = true;
    loop {
        // While this node was not ready the others counted it gone and may have removed its
        // objects: look again once it is ready.
        let ready = ctx.health.not_ready_reason().is_none();
        if ready && !was_ready {
            last_sweep = None;
        }
        was_ready = ready;
        let backing_off = publisher.state.lock().await.retry_at.is_some_and(|at| Instant::now() < at);
        if !backing_off {
            if sweep_due(&ctx, last_sweep) {
                match sweep(&ctx, &publisher).await {
                    // The sweep's own look at the live nodes is counted in.
                    Ok(()) => last_sweep = Some((Instant::now(), ctx.membership.changes())),
                    Err(error) => settle(&ctx, &publisher, publisher.state.lock().await, Some(error)).await,
                }
            }
            if last_sweep.is_some() && !publish(&ctx, &publisher).await {
                return;
            }
        }
        tokio::time::sleep(MEASURE_INTERVAL).await;
    }
}

/// Whether to look at the objects on the server: at start and after this node was not ready;
/// then, with liveness from Lease renewals, once per lease duration; with liveness from
/// readiness (which costs nothing at rest), only when the set of live nodes was seen to change,
/// so a cluster at rest makes no request.
fn sweep_due(ctx: &Context, last: Option<(Instant, u64)>) -> bool {
    match last {
        None => true,
        Some((_, changes)) if ctx.membership.from_readiness() => ctx.membership.changes() != changes,
        Some((at, _)) => at.elapsed() >= ctx.config.node_lease,
    }
}

/// Removes this node's objects (clean shutdown): the scheduler stops placing volumes here at
/// once. Bounded in time; objects left by an API outage are removed by another node once this
/// node's lease has expired.
pub async fn withdraw(ctx: &Context, publisher: &Publisher) {
    let mut state = publisher.state.lock().await;
    state.stopped = true;
    let names: Vec<String> = state.published.keys().cloned().collect();
    let delete_all = async {
        for name in &names {
            delete(publisher, name).await?;
        }
        Ok::<(), kube::Error>(())
    };
    match tokio::time::timeout(WITHDRAW_TIMEOUT, delete_all).await {
        Ok(Ok(())) => {
            if !names.is_empty() {
                tracing::info!(objects = names.len(), "withdrew this node's published capacity");
            }
        }
        Ok(Err(error)) => {
            tracing::warn!(%error, node = %ctx.me.node, "could not withdraw this node's published capacity; another node removes it once this node's lease expired")
        }
        Err(_) => tracing::warn!(
            "the API server did not answer; another node removes this node's published capacity once its lease expired"
        ),
    }
    state.published.clear();
}

/// With publishing off: removes objects this node published in an earlier run with it on, which
/// no other node would remove while this node is alive. Only for a provisioner name that can
/// have a CSIDriver (no object can exist otherwise), so default installs make no call.
pub async fn withdraw_leftovers(ctx: &Context) {
    if ctx.me.publishable_names().is_empty() {
        return;
    }
    let publisher = Publisher::new(ctx);
    let selector = format!("{},{}={}", publisher.selector, keys::NODE_LABEL, layout::node_label_value(&ctx.me.node));
    let objects = match publisher.api.list(&ListParams::default().labels(&selector)).await {
        Ok(list) => list.items,
        Err(error) => {
            tracing::debug!(%error, "cannot look for capacity objects of an earlier run");
            return;
        }
    };
    for name in objects.into_iter().filter_map(|o| o.metadata.name) {
        match delete(&publisher, &name).await {
            Ok(()) => {
                tracing::info!(object = %name, "publishing capacity is off: removed this node's object of an earlier run")
            }
            Err(error) => {
                tracing::warn!(object = %name, %error, "cannot remove this node's capacity object of an earlier run")
            }
        }
    }
}

/// Lists this provisioner's objects: refreshes what this node believes it published (an object
/// deleted or changed by someone else is rewritten) and removes those of gone nodes.
async fn sweep(ctx: &Context, publisher: &Publisher) -> Result<(), kube::Error> {
    let objects = publisher.api.list(&ListParams::default().labels(&publisher.selector)).await?.items;
    let mut listed = Vec::new();
    {
        let mut state = publisher.state.lock().await;
        let mut mine = BTreeMap::new();
        for object in &objects {
            let name = object.metadata.name.clone().unwrap_or_default();
            let annotations = object.metadata.annotations.clone().unwrap_or_default();
            let node = annotations.get(keys::NODE_LABEL).cloned();
            if node.as_deref() == Some(ctx.me.node.as_str()) {
                let pool = annotations.get(keys::PUBLISHED_POOL).cloned().unwrap_or_default();
                let bytes = object.capacity.as_ref().and_then(|q| parse_bytes(&q.0).ok());
                // Unreadable figures are rewritten (`u64::MAX` is never wanted).
                mine.insert(name.clone(), (pool, bytes.unwrap_or(u64::MAX)));
            }
            listed.push(Listed { name, node });
        }
        state.published.retain(|name, _| mine.contains_key(name));
        for (name, (pool, bytes)) in mine {
            let record = state.published.entry(name).or_insert(Record { pool: pool.clone(), bytes, written_at: None });
            if record.pool != pool || record.bytes != bytes {
                *record = Record { pool, bytes, written_at: None };
            }
        }
    }
    let live = ctx.live_nodes().await?;
    for name in published_capacity::stale(&listed, &ctx.me.node, &live) {
        let node = listed.iter().find(|l| l.name == name).and_then(|l| l.node.clone()).unwrap_or_default();
        match delete(publisher, &name).await {
            Ok(()) => {
                tracing::info!(object = %name, %node, "removed the published capacity of a node whose provisioner is gone")
            }
            Err(error) => {
                tracing::warn!(object = %name, %node, %error, "cannot remove the published capacity of a gone node; retrying")
            }
        }
    }
    Ok(())
}

/// One round: measure, decide, write. False once withdrawn.
async fn publish(ctx: &Context, publisher: &Publisher) -> bool {
    let hostname = match ctx.node_facts().await {
        Ok(facts) => facts.hostname,
        Err(error) => {
            tracing::warn!(%error, "cannot read this node's hostname label; capacity not published yet");
            return true;
        }
    };
    let classes: Vec<_> = ctx.classes.state().iter().map(|c| (**c).clone()).collect();
    let wanted = published_capacity::wanted(
        &ctx.me.publishable_names(),
        ctx.membership.provisioner_hash(),
        &ctx.me.node,
        &classes,
        &ctx.decision,
        &measure(ctx),
    );
    let mut state = publisher.state.lock().await;
    if state.stopped {
        return false;
    }
    let published: BTreeMap<String, Published> = state
        .published
        .iter()
        .map(|(name, r)| {
            let record =
                Published { pool: r.pool.clone(), bytes: r.bytes, written_ago: r.written_at.map(|at| at.elapsed()) };
            (name.clone(), record)
        })
        .collect();
    let mut failure = None;
    for write in published_capacity::writes(&wanted, &published) {
        let result = match &write {
            Write::Apply(wanted) => apply(ctx, publisher, wanted, &hostname).await.map(|()| {
                let record =
                    Record { pool: wanted.pool.clone(), bytes: wanted.bytes, written_at: Some(Instant::now()) };
                state.published.insert(wanted.name.clone(), record);
            }),
            Write::Delete(name) => delete(publisher, name).await.map(|()| {
                state.published.remove(name);
            }),
        };
        if let Err(error) = result {
            failure = Some(error);
        }
    }
    settle(ctx, publisher, state, failure).await;
    true
}

/// After a round (or a failed list): backs off while the API refuses or fails, and reports the
/// start and the end of a failing spell once each.
async fn settle(
    ctx: &Context,
    publisher: &Publisher,
    mut state: tokio::sync::MutexGuard<'_, State>,
    failure: Option<kube::Error>,
) {
    if failure.is_some() {
        state.retry_at = Some(Instant::now() + ctx.next_retry(RETRY_KEY));
    } else {
        state.retry_at = None;
        ctx.reset_retry(RETRY_KEY);
    }
    match failure {
        Some(error) if !state.failing => {
            state.failing = true;
            drop(state);
            report_failure(ctx, publisher, &error).await;
        }
        Some(error) => tracing::debug!(%error, "capacity objects still cannot be read or written"),
        None if state.failing => {
            state.failing = false;
            tracing::info!("published capacity is written again");
        }
        None => {}
    }
}

/// Room per pool now: free space minus each pool's reserve, and with requests accounting no more
/// than what is not promised (the same figure the provisioning check uses).
fn measure(ctx: &Context) -> Vec<PoolSpace> {
    let volumes: Vec<_> = ctx.volumes.iter().flat_map(|store| store.state()).collect();
    ctx.config
        .pools
        .iter()
        .map(|pool| {
            let reserve = pool.reserve.unwrap_or(ctx.config.reserved_bytes);
            // Snapshots' byte copies are promised space too (deciding::copy_room), as the
            // provisioning check counts them.
            let kept_copies = ctx.copies.lock().unwrap_or_else(|e| e.into_inner()).kept_bytes(&pool.root);
            let promised = (pool.accounting == Some(CapacityAccounting::Requests))
                .then(|| promised_bytes(volumes.iter().map(|pv| pv.as_ref()), &pool.root).saturating_add(kept_copies));
            let (usable_bytes, enforces_quota) = match ctx.pools.usable(&pool.root) {
                Some(Ok(root)) => (
                    root.stats().ok().map(|s| {
                        PoolRoom { available: s.available_bytes, total: s.go_total_bytes, reserved: reserve, promised }
                            .room()
                    }),
                    root.quota_facts().is_ok_and(|f| !matches!(quota::capability(&f), QuotaCapability::Unable(_))),
                ),
                _ => (None, false),
            };
            PoolSpace { pool: pool.name.clone(), usable_bytes, enforces_quota }
        })
        .collect()
}

async fn apply(ctx: &Context, publisher: &Publisher, wanted: &Wanted, hostname: &str) -> Result<(), kube::Error> {
    let size = format_binary_si(wanted.bytes);
    // The node selector is the value our PVs' node affinity uses, so a volume is offered exactly
    // where it can be mounted. The node is named in full in an annotation (label values are
    // limited to 63 bytes) for the removal of a gone node's objects.
    let object = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIStorageCapacity",
        "metadata": {
            "name": wanted.name,
            "namespace": publisher.namespace,
            "labels": {
                keys::LEASE_PROVISIONER_LABEL: ctx.membership.provisioner_hash(),
                keys::NODE_LABEL: layout::node_label_value(&ctx.me.node),
                "app.kubernetes.io/name": "hostpath-provisioner",
            },
            "annotations": {
                keys::NODE_LABEL: ctx.me.node,
                keys::PUBLISHED_POOL: wanted.pool,
            },
        },
        "storageClassName": wanted.class,
        "nodeTopology": { "matchLabels": { keys::HOSTNAME_LABEL: hostname } },
        "capacity": size,
        "maximumVolumeSize": size,
    });
    publisher.api.patch(&wanted.name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object)).await?;
    tracing::debug!(class = %wanted.class, pool = %wanted.pool, free = %format_size(wanted.bytes), "published capacity");
    Ok(())
}

async fn delete(publisher: &Publisher, name: &str) -> Result<(), kube::Error> {
    match publisher.api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(error) => Err(error),
    }
}

/// A log line and a Warning on this node's Node object, once per failing spell: without the
/// objects the scheduler places no claim of the affected classes on this node.
async fn report_failure(ctx: &Context, publisher: &Publisher, error: &kube::Error) {
    tracing::warn!(%error, namespace = %publisher.namespace, "cannot read or write this node's CSIStorageCapacity objects; retrying with backoff");
    let note = format!(
        "cannot publish the free space of node {} as CSIStorageCapacity objects in namespace {}, retrying with \
         backoff; until then kube-scheduler may not place volumes here, or place them by stale figures (the \
         Role needs list, create, patch and delete on csistoragecapacities.storage.k8s.io): {error}",
        ctx.me.node, publisher.namespace
    );
    match ctx.node_ref().await {
        Ok(node) => ctx.warn(&node, reason::CAPACITY_PUBLISH_FAILED, "PublishCapacity", note).await,
        Err(error) => tracing::warn!(%error, "cannot read this node's Node object to report on it"),
    }
}

//! A shared pool's record of promised space (`deciding::pool_promises`), kept in an annotation
//! of a Lease in the provisioners' namespace, which every node that provisions in the pool reads
//! and writes. The Lease is only a small object every node may already read and patch (the node
//! Role's `leases` rule); it has no holder, so liveness never mistakes it for a node's.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::pool_promises::{self, PoolPromises, RECORD_ANNOTATION};
use crate::deciding::topology::PoolKey;
use crate::deciding::volume::pool_volume_bytes;
use crate::error::ClaimError;
use crate::reconciling::context::Context;

/// How many times a decision reads, lists and writes before giving up for this reconcile (it is
/// retried with backoff): each failed attempt means another node's write succeeded.
pub const ATTEMPTS: usize = 8;

/// The record as read: its content and the version the write is conditional on (`None`: no
/// Lease yet, so the write creates it).
pub struct RecordRead {
    pub record: PoolPromises,
    version: Option<String>,
    pool: PoolKey,
    lease: String,
}

/// Seconds since the Unix epoch, the clock promises are stamped with (nodes' clocks differ by
/// far less than [`pool_promises::PROMISE_TTL`]).
pub fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs()
}

fn leases(ctx: &Context) -> Api<Lease> {
    Api::namespaced(ctx.client.clone(), &ctx.config.namespace)
}

fn lease_ref(ctx: &Context, lease: &str) -> String {
    format!("{}/{lease}", ctx.config.namespace)
}

/// Reads the pool's record (a consistent read: never a cache).
pub async fn read(ctx: &Context, pool: &PoolKey) -> Result<RecordRead, ClaimError> {
    let lease = pool_promises::lease_name(&ctx.me.provisioner, pool);
    let found = leases(ctx).get_opt(&lease).await?;
    let annotation = found.as_ref().and_then(|l| l.metadata.annotations.as_ref()?.get(RECORD_ANNOTATION));
    let record = pool_promises::decode(annotation.map(String::as_str)).map_err(|error| ClaimError::PromiseRecord {
        pool: pool.name.clone(),
        lease: lease_ref(ctx, &lease),
        annotation: RECORD_ANNOTATION,
        error,
    })?;
    let version = found.and_then(|l| l.metadata.resource_version);
    Ok(RecordRead { record, version, pool: pool.clone(), lease })
}

/// The pool's volumes by PV name with their capacity, from a consistent list of the PVs (the
/// watch caches lag behind creates other nodes just made).
pub async fn listed(ctx: &Context, root: &Path) -> Result<BTreeMap<String, u64>, ClaimError> {
    let pvs = Api::<KeptVolume>::all(ctx.client.clone()).list(&ListParams::default()).await?;
    Ok(pool_volume_bytes(pvs.items.iter(), root).map(|(name, bytes)| (name.to_owned(), bytes)).collect())
}

/// Writes `record` on condition that the record is still the one `read` saw. `Ok(false)`:
/// another node wrote it meanwhile; read again.
pub async fn write(ctx: &Context, read: &RecordRead, record: &PoolPromises) -> Result<bool, ClaimError> {
    let value = pool_promises::encode(record);
    let result = match &read.version {
        None => {
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {
                    "name": read.lease,
                    "labels": {"app.kubernetes.io/component": "pool-promises"},
                    "annotations": {RECORD_ANNOTATION: value},
                },
            }))
            .map_err(|e| ClaimError::PromiseRecord {
                pool: read.pool.name.clone(),
                lease: lease_ref(ctx, &read.lease),
                annotation: RECORD_ANNOTATION,
                error: e.to_string(),
            })?;
            leases(ctx).create(&PostParams::default(), &lease).await.map(|_| ())
        }
        // A patch carrying the resourceVersion is refused (409) unless the object still has it.
        Some(version) => {
            let patch = json!({"metadata": {"resourceVersion": version, "annotations": {RECORD_ANNOTATION: value}}});
            leases(ctx).patch(&read.lease, &PatchParams::default(), &Patch::Merge(&patch)).await.map(|_| ())
        }
    };
    match result {
        Ok(()) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error.into()),
    }
}

/// Drops `pv`'s promise once its create returned, made or failed. A record that cannot be
/// written now keeps the promise until it expires: the pool under-promises meanwhile, which the
/// log says.
pub async fn settle(ctx: &Context, pool: &PoolKey, pv: &str) {
    for _ in 0..ATTEMPTS {
        let outcome = async {
            let read = read(ctx, pool).await?;
            if !read.record.by_pv.contains_key(pv) {
                return Ok(true);
            }
            write(ctx, &read, &pool_promises::settle(&read.record, pv)).await
        }
        .await;
        match outcome {
            Ok(true) => return,
            Ok(false) => continue,
            Err(error) => {
                tracing::warn!(pool = %pool.name, %pv, %error, "could not drop the volume's promise from the pool's record; it expires on its own");
                return;
            }
        }
    }
    tracing::warn!(pool = %pool.name, %pv, "other nodes kept changing the pool's record; the volume's promise expires on its own");
}

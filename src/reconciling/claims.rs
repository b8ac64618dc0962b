//! The claim reconciler: decide whether a claim is this node's, then ensure its directory and PV.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use crate::deciding::capacity::{format_binary_si, round_down_pretty};
use crate::deciding::claim::{self as claim_decision, BindingMode, Decision, Interest, ProvisionPlan, SkipReason};
use crate::deciding::quota::{self, QuotaMode, VolumeQuota};
use crate::deciding::retention;
use crate::deciding::static_binding::pre_bound_volume;
use crate::deciding::topology::{self, Acting, Topology};
use crate::deciding::volume_spec::build_pv;
use crate::error::{ClaimError, Retry, reason};
use crate::filesystem::{Created, VolumeDirName};
use crate::keys;
use crate::reconciling::clones;
use crate::reconciling::context::{Context, MAX_RETRY};
use crate::reconciling::resize;
use crate::serving::metrics::{ClaimClass, Metrics};

/// How soon a protected source claim seen before the PV watches synced is looked at again.
const UNSYNCED_RECHECK: Duration = Duration::from_secs(5);
/// How often a claim left to the PV controller (an existing PV may bind it) is looked at again.
const STATIC_RECHECK: Duration = Duration::from_secs(30);
/// How long to wait before looking again at a claim whose class does not exist yet.
const CLASS_RECHECK: Duration = Duration::from_secs(30);
/// How often a claim waiting for a node without a running provisioner is looked at again.
const STRANDED_RECHECK: Duration = Duration::from_secs(300);
/// How long to wait before looking again for a node that serves a claim's pool.
const NO_NODE_RECHECK: Duration = Duration::from_secs(60);
/// How long a report of a claim waiting for a node without a provisioner holds: two rechecks and
/// a margin, so it lapses only once its speaker stopped looking (the claim went, or the speaker).
const WAITING_REPORT_VALIDITY: Duration = Duration::from_secs(2 * STRANDED_RECHECK.as_secs() + 60);

/// Reconciles one claim, as the watch cache holds it (deciding::retention: only claims this
/// node may act on are there).
pub async fn reconcile(claim: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Action, ClaimError> {
    let key = object_key(&claim.metadata);
    match claim_decision::claim_interest(&claim.metadata, &ctx.me) {
        Interest::Ignore => {
            ctx.reset_retry(&key);
            ctx.forget_stranded(&claim.metadata);
            forget_waiting(&ctx, &claim.metadata);
            let mut protection = Action::await_change();
            // A source claim whose clones are all done (or gone) loses its cloning protection.
            if claim.metadata.finalizers.iter().flatten().any(|f| f == keys::CLONE_PROTECTION_FINALIZER)
                && let (Some(uid), Some(namespace), Some(name)) =
                    (claim.metadata.uid.as_deref(), claim.metadata.namespace.as_deref(), claim.metadata.name.as_deref())
            {
                if ctx.known_volume(&crate::deciding::layout::pv_name(uid)).is_some() {
                    protection = clones::check_source_protection(&ctx, namespace, name).await?;
                } else if !ctx.health.all_synced() {
                    // At start-up the claims may come before the PVs: look again once they are in.
                    protection = Action::requeue(UNSYNCED_RECHECK);
                }
            }
            // A bound claim of one of this node's PVs may ask for more room (expansion).
            if claim.metadata.deletion_timestamp.is_none()
                && let Some(uid) = claim.metadata.uid.as_deref()
            {
                if let Some(pv) = resize::bound_volume(&ctx, uid) {
                    resize::reconcile(&ctx, &claim, &pv).await;
                } else if !ctx.health.all_synced() && retention::size_change_pending(&claim) {
                    // At start-up the claims may come before the PVs: look again once they are in.
                    protection = Action::requeue(UNSYNCED_RECHECK);
                }
            }
            return Ok(protection);
        }
        Interest::Elsewhere(node) => return watch_for_no_provisioner(&ctx, &claim, &node).await,
        Interest::Candidate => forget_waiting(&ctx, &claim.metadata),
    }
    let claim = claim.as_ref();
    let class = claim_decision::claim_class_name(claim).and_then(|class| ctx.classes.get(&ObjectRef::new(class)));
    // Only volumes without an owning node need to know who else is alive.
    let needs_live = class.as_deref().is_some_and(|c| {
        c.provisioner == ctx.me.provisioner && claim_decision::class_topology(c, &ctx.decision) != Some(Topology::Node)
    });
    let live = if needs_live { ctx.live_nodes().await? } else { Vec::new() };
    let library_labels = library_labels(claim);
    let decision = claim_decision::decide_claim(claim, class.as_deref(), &ctx.me, &ctx.decision, &live);
    let (decision, clone_from) = match clones::prepare(&ctx, claim, class.as_deref(), &live, decision).await? {
        clones::Prepared::Decided(decision, clone_from) => (decision, clone_from),
        clones::Prepared::Done(action) => {
            ctx.reset_retry(&key);
            return Ok(action);
        }
    };
    let action = match decision {
        Decision::Skip(SkipReason::ClassNotFound(class)) => {
            tracing::debug!(claim = %key, %class, "class not found; looking again later");
            Action::requeue(CLASS_RECHECK)
        }
        Decision::Skip(SkipReason::ActedOnBy { node, recheck_after }) => {
            // Look again once that node's lease would have run out, in case it died.
            tracing::trace!(claim = %key, %node, "another live node provisions it");
            Action::requeue(recheck_after)
        }
        Decision::Skip(skip) => {
            tracing::trace!(claim = %key, ?skip, "not ours");
            Action::await_change()
        }
        Decision::HandBack(refusal) => {
            ctx.metrics.library.provision_failed(&library_labels);
            handback(&ctx, claim, &refusal.to_string(), refusal_label(&refusal)).await?;
            Action::await_change()
        }
        Decision::ExplainImmediate => {
            explain_immediate(&ctx, claim).await;
            Action::await_change()
        }
        Decision::Refuse(refusal) => {
            tracing::warn!(claim = %key, %refusal, "refusing claim");
            Metrics::outcome(&ctx.metrics.provisions, "refused", refusal_label(&refusal));
            ctx.metrics.library.provision_failed(&library_labels);
            ctx.warn(&claim_ref(claim), reason::PROVISIONING_FAILED, "Provision", refusal.to_string()).await;
            match refusal {
                // A node serving the pool may start later: nothing on the claim would change.
                claim_decision::Refusal::NoNodeServesPool { .. } => Action::requeue(NO_NODE_RECHECK),
                _ => Action::await_change(),
            }
        }
        Decision::Provision(plan) => {
            if let Some(pv) = existing_volume_for(&ctx, claim, &plan) {
                // The PV controller binds the claim to that PV (a change of the claim). Looked at
                // again meanwhile in case the PV goes or the PV controller is down.
                tracing::info!(claim = %key, %pv, "a PV is pre-bound to this claim: leaving it to the PV controller");
                ctx.reset_retry(&key);
                return Ok(Action::requeue(STATIC_RECHECK));
            }
            let started = Instant::now();
            // The library's count points: a PV created, or an attempt that failed or handed the
            // claim back. A PV found already there is neither (the library skips bound claims).
            match provision(&ctx, claim, &plan, clone_from.as_ref()).await {
                Ok(Provisioned::Now) => {
                    let seconds = started.elapsed().as_secs_f64();
                    ctx.metrics.provision_seconds.observe(seconds);
                    ctx.metrics.library.provisioned(&library_labels, seconds);
                }
                Ok(Provisioned::Before) => {}
                Ok(Provisioned::Rescheduled) => ctx.metrics.library.provision_failed(&library_labels),
                Err(error) => {
                    ctx.metrics.library.provision_failed(&library_labels);
                    return Err(error);
                }
            }
            Action::await_change()
        }
    };
    ctx.reset_retry(&key);
    Ok(action)
}

/// A PV pre-bound to this claim, which the PV controller binds instead of having one provisioned
/// (deciding::static_binding), for a claim the scheduler placed here before the PV controller
/// handed it to a provisioner.
fn existing_volume_for(ctx: &Context, claim: &PersistentVolumeClaim, plan: &ProvisionPlan) -> Option<String> {
    if plan.binding_mode != BindingMode::WaitForFirstConsumer
        || plan.pinned_by_annotation
        || claim_decision::annotated_for_provisioning(&claim.metadata)
    {
        return None;
    }
    // Not the PV this node made for the claim itself (it is pre-bound to the claim too).
    let volumes: Vec<_> = ctx
        .volumes
        .iter()
        .flat_map(|store| store.state())
        .filter(|pv| pv.metadata.name.as_deref() != Some(plan.pv_name.as_str()))
        .collect();
    pre_bound_volume(claim, volumes.iter().map(|pv| pv.as_ref()))
}

/// Decides when to retry after an error, and reports it on the claim.
pub fn error_policy(claim: Arc<PersistentVolumeClaim>, error: &ClaimError, ctx: Arc<Context>) -> Action {
    let key = object_key(&claim.metadata);
    Metrics::outcome(&ctx.metrics.provisions, "error", error.metric_label());
    let delay = match error.retry() {
        Retry::Backoff => ctx.next_retry(&key),
        Retry::AfterChange => MAX_RETRY,
    };
    tracing::warn!(claim = %key, %error, retry_in = ?delay, "provisioning failed");
    let ctx2 = ctx.clone();
    let regarding = claim_ref(&claim);
    let note = failure_note(error);
    let reason = error.reason();
    // error_policy is synchronous; the event goes out on its own task.
    tokio::spawn(async move { ctx2.warn(&regarding, reason, "Provision", note).await });
    Action::requeue(delay)
}

/// The labels the sig-storage library puts on its provisioning metrics: the claim's
/// `storageClassName` and the kind of its data source, each empty when absent.
fn library_labels(claim: &PersistentVolumeClaim) -> ClaimClass {
    let spec = claim.spec.as_ref();
    ClaimClass {
        class: spec.and_then(|s| s.storage_class_name.clone()).unwrap_or_default(),
        source: spec.and_then(|s| s.data_source.as_ref()).map(|d| d.kind.clone()).unwrap_or_default(),
    }
}

fn forget_waiting(ctx: &Context, meta: &ObjectMeta) {
    if let Some(uid) = meta.uid.as_deref() {
        ctx.metrics.waiting_claims.forget(uid);
    }
}

fn failure_note(error: &ClaimError) -> String {
    format!("failed to provision volume: {error}")
}

/// Whether this call created the PV, or found it already there (only the former is timed).
#[derive(Debug, PartialEq, Eq)]
enum Provisioned {
    Now,
    Before,
    /// Handed back to the scheduler instead.
    Rescheduled,
}

async fn provision(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    plan: &ProvisionPlan,
    clone_from: Option<&VolumeDirName>,
) -> Result<Provisioned, ClaimError> {
    let pvs: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
    // The watch caches answer "already provisioned?" without a round trip once synced; a PV
    // they have not seen yet is caught by AlreadyExists on create below.
    let existing = if ctx.health.all_synced() {
        ctx.known_volume(&plan.pv_name).map(|pv| (*pv).clone())
    } else {
        pvs.get_opt(&plan.pv_name).await?
    };
    if let Some(existing) = existing {
        // Already provisioned (by us before a restart, or by the Go build): nothing to do.
        return check_owner(&existing, &plan.pv_name, &claim_uid).map(|()| Provisioned::Before);
    }
    let pool = ctx.pools.usable(&plan.pool.name).ok_or_else(|| ClaimError::UnknownPool(plan.pool.name.clone()))??;
    let stats = pool.stats()?;
    let reserved = plan.pool.reserve.unwrap_or(ctx.config.reserved_bytes);
    let available = stats.available_bytes.saturating_sub(reserved);
    let dir = VolumeDirName::new(&plan.dir_name).map_err(|e| ClaimError::Pool(e.into()))?;
    let regarding = claim_ref(claim);
    let root = pool.path().display().to_string();
    // The facts cost a quotactl and two reads of /proc: only an enforce class needs them.
    let volume_quota = match plan.quota {
        QuotaMode::None => VolumeQuota::Unlimited,
        mode => quota::decide(mode, plan.request_bytes, &plan.pool.name, &root, &pool.quota_facts()?)?,
    };
    if plan.request_bytes > available && !pool.volume_dir_exists(&dir)? {
        let error = ClaimError::InsufficientSpace {
            pool: plan.pool.name.clone(),
            node: ctx.me.node.clone(),
            requested: plan.request_bytes,
            available,
            reserved,
        };
        // Another node has room of its own; a shared pool is the same filesystem everywhere.
        if plan.binding_mode == BindingMode::WaitForFirstConsumer
            && !plan.pinned_by_annotation
            && plan.topology != Topology::Shared
        {
            return handback(ctx, claim, &error.to_string(), error.metric_label())
                .await
                .map(|()| Provisioned::Rescheduled);
        }
        return Err(error);
    }
    // A plain volume is made in milliseconds, and its ProvisioningSucceeded says all a user needs:
    // one event per volume. A copy can take minutes, so a clone announces itself first. The
    // event must not delay the copy: it goes out on its own task.
    if clone_from.is_some() {
        let note = format!(
            "External provisioner is provisioning volume for claim \"{}/{}\"",
            claim.metadata.namespace.as_deref().unwrap_or_default(),
            claim.metadata.name.as_deref().unwrap_or_default()
        );
        let (events_ctx, provisioning_ref) = (ctx.clone(), regarding.clone());
        tokio::spawn(
            async move { events_ctx.normal(&provisioning_ref, reason::PROVISIONING, "Provision", note).await },
        );
    }
    let node = ctx.node_facts().await?;
    let created = match (clone_from, volume_quota) {
        (None, VolumeQuota::Unlimited) => pool.create_volume_dir(&dir, ctx.config.dir_mode)?,
        (None, VolumeQuota::BtrfsQgroup { limit_bytes }) => {
            pool.create_quota_volume(&dir, ctx.config.dir_mode, limit_bytes)?
        }
        (None, VolumeQuota::Project { limit_bytes }) => {
            pool.create_project_volume(&dir, ctx.config.dir_mode, limit_bytes)?
        }
        (Some(_), VolumeQuota::Project { .. }) => {
            return Err(crate::filesystem::PoolError::ProjectQuotaClone { path: pool.volume_path(&dir) }.into());
        }
        (Some(source), quota) => {
            let source_claim = plan.clone_of.as_deref().unwrap_or_default();
            let created = clones::copy(ctx, claim, source_claim, &pool, source, &dir).await?;
            // A clone of a quota volume is a snapshot of its subvolume, which starts without a
            // limit of its own: it gets the clone's request before any pod can write to it.
            if let Some(limit_bytes) = quota.limit_bytes() {
                pool.set_quota_limit(&dir, limit_bytes)?;
            }
            created
        }
    };
    let capacity = if quota::pv_reports_filesystem_size(ctx.config.pv_capacity, volume_quota) {
        Quantity(format_binary_si(round_down_pretty(stats.go_total_bytes)))
    } else {
        Quantity(plan.request.clone())
    };
    let pv = build_pv(plan, claim, &ctx.me, &node, capacity);
    match pvs.create(&PostParams::default(), &pv).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {
            // Made by an earlier attempt whose PV the watch cache had not shown yet: fine if it is
            // for this claim, and already counted and reported by that attempt.
            let existing = pvs.get(&plan.pv_name).await?;
            return check_owner(&existing, &plan.pv_name, &claim_uid).map(|()| Provisioned::Before);
        }
        Err(create_error) => {
            // Leave nothing behind: remove the directory again if this attempt made it and it
            // is still empty (a directory a workload already wrote to is never touched here),
            // but only when the API server answered that it did not create the PV. A request
            // cut off on the way back (a network partition, a restart) may well have created it:
            // removing the directory then would leave a bound PV without one. The retry reuses
            // the directory; if the claim goes meanwhile, the start-up sweep removes it.
            // Not on a shared pool: another node may be creating the PV for this directory right
            // now (a failover race), and an empty directory there costs nothing until the retry.
            let refused_by_api = matches!(&create_error, kube::Error::Api(status) if (400..500).contains(&status.code));
            // A clone's directory holds only a copy: it goes to the trash (the source stays).
            let cleanup = || match clone_from {
                None => pool.remove_empty_volume_dir(&dir),
                Some(_) => pool.move_to_trash(&dir).map(|_| ()),
            };
            if created == Created::New
                && refused_by_api
                && plan.topology != Topology::Shared
                && let Err(cleanup) = cleanup()
            {
                return Err(ClaimError::Cleanup {
                    create: create_error.to_string(),
                    dir: pool.path().join(dir.as_str()).display().to_string(),
                    cleanup: cleanup.to_string(),
                });
            }
            return Err(create_error.into());
        }
    }
    tracing::info!(claim = %claim_key(claim), pv = %plan.pv_name, path = %pool.path().join(dir.as_str()).display(), "provisioned");
    Metrics::outcome(&ctx.metrics.provisions, "success", "none");
    ctx.forget_warnings(&claim_uid);
    ctx.normal(
        &regarding,
        reason::PROVISIONING_SUCCEEDED,
        "Provision",
        format!("Successfully provisioned volume {}", plan.pv_name),
    )
    .await;
    Ok(Provisioned::Now)
}

fn check_owner(pv: &PersistentVolume, pv_name: &str, claim_uid: &str) -> Result<(), ClaimError> {
    let bound_uid =
        pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.uid.as_deref()).unwrap_or_default();
    if bound_uid == claim_uid {
        Ok(())
    } else {
        Err(ClaimError::PvConflict { pv: pv_name.to_owned(), other_uid: bound_uid.to_owned() })
    }
}

/// Gives a WaitForFirstConsumer claim back to the scheduler by removing `selected-node`, so that
/// it can pick a node with room or with the pool. The JSON patch tests the value first: if the
/// scheduler already moved the claim elsewhere, nothing is removed.
pub(crate) async fn handback(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    why: &str,
    label: &str,
) -> Result<(), ClaimError> {
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), claim.metadata.namespace.as_deref().unwrap_or_default());
    let pointer = format!("/metadata/annotations/{}", keys::SELECTED_NODE.replace('~', "~0").replace('/', "~1"));
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        { "op": "test", "path": pointer, "value": ctx.me.node },
        { "op": "remove", "path": pointer },
    ]))
    .map_err(|e| ClaimError::Api(kube::Error::SerdeError(e)))?;
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    match claims.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch)).await {
        Ok(_) => {}
        // 422: the test failed (the annotation changed meanwhile); 404: claim gone. Both fine.
        Err(kube::Error::Api(status)) if status.code == 422 || status.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    tracing::info!(claim = %claim_key(claim), %why, "handed the claim back to the scheduler");
    Metrics::outcome(&ctx.metrics.provisions, "rescheduled", label);
    ctx.warn(
        &claim_ref(claim),
        reason::PROVISIONING_FAILED,
        "Provision",
        format!("{why}; removed {} so the scheduler can choose another node", keys::SELECTED_NODE),
    )
    .await;
    Ok(())
}

/// A claim placed on another node waits for that node's provisioner. When that node has had no
/// live lease for a whole lease duration (the DaemonSet does not run there: a taint it does not
/// tolerate, a nodeSelector, a typo in the annotation), one node says so on the claim, once.
/// A claim whose node is alive is provisioned there within moments and leaves this node's cache
/// when bound, so the leases are looked at only for a claim still waiting after that grace.
async fn watch_for_no_provisioner(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    node: &str,
) -> Result<Action, ClaimError> {
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    let waited = ctx.stranded_for(uid);
    let grace = ctx.config.node_lease;
    if waited < grace {
        return Ok(Action::requeue(grace - waited + Duration::from_secs(1)));
    }
    let live = ctx.live_nodes().await?;
    if live.iter().any(|n| n.node == node) {
        // Alive, and the claim waits for something else there (that node explains it).
        forget_waiting(ctx, &claim.metadata);
        return Ok(Action::requeue(STRANDED_RECHECK));
    }
    // Another node speaks; look again when its lease would have expired, in case it died.
    if let Acting::Other { recheck_after, .. } = topology::spokesman(uid, &ctx.me.node, &live) {
        forget_waiting(ctx, &claim.metadata);
        return Ok(Action::requeue(recheck_after.min(STRANDED_RECHECK)));
    }
    // provisionOnNode says nothing about the class: only claims of our classes are ours to explain.
    let ours = claim_decision::claim_class_name(claim)
        .and_then(|class| ctx.classes.get(&ObjectRef::new(class)))
        .is_some_and(|class| class.provisioner == ctx.me.provisioner);
    let pending = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_none_or(str::is_empty);
    if ours && pending {
        let note = format!(
            "this claim waits for node {node}, where no hostpath-provisioner is running (no live lease in namespace {}): \
             check that the provisioner DaemonSet runs there (taints it does not tolerate, its nodeSelector) and that \
             the node name is right",
            ctx.config.namespace
        );
        explain_once(ctx, claim, "no-provisioner-on-node", reason::NO_PROVISIONER_ON_NODE, note).await;
        ctx.metrics.waiting_claims.report(uid, node, WAITING_REPORT_VALIDITY);
    } else {
        forget_waiting(ctx, &claim.metadata);
    }
    Ok(Action::requeue(STRANDED_RECHECK))
}

/// Writes the single cluster-wide explanation for an Immediate claim that names no node.
async fn explain_immediate(ctx: &Context, claim: &PersistentVolumeClaim) {
    let note = format!(
        "StorageClass {} uses volumeBindingMode Immediate, so no node is chosen for this claim and it will stay Pending. \
         Use a WaitForFirstConsumer StorageClass (recommended), or annotate the claim with {}: <node name>.",
        claim_decision::claim_class_name(claim).unwrap_or_default(),
        keys::PROVISION_ON_NODE
    );
    explain_once(ctx, claim, "node-selection-required", reason::NODE_SELECTION_REQUIRED, note).await;
}

/// Writes a Warning that speaks for the cluster, not for one node: every node computes the same
/// event name, so the first create wins and the others get AlreadyExists.
pub(crate) async fn explain_once(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    suffix: &str,
    reason: &str,
    note: String,
) {
    let (Some(namespace), Some(uid)) = (claim.metadata.namespace.as_deref(), claim.metadata.uid.as_deref()) else {
        return;
    };
    let event = K8sEvent {
        metadata: ObjectMeta {
            name: Some(format!("{uid}.{suffix}")),
            namespace: Some(namespace.to_owned()),
            ..Default::default()
        },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        action: Some("Provision".into()),
        reason: Some(reason.into()),
        note: Some(note),
        regarding: Some(claim_ref(claim)),
        reporting_controller: Some(ctx.me.provisioner.clone()),
        reporting_instance: Some(ctx.me.provisioner.clone()),
        type_: Some("Warning".into()),
        ..Default::default()
    };
    let events: Api<K8sEvent> = Api::namespaced(ctx.client.clone(), namespace);
    match events.create(&PostParams::default(), &event).await {
        Ok(_) => tracing::info!(claim = %claim_key(claim), reason, "explained why the claim stays Pending"),
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => tracing::warn!(claim = %claim_key(claim), %error, reason, "could not publish the explanation"),
    }
}

fn refusal_label(refusal: &claim_decision::Refusal) -> &'static str {
    use claim_decision::Refusal::*;
    match refusal {
        Block(_) => "block",
        Selector => "selector",
        DataSource(refusal) => refusal.label(),
        AccessMode { .. } | NoAccessModes => "access_mode",
        UnknownParameter { .. } | BadParameter { .. } | NoDefaultPool { .. } | TopologyPoolMismatch { .. } => {
            "parameters"
        }
        UnknownPool { .. } => "unknown_pool",
        NoNodeServesPool { .. } => "no_node_serves_pool",
        BadRequest(_) => "request",
        BadName(_) => "name",
        ProvisionOnNodeNotAllowed(_) => "provision_on_node_denied",
        MountOptions(_) => "mount_options",
    }
}

fn object_key(meta: &ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

fn claim_key(claim: &PersistentVolumeClaim) -> String {
    object_key(&claim.metadata)
}

pub(crate) fn claim_ref(claim: &PersistentVolumeClaim) -> ObjectReference {
    claim.object_ref(&())
}

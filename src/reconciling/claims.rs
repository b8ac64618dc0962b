//! The claim reconciler. A claim this node may provision is looked at as a whole: the facts its
//! plan reads are gathered ([`claim_facts`](crate::reconciling::claim_facts)), one decision
//! plans it ([`plan_claim`]) and the plan is carried out here. A settled claim is looked at only
//! for its clones' protection and for expansion. A claim placed on another node is not here: the
//! claim watch records it compactly for [`stranded`](crate::reconciling::stranded).

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use crate::deciding::capacity::parse_bytes;
use crate::deciding::claim::{Interest, claim_interest};
use crate::deciding::class::claim_class_name;
use crate::deciding::layout::pv_name;
use crate::deciding::pool_promises as promises;
use crate::deciding::provision::{self, ClaimPlan, Explanation, Failure, Later, SOURCE_RECHECK, plan_claim};
use crate::deciding::retention;
use crate::deciding::topology::PoolKey;
use crate::error::{ClaimError, Retry, reason};
use crate::filesystem::PoolError;
use crate::keys;
use crate::reconciling::claim_actions::{claim_key, claim_ref, explain_once, handback, object_key};
use crate::reconciling::claim_facts::{self, Gathered};
use crate::reconciling::clones;
use crate::reconciling::context::{Context, MAX_RETRY};
use crate::reconciling::pool_promises;
use crate::reconciling::provisioning::{self, Provisioned};
use crate::reconciling::resize;
use crate::serving::metrics::{ClaimClass, Metrics};

/// How soon a claim seen before the PV watches synced is looked at again.
const UNSYNCED_RECHECK: Duration = Duration::from_secs(5);

/// Reconciles one claim, as the watch cache holds it (deciding::retention: only claims this
/// node may act on are there).
pub async fn reconcile(claim: Arc<PersistentVolumeClaim>, ctx: Arc<Context>) -> Result<Action, ClaimError> {
    let key = object_key(&claim.metadata);
    let action = match claim_interest(&claim.metadata, &ctx.me) {
        Interest::Ignore => {
            ctx.reset_retry(&key);
            return settled(&ctx, &claim).await;
        }
        // Not kept in the cache (deciding::retention): recorded for reconciling::stranded.
        Interest::Elsewhere(_) => return Ok(Action::await_change()),
        Interest::Candidate => candidate(&ctx, &claim).await?,
    };
    ctx.reset_retry(&key);
    Ok(action)
}

/// A claim that is not (or no longer) a candidate: a source claim whose clones are all done loses
/// its cloning protection, and a bound claim of this node's PV may ask for more room.
async fn settled(ctx: &Arc<Context>, claim: &PersistentVolumeClaim) -> Result<Action, ClaimError> {
    let meta = &claim.metadata;
    let mut action = Action::await_change();
    if meta.finalizers.iter().flatten().any(|f| f == keys::CLONE_PROTECTION_FINALIZER)
        && let (Some(uid), Some(namespace), Some(name)) =
            (meta.uid.as_deref(), meta.namespace.as_deref(), meta.name.as_deref())
    {
        if ctx.known_volume(&pv_name(uid)).is_some() {
            action = clones::check_source_protection(ctx, namespace, name).await?;
        } else if !ctx.health.all_synced() {
            // At start-up the claims may come before the PVs: look again once they are in.
            action = Action::requeue(UNSYNCED_RECHECK);
        }
    }
    if meta.deletion_timestamp.is_none()
        && let Some(uid) = meta.uid.as_deref()
    {
        if let Some(pv) = resize::bound_volume(ctx, uid) {
            resize::reconcile(ctx, claim, &pv).await;
        } else if !ctx.health.all_synced() && retention::size_change_pending(claim) {
            action = Action::requeue(UNSYNCED_RECHECK);
        }
    }
    Ok(action)
}

/// A claim this node may provision: gather, plan, carry out.
async fn candidate(ctx: &Arc<Context>, claim: &PersistentVolumeClaim) -> Result<Action, ClaimError> {
    let class = claim_class_name(claim).and_then(|class| ctx.classes.get(&ObjectRef::new(class)));
    let needs = provision::facts_needed(claim, class.as_deref(), &ctx.me, &ctx.decision);
    let mut gathered = claim_facts::gather(ctx, claim, &needs).await?;
    if needs.shared_promises
        && let Some(pool) = gathered.pool_key()
    {
        return shared_pool_candidate(ctx, claim, class.as_deref(), gathered, &pool).await;
    }
    if !needs.promised {
        let plan = plan_claim(&gathered.facts(claim, class.as_deref(), ctx));
        return carry_out(ctx, claim, plan, &mut gathered).await;
    }
    // Requests accounting: what the pool has promised, the plan and the reservation of the new
    // volume are one step under the ledger's lock, so claims planned at the same time (or before
    // the watch shows the last one's PV) see each other (deciding::reservations).
    let plan = {
        let mut ledger = ctx.reservations.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        gathered.count_promised(ctx, claim.metadata.uid.as_deref().unwrap_or_default(), &ledger, now);
        let plan = plan_claim(&gathered.facts(claim, class.as_deref(), ctx));
        if let ClaimPlan::Provision(provision) = &plan {
            let bytes = parse_bytes(&provision.capacity).unwrap_or(provision.plan.request_bytes);
            let cached = |name: &str| ctx.known_volume(name).is_some();
            // By root: each root of a pool of several promises its own space.
            let root = provision.plan.pool.root.to_string_lossy();
            ledger.reserve(&root, &provision.plan.pv_name, bytes, cached, now);
        }
        plan
    };
    carry_out(ctx, claim, plan, &mut gathered).await
}

/// A claim of a `shared` pool with requests accounting: other nodes make volumes in the pool at
/// the same time, so what is promised comes from the pool's shared record and a consistent list
/// of the PVs, and the new volume's promise is written to the record, on condition that nobody
/// wrote it meanwhile, before the volume is made (deciding::pool_promises). A lost race reads
/// again.
async fn shared_pool_candidate(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    class: Option<&k8s_openapi::api::storage::v1::StorageClass>,
    mut gathered: Gathered,
    pool: &PoolKey,
) -> Result<Action, ClaimError> {
    // Only a claim this node would make reads the record: planned as if nothing were promised,
    // any other plan (another node acts, a refusal for another reason) stands as it is, and
    // those nodes cost the API nothing.
    gathered.set_promised(0);
    let unpromised = plan_claim(&gathered.facts(claim, class, ctx));
    if !matches!(unpromised, ClaimPlan::Provision(_)) {
        return carry_out(ctx, claim, unpromised, &mut gathered).await;
    }
    let own = pv_name(claim.metadata.uid.as_deref().unwrap_or_default());
    for _ in 0..pool_promises::ATTEMPTS {
        let read = pool_promises::read(ctx, pool).await?;
        let listed = pool_promises::listed(ctx, std::path::Path::new(&pool.root)).await?;
        let now = pool_promises::now_secs();
        gathered.set_promised(promises::promised(&listed, &read.record, &own, now));
        let plan = plan_claim(&gathered.facts(claim, class, ctx));
        let ClaimPlan::Provision(provision) = &plan else {
            return carry_out(ctx, claim, plan, &mut gathered).await;
        };
        let bytes = parse_bytes(&provision.capacity).unwrap_or(provision.plan.request_bytes);
        let record = promises::with_promise(&listed, &read.record, &own, bytes, now);
        if !pool_promises::write(ctx, &read, &record).await? {
            continue;
        }
        let outcome = carry_out(ctx, claim, plan, &mut gathered).await;
        // Made (its PV now counts from the list) or failed (nothing is promised): either way
        // the promise has done its work.
        pool_promises::settle(ctx, pool, &own).await;
        return outcome;
    }
    Err(ClaimError::PromiseContention {
        pool: pool.name.clone(),
        lease: format!("{}/{}", ctx.config.namespace, promises::lease_name(&ctx.me.provisioner, pool)),
        attempts: pool_promises::ATTEMPTS,
    })
}

async fn carry_out(
    ctx: &Arc<Context>,
    claim: &PersistentVolumeClaim,
    plan: ClaimPlan,
    gathered: &mut Gathered,
) -> Result<Action, ClaimError> {
    let key = claim_key(claim);
    let library_labels = library_labels(claim);
    let action = match plan {
        ClaimPlan::Idle(skip) => {
            tracing::trace!(claim = %key, ?skip, "not ours");
            Action::await_change()
        }
        ClaimPlan::LookAgain { why, after } => {
            match why {
                Later::ClassNotFound(class) => {
                    tracing::debug!(claim = %key, %class, "class not found; looking again later")
                }
                Later::ActedOnBy(node) => tracing::trace!(claim = %key, %node, "another live node provisions it"),
                Later::PreBound(pv) => {
                    tracing::info!(claim = %key, %pv, "a PV is pre-bound to this claim: leaving it to the PV controller")
                }
            }
            Action::requeue(after)
        }
        ClaimPlan::Refuse { refusal, recheck } => {
            tracing::warn!(claim = %key, %refusal, "refusing claim");
            Metrics::outcome(&ctx.metrics.provisions, "refused", refusal.label());
            ctx.metrics.library.provision_failed(&library_labels);
            ctx.warn(&claim_ref(claim), reason::PROVISIONING_FAILED, "Provision", refusal.to_string()).await;
            recheck.map_or_else(Action::await_change, Action::requeue)
        }
        ClaimPlan::HandBack { why, label } => {
            ctx.metrics.library.provision_failed(&library_labels);
            handback(ctx, claim, &why, label).await?;
            Action::await_change()
        }
        ClaimPlan::Explain { explanation, recheck } => {
            explain(ctx, claim, explanation).await;
            recheck.map_or_else(Action::await_change, Action::requeue)
        }
        ClaimPlan::WaitForSource(why) => {
            tracing::info!(claim = %key, %why, "clone waits for its source");
            ctx.warn(&claim_ref(claim), reason::CLONE_SOURCE_NOT_READY, "Provision", why).await;
            Action::requeue(SOURCE_RECHECK)
        }
        // Made by us before a restart, or by the Go build: nothing to do, nothing to count (the
        // library skips bound claims).
        ClaimPlan::AlreadyProvisioned => Action::await_change(),
        ClaimPlan::Fail(failure) => {
            ctx.metrics.library.provision_failed(&library_labels);
            return Err(gathered.error_for(failure));
        }
        ClaimPlan::Provision(provision) => {
            let Some(pool) = gathered.handle(&provision.plan.pool.root) else {
                ctx.reservations.lock().unwrap_or_else(|e| e.into_inner()).release(&provision.plan.pv_name);
                return Err(ClaimError::UnknownPool(provision.plan.pool.name.clone()));
            };
            let started = Instant::now();
            // The library's count points: a PV created, or an attempt that failed. A PV found
            // already there is neither.
            match provisioning::provision(ctx, claim, &provision, &pool).await {
                Ok(Provisioned::Now) => {
                    let seconds = started.elapsed().as_secs_f64();
                    ctx.metrics.provision_seconds.observe(seconds);
                    ctx.metrics.library.provisioned(&library_labels, seconds);
                }
                Ok(Provisioned::Before) => {}
                Err(error) => {
                    // Nothing was made, so nothing is promised (a no-op for pools without
                    // requests accounting).
                    ctx.reservations.lock().unwrap_or_else(|e| e.into_inner()).release(&provision.plan.pv_name);
                    ctx.metrics.library.provision_failed(&library_labels);
                    return Err(error);
                }
            }
            Action::await_change()
        }
    };
    Ok(action)
}

/// Writes the single cluster-wide explanation of why a claim stays Pending.
async fn explain(ctx: &Context, claim: &PersistentVolumeClaim, explanation: Explanation) {
    match explanation {
        Explanation::NodeSelectionRequired { class } => {
            let note = format!(
                "StorageClass {class} uses volumeBindingMode Immediate, so no node is chosen for this claim and it will \
                 stay Pending. Use a WaitForFirstConsumer StorageClass (recommended), or annotate the claim with {}: \
                 <node name>.",
                keys::PROVISION_ON_NODE
            );
            explain_once(ctx, claim, "node-selection-required", reason::NODE_SELECTION_REQUIRED, note).await;
        }
        Explanation::CloneSourceNotReady(why) => {
            explain_once(ctx, claim, "clone-source-not-ready", reason::CLONE_SOURCE_NOT_READY, why).await;
        }
        Explanation::CloneSourceNodeAbsent { source, node } => {
            let note = format!(
                "this claim clones claim {source:?}, whose volume lives on node {node}, where no hostpath-provisioner is \
                 running: a clone is made by the node that holds its source. Check that the provisioner DaemonSet runs \
                 there (taints it does not tolerate, its nodeSelector)"
            );
            explain_once(ctx, claim, "clone-source-node-absent", reason::CLONE_SOURCE_NOT_READY, note).await;
        }
    }
}

impl Gathered {
    /// The error a planned failure is reported and retried as.
    fn error_for(&mut self, failure: Failure) -> ClaimError {
        match failure {
            Failure::ShortOfSpace(short) => ClaimError::InsufficientSpace(short),
            Failure::QuotaUnsupported(refusal) => ClaimError::QuotaUnsupported(refusal),
            Failure::ProjectQuotaClone { path } => PoolError::ProjectQuotaClone { path }.into(),
            Failure::UnknownPool(pool) => ClaimError::UnknownPool(pool),
            Failure::PoolUnusable => match self.take_pool_error() {
                Some(error) => error.into(),
                None => ClaimError::UnknownPool(String::new()),
            },
            Failure::PvConflict { pv, other_uid } => ClaimError::PvConflict { pv, other_uid },
        }
    }
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
    let note = format!("failed to provision volume: {error}");
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

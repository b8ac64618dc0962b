//! Claims placed on another node: noticing a node where no provisioner runs, where the claim
//! would otherwise wait without a word.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

use crate::deciding::class::claim_class_name;
use crate::deciding::topology::{self, Acting};
use crate::error::{ClaimError, reason};
use crate::reconciling::claim_actions::explain_once;
use crate::reconciling::context::Context;

/// How often a claim waiting for a node without a running provisioner is looked at again.
const STRANDED_RECHECK: Duration = Duration::from_secs(300);
/// How long a report of a claim waiting for a node without a provisioner holds: two rechecks and
/// a margin, so it lapses only once its speaker stopped looking (the claim went, or the speaker).
const WAITING_REPORT_VALIDITY: Duration = Duration::from_secs(2 * STRANDED_RECHECK.as_secs() + 60);

/// A claim placed on another node waits for that node's provisioner. When that node has not been
/// live (no ready provisioner pod; with renewals, no live lease) for a whole lease duration (the
/// DaemonSet does not run there: a taint it does not tolerate, a nodeSelector, a typo in the
/// annotation), one node says so on the claim, once. A claim whose node is alive is provisioned
/// there within moments and leaves this node's cache when bound, so liveness is looked at only
/// for a claim still waiting after that grace.
pub async fn watch_for_no_provisioner(
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
    let ours = claim_class_name(claim)
        .and_then(|class| ctx.classes.get(&ObjectRef::new(class)))
        .is_some_and(|class| class.provisioner == ctx.me.provisioner);
    let pending = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_none_or(str::is_empty);
    if ours && pending {
        let evidence = match &ctx.config.peer_service {
            Some(service) => format!("no ready pod behind Service {service} in namespace {}", ctx.config.namespace),
            None => format!("no live lease in namespace {}", ctx.config.namespace),
        };
        let note = format!(
            "this claim waits for node {node}, where no hostpath-provisioner is running ({evidence}): check that the \
             provisioner DaemonSet runs there (taints it does not tolerate, its nodeSelector) and that the node name is right"
        );
        explain_once(ctx, claim, "no-provisioner-on-node", reason::NO_PROVISIONER_ON_NODE, note).await;
        ctx.metrics.waiting_claims.report(uid, node, WAITING_REPORT_VALIDITY);
    } else {
        forget_waiting(ctx, &claim.metadata);
    }
    Ok(Action::requeue(STRANDED_RECHECK))
}

/// Forgets that a claim was reported waiting for a node (it moved on, or another node speaks).
pub fn forget_waiting(ctx: &Context, meta: &ObjectMeta) {
    if let Some(uid) = meta.uid.as_deref() {
        ctx.metrics.waiting_claims.forget(uid);
    }
}

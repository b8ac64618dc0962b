//! Claims placed on another node: noticing a node where no provisioner runs, where the claim
//! would otherwise wait without a word. The claims come from the compact record the claim watch
//! keeps (deciding::waiting); this task looks at each when it is due and writes what that
//! decides.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::runtime::reflector::ObjectRef;

use crate::deciding::waiting::{Look, RECHECK, WaitingClaim, look};
use crate::error::reason;
use crate::reconciling::claim_actions::{claim_ref_of, explain_once_about};
use crate::reconciling::context::Context;

/// How often the record is scanned for claims due for a look.
const SCAN_EVERY: Duration = Duration::from_secs(5);
/// How long a report of a claim waiting for a node without a provisioner holds: two rechecks and
/// a margin, so it lapses only once its speaker stopped looking (the claim went, or the speaker).
const WAITING_REPORT_VALIDITY: Duration = Duration::from_secs(2 * RECHECK.as_secs() + 60);
/// Explanations written at once when many claims fall due together (a node with many claims
/// went away).
const EXPLAIN_CONCURRENCY: usize = 8;

/// A claim placed on another node waits for that node's provisioner. When that node has not been
/// live (no ready provisioner pod; with renewals, no live lease) for a whole lease duration (the
/// DaemonSet does not run there: a taint it does not tolerate, a nodeSelector, a typo in the
/// annotation), one node says so on the claim, once. A claim whose node is alive is provisioned
/// there within moments and leaves the record when bound, so liveness is looked at only for a
/// claim still waiting after that grace, and once per scan for all claims due in it.
pub async fn watch_for_no_provisioner(ctx: Arc<Context>) {
    let mut failing = false;
    loop {
        tokio::time::sleep(SCAN_EVERY).await;
        let due = ctx.waiting().due(Instant::now());
        if due.is_empty() {
            continue;
        }
        let live = match ctx.live_nodes().await {
            Ok(live) => {
                failing = false;
                live
            }
            Err(error) => {
                // The claims stay due: the next scan tries again.
                if !failing {
                    tracing::warn!(%error, claims = due.len(), "cannot read the live nodes to look at claims waiting for another node; retrying");
                }
                failing = true;
                continue;
            }
        };
        futures::stream::iter(due)
            .for_each_concurrent(EXPLAIN_CONCURRENCY, |(claim, _waited)| {
                let (ctx, live) = (&ctx, &live);
                async move {
                    let ours = claim
                        .class
                        .as_deref()
                        .and_then(|class| ctx.classes.get(&ObjectRef::new(class)))
                        .is_some_and(|class| ctx.me.serves(&class.provisioner));
                    let (seen, next) = look(&claim, &ctx.me.node, live, ours);
                    if seen == Look::Explain {
                        explain(ctx, &claim).await;
                        ctx.metrics.waiting_claims.report(&claim.uid, &claim.node, WAITING_REPORT_VALIDITY);
                    } else {
                        ctx.metrics.waiting_claims.forget(&claim.uid);
                    }
                    ctx.waiting().look_again(&claim.uid, Instant::now() + next);
                }
            })
            .await;
    }
}

/// The one event for the cluster on `claim`.
async fn explain(ctx: &Context, claim: &WaitingClaim) {
    let evidence = match &ctx.config.peer_service {
        Some(service) => format!("no ready pod behind Service {service} in namespace {}", ctx.config.namespace),
        None => format!("no live lease in namespace {}", ctx.config.namespace),
    };
    let note = format!(
        "this claim waits for node {}, where no hostpath-provisioner is running ({evidence}): check that the \
         provisioner DaemonSet runs there (taints it does not tolerate, its nodeSelector) and that the node name is right",
        claim.node
    );
    let regarding = claim_ref_of(&claim.namespace, &claim.name, &claim.uid);
    explain_once_about(ctx, regarding, "no-provisioner-on-node", reason::NO_PROVISIONER_ON_NODE, note).await;
}

//! The restore step of the plan: a claim whose `dataSourceRef` names a `HostPathSnapshot` is
//! made, as a copy of the snapshot, on the node that holds it (as a clone is made on its
//! source's node), and explains every wait.

use super::*;
use crate::deciding::refusal::CloneRefusal;
use crate::deciding::snapshot::{self, RestoreVerdict};

/// Lets the node that holds the snapshot make the copy.
pub(super) fn restore_step(facts: &ClaimFacts<'_>, restore: RestoreFacts<'_>, decision: Decision) -> CloneStep {
    let request_bytes = match &decision {
        Decision::Provision(plan) => plan.request_bytes,
        _ => crate::deciding::clone::request_bytes(facts.claim).unwrap_or(u64::MAX),
    };
    let namespace = facts.claim.metadata.namespace.as_deref().unwrap_or_default();
    let block = facts.claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block");
    let verdict = snapshot::restore_verdict(restore.name, namespace, restore.snapshot, request_bytes, block);
    let refuse = |why| CloneStep::Go(Decision::Refuse(Refusal::DataSource(CloneRefusal::Restore(why))), None);
    let (node, dir_name) = match verdict {
        RestoreVerdict::Ready { node, dir_name, .. } => (node, dir_name),
        RestoreVerdict::Refuse(why) => return refuse(why),
        RestoreVerdict::Wait(why) => {
            return CloneStep::Done(match decision {
                // Not placed: one event for the whole cluster.
                Decision::ExplainImmediate => ClaimPlan::Explain {
                    explanation: Explanation::CloneSourceNotReady(why),
                    recheck: Some(SOURCE_RECHECK),
                },
                Decision::Provision(_) => ClaimPlan::WaitForSource(why),
                other => return CloneStep::Go(other, None),
            });
        }
    };
    let plan = match decision {
        Decision::Provision(plan) => *plan,
        // Immediate and unplaced: the snapshot's node makes it, as if the claim were pinned
        // there (the copy cannot be anywhere else; no placement by the user).
        Decision::ExplainImmediate if node == facts.me.node => match decide_pinned_here(facts) {
            Decision::Provision(plan) => return restore_here(facts, restore, *plan, dir_name),
            other => return CloneStep::Go(other, None),
        },
        Decision::ExplainImmediate => return CloneStep::Done(ClaimPlan::Idle(SkipReason::OtherNode)),
        other => return CloneStep::Go(other, None),
    };
    let placement = if plan.binding_mode == BindingMode::WaitForFirstConsumer && !plan.pinned_by_annotation {
        Placement::Scheduled
    } else {
        Placement::Pinned
    };
    match clone::clone_actor(Some(&node), placement, facts.me) {
        CloneActor::Me => restore_here(facts, restore, plan, dir_name),
        CloneActor::Other(_) => CloneStep::Done(ClaimPlan::Idle(SkipReason::OtherNode)),
        CloneActor::Refuse(_) => refuse(format!(
            "{} {:?} is held by node {node}, but this claim is pinned to node {}: a restore is made on the snapshot's node",
            snapshot::KIND,
            restore.name,
            facts.me.node
        )),
        CloneActor::WrongNode { source_node } => {
            let why = format!(
                "this claim restores {} {:?}, held by node {source_node}; a restore is made on the node that holds the \
                 snapshot, but the pod was scheduled to node {}. Run the pod on node {source_node} (nodeSelector \
                 kubernetes.io/hostname of that node; recreate the pod)",
                snapshot::KIND,
                restore.name,
                facts.me.node
            );
            CloneStep::Done(ClaimPlan::HandBack { why, label: "restore_wrong_node" })
        }
    }
}

/// This node restores: the snapshot must be on a root of the claim's pool here, and a quota
/// class needs a snapshot a limit can hold (a btrfs subvolume). Whether it is one is read from
/// the disk, not from the status's `method`: a status saying `snapshot` over a plain copy would
/// otherwise make a copy no limit can be set on, failing and retried forever.
fn restore_here(facts: &ClaimFacts<'_>, restore: RestoreFacts<'_>, plan: ProvisionPlan, dir_name: String) -> CloneStep {
    let refuse = |why| CloneStep::Go(Decision::Refuse(Refusal::DataSource(CloneRefusal::Restore(why))), None);
    if let PoolState::Ready(roots) = facts.pool
        && !roots.iter().any(|r| r.read.as_ref().is_some_and(|f| f.snapshot_here))
    {
        let pools = pool_roots::roots_of(&facts.config.pools, &plan.pool.name);
        let where_ = pools.iter().map(|p| p.root.display().to_string()).collect::<Vec<_>>().join(", ");
        return refuse(format!(
            "{} {:?} is not in pool {} ({where_}) on node {}: a restore is made in the pool of the snapshot's volume; use a class of that pool",
            snapshot::KIND,
            restore.name,
            plan.pool.name,
            facts.me.node
        ));
    }
    let subvolume = match facts.pool {
        PoolState::Ready(roots) => {
            roots.iter().any(|r| r.read.as_ref().is_some_and(|f| f.snapshot_here && f.snapshot_subvolume))
        }
        _ => false,
    };
    if plan.quota == QuotaMode::Enforce && !subvolume {
        return refuse(format!(
            "{} {:?} is a plain copy, which a quota limit cannot hold; restore it with a class without quota: enforce",
            snapshot::KIND,
            restore.name
        ));
    }
    let copy_from = CopyFrom::Snapshot { dir: dir_name, name: restore.name.to_owned() };
    CloneStep::Go(Decision::Provision(Box::new(plan)), Some(copy_from))
}

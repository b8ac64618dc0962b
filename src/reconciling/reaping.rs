//! `--reap-volumes-of-removed-nodes`: the node that speaks for the cluster looks, once per pass,
//! for Released PVs of ours whose node's Node object is gone, and past the grace period deletes
//! them (`deciding::reaping` decides). Off unless configured. Deleting PVs is a right every node
//! pod holds anyway (for its own volumes), so this stays here.
//!
//! Releasing the claims of removed nodes does not: deleting claims is a right no node pod holds,
//! and the `release-claims-of-removed-nodes` subcommand does it from a Deployment of its own
//! (`reconciling::claim_release`). A node whose DaemonSet still sets
//! `RELEASE_CLAIMS_OF_REMOVED_NODES` (an install from before) ignores it and says so: a log line,
//! a Warning Event on its Node, a metric and a doctor line; provisioning goes on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};

use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::reaping::{Graces, ReapFacts, owners_to_check, plan_reaping};
use crate::deciding::topology::{self, Acting};
use crate::error::reason;
use crate::keys;
use crate::reconciling::context::Context;

/// The key the cluster-wide ranking picks the speaking node by.
const SPOKESMAN_KEY: &str = "reap-volumes-of-removed-nodes";
/// Passes are at most this far apart (and a quarter of the grace period when that is shorter).
const MAX_PASS_INTERVAL: Duration = Duration::from_secs(60);

/// Runs the passes for as long as the provisioner runs.
pub async fn run(ctx: Arc<Context>) {
    if let Some(value) = ctx.config.release_claims_setting_ignored.clone() {
        report_ignored_release_setting(&ctx, &value).await;
    }
    let graces = Graces { reap: ctx.config.reap_volumes_of_removed_nodes, release: None };
    let Some(grace) = graces.reap else { return };
    let interval = (grace / 4).clamp(Duration::from_secs(1), MAX_PASS_INTERVAL);
    tracing::info!(grace = ?grace, "deleting the Released PVs of nodes gone for longer than the grace period");
    let mut absent_since = BTreeMap::new();
    loop {
        tokio::time::sleep(interval).await;
        match pass(&ctx, graces, &absent_since).await {
            Ok(Some(next)) => absent_since = next,
            // Another node speaks for the cluster: its clock counts, ours starts again if it dies.
            Ok(None) => absent_since.clear(),
            Err(error) => tracing::warn!(%error, "looking for volumes of removed nodes failed; next pass retries"),
        }
    }
}

/// One pass; `None` when another node speaks for the cluster.
async fn pass(
    ctx: &Context,
    graces: Graces,
    absent_since: &BTreeMap<String, Instant>,
) -> Result<Option<BTreeMap<String, Instant>>, kube::Error> {
    let live = ctx.live_nodes().await?;
    if let Acting::Other { .. } = topology::spokesman(SPOKESMAN_KEY, &ctx.me.node, &live) {
        return Ok(None);
    }
    let pvs: Api<KeptVolume> = Api::all(ctx.client.clone());
    let listed = pvs.list(&ListParams::default()).await?.items;
    // One GET per owner of a Released PV (few), rather than a list of every Node: the
    // provisioner's RBAC has nodes `get` only.
    let mut existing = BTreeSet::new();
    let provisioners = ctx.me.names();
    for owner in owners_to_check(&listed, &provisioners, graces) {
        if Api::<Node>::all(ctx.client.clone()).get_metadata_opt(owner).await?.is_some() {
            existing.insert(owner.to_owned());
        }
    }
    let plan = plan_reaping(&ReapFacts {
        pvs: &listed,
        nodes: &existing,
        absent_since,
        now: Instant::now(),
        graces,
        provisioners: &provisioners,
    });
    for (node, left) in &plan.waiting {
        tracing::debug!(%node, left = ?left, "a node with volumes is gone; waiting out the grace period");
    }
    for reap in &plan.reap {
        let Some(pv) = listed.iter().find(|pv| pv.metadata.name.as_deref() == Some(&reap.pv)) else { continue };
        let note = format!(
            "deleted: node {} has had no Node object for longer than {:?} (--reap-volumes-of-removed-nodes); \
             the volume's data was on that node and went with it",
            reap.node,
            graces.reap.unwrap_or_default()
        );
        if !reap.already_deleted {
            let preconditions =
                Preconditions { uid: Some(reap.uid.clone()), resource_version: Some(reap.resource_version.clone()) };
            match pvs.delete(&reap.pv, &DeleteParams { preconditions: Some(preconditions), ..Default::default() }).await
            {
                Ok(_) => {}
                // Changed since the list (switched to Retain, rebound) or gone: the next pass decides.
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => continue,
                Err(error) => return Err(error),
            }
        }
        if reap.remove_finalizer {
            remove_protection(&pvs, pv).await?;
        }
        tracing::warn!(pv = %reap.pv, node = %reap.node, "deleted the PV of a removed node");
        ctx.metrics.reaped_volumes.inc();
        ctx.warn(&pv.object_ref(&()), reason::REMOVED_NODE_VOLUME_DELETED, "Delete", note).await;
    }
    Ok(Some(plan.absent_since))
}

/// `RELEASE_CLAIMS_OF_REMOVED_NODES` on a node pod (an install from before the releaser ran
/// apart): never acted upon, said once at start (a log line, a Warning Event on this node's Node,
/// the metric `hostpath_provisioner_release_claims_setting_ignored`; `doctor` says it too).
/// Provisioning goes on: failing here would take every node's provisioning down on an upgrade.
async fn report_ignored_release_setting(ctx: &Context, value: &str) {
    let note = format!(
        "RELEASE_CLAIMS_OF_REMOVED_NODES={value} is set on this node's provisioner and ignored: node pods never \
         delete claims; the claims of removed nodes are released by the release-claims-of-removed-nodes \
         Deployment, whose ServiceAccount alone may delete claims. Remove the variable from the DaemonSet and \
         install that Deployment (docs/operating.md, \"Claims of removed nodes\")"
    );
    tracing::warn!(value, "{note}");
    ctx.metrics.release_claims_setting_ignored.set(1);
    match ctx.node_ref().await {
        Ok(node) => ctx.warn(&node, reason::RELEASE_CLAIMS_SETTING_IGNORED, "Configure", note).await,
        Err(error) => tracing::warn!(%error, "cannot read this node's Node object to report the ignored setting"),
    }
}

/// Removes our deletion-protection finalizer, which only the PV's (gone) owner would remove.
async fn remove_protection(pvs: &Api<KeptVolume>, pv: &KeptVolume) -> Result<(), kube::Error> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let Some(index) = pv.metadata.finalizers.iter().flatten().position(|f| f == keys::PROTECTION_FINALIZER) else {
        return Ok(());
    };
    let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
        { "op": "test", "path": format!("/metadata/finalizers/{index}"), "value": keys::PROTECTION_FINALIZER },
        { "op": "remove", "path": format!("/metadata/finalizers/{index}") },
    ]))
    .expect("a valid JSON patch");
    match pvs.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 422 => Ok(()),
        Err(error) => Err(error),
    }
}

//! `--reap-volumes-of-removed-nodes` and `--release-claims-of-removed-nodes`: the node that speaks
//! for the cluster looks, once per pass, for PVs of ours whose node's Node object is gone; past
//! the grace period it deletes the Released ones, and releases the claims of the Bound ones
//! (`deciding::reaping` decides). Off unless configured.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolumeClaim};
use kube::Resource;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};

use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::reaping::{Graces, ReapFacts, Release, owners_to_check, plan_reaping};
use crate::deciding::topology::{self, Acting};
use crate::error::reason;
use crate::keys;
use crate::reconciling::claim_actions::claim_ref_of;
use crate::reconciling::context::Context;

/// The key the cluster-wide ranking picks the speaking node by.
const SPOKESMAN_KEY: &str = "reap-volumes-of-removed-nodes";
/// Passes are at most this far apart (and a quarter of the grace period when that is shorter).
const MAX_PASS_INTERVAL: Duration = Duration::from_secs(60);

/// Runs the passes for as long as the provisioner runs.
pub async fn run(ctx: Arc<Context>) {
    let graces =
        Graces { reap: ctx.config.reap_volumes_of_removed_nodes, release: ctx.config.release_claims_of_removed_nodes };
    let Some(shortest) = [graces.reap, graces.release].into_iter().flatten().min() else { return };
    let interval = (shortest / 4).clamp(Duration::from_secs(1), MAX_PASS_INTERVAL);
    if let Some(grace) = graces.reap {
        tracing::info!(grace = ?grace, "deleting the Released PVs of nodes gone for longer than the grace period");
    }
    if let Some(grace) = graces.release {
        tracing::info!(grace = ?grace, "releasing the bound claims of nodes gone for longer than the grace period");
    }
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
    for owner in owners_to_check(&listed, &ctx.me.provisioner, graces) {
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
        provisioner: &ctx.me.provisioner,
    });
    for (node, left) in &plan.waiting {
        tracing::debug!(%node, left = ?left, "a node with volumes is gone; waiting out the grace period");
    }
    for release in &plan.release {
        release_claim(ctx, &pvs, release, graces.release.unwrap_or_default()).await?;
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

/// Releases one claim from a gone node's PV: the PV to Retain first (a JSON patch that tests the
/// resourceVersion the plan saw), then the claim deleted with its uid as precondition. A write
/// refused because the object changed or went (409, 404, 422) leaves the rest to the next pass,
/// which decides again on what it finds.
async fn release_claim(
    ctx: &Context,
    pvs: &Api<KeptVolume>,
    release: &Release,
    grace: Duration,
) -> Result<(), kube::Error> {
    let pv_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolume".into()),
        name: Some(release.pv.clone()),
        uid: Some(release.pv_uid.clone()),
        ..Default::default()
    };
    let claim_ref = claim_ref_of(&release.claim_namespace, &release.claim_name, &release.claim_uid);
    let claim = format!("{}/{}", release.claim_namespace, release.claim_name);
    if release.retain_first {
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            { "op": "test", "path": "/metadata/resourceVersion", "value": release.pv_resource_version },
            { "op": "replace", "path": "/spec/persistentVolumeReclaimPolicy", "value": "Retain" },
        ]))
        .expect("a valid JSON patch");
        match pvs.patch(&release.pv, &PatchParams::default(), &Patch::Json::<()>(patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 || e.code == 422 => return Ok(()),
            Err(error) => return Err(error),
        }
        tracing::info!(pv = %release.pv, node = %release.node, %claim, "set the PV of a removed node to Retain before releasing its claim");
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &release.claim_namespace);
    let preconditions = Preconditions { uid: Some(release.claim_uid.clone()), resource_version: None };
    match claims
        .delete(&release.claim_name, &DeleteParams { preconditions: Some(preconditions), ..Default::default() })
        .await
    {
        Ok(_) => {}
        // Gone already, or a new claim of the same name: nothing of ours to release.
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(()),
        Err(error) => {
            let why = if matches!(&error, kube::Error::Api(e) if e.code == 403) {
                " (the provisioner's ClusterRole needs `delete` on persistentvolumeclaims; docs/operating.md, \"Claims of removed nodes\")"
            } else {
                ""
            };
            let note = format!(
                "claim {claim} not released: {error}{why}; PV {} is Retain, its data stays, and the next pass tries again",
                release.pv
            );
            ctx.warn(&pv_ref, reason::REMOVED_NODE_CLAIM_NOT_RELEASED, "Release", note).await;
            return Err(error);
        }
    }
    let note = format!(
        "claim {claim} released: node {} has had no Node object for longer than {grace:?} \
         (--release-claims-of-removed-nodes); PV {} is Retain and its data stays on that node, \
         for the node's return or an admin; a new claim of the workload is provisioned where its pod runs now",
        release.node, release.pv
    );
    tracing::warn!(pv = %release.pv, node = %release.node, %claim, "released the claim of a removed node's volume");
    ctx.metrics.released_claims.inc();
    ctx.warn(&claim_ref, reason::REMOVED_NODE_CLAIM_RELEASED, "Release", note.clone()).await;
    ctx.warn(&pv_ref, reason::REMOVED_NODE_CLAIM_RELEASED, "Release", note).await;
    Ok(())
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

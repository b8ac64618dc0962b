//! What the claim reconciler does to a claim besides provisioning it: hand it back to the
//! scheduler, and write the single cluster-wide explanation of why it stays Pending.

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::error::{ClaimError, reason};
use crate::keys;
use crate::reconciling::context::Context;
use crate::serving::metrics::Metrics;

/// Gives a WaitForFirstConsumer claim back to the scheduler by removing `selected-node`, so that
/// it can pick a node with room or with the pool. The JSON patch tests the value first: if the
/// scheduler already moved the claim elsewhere, nothing is removed.
pub async fn handback(ctx: &Context, claim: &PersistentVolumeClaim, why: &str, label: &str) -> Result<(), ClaimError> {
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

/// Writes a Warning that speaks for the cluster, not for one node: every node computes the same
/// event name, so the first create wins and the others get AlreadyExists.
pub async fn explain_once(ctx: &Context, claim: &PersistentVolumeClaim, suffix: &str, reason: &str, note: String) {
    explain_once_about(ctx, claim_ref(claim), suffix, reason, note).await;
}

/// [`explain_once`] about the object `regarding` refers to (its namespace and uid name the event).
pub async fn explain_once_about(ctx: &Context, regarding: ObjectReference, suffix: &str, reason: &str, note: String) {
    let (Some(namespace), Some(uid)) = (regarding.namespace.clone(), regarding.uid.as_deref()) else {
        return;
    };
    let key = format!("{namespace}/{}", regarding.name.as_deref().unwrap_or_default());
    let event = K8sEvent {
        metadata: ObjectMeta {
            name: Some(format!("{uid}.{suffix}")),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        event_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
        action: Some("Provision".into()),
        reason: Some(reason.into()),
        note: Some(note),
        regarding: Some(regarding),
        reporting_controller: Some(ctx.me.provisioner.clone()),
        reporting_instance: Some(ctx.me.provisioner.clone()),
        type_: Some("Warning".into()),
        ..Default::default()
    };
    let events: Api<K8sEvent> = Api::namespaced(ctx.client.clone(), &namespace);
    match events.create(&PostParams::default(), &event).await {
        Ok(_) => tracing::info!(claim = %key, reason, "explained why the claim stays Pending"),
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(error) => tracing::warn!(claim = %key, %error, reason, "could not publish the explanation"),
    }
}

/// `namespace/name` of an object, for logs and retry keys.
pub fn object_key(meta: &ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
}

/// `namespace/name` of a claim.
pub fn claim_key(claim: &PersistentVolumeClaim) -> String {
    object_key(&claim.metadata)
}

/// The reference events about a claim point at.
pub fn claim_ref(claim: &PersistentVolumeClaim) -> ObjectReference {
    claim.object_ref(&())
}

/// The same reference for a claim known by namespace, name and uid only (a claim this node
/// does not keep, or one it is about to delete).
pub fn claim_ref_of(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(namespace.to_owned()),
        name: Some(name.to_owned()),
        uid: Some(uid.to_owned()),
        ..Default::default()
    }
}

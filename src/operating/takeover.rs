//! Taking a resource over from the kubevirt hostpath-provisioner operator: read what that
//! operator owned in this namespace, ask [`crate::deciding::operator::takeover`] for the plan,
//! carry it out, and say what was done in an Event and a log line.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, Resource, ResourceExt};

use super::error::OperatorError;
use crate::deciding::operator::render::OWNER_LABEL;
use crate::deciding::operator::resource::HostPathProvisioner;
use crate::deciding::operator::takeover::{self, Found, Kind, TakeOver};

/// Takes `resource` over if the kubevirt operator left anything to take over; returns the plan
/// carried out (empty: nothing was there). The first failed step stops it, finalizer last.
pub async fn take_over(
    client: &Client,
    namespace: &str,
    resource: &HostPathProvisioner,
    replace_legacy: bool,
) -> Result<TakeOver, OperatorError> {
    let uid = resource.uid().unwrap_or_default();
    let mut found = Vec::new();
    for kind in Kind::ALL {
        found.extend(read(client, namespace, kind, &uid).await?);
    }
    let plan = takeover::plan(&uid, resource.finalizers(), &found, replace_legacy);
    let name = resource.name_any();
    for (kind, object) in &plan.delete {
        let result = match kind {
            Kind::DaemonSet => {
                api::<DaemonSet>(client, namespace).delete(object, &DeleteParams::background()).await.map(|_| ())
            }
            Kind::Deployment => {
                api::<Deployment>(client, namespace).delete(object, &DeleteParams::background()).await.map(|_| ())
            }
            Kind::ServiceAccount => {
                api::<ServiceAccount>(client, namespace).delete(object, &DeleteParams::background()).await.map(|_| ())
            }
        };
        match result {
            Ok(()) => {
                tracing::info!(resource = %name, kind = kind.name(), %object, "deleted the kubevirt operator's legacy provisioner: the node DaemonSet replaces it");
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                return Err(OperatorError::api(
                    format!("delete the kubevirt operator's {} {object}", kind.name()),
                    error,
                ));
            }
        }
    }
    for (kind, object, patch) in &plan.keep {
        let patch: json_patch::Patch = serde_json::from_value(patch.clone()).expect("the plan writes JSON patches");
        let patch = Patch::Json::<()>(patch);
        let params = PatchParams::default();
        let result = match kind {
            Kind::DaemonSet => api::<DaemonSet>(client, namespace).patch(object, &params, &patch).await.map(|_| ()),
            Kind::Deployment => api::<Deployment>(client, namespace).patch(object, &params, &patch).await.map(|_| ()),
            Kind::ServiceAccount => {
                api::<ServiceAccount>(client, namespace).patch(object, &params, &patch).await.map(|_| ())
            }
        };
        if let Err(error) = result {
            return Err(OperatorError::api(
                format!("drop the resource's owner reference from the kubevirt operator's {} {object}", kind.name()),
                error,
            ));
        }
        tracing::info!(resource = %name, kind = kind.name(), %object, "kept the kubevirt operator's object without owner: its CSI volumes need it");
    }
    if let Some(patch) = &plan.remove_finalizer {
        let patch: json_patch::Patch = serde_json::from_value(patch.clone()).expect("the plan writes JSON patches");
        Api::<HostPathProvisioner>::all(client.clone())
            .patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
            .map_err(|e| {
                OperatorError::api(
                    format!("remove the finalizer {} from HostPathProvisioner {name}", takeover::KUBEVIRT_FINALIZER),
                    e,
                )
            })?;
        tracing::info!(resource = %name, finalizer = takeover::KUBEVIRT_FINALIZER, "removed the kubevirt operator's finalizer");
    }
    Ok(plan)
}

fn api<K>(client: &Client, namespace: &str) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    Api::namespaced(client.clone(), namespace)
}

/// The objects of `kind` in the namespace, with where the resource's uid sits in their owner
/// references. Metadata only: the take-over reads nothing else.
async fn read(client: &Client, namespace: &str, kind: Kind, uid: &str) -> Result<Vec<Found>, OperatorError> {
    let params = ListParams::default();
    let listed = match kind {
        Kind::DaemonSet => api::<DaemonSet>(client, namespace)
            .list_metadata(&params)
            .await
            .map(|l| l.items.into_iter().map(|o| o.metadata).collect::<Vec<_>>()),
        Kind::Deployment => api::<Deployment>(client, namespace)
            .list_metadata(&params)
            .await
            .map(|l| l.items.into_iter().map(|o| o.metadata).collect()),
        Kind::ServiceAccount => api::<ServiceAccount>(client, namespace)
            .list_metadata(&params)
            .await
            .map(|l| l.items.into_iter().map(|o| o.metadata).collect()),
    }
    .map_err(|e| OperatorError::api(format!("list the {}s the kubevirt operator may have made", kind.name()), e))?;
    Ok(listed
        .into_iter()
        .map(|meta: ObjectMeta| Found {
            kind,
            ours: meta.labels.as_ref().is_some_and(|l| l.contains_key(OWNER_LABEL)),
            owner_index: meta.owner_references.iter().flatten().position(|r| r.uid == uid),
            has_annotations: meta.annotations.as_ref().is_some_and(|a| !a.is_empty()),
            name: meta.name.unwrap_or_default(),
        })
        .collect())
}

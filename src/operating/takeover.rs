//! Taking a resource over from the kubevirt hostpath-provisioner operator: read what that
//! operator owned, in any namespace, and its monitoring; ask
//! [`crate::deciding::operator::takeover_stop`] whether to start at all and
//! [`crate::deciding::operator::takeover`] for the plan; carry it out, and say what was done in an
//! Event and a log line.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Resource, ResourceExt};

use super::error::OperatorError;
use crate::deciding::operator::render::OWNER_LABEL;
use crate::deciding::operator::resource::HostPathProvisioner;
use crate::deciding::operator::takeover::{self, Found, Kind, TakeOver, Target};
use crate::deciding::operator::takeover_stop::{self, ClusterServiceVersion, OperatorDeployment, Stop};

/// What the take-over reads before deciding: the objects, and whether OLM manages the kubevirt
/// operator.
pub struct Facts {
    pub found: Vec<Found>,
    pub operator_deployments: Vec<OperatorDeployment>,
    pub csvs: Vec<ClusterServiceVersion>,
}

/// Reads what the kubevirt operator left for `resource`: the objects it owns in every
/// namespace, its monitoring in their namespaces, the Deployments of its name and OLM's CSVs.
pub async fn read_facts(client: &Client, resource: &HostPathProvisioner) -> Result<Facts, OperatorError> {
    let uid = resource.uid().unwrap_or_default();
    let mut found = Vec::new();
    let mut operator_deployments = Vec::new();
    for kind in Kind::OWNED {
        for meta in list_everywhere(client, kind).await? {
            if kind == Kind::Deployment && meta.name.as_deref() == Some(takeover_stop::KUBEVIRT_OPERATOR_DEPLOYMENT) {
                operator_deployments.push(OperatorDeployment {
                    namespace: meta.namespace.clone().unwrap_or_default(),
                    labels: meta.labels.clone().unwrap_or_default(),
                    owners: meta
                        .owner_references
                        .iter()
                        .flatten()
                        .map(|r| (r.api_version.clone(), r.kind.clone(), r.name.clone()))
                        .collect(),
                });
            }
            let object = found_of(kind, meta, &uid);
            // Only what concerns the take-over: owned by the resource, or kept by it earlier.
            if object.owner_index.is_some() || object.kept {
                found.push(object);
            }
        }
    }
    for namespace in takeover::install_namespaces(&found) {
        for (kind, name) in takeover::KUBEVIRT_MONITORING {
            if let Some(meta) = get_monitoring(client, kind, &namespace, name).await? {
                found.push(found_of(kind, meta, &uid));
            }
        }
    }
    let csvs = list_csvs(client).await?;
    Ok(Facts { found, operator_deployments, csvs })
}

/// Whether the take-over must not start, from `facts`.
pub fn stop(namespace: &str, facts: &Facts) -> Option<Stop> {
    takeover_stop::stop(namespace, &facts.operator_deployments, &facts.csvs, &facts.found)
}

/// Takes `resource` over if the kubevirt operator left anything to take over; returns the plan
/// carried out (empty: nothing was there). The first failed step stops it, finalizer last.
pub async fn take_over(
    client: &Client,
    resource: &HostPathProvisioner,
    facts: &Facts,
    replace_legacy: bool,
) -> Result<TakeOver, OperatorError> {
    let uid = resource.uid().unwrap_or_default();
    let plan = takeover::plan(&uid, resource.finalizers(), &facts.found, replace_legacy);
    let name = resource.name_any();
    for target in &plan.delete {
        match delete(client, target).await {
            Ok(()) => {
                tracing::info!(resource = %name, object = %target, "deleted an object of the kubevirt operator: its legacy provisioner is replaced by the node DaemonSet, its monitoring watched pods that no longer run");
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => {
                return Err(OperatorError::api(format!("delete the kubevirt operator's {target}"), error));
            }
        }
    }
    for (target, patch) in &plan.keep {
        let patch: json_patch::Patch = serde_json::from_value(patch.clone()).expect("the plan writes JSON patches");
        let patch = Patch::Json::<()>(patch);
        let params = PatchParams::default();
        let ns = target.namespace.as_str();
        let object = target.name.as_str();
        let result = match target.kind {
            Kind::DaemonSet => api::<DaemonSet>(client, ns).patch(object, &params, &patch).await.map(|_| ()),
            Kind::Deployment => api::<Deployment>(client, ns).patch(object, &params, &patch).await.map(|_| ()),
            Kind::ServiceAccount => api::<ServiceAccount>(client, ns).patch(object, &params, &patch).await.map(|_| ()),
            other => unreachable!("the plan keeps only owned kinds, not {other:?}"),
        };
        if let Err(error) = result {
            return Err(OperatorError::api(
                format!("drop the resource's owner reference from the kubevirt operator's {target}"),
                error,
            ));
        }
        tracing::info!(resource = %name, object = %target, "kept the kubevirt operator's object without owner: its CSI volumes need it");
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

/// Writes the [`takeover_stop::TAKE_OVER_STOPPED`] condition beside the resource's others, if
/// it does not say so already; returns whether it wrote.
pub async fn report_stop(client: &Client, resource: &HostPathProvisioner, stop: &Stop) -> Result<bool, OperatorError> {
    let conditions = resource.status.as_ref().map(|s| s.conditions.clone()).unwrap_or_default();
    let now = jiff::Timestamp::now().to_string();
    let Some(conditions) = takeover_stop::conditions_with_stop(&conditions, stop, resource.metadata.generation, &now)
    else {
        return Ok(false);
    };
    let name = resource.name_any();
    // A merge patch of the list with the resourceVersion read: a concurrent write by the
    // kubevirt operator fails this one (409) instead of being overwritten.
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": resource.resource_version()},
        "status": {"conditions": conditions},
    });
    Api::<HostPathProvisioner>::all(client.clone())
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| OperatorError::api(format!("write the status of HostPathProvisioner {name}"), e))?;
    Ok(true)
}

async fn delete(client: &Client, target: &Target) -> Result<(), kube::Error> {
    let params = DeleteParams::background();
    let (ns, name) = (target.namespace.as_str(), target.name.as_str());
    match target.kind {
        Kind::DaemonSet => api::<DaemonSet>(client, ns).delete(name, &params).await.map(|_| ()),
        Kind::Deployment => api::<Deployment>(client, ns).delete(name, &params).await.map(|_| ()),
        Kind::ServiceAccount => api::<ServiceAccount>(client, ns).delete(name, &params).await.map(|_| ()),
        Kind::Service => api::<Service>(client, ns).delete(name, &params).await.map(|_| ()),
        Kind::Role => api::<Role>(client, ns).delete(name, &params).await.map(|_| ()),
        Kind::RoleBinding => api::<RoleBinding>(client, ns).delete(name, &params).await.map(|_| ()),
        Kind::ServiceMonitor | Kind::PrometheusRule => {
            monitoring_api(client, target.kind, ns).delete(name, &params).await.map(|_| ())
        }
    }
}

fn api<K>(client: &Client, namespace: &str) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    <K as Resource>::DynamicType: Default,
{
    Api::namespaced(client.clone(), namespace)
}

fn monitoring_api(client: &Client, kind: Kind, namespace: &str) -> Api<DynamicObject> {
    let plural = if kind == Kind::ServiceMonitor { "servicemonitors" } else { "prometheusrules" };
    let gvk = GroupVersionKind::gvk("monitoring.coreos.com", "v1", kind.name());
    Api::namespaced_with(client.clone(), namespace, &ApiResource::from_gvk_with_plural(&gvk, plural))
}

fn found_of(kind: Kind, meta: ObjectMeta, uid: &str) -> Found {
    Found {
        kind,
        namespace: meta.namespace.unwrap_or_default(),
        ours: meta.labels.as_ref().is_some_and(|l| l.contains_key(OWNER_LABEL)),
        owner_index: meta.owner_references.iter().flatten().position(|r| r.uid == uid),
        has_annotations: meta.annotations.as_ref().is_some_and(|a| !a.is_empty()),
        kept: meta.annotations.as_ref().is_some_and(|a| a.contains_key(takeover::KEPT_ANNOTATION)),
        name: meta.name.unwrap_or_default(),
    }
}

/// The objects of an owned `kind` in every namespace. Metadata only: the take-over reads
/// nothing else.
async fn list_everywhere(client: &Client, kind: Kind) -> Result<Vec<ObjectMeta>, OperatorError> {
    let params = ListParams::default();
    match kind {
        Kind::DaemonSet => Api::<DaemonSet>::all(client.clone())
            .list_metadata(&params)
            .await
            .map(|l| l.items.into_iter().map(|o| o.metadata).collect::<Vec<_>>()),
        Kind::Deployment => Api::<Deployment>::all(client.clone())
            .list_metadata(&params)
            .await
            .map(|l| l.items.into_iter().map(|o| o.metadata).collect()),
        Kind::ServiceAccount => Api::<ServiceAccount>::all(client.clone())
            .list_metadata(&params)
            .await
            .map(|l| l.items.into_iter().map(|o| o.metadata).collect()),
        other => unreachable!("listed everywhere: only owned kinds, not {other:?}"),
    }
    .map_err(|e| OperatorError::api(format!("list the {}s the kubevirt operator may have made", kind.name()), e))
}

/// A monitoring object of the kubevirt operator, if there (a kind not served: none).
async fn get_monitoring(
    client: &Client,
    kind: Kind,
    namespace: &str,
    name: &str,
) -> Result<Option<ObjectMeta>, OperatorError> {
    let result = match kind {
        Kind::Service => api::<Service>(client, namespace).get_metadata_opt(name).await.map(|o| o.map(|o| o.metadata)),
        Kind::Role => api::<Role>(client, namespace).get_metadata_opt(name).await.map(|o| o.map(|o| o.metadata)),
        Kind::RoleBinding => {
            api::<RoleBinding>(client, namespace).get_metadata_opt(name).await.map(|o| o.map(|o| o.metadata))
        }
        _ => monitoring_api(client, kind, namespace).get_metadata_opt(name).await.map(|o| o.map(|o| o.metadata)),
    };
    match result {
        Ok(meta) => Ok(meta),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(error) => {
            Err(OperatorError::api(format!("read the kubevirt operator's {} {namespace}/{name}", kind.name()), error))
        }
    }
}

/// OLM's ClusterServiceVersions in every namespace, each with the Deployments it makes; none
/// where OLM is not installed. Not the copies: OLM copies an all-namespaces operator's CSV into
/// every namespace (labelled `olm.copiedFrom`), full objects that would make this list grow with
/// the cluster's namespaces, and a copy makes no Deployment (the original, in the operator's
/// namespace, is the one the decision needs).
async fn list_csvs(client: &Client) -> Result<Vec<ClusterServiceVersion>, OperatorError> {
    let gvk = GroupVersionKind::gvk(takeover_stop::OLM_GROUP, "v1alpha1", takeover_stop::CSV_KIND);
    let api: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::from_gvk_with_plural(&gvk, "clusterserviceversions"));
    match api.list(&ListParams::default().labels(&format!("!{}", takeover_stop::OLM_COPIED_FROM))).await {
        Ok(list) => Ok(list
            .items
            .into_iter()
            .map(|csv| ClusterServiceVersion {
                namespace: csv.metadata.namespace.clone().unwrap_or_default(),
                name: csv.metadata.name.clone().unwrap_or_default(),
                deployments: csv.data["spec"]["install"]["spec"]["deployments"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|d| d["name"].as_str().map(str::to_owned))
                    .collect(),
            })
            .collect()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
        Err(error) => Err(OperatorError::api("list OLM's ClusterServiceVersions", error)),
    }
}

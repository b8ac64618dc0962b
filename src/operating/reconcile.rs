//! One reconcile of a `HostPathProvisioner`: render, apply with server-side apply, read the node
//! DaemonSet's rollout, write the status when it changed, and report each failed step as an
//! Event on the resource and a log line. On deletion (the finalizer), remove what the resource
//! made; never a PersistentVolume or a volume's directory, which the operator never touches.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{Event as Finalizing, finalizer};
use kube::{Client, Resource, ResourceExt};

use super::error::{OperatorError, reason};
use crate::deciding::event;
use crate::deciding::operator::render::claim_releaser;
use crate::deciding::operator::render::{Desired, Environment, OWNER_LABEL, Rendered, render};
use crate::deciding::operator::resource::{HostPathProvisioner, Status};
use crate::deciding::operator::status::{self, Observed, Rollout};
use crate::deciding::operator::takeover::KUBEVIRT_FINALIZER;

/// The finalizer on every resource: its deletion waits until what it made is removed.
pub const FINALIZER: &str = "hostpathprovisioner.kubevirt.io/cleanup";
/// The server-side apply field manager of the operator.
pub const FIELD_MANAGER: &str = "hostpath-provisioner-operator";

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    /// The operator's namespace.
    pub namespace: String,
    /// The node pods' image.
    pub image: String,
    /// The node pods' and pool mounters' pull secrets: the operator pod's own.
    pub image_pull_secrets: Vec<String>,
    pub recorder: Recorder,
    /// This operator pod's name in its Events (the recorder's instance).
    pub identity: String,
}

/// Reconciles one resource (the controller's entry point).
pub async fn reconcile(resource: Arc<HostPathProvisioner>, ctx: Arc<Context>) -> Result<Action, OperatorError> {
    let api: Api<HostPathProvisioner> = Api::all(ctx.client.clone());
    let name = resource.name_any();
    let resource_for_events = resource.clone();
    // What the kubevirt operator left, read first: where OLM manages that operator, or its pools
    // on a claim are in another namespace, nothing is changed at all (not even the finalizer).
    let facts = match super::takeover::read_facts(&ctx.client, &resource).await {
        Ok(facts) => facts,
        Err(error) => {
            publish(&ctx, &resource, EventType::Warning, error.reason(), &error.to_string()).await;
            return Err(error);
        }
    };
    if let Some(stop) = super::takeover::stop(&ctx.namespace, &facts) {
        return take_over_stopped(&resource, &ctx, &stop).await;
    }
    // Deleted while the kubevirt operator's finalizer is still on it (this operator may never
    // have applied it): take over first, so that the garbage collector leaves the CSI driver
    // and nothing waits for a finalizer nobody removes. The change wakes the next reconcile.
    if resource.metadata.deletion_timestamp.is_some() && resource.finalizers().iter().any(|f| f == KUBEVIRT_FINALIZER) {
        if let Err(error) = take_over(&resource, &ctx, &facts, true).await {
            publish(&ctx, &resource, EventType::Warning, reason::CLEANUP_FAILED, &error.to_string()).await;
            return Err(error);
        }
        return Ok(Action::await_change());
    }
    // A resource a newer operator of this project brought to its version: left alone, deletion
    // included (this operator may not know what the newer one made), with the status and an
    // Event saying why and what to do.
    if let Some(newer) = status::newer_version_observed(&resource, crate::serving::build_info::VERSION) {
        return leave_to_the_newer_operator(&resource, &ctx, &newer).await;
    }
    let result = finalizer(&api, FINALIZER, resource, |event| async {
        match event {
            Finalizing::Apply(resource) => apply(&resource, &ctx, &facts).await,
            Finalizing::Cleanup(resource) => cleanup(&resource, &ctx).await,
        }
    })
    .await;
    // A resource deleted since the event that woke us: nothing left to do.
    if let Err(
        kube::runtime::finalizer::Error::AddFinalizer(kube::Error::Api(status))
        | kube::runtime::finalizer::Error::RemoveFinalizer(kube::Error::Api(status)),
    ) = &result
        && status.code == 404
    {
        return Ok(Action::await_change());
    }
    // Before Kubernetes 1.30 an unchanged spec is validated again on every write: a resource
    // stored under an earlier schema that breaks a rule of this CRD cannot take the finalizer.
    if let Err(
        kube::runtime::finalizer::Error::AddFinalizer(kube::Error::Api(status))
        | kube::runtime::finalizer::Error::RemoveFinalizer(kube::Error::Api(status)),
    ) = &result
        && status.code == 422
    {
        let note = format!(
            "the API server refuses every change to this resource, the operator's finalizer included: it breaks a rule of the current CRD (it was stored under an earlier schema); edit the spec so that it passes: {}",
            status.message
        );
        publish(&ctx, &resource_for_events, EventType::Warning, reason::INVALID_RESOURCE, &note).await;
    }
    result.map_err(|error| match error {
        kube::runtime::finalizer::Error::ApplyFailed(e) | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        kube::runtime::finalizer::Error::AddFinalizer(e) | kube::runtime::finalizer::Error::RemoveFinalizer(e) => {
            OperatorError::api(format!("update the finalizer of HostPathProvisioner {name}"), e)
        }
        other => OperatorError::Config(other.to_string()),
    })
}

/// After a failed reconcile: retry soon; the failure was already reported.
pub fn error_policy(resource: Arc<HostPathProvisioner>, error: &OperatorError, _ctx: Arc<Context>) -> Action {
    tracing::warn!(resource = %resource.name_any(), %error, "reconcile failed; retrying");
    Action::requeue(Duration::from_secs(15))
}

async fn apply(
    resource: &HostPathProvisioner,
    ctx: &Context,
    facts: &super::takeover::Facts,
) -> Result<Action, OperatorError> {
    let name = resource.name_any();
    let api: Api<HostPathProvisioner> = Api::all(ctx.client.clone());
    let all = api.list(&ListParams::default()).await.map_err(|e| OperatorError::api("list HostPathProvisioners", e))?;
    let acting = status::acting_resource(&all.items);
    let superseded_by = acting.filter(|a| *a != name);
    let mut environment = environment(ctx).await;
    let mut rendered = super::node_settings::checked(render(resource, &environment));
    // Pools on a claim, once the node objects rendered (a blocked render must not release
    // the pools' claims). A pool whose claims PVs of ours still hold stays served.
    let target = pool_target(resource, ctx);
    let pool_objects = if superseded_by.is_none() && !rendered.objects.is_empty() {
        match super::pool_claims::read(&target, !rendered.pools_on_claim.is_empty()).await {
            Ok(found) => Some(found),
            Err(error) => {
                publish(ctx, resource, EventType::Warning, error.reason(), &error.to_string()).await;
                return Err(error);
            }
        }
    } else {
        None
    };
    if let Some(found) = &pool_objects {
        (environment.held_pools, environment.pool_roots) =
            super::pool_claims::served_roots(&target, found, &rendered.pools_on_claim, &rendered.placement);
        if !environment.held_pools.is_empty() || !environment.pool_roots.is_empty() {
            rendered = super::node_settings::checked(render(resource, &environment));
        }
    }
    let mut apply_failure = None;
    let mut daemonset_applied = false;
    if superseded_by.is_none() {
        for object in &rendered.objects {
            match apply_object(&ctx.client, object).await {
                Ok(()) => daemonset_applied |= object.kind == "DaemonSet",
                Err(error) => {
                    let message = format!("{} {}: {error}", object.kind, object.name);
                    tracing::warn!(resource = %name, %message, "cannot apply an object of the resource");
                    apply_failure.get_or_insert(message);
                }
            }
        }
    }
    if superseded_by.is_none()
        && let Err(error) = super::node_settings::prune_capacity_drivers(&ctx.client, resource, &rendered).await
    {
        apply_failure.get_or_insert(error);
    }
    if superseded_by.is_none()
        && !rendered.objects.is_empty()
        && let Err(message) = remove_unasked_claim_releaser(resource, ctx, &rendered, &environment).await
    {
        apply_failure.get_or_insert(message);
    }
    let node_daemonset_applied = daemonset_applied && apply_failure.is_none();
    let mut pools = super::pool_claims::Outcome::default();
    if let Some(found) = &pool_objects {
        pools = super::pool_claims::reconcile(&target, found, &rendered.pools_on_claim, &rendered.placement).await;
        if let Some(failure) = pools.failure.take() {
            apply_failure.get_or_insert(failure);
        }
    }
    let rollout = if superseded_by.is_none() { rollout(ctx, &rendered).await? } else { None };
    if superseded_by.is_none() {
        // What the kubevirt operator left: its legacy DaemonSet goes once the node DaemonSet
        // runs on every selected node (never a node left without a provisioner), the rest stays
        // for its CSI volumes, its finalizer goes.
        let replace_legacy = node_daemonset_applied && rollout.as_ref().is_some_and(status::Rollout::complete);
        if let Err(error) = take_over(resource, ctx, facts, replace_legacy).await {
            apply_failure.get_or_insert(error.to_string());
        }
    }
    let now = jiff::Timestamp::now().to_string();
    let new_status = status::status(&Observed {
        resource,
        rendered: &rendered,
        apply_failure: apply_failure.clone(),
        rollout,
        superseded_by,
        pools_on_claim: &pools.states,
        held_back: &pools.held_back,
        version: crate::serving::build_info::VERSION,
        now: &now,
    });
    let previous = resource.status.clone().unwrap_or_default();
    if new_status != previous {
        report_changes(resource, &previous, &new_status, ctx).await;
        // Server-side apply of the whole status: a field left out (the pool statuses after a
        // switch to pathConfig) is removed, which a merge patch would keep.
        let patch = serde_json::json!({
            "apiVersion": crate::deciding::operator::resource::API_VERSION,
            "kind": crate::deciding::operator::resource::KIND,
            "status": new_status,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        if let Err(error) = api.patch_status(&name, &params, &Patch::Apply(&patch)).await {
            let error = OperatorError::api(format!("write the status of HostPathProvisioner {name}"), error);
            publish(ctx, resource, EventType::Warning, reason::STATUS_FAILED, &error.to_string()).await;
            return Err(error);
        }
    }
    // Pools on a claim follow nodes, mounters and PVs, which do not wake the operator: look again soon.
    let settling = new_status.conditions.iter().any(|c| c.type_ == status::PROGRESSING && c.status == "True")
        || !pools.held_back.is_empty()
        || pools.replacing
        || new_status.storage_pool_statuses.iter().any(|p| p.phase != status::READY);
    Ok(match (apply_failure, settling) {
        (Some(_), _) => Action::requeue(Duration::from_secs(30)),
        (None, true) => Action::requeue(Duration::from_secs(10)),
        (None, false) => Action::requeue(Duration::from_secs(300)),
    })
}

/// Writes the status that says why this operator leaves the resource alone (the Degraded
/// change is the Warning Event and the log line), and looks again later: the admin may remove
/// the observed version, or the newer operator may come back.
async fn leave_to_the_newer_operator(
    resource: &HostPathProvisioner,
    ctx: &Context,
    newer: &status::NewerVersion,
) -> Result<Action, OperatorError> {
    let name = resource.name_any();
    let now = jiff::Timestamp::now().to_string();
    let refused = status::refused_status(resource, newer, &now);
    let previous = resource.status.clone().unwrap_or_default();
    if refused != previous {
        report_changes(resource, &previous, &refused, ctx).await;
        let patch = serde_json::json!({
            "apiVersion": crate::deciding::operator::resource::API_VERSION,
            "kind": crate::deciding::operator::resource::KIND,
            "status": refused,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let api: Api<HostPathProvisioner> = Api::all(ctx.client.clone());
        if let Err(error) = api.patch_status(&name, &params, &Patch::Apply(&patch)).await {
            let error = OperatorError::api(format!("write the status of HostPathProvisioner {name}"), error);
            publish(ctx, resource, EventType::Warning, reason::STATUS_FAILED, &error.to_string()).await;
            return Err(error);
        }
    }
    Ok(Action::requeue(Duration::from_secs(300)))
}

/// Takes the resource over from the kubevirt operator, with an Event saying what was done (a
/// failure is reported by the caller: in the status while the resource lives).
async fn take_over(
    resource: &HostPathProvisioner,
    ctx: &Context,
    facts: &super::takeover::Facts,
    replace_legacy: bool,
) -> Result<(), OperatorError> {
    match super::takeover::take_over(&ctx.client, resource, facts, replace_legacy).await {
        Ok(plan) if plan.is_empty() => Ok(()),
        Ok(plan) => {
            publish(ctx, resource, EventType::Normal, reason::TOOK_OVER, &plan.summary()).await;
            Ok(())
        }
        Err(error) => {
            tracing::warn!(resource = %resource.name_any(), %error, "cannot take the resource over from the kubevirt operator");
            Err(error)
        }
    }
}

/// The take-over must not start: the condition `TakeOverStopped` and a Warning Event say why
/// and what to do (once; nothing is written while they say it already), and the operator looks
/// again in a minute.
async fn take_over_stopped(
    resource: &HostPathProvisioner,
    ctx: &Context,
    stop: &crate::deciding::operator::takeover_stop::Stop,
) -> Result<Action, OperatorError> {
    match super::takeover::report_stop(&ctx.client, resource, stop).await {
        Ok(true) => {
            tracing::warn!(resource = %resource.name_any(), reason = stop.reason, message = %stop.message, "not taking the resource over");
            publish(ctx, resource, EventType::Warning, stop.reason, &stop.message).await;
        }
        Ok(false) => {}
        Err(error) => {
            tracing::warn!(resource = %resource.name_any(), %error, "cannot say why the resource is not taken over");
            return Err(error);
        }
    }
    Ok(Action::requeue(Duration::from_secs(60)))
}

/// Events and log lines for what changed: a new Degraded reason or message is a Warning (each
/// failed step: an object that did not apply, a spec problem), a recovery a Normal event.
async fn report_changes(resource: &HostPathProvisioner, previous: &Status, new: &Status, ctx: &Context) {
    let degraded = |s: &Status| s.conditions.iter().find(|c| c.type_ == status::DEGRADED).cloned();
    let (before, after) = (degraded(previous), degraded(new));
    let Some(after) = after else { return };
    let changed = before.as_ref().is_none_or(|b| b.status != after.status || b.message != after.message);
    if !changed {
        return;
    }
    if after.status == "True" {
        tracing::warn!(resource = %resource.name_any(), reason = %after.reason, message = %after.message, "resource degraded");
        publish(ctx, resource, EventType::Warning, &after.reason, &after.message).await;
    } else if before.is_some_and(|b| b.status == "True") {
        tracing::info!(resource = %resource.name_any(), "resource no longer degraded");
        publish(ctx, resource, EventType::Normal, reason::APPLIED, "every object of the resource is applied").await;
    }
}

async fn publish(ctx: &Context, resource: &HostPathProvisioner, type_: EventType, reason: &str, note: &str) {
    // The recorder folds Events of the same reason and action into one series, keeping the
    // first note: the deletion's own steps are another action, so that their notes show.
    let action = if resource.metadata.deletion_timestamp.is_some() { "Cleanup" } else { "Reconcile" };
    let event = Event {
        type_,
        reason: reason.to_owned(),
        // The API server refuses notes over 1 kB.
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary: None,
    };
    let regarding = resource.object_ref(&());
    let result = if event::recorder_can_name(&resource.name_any()) {
        ctx.recorder.publish(&event, &regarding).await
    } else {
        // Too long a name for the recorder's Event name (deciding::event): written as a first
        // occurrence under a shortened one.
        let type_ = if type_ == EventType::Warning { "Warning" } else { "Normal" };
        let note = event.note.as_deref().unwrap_or_default();
        let text = event::EventText { type_, reason, action, note };
        let written = event::new_event(FIELD_MANAGER, &ctx.identity, &regarding, text, Timestamp::now());
        let namespace = written.metadata.namespace.clone().unwrap_or_default();
        let events: Api<K8sEvent> = Api::namespaced(ctx.client.clone(), &namespace);
        events.create(&PostParams::default(), &written).await.map(|_| ())
    };
    if let Err(error) = result {
        tracing::warn!(%error, reason, "cannot write an Event on the resource");
    }
}

/// What the cluster serves besides core Kubernetes: the SCC API (OpenShift) and the Prometheus
/// Operator's kinds. Asked at each reconcile, since either may be installed later.
async fn environment(ctx: &Context) -> Environment {
    let serves = |group_version: &'static str, plurals: &'static [&'static str]| {
        let client = ctx.client.clone();
        async move {
            match client.list_api_group_resources(group_version).await {
                Ok(list) => plurals.iter().all(|p| list.resources.iter().any(|r| r.name == *p)),
                Err(_) => false,
            }
        }
    };
    Environment {
        namespace: ctx.namespace.clone(),
        image: ctx.image.clone(),
        openshift: serves("security.openshift.io/v1", &["securitycontextconstraints"]).await,
        prometheus: serves("monitoring.coreos.com/v1", &["servicemonitors", "prometheusrules"]).await,
        held_pools: Vec::new(),
        pool_roots: Vec::new(),
        image_pull_secrets: ctx.image_pull_secrets.clone(),
    }
}

fn pool_target<'a>(resource: &'a HostPathProvisioner, ctx: &'a Context) -> super::pool_claims::Target<'a> {
    super::pool_claims::Target {
        client: &ctx.client,
        namespace: &ctx.namespace,
        image: &ctx.image,
        image_pull_secrets: &ctx.image_pull_secrets,
        resource: resource.metadata.name.as_deref().unwrap_or_default(),
        field_manager: FIELD_MANAGER,
    }
}

fn api_for(client: &Client, object: &Desired) -> Api<DynamicObject> {
    let (group, version) = object.api_version.rsplit_once('/').unwrap_or(("", object.api_version.as_str()));
    let gvk = GroupVersionKind::gvk(group, version, &object.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &object.plural);
    match &object.namespace {
        Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
        None => Api::all_with(client.clone(), &resource),
    }
}

async fn apply_object(client: &Client, object: &Desired) -> Result<(), kube::Error> {
    // force: the operator owns these objects' fields, including from an earlier manual apply.
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api_for(client, object).patch(&object.name, &params, &Patch::Apply(&object.body)).await.map(|_| ())
}

/// The node DaemonSet's rollout, if the resource rendered one.
async fn rollout(ctx: &Context, rendered: &Rendered) -> Result<Option<Rollout>, OperatorError> {
    let Some(desired) = rendered.objects.iter().find(|o| o.kind == "DaemonSet") else { return Ok(None) };
    let api: Api<DaemonSet> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    let daemonset = api
        .get_opt(&desired.name)
        .await
        .map_err(|e| OperatorError::api(format!("read DaemonSet {}", desired.name), e))?;
    Ok(daemonset.map(|d| {
        let generation = d.metadata.generation.unwrap_or(0);
        let status = d.status.unwrap_or_default();
        Rollout {
            desired: status.desired_number_scheduled,
            updated: status.updated_number_scheduled.unwrap_or(0),
            available: status.number_available.unwrap_or(0),
            current: status.observed_generation.unwrap_or(0) >= generation,
        }
    }))
}

/// `spec.releaseClaimsOfRemovedNodes` turned off: the claim releaser an earlier spec made goes
/// (only objects this resource made: its owner reference), its ClusterRole with it, so that no
/// identity keeps `delete` on claims nobody asked for.
async fn remove_unasked_claim_releaser(
    resource: &HostPathProvisioner,
    ctx: &Context,
    rendered: &Rendered,
    environment: &Environment,
) -> Result<(), String> {
    let made = claim_releaser::made_objects(environment);
    if rendered.objects.iter().any(|o| o.kind == "Deployment" && o.name == claim_releaser::NAME) {
        return Ok(());
    }
    let uid = resource.uid().unwrap_or_default();
    for probe in &made {
        let api = api_for(&ctx.client, probe);
        let existing =
            api.get_opt(&probe.name).await.map_err(|e| format!("read {} {}: {e}", probe.kind, probe.name))?;
        let Some(existing) = existing else { continue };
        if !existing.owner_references().iter().any(|r| r.uid == uid) {
            continue;
        }
        match api.delete(&probe.name, &DeleteParams::background()).await {
            Ok(_) => tracing::info!(
                resource = %resource.name_any(),
                kind = %probe.kind,
                name = %probe.name,
                "removed: spec.releaseClaimsOfRemovedNodes is off"
            ),
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(error) => return Err(format!("delete {} {}: {error}", probe.kind, probe.name)),
        }
    }
    Ok(())
}

/// The kinds a resource may have made, with where they live.
const MADE_KINDS: [(&str, &str, &str, bool); 12] = [
    ("apps/v1", "DaemonSet", "daemonsets", true),
    // The claim releaser (spec.releaseClaimsOfRemovedNodes).
    ("apps/v1", "Deployment", "deployments", true),
    ("v1", "ServiceAccount", "serviceaccounts", true),
    ("rbac.authorization.k8s.io/v1", "Role", "roles", true),
    ("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", true),
    ("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", false),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", false),
    ("security.openshift.io/v1", "SecurityContextConstraints", "securitycontextconstraints", false),
    ("v1", "Service", "services", true),
    ("monitoring.coreos.com/v1", "ServiceMonitor", "servicemonitors", true),
    ("monitoring.coreos.com/v1", "PrometheusRule", "prometheusrules", true),
    ("storage.k8s.io/v1", "CSIDriver", "csidrivers", false),
];

/// Removes the objects this resource made (its label and its uid in their owner references).
/// The node pods go with the DaemonSet; PersistentVolumes and their directories stay: released
/// volumes wait, with their data, for a provisioner to serve them again.
async fn cleanup(resource: &HostPathProvisioner, ctx: &Context) -> Result<Action, OperatorError> {
    let name = resource.name_any();
    let uid = resource.uid().unwrap_or_default();
    // Pools on a claim first: while PVs of ours live in one, everything stays (the node
    // provisioner too, to serve and release those volumes) and the finalizer holds.
    let target = pool_target(resource, ctx);
    let found = super::pool_claims::read(&target, false).await?;
    let pools = super::pool_claims::reconcile(&target, &found, &[], &Default::default()).await;
    if let Some(failure) = &pools.failure {
        publish(ctx, resource, EventType::Warning, reason::CLEANUP_FAILED, failure).await;
        return Err(OperatorError::Config(failure.clone()));
    }
    if !pools.held_back.is_empty() {
        let message = format!("deletion of HostPathProvisioner {name} waits: {}", pools.held_back.join("; "));
        publish(ctx, resource, EventType::Warning, reason::POOL_HELD_BACK, &message).await;
        return Err(OperatorError::PoolHeldBack(message));
    }
    let environment = environment(ctx).await;
    for (api_version, kind, plural, namespaced) in MADE_KINDS {
        let optional_group = match api_version {
            "security.openshift.io/v1" => Some(environment.openshift),
            "monitoring.coreos.com/v1" => Some(environment.prometheus),
            _ => None,
        };
        if optional_group == Some(false) {
            continue;
        }
        let probe = Desired {
            api_version: api_version.into(),
            kind: kind.into(),
            plural: plural.into(),
            name: String::new(),
            namespace: namespaced.then(|| ctx.namespace.clone()),
            body: serde_json::Value::Null,
        };
        let api = api_for(&ctx.client, &probe);
        let selector = format!("{OWNER_LABEL}={name}");
        let made = match api.list(&ListParams::default().labels(&selector)).await {
            Ok(list) => list.items,
            Err(error) => {
                let error = OperatorError::api(format!("list the {kind}s made for HostPathProvisioner {name}"), error);
                publish(ctx, resource, EventType::Warning, reason::CLEANUP_FAILED, &error.to_string()).await;
                return Err(error);
            }
        };
        for object in made.iter().filter(|o| o.owner_references().iter().any(|r| r.uid == uid)) {
            let object_name = object.name_any();
            match api.delete(&object_name, &DeleteParams::background()).await {
                Ok(_) => tracing::info!(resource = %name, kind, name = %object_name, "removed"),
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(error) => {
                    let error = OperatorError::api(format!("delete {kind} {object_name}"), error);
                    publish(ctx, resource, EventType::Warning, reason::CLEANUP_FAILED, &error.to_string()).await;
                    return Err(error);
                }
            }
        }
    }
    Ok(Action::await_change())
}

//! What a `HostPathProvisioner` makes: the objects of deploy/legacy (ServiceAccount, RBAC, the
//! peers Service, the node DaemonSet), read from the very files users can read and changed only where the resource
//! says so; the pool mounters' ServiceAccount; on OpenShift the SCCs of deploy/openshift (the node
//! pods' and the pool mounters'); with the Prometheus Operator the metrics
//! Service, ServiceMonitor and PrometheusRule of deploy/monitoring; with published capacity the
//! CSIDriver of the provisioner name (render_features.rs). Namespaced objects go in the
//! operator's namespace; every object carries an owner reference to the resource, so that the
//! garbage collector removes them with it.
//!
//! The spec's problems (a malformed affinity, a pool name the node binary cannot take) are
//! returned next to the objects, to be reported in the status: a problem of the whole resource
//! renders nothing (what runs keeps running), a problem of one pool leaves that pool out.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Affinity, Container, EnvVar, HostPathVolumeSource, LocalObjectReference, PersistentVolumeClaimSpec, ServiceAccount,
    Toleration, Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::embedded::{self, EmbeddedError};
use super::resource::{API_VERSION, HostPathProvisioner, KIND, StoragePool};
use crate::deciding::layout;

/// The mounters' ServiceAccount, made here next to the node pods': none of the
/// namespace's other pods may use the mounters' SCC.
pub const MOUNTER_SERVICE_ACCOUNT: &str = "kubevirt-hostpath-provisioner-pool-mounter";
/// The mounters' SCC (deploy/openshift/pool-mounter-scc.yaml), which their pods pin. Not a name
/// of the kubevirt operator's SCCs (`hostpath-provisioner`, `hostpath-provisioner-csi`).
pub const MOUNTER_SCC: &str = "kubevirt-hostpath-provisioner-pool-mounter";

const DAEMONSET: &str = include_str!("../../../deploy/legacy/daemonset.yaml");
const RBAC: &str = include_str!("../../../deploy/legacy/rbac.yaml");
const SERVICE_ACCOUNT: &str = include_str!("../../../deploy/legacy/serviceaccount.yaml");
const PEERS_SERVICE: &str = include_str!("../../../deploy/legacy/peers-service.yaml");
const SCC: &str = include_str!("../../../deploy/openshift/scc.yaml");
const MOUNTER_SCC_FILE: &str = include_str!("../../../deploy/openshift/pool-mounter-scc.yaml");
const METRICS_SERVICE: &str = include_str!("../../../deploy/monitoring/metrics-service.yaml");
const SERVICE_MONITOR: &str = include_str!("../../../deploy/monitoring/servicemonitor.yaml");
const PROMETHEUS_RULE: &str = include_str!("../../../deploy/monitoring/prometheusrule.yaml");
/// The operator's own monitoring: its replicas' metrics Service and ServiceMonitor, and its alert
/// (a plain rule file, wrapped here in a PrometheusRule).
const OPERATOR_METRICS_SERVICE: &str = include_str!("../../../deploy/operator/monitoring/metrics-service.yaml");
const OPERATOR_SERVICE_MONITOR: &str = include_str!("../../../deploy/operator/monitoring/servicemonitor.yaml");
const OPERATOR_RULES: &str = include_str!("../../../deploy/operator/monitoring/alerts.rules.yaml");
/// The name of the PrometheusRule holding [`OPERATOR_RULES`].
pub const OPERATOR_PROMETHEUS_RULE: &str = "hostpath-provisioner-operator";

/// The namespace deploy/legacy names, replaced by the operator's.
const LEGACY_NAMESPACE: &str = "kubevirt-hostpath-provisioner";
/// The pool PV_DIR is served as by the node binary (its configuration's name for it).
const LEGACY_POOL: &str = "legacy";
/// The node container's name in daemonset.yaml.
pub const NODE_CONTAINER: &str = "kubevirt-hostpath-provisioner";
/// The pool root volume of daemonset.yaml (the legacy pool), kept for `pathConfig`.
const LEGACY_VOLUME: &str = "pv-volume";
/// The node pods' SCC (deploy/openshift/scc.yaml), which their pods pin on OpenShift. Not the
/// kubevirt operator's `hostpath-provisioner`: applying over it would take that SCC over, and
/// deleting the resource would delete it.
pub const NODE_SCC: &str = "kubevirt-hostpath-provisioner";
/// The annotation by which a pod names the one SCC that may admit it (OpenShift 4.14 and later).
pub const REQUIRED_SCC: &str = "openshift.io/required-scc";
/// Label on everything the operator makes: which resource made it.
pub const OWNER_LABEL: &str = "hostpathprovisioner.kubevirt.io/resource";
/// The recommended labels deploy/legacy's kustomization puts on pods; the metrics Service
/// selects the pods by them.
const POD_LABELS: [(&str, &str); 3] = [
    ("app.kubernetes.io/name", "hostpath-provisioner"),
    ("app.kubernetes.io/instance", "kubevirt-hostpath-provisioner"),
    ("app.kubernetes.io/part-of", "hostpath-provisioner"),
];

/// What the cluster serves besides core Kubernetes, and where the operator runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Environment {
    /// The operator's namespace: every namespaced object goes there.
    pub namespace: String,
    /// The node pods' image: the operator's own.
    pub image: String,
    /// `security.openshift.io/v1` SecurityContextConstraints are served.
    pub openshift: bool,
    /// The Prometheus Operator's ServiceMonitor and PrometheusRule are served.
    pub prometheus: bool,
    /// Pools on a claim gone from the spec whose claims PVs of ours still hold (name, path):
    /// the DaemonSet keeps serving them (only while mounted), so that those volumes can still
    /// be used and released.
    pub held_pools: Vec<(String, String)>,
    /// Pools on a claim served at another root than their path (name, root): a claim taken over
    /// from the kubevirt operator stays mounted at `<path>/csi`, where its CSI volumes are.
    pub pool_roots: Vec<(String, String)>,
    /// Pull secrets (names, in the operator's namespace) the node pods and the pool mounters
    /// get: the operator pod's own (docs/operator.md, "Private registries").
    pub image_pull_secrets: Vec<String>,
}

/// One object to apply, with what the API needs to address it.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub api_version: String,
    pub kind: String,
    /// The resource's URL segment (`daemonsets`).
    pub plural: String,
    pub name: String,
    /// None for cluster-scoped kinds.
    pub namespace: Option<String>,
    pub body: Value,
}

/// Something in the spec that cannot be acted upon as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// CamelCase, the condition's and the Event's reason.
    pub reason: &'static str,
    /// What is wrong and what to change.
    pub message: String,
    /// The pool it concerns; None: the whole resource.
    pub pool: Option<String>,
}

/// The outcome of rendering a resource.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rendered {
    /// Empty when a problem of the whole resource stops rendering.
    pub objects: Vec<Desired>,
    pub problems: Vec<Problem>,
    /// Fields accepted but with no effect here, named by their path in the spec.
    pub not_acted_upon: Vec<String>,
    /// The pools the DaemonSet serves, in spec order (`legacy` for pathConfig).
    pub served_pools: Vec<String>,
    /// The served pools on a claim (`pvcTemplate`), whose claims and mounters the operator
    /// makes per node ([`super::pool_plan`]).
    pub pools_on_claim: Vec<PoolOnClaim>,
    /// Where the node DaemonSet's pods may run (its file's placement plus the resource's): the
    /// nodes that get a pool's claim and mounter.
    pub placement: NodePlacement,
}

/// A pool on a claim as the DaemonSet serves it.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolOnClaim {
    pub name: String,
    pub path: String,
    pub template: PersistentVolumeClaimSpec,
}

/// The node DaemonSet pods' placement.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodePlacement {
    pub node_selector: BTreeMap<String, String>,
    pub affinity: Option<Affinity>,
    pub tolerations: Vec<Toleration>,
}

impl Rendered {
    /// Whether a problem of the whole resource stopped rendering.
    pub fn blocked(&self) -> bool {
        self.problems.iter().any(|p| p.pool.is_none())
    }
}

/// A pool the node DaemonSet serves: its name in STORAGE_POOLS and its root on the node.
#[derive(Clone, Debug, PartialEq)]
struct ServedPool {
    name: String,
    path: String,
    /// The pool's claim template: the pool is served only while something is mounted at its
    /// path (its `mountpoint` option), so that no volume lands on the root disk before the
    /// claim is mounted there, after a reboot too.
    template: Option<PersistentVolumeClaimSpec>,
    /// Gone from the spec, served while PVs of ours hold its claim (also only while mounted).
    held: bool,
    /// Where the node serves it when not at `path` (a kubevirt claim's `<path>/csi`).
    root: Option<String>,
    /// The spec's entry (None: the legacy pool, or a held one), for its options.
    options: Option<StoragePool>,
}

/// Renders `resource` for `environment`.
pub fn render(resource: &HostPathProvisioner, environment: &Environment) -> Rendered {
    let mut rendered = Rendered { not_acted_upon: not_acted_upon(resource), ..Rendered::default() };
    // A resource stored before the CRD's rules applied (the kubevirt operator's schema) may
    // break them: told, and nothing rendered, as the API server would have refused it.
    let broken = super::spec_rules::broken_rules(&resource.spec);
    if !broken.is_empty() {
        rendered.problems.push(Problem {
            reason: "InvalidSpec",
            message: format!(
                "the resource breaks this operator's rules (it was stored before they applied); edit it, what runs is left as it was: {}",
                broken.join("; ")
            ),
            pool: None,
        });
        return rendered;
    }
    let placement = match Placement::parse(resource) {
        Ok(placement) => placement,
        Err(problem) => {
            rendered.problems.push(problem);
            return rendered;
        }
    };
    // spec.releaseClaimsOfRemovedNodes (claim_releaser).
    let release_claims = match claim_releaser::requested(resource) {
        Ok(grace) => grace,
        Err(problem) => {
            rendered.problems.push(problem);
            return rendered;
        }
    };
    let mut pools = served_pools(resource, &mut rendered.problems);
    for pool in pools.iter_mut().filter(|p| p.template.is_some()) {
        if let Some((_, root)) = environment.pool_roots.iter().find(|(name, _)| *name == pool.name) {
            pool.root = Some(root.clone());
        }
    }
    if resource.spec.path_config.is_none() {
        for (name, path) in &environment.held_pools {
            let clashes = pools.iter().any(|p| {
                p.name == *name || Path::new(&p.path).starts_with(path) || Path::new(path).starts_with(&p.path)
            });
            if !clashes {
                pools.push(ServedPool {
                    name: name.clone(),
                    path: path.clone(),
                    template: None,
                    held: true,
                    root: None,
                    options: None,
                });
            }
        }
    }
    if pools.is_empty() {
        rendered.problems.push(Problem {
            reason: "NoPoolServed",
            message: "no pool can be served as written (see the other problems): the node DaemonSet is left as it was"
                .into(),
            pool: None,
        });
        return rendered;
    }
    rendered.served_pools = pools.iter().map(|p| p.name.clone()).collect();
    rendered.pools_on_claim = pools
        .iter()
        .filter_map(|p| {
            let template = p.template.clone()?;
            Some(PoolOnClaim { name: p.name.clone(), path: p.path.clone(), template })
        })
        .collect();
    let objects = objects(resource, environment, &placement, &pools).and_then(|mut objects| {
        if let Some(grace) = &release_claims {
            objects.extend(claim_releaser::objects(resource, environment, grace)?);
        }
        Ok(objects)
    });
    match objects {
        Ok(objects) => {
            rendered.placement = objects
                .iter()
                .find(|o| o.kind == "DaemonSet")
                .and_then(|o| o.body.pointer("/spec/template/spec").cloned())
                .and_then(|pod| serde_json::from_value::<k8s_openapi::api::core::v1::PodSpec>(pod).ok())
                .map(|pod| NodePlacement {
                    node_selector: pod.node_selector.unwrap_or_default(),
                    affinity: pod.affinity,
                    tolerations: pod.tolerations.unwrap_or_default(),
                })
                .unwrap_or_default();
            rendered.objects = objects;
        }
        Err(message) => rendered.problems.push(Problem { reason: "RenderFailed", message, pool: None }),
    }
    rendered
}

/// `spec.workload`, parsed into the core types.
#[derive(Clone, Debug, Default, PartialEq)]
struct Placement {
    node_selector: BTreeMap<String, String>,
    affinity: Option<Affinity>,
    tolerations: Vec<Toleration>,
}

impl Placement {
    fn parse(resource: &HostPathProvisioner) -> Result<Placement, Problem> {
        let workload = &resource.spec.workload;
        let problem = |reason| move |error: EmbeddedError| Problem { reason, message: error.to_string(), pool: None };
        let affinity = match &workload.affinity {
            None => None,
            Some(value) => Some(
                embedded::parse::<Affinity>(value, "spec.workload.affinity", AFFINITY)
                    .map_err(problem("InvalidAffinity"))?,
            ),
        };
        let tolerations = workload
            .tolerations
            .iter()
            .enumerate()
            .map(|(i, value)| {
                embedded::parse::<Toleration>(value, &format!("spec.workload.tolerations[{i}]"), TOLERATION)
                    .map_err(problem("InvalidTolerations"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Placement { node_selector: workload.node_selector.clone(), affinity, tolerations })
    }
}

const AFFINITY: embedded::Kind = embedded::Kind { name: "Affinity", as_for: "a pod's spec.affinity" };
const TOLERATION: embedded::Kind = embedded::Kind { name: "Toleration", as_for: "a pod's spec.tolerations" };
const CLAIM_SPEC: embedded::Kind = embedded::Kind { name: "PersistentVolumeClaimSpec", as_for: "a claim's spec" };

/// The pool claim template of the pool at `index` in the spec, parsed, or the problem that
/// leaves the pool out.
pub fn claim_template(index: usize, pool: &StoragePool) -> Result<Option<PersistentVolumeClaimSpec>, Problem> {
    let Some(value) = &pool.pvc_template else { return Ok(None) };
    let problem = |reason, message| Problem { reason, message, pool: Some(pool.name.clone()) };
    let at = format!("spec.storagePools[{index}].pvcTemplate");
    let template = embedded::parse::<PersistentVolumeClaimSpec>(value, &at, CLAIM_SPEC)
        .map_err(|e| problem("InvalidPvcTemplate", format!("storage pool {:?}: {e}", pool.name)))?;
    if template.volume_mode.as_deref() == Some("Block") {
        return Err(problem(
            "BlockPoolNotSupported",
            format!(
                "storage pool {:?}: pvcTemplate asks for a Block volume; this provisioner carves volumes as directories of a mounted filesystem, so the pool needs volumeMode Filesystem (remove volumeMode or set it to Filesystem)",
                pool.name
            ),
        ));
    }
    Ok(Some(template))
}

/// The pools the DaemonSet serves, each problem of a pool recorded and that pool left out.
fn served_pools(resource: &HostPathProvisioner, problems: &mut Vec<Problem>) -> Vec<ServedPool> {
    if let Some(path_config) = &resource.spec.path_config {
        return vec![ServedPool {
            name: LEGACY_POOL.to_owned(),
            path: path_config.path.clone(),
            template: None,
            held: false,
            root: None,
            options: None,
        }];
    }
    let mut served = Vec::new();
    for (index, pool) in resource.spec.storage_pools.iter().enumerate() {
        if !layout::is_dns_label(&pool.name) {
            problems.push(Problem {
                reason: "InvalidPoolName",
                message: format!(
                    "storage pool {:?}: a pool name is a StorageClass parameter value and must be a DNS label (lower-case letters, digits and '-', at most 63): rename it",
                    pool.name
                ),
                pool: Some(pool.name.clone()),
            });
            continue;
        }
        match claim_template(index, pool) {
            Err(problem) => problems.push(problem),
            Ok(template) => served.push(ServedPool {
                name: pool.name.clone(),
                path: pool.path.clone(),
                template,
                held: false,
                root: None,
                options: Some(pool.clone()),
            }),
        }
    }
    served
}

/// Fields with no effect here: the kubevirt CSI driver's.
fn not_acted_upon(resource: &HostPathProvisioner) -> Vec<String> {
    let mut fields = Vec::new();
    if !resource.spec.feature_gates.is_empty() {
        fields.push(format!("spec.featureGates ({})", resource.spec.feature_gates.join(", ")));
    }
    for (i, pool) in resource.spec.storage_pools.iter().enumerate() {
        if pool.snapshot_provider.is_some() {
            fields.push(format!("spec.storagePools[{i}].snapshotProvider"));
        }
        if pool.overlay_class_name.is_some() {
            fields.push(format!("spec.storagePools[{i}].overlayClassName"));
        }
    }
    fields
}

fn objects(
    resource: &HostPathProvisioner,
    environment: &Environment,
    placement: &Placement,
    pools: &[ServedPool],
) -> Result<Vec<Desired>, String> {
    let namespace = environment.namespace.as_str();
    let mut objects = Vec::new();
    let mut service_account: ServiceAccount = typed(SERVICE_ACCOUNT, "serviceaccount.yaml")?;
    service_account.metadata.namespace = Some(namespace.to_owned());
    let service_account_name = service_account.metadata.name.clone().unwrap_or_default();
    objects.push(desired(resource, "serviceaccounts", &service_account)?);
    // The pool mounters' own identity: no role is bound to it and it mounts no token; it exists
    // so that an SCC can admit the mounters (privileged) and nothing else in the namespace.
    let mounter_account = json!({
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"name": MOUNTER_SERVICE_ACCOUNT, "namespace": namespace},
        "automountServiceAccountToken": false,
    });
    objects.push(desired(resource, "serviceaccounts", &mounter_account)?);
    for document in documents(RBAC, "rbac.yaml")? {
        match document.get("kind").and_then(Value::as_str) {
            Some("ClusterRole") => objects.push(desired(resource, "clusterroles", &from::<ClusterRole>(document)?)?),
            Some("ClusterRoleBinding") => {
                let mut binding: ClusterRoleBinding = from(document)?;
                for subject in binding.subjects.iter_mut().flatten() {
                    subject.namespace = Some(namespace.to_owned());
                }
                objects.push(desired(resource, "clusterrolebindings", &binding)?);
            }
            Some("Role") => {
                let mut role: Role = from(document)?;
                role.metadata.namespace = Some(namespace.to_owned());
                objects.push(desired(resource, "roles", &role)?);
            }
            Some("RoleBinding") => {
                let mut binding: RoleBinding = from(document)?;
                binding.metadata.namespace = Some(namespace.to_owned());
                for subject in binding.subjects.iter_mut().flatten() {
                    subject.namespace = Some(namespace.to_owned());
                }
                objects.push(desired(resource, "rolebindings", &binding)?);
            }
            other => return Err(format!("rbac.yaml: unexpected kind {other:?}")),
        }
    }
    let mut peers = untyped(PEERS_SERVICE, "peers-service.yaml")?;
    peers["metadata"]["namespace"] = json!(namespace);
    objects.push(desired(resource, "services", &peers)?);
    objects.push(desired(resource, "daemonsets", &daemonset(resource, environment, placement, pools)?)?);
    objects.extend(features::capacity_driver(resource)?);
    if environment.openshift {
        for (file, name, text, account) in [
            ("scc.yaml", NODE_SCC, SCC, service_account_name.as_str()),
            ("pool-mounter-scc.yaml", MOUNTER_SCC, MOUNTER_SCC_FILE, MOUNTER_SERVICE_ACCOUNT),
        ] {
            let mut scc = untyped(text, file)?;
            if scc["metadata"]["name"] != name {
                return Err(format!("{file}: the SCC is not named {name}, which the pods require"));
            }
            scc["users"] = json!([format!("system:serviceaccount:{namespace}:{account}")]);
            if name == NODE_SCC {
                features::apply_to_scc(resource, &mut scc);
            }
            objects.push(desired(resource, "securitycontextconstraints", &scc)?);
        }
    }
    if environment.prometheus {
        let mut service = untyped(METRICS_SERVICE, "metrics-service.yaml")?;
        service["metadata"]["namespace"] = json!(namespace);
        objects.push(desired(resource, "services", &service)?);
        let mut monitor = untyped(SERVICE_MONITOR, "servicemonitor.yaml")?;
        monitor["metadata"]["namespace"] = json!(namespace);
        monitor["spec"]["namespaceSelector"]["matchNames"] = json!([namespace]);
        objects.push(desired(resource, "servicemonitors", &monitor)?);
        let mut rule = untyped(PROMETHEUS_RULE, "prometheusrule.yaml")?;
        rule["metadata"]["namespace"] = json!(namespace);
        objects.push(desired(resource, "prometheusrules", &rule)?);
        // The operator's own: `up` of its replicas is what tells that it runs.
        for (text, file, plural) in [
            (OPERATOR_METRICS_SERVICE, "operator/monitoring/metrics-service.yaml", "services"),
            (OPERATOR_SERVICE_MONITOR, "operator/monitoring/servicemonitor.yaml", "servicemonitors"),
        ] {
            let mut object = untyped(text, file)?;
            object["metadata"]["namespace"] = json!(namespace);
            objects.push(desired(resource, plural, &object)?);
        }
        let groups = untyped(OPERATOR_RULES, "operator/monitoring/alerts.rules.yaml")?;
        let rule = json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {
                "name": OPERATOR_PROMETHEUS_RULE,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/name": "hostpath-provisioner-operator"},
            },
            "spec": {"groups": groups["groups"]},
        });
        objects.push(desired(resource, "prometheusrules", &rule)?);
    }
    Ok(objects)
}

/// daemonset.yaml with the resource's placement, pull policy, image and pools.
fn daemonset(
    resource: &HostPathProvisioner,
    environment: &Environment,
    placement: &Placement,
    pools: &[ServedPool],
) -> Result<DaemonSet, String> {
    let mut daemonset: DaemonSet = typed(DAEMONSET, "daemonset.yaml")?;
    daemonset.metadata.namespace = Some(environment.namespace.clone());
    let spec = daemonset.spec.as_mut().ok_or("daemonset.yaml: no spec")?;
    let template_metadata = spec.template.metadata.get_or_insert_with(ObjectMeta::default);
    let template_labels = template_metadata.labels.get_or_insert_default();
    for (key, value) in POD_LABELS {
        template_labels.insert(key.to_owned(), value.to_owned());
    }
    // On OpenShift the node pods are admitted by their own SCC and no other (elsewhere the
    // annotation means nothing).
    template_metadata.annotations.get_or_insert_default().insert(REQUIRED_SCC.to_owned(), NODE_SCC.to_owned());
    let pod = spec.template.spec.as_mut().ok_or("daemonset.yaml: no pod spec")?;
    // The file's node selector (Linux nodes: the binary is Linux-only) stays, the resource's adds
    // to it and wins on a key both name. Tolerations are the resource's alone, as the kubevirt
    // operator has them: the file's control-plane toleration is for deploy/legacy, and here it
    // would put node pods, pool claims and mounters on control-plane nodes nobody asked for.
    pod.node_selector.get_or_insert_default().extend(placement.node_selector.clone());
    pod.tolerations = Some(placement.tolerations.clone()).filter(|t| !t.is_empty());
    pod.affinity = placement.affinity.clone();
    pod.image_pull_secrets = pull_secrets(&environment.image_pull_secrets);
    let container = pod
        .containers
        .iter_mut()
        .find(|c| c.name == NODE_CONTAINER)
        .ok_or("daemonset.yaml: no provisioner container")?;
    container.image = Some(environment.image.clone());
    if let Some(policy) = resource.spec.image_pull_policy.as_deref().filter(|p| !p.is_empty()) {
        container.image_pull_policy = Some(policy.to_owned());
    }
    features::apply_to_container(resource, container);
    let volumes = pod.volumes.get_or_insert_default();
    match &resource.spec.path_config {
        Some(path_config) => {
            // The legacy provisioner exactly as the kubevirt operator deployed it: PV_DIR and
            // the naming prefix, the pool root mounted at the same path as on the host.
            set_env(container, "PV_DIR", Some(&path_config.path));
            set_env(container, "USE_NAMING_PREFIX", Some(if path_config.use_naming_prefix { "true" } else { "false" }));
            for mount in container.volume_mounts.iter_mut().flatten().filter(|m| m.name == LEGACY_VOLUME) {
                mount.mount_path = path_config.path.clone();
            }
            for volume in volumes.iter_mut().filter(|v| v.name == LEGACY_VOLUME) {
                if let Some(host_path) = volume.host_path.as_mut() {
                    host_path.path = path_config.path.clone();
                }
            }
        }
        None => {
            set_env(container, "PV_DIR", None);
            volumes.retain(|v| v.name != LEGACY_VOLUME);
            let entries: Vec<String> = pools
                .iter()
                .map(|p| {
                    let options = features::pool_options(p.options.as_ref(), p.template.is_some() || p.held);
                    format!("{}={}{options}", p.name, p.root.as_deref().unwrap_or(&p.path))
                })
                .collect();
            set_env(container, "STORAGE_POOLS", Some(&entries.join(",")));
            let mounts = container.volume_mounts.get_or_insert_default();
            mounts.retain(|m| m.name != LEGACY_VOLUME);
            for (i, pool) in pools.iter().enumerate() {
                // By position: a pool name may be as long as a volume name may be.
                let name = format!("pool-{}", i + 1);
                volumes.push(Volume {
                    name: name.clone(),
                    host_path: Some(HostPathVolumeSource {
                        path: pool.path.clone(),
                        type_: Some("DirectoryOrCreate".into()),
                    }),
                    ..Volume::default()
                });
                mounts.push(VolumeMount {
                    name,
                    mount_path: pool.path.clone(),
                    mount_propagation: Some("HostToContainer".into()),
                    ..VolumeMount::default()
                });
            }
        }
    }
    features::apply_block_volumes(resource, pod, NODE_CONTAINER);
    Ok(daemonset)
}

/// `imagePullSecrets` naming `secrets`, as JSON; None for none.
pub(super) fn pull_secrets_json(secrets: &[String]) -> Option<Value> {
    pull_secrets(secrets).and_then(|s| serde_json::to_value(s).ok())
}

/// `imagePullSecrets` naming `secrets`; None for none.
fn pull_secrets(secrets: &[String]) -> Option<Vec<LocalObjectReference>> {
    Some(secrets.iter().map(|name| LocalObjectReference { name: name.clone() }).collect())
        .filter(|s: &Vec<_>| !s.is_empty())
}

/// Sets (or with None removes) a plain env var, keeping the file's order.
fn set_env(container: &mut Container, name: &str, value: Option<&str>) {
    let env = container.env.get_or_insert_default();
    match (env.iter_mut().find(|e| e.name == name), value) {
        (Some(existing), Some(value)) => {
            existing.value = Some(value.to_owned());
            existing.value_from = None;
        }
        (None, Some(value)) => {
            env.push(EnvVar { name: name.to_owned(), value: Some(value.to_owned()), ..EnvVar::default() })
        }
        (_, None) => env.retain(|e| e.name != name),
    }
}

/// The owner reference every made object carries.
pub fn owner_reference(resource: &HostPathProvisioner) -> OwnerReference {
    OwnerReference {
        api_version: API_VERSION.to_owned(),
        kind: KIND.to_owned(),
        name: resource.metadata.name.clone().unwrap_or_default(),
        uid: resource.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

pub(super) fn desired(
    resource: &HostPathProvisioner,
    plural: &str,
    object: &impl Serialize,
) -> Result<Desired, String> {
    let mut body = serde_json::to_value(object).map_err(|e| e.to_string())?;
    let owner = serde_json::to_value(owner_reference(resource)).map_err(|e| e.to_string())?;
    let metadata = body.get_mut("metadata").and_then(Value::as_object_mut).ok_or("object without metadata")?;
    metadata.insert("ownerReferences".into(), json!([owner]));
    let labels = metadata.entry("labels").or_insert_with(|| json!({}));
    labels[OWNER_LABEL] = json!(resource.metadata.name.clone().unwrap_or_default());
    labels["app.kubernetes.io/managed-by"] = json!("hostpath-provisioner-operator");
    let text = |key: &str| body.get(key).and_then(Value::as_str).map(str::to_owned);
    let meta = |key: &str| body["metadata"].get(key).and_then(Value::as_str).map(str::to_owned);
    Ok(Desired {
        api_version: text("apiVersion").ok_or("object without apiVersion")?,
        kind: text("kind").ok_or("object without kind")?,
        plural: plural.to_owned(),
        name: meta("name").ok_or("object without name")?,
        namespace: meta("namespace"),
        body,
    })
}

/// The YAML documents of an embedded file, comments and empty documents dropped.
pub(super) fn documents(text: &str, file: &str) -> Result<Vec<Value>, String> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| format!("{file}: {e}"))?;
    Ok(documents.into_iter().filter(|d| d.is_object()).collect())
}

fn untyped(text: &str, file: &str) -> Result<Value, String> {
    documents(text, file)?.into_iter().next().ok_or_else(|| format!("{file}: no object"))
}

fn typed<T: DeserializeOwned>(text: &str, file: &str) -> Result<T, String> {
    serde_json::from_value(untyped(text, file)?).map_err(|e| format!("{file}: {e}"))
}

fn from<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| e.to_string())
}

/// deploy/legacy's namespace, which the operator's replaces (exposed for tests and docs).
pub fn legacy_namespace() -> &'static str {
    LEGACY_NAMESPACE
}

/// The claim releaser a resource makes (`spec.releaseClaimsOfRemovedNodes`): part of what a
/// resource renders, so a module of this one.
#[path = "claim_releaser.rs"]
pub mod claim_releaser;
#[path = "render_features.rs"]
mod features;
pub use features::{CONFIG_FIELDS, QUOTA_CAPABILITY, config_env, field_of_env};

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;

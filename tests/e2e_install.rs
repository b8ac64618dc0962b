//! End-to-end: the three install paths of the README (the Helm chart, the one file
//! `deploy/install.yaml`, the kustomization `deploy/legacy`) against the real control plane,
//! each followed by a claim provisioned under the installed RBAC and class; the chart linted
//! and rendered for its default and its maximal values; every rendered variant through
//! server-side dry-run; kube-score over the rendered manifests; the checked-in rendered files
//! kept in step with their sources.
//!
//! helm and kube-score are built from the Go module proxy by `hack/build-deploy-tools.sh` (cached
//! like the control plane), and so are the CRDs of the chart's optional kinds.

mod common;
mod helm;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use helm::{CHART, chart_template, helm, helm_refusal};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use testbed::{DeployTool, deploy_tool, fixtures};

const MAX_VALUES: &str = "deploy/helm/hostpath-provisioner/ci/max-values.yaml";
const NODE_GROUPS_VALUES: &str = "deploy/helm/hostpath-provisioner/ci/node-groups-values.yaml";
/// Namespace and names of the objects `deploy/legacy` creates.
const LEGACY_NAMESPACE: &str = "kubevirt-hostpath-provisioner";
const LEGACY_SERVICE_ACCOUNT: &str = "kubevirt-hostpath-provisioner-admin";
/// The registry placeholder of the deploy files and the chart (README, "Install").
const PLACEHOLDER_REGISTRY: &str = "your-registry.invalid";

/// The installs create the same cluster-wide objects (StorageClass `hostpath-provisioner`), so
/// the tests that create them take turns; each removes what it created. The server-side dry runs
/// take their turn too: they read those objects and then patch or create them, and one deleted
/// or created in between by an install test fails them with NotFound or AlreadyExists.
static CLUSTER_OBJECTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `program` in the repository and returns its stdout; panics with its stderr on failure.
fn run(program: &Path, args: &[&str], envs: &[(&str, &Path)]) -> String {
    let output = Command::new(program)
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, *v)))
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    assert!(
        output.status.success(),
        "{} {} failed ({}):\n{}\n{}",
        program.display(),
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn kubectl(env: &TestEnv, args: &[&str]) -> String {
    env.cp.run_kubectl(&repo(), args).unwrap_or_else(|e| panic!("{e:#}"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Applies the CRDs the chart's optional kinds need (ServiceMonitor, PrometheusRule,
/// SecurityContextConstraints), taken from the Go modules that publish them, once per binary.
async fn install_crds(env: &TestEnv) {
    static DONE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    DONE.get_or_init(|| async {
        let dir = deploy_tool(DeployTool::Crds).unwrap_or_else(|e| panic!("{e:#}"));
        let dir = dir.to_str().expect("utf-8 path");
        // Server-side: the CRDs are larger than the last-applied annotation allows.
        kubectl(env, &["apply", "--server-side", "-f", dir]);
        kubectl(env, &["wait", "--for", "condition=Established", "--timeout=90s", "-f", dir]);
    })
    .await;
}

/// `kubectl apply --dry-run=server` of `manifests`, returning the objects as the API server
/// would store them.
fn server_dry_run(env: &TestEnv, name: &str, manifests: &str) -> Vec<Value> {
    let file = env.cp.temp_dir().join(format!("{}-{name}.yaml", env.group));
    std::fs::write(&file, manifests).expect("write manifests");
    let out = kubectl(env, &["apply", "--dry-run=server", "-o", "json", "-f", file.to_str().expect("utf-8 path")]);
    let _ = std::fs::remove_file(&file);
    let value: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{name}: dry-run output: {e}\n{out}"));
    match value["kind"].as_str() {
        Some("List") => value["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![value],
    }
}

/// The number of YAML documents that hold an object.
fn document_count(manifests: &str) -> usize {
    manifests.split("\n---").filter(|doc| doc.lines().any(|l| l.starts_with("kind:"))).count()
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind} among the objects"))
}

/// The first `kind` object that is not a role for tenants (the provisioner's own).
fn find_provisioners<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && aggregated_to(o).is_empty())
        .unwrap_or_else(|| panic!("no {kind} among the objects"))
}

/// The built-in roles (`admin`, `edit`, `view`) a ClusterRole's aggregation labels add it to.
fn aggregated_to(role: &Value) -> Vec<String> {
    let labels = role["metadata"]["labels"].as_object().cloned().unwrap_or_default();
    labels
        .iter()
        .filter(|(_, value)| *value == "true")
        .filter_map(|(key, _)| key.strip_prefix("rbac.authorization.k8s.io/aggregate-to-").map(str::to_owned))
        .collect()
}

/// The ClusterRoles that aggregate to built-in roles: name, the roles they join, their rules.
fn tenant_roles(objects: &[Value]) -> Vec<(String, Vec<String>, Value)> {
    let mut roles: Vec<(String, Vec<String>, Value)> = objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" && !aggregated_to(o).is_empty())
        .map(|o| (o["metadata"]["name"].as_str().unwrap_or_default().to_owned(), aggregated_to(o), o["rules"].clone()))
        .collect();
    roles.sort_by(|a, b| a.0.cmp(&b.0));
    roles
}

/// Deletes what an install created, by its part-of label, except the namespace: the shared
/// control plane runs no namespace controller, so a deleted namespace would stay Terminating
/// and refuse the next test's objects. An empty namespace is all that remains.
fn remove_installed(env: &TestEnv, namespace: &str) {
    let selector = "app.kubernetes.io/part-of=hostpath-provisioner";
    kubectl(env, &["delete", "daemonset,serviceaccount,role,rolebinding", "-n", namespace, "-l", selector]);
    kubectl(env, &["delete", "clusterrole,clusterrolebinding,storageclass", "-l", selector]);
}

async fn ensure_namespace(env: &TestEnv, name: &str) {
    match Api::<k8s_openapi::api::core::v1::Namespace>::all(env.client.clone())
        .create(&PostParams::default(), &fixtures::namespace(name))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("create namespace {name}: {e}"),
    }
}

/// Every variant an admin can render: name and manifests.
fn rendered_variants() -> Vec<(&'static str, String)> {
    vec![
        ("chart-default", chart_template("hpp-chart", &[])),
        ("chart-max-values", chart_template("hpp-chart", &["-f", MAX_VALUES])),
        ("chart-node-groups", chart_template("hpp-chart", &["-f", NODE_GROUPS_VALUES])),
        ("install-yaml", read("deploy/install.yaml")),
        ("monitoring", monitoring_manifests()),
    ]
}

/// deploy/legacy with every component of deploy/components, as a user's kustomization lists
/// them (docs/install.md, "Optional features: kustomize components"), with a value for each
/// setting they read.
fn components_manifests() -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    std::os::unix::fs::symlink(repo().join("deploy"), dir.path().join("deploy")).expect("link deploy");
    let user = dir.path().join("user");
    std::fs::create_dir(&user).expect("mkdir");
    let mut names: Vec<String> = std::fs::read_dir(repo().join("deploy/components"))
        .expect("deploy/components")
        .map(|entry| entry.expect("entry").file_name().to_str().expect("utf-8 name").to_owned())
        .collect();
    // In the doc's order where it matters: published-capacity after the claim releaser's, and
    // block-volumes (which replaces the container's security context) after quota's capability.
    names.sort_by_key(|name| match name.as_str() {
        "published-capacity" => 1,
        "block-volumes" => 2,
        _ => 0,
    });
    let components: String = names.iter().map(|name| format!("  - ../deploy/components/{name}\n")).collect();
    let kustomization = format!("resources:\n  - ../deploy/legacy\n  - settings.yaml\ncomponents:\n{components}");
    std::fs::write(user.join("kustomization.yaml"), kustomization).expect("write");
    let settings = "apiVersion: v1
kind: ConfigMap
metadata:
  name: hostpath-provisioner-settings
  annotations: {config.kubernetes.io/local-config: \"true\"}
data:
  RELEASE_CLAIMS_OF_REMOVED_NODES: 24h
  NODE_AFFINITY_KEYS: example.com/disk-serial
  STORAGE_POOLS: data=/mnt/disk1,data=/mnt/disk2
  DISK_1: /mnt/disk1
  DISK_2: /mnt/disk2
  CAPACITY_PROVISIONER_NAME: hostpath.example.org
  BLOCK_DEVICE_DIR: /dev/hostpath-provisioner
";
    std::fs::write(user.join("settings.yaml"), settings).expect("write");
    let kubectl = testbed_kubectl();
    run(&kubectl, &["kustomize", user.to_str().expect("utf-8 path")], &[])
}

fn monitoring_manifests() -> String {
    ["metrics-service.yaml", "servicemonitor.yaml", "prometheusrule.yaml", "grafana-dashboard.yaml"]
        .iter()
        .map(|f| read(&format!("deploy/monitoring/{f}")))
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[test]
fn helm_lint_passes_for_the_default_and_the_maximal_values() {
    let default = helm(&["lint", "--strict", CHART]);
    assert!(default.contains("1 chart(s) linted, 0 chart(s) failed"), "{default}");
    let max = helm(&["lint", "--strict", CHART, "-f", MAX_VALUES]);
    assert!(max.contains("1 chart(s) linted, 0 chart(s) failed"), "{max}");
}

#[test]
fn the_chart_renders_every_setting_of_the_maximal_values() {
    let default = chart_template("hpp-chart", &[]);
    // Defaults: the recommended WaitForFirstConsumer class only, the placeholder registry, and
    // none of the optional objects.
    assert_eq!(default.matches("kind: StorageClass").count(), 1, "{default}");
    assert!(default.contains("volumeBindingMode: WaitForFirstConsumer"));
    assert!(default.contains(&format!("image: \"{PLACEHOLDER_REGISTRY}/hostpath-provisioner:0.1.0\"")), "{default}");
    assert!(default.contains("priorityClassName: system-node-critical"));
    for kind in
        ["SecurityContextConstraints", "ServiceMonitor", "PrometheusRule", "NetworkPolicy", "ConfigMap", "CSIDriver"]
    {
        assert!(!default.contains(&format!("kind: {kind}")), "{kind} is opt-in:\n{default}");
    }
    // One Service, the peers one (liveness from the pods' readiness); the metrics one is opt-in.
    assert_eq!(default.matches("kind: Service\n").count(), 1, "{default}");
    assert!(default.contains("name: hostpath-provisioner-peers\n"), "{default}");
    assert!(default.contains("- name: PEER_SERVICE\n              value: \"hostpath-provisioner-peers\""), "{default}");

    let max = chart_template("hpp-chart", &["-f", MAX_VALUES]);
    for kind in [
        "SecurityContextConstraints",
        "ServiceMonitor",
        "PrometheusRule",
        "NetworkPolicy",
        "ConfigMap",
        "Service\n",
        "CSIDriver",
        "DaemonSet",
        "ServiceAccount",
        "ClusterRole\n",
        "Role\n",
    ] {
        assert!(max.contains(&format!("kind: {kind}")), "max values render no {kind}:\n{max}");
    }
    // Each setting of the binary, as the maximal values file sets it.
    for (name, value) in [
        ("PV_DIR", "/var/hpvolumes"),
        ("STORAGE_POOLS", "ssd=/mnt/ssd,reserve=20Gi,accounting=free,nfs=/mnt/nfs,shared,mountpoint"),
        ("PROVISIONER_NAME", "hostpath.example.com"),
        ("USE_NAMING_PREFIX", "true"),
        // Not `filesystem`: the binary refuses it with `requests` accounting, set just below.
        ("PV_CAPACITY", "request"),
        ("DIR_MODE", "0750"),
        ("REQUIRE_MOUNTPOINT", "true"),
        ("PV_FINALIZER", "true"),
        ("PUBLISH_CAPACITY", "true"),
        ("PROVISION_ON_NODE", "team-a,team-b"),
        ("RESERVED_SPACE", "10Gi"),
        ("CAPACITY_ACCOUNTING", "requests"),
        ("REAP_VOLUMES_OF_REMOVED_NODES", "24h"),
        ("MAX_CONCURRENCY", "32"),
        ("NODE_LEASE_SECONDS", "60"),
        ("LOG_FORMAT", "json"),
        ("RUST_LOG", "info,hostpath_provisioner=debug"),
        ("METRICS_ADDR", "[::]:9090"),
        ("HEALTH_ADDR", "[::]:9091"),
        ("EXAMPLE_SETTING", "1"),
    ] {
        assert!(
            max.contains(&format!("- name: {name}\n              value: \"{value}\"")),
            "{name}={value} missing from the rendered DaemonSet:\n{max}"
        );
    }
    assert!(max.contains(
        "image: \"registry.example.com/storage/hostpath-provisioner@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\""
    ));
    assert_eq!(max.matches("kind: StorageClass").count(), 4);
    // quota.enabled adds SYS_ADMIN (btrfs qgroup limits) to the container and the SCC, and only then.
    assert!(max.contains(r#"add: ["DAC_OVERRIDE", "FOWNER", "CHOWN", "FSETID", "SYS_ADMIN"]"#), "{max}");
    assert!(max.contains("\n  - SYS_ADMIN\n"), "SCC allows SYS_ADMIN:\n{max}");
    assert!(!default.contains("SYS_ADMIN"), "{default}");
    assert!(max.contains("storageclass.kubernetes.io/is-default-class: \"true\""));
    assert!(max.contains("provisioner: hostpath.example.com"));

    // Every setting the binary reads from its environment (src/config.rs) is a value of the
    // chart; only KUBECONFIG is not, since in a pod the ServiceAccount is used.
    let config = read("src/config.rs");
    let variables: Vec<&str> = config.split("env = \"").skip(1).filter_map(|rest| rest.split('"').next()).collect();
    assert!(variables.len() >= 15, "settings found in src/config.rs: {variables:?}");
    for variable in variables.into_iter().filter(|v| *v != "KUBECONFIG") {
        assert!(max.contains(&format!("- name: {variable}\n")), "the chart does not set {variable}");
    }

    // Values the binary would refuse, or that are misspelt, are refused at render time with
    // the reason, rather than starting pods that exit or silently ignoring a setting.
    for (set, reason) in [
        ("pools[0].name=legacy,pools[0].path=/a,pools[0].shared=true", "legacy is PV_DIR"),
        ("config.pvCapacity=whole", "pvCapacity"),
        ("config.dirMode=0999", "dirMode"),
        ("storageClass.name=typo", "storageClass"),
        ("storageClasses[0].name=x,storageClasses[0].volumeBindingMode=Later", "volumeBindingMode"),
        // The binary reads Kubernetes quantities: `10GB` is none, and every pod would exit.
        ("config.reservedSpace=10GB", "reservedSpace"),
        ("pools[0].name=ssd,pools[0].path=/mnt/ssd,pools[0].reserve=10GB", "reserve"),
        ("pools[0].name=ssd,pools[0].path=/mnt/ssd,pools[0].reserve=-1Gi", "reserve"),
        // Class parameters the binary would refuse on every claim are refused at render time.
        ("storageClasses[0].name=x,storageClasses[0].parameters.volumeType=Local", "volumeType"),
        ("storageClasses[0].name=x,storageClasses[0].parameters.nodeLocalSharing=yes", "nodeLocalSharing"),
        ("storageClasses[0].name=x,storageClasses[0].parameters.typo=1", "typo"),
    ] {
        let refused = helm_refusal(&["template", "x", CHART, "--set", set]);
        assert!(refused.contains(reason), "--set {set}: {refused}");
    }
}

/// The not-ready alert selects the scrape job by name: the chart keeps that name whatever the
/// release is called, or a dead pod would raise nothing.
#[test]
fn the_alerts_find_the_scrape_job_under_any_release_name() {
    let rules = read("deploy/helm/hostpath-provisioner/files/alerts.rules.yaml");
    let job = rules
        .split("up{job=\"")
        .nth(1)
        .and_then(|rest| rest.split_once('"'))
        .map(|(job, _)| job.to_owned())
        .expect("the not-ready alert selects up{job=\"...\"} by exact name");
    for extra in [&["--set", "fullnameOverride=storage-agent"][..], &["--set", "nameOverride=hpp"][..], &[][..]] {
        let mut args = vec!["--set", "serviceMonitor.enabled=true"];
        args.extend_from_slice(extra);
        let rendered = chart_template("hpp-job", &args);
        let label = rendered
            .lines()
            .find_map(|l| l.trim().strip_prefix("jobLabel:"))
            .map(|l| l.trim().to_owned())
            .unwrap_or_else(|| panic!("{extra:?}: the ServiceMonitor names its job by a label:\n{rendered}"));
        let service = rendered
            .split("\n---")
            .find(|doc| doc.contains("kind: Service\n"))
            .unwrap_or_else(|| panic!("{extra:?}: no metrics Service"));
        assert!(
            service.contains(&format!("{label}: {job}\n")),
            "{extra:?}: the Service's {label} is {job}:\n{service}"
        );
    }
}

/// Alertmanager needs absolute runbook links: with a base URL each alert links to its own
/// section under it; without one no alert carries a (relative, useless) runbook_url; a relative
/// base is refused by the schema.
#[test]
fn alerts_link_to_their_runbooks_by_absolute_url_only() {
    let base = "https://git.example.com/storage/hpp/-/raw/v0.1.0/";
    let rendered = chart_template(
        "hpp-runbooks",
        &["--set", "prometheusRule.enabled=true", "--set", &format!("prometheusRule.runbookBaseURL={base}")],
    );
    let rules: Vec<&str> = rendered.split("- alert:").skip(1).collect();
    let shipped = read("deploy/helm/hostpath-provisioner/files/alerts.rules.yaml").matches("- alert:").count();
    assert_eq!(rules.len(), shipped, "{rendered}");
    for rule in rules {
        let alert = rule.split_whitespace().next().unwrap().to_lowercase();
        let want = format!("runbook_url: https://git.example.com/storage/hpp/-/raw/v0.1.0/docs/operating.md#{alert}\n");
        assert!(rule.contains(&want), "{alert} lacks {want}in:\n{rule}");
    }
    let plain = chart_template("hpp-runbooks", &["--set", "prometheusRule.enabled=true"]);
    assert!(plain.contains("runbook: docs/operating.md#") && !plain.contains("runbook_url"), "{plain}");
    let refused = helm_refusal(&["template", "x", CHART, "--set", "prometheusRule.runbookBaseURL=docs/operating.md"]);
    assert!(refused.contains("runbookBaseURL"), "{refused}");
}

/// Chart.yaml's kubeVersion is a real gate: Helm refuses a cluster older than the APIs the chart
/// needs and renders for the oldest it accepts.
#[test]
fn the_chart_refuses_clusters_older_than_its_declared_kubernetes_version() {
    let refused = helm_refusal(&["template", "x", CHART, "--kube-version", "1.24.17"]);
    assert!(refused.contains("kubeVersion"), "{refused}");
    let rendered = helm(&["template", "x", CHART, "--kube-version", "1.25.0"]);
    assert!(rendered.contains("kind: DaemonSet"), "{rendered}");
}

/// A pool that names no `hostPathType` gets the schema's stated default.
#[test]
fn the_documented_host_path_type_default_is_the_rendered_one() {
    let schema: Value = serde_json::from_str(&read("deploy/helm/hostpath-provisioner/values.schema.json")).unwrap();
    let default = schema["properties"]["pools"]["items"]["properties"]["hostPathType"]["default"]
        .as_str()
        .expect("the schema states hostPathType's default")
        .to_owned();
    let rendered = chart_template("hpp-type", &["--set", "pools[0].name=legacy,pools[0].path=/var/hpvolumes"]);
    assert!(rendered.contains(&format!("type: {default}\n")), "rendered with {default}:\n{rendered}");
    let values = read("deploy/helm/hostpath-provisioner/values.yaml");
    assert!(values.contains(&format!("(default {default})")), "values.yaml states the default {default}");
}

/// Nodes whose data disks are mounted at different paths: one DaemonSet per group, each with its
/// own node selector (over the common one) and pools, pod selectors that cannot overlap, and
/// groups that could select the same node refused at render time.
#[test]
fn node_groups_render_one_daemonset_per_group_and_overlapping_groups_are_refused() {
    let rendered = chart_template("hpp-groups", &["-f", NODE_GROUPS_VALUES]);
    let daemonsets: Vec<&str> = rendered.split("\n---").filter(|doc| doc.contains("\nkind: DaemonSet\n")).collect();
    assert_eq!(daemonsets.len(), 2, "{rendered}");
    for (group, disk, pv_dir) in [("nvme", "nvme", "/mnt/nvme/hpvolumes"), ("sata", "sata", "/srv/data/hpvolumes")] {
        let ds = daemonsets
            .iter()
            .find(|d| d.contains(&format!("name: hostpath-provisioner-{group}\n")))
            .unwrap_or_else(|| panic!("no DaemonSet of group {group}:\n{rendered}"));
        let selector = ds.split("selector:").nth(1).and_then(|s| s.split("updateStrategy").next()).unwrap();
        assert!(selector.contains(&format!("hostpath-provisioner.kubevirt.io/node-group: {group}")), "{selector}");
        assert!(ds.contains(&format!("example.com/disk: {disk}")) && ds.contains("kubernetes.io/os: linux"), "{ds}");
        assert!(ds.contains(&format!("- name: PV_DIR\n              value: \"{pv_dir}\"")), "{ds}");
        assert!(ds.contains("- name: PROVISIONER_NAME\n              value: \"kubevirt.io/hostpath-provisioner\""));
    }
    assert!(daemonsets[0].contains("STORAGE_POOLS") && !daemonsets[1].contains("STORAGE_POOLS"), "pools per group");

    let group = |i: usize, selector: &str| {
        format!(
            "nodeGroups[{i}].name=g{i},nodeGroups[{i}].nodeSelector.{selector},nodeGroups[{i}].pools[0].name=legacy,nodeGroups[{i}].pools[0].path=/d{i}"
        )
    };
    for (set, says) in [
        // The same label value: both select the node.
        (format!("{},{}", group(0, "disk=a"), group(1, "disk=a")), "may select the same node"),
        // Different keys: a node can carry both labels.
        (format!("{},{}", group(0, "disk=a"), group(1, "zone=b")), "may select the same node"),
        (format!("{},{}", group(0, "disk=a"), group(1, "disk=b").replace("name=g1", "name=g0")), "listed twice"),
    ] {
        let refused = helm_refusal(&["template", "x", CHART, "--set", &set]);
        assert!(refused.contains(says), "--set {set}: {refused}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_rendered_variant_passes_server_side_dry_run() {
    let env = TestEnv::start("dry-run", 0).await;
    let _turn = CLUSTER_OBJECTS.lock().await;
    install_crds(&env).await;
    ensure_namespace(&env, "hpp-chart").await;
    ensure_namespace(&env, LEGACY_NAMESPACE).await;
    for (name, manifests) in rendered_variants().into_iter().chain([
        // OpenShift: deploy/legacy plus the SCC, against the real SCC CRD.
        ("openshift", kubectl(&env, &["kustomize", "deploy/openshift"])),
        // `kubectl apply -k deploy/monitoring`, as the README says.
        ("monitoring-kustomization", kubectl(&env, &["kustomize", "deploy/monitoring"])),
    ]) {
        let objects = server_dry_run(&env, name, &manifests);
        assert_eq!(objects.len(), document_count(&manifests), "{name}: every object accepted");
        for object in &objects {
            let kind = object["kind"].as_str().unwrap_or_default();
            let labels = &object["metadata"]["labels"];
            for label in ["app.kubernetes.io/name", "app.kubernetes.io/part-of", "app.kubernetes.io/version"] {
                assert!(labels[label].is_string(), "{name}: {kind} {} lacks {label}", object["metadata"]["name"]);
            }
            if kind == "DaemonSet" {
                assert_daemonset_conventions(name, object);
            }
        }
    }
}

/// The deploy conventions of docs/install.md every DaemonSet variant keeps.
fn assert_daemonset_conventions(variant: &str, daemonset: &Value) {
    let template = &daemonset["spec"]["template"];
    let pod = &template["spec"];
    assert!(template["metadata"]["labels"]["app.kubernetes.io/name"].is_string(), "{variant}: pod labels");
    assert!(pod["priorityClassName"].as_str().is_some_and(|p| p.starts_with("system-")), "{variant}: priority class");
    assert_eq!(daemonset["spec"]["updateStrategy"]["type"], "RollingUpdate", "{variant}");
    assert!(
        daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"].is_string()
            || daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"].is_number()
    );
    let container = &pod["containers"][0];
    assert!(
        container["resources"]["requests"]["ephemeral-storage"].is_string(),
        "{variant}: ephemeral-storage request"
    );
    assert!(container["resources"]["limits"]["memory"].is_string(), "{variant}: memory limit");
    let image = container["image"].as_str().unwrap_or_default();
    let registry = image.split_once('/').map(|(host, _)| host).unwrap_or_default();
    assert!(registry.contains('.'), "{variant}: image {image} is not fully qualified");
    let tolerations = pod["tolerations"].as_array().cloned().unwrap_or_default();
    assert!(
        tolerations.iter().any(|t| t["key"] == "node-role.kubernetes.io/control-plane" || t["operator"] == "Exists"),
        "{variant}: control-plane nodes tolerated: {tolerations:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_chart_defaults_match_deploy_legacy() {
    // Its server-side dry run reads the cluster-wide objects an install test may be creating:
    // created between kubectl's read and its dry-run create, one fails it with AlreadyExists.
    let _turn = CLUSTER_OBJECTS.lock().await;
    let env = TestEnv::start("same", 0).await;
    ensure_namespace(&env, "hpp-chart").await;
    ensure_namespace(&env, LEGACY_NAMESPACE).await;
    let chart = server_dry_run(&env, "chart", &chart_template("hpp-chart", &[]));
    let legacy = server_dry_run(&env, "legacy", &read("deploy/install.yaml"));

    // The same rights.
    for kind in ["ClusterRole", "Role"] {
        assert_eq!(
            find_provisioners(&chart, kind)["rules"],
            find_provisioners(&legacy, kind)["rules"],
            "{kind} rules differ"
        );
    }
    // The same roles for tenants' snapshots, added to the same built-in roles; the names
    // differ on purpose (the chart's release name, kustomize's `kubevirt-` prefix), so that one
    // install never collides with the roles another left.
    let unprefixed = |roles: Vec<(String, Vec<String>, Value)>| {
        roles
            .into_iter()
            .map(|(name, joins, rules)| (name.trim_start_matches("kubevirt-").to_owned(), joins, rules))
            .collect::<Vec<_>>()
    };
    let (chart_tenants, legacy_tenants) = (tenant_roles(&chart), tenant_roles(&legacy));
    assert_eq!(chart_tenants.len(), 2, "{chart_tenants:#?}");
    assert!(legacy_tenants.iter().all(|(name, _, _)| name.starts_with("kubevirt-")), "{legacy_tenants:#?}");
    assert_eq!(chart_tenants, unprefixed(legacy_tenants), "the roles for tenants' snapshots differ");
    // The same pod, apart from names and labels.
    let (chart_pod, legacy_pod) = (
        &find(&chart, "DaemonSet")["spec"]["template"]["spec"],
        &find(&legacy, "DaemonSet")["spec"]["template"]["spec"],
    );
    for field in ["priorityClassName", "tolerations", "nodeSelector", "volumes", "terminationGracePeriodSeconds"] {
        assert_eq!(chart_pod[field], legacy_pod[field], "pod {field} differs");
    }
    assert_eq!(
        find(&chart, "DaemonSet")["spec"]["updateStrategy"],
        find(&legacy, "DaemonSet")["spec"]["updateStrategy"]
    );
    let (chart_container, legacy_container) = (&chart_pod["containers"][0], &legacy_pod["containers"][0]);
    for field in [
        "image",
        "imagePullPolicy",
        "securityContext",
        "resources",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "volumeMounts",
    ] {
        assert_eq!(chart_container[field], legacy_container[field], "container {field} differs");
    }
    // Every variable deploy/legacy sets, the chart sets to the same value (the chart also sets
    // the binary's defaults for the others).
    let chart_env: BTreeSet<String> =
        chart_container["env"].as_array().expect("env").iter().map(Value::to_string).collect();
    for variable in legacy_container["env"].as_array().expect("env") {
        assert!(chart_env.contains(&variable.to_string()), "chart lacks {variable}");
    }
    // The same recommended class.
    let (chart_class, legacy_class) = (find(&chart, "StorageClass"), find(&legacy, "StorageClass"));
    for field in ["provisioner", "reclaimPolicy", "volumeBindingMode"] {
        assert_eq!(chart_class[field], legacy_class[field], "class {field} differs");
    }
    assert_eq!(chart_class["metadata"]["name"], legacy_class["metadata"]["name"]);
}

/// YAML documents as objects.
fn parse_objects(manifests: &str) -> Vec<Value> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(manifests).unwrap_or_else(|e| panic!("{e}:\n{manifests}"));
    documents.into_iter().filter(Value::is_object).collect()
}

/// Every install that brings the HostPathSnapshot CRD brings the roles that let namespace
/// admins, editors and viewers use it, the same in each: the chart in both modes (its crds/
/// installs the CRD in both), deploy/legacy (and so deploy/install.yaml) and deploy/operator.
/// None grants `hostpathsnapshots/status`, the provisioner's word. (What the roles let a tenant
/// do on a real API server: e2e_documented_commands, after the documented installs.)
#[test]
fn every_install_of_the_snapshot_crd_brings_the_same_roles_for_tenants() {
    let kubectl = testbed_kubectl();
    let kustomized = |dir: &str| parse_objects(&run(&kubectl, &["kustomize", dir], &[]));
    let installs = [
        ("chart", parse_objects(&chart_template("hpp-chart", &[]))),
        ("chart operator mode", parse_objects(&chart_template("hpp-chart", &["--set", "operator.enabled=true"]))),
        ("deploy/install.yaml", parse_objects(&read("deploy/install.yaml"))),
        ("deploy/legacy", kustomized("deploy/legacy")),
        ("deploy/operator", kustomized("deploy/operator")),
        ("deploy/operator/install.yaml", parse_objects(&read("deploy/operator/install.yaml"))),
    ];
    let edit = json!([{
        "apiGroups": ["hostpath-provisioner.kubevirt.io"],
        "resources": ["hostpathsnapshots"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"],
    }]);
    let view = json!([{
        "apiGroups": ["hostpath-provisioner.kubevirt.io"],
        "resources": ["hostpathsnapshots"],
        "verbs": ["get", "list", "watch"],
    }]);
    // The chart names them after its release; kustomize after deploy/legacy's objects, so that
    // a Helm release installed where a kustomize install was (or beside it) does not collide
    // with the roles that install left.
    let expected = |prefix: &str| {
        vec![
            (format!("{prefix}-snapshots-edit"), vec!["admin".to_owned(), "edit".to_owned()], edit.clone()),
            (format!("{prefix}-snapshots-view"), vec!["view".to_owned()], view.clone()),
        ]
    };
    for (install, objects) in &installs {
        let expected = expected(if install.starts_with("chart") {
            "hostpath-provisioner"
        } else {
            "kubevirt-hostpath-provisioner"
        });
        let has_crd = objects.iter().any(|o| {
            o["kind"] == "CustomResourceDefinition"
                && o["metadata"]["name"] == "hostpathsnapshots.hostpath-provisioner.kubevirt.io"
        });
        assert!(has_crd || install.starts_with("chart"), "{install}: the CRD");
        let mut roles = tenant_roles(objects);
        for role in &mut roles {
            role.1.sort();
        }
        assert_eq!(roles, expected, "{install}");
    }
    // The chart's CRD is in crds/, which `helm template` leaves out: it is there in both modes.
    assert!(repo().join(CHART).join("crds/hostpathsnapshots.yaml").is_file());
}

/// Every install of the operator lets the metrics Service the operator makes for itself
/// (deploy/operator/monitoring) find its replicas and scrape them on the port they serve:
/// otherwise HostpathProvisionerOperatorDown would fire for a healthy operator.
#[test]
fn every_install_of_the_operator_is_found_and_scraped_by_its_metrics_service() {
    let kubectl = testbed_kubectl();
    let service = parse_objects(&read("deploy/operator/monitoring/metrics-service.yaml")).remove(0);
    let installs = [
        ("chart operator mode", parse_objects(&chart_template("hpp-chart", &["--set", "operator.enabled=true"]))),
        ("deploy/operator", parse_objects(&run(&kubectl, &["kustomize", "deploy/operator"], &[]))),
        ("deploy/operator/install.yaml", parse_objects(&read("deploy/operator/install.yaml"))),
        ("deploy/operator-openshift", parse_objects(&run(&kubectl, &["kustomize", "deploy/operator-openshift"], &[]))),
    ];
    for (install, objects) in &installs {
        let deployment = objects
            .iter()
            .find(|o| {
                o["kind"] == "Deployment" && o["spec"]["template"]["spec"]["containers"][0]["args"][0] == "operator"
            })
            .unwrap_or_else(|| panic!("{install}: the operator's Deployment"));
        let pod = &deployment["spec"]["template"];
        for (key, value) in service["spec"]["selector"].as_object().expect("a selector") {
            assert_eq!(&pod["metadata"]["labels"][key], value, "{install}: the pods lack {key}");
        }
        let container = &pod["spec"]["containers"][0];
        let port = container["ports"]
            .as_array()
            .and_then(|ports| ports.iter().find(|p| p["name"] == service["spec"]["ports"][0]["targetPort"]))
            .unwrap_or_else(|| panic!("{install}: no port named as the Service's targetPort"));
        let listen = container["env"]
            .as_array()
            .and_then(|env| env.iter().find(|e| e["name"] == "LISTEN_ADDR"))
            .and_then(|e| e["value"].as_str())
            .unwrap_or_else(|| panic!("{install}: LISTEN_ADDR"));
        assert_eq!(listen, format!(":{}", port["containerPort"]), "{install}");
        assert_eq!(container["readinessProbe"]["httpGet"]["port"], port["name"], "{install}");
    }
}

/// kube-score checks left out, each for a reason docs/install.md ("Deploy conventions") gives. A
/// check listed here that no longer fires anywhere fails the test, so the list stays honest.
const KUBE_SCORE_IGNORED: [(&str, &str); 3] = [
    (
        "container-security-context-user-group-id",
        "uid 0: root-owned directories in the host's pool, files of any uid removed",
    ),
    (
        "container-image-pull-policy",
        "IfNotPresent: a pinned tag or digest, and no registry dependency when a node restarts",
    ),
    ("container-ephemeral-storage-request-and-limit", "a request but no limit: going over it would evict node storage"),
];
/// Ignored only where the NetworkPolicy is off (the default: it is opt-in).
const KUBE_SCORE_IGNORED_WITHOUT_POLICY: &str = "pod-networkpolicy";
/// Ignored only where Block volumes are on (opt-in: the component block-volumes): loop devices
/// and device nodes on the host's /dev need a privileged container.
const KUBE_SCORE_IGNORED_WITH_BLOCK_VOLUMES: &str = "container-security-context-privileged";

/// kube-score's findings (check id, object, comment) of grade below "almost OK".
fn kube_score(file: &Path, ignored: &[&str]) -> Vec<(String, String, String)> {
    let bin = deploy_tool(DeployTool::KubeScore).unwrap_or_else(|e| panic!("{e:#}"));
    let mut args = vec!["score", "--output-format", "json", "--kubernetes-version", "v1.36"];
    // No CPU limit on purpose (docs/install.md); memory limit and requests are still checked.
    args.push("--ignore-container-cpu-limit");
    for check in ignored {
        args.extend(["--ignore-test", check]);
    }
    args.push(file.to_str().expect("utf-8 path"));
    let output = Command::new(bin).args(&args).output().expect("kube-score");
    let report: Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("kube-score output: {e}\n{}", String::from_utf8_lossy(&output.stderr)));
    let mut findings = Vec::new();
    for object in report.as_array().expect("a list of objects") {
        for check in object["checks"].as_array().into_iter().flatten() {
            // Grades: 1 critical, 5 warning, 7 almost OK, 10 OK.
            if check["skipped"] == true || check["grade"].as_u64().unwrap_or(10) >= 7 {
                continue;
            }
            let comments = check["comments"].as_array().into_iter().flatten();
            findings.push((
                check["check"]["id"].as_str().unwrap_or_default().to_string(),
                object["object_name"].as_str().unwrap_or_default().to_string(),
                comments.map(|c| c["summary"].as_str().unwrap_or_default()).collect::<Vec<_>>().join("; "),
            ));
        }
    }
    findings
}

#[test]
fn rendered_manifests_pass_kube_score_except_the_justified_checks() {
    let dir = tempfile::tempdir().expect("temp dir");
    let variants = [
        // The one-file install together with the monitoring objects that select its pods.
        ("install-yaml", format!("{}\n---\n{}", read("deploy/install.yaml"), monitoring_manifests()), false, false),
        ("chart-default", chart_template("hpp-chart", &[]), false, false),
        ("chart-max-values", chart_template("hpp-chart", &["-f", MAX_VALUES]), true, false),
        // deploy/legacy with every kustomize component: their mounts, volumes and variables
        // (block-volumes among them, so the container is privileged).
        ("kustomize-components", components_manifests(), false, true),
    ];
    let mut fired = BTreeSet::new();
    for (name, manifests, has_network_policy, block_volumes) in variants {
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, manifests).expect("write");
        let mut ignored: Vec<&str> = KUBE_SCORE_IGNORED.iter().map(|(id, _)| *id).collect();
        if !has_network_policy {
            ignored.push(KUBE_SCORE_IGNORED_WITHOUT_POLICY);
        }
        if block_volumes {
            ignored.push(KUBE_SCORE_IGNORED_WITH_BLOCK_VOLUMES);
        }
        let findings = kube_score(&file, &ignored);
        assert!(findings.is_empty(), "{name}: kube-score findings outside the justified list: {findings:#?}");
        fired.extend(kube_score(&file, &[]).into_iter().map(|(id, _, _)| id));
    }
    for (id, reason) in KUBE_SCORE_IGNORED {
        assert!(fired.contains(id), "{id} ({reason}) no longer fires: drop it from the list and from docs/install.md");
    }
    assert!(fired.contains(KUBE_SCORE_IGNORED_WITHOUT_POLICY));
    assert!(fired.contains(KUBE_SCORE_IGNORED_WITH_BLOCK_VOLUMES));
}

#[test]
fn the_checked_in_rendered_manifests_are_up_to_date() {
    let out = tempfile::tempdir().expect("temp dir");
    let helm_bin = deploy_tool(DeployTool::Helm).unwrap_or_else(|e| panic!("{e:#}"));
    let cp_bin = testbed_kubectl();
    run(
        Path::new("bash"),
        &["hack/render-manifests.sh", out.path().to_str().expect("utf-8 path")],
        &[("HELM", &helm_bin), ("KUBECTL", &cp_bin)],
    );
    for file in [
        "deploy/install.yaml",
        "deploy/monitoring/metrics-service.yaml",
        "deploy/monitoring/servicemonitor.yaml",
        "deploy/monitoring/prometheusrule.yaml",
        "deploy/monitoring/grafana-dashboard.yaml",
    ] {
        let fresh = std::fs::read_to_string(out.path().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(fresh == read(file), "{file} is stale: run `make manifests` and commit the result");
    }
    let install = read("deploy/install.yaml");
    assert!(install.contains(&format!("image: {PLACEHOLDER_REGISTRY}/hostpath-provisioner:")), "{install}");
}

/// kubectl from the control-plane cache (built by the first control plane of this binary).
fn testbed_kubectl() -> PathBuf {
    let script = repo().join("hack/build-control-plane.sh");
    let out = run(Path::new("bash"), &[script.to_str().expect("utf-8 path")], &[]);
    PathBuf::from(out.lines().last().expect("bin dir").trim()).join("kubectl")
}

#[test]
fn versions_agree_across_cargo_the_chart_the_manifests_and_the_changelog() {
    let version = env!("CARGO_PKG_VERSION");
    let chart = read("deploy/helm/hostpath-provisioner/Chart.yaml");
    assert!(chart.contains(&format!("\nversion: {version}\n")), "Chart.yaml version");
    assert!(chart.contains(&format!("\nappVersion: \"{version}\"\n")), "Chart.yaml appVersion");
    for kustomization in ["deploy/legacy/kustomization.yaml", "deploy/operator/kustomization.yaml"] {
        let text = read(kustomization);
        assert!(text.contains(&format!("newTag: \"{version}\"")), "{kustomization}: image tag");
        assert!(text.contains(&format!("app.kubernetes.io/version: \"{version}\"")), "{kustomization}: label");
    }
    // Every version written out under deploy/ (labels, image tags, the rendered one-file installs
    // and the operator's node image), so that a release moves them all: an image of one version
    // labelled with another would mislead whoever reads the cluster.
    let mut stale = Vec::new();
    let mut files = vec![repo().join("deploy")];
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).expect("read deploy/").map(|e| e.expect("entry").path()));
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        for (number, line) in text.lines().enumerate() {
            let written = line
                .split_once("app.kubernetes.io/version:")
                .or_else(|| line.split_once("newTag:"))
                .map(|(_, value)| value.trim().trim_matches('"'))
                .or_else(|| line.split_once("/hostpath-provisioner:").map(|(_, tag)| tag.trim()));
            // Chart templates take the chart's own version (`{{ ... }}`); comments show examples.
            let Some(written) = written.filter(|w| !w.starts_with("{{") && !line.trim_start().starts_with('#')) else {
                continue;
            };
            if written != version {
                stale.push(format!("{}:{}: {}", path.display(), number + 1, line.trim()));
            }
        }
    }
    assert!(stale.is_empty(), "versions other than {version} under deploy/:\n{}", stale.join("\n"));
    // The changelog has the release's entry, which says what an admin must know about it.
    let changelog = read("CHANGELOG.md");
    assert!(changelog.contains(&format!("\n## {version}")), "CHANGELOG.md has no `## {version}` entry");
}

/// Runs the provisioner as one node with a token of `service_account` (the rights the install
/// granted), provisions a claim of `class` for a pod and deletes it again.
async fn provision_with_the_installed_objects(env: &mut TestEnv, namespace: &str, service_account: &str, class: &str) {
    let accounts: Api<ServiceAccount> = Api::namespaced(env.client.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
        ..Default::default()
    };
    let token = testbed::wait_for("the installed ServiceAccount", TIMEOUT, || async {
        match accounts.create_token_request(service_account, &PostParams::default(), &request).await {
            Ok(answer) => anyhow::Ok(answer.status.and_then(|s| s.token)),
            Err(kube::Error::Api(status)) if status.code == 404 => anyhow::Ok(None),
            Err(e) => Err(e.into()),
        }
    })
    .await
    .expect("token");
    let kubeconfig = env.cp.temp_dir().join(format!("{}-sa.kubeconfig", env.group));
    env.cp.write_kubeconfig_for_token(&token, &kubeconfig).expect("kubeconfig");
    let node = format!("{}-1", env.group);
    let namespace = namespace.to_owned();
    env.add_node(&node, &move |mut spec| {
        spec.kubeconfig = kubeconfig.clone();
        spec.env("POD_NAMESPACE", &namespace)
    })
    .await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "data", class, "1Mi")).await;
    env.create_pod("app", "data").await;
    let pv = env.wait_bound("data").await;
    let dir = env.node(&node).pool_root.join(format!("pvc-{}", uid(&claim)));
    assert!(dir.is_dir(), "{} created", dir.display());
    env.delete_pod("app").await;
    env.delete_claim("data").await;
    env.wait_pv_gone(pv.metadata.name.as_deref().expect("PV name")).await;
    wait_path_gone(&dir).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_install_gives_a_working_provisioner_and_uninstall_removes_it() {
    let mut env = TestEnv::start("helm", 0).await;
    let _turn = CLUSTER_OBJECTS.lock().await;
    let kubeconfig = env.cp.kubeconfig_path().to_str().expect("utf-8 path").to_owned();
    let namespace = "hpp-helm";
    let out = helm(&[
        "install",
        "hostpath-provisioner",
        CHART,
        "--namespace",
        namespace,
        "--create-namespace",
        "--kubeconfig",
        &kubeconfig,
    ]);
    assert!(out.contains("STATUS: deployed"), "{out}");
    assert!(out.contains(PLACEHOLDER_REGISTRY), "the notes warn about the placeholder registry:\n{out}");

    let daemonset = Api::<DaemonSet>::namespaced(env.client.clone(), namespace)
        .get("hostpath-provisioner")
        .await
        .expect("the chart's DaemonSet");
    let labels = daemonset.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("app.kubernetes.io/managed-by").map(String::as_str), Some("Helm"));
    let pod = daemonset.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod spec");
    assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"));
    let class = Api::<StorageClass>::all(env.client.clone()).get("hostpath-provisioner").await.expect("class");
    assert_eq!(class.volume_binding_mode.as_deref(), Some("WaitForFirstConsumer"));

    // The installed rights and class serve a claim.
    provision_with_the_installed_objects(&mut env, namespace, "hostpath-provisioner", "hostpath-provisioner").await;
    env.nodes.clear();

    let out = helm(&["uninstall", "hostpath-provisioner", "--namespace", namespace, "--kubeconfig", &kubeconfig]);
    assert!(out.contains("uninstalled"), "{out}");
    let roles: Api<ClusterRole> = Api::all(env.client.clone());
    assert!(roles.get_opt("hostpath-provisioner").await.expect("get").is_none(), "ClusterRole left behind");
    assert!(
        Api::<StorageClass>::all(env.client.clone()).get_opt("hostpath-provisioner").await.expect("get").is_none(),
        "StorageClass left behind"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn install_yaml_and_the_kustomization_install_the_same_working_provisioner() {
    let mut env = TestEnv::start("one-file", 0).await;
    let _turn = CLUSTER_OBJECTS.lock().await;
    let created = kubectl(&env, &["apply", "-f", "deploy/install.yaml"]);
    // Every object created (the namespace may be left from an earlier test of this binary).
    assert_eq!(created.lines().count(), document_count(&read("deploy/install.yaml")), "{created}");
    // The namespace and the snapshots' CRD (cluster-wide) may be left from an earlier test.
    let left_before = |l: &str| l.starts_with("namespace/") || l.starts_with("customresourcedefinition.");
    assert!(created.lines().all(|l| l.ends_with(" created") || left_before(l)), "{created}");
    // The kustomization renders the very same objects: applying it over the file changes nothing.
    let again = kubectl(&env, &["apply", "-k", "deploy/legacy"]);
    assert!(again.lines().all(|l| l.ends_with(" unchanged")), "{again}");

    let daemonset = Api::<DaemonSet>::namespaced(env.client.clone(), LEGACY_NAMESPACE)
        .get("kubevirt-hostpath-provisioner")
        .await
        .expect("DaemonSet");
    let pod = daemonset.spec.as_ref().and_then(|s| s.template.spec.as_ref()).expect("pod spec");
    let image = pod.containers[0].image.as_deref().unwrap_or_default();
    assert!(image.starts_with(&format!("{PLACEHOLDER_REGISTRY}/")), "never an unqualified image: {image}");

    provision_with_the_installed_objects(&mut env, LEGACY_NAMESPACE, LEGACY_SERVICE_ACCOUNT, "hostpath-provisioner")
        .await;
    env.nodes.clear();
    remove_installed(&env, LEGACY_NAMESPACE);
}

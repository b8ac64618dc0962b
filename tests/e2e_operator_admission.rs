//! The rights and the admission of what the operator path installs and makes:
//! - the chart's operator RBAC is deploy/operator/rbac.yaml, rule for rule;
//! - every pod the shipped manifests and the operator create passes Pod Security at exactly the
//!   level meant for it (`restricted` where it can, `privileged` only where it must), checked by
//!   the API server itself (server-side dry-run into namespaces enforcing each level);
//! - every such pod passes the rules of the OpenShift SecurityContextConstraints meant to admit
//!   it (a check of the fields SCCs govern, since no OpenShift runs here).

mod common;

use std::path::PathBuf;

use common::*;
use hostpath_provisioner::deciding::operator::pool_claims::PoolObjects;
use hostpath_provisioner::deciding::operator::render::{Environment, render};
use hostpath_provisioner::deciding::operator::resource::{EXAMPLES, HostPathProvisioner};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

const CHART: &str = "deploy/helm/hostpath-provisioner";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn documents(text: &str) -> Vec<Value> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(text).expect("YAML documents");
    documents.into_iter().filter(Value::is_object).collect()
}

/// helm with its caches under the target directory, run in the repository.
fn helm(args: &[&str]) -> String {
    let bin = testbed::deploy_tool(testbed::DeployTool::Helm).unwrap_or_else(|e| panic!("{e:#}"));
    let home = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("helm-home");
    let output = std::process::Command::new(bin)
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .current_dir(repo())
        .output()
        .expect("helm");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    assert!(output.status.success(), "helm {}:\n{}", args.join(" "), text(&output.stderr));
    text(&output.stdout)
}

fn chart(extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["template", "hpp", CHART, "--namespace", CHART_NAMESPACE];
    args.extend_from_slice(extra);
    documents(&helm(&args))
}

const CHART_NAMESPACE: &str = "hpp-system";

/// deploy/openshift with the kustomize component `block-volumes` and its setting, rendered by
/// the control plane's kubectl from a kustomization in the checkout (kustomize takes relative
/// paths only).
fn openshift_with_block_volumes(env: &TestEnv) -> Vec<Value> {
    let dir = tempfile::Builder::new().prefix(".admission-").tempdir_in(repo()).expect("temp dir in the checkout");
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "resources: [../deploy/openshift, settings.yaml]\ncomponents: [../deploy/components/block-volumes]\n",
    )
    .expect("kustomization");
    std::fs::write(
        dir.path().join("settings.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hostpath-provisioner-settings\n  \
         annotations: {config.kubernetes.io/local-config: \"true\"}\ndata: {BLOCK_DEVICE_DIR: /dev/hostpath-provisioner}\n",
    )
    .expect("settings");
    let output = std::process::Command::new(env.cp.kubectl())
        .args(["kustomize", dir.path().to_str().expect("utf-8 path")])
        .output()
        .expect("kubectl kustomize");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    documents(&String::from_utf8_lossy(&output.stdout))
}

fn find<'a>(documents: &'a [Value], kind: &str) -> &'a Value {
    documents.iter().find(|d| d["kind"] == kind).unwrap_or_else(|| panic!("no {kind}"))
}

/// A rule as a comparable value: its lists sorted.
fn rule_key(rule: &Value) -> Vec<Vec<String>> {
    ["apiGroups", "resources", "resourceNames", "verbs", "nonResourceURLs"]
        .iter()
        .map(|key| {
            let mut items: Vec<String> =
                rule[*key].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect();
            items.sort();
            items
        })
        .collect()
}

/// The rules of the `kind` in `documents` whose name ends with `-operator` (the chart names it
/// after the release), each a [`rule_key`], sorted.
fn operator_rules(documents: &[Value], kind: &str) -> Vec<Vec<Vec<String>>> {
    let role = documents
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"].as_str().is_some_and(|n| n.ends_with("-operator")))
        .unwrap_or_else(|| panic!("no operator {kind}"));
    let mut rules: Vec<_> = role["rules"].as_array().expect("rules").iter().map(rule_key).collect();
    rules.sort();
    rules
}

/// The chart's operator (operator.enabled) holds exactly the rights of deploy/operator/rbac.yaml,
/// so that one cannot lose a right the other has (it lacked `endpointslices list`, and the
/// escalation check refused the node Role).
#[test]
fn the_charts_operator_rbac_is_deploy_operators() {
    let chart = helm(&["template", "hpp", CHART, "--namespace", "hpp-system", "--set", "operator.enabled=true"]);
    let chart: Vec<Value> = serde_saphyr::from_multiple(&chart).expect("chart renders YAML");
    let file = std::fs::read_to_string(repo().join("deploy/operator/rbac.yaml")).expect("rbac.yaml");
    let file: Vec<Value> = serde_saphyr::from_multiple(&file).expect("rbac.yaml parses");
    for kind in ["ClusterRole", "Role"] {
        assert_eq!(operator_rules(&chart, kind), operator_rules(&file, kind), "{kind}: the chart and rbac.yaml differ");
    }
}

/// One pod the shipped manifests or the operator create, with what should admit it.
struct ShippedPod {
    what: &'static str,
    /// `{metadata: {labels, annotations}, spec}`, as the pod template has it.
    pod: Value,
    /// The namespace it runs in, for the SCC's users.
    namespace: String,
    /// The Pod Security level it needs: the least one whose namespace admits it.
    level: &'static str,
    /// The SCC meant to admit it on OpenShift; none for the variant that is not for OpenShift
    /// (the operator pod that pins its uid, for clusters whose images' default user is root).
    scc: Option<Value>,
    /// The SCC names its ServiceAccount in `users` (ours); OpenShift's own restricted-v2 is
    /// granted to every authenticated user instead.
    granted_by_name: bool,
}

fn template(workload: &Value) -> Value {
    workload["spec"]["template"].clone()
}

/// OpenShift's built-in `restricted-v2`, the SCC every authenticated user may use and the one
/// the operator pod is meant for (as the kubevirt operator's pod is), as OpenShift ships it.
fn restricted_v2() -> Value {
    json!({
        "metadata": {"name": "restricted-v2"},
        "allowHostDirVolumePlugin": false, "allowHostIPC": false, "allowHostNetwork": false,
        "allowHostPID": false, "allowHostPorts": false, "allowPrivilegedContainer": false,
        "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": false,
        "allowedCapabilities": ["NET_BIND_SERVICE"], "defaultAddCapabilities": null,
        "requiredDropCapabilities": ["ALL"],
        "runAsUser": {"type": "MustRunAsRange"}, "seLinuxContext": {"type": "MustRunAs"},
        "fsGroup": {"type": "MustRunAs"}, "supplementalGroups": {"type": "RunAsAny"},
        "seccompProfiles": ["runtime/default"],
        "volumes": ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"],
    })
}

fn example(file: &str) -> HostPathProvisioner {
    let (_, text) = EXAMPLES.iter().find(|(name, _)| *name == file).expect("example");
    serde_saphyr::from_str(text).expect("example parses")
}

/// Every pod of the operator path: the operator's (deploy/operator and the chart), the node
/// DaemonSet's and a pool mounter's as the operator makes them, and the node DaemonSet's of
/// deploy/openshift and of the chart with its SCC.
fn shipped_pods(env: &TestEnv) -> Vec<ShippedPod> {
    let mut pods = Vec::new();
    let deployment = documents(&read("deploy/operator/deployment.yaml")).remove(0);
    pods.push(ShippedPod {
        what: "the operator (deploy/operator)",
        pod: template(&deployment),
        namespace: "hostpath-provisioner".into(),
        level: "restricted",
        scc: None,
        granted_by_name: false,
    });
    let openshift_operator =
        env.cp.run_kubectl(&repo(), &["kustomize", "deploy/operator-openshift"]).unwrap_or_else(|e| panic!("{e:#}"));
    pods.push(ShippedPod {
        what: "the operator (deploy/operator-openshift)",
        pod: template(find(&documents(&openshift_operator), "Deployment")),
        namespace: "hostpath-provisioner".into(),
        level: "restricted",
        scc: Some(restricted_v2()),
        granted_by_name: false,
    });
    let operator_chart = chart(&["--set", "operator.enabled=true"]);
    pods.push(ShippedPod {
        what: "the operator (the chart)",
        pod: template(find(&operator_chart, "Deployment")),
        namespace: CHART_NAMESPACE.into(),
        level: "restricted",
        scc: None,
        granted_by_name: false,
    });
    let openshift_operator_chart =
        chart(&["--set", "operator.enabled=true", "--api-versions", "security.openshift.io/v1"]);
    pods.push(ShippedPod {
        what: "the operator (the chart on OpenShift)",
        pod: template(find(&openshift_operator_chart, "Deployment")),
        namespace: CHART_NAMESPACE.into(),
        level: "restricted",
        scc: Some(restricted_v2()),
        granted_by_name: false,
    });

    let environment = Environment {
        namespace: CHART_NAMESPACE.into(),
        image: "registry.example/hostpath-provisioner:1".into(),
        openshift: true,
        prometheus: false,
        held_pools: Vec::new(),
        pool_roots: Vec::new(),
        image_pull_secrets: vec!["regcred".into()],
    };
    let rendered = render(&example("pvc-template.yaml"), &environment);
    assert!(rendered.problems.is_empty(), "{:?}", rendered.problems);
    let made = |kind: &str, name: &str| {
        rendered
            .objects
            .iter()
            .find(|o| o.kind == kind && o.name == name)
            .map(|o| o.body.clone())
            .unwrap_or_else(|| panic!("the operator makes no {kind} {name}"))
    };
    pods.push(ShippedPod {
        what: "the node DaemonSet the operator makes",
        pod: template(&made("DaemonSet", "kubevirt-hostpath-provisioner")),
        namespace: CHART_NAMESPACE.into(),
        level: "privileged",
        scc: Some(made("SecurityContextConstraints", "kubevirt-hostpath-provisioner")),
        granted_by_name: true,
    });
    // Block volumes on: the node container privileged with the host's /dev, its SCC allowing it.
    let mut block = example("pvc-template.yaml");
    block.spec.config.block_volumes = Some(true);
    let block_rendered = render(&block, &environment);
    assert!(block_rendered.problems.is_empty(), "{:?}", block_rendered.problems);
    let block_made = |kind: &str| {
        block_rendered
            .objects
            .iter()
            .find(|o| o.kind == kind && o.name == "kubevirt-hostpath-provisioner")
            .map(|o| o.body.clone())
    };
    let block_pod = template(&block_made("DaemonSet").expect("the node DaemonSet"));
    assert_eq!(block_pod["spec"]["containers"][0]["securityContext"]["privileged"], true);
    pods.push(ShippedPod {
        what: "the node DaemonSet the operator makes with Block volumes",
        pod: block_pod,
        namespace: CHART_NAMESPACE.into(),
        level: "privileged",
        scc: Some(block_made("SecurityContextConstraints").expect("the node pods' SCC")),
        granted_by_name: true,
    });
    let pool = &rendered.pools_on_claim[0];
    let secrets = environment.image_pull_secrets.clone();
    let objects = PoolObjects {
        resource: "hostpath-provisioner",
        namespace: CHART_NAMESPACE,
        image: &environment.image,
        pool: &pool.name,
        path: &pool.path,
        mount_target: &pool.path,
        image_pull_secrets: &secrets,
    };
    pods.push(ShippedPod {
        what: "a pool mounter the operator makes",
        pod: template(&objects.mounter(
            "hpp-pool-local-node-1",
            "node-1",
            "hpp-pool-local-node-1",
            &rendered.placement.tolerations,
        )),
        namespace: CHART_NAMESPACE.into(),
        level: "privileged",
        scc: Some(made("SecurityContextConstraints", "kubevirt-hostpath-provisioner-pool-mounter")),
        granted_by_name: true,
    });

    pods.push(ShippedPod {
        what: "the node DaemonSet of deploy/openshift",
        pod: template(&documents(&read("deploy/legacy/daemonset.yaml"))[0]),
        namespace: "kubevirt-hostpath-provisioner".into(),
        level: "privileged",
        scc: Some(documents(&read("deploy/openshift/scc.yaml")).remove(0)),
        granted_by_name: true,
    });
    let openshift_chart = chart(&["--set", "openshift.scc.create=true"]);
    pods.push(ShippedPod {
        what: "the node DaemonSet of the chart",
        pod: template(find(&openshift_chart, "DaemonSet")),
        namespace: CHART_NAMESPACE.into(),
        level: "privileged",
        scc: Some(find(&openshift_chart, "SecurityContextConstraints").clone()),
        granted_by_name: true,
    });
    let block_kustomize = openshift_with_block_volumes(env);
    pods.push(ShippedPod {
        what: "the node DaemonSet of deploy/openshift with the component block-volumes",
        pod: template(find(&block_kustomize, "DaemonSet")),
        namespace: "kubevirt-hostpath-provisioner".into(),
        level: "privileged",
        scc: block_kustomize
            .iter()
            .find(|d| {
                d["kind"] == "SecurityContextConstraints" && d["metadata"]["name"] == "kubevirt-hostpath-provisioner"
            })
            .cloned(),
        granted_by_name: true,
    });
    let block_chart = chart(&["--set", "openshift.scc.create=true", "--set", "config.blockVolumes=true"]);
    pods.push(ShippedPod {
        what: "the node DaemonSet of the chart with Block volumes",
        pod: template(find(&block_chart, "DaemonSet")),
        namespace: CHART_NAMESPACE.into(),
        level: "privileged",
        scc: Some(find(&block_chart, "SecurityContextConstraints").clone()),
        granted_by_name: true,
    });
    pods
}

/// Each pod, server-side dry-run into a namespace enforcing each Pod Security level from the
/// strictest up: the first that admits it is the level it needs, and must be the one meant.
#[tokio::test(flavor = "multi_thread")]
async fn every_pod_needs_exactly_the_pod_security_level_meant_for_it() {
    let env = TestEnv::start("hpp-psa", 0).await;
    let levels = ["restricted", "baseline", "privileged"];
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    for level in levels {
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {
            "name": format!("{}-{level}", env.group),
            "labels": {"pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "latest"},
        }}))
        .expect("namespace");
        namespaces.create(&PostParams::default(), &namespace).await.expect("create a namespace");
    }
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    for shipped in shipped_pods(&env) {
        let mut least = None;
        let mut refusals = Vec::new();
        for level in levels {
            let namespace = format!("{}-{level}", env.group);
            let mut pod = shipped.pod.clone();
            pod["apiVersion"] = json!("v1");
            pod["kind"] = json!("Pod");
            pod["metadata"]["name"] = json!("psa-check");
            pod["metadata"]["namespace"] = json!(namespace);
            let pod: Pod = serde_json::from_value(pod).unwrap_or_else(|e| panic!("{}: {e}", shipped.what));
            match Api::<Pod>::namespaced(env.client.clone(), &namespace).create(&dry_run, &pod).await {
                Ok(_) => {
                    least = Some(level);
                    break;
                }
                Err(kube::Error::Api(status))
                    if status.code == 403 && status.message.contains("violates PodSecurity") =>
                {
                    refusals.push(status.message);
                }
                Err(error) => panic!("{}: not a Pod Security refusal in {level}: {error}", shipped.what),
            }
        }
        assert_eq!(least, Some(shipped.level), "{}: {refusals:#?}", shipped.what);
    }
}

/// What an SCC refuses in a pod, for the fields SCCs govern: privileged containers, host
/// directory volumes, volume types (with the token volume the ServiceAccount admission adds),
/// added and dropped capabilities, the uid strategy (MustRunAs, MustRunAsRange: the uid is the
/// SCC's to assign, so a pinned one is refused, MustRunAsNonRoot, RunAsAny), host network, PID,
/// IPC and ports, privilege escalation (and its default), a read-only root filesystem, seccomp
/// profiles, and the SCC's users naming the pod's ServiceAccount.
///
/// Not checked, since no OpenShift runs here: SELinux contexts, the fsGroup and supplemental
/// group ranges and the namespace's real uid range (from its annotations), sysctls, flexVolume
/// drivers, AppArmor, the choice among several SCCs a user may use (priority, then the most
/// restrictive), grants through RBAC `use` rather than `users`, and the mutations of the
/// admission plugin beyond the defaults modelled here.
fn scc_refusals(scc: &Value, pod: &Value, namespace: &str, granted_by_name: bool) -> Vec<String> {
    let spec = &pod["spec"];
    let strings = |value: &Value| -> Vec<String> {
        value.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
    };
    let allows = |key: &str| scc[key].as_bool() == Some(true);
    let mut refusals = Vec::new();
    for (field, key) in [("hostNetwork", "allowHostNetwork"), ("hostPID", "allowHostPID"), ("hostIPC", "allowHostIPC")]
    {
        if spec[field] == true && !allows(key) {
            refusals.push(format!("{field} without {key}"));
        }
    }
    let allowed_volumes = strings(&scc["volumes"]);
    let mut volumes: Vec<String> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|v| v.as_object().into_iter().flatten().map(|(k, _)| k.clone()).filter(|k| k != "name"))
        .collect();
    if spec["automountServiceAccountToken"] != false {
        volumes.push("projected".into());
    }
    for volume in volumes {
        if !allowed_volumes.iter().any(|a| *a == volume || a == "*") {
            refusals.push(format!("a {volume} volume, not in volumes {allowed_volumes:?}"));
        }
        if volume == "hostPath" && !allows("allowHostDirVolumePlugin") {
            refusals.push("a hostPath volume without allowHostDirVolumePlugin".into());
        }
    }
    let seccomp_name = |profile: &Value| match profile["type"].as_str() {
        Some("RuntimeDefault") => Some("runtime/default".to_owned()),
        Some("Unconfined") => Some("unconfined".to_owned()),
        Some("Localhost") => Some(format!("localhost/{}", profile["localhostProfile"].as_str().unwrap_or_default())),
        _ => None,
    };
    let allowed_seccomp = strings(&scc["seccompProfiles"]);
    let pod_context = &spec["securityContext"];
    let containers = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(spec["initContainers"].as_array().into_iter().flatten());
    for container in containers {
        let name = container["name"].as_str().unwrap_or_default();
        let context = &container["securityContext"];
        let privileged = context["privileged"] == true;
        if privileged && !allows("allowPrivilegedContainer") {
            refusals.push(format!("{name}: privileged without allowPrivilegedContainer"));
        }
        let uid = context["runAsUser"].as_i64().or(pod_context["runAsUser"].as_i64());
        let non_root = context["runAsNonRoot"].as_bool().or(pod_context["runAsNonRoot"].as_bool()) == Some(true);
        match scc["runAsUser"]["type"].as_str() {
            Some("RunAsAny") => {}
            Some("MustRunAs") => {
                if uid.is_some_and(|u| Some(u) != scc["runAsUser"]["uid"].as_i64()) {
                    refusals.push(format!("{name}: uid {uid:?}, the SCC's is {}", scc["runAsUser"]["uid"]));
                }
            }
            Some("MustRunAsRange") => {
                if let Some(uid) = uid {
                    refusals.push(format!(
                        "{name}: pins uid {uid}, which MustRunAsRange assigns from the namespace's range"
                    ));
                }
            }
            Some("MustRunAsNonRoot") => {
                if uid == Some(0) || (uid.is_none() && !non_root) {
                    refusals.push(format!("{name}: may run as root under MustRunAsNonRoot"));
                }
            }
            other => refusals.push(format!("runAsUser strategy {other:?} unknown to this check")),
        }
        let escalation = context["allowPrivilegeEscalation"]
            .as_bool()
            .or(scc["defaultAllowPrivilegeEscalation"].as_bool())
            .or((!allows("allowPrivilegeEscalation")).then_some(false));
        if escalation != Some(false) && !allows("allowPrivilegeEscalation") {
            refusals.push(format!("{name}: privilege escalation without allowPrivilegeEscalation"));
        }
        if privileged && escalation == Some(false) {
            refusals.push(format!("{name}: privileged but denied privilege escalation (an invalid pod)"));
        }
        if allows("readOnlyRootFilesystem") && context["readOnlyRootFilesystem"] != true {
            refusals.push(format!("{name}: no read-only root filesystem"));
        }
        let (allowed_caps, default_caps, required_drop) = (
            strings(&scc["allowedCapabilities"]),
            strings(&scc["defaultAddCapabilities"]),
            strings(&scc["requiredDropCapabilities"]),
        );
        for cap in strings(&context["capabilities"]["add"]) {
            let allowed = allowed_caps.iter().chain(&default_caps).any(|a| *a == cap || a == "*");
            if !allowed || required_drop.contains(&cap) {
                refusals.push(format!("{name}: adds capability {cap}"));
            }
        }
        for port in container["ports"].as_array().into_iter().flatten() {
            if port.get("hostPort").is_some() && !allows("allowHostPorts") {
                refusals.push(format!("{name}: a hostPort without allowHostPorts"));
            }
        }
        let profile = seccomp_name(&context["seccompProfile"]).or_else(|| seccomp_name(&pod_context["seccompProfile"]));
        if let Some(profile) = profile
            && !allowed_seccomp.iter().any(|a| *a == profile || a == "*")
        {
            refusals.push(format!("{name}: seccomp profile {profile}, not in {allowed_seccomp:?}"));
        }
    }
    if granted_by_name {
        let account = spec["serviceAccountName"].as_str().unwrap_or("default");
        let user = format!("system:serviceaccount:{namespace}:{account}");
        if !strings(&scc["users"]).contains(&user) {
            refusals.push(format!("not granted to {user}: users {}", scc["users"]));
        }
    }
    refusals
}

#[tokio::test(flavor = "multi_thread")]
async fn every_pod_passes_the_rules_of_the_scc_meant_to_admit_it() {
    let env = TestEnv::start("hpp-scc", 0).await;
    let pods = shipped_pods(&env);
    for shipped in &pods {
        let Some(scc) = &shipped.scc else {
            // Not for OpenShift: the operator pod that pins its uid, since the image's default
            // user is root. Its OpenShift variant is checked instead, and this one must be it
            // with the uid pinned.
            assert_eq!(shipped.pod["spec"]["securityContext"]["runAsUser"], json!(65532), "{}", shipped.what);
            continue;
        };
        let refusals = scc_refusals(scc, &shipped.pod, &shipped.namespace, shipped.granted_by_name);
        assert!(refusals.is_empty(), "{} under {}: {refusals:#?}", shipped.what, scc["metadata"]["name"]);
        // A pod that names the SCC it needs names this one.
        if let Some(required) = shipped.pod["metadata"]["annotations"]["openshift.io/required-scc"].as_str() {
            assert_eq!(required, scc["metadata"]["name"], "{}", shipped.what);
        }
    }
    // The check refuses what it should: a pinned uid under restricted-v2 (what kept the operator
    // pod off OpenShift), a mounter under the node pods' SCC, a node pod under restricted-v2.
    let find_pod = |what: &str| pods.iter().find(|p| p.what == what).unwrap_or_else(|| panic!("no pod {what}"));
    let pinned = &find_pod("the operator (deploy/operator)").pod;
    assert!(!scc_refusals(&restricted_v2(), pinned, "ns", false).is_empty());
    let (node, mounter) =
        (find_pod("the node DaemonSet the operator makes"), find_pod("a pool mounter the operator makes"));
    let node_scc = node.scc.as_ref().expect("the node pods' SCC");
    assert!(!scc_refusals(node_scc, &mounter.pod, &mounter.namespace, true).is_empty());
    assert!(!scc_refusals(&restricted_v2(), &node.pod, &node.namespace, false).is_empty());
    // A Block volumes' node pod is refused by the node SCC made without them.
    let block = find_pod("the node DaemonSet the operator makes with Block volumes");
    assert!(!scc_refusals(node_scc, &block.pod, &block.namespace, true).is_empty());
}

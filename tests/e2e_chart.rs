//! End-to-end: the Helm chart's values beyond the install paths of e2e_install: expandable
//! classes; node groups with a group of the other nodes, checked against the real DaemonSet
//! controller and scheduler; where the `helm test` pod goes and which class it claims; the install
//! notes; values the binary would refuse at start, refused at render time (each checked against
//! the binary itself, which must accept what the chart renders); the longest names the schema
//! accepts, through server-side dry-run; the classes' parameters: the schema's keys are the
//! binary's, and each value renders as the binary reads it or is refused at render time.

mod common;
mod helm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use helm::{CHART, chart_template, helm, helm_refusal};
use hostpath_provisioner::deciding::class::{KNOWN_PARAMETERS, class_request};
use hostpath_provisioner::deciding::layout::PoolPath;
use hostpath_provisioner::deciding::settings::{DecisionConfig, ProvisionOnNodePolicy, PvCapacity};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testbed::{ControlPlane, Options, fixtures};

const NODE_GROUPS_VALUES: &str = "deploy/helm/hostpath-provisioner/ci/node-groups-values.yaml";
const MAX_VALUES: &str = "deploy/helm/hostpath-provisioner/ci/max-values.yaml";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `values` (YAML) in a file of its own, for `helm -f`.
fn values_file(dir: &Path, name: &str, values: &str) -> String {
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, values).expect("write values");
    path.to_str().expect("utf-8 path").to_owned()
}

/// The release name of these tests: objects are called `hpp-hostpath-provisioner[-...]`.
const RELEASE: &str = "hpp";

/// The chart rendered as release `hpp` in namespace `hpp` with `values`, as objects.
fn render(values: &str, extra: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = values_file(dir.path(), "values", values);
    let mut args = vec!["template", RELEASE, CHART, "--namespace", "hpp", "-f", file.as_str()];
    args.extend_from_slice(extra);
    objects(&helm(&args))
}

fn objects(manifests: &str) -> Vec<Value> {
    let documents: Vec<Value> = serde_saphyr::from_multiple(manifests).unwrap_or_else(|e| panic!("{e}:\n{manifests}"));
    documents.into_iter().filter(|d| d.is_object()).collect()
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> Vec<&'a Value> {
    objects.iter().filter(|o| o["kind"] == kind).collect()
}

fn name(object: &Value) -> &str {
    object["metadata"]["name"].as_str().unwrap_or_default()
}

/// Runs helm on `values` expecting a refusal; returns what it said.
fn refusal(values: &str) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = values_file(dir.path(), "values", values);
    helm_refusal(&["template", "x", CHART, "-f", &file])
}

/// `kubectl apply --dry-run=server` of `manifests` in the test's namespace, as stored objects.
fn server_dry_run(env: &TestEnv, manifests: &str) -> Vec<Value> {
    let file = env.cp.temp_dir().join(format!("{}-dry-run.yaml", env.group));
    std::fs::write(&file, manifests).expect("write manifests");
    let out = env
        .cp
        .run_kubectl(&repo(), &["apply", "--dry-run=server", "-o", "json", "-n", &env.ns, "-f", file.to_str().unwrap()])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let value: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("dry-run output: {e}\n{out}"));
    match value["kind"].as_str() {
        Some("List") => value["items"].as_array().cloned().unwrap_or_default(),
        _ => vec![value],
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_class_can_allow_volume_expansion_and_a_value_not_a_boolean_is_refused() {
    let env = TestEnv::start("expand", 0).await;
    let values = format!(
        "storageClasses:\n  - {{name: {0}-yes, allowVolumeExpansion: true}}\n  - {{name: {0}-no, allowVolumeExpansion: false}}\n  - {{name: {0}-unset}}\n",
        env.group
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let file = values_file(dir.path(), "classes", &values);
    let manifests = chart_template(&env.ns, &["-f", &file, "--show-only", "templates/storageclasses.yaml"]);
    let classes = server_dry_run(&env, &manifests);
    assert_eq!(classes.len(), 3, "{manifests}");
    let expansion = |suffix: &str| {
        let class = classes.iter().find(|c| name(c) == format!("{}-{suffix}", env.group)).expect("class");
        class["allowVolumeExpansion"].clone()
    };
    assert_eq!(expansion("yes"), json!(true), "{classes:#?}");
    assert_eq!(expansion("no"), json!(false));
    assert_eq!(expansion("unset"), Value::Null, "unset: the API server's default");

    let refused = refusal("storageClasses: [{name: x, allowVolumeExpansion: \"yes\"}]\n");
    assert!(refused.contains("allowVolumeExpansion"), "{refused}");
}

/// Whether a pod spec admits a node with `labels` by its nodeSelector and required node affinity
/// (In, NotIn, Exists, DoesNotExist), as the scheduler and the DaemonSet controller read them.
fn admits(pod: &Value, labels: &BTreeMap<&str, &str>) -> bool {
    let label = |key: &Value| labels.get(key.as_str().expect("key")).copied();
    let selector_ok = pod["nodeSelector"]
        .as_object()
        .is_none_or(|s| s.iter().all(|(k, v)| labels.get(k.as_str()).copied() == v.as_str()));
    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    let affinity_ok = terms.as_array().is_none_or(|terms| {
        terms.iter().any(|term| {
            term["matchExpressions"].as_array().into_iter().flatten().all(|e| {
                let value = label(&e["key"]);
                let listed = || e["values"].as_array().expect("values").iter().any(|v| v.as_str() == value);
                match e["operator"].as_str().expect("operator") {
                    "In" => listed(),
                    "NotIn" => !listed(),
                    "Exists" => value.is_some(),
                    "DoesNotExist" => value.is_none(),
                    op => panic!("operator {op}"),
                }
            })
        })
    });
    selector_ok && affinity_ok
}

/// Every combination of the labels the groups below select by, plus the common ones.
fn label_combinations() -> Vec<BTreeMap<&'static str, &'static str>> {
    let mut all = vec![BTreeMap::new()];
    for (key, values) in [
        ("kubernetes.io/os", &["linux", ""][..]),
        ("example.com/disk", &["nvme", "sata", "ssd", "hdd", ""]),
        ("example.com/gpu", &["true", "false", ""]),
        ("example.com/no-storage", &["yes", ""]),
        ("example.com/storage-anyway", &["true", ""]),
    ] {
        all = all
            .into_iter()
            .flat_map(|labels| {
                values.iter().map(move |value| {
                    let mut labels = labels.clone();
                    if !value.is_empty() {
                        labels.insert(key, *value);
                    }
                    labels
                })
            })
            .collect();
    }
    all
}

/// Groups selecting by one label and by two, under a common node selector and a node affinity of
/// two ORed terms, with or without the group of the other nodes.
fn groups_values(other_nodes: bool) -> String {
    let rest = if other_nodes {
        "  - {name: rest, otherNodes: true, pools: [{name: legacy, path: /var/hpvolumes}]}\n"
    } else {
        ""
    };
    format!(
        r#"nodeSelector: {{kubernetes.io/os: linux}}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
        - matchExpressions: [{{key: example.com/no-storage, operator: DoesNotExist}}]
        - matchExpressions: [{{key: example.com/storage-anyway, operator: In, values: ["true"]}}]
tolerations: [{{key: example.com/dedicated, operator: Equal, value: storage, effect: NoSchedule}}]
nodeGroups:
  - {{name: nvme, nodeSelector: {{example.com/disk: nvme}}, pools: [{{name: legacy, path: /mnt/nvme/hpvolumes}}]}}
  - {{name: sata, nodeSelector: {{example.com/disk: sata}}, pools: [{{name: legacy, path: /srv/hpvolumes}}]}}
  - {{name: gpu, nodeSelector: {{example.com/disk: ssd, example.com/gpu: "true"}}, pools: [{{name: legacy, path: /mnt/gpu/hpvolumes}}]}}
{rest}"#
    )
}

/// The group a node with `labels` belongs in, by the groups' definition above.
fn expected_group(labels: &BTreeMap<&str, &str>, other_nodes: bool) -> Option<&'static str> {
    let label = |key| labels.get(key).copied();
    let eligible = label("kubernetes.io/os") == Some("linux")
        && (label("example.com/no-storage").is_none() || label("example.com/storage-anyway") == Some("true"));
    match (label("example.com/disk"), label("example.com/gpu")) {
        _ if !eligible => None,
        (Some("nvme"), _) => Some("nvme"),
        (Some("sata"), _) => Some("sata"),
        (Some("ssd"), Some("true")) => Some("gpu"),
        _ => other_nodes.then_some("rest"),
    }
}

/// The node groups split every node between them: each node that a group selects, or, with the
/// group of the other nodes, every eligible node, gets exactly one DaemonSet, the one of its
/// group. The `helm test` pod may go exactly where some DaemonSet runs, tolerating what they do.
#[test]
fn the_group_of_the_other_nodes_takes_every_node_no_group_selects_and_the_test_pod_follows_the_groups() {
    for other_nodes in [false, true] {
        let objects = render(&groups_values(other_nodes), &[]);
        let daemonsets = of_kind(&objects, "DaemonSet");
        assert_eq!(daemonsets.len(), if other_nodes { 4 } else { 3 });
        let test_pod = of_kind(&objects, "Pod").into_iter().next().expect("the test pod").clone();
        for labels in label_combinations() {
            let serving: Vec<&str> = daemonsets
                .iter()
                .filter(|ds| admits(&ds["spec"]["template"]["spec"], &labels))
                .map(|ds| name(ds))
                .collect();
            let expected: Vec<String> = expected_group(&labels, other_nodes)
                .map(|g| format!("hpp-hostpath-provisioner-{g}"))
                .into_iter()
                .collect();
            assert_eq!(serving, expected, "node {labels:?} (otherNodes: {other_nodes})");
            assert_eq!(admits(&test_pod["spec"], &labels), !serving.is_empty(), "test pod on {labels:?}");
        }
        for ds in &daemonsets {
            assert_eq!(ds["spec"]["template"]["spec"]["tolerations"], test_pod["spec"]["tolerations"], "tolerations");
        }
        if other_nodes {
            // As deploy/node-groups: the other groups' labels, each NotIn.
            let rest = daemonsets.iter().find(|ds| name(ds) == "hpp-hostpath-provisioner-rest").expect("rest");
            let terms = rest["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
                ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
                .to_string();
            assert!(terms.contains(r#""key":"example.com/disk","operator":"NotIn""#), "{terms}");
        }
    }

    let group =
        |name: &str, rest: &str| format!("  - {{name: {name}, {rest}pools: [{{name: legacy, path: /d/{name}}}]}}\n");
    for (groups, says) in [
        (group("a", "otherNodes: true, ") + &group("b", "otherNodes: true, "), "only one group can take"),
        (group("a", "otherNodes: true, nodeSelector: {disk: x}, "), "otherNodes: true and a nodeSelector"),
        (group("a", ""), "needs a nodeSelector"),
        // Every label of b is also the common selector's: b takes every node, `rest` none.
        (
            group("b", "nodeSelector: {kubernetes.io/os: linux}, ") + &group("rest", "otherNodes: true, "),
            "would get no node",
        ),
    ] {
        let refused = refusal(&format!("nodeGroups:\n{groups}"));
        assert!(refused.contains(says), "{groups}: {refused}");
    }
}

/// The `helm test` claim is of a class whose claim no node annotation has to place.
#[test]
fn the_test_claims_a_class_that_needs_no_node_annotation_and_refuses_one_that_does() {
    let class_of_test = |classes: &str| {
        let objects = render(&format!("storageClasses:\n{classes}"), &[]);
        let pod = of_kind(&objects, "Pod").into_iter().next().expect("the test pod").clone();
        pod["spec"]["volumes"][0]["ephemeral"]["volumeClaimTemplate"]["spec"]["storageClassName"].clone()
    };
    let immediate = "  - {name: pinned, volumeBindingMode: Immediate}\n";
    assert_eq!(class_of_test(&format!("{immediate}  - {{name: wffc}}\n")), json!("wffc"));
    assert_eq!(
        class_of_test(&format!(
            "{immediate}  - {{name: nfs, volumeBindingMode: Immediate, parameters: {{topology: shared}}}}\n"
        )),
        json!("nfs"),
        "an Immediate class of shared volumes needs no node"
    );
    let refused = refusal(&format!("storageClasses:\n{immediate}"));
    assert!(refused.contains("tests.storageClass") && refused.contains("WaitForFirstConsumer"), "{refused}");
    let refused =
        refusal(&format!("storageClasses:\n{immediate}  - {{name: wffc}}\ntests: {{storageClass: pinned}}\n"));
    assert!(refused.contains("pinned") && refused.contains("Immediate"), "{refused}");
}

/// The notes `helm install` prints (client-side dry run: nothing reaches a cluster).
fn install_notes(values: &str) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = values_file(dir.path(), "values", values);
    let out = helm(&["install", RELEASE, CHART, "--namespace", "hpp", "--dry-run=client", "-f", &file]);
    out.split_once("NOTES:").unwrap_or_else(|| panic!("no notes:\n{out}")).1.to_owned()
}

/// The notes name every DaemonSet the chart renders and each group's pools, and in operator mode
/// the DaemonSet the operator makes and how to read the resource's conditions.
#[test]
fn the_install_notes_name_the_daemonsets_and_pools_that_are_rendered() {
    let groups = std::fs::read_to_string(repo().join(NODE_GROUPS_VALUES)).expect("values");
    let with_rest =
        format!("{groups}  - {{name: rest, otherNodes: true, pools: [{{name: legacy, path: /var/hpvolumes}}]}}\n");
    for (values, warns) in [("", false), (groups.as_str(), true), (with_rest.as_str(), false)] {
        let notes = install_notes(values);
        let objects = render(values, &[]);
        let daemonsets = of_kind(&objects, "DaemonSet");
        let rollouts = notes.matches("rollout status daemonset/").count();
        assert_eq!(rollouts, daemonsets.len(), "one rollout line per DaemonSet:\n{notes}");
        for ds in daemonsets {
            let ds_name = name(ds);
            assert!(notes.contains(&format!("rollout status daemonset/{ds_name}\n")), "{ds_name}:\n{notes}");
            for mount in ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"].as_array().expect("mounts") {
                let path = mount["mountPath"].as_str().expect("path");
                assert!(notes.contains(path), "{ds_name}'s pool {path}:\n{notes}");
            }
        }
        assert_eq!(notes.contains("gets no provisioner"), warns, "the warning about unlabelled nodes:\n{notes}");
    }

    let notes = install_notes(
        "operator: {enabled: true, resource: {storagePools: [{name: local, path: /var/hpvolumes}]}}\nimage: {registry: r.example.com}\n",
    );
    let operator = render("operator: {enabled: true}\n", &["--show-only", "templates/operator.yaml"]);
    let deployment = of_kind(&operator, "Deployment").into_iter().next().expect("the operator's Deployment").clone();
    let deployment = name(&deployment);
    // The operator makes deploy/legacy's DaemonSet (docs/operator.md).
    let legacy = objects(&std::fs::read_to_string(repo().join("deploy/legacy/daemonset.yaml")).expect("daemonset"));
    let made = name(of_kind(&legacy, "DaemonSet")[0]).to_owned();
    for line in [
        format!("rollout status deployment/{deployment}\n"),
        format!("rollout status daemonset/{made}\n"),
        "kubectl get hostpathprovisioner hostpath-provisioner -o jsonpath=".to_owned(),
        "kubectl wait hostpathprovisioner/hostpath-provisioner --for=condition=Available".to_owned(),
        "local=/var/hpvolumes".to_owned(),
    ] {
        assert!(notes.contains(&line), "{line}\n{notes}");
    }
    assert!(!notes.contains("daemonset/hpp-hostpath-provisioner"), "no DaemonSet of the chart's own:\n{notes}");
}

/// The environment the binary gets from the first rendered DaemonSet, with what the downward API
/// would give.
fn rendered_env(objects: &[Value]) -> Vec<(String, String)> {
    let daemonset = of_kind(objects, "DaemonSet").into_iter().next().expect("a DaemonSet");
    let env = daemonset["spec"]["template"]["spec"]["containers"][0]["env"].as_array().expect("env");
    let mut vars: Vec<(String, String)> =
        env.iter().filter_map(|e| Some((e["name"].as_str()?.to_owned(), e["value"].as_str()?.to_owned()))).collect();
    vars.extend([("NODE_NAME".into(), "node-1".into()), ("POD_NAMESPACE".into(), "hpp".into())]);
    vars
}

/// Starts the provisioner with `vars` and nothing else: exit code 2 and the message of a
/// configuration error, or, for a configuration it accepts, the failure to find a cluster (its
/// kubeconfig does not exist), so nothing is ever served.
fn binary_verdict(vars: &[(String, String)]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_hostpath-provisioner"))
        .env_clear()
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .env("KUBECONFIG", "/nonexistent/hostpath-provisioner-test-kubeconfig")
        .output()
        .expect("run the provisioner");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

const CONFIGURATION_ERROR: Option<i32> = Some(2);

/// A value the binary refuses at start: the chart's values (YAML), how helm's refusal names the
/// value, and the environment variables (with their values) the binary would read it from.
type RefusedValue = (&'static str, &'static str, &'static [(&'static str, &'static str)]);

/// Values the binary refuses at start (exit 2, its pods crash-looping and the rollout stalled)
/// are refused by `helm template`, naming the value: each with the values, the bad value, and
/// the variable(s) the binary would read it from, which the test gives the binary to show that
/// it does refuse it.
#[test]
fn values_the_binary_refuses_at_start_are_refused_at_render_time_naming_the_value() {
    let defaults = rendered_env(&render("", &[]));
    let (code, said) = binary_verdict(&defaults);
    assert!(code != CONFIGURATION_ERROR && said.contains("KUBECONFIG"), "the defaults start: {code:?} {said}");
    // The refusal quotes the value: the schema as '...', the templates as "..." (or plain).
    let cases: &[RefusedValue] = &[
        ("pools: [{name: legacy, path: \"/var/hp,volumes\"}]", "'/var/hp,volumes'", &[("PV_DIR", "/var/hp,volumes")]),
        (
            "pools: [{name: legacy, path: /var/hpvolumes}, {name: ssd, path: \"/mnt/a,b\"}]",
            "'/mnt/a,b'",
            &[("STORAGE_POOLS", "ssd=/mnt/a,b")],
        ),
        (
            "nodeGroups: [{name: g, nodeSelector: {disk: x}, pools: [{name: legacy, path: \"/d,1\"}]}]",
            "'/d,1'",
            &[("PV_DIR", "/d,1")],
        ),
        ("pools: [{name: legacy, path: /var/../hp}]", "\"/var/../hp\"", &[("PV_DIR", "/var/../hp")]),
        ("pools: [{name: legacy, path: /}]", "'/'", &[("PV_DIR", "/")]),
        (
            "pools: [{name: legacy, path: /mnt/a}, {name: ssd, path: /mnt/a/b}]",
            "(/mnt/a/b)",
            &[("PV_DIR", "/mnt/a"), ("STORAGE_POOLS", "ssd=/mnt/a/b")],
        ),
        (
            "pools: [{name: legacy, path: /var/hpvolumes}, {name: reserve, path: /mnt/r}]",
            "\"reserve\"",
            &[("STORAGE_POOLS", "reserve=/mnt/r")],
        ),
        (
            "pools: [{name: legacy, path: /var/hpvolumes}, {name: ssd, path: /mnt/ssd, reserve: \"1e31\"}]",
            "\"1e31\"",
            &[("STORAGE_POOLS", "ssd=/mnt/ssd,reserve=1e31")],
        ),
        ("config: {reapVolumesOfRemovedNodes: 0s}", "\"0s\"", &[("REAP_VOLUMES_OF_REMOVED_NODES", "0s")]),
        ("config: {reapVolumesOfRemovedNodes: 0h}", "\"0h\"", &[("REAP_VOLUMES_OF_REMOVED_NODES", "0h")]),
        ("config: {reapVolumesOfRemovedNodes: PT0S}", "\"PT0S\"", &[("REAP_VOLUMES_OF_REMOVED_NODES", "PT0S")]),
        ("config: {reapVolumesOfRemovedNodes: 30m1h}", "'30m1h'", &[("REAP_VOLUMES_OF_REMOVED_NODES", "30m1h")]),
        ("config: {reapVolumesOfRemovedNodes: 1d}", "'1d'", &[("REAP_VOLUMES_OF_REMOVED_NODES", "1d")]),
        ("config: {dirMode: \"77777\"}", "'77777'", &[("DIR_MODE", "77777")]),
        ("config: {nodeAffinityKeys: \"/disk\"}", "'/disk'", &[("NODE_AFFINITY_KEYS", "/disk")]),
        (
            "config: {nodeAffinityKeys: \"example.com/disk,Bad.Prefix/x\"}",
            "'example.com/disk,Bad.Prefix/x'",
            &[("NODE_AFFINITY_KEYS", "example.com/disk,Bad.Prefix/x")],
        ),
        ("config: {provisionOnNode: Team_A}", "'Team_A'", &[("PROVISION_ON_NODE", "Team_A")]),
        ("config: {listenAddress: \"::\"}", "'::'", &[("METRICS_ADDR", ":::8080")]),
        ("config: {listenAddress: localhost}", "'localhost'", &[("HEALTH_ADDR", "localhost:8081")]),
        (
            "config: {logLevel: \"info,hostpath_provisioner=loud\"}",
            "'info,hostpath_provisioner=loud'",
            &[("RUST_LOG", "info,hostpath_provisioner=loud")],
        ),
        ("config: {nodeLeaseSeconds: 4294967296}", "4294967296", &[("NODE_LEASE_SECONDS", "4294967296")]),
        ("config: {reservedSpace: 20Ei}", "\"20Ei\"", &[("RESERVED_SPACE", "20Ei")]),
        ("config: {provisionerName: \" \"}", "' '", &[("PROVISIONER_NAME", " ")]),
        (
            "config: {pvCapacity: filesystem, capacityAccounting: requests}",
            "pvCapacity: filesystem",
            &[("PV_CAPACITY", "filesystem"), ("CAPACITY_ACCOUNTING", "requests")],
        ),
        (
            "config: {publishCapacity: true, provisionerName: kubevirt.io/hostpath-provisioner}",
            "\"kubevirt.io/hostpath-provisioner\"",
            &[("PUBLISH_CAPACITY", "true")],
        ),
        ("fullnameOverride: my.release", "'my.release'", &[("PEER_SERVICE", "my.release-peers")]),
        (
            "pools: [{name: legacy, path: /var/hpvolumes}, {name: nfs, path: /mnt/a, shared: true}, {name: nfs, path: /mnt/b}]",
            "\"nfs\" is listed twice with shared",
            &[("STORAGE_POOLS", "nfs=/mnt/a,shared,nfs=/mnt/b")],
        ),
    ];
    for (values, value, binary_reads) in cases {
        let said = refusal(&format!("{values}\n"));
        assert!(said.contains(value), "{values}: the refusal names {value}:\n{said}");
        let mut vars = defaults.clone();
        for (variable, bad) in *binary_reads {
            vars.retain(|(name, _)| name != variable);
            vars.push((variable.to_string(), bad.to_string()));
        }
        let (code, said) = binary_verdict(&vars);
        assert_eq!(code, CONFIGURATION_ERROR, "{values}: the binary refuses {binary_reads:?}: {said}");
        assert!(
            binary_reads.iter().any(|(variable, _)| said.contains(variable)),
            "{values}: the binary names the variable: {said}"
        );
    }
}

/// A pool listed once per disk is one pool of several roots: one STORAGE_POOLS entry and one
/// hostPath volume per root, each mounted at its path.
#[test]
fn a_pool_listed_once_per_disk_mounts_every_disk() {
    let objects = render(
        "pools: [{name: legacy, path: /var/hpvolumes}, {name: data, path: /mnt/disk1}, {name: data, path: /mnt/disk2, reserve: 1Gi}]",
        &[],
    );
    let env = rendered_env(&objects);
    assert!(
        env.contains(&("STORAGE_POOLS".to_owned(), "data=/mnt/disk1,data=/mnt/disk2,reserve=1Gi".to_owned())),
        "{env:?}"
    );
    let daemonset = of_kind(&objects, "DaemonSet")[0];
    let pod = &daemonset["spec"]["template"]["spec"];
    let volumes: BTreeMap<&str, &str> = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?, v["hostPath"]["path"].as_str()?)))
        .collect();
    let disks: Vec<&str> = volumes.values().copied().filter(|path| path.starts_with("/mnt/disk")).collect();
    assert_eq!(disks, ["/mnt/disk1", "/mnt/disk2"], "a volume per disk: {volumes:?}");
    let mounts: Vec<(&str, &str)> = pod["containers"][0]["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter_map(|m| Some((m["name"].as_str()?, m["mountPath"].as_str()?)))
        .collect();
    for (volume, path) in &volumes {
        assert!(mounts.contains(&(*volume, *path)), "{volume} mounted at {path}: {mounts:?}");
    }
    // legacy's first root is PV_DIR (the Go build's volume name); its others join STORAGE_POOLS.
    let objects = render("pools: [{name: legacy, path: /var/hpvolumes}, {name: legacy, path: /mnt/disk2}]", &[]);
    let env = rendered_env(&objects);
    assert!(env.contains(&("PV_DIR".to_owned(), "/var/hpvolumes".to_owned())), "{env:?}");
    assert!(env.contains(&("STORAGE_POOLS".to_owned(), "legacy=/mnt/disk2".to_owned())), "{env:?}");
    let volumes = &of_kind(&objects, "DaemonSet")[0]["spec"]["template"]["spec"]["volumes"];
    let pv_volume = volumes.as_array().expect("volumes").iter().find(|v| v["name"] == "pv-volume").expect("pv-volume");
    assert_eq!(pv_volume["hostPath"]["path"], "/var/hpvolumes");
}

/// What the chart renders, the binary starts with: the shipped values files, and the accepted
/// spellings of the settings whose grammar the chart now checks.
/// No node pod may delete claims, whatever the values: `config.releaseClaimsOfRemovedNodes` adds
/// the claim releaser, one Deployment whose ServiceAccount alone is bound to `delete` on claims,
/// with the rules of the kustomize component's file; its pods are not the node pods' Services'.
#[test]
fn no_node_pod_may_delete_claims_and_the_claim_releaser_alone_may_when_asked_for() {
    let grants_claim_delete = |role: &Value| {
        role["rules"].as_array().into_iter().flatten().any(|rule| {
            let has =
                |key: &str, value: &str| rule[key].as_array().into_iter().flatten().any(|v| v == value || v == "*");
            has("resources", "persistentvolumeclaims") && has("verbs", "delete")
        })
    };
    let releaser = format!("{RELEASE}-hostpath-provisioner-claim-releaser");
    for values in [
        "config: {}",
        "config: {releaseClaimsOfRemovedNodes: \"\"}",
        "config: {releaseClaimsOfRemovedNodes: \"off\"}",
        "config: {releaseClaimsOfRemovedNodes: 1h}",
        "config: {releaseClaimsOfRemovedNodes: 1h, reapVolumesOfRemovedNodes: 24h}",
    ] {
        let rendered = render(values, &[]);
        let on = values.contains("1h");
        for role in of_kind(&rendered, "ClusterRole") {
            assert_eq!(grants_claim_delete(role), name(role) == releaser, "{values}: {role}");
        }
        for daemonset in of_kind(&rendered, "DaemonSet") {
            assert!(!daemonset.to_string().contains("RELEASE_CLAIMS_OF_REMOVED_NODES"), "{values}: {daemonset}");
        }
        let deployments: Vec<&Value> =
            of_kind(&rendered, "Deployment").into_iter().filter(|d| name(d) == releaser).collect();
        assert_eq!(deployments.len(), usize::from(on), "{values}");
        if !on {
            continue;
        }
        // The rules of deploy/components/release-claims-of-removed-nodes/claim-releaser.yaml.
        let file = std::fs::read_to_string(
            repo().join("deploy/components/release-claims-of-removed-nodes/claim-releaser.yaml"),
        )
        .expect("the component's file");
        let component = objects(&file);
        let component_role = component.iter().find(|o| o["kind"] == "ClusterRole").expect("the component's role");
        let role = of_kind(&rendered, "ClusterRole").into_iter().find(|r| name(r) == releaser).expect("releaser role");
        assert_eq!(role["rules"], component_role["rules"]);
        let binding = of_kind(&rendered, "ClusterRoleBinding")
            .into_iter()
            .find(|b| name(b) == releaser)
            .expect("releaser binding");
        assert_eq!(binding["roleRef"]["name"], releaser.as_str());
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": releaser, "namespace": "hpp"}])
        );
        let deployment = deployments[0];
        assert_eq!(deployment["spec"]["replicas"], 1);
        assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
        let pod = &deployment["spec"]["template"];
        assert_eq!(pod["spec"]["serviceAccountName"], releaser.as_str());
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["args"], serde_json::json!(["release-claims-of-removed-nodes"]));
        let env: Vec<(String, String)> = container["env"]
            .as_array()
            .expect("env")
            .iter()
            .filter_map(|e| Some((e["name"].as_str()?.to_owned(), e["value"].as_str()?.to_owned())))
            .collect();
        assert!(env.contains(&("RELEASE_CLAIMS_OF_REMOVED_NODES".to_owned(), "1h".to_owned())), "{env:?}");
        // Its probes and metrics port are the component's (/healthz, /readyz on the binary's
        // default LISTEN_ADDR port).
        let component_deployment =
            component.iter().find(|o| o["kind"] == "Deployment").expect("the component's Deployment");
        let component_container = &component_deployment["spec"]["template"]["spec"]["containers"][0];
        for field in ["ports", "livenessProbe", "readinessProbe"] {
            assert_eq!(container[field], component_container[field], "{field}");
        }
        assert_eq!(container["ports"][0]["containerPort"], 8080);
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
        // The node pods' Services select by their labels; the releaser's pods must not match.
        for service in of_kind(&rendered, "Service") {
            let selector = service["spec"]["selector"].as_object().expect("selector");
            assert!(
                !selector.iter().all(|(k, v)| &pod["metadata"]["labels"][k] == v),
                "{}: selects the releaser's pods",
                name(service)
            );
        }
        // The subcommand starts with that environment (no cluster here: it fails on the client).
        let (code, said) = releaser_verdict(&env);
        assert!(code != CONFIGURATION_ERROR && !said.contains("configuration error"), "{code:?} {said}");
    }
    // A value the releaser refuses is refused at render time.
    for (values, value) in
        [("config: {releaseClaimsOfRemovedNodes: 0m}", "\"0m\""), ("config: {releaseClaimsOfRemovedNodes: 1d}", "'1d'")]
    {
        let said = refusal(&format!("{values}\n"));
        assert!(said.contains(value), "{values}: the refusal names {value}:\n{said}");
        let bare = value.trim_matches(|c| c == '"' || c == '\'');
        let (code, said) = releaser_verdict(&[("RELEASE_CLAIMS_OF_REMOVED_NODES".into(), bare.into())]);
        assert!(
            code == CONFIGURATION_ERROR && said.contains("RELEASE_CLAIMS_OF_REMOVED_NODES"),
            "{value}: {code:?} {said}"
        );
    }
}

/// Runs `hostpath-provisioner release-claims-of-removed-nodes` with `vars` alone (its kubeconfig
/// does not exist, so nothing is ever released).
fn releaser_verdict(vars: &[(String, String)]) -> (Option<i32>, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_hostpath-provisioner"))
        .arg("release-claims-of-removed-nodes")
        .env_clear()
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .env("KUBECONFIG", "/nonexistent/hostpath-provisioner-test-kubeconfig")
        .output()
        .expect("run the releaser");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn every_environment_the_chart_renders_is_one_the_binary_starts_with() {
    let read = |path: &str| std::fs::read_to_string(repo().join(path)).expect("values");
    let mut cases = vec![read(MAX_VALUES), read(NODE_GROUPS_VALUES), groups_values(true)];
    for values in [
        "config: {reapVolumesOfRemovedNodes: 1h 30m}",
        "config: {reapVolumesOfRemovedNodes: PT24H}",
        "config: {releaseClaimsOfRemovedNodes: 1h, reapVolumesOfRemovedNodes: 24h}",
        "config: {reapVolumesOfRemovedNodes: 1s 500ms, listenAddress: \"[::]\"}",
        "config: {logLevel: \"warn,hostpath_provisioner[reconcile{claim}]=TRACE,kube=0\"}",
        "config: {dirMode: \"0o7777\", provisionOnNode: \"team-a, team-b\"}",
        "config: {provisionOnNode: deny, reservedSpace: 15Ei}",
        "config: {nodeAffinityKeys: \"example.com/disk-serial,rack_slot,topology.kubernetes.io/zone\"}",
        "pools: [{name: legacy, path: /var/hp-volumes}, {name: ssd, path: \"/mnt/my disk/x\", reserve: 0.5Gi}]",
        "pools: [{name: data, path: /mnt/disk1}, {name: data, path: /mnt/disk2, reserve: 1Gi, requireMountpoint: true}]",
        "pools: [{name: legacy, path: /var/hpvolumes}, {name: legacy, path: /mnt/disk2, requireMountpoint: true}]",
    ] {
        cases.push(values.to_owned());
    }
    for values in &cases {
        let objects = render(values, &[]);
        for daemonset in of_kind(&objects, "DaemonSet") {
            let (code, said) = binary_verdict(&rendered_env(std::slice::from_ref(daemonset)));
            assert!(
                code != CONFIGURATION_ERROR,
                "{values}\n{}: the binary refuses what the chart rendered: {said}",
                name(daemonset)
            );
        }
    }
}

/// Names at the limits the schema allows stay valid names: the API server takes every object.
#[tokio::test(flavor = "multi_thread")]
async fn the_longest_names_the_schema_accepts_pass_server_side_dry_run() {
    let env = TestEnv::start("longnames", 0).await;
    // Unique cluster-wide objects (ClusterRole, StorageClass) among the tests of this control plane.
    let full = format!("{}{}", env.group, "x".repeat(63)).chars().take(63).collect::<String>();
    let long_name = "n".repeat(63);
    // Two pools alike in their first 58 characters: their volume names must still differ.
    let (pool_a, pool_b) = (format!("{}a", "p".repeat(62)), format!("{}b", "p".repeat(62)));
    let class = format!("{}.{}", env.group, "c".repeat(252 - env.group.len()));
    let tag = format!("v{}_", "1".repeat(120));
    let common = format!(
        "fullnameOverride: {full}\nnameOverride: {long_name}\nimage: {{tag: \"{tag}\"}}\nmetricsService: {{enabled: true}}\nstorageClasses: [{{name: {class}}}]\n"
    );
    let pools = format!(
        "[{{name: legacy, path: /var/hpvolumes}}, {{name: {pool_a}, path: /mnt/a}}, {{name: {pool_b}, path: /mnt/b}}]"
    );
    let group = "g".repeat(63);
    for values in [
        format!("{common}pools: {pools}\n"),
        format!(
            "{common}nodeGroups:\n  - {{name: {group}, nodeSelector: {{disk: x}}, pools: {pools}}}\n  - {{name: {}, otherNodes: true, pools: {pools}}}\n",
            "o".repeat(63)
        ),
    ] {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = values_file(dir.path(), "long", &values);
        let manifests = chart_template(&env.ns, &["-f", &file]);
        let rendered = objects(&manifests);
        let stored = server_dry_run(&env, &manifests);
        assert_eq!(stored.len(), rendered.len(), "every object accepted:\n{manifests}");
        for daemonset in of_kind(&rendered, "DaemonSet") {
            let volumes = daemonset["spec"]["template"]["spec"]["volumes"].as_array().expect("volumes");
            let names: std::collections::BTreeSet<&str> = volumes.iter().filter_map(|v| v["name"].as_str()).collect();
            assert_eq!(names.len(), 3, "distinct volume names: {names:?}");
        }
        let services: Vec<&str> = of_kind(&rendered, "Service").into_iter().map(name).collect();
        assert!(
            services.iter().any(|s| s.ends_with("-metrics")) && services.iter().all(|s| s.len() <= 63),
            "{services:?}"
        );
    }
}

/// The DaemonSets' placement once the DaemonSet controller has caught up: node -> DaemonSets
/// with a pod for it.
async fn placement(client: &Client, namespace: &str) -> BTreeMap<String, Vec<String>> {
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector = ListParams::default().labels("app.kubernetes.io/component=provisioner");
    testbed::wait_for("the DaemonSet controller placed the pods", TIMEOUT, || async {
        let sets = daemonsets.list(&ListParams::default()).await?.items;
        let pods = pods.list(&selector).await?.items;
        let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for set in &sets {
            let Some(status) = &set.status else { return anyhow::Ok(None) };
            let own: Vec<&Pod> = pods
                .iter()
                .filter(|p| p.metadata.owner_references.iter().flatten().any(|o| Some(&o.name) == set.metadata.name.as_ref()))
                .collect();
            let caught_up = status.observed_generation >= set.metadata.generation
                && status.current_number_scheduled == status.desired_number_scheduled
                && own.len() == status.desired_number_scheduled as usize;
            if !caught_up {
                return anyhow::Ok(None);
            }
            for pod in own {
                // The controller pins each pod to its node by a matchFields term.
                let spec = serde_json::to_value(pod.spec.as_ref()).expect("pod spec");
                let terms = &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
                let node = terms[0]["matchFields"][0]["values"][0].as_str().expect("the pod's node").to_owned();
                by_node.entry(node).or_default().push(set.metadata.name.clone().expect("name"));
            }
        }
        anyhow::Ok(Some(by_node))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"))
}

/// Against the real DaemonSet controller and scheduler: with node groups, a node no group selects
/// gets a provisioner pod only once a group takes the other nodes, and the `helm test` pod's claim
/// goes to a node with a provisioner even when that node is tainted and others are free.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_outside_every_group_gets_a_provisioner_only_from_the_group_of_the_other_nodes() {
    // A control plane of its own: the shared one runs no DaemonSet controller, nor the one that
    // makes the test pod's claim. The controllers' old names: 1.25 knows only those, and later
    // releases keep them as aliases (kube-controller-manager adds a repeated --controllers).
    let options = Options {
        extra_controller_manager_args: vec!["--controllers=daemonset,ephemeral-volume".into()],
        ..Options::default()
    };
    let cp = ControlPlane::start_with(options).await.unwrap_or_else(|e| panic!("{e:#}"));
    let logs = cp.logs_on_failure();
    let client = cp.admin_client();
    for (node, labels) in [
        ("nvme-node", &[("example.com/disk", "nvme")][..]),
        ("hdd-node", &[("example.com/disk", "hdd")]),
        ("plain-node", &[]),
    ] {
        cp.add_node_labeled(node, node, labels).await.unwrap_or_else(|e| panic!("{e:#}"));
    }
    // Only pods that tolerate this taint, as the chart's values below do, may go to the nvme node.
    let taint =
        json!({"spec": {"taints": [{"key": "example.com/dedicated", "value": "storage", "effect": "NoSchedule"}]}});
    Api::<Node>::all(client.clone())
        .patch("nvme-node", &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .expect("taint");
    let namespace = "hpp";
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(&PostParams::default(), &fixtures::namespace(namespace))
        .await
        .expect("namespace");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = cp.kubeconfig_path().to_str().expect("utf-8 path").to_owned();
    let deploy = |other_nodes: bool| {
        let values = values_file(dir.path(), &format!("groups-{other_nodes}"), &groups_values(other_nodes));
        helm(&["upgrade", "--install", "hpp", CHART, "-n", namespace, "-f", &values, "--kubeconfig", &kubeconfig]);
        values
    };
    let daemonset = |group: &str| format!("hpp-hostpath-provisioner-{group}");

    let values = deploy(false);
    let placed = placement(&client, namespace).await;
    assert_eq!(
        placed,
        BTreeMap::from([("nvme-node".to_owned(), vec![daemonset("nvme")])]),
        "only the nvme node is served"
    );

    // The test pod, as `helm test` creates it: the scheduler must pick the only node with a
    // provisioner, tainted as it is, over the two free ones.
    let test_pod =
        helm(&["template", "hpp", CHART, "-n", namespace, "-f", &values, "--show-only", "templates/tests/volume.yaml"]);
    let file = dir.path().join("test-pod.yaml");
    std::fs::write(&file, test_pod).expect("write");
    cp.run_kubectl(&repo(), &["apply", "-n", namespace, "-f", file.to_str().expect("utf-8 path")])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let selected = testbed::wait_for("the scheduler chose the test claim's node", TIMEOUT, || async {
        let claim = claims.get_opt("hpp-hostpath-provisioner-test-data").await?;
        anyhow::Ok(claim.and_then(|c| c.metadata.annotations?.get("volume.kubernetes.io/selected-node").cloned()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(selected, "nvme-node");

    deploy(true);
    let placed = placement(&client, namespace).await;
    let expected = BTreeMap::from([
        ("nvme-node".to_owned(), vec![daemonset("nvme")]),
        ("hdd-node".to_owned(), vec![daemonset("rest")]),
        ("plain-node".to_owned(), vec![daemonset("rest")]),
    ]);
    assert_eq!(placed, expected, "every node has exactly one provisioner");
    logs.passed();
}

/// The schema's keys of `storageClasses[].parameters`, read from values.schema.json.
fn schema_parameters() -> Value {
    let path = repo().join(CHART).join("values.schema.json");
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("values.schema.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    schema["properties"]["storageClasses"]["items"]["properties"]["parameters"].clone()
}

/// The schema refuses any class parameter the binary does not know, so it must list every one
/// it knows: a key added to the binary and not here would be refused by the chart.
#[test]
fn the_schemas_class_parameters_are_exactly_the_ones_the_binary_knows() {
    let parameters = schema_parameters();
    assert_eq!(parameters["additionalProperties"], json!(false), "unknown keys refused: {parameters:#}");
    let in_schema: std::collections::BTreeSet<&str> =
        parameters["properties"].as_object().expect("parameters.properties").keys().map(String::as_str).collect();
    let known: std::collections::BTreeSet<&str> = KNOWN_PARAMETERS.iter().copied().collect();
    assert_eq!(in_schema, known, "values.schema.json against deciding::class::KNOWN_PARAMETERS");
}

/// How the binary reads a class with `parameters` (as a node's provisioner with the default
/// pool and no affinity keys): `Ok` or the refusal.
fn binary_reads_class(parameters: &BTreeMap<String, String>) -> Result<(), String> {
    let class = StorageClass {
        metadata: kube::api::ObjectMeta { name: Some("x".into()), ..Default::default() },
        provisioner: "kubevirt.io/hostpath-provisioner".into(),
        parameters: Some(parameters.clone()),
        ..Default::default()
    };
    let config = DecisionConfig {
        use_naming_prefix: false,
        pools: vec![PoolPath::local("legacy", "/var/hpvolumes")],
        default_pool: Some("legacy".into()),
        pv_finalizer: false,
        provision_on_node: ProvisionOnNodePolicy::Allow,
        reserved_bytes: 0,
        pv_capacity: PvCapacity::Request,
        affinity_keys: Vec::new(),
        block_device_dir: None,
    };
    class_request(&class, "x", &config).map(|_| ()).map_err(|refusal| format!("{refusal:?}"))
}

/// What a class parameter's value does at render time and in the binary.
enum Verdict {
    /// Rendered as this string, which the binary accepts.
    Rendered(&'static str),
    /// Rendered as this string, which the binary refuses (a rule the schema cannot say).
    RenderedButRefusedByTheBinary(&'static str),
    /// Refused at render time; the binary refuses the same text too.
    Refused,
    /// Refused at render time though the binary would accept this string: a YAML number that
    /// does not say what its writer meant (an unquoted `0770` is not that octal mode).
    RefusedAsANumber(&'static str),
}

/// Each class parameter the binary gained after the schema was written (`uid`, `gid`, `mode`,
/// `pathPattern`, `nodeAffinityKey`): a value the binary accepts renders a class carrying it as
/// the binary reads it; a value it refuses is refused by `helm template`, naming the key, except
/// where the schema cannot express the binary's rule (checked here to be refused by the binary).
#[test]
fn the_new_class_parameters_render_as_the_binary_reads_them_and_bad_values_are_refused_at_render_time() {
    use Verdict::*;
    let cases: &[(&str, &str, Verdict)] = &[
        ("uid", "1000", Rendered("1000")),
        ("uid", "\"1000\"", Rendered("1000")),
        ("uid", "0", Rendered("0")),
        // YAML numbers are floats to Helm: a million and up must not render as 1e+06.
        ("uid", "1000000", Rendered("1000000")),
        ("uid", "4294967294", Rendered("4294967294")),
        ("uid", "4294967295", Refused),
        ("uid", "-1", Refused),
        ("uid", "\"1e3\"", Refused),
        ("uid", "\"4294967295\"", RenderedButRefusedByTheBinary("4294967295")),
        ("gid", "\"3000\"", Rendered("3000")),
        ("gid", "\"root\"", Refused),
        ("mode", "\"0770\"", Rendered("0770")),
        ("mode", "\"2775\"", Rendered("2775")),
        ("mode", "\"0o755\"", Rendered("0o755")),
        ("mode", "\"07777\"", Rendered("07777")),
        ("mode", "\"17777\"", Refused),
        ("mode", "\"0778\"", Refused),
        ("mode", "0770", RefusedAsANumber("0770")),
        ("pathPattern", "\"{namespace}_{claim}\"", Rendered("{namespace}_{claim}")),
        ("pathPattern", "\"data-{uid}\"", Rendered("data-{uid}")),
        ("pathPattern", "\"{claim}.{namespace}_x{uid}\"", Rendered("{claim}.{namespace}_x{uid}")),
        ("pathPattern", "\"{namespace}/{claim}\"", Refused),
        ("pathPattern", "\"_{uid}\"", Refused),
        ("pathPattern", "\"{pod}_{uid}\"", Refused),
        ("pathPattern", "\"{uid\"", Refused),
        ("pathPattern", "\"\"", Refused),
        ("pathPattern", "\"{namespace}-{claim}\"", RenderedButRefusedByTheBinary("{namespace}-{claim}")),
        ("pathPattern", "\"{uid}{uid}\"", RenderedButRefusedByTheBinary("{uid}{uid}")),
        ("nodeAffinityKey", "example.com/disk-serial", Rendered("example.com/disk-serial")),
        ("nodeAffinityKey", "disk_Serial.1", Rendered("disk_Serial.1")),
        ("nodeAffinityKey", "Example.com/disk", Refused),
        ("nodeAffinityKey", "\"-disk\"", Refused),
        ("nodeAffinityKey", "a/b/c", Refused),
        ("nodeAffinityKey", "\"\"", Refused),
    ];
    for (key, value, verdict) in cases {
        let values = format!("storageClasses: [{{name: c, parameters: {{{key}: {value}}}}}]\n");
        let rendered = |expected: &str| {
            let objects = render(&values, &["--show-only", "templates/storageclasses.yaml"]);
            let classes = of_kind(&objects, "StorageClass");
            assert_eq!(classes.len(), 1, "{values}");
            let parameters: BTreeMap<String, String> = serde_json::from_value(classes[0]["parameters"].clone())
                .unwrap_or_else(|e| panic!("{values}: parameters are strings: {e}: {}", classes[0]));
            assert_eq!(parameters.get(*key).map(String::as_str), Some(expected), "{values}");
            parameters
        };
        let alone = |text: &str| BTreeMap::from([(key.to_string(), text.to_owned())]);
        match verdict {
            Rendered(expected) => {
                let parameters = rendered(expected);
                binary_reads_class(&parameters).unwrap_or_else(|e| panic!("{values}: the binary refuses: {e}"));
            }
            RenderedButRefusedByTheBinary(expected) => {
                let parameters = rendered(expected);
                assert!(binary_reads_class(&parameters).is_err(), "{values}: the binary accepts it");
            }
            Refused => {
                let said = refusal(&values);
                assert!(said.contains(key), "{values}: the refusal names {key}:\n{said}");
                let text = value.trim_matches('"');
                assert!(binary_reads_class(&alone(text)).is_err(), "{values}: the binary accepts {text:?}");
            }
            RefusedAsANumber(text) => {
                let said = refusal(&values);
                assert!(said.contains(key), "{values}: the refusal names {key}:\n{said}");
                binary_reads_class(&alone(text)).unwrap_or_else(|e| panic!("{values}: quoted, it is accepted: {e}"));
            }
        }
    }
}

/// In operator mode the chart makes no node DaemonSet: the values that have a field in the
/// HostPathProvisioner are carried into the resource it makes (next test); every other value
/// that shapes its own DaemonSet is refused at render time, naming it and where its setting
/// goes, instead of being dropped; the defaults (its copy in templates/_node_defaults.tpl equal
/// to values.yaml's) render, as does the resource that carries the settings.
#[test]
fn operator_mode_refuses_the_values_of_the_charts_own_daemonset_naming_each() {
    let defaults = render("operator: {enabled: true}\n", &[]);
    assert!(of_kind(&defaults, "Deployment").len() == 1 && of_kind(&defaults, "DaemonSet").is_empty());
    render(
        "operator: {enabled: true, resource: {storagePools: [{name: local, path: /mnt/disk}], \
         workload: {tolerations: [{operator: Exists}]}}}\n",
        &[],
    );
    let cases = [
        ("config: {metricsPort: 9090}", "config.metricsPort (in operator mode: nowhere"),
        ("config: {nodeLeaseSeconds: 60}", "config.nodeLeaseSeconds (in operator mode: nowhere"),
        (
            "config: {useNamingPrefix: true}",
            "config.useNamingPrefix (in operator mode: spec.pathConfig.useNamingPrefix",
        ),
        ("csiDriver: {create: true}", "csiDriver.create (in operator mode the operator makes the CSIDriver"),
        ("tolerations: [{operator: Exists}]", "tolerations (in operator mode: spec.workload.tolerations"),
        ("nodeSelector: {disk: ssd}", "nodeSelector (in operator mode: spec.workload.nodeSelector"),
        ("resources: {limits: {memory: 1Gi}}", "resources (in operator mode: nowhere"),
        ("extraEnv: [{name: X, value: y}]", "extraEnv (in operator mode: nowhere"),
        ("nodeGroups: [{name: g, nodeSelector: {a: b}, pools: [{name: legacy, path: /d}]}]", "nodeGroups"),
        // Carried values, but no resource to carry them into.
        ("config: {nodeAffinityKeys: example.com/disk}", "config.nodeAffinityKeys into the HostPathProvisioner"),
        ("quota: {enabled: true}", "quota.enabled into the HostPathProvisioner"),
        ("pools: [{name: legacy, path: /mnt/disk}]", "pools into the HostPathProvisioner"),
        // Carried values the resource cannot take as written.
        (
            "operator: {enabled: true, resource: {workload: {}}}\npools: [{name: nfs, path: /mnt/nfs, shared: true}]",
            "shared: true, which the HostPathProvisioner has no field for",
        ),
        (
            "operator: {enabled: true, resource: {workload: {}}}\npools: [{name: legacy, path: /a}, {name: b, path: /b}]",
            "pools has legacy (PV_DIR) and other pools",
        ),
        (
            "operator: {enabled: true, resource: {config: {pvCapacity: request}}}\nconfig: {pvCapacity: filesystem}",
            "config.pvCapacity and operator.resource.config.pvCapacity are both set, differently",
        ),
        (
            "operator: {enabled: true, resource: {storagePools: [{name: a, path: /a}]}}\npools: [{name: b, path: /b}]",
            "pools and operator.resource's storagePools or pathConfig are both set",
        ),
    ];
    for (values, says) in cases {
        let values = if values.starts_with("operator:") {
            format!("{values}\n")
        } else {
            format!("operator: {{enabled: true}}\n{values}\n")
        };
        let said = refusal(&values);
        assert!(said.contains("operator.enabled") && said.contains(says), "{values}: {said}");
    }
    // Without operator mode the same values are the DaemonSet's, as ever.
    render(
        "tolerations: [{operator: Exists}]\nconfig: {publishCapacity: true, provisionerName: hpp.example.com}\n",
        &[],
    );
}

/// The HostPathProvisioner the chart renders in operator mode.
fn operator_resource(values: &str) -> hostpath_provisioner::deciding::operator::resource::HostPathProvisioner {
    let objects = render(values, &[]);
    let resource = of_kind(&objects, "HostPathProvisioner");
    assert_eq!(resource.len(), 1, "{values}");
    serde_json::from_value(resource[0].clone()).expect("the resource reads into the operator's types")
}

/// Operator mode carries config.*, quota.enabled and pools into the resource, and the operator
/// renders from it the node DaemonSet the chart itself renders from the same values: the same
/// env for every carried setting, the same capability, the same pools.
#[test]
fn operator_mode_carries_the_values_the_resource_has_fields_for_into_it() {
    use hostpath_provisioner::deciding::operator::render::{
        CONFIG_FIELDS, Environment, NODE_CONTAINER, render as operator_render,
    };
    let chart_values = "config: {provisionerName: hpp.example.com, capacityProvisionerName: placed.example.com, publishCapacity: true, nodeAffinityKeys: example.com/disk, \
         pvCapacity: request, dirMode: \"0770\", requireMountpoint: true, pvFinalizer: true, provisionOnNode: deny, \
         reservedSpace: 1Gi, capacityAccounting: requests, maxConcurrency: 4, orphanSnapshotCopyGrace: 2h, reapVolumesOfRemovedNodes: 24h, \
         logFormat: json, logLevel: debug, blockVolumes: true, blockDeviceDir: /dev/hpp-block}\n\
         quota: {enabled: true}\n\
         pools: [{name: data, path: /mnt/d1, reserve: 1Gi, accounting: free}, {name: data, path: /mnt/d2, requireMountpoint: true}]\n";
    let resource = operator_resource(&format!(
        "operator: {{enabled: true, resource: {{workload: {{nodeSelector: {{kubernetes.io/os: linux}}}}}}}}\n{chart_values}"
    ));
    assert!(resource.spec.quota.as_ref().is_some_and(|q| q.enabled));
    let environment = Environment {
        namespace: "hpp".into(),
        image: "img".into(),
        openshift: false,
        prometheus: false,
        held_pools: Vec::new(),
        pool_roots: Vec::new(),
        image_pull_secrets: Vec::new(),
    };
    let rendered = operator_render(&resource, &environment);
    assert_eq!(rendered.problems, [], "{:?}", resource.spec);
    let operator_daemonset = rendered.objects.iter().find(|o| o.kind == "DaemonSet").expect("DaemonSet").body.clone();
    // Named after the second name, as the chart names its own.
    assert!(rendered.objects.iter().any(|o| o.kind == "CSIDriver" && o.name == "placed.example.com"));
    let chart = render(chart_values, &[]);
    let chart_env = rendered_env(&chart);
    let container = operator_daemonset["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == NODE_CONTAINER)
        .expect("node container")
        .clone();
    let operator_env = |name: &str| {
        container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .and_then(|e| e["value"].as_str())
            .map(str::to_owned)
    };
    for (field, variable) in CONFIG_FIELDS {
        let chart_value = chart_env.iter().find(|(n, _)| n == variable).map(|(_, v)| v.clone());
        assert_eq!(operator_env(variable), chart_value, "config.{field} ({variable})");
    }
    assert_eq!(
        operator_env("STORAGE_POOLS").as_deref(),
        Some("data=/mnt/d1,reserve=1Gi,accounting=free,data=/mnt/d2,mountpoint")
    );
    let chart_daemonset = of_kind(&chart, "DaemonSet")[0].clone();
    let chart_container = chart_daemonset["spec"]["template"]["spec"]["containers"][0].clone();
    // Block volumes: the same privileged context, and the host's /dev mounted at /dev.
    assert_eq!(container["securityContext"], chart_container["securityContext"]);
    assert_eq!(container["securityContext"]["privileged"], true);
    let dev = |daemonset: &Value, container: &Value| {
        let volume = daemonset["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| v["hostPath"]["path"] == "/dev")
            .map(|v| v["name"].clone());
        let mount = container["volumeMounts"].as_array().into_iter().flatten().find(|m| m["mountPath"] == "/dev");
        mount.is_some_and(|m| Some(&m["name"]) == volume.as_ref())
    };
    assert!(dev(&operator_daemonset, &container) && dev(&chart_daemonset, &chart_container));
    // Without Block volumes, the quota's capability, the same on both.
    let quota_values = "quota: {enabled: true}\npools: [{name: data, path: /mnt/d1}]\n";
    let quota_resource = operator_resource(&format!(
        "operator: {{enabled: true, resource: {{workload: {{nodeSelector: {{kubernetes.io/os: linux}}}}}}}}\n{quota_values}"
    ));
    let quota_rendered = operator_render(&quota_resource, &environment);
    let quota_daemonset =
        quota_rendered.objects.iter().find(|o| o.kind == "DaemonSet").expect("DaemonSet").body.clone();
    let quota_container = quota_daemonset["spec"]["template"]["spec"]["containers"][0].clone();
    let chart_quota = render(quota_values, &[]);
    let chart_quota_container =
        of_kind(&chart_quota, "DaemonSet")[0]["spec"]["template"]["spec"]["containers"][0].clone();
    let capabilities = |c: &Value| c["securityContext"]["capabilities"]["add"].clone();
    assert_eq!(capabilities(&quota_container), capabilities(&chart_quota_container));
    assert!(capabilities(&quota_container).as_array().is_some_and(|a| a.contains(&json!("SYS_ADMIN"))));
    assert!(!dev(&quota_daemonset, &quota_container), "no /dev without Block volumes");
    // The legacy pool alone becomes pathConfig.
    let legacy = operator_resource(
        "operator: {enabled: true, resource: {workload: {}}}\npools: [{name: legacy, path: /mnt/disk}]\n",
    );
    assert_eq!(legacy.spec.path_config.map(|p| p.path).as_deref(), Some("/mnt/disk"));
    // Defaults carry nothing: the resource is operator.resource as written.
    let plain = operator_resource("operator: {enabled: true, resource: {storagePools: [{name: a, path: /a}]}}\n");
    assert!(plain.spec.config.is_empty() && plain.spec.quota.is_none());
}

/// `config.capacityProvisionerName`: the nodes serve it beside `config.provisionerName`, which
/// keeps its '/'; the CSIDriver is named after it, and only the classes marked
/// `placedByCapacity` are of it. Refused at render: a marked class without the name, the same
/// name twice, and publishing with neither name able to name a CSIDriver.
#[test]
fn a_capacity_provisioner_name_places_the_marked_classes_and_names_the_csidriver() {
    let objects = render(
        "config: {publishCapacity: true, capacityProvisionerName: hostpath.example.org}\ncsiDriver: {create: true}\n\
         storageClasses: [{name: plain}, {name: placed, placedByCapacity: true}]\n",
        &[],
    );
    let env = rendered_env(&objects);
    let value = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    assert_eq!(value("CAPACITY_PROVISIONER_NAME"), Some("hostpath.example.org"));
    assert_eq!(value("PROVISIONER_NAME"), Some("kubevirt.io/hostpath-provisioner"));
    assert_eq!(value("PUBLISH_CAPACITY"), Some("true"));
    let drivers = of_kind(&objects, "CSIDriver");
    assert_eq!(drivers.len(), 1);
    assert_eq!(drivers[0]["metadata"]["name"], "hostpath.example.org");
    let classes = of_kind(&objects, "StorageClass");
    let provisioner_of =
        |name: &str| classes.iter().find(|c| c["metadata"]["name"] == name).expect("class")["provisioner"].clone();
    assert_eq!(provisioner_of("plain"), "kubevirt.io/hostpath-provisioner");
    assert_eq!(provisioner_of("placed"), "hostpath.example.org");
    // The claim releaser considers the PVs of both names.
    let with_releaser =
        render("config: {capacityProvisionerName: hostpath.example.org, releaseClaimsOfRemovedNodes: 24h}\n", &[]);
    let releaser = of_kind(&with_releaser, "Deployment").into_iter().next().expect("the claim releaser");
    let releaser_env = releaser["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(
        releaser_env.contains(r#"{"name":"CAPACITY_PROVISIONER_NAME","value":"hostpath.example.org"}"#),
        "{releaser_env}"
    );
    // Unset, the binary gets an empty value, which it reads as unset.
    let plain = render("", &[]);
    assert_eq!(
        rendered_env(&plain).iter().find(|(k, _)| k == "CAPACITY_PROVISIONER_NAME").map(|(_, v)| v.as_str()),
        Some("")
    );

    for (values, says) in [
        (
            "storageClasses: [{name: placed, placedByCapacity: true}]",
            "placedByCapacity needs config.capacityProvisionerName",
        ),
        (
            "config: {provisionerName: hostpath.example.org, capacityProvisionerName: hostpath.example.org}",
            "other than config.provisionerName",
        ),
        ("config: {capacityProvisionerName: kubevirt.io/other}", "capacityProvisionerName"),
        ("config: {publishCapacity: true}", "config.publishCapacity needs config.capacityProvisionerName"),
    ] {
        let said = refusal(&format!("{values}\n"));
        assert!(said.contains(says), "{values}: {said}");
    }
}

/// Block volumes (`config.blockVolumes`): off by default, the node container unprivileged; on,
/// the setting and the device directory reach the binary, and the container runs privileged
/// with the host's `/dev` (loop devices, device nodes). The SCC follows; operator mode carries
/// both values into the resource; a device directory outside `/dev` is refused.
#[test]
fn block_volumes_make_the_node_container_privileged_with_the_hosts_dev_only_when_asked_for() {
    let daemonset = |objects: &[Value]| (*of_kind(objects, "DaemonSet").first().expect("DaemonSet")).clone();
    let off = render("", &[]);
    let container = &daemonset(&off)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["securityContext"]["privileged"], false);
    assert!(rendered_env(&off).contains(&("BLOCK_VOLUMES".to_owned(), "false".to_owned())));
    let mounts = container["volumeMounts"].as_array().expect("mounts");
    assert!(mounts.iter().all(|m| m["mountPath"] != "/dev"), "{mounts:?}");

    let on = render(
        "config: {blockVolumes: true, blockDeviceDir: /dev/hpp-block}\nopenshift: {scc: {create: true}}\n\
         storageClasses: [{name: disks, parameters: {allocation: full}}]\n",
        &[],
    );
    let env = rendered_env(&on);
    assert!(env.contains(&("BLOCK_VOLUMES".to_owned(), "true".to_owned())), "{env:?}");
    assert!(env.contains(&("BLOCK_DEVICE_DIR".to_owned(), "/dev/hpp-block".to_owned())), "{env:?}");
    let pod = &daemonset(&on)["spec"]["template"]["spec"];
    assert_eq!(pod["containers"][0]["securityContext"]["privileged"], true);
    assert!(pod["containers"][0]["volumeMounts"].as_array().expect("mounts").iter().any(|m| m["mountPath"] == "/dev"));
    assert!(pod["volumes"].as_array().expect("volumes").iter().any(|v| v["hostPath"]["path"] == "/dev"));
    let scc = of_kind(&on, "SecurityContextConstraints");
    assert!(scc.iter().any(|s| s["allowPrivilegedContainer"] == true), "the SCC admits the privileged container");
    let class = of_kind(&on, "StorageClass").into_iter().find(|c| c["metadata"]["name"] == "disks").expect("class");
    assert_eq!(class["parameters"]["allocation"], "full");

    assert!(refusal("config: {blockDeviceDir: /var/lib/x}").contains("blockDeviceDir"));
    assert!(refusal("storageClasses: [{name: d, parameters: {allocation: thick}}]").contains("allocation"));
    let operator = operator_resource(
        "operator: {enabled: true, resource: {workload: {}}}\nconfig: {blockVolumes: true, blockDeviceDir: /dev/hpp-block}\n",
    );
    assert_eq!(operator.spec.config.block_volumes, Some(true));
    assert_eq!(operator.spec.config.block_device_dir.as_deref(), Some("/dev/hpp-block"));
}

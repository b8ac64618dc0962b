use k8s_openapi::api::core::v1::PodSpec;

use super::*;
use crate::deciding::operator::resource::EXAMPLES;

const NAMESPACE: &str = "hpp-operator";
const IMAGE: &str = "registry.example/hostpath-provisioner:1.2.3";

fn environment() -> Environment {
    Environment {
        namespace: NAMESPACE.into(),
        image: IMAGE.into(),
        openshift: false,
        prometheus: false,
        held_pools: Vec::new(),
        pool_roots: Vec::new(),
        image_pull_secrets: Vec::new(),
    }
}

fn example(file: &str) -> HostPathProvisioner {
    let (_, text) = EXAMPLES.iter().find(|(name, _)| *name == file).expect("example exists");
    let mut resource: HostPathProvisioner = serde_saphyr::from_str(text).expect("example parses");
    resource.metadata.uid = Some("0b5c4a1e-0000-4000-8000-000000000001".into());
    resource
}

fn with_spec(spec: Value) -> HostPathProvisioner {
    serde_json::from_value(json!({"metadata": {"name": "hpp", "uid": "u-1"}, "spec": spec})).expect("resource")
}

fn object<'a>(rendered: &'a Rendered, kind: &str) -> &'a Desired {
    rendered.objects.iter().find(|o| o.kind == kind).unwrap_or_else(|| panic!("no {kind} rendered"))
}

fn pod(rendered: &Rendered) -> PodSpec {
    let daemonset: DaemonSet = serde_json::from_value(object(rendered, "DaemonSet").body.clone()).expect("daemonset");
    daemonset.spec.expect("spec").template.spec.expect("pod spec")
}

fn node_container(pod: &PodSpec) -> &Container {
    pod.containers.iter().find(|c| c.name == NODE_CONTAINER).expect("node container")
}

fn env<'a>(container: &'a Container, name: &str) -> Option<&'a str> {
    container.env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.as_deref())
}

fn the_files_pod() -> PodSpec {
    let daemonset: DaemonSet = typed(DAEMONSET, "daemonset.yaml").expect("daemonset.yaml");
    daemonset.spec.expect("spec").template.spec.expect("pod spec")
}

#[test]
fn legacy_path_config_deploys_the_legacy_provisioner_as_deploy_legacy_has_it() {
    let rendered = render(&example("legacy.yaml"), &environment());
    assert_eq!(rendered.problems, []);
    assert_eq!(rendered.served_pools, ["legacy"]);
    let pod = pod(&rendered);
    let container = node_container(&pod);
    assert_eq!(env(container, "PV_DIR"), Some("/var/hpvolumes"));
    assert_eq!(env(container, "USE_NAMING_PREFIX"), Some("false"));
    assert_eq!(env(container, "STORAGE_POOLS"), None);
    assert_eq!(container.image.as_deref(), Some(IMAGE));
    assert_eq!(container.image_pull_policy.as_deref(), Some("Always"));
    // Everything the file decides about the container is untouched.
    let files_pod = the_files_pod();
    let file = node_container(&files_pod);
    assert_eq!(container.security_context, file.security_context);
    assert_eq!(container.liveness_probe, file.liveness_probe);
    assert_eq!(container.readiness_probe, file.readiness_probe);
    assert_eq!(container.resources, file.resources);
    assert_eq!(container.volume_mounts, file.volume_mounts);
    assert_eq!(pod.volumes, files_pod.volumes);
    assert_eq!(pod.priority_class_name, files_pod.priority_class_name);
    assert_eq!(pod.service_account_name, files_pod.service_account_name);
}

#[test]
fn legacy_path_config_moves_the_pool_root_and_the_naming_prefix() {
    let rendered =
        render(&with_spec(json!({"pathConfig": {"path": "/srv/volumes", "useNamingPrefix": true}})), &environment());
    let pod = pod(&rendered);
    let container = node_container(&pod);
    assert_eq!(env(container, "PV_DIR"), Some("/srv/volumes"));
    assert_eq!(env(container, "USE_NAMING_PREFIX"), Some("true"));
    let mount = container.volume_mounts.iter().flatten().find(|m| m.name == "pv-volume").expect("mount");
    assert_eq!(mount.mount_path, "/srv/volumes");
    let volume = pod.volumes.iter().flatten().find(|v| v.name == "pv-volume").expect("volume");
    assert_eq!(volume.host_path.as_ref().map(|h| h.path.as_str()), Some("/srv/volumes"));
}

#[test]
fn storage_pools_become_named_pools_each_with_its_own_host_path_mount() {
    let spec = json!({"storagePools": [{"name": "fast", "path": "/mnt/ssd"}, {"name": "slow", "path": "/mnt/hdd"}]});
    let rendered = render(&with_spec(spec), &environment());
    assert_eq!(rendered.problems, []);
    assert_eq!(rendered.served_pools, ["fast", "slow"]);
    let pod = pod(&rendered);
    let container = node_container(&pod);
    assert_eq!(env(container, "STORAGE_POOLS"), Some("fast=/mnt/ssd,slow=/mnt/hdd"));
    assert_eq!(env(container, "PV_DIR"), None, "no legacy pool unless pathConfig says so");
    let mounts: Vec<_> = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.name.as_str(), m.mount_path.as_str(), m.mount_propagation.as_deref()))
        .collect();
    assert_eq!(
        mounts,
        [("pool-1", "/mnt/ssd", Some("HostToContainer")), ("pool-2", "/mnt/hdd", Some("HostToContainer"))]
    );
    let volumes: Vec<_> = pod
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v.host_path.as_ref().map(|h| h.path.as_str())))
        .collect();
    assert_eq!(volumes, [("pool-1", Some("/mnt/ssd")), ("pool-2", Some("/mnt/hdd"))]);
}

#[test]
fn the_storage_pool_example_is_one_pool_at_var_hpvolumes() {
    let rendered = render(&example("storage-pool.yaml"), &environment());
    let pod = pod(&rendered);
    assert_eq!(env(node_container(&pod), "STORAGE_POOLS"), Some("local=/var/hpvolumes"));
}

#[test]
fn workload_placement_adds_to_the_files_node_selector_and_the_tolerations_are_the_resources_alone() {
    let spec = json!({
        "pathConfig": {"path": "/var/hpvolumes"},
        "workload": {
            "nodeSelector": {"storage": "yes"},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
            ]}}},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "storage", "effect": "NoSchedule"}],
        },
    });
    let pod = pod(&render(&with_spec(spec), &environment()));
    let selector = pod.node_selector.expect("selector");
    assert_eq!(selector.get("storage").map(String::as_str), Some("yes"));
    assert_eq!(selector.get("kubernetes.io/os").map(String::as_str), Some("linux"), "the file's own selector stays");
    let tolerations: Vec<_> = pod.tolerations.iter().flatten().filter_map(|t| t.key.as_deref()).collect();
    assert_eq!(tolerations, ["dedicated"], "no control-plane toleration the kubevirt operator does not add");
    let terms =
        pod.affinity.and_then(|a| a.node_affinity).and_then(|n| n.required_during_scheduling_ignored_during_execution);
    assert_eq!(terms.map(|t| t.node_selector_terms.len()), Some(1));
}

#[test]
fn a_malformed_affinity_renders_nothing_and_says_what_to_fix() {
    let spec =
        json!({"pathConfig": {"path": "/var/hpvolumes"}, "workload": {"affinity": {"nodeAffinity": "everywhere"}}});
    let rendered = render(&with_spec(spec), &environment());
    assert!(rendered.blocked());
    assert!(rendered.objects.is_empty(), "what runs keeps running");
    assert_eq!(rendered.problems[0].reason, "InvalidAffinity");
    assert!(rendered.problems[0].message.contains("spec.workload.affinity"));
    let spec =
        json!({"pathConfig": {"path": "/var/hpvolumes"}, "workload": {"tolerations": [{"tolerationSeconds": "soon"}]}});
    let rendered = render(&with_spec(spec), &environment());
    assert_eq!(rendered.problems[0].reason, "InvalidTolerations");
    assert!(rendered.problems[0].message.contains("tolerations[0]"));
}

#[test]
fn image_pull_policy_is_the_resources_or_else_the_files() {
    let pull = |spec: Value| {
        let pod = pod(&render(&with_spec(spec), &environment()));
        node_container(&pod).image_pull_policy.clone()
    };
    assert_eq!(pull(json!({"pathConfig": {"path": "/a"}})).as_deref(), Some("IfNotPresent"));
    assert_eq!(pull(json!({"pathConfig": {"path": "/a"}, "imagePullPolicy": ""})).as_deref(), Some("IfNotPresent"));
    assert_eq!(pull(json!({"pathConfig": {"path": "/a"}, "imagePullPolicy": "Never"})).as_deref(), Some("Never"));
}

#[test]
fn pools_on_a_claim_are_served_only_while_mounted_and_listed_for_their_claims() {
    for file in ["pvc-template.yaml", "shared-pvc-template.yaml"] {
        let rendered = render(&example(file), &environment());
        assert!(rendered.problems.is_empty(), "{file}: {:?}", rendered.problems);
        assert_eq!(rendered.pools_on_claim.len(), 1, "{file}");
        let pool = &rendered.pools_on_claim[0];
        let storage_pools = env_value(&rendered, "STORAGE_POOLS").expect("STORAGE_POOLS");
        assert_eq!(storage_pools, format!("{}={},mountpoint", pool.name, pool.path), "{file}");
    }
    let spec = json!({"storagePools": [
        {"name": "disk", "path": "/mnt/disk"},
        {"name": "claim", "path": "/mnt/claim", "pvcTemplate": {"resources": {"requests": {"storage": "1Gi"}}}},
    ]});
    let rendered = render(&with_spec(spec), &environment());
    assert_eq!(rendered.served_pools, ["disk", "claim"]);
    assert_eq!(env_value(&rendered, "STORAGE_POOLS").as_deref(), Some("disk=/mnt/disk,claim=/mnt/claim,mountpoint"));
    assert_eq!(rendered.pools_on_claim.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["claim"]);
    // The claims' nodes are the DaemonSet's: its file's node selector is kept, its
    // control-plane toleration is not (the kubevirt operator adds none).
    assert_eq!(rendered.placement.node_selector.get("kubernetes.io/os").map(String::as_str), Some("linux"));
    assert_eq!(rendered.placement.tolerations, []);
    assert_eq!(pod(&rendered).tolerations, None);
}

#[test]
fn a_held_back_pool_stays_served_while_mounted_unless_its_name_or_path_is_taken() {
    let spec = json!({"storagePools": [{"name": "disk", "path": "/mnt/disk"}]});
    let held = |pools: &[(&str, &str)]| {
        let environment = Environment {
            held_pools: pools.iter().map(|(n, p)| ((*n).to_owned(), (*p).to_owned())).collect(),
            ..environment()
        };
        env_value(&render(&with_spec(spec.clone()), &environment), "STORAGE_POOLS")
    };
    assert_eq!(held(&[("old", "/mnt/old")]).as_deref(), Some("disk=/mnt/disk,old=/mnt/old,mountpoint"));
    assert_eq!(held(&[("disk", "/mnt/old")]).as_deref(), Some("disk=/mnt/disk"), "the name is taken");
    assert_eq!(held(&[("old", "/mnt/disk/old")]).as_deref(), Some("disk=/mnt/disk"), "inside a served pool");
    let legacy = Environment { held_pools: vec![("old".into(), "/mnt/old".into())], ..environment() };
    assert!(env_value(&render(&example("legacy.yaml"), &legacy), "STORAGE_POOLS").is_none(), "pathConfig has no pools");
}

fn env_value(rendered: &Rendered, name: &str) -> Option<String> {
    let daemonset = rendered.objects.iter().find(|o| o.kind == "DaemonSet")?;
    daemonset
        .body
        .pointer("/spec/template/spec/containers/0/env")?
        .as_array()?
        .iter()
        .find_map(|e| (e["name"] == name).then(|| e["value"].as_str().map(str::to_owned)).flatten())
}

#[test]
fn block_mode_and_malformed_claim_templates_are_refused_with_the_reason() {
    let pool = |template: Value| {
        let spec = json!({"storagePools": [{"name": "p", "path": "/mnt/p", "pvcTemplate": template}]});
        render(&with_spec(spec), &environment()).problems[0].clone()
    };
    let block = pool(json!({"volumeMode": "Block", "resources": {"requests": {"storage": "1Gi"}}}));
    assert_eq!(block.reason, "BlockPoolNotSupported");
    assert!(block.message.contains("volumeMode Filesystem"), "{}", block.message);
    assert_eq!(block.pool.as_deref(), Some("p"));
    assert_eq!(pool(json!({"accessModes": "ReadWriteOnce"})).reason, "InvalidPvcTemplate");
}

#[test]
fn a_pool_name_the_node_binary_cannot_take_is_refused_and_the_others_served() {
    let spec = json!({"storagePools": [{"name": "Fast_SSD", "path": "/mnt/ssd"}, {"name": "hdd", "path": "/mnt/hdd"}]});
    let rendered = render(&with_spec(spec), &environment());
    assert_eq!(rendered.problems.iter().map(|p| p.reason).collect::<Vec<_>>(), ["InvalidPoolName"]);
    assert_eq!(rendered.served_pools, ["hdd"]);
}

#[test]
fn csi_only_fields_are_listed_as_not_acted_upon() {
    let rendered = render(&example("shared-pvc-template.yaml"), &environment());
    assert_eq!(rendered.not_acted_upon, ["spec.featureGates (Snapshotting)", "spec.storagePools[0].snapshotProvider"]);
    assert_eq!(render(&example("legacy.yaml"), &environment()).not_acted_upon, Vec::<String>::new());
}

#[test]
fn everything_is_owned_by_the_resource_and_namespaced_objects_go_in_the_operators_namespace() {
    let environment = Environment { openshift: true, prometheus: true, ..environment() };
    let rendered = render(&example("legacy.yaml"), &environment);
    let kinds: Vec<_> = rendered.objects.iter().map(|o| o.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
            "DaemonSet",
            "SecurityContextConstraints",
            "SecurityContextConstraints",
            "Service",
            "ServiceMonitor",
            "PrometheusRule",
            "Service",
            "ServiceMonitor",
            "PrometheusRule"
        ]
    );
    for object in &rendered.objects {
        let owners = &object.body["metadata"]["ownerReferences"];
        assert_eq!(owners[0]["kind"], "HostPathProvisioner", "{}", object.kind);
        assert_eq!(owners[0]["uid"], "0b5c4a1e-0000-4000-8000-000000000001", "{}", object.kind);
        assert_eq!(object.body["metadata"]["labels"][OWNER_LABEL], "hostpath-provisioner");
        let cluster_scoped =
            ["ClusterRole", "ClusterRoleBinding", "SecurityContextConstraints"].contains(&object.kind.as_str());
        assert_eq!(object.namespace.as_deref(), if cluster_scoped { None } else { Some(NAMESPACE) }, "{}", object.kind);
        let text = object.body.to_string();
        for stale in
            [format!("\"namespace\":\"{}\"", legacy_namespace()), format!("serviceaccount:{}:", legacy_namespace())]
        {
            assert!(!text.contains(&stale), "{} still says {stale}", object.kind);
        }
    }
    let binding = &object(&rendered, "ClusterRoleBinding").body;
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
    let sccs: Vec<_> = rendered.objects.iter().filter(|o| o.kind == "SecurityContextConstraints").collect();
    let users: Vec<_> = sccs.iter().map(|s| (s.name.as_str(), s.body["users"].clone())).collect();
    assert_eq!(
        users,
        [
            (NODE_SCC, json!([format!("system:serviceaccount:{NAMESPACE}:kubevirt-hostpath-provisioner-admin")])),
            (MOUNTER_SCC, json!([format!("system:serviceaccount:{NAMESPACE}:{MOUNTER_SERVICE_ACCOUNT}")])),
        ]
    );
    let accounts: Vec<_> = rendered.objects.iter().filter(|o| o.kind == "ServiceAccount").map(|o| &o.name).collect();
    assert_eq!(accounts, ["kubevirt-hostpath-provisioner-admin", MOUNTER_SERVICE_ACCOUNT]);
    assert_eq!(object(&rendered, "ServiceMonitor").body["spec"]["namespaceSelector"]["matchNames"], json!([NAMESPACE]));
    // The peers and metrics Services find the pods by the labels the rendered template carries,
    // and the pods name the peers Service.
    let template = &object(&rendered, "DaemonSet").body["spec"]["template"];
    // (The operator's own metrics Service selects its replicas: the test below.)
    let services: Vec<_> = rendered
        .objects
        .iter()
        .filter(|o| o.kind == "Service" && o.name != "hostpath-provisioner-operator-metrics")
        .collect();
    assert_eq!(
        services.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["hostpath-provisioner-peers", "kubevirt-hostpath-provisioner-metrics"]
    );
    for service in services {
        for (key, value) in service.body["spec"]["selector"].as_object().expect("selector") {
            assert_eq!(&template["metadata"]["labels"][key], value, "{}: pod label {key}", service.name);
        }
    }
    let env = template["spec"]["containers"][0]["env"].as_array().expect("env");
    assert!(env.iter().any(|e| e["name"] == "PEER_SERVICE" && e["value"] == "hostpath-provisioner-peers"), "{env:?}");
}

#[test]
fn without_openshift_or_prometheus_no_scc_or_monitoring_object_is_made() {
    let rendered = render(&example("legacy.yaml"), &environment());
    let monitoring_or_scc = |o: &Desired| {
        ["SecurityContextConstraints", "ServiceMonitor", "PrometheusRule"].contains(&o.kind.as_str())
            || (o.kind == "Service" && o.name.ends_with("-metrics"))
    };
    assert!(!rendered.objects.iter().any(monitoring_or_scc));
}

/// The kubevirt operator's SCCs are `hostpath-provisioner` (legacy) and `hostpath-provisioner-csi`:
/// applying ours under one of those names would take it over, and deleting the resource would
/// delete it.
#[test]
fn the_sccs_take_no_name_of_the_kubevirt_operators_and_the_pods_pin_theirs() {
    let environment = Environment { openshift: true, ..environment() };
    let rendered = render(&example("pvc-template.yaml"), &environment);
    let names: Vec<_> =
        rendered.objects.iter().filter(|o| o.kind == "SecurityContextConstraints").map(|o| o.name.as_str()).collect();
    assert_eq!(names, [NODE_SCC, MOUNTER_SCC]);
    for kubevirt in ["hostpath-provisioner", "hostpath-provisioner-csi"] {
        assert!(!names.contains(&kubevirt), "{kubevirt} is the kubevirt operator's");
    }
    let template = &object(&rendered, "DaemonSet").body["spec"]["template"];
    assert_eq!(template["metadata"]["annotations"][REQUIRED_SCC], NODE_SCC);
}

#[test]
fn the_node_pods_pull_with_the_operators_pull_secrets() {
    let environment = Environment { image_pull_secrets: vec!["regcred".into()], ..environment() };
    let pod = pod(&render(&example("storage-pool.yaml"), &environment));
    let names: Vec<_> = pod.image_pull_secrets.iter().flatten().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["regcred"]);
    assert_eq!(self::pod(&render(&example("storage-pool.yaml"), &self::environment())).image_pull_secrets, None);
}

#[test]
fn a_typo_in_the_placement_is_refused_naming_the_field_and_renders_nothing() {
    let spec = json!({"pathConfig": {"path": "/var/hpvolumes"}, "workload": {"tolerations": [
        {"key": "dedicated", "operator": "Exists"},
        {"key": "gpu", "operater": "Exists", "effect": "NoSchedule"},
    ]}});
    let rendered = render(&with_spec(spec), &environment());
    assert!(rendered.blocked() && rendered.objects.is_empty(), "what runs keeps running");
    assert_eq!(rendered.problems[0].reason, "InvalidTolerations");
    assert!(
        rendered.problems[0].message.starts_with("spec.workload.tolerations[1].operater: "),
        "{:?}",
        rendered.problems
    );
    let spec = json!({"pathConfig": {"path": "/var/hpvolumes"}, "workload": {"affinity": {"nodeAfinity": {}}}});
    let rendered = render(&with_spec(spec), &environment());
    assert_eq!(rendered.problems[0].reason, "InvalidAffinity");
    assert!(
        rendered.problems[0].message.starts_with("spec.workload.affinity.nodeAfinity: "),
        "{:?}",
        rendered.problems
    );
}

#[test]
fn a_typo_in_a_claim_template_leaves_that_pool_out_naming_the_field() {
    let spec = json!({"storagePools": [
        {"name": "disk", "path": "/mnt/disk"},
        {"name": "claim", "path": "/mnt/claim", "pvcTemplate": {"resources": {"request": {"storage": "1Gi"}}}},
    ]});
    let rendered = render(&with_spec(spec), &environment());
    assert_eq!(rendered.served_pools, ["disk"]);
    assert_eq!(rendered.problems.len(), 1, "{:?}", rendered.problems);
    let problem = &rendered.problems[0];
    assert_eq!((problem.reason, problem.pool.as_deref()), ("InvalidPvcTemplate", Some("claim")));
    assert!(problem.message.contains("spec.storagePools[1].pvcTemplate.resources.request"), "{}", problem.message);
}

/// The operator's rights over cluster-wide RBAC and SCCs (deploy/operator/rbac.yaml) are
/// limited by name to what it makes: a stolen operator token cannot patch or delete any other
/// ClusterRole, binding or SCC. `create` and `list` cannot be limited by name in Kubernetes RBAC.
#[test]
fn the_operator_may_change_only_the_cluster_objects_it_makes() {
    let rbac: Vec<Value> = serde_saphyr::from_multiple(OPERATOR_RBAC).expect("rbac.yaml parses");
    let cluster_role = rbac.iter().find(|d| d["kind"] == "ClusterRole").expect("ClusterRole");
    let guarded = ["clusterroles", "clusterrolebindings", "securitycontextconstraints"];
    let by_name = ["get", "patch", "update", "delete", "escalate", "bind", "*"];
    let mut named: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for rule in cluster_role["rules"].as_array().expect("rules") {
        let strings = |key: &str| -> Vec<String> {
            rule[key].as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
        };
        let (resources, verbs, names) = (strings("resources"), strings("verbs"), strings("resourceNames"));
        for resource in resources.iter().filter(|r| guarded.contains(&r.as_str()) || *r == "*") {
            if names.is_empty() {
                let open: Vec<_> = verbs.iter().filter(|v| by_name.contains(&v.as_str())).collect();
                assert!(open.is_empty(), "{resource}: {open:?} granted without resourceNames");
            }
            named.entry(resource.clone()).or_default().extend(names.iter().cloned());
        }
    }
    let environment = Environment { openshift: true, ..environment() };
    for kind in ["ClusterRole", "ClusterRoleBinding", "SecurityContextConstraints"] {
        let made: Vec<_> = render(&example("pvc-template.yaml"), &environment)
            .objects
            .into_iter()
            .filter(|o| o.kind == kind)
            .map(|o| (o.plural, o.name))
            .collect();
        assert!(!made.is_empty(), "{kind}");
        for (plural, name) in made {
            let allowed = named.get(&plural).cloned().unwrap_or_default();
            assert!(allowed.contains(&name), "{kind} {name} is made but rbac.yaml names only {allowed:?}");
        }
    }
}

const OPERATOR_RBAC: &str = include_str!("../../../deploy/operator/rbac.yaml");

// --- The node provisioner's features: spec.config, pool options, several disks, quota,
// published capacity. ---

#[test]
fn every_config_field_becomes_its_env_var_and_unset_ones_keep_the_files() {
    let config = json!({
        "provisionerName": "hostpath.example.org", "publishCapacity": true,
        "capacityProvisionerName": "placed.example.org", "nodeAffinityKeys": "example.com/disk-serial", "pvCapacity": "filesystem", "dirMode": "0770",
        "requireMountpoint": true, "pvFinalizer": true, "provisionOnNode": "deny", "reservedSpace": "1Gi",
        "capacityAccounting": "requests", "maxConcurrency": 4, "orphanSnapshotCopyGrace": "2h",
        "reapVolumesOfRemovedNodes": "24h", "logFormat": "json", "logLevel": "debug",
        "blockVolumes": true, "blockDeviceDir": "/dev/hpp-block"
    });
    let rendered = render(
        &with_spec(json!({"storagePools": [{"name": "a", "path": "/var/a"}], "config": config})),
        &environment(),
    );
    assert_eq!(rendered.problems, []);
    let pod = pod(&rendered);
    let container = node_container(&pod);
    assert_eq!(CONFIG_FIELDS.len(), config.as_object().expect("object").len(), "a field of spec.config is not tested");
    for (field, variable) in CONFIG_FIELDS {
        let value = &config[field];
        let written = value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string());
        assert_eq!(env(container, variable), Some(written.as_str()), "spec.config.{field} -> {variable}");
    }
    // Unset: the file's values stay.
    let plain = render(&with_spec(json!({"storagePools": [{"name": "a", "path": "/var/a"}]})), &environment());
    let pod = self::pod(&plain);
    let file = the_files_pod();
    for variable in ["PROVISIONER_NAME", "PV_CAPACITY", "DIR_MODE", "LOG_FORMAT", "RUST_LOG"] {
        assert_eq!(env(node_container(&pod), variable), env(node_container(&file), variable), "{variable}");
    }
    assert_eq!(env(node_container(&pod), "PUBLISH_CAPACITY"), None);
}

#[test]
fn pool_options_and_one_pool_over_several_disks_are_written_into_storage_pools() {
    let rendered = render(
        &with_spec(json!({"storagePools": [
            {"name": "data", "path": "/mnt/disk1", "reserve": "10Gi", "accounting": "requests"},
            {"name": "data", "path": "/mnt/disk2", "reserve": 1048576, "requireMountpoint": true},
            {"name": "fast", "path": "/mnt/nvme", "requireMountpoint": false}
        ]})),
        &environment(),
    );
    assert_eq!(rendered.problems, []);
    assert_eq!(rendered.served_pools, ["data", "data", "fast"]);
    let pod = pod(&rendered);
    assert_eq!(
        env(node_container(&pod), "STORAGE_POOLS"),
        Some(
            "data=/mnt/disk1,reserve=10Gi,accounting=requests,data=/mnt/disk2,reserve=1048576,mountpoint,fast=/mnt/nvme"
        )
    );
    // Each disk is mounted into the pod.
    let mounts: Vec<_> = node_container(&pod).volume_mounts.iter().flatten().map(|m| m.mount_path.clone()).collect();
    for path in ["/mnt/disk1", "/mnt/disk2", "/mnt/nvme"] {
        assert!(mounts.iter().any(|m| m == path), "{path} not mounted: {mounts:?}");
    }
    // The binary reads it as one pool over two disks.
    let pools =
        crate::config::parse_pool_specs(env(node_container(&pod), "STORAGE_POOLS").expect("set")).expect("parses");
    assert_eq!(pools.iter().filter(|p| p.name == "data").count(), 2);
    assert_eq!(pools[0].reserve, Some(10 << 30));
    assert!(pools[1].require_mountpoint && !pools[2].require_mountpoint);
}

#[test]
fn a_pool_name_twice_with_a_claim_template_is_refused_naming_the_rule() {
    let rendered = render(
        &with_spec(json!({"storagePools": [
            {"name": "data", "path": "/mnt/disk1", "pvcTemplate": {"resources": {"requests": {"storage": "1Gi"}}}},
            {"name": "data", "path": "/mnt/disk2"}
        ]})),
        &environment(),
    );
    assert!(rendered.blocked() && rendered.objects.is_empty());
    assert!(rendered.problems[0].message.contains(super::super::spec_rules::message::POOL_NAMES_UNIQUE));
}

#[test]
fn the_quota_capability_is_added_to_the_pods_and_their_scc_only_when_enabled() {
    let environment = Environment { openshift: true, ..environment() };
    for enabled in [false, true] {
        let rendered = render(
            &with_spec(json!({"storagePools": [{"name": "a", "path": "/var/a"}], "quota": {"enabled": enabled}})),
            &environment,
        );
        let pod = pod(&rendered);
        let added = node_container(&pod)
            .security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref())
            .and_then(|c| c.add.clone())
            .unwrap_or_default();
        assert_eq!(added.iter().any(|c| c == QUOTA_CAPABILITY), enabled, "{added:?}");
        let scc = rendered
            .objects
            .iter()
            .find(|o| o.kind == "SecurityContextConstraints" && o.name == NODE_SCC)
            .expect("node SCC");
        let allowed = scc.body["allowedCapabilities"].as_array().expect("allowed").clone();
        assert_eq!(allowed.contains(&json!(QUOTA_CAPABILITY)), enabled, "{allowed:?}");
        let mounter = rendered.objects.iter().find(|o| o.name == MOUNTER_SCC && o.kind == "SecurityContextConstraints");
        assert!(!mounter.expect("mounter SCC").body.to_string().contains(QUOTA_CAPABILITY));
    }
}

/// Block volumes need more privilege than the rest (loop control, mknod on the host's /dev): the
/// node container is privileged with /dev mounted, and its SCC allows it, only when the
/// resource turns them on; off, the DaemonSet is the file's unprivileged one.
#[test]
fn block_volumes_make_the_node_container_privileged_with_the_hosts_dev_only_when_on() {
    let environment = Environment { openshift: true, ..environment() };
    for on in [None, Some(false), Some(true)] {
        let mut spec = json!({"storagePools": [{"name": "a", "path": "/var/a"}], "quota": {"enabled": true}});
        if let Some(on) = on {
            spec["config"] = json!({"blockVolumes": on, "blockDeviceDir": "/dev/hpp-block"});
        }
        let rendered = render(&with_spec(spec), &environment);
        assert_eq!(rendered.problems, []);
        let enabled = on == Some(true);
        let pod = pod(&rendered);
        let container = node_container(&pod);
        let context = container.security_context.clone().expect("a security context");
        assert_eq!(context.privileged, Some(enabled), "{on:?}: {context:?}");
        assert_eq!(context.allow_privilege_escalation, Some(enabled), "{on:?}");
        assert_eq!(context.read_only_root_filesystem, Some(true), "{on:?}");
        if !enabled {
            // The file's context, with the quota's capability: nothing of the privileged one.
            let file = the_files_pod();
            let files = node_container(&file).security_context.clone().expect("the file's context");
            assert_eq!(
                context.capabilities.as_ref().and_then(|c| c.drop.clone()),
                files.capabilities.and_then(|c| c.drop)
            );
            assert_eq!(context.seccomp_profile, files.seccomp_profile);
        }
        let dev_mounts: Vec<_> =
            container.volume_mounts.iter().flatten().filter(|m| m.mount_path == "/dev").map(|m| &m.name).collect();
        let dev_volumes: Vec<_> = pod
            .volumes
            .iter()
            .flatten()
            .filter(|v| v.host_path.as_ref().is_some_and(|h| h.path == "/dev"))
            .map(|v| &v.name)
            .collect();
        assert_eq!(dev_mounts.len(), usize::from(enabled), "{on:?}: {dev_mounts:?}");
        assert_eq!(dev_mounts, dev_volumes, "{on:?}: the mount is of the host's /dev");
        assert_eq!(env(container, "BLOCK_VOLUMES"), on.map(|b| if b { "true" } else { "false" }));
        assert_eq!(env(container, "BLOCK_DEVICE_DIR"), on.map(|_| "/dev/hpp-block"));
        let scc = rendered
            .objects
            .iter()
            .find(|o| o.kind == "SecurityContextConstraints" && o.name == NODE_SCC)
            .expect("node SCC");
        assert_eq!(scc.body["allowPrivilegedContainer"], json!(enabled), "{on:?}");
        assert_eq!(scc.body["allowPrivilegeEscalation"], json!(enabled), "{on:?}");
        let mounter = rendered.objects.iter().find(|o| o.name == MOUNTER_SCC && o.kind == "SecurityContextConstraints");
        assert!(mounter.is_some(), "the mounters' SCC is rendered as before");
    }
}

#[test]
fn published_capacity_makes_a_csidriver_of_the_provisioner_name_owned_by_the_resource() {
    let spec = |publish: bool| {
        json!({"storagePools": [{"name": "a", "path": "/var/a"}],
               "config": {"provisionerName": "hostpath.example.org", "publishCapacity": publish}})
    };
    let rendered = render(&with_spec(spec(true)), &environment());
    let driver = object(&rendered, "CSIDriver");
    assert_eq!(
        (driver.name.as_str(), driver.namespace.as_deref(), driver.plural.as_str()),
        ("hostpath.example.org", None, "csidrivers")
    );
    assert_eq!(driver.body["spec"]["storageCapacity"], json!(true));
    assert_eq!(driver.body["metadata"]["ownerReferences"][0]["uid"], json!("u-1"));
    assert_eq!(driver.body["metadata"]["labels"][OWNER_LABEL], json!("hpp"));
    assert_eq!(env(node_container(&pod(&rendered)), "PUBLISH_CAPACITY"), Some("true"));
    let off = render(&with_spec(spec(false)), &environment());
    assert!(off.objects.iter().all(|o| o.kind != "CSIDriver"));
    // The default name has a '/': no CSIDriver can carry it, refused as the CRD refuses it.
    let refused = render(
        &with_spec(json!({"storagePools": [{"name": "a", "path": "/var/a"}], "config": {"publishCapacity": true}})),
        &environment(),
    );
    assert!(refused.blocked());
    assert!(refused.problems[0].message.contains(super::super::spec_rules::message::PUBLISH_NEEDS_NAME));
}

/// A migrated kubevirt install keeps `kubevirt.io/hostpath-provisioner` and places new classes by
/// capacity under a second name: the nodes get both, the CSIDriver is named after the second.
#[test]
fn a_capacity_provisioner_name_names_the_csidriver_and_lets_the_first_name_keep_its_slash() {
    let spec = json!({"storagePools": [{"name": "a", "path": "/var/a"}],
        "config": {"publishCapacity": true, "capacityProvisionerName": "hostpath.example.org"}});
    let rendered = render(&with_spec(spec), &environment());
    assert!(!rendered.blocked(), "{:?}", rendered.problems);
    assert_eq!(object(&rendered, "CSIDriver").name, "hostpath.example.org");
    let pod = pod(&rendered);
    let container = node_container(&pod);
    assert_eq!(env(container, "CAPACITY_PROVISIONER_NAME"), Some("hostpath.example.org"));
    assert_eq!(env(container, "PROVISIONER_NAME"), Some("kubevirt.io/hostpath-provisioner"), "the file's, kept");
}

#[test]
fn the_operator_may_manage_the_csidriver_it_makes() {
    let rbac: Vec<Value> = serde_saphyr::from_multiple(OPERATOR_RBAC).expect("rbac.yaml parses");
    let cluster_role = rbac.iter().find(|d| d["kind"] == "ClusterRole").expect("ClusterRole");
    let granted: Vec<String> = cluster_role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|r| r["resources"].as_array().is_some_and(|rs| rs.contains(&json!("csidrivers"))))
        .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    for verb in ["get", "list", "create", "patch", "delete"] {
        assert!(granted.iter().any(|g| g == verb), "csidrivers: {verb} not granted");
    }
}

/// The operator's own monitoring finds its replicas: the Service selects the pods of
/// deploy/operator's Deployment (the chart's operator mode is checked by e2e_chart), the
/// ServiceMonitor selects the Service, and the alert's job is the one the Service names.
#[test]
fn the_operators_monitoring_selects_its_replicas_and_the_alert_its_job() {
    let environment = Environment { prometheus: true, ..environment() };
    let rendered = render(&example("legacy.yaml"), &environment);
    let service = rendered
        .objects
        .iter()
        .find(|o| o.kind == "Service" && o.name == "hostpath-provisioner-operator-metrics")
        .expect("the operator's metrics Service");
    let deployment = untyped(include_str!("../../../deploy/operator/deployment.yaml"), "deployment.yaml").unwrap();
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selector = service.body["spec"]["selector"].as_object().expect("a selector");
    assert!(!selector.is_empty());
    for (key, value) in selector {
        assert_eq!(&pod_labels[key], value, "the operator pods lack {key}: {pod_labels}");
    }
    let port = &deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0];
    assert_eq!(
        (&port["name"], &port["containerPort"]),
        (&service.body["spec"]["ports"][0]["targetPort"], &serde_json::json!(8080))
    );
    let monitor = rendered
        .objects
        .iter()
        .find(|o| o.kind == "ServiceMonitor" && o.name == "hostpath-provisioner-operator")
        .expect("the operator's ServiceMonitor");
    for (key, value) in monitor.body["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels") {
        assert_eq!(&service.body["metadata"]["labels"][key], value, "the Service lacks {key}");
    }
    let job_label = monitor.body["spec"]["jobLabel"].as_str().expect("jobLabel");
    let job = service.body["metadata"]["labels"][job_label].as_str().expect("the job label on the Service");
    let rule = rendered
        .objects
        .iter()
        .find(|o| o.kind == "PrometheusRule" && o.name == OPERATOR_PROMETHEUS_RULE)
        .expect("the operator's PrometheusRule");
    let expr = rule.body["spec"]["groups"][0]["rules"][0]["expr"].as_str().expect("an expr");
    assert!(expr.contains(&format!("up{{job=\"{job}\"}}")), "{expr}");
    assert_eq!(rule.namespace.as_deref(), Some(NAMESPACE));
}

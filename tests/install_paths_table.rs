//! docs/install.md, "What each path can turn on": every feature (each class parameter the binary
//! knows, each of its settings, and the named features) against Helm, Helm operator mode,
//! kustomize / install.yaml and the operator's resource. Each cell is derived here from the
//! sources of truth (the binary's parameter and setting lists, the chart's schema and templates,
//! what `helm template` carries or refuses in operator mode, the CRD, the kustomize components)
//! and the test fails when the doc says otherwise, so the table cannot drift.
//!
//! Cells: `yes...` (naming the value, field or file), `set by the install...` (what the install
//! sets for the user: the pod's node, its namespace, the peers Service, its credentials), or
//! `no: <why>; <how it is refused at install time>`.

mod helm;

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::CommandFactory;
use helm::{CHART, helm_command};
use hostpath_provisioner::config::Args;
use hostpath_provisioner::deciding::class::KNOWN_PARAMETERS;
use hostpath_provisioner::deciding::operator::render::CONFIG_FIELDS;
use hostpath_provisioner::deciding::operator::resource::Spec;
use hostpath_provisioner::deciding::operator::spec_rules::broken_rules;
use serde_json::{Value, json};

const SECTION: &str = "## What each path can turn on";
const HELM: usize = 0;
const OPERATOR_MODE: usize = 1;
const KUSTOMIZE: usize = 2;
const RESOURCE: usize = 3;
/// The named features of the table, besides parameters and settings.
const NAMED: [&str; 7] = [
    "snapshots",
    "several disks",
    "released claims",
    "node-affinity keys",
    "published capacity",
    "quota",
    "block volumes",
];
/// Settings every install sets for the user, on every path.
const INSTALL_SET: [&str; 4] = ["NODE_NAME", "POD_NAMESPACE", "PEER_SERVICE", "KUBECONFIG"];
/// Releasing the claims of removed nodes is not a setting of the node pods on any path but a
/// Deployment of its own (the claim releaser): its rows are derived from the releaser's sources
/// by `the_claim_releaser_rows_are_the_releasers_sources`, not by the node pods' settings.
const LEFT_FOR_THE_RELEASE_WORK: [&str; 2] = ["setting `RELEASE_CLAIMS_OF_REMOVED_NODES`", "released claims"];

#[test]
fn the_claim_releaser_rows_are_the_releasers_sources() {
    let rows = table();
    let component = "release-claims-of-removed-nodes";
    let facts = [
        (
            HELM,
            read(&format!("{CHART}/templates/claim-releaser.yaml"))
                .contains(".Values.config.releaseClaimsOfRemovedNodes"),
            "`config.releaseClaimsOfRemovedNodes`".to_owned(),
        ),
        (
            OPERATOR_MODE,
            operator_mode("config: {releaseClaimsOfRemovedNodes: 1h}")
                .is_ok_and(|spec| spec["releaseClaimsOfRemovedNodes"] == "1h"),
            "carried into `spec.releaseClaimsOfRemovedNodes`".to_owned(),
        ),
        (
            KUSTOMIZE,
            repo().join("deploy/components").join(component).join("claim-releaser.yaml").is_file(),
            format!("component `{component}`"),
        ),
        (
            RESOURCE,
            yaml("deploy/operator/crd.yaml")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
                ["properties"]
                .get("releaseClaimsOfRemovedNodes")
                .is_some(),
            "`spec.releaseClaimsOfRemovedNodes`".to_owned(),
        ),
    ];
    for row in LEFT_FOR_THE_RELEASE_WORK {
        for (column, holds, names) in &facts {
            let cell = cell(&rows, row, *column);
            assert!(*holds, "{row}, column {column}: the source it names does not make the releaser");
            assert!(cell.starts_with("yes (separate Deployment)") && cell.contains(names.as_str()), "{row}: {cell}");
        }
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The table's rows: feature -> its four cells.
fn table() -> BTreeMap<String, [String; 4]> {
    let doc = read("docs/install.md");
    let start = doc.find(SECTION).expect("docs/install.md has the section");
    let section = &doc[start + SECTION.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut rows = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| Feature")) {
        let cells: Vec<String> = line.trim_matches('|').split(" | ").map(|c| c.trim().to_owned()).collect();
        assert_eq!(cells.len(), 5, "a row of five cells: {line}");
        let previous =
            rows.insert(cells[0].clone(), [cells[1].clone(), cells[2].clone(), cells[3].clone(), cells[4].clone()]);
        assert!(previous.is_none(), "{} is listed twice", cells[0]);
    }
    rows
}

/// Every setting of the binary: its env vars, and RUST_LOG.
fn settings() -> Vec<String> {
    let mut settings: Vec<String> =
        Args::command().get_arguments().filter_map(|a| a.get_env().map(|e| e.to_string_lossy().into_owned())).collect();
    settings.push("RUST_LOG".into());
    settings
}

fn setting_row(env: &str) -> String {
    format!("setting `{env}`")
}

fn parameter_row(parameter: &str) -> String {
    format!("class parameter `{parameter}`")
}

fn cell<'a>(rows: &'a BTreeMap<String, [String; 4]>, feature: &str, column: usize) -> &'a str {
    &rows.get(feature).unwrap_or_else(|| panic!("no row {feature}"))[column]
}

fn says_yes(cell: &str) -> bool {
    cell.starts_with("yes")
}

#[test]
fn the_table_lists_every_parameter_setting_and_feature_once() {
    let rows = table();
    let mut expected: Vec<String> = KNOWN_PARAMETERS.iter().map(|p| parameter_row(p)).collect();
    expected.extend(settings().iter().map(|s| setting_row(s)));
    expected.extend(NAMED.iter().map(|n| n.to_string()));
    expected.sort();
    let listed: Vec<String> = rows.keys().cloned().collect();
    assert_eq!(listed, expected, "the table's rows and the binary's parameters, settings and named features differ");
}

#[test]
fn every_cell_is_a_yes_a_setting_of_the_install_or_a_no_with_its_reason_and_refusal() {
    for (feature, cells) in table() {
        let install_set = INSTALL_SET.iter().any(|s| setting_row(s) == feature);
        for cell in &cells {
            if install_set {
                assert!(cell.starts_with("set by the install: "), "{feature}: {cell}");
            } else if let Some(reason) = cell.strip_prefix("no: ") {
                assert!(
                    reason.contains("refuse") && reason.len() > 40,
                    "{feature}: a no says why and how it is refused: {cell}"
                );
            } else {
                assert!(says_yes(cell) && cell.len() > 5, "{feature}: {cell}");
            }
        }
    }
}

/// The chart's node DaemonSet template: each env var and the `config` values its value reads.
fn chart_env() -> BTreeMap<String, Vec<String>> {
    let template = read(&format!("{CHART}/templates/daemonset.yaml"));
    let lines: Vec<&str> = template.lines().collect();
    let mut env = BTreeMap::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line.trim().strip_prefix("- name: ") else { continue };
        if !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            continue;
        }
        let value = lines.get(i + 1).copied().unwrap_or_default();
        let keys: Vec<String> = value
            .split(".Values.config.")
            .skip(1)
            .map(|rest| rest.chars().take_while(|c| c.is_ascii_alphanumeric()).collect())
            .collect();
        env.insert(name.to_owned(), keys);
    }
    env
}

#[test]
fn the_helm_cells_are_the_charts_schema_and_daemonset() {
    let rows = table();
    let schema: Value = serde_json::from_str(&read(&format!("{CHART}/values.schema.json"))).expect("schema");
    let parameters = &schema["properties"]["storageClasses"]["items"]["properties"]["parameters"]["properties"];
    for parameter in KNOWN_PARAMETERS {
        let row = parameter_row(parameter);
        for column in [HELM, OPERATOR_MODE] {
            let cell = cell(&rows, &row, column);
            if parameters.get(parameter).is_some() {
                assert!(
                    says_yes(cell) && cell.contains(&format!("`storageClasses[].parameters.{parameter}`")),
                    "{row}: {cell}"
                );
            } else {
                assert!(cell.starts_with("no: "), "{row}: the schema refuses it: {cell}");
            }
        }
    }
    let env = chart_env();
    for setting in settings() {
        let row = setting_row(&setting);
        if LEFT_FOR_THE_RELEASE_WORK.contains(&row.as_str()) {
            continue;
        }
        let cell = cell(&rows, &row, HELM);
        match env.get(&setting) {
            _ if INSTALL_SET.contains(&setting.as_str()) => {}
            Some(keys) if !keys.is_empty() => {
                for key in keys {
                    assert!(
                        says_yes(cell) && cell.contains(&format!("`config.{key}`")),
                        "{row}: the chart sets it from config.{key}: {cell}"
                    );
                }
            }
            Some(_) => {
                assert!(says_yes(cell) && cell.contains("pools"), "{row}: the chart sets it from its pools: {cell}")
            }
            None => panic!("{row}: the chart's DaemonSet does not set it, yet the Helm cell is {cell}"),
        }
    }
    assert!(read(&format!("{CHART}/templates/daemonset.yaml")).contains("if $.Values.quota.enabled"));
    assert!(says_yes(cell(&rows, "quota", HELM)) && cell(&rows, "quota", HELM).contains("`quota.enabled`"));
    assert!(read(&format!("{CHART}/templates/csidriver.yaml")).contains("storageCapacity: true"));
    assert!(cell(&rows, "published capacity", HELM).contains("`csiDriver.create`"));
    assert!(read(&format!("{CHART}/templates/daemonset.yaml")).contains("if $.Values.config.blockVolumes"));
    assert!(cell(&rows, "block volumes", HELM) == "yes: `config.blockVolumes`");
    assert!(repo().join(CHART).join("crds/hostpathsnapshots.yaml").exists());
    assert!(says_yes(cell(&rows, "snapshots", HELM)) && says_yes(cell(&rows, "snapshots", OPERATOR_MODE)));
}

/// `helm template` in operator mode with `values`: Ok(the resource's spec) or Err(the refusal).
fn operator_mode(values: &str) -> Result<Value, String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, format!("operator: {{enabled: true, resource: {{workload: {{}}}}}}\n{values}\n"))
        .expect("values");
    let output =
        helm_command(&["template", "x", CHART, "-f", file.to_str().expect("utf-8")]).output().expect("running helm");
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&String::from_utf8_lossy(&output.stdout)).expect("rendered YAML");
    let resource = documents.into_iter().find(|d| d["kind"] == "HostPathProvisioner").expect("the resource");
    Ok(resource["spec"].clone())
}

/// A value of each `config` key other than its default: ci/max-values.yaml's, else one here.
fn non_default(key: &str) -> Value {
    let max = yaml(&format!("{CHART}/ci/max-values.yaml"));
    let default = yaml(&format!("{CHART}/values.yaml"))["config"][key].clone();
    if let Some(value) = max["config"].get(key).filter(|v| !v.is_null() && **v != default) {
        return value.clone();
    }
    if let Some(on) = default.as_bool() {
        return json!(!on);
    }
    match key {
        "pvCapacity" => json!("filesystem"),
        "nodeAffinityKeys" => json!("example.com/disk"),
        "orphanSnapshotCopyGrace" => json!("2h"),
        "releaseClaimsOfRemovedNodes" => json!("1h"),
        "reapVolumesOfRemovedNodes" => json!("24h"),
        "capacityProvisionerName" => json!("hostpath.example.org"),
        "blockDeviceDir" => json!("/dev/hpp-block"),
        other => panic!("no value other than the default for config.{other}: add one here"),
    }
}

#[test]
fn the_operator_mode_cells_are_what_the_chart_carries_or_refuses() {
    let rows = table();
    let values = yaml(&format!("{CHART}/values.yaml"));
    let env = chart_env();
    for (setting, keys) in &env {
        let row = setting_row(setting);
        if keys.is_empty() || LEFT_FOR_THE_RELEASE_WORK.contains(&row.as_str()) {
            continue;
        }
        let cell = cell(&rows, &row, OPERATOR_MODE);
        for key in keys {
            assert!(values["config"].get(key).is_some(), "config.{key} is not a value");
            let mut config = json!({key: non_default(key)});
            if key == "publishCapacity" {
                config["provisionerName"] = json!("hostpath.example.org");
            }
            match operator_mode(&format!("config: {config}")) {
                Ok(spec) => {
                    assert_eq!(spec["config"][key], config[key], "config.{key} carried as given");
                    assert!(
                        says_yes(cell) && cell.contains(&format!("`spec.config.{key}`")),
                        "{row}: carried into spec.config.{key}: {cell}"
                    );
                }
                Err(refusal) => {
                    assert!(refusal.contains(&format!("config.{key}")), "the refusal names config.{key}: {refusal}");
                    assert!(
                        cell.starts_with("no: ") && cell.contains("refused at render"),
                        "{row}: refused ({refusal}): {cell}"
                    );
                }
            }
        }
    }
    // pools: the legacy pool alone into pathConfig, others (one over several disks) into storagePools.
    let legacy = operator_mode("pools: [{name: legacy, path: /mnt/disk}]").expect("carried");
    assert_eq!(legacy["pathConfig"]["path"], "/mnt/disk");
    assert!(cell(&rows, &setting_row("PV_DIR"), OPERATOR_MODE).contains("`spec.pathConfig.path`"));
    let disks = operator_mode("pools: [{name: data, path: /mnt/d1, reserve: 1Gi}, {name: data, path: /mnt/d2}]")
        .expect("carried");
    assert_eq!(disks["storagePools"][0]["name"], disks["storagePools"][1]["name"]);
    for row in ["several disks", "setting `STORAGE_POOLS`"] {
        assert!(
            says_yes(cell(&rows, row, OPERATOR_MODE))
                && cell(&rows, row, OPERATOR_MODE).contains("`spec.storagePools`"),
            "{row}"
        );
    }
    let shared = operator_mode("pools: [{name: nfs, path: /mnt/nfs, shared: true}]").expect_err("refused");
    assert!(
        shared.contains("shared: true")
            && cell(&rows, "setting `STORAGE_POOLS`", OPERATOR_MODE).contains("`shared: true`")
    );
    let quota = operator_mode("quota: {enabled: true}").expect("carried");
    assert_eq!(quota["quota"]["enabled"], true);
    assert!(cell(&rows, "quota", OPERATOR_MODE).contains("`spec.quota.enabled`"));
    let capacity =
        operator_mode("config: {publishCapacity: true, provisionerName: hostpath.example.org}").expect("carried");
    assert_eq!(capacity["config"]["publishCapacity"], true);
    assert!(says_yes(cell(&rows, "published capacity", OPERATOR_MODE)));
    let keys = operator_mode("config: {nodeAffinityKeys: example.com/disk}").expect("carried");
    assert_eq!(keys["config"]["nodeAffinityKeys"], "example.com/disk");
    assert!(cell(&rows, "node-affinity keys", OPERATOR_MODE).contains("`spec.config.nodeAffinityKeys`"));
    let block = operator_mode("config: {blockVolumes: true, blockDeviceDir: /dev/hpp-block}").expect("carried");
    assert_eq!(block["config"]["blockVolumes"], true);
    assert_eq!(block["config"]["blockDeviceDir"], "/dev/hpp-block");
    assert!(cell(&rows, "block volumes", OPERATOR_MODE).contains("`spec.config.blockVolumes`"));
    let refused = operator_mode("csiDriver: {create: true}").expect_err("the operator makes the CSIDriver");
    assert!(refused.contains("csiDriver.create"));
}

/// The env vars a kustomize component sets, by component.
fn components() -> BTreeMap<String, Vec<String>> {
    let mut components = BTreeMap::new();
    for entry in std::fs::read_dir(repo().join("deploy/components")).expect("deploy/components") {
        let dir = entry.expect("entry").path();
        let text = std::fs::read_to_string(dir.join("kustomization.yaml")).expect("kustomization.yaml");
        let vars = text
            .lines()
            .filter_map(|l| l.trim().strip_prefix("- name: "))
            .filter(|n| n.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            .map(str::to_owned)
            .collect();
        components.insert(dir.file_name().expect("name").to_string_lossy().into_owned(), vars);
    }
    components
}

#[test]
fn the_kustomize_cells_are_the_components_and_files_that_exist() {
    let rows = table();
    let components = components();
    for (component, vars) in &components {
        for var in vars {
            let row = setting_row(var);
            if LEFT_FOR_THE_RELEASE_WORK.contains(&row.as_str()) {
                continue;
            }
            let cell = cell(&rows, &row, KUSTOMIZE);
            assert!(
                says_yes(cell) && cell.contains(&format!("component `{component}`")),
                "{row}: set by component {component}: {cell}"
            );
        }
    }
    // Each cell naming a component names one that exists.
    for (feature, cells) in table() {
        if let Some((_, rest)) = cells[KUSTOMIZE].split_once("component `") {
            let name = rest.split('`').next().unwrap_or_default();
            assert!(components.contains_key(name), "{feature}: no component {name}");
        }
    }
    let doc = read("docs/install.md");
    for setting in settings() {
        let row = setting_row(&setting);
        let cell = cell(&rows, &row, KUSTOMIZE);
        if cell.contains("the env patch") {
            // The documented patch that sets any variable.
            assert!(
                doc.contains("is a patch in the same\nkustomization.yaml, one entry per variable under `env`"),
                "the env patch is documented"
            );
        }
    }
    assert!(read("deploy/legacy/kustomization.yaml").contains("../snapshots"));
    assert!(cell(&rows, "snapshots", KUSTOMIZE).contains("`deploy/snapshots`"));
    assert!(
        components.contains_key("several-disks") && cell(&rows, "several disks", KUSTOMIZE).contains("`several-disks`")
    );
    assert!(cell(&rows, "node-affinity keys", KUSTOMIZE) == cell(&rows, &setting_row("NODE_AFFINITY_KEYS"), KUSTOMIZE));
    // published capacity: the component brings the CSIDriver (what it renders is checked with
    // the doc's settings in tests/documented/components.rs).
    assert!(read("deploy/components/published-capacity/csidriver.yaml").contains("storageCapacity: true"));
    assert!(cell(&rows, "published capacity", KUSTOMIZE).contains("component `published-capacity`"));
    // quota: the component adds the capability to the container and to the SCC where there is one.
    assert!(cell(&rows, "quota", KUSTOMIZE).contains("component `quota`"));
    for base in ["deploy/legacy", "deploy/openshift"] {
        let objects = kustomize_with_component(base, "quota");
        let daemonset = objects.iter().find(|o| o["kind"] == "DaemonSet").expect("DaemonSet");
        let added = &daemonset["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"];
        assert!(added.as_array().is_some_and(|a| a.contains(&json!("SYS_ADMIN"))), "{base}: {added}");
        let scc = objects.iter().find(|o| {
            o["kind"] == "SecurityContextConstraints" && o["metadata"]["name"] == "kubevirt-hostpath-provisioner"
        });
        if base == "deploy/openshift" {
            let allowed = &scc.expect("the node pods' SCC")["allowedCapabilities"];
            assert!(allowed.as_array().is_some_and(|a| a.contains(&json!("SYS_ADMIN"))), "{allowed}");
        }
    }
    // block volumes: the component makes the container privileged with the host's /dev, and the
    // SCC allow it where there is one.
    assert!(cell(&rows, "block volumes", KUSTOMIZE).contains("component `block-volumes`"));
    for base in ["deploy/legacy", "deploy/openshift"] {
        let objects = kustomize_with_component(base, "block-volumes");
        let daemonset = objects.iter().find(|o| o["kind"] == "DaemonSet").expect("DaemonSet");
        let container = &daemonset["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["securityContext"]["privileged"], true, "{base}");
        let mounts = container["volumeMounts"].as_array().expect("mounts");
        assert!(mounts.iter().any(|m| m["mountPath"] == "/dev"), "{base}: {mounts:?}");
        if base == "deploy/openshift" {
            let scc = objects
                .iter()
                .find(|o| {
                    o["kind"] == "SecurityContextConstraints"
                        && o["metadata"]["name"] == "kubevirt-hostpath-provisioner"
                })
                .expect("the node pods' SCC");
            assert_eq!(scc["allowPrivilegedContainer"], true, "{scc}");
        }
    }
}

/// `kubectl kustomize` (the control plane's) of `base` with `component`, from a kustomization in
/// the checkout (kustomize takes relative paths only).
fn kustomize_with_component(base: &str, component: &str) -> Vec<Value> {
    let built = std::process::Command::new("bash")
        .arg("hack/build-control-plane.sh")
        .current_dir(repo())
        .output()
        .expect("build-control-plane.sh");
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    let bin = String::from_utf8_lossy(&built.stdout).lines().last().expect("the binaries' directory").trim().to_owned();
    let dir = tempfile::Builder::new().prefix(".table-").tempdir_in(repo()).expect("temp dir in the checkout");
    let name = dir.path().file_name().expect("name").to_string_lossy().into_owned();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!("resources: [../{base}, settings.yaml]\ncomponents: [../deploy/components/{component}]\n"),
    )
    .expect("kustomization");
    // The settings the components read (docs/install.md), kept out of the output.
    std::fs::write(
        dir.path().join("settings.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hostpath-provisioner-settings\n  \
         annotations: {config.kubernetes.io/local-config: \"true\"}\ndata: {BLOCK_DEVICE_DIR: /dev/hostpath-provisioner}\n",
    )
    .expect("settings");
    let output = std::process::Command::new(format!("{bin}/kubectl"))
        .args(["kustomize", &name])
        .current_dir(repo())
        .output()
        .expect("kubectl");
    assert!(output.status.success(), "{base} + {component}: {}", String::from_utf8_lossy(&output.stderr));
    serde_saphyr::from_multiple::<Value>(&String::from_utf8_lossy(&output.stdout))
        .expect("YAML")
        .into_iter()
        .filter(|d| d.is_object())
        .collect()
}

#[test]
fn the_resource_cells_are_the_crds_fields() {
    let rows = table();
    let crd = yaml("deploy/operator/crd.yaml");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    let by_env: BTreeMap<&str, &str> = CONFIG_FIELDS.iter().map(|(field, env)| (*env, *field)).collect();
    for setting in settings() {
        let row = setting_row(&setting);
        if LEFT_FOR_THE_RELEASE_WORK.contains(&row.as_str()) || INSTALL_SET.contains(&setting.as_str()) {
            continue;
        }
        let cell = cell(&rows, &row, RESOURCE);
        let field = match (setting.as_str(), by_env.get(setting.as_str())) {
            (_, Some(field)) => {
                assert!(spec["config"]["properties"].get(field).is_some(), "the CRD has no spec.config.{field}");
                Some(format!("`spec.config.{field}`"))
            }
            ("PV_DIR", _) => spec["pathConfig"]["properties"].get("path").map(|_| "`spec.pathConfig.path`".to_owned()),
            ("USE_NAMING_PREFIX", _) => spec["pathConfig"]["properties"]
                .get("useNamingPrefix")
                .map(|_| "`spec.pathConfig.useNamingPrefix`".to_owned()),
            ("STORAGE_POOLS", _) => spec.get("storagePools").map(|_| "`spec.storagePools`".to_owned()),
            _ => None,
        };
        match field {
            Some(field) => assert!(says_yes(cell) && cell.contains(&field), "{row}: {field}: {cell}"),
            None => assert!(
                cell.starts_with("no: ") && cell.contains("unknown field"),
                "{row}: the CRD has no field for it: {cell}"
            ),
        }
    }
    let pool = &spec["storagePools"]["items"]["properties"];
    for option in ["reserve", "accounting", "requireMountpoint"] {
        assert!(pool.get(option).is_some(), "storagePools[].{option}");
        assert!(cell(&rows, &setting_row("STORAGE_POOLS"), RESOURCE).contains(&format!("`{option}`")));
    }
    // One pool over several disks passes the CRD's rules.
    let disks: Spec =
        serde_json::from_value(json!({"storagePools": [{"name": "d", "path": "/d1"}, {"name": "d", "path": "/d2"}]}))
            .expect("spec");
    assert_eq!(broken_rules(&disks), Vec::<&str>::new());
    assert!(says_yes(cell(&rows, "several disks", RESOURCE)));
    assert!(
        spec["quota"]["properties"].get("enabled").is_some()
            && cell(&rows, "quota", RESOURCE).contains("`spec.quota.enabled`")
    );
    for field in ["publishCapacity", "provisionerName"] {
        assert!(cell(&rows, "published capacity", RESOURCE).contains(&format!("`spec.config.{field}`")));
    }
    assert!(cell(&rows, "node-affinity keys", RESOURCE) == cell(&rows, &setting_row("NODE_AFFINITY_KEYS"), RESOURCE));
    assert!(
        spec["config"]["properties"].get("blockVolumes").is_some()
            && cell(&rows, "block volumes", RESOURCE).contains("`spec.config.blockVolumes`")
    );
    assert!(read("deploy/operator/kustomization.yaml").contains("../snapshots"));
    assert!(cell(&rows, "snapshots", RESOURCE).contains("`deploy/snapshots`"));
    // Classes are the user's own objects on this path and kustomize's: the binary reads each
    // parameter it knows, whoever made the class.
    for parameter in KNOWN_PARAMETERS {
        for column in [KUSTOMIZE, RESOURCE] {
            assert!(says_yes(cell(&rows, &parameter_row(parameter), column)), "{parameter}");
        }
    }
}

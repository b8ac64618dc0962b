//! docs/install.md, "Optional features: kustomize components": a user's kustomization and
//! settings, as the doc writes them, listing every component of deploy/components next to
//! deploy/legacy; applied, then upgraded by the documented command once the next release's
//! deploy/ replaced the old, with each feature still on. And each component rendered alone with
//! deploy/legacy, its environment given to the binary, which must start with it. The claim
//! releaser's component adds a Deployment of its own (the only identity that may delete claims)
//! and leaves the node pods' DaemonSet and ClusterRole as they are.

use super::*;

const SECTION: &str = "Optional features: kustomize components";
const UPGRADE_SECTION: &str = "Upgrading with components";
/// The user's own directory, as the doc names it.
const USER_DIR: &str = "my-hostpath-provisioner";
/// The placeholder value the components write before their replacements set yours.
const UNSET: &str = "set-in-your-settings";
/// The variables the doc's settings give, with their values there.
const SETTINGS: [(&str, &str); 7] = [
    ("RELEASE_CLAIMS_OF_REMOVED_NODES", "24h"),
    ("NODE_AFFINITY_KEYS", "node-restriction.kubernetes.io/disk-serial"),
    ("STORAGE_POOLS", "data=/mnt/disk1,data=/mnt/disk2"),
    ("DISK_1", "/mnt/disk1"),
    ("DISK_2", "/mnt/disk2"),
    ("CAPACITY_PROVISIONER_NAME", "hostpath.example.org"),
    ("BLOCK_DEVICE_DIR", "/dev/hostpath-provisioner"),
];
/// Each component, with the settings it reads that become variables of its workload (the node
/// DaemonSet, or for release-claims-of-removed-nodes the claim releaser's Deployment).
const COMPONENTS: [(&str, &[&str]); 5] = [
    ("release-claims-of-removed-nodes", &["RELEASE_CLAIMS_OF_REMOVED_NODES"]),
    ("node-affinity-keys", &["NODE_AFFINITY_KEYS"]),
    ("several-disks", &["STORAGE_POOLS"]),
    ("published-capacity", &["CAPACITY_PROVISIONER_NAME"]),
    ("block-volumes", &["BLOCK_DEVICE_DIR"]),
];
/// published-capacity's class, of the second provisioner name.
const CAPACITY_CLASS: &str = "hostpath-provisioner-capacity-aware";
/// The component whose workload is a Deployment of its own, and that Deployment.
const RELEASER_COMPONENT: &str = "release-claims-of-removed-nodes";
const RELEASER: &str = "kubevirt-hostpath-provisioner-claim-releaser";
const RELEASER_DEPLOYMENT: [&str; 4] = ["deployment", RELEASER, "-n", "kubevirt-hostpath-provisioner"];
/// The component that makes the node container privileged, with the host's /dev mounted.
const BLOCK_COMPONENT: &str = "block-volumes";
/// The extra variable the doc's generic patch sets.
const PATCHED: (&str, &str) = ("ORPHAN_SNAPSHOT_COPY_GRACE", "24h");

/// The fenced yaml block under `section` of `file` whose first line starts with `first`, as
/// written (the user copies it whole).
fn yaml_block(file: &str, section: &str, first: &str) -> String {
    let text = std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut heading = "";
    // Inside a fence: whether it is yaml, and its lines so far.
    let mut fence: Option<(bool, Vec<&str>)> = None;
    let mut found = Vec::new();
    for line in text.lines() {
        let marker = line.trim_start().starts_with("```");
        match (&mut fence, marker) {
            (None, true) => fence = Some((line.trim_start().trim_start_matches('`').trim() == "yaml", Vec::new())),
            (None, false) => {
                if line.starts_with('#') {
                    heading = line.trim_start_matches('#').trim();
                }
            }
            (Some((yaml, lines)), true) => {
                if *yaml && heading == section && lines.first().is_some_and(|l| l.starts_with(first)) {
                    found.push(lines.join("\n") + "\n");
                }
                fence = None;
            }
            (Some((_, lines)), false) => lines.push(line),
        }
    }
    assert_eq!(found.len(), 1, "{file}, section {section:?}: one yaml block starting with {first:?}");
    found.remove(0)
}

/// The user's two files, as the doc writes them: the kustomization with the doc's generic
/// patch for a variable added to it, and the settings.
fn write_user_files(shell: &Shell) {
    let dir = shell.dir().join(USER_DIR);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let kustomization = yaml_block("docs/install.md", SECTION, &format!("# {USER_DIR}/kustomization.yaml"))
        + "\n"
        + &yaml_block("docs/install.md", SECTION, "patches:");
    std::fs::write(dir.join("kustomization.yaml"), kustomization).expect("write");
    let settings = yaml_block("docs/install.md", SECTION, &format!("# {USER_DIR}/settings.yaml"));
    std::fs::write(dir.join("settings.yaml"), settings).expect("write");
}

/// The doc's settings hold the values this test checks for.
fn assert_doc_settings(settings: &str) {
    for (key, value) in SETTINGS {
        assert!(settings.lines().any(|l| l.trim() == format!("{key}: {value}")), "{key}: {value} in\n{settings}");
    }
}

/// Whether `daemonset`'s node container runs privileged with the host's /dev mounted at /dev
/// (Block volumes), and otherwise keeps deploy/legacy's dropped capabilities: all or nothing.
fn block_privileged(daemonset: &Value) -> bool {
    let pod = &daemonset["spec"]["template"]["spec"];
    let container = container(daemonset);
    let context = &container["securityContext"];
    let dev_volume = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["hostPath"]["path"] == "/dev")
        .map(|v| v["name"].clone());
    let dev_mounted = container["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|m| m["mountPath"] == "/dev" && Some(&m["name"]) == dev_volume.as_ref());
    let privileged = context["privileged"] == true && context["allowPrivilegeEscalation"] == true;
    assert_eq!(privileged, dev_mounted, "privileged and /dev mounted go together: {daemonset}");
    assert_eq!(privileged, context["capabilities"].is_null(), "{context}");
    assert_eq!(context["readOnlyRootFilesystem"], true, "{context}");
    assert_eq!(env_value(container, "BLOCK_VOLUMES") == Some("true"), privileged, "{}", container["env"]);
    privileged
}

/// Every component's feature is on in the cluster, with the image of release `tag`.
fn assert_features_on(shell: &Shell, tag: &str) {
    let daemonset = shell.must_get(&LEGACY_DAEMONSET);
    let container = container(&daemonset);
    assert_eq!(container["image"], format!("{REGISTRY}/hostpath-provisioner:{tag}"));
    for (component, keys) in COMPONENTS {
        for key in keys {
            let value = SETTINGS.iter().find(|(k, _)| k == key).expect("a setting").1;
            let expected = (component != RELEASER_COMPONENT).then_some(value);
            assert_eq!(env_value(container, key), expected, "{key} in {}", container["env"]);
        }
    }
    assert_eq!(env_value(container, PATCHED.0), Some(PATCHED.1), "{}", container["env"]);
    // several-disks: each disk a hostPath volume, mounted at the same path.
    let volumes = daemonset["spec"]["template"]["spec"]["volumes"].as_array().expect("volumes");
    let mounts = container["volumeMounts"].as_array().expect("mounts");
    for disk in ["/mnt/disk1", "/mnt/disk2"] {
        let volume = volumes.iter().find(|v| v["hostPath"]["path"] == disk).unwrap_or_else(|| panic!("{disk}"));
        assert_eq!(volume["hostPath"]["type"], "Directory");
        let mount = mounts.iter().find(|m| m["name"] == volume["name"]).unwrap_or_else(|| panic!("{disk} mount"));
        assert_eq!(mount["mountPath"], disk);
    }
    // release-claims-of-removed-nodes: the claim releaser, with the release's image, alone
    // allowed to delete claims; the node pods never are.
    let releaser = shell.must_get(&RELEASER_DEPLOYMENT);
    let releaser_container = &releaser["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(releaser_container["image"], format!("{REGISTRY}/hostpath-provisioner:{tag}"));
    assert_eq!(env_value(releaser_container, "RELEASE_CLAIMS_OF_REMOVED_NODES"), Some("24h"));
    assert_eq!(releaser["spec"]["template"]["spec"]["serviceAccountName"], RELEASER);
    // published-capacity, listed after it, gives it the nodes' second name: its PVs count too.
    let second = SETTINGS.iter().find(|(k, _)| *k == "CAPACITY_PROVISIONER_NAME").expect("setting").1;
    assert_eq!(env_value(releaser_container, "CAPACITY_PROVISIONER_NAME"), Some(second));
    let role = shell.must_get(&["clusterrole", "kubevirt-hostpath-provisioner"]);
    assert!(!grants(&role, "persistentvolumeclaims", "delete"), "{role}");
    let releaser_role = shell.must_get(&["clusterrole", RELEASER]);
    assert!(grants(&releaser_role, "persistentvolumeclaims", "delete"), "{releaser_role}");
    assert!(!daemonset.to_string().contains(UNSET) && !releaser.to_string().contains(UNSET), "{daemonset}");
    // published-capacity: the nodes serve the second name beside the first, which stays; the
    // CSIDriver of that name turns the scheduler's check on for its class.
    let second = SETTINGS.iter().find(|(k, _)| *k == "CAPACITY_PROVISIONER_NAME").expect("setting").1;
    assert_eq!(env_value(container, "PUBLISH_CAPACITY"), Some("true"));
    assert_eq!(env_value(container, "PROVISIONER_NAME"), Some("kubevirt.io/hostpath-provisioner"));
    let driver = shell.must_get(&["csidriver", second]);
    assert_eq!(driver["spec"]["storageCapacity"], true, "{driver}");
    assert_eq!(shell.must_get(&["storageclass", CAPACITY_CLASS])["provisioner"], second);
    assert_eq!(
        shell.must_get(&["storageclass", "hostpath-provisioner"])["provisioner"],
        "kubevirt.io/hostpath-provisioner"
    );
    // block-volumes: BLOCK_VOLUMES, the privilege and the host's /dev (listed after quota, whose
    // capability it makes moot).
    assert!(block_privileged(&daemonset), "{daemonset}");
    // The settings are the build's, not an object of the cluster.
    assert!(
        shell.get(&["configmap", "hostpath-provisioner-settings", "-n", "kubevirt-hostpath-provisioner"]).is_none()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kustomize_components_install_and_upgrade_as_written() {
    let docs = Docs::load();
    let mut shell = Shell::with_cluster("the_kustomize_components_install_and_upgrade_as_written").await;
    write_user_files(&shell);
    assert_doc_settings(&shell.read(&format!("{USER_DIR}/settings.yaml")));

    let rendered = shell.run(&docs.command("docs/install.md", SECTION, "kubectl kustomize my-hostpath-provisioner"));
    assert!(rendered.contains("RELEASE_CLAIMS_OF_REMOVED_NODES") && !rendered.contains(UNSET), "{rendered}");
    assert!(!rendered.contains("hostpath-provisioner-settings"), "the settings are not rendered:\n{rendered}");
    let out = shell.run(&docs.command("docs/install.md", SECTION, "kubectl apply -k my-hostpath-provisioner"));
    assert!(out.lines().all(|l| l.ends_with(" created")), "{out}");
    assert_features_on(&shell, "0.1.0");

    // The next release: its deploy/ in place of the old (here the same files under a new tag),
    // the user's directory untouched.
    std::fs::remove_dir_all(shell.dir().join("deploy")).expect("remove the old release");
    copy_tree(&repo().join("deploy"), &shell.dir().join("deploy"));
    shell.edit("deploy/legacy/kustomization.yaml", "newTag: \"0.1.0\"", "newTag: \"0.2.0\"");
    shell.edit(
        &format!("deploy/components/{RELEASER_COMPONENT}/kustomization.yaml"),
        "newTag: \"0.1.0\"",
        "newTag: \"0.2.0\"",
    );
    let out = shell.run(&docs.command("docs/install.md", UPGRADE_SECTION, "kubectl apply -k my-hostpath-provisioner"));
    assert!(out.contains("daemonset.apps/kubevirt-hostpath-provisioner configured"), "{out}");
    assert_features_on(&shell, "0.2.0");

    // What the doc warns of: deploy/legacy alone takes the components' additions to the
    // DaemonSet away (so the checks above would see a lost feature).
    shell.kubectl(&["apply", "-k", "deploy/legacy"]);
    let daemonset = shell.must_get(&LEGACY_DAEMONSET);
    assert_eq!(env_value(container(&daemonset), "NODE_AFFINITY_KEYS"), None);
    assert!(!block_privileged(&daemonset), "deploy/legacy alone is unprivileged again");
    shell.finish();
}

/// Renders `USER_DIR`-like directory `dir` of the checkout with bash's kubectl (no documented
/// step); the objects, or the error.
fn render(shell: &Shell, dir: &str) -> Result<Vec<Value>, String> {
    let ran = shell.bash(&format!("kubectl kustomize {dir}"));
    if !ran.success {
        return Err(ran.stderr);
    }
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&ran.stdout).unwrap_or_else(|e| panic!("{e}:\n{}", ran.stdout));
    Ok(documents)
}

/// A kustomization of deploy/legacy with one component and `settings`, in `dir` of the checkout.
fn write_one_component(shell: &Shell, dir: &str, component: &str, settings: &str) {
    let path = shell.dir().join(dir);
    std::fs::create_dir_all(&path).expect("mkdir");
    let kustomization = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../deploy/legacy\n  - settings.yaml\ncomponents:\n  - ../deploy/components/{component}\n"
    );
    std::fs::write(path.join("kustomization.yaml"), kustomization).expect("write");
    std::fs::write(path.join("settings.yaml"), settings).expect("write");
}

/// The environment the binary gets from the rendered DaemonSet, with what the downward API
/// would give.
fn rendered_env(objects: &[Value]) -> Vec<(String, String)> {
    let daemonset = objects.iter().find(|o| o["kind"] == "DaemonSet").expect("a DaemonSet");
    let env = container(daemonset)["env"].as_array().expect("env");
    let mut vars: Vec<(String, String)> =
        env.iter().filter_map(|e| Some((e["name"].as_str()?.to_owned(), e["value"].as_str()?.to_owned()))).collect();
    vars.extend([("NODE_NAME".into(), "node-1".into()), ("POD_NAMESPACE".into(), "hpp".into())]);
    vars
}

/// The environment of `component`'s workload: the claim releaser's Deployment for its
/// component, else the node DaemonSet's (with what the downward API would give).
fn workload_env(objects: &[Value], component: &str) -> Vec<(String, String)> {
    if component != RELEASER_COMPONENT {
        return rendered_env(objects);
    }
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == RELEASER)
        .expect("the claim releaser's Deployment");
    let env = container(deployment)["env"].as_array().expect("env");
    env.iter().filter_map(|e| Some((e["name"].as_str()?.to_owned(), e["value"].as_str()?.to_owned()))).collect()
}

/// Starts the binary with `vars` alone, as `component`'s workload runs it (the releaser with its
/// subcommand): exit code 2 and the message for a configuration it refuses; for one it accepts,
/// the failure to find a cluster (no kubeconfig), so nothing runs.
fn workload_verdict(component: &str, vars: &[(String, String)]) -> (Option<i32>, String) {
    let subcommand = (component == RELEASER_COMPONENT).then_some("release-claims-of-removed-nodes");
    let output = Command::new(env!("CARGO_BIN_EXE_hostpath-provisioner"))
        .args(subcommand)
        .env_clear()
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .env("KUBECONFIG", "/nonexistent/hostpath-provisioner-test-kubeconfig")
        .output()
        .expect("run the provisioner");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn each_kustomize_component_renders_with_deploy_legacy_and_the_binary_starts_with_its_env() {
    let shell = Shell::without_cluster(
        "each_kustomize_component_renders_with_deploy_legacy_and_the_binary_starts_with_its_env",
    );
    let settings = yaml_block("docs/install.md", SECTION, &format!("# {USER_DIR}/settings.yaml"));
    assert_doc_settings(&settings);
    let all_keys: Vec<&str> = COMPONENTS.iter().flat_map(|(_, keys)| keys.iter().copied()).collect();
    for (component, keys) in COMPONENTS {
        let dir = format!("only-{component}");
        write_one_component(&shell, &dir, component, &settings);
        let objects = render(&shell, &dir).unwrap_or_else(|e| panic!("{component}: {e}"));
        let vars = workload_env(&objects, component);
        let daemonset_vars = workload_env(&objects, "");
        for key in &all_keys {
            // Empty is unset to the binary (the releaser's file carries CAPACITY_PROVISIONER_NAME
            // empty until published-capacity sets it).
            let value = vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str()).filter(|v| !v.is_empty());
            let expected = keys.contains(key).then(|| SETTINGS.iter().find(|(k, _)| k == key).expect("setting").1);
            assert_eq!(value, expected, "{component}: {key}");
        }
        assert!(
            !daemonset_vars.iter().any(|(k, _)| k == "RELEASE_CLAIMS_OF_REMOVED_NODES"),
            "{component}: the node pods never get it"
        );
        assert!(!objects.iter().any(|o| o["metadata"]["name"] == "hostpath-provisioner-settings"), "{component}");
        for role in objects.iter().filter(|o| o["kind"] == "ClusterRole") {
            assert_eq!(
                grants(role, "persistentvolumeclaims", "delete"),
                role["metadata"]["name"] == RELEASER,
                "{component}: only the releaser's role may delete claims: {role}"
            );
        }
        let daemonset = objects.iter().find(|o| o["kind"] == "DaemonSet").expect("a DaemonSet");
        assert_eq!(block_privileged(daemonset), component == BLOCK_COMPONENT, "{component}: privileged");
        let releasers = objects.iter().filter(|o| o["metadata"]["name"] == RELEASER && o["kind"] == "Deployment");
        assert_eq!(releasers.count(), usize::from(component == RELEASER_COMPONENT), "{component}");
        let (code, said) = workload_verdict(component, &vars);
        assert!(code != CONFIGURATION_ERROR && said.contains("KUBECONFIG"), "{component}: {code:?} {said}");

        // A value the binary refuses, given in the settings, reaches it: it exits 2 naming it.
        let key = keys[0];
        let broken = settings.replace(
            &format!("{key}: {}", SETTINGS.iter().find(|(k, _)| *k == key).expect("setting").1),
            &format!("{key}: \"{REFUSED}\""),
        );
        let dir = format!("broken-{component}");
        write_one_component(&shell, &dir, component, &broken);
        let (code, said) =
            workload_verdict(component, &workload_env(&render(&shell, &dir).expect("renders"), component));
        assert!(code == CONFIGURATION_ERROR && said.contains(key), "{component} with {key}={REFUSED}: {code:?} {said}");

        // A setting left out fails the build, naming it.
        let dir = format!("unset-{component}");
        let missing: String = settings
            .lines()
            .filter(|l| !l.trim_start().starts_with(&format!("{key}:")))
            .map(|l| format!("{l}\n"))
            .collect();
        write_one_component(&shell, &dir, component, &missing);
        let error = render(&shell, &dir).expect_err("a missing setting fails the build");
        assert!(error.contains(&format!("data.{key}")), "{component}: {error}");
    }
}

/// A value no setting of the components accepts: no duration, label key or pool.
const REFUSED: &str = "not valid!";
/// The binary's exit code for a configuration it refuses.
const CONFIGURATION_ERROR: Option<i32> = Some(2);

#[test]
fn over_the_node_groups_two_components_and_the_patch_set_every_groups_daemonset_and_several_disks_is_refused() {
    let shell = Shell::without_cluster(
        "over_the_node_groups_two_components_and_the_patch_set_every_groups_daemonset_and_several_disks_is_refused",
    );
    let settings = yaml_block("docs/install.md", SECTION, &format!("# {USER_DIR}/settings.yaml"));
    let kustomization = yaml_block("docs/install.md", SECTION, &format!("# {USER_DIR}/kustomization.yaml"))
        + "\n"
        + &yaml_block("docs/install.md", SECTION, "patches:");
    // "list ../deploy/node-groups in place of ../deploy/legacy".
    assert!(kustomization.contains("  - ../deploy/legacy\n"), "{kustomization}");
    let groups = kustomization.replace("../deploy/legacy", "../deploy/node-groups");
    let several_disks = "  - ../deploy/components/several-disks\n";
    assert!(groups.contains(several_disks), "{groups}");
    for (dir, kustomization) in [("groups", groups.replace(several_disks, "")), ("groups-disks", groups.clone())] {
        let path = shell.dir().join(dir);
        std::fs::create_dir_all(&path).expect("mkdir");
        std::fs::write(path.join("kustomization.yaml"), kustomization).expect("write");
        std::fs::write(path.join("settings.yaml"), &settings).expect("write");
    }
    let objects = render(&shell, "groups").unwrap_or_else(|e| panic!("{e}"));
    let daemonsets: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "DaemonSet").collect();
    assert_eq!(daemonsets.len(), 2, "the two groups of deploy/node-groups");
    for daemonset in daemonsets {
        let name = daemonset["metadata"]["name"].as_str().expect("name");
        let value = SETTINGS.iter().find(|(k, _)| *k == "NODE_AFFINITY_KEYS").expect("setting").1;
        assert_eq!(env_value(container(daemonset), "NODE_AFFINITY_KEYS"), Some(value), "{name}");
        assert_eq!(env_value(container(daemonset), "RELEASE_CLAIMS_OF_REMOVED_NODES"), None, "{name}");
        assert_eq!(env_value(container(daemonset), PATCHED.0), Some(PATCHED.1), "{name}: the doc's patch");
        assert!(!daemonset.to_string().contains(UNSET), "{daemonset}");
        assert!(block_privileged(daemonset), "{name}: block-volumes");
    }
    // One claim releaser for all the groups, in their namespace, with their image.
    let releasers: Vec<&Value> =
        objects.iter().filter(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == RELEASER).collect();
    assert_eq!(releasers.len(), 1, "one claim releaser");
    assert_eq!(env_value(container(releasers[0]), "RELEASE_CLAIMS_OF_REMOVED_NODES"), Some("24h"));
    assert_eq!(container(releasers[0])["image"], container(daemonsets_image_source(&objects))["image"]);
    let error = render(&shell, "groups-disks").expect_err("several-disks over the node groups");
    assert!(error.contains("multiple matches"), "{error}");
}

/// The node DaemonSet whose image the releaser's must be.
fn daemonsets_image_source(objects: &[Value]) -> &Value {
    objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet" && o["metadata"]["name"] == "kubevirt-hostpath-provisioner")
        .expect("deploy/legacy's DaemonSet")
}

/// The claim releaser's component names the node pods' image exactly as deploy/legacy does (a
/// release changes both), so that the user's own `images:` entry sets the registry on both.
#[test]
fn the_claim_releasers_image_is_deploy_legacys() {
    let images = |file: &str| -> Value {
        let text = std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let kustomization: Value = serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        kustomization["images"].clone()
    };
    let legacy = images("deploy/legacy/kustomization.yaml");
    assert!(legacy.as_array().is_some_and(|l| !l.is_empty()), "{legacy}");
    assert_eq!(images(&format!("deploy/components/{RELEASER_COMPONENT}/kustomization.yaml")), legacy);
}

//! End-to-end: the documented commands that install, upgrade, migrate, roll back or remove, run
//! exactly as README.md and docs/ write them, the way a user runs them: each test reads its
//! commands from the docs (testbed::documented_commands), runs them with bash in a copy of the
//! repository's deploy files against a real control plane, and checks what the API server shows.
//! tests/documented_commands.txt is the ledger: every such command of the docs, with the tests
//! that run it or why none can here (docs/development.md, "Documented commands").
//!
//! Each test has a control plane of its own, one at a time: the installs create the same
//! cluster-wide objects, and users run them on a cluster of their own. It runs the DaemonSet
//! controller, so `kubectl rollout status` answers; without nodes there is nothing to schedule,
//! and a rollout is complete once the controller has seen the DaemonSet.

#[path = "documented/block_volumes.rs"]
mod block_volumes;
#[path = "documented/components.rs"]
mod components;
#[path = "documented/kubevirt_operator.rs"]
mod kubevirt_operator;
#[path = "documented/registry.rs"]
mod registry;
#[path = "documented/snapshot_recreation.rs"]
mod snapshot_recreation;
#[path = "documented/tenant_roles.rs"]
mod tenant_roles;
#[path = "documented/upgrading.rs"]
mod upgrading;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testbed::documented_commands::{self, DocumentedCommand, changes_an_install};
use testbed::{ControlPlane, DeployTool, Options, deploy_tool};

/// The placeholders the docs write in commands, and what each stands for. A test replaces
/// these and nothing else.
const PLACEHOLDERS: &[(&str, &str)] = &[
    ("image.registry=...", "the registry the image was pushed to (docs/install.md, step 2)"),
    ("<name>", "the name of the object the step acts on"),
    ("NAME", "the same, in capitals"),
    ("NAMESPACE", "the namespace of that object"),
    ("COPY-UID", "the snapshot copy a refusal names (docs/snapshots.md, \"Snapshots made again\")"),
];
/// The registry the docs' examples push to.
const REGISTRY: &str = "registry.example.com";
/// The registry placeholder of the deploy files and the chart (README, "Install").
const PLACEHOLDER_REGISTRY: &str = "your-registry.invalid";
/// How long one command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(240);
const WAIT: Duration = Duration::from_secs(90);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The commands of README.md and docs/*.md.
struct Docs(Vec<DocumentedCommand>);

impl Docs {
    fn load() -> Docs {
        Docs(documented_commands::documented_commands(&repo()).unwrap_or_else(|e| panic!("{e:#}")))
    }

    /// The command of `file`, under the heading `section`, that starts with `start` (written
    /// once, or the same text more than once).
    fn command(&self, file: &str, section: &str, start: &str) -> DocumentedCommand {
        let in_section: Vec<&DocumentedCommand> =
            self.0.iter().filter(|c| c.file == file && c.section == section).collect();
        let found: Vec<&&DocumentedCommand> = in_section.iter().filter(|c| c.text.starts_with(start)).collect();
        let texts: BTreeSet<&str> = found.iter().map(|c| c.text.as_str()).collect();
        match (found.first(), texts.len()) {
            (Some(command), 1) => (**command).clone(),
            (None, _) => panic!(
                "{file}, section {section:?}: no command starts with {start:?}; its commands: {:#?}",
                in_section.iter().map(|c| &c.text).collect::<Vec<_>>()
            ),
            _ => panic!("{file}, section {section:?}: several commands start with {start:?}: {texts:#?}"),
        }
    }
}

/// What a command left: its exit, stdout and stderr.
struct Ran {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Only one of this binary's control planes at a time.
static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

struct Cluster {
    cp: ControlPlane,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

/// A user's shell: bash in a checkout of the deploy files (a copy, so edits and rendered files
/// stay out of the repository), with the harness's kubectl and helm first on PATH and its
/// control plane as the kubeconfig.
struct Shell {
    test: &'static str,
    checkout: tempfile::TempDir,
    cluster: Option<Cluster>,
    /// The documented commands run, as the docs write them.
    ran: Vec<String>,
    /// Set by [`Shell::through_registry`]: commands reach the docs' example registry.
    registry: Option<(PathBuf, PathBuf)>,
}

impl Shell {
    /// A shell against a control plane of its own, running the DaemonSet controller.
    async fn with_cluster(test: &'static str) -> Shell {
        Shell::with_controllers(test, &["daemonset"]).await
    }

    /// A cluster whose controller manager also runs `controllers`, appended to the harness's
    /// list (the flag adds to it when repeated) under the names every supported release knows.
    async fn with_controllers(test: &'static str, controllers: &[&str]) -> Shell {
        let turn = ONE_CLUSTER_AT_A_TIME.lock().await;
        let options = Options {
            extra_controller_manager_args: controllers.iter().map(|c| format!("--controllers={c}")).collect(),
            ..Options::default()
        };
        let cp = ControlPlane::start_with(options).await.unwrap_or_else(|e| panic!("{e:#}"));
        let kubectl = cp.kubectl();
        Shell::new(test, &kubectl, Some(Cluster { cp, _turn: turn }))
    }

    /// A shell without a cluster, for commands that only build or render.
    fn without_cluster(test: &'static str) -> Shell {
        let script = repo().join("hack/build-control-plane.sh");
        let out = Command::new("bash").arg(&script).stderr(Stdio::inherit()).output().expect("build-control-plane.sh");
        assert!(out.status.success(), "{} failed", script.display());
        let bin_dir = String::from_utf8_lossy(&out.stdout).lines().last().expect("bin dir").trim().to_owned();
        Shell::new(test, &Path::new(&bin_dir).join("kubectl"), None)
    }

    fn new(test: &'static str, kubectl: &Path, cluster: Option<Cluster>) -> Shell {
        let checkout = tempfile::Builder::new()
            .prefix("documented-commands-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .expect("temp dir");
        for item in ["deploy", "hack", "Makefile"] {
            copy_tree(&repo().join(item), &checkout.path().join(item));
        }
        let bin = checkout.path().join(".tools");
        std::fs::create_dir_all(&bin).expect("tools dir");
        let helm = deploy_tool(DeployTool::Helm).unwrap_or_else(|e| panic!("{e:#}"));
        std::os::unix::fs::symlink(helm, bin.join("helm")).expect("link helm");
        std::os::unix::fs::symlink(kubectl, bin.join("kubectl")).expect("link kubectl");
        Shell { test, checkout, cluster, ran: Vec::new(), registry: None }
    }

    fn dir(&self) -> &Path {
        self.checkout.path()
    }

    fn cp(&self) -> &ControlPlane {
        &self.cluster.as_ref().expect("this shell has a cluster").cp
    }

    /// Runs `text` with bash in the checkout, as a user would type it.
    fn bash(&self, text: &str) -> Ran {
        let tools = self.dir().join(".tools");
        let path = format!("{}:{}", tools.display(), std::env::var("PATH").unwrap_or_default());
        let (stdout_file, stderr_file) = (self.dir().join(".stdout"), self.dir().join(".stderr"));
        let mut command = Command::new("bash");
        match &self.registry {
            // In a mount namespace of its own whose /etc/hosts resolves the docs' registry name
            // to the test's registry; its CA trusted through SSL_CERT_FILE (skopeo and helm).
            Some((hosts, trust)) => command
                .args(["-c", r#"exec unshare --mount --propagation private -- bash -c 'mount --bind "$HPP_HOSTS" /etc/hosts && exec bash -c "$HPP_COMMAND"'"#])
                .env("HPP_HOSTS", hosts)
                .env("HPP_COMMAND", text)
                .env("SSL_CERT_FILE", trust),
            None => command.arg("-c").arg(text),
        };
        command
            .current_dir(self.dir())
            .env("PATH", path)
            // helm's and kubectl's caches and settings in the checkout, not the user's home.
            .env("HELM_CACHE_HOME", self.dir().join(".helm/cache"))
            .env("HELM_CONFIG_HOME", self.dir().join(".helm/config"))
            .env("HELM_DATA_HOME", self.dir().join(".helm/data"))
            .env("KUBECACHEDIR", self.dir().join(".kube-cache"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout_file).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr_file).expect("stderr file"));
        match &self.cluster {
            Some(cluster) => command.env("KUBECONFIG", cluster.cp.kubeconfig_path()),
            None => command.env_remove("KUBECONFIG"),
        };
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn().expect("start bash");
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for bash") {
                break Some(status);
            }
            if Instant::now() > deadline {
                // SAFETY: kill(2) of the process group our own child leads.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
        let mut stderr = read(&stderr_file);
        if status.is_none() {
            stderr.push_str(&format!("\n(killed after {COMMAND_TIMEOUT:?})"));
        }
        Ran { success: status.is_some_and(|s| s.success()), stdout: read(&stdout_file), stderr }
    }

    /// Runs a documented command as written, placeholders replaced by `values`; fails the test
    /// when it fails. Returns its stdout.
    fn run_with(&mut self, command: &DocumentedCommand, values: &[(&str, &str)]) -> String {
        let text = substitute(&command.text, values);
        let ran = self.bash(&text);
        assert!(ran.success, "`{text}` ({}) failed:\n{}\n{}", command.location(), ran.stdout, ran.stderr);
        self.ran.push(command.text.clone());
        ran.stdout
    }

    /// From now on, commands reach `registry` under the docs' example name.
    fn through_registry(&mut self, registry: &testbed::registry::Registry) {
        self.registry = Some((registry.hosts_file(), registry.trust_bundle()));
    }

    fn run(&mut self, command: &DocumentedCommand) -> String {
        self.run_with(command, &[])
    }

    /// Runs a documented command that must fail here (the doc says so); returns its stderr.
    fn run_expecting_failure(&mut self, command: &DocumentedCommand) -> String {
        let ran = self.bash(&command.text);
        assert!(!ran.success, "`{}` ({}) succeeded:\n{}", command.text, command.location(), ran.stdout);
        self.ran.push(command.text.clone());
        ran.stderr
    }

    /// A user's edit of a file of the checkout, as a doc step describes it.
    fn edit(&self, file: &str, from: &str, to: &str) {
        let path = self.dir().join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(text.contains(from), "{file} has no {from:?}");
        std::fs::write(&path, text.replace(from, to)).expect("write");
    }

    /// A stand-in for another project's file, into the checkout's top directory.
    fn copy_in(&self, name: &str) {
        std::fs::copy(repo().join(STAND_INS).join(name), self.dir().join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
    }

    /// Step 2 of docs/install.md for kustomize: the `images:` entry names your registry.
    fn set_image_in_kustomization(&self, kustomization: &str) {
        self.edit(kustomization, &format!("newName: {PLACEHOLDER_REGISTRY}/"), &format!("newName: {REGISTRY}/"));
    }

    /// The harness's own kubectl (setting up and checking, not a documented step).
    fn kubectl(&self, args: &[&str]) -> String {
        self.cp().run_kubectl(self.dir(), args).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// An object as JSON (`["daemonset", "x", "-n", "ns"]`), or None when there is none.
    fn get(&self, what: &[&str]) -> Option<Value> {
        let mut args = vec!["get"];
        args.extend_from_slice(what);
        args.extend(["-o", "json", "--ignore-not-found"]);
        let out = self.kubectl(&args);
        (!out.trim().is_empty()).then(|| serde_json::from_str(&out).unwrap_or_else(|e| panic!("{what:?}: {e}")))
    }

    fn must_get(&self, what: &[&str]) -> Value {
        self.get(what).unwrap_or_else(|| panic!("{what:?} does not exist"))
    }

    async fn wait_gone(&self, what: &[&str]) {
        testbed::wait_for(&format!("{what:?} gone"), WAIT, || async {
            anyhow::Ok(self.get(what).is_none().then_some(()))
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// The CRDs of kinds OpenShift or the Prometheus Operator serve, which the OpenShift and
    /// monitoring steps need (their docs say so).
    fn install_crds(&self) {
        let dir = deploy_tool(DeployTool::Crds).unwrap_or_else(|e| panic!("{e:#}"));
        let dir = dir.to_str().expect("utf-8 path");
        self.kubectl(&["apply", "--server-side", "-f", dir]);
        self.kubectl(&["wait", "--for", "condition=Established", "--timeout=90s", "-f", dir]);
    }

    /// The ledger names this test for exactly the classified commands it ran.
    fn finish(self) {
        let ledger = documented_commands::read_ledger(&repo()).unwrap_or_else(|e| panic!("{e:#}"));
        let claimed = ledger.run_by(self.test);
        let ran: BTreeSet<&str> = self.ran.iter().map(String::as_str).filter(|c| changes_an_install(c)).collect();
        let unlisted: Vec<&&str> = ran.difference(&claimed).collect();
        let not_run: Vec<&&str> = claimed.difference(&ran).collect();
        assert!(
            unlisted.is_empty() && not_run.is_empty(),
            "{}: run here but without `run by: {}` in the ledger: {unlisted:#?}\nin the ledger as run by {} but not run: {not_run:#?}",
            documented_commands::LEDGER_PATH,
            self.test,
            self.test
        );
    }
}

fn copy_tree(from: &Path, to: &Path) {
    if from.is_dir() {
        std::fs::create_dir_all(to).expect("mkdir");
        for entry in std::fs::read_dir(from).expect("read dir") {
            let entry = entry.expect("entry");
            copy_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else {
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    }
}

/// `command` with documented placeholders replaced; any other replacement fails the test.
fn substitute(command: &str, values: &[(&str, &str)]) -> String {
    let mut text = command.to_owned();
    for (placeholder, value) in values {
        assert!(
            PLACEHOLDERS.iter().any(|(p, _)| p == placeholder),
            "{placeholder:?} is not a documented placeholder ({PLACEHOLDERS:?})"
        );
        let replaced = replace_word(&text, placeholder, value);
        assert!(replaced != text, "`{command}` has no {placeholder:?}");
        text = replaced;
    }
    text
}

/// `text` with each `word` that stands alone (not inside a longer name) replaced.
fn replace_word(text: &str, word: &str, value: &str) -> String {
    let is_name = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find(word) {
        let before = rest[..at].chars().next_back();
        let after = rest[at + word.len()..].chars().next();
        let alone = before.is_none_or(|c| !is_name(c)) && after.is_none_or(|c| !is_name(c));
        out.push_str(&rest[..at]);
        out.push_str(if alone { value } else { word });
        rest = &rest[at + word.len()..];
    }
    out.push_str(rest);
    out
}

/// The first container of a DaemonSet's pod template.
fn container(daemonset: &Value) -> &Value {
    &daemonset["spec"]["template"]["spec"]["containers"][0]
}

fn env_value<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"].as_array()?.iter().find(|e| e["name"] == name)?["value"].as_str()
}

/// The ledger and the docs agree, and every test the ledger names exists.
#[test]
fn every_documented_install_command_is_in_the_ledger_with_a_test_or_a_reason() {
    let commands = documented_commands::documented_commands(&repo()).unwrap_or_else(|e| panic!("{e:#}"));
    let ledger = documented_commands::read_ledger(&repo()).unwrap_or_else(|e| panic!("{e:#}"));
    let tests = documented_commands::test_functions_under(&repo().join("tests")).unwrap_or_else(|e| panic!("{e:#}"));
    // The docs do have such commands: an extraction that finds none would pass vacuously.
    assert!(commands.iter().filter(|c| changes_an_install(&c.text)).count() >= 20, "{commands:#?}");
    let problems = documented_commands::ledger_problems(&commands, &ledger, &tests);
    assert!(problems.is_empty(), "docs/development.md, \"Documented commands\":\n{}", problems.join("\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_install_tables_helm_command_installs_the_chart_with_your_registry() {
    let docs = Docs::load();
    let mut shell = Shell::with_cluster("the_install_tables_helm_command_installs_the_chart_with_your_registry").await;
    let install = docs.command("README.md", "Install", "helm install");
    // The same row of docs/install.md's table.
    assert_eq!(install.text, docs.command("docs/install.md", "Installing hostpath-provisioner", "helm install").text);
    let out = shell.run_with(&install, &[("image.registry=...", &format!("image.registry={REGISTRY}"))]);
    assert!(out.contains("STATUS: deployed"), "{out}");

    let daemonset = shell.must_get(&["daemonset", "hostpath-provisioner", "-n", "hostpath-provisioner"]);
    assert_eq!(container(&daemonset)["image"], format!("{REGISTRY}/hostpath-provisioner:0.1.0"));
    let class = shell.must_get(&["storageclass", "hostpath-provisioner"]);
    assert_eq!(class["volumeBindingMode"], "WaitForFirstConsumer");
    assert_eq!(class["provisioner"], "kubevirt.io/hostpath-provisioner");
    shell.finish();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_helm_steps_install_roll_out_and_label_the_namespace() {
    let docs = Docs::load();
    let mut shell = Shell::with_controllers(
        "the_helm_steps_install_roll_out_and_label_the_namespace",
        tenant_roles::AGGREGATING_CONTROLLERS,
    )
    .await;
    let section = "3a. Helm";
    let out = shell.run(&docs.command("docs/install.md", section, "helm install"));
    assert!(out.contains("STATUS: deployed"), "{out}");
    let daemonset = shell.must_get(&["daemonset", "hostpath-provisioner", "-n", "hostpath-provisioner"]);
    assert_eq!(container(&daemonset)["image"], format!("{REGISTRY}/hostpath-provisioner:0.1.0"));
    assert_eq!(daemonset["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm");

    let out = shell.run(&docs.command("docs/install.md", section, "kubectl -n hostpath-provisioner rollout status"));
    assert!(out.contains("successfully rolled out"), "{out}");

    // Pod Security: the namespace the chart's pods run in is labelled privileged.
    shell.run(&docs.command("docs/install.md", section, "kubectl label namespace"));
    let namespace = shell.must_get(&["namespace", "hostpath-provisioner"]);
    assert_eq!(namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged");
    tenant_roles::tenants_take_snapshots_with_the_built_in_roles(&mut shell, &docs).await;
    shell.finish();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_one_file_install_runs_as_written_with_your_image() {
    let docs = Docs::load();
    let mut shell = Shell::with_cluster("the_one_file_install_runs_as_written_with_your_image").await;
    // The checked-in file is a header comment and the rendered objects.
    let checked_in = shell.read("deploy/install.yaml");
    let objects = checked_in.lines().skip_while(|l| l.starts_with('#')).map(|l| format!("{l}\n")).collect::<String>();

    // "deploy/install.yaml is `kubectl kustomize deploy/legacy`".
    let rendered = shell.run(&docs.command("docs/install.md", "3b. One file", "kubectl kustomize deploy/legacy"));
    assert_eq!(rendered, objects, "deploy/install.yaml is not what kubectl kustomize deploy/legacy renders");

    // Step 2 the second way: the registry in the kustomization, the file rendered from it. The
    // hand edit of the image line (the first way) gives the same objects.
    shell.set_image_in_kustomization("deploy/legacy/kustomization.yaml");
    let section = "2. Set the image: the registry placeholder";
    let render = docs.command("docs/install.md", section, "kubectl kustomize deploy/legacy >");
    shell.run(&render);
    let applied = shell.read("deploy/install.yaml");
    let image = applied.lines().find(|l| l.trim_start().starts_with("image:")).unwrap_or_default().to_owned();
    assert!(
        applied == objects.replace(&format!("image: {PLACEHOLDER_REGISTRY}/"), &format!("image: {REGISTRY}/")),
        "after `{}`, the file the next step applies is not the hand-edited one (its {})",
        render.text,
        image.trim()
    );

    let created = shell.run(&docs.command("docs/install.md", "3b. One file", "kubectl apply -f deploy/install.yaml"));
    let documents = objects.split("\n---").filter(|doc| doc.lines().any(|l| l.starts_with("kind:"))).count();
    assert_eq!(created.lines().count(), documents, "{created}");
    assert!(created.lines().all(|l| l.ends_with(" created")), "{created}");
    let daemonset =
        shell.must_get(&["daemonset", "kubevirt-hostpath-provisioner", "-n", "kubevirt-hostpath-provisioner"]);
    assert_eq!(container(&daemonset)["image"], format!("{REGISTRY}/hostpath-provisioner:0.1.0"));
    for class in ["hostpath-provisioner", "hostpath-provisioner-immediate"] {
        shell.must_get(&["storageclass", class]);
    }
    let out =
        shell.run(&docs.command("docs/install.md", "3b. One file", "kubectl -n kubevirt-hostpath-provisioner rollout"));
    assert!(out.contains("successfully rolled out"), "{out}");

    // The claim releaser, turned on as the one file's users are told: the component's objects
    // with the DaemonSet's image and the duration; its account alone may delete claims.
    let section = "The claim releaser with the one file";
    let created = shell.run(&docs.command("docs/install.md", section, "sed -e "));
    assert_eq!(created.lines().filter(|l| l.ends_with(" created")).count(), 4, "{created}");
    let releaser =
        ["deployment", "kubevirt-hostpath-provisioner-claim-releaser", "-n", "kubevirt-hostpath-provisioner"];
    let deployment = shell.must_get(&releaser);
    let releaser_container = container(&deployment);
    assert_eq!(releaser_container["image"], format!("{REGISTRY}/hostpath-provisioner:0.1.0"));
    assert_eq!(env_value(releaser_container, "RELEASE_CLAIMS_OF_REMOVED_NODES"), Some("24h"), "{releaser_container}");
    let may_delete_claims = |shell: &Shell, account: &str| {
        let asked = format!(
            "kubectl auth can-i delete persistentvolumeclaims -A --as=system:serviceaccount:kubevirt-hostpath-provisioner:{account}"
        );
        shell.bash(&asked).stdout.trim() == "yes"
    };
    assert!(
        may_delete_claims(&shell, "kubevirt-hostpath-provisioner-claim-releaser"),
        "the releaser may delete claims"
    );
    assert!(!may_delete_claims(&shell, "kubevirt-hostpath-provisioner-admin"), "the node pods may not");
    shell.run(&docs.command("docs/install.md", section, "kubectl delete -f"));
    shell.wait_gone(&releaser).await;
    assert!(!may_delete_claims(&shell, "kubevirt-hostpath-provisioner-claim-releaser"), "its rights go with it");
    shell.finish();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_kustomize_installs_and_their_additions_run_as_written() {
    let docs = Docs::load();
    let mut shell = Shell::with_controllers(
        "the_kustomize_installs_and_their_additions_run_as_written",
        tenant_roles::AGGREGATING_CONTROLLERS,
    )
    .await;
    shell.set_image_in_kustomization("deploy/legacy/kustomization.yaml");
    let section = "3c. Kustomize";
    let out = shell.run(&docs.command("docs/install.md", section, "kubectl apply -k deploy/legacy"));
    assert!(out.lines().all(|l| l.ends_with(" created")), "{out}");
    let namespace = shell.must_get(&["namespace", "kubevirt-hostpath-provisioner"]);
    assert_eq!(namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged");
    let daemonset =
        shell.must_get(&["daemonset", "kubevirt-hostpath-provisioner", "-n", "kubevirt-hostpath-provisioner"]);
    assert_eq!(container(&daemonset)["image"], format!("{REGISTRY}/hostpath-provisioner:0.1.0"));
    shell.must_get(&["clusterrole", "kubevirt-hostpath-provisioner"]);
    shell.must_get(&["serviceaccount", "kubevirt-hostpath-provisioner-admin", "-n", "kubevirt-hostpath-provisioner"]);
    tenant_roles::tenants_take_snapshots_with_the_built_in_roles(&mut shell, &docs).await;

    // OpenShift serves SecurityContextConstraints; here its CRD stands in.
    shell.install_crds();
    let out = shell.run(&docs.command("docs/install.md", section, "kubectl apply -k deploy/openshift"));
    assert!(
        out.contains("securitycontextconstraints.security.openshift.io/kubevirt-hostpath-provisioner created"),
        "{out}"
    );
    assert_eq!(out.lines().filter(|l| l.ends_with(" created")).count(), 1, "only the SCC is new:\n{out}");
    let out = shell.run(&docs.command("docs/install.md", section, "kubectl -n kubevirt-hostpath-provisioner rollout"));
    assert!(out.contains("successfully rolled out"), "{out}");

    // Monitoring, with the Prometheus Operator's CRDs (installed above).
    let out = shell.run(&docs.command(
        "docs/install.md",
        "Installing hostpath-provisioner",
        "kubectl apply -k deploy/monitoring",
    ));
    for object in ["servicemonitor", "prometheusrule", "configmap", "service"] {
        let named = |l: &str| l.starts_with(&format!("{object}/")) || l.starts_with(&format!("{object}."));
        assert!(out.lines().any(|l| named(l) && l.ends_with(" created")), "no {object} created:\n{out}");
    }

    // Node groups: deploy/legacy's DaemonSet keeps its name and gains a second one.
    let section = "A different path on different nodes: node groups";
    shell.run(&docs.command("docs/install.md", section, "kubectl apply -k deploy/node-groups"));
    let daemonsets = shell.must_get(&["daemonsets", "-n", "kubevirt-hostpath-provisioner"]);
    let names: BTreeSet<&str> =
        daemonsets["items"].as_array().expect("items").iter().filter_map(|d| d["metadata"]["name"].as_str()).collect();
    // The names docs/install.md gives.
    assert_eq!(names, BTreeSet::from(["kubevirt-hostpath-provisioner", "kubevirt-hostpath-provisioner-nvme"]));
    let legacy = shell.must_get(&["daemonset", "kubevirt-hostpath-provisioner", "-n", "kubevirt-hostpath-provisioner"]);
    let affinity = &legacy["spec"]["template"]["spec"]["affinity"]["nodeAffinity"];
    assert!(affinity.to_string().contains("NotIn"), "kept off the nvme group's nodes: {affinity}");

    // Published capacity: the CSIDriver that switches the scheduler's check on.
    let out = shell.run(&docs.command(
        "docs/sizes.md",
        "Capacity-aware scheduling",
        "kubectl apply -f deploy/components/published-capacity/csidriver.yaml",
    ));
    assert!(out.contains("csidriver.storage.k8s.io/") && out.contains(" created"), "{out}");
    shell.finish();
}

/// The DaemonSet of the Go build's deploy file and of deploy/legacy (same name on purpose).
const LEGACY_DAEMONSET: [&str; 4] =
    ["daemonset", "kubevirt-hostpath-provisioner", "-n", "kubevirt-hostpath-provisioner"];
/// The image of the Go build's deploy file.
const GO_IMAGE: &str = "quay.io/kubevirt/hostpath-provisioner";
/// The stand-ins for other projects' files the steps start from or go back to.
const STAND_INS: &str = "tests/documented_commands";

/// Whether the ClusterRole grants `verb` on `resource` (core group).
fn grants(role: &Value, resource: &str, verb: &str) -> bool {
    role["rules"].as_array().into_iter().flatten().any(|rule| {
        let has = |field: &str, value: &str| rule[field].as_array().is_some_and(|l| l.iter().any(|v| v == value));
        has("resources", resource) && has("verbs", verb)
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn rolling_forward_from_the_go_build_and_back_runs_as_written() {
    let docs = Docs::load();
    let mut shell = Shell::with_cluster("rolling_forward_from_the_go_build_and_back_runs_as_written").await;
    // The Go install, applied from its deploy file (its ClusterRole under the API a current
    // cluster serves).
    let go_file = "kubevirt-hostpath-provisioner.yaml";
    shell.copy_in(go_file);
    shell.edit(go_file, "rbac.authorization.k8s.io/v1beta1", "rbac.authorization.k8s.io/v1");
    shell.kubectl(&["apply", "-f", go_file]);
    let go = shell.must_get(&LEGACY_DAEMONSET);

    // Rolling forward: the image set (docs/install.md, step 2), deploy/legacy over the Go install.
    shell.set_image_in_kustomization("deploy/legacy/kustomization.yaml");
    shell.run(&docs.command("docs/migrating.md", "Rolling forward", "kubectl apply -k deploy/legacy"));
    let ours = shell.must_get(&LEGACY_DAEMONSET);
    assert_eq!(ours["metadata"]["uid"], go["metadata"]["uid"], "the DaemonSet was replaced, not taken over");
    assert_eq!(ours["spec"]["selector"], go["spec"]["selector"]);
    assert_eq!(container(&ours)["image"], format!("{REGISTRY}/hostpath-provisioner:0.1.0"));
    assert!(container(&ours)["readinessProbe"].is_object() && container(&ours)["securityContext"].is_object());
    shell.must_get(&["storageclass", "kubevirt-hostpath-provisioner"]); // the Go file's class stays
    shell.must_get(&["storageclass", "hostpath-provisioner"]);
    assert!(!grants(
        &shell.must_get(&["clusterrole", "kubevirt-hostpath-provisioner"]),
        "persistentvolumeclaims",
        "update"
    ));

    // Rolling back: the Go file as its repository has it fails on the v1beta1 ClusterRole, as
    // the doc warns; with that one line changed it applies.
    shell.copy_in(go_file);
    let rollback = docs.command("docs/migrating.md", "Rolling back", &format!("kubectl apply -f {go_file}"));
    let refused = shell.run_expecting_failure(&rollback);
    assert!(refused.contains("v1beta1"), "{refused}");
    shell.edit(go_file, "rbac.authorization.k8s.io/v1beta1", "rbac.authorization.k8s.io/v1");
    shell.run(&rollback);
    let back = shell.must_get(&LEGACY_DAEMONSET);
    assert_eq!(back["metadata"]["uid"], go["metadata"]["uid"]);
    assert_eq!(container(&back)["image"], GO_IMAGE);
    for field in ["readinessProbe", "livenessProbe", "securityContext"] {
        assert!(container(&back)[field].is_null(), "this build's {field} is left: {}", container(&back));
    }
    assert_eq!(env_value(container(&back), "PV_DIR"), Some("/var/hpvolumes"));
    // The rules the Go build needs and this build's ClusterRole lacks are back.
    let role = shell.must_get(&["clusterrole", "kubevirt-hostpath-provisioner"]);
    assert!(grants(&role, "persistentvolumeclaims", "update") && grants(&role, "events", "create"), "{role}");
    shell.finish();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_install_runs_as_written() {
    let docs = Docs::load();
    let mut shell =
        Shell::with_controllers("the_operator_install_runs_as_written", tenant_roles::AGGREGATING_CONTROLLERS).await;
    // "Point the image at your registry first".
    shell.set_image_in_kustomization("deploy/operator/kustomization.yaml");
    shell.run(&docs.command("docs/operator.md", "Install", "kubectl apply --server-side -k deploy/operator"));
    let operator = shell.must_get(&["deployment", "hostpath-provisioner-operator", "-n", "hostpath-provisioner"]);
    assert_eq!(container(&operator)["image"], format!("{REGISTRY}/hostpath-provisioner:0.1.0"));
    tenant_roles::tenants_take_snapshots_with_the_built_in_roles(&mut shell, &docs).await;
    shell.run(&docs.command(
        "docs/operator.md",
        "Install",
        "kubectl apply -f deploy/operator/examples/storage-pool.yaml",
    ));
    let listed = shell.run(&docs.command("docs/operator.md", "Install", "kubectl get hostpathprovisioners"));
    assert!(listed.lines().any(|l| l.starts_with("hostpath-provisioner ")), "{listed}");
    // On OpenShift: the same install, with no uid pinned on the operator pod (restricted-v2
    // assigns one), applied over the first as an admin switching would.
    let pinned = &operator["spec"]["template"]["spec"]["securityContext"];
    assert_eq!(pinned["runAsUser"], 65532, "elsewhere the uid is pinned: the image's default user is root");
    shell.run(&docs.command(
        "docs/operator.md",
        "OpenShift",
        "kubectl apply --server-side -k deploy/operator-openshift",
    ));
    let operator = shell.must_get(&["deployment", "hostpath-provisioner-operator", "-n", "hostpath-provisioner"]);
    let context = &operator["spec"]["template"]["spec"]["securityContext"];
    assert!(context["runAsUser"].is_null() && context["runAsNonRoot"] == true, "{context}");
    assert_eq!(container(&operator)["image"], format!("{REGISTRY}/hostpath-provisioner:0.1.0"));
    shell.finish();
}

/// The volume of claim `shop/data` once it is Bound.
async fn bound_volume(shell: &Shell, what: &str) -> anyhow::Result<String> {
    testbed::wait_for(what, WAIT, || async {
        anyhow::Ok(
            shell
                .get(&["pvc", "data", "-n", "shop"])
                .filter(|c| c["status"]["phase"] == "Bound")
                .and_then(|c| c["spec"]["volumeName"].as_str().map(str::to_owned)),
        )
    })
    .await
}

/// `hostpath-provisioner operator` as deploy/operator's Deployment runs it; stopped on drop.
struct OperatorProcess(std::process::Child);

impl OperatorProcess {
    fn start(shell: &Shell) -> OperatorProcess {
        let log = std::fs::File::create(shell.dir().join("operator.log")).expect("log");
        let child = Command::new(env!("CARGO_BIN_EXE_hostpath-provisioner"))
            .args(["operator", "--namespace", "hostpath-provisioner", "--node-image", "registry.example.com/hpp:e2e"])
            .arg("--kubeconfig")
            .arg(shell.cp().kubeconfig_path())
            .env("POD_NAME", "hostpath-provisioner-operator-0")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start the operator");
        OperatorProcess(child)
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_documented_volume_repairs_run_as_written() {
    let docs = Docs::load();
    let mut shell = Shell::with_cluster("the_documented_volume_repairs_run_as_written").await;
    // README, "Deletion safety": a PV whose path was refused, deleted by hand.
    let refused = "pvc-0e0e0e0e-0000-4000-8000-000000000001";
    create_pv(&shell, refused, Value::Null);
    shell.run_with(&docs.command("README.md", "Deletion safety", "kubectl delete pv"), &[("<name>", refused)]);
    shell.wait_gone(&["pv", refused]).await;

    // docs/configuration.md, PV_FINALIZER's rollback caveat: a PV deleted while the Go build,
    // which does not know the finalizer, serves; the finalizer removed by hand.
    let held = "pvc-0e0e0e0e-0000-4000-8000-000000000002";
    create_pv(
        &shell,
        held,
        serde_json::json!({"metadata": {"finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"]}}),
    );
    shell.kubectl(&["delete", "pv", held, "--wait=false"]);
    // "checking its index first".
    assert_eq!(
        shell.must_get(&["pv", held])["metadata"]["finalizers"][0],
        "external-provisioner.volume.kubernetes.io/finalizer"
    );
    shell.run_with(&docs.command("docs/configuration.md", "Settings", "kubectl patch pv NAME"), &[("NAME", held)]);
    shell.wait_gone(&["pv", held]).await;

    // docs/sizes.md, "Expansion": the claim `data` of a class that allows expansion, raised.
    let class = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "expandable"},
        "provisioner": "kubevirt.io/hostpath-provisioner", "allowVolumeExpansion": true,
    });
    let claim = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "data", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "expandable", "resources": {"requests": {"storage": "10Gi"}}},
    });
    std::fs::write(shell.dir().join("claim.json"), format!("{class}\n{claim}")).expect("write");
    shell.kubectl(&["create", "-f", "claim.json"]);
    let volume = "pvc-0e0e0e0e-0000-4000-8000-000000000003";
    create_pv(
        &shell,
        volume,
        serde_json::json!({"spec": {
            "capacity": {"storage": "10Gi"}, "storageClassName": "expandable",
            "claimRef": {"namespace": "default", "name": "data"},
        }}),
    );
    testbed::wait_for("claim data Bound", WAIT, || async {
        anyhow::Ok(
            (shell.get(&["pvc", "data", "-n", "default"]).is_some_and(|c| c["status"]["phase"] == "Bound"))
                .then_some(()),
        )
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    shell.run(&docs.command("docs/sizes.md", "Expansion", "kubectl patch pvc data"));
    let raised = shell.must_get(&["pvc", "data", "-n", "default"]);
    assert_eq!(raised["spec"]["resources"]["requests"]["storage"], "20Gi");

    // docs/volumes.md, "Pinned to a node label": the node labelled as written; its provisioner,
    // with NODE_AFFINITY_KEYS as the docs set it, pins a class's volume to the disk's label.
    shell.cp().add_node_labeled("worker-3", "worker-3", &[]).await.expect("Node worker-3");
    shell.run(&docs.command("docs/volumes.md", "Pinned to a node label: `nodeAffinityKey`", "kubectl label node"));
    let pool = testbed::pool_root_for(shell.cp(), "worker-3");
    std::fs::create_dir_all(&pool).expect("pool root");
    let spec = testbed::ProvisionerSpec::new(
        env!("CARGO_BIN_EXE_hostpath-provisioner"),
        "worker-3",
        &pool,
        shell.cp().kubeconfig_path(),
    )
    .env("NODE_AFFINITY_KEYS", "node-restriction.kubernetes.io/disk-serial");
    let mut provisioner = testbed::Provisioner::spawn(spec, shell.cp().temp_dir()).expect("spawn provisioner");
    provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("provisioner ready");
    let class = serde_json::json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "disk"},
        "provisioner": "kubevirt.io/hostpath-provisioner", "parameters": {"nodeAffinityKey": "node-restriction.kubernetes.io/disk-serial"},
    });
    let claim = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "on-disk", "namespace": "default", "annotations": {"kubevirt.io/provisionOnNode": "worker-3"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "disk", "resources": {"requests": {"storage": "1Mi"}}},
    });
    std::fs::write(shell.dir().join("disk.json"), format!("{class}\n{claim}")).expect("write");
    shell.kubectl(&["create", "-f", "disk.json"]);
    let bound = testbed::wait_for("claim on-disk Bound", WAIT, || async {
        anyhow::Ok(shell.get(&["pvc", "on-disk", "-n", "default"]).filter(|c| c["status"]["phase"] == "Bound"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", provisioner.log_tail(30)));
    let pv = shell.must_get(&["pv", bound["spec"]["volumeName"].as_str().expect("volume name")]);
    let expression = &pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0];
    assert_eq!(expression["key"], "node-restriction.kubernetes.io/disk-serial", "{pv}");
    assert_eq!(expression["values"][0], "WD-WX12345", "{pv}");
    provisioner.terminate();

    // docs/volumes.md, pathPattern: a directory made for a claim of one class, its PV deleted
    // under Retain; the same claim made again in another class is refused (the directory
    // records the class it was made for) until the admin names the directory on the
    // Namespace, as written; then it takes the directory over with its data.
    shell.cp().add_node_labeled("worker-4", "worker-4", &[]).await.expect("Node worker-4");
    let pool = testbed::pool_root_for(shell.cp(), "worker-4");
    std::fs::create_dir_all(&pool).expect("pool root");
    let spec = testbed::ProvisionerSpec::new(
        env!("CARGO_BIN_EXE_hostpath-provisioner"),
        "worker-4",
        &pool,
        shell.cp().kubeconfig_path(),
    );
    let mut provisioner = testbed::Provisioner::spawn(spec, shell.cp().temp_dir()).expect("spawn provisioner");
    provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("provisioner ready");
    shell.kubectl(&["create", "namespace", "shop"]);
    let pattern_class = |name: &str| {
        serde_json::json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
            "provisioner": "kubevirt.io/hostpath-provisioner", "reclaimPolicy": "Retain",
            "parameters": {"pathPattern": "{namespace}_{claim}"},
        })
    };
    let pattern_claim = |class: &str| {
        serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "shop", "annotations": {"kubevirt.io/provisionOnNode": "worker-4"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class, "resources": {"requests": {"storage": "1Mi"}}},
        })
    };
    std::fs::write(
        shell.dir().join("pattern.json"),
        format!("{}\n{}\n{}", pattern_class("shop-a"), pattern_class("shop-b"), pattern_claim("shop-a")),
    )
    .expect("write");
    shell.kubectl(&["create", "-f", "pattern.json"]);
    let first = bound_volume(&shell, "claim shop/data Bound")
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", provisioner.log_tail(30)));
    std::fs::write(pool.join("shop_data").join("orders"), b"kept").expect("write into the volume");
    shell.kubectl(&["delete", "pvc", "data", "-n", "shop"]);
    shell.kubectl(&["delete", "pv", &first]);
    shell.wait_gone(&["pv", &first]).await;
    std::fs::write(shell.dir().join("again.json"), pattern_claim("shop-b").to_string()).expect("write");
    shell.kubectl(&["create", "-f", "again.json"]);
    let refused = testbed::wait_for("the other class's claim refused", WAIT, || async {
        let events = shell.kubectl(&["get", "events", "-n", "shop", "-o", "json"]);
        anyhow::Ok(events.contains("adopt-directory").then_some(()))
    })
    .await;
    refused.unwrap_or_else(|e| panic!("{e:#}\n{}", provisioner.log_tail(30)));
    shell.run(&docs.command(
        "docs/volumes.md",
        "Predictable directory names: `pathPattern`",
        "kubectl annotate namespace shop",
    ));
    bound_volume(&shell, "claim shop/data Bound after the annotation")
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", provisioner.log_tail(30)));
    assert_eq!(std::fs::read(pool.join("shop_data").join("orders")).ok().as_deref(), Some(&b"kept"[..]));
    provisioner.terminate();

    // docs/snapshots.md: the CRD applied as an upgraded Helm release needs it, then a snapshot
    // whose node is gone, deleted and let go by removing its finalizer by hand.
    shell.run(&docs.command("docs/snapshots.md", "The resource", "kubectl apply --server-side -f"));
    shell.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/hostpathsnapshots.hostpath-provisioner.kubevirt.io",
    ]);
    let snapshot = serde_json::json!({
        "apiVersion": "hostpath-provisioner.kubevirt.io/v1alpha1", "kind": "HostPathSnapshot",
        "metadata": {"name": "on-gone-node", "namespace": "default", "finalizers": ["hostpath-provisioner.kubevirt.io/snapshot"]},
        "spec": {"source": {"persistentVolumeClaimName": "on-disk"}},
    });
    std::fs::write(shell.dir().join("snapshot.json"), snapshot.to_string()).expect("write");
    shell.kubectl(&["create", "-f", "snapshot.json"]);
    shell.kubectl(&["delete", "hostpathsnapshot", "on-gone-node", "-n", "default", "--wait=false"]);
    assert_eq!(
        shell.must_get(&["hostpathsnapshot", "on-gone-node", "-n", "default"])["metadata"]["finalizers"][0],
        "hostpath-provisioner.kubevirt.io/snapshot"
    );
    shell.run_with(
        &docs.command("docs/snapshots.md", "Deleting", "kubectl patch hostpathsnapshot NAME"),
        &[("NAMESPACE", "default"), ("NAME", "on-gone-node")],
    );
    shell.wait_gone(&["hostpathsnapshot", "on-gone-node", "-n", "default"]).await;
    shell.finish();
}

/// The publish path through a real registry (`documented/registry.rs`).
#[tokio::test(flavor = "multi_thread")]
async fn the_image_and_the_chart_are_pushed_to_a_real_registry_and_installed_from_it_as_written() {
    let docs = Docs::load();
    let mut shell =
        Shell::with_cluster("the_image_and_the_chart_are_pushed_to_a_real_registry_and_installed_from_it_as_written")
            .await;
    registry::push_and_install_through_a_registry(&mut shell, &docs).await;
    shell.finish();
}

/// docs/snapshots.md, "Snapshots made again": the admin's and the tenant's commands, each where
/// the doc says to run it (`documented/snapshot_recreation.rs`). Its controller manager runs the
/// namespace controller: the namespace is deleted and made again.
#[tokio::test(flavor = "multi_thread")]
async fn the_documented_steps_for_snapshots_made_again_run_as_written() {
    let docs = Docs::load();
    let mut shell =
        Shell::with_controllers("the_documented_steps_for_snapshots_made_again_run_as_written", &["namespace"]).await;
    snapshot_recreation::snapshots_made_again_follow_the_doc(&mut shell, &docs).await;
    shell.finish();
}

/// A PersistentVolume of a hostPath outside any pool, with `extra` merged in.
fn create_pv(shell: &Shell, name: &str, extra: Value) {
    let mut pv = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": format!("/var/hpvolumes/elsewhere/{name}")},
            "persistentVolumeReclaimPolicy": "Delete",
        },
    });
    json_merge(&mut pv, extra);
    let file = shell.dir().join(format!("{name}.json"));
    std::fs::write(&file, pv.to_string()).expect("write");
    shell.kubectl(&["create", "-f", file.to_str().expect("utf-8 path")]);
}

/// Merges `extra` into `into`, objects key by key.
fn json_merge(into: &mut Value, extra: Value) {
    match (into, extra) {
        (Value::Object(into), Value::Object(extra)) => {
            for (key, value) in extra {
                json_merge(into.entry(key).or_insert(Value::Null), value);
            }
        }
        (_, Value::Null) => {}
        (into, extra) => *into = extra,
    }
}

#[test]
fn the_release_steps_that_need_no_registry_run_as_written() {
    let docs = Docs::load();
    let mut shell = Shell::without_cluster("the_release_steps_that_need_no_registry_run_as_written");
    let section = "Releasing: the image and the chart";
    // Regenerating from unchanged sources changes none of the checked-in rendered files.
    shell.run(&docs.command("docs/development.md", section, "make manifests"));
    for file in ["deploy/install.yaml", "deploy/operator/install.yaml", "deploy/monitoring/prometheusrule.yaml"] {
        let checked_in = std::fs::read_to_string(repo().join(file)).expect("read");
        assert!(shell.read(file) == checked_in, "{file} differs after `make manifests`");
    }
    // The chart packaged under the name the next step pushes.
    shell.run(&docs.command("docs/development.md", section, "helm package"));
    let push = docs.command("docs/development.md", section, "helm push");
    let package = push.text.split_whitespace().nth(2).expect("the package helm push names");
    assert!(shell.dir().join(package).is_file(), "helm package made no {package}");
    shell.finish();
}

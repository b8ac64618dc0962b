//! The operator's one-step Helm install on a real kubelet, run exactly as docs/operator.md
//! writes it (the commands are read from the page): the chart's CRD from `crds/`, its operator
//! running as a real pod under the chart's RBAC only, the resource of the same install turned into
//! node pods, and a volume of the chart's class that a pod writes into at the documented pool
//! path. Then the page's CRD update step, and its uninstall steps, which leave nothing of the
//! operator's behind.
//!
//! Nothing of the operator is applied before: this scenario runs before the other operator
//! scenarios, which apply deploy/operator themselves.

use std::os::unix::ffi::OsStrExt;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::rbac::v1::ClusterRole;
use testbed::documented_commands::{DocumentedCommand, documented_commands};
use testbed::{DeployTool, deploy_tool};

use super::*;

/// The page whose commands the scenario runs.
const DOC: &str = "docs/operator.md";
/// What the documented command names: release, namespace, resource, pool path, class.
const NAMESPACE: &str = "hostpath-provisioner";
const RESOURCE: &str = "hostpath-provisioner";
const POOL: &str = "/var/hpvolumes";
const CHART_CLASS: &str = "hostpath-provisioner";
/// The node DaemonSet and ClusterRole the operator makes.
const NODE_OBJECTS: &str = "kubevirt-hostpath-provisioner";

/// The one command of docs/operator.md that starts with `start` and contains `containing`.
fn documented(commands: &[DocumentedCommand], start: &str, containing: &str) -> Result<String> {
    let mut found =
        commands.iter().filter(|c| c.file == DOC && c.text.starts_with(start) && c.text.contains(containing));
    let command = found.next().with_context(|| format!("no `{start} ...{containing}...` command in {DOC}"))?;
    ensure!(found.next().is_none(), "more than one `{start} ...{containing}...` in {DOC}");
    Ok(command.text.clone())
}

/// A user's shell: bash in the repository (or the directory [`Shell::within`] names) with the
/// lane's kubectl and helm first on PATH, the lane's kubeconfig, helm's caches in the lane
/// directory.
pub(super) struct Shell {
    tools: PathBuf,
    home: PathBuf,
    kubeconfig: PathBuf,
    cwd: PathBuf,
}

impl Shell {
    pub(super) fn new(ctx: &Ctx) -> Result<Shell> {
        let tools = ctx.lane.dir().join("operator-helm-tools");
        std::fs::create_dir_all(&tools)?;
        for (name, target) in [("kubectl", ctx.lane.cp().kubectl()), ("helm", deploy_tool(DeployTool::Helm)?)] {
            let link = tools.join(name);
            if !link.exists() {
                std::os::unix::fs::symlink(target, link)?;
            }
        }
        Ok(Shell {
            tools,
            home: ctx.lane.dir().join("operator-helm-home"),
            kubeconfig: ctx.lane.cp().kubeconfig_path().to_path_buf(),
            cwd: ctx.repo.clone(),
        })
    }

    /// The same shell in `dir` (a user's checkout of some release's files).
    pub(super) fn within(self, dir: &Path) -> Shell {
        Shell { cwd: dir.to_path_buf(), ..self }
    }

    /// Runs `text` as a user would type it; fails with what it printed unless it exits 0.
    pub(super) async fn run(&self, text: &str) -> Result<String> {
        let path = format!("{}:{}", self.tools.display(), std::env::var("PATH").unwrap_or_default());
        let (out, err) = (self.home.join("stdout"), self.home.join("stderr"));
        std::fs::create_dir_all(&self.home)?;
        let mut command = std::process::Command::new("bash");
        command
            .arg("-c")
            .arg(text)
            .current_dir(&self.cwd)
            .env("PATH", path)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_DATA_HOME", self.home.join("data"))
            .env("KUBECACHEDIR", self.home.join("kube-cache"))
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&out)?)
            .stderr(std::fs::File::create(&err)?);
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn()?;
        let deadline = std::time::Instant::now() + LANE_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if std::time::Instant::now() > deadline {
                // SAFETY: kill(2) of the process group our own child leads.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
                let _ = child.wait();
                anyhow::bail!("`{text}` still running after {LANE_TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let said = format!("{}{}", std::fs::read_to_string(&out)?, std::fs::read_to_string(&err)?);
        ensure!(status.success(), "`{text}` exited {status}:\n{said}");
        Ok(said)
    }
}

/// The documented pool path, made for the scenario (a shared mount of itself, as the lane's
/// pools: containerd refuses HostToContainer from a private mount) and removed when dropped.
struct DocumentedPool;

impl DocumentedPool {
    fn make() -> Result<DocumentedPool> {
        let pool = Path::new(POOL);
        ensure!(!pool.exists(), "{POOL} exists on this machine: the scenario makes it and removes it, so it must not");
        std::fs::create_dir_all(pool)?;
        let made = DocumentedPool;
        testbed::real_nodes::host::make_shared_mount(pool)?;
        Ok(made)
    }
}

impl Drop for DocumentedPool {
    fn drop(&mut self) {
        let path = std::ffi::CString::new(Path::new(POOL).as_os_str().as_bytes()).expect("no NUL in the path");
        // SAFETY: a valid NUL-terminated path; a lazy unmount of the bind mount made above.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
        // Only what is empty goes: the provisioner's own (empty) trash directory, then the pool.
        let _ = std::fs::remove_dir(Path::new(POOL).join(".hpp-trash"));
        let _ = std::fs::remove_dir(POOL);
    }
}

pub(super) async fn the_documented_one_step_helm_install_of_the_operator_provisions_a_volume_a_pod_writes(
    ctx: &Ctx,
) -> Result<()> {
    let image = ctx.deployed().await?;
    let node = ctx.lane.node_name().to_owned();
    let commands = documented_commands(&ctx.repo)?;
    let install = documented(&commands, "helm install", "operator.enabled=true")?;
    let crd_update = documented(&commands, "kubectl apply --server-side", "/crds/")?;
    let delete_resource = documented(&commands, "kubectl delete hostpathprovisioner", RESOURCE)?;
    let uninstall = documented(&commands, "helm uninstall ", NAMESPACE)?;
    let shell = Shell::new(ctx)?;

    // The images the documented command names (the placeholder registry) are the lane's image,
    // as if pushed there: what `helm template` of the same arguments renders.
    let rendered = shell.run(&install.replacen("helm install", "helm template", 1)).await?;
    let references: std::collections::BTreeSet<&str> =
        rendered.lines().filter_map(|l| l.trim().strip_prefix("image:")).map(|r| r.trim().trim_matches('"')).collect();
    ensure!(!references.is_empty(), "the chart names no image:\n{rendered}");
    for reference in &references {
        ctx.lane.tag_image(&images::normalize_reference(&image), &images::normalize_reference(reference))?;
    }

    // One provisioner of the name per node, and the chart's class has deploy/legacy's name:
    // both go aside, and deploy/legacy comes back at the end.
    ctx.lane
        .cp()
        .run_kubectl(&ctx.repo, &["delete", "daemonset", "-n", DEPLOY_NAMESPACE, DEPLOY_DAEMONSET, "--wait"])?;
    ctx.lane.cp().run_kubectl(&ctx.repo, &["delete", "storageclass", CHART_CLASS, "--ignore-not-found"])?;
    let pool = DocumentedPool::make()?;

    let said = shell.run(&install).await?;
    ensure!(said.contains("STATUS: deployed"), "{said}");
    // The resource of the same install, Available under the chart's RBAC, the operator running as
    // a pod of the chart.
    let available = testbed::wait_for("the chart's resource Available and not Degraded", LANE_TIMEOUT, || async {
        let resource = resources(ctx).get_opt(RESOURCE).await?;
        let status = resource.map(|r| r.data["status"].clone()).unwrap_or_default();
        let condition =
            |kind: &str| status["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == kind)).cloned();
        let ready = condition("Available").is_some_and(|c| c["status"] == "True")
            && condition("Degraded").is_some_and(|c| c["status"] == "False");
        anyhow::Ok(ready.then_some(status))
    })
    .await
    .map_err(|e| e.context(ctx.lane.log_tails(40)))?;
    let operator_pods: Api<Pod> = Api::namespaced(ctx.lane.client(), NAMESPACE);
    let running = operator_pods.list(&ListParams::default().labels("app.kubernetes.io/component=operator")).await?;
    ensure!(
        running.items.iter().any(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")),
        "the operator runs as the chart's pod: {:?}\n{available:#}",
        running.items.iter().map(|p| p.metadata.name.clone()).collect::<Vec<_>>()
    );

    // A volume of the chart's class (WaitForFirstConsumer) in the documented pool, written by a pod.
    let ns = ctx.namespace("operator-helm").await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    claims.create(&PostParams::default(), &fixtures::claim(&ns, "data", CHART_CLASS, "16Mi").build()).await?;
    let run = PodRun::new(&ns, "writer", "echo from-the-chart > /data/file").claim("data").on_node(&node);
    let outcome = ctx.lane.run_pod(&run).await?;
    ensure!(outcome.exit_code == Some(0), "pod exited {:?}: {}", outcome.exit_code, outcome.logs);
    let dir = ctx.lane.volume_dir(&ns, "data").await?;
    ensure!(dir.parent() == Some(Path::new(POOL)), "the volume is in the documented pool: {}", dir.display());
    ensure!(std::fs::read_to_string(dir.join("file"))? == "from-the-chart\n", "written by the pod");

    // The page's step for a release that changes the CRD applies over the one Helm installed.
    shell.run(&crd_update).await?;

    // Uninstall as the page says: the resource first (the operator removes what it made), then
    // the release. The volume is released first, as a user would before removing its provisioner.
    ctx.lane.delete_pod(&ns, "writer").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "data").await?;
    shell.run(&delete_resource).await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.lane.client(), NAMESPACE);
    ensure!(daemonsets.get_opt(NODE_OBJECTS).await?.is_none(), "the operator removed its node DaemonSet");
    ensure!(
        Api::<ClusterRole>::all(ctx.lane.client()).get_opt(NODE_OBJECTS).await?.is_none(),
        "the operator removed its node ClusterRole"
    );
    shell.run(&uninstall).await?;
    testbed::wait_for("the operator's pods gone", LANE_TIMEOUT, || async {
        let left = operator_pods.list(&ListParams::default().labels("app.kubernetes.io/component=operator")).await?;
        anyhow::Ok(left.items.is_empty().then_some(()))
    })
    .await?;
    let left: Vec<_> = std::fs::read_dir(POOL)?
        .flatten()
        .map(|e| e.file_name())
        .filter(|name| {
            name != ".hpp-trash" || std::fs::read_dir(Path::new(POOL).join(name)).is_ok_and(|mut d| d.next().is_some())
        })
        .collect();
    ensure!(left.is_empty(), "the pool holds only the provisioner's empty trash after the volume went: {left:?}");
    drop(pool);
    ensure!(!Path::new(POOL).exists(), "{POOL} removed after the scenario");

    // deploy/legacy back for the next scenarios.
    ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    Ok(())
}

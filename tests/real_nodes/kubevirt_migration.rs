//! A cluster of the kubevirt hostpath-provisioner-operator, as most KubeVirt clusters run it,
//! moved to this project's operator by the steps of docs/operator.md ("Coming from the kubevirt
//! operator"), read from the doc and run as written, then back by its "Going back" steps.
//!
//! The kubevirt install runs for real on the second node (`testbed::real_nodes::kubevirt` says
//! how it is built and what the lane changes in it): its operator in a pod, with its webhook;
//! its legacy provisioner and its CSI driver with the CSI sidecars as DaemonSets, on the storage
//! node the resource selects. Two resources, one per scenario, as the kubevirt operator takes
//! either a `pathConfig` or pools:
//!
//! - its `pathConfig` example: pods write into a legacy volume and a CSI volume; then, through
//!   the move and back, every pod keeps running with its data, a CSI volume still mounts when
//!   its pod is made again, each class a user had gets new volumes, each side reclaims the
//!   other's legacy volumes, and the resource can be deleted at the end;
//! - its `pvcTemplate` example, in `kubevirt_pool_migration.rs`.
//!
//! This file holds the first scenario and what both share: the install, the move, the way
//! back and a user's volumes.
//!
//! Run by `make test-kubevirt-migration` (`HPP_KUBEVIRT_MIGRATION=1`): building the kubevirt
//! programs costs about 13 minutes of CPU cold, which would take a cold `make test` past the hour.

use std::os::unix::fs::MetadataExt;
use std::process::Command;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Event;
use kube::api::DynamicObject;
use serde_json::json;
use testbed::real_nodes::NODE2_NAME;
use testbed::real_nodes::kubevirt::{
    self, CSI_DAEMONSET, CSI_DRIVER, LEGACY_DAEMONSET, NAMESPACE, OPERATOR_DEPLOYMENT,
};

use super::drain::LoopDisk;
use super::swap::made_by_us;
use super::*;

/// Set to 1 to run this scenario (`make test-kubevirt-migration`).
pub(super) const MIGRATION_ENV: &str = "HPP_KUBEVIRT_MIGRATION";
/// The resource, as the operator's legacy example names it.
pub(super) const RESOURCE: &str = "hostpath-provisioner";
/// The CSI class of a `pathConfig` resource (its `deploy/storageclass-wffc-legacy-csi.yaml`).
pub(super) const CSI_CLASS: &str = "hostpath-csi";
/// This operator's node DaemonSet.
pub(super) const OUR_DAEMONSET: &str = "kubevirt-hostpath-provisioner";
pub(super) const SECTION: &str = "Coming from the kubevirt operator";
pub(super) const GOING_BACK: &str = "Going back";
pub(super) async fn a_kubevirt_operator_cluster_moves_to_this_operator_and_back_with_its_volumes_two_nodes(
    ctx: &Ctx,
) -> Result<()> {
    // The kubevirt install in a namespace of its own, as many clusters have it: the take-over
    // finds it by the owner references to the resource, and the way back restores it there.
    let Some(install) = install_kubevirt(ctx, ELSEWHERE).await? else { return Ok(()) };
    let Install { build, dir, our_image, theirs, started, ns } = &install;
    // Its `pathConfig` example, on the second node only (the storage node: the kubelet's
    // default root, which the kubevirt DaemonSets hard-code, is there).
    let resource = build.resource("hostpathprovisioner_legacy_cr.yaml", ctx.lane.pool_root())?;
    create_resource(ctx, dir, ns, resource)?;
    // Its webhook answers: a resource with both a pathConfig and pools is refused by it (the
    // kubevirt CRD's schema lets it through).
    let both = json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
        "metadata": {"name": "both"},
        "spec": {"pathConfig": {"path": "/x"}, "storagePools": [{"name": "a", "path": "/y"}]},
    });
    std::fs::write(dir.join("both.json"), both.to_string())?;
    let refused = kubectl(ctx, dir, &["create", "-f", "both.json"]);
    ensure!(
        format!("{refused:?}").contains("pathConfig and storage pools cannot be both set"),
        "the kubevirt webhook refuses a resource with both: {refused:?}"
    );
    for daemonset in [LEGACY_DAEMONSET, CSI_DAEMONSET] {
        wait_rolled_out(ctx, ns, daemonset).await?;
    }
    wait_driver_registered(ctx, ns).await?;
    create_csi_class(ctx, dir, &build.source.join("deploy/storageclass-wffc-legacy-csi.yaml"))?;
    println!(
        "    kubevirt operator, legacy provisioner and CSI driver running in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // A user's volumes: a legacy one and a CSI one, each with a pod writing into it.
    let volumes = Volumes { ctx, ns: ctx.namespace("kubevirt").await?, csi_root: ctx.lane.pool_root().join("csi") };
    let legacy = volumes.claim_with_writer("legacy-theirs", CLASS).await?;
    ensure!(!made_by_us(&legacy), "legacy-theirs made by the kubevirt legacy provisioner");
    let csi = volumes.claim_with_writer("csi-theirs", CSI_CLASS).await?;
    ensure!(csi_driver_of(&csi) == Some(CSI_DRIVER), "csi-theirs is a CSI volume: {:?}", csi.spec);

    let (docs, work) = move_to_this_operator(ctx, dir, our_image, ns).await?;
    wait_gone::<DaemonSet>(ctx, ns, LEGACY_DAEMONSET).await?;
    // Every pod kept running with its data; the CSI volume mounts again for a new pod.
    volumes.still_running_with_their_data(&["legacy-theirs", "csi-theirs"]).await?;
    volumes.mounts_again("csi-theirs").await?;
    // New volumes of both classes: the legacy class from this provisioner, the CSI class from
    // the driver that was kept.
    let ours = volumes.claim_with_writer("legacy-ours", CLASS).await?;
    ensure!(made_by_us(&ours), "legacy-ours made by this provisioner");
    let csi_after = volumes.claim_with_writer("csi-after", CSI_CLASS).await?;
    ensure!(csi_driver_of(&csi_after) == Some(CSI_DRIVER), "csi-after made by the kept CSI driver");
    // The kubevirt legacy provisioner's volume is reclaimed by this one, and a CSI volume by
    // the kept CSI driver while this operator is in charge.
    volumes.reclaim("legacy-theirs").await?;
    volumes.reclaim("csi-theirs").await?;
    // The capacity tracking the CSI driver gave, on the migrated install (docs/kubevirt.md,
    // "Placing VM disks by free space"); turned off again before going back.
    places_by_capacity(ctx, dir, &volumes).await?;
    println!("    moved to this operator in {:.1} s", started.elapsed().as_secs_f64());

    go_back(ctx, dir, &work, &docs, theirs, ns).await?;
    wait_rolled_out(ctx, ns, LEGACY_DAEMONSET).await?;
    volumes.still_running_with_their_data(&["legacy-ours", "csi-after"]).await?;
    volumes.mounts_again("csi-after").await?;
    let go_again = volumes.claim_with_writer("legacy-back", CLASS).await?;
    ensure!(!made_by_us(&go_again), "legacy-back made by the kubevirt legacy provisioner");
    // This provisioner's volume is reclaimed by the kubevirt one (same layout).
    volumes.reclaim("legacy-ours").await?;

    // The resource deletes: the kubevirt operator removes its finalizer and its DaemonSets.
    for claim in ["csi-after", "legacy-back"] {
        volumes.reclaim(claim).await?;
    }
    kubectl(ctx, dir, &["delete", "hostpathprovisioner", RESOURCE, "--timeout=120s"])?;
    wait_gone::<DaemonSet>(ctx, ns, LEGACY_DAEMONSET).await?;
    println!("    back to the kubevirt operator and deleted in {:.1} s", started.elapsed().as_secs_f64());
    uninstall_kubevirt(ctx, dir, ns).await
}

/// The kubevirt install, running, and what a scenario needs of it.
pub(super) struct Install {
    pub(super) build: kubevirt::KubevirtBuild,
    /// The scenario's files (the kubevirt manifests as applied).
    pub(super) dir: PathBuf,
    /// This project's image in the lane.
    pub(super) our_image: String,
    /// The kubevirt operator's Deployment.
    pub(super) theirs: Deployment,
    pub(super) started: Instant,
    /// The namespace it runs in.
    pub(super) ns: &'static str,
}

/// Another namespace than this operator's, for the kubevirt install (one many upstream installs
/// use); this operator runs in [`NAMESPACE`], where both operators' manifests install.
pub(super) const ELSEWHERE: &str = "kubevirt-hostpath-provisioner";
/// The Prometheus Operator's kinds (their CRDs only, no Prometheus): both operators make their
/// monitoring where these are served.
const MONITORING_CRDS: [&str; 2] =
    ["monitoring.coreos.com_prometheusrules.yaml", "monitoring.coreos.com_servicemonitors.yaml"];

/// Builds the kubevirt programs (cached), brings the lane's second node, imports the images,
/// sets deploy/legacy aside, serves the Prometheus Operator's kinds, and installs the kubevirt
/// operator as its README says in namespace `ns` (cert-manager's part done by the lane); `None`
/// (saying where it runs) unless [`MIGRATION_ENV`] is 1.
pub(super) async fn install_kubevirt(ctx: &Ctx, ns: &'static str) -> Result<Option<Install>> {
    if std::env::var(MIGRATION_ENV).as_deref() != Ok("1") {
        println!("    not here: run by `make test-kubevirt-migration` ({MIGRATION_ENV}=1; its build is long)");
        return Ok(None);
    }
    let started = Instant::now();
    let build = kubevirt::build(&ctx.repo).context("building the kubevirt operator, CSI driver and sidecars")?;
    println!("    kubevirt programs ready in {:.1} s", started.elapsed().as_secs_f64());
    let our_image = super::two_nodes::two_nodes(ctx).await?;
    let dir = ctx.lane.dir().join("kubevirt-migration");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let images = build.images()?;
    for image in &images {
        let archive = dir.join(format!("{}.oci.tar", image.env));
        image.image.write(&archive)?;
        ctx.lane.import_image(&archive)?;
    }
    // deploy/legacy's DaemonSet aside: one provisioner of the name per node.
    kubectl(
        ctx,
        &dir,
        &["delete", "daemonset", "-n", DEPLOY_NAMESPACE, DEPLOY_DAEMONSET, "--ignore-not-found", "--wait"],
    )?;
    // The CSI class name is the same in both examples, with other parameters.
    kubectl(ctx, &dir, &["delete", "storageclass", CSI_CLASS, "--ignore-not-found"])?;
    let crds = testbed::deploy_tool(testbed::DeployTool::Crds)?;
    for crd in MONITORING_CRDS {
        kubectl(ctx, &dir, &["apply", "--server-side", "-f", &crds.join(crd).display().to_string()])?;
    }
    for crd in ["prometheusrules", "servicemonitors"] {
        let established = format!("crd/{crd}.monitoring.coreos.com");
        kubectl(ctx, &dir, &["wait", "--for", "condition=Established", &established])?;
    }
    std::fs::write(dir.join("namespace.yaml"), kubevirt::in_namespace(build.read("namespace.yaml")?, ns)?)?;
    std::fs::write(dir.join("webhook.yaml"), build.webhook_manifest_in(ns)?)?;
    std::fs::write(dir.join("operator.yaml"), kubevirt::in_namespace(build.operator_manifest(&images)?, ns)?)?;
    kubectl(ctx, &dir, &["apply", "-f", "namespace.yaml"])?;
    kubectl(ctx, &dir, &["create", "-f", "webhook.yaml", "-n", ns])?;
    kubectl(ctx, &dir, &["create", "-f", "operator.yaml", "-n", ns])?;
    let theirs = wait_operator_available(ctx, ns, "the kubevirt operator").await?;
    Ok(Some(Install { build, dir, our_image, theirs, started, ns }))
}

/// `resource` (an example of the kubevirt operator) pointed at the storage node and created.
pub(super) fn create_resource(ctx: &Ctx, dir: &Path, ns: &str, resource: String) -> Result<()> {
    let resource = edit(resource, &[("kubernetes.io/os: linux", &format!("kubernetes.io/hostname: {NODE2_NAME}"))])?;
    std::fs::write(dir.join("resource.yaml"), resource)?;
    kubectl(ctx, dir, &["create", "-f", "resource.yaml"])
        .map_err(|e| e.context(pod_logs(ctx, ns, OPERATOR_DEPLOYMENT)))?;
    Ok(())
}

fn create_csi_class(ctx: &Ctx, dir: &Path, file: &Path) -> Result<()> {
    kubectl(ctx, dir, &["create", "-f", &file.display().to_string()])?;
    Ok(())
}

/// The move, as docs/operator.md says: the image set in deploy/operator (step 1), the kubevirt
/// operator and its webhook stopped (step 2), this operator applied (step 3), Available with a
/// `TookOver` Event (step 4); the CSI DaemonSet kept in `ns` (the kubevirt install's), the
/// finalizer replaced, the kubevirt monitoring replaced by this operator's. Returns the
/// documented commands and the directory the steps ran in.
pub(super) async fn move_to_this_operator(
    ctx: &Ctx,
    dir: &Path,
    our_image: &str,
    ns: &str,
) -> Result<(Vec<testbed::documented_commands::DocumentedCommand>, PathBuf)> {
    let docs = testbed::documented_commands::documented_commands(&ctx.repo)?;
    let work = dir.join("ours");
    copy_deploy(&ctx.repo, &work, our_image)?;
    // Before: the kubevirt operator's monitoring, made by it in its namespace.
    wait_monitoring(ctx, &[(ns, "prometheus-hpp-rules")], &[(ns, "service-monitor-hpp")]).await?;
    let found = run_documented(ctx, &work, &docs, SECTION, "kubectl get deployments -A", &[])?;
    ensure!(
        found.lines().any(|l| l.split_whitespace().next() == Some(ns)),
        "the documented command finds the kubevirt operator in {ns}: {found}"
    );
    run_documented(ctx, &work, &docs, SECTION, "kubectl -n NAMESPACE delete deployment", &[("NAMESPACE", ns)])?;
    run_documented(ctx, &work, &docs, SECTION, "kubectl delete validatingwebhookconfiguration", &[])?;
    run_documented(
        ctx,
        &work,
        &docs,
        SECTION,
        "kubectl apply --server-side --force-conflicts -k deploy/operator",
        &[],
    )?;
    wait_operator_available(ctx, NAMESPACE, "this operator").await?;
    wait_condition(ctx, "Available", "True").await?;
    wait_rolled_out(ctx, NAMESPACE, OUR_DAEMONSET).await?;
    // The take-over's steps land one by one (Available can come before the last of them).
    let events: Api<Event> = Api::namespaced(ctx.lane.client(), "default");
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.lane.client(), ns);
    testbed::wait_for(
        "a TookOver Event, the CSI DaemonSet kept without owner, the kubevirt finalizer replaced",
        Duration::from_secs(240),
        || async {
            let took_over = events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .any(|e| e.reason.as_deref() == Some("TookOver"));
            let csi_kept = daemonsets.get(CSI_DAEMONSET).await?.metadata.owner_references.is_none();
            let finalizers = resources(ctx).get(RESOURCE).await?.metadata.finalizers.unwrap_or_default();
            let replaced = finalizers == ["hostpathprovisioner.kubevirt.io/cleanup"];
            anyhow::Ok((took_over && csi_kept && replaced).then_some(()))
        },
    )
    .await
    .map_err(|e| e.context(pod_logs(ctx, NAMESPACE, OPERATOR_DEPLOYMENT)))?;
    // After: this operator's monitoring only; the kubevirt operator's, which watched pods that
    // no longer run, deleted with its metrics Service.
    // The node provisioner's monitoring and the operator's own (its replicas' `up`).
    let (ours, operator) = ("kubevirt-hostpath-provisioner", "hostpath-provisioner-operator");
    let set = [(NAMESPACE, ours), (NAMESPACE, operator)];
    wait_monitoring(ctx, &set, &set).await?;
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(ctx.lane.client(), ns);
    ensure!(services.get_opt("hpp-prometheus-metrics").await?.is_none(), "the kubevirt metrics Service deleted");
    Ok((docs, work))
}

/// Waits until the PrometheusRules and ServiceMonitors of the cluster are exactly `rules` and
/// `monitors` ((namespace, name) each).
async fn wait_monitoring(ctx: &Ctx, rules: &[(&str, &str)], monitors: &[(&str, &str)]) -> Result<()> {
    let list = |plural: &'static str, kind: &'static str| async move {
        let gvk = kube::core::GroupVersionKind::gvk("monitoring.coreos.com", "v1", kind);
        let api: Api<DynamicObject> =
            Api::all_with(ctx.lane.client(), &kube::core::ApiResource::from_gvk_with_plural(&gvk, plural));
        let mut names: Vec<String> = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|o| format!("{}/{}", o.metadata.namespace.unwrap_or_default(), o.metadata.name.unwrap_or_default()))
            .collect();
        names.sort();
        anyhow::Ok(names)
    };
    let want = |set: &[(&str, &str)]| {
        let mut names: Vec<String> = set.iter().map(|(ns, name)| format!("{ns}/{name}")).collect();
        names.sort();
        names
    };
    let (rules, monitors) = (want(rules), want(monitors));
    let last = std::sync::Mutex::new((Vec::new(), Vec::new()));
    testbed::wait_for("the PrometheusRules and ServiceMonitors", LANE_TIMEOUT, || {
        let (rules, monitors, last) = (&rules, &monitors, &last);
        async move {
            let found =
                (list("prometheusrules", "PrometheusRule").await?, list("servicemonitors", "ServiceMonitor").await?);
            let done = &found.0 == rules && &found.1 == monitors;
            *last.lock().expect("not poisoned") = found;
            anyhow::Ok(done.then_some(()))
        }
    })
    .await
    .map_err(|e| {
        let found = last.lock().expect("not poisoned").clone();
        e.context(format!("wanted rules {rules:?} and monitors {monitors:?}, found {found:?}"))
    })
}

/// Going back, as docs/operator.md says, with the kubevirt operator's files it was installed
/// from; its own Deployment and CSI DaemonSet running again.
pub(super) async fn go_back(
    ctx: &Ctx,
    dir: &Path,
    work: &Path,
    docs: &[testbed::documented_commands::DocumentedCommand],
    theirs: &Deployment,
    ns: &str,
) -> Result<()> {
    run_documented(
        ctx,
        work,
        docs,
        GOING_BACK,
        "kubectl -n hostpath-provisioner delete deployment hostpath-provisioner-operator",
        &[],
    )?;
    run_documented(ctx, work, docs, GOING_BACK, "kubectl -n hostpath-provisioner delete daemonset", &[])?;
    run_documented(ctx, work, docs, GOING_BACK, "kubectl -n hostpath-provisioner delete deployment -l", &[])?;
    run_documented(ctx, work, docs, GOING_BACK, "kubectl -n hostpath-provisioner delete prometheusrule", &[])?;
    let name = [("<name>", RESOURCE)];
    run_documented(ctx, work, docs, GOING_BACK, "kubectl patch hostpathprovisioner <name> --type", &name)?;
    run_documented(ctx, work, docs, GOING_BACK, "kubectl patch hostpathprovisioner <name> --subresource", &name)?;
    for file in ["operator.yaml", "webhook.yaml"] {
        std::fs::copy(dir.join(file), work.join(file))?;
    }
    run_documented(
        ctx,
        work,
        docs,
        GOING_BACK,
        "kubectl apply --server-side --force-conflicts -n NAMESPACE -f operator.yaml",
        &[("NAMESPACE", ns)],
    )?;
    run_documented(
        ctx,
        work,
        docs,
        GOING_BACK,
        "kubectl apply --server-side --force-conflicts -n NAMESPACE -f webhook.yaml",
        &[("NAMESPACE", ns)],
    )?;
    if ns != NAMESPACE {
        // What is left of this operator's install, whose names are not the kubevirt operator's
        // here (in a shared namespace they are, and stay).
        let leftovers = "kubectl -n hostpath-provisioner delete serviceaccount,role,rolebinding";
        run_documented(ctx, work, docs, GOING_BACK, leftovers, &[])?;
        let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(ctx.lane.client(), NAMESPACE);
        ensure!(accounts.get_opt(OPERATOR_DEPLOYMENT).await?.is_none(), "this operator's ServiceAccount removed");
    }
    let back = wait_operator_available(ctx, ns, "the kubevirt operator, back").await?;
    ensure!(
        back.spec.as_ref().map(|s| &s.selector) == theirs.spec.as_ref().map(|s| &s.selector),
        "its own Deployment again"
    );
    wait_rolled_out(ctx, ns, CSI_DAEMONSET).await?;
    // The kubevirt operator's monitoring back, made by it; this operator's gone.
    wait_monitoring(ctx, &[(ns, "prometheus-hpp-rules")], &[(ns, "service-monitor-hpp")]).await?;
    Ok(())
}

/// As the lane was: the kubevirt install out, the CSI class and the monitoring kinds gone,
/// deploy/legacy back.
pub(super) async fn uninstall_kubevirt(ctx: &Ctx, dir: &Path, ns: &str) -> Result<()> {
    kubectl(ctx, dir, &["delete", "-f", "operator.yaml", "-n", ns, "--ignore-not-found", "--wait"])?;
    kubectl(ctx, dir, &["delete", "-f", "webhook.yaml", "-n", ns, "--ignore-not-found"])?;
    kubectl(ctx, dir, &["delete", "storageclass", CSI_CLASS, "--ignore-not-found"])?;
    for crd in ["prometheusrules", "servicemonitors"] {
        kubectl(ctx, dir, &["delete", "crd", &format!("{crd}.monitoring.coreos.com"), "--ignore-not-found"])?;
    }
    ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    Ok(())
}

pub(super) fn kubectl(ctx: &Ctx, dir: &Path, args: &[&str]) -> Result<String> {
    ctx.lane.cp().run_kubectl(dir, args)
}

/// The documented command of `section` that starts with `start`, run in bash in `dir` as the
/// doc writes it (placeholders replaced), with the lane's kubectl and kubeconfig.
fn run_documented(
    ctx: &Ctx,
    dir: &Path,
    docs: &[testbed::documented_commands::DocumentedCommand],
    section: &str,
    start: &str,
    placeholders: &[(&str, &str)],
) -> Result<String> {
    let found: Vec<_> = docs
        .iter()
        .filter(|c| c.file == "docs/operator.md" && c.section == section && c.text.starts_with(start))
        .collect();
    ensure!(found.len() == 1, "docs/operator.md, {section:?}: one command starting with {start:?}, found {found:?}");
    let mut text = found[0].text.clone();
    for (placeholder, value) in placeholders {
        text = text.replace(placeholder, value);
    }
    let cp = ctx.lane.cp();
    let path = format!(
        "{}:{}",
        cp.kubectl().parent().context("kubectl's directory")?.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = Command::new("bash")
        .args(["-c", &text])
        .current_dir(dir)
        .env("PATH", path)
        .env("KUBECONFIG", cp.kubeconfig_path())
        .output()?;
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    ensure!(output.status.success(), "`{text}` ({}) failed:\n{stdout}\n{stderr}", found[0].location());
    println!("    ran `{text}` ({})", found[0].location());
    Ok(stdout.into_owned())
}

/// The repository's `deploy/` copied to `work`, with deploy/operator's image set to the lane's
/// (docs/operator.md's step 1: "set it in deploy/operator/kustomization.yaml").
fn copy_deploy(repo: &Path, work: &Path, image: &str) -> Result<()> {
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work)?;
    let status = Command::new("cp").arg("-r").arg(repo.join("deploy")).arg(work).status()?;
    ensure!(status.success(), "copying deploy/");
    let kustomization = work.join("deploy/operator/kustomization.yaml");
    let text = std::fs::read_to_string(&kustomization)?;
    let (name, tag) = image.rsplit_once(':').context("a tag in the lane's image")?;
    let placeholder = "newName: your-registry.invalid/hostpath-provisioner\n    newTag: \"0.1.0\"";
    ensure!(text.contains(placeholder), "deploy/operator/kustomization.yaml names no placeholder image");
    std::fs::write(&kustomization, text.replace(placeholder, &format!("newName: {name}\n    newTag: \"{tag}\"")))?;
    Ok(())
}

async fn wait_operator_available(ctx: &Ctx, ns: &str, what: &str) -> Result<Deployment> {
    let deployments: Api<Deployment> = Api::namespaced(ctx.lane.client(), ns);
    testbed::wait_until(
        &format!("{what} available"),
        Duration::from_secs(240),
        || deployments.get(OPERATOR_DEPLOYMENT),
        |d| d.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0) >= 1,
    )
    .await
    .map_err(|e| e.context(pod_logs(ctx, ns, OPERATOR_DEPLOYMENT)).context(ctx.lane.log_tails(30)))
}

pub(super) async fn wait_rolled_out(ctx: &Ctx, ns: &str, name: &str) -> Result<DaemonSet> {
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.lane.client(), ns);
    testbed::wait_until(
        &format!("DaemonSet {ns}/{name} running on {NODE2_NAME}"),
        Duration::from_secs(240),
        || async { Ok::<_, kube::Error>(daemonsets.get_opt(name).await?.unwrap_or_default()) },
        |d| {
            d.status.as_ref().is_some_and(|s| {
                s.desired_number_scheduled == 1
                    && s.number_ready == 1
                    && s.updated_number_scheduled == Some(1)
                    && s.observed_generation == d.metadata.generation
            })
        },
    )
    .await
    .map_err(|e| e.context(pod_logs(ctx, ns, name)).context(ctx.lane.log_tails(30)))
}

pub(super) async fn wait_gone<K>(ctx: &Ctx, ns: &str, name: &str) -> Result<()>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(ctx.lane.client(), ns);
    testbed::wait_for(&format!("{ns}/{name} gone"), LANE_TIMEOUT, || async {
        anyhow::Ok(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// The kubelet of the storage node lists the CSI driver in its CSINode (the registrar did its
/// part).
pub(super) async fn wait_driver_registered(ctx: &Ctx, ns: &str) -> Result<()> {
    let nodes: Api<k8s_openapi::api::storage::v1::CSINode> = Api::all(ctx.lane.client());
    testbed::wait_for(&format!("{CSI_DRIVER} registered on {NODE2_NAME}"), LANE_TIMEOUT, || async {
        let node = nodes.get_opt(NODE2_NAME).await?;
        let drivers = node.map(|n| n.spec.drivers).unwrap_or_default();
        anyhow::Ok(drivers.iter().any(|d| d.name == CSI_DRIVER).then_some(()))
    })
    .await
    .map_err(|e| e.context(pod_logs(ctx, ns, CSI_DAEMONSET)))
}

async fn wait_condition(ctx: &Ctx, kind: &str, status: &str) -> Result<()> {
    let api = resources(ctx);
    testbed::wait_for(&format!("the resource {kind} {status}"), Duration::from_secs(240), || async {
        let found: DynamicObject = api.get(RESOURCE).await?;
        let conditions = found.data["status"]["conditions"].as_array().cloned().unwrap_or_default();
        anyhow::Ok(conditions.iter().any(|c| c["type"] == kind && c["status"] == status).then_some(()))
    })
    .await
    .map_err(|e| e.context(pod_logs(ctx, NAMESPACE, OPERATOR_DEPLOYMENT)))
}

/// The logs of the pods of `ns` whose names start with `prefix`, for failure messages.
pub(super) fn pod_logs(ctx: &Ctx, ns: &str, prefix: &str) -> String {
    let dir = ctx.lane.dir().join("node2").join("pod-logs");
    let mut out = format!("logs of {ns}/{prefix}* on {NODE2_NAME}:\n");
    for entry in std::fs::read_dir(&dir).map(|rd| rd.flatten().collect::<Vec<_>>()).unwrap_or_default() {
        if entry.file_name().to_string_lossy().starts_with(&format!("{ns}_{prefix}")) {
            for file in walk(&entry.path()) {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                out.push_str(&format!("--- {}\n", file.display()));
                out.extend(tail.into_iter().rev().map(|l| format!("{l}\n")));
            }
        }
    }
    out
}

pub(super) fn csi_driver_of(pv: &PersistentVolume) -> Option<&str> {
    pv.spec.as_ref()?.csi.as_ref().map(|c| c.driver.as_str())
}

/// A user's volumes in namespace `ns`, on the storage node.
pub(super) struct Volumes<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) ns: String,
    /// Where the CSI driver keeps its volumes on the node: `<pool path>/csi`.
    pub(super) csi_root: PathBuf,
}

impl Volumes<'_> {
    /// Where `claim`'s data is, as the storage node sees it (its mounts included): a hostPath
    /// PV's path, or a CSI volume's directory (`<pool path>/csi/<volume handle>`).
    pub(super) async fn data_dir(&self, claim: &str) -> Result<PathBuf> {
        let pv = self.ctx.pv_of(&self.ns, claim).await?;
        let spec = pv.spec.clone().unwrap_or_default();
        let path = match (spec.host_path, spec.csi) {
            (Some(host_path), _) => PathBuf::from(host_path.path),
            (None, Some(csi)) => self.csi_root.join(csi.volume_handle),
            _ => anyhow::bail!("{claim}'s PV is neither hostPath nor CSI"),
        };
        self.ctx.lane.path_in_second_node(&path)
    }

    /// A claim of `class` with a pod on the storage node that writes its name into it and
    /// keeps running; returns the PV.
    pub(super) async fn claim_with_writer(&self, name: &str, class: &str) -> Result<PersistentVolume> {
        let (ctx, ns) = (self.ctx, self.ns.as_str());
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
        claims.create(&PostParams::default(), &fixtures::claim(ns, name, class, "16Mi").build()).await?;
        let writer = PodRun::new(ns, name, &format!("echo {name} > /data/{name} && sleep 3600"))
            .claim(name)
            .on_node(NODE2_NAME)
            .keep_running();
        ctx.lane.run_pod(&writer).await.map_err(|e| e.context(pod_logs(ctx, NAMESPACE, "")))?;
        let dir = self.data_dir(name).await?;
        testbed::wait_for(&format!("{name} written in {}", dir.display()), LANE_TIMEOUT, || async {
            anyhow::Ok((std::fs::read_to_string(dir.join(name)).ok() == Some(format!("{name}\n"))).then_some(()))
        })
        .await?;
        ctx.pv_of(ns, name).await
    }

    /// `claim`'s data is on `disk`'s filesystem (the pool's claim), not on the node's root.
    pub(super) async fn on_the_disk(&self, disk: &LoopDisk, claim: &str) -> Result<()> {
        let file = self.data_dir(claim).await?.join(claim);
        let dev = std::fs::metadata(&file).with_context(|| format!("{}", file.display()))?.dev();
        ensure!(dev == disk.dev, "{claim}'s data on the pool's disk (device {dev:#x}, the disk's {:#x})", disk.dev);
        Ok(())
    }

    /// The pods still run, never restarted, and their data is where it was.
    pub(super) async fn still_running_with_their_data(&self, names: &[&str]) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.ctx.lane.client(), &self.ns);
        for name in names {
            let status = pods.get(name).await?.status.context("status")?;
            ensure!(status.phase.as_deref() == Some("Running"), "{name} still running");
            let restarts: i32 = status.container_statuses.iter().flatten().map(|c| c.restart_count).sum();
            ensure!(restarts == 0, "{name} restarted {restarts} times");
            let dir = self.data_dir(name).await?;
            ensure!(std::fs::read_to_string(dir.join(name))? == format!("{name}\n"), "{name}'s data kept");
        }
        Ok(())
    }

    /// The claim's pod made again: the volume mounts (through the CSI driver for a CSI
    /// volume) and the new pod reads what the first one wrote.
    pub(super) async fn mounts_again(&self, claim: &str) -> Result<()> {
        let (ctx, ns) = (self.ctx, self.ns.as_str());
        ctx.lane.delete_pod(ns, claim).await?;
        let reader = PodRun::new(ns, claim, &format!("grep -qx {claim} /data/{claim} && sleep 3600"))
            .claim(claim)
            .on_node(NODE2_NAME)
            .keep_running();
        let outcome =
            ctx.lane.run_pod(&reader).await.map_err(|e| e.context(pod_logs(ctx, NAMESPACE, CSI_DAEMONSET)))?;
        // A pod that did not find the file ends (Failed) instead of running on.
        let phase = outcome.pod.status.as_ref().and_then(|s| s.phase.clone());
        ensure!(
            phase.as_deref() == Some("Running"),
            "{claim} mounted again with its data: pod {phase:?}, {}",
            outcome.logs
        );
        Ok(())
    }

    /// Stops the claim's pod, deletes the claim and waits until its PV and data are gone.
    pub(super) async fn reclaim(&self, claim: &str) -> Result<()> {
        let (ctx, ns) = (self.ctx, self.ns.as_str());
        ctx.lane.delete_pod(ns, claim).await?;
        let dir = self.data_dir(claim).await?;
        let pv = ctx.pv_of(ns, claim).await?.metadata.name.unwrap_or_default();
        Api::<PersistentVolumeClaim>::namespaced(ctx.lane.client(), ns).delete(claim, &DeleteParams::default()).await?;
        let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
        testbed::wait_for(&format!("PV {pv} and {} gone", dir.display()), LANE_TIMEOUT, || async {
            anyhow::Ok((pvs.get_opt(&pv).await?.is_none() && !dir.exists()).then_some(()))
        })
        .await
        .map_err(|e| e.context(pod_logs(ctx, NAMESPACE, "")))
    }
}

/// The second provisioner name of docs/kubevirt.md, "Placing VM disks by free space".
const CAPACITY_NAME: &str = "hostpath.example.org";

/// With `spec.config.publishCapacity` and `capacityProvisionerName` on the migrated resource: the
/// operator makes the CSIDriver of the second name and rolls the nodes out with it, the storage
/// node publishes its room for a WaitForFirstConsumer class of that name, kube-scheduler refuses
/// a pod whose claim no node has room for (it read the published capacity), and places one that
/// fits, whose volume this provisioner makes under the second name. Then off again: the
/// CSIDriver goes, the class's volume is reclaimed.
async fn places_by_capacity(ctx: &Ctx, dir: &Path, volumes: &Volumes<'_>) -> Result<()> {
    use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity, StorageClass};
    let on = json!({"spec": {"config": {"publishCapacity": true, "capacityProvisionerName": CAPACITY_NAME}}});
    kubectl(ctx, dir, &["patch", "hostpathprovisioner", RESOURCE, "--type", "merge", "-p", &on.to_string()])?;
    let drivers: Api<CSIDriver> = Api::all(ctx.lane.client());
    testbed::wait_for("the CSIDriver of the second name", LANE_TIMEOUT, || async {
        anyhow::Ok(drivers.get_opt(CAPACITY_NAME).await?.filter(|d| d.spec.storage_capacity == Some(true)))
    })
    .await?;
    let class = "placed-by-capacity";
    let placed = json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": class},
        "provisioner": CAPACITY_NAME, "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete"});
    let classes: Api<StorageClass> = Api::all(ctx.lane.client());
    classes.create(&PostParams::default(), &serde_json::from_value(placed)?).await?;
    let capacities: Api<CSIStorageCapacity> = Api::namespaced(ctx.lane.client(), NAMESPACE);
    testbed::wait_for("the storage node's room published for the class", LANE_TIMEOUT, || async {
        let listed = capacities.list(&ListParams::default()).await?.items;
        anyhow::Ok(listed.iter().any(|c| c.storage_class_name == class && c.capacity.is_some()).then_some(()))
    })
    .await
    .map_err(|e| e.context(pod_logs(ctx, NAMESPACE, OUR_DAEMONSET)))?;

    // A claim no node has room for: the scheduler itself says so, and nothing is made.
    let ns = volumes.ns.as_str();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
    claims.create(&PostParams::default(), &fixtures::claim(ns, "too-big", class, "1Ei").build()).await?;
    let pod = PodRun::new(ns, "too-big", "sleep 3600").claim("too-big").on_node(NODE2_NAME).build();
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), ns);
    let uid = pods.create(&PostParams::default(), &pod).await?.metadata.uid.unwrap_or_default();
    let events: Api<Event> = Api::namespaced(ctx.lane.client(), ns);
    testbed::wait_for("the scheduler refusing the pod for want of storage", LANE_TIMEOUT, || async {
        let listed = events.list(&ListParams::default().fields(&format!("involvedObject.uid={uid}"))).await?.items;
        anyhow::Ok(
            listed
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("FailedScheduling")
                        && e.message.as_deref().is_some_and(|m| m.contains("did not have enough free storage"))
                })
                .then_some(()),
        )
    })
    .await?;
    pods.delete("too-big", &DeleteParams::default()).await?;
    claims.delete("too-big", &DeleteParams::default()).await?;

    // One that fits: placed, and made by this provisioner under the second name.
    let pv = volumes.claim_with_writer("placed", class).await?;
    let provisioned_by = pv.metadata.annotations.as_ref().and_then(|a| a.get("pv.kubernetes.io/provisioned-by"));
    ensure!(made_by_us(&pv) && provisioned_by.map(String::as_str) == Some(CAPACITY_NAME), "{:?}", pv.metadata);
    volumes.reclaim("placed").await?;
    classes.delete(class, &DeleteParams::default()).await?;
    let off = json!({"spec": {"config": null}});
    kubectl(ctx, dir, &["patch", "hostpathprovisioner", RESOURCE, "--type", "merge", "-p", &off.to_string()])?;
    testbed::wait_for("the CSIDriver removed with publishing off", LANE_TIMEOUT, || async {
        anyhow::Ok(drivers.get_opt(CAPACITY_NAME).await?.is_none().then_some(()))
    })
    .await?;
    wait_rolled_out(ctx, NAMESPACE, OUR_DAEMONSET).await?;
    Ok(())
}

/// Replaces each `from` (which must occur) by its `to`.
pub(super) fn edit(mut text: String, edits: &[(&str, &str)]) -> Result<String> {
    for (from, to) in edits {
        ensure!(text.contains(from), "the upstream file no longer has {from:?}");
        text = text.replace(from, to);
    }
    Ok(text)
}

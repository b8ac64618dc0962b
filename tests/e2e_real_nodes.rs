//! End-to-end on a real kubelet: the project's image runs as the DaemonSet of `deploy/legacy`
//! and real pods, running as various users, mount and use the volumes it makes.
//!
//! One lane (control plane, containerd, kubelet; see `testbed::real_nodes`) serves every
//! scenario in turn, so this is a plain `main` (`harness = false` in Cargo.toml) that runs the
//! scenarios in order, reports each like libtest, and tears the lane down at the end. An
//! argument filters scenarios by substring. Without root or packages the lane is skipped with
//! a message, except under `CI=true`, where a lane that cannot start fails.

use std::future::Future;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::FutureExt;
use k8s_openapi::api::core::v1::TypedLocalObjectReference;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod, Toleration};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use testbed::fixtures;
use testbed::real_nodes::{DEPLOY_DAEMONSET, DEPLOY_NAMESPACE, LANE_TIMEOUT, Lane, LaneOptions, PodRun, images};

/// The class `deploy/legacy` installs (WaitForFirstConsumer).
const CLASS: &str = "hostpath-provisioner";
const PROVISIONER_LABEL: &str = "k8s-app=kubevirt-hostpath-provisioner";
/// CAP_CHOWN (0), CAP_DAC_OVERRIDE (1), CAP_FOWNER (3) and CAP_FSETID (4): what daemonset.yaml
/// adds back after dropping ALL.
const CAPABILITIES: u64 = (1 << 0) | (1 << 1) | (1 << 3) | (1 << 4);

struct Ctx {
    lane: Lane,
    repo: PathBuf,
    archive: PathBuf,
    /// The image as the rendered DaemonSet names it, set by the first scenario.
    image: std::sync::Mutex<Option<String>>,
}

#[path = "real_nodes/local_volumes.rs"]
mod local_volumes;
use local_volumes::{
    a_local_volume_gets_the_pods_fs_group_and_shows_in_the_kubelets_volume_stats,
    a_pod_of_another_user_writes_into_a_class_owned_volume_through_its_group,
    two_pods_of_the_node_share_a_node_volume_with_node_local_sharing,
};
#[path = "real_nodes/registry_pull.rs"]
mod registry_pull;
use registry_pull::the_provisioner_image_is_pulled_by_reference_from_a_registry;
#[path = "real_nodes/helm_test.rs"]
mod helm_test;
use helm_test::helm_test_provisions_a_volume_a_non_root_pod_writes_into_and_fails_when_it_cannot;
#[path = "real_nodes/two_nodes.rs"]
mod two_nodes;
use two_nodes::{
    a_daemonset_rollout_across_two_nodes_loses_nothing_two_nodes,
    a_shared_volume_written_on_one_node_is_read_on_the_other_two_nodes,
    an_every_node_volume_gives_each_nodes_pod_its_own_directory_two_nodes,
};
#[path = "real_nodes/operator_helm.rs"]
mod operator_helm;
use operator_helm::the_documented_one_step_helm_install_of_the_operator_provisions_a_volume_a_pod_writes;
#[path = "real_nodes/operator.rs"]
mod operator;
use operator::the_operator_mounts_a_pool_on_a_claim_of_a_local_pv_and_keeps_it_while_its_volume_lives;
use operator::the_operators_resource_turns_on_one_pool_over_two_disks_with_a_reserve_and_the_quota_capability;
#[path = "real_nodes/drain.rs"]
mod drain;
use drain::kubectl_drain_of_a_node_whose_pool_sits_on_a_claim_loses_nothing_and_the_pool_comes_back;
#[path = "real_nodes/disk_label.rs"]
mod disk_label;
use disk_label::a_volume_pinned_to_a_disk_label_follows_the_disk_to_the_other_node_two_nodes;
#[path = "real_nodes/removed_node.rs"]
mod removed_node;
use removed_node::a_statefulset_whose_node_is_removed_comes_back_on_the_other_node_with_a_new_volume_two_nodes;
#[path = "real_nodes/snapshots.rs"]
mod snapshots;
use snapshots::a_snapshot_of_a_volume_a_pod_wrote_restores_the_files_as_they_were_for_another_pod;
#[path = "real_nodes/block.rs"]
mod block;
#[path = "real_nodes/block_lifecycle.rs"]
mod block_lifecycle;
use block::a_block_volume_keeps_its_data_across_pods_clones_snapshots_growth_and_a_reboot_never_mapping_another_file;
#[path = "real_nodes/swap.rs"]
mod swap;
use swap::a_swap_from_the_go_build_to_this_one_and_back_loses_and_orphans_nothing_two_nodes;
#[path = "real_nodes/upgrade_helm.rs"]
mod upgrade_helm;
use upgrade_helm::an_earlier_helm_release_upgraded_under_a_burst_of_claims_and_rolled_back_loses_nothing_two_nodes;
#[path = "real_nodes/upgrade_checks.rs"]
mod upgrade_checks;
#[path = "real_nodes/upgrade_claim_pool.rs"]
mod upgrade_claim_pool;
#[path = "real_nodes/upgrade_helm_operator.rs"]
mod upgrade_helm_operator;
use upgrade_helm_operator::an_earlier_helm_release_in_operator_mode_upgraded_under_a_burst_and_rolled_back_loses_nothing_two_nodes;
#[path = "real_nodes/upgrade_kustomize.rs"]
mod upgrade_kustomize;
use upgrade_kustomize::an_earlier_kustomize_install_upgraded_by_applying_the_new_release_under_a_burst_and_rolled_back_loses_nothing_two_nodes;
#[path = "real_nodes/upgrade_operator.rs"]
mod upgrade_operator;
use upgrade_operator::an_earlier_operator_upgraded_by_applying_the_new_release_under_a_burst_and_rolled_back_loses_nothing_two_nodes;
#[path = "real_nodes/kubevirt_migration.rs"]
mod kubevirt_migration;
use kubevirt_migration::a_kubevirt_operator_cluster_moves_to_this_operator_and_back_with_its_volumes_two_nodes;
#[path = "real_nodes/kubevirt_pool_migration.rs"]
mod kubevirt_pool_migration;
use kubevirt_pool_migration::a_kubevirt_operator_cluster_with_a_pool_on_a_claim_moves_and_back_with_its_mount_two_nodes;

/// Set to 1 by `make test`, which runs this lane at the same time as the rest of the suite, in
/// a `cargo test` of its own: the suite's run of this binary then does nothing.
const APART_ENV: &str = "TESTBED_REAL_NODES_APART";

/// The `HostPathProvisioner` resources (cluster-scoped), for the operator scenarios.
fn resources(ctx: &Ctx) -> Api<kube::api::DynamicObject> {
    let gvk = kube::core::GroupVersionKind::gvk("hostpathprovisioner.kubevirt.io", "v1beta1", "HostPathProvisioner");
    Api::all_with(ctx.lane.client(), &kube::core::ApiResource::from_gvk_with_plural(&gvk, "hostpathprovisioners"))
}

/// Suffix of the scenarios that run with the second real node; the others run without it.
const TWO_NODES: &str = "_two_nodes";

type Scenario = for<'a> fn(&'a Ctx) -> Pin<Box<dyn Future<Output = Result<()>> + 'a>>;

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        [$((stringify!($name), (|ctx| Box::pin($name(ctx))) as Scenario)),*]
    };
}

fn main() -> ExitCode {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    runtime.block_on(run(filter))
}

async fn run(filter: Option<String>) -> ExitCode {
    let scenarios = scenarios![
        the_deploy_legacy_daemonset_runs_with_its_own_token_probes_read_only_root_and_two_capabilities,
        a_non_root_pod_writes_into_a_wffc_volume_and_the_file_is_on_the_host_with_its_owner_and_mode,
        reclaim_removes_what_several_uids_left_in_0700_1777_and_0500_directories,
        a_pod_that_plants_symlinks_out_of_its_volume_changes_nothing_outside_it_when_the_claim_goes,
        a_pod_stops_at_its_quota_and_writes_past_it_after_an_online_expansion_without_restarting,
        a_clone_of_a_claim_a_pod_wrote_into_gives_another_pod_the_same_files_and_owners,
        a_snapshot_of_a_volume_a_pod_wrote_restores_the_files_as_they_were_for_another_pod,
        // Turns BLOCK_VOLUMES on (a privileged container) and restores the template after.
        a_block_volume_keeps_its_data_across_pods_clones_snapshots_growth_and_a_reboot_never_mapping_another_file,
        a_local_volume_gets_the_pods_fs_group_and_shows_in_the_kubelets_volume_stats,
        two_pods_of_the_node_share_a_node_volume_with_node_local_sharing,
        a_pod_of_another_user_writes_into_a_class_owned_volume_through_its_group,
        helm_test_provisions_a_volume_a_non_root_pod_writes_into_and_fails_when_it_cannot,
        // Before the other operator scenarios: nothing of the operator is applied yet.
        the_documented_one_step_helm_install_of_the_operator_provisions_a_volume_a_pod_writes,
        the_operator_mounts_a_pool_on_a_claim_of_a_local_pv_and_keeps_it_while_its_volume_lives,
        the_operators_resource_turns_on_one_pool_over_two_disks_with_a_reserve_and_the_quota_capability,
        kubectl_drain_of_a_node_whose_pool_sits_on_a_claim_loses_nothing_and_the_pool_comes_back,
        // The second real node joins for these (names end in TWO_NODES) and leaves after them.
        a_shared_volume_written_on_one_node_is_read_on_the_other_two_nodes,
        an_every_node_volume_gives_each_nodes_pod_its_own_directory_two_nodes,
        a_daemonset_rollout_across_two_nodes_loses_nothing_two_nodes,
        a_volume_pinned_to_a_disk_label_follows_the_disk_to_the_other_node_two_nodes,
        // It takes the second node out itself; the swap brings it back.
        a_statefulset_whose_node_is_removed_comes_back_on_the_other_node_with_a_new_volume_two_nodes,
        // Last: it replaces the DaemonSet twice, on both nodes.
        a_swap_from_the_go_build_to_this_one_and_back_loses_and_orphans_nothing_two_nodes,
        // `make test-upgrade` only (they say so here): a Helm release, a deploy/legacy install,
        // a Helm release in operator mode and an operator of the pinned earlier commit, upgraded
        // and rolled back on both nodes; deploy/legacy set aside meanwhile (the kustomize one
        // replaces it, and puts it back).
        an_earlier_helm_release_upgraded_under_a_burst_of_claims_and_rolled_back_loses_nothing_two_nodes,
        an_earlier_kustomize_install_upgraded_by_applying_the_new_release_under_a_burst_and_rolled_back_loses_nothing_two_nodes,
        an_earlier_helm_release_in_operator_mode_upgraded_under_a_burst_and_rolled_back_loses_nothing_two_nodes,
        an_earlier_operator_upgraded_by_applying_the_new_release_under_a_burst_and_rolled_back_loses_nothing_two_nodes,
        // After every scenario that runs the lane's imported images: a pull gives containerd's CRI
        // image cache a second name for the same image, which later re-imports of that image did
        // not survive (containerd 1.6: the kubelet pulled an image the store had).
        the_provisioner_image_is_pulled_by_reference_from_a_registry,
        // `make test-kubevirt-migration` only (it says so here): the kubevirt install replaces
        // the DaemonSet on the second node.
        a_kubevirt_operator_cluster_moves_to_this_operator_and_back_with_its_volumes_two_nodes,
        a_kubevirt_operator_cluster_with_a_pool_on_a_claim_moves_and_back_with_its_mount_two_nodes,
    ];
    let selected: Vec<_> =
        scenarios.iter().filter(|(name, _)| filter.as_deref().is_none_or(|f| name.contains(f))).collect();
    println!("\nrunning {} real-node tests", selected.len());
    if selected.is_empty() {
        return ExitCode::SUCCESS;
    }
    if std::env::var(APART_ENV).is_ok_and(|v| v == "1") {
        println!(
            "not here: `make test` runs the real-node lane in its own `cargo test --test e2e_real_nodes` ({APART_ENV}=1)"
        );
        return ExitCode::SUCCESS;
    }
    if let Err(reason) = testbed::real_nodes::availability() {
        if testbed::in_ci() {
            eprintln!("error: the real-node lane cannot run and CI=true: {reason:#}");
            return ExitCode::FAILURE;
        }
        println!("SKIPPED: the real-node lane cannot run here: {reason:#}");
        println!(
            "(it needs root, apt packages containerd runc busybox-static containernetworking-plugins iptables gcc)"
        );
        return ExitCode::SUCCESS;
    }

    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let started = Instant::now();
    let archive = match build_image(&repo) {
        Ok(archive) => archive,
        Err(err) => {
            eprintln!("error: building the provisioner image: {err:#}");
            return ExitCode::FAILURE;
        }
    };
    println!("provisioner image ready in {:.1} s", started.elapsed().as_secs_f64());
    let options = LaneOptions {
        simulated_nodes: 1,
        simulated_node_binary: Some(PathBuf::from(env!("CARGO_BIN_EXE_hostpath-provisioner"))),
    };
    let lane = match Lane::start(options).await {
        Ok(lane) => lane,
        Err(err) => {
            eprintln!("error: the real-node lane did not start: {err:#}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "lane up in {:.1} s (node {} Ready; files in {})",
        lane.started_in().as_secs_f64(),
        lane.node_name(),
        lane.dir().display()
    );
    let ctx = Ctx { lane, repo, archive, image: std::sync::Mutex::new(None) };

    let mut failed: Vec<String> = Vec::new();
    // Ctrl-C ends the run and still tears the lane down.
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    for (name, scenario) in selected {
        if !name.ends_with(TWO_NODES) && ctx.lane.has_second_node() {
            let started = Instant::now();
            match ctx.lane.remove_second_node().await {
                Ok(()) => println!("second real node removed in {:.1} s", started.elapsed().as_secs_f64()),
                Err(err) => {
                    println!("test {name} ... FAILED (the second real node did not leave)");
                    eprintln!("---- {name} ----\n{err:#}\n{}", ctx.lane.log_tails(20));
                    failed.push(name.to_string());
                    continue;
                }
            }
        }
        let started = Instant::now();
        let run = tokio::time::timeout(Duration::from_secs(600), AssertUnwindSafe(scenario(&ctx)).catch_unwind());
        let outcome = tokio::select! {
            outcome = run => outcome,
            _ = &mut interrupted => {
                println!("test {name} ... interrupted (Ctrl-C); tearing the lane down");
                failed.push(format!("{name} (interrupted)"));
                break;
            }
        };
        let result = match outcome {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(err))) => Err(format!("{err:#}")),
            Ok(Err(panic)) => Err(panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into())),
            Err(_) => Err("timed out after 600 s".into()),
        };
        let secs = started.elapsed().as_secs_f64();
        match result {
            Ok(()) => println!("test {name} ... ok ({secs:.1} s)"),
            Err(message) => {
                println!("test {name} ... FAILED ({secs:.1} s)");
                eprintln!("---- {name} ----\n{message}\n{}", ctx.lane.log_tails(20));
                failed.push(name.to_string());
            }
        }
    }

    let kept = keep_logs(&ctx.lane, &ctx.repo.join("target/real-nodes-logs"));
    println!("logs of the kubelet, containerd, the control plane and every pod: {}", kept.display());
    let started = Instant::now();
    let teardown = ctx.lane.teardown().await;
    println!("lane torn down in {:.1} s", started.elapsed().as_secs_f64());
    if let Err(err) = teardown {
        eprintln!("error: teardown: {err:#}");
        return ExitCode::FAILURE;
    }
    if failed.is_empty() {
        println!("\ntest result: ok. real-node lane passed");
        ExitCode::SUCCESS
    } else {
        println!("\ntest result: FAILED. failures: {}", failed.join(", "));
        ExitCode::FAILURE
    }
}

/// Copies the node's and control plane's logs and every container's log (the lane directory
/// goes at teardown) for a look after the run, or as CI artefacts.
fn keep_logs(lane: &Lane, out: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(out);
    let _ = std::fs::create_dir_all(out.join("pods"));
    for (name, path) in lane.log_paths() {
        let _ = std::fs::copy(path, out.join(format!("{name}.log")));
    }
    let pod_logs = lane.dir().join("pod-logs");
    for file in walk(&pod_logs) {
        if let Ok(relative) = file.strip_prefix(&pod_logs) {
            let name = relative.to_string_lossy().replace('/', "__");
            let _ = std::fs::copy(&file, out.join("pods").join(name));
        }
    }
    out.to_path_buf()
}

/// The static provisioner (cargo rebuilds it only when the source changed) in an OCI archive.
fn build_image(repo: &Path) -> Result<PathBuf> {
    let binary = images::build_static_provisioner(repo)?;
    // Not `make image`'s archive (both platforms), which it would otherwise overwrite.
    let archive = images::image_dir(repo).join("hostpath-provisioner-lane.oci.tar");
    images::provisioner_image(&binary, &images::local_image(repo)?).write(&archive)?;
    Ok(archive)
}

impl Ctx {
    /// Deploys `deploy/legacy` once; later scenarios reuse it.
    async fn deployed(&self) -> Result<String> {
        if let Some(image) = self.image.lock().expect("image lock").clone() {
            return Ok(image);
        }
        let image = self.lane.deploy_legacy(&self.repo, &self.archive).await?;
        *self.image.lock().expect("image lock") = Some(image.clone());
        Ok(image)
    }

    async fn namespace(&self, prefix: &str) -> Result<String> {
        let ns = testbed::unique_name(prefix);
        self.lane.create_namespace(&ns).await?;
        Ok(ns)
    }

    async fn create_claim(&self, ns: &str, name: &str) -> Result<PersistentVolumeClaim> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.lane.client(), ns);
        Ok(claims.create(&PostParams::default(), &fixtures::claim(ns, name, CLASS, "16Mi").build()).await?)
    }

    /// An Immediate class of ours with these parameters, named after the namespace.
    async fn class(&self, ns: &str, params: &[(&str, &str)]) -> Result<String> {
        let name = format!("{ns}-class");
        let mut class = fixtures::storage_class(&name, "kubevirt.io/hostpath-provisioner").immediate();
        for (key, value) in params {
            class = class.parameter(key, value);
        }
        Api::<StorageClass>::all(self.lane.client()).create(&PostParams::default(), &class.build()).await?;
        Ok(name)
    }

    /// A ReadWriteMany claim of `class`, waited for until Bound.
    async fn bound_rwx_claim(&self, ns: &str, name: &str, class: &str) -> Result<PersistentVolume> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.lane.client(), ns);
        let claim = fixtures::claim(ns, name, class, "16Mi").access_modes(&["ReadWriteMany"]).build();
        claims.create(&PostParams::default(), &claim).await?;
        testbed::wait_until(
            &format!("claim {ns}/{name} Bound"),
            LANE_TIMEOUT,
            || claims.get(name),
            |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
        )
        .await
        .map_err(|e| e.context(self.provisioner_logs()))?;
        self.pv_of(ns, name).await
    }

    async fn pv_of(&self, ns: &str, claim: &str) -> Result<PersistentVolume> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.lane.client(), ns);
        let name = claims.get(claim).await?.spec.and_then(|s| s.volume_name).context("claim not bound")?;
        Ok(Api::<PersistentVolume>::all(self.lane.client()).get(&name).await?)
    }

    /// Deletes the claim, then waits until its PV and directory are gone.
    async fn delete_claim_and_wait_reclaimed(&self, ns: &str, claim: &str) -> Result<PathBuf> {
        let dir = self.lane.volume_dir(ns, claim).await?;
        let pv = self.pv_of(ns, claim).await?.metadata.name.unwrap_or_default();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.lane.client(), ns);
        claims.delete(claim, &DeleteParams::default()).await?;
        let pvs: Api<PersistentVolume> = Api::all(self.lane.client());
        testbed::wait_for(&format!("PV {pv} and {} gone", dir.display()), LANE_TIMEOUT, || async {
            anyhow::Ok((pvs.get_opt(&pv).await?.is_none() && !dir.exists()).then_some(()))
        })
        .await
        .map_err(|e| e.context(self.provisioner_logs()))?;
        Ok(dir)
    }

    /// The DaemonSet pod's log, for failure messages.
    fn provisioner_logs(&self) -> String {
        let pods = std::fs::read_dir(self.lane.dir().join("pod-logs")).map(|rd| rd.flatten().collect::<Vec<_>>());
        let mut out = String::from("provisioner pod logs:\n");
        for entry in pods.unwrap_or_default() {
            if entry.file_name().to_string_lossy().starts_with(DEPLOY_NAMESPACE) {
                for file in walk(&entry.path()) {
                    out.push_str(&std::fs::read_to_string(file).unwrap_or_default());
                }
            }
        }
        out
    }

    async fn provisioner_pods(&self) -> Result<Vec<Pod>> {
        let pods: Api<Pod> = Api::namespaced(self.lane.client(), DEPLOY_NAMESPACE);
        Ok(pods.list(&ListParams::default().labels(PROVISIONER_LABEL)).await?.items)
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() { out.extend(walk(&path)) } else { out.push(path) }
    }
    out
}

/// `/proc/<pid>/status` field `key` (e.g. `CapEff`, `Uid`).
fn proc_status(pid: u32, key: &str) -> Result<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")).map(|v| v.trim().to_string()))
        .with_context(|| format!("{key} not in /proc/{pid}/status"))
}

fn container_id(pod: &Pod, container: &str) -> Result<String> {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == container))
        .and_then(|c| c.container_id.clone())
        .context("container has no ID yet")?;
    Ok(id.trim_start_matches("containerd://").to_string())
}

async fn the_deploy_legacy_daemonset_runs_with_its_own_token_probes_read_only_root_and_two_capabilities(
    ctx: &Ctx,
) -> Result<()> {
    let image = ctx.deployed().await?;
    let pods = ctx.provisioner_pods().await?;
    ensure!(pods.len() == 1, "one provisioner pod on the one real node, got {}", pods.len());
    let pod = &pods[0];
    let spec = pod.spec.as_ref().context("spec")?;
    ensure!(spec.node_name.as_deref() == Some(ctx.lane.node_name()), "DaemonSet pod on the real node only");
    let container = &spec.containers[0];
    ensure!(container.image.as_deref() == Some(image.as_str()), "runs the image of the manifests");
    ensure!(container.readiness_probe.is_some() && container.liveness_probe.is_some(), "both probes in the spec");
    let status = pod.status.as_ref().and_then(|s| s.container_statuses.as_ref()).context("container status")?;
    ensure!(status[0].ready, "readiness probe passed (container ready)");
    ensure!(status[0].restart_count == 0, "no restarts (liveness probe never failed)");
    // ServiceAccount admission added the projected token volume; the kubelet mounted it.
    ensure!(
        spec.volumes.iter().flatten().any(|v| v.projected.as_ref().is_some_and(|p| p
            .sources
            .iter()
            .flatten()
            .any(|s| s.service_account_token.is_some()))),
        "a projected ServiceAccount token volume"
    );

    let id = container_id(pod, "kubevirt-hostpath-provisioner")?;
    let pid = ctx
        .lane
        .container_pids()?
        .into_iter()
        .find(|(task, _)| *task == id)
        .map(|(_, pid)| pid)
        .context("the provisioner's task in containerd")?;
    let cap_eff = u64::from_str_radix(&proc_status(pid, "CapEff")?, 16)?;
    ensure!(cap_eff == CAPABILITIES, "effective capabilities {cap_eff:#x}, want CHOWN+DAC_OVERRIDE+FOWNER+FSETID only");
    let uid = proc_status(pid, "Uid")?;
    ensure!(uid.split_whitespace().next() == Some("0"), "runs as uid 0: {uid}");
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    let root = mountinfo.lines().find(|l| l.split(' ').nth(4) == Some("/")).context("root mount")?;
    ensure!(root.split(' ').nth(5).is_some_and(|o| o.split(',').any(|o| o == "ro")), "read-only root: {root}");
    let token = PathBuf::from(format!("/proc/{pid}/root/var/run/secrets/kubernetes.io/serviceaccount/token"));
    ensure!(std::fs::metadata(&token).is_ok_and(|m| m.len() > 0), "token mounted at the in-cluster path");
    let no_write = std::fs::write(format!("/proc/{pid}/root/probe"), b"x");
    ensure!(no_write.is_err(), "the container's root file system refuses writes");

    // It provisions for a real pod: with no other credentials than that token.
    let ns = ctx.namespace("deploy").await?;
    ctx.create_claim(&ns, "data").await?;
    let outcome =
        ctx.lane.run_pod(&PodRun::new(&ns, "writer", "echo from-a-real-pod > /data/hello.txt").claim("data")).await?;
    ensure!(outcome.exit_code == Some(0), "writer exited {:?}: {}", outcome.exit_code, outcome.logs);
    let dir = ctx.lane.volume_dir(&ns, "data").await?;
    ensure!(dir.starts_with(ctx.lane.pool_root()), "{} in the DaemonSet's pool", dir.display());
    ensure!(std::fs::read_to_string(dir.join("hello.txt"))? == "from-a-real-pod\n");
    ctx.lane.delete_pod(&ns, "writer").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "data").await?;
    Ok(())
}

async fn a_non_root_pod_writes_into_a_wffc_volume_and_the_file_is_on_the_host_with_its_owner_and_mode(
    ctx: &Ctx,
) -> Result<()> {
    ctx.deployed().await?;
    let ns = ctx.namespace("nonroot").await?;
    ctx.create_claim(&ns, "data").await?;
    let script = "umask 027 && echo hello > /data/hello.txt && mkdir /data/sub && id -u";
    let run = PodRun::new(&ns, "app", script).claim("data").as_user(1000, 3000).on_node(ctx.lane.node_name());
    let outcome = ctx.lane.run_pod(&run).await?;
    ensure!(outcome.exit_code == Some(0), "pod exited {:?}: {}", outcome.exit_code, outcome.logs);
    ensure!(outcome.logs.trim() == "1000", "ran as uid 1000: {:?}", outcome.logs);

    let pv = ctx.pv_of(&ns, "data").await?;
    let affinity = serde_json::to_string(&pv.spec.as_ref().and_then(|s| s.node_affinity.clone()))?;
    ensure!(affinity.contains(ctx.lane.node_name()), "PV pinned to the real node: {affinity}");
    let dir = ctx.lane.volume_dir(&ns, "data").await?;
    ensure!(dir.parent() == Some(ctx.lane.pool_root()), "{} directly in the pool", dir.display());
    let dir_meta = std::fs::metadata(&dir)?;
    ensure!(dir_meta.uid() == 0 && dir_meta.permissions().mode() & 0o7777 == 0o777, "volume dir root-owned 0777");
    let file = std::fs::metadata(dir.join("hello.txt"))?;
    ensure!(std::fs::read_to_string(dir.join("hello.txt"))? == "hello\n");
    ensure!((file.uid(), file.gid()) == (1000, 3000), "owner {}:{}, want 1000:3000", file.uid(), file.gid());
    ensure!(file.permissions().mode() & 0o7777 == 0o640, "mode {:o}, want 640", file.permissions().mode() & 0o7777);
    let sub = std::fs::metadata(dir.join("sub"))?;
    ensure!(sub.uid() == 1000 && sub.permissions().mode() & 0o7777 == 0o750, "sub dir 1000 0750");

    // The second node (simulated, its provisioner on the host) serves its own claims; the
    // real node's volume stays where it is.
    let sim = &ctx.lane.simulated_nodes()[0];
    ctx.create_claim(&ns, "sim-data").await?;
    let mut pod = fixtures::pod_using_claim(&ns, "sim-app", "sim-data").on_hostname(&sim.hostname).build();
    pod.spec.as_mut().context("spec")?.tolerations = Some(vec![Toleration {
        key: Some(testbed::real_nodes::SIMULATED_TAINT.into()),
        operator: Some("Exists".into()),
        ..Toleration::default()
    }]);
    Api::<Pod>::namespaced(ctx.lane.client(), &ns).create(&PostParams::default(), &pod).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    testbed::wait_until(
        "claim sim-data Bound",
        LANE_TIMEOUT,
        || claims.get("sim-data"),
        |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
    )
    .await?;
    let sim_dir = ctx.lane.volume_dir(&ns, "sim-data").await?;
    ensure!(sim_dir.starts_with(&sim.pool_root), "{} in the simulated node's pool", sim_dir.display());
    ensure!(dir.join("hello.txt").exists());

    ctx.lane.delete_pod(&ns, "app").await?;
    ctx.lane.delete_pod(&ns, "sim-app").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "data").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "sim-data").await?;
    Ok(())
}

async fn reclaim_removes_what_several_uids_left_in_0700_1777_and_0500_directories(ctx: &Ctx) -> Result<()> {
    ctx.deployed().await?;
    let ns = ctx.namespace("reclaim").await?;
    ctx.create_claim(&ns, "data").await?;
    let first = "mkdir /data/priv && echo a > /data/priv/f && chmod 700 /data/priv \
                 && mkdir /data/tmp && chmod 1777 /data/tmp && echo b > /data/tmp/f1";
    let second = "echo c > /data/tmp/f2 && mkdir /data/tmp/d && echo d > /data/tmp/d/f3 \
                  && chmod 500 /data/tmp/d && ! rm /data/tmp/f1 2>/dev/null";
    let run = PodRun::new(&ns, "users", second).claim("data").init_as(1000, first).as_user(2000, 2000);
    let outcome = ctx.lane.run_pod(&run).await?;
    ensure!(outcome.exit_code == Some(0), "pod exited {:?}: {}", outcome.exit_code, outcome.logs);

    let dir = ctx.lane.volume_dir(&ns, "data").await?;
    let mode = |p: &str| -> Result<(u32, u32)> {
        let m = std::fs::symlink_metadata(dir.join(p))?;
        Ok((m.uid(), m.permissions().mode() & 0o7777))
    };
    ensure!(mode("priv")? == (1000, 0o700), "priv: {:?}", mode("priv")?);
    ensure!(mode("tmp")? == (1000, 0o1777), "tmp: {:?}", mode("tmp")?);
    ensure!(mode("tmp/d")? == (2000, 0o500), "tmp/d: {:?}", mode("tmp/d")?);
    ensure!(mode("tmp/f1")?.0 == 1000 && mode("tmp/f2")?.0 == 2000 && mode("tmp/d/f3")?.0 == 2000);

    ctx.lane.delete_pod(&ns, "users").await?;
    let dir = ctx.delete_claim_and_wait_reclaimed(&ns, "data").await?;
    ensure!(!dir.exists());
    let trash = ctx.lane.pool_root().join(".hpp-trash");
    testbed::wait_for("the trash emptied", LANE_TIMEOUT, || async {
        anyhow::Ok((std::fs::read_dir(&trash).map(|rd| rd.count()).unwrap_or(0) == 0).then_some(()))
    })
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;
    Ok(())
}

async fn a_pod_that_plants_symlinks_out_of_its_volume_changes_nothing_outside_it_when_the_claim_goes(
    ctx: &Ctx,
) -> Result<()> {
    ctx.deployed().await?;
    let ns = ctx.namespace("escape").await?;
    let pool = ctx.lane.pool_root().to_path_buf();
    // A neighbour volume in the same pool, and a canary on the host next to the pool.
    ctx.create_claim(&ns, "neighbour").await?;
    let neighbour = PodRun::new(&ns, "neighbour", "echo keep > /data/keep").claim("neighbour");
    ensure!(ctx.lane.run_pod(&neighbour).await?.exit_code == Some(0));
    let neighbour_dir = ctx.lane.volume_dir(&ns, "neighbour").await?;
    let canary = ctx.lane.dir().join("canary");
    std::fs::create_dir_all(&canary)?;
    std::fs::write(canary.join("keep"), "keep")?;

    // The pool root has the same path in the DaemonSet's container as on the host, so links to
    // it (and to the neighbour) are what a provisioner that follows links would walk into.
    ctx.create_claim(&ns, "data").await?;
    let script = format!(
        "ln -s / /data/root && ln -s {pool} /data/pool && ln -s {neighbour} /data/neighbour \
         && ln -s {canary} /data/canary && ln -s ../.. /data/up && mkdir /data/d && ln -s / /data/d/root \
         && ln -s /data/neighbour/keep /data/keep-link",
        pool = pool.display(),
        neighbour = neighbour_dir.display(),
        canary = canary.display()
    );
    let outcome = ctx.lane.run_pod(&PodRun::new(&ns, "escaper", &script).claim("data")).await?;
    ensure!(outcome.exit_code == Some(0), "pod exited {:?}: {}", outcome.exit_code, outcome.logs);
    let dir = ctx.lane.volume_dir(&ns, "data").await?;
    ensure!(std::fs::read_link(dir.join("root"))? == Path::new("/"));
    let pool_before = entries(&pool);

    ctx.lane.delete_pod(&ns, "escaper").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "data").await?;
    ensure!(std::fs::read_to_string(neighbour_dir.join("keep"))? == "keep\n", "the neighbour's file survived");
    ensure!(std::fs::read_to_string(canary.join("keep"))? == "keep", "the host canary survived");
    let mut expected = pool_before;
    expected.retain(|e| Some(e.as_str()) != dir.file_name().and_then(|n| n.to_str()));
    ensure!(entries(&pool) == expected, "only the deleted volume left the pool: {:?}", entries(&pool));
    ensure!(Path::new("/etc/hostname").exists() || Path::new("/etc/passwd").exists(), "the host's / intact");

    ctx.lane.delete_pod(&ns, "neighbour").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "neighbour").await?;
    Ok(())
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".hpp-trash")
        .collect();
    names.sort();
    names
}

/// Gives the DaemonSet's container `CAP_SYS_ADMIN`, as the README tells admins of quota pools:
/// the kernel refuses btrfs qgroup ioctls (create, limit) without it. Later scenarios keep it.
async fn grant_quota_capability(ctx: &Ctx) -> Result<()> {
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(ctx.lane.client(), DEPLOY_NAMESPACE);
    let ds = daemonsets.get(DEPLOY_DAEMONSET).await?;
    let added = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers[0].security_context.as_ref())
        .and_then(|c| c.capabilities.as_ref())
        .and_then(|c| c.add.clone())
        .unwrap_or_default();
    if added.iter().any(|c| c == "SYS_ADMIN") {
        return Ok(());
    }
    let patch = serde_json::json!([{
        "op": "add",
        "path": "/spec/template/spec/containers/0/securityContext/capabilities/add/-",
        "value": "SYS_ADMIN",
    }]);
    daemonsets
        .patch(DEPLOY_DAEMONSET, &PatchParams::default(), &Patch::<()>::Json(serde_json::from_value(patch)?))
        .await?;
    ctx.lane.wait_daemonset_rolled_out().await?;
    Ok(())
}

/// A WaitForFirstConsumer class of ours on pool `btrfs` with `quota: enforce`, expandable.
async fn quota_class(ctx: &Ctx, ns: &str) -> Result<String> {
    let name = format!("{ns}-quota");
    let class = fixtures::storage_class(&name, "kubevirt.io/hostpath-provisioner")
        .parameter("storagePool", "btrfs")
        .parameter("quota", "enforce")
        .allow_expansion()
        .build();
    Api::<StorageClass>::all(ctx.lane.client()).create(&PostParams::default(), &class).await?;
    Ok(name)
}

/// `key=<value>` from a pod's output.
fn logged(logs: &str, key: &str) -> Option<String> {
    logs.lines().find_map(|l| l.strip_prefix(&format!("{key}=")).map(|v| v.trim().to_string()))
}

async fn a_pod_stops_at_its_quota_and_writes_past_it_after_an_online_expansion_without_restarting(
    ctx: &Ctx,
) -> Result<()> {
    ctx.deployed().await?;
    grant_quota_capability(ctx).await?;
    let ns = ctx.namespace("quota").await?;
    let class = quota_class(ctx, &ns).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    claims.create(&PostParams::default(), &fixtures::claim(&ns, "data", &class, "10Mi").build()).await?;

    // Writes 40 MiB into the 10 MiB volume (the filesystem has 512 MiB), waits for the test's
    // signal that the claim grew, then writes 6 MiB more next to the first file.
    let script = "dd if=/dev/zero of=/data/first bs=1M count=40 2>&1; echo first-exit=$?; \
                  echo first-bytes=$(stat -c %s /data/first); echo waiting; \
                  until [ -f /data/grown ]; do sleep 1; done; \
                  dd if=/dev/zero of=/data/second bs=1M count=6 2>&1; echo second-exit=$?; \
                  echo second-bytes=$(stat -c %s /data/second); sync";
    let run = PodRun::new(&ns, "writer", script).claim("data").as_user(1000, 1000).on_node(ctx.lane.node_name());
    let started = ctx.lane.run_pod(&run.clone().keep_running()).await?;
    let pod_uid = started.pod.metadata.uid.clone().context("pod uid")?;
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), &ns);
    let logs_now = || async {
        let pod = pods.get("writer").await?;
        anyhow::Ok(ctx.lane.container_logs(&pod, "main"))
    };
    testbed::wait_for("the first dd stopped", LANE_TIMEOUT, || async {
        let logs = logs_now().await?;
        anyhow::Ok(logs.contains("waiting").then_some(logs))
    })
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;
    let logs = logs_now().await?;
    ensure!(logged(&logs, "first-exit") != Some("0".into()), "the first dd must fail at the limit: {logs}");
    ensure!(
        logs.contains("Disk quota exceeded") || logs.contains("No space left on device"),
        "EDQUOT/ENOSPC in the pod's log: {logs}"
    );
    let first: u64 = logged(&logs, "first-bytes").context("first-bytes")?.parse()?;
    ensure!(first <= 10 << 20, "no more than the 10 MiB limit written: {first} bytes");
    ensure!(first >= 4 << 20, "the quota, not something else, stopped the writer: only {first} bytes");
    let dir = ctx.lane.volume_dir(&ns, "data").await?;
    ensure!(dir.parent() == Some(ctx.lane.quota_pool()), "{} in the quota pool", dir.display());

    // Expanded online while the pod runs.
    let grow = serde_json::json!({"spec": {"resources": {"requests": {"storage": "20Mi"}}}});
    claims.patch("data", &PatchParams::default(), &Patch::Merge(&grow)).await?;
    let twenty = Quantity("20Mi".into());
    let pv_name = ctx.pv_of(&ns, "data").await?.metadata.name.context("PV name")?;
    let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
    testbed::wait_until(
        "the PV and the claim at 20Mi",
        LANE_TIMEOUT,
        || async {
            let pv = pvs.get(&pv_name).await?;
            let claim = claims.get("data").await?;
            anyhow::Ok((pv, claim))
        },
        |(pv, claim)| {
            pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")) == Some(&twenty)
                && claim.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage"))
                    == Some(&twenty)
        },
    )
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;

    std::fs::write(dir.join("grown"), "")?;
    let finished = testbed::wait_until(
        "pod writer finished",
        LANE_TIMEOUT,
        || pods.get("writer"),
        |p| p.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|p| p == "Succeeded" || p == "Failed"),
    )
    .await?;
    let logs = ctx.lane.container_logs(&finished, "main");
    ensure!(finished.metadata.uid.as_deref() == Some(pod_uid.as_str()), "the same pod wrote both times");
    let status = finished.status.as_ref().context("status")?;
    let restarts: i32 = status.container_statuses.iter().flatten().map(|c| c.restart_count).sum();
    ensure!(restarts == 0, "the pod restarted {restarts} times");
    ensure!(status.phase.as_deref() == Some("Succeeded"), "the pod failed: {logs}");
    ensure!(logged(&logs, "second-exit").as_deref() == Some("0"), "the second dd must succeed: {logs}");
    let second: u64 = logged(&logs, "second-bytes").context("second-bytes")?.parse()?;
    ensure!(second == 6 << 20, "6 MiB written after the expansion: {second}");
    ensure!(first + second > 10 << 20, "past the old limit: {first} + {second} bytes");
    let on_host = std::fs::metadata(dir.join("first"))?.len() + std::fs::metadata(dir.join("second"))?.len();
    ensure!(on_host == first + second, "the host holds what the pod wrote: {on_host}");
    let refusal = logs.lines().find(|l| l.contains("exceeded") || l.contains("No space")).unwrap_or_default();
    println!("    quota: the first dd stopped at {first} bytes of 10Mi ({refusal}); after 20Mi, {second} more");

    ctx.lane.delete_pod(&ns, "writer").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "data").await?;
    Ok(())
}

async fn a_clone_of_a_claim_a_pod_wrote_into_gives_another_pod_the_same_files_and_owners(ctx: &Ctx) -> Result<()> {
    ctx.deployed().await?;
    let ns = ctx.namespace("clone").await?;
    ctx.create_claim(&ns, "source").await?;
    let write = "umask 022 && echo top > /data/top && mkdir /data/dir && chmod 2750 /data/dir \
                 && echo inner > /data/dir/file && chmod 600 /data/dir/file && ln -s dir/file /data/link";
    let writer = PodRun::new(&ns, "writer", write).claim("source").as_user(1000, 3000).on_node(ctx.lane.node_name());
    let outcome = ctx.lane.run_pod(&writer).await?;
    ensure!(outcome.exit_code == Some(0), "writer exited {:?}: {}", outcome.exit_code, outcome.logs);

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    let mut clone = fixtures::claim(&ns, "copy", CLASS, "16Mi").build();
    clone.spec.as_mut().context("spec")?.data_source = Some(TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: "source".into(),
    });
    claims.create(&PostParams::default(), &clone).await?;
    let read = "cat /data/top /data/dir/file /data/link && stat -c '%n %u:%g %a' /data/top /data/dir /data/dir/file";
    let reader = PodRun::new(&ns, "reader", read).claim("copy").as_user(1000, 3000).on_node(ctx.lane.node_name());
    let outcome = ctx.lane.run_pod(&reader).await.map_err(|e| e.context(ctx.provisioner_logs()))?;
    ensure!(outcome.exit_code == Some(0), "reader exited {:?}: {}", outcome.exit_code, outcome.logs);
    let expected =
        "top\ninner\ninner\n/data/top 1000:3000 644\n/data/dir 1000:3000 2750\n/data/dir/file 1000:3000 600\n";
    ensure!(outcome.logs == expected, "the clone's pod sees the source's files and owners: {:?}", outcome.logs);

    let source_dir = ctx.lane.volume_dir(&ns, "source").await?;
    let copy_dir = ctx.lane.volume_dir(&ns, "copy").await?;
    ensure!(source_dir != copy_dir, "the clone is a volume of its own");
    std::fs::write(copy_dir.join("top"), "changed\n")?;
    ensure!(std::fs::read_to_string(source_dir.join("top"))? == "top\n", "writing the clone leaves the source");

    ctx.lane.delete_pod(&ns, "writer").await?;
    ctx.lane.delete_pod(&ns, "reader").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "copy").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "source").await?;
    Ok(())
}

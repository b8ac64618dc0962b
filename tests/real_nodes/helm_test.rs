//! The Helm chart's own test on a real node: `helm install` of the chart (as a second,
//! independent instance beside deploy/legacy: its own provisioner name, class and pool) and
//! `helm test`, whose pod mounts a fresh claim and writes into it as an unprivileged user. The
//! same test fails, with the reason in the test pod's log, when the volumes it gets are not
//! writable for that user (DIR_MODE 0700).

use super::*;
use testbed::{DeployTool, deploy_tool};

const RELEASE: &str = "hpp-helm";
const PROVISIONER: &str = "helm.hostpath.test";
const HELM_CLASS: &str = "hpp-helm-class";

/// helm against the lane, with its caches and settings under the lane's directory.
fn helm(ctx: &Ctx, args: &[&str]) -> Result<std::process::Output> {
    let home = ctx.lane.dir().join("helm-home");
    Ok(std::process::Command::new(deploy_tool(DeployTool::Helm)?)
        .args(args)
        .env("KUBECONFIG", ctx.lane.cp().kubeconfig_path())
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .current_dir(&ctx.repo)
        .output()?)
}

fn said(output: &std::process::Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

/// The chart's values for this lane: the imported image, the real node only, a pool of its own.
fn values(ctx: &Ctx, image: &str, pool: &Path, dir_mode: &str) -> Result<PathBuf> {
    let (reference, tag) = image.rsplit_once(':').context("a tag in the image")?;
    let (registry, repository) = reference.split_once('/').unwrap_or(("", reference));
    let file = ctx.lane.dir().join(format!("helm-values-{dir_mode}.yaml"));
    std::fs::write(
        &file,
        format!(
            r#"image: {{registry: "{registry}", repository: "{repository}", tag: "{tag}", pullPolicy: IfNotPresent}}
nodeSelector: {{kubernetes.io/hostname: "{node}"}}
pools: [{{name: legacy, path: "{pool}", hostPathType: DirectoryOrCreate}}]
storageClasses: [{{name: {HELM_CLASS}, volumeBindingMode: WaitForFirstConsumer}}]
config: {{provisionerName: {PROVISIONER}, dirMode: "{dir_mode}"}}
"#,
            node = ctx.lane.node_name(),
            pool = pool.display(),
        ),
    )?;
    Ok(file)
}

/// `helm upgrade --install` of the release with volumes of `dir_mode`, waited for until ready.
async fn deploy_release(ctx: &Ctx, ns: &str, image: &str, pool: &Path, dir_mode: &str) -> Result<()> {
    let values = values(ctx, image, pool, dir_mode)?.display().to_string();
    let chart = "deploy/helm/hostpath-provisioner";
    let deployed = helm(ctx, &["upgrade", "--install", RELEASE, chart, "-n", ns, "-f", &values])?;
    ensure!(deployed.status.success(), "helm upgrade --install: {}", said(&deployed));
    release_ready(ctx, ns).await
}

/// Waits until no volume directory is left in the release's pool.
async fn pool_emptied(pool: &Path, what: &str) -> Result<()> {
    testbed::wait_for(what, LANE_TIMEOUT, || async {
        let left =
            std::fs::read_dir(pool)?.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("pvc-")).count();
        anyhow::Ok((left == 0).then_some(()))
    })
    .await
}

/// Waits until the release's one provisioner pod runs the current template and is ready.
async fn release_ready(ctx: &Ctx, ns: &str) -> Result<()> {
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(ctx.lane.client(), ns);
    testbed::wait_until(
        "the chart's DaemonSet rolled out on the real node",
        LANE_TIMEOUT,
        || async { Ok::<_, kube::Error>(daemonsets.list(&ListParams::default()).await?.items) },
        |items| {
            items.len() == 1
                && items[0].status.as_ref().is_some_and(|s| {
                    s.observed_generation.unwrap_or(0) >= items[0].metadata.generation.unwrap_or(0)
                        && s.desired_number_scheduled == 1
                        && s.updated_number_scheduled == Some(1)
                        && s.number_ready == 1
                        && s.number_unavailable.unwrap_or(0) == 0
                })
        },
    )
    .await?;
    Ok(())
}

pub(crate) async fn helm_test_provisions_a_volume_a_non_root_pod_writes_into_and_fails_when_it_cannot(
    ctx: &Ctx,
) -> Result<()> {
    let image = ctx.deployed().await?;
    let ns = ctx.namespace("helm").await?;
    // A pool of its own, shared as the lane's are (containerd refuses HostToContainer from a
    // private mount); under the lane directory, so that teardown unmounts it.
    let pool = ctx.lane.dir().join("helm-pool");
    std::fs::create_dir_all(&pool)?;
    testbed::real_nodes::host::make_shared_mount(&pool)?;
    deploy_release(ctx, &ns, &image, &pool, "0777").await?;

    let test = helm(ctx, &["test", RELEASE, "-n", &ns, "--timeout", "4m", "--logs"])?;
    let text = said(&test);
    ensure!(test.status.success(), "helm test failed:\n{text}");
    ensure!(text.contains("Succeeded") && text.contains("/data: wrote, synced, read back and removed"), "{text}");
    // The claim was made by the release's provisioner in its pool and, the test passed, deleted
    // with its volume: nothing is left in the pool.
    pool_emptied(&pool, "the test volume reclaimed").await?;

    // Volumes only root may write into: the same test fails and says why.
    deploy_release(ctx, &ns, &image, &pool, "0700").await?;
    let failing = helm(ctx, &["test", RELEASE, "-n", &ns, "--timeout", "4m", "--logs"])?;
    let text = said(&failing);
    ensure!(!failing.status.success(), "helm test passed on volumes a non-root pod cannot write:\n{text}");
    ensure!(text.contains("cannot create") && text.contains("Permission denied"), "the test pod says why:\n{text}");

    // A failed test leaves its pod (and the pod's claim) for inspection; deleting the pod takes
    // the claim with it, the release's provisioner reclaims the volume, then uninstall.
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), &ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    let test_pod = format!("{RELEASE}-hostpath-provisioner-test");
    ensure!(claims.get_opt(&format!("{test_pod}-data")).await?.is_some(), "the failed test's claim is kept");
    pods.delete(&test_pod, &DeleteParams::default()).await?;
    pool_emptied(&pool, "the failed test's volume reclaimed").await?;
    let uninstall = helm(ctx, &["uninstall", RELEASE, "-n", &ns, "--wait"])?;
    ensure!(uninstall.status.success(), "helm uninstall: {}", said(&uninstall));
    Ok(())
}

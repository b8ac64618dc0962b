//! The drop-in promise on a real node: the Go provisioner this project replaces, built from its
//! source (hack/build-go-legacy.sh) and deployed with its own upstream manifest, provisions
//! volumes that real pods use; `kubectl apply -k deploy/legacy` replaces it in place while the
//! pods keep running; this build serves new claims and reclaims the Go-made volumes; rolling
//! back to the Go DaemonSet (docs/migrating.md, "Rolling back") serves and reclaims again,
//! this build's volumes included; nothing is orphaned in either direction.

use super::*;

/// The Go build's image, as the lane imports it (never pulled).
const GO_IMAGE: &str = "kubevirt/hostpath-provisioner-go:7c142255";
/// The Immediate class the Go deploy file installs.
const GO_CLASS: &str = "kubevirt-hostpath-provisioner";
/// What `pv.kubernetes.io/provisioned-by` and `hostPathProvisionerIdentity` say for both builds.
const PROVISIONER: &str = "kubevirt.io/hostpath-provisioner";
/// The label this build puts on its PVs and the Go build does not.
const OUR_LABEL: &str = "hostpath-provisioner.kubevirt.io/node";

/// The cached Go build (binary and source tree), or why it cannot be had here.
fn go_build(repo: &Path) -> Result<PathBuf> {
    let output = std::process::Command::new("bash")
        .arg(repo.join("hack/build-go-legacy.sh"))
        .output()
        .context("running hack/build-go-legacy.sh")?;
    let log = String::from_utf8_lossy(&output.stderr);
    ensure!(output.status.success(), "hack/build-go-legacy.sh failed:\n{log}");
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or_default().trim());
    ensure!(dir.join("kubevirt-legacy-provisioner").is_file(), "no Go binary in {}:\n{log}", dir.display());
    Ok(dir)
}

/// The Go build's own deploy file, changed only where this lane must: its ClusterRole's
/// `rbac.authorization.k8s.io/v1beta1` (no longer served since Kubernetes 1.22: the file does
/// not apply on any current cluster as shipped) becomes `v1`; the image is the one imported
/// here, not pulled (`imagePullPolicy: Always` would ask a registry); the pool root is the
/// lane's; `USE_NAMING_PREFIX` as asked.
fn go_manifest(go: &Path, pool: &Path, naming_prefix: bool) -> Result<String> {
    let upstream = std::fs::read_to_string(go.join("src/deploy/kubevirt-hostpath-provisioner.yaml"))?;
    let mut manifest = upstream.clone();
    for (from, to) in [
        ("apiVersion: rbac.authorization.k8s.io/v1beta1", "apiVersion: rbac.authorization.k8s.io/v1".to_owned()),
        ("image: quay.io/kubevirt/hostpath-provisioner", format!("image: {GO_IMAGE}")),
        ("imagePullPolicy: Always", "imagePullPolicy: IfNotPresent".to_owned()),
        ("value: \"false\" # change to true", format!("value: \"{naming_prefix}\" # change to true")),
        ("/var/hpvolumes", pool.display().to_string()),
    ] {
        ensure!(manifest.contains(from), "the upstream deploy file no longer has {from:?}");
        manifest = manifest.replace(from, &to);
    }
    Ok(manifest)
}

/// Applies the Go deploy file over whatever runs and waits for the rollout.
async fn roll_to_go(ctx: &Ctx, go: &Path, naming_prefix: bool) -> Result<()> {
    let file = ctx.lane.dir().join(format!("go-legacy-{naming_prefix}.yaml"));
    std::fs::write(&file, go_manifest(go, ctx.lane.pool_root(), naming_prefix)?)?;
    ctx.lane.cp().run_kubectl(&ctx.repo, &["apply", "-f", &file.display().to_string()])?;
    ctx.lane.wait_daemonset_rolled_out().await?;
    only_pods_of(ctx, GO_IMAGE).await
}

/// Waits until the one provisioner pod left runs `image` (the replaced one may still be
/// terminating when the DaemonSet reports the rollout done).
async fn only_pods_of(ctx: &Ctx, image: &str) -> Result<()> {
    testbed::wait_for(&format!("only {image} runs"), LANE_TIMEOUT, || async {
        let pods = ctx.provisioner_pods().await?;
        let images: Vec<_> = pods.iter().filter_map(|p| p.spec.as_ref()?.containers[0].image.clone()).collect();
        anyhow::Ok((images == [image]).then_some(()))
    })
    .await
}

/// A claim (`pinned`: the Go deploy's Immediate class with `kubevirt.io/provisionOnNode`; else
/// the WaitForFirstConsumer class) and a pod that writes its name into it and keeps running.
async fn claim_with_writer(ctx: &Ctx, ns: &str, name: &str, pinned: bool) -> Result<PersistentVolume> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
    let claim = if pinned {
        fixtures::claim(ns, name, GO_CLASS, "16Mi").provision_on_node(ctx.lane.node_name()).build()
    } else {
        fixtures::claim(ns, name, CLASS, "16Mi").build()
    };
    claims.create(&PostParams::default(), &claim).await?;
    let script = format!("echo {name} > /data/{name} && sleep 3600");
    ctx.lane.run_pod(&PodRun::new(ns, name, &script).claim(name).keep_running()).await?;
    let pv = ctx.pv_of(ns, name).await?;
    let dir = ctx.lane.volume_dir(ns, name).await?;
    testbed::wait_for(&format!("{name} written"), LANE_TIMEOUT, || async {
        anyhow::Ok(
            (std::fs::read_to_string(dir.join(name)).ok().as_deref() == Some(&format!("{name}\n"))).then_some(()),
        )
    })
    .await?;
    Ok(pv)
}

fn made_by_us(pv: &PersistentVolume) -> bool {
    pv.metadata.labels.as_ref().is_some_and(|l| l.contains_key(OUR_LABEL))
}

fn annotation<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The pods still run, never restarted, and their data is where it was.
async fn still_running_with_their_data(ctx: &Ctx, ns: &str, names: &[&str]) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), ns);
    for name in names {
        let status = pods.get(name).await?.status.context("status")?;
        ensure!(status.phase.as_deref() == Some("Running"), "{name} still running");
        let restarts: i32 = status.container_statuses.iter().flatten().map(|c| c.restart_count).sum();
        ensure!(restarts == 0, "{name} restarted {restarts} times");
        let dir = ctx.lane.volume_dir(ns, name).await?;
        ensure!(std::fs::read_to_string(dir.join(name))? == format!("{name}\n"), "{name}'s data kept");
        let pv = ctx.pv_of(ns, name).await?;
        ensure!(pv.status.and_then(|s| s.phase).as_deref() == Some("Bound"), "{name}'s PV still Bound");
    }
    Ok(())
}

/// Stops the pod, deletes its claim and waits until the PV and the directory are gone.
async fn reclaim(ctx: &Ctx, ns: &str, name: &str) -> Result<()> {
    ctx.lane.delete_pod(ns, name).await?;
    ctx.delete_claim_and_wait_reclaimed(ns, name).await?;
    Ok(())
}

pub(super) async fn a_swap_from_the_go_build_to_this_one_and_back_loses_and_orphans_nothing(ctx: &Ctx) -> Result<()> {
    // The Go source archive is not served by any registry this project can reach: a machine
    // without it cannot run this scenario, and says so loudly (.ci/run finds it on CI).
    if std::env::var_os("HPP_GO_LEGACY_ARCHIVE").is_none() && go_build(&ctx.repo).is_err() {
        println!("    SKIPPED: no Go build (set HPP_GO_LEGACY_ARCHIVE to the Go provisioner's source archive)");
        return Ok(());
    }
    let go = go_build(&ctx.repo)?;
    let started = Instant::now();
    ctx.deployed().await?;
    let archive = images::image_dir(&ctx.repo).join("go-legacy.oci.tar");
    images::provisioner_image(&go.join("kubevirt-legacy-provisioner"), GO_IMAGE).write(&archive)?;
    ctx.lane.import_image(&archive)?;
    let ns = ctx.namespace("swap").await?;
    let mut timings = Vec::new();

    // The Go build as upstream deploys it, naming prefix off then on: both placements.
    roll_to_go(ctx, &go, false).await?;
    timings.push(("to the Go build", started.elapsed()));
    for (name, pinned) in [("go-wffc", false), ("go-pinned", true)] {
        let pv = claim_with_writer(ctx, &ns, name, pinned).await?;
        ensure!(!made_by_us(&pv), "{name}: made by the Go build");
        ensure!(annotation(&pv, "hostPathProvisionerIdentity") == Some(PROVISIONER), "{name}: Go's identity");
        let dir = ctx.lane.volume_dir(&ns, name).await?;
        let base = dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
        ensure!(base.starts_with("pvc-"), "{name}: no naming prefix: {base}");
    }
    roll_to_go(ctx, &go, true).await?;
    let pv = claim_with_writer(ctx, &ns, "go-prefixed", false).await?;
    ensure!(!made_by_us(&pv), "go-prefixed: made by the Go build");
    let dir = ctx.lane.volume_dir(&ns, "go-prefixed").await?;
    ensure!(dir.file_name().unwrap_or_default().to_string_lossy().starts_with("go-prefixed-pvc-"), "prefixed: {dir:?}");

    // This build over it, as docs/migrating.md says: the pods keep running.
    let swap = Instant::now();
    let ours = ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    only_pods_of(ctx, &ours).await?;
    timings.push(("Go build to this one", swap.elapsed()));
    let go_made = ["go-wffc", "go-pinned", "go-prefixed"];
    still_running_with_their_data(ctx, &ns, &go_made).await?;
    for (name, pinned) in [("ours-wffc", false), ("ours-pinned", true)] {
        let pv = claim_with_writer(ctx, &ns, name, pinned).await?;
        ensure!(made_by_us(&pv), "{name}: made by this build");
    }
    // The Go-made volumes are reclaimed by this build, prefixed or not.
    reclaim(ctx, &ns, "go-wffc").await?;
    reclaim(ctx, &ns, "go-prefixed").await?;

    // Back to the Go build: it serves, and reclaims this build's volumes and its own.
    let back = Instant::now();
    roll_to_go(ctx, &go, false).await?;
    timings.push(("back to the Go build", back.elapsed()));
    still_running_with_their_data(ctx, &ns, &["go-pinned", "ours-wffc", "ours-pinned"]).await?;
    let pv = claim_with_writer(ctx, &ns, "go-again", true).await?;
    ensure!(!made_by_us(&pv), "go-again: made by the Go build");
    for name in ["ours-wffc", "ours-pinned", "go-pinned", "go-again"] {
        reclaim(ctx, &ns, name).await?;
    }

    // Nothing orphaned: no PV of the namespace is left, every directory went with its claim
    // (checked by each reclaim), and what this build moved to its trash is purged.
    let pvs = Api::<PersistentVolume>::all(ctx.lane.client()).list(&ListParams::default()).await?.items;
    let left: Vec<_> = pvs
        .iter()
        .filter(|pv| {
            pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.namespace.as_deref())
                == Some(ns.as_str())
        })
        .filter_map(|pv| pv.metadata.name.clone())
        .collect();
    ensure!(left.is_empty(), "PVs left: {left:?}");
    let trash = ctx.lane.pool_root().join(".hpp-trash");
    testbed::wait_for("the trash purged", LANE_TIMEOUT, || async {
        anyhow::Ok(entries(&trash).is_empty().then_some(()))
    })
    .await
    .with_context(|| format!("left in the trash: {:?}", entries(&trash)))?;

    // This build again, as the lane began.
    ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    for (step, took) in timings {
        println!("    {step}: rolled out in {:.1} s", took.as_secs_f64());
    }
    Ok(())
}

//! The drop-in promise on two real nodes: the Go provisioner this project replaces, built from
//! its source (hack/build-go-legacy.sh) and deployed with its own upstream manifest, runs a pod
//! on each node and provisions volumes that real pods on each node use; `kubectl apply -k
//! deploy/legacy` replaces it in place, node after node, while the pods keep running; this
//! build serves new claims on both nodes and reclaims the Go-made volumes, each in its own
//! node's pool; rolling back to the Go DaemonSet (docs/migrating.md, "Rolling back") serves and
//! reclaims again on both nodes, this build's volumes included; nothing is orphaned on either
//! node in either direction. The second node (`real-node-2`) has its own directory at the pool
//! root, so a volume made on it is found, and must be gone, there and not in node 1's.

use super::*;
use testbed::real_nodes::NODE2_NAME;

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
    testbed::go_legacy_build(repo)
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

/// The two real nodes, node 1 first.
fn real_nodes(ctx: &Ctx) -> [String; 2] {
    [ctx.lane.node_name().to_owned(), NODE2_NAME.to_owned()]
}

/// Waits until the provisioner pods left are one per real node, each running `image` (a
/// replaced one may still be terminating when the DaemonSet reports the rollout done).
async fn only_pods_of(ctx: &Ctx, image: &str) -> Result<()> {
    let nodes = real_nodes(ctx);
    testbed::wait_for(&format!("only {image} runs, one pod on each of {nodes:?}"), LANE_TIMEOUT, || async {
        let pods = ctx.provisioner_pods().await?;
        let images: Vec<_> = pods.iter().filter_map(|p| p.spec.as_ref()?.containers[0].image.clone()).collect();
        let mut on: Vec<&str> = pods.iter().filter_map(|p| p.spec.as_ref()?.node_name.as_deref()).collect();
        on.sort_unstable();
        anyhow::Ok((images == [image, image] && on == nodes).then_some(()))
    })
    .await
}

/// The directory of `claim`'s volume on the host, as `node` has it (node 2's pool root is a
/// directory of its own).
async fn dir_on(ctx: &Ctx, node: &str, ns: &str, claim: &str) -> Result<PathBuf> {
    Ok(ctx.lane.host_path_on(node, &ctx.lane.volume_dir(ns, claim).await?))
}

/// The claim's volume is `node`'s: its PV is pinned there and its directory is in that node's
/// pool and not at the same path in the other node's.
async fn on_its_node(ctx: &Ctx, node: &str, ns: &str, claim: &str) -> Result<PathBuf> {
    let pv = ctx.pv_of(ns, claim).await?;
    let affinity = serde_json::to_string(&pv.spec.as_ref().and_then(|s| s.node_affinity.clone()))?;
    ensure!(affinity.contains(&format!("\"{node}\"")), "{claim}'s PV pinned to {node}: {affinity}");
    let dir = dir_on(ctx, node, ns, claim).await?;
    ensure!(dir.is_dir(), "{claim}'s directory {} in {node}'s pool", dir.display());
    for other in real_nodes(ctx).iter().filter(|n| *n != node) {
        let elsewhere = dir_on(ctx, other, ns, claim).await?;
        ensure!(!elsewhere.exists(), "{claim} made on {node} only, yet {} exists", elsewhere.display());
    }
    Ok(dir)
}

/// A claim on `node` (`pinned`: the Go deploy's Immediate class with `kubevirt.io/provisionOnNode`
/// naming the node; else the WaitForFirstConsumer class, placed by its pod's nodeSelector) and a
/// pod on that node that writes its name into it and keeps running.
async fn claim_with_writer(ctx: &Ctx, ns: &str, name: &str, node: &str, pinned: bool) -> Result<PersistentVolume> {
    claim_of_class_with_writer(ctx, ns, name, node, pinned.then_some(GO_CLASS)).await
}

/// As [`claim_with_writer`]; `pinned_class`: pinned to the node with `kubevirt.io/provisionOnNode`
/// in that class, else the WaitForFirstConsumer class.
async fn claim_of_class_with_writer(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    node: &str,
    pinned_class: Option<&str>,
) -> Result<PersistentVolume> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
    let claim = match pinned_class {
        Some(class) => fixtures::claim(ns, name, class, "16Mi").provision_on_node(node).build(),
        None => fixtures::claim(ns, name, CLASS, "16Mi").build(),
    };
    claims.create(&PostParams::default(), &claim).await?;
    let script = format!("echo {name} > /data/{name} && sleep 3600");
    let writer = PodRun::new(ns, name, &script).claim(name).on_node(node).keep_running();
    ctx.lane.run_pod(&writer).await.map_err(|e| e.context(ctx.provisioner_logs()))?;
    let pv = ctx.pv_of(ns, name).await?;
    let dir = on_its_node(ctx, node, ns, name).await?;
    testbed::wait_for(&format!("{name} written"), LANE_TIMEOUT, || async {
        anyhow::Ok(
            (std::fs::read_to_string(dir.join(name)).ok().as_deref() == Some(&format!("{name}\n"))).then_some(()),
        )
    })
    .await?;
    Ok(pv)
}

pub(super) fn made_by_us(pv: &PersistentVolume) -> bool {
    pv.metadata.labels.as_ref().is_some_and(|l| l.contains_key(OUR_LABEL))
}

fn annotation<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The pods still run on their node, never restarted, and their data is where it was, in
/// their node's pool.
async fn still_running_with_their_data(ctx: &Ctx, ns: &str, names: &[&str]) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), ns);
    for (node, suffix) in real_nodes(ctx).iter().zip(["-1", "-2"]) {
        for name in names.iter().map(|n| format!("{n}{suffix}")) {
            let pod = pods.get(&name).await?;
            let ran_on = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default();
            ensure!(ran_on == node, "{name} runs on {node}, not {ran_on:?}");
            let status = pod.status.context("status")?;
            ensure!(status.phase.as_deref() == Some("Running"), "{name} still running");
            let restarts: i32 = status.container_statuses.iter().flatten().map(|c| c.restart_count).sum();
            ensure!(restarts == 0, "{name} restarted {restarts} times");
            let dir = on_its_node(ctx, node, ns, &name).await?;
            ensure!(std::fs::read_to_string(dir.join(&name))? == format!("{name}\n"), "{name}'s data kept");
            let pv = ctx.pv_of(ns, &name).await?;
            ensure!(pv.status.and_then(|s| s.phase).as_deref() == Some("Bound"), "{name}'s PV still Bound");
        }
    }
    Ok(())
}

/// On each node at once, stops the pod of `name-N`, deletes its claim and waits until the PV
/// and the directory in that node's pool are gone.
async fn reclaim_on_each_node(ctx: &Ctx, ns: &str, name: &str) -> Result<()> {
    let nodes = real_nodes(ctx);
    let each = nodes.iter().zip(["-1", "-2"]).map(|(node, suffix)| async move {
        let claim = format!("{name}{suffix}");
        ctx.lane.delete_pod(ns, &claim).await?;
        let dir = dir_on(ctx, node, ns, &claim).await?;
        let pv = ctx.pv_of(ns, &claim).await?.metadata.name.unwrap_or_default();
        Api::<PersistentVolumeClaim>::namespaced(ctx.lane.client(), ns)
            .delete(&claim, &DeleteParams::default())
            .await?;
        let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
        testbed::wait_for(&format!("PV {pv} and {} on {node} gone", dir.display()), LANE_TIMEOUT, || async {
            anyhow::Ok((pvs.get_opt(&pv).await?.is_none() && !dir.exists()).then_some(()))
        })
        .await
        .map_err(|e| e.context(ctx.provisioner_logs()))
    });
    futures::future::try_join_all(each).await?;
    Ok(())
}

/// A claim `name-N` with its writer on each node, both nodes at once (each node's provisioner
/// serves its own claims), in node order.
async fn claims_with_writers(ctx: &Ctx, ns: &str, name: &str, pinned: bool) -> Result<Vec<PersistentVolume>> {
    let nodes = real_nodes(ctx);
    let each = nodes.iter().zip(["-1", "-2"]).map(|(node, suffix)| async move {
        claim_with_writer(ctx, ns, &format!("{name}{suffix}"), node, pinned).await
    });
    futures::future::try_join_all(each).await
}

/// Each node's pool root as the host has it, and its entries (the trash aside).
fn pools(ctx: &Ctx) -> Vec<(String, PathBuf, Vec<String>)> {
    real_nodes(ctx)
        .into_iter()
        .map(|node| {
            let pool = ctx.lane.host_path_on(&node, ctx.lane.pool_root());
            let names = entries(&pool);
            (node, pool, names)
        })
        .collect()
}

pub(super) async fn a_swap_from_the_go_build_to_this_one_and_back_loses_and_orphans_nothing_two_nodes(
    ctx: &Ctx,
) -> Result<()> {
    // The Go source archive is not served by any registry this project can reach: a developer's
    // machine without it cannot run this scenario, and says so loudly; CI must have it (.ci/run
    // finds it next to the checkout), so there its absence fails the run.
    if std::env::var_os("HPP_GO_LEGACY_ARCHIVE").is_none()
        && let Err(error) = go_build(&ctx.repo)
    {
        anyhow::ensure!(!testbed::in_ci(), "CI=true and no Go build (set HPP_GO_LEGACY_ARCHIVE): {error:#}");
        println!("    SKIPPED: no Go build (set HPP_GO_LEGACY_ARCHIVE to the Go provisioner's source archive)");
        return Ok(());
    }
    let go = go_build(&ctx.repo)?;
    let started = Instant::now();
    super::two_nodes::two_nodes(ctx).await?;
    let pools_before = pools(ctx);
    // The lane imports into every node's containerd, the second node's included.
    let archive = images::image_dir(&ctx.repo).join("go-legacy.oci.tar");
    images::provisioner_image(&go.join("kubevirt-legacy-provisioner"), GO_IMAGE).write(&archive)?;
    ctx.lane.import_image(&archive)?;
    let ns = ctx.namespace("swap").await?;
    let mut timings = Vec::new();

    // The Go build as upstream deploys it, naming prefix off then on: both placements on both
    // nodes (claims and pods are named `<what>-<node number>`).
    roll_to_go(ctx, &go, false).await?;
    timings.push(("to the Go build", started.elapsed()));
    for (name, pinned) in [("go-wffc", false), ("go-pinned", true)] {
        for pv in claims_with_writers(ctx, &ns, name, pinned).await? {
            let pv_name = pv.metadata.name.as_deref().unwrap_or_default();
            ensure!(!made_by_us(&pv), "{name}: {pv_name} made by the Go build");
            ensure!(annotation(&pv, "hostPathProvisionerIdentity") == Some(PROVISIONER), "{name}: Go's identity");
            let path = pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone());
            let base = path.as_deref().and_then(|p| Path::new(p).file_name()).unwrap_or_default().to_string_lossy();
            ensure!(base.starts_with("pvc-"), "{name}: no naming prefix: {base}");
        }
    }
    roll_to_go(ctx, &go, true).await?;
    let prefixed = claims_with_writers(ctx, &ns, "go-prefixed", false).await?;
    for ((node, suffix), pv) in real_nodes(ctx).iter().zip(["-1", "-2"]).zip(prefixed) {
        let name = format!("go-prefixed{suffix}");
        ensure!(!made_by_us(&pv), "{name}: made by the Go build");
        let dir = dir_on(ctx, node, &ns, &name).await?;
        let base = dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
        ensure!(base.starts_with(&format!("{name}-pvc-")), "prefixed: {dir:?}");
    }

    // This build over it, as docs/migrating.md says: the pods keep running on both nodes.
    let swap = Instant::now();
    let ours = ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    only_pods_of(ctx, &ours).await?;
    timings.push(("Go build to this one", swap.elapsed()));
    still_running_with_their_data(ctx, &ns, &["go-wffc", "go-pinned", "go-prefixed"]).await?;
    for (name, pinned) in [("ours-wffc", false), ("ours-pinned", true)] {
        for pv in claims_with_writers(ctx, &ns, name, pinned).await? {
            ensure!(made_by_us(&pv), "{name}: {:?} made by this build", pv.metadata.name);
        }
    }
    // A local volume on each node (volumeType: local), which the Go build cannot serve.
    let local_class = ctx.class(&ns, &[("volumeType", "local")]).await?;
    let each = real_nodes(ctx).into_iter().zip(["-1", "-2"]).map(|(node, suffix)| {
        let (ns, class) = (&ns, &local_class);
        async move { claim_of_class_with_writer(ctx, ns, &format!("ours-local{suffix}"), &node, Some(class)).await }
    });
    let mut local_pvs = Vec::new();
    for pv in futures::future::try_join_all(each).await? {
        let name = pv.metadata.name.clone().unwrap_or_default();
        ensure!(pv.spec.as_ref().is_some_and(|s| s.local.is_some()), "{name}: a local PV");
        let identity = annotation(&pv, "hostPathProvisionerIdentity");
        ensure!(identity == Some(&format!("{PROVISIONER}/local")), "{name}: not the Go build's identity: {identity:?}");
        local_pvs.push(name);
    }
    // The Go-made volumes are reclaimed by this build on each node, prefixed or not.
    reclaim_on_each_node(ctx, &ns, "go-wffc").await?;
    reclaim_on_each_node(ctx, &ns, "go-prefixed").await?;

    // Back to the Go build: it serves, and reclaims this build's volumes and its own, on both
    // nodes.
    let back = Instant::now();
    roll_to_go(ctx, &go, false).await?;
    timings.push(("back to the Go build", back.elapsed()));
    still_running_with_their_data(ctx, &ns, &["go-pinned", "ours-wffc", "ours-pinned", "ours-local"]).await?;
    // The local volumes released under the Go build: it leaves them, Released with their data,
    // and keeps running (it would crash on the plain identity, docs/migrating.md).
    let mut local_dirs = Vec::new();
    for (node, suffix) in real_nodes(ctx).iter().zip(["-1", "-2"]) {
        let claim = format!("ours-local{suffix}");
        local_dirs.push((dir_on(ctx, node, &ns, &claim).await?, claim.clone()));
        ctx.lane.delete_pod(&ns, &claim).await?;
        Api::<PersistentVolumeClaim>::namespaced(ctx.lane.client(), &ns)
            .delete(&claim, &DeleteParams::default())
            .await?;
    }
    testbed::wait_for("the Go build ignoring the released local volumes", LANE_TIMEOUT, || async {
        let logs = ctx.provisioner_logs();
        let ignored =
            local_pvs.iter().all(|pv| logs.lines().any(|l| l.contains(pv.as_str()) && l.contains("deletion ignored")));
        anyhow::Ok(ignored.then_some(()))
    })
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;
    let pvs_api: Api<PersistentVolume> = Api::all(ctx.lane.client());
    for pv in &local_pvs {
        let phase = pvs_api.get(pv).await?.status.and_then(|s| s.phase);
        ensure!(phase.as_deref() == Some("Released"), "{pv} left Released, not {phase:?}");
    }
    for (dir, claim) in &local_dirs {
        ensure!(std::fs::read_to_string(dir.join(claim))? == format!("{claim}\n"), "{claim}'s data kept");
    }
    for pod in ctx.provisioner_pods().await? {
        let restarts: i32 =
            pod.status.iter().flat_map(|s| s.container_statuses.iter().flatten()).map(|c| c.restart_count).sum();
        ensure!(restarts == 0, "the Go build restarted {restarts} times on {:?}", pod.spec.and_then(|s| s.node_name));
    }
    for pv in claims_with_writers(ctx, &ns, "go-again", true).await? {
        ensure!(!made_by_us(&pv), "go-again: {:?} made by the Go build", pv.metadata.name);
    }
    for name in ["ours-wffc", "ours-pinned", "go-pinned", "go-again"] {
        reclaim_on_each_node(ctx, &ns, name).await?;
    }

    // This build again, as the lane began.
    ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    only_pods_of(ctx, &ours).await?;
    // It reclaims the local volumes the Go build left.
    for pv in &local_pvs {
        testbed::wait_for(&format!("{pv} reclaimed"), LANE_TIMEOUT, || async {
            anyhow::Ok(pvs_api.get_opt(pv).await?.is_none().then_some(()))
        })
        .await
        .map_err(|e| e.context(ctx.provisioner_logs()))?;
    }
    for (dir, _) in &local_dirs {
        ensure!(!dir.exists(), "{} removed with its PV", dir.display());
    }
    // Nothing orphaned: no PV of the namespace is left, every directory went with its claim
    // (checked by each reclaim), each node's pool holds what it held before, and what this
    // build moved to each node's trash is purged.
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
    for ((node, pool, before), (_, _, after)) in pools_before.iter().zip(pools(ctx)) {
        ensure!(*before == after, "{node}'s pool {} held {before:?}, now {after:?}", pool.display());
        let trash = pool.join(".hpp-trash");
        testbed::wait_for(&format!("{node}'s trash purged"), LANE_TIMEOUT, || async {
            anyhow::Ok(entries(&trash).is_empty().then_some(()))
        })
        .await
        .with_context(|| format!("left in {node}'s trash: {:?}", entries(&trash)))?;
    }

    for (step, took) in timings {
        println!("    {step}: rolled out in {:.1} s", took.as_secs_f64());
    }
    Ok(())
}

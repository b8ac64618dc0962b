//! A Helm release of a pinned earlier commit of this project, upgraded to this checkout on two
//! real nodes while claims keep coming and going, by the commands docs/upgrading.md writes (read
//! from the page, run as written in a directory holding the new release's files), then rolled
//! back as the page writes it.
//!
//! The earlier release runs its own image: the static binary `hack/build-earlier-provisioner.sh`
//! builds from git history, put into an OCI archive as the lane builds this checkout's image, and
//! imported under a tag of its own; its chart comes from `git archive` of that commit. Before the
//! upgrade it makes volumes with data: node volumes on each node with a pod that keeps running on
//! each, a local PV, a shared volume, an every-node volume, a directory named by `pathPattern` and
//! a volume with an enforced btrfs quota (its limit grown by this version after the upgrade). A burst of claims (node volumes pinned to each
//! node, shared volumes) and deletions runs through the upgrade, and the rollout is held so that
//! each node runs another version for a while (the mixed window). Then:
//!
//! - every claim is bound, to exactly one PV (its only `ProvisioningSucceeded`), no PV is left
//!   for a deleted claim, and the pools hold exactly the live PVs' directories;
//! - the pods that ran through the upgrade still run with their data, the earlier release's
//!   volumes are served to new pods, expanded and reclaimed by this version.
//!
//! Volumes this version made are then rolled back over: docs/upgrading.md says the earlier
//! release serves and deletes them, and it does (a pod reads them, their claims go, nothing is
//! left). The earlier commit has no snapshots, so no snapshot is taken before the upgrade; one
//! this version takes before the rollback is left by the earlier release with its finalizer and
//! its copy (as the page says), and restores once the same commands upgrade again; its deletion
//! then takes the copy.
//!
//! Run by `make test-upgrade` ([`EARLIER_ENV`] names the earlier binary; its build is long).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};

use hostpath_provisioner::deciding::snapshot::{
    FINALIZER as SNAPSHOT_FINALIZER, GROUP as SNAPSHOT_GROUP, HostPathSnapshot, KIND as SNAPSHOT_KIND,
};
use k8s_openapi::api::core::v1::{Event, TypedObjectReference};
use testbed::documented_commands::documented_commands;
use testbed::real_nodes::NODE2_NAME;

use super::operator_helm::Shell;
use super::*;

/// The earlier provisioner binary (`make test-upgrade` sets it; unset, the scenario is not run).
pub(super) const EARLIER_ENV: &str = "HPP_EARLIER_PROVISIONER";
/// The pinned earlier commit that binary is built from (its start-up log line names it).
pub(super) const EARLIER_COMMIT: &str = "12b82d297bdf2511c5dcb4140a08407fe805fe2d";
const DOC: &str = "docs/upgrading.md";
const SECTION: &str = "Helm";
/// What the documented commands name: the release, its namespace and its DaemonSet.
const RELEASE: &str = "hostpath-provisioner";
/// A provisioner name of its own: deploy/legacy's classes and PVs are none of its business.
const PROVISIONER: &str = "upgrade.hostpath.test";
const NODE_CLASS: &str = "upgrade-node";
const PINNED_CLASS: &str = "upgrade-pinned";
const SHARED_CLASS: &str = "upgrade-shared";
const EVERY_CLASS: &str = "upgrade-every";
const LOCAL_CLASS: &str = "upgrade-local";
/// Directories named from the claim (`pathPattern`), and enforced quotas on the lane's btrfs pool.
const PATTERN_CLASS: &str = "upgrade-pattern";
const QUOTA_CLASS: &str = "upgrade-quota";
/// The snapshot this release takes before the rollback.
const SNAPSHOT: &str = "before-rollback";
/// The images, as the chart's values name them (registry `localhost`: never pulled).
const REPOSITORY: &str = "localhost/hostpath-provisioner";
const EARLIER_TAG: &str = "earlier-12b82d2";
/// How long a node's new pod waits before the rollout moves to the next node: the window in
/// which each node runs another release (a DaemonSet's `minReadySeconds`).
pub(super) const HELD_SECONDS: i32 = 20;

pub(super) fn earlier_image() -> String {
    format!("{REPOSITORY}:{EARLIER_TAG}")
}

pub(super) fn new_image() -> String {
    format!("{REPOSITORY}:{}", env!("CARGO_PKG_VERSION"))
}

/// The earlier binary in an OCI archive, as the lane builds this checkout's image; kept beside
/// the binary (under target/, outside git) for the next run.
pub(super) fn earlier_image_archive(binary: &Path) -> Result<PathBuf> {
    let name = binary.file_name().context("the binary's file name")?.to_string_lossy().into_owned();
    let archive = binary.with_file_name(format!("{name}-lane.oci.tar"));
    if !archive.is_file() {
        let partial = binary.with_file_name(format!("{name}-lane.oci.tar.partial"));
        images::provisioner_image(binary, &earlier_image()).write(&partial)?;
        std::fs::rename(&partial, &archive)?;
    }
    Ok(archive)
}

/// Puts the `deploy/` of `commit` (None: this checkout's) into `work`, as a user who takes that
/// release's files.
pub(super) fn take_the_files_of(repo: &Path, work: &Path, commit: Option<&str>) -> Result<()> {
    let _ = std::fs::remove_dir_all(work.join("deploy"));
    std::fs::create_dir_all(work)?;
    let script = match commit {
        None => format!("cp -a '{}/deploy' '{}/'", repo.display(), work.display()),
        Some(commit) => format!(
            "set -o pipefail; git -C '{}' archive --format=tar {commit} deploy | tar -x -C '{}'",
            repo.display(),
            work.display()
        ),
    };
    let output = std::process::Command::new("bash").arg("-c").arg(&script).output()?;
    ensure!(
        output.status.success(),
        "{script}: {} (a shallow clone without the earlier commit? fetch the history)",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// The install's values: the earlier image, the lane's node pool (each node's own directory)
/// and its shared pool, and a class of each shape.
fn install_values(ctx: &Ctx) -> String {
    format!(
        r#"image: {{registry: localhost, repository: hostpath-provisioner, tag: "{EARLIER_TAG}", pullPolicy: IfNotPresent}}
pools:
  - {{name: legacy, path: "{pool}", hostPathType: Directory}}
  - {{name: nfs, path: "{shared}", shared: true, hostPathType: Directory}}
  - {{name: btrfs, path: "{quota}", hostPathType: Directory}}
quota: {{enabled: true}}
storageClasses:
  - {{name: {NODE_CLASS}, volumeBindingMode: WaitForFirstConsumer, allowVolumeExpansion: true}}
  - {{name: {PINNED_CLASS}, volumeBindingMode: Immediate, allowVolumeExpansion: true}}
  - {{name: {SHARED_CLASS}, volumeBindingMode: Immediate, allowVolumeExpansion: true, parameters: {{storagePool: nfs, topology: shared}}}}
  - {{name: {EVERY_CLASS}, volumeBindingMode: Immediate, parameters: {{topology: everyNode}}}}
  - {{name: {LOCAL_CLASS}, volumeBindingMode: WaitForFirstConsumer, parameters: {{volumeType: local}}}}
  - {{name: {QUOTA_CLASS}, volumeBindingMode: WaitForFirstConsumer, allowVolumeExpansion: true, parameters: {{storagePool: btrfs, quota: enforce}}}}
config: {{provisionerName: {PROVISIONER}}}
"#,
        pool = ctx.lane.pool_root().display(),
        shared = ctx.lane.shared_pool().display(),
        quota = ctx.lane.quota_pool().display(),
    )
}

/// The one command of the page's Helm section that starts with `start`.
pub(super) fn helm_section_command(
    commands: &[testbed::documented_commands::DocumentedCommand],
    start: &str,
) -> Result<String> {
    let mut found = commands.iter().filter(|c| c.file == DOC && c.section == SECTION && c.text.starts_with(start));
    let command = found.next().with_context(|| format!("no `{start} ...` in {DOC}, \"{SECTION}\""))?;
    ensure!(found.next().is_none(), "more than one `{start} ...` in {DOC}, \"{SECTION}\"");
    Ok(command.text.clone())
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The provisioner pods of the release in namespace `release`: (node, image, ready).
pub(super) async fn release_pods(ctx: &Ctx, release: &str) -> Result<Vec<(String, String, bool)>> {
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), release);
    Ok(pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| p.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet"))
        .map(|p| {
            let spec = p.spec.as_ref();
            let node = spec.and_then(|s| s.node_name.clone()).unwrap_or_default();
            let image = spec.and_then(|s| s.containers[0].image.clone()).unwrap_or_default();
            (node, image, is_ready(p))
        })
        .collect())
}

/// Waits until the release in namespace `release` runs one ready pod of `image` on each real
/// node, and nothing else.
pub(super) async fn release_runs(ctx: &Ctx, release: &str, image: &str) -> Result<()> {
    let mut nodes = vec![ctx.lane.node_name().to_owned(), NODE2_NAME.to_owned()];
    nodes.sort();
    testbed::wait_for(
        &format!("the release runs {image}, one ready pod on each of {nodes:?}"),
        LANE_TIMEOUT,
        || async {
            let pods = release_pods(ctx, release).await?;
            let mut on: Vec<String> =
                pods.iter().filter(|(_, i, ready)| i == image && *ready).map(|p| p.0.clone()).collect();
            on.sort();
            anyhow::Ok((on == nodes && pods.len() == 2).then_some(()))
        },
    )
    .await
    .map_err(|e| e.context(release_logs(ctx)))
}

/// Holds the next rollout of DaemonSet `name` (in namespace `release`) on each node for
/// [`HELD_SECONDS`] (`minReadySeconds`), then waits until its pods count as available under
/// that hold: a pod not available yet is replaced at once, so both nodes would switch together.
pub(super) async fn hold_the_rollout(ctx: &Ctx, release: &str, name: &str) -> Result<()> {
    let hold = format!(r#"{{"spec":{{"minReadySeconds":{HELD_SECONDS}}}}}"#);
    ctx.lane.cp().run_kubectl(&ctx.repo, &["-n", release, "patch", "daemonset", name, "-p", &hold])?;
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(ctx.lane.client(), release);
    testbed::wait_until(
        &format!("DaemonSet {name}'s pods available under minReadySeconds {HELD_SECONDS}"),
        LANE_TIMEOUT,
        || daemonsets.get(name),
        |ds| {
            ds.status.as_ref().is_some_and(|s| {
                s.observed_generation >= ds.metadata.generation
                    && s.desired_number_scheduled == 2
                    && s.number_available == Some(2)
            })
        },
    )
    .await?;
    Ok(())
}

/// The provisioner logs of the releases (of this file's namespace, the operator's, and
/// deploy/legacy's), for failure messages.
pub(super) fn release_logs(ctx: &Ctx) -> String {
    let mut out = String::from("the release's provisioner pod logs:\n");
    // Node 1's pod logs, and the second node's (its layout is `node2` under the lane directory).
    for node_logs in [ctx.lane.dir().join("pod-logs"), ctx.lane.dir().join("node2/pod-logs")] {
        for entry in std::fs::read_dir(&node_logs).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if [RELEASE, DEPLOY_NAMESPACE].iter().any(|ns| name.starts_with(&format!("{ns}_"))) {
                for file in walk(&entry.path()) {
                    out.push_str(&format!("--- {}\n", file.display()));
                    out.push_str(&std::fs::read_to_string(file).unwrap_or_default());
                }
            }
        }
    }
    out
}

/// A claim of `class` (16Mi), pinned to `node` when given, ReadWriteMany when `many`.
pub(super) fn claim(ns: &str, name: &str, class: &str, node: Option<&str>, many: bool) -> PersistentVolumeClaim {
    let mut claim = fixtures::claim(ns, name, class, "16Mi");
    if let Some(node) = node {
        claim = claim.provision_on_node(node);
    }
    if many {
        claim = claim.access_modes(&["ReadWriteMany"]);
    }
    claim.build()
}

pub(super) async fn wait_bound(ctx: &Ctx, ns: &str, name: &str) -> Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
    testbed::wait_until(
        &format!("claim {ns}/{name} Bound"),
        LANE_TIMEOUT,
        || claims.get(name),
        |c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
    )
    .await
    .map(|_| ())
    .map_err(|e| e.context(release_logs(ctx)))
}

/// A pod on `node` that runs `script` with `claim` mounted, to completion; its output.
pub(super) async fn run_on(ctx: &Ctx, ns: &str, pod: &str, claim: &str, node: &str, script: &str) -> Result<String> {
    let run = PodRun::new(ns, pod, script).claim(claim).on_node(node);
    let outcome = ctx.lane.run_pod(&run).await.map_err(|e| e.context(release_logs(ctx)))?;
    ensure!(outcome.exit_code == Some(0), "pod {pod} exited {:?}: {}", outcome.exit_code, outcome.logs);
    ctx.lane.delete_pod(ns, pod).await?;
    Ok(outcome.logs)
}

/// A pod on `node` that writes `text` into `claim` and keeps running.
pub(super) async fn keep_writing(ctx: &Ctx, ns: &str, pod: &str, claim: &str, node: &str, text: &str) -> Result<()> {
    let script = format!("echo {text} > /data/note && sleep 3600");
    let run = PodRun::new(ns, pod, &script).claim(claim).on_node(node).keep_running();
    ctx.lane.run_pod(&run).await.map_err(|e| e.context(release_logs(ctx)))?;
    Ok(())
}

/// The pod runs on, never restarted.
pub(super) async fn still_running(ctx: &Ctx, ns: &str, pod: &str) -> Result<()> {
    let found = Api::<Pod>::namespaced(ctx.lane.client(), ns).get(pod).await?;
    let status = found.status.context("status")?;
    ensure!(status.phase.as_deref() == Some("Running"), "{pod} still running: {:?}", status.phase);
    let restarts: i32 = status.container_statuses.iter().flatten().map(|c| c.restart_count).sum();
    ensure!(restarts == 0, "{pod} restarted {restarts} times");
    Ok(())
}

/// The pod runs on, never restarted, and its volume still holds what it wrote.
pub(super) async fn still_running_with(
    ctx: &Ctx,
    ns: &str,
    pod: &str,
    node: &str,
    claim: &str,
    text: &str,
) -> Result<()> {
    still_running(ctx, ns, pod).await?;
    let dir = ctx.lane.host_path_on(node, &ctx.lane.volume_dir(ns, claim).await?);
    let note = std::fs::read_to_string(dir.join("note"))?;
    ensure!(note == format!("{text}\n"), "{pod}'s data kept in {}: {note:?}", dir.display());
    Ok(())
}

/// Where the host holds each live PV of [`PROVISIONER`]'s directory (both nodes' copies of an
/// every-node volume), and the PVs by the uid of their claim.
pub(super) async fn our_pvs(
    ctx: &Ctx,
    provisioner: &str,
) -> Result<(BTreeSet<PathBuf>, BTreeMap<String, Vec<String>>)> {
    let nodes = [ctx.lane.node_name().to_owned(), NODE2_NAME.to_owned()];
    let mut dirs = BTreeSet::new();
    let mut by_claim: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pv in Api::<PersistentVolume>::all(ctx.lane.client()).list(&ListParams::default()).await?.items {
        let by = pv.metadata.annotations.as_ref().and_then(|a| a.get("pv.kubernetes.io/provisioned-by"));
        if by.map(String::as_str) != Some(provisioner) {
            continue;
        }
        let spec = pv.spec.clone().unwrap_or_default();
        let path = spec.host_path.map(|h| h.path).or(spec.local.map(|l| l.path));
        let path = PathBuf::from(path.context("a hostPath or local PV")?);
        // A pool on a claim sits under the edge pool, mounted where only its node's own mount
        // namespace sees it: its scenario checks those volumes on the claim's disk
        // (upgrade_claim_pool.rs).
        if path.starts_with(ctx.lane.edge_pool()) {
            continue;
        }
        if path.starts_with(ctx.lane.shared_pool()) {
            dirs.insert(path);
        } else {
            let affinity = serde_json::to_string(&spec.node_affinity)?;
            for node in nodes.iter().filter(|n| spec.node_affinity.is_none() || affinity.contains(&format!("\"{n}\"")))
            {
                dirs.insert(ctx.lane.host_path_on(node, &path));
            }
        }
        let claim = spec.claim_ref.and_then(|r| r.uid).unwrap_or_default();
        by_claim.entry(claim).or_default().push(pv.metadata.name.unwrap_or_default());
    }
    Ok((dirs, by_claim))
}

/// The volume directories in the node pools (each node's own) and the shared pool, beyond
/// `baseline`; hidden entries (trash, markers) aside.
pub(super) fn volume_dirs(ctx: &Ctx, baseline: &BTreeSet<PathBuf>) -> BTreeSet<PathBuf> {
    let roots = [
        ctx.lane.pool_root().to_path_buf(),
        ctx.lane.host_path_on(NODE2_NAME, ctx.lane.pool_root()),
        ctx.lane.shared_pool().to_path_buf(),
        // The btrfs pool of the quota volumes (on node 1, where they are made).
        ctx.lane.quota_pool().to_path_buf(),
    ];
    roots
        .iter()
        .flat_map(|root| std::fs::read_dir(root).into_iter().flatten().flatten())
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .filter(|p| !baseline.contains(p))
        .collect()
}

/// Every claim of `ns` bound to exactly one PV of ours, made once (one `ProvisioningSucceeded`;
/// an every-node volume's copies aside), no PV of ours for a claim that is gone, and exactly
/// the live PVs' directories in the pools: nothing orphaned. Waits for deletions in flight.
pub(super) async fn each_claim_once_and_nothing_orphaned(
    ctx: &Ctx,
    provisioner: &str,
    ns: &str,
    baseline: &BTreeSet<PathBuf>,
) -> Result<usize> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
    let last = std::sync::Mutex::new(String::new());
    let live =
        testbed::wait_for("one PV per claim of ours, and the pools hold their directories only", LANE_TIMEOUT, || {
            let (claims, last) = (&claims, &last);
            async move {
                let live = claims.list(&ListParams::default()).await?.items;
                let (expected, by_claim) = our_pvs(ctx, provisioner).await?;
                let found = volume_dirs(ctx, baseline);
                let mut problems = Vec::new();
                let uids: BTreeSet<String> = live.iter().filter_map(|c| c.metadata.uid.clone()).collect();
                for claim in &live {
                    let name = claim.metadata.name.clone().unwrap_or_default();
                    let pvs =
                        by_claim.get(claim.metadata.uid.as_deref().unwrap_or_default()).cloned().unwrap_or_default();
                    let bound = claim.spec.as_ref().and_then(|s| s.volume_name.clone());
                    if pvs.len() != 1 || bound.as_ref() != pvs.first() {
                        problems.push(format!("claim {name} bound to {bound:?}, PVs for it {pvs:?}"));
                    }
                }
                for (uid, pvs) in by_claim.iter().filter(|(uid, _)| !uids.contains(*uid)) {
                    problems.push(format!("PVs {pvs:?} left for gone claim {uid}"));
                }
                if found != expected {
                    problems.push(format!(
                        "directories without a PV: {:?}; PVs without their directory: {:?}",
                        found.difference(&expected).collect::<Vec<_>>(),
                        expected.difference(&found).collect::<Vec<_>>()
                    ));
                }
                let done = problems.is_empty();
                *last.lock().expect("not poisoned") = problems.join("\n");
                anyhow::Ok(done.then_some(live))
            }
        })
        .await
        .map_err(|e| e.context(last.lock().expect("not poisoned").clone()).context(release_logs(ctx)))?;
    let events: Api<Event> = Api::namespaced(ctx.lane.client(), ns);
    for claim in
        live.iter().filter(|c| c.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()) != Some(EVERY_CLASS))
    {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let about = events.list(&ListParams::default().fields(&format!("involvedObject.uid={uid}"))).await?.items;
        let made: i32 = about
            .iter()
            .filter(|e| e.reason.as_deref() == Some("ProvisioningSucceeded"))
            .map(|e| e.count.unwrap_or(1))
            .sum();
        ensure!(made == 1, "claim {:?} provisioned {made} times", claim.metadata.name);
    }
    Ok(live.len())
}

/// What the burst made and deleted, with when.
#[derive(Default)]
pub(super) struct Burst {
    pub(super) made: Vec<(String, Instant)>,
    pub(super) deleted: usize,
}

/// Until `stop`: a claim every 0.8 s, in turn of class `shared` (when given, else pinned to
/// node 2), pinned to node 1, pinned to node 2 (class `pinned`); every
/// second step one made four steps before is deleted (bound or not yet).
pub(super) async fn burst(ctx: &Ctx, ns: &str, shared: Option<&str>, pinned: &str, stop: &AtomicBool) -> Result<Burst> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
    let node1 = ctx.lane.node_name().to_owned();
    let mut out = Burst::default();
    let mut step = 0;
    while !stop.load(Ordering::SeqCst) {
        let name = format!("burst-{step}");
        let made = match (step % 3, shared) {
            (0, Some(shared)) => claim(ns, &name, shared, None, true),
            (1, _) => claim(ns, &name, pinned, Some(&node1), false),
            _ => claim(ns, &name, pinned, Some(NODE2_NAME), false),
        };
        claims.create(&PostParams::default(), &made).await.with_context(|| format!("creating claim {name}"))?;
        out.made.push((name, Instant::now()));
        if step >= 4 && step % 2 == 0 {
            claims.delete(&format!("burst-{}", step - 4), &DeleteParams::default()).await?;
            out.deleted += 1;
        }
        step += 1;
        tokio::time::sleep(Duration::from_millis(800)).await;
    }
    Ok(out)
}

/// Until `rolled`: when the pods of the release in namespace `release` ran both images, ready,
/// at once (first and last seen).
pub(super) async fn watch_the_mixed_window(
    ctx: &Ctx,
    release: &str,
    rolled: &AtomicBool,
) -> Result<Option<(Instant, Instant)>> {
    let (earlier, new) = (earlier_image(), new_image());
    let mut window: Option<(Instant, Instant)> = None;
    while !rolled.load(Ordering::SeqCst) {
        let pods = release_pods(ctx, release).await?;
        let ready_with = |image: &str| pods.iter().any(|(_, i, ready)| i == image && *ready);
        if ready_with(&earlier) && ready_with(&new) {
            let now = Instant::now();
            window = Some((window.map_or(now, |w| w.0), now));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(window)
}

/// Expands `claim` to `size` and waits until the PV and the claim have it.
pub(super) async fn expand(ctx: &Ctx, ns: &str, claim: &str, size: &str) -> Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
    let grow = serde_json::json!({"spec": {"resources": {"requests": {"storage": size}}}});
    claims.patch(claim, &PatchParams::default(), &Patch::Merge(&grow)).await?;
    let pv_name = ctx.pv_of(ns, claim).await?.metadata.name.context("PV name")?;
    let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
    let want = Quantity(size.into());
    testbed::wait_until(
        &format!("PV and claim {claim} at {size}"),
        LANE_TIMEOUT,
        || async { anyhow::Ok((pvs.get(&pv_name).await?, claims.get(claim).await?)) },
        |(pv, c)| {
            pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")) == Some(&want)
                && c.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")) == Some(&want)
        },
    )
    .await
    .map(|_| ())
    .map_err(|e| e.context(release_logs(ctx)))
}

/// Deletes the pods, then the claims, and waits until the claims' PVs are gone.
pub(super) async fn reclaim(ctx: &Ctx, ns: &str, pods: &[&str], claims: &[String]) -> Result<()> {
    for pod in pods {
        ctx.lane.delete_pod(ns, pod).await?;
    }
    let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
    let mut volumes = Vec::new();
    for claim in claims {
        volumes.extend(api.get(claim).await?.spec.and_then(|s| s.volume_name));
        api.delete(claim, &DeleteParams::default()).await?;
    }
    let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
    testbed::wait_for(&format!("the PVs of {claims:?} gone"), LANE_TIMEOUT, || async {
        for pv in &volumes {
            if pvs.get_opt(pv).await?.is_some() {
                return anyhow::Ok(None);
            }
        }
        anyhow::Ok(Some(()))
    })
    .await
    .map_err(|e| e.context(release_logs(ctx)))
}

/// What an upgrade scenario starts from.
pub(super) struct Start {
    pub(super) started: Instant,
    pub(super) node1: String,
    pub(super) node2: String,
}

/// The lane's two nodes with deploy/legacy's DaemonSet set aside (the scenario's release is the
/// only provisioner of the pools while it runs; deploy/legacy comes back at the end), the earlier
/// image imported and this checkout's tagged as the new release; `None` (saying where it runs)
/// without [`EARLIER_ENV`].
pub(super) async fn earlier_beside_head(ctx: &Ctx) -> Result<Option<Start>> {
    let Some(binary) = std::env::var_os(EARLIER_ENV).map(PathBuf::from) else {
        println!("    not here: run by `make test-upgrade` ({EARLIER_ENV}; the earlier build is long)");
        return Ok(None);
    };
    ensure!(binary.is_file(), "{EARLIER_ENV}={}: no such file", binary.display());
    let started = Instant::now();
    let head = super::two_nodes::two_nodes(ctx).await?;
    ctx.lane
        .cp()
        .run_kubectl(&ctx.repo, &["delete", "daemonset", "-n", DEPLOY_NAMESPACE, DEPLOY_DAEMONSET, "--wait"])?;
    ctx.lane.import_image(&earlier_image_archive(&binary)?)?;
    ctx.lane.tag_image(&images::normalize_reference(&head), &new_image())?;
    Ok(Some(Start { started, node1: ctx.lane.node_name().to_owned(), node2: NODE2_NAME.to_owned() }))
}

/// The upgrade `steps` (which return how long they took), started 3 s into a burst of claims and
/// deletions in `ns` that goes on 4 s past them, with the mixed window of the rollout of the
/// release in namespace `release` watched: there must be one of at least 5 s, with at least 3
/// claims made in it.
pub(super) async fn under_a_burst(
    ctx: &Ctx,
    release: &str,
    ns: &str,
    shared: Option<&str>,
    pinned: &str,
    steps: impl std::future::Future<Output = Result<Duration>>,
) -> Result<()> {
    let (stop, rolled) = (AtomicBool::new(false), AtomicBool::new(false));
    let upgrade = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let result = steps.await;
        rolled.store(true, Ordering::SeqCst);
        // The burst goes on a little after the rollout.
        tokio::time::sleep(Duration::from_secs(4)).await;
        stop.store(true, Ordering::SeqCst);
        result
    };
    let (took, burst, window) =
        tokio::join!(upgrade, burst(ctx, ns, shared, pinned, &stop), watch_the_mixed_window(ctx, release, &rolled));
    let (took, burst, window) = (took?, burst?, window?);
    let (from, to) = window.context("no moment with a ready pod of each release: the window was not mixed")?;
    let in_window = burst.made.iter().filter(|(_, at)| *at >= from && *at <= to).count();
    println!(
        "    upgraded in {:.1} s: mixed window {:.1} s with {in_window} claims made in it; burst: {} made, {} deleted",
        took.as_secs_f64(),
        (to - from).as_secs_f64(),
        burst.made.len(),
        burst.deleted
    );
    ensure!(to - from >= Duration::from_secs(5), "the mixed window lasted {:?}", to - from);
    ensure!(in_window >= 3, "claims made while each node ran another release: {in_window}");
    Ok(())
}

pub(super) async fn an_earlier_helm_release_upgraded_under_a_burst_of_claims_and_rolled_back_loses_nothing_two_nodes(
    ctx: &Ctx,
) -> Result<()> {
    let Some(Start { started, node1, node2 }) = earlier_beside_head(ctx).await? else { return Ok(()) };
    let baseline = volume_dirs(ctx, &BTreeSet::new());

    // The earlier release, from its own files.
    let work = ctx.lane.dir().join("upgrade-helm");
    take_the_files_of(&ctx.repo, &work, Some(EARLIER_COMMIT))?;
    std::fs::write(work.join("install-values.yaml"), install_values(ctx))?;
    let shell = Shell::new(ctx)?.within(&work);
    let said = shell
        .run(&format!(
            "helm install {RELEASE} deploy/helm/hostpath-provisioner -n {RELEASE} --create-namespace -f install-values.yaml"
        ))
        .await?;
    ensure!(said.contains("STATUS: deployed"), "{said}");
    release_runs(ctx, RELEASE, &earlier_image()).await?;
    let earlier_log = release_logs(ctx);
    ensure!(earlier_log.contains(EARLIER_COMMIT), "the release runs the earlier commit:\n{earlier_log}");
    println!("    earlier release {EARLIER_TAG} running on both nodes at {:.1} s", started.elapsed().as_secs_f64());

    // Volumes of every shape it has, with data.
    let ns = ctx.namespace("upgrade").await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    for (name, class) in [("old-1", NODE_CLASS), ("old-2", NODE_CLASS), ("old-local", LOCAL_CLASS)] {
        claims.create(&PostParams::default(), &claim(&ns, name, class, None, false)).await?;
    }
    run_on(ctx, &ns, "local-writer", "old-local", &node1, "echo old-local > /data/note").await?;
    // The earlier chart's values know no `pathPattern`; its provisioner does: the admin's own class.
    let pattern = fixtures::storage_class(PATTERN_CLASS, PROVISIONER).parameter("pathPattern", "{namespace}_{claim}");
    Api::<StorageClass>::all(ctx.lane.client()).create(&PostParams::default(), &pattern.build()).await?;
    for (name, class) in [("old-pattern", PATTERN_CLASS), ("old-quota", QUOTA_CLASS)] {
        claims.create(&PostParams::default(), &claim(&ns, name, class, None, false)).await?;
        run_on(ctx, &ns, &format!("{name}-writer"), name, &node1, &format!("echo {name} > /data/note")).await?;
    }
    let pattern_dir = ctx.lane.volume_dir(&ns, "old-pattern").await?;
    ensure!(
        pattern_dir.file_name().is_some_and(|n| *n == *format!("{ns}_old-pattern")),
        "old-pattern's directory named from the claim: {}",
        pattern_dir.display()
    );
    let quota_dir = ctx.lane.volume_dir(&ns, "old-quota").await?;
    ensure!(quota_dir.parent() == Some(ctx.lane.quota_pool()), "{} in the quota pool", quota_dir.display());
    // The earlier release enforces its 16 MiB: 24 MiB do not fit.
    let refused = run_on(
        ctx,
        &ns,
        "quota-tester",
        "old-quota",
        &node1,
        "dd if=/dev/zero of=/data/fill bs=1M count=24 2>&1; echo exit=$?; rm -f /data/fill; sync",
    )
    .await?;
    ensure!(!refused.contains("exit=0"), "24 MiB must not fit in the earlier release's 16 MiB quota: {refused}");
    ensure!(ctx.pv_of(&ns, "old-local").await?.spec.and_then(|s| s.local).is_some(), "old-local is a local PV");
    keep_writing(ctx, &ns, "keeper-1", "old-1", &node1, "old-1").await?;
    keep_writing(ctx, &ns, "keeper-2", "old-2", &node2, "old-2").await?;
    claims.create(&PostParams::default(), &claim(&ns, "old-shared", SHARED_CLASS, None, true)).await?;
    claims.create(&PostParams::default(), &claim(&ns, "old-every", EVERY_CLASS, None, true)).await?;
    wait_bound(ctx, &ns, "old-shared").await?;
    wait_bound(ctx, &ns, "old-every").await?;
    run_on(ctx, &ns, "shared-writer", "old-shared", &node2, "echo old-shared > /data/note").await?;
    for node in [&node1, &node2] {
        run_on(ctx, &ns, "every-writer", "old-every", node, &format!("echo {node} > /data/note")).await?;
    }
    each_claim_once_and_nothing_orphaned(ctx, PROVISIONER, &ns, &baseline).await?;

    // The upgrade, by the page's commands, from the new release's files, while the burst runs.
    let commands = documented_commands(&ctx.repo)?;
    let get_values = helm_section_command(&commands, "helm get values hostpath-provisioner")?;
    let apply_crds = helm_section_command(&commands, "kubectl apply --server-side --force-conflicts -f deploy/helm")?;
    let upgrade = helm_section_command(&commands, "helm upgrade hostpath-provisioner")?;
    let rollout = helm_section_command(&commands, "kubectl -n hostpath-provisioner rollout status")?;
    let rollback = helm_section_command(&commands, "helm rollback hostpath-provisioner")?;
    take_the_files_of(&ctx.repo, &work, None)?;
    shell.run(&get_values).await?;
    // "move those with the release": the values pin the image tag, the new one is the release's.
    let values = std::fs::read_to_string(work.join("my-values.yaml"))?;
    ensure!(values.contains(&format!("tag: {EARLIER_TAG}")), "the installed values:\n{values}");
    let new_tag = format!("tag: {}", env!("CARGO_PKG_VERSION"));
    std::fs::write(work.join("my-values.yaml"), values.replace(&format!("tag: {EARLIER_TAG}"), &new_tag))?;
    // The window held open: a node's new pod counts as available only after HELD_SECONDS, so
    // the rollout moves to the other node that much later (Helm's three-way merge keeps a field
    // the chart does not set).
    hold_the_rollout(ctx, RELEASE, RELEASE).await?;

    let upgrading = Instant::now();
    let steps = async {
        shell.run(&apply_crds).await?;
        let said = shell.run(&upgrade).await?;
        ensure!(said.contains("STATUS: deployed") && said.contains("REVISION: 2"), "{said}");
        let said = shell.run(&rollout).await?;
        ensure!(said.contains("successfully rolled out"), "{said}");
        anyhow::Ok(upgrading.elapsed())
    };
    under_a_burst(ctx, RELEASE, &ns, Some(SHARED_CLASS), PINNED_CLASS, steps).await?;
    release_runs(ctx, RELEASE, &new_image()).await?;

    // Every claim once, nothing orphaned; the pods ran through with their data.
    let bound = each_claim_once_and_nothing_orphaned(ctx, PROVISIONER, &ns, &baseline).await?;
    still_running_with(ctx, &ns, "keeper-1", &node1, "old-1", "old-1").await?;
    still_running_with(ctx, &ns, "keeper-2", &node2, "old-2", "old-2").await?;
    // The earlier release's volumes, served by this one to new pods, expanded, reclaimed.
    let read = run_on(ctx, &ns, "reader-1", "old-1", &node1, "cat /data/note").await?;
    ensure!(read.trim() == "old-1", "node 1's old volume read after the upgrade: {read:?}");
    let read = run_on(ctx, &ns, "shared-reader", "old-shared", &node1, "cat /data/note").await?;
    ensure!(read.trim() == "old-shared", "the old shared volume read on the other node: {read:?}");
    let read = run_on(ctx, &ns, "local-reader", "old-local", &node1, "cat /data/note").await?;
    ensure!(read.trim() == "old-local", "the old local volume read after the upgrade: {read:?}");
    for name in ["old-pattern", "old-quota"] {
        let read = run_on(ctx, &ns, &format!("{name}-reader"), name, &node1, "cat /data/note").await?;
        ensure!(read.trim() == name, "the old {name} volume read after the upgrade: {read:?}");
    }
    expand(ctx, &ns, "old-1", "32Mi").await?;
    expand(ctx, &ns, "old-shared", "32Mi").await?;
    // The quota grows with the claim: 24 MiB written into the 16 MiB volume made by the
    // earlier release fits once this release expanded it to 32 MiB.
    expand(ctx, &ns, "old-quota", "32Mi").await?;
    let wrote = run_on(
        ctx,
        &ns,
        "quota-filler",
        "old-quota",
        &node1,
        "dd if=/dev/zero of=/data/fill bs=1M count=24 2>&1 && sync && echo filled",
    )
    .await?;
    ensure!(wrote.contains("filled"), "24 MiB in the expanded quota volume: {wrote}");
    let old = ["old-2", "old-every", "old-local", "old-pattern", "old-quota"].map(String::from);
    reclaim(ctx, &ns, &["keeper-2"], &old).await?;
    each_claim_once_and_nothing_orphaned(ctx, PROVISIONER, &ns, &baseline).await?;
    println!("    after the upgrade: {bound} claims each bound once; old volumes served, expanded, reclaimed");

    // Volumes of this version, then the rollback as the page writes it: the earlier release
    // serves them and deletes them (docs/upgrading.md, "What is served after a rollback").
    claims.create(&PostParams::default(), &claim(&ns, "new-1", NODE_CLASS, None, false)).await?;
    run_on(ctx, &ns, "new-writer", "new-1", &node1, "echo new-1 > /data/note").await?;
    claims.create(&PostParams::default(), &claim(&ns, "new-shared", SHARED_CLASS, None, true)).await?;
    wait_bound(ctx, &ns, "new-shared").await?;
    run_on(ctx, &ns, "new-shared-writer", "new-shared", &node2, "echo new-shared > /data/note").await?;
    claims.create(&PostParams::default(), &claim(&ns, "new-2", PINNED_CLASS, Some(&node2), false)).await?;
    wait_bound(ctx, &ns, "new-2").await?;
    // A snapshot this release takes: the earlier release, which has none, leaves it and its copy.
    let snapshots: Api<HostPathSnapshot> = Api::namespaced(ctx.lane.client(), &ns);
    snapshots.create(&PostParams::default(), &HostPathSnapshot::new(SNAPSHOT, "new-1")).await?;
    let snapshot = testbed::wait_for("the snapshot ready", LANE_TIMEOUT, || async {
        let snapshot = snapshots.get(SNAPSHOT).await?;
        anyhow::Ok(snapshot.status.as_ref().is_some_and(|s| s.ready_to_use).then_some(snapshot))
    })
    .await
    .map_err(|e| e.context(release_logs(ctx)))?;
    let copy = ctx
        .lane
        .pool_root()
        .join(".hpp-snapshots")
        .join(snapshot.metadata.uid.as_deref().context("the snapshot's uid")?);
    ensure!(copy.is_dir(), "the snapshot's copy at {}", copy.display());
    let rolling_back = Instant::now();
    let said = shell.run(&rollback).await?;
    ensure!(said.contains("Rollback was a success"), "{said}");
    release_runs(ctx, RELEASE, &earlier_image()).await?;
    println!("    rolled back in {:.1} s", rolling_back.elapsed().as_secs_f64());
    each_claim_once_and_nothing_orphaned(ctx, PROVISIONER, &ns, &baseline).await?;
    still_running_with(ctx, &ns, "keeper-1", &node1, "old-1", "old-1").await?;
    let read = run_on(ctx, &ns, "new-reader", "new-1", &node1, "cat /data/note").await?;
    ensure!(read.trim() == "new-1", "the new release's node volume served after the rollback: {read:?}");
    let read = run_on(ctx, &ns, "new-shared-reader", "new-shared", &node1, "cat /data/note").await?;
    ensure!(read.trim() == "new-shared", "the new release's shared volume served after the rollback: {read:?}");
    // Everything but the snapshot's source reclaimed by the earlier release: its own volumes, the
    // new release's, the burst's.
    let mut left: Vec<String> = claims
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|name| name != "new-1")
        .collect();
    left.sort();
    reclaim(ctx, &ns, &["keeper-1"], &left).await?;
    ensure!(each_claim_once_and_nothing_orphaned(ctx, PROVISIONER, &ns, &baseline).await? == 1, "only new-1 left");
    let kept = snapshots.get(SNAPSHOT).await?;
    ensure!(
        kept.metadata.finalizers.iter().flatten().any(|f| f == SNAPSHOT_FINALIZER) && copy.is_dir(),
        "the snapshot keeps its finalizer and its copy under the earlier release: {:?}, {}",
        kept.metadata.finalizers,
        copy.display()
    );

    // Upgraded again by the same commands: the snapshot taken before the rollback restores, and
    // its deletion takes the copy. The window need not be held this time.
    let unhold = r#"{"spec":{"minReadySeconds":0}}"#;
    ctx.lane.cp().run_kubectl(&ctx.repo, &["-n", RELEASE, "patch", "daemonset", RELEASE, "-p", unhold])?;
    let upgrading = Instant::now();
    shell.run(&apply_crds).await?;
    let said = shell.run(&upgrade).await?;
    ensure!(said.contains("STATUS: deployed") && said.contains("REVISION: 4"), "{said}");
    shell.run(&rollout).await?;
    release_runs(ctx, RELEASE, &new_image()).await?;
    println!("    upgraded again in {:.1} s", upgrading.elapsed().as_secs_f64());
    let mut restored = claim(&ns, "restored", NODE_CLASS, None, false);
    restored.spec.as_mut().context("spec")?.data_source_ref = Some(TypedObjectReference {
        api_group: Some(SNAPSHOT_GROUP.into()),
        kind: SNAPSHOT_KIND.into(),
        name: SNAPSHOT.into(),
        namespace: None,
    });
    claims.create(&PostParams::default(), &restored).await?;
    let read = run_on(ctx, &ns, "restored-reader", "restored", &node1, "cat /data/note").await?;
    ensure!(read.trim() == "new-1", "the snapshot taken before the rollback restores after it: {read:?}");
    snapshots.delete(SNAPSHOT, &DeleteParams::default()).await?;
    testbed::wait_for("the snapshot gone", LANE_TIMEOUT, || async {
        anyhow::Ok(snapshots.get_opt(SNAPSHOT).await?.is_none().then_some(()))
    })
    .await
    .map_err(|e| e.context(release_logs(ctx)))?;
    ensure!(!copy.exists(), "the snapshot's copy went with it");
    reclaim(ctx, &ns, &[], &["new-1".into(), "restored".into()]).await?;
    ensure!(each_claim_once_and_nothing_orphaned(ctx, PROVISIONER, &ns, &baseline).await? == 0, "claims left");
    ensure!(volume_dirs(ctx, &baseline).is_empty(), "the pools are back as they were");

    let uninstall = shell.run(&format!("helm uninstall {RELEASE} -n {RELEASE} --wait")).await?;
    ensure!(uninstall.contains("uninstalled"), "{uninstall}");
    Api::<StorageClass>::all(ctx.lane.client()).delete(PATTERN_CLASS, &DeleteParams::default()).await?;
    ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    Ok(())
}

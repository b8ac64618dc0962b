//! The operator of a pinned earlier commit of this project, installed from that commit's
//! `deploy/operator` with a resource selecting both real nodes, upgraded to this checkout by
//! docs/upgrading.md's command ("The operator": the new release's `deploy/operator` applied, read
//! from the page and run as written) while a burst of node claims and deletions runs, then rolled
//! back by the same command from the earlier release's files. The operator gives the node pods
//! its own image, so each apply rolls the node DaemonSet; the rollout is held so that each node
//! runs another release for a while. The same checks as the Helm path
//! (`upgrade_helm.rs`, whose helpers this uses): every claim bound to one PV made once, nothing
//! orphaned, pods keep their data, old volumes served, expanded and reclaimed by the new
//! release, the new release's volumes served and deleted by the earlier one. A pool on a claim
//! per node goes through both applies too (`upgrade_claim_pool.rs`).
//!
//! Run by `make test-upgrade` ([`EARLIER_ENV`]).

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use testbed::documented_commands::documented_commands;

use super::operator_helm::Shell;
use super::upgrade_checks::Volumes;
use super::upgrade_claim_pool::{self, ClaimPool};
use super::upgrade_helm::*;
use super::*;

const DOC: &str = "docs/upgrading.md";
const SECTION: &str = "The operator";
/// The operator's namespace and its node DaemonSet, as deploy/operator names them.
pub(super) const NAMESPACE: &str = "hostpath-provisioner";
pub(super) const NODE_DAEMONSET: &str = "kubevirt-hostpath-provisioner";
const OPERATOR: &str = "hostpath-provisioner-operator";
/// The operator's node pods serve this name, as the kubevirt operator's do.
pub(super) const PROVISIONER: &str = "kubevirt.io/hostpath-provisioner";
pub(super) const RESOURCE: &str = "hostpath-provisioner";
/// A label on both real nodes, which the resource selects (not the simulated node).
pub(super) const NODE_LABEL: &str = "hpp-upgrade";
const NODE_CLASS: &str = "upgrade-operator-node";
const PINNED_CLASS: &str = "upgrade-operator-pinned";

/// `deploy/` of `commit` (None: this checkout's) in `work`, its operator image set as an admin
/// does (deploy/operator/kustomization.yaml, `images:`).
fn take_the_operator_of(repo: &Path, work: &Path, commit: Option<&str>, image: &str) -> Result<()> {
    take_the_files_of(repo, work, commit)?;
    let kustomization = work.join("deploy/operator/kustomization.yaml");
    let text = std::fs::read_to_string(&kustomization)?;
    let placeholder = "newName: your-registry.invalid/hostpath-provisioner\n    newTag: \"0.1.0\"";
    ensure!(text.contains(placeholder), "deploy/operator/kustomization.yaml names no placeholder image:\n{text}");
    let (name, tag) = image.rsplit_once(':').context("a tag in the image")?;
    std::fs::write(&kustomization, text.replace(placeholder, &format!("newName: {name}\n    newTag: \"{tag}\"")))?;
    Ok(())
}

pub(super) async fn operator_runs(ctx: &Ctx, image: &str) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(ctx.lane.client(), NAMESPACE);
    testbed::wait_until(
        &format!("the operator Deployment rolled out with {image}"),
        Duration::from_secs(240),
        || deployments.get(OPERATOR),
        |d| {
            let spec_image =
                d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).and_then(|s| s.containers[0].image.clone());
            d.status.as_ref().is_some_and(|s| {
                s.observed_generation == d.metadata.generation
                    && s.updated_replicas == s.replicas
                    && s.available_replicas.unwrap_or(0) >= 1
                    && s.unavailable_replicas.unwrap_or(0) == 0
            }) && spec_image.as_deref() == Some(image)
        },
    )
    .await
    .map(|_| ())
    .map_err(|e| e.context(release_logs(ctx)))
}

pub(super) fn class(name: &str, immediate: bool) -> StorageClass {
    let class = fixtures::storage_class(name, PROVISIONER).parameter("storagePool", "local").allow_expansion();
    if immediate { class.immediate().build() } else { class.build() }
}

pub(super) async fn an_earlier_operator_upgraded_by_applying_the_new_release_under_a_burst_and_rolled_back_loses_nothing_two_nodes(
    ctx: &Ctx,
) -> Result<()> {
    let Some(Start { started, node1, node2 }) = earlier_beside_head(ctx).await? else { return Ok(()) };
    for node in [&node1, &node2] {
        ctx.lane.cp().run_kubectl(&ctx.repo, &["label", "node", node, &format!("{NODE_LABEL}=yes"), "--overwrite"])?;
    }
    let baseline = volume_dirs(ctx, &BTreeSet::new());
    let commands = documented_commands(&ctx.repo)?;
    let documented = |start: &str| -> Result<String> {
        let mut found = commands.iter().filter(|c| c.file == DOC && c.section == SECTION && c.text.starts_with(start));
        let command = found.next().with_context(|| format!("no `{start} ...` in {DOC}, \"{SECTION}\""))?;
        ensure!(found.next().is_none(), "more than one `{start} ...` in {DOC}, \"{SECTION}\"");
        Ok(command.text.clone())
    };
    let apply = documented("kubectl apply --server-side --force-conflicts -k deploy/operator")?;
    let get = documented("kubectl get hostpathprovisioners")?;

    // The earlier operator, from its own files, and a resource on both nodes with two pools: a
    // directory, and one on a claim per node (upgrade_claim_pool.rs).
    let work = ctx.lane.dir().join("upgrade-operator");
    take_the_operator_of(&ctx.repo, &work, Some(EARLIER_COMMIT), &earlier_image())?;
    let shell = Shell::new(ctx)?.within(&work);
    shell.run(&apply).await?;
    operator_runs(ctx, &earlier_image()).await?;
    let mut claim_pool = ClaimPool::create(ctx, &work).await?;
    let resource = serde_json::json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
        "metadata": {"name": RESOURCE},
        "spec": {
            "imagePullPolicy": "IfNotPresent",
            "storagePools": [{"name": "local", "path": ctx.lane.pool_root()}, claim_pool.resource_entry()],
            "workload": {"nodeSelector": {NODE_LABEL: "yes"}},
        },
    });
    resources(ctx).create(&PostParams::default(), &serde_json::from_value(resource)?).await?;
    release_runs(ctx, NAMESPACE, &earlier_image()).await?;
    claim_pool.served_by(ctx, &earlier_image()).await?;
    for (name, immediate) in [(NODE_CLASS, false), (PINNED_CLASS, true)] {
        Api::<StorageClass>::all(ctx.lane.client()).create(&PostParams::default(), &class(name, immediate)).await?;
    }
    let on_claim = fixtures::storage_class(upgrade_claim_pool::CLASS, PROVISIONER)
        .parameter("storagePool", upgrade_claim_pool::POOL)
        .immediate()
        .build();
    Api::<StorageClass>::all(ctx.lane.client()).create(&PostParams::default(), &on_claim).await?;
    println!(
        "    earlier operator and its node pods running on both nodes at {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let ns = ctx.namespace("upgrade-op").await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    for name in ["old-1", "old-2"] {
        claims.create(&PostParams::default(), &claim(&ns, name, NODE_CLASS, None, false)).await?;
    }
    keep_writing(ctx, &ns, "keeper-1", "old-1", &node1, "old-1").await?;
    keep_writing(ctx, &ns, "keeper-2", "old-2", &node2, "old-2").await?;
    each_claim_once_and_nothing_orphaned(ctx, PROVISIONER, &ns, &baseline).await?;
    // A volume in the pool on a claim of node 2, with a pod writing into it.
    let claimed_ns = ctx.namespace("upgrade-op-claimed").await?;
    let claimed: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &claimed_ns);
    claimed
        .create(&PostParams::default(), &claim(&claimed_ns, "on-claim", upgrade_claim_pool::CLASS, Some(&node2), false))
        .await?;
    keep_writing(ctx, &claimed_ns, "keeper-claimed", "on-claim", &node2, "on-claim").await?;
    ensure!(
        claim_pool.note(ctx, &claimed_ns, "on-claim", &node2).await? == "on-claim\n",
        "the volume on node 2's claim disk written"
    );

    // The upgrade: the new release's deploy/operator applied as the page writes it.
    take_the_operator_of(&ctx.repo, &work, None, &new_image())?;
    hold_the_rollout(ctx, NAMESPACE, NODE_DAEMONSET).await?;
    let upgrading = Instant::now();
    let steps = async {
        shell.run(&apply).await?;
        let listed = shell.run(&get).await?;
        ensure!(listed.contains(RESOURCE), "{listed}");
        operator_runs(ctx, &new_image()).await?;
        release_runs(ctx, NAMESPACE, &new_image()).await?;
        anyhow::Ok(upgrading.elapsed())
    };
    under_a_burst(ctx, NAMESPACE, &ns, None, PINNED_CLASS, steps).await?;
    let volumes = Volumes { ctx, provisioner: PROVISIONER, ns: &ns, baseline: &baseline, node1: &node1, node2: &node2 };
    volumes.kept_through_the_upgrade(&[]).await?;
    // The pool on a claim: the same claims, the new mounters on the same mounts, the pod on its
    // data, and a new volume on node 1's claim disk.
    claim_pool.served_by(ctx, &new_image()).await?;
    still_running(ctx, &claimed_ns, "keeper-claimed").await?;
    ensure!(
        claim_pool.note(ctx, &claimed_ns, "on-claim", &node2).await? == "on-claim\n",
        "the volume on node 2's claim disk kept its data"
    );
    claimed
        .create(
            &PostParams::default(),
            &claim(&claimed_ns, "new-on-claim", upgrade_claim_pool::CLASS, Some(&node1), false),
        )
        .await?;
    wait_bound(ctx, &claimed_ns, "new-on-claim").await?;
    run_on(ctx, &claimed_ns, "new-on-claim-writer", "new-on-claim", &node1, "echo new-on-claim > /data/note").await?;
    let new_dir = claim_pool.volume_dir(ctx, &claimed_ns, "new-on-claim", &node1).await?;
    ensure!(
        std::fs::read_to_string(new_dir.join("note"))? == "new-on-claim\n",
        "the new volume on node 1's claim disk"
    );

    // A volume of this release on each node, then back: the earlier deploy/operator applied the
    // same way ("Rolling back the operator").
    volumes.made_before_the_rollback(NODE_CLASS, PINNED_CLASS).await?;
    let rolling_back = Instant::now();
    take_the_operator_of(&ctx.repo, &work, Some(EARLIER_COMMIT), &earlier_image())?;
    shell.run(&apply).await?;
    operator_runs(ctx, &earlier_image()).await?;
    release_runs(ctx, NAMESPACE, &earlier_image()).await?;
    println!("    rolled back in {:.1} s", rolling_back.elapsed().as_secs_f64());
    volumes.served_after_the_rollback_and_reclaimed().await?;
    // The pool on a claim under the earlier release again: its mounters, the same mounts, the
    // pod on its data, the new release's volume read; then both volumes reclaimed by it.
    claim_pool.served_by(ctx, &earlier_image()).await?;
    still_running(ctx, &claimed_ns, "keeper-claimed").await?;
    ensure!(
        claim_pool.note(ctx, &claimed_ns, "on-claim", &node2).await? == "on-claim\n",
        "the volume on node 2's claim disk kept its data"
    );
    let read = run_on(ctx, &claimed_ns, "new-on-claim-reader", "new-on-claim", &node1, "cat /data/note").await?;
    ensure!(read.trim() == "new-on-claim", "the new release's volume on a claim served after the rollback: {read:?}");
    reclaim(ctx, &claimed_ns, &["keeper-claimed"], &["on-claim".to_owned(), "new-on-claim".to_owned()]).await?;
    println!("    the pool on a claim kept its claims, mounts and data through both applies");

    // The resource deleted (the operator removes its node DaemonSet), the operator scaled away,
    // deploy/legacy back.
    resources(ctx).delete(RESOURCE, &DeleteParams::default()).await?;
    testbed::wait_for("the resource gone", LANE_TIMEOUT, || async {
        anyhow::Ok(resources(ctx).get_opt(RESOURCE).await?.is_none().then_some(()))
    })
    .await?;
    claim_pool.remove(ctx).await?;
    ctx.lane.cp().run_kubectl(&ctx.repo, &["-n", NAMESPACE, "delete", "deployment", OPERATOR, "--wait"])?;
    for name in [NODE_CLASS, PINNED_CLASS] {
        Api::<StorageClass>::all(ctx.lane.client()).delete(name, &DeleteParams::default()).await?;
    }
    ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    Ok(())
}

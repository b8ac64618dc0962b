//! The chart of a pinned earlier commit in operator mode (`operator.enabled`, with the chart's
//! `operator.resource` selecting both real nodes), upgraded to this checkout by docs/upgrading.md's
//! Helm commands, which "The operator" names for this mode (the values read back, the CRDs
//! applied, `helm upgrade`; read from the page, run as written in a directory holding the new
//! release's files) while a burst of node claims and deletions runs, then rolled back by
//! `helm rollback` as written. The operator gives the node pods its own image, so the upgrade
//! rolls the node DaemonSet; the rollout is held so that each node runs another release for a
//! while. The same checks as the other paths (`upgrade_helm.rs`, `upgrade_operator.rs`, whose
//! helpers this uses).
//!
//! Run by `make test-upgrade` ([`EARLIER_ENV`]).

use std::collections::BTreeSet;

use testbed::documented_commands::documented_commands;

use super::operator_helm::Shell;
use super::upgrade_checks::Volumes;
use super::upgrade_helm::*;
use super::upgrade_operator::*;
use super::*;

/// The release, as docs/upgrading.md's commands name it; in operator mode its namespace is also
/// the operator's and the node DaemonSet's.
const RELEASE: &str = "hostpath-provisioner";
const NODE_CLASS: &str = "upgrade-helm-operator-node";
const PINNED_CLASS: &str = "upgrade-helm-operator-pinned";

/// The install's values: the earlier image, no class of the chart's (so no `helm test` claim),
/// operator mode with a resource whose pool is the lane's node pool on both real nodes.
fn install_values(ctx: &Ctx) -> Result<String> {
    let earlier = earlier_image();
    let (_, tag) = earlier.rsplit_once(':').context("a tag in the earlier image")?;
    Ok(format!(
        r#"image: {{registry: localhost, repository: hostpath-provisioner, tag: "{tag}", pullPolicy: IfNotPresent}}
# The scenario's classes are its own (the chart's default class is deploy/legacy's name on the lane).
storageClasses: []
tests: {{enabled: false}}
operator:
  enabled: true
  replicas: 1
  resource:
    imagePullPolicy: IfNotPresent
    storagePools: [{{name: local, path: "{pool}"}}]
    workload: {{nodeSelector: {{{NODE_LABEL}: "yes"}}}}
"#,
        pool = ctx.lane.pool_root().display(),
    ))
}

pub(super) async fn an_earlier_helm_release_in_operator_mode_upgraded_under_a_burst_and_rolled_back_loses_nothing_two_nodes(
    ctx: &Ctx,
) -> Result<()> {
    let Some(Start { started, node1, node2 }) = earlier_beside_head(ctx).await? else { return Ok(()) };
    for node in [&node1, &node2] {
        ctx.lane.cp().run_kubectl(&ctx.repo, &["label", "node", node, &format!("{NODE_LABEL}=yes"), "--overwrite"])?;
    }
    let baseline = volume_dirs(ctx, &BTreeSet::new());
    let commands = documented_commands(&ctx.repo)?;
    let get_values = helm_section_command(&commands, "helm get values hostpath-provisioner")?;
    let apply_crds = helm_section_command(&commands, "kubectl apply --server-side --force-conflicts -f deploy/helm")?;
    let upgrade = helm_section_command(&commands, "helm upgrade hostpath-provisioner")?;
    let rollback = helm_section_command(&commands, "helm rollback hostpath-provisioner")?;

    // The earlier release, from its own files.
    let work = ctx.lane.dir().join("upgrade-helm-operator");
    take_the_files_of(&ctx.repo, &work, Some(EARLIER_COMMIT))?;
    std::fs::write(work.join("install-values.yaml"), install_values(ctx)?)?;
    let shell = Shell::new(ctx)?.within(&work);
    // A cluster that never had this release: the HostPathProvisioner CRD the Helm path's upgrade
    // left (applied by kubectl, the page's step) goes first, no resource being left of it. Else
    // Helm 4 applies the earlier chart's CRD over it and stops at a conflict with kubectl's
    // fields: a downgrade, which the earlier release's own install never meets.
    ctx.lane.cp().run_kubectl(
        &ctx.repo,
        &["delete", "crd", "hostpathprovisioners.hostpathprovisioner.kubevirt.io", "--ignore-not-found", "--wait"],
    )?;
    let said = shell
        .run(&format!(
            "helm install {RELEASE} deploy/helm/hostpath-provisioner -n {RELEASE} --create-namespace -f install-values.yaml"
        ))
        .await?;
    ensure!(said.contains("STATUS: deployed"), "{said}");
    operator_runs(ctx, &earlier_image()).await?;
    release_runs(ctx, NAMESPACE, &earlier_image()).await?;
    for (name, immediate) in [(NODE_CLASS, false), (PINNED_CLASS, true)] {
        Api::<StorageClass>::all(ctx.lane.client()).create(&PostParams::default(), &class(name, immediate)).await?;
    }
    println!(
        "    earlier release in operator mode and its node pods running on both nodes at {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let ns = ctx.namespace("upgrade-hop").await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    for name in ["old-1", "old-2"] {
        claims.create(&PostParams::default(), &claim(&ns, name, NODE_CLASS, None, false)).await?;
    }
    keep_writing(ctx, &ns, "keeper-1", "old-1", &node1, "old-1").await?;
    keep_writing(ctx, &ns, "keeper-2", "old-2", &node2, "old-2").await?;
    each_claim_once_and_nothing_orphaned(ctx, PROVISIONER, &ns, &baseline).await?;

    // The upgrade, by the page's Helm commands, from the new release's files.
    take_the_files_of(&ctx.repo, &work, None)?;
    shell.run(&get_values).await?;
    // "move those with the release": the values pin the image tag, the new one is the release's.
    let values = std::fs::read_to_string(work.join("my-values.yaml"))?;
    let earlier = earlier_image();
    let (_, earlier_tag) = earlier.rsplit_once(':').context("a tag in the earlier image")?;
    ensure!(values.contains(&format!("tag: {earlier_tag}")), "the installed values:\n{values}");
    ensure!(values.contains("enabled: true"), "the installed values keep operator mode:\n{values}");
    let new_tag = format!("tag: {}", env!("CARGO_PKG_VERSION"));
    std::fs::write(work.join("my-values.yaml"), values.replace(&format!("tag: {earlier_tag}"), &new_tag))?;
    hold_the_rollout(ctx, NAMESPACE, NODE_DAEMONSET).await?;
    let upgrading = Instant::now();
    let steps = async {
        shell.run(&apply_crds).await?;
        let said = shell.run(&upgrade).await?;
        ensure!(said.contains("STATUS: deployed") && said.contains("REVISION: 2"), "{said}");
        operator_runs(ctx, &new_image()).await?;
        release_runs(ctx, NAMESPACE, &new_image()).await?;
        anyhow::Ok(upgrading.elapsed())
    };
    under_a_burst(ctx, NAMESPACE, &ns, None, PINNED_CLASS, steps).await?;
    let volumes = Volumes { ctx, provisioner: PROVISIONER, ns: &ns, baseline: &baseline, node1: &node1, node2: &node2 };
    volumes.kept_through_the_upgrade(&[]).await?;

    // A volume of this release on each node, then `helm rollback` as written.
    volumes.made_before_the_rollback(NODE_CLASS, PINNED_CLASS).await?;
    let rolling_back = Instant::now();
    let said = shell.run(&rollback).await?;
    ensure!(said.contains("Rollback was a success"), "{said}");
    operator_runs(ctx, &earlier_image()).await?;
    release_runs(ctx, NAMESPACE, &earlier_image()).await?;
    println!("    rolled back in {:.1} s", rolling_back.elapsed().as_secs_f64());
    volumes.served_after_the_rollback_and_reclaimed().await?;

    // The resource deleted while its operator runs (it removes the node DaemonSet and its own
    // finalizer), then the release uninstalled, deploy/legacy back.
    resources(ctx).delete(RESOURCE, &DeleteParams::default()).await?;
    testbed::wait_for("the resource gone", LANE_TIMEOUT, || async {
        anyhow::Ok(resources(ctx).get_opt(RESOURCE).await?.is_none().then_some(()))
    })
    .await?;
    let uninstall = shell.run(&format!("helm uninstall {RELEASE} -n {RELEASE} --wait")).await?;
    ensure!(uninstall.contains("uninstalled"), "{uninstall}");
    for name in [NODE_CLASS, PINNED_CLASS] {
        Api::<StorageClass>::all(ctx.lane.client()).delete(name, &DeleteParams::default()).await?;
    }
    ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    Ok(())
}

//! deploy/legacy of a pinned earlier commit, installed from that commit's files by
//! `kubectl apply -k deploy/legacy` (its kustomization set to the admin's image and pool, as an
//! admin does in the files they keep), upgraded to this checkout by docs/upgrading.md's commands
//! ("Kustomize and the one file", read from the page and run as written in a directory holding the
//! new release's files, set the same way) while a burst of node claims and deletions runs, then
//! rolled back by the same command from the earlier release's files. The rollout is held so that
//! each node runs another release for a while. The same checks as the Helm path
//! (`upgrade_helm.rs`, whose helpers this uses): every claim bound to one PV made once, nothing
//! orphaned, pods keep their data, old volumes served, expanded and reclaimed by the new release,
//! the new release's volumes served and deleted by the earlier one.
//!
//! The lane's own deploy/legacy install (this checkout's, over which the earlier one is applied)
//! already brought the HostPathSnapshot CRD, so the CRD's arrival with an upgrade is shown by the
//! Helm path, not here.
//!
//! Run by `make test-upgrade` ([`EARLIER_ENV`]).

use std::collections::BTreeSet;

use testbed::documented_commands::documented_commands;

use super::operator_helm::Shell;
use super::upgrade_checks::Volumes;
use super::upgrade_helm::*;
use super::*;

const DOC: &str = "docs/upgrading.md";
const SECTION: &str = "Kustomize and the one file";
/// deploy/legacy's node pods serve this name.
const PROVISIONER: &str = "kubevirt.io/hostpath-provisioner";
const NODE_CLASS: &str = "upgrade-kustomize-node";
const PINNED_CLASS: &str = "upgrade-kustomize-pinned";

/// `deploy/` of `commit` (None: this checkout's) in `work`, with deploy/legacy's kustomization
/// set to `image` and to the lane's node pool, as an admin keeps their install's files: the
/// placeholder image replaced (`images:`), and the pool root moved by a patch.
fn take_the_legacy_of(ctx: &Ctx, work: &Path, commit: Option<&str>, image: &str) -> Result<()> {
    take_the_files_of(&ctx.repo, work, commit)?;
    let kustomization = work.join("deploy/legacy/kustomization.yaml");
    let text = std::fs::read_to_string(&kustomization)?;
    let placeholder = "newName: your-registry.invalid/hostpath-provisioner\n    newTag: \"0.1.0\"";
    ensure!(text.contains(placeholder), "deploy/legacy/kustomization.yaml names no placeholder image:\n{text}");
    ensure!(!text.contains("\npatches:"), "deploy/legacy/kustomization.yaml has patches of its own:\n{text}");
    let (name, tag) = image.rsplit_once(':').context("a tag in the image")?;
    let pool = ctx.lane.pool_root().display().to_string();
    // A JSON patch for the mount (volumeMounts merge on mountPath: a merge would add a second
    // one), a strategic merge for the env entry and the volume (merged by name).
    let patches = format!(
        r#"
# The lane's node pool (an admin's edit).
patches:
  - target: {{kind: DaemonSet, name: {DEPLOY_DAEMONSET}}}
    patch: |-
      - op: test
        path: /spec/template/spec/containers/0/volumeMounts/0/name
        value: pv-volume
      - op: replace
        path: /spec/template/spec/containers/0/volumeMounts/0/mountPath
        value: {pool}
  - patch: |-
      apiVersion: apps/v1
      kind: DaemonSet
      metadata:
        name: {DEPLOY_DAEMONSET}
        namespace: {DEPLOY_NAMESPACE}
      spec:
        template:
          spec:
            containers:
              - name: {DEPLOY_DAEMONSET}
                env:
                  - name: PV_DIR
                    value: {pool}
            volumes:
              - name: pv-volume
                hostPath:
                  path: {pool}
"#
    );
    let text = text.replace(placeholder, &format!("newName: {name}\n    newTag: \"{tag}\"")) + &patches;
    std::fs::write(&kustomization, text)?;
    Ok(())
}

fn class(name: &str, immediate: bool) -> StorageClass {
    let class = fixtures::storage_class(name, PROVISIONER).allow_expansion();
    if immediate { class.immediate().build() } else { class.build() }
}

pub(super) async fn an_earlier_kustomize_install_upgraded_by_applying_the_new_release_under_a_burst_and_rolled_back_loses_nothing_two_nodes(
    ctx: &Ctx,
) -> Result<()> {
    let Some(Start { started, node1, node2 }) = earlier_beside_head(ctx).await? else { return Ok(()) };
    let baseline = volume_dirs(ctx, &BTreeSet::new());
    let commands = documented_commands(&ctx.repo)?;
    let documented = |start: &str| -> Result<String> {
        let mut found = commands.iter().filter(|c| c.file == DOC && c.section == SECTION && c.text.starts_with(start));
        let command = found.next().with_context(|| format!("no `{start} ...` in {DOC}, \"{SECTION}\""))?;
        ensure!(found.next().is_none(), "more than one `{start} ...` in {DOC}, \"{SECTION}\"");
        Ok(command.text.clone())
    };
    let apply = documented("kubectl apply -k deploy/legacy")?;
    let rollout = documented(&format!("kubectl -n {DEPLOY_NAMESPACE} rollout status"))?;

    // The earlier release, from its own files.
    let work = ctx.lane.dir().join("upgrade-kustomize");
    take_the_legacy_of(ctx, &work, Some(EARLIER_COMMIT), &earlier_image())?;
    let shell = Shell::new(ctx)?.within(&work);
    shell.run(&apply).await?;
    let said = shell.run(&rollout).await?;
    ensure!(said.contains("successfully rolled out"), "{said}");
    release_runs(ctx, DEPLOY_NAMESPACE, &earlier_image()).await?;
    for (name, immediate) in [(NODE_CLASS, false), (PINNED_CLASS, true)] {
        Api::<StorageClass>::all(ctx.lane.client()).create(&PostParams::default(), &class(name, immediate)).await?;
    }
    println!("    earlier deploy/legacy running on both nodes at {:.1} s", started.elapsed().as_secs_f64());

    let ns = ctx.namespace("upgrade-kust").await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    for name in ["old-1", "old-2"] {
        claims.create(&PostParams::default(), &claim(&ns, name, NODE_CLASS, None, false)).await?;
    }
    keep_writing(ctx, &ns, "keeper-1", "old-1", &node1, "old-1").await?;
    keep_writing(ctx, &ns, "keeper-2", "old-2", &node2, "old-2").await?;
    claims.create(&PostParams::default(), &claim(&ns, "old-pinned", PINNED_CLASS, Some(&node2), false)).await?;
    wait_bound(ctx, &ns, "old-pinned").await?;
    run_on(ctx, &ns, "pinned-writer", "old-pinned", &node2, "echo old-pinned > /data/note").await?;
    each_claim_once_and_nothing_orphaned(ctx, PROVISIONER, &ns, &baseline).await?;

    // The upgrade: the new release's deploy/legacy applied as the page writes it.
    take_the_legacy_of(ctx, &work, None, &new_image())?;
    hold_the_rollout(ctx, DEPLOY_NAMESPACE, DEPLOY_DAEMONSET).await?;
    let upgrading = Instant::now();
    let steps = async {
        shell.run(&apply).await?;
        let said = shell.run(&rollout).await?;
        ensure!(said.contains("successfully rolled out"), "{said}");
        release_runs(ctx, DEPLOY_NAMESPACE, &new_image()).await?;
        anyhow::Ok(upgrading.elapsed())
    };
    under_a_burst(ctx, DEPLOY_NAMESPACE, &ns, None, PINNED_CLASS, steps).await?;
    let volumes = Volumes { ctx, provisioner: PROVISIONER, ns: &ns, baseline: &baseline, node1: &node1, node2: &node2 };
    let read = run_on(ctx, &ns, "pinned-reader", "old-pinned", &node2, "cat /data/note").await?;
    ensure!(read.trim() == "old-pinned", "the old pinned volume read after the upgrade: {read:?}");
    volumes.kept_through_the_upgrade(&["old-pinned"]).await?;

    // Volumes of this release on each node, then back: the earlier release's deploy/legacy
    // applied the same way ("Rolling back is the same command from the earlier release's files").
    volumes.made_before_the_rollback(NODE_CLASS, PINNED_CLASS).await?;
    let rolling_back = Instant::now();
    take_the_legacy_of(ctx, &work, Some(EARLIER_COMMIT), &earlier_image())?;
    shell.run(&apply).await?;
    let said = shell.run(&rollout).await?;
    ensure!(said.contains("successfully rolled out"), "{said}");
    release_runs(ctx, DEPLOY_NAMESPACE, &earlier_image()).await?;
    println!("    rolled back in {:.1} s", rolling_back.elapsed().as_secs_f64());
    volumes.served_after_the_rollback_and_reclaimed().await?;

    // The lane's deploy/legacy back, its rollout no longer held.
    for name in [NODE_CLASS, PINNED_CLASS] {
        Api::<StorageClass>::all(ctx.lane.client()).delete(name, &DeleteParams::default()).await?;
    }
    let unhold = r#"{"spec":{"minReadySeconds":0}}"#;
    ctx.lane
        .cp()
        .run_kubectl(&ctx.repo, &["-n", DEPLOY_NAMESPACE, "patch", "daemonset", DEPLOY_DAEMONSET, "-p", unhold])?;
    ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    Ok(())
}

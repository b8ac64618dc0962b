//! The checks every upgrade path makes on its two node volumes with a pod writing into each
//! (`old-1` on node 1, `old-2` on node 2, made by the earlier release) and on the volumes the new
//! release makes before the rollback (`new-1`, `new-2`): shared by the kustomize, operator and
//! Helm operator-mode paths (`upgrade_*.rs`), each running its own install, upgrade and rollback.

use std::collections::BTreeSet;

use super::upgrade_helm::*;
use super::*;

/// One path's claims and where they live.
pub(super) struct Volumes<'a> {
    pub ctx: &'a Ctx,
    pub provisioner: &'a str,
    pub ns: &'a str,
    /// The pools' entries before the path made anything.
    pub baseline: &'a BTreeSet<PathBuf>,
    pub node1: &'a str,
    pub node2: &'a str,
}

impl Volumes<'_> {
    /// After the upgrade under the burst: every claim bound once with nothing orphaned, the pods
    /// that ran through it still running on their data, node 1's old volume read by a new pod and
    /// expanded, node 2's and `also_reclaimed` reclaimed by the new release. Returns how many
    /// claims were bound.
    pub async fn kept_through_the_upgrade(&self, also_reclaimed: &[&str]) -> Result<usize> {
        let Volumes { ctx, provisioner, ns, baseline, node1, node2 } = *self;
        let bound = each_claim_once_and_nothing_orphaned(ctx, provisioner, ns, baseline).await?;
        still_running_with(ctx, ns, "keeper-1", node1, "old-1", "old-1").await?;
        still_running_with(ctx, ns, "keeper-2", node2, "old-2", "old-2").await?;
        let read = run_on(ctx, ns, "reader-1", "old-1", node1, "cat /data/note").await?;
        ensure!(read.trim() == "old-1", "node 1's old volume read after the upgrade: {read:?}");
        expand(ctx, ns, "old-1", "32Mi").await?;
        let mut reclaimed = vec!["old-2".to_owned()];
        reclaimed.extend(also_reclaimed.iter().map(|c| (*c).to_owned()));
        reclaim(ctx, ns, &["keeper-2"], &reclaimed).await?;
        each_claim_once_and_nothing_orphaned(ctx, provisioner, ns, baseline).await?;
        println!("    after the upgrade: {bound} claims each bound once; old volumes served, expanded, reclaimed");
        Ok(bound)
    }

    /// A volume of the new release on each node before the rollback: `new-1` of `node_class`
    /// written on node 1, `new-2` of `pinned_class` pinned to node 2.
    pub async fn made_before_the_rollback(&self, node_class: &str, pinned_class: &str) -> Result<()> {
        let Volumes { ctx, ns, node1, node2, .. } = *self;
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
        claims.create(&PostParams::default(), &claim(ns, "new-1", node_class, None, false)).await?;
        run_on(ctx, ns, "new-writer", "new-1", node1, "echo new-1 > /data/note").await?;
        claims.create(&PostParams::default(), &claim(ns, "new-2", pinned_class, Some(node2), false)).await?;
        wait_bound(ctx, ns, "new-2").await
    }

    /// After the rollback: every claim bound once, node 1's pod still on its data, the new
    /// release's volume served by the earlier one, then every claim left reclaimed by it and the
    /// pools back as they were.
    pub async fn served_after_the_rollback_and_reclaimed(&self) -> Result<()> {
        let Volumes { ctx, provisioner, ns, baseline, node1, .. } = *self;
        each_claim_once_and_nothing_orphaned(ctx, provisioner, ns, baseline).await?;
        still_running_with(ctx, ns, "keeper-1", node1, "old-1", "old-1").await?;
        let read = run_on(ctx, ns, "new-reader", "new-1", node1, "cat /data/note").await?;
        ensure!(read.trim() == "new-1", "the new release's volume served after the rollback: {read:?}");
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), ns);
        let mut left: Vec<String> =
            claims.list(&ListParams::default()).await?.items.into_iter().filter_map(|c| c.metadata.name).collect();
        left.sort();
        reclaim(ctx, ns, &["keeper-1"], &left).await?;
        ensure!(each_claim_once_and_nothing_orphaned(ctx, provisioner, ns, baseline).await? == 0, "claims left");
        ensure!(volume_dirs(ctx, baseline).is_empty(), "the pools are back as they were");
        Ok(())
    }
}

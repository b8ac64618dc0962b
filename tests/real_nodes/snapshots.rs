//! `HostPathSnapshot` on a real kubelet: a pod writes files with its owner and modes; a snapshot
//! is taken; the pod changes the source afterwards; a claim restored from the snapshot gives
//! another pod the files as they were; deleting the snapshot removes its copy from the pool.

use anyhow::{Context, Result, ensure};
use hostpath_provisioner::deciding::snapshot::{GROUP, HostPathSnapshot, KIND};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, TypedObjectReference};
use kube::api::{Api, DeleteParams, PostParams};
use testbed::fixtures;
use testbed::real_nodes::{LANE_TIMEOUT, PodRun};

use super::{CLASS, Ctx};

pub(super) async fn a_snapshot_of_a_volume_a_pod_wrote_restores_the_files_as_they_were_for_another_pod(
    ctx: &Ctx,
) -> Result<()> {
    ctx.deployed().await?;
    let ns = ctx.namespace("snapshot").await?;
    ctx.create_claim(&ns, "source").await?;
    let node = ctx.lane.node_name().to_owned();
    let write = "umask 022 && echo before > /data/top && mkdir /data/dir && chmod 2750 /data/dir \
                 && echo inner > /data/dir/file && chmod 600 /data/dir/file && ln -s dir/file /data/link";
    let writer = PodRun::new(&ns, "writer", write).claim("source").as_user(1000, 3000).on_node(&node);
    let outcome = ctx.lane.run_pod(&writer).await?;
    ensure!(outcome.exit_code == Some(0), "writer exited {:?}: {}", outcome.exit_code, outcome.logs);

    let snapshots: Api<HostPathSnapshot> = Api::namespaced(ctx.lane.client(), &ns);
    snapshots.create(&PostParams::default(), &HostPathSnapshot::new("before", "source")).await?;
    let ready = testbed::wait_for("snapshot ready", LANE_TIMEOUT, || async {
        let snapshot = snapshots.get("before").await?;
        anyhow::Ok(snapshot.status.clone().filter(|s| s.ready_to_use).map(|s| (snapshot, s)))
    })
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;
    let (snapshot, status) = ready;
    ensure!(status.node.as_deref() == Some(node.as_str()), "held by {:?}", status.node);

    // The source changes after the snapshot.
    let change =
        PodRun::new(&ns, "changer", "echo after > /data/top").claim("source").as_user(1000, 3000).on_node(&node);
    let outcome = ctx.lane.run_pod(&change).await?;
    ensure!(outcome.exit_code == Some(0), "changer exited {:?}: {}", outcome.exit_code, outcome.logs);

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    let mut restored = fixtures::claim(&ns, "restored", CLASS, "16Mi").build();
    restored.spec.as_mut().context("spec")?.data_source_ref = Some(TypedObjectReference {
        api_group: Some(GROUP.into()),
        kind: KIND.into(),
        name: "before".into(),
        namespace: None,
    });
    claims.create(&PostParams::default(), &restored).await?;
    let read = "cat /data/top /data/dir/file /data/link && stat -c '%n %u:%g %a' /data/top /data/dir /data/dir/file";
    let reader = PodRun::new(&ns, "reader", read).claim("restored").as_user(1000, 3000).on_node(&node);
    let outcome = ctx.lane.run_pod(&reader).await.map_err(|e| e.context(ctx.provisioner_logs()))?;
    ensure!(outcome.exit_code == Some(0), "reader exited {:?}: {}", outcome.exit_code, outcome.logs);
    let expected =
        "before\ninner\ninner\n/data/top 1000:3000 644\n/data/dir 1000:3000 2750\n/data/dir/file 1000:3000 600\n";
    ensure!(outcome.logs == expected, "the restored volume holds the files as they were: {:?}", outcome.logs);

    // Deleted: the copy leaves the pool's snapshots directory.
    let source_dir = ctx.lane.volume_dir(&ns, "source").await?;
    let uid = snapshot.metadata.uid.clone().context("uid")?;
    let copy = source_dir.parent().context("pool root")?.join(".hpp-snapshots").join(&uid);
    ensure!(copy.is_dir(), "the copy is at {}", copy.display());
    snapshots.delete("before", &DeleteParams::default()).await?;
    testbed::wait_for("snapshot gone", LANE_TIMEOUT, || async {
        anyhow::Ok(snapshots.get_opt("before").await?.is_none().then_some(()))
    })
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;
    ensure!(!copy.exists(), "the copy went to the trash");

    for pod in ["writer", "changer", "reader"] {
        ctx.lane.delete_pod(&ns, pod).await?;
    }
    ctx.delete_claim_and_wait_reclaimed(&ns, "restored").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "source").await?;
    Ok(())
}

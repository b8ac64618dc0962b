//! Cases that need two real nodes: the second node (`testbed::real_nodes::second_node`) joins
//! for them, with its own kubelet, containerd, network and mount namespace, and its own
//! directories at the local pools' paths; the shared pool is one directory for both.
//! The harness takes the node out again before the next one-node scenario.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use testbed::real_nodes::{DEPLOY_DAEMONSET, DEPLOY_NAMESPACE, LANE_TIMEOUT, NODE2_NAME, PodRun, images};

use super::Ctx;

/// Deploys if needed, starts the second node and waits until the DaemonSet runs a ready pod
/// on each node.
pub(super) async fn two_nodes(ctx: &Ctx) -> Result<String> {
    let image = ctx.deployed().await?;
    if !ctx.lane.has_second_node() {
        let started = Instant::now();
        ctx.lane.join_second_node().await?;
        println!("    second real node {NODE2_NAME} Ready in {:.1} s", started.elapsed().as_secs_f64());
    }
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.lane.client(), DEPLOY_NAMESPACE);
    testbed::wait_until(
        "the DaemonSet scheduled on both nodes",
        LANE_TIMEOUT,
        || daemonsets.get(DEPLOY_DAEMONSET),
        |ds| ds.status.as_ref().is_some_and(|s| s.desired_number_scheduled == 2),
    )
    .await?;
    ctx.lane.wait_daemonset_rolled_out().await.map_err(|e| e.context(ctx.lane.log_tails(30)))?;
    Ok(image)
}

/// `kubectl exec` (the harness's kubectl helper appends its flags, which would land after `--`).
fn kubectl_exec(ctx: &Ctx, ns: &str, pod: &str, command: &[&str]) -> Result<String> {
    let cp = ctx.lane.cp();
    let output = std::process::Command::new(cp.kubectl())
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args(["-n", ns, "exec", pod, "--"])
        .args(command)
        .output()
        .context("running kubectl exec")?;
    ensure!(output.status.success(), "kubectl exec failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

pub(super) fn node_of(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or_default()
}

/// The directory of `claim`'s volume on the host, as node `node` has it.
async fn dir_on(ctx: &Ctx, node: &str, ns: &str, claim: &str) -> Result<PathBuf> {
    Ok(ctx.lane.host_path_on(node, &ctx.lane.volume_dir(ns, claim).await?))
}

/// Deletes the claim and waits until its PV and every listed host directory are gone.
async fn reclaim(ctx: &Ctx, ns: &str, claim: &str, dirs: &[PathBuf]) -> Result<()> {
    let pv = ctx.pv_of(ns, claim).await?.metadata.name.unwrap_or_default();
    Api::<PersistentVolumeClaim>::namespaced(ctx.lane.client(), ns).delete(claim, &DeleteParams::default()).await?;
    let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
    testbed::wait_for(&format!("PV {pv} and {dirs:?} gone"), LANE_TIMEOUT, || async {
        anyhow::Ok((pvs.get_opt(&pv).await?.is_none() && dirs.iter().all(|d| !d.exists())).then_some(()))
    })
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))
}

pub async fn a_shared_volume_written_on_one_node_is_read_on_the_other_two_nodes(ctx: &Ctx) -> Result<()> {
    two_nodes(ctx).await?;
    let node1 = ctx.lane.node_name().to_string();
    let ns = ctx.namespace("shared2").await?;
    // Which node acts on a shared volume comes from the pods' readiness: the EndpointSlice
    // controller lists both nodes' provisioner pods, ready, in the peers Service's slices.
    let slices: Api<EndpointSlice> = Api::namespaced(ctx.lane.client(), DEPLOY_NAMESPACE);
    let selector = ListParams::default().labels("kubernetes.io/service-name=hostpath-provisioner-peers");
    testbed::wait_until(
        "both nodes' provisioner pods ready in the peers Service's EndpointSlices",
        LANE_TIMEOUT,
        || slices.list(&selector),
        |list| {
            let ready: Vec<&str> = list
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter().flatten())
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .filter_map(|e| e.node_name.as_deref())
                .collect();
            [node1.as_str(), NODE2_NAME].iter().all(|n| ready.contains(n))
        },
    )
    .await?;
    let class = ctx.class(&ns, &[("storagePool", "nfs"), ("topology", "shared")]).await?;
    let pv = ctx.bound_rwx_claim(&ns, "data", &class).await?;
    ensure!(pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).is_none(), "a shared volume is not pinned");
    let dir = ctx.lane.volume_dir(&ns, "data").await?;
    ensure!(dir.parent() == Some(ctx.lane.shared_pool()), "{} in the shared pool", dir.display());

    let writer = PodRun::new(&ns, "writer", "echo from-node-1 > /data/note").claim("data").as_user(1000, 1000);
    let outcome = ctx.lane.run_pod(&writer.on_node(&node1)).await?;
    ensure!(outcome.exit_code == Some(0), "writer exited {:?}: {}", outcome.exit_code, outcome.logs);
    ensure!(node_of(&outcome.pod) == node1, "the writer ran on {node1}");

    let reader = PodRun::new(&ns, "reader", "cat /data/note && echo from-node-2 > /data/reply")
        .claim("data")
        .as_user(2000, 2000)
        .on_node(NODE2_NAME);
    let outcome = ctx.lane.run_pod(&reader).await.map_err(|e| e.context(ctx.provisioner_logs()))?;
    ensure!(outcome.exit_code == Some(0), "reader exited {:?}: {}", outcome.exit_code, outcome.logs);
    ensure!(node_of(&outcome.pod) == NODE2_NAME, "the reader ran on {NODE2_NAME}");
    ensure!(outcome.logs.trim() == "from-node-1", "node 2 reads what node 1 wrote: {:?}", outcome.logs);
    // The API server reaches node 2's kubelet (over the veth, at its InternalIP) for logs and
    // exec, as `kubectl` users expect of any node.
    let logs = ctx.lane.cp().run_kubectl(&ctx.repo, &["-n", &ns, "logs", "reader"])?;
    ensure!(logs.trim() == "from-node-1", "kubectl logs of a pod on node 2: {logs:?}");
    let shell = PodRun::new(&ns, "shell", "sleep 3600").claim("data").on_node(NODE2_NAME).keep_running();
    ctx.lane.run_pod(&shell).await?;
    let exec = kubectl_exec(ctx, &ns, "shell", &["cat", "/data/reply"])?;
    ensure!(exec.trim() == "from-node-2", "kubectl exec in a pod on node 2: {exec:?}");

    // And back: node 1 reads node 2's answer.
    let back = PodRun::new(&ns, "back", "cat /data/reply").claim("data").as_user(3000, 3000).on_node(&node1);
    let outcome = ctx.lane.run_pod(&back).await?;
    ensure!(outcome.logs.trim() == "from-node-2", "node 1 reads what node 2 wrote: {:?}", outcome.logs);
    ensure!(std::fs::read_to_string(dir.join("reply"))? == "from-node-2\n", "the shared directory holds both");
    let owners = (std::fs::metadata(dir.join("note"))?.uid(), std::fs::metadata(dir.join("reply"))?.uid());
    ensure!(owners == (1000, 2000), "each file owned by its pod's uid: {owners:?}");

    for pod in ["writer", "reader", "back", "shell"] {
        ctx.lane.delete_pod(&ns, pod).await?;
    }
    reclaim(ctx, &ns, "data", &[dir]).await
}

pub async fn an_every_node_volume_gives_each_nodes_pod_its_own_directory_two_nodes(ctx: &Ctx) -> Result<()> {
    two_nodes(ctx).await?;
    let node1 = ctx.lane.node_name().to_string();
    let ns = ctx.namespace("every2").await?;
    let class = ctx.class(&ns, &[("storagePool", "edge"), ("topology", "everyNode")]).await?;
    let pv = ctx.bound_rwx_claim(&ns, "data", &class).await?;
    ensure!(pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).is_none(), "not pinned");
    let pv_name = pv.metadata.name.clone().context("PV name")?;
    let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
    // Each node's provisioner makes its copy and holds the PV with a finalizer of its own.
    testbed::wait_until(
        "both nodes' copies hold the PV",
        LANE_TIMEOUT,
        || pvs.get(&pv_name),
        |pv| {
            let finalizers = pv.metadata.finalizers.clone().unwrap_or_default();
            [node1.as_str(), NODE2_NAME]
                .iter()
                .all(|n| finalizers.contains(&format!("copies.hostpath-provisioner.kubevirt.io/{n}")))
        },
    )
    .await
    .map_err(|e| e.context(ctx.provisioner_logs()))?;
    let on_node1 = dir_on(ctx, &node1, &ns, "data").await?;
    let on_node2 = dir_on(ctx, NODE2_NAME, &ns, "data").await?;
    ensure!(on_node1 != on_node2, "two directories on the host: {}", on_node1.display());
    ensure!(on_node1.parent() == Some(ctx.lane.edge_pool()), "{} in node 1's edge pool", on_node1.display());

    let first = PodRun::new(&ns, "first", "echo node-1 > /data/written-by-node-1 && ls /data")
        .claim("data")
        .as_user(1000, 1000)
        .on_node(&node1);
    let outcome = ctx.lane.run_pod(&first).await?;
    ensure!(outcome.exit_code == Some(0), "pod on node 1 exited {:?}: {}", outcome.exit_code, outcome.logs);
    let second = PodRun::new(&ns, "second", "echo node-2 > /data/written-by-node-2 && ls /data")
        .claim("data")
        .as_user(1000, 1000)
        .on_node(NODE2_NAME);
    let outcome = ctx.lane.run_pod(&second).await.map_err(|e| e.context(ctx.provisioner_logs()))?;
    ensure!(outcome.exit_code == Some(0), "pod on node 2 exited {:?}: {}", outcome.exit_code, outcome.logs);
    ensure!(node_of(&outcome.pod) == NODE2_NAME, "the second pod ran on {NODE2_NAME}");
    ensure!(
        outcome.logs.trim() == "written-by-node-2",
        "node 2's pod sees only its own node's copy: {:?}",
        outcome.logs
    );

    let listing = |dir: &PathBuf| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    ensure!(listing(&on_node1) == ["written-by-node-1"], "node 1's copy: {:?}", listing(&on_node1));
    ensure!(listing(&on_node2) == ["written-by-node-2"], "node 2's copy: {:?}", listing(&on_node2));

    ctx.lane.delete_pod(&ns, "first").await?;
    ctx.lane.delete_pod(&ns, "second").await?;
    // Each node removes its own copy; the PV goes when both have.
    reclaim(ctx, &ns, "data", &[on_node1, on_node2]).await
}

pub async fn a_daemonset_rollout_across_two_nodes_loses_nothing_two_nodes(ctx: &Ctx) -> Result<()> {
    let image = two_nodes(ctx).await?;
    let node1 = ctx.lane.node_name().to_string();
    let nodes = [node1.as_str(), NODE2_NAME];
    let ns = ctx.namespace("rollout2").await?;
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), &ns);

    // A workload on each node keeps its volume mounted through the update.
    for (i, node) in nodes.iter().enumerate() {
        let name = format!("keep-{}", i + 1);
        ctx.create_claim(&ns, &name).await?;
        let script = format!("echo {name} > /data/{name} && sleep 3600");
        let run = PodRun::new(&ns, &name, &script).claim(&name).on_node(node).keep_running();
        ctx.lane.run_pod(&run).await.map_err(|e| e.context(ctx.provisioner_logs()))?;
    }
    let old = ctx.provisioner_pods().await?;
    ensure!(old.len() == 2, "a provisioner pod per node before the update, got {}", old.len());
    let old_uids: Vec<String> = old.into_iter().filter_map(|p| p.metadata.uid).collect();

    let (name, tag) = image.rsplit_once(':').filter(|(_, t)| !t.contains('/')).unwrap_or((&image, "latest"));
    let new_image = format!("{name}:{tag}-two-nodes");
    ctx.lane.tag_image(&images::normalize_reference(&image), &images::normalize_reference(&new_image))?;
    let container = format!("kubevirt-hostpath-provisioner={new_image}");
    ctx.lane.cp().run_kubectl(
        &ctx.repo,
        &["-n", DEPLOY_NAMESPACE, "set", "image", &format!("daemonset/{DEPLOY_DAEMONSET}"), &container],
    )?;
    // Claims made while the pods are replaced, one node after the other, must still be served.
    for (i, node) in nodes.iter().enumerate() {
        let name = format!("during-{}", i + 1);
        ctx.create_claim(&ns, &name).await?;
        let run = PodRun::new(&ns, &name, &format!("echo {name} > /data/{name}")).claim(&name).on_node(node);
        pods.create(&PostParams::default(), &run.build()).await?;
    }
    ctx.lane.wait_daemonset_rolled_out().await?;
    let new = ctx.provisioner_pods().await?;
    ensure!(new.len() == 2, "a provisioner pod per node after the update, got {}", new.len());
    let mut on: Vec<&str> = new.iter().map(node_of).collect();
    on.sort_unstable();
    ensure!(on == nodes, "one on each node: {on:?}");
    for pod in &new {
        ensure!(!old_uids.contains(pod.metadata.uid.as_ref().context("uid")?), "every pod replaced");
        let running = pod.spec.as_ref().and_then(|s| s.containers[0].image.clone());
        ensure!(running.as_deref() == Some(new_image.as_str()), "new pod runs {running:?}");
    }

    for (i, node) in nodes.iter().enumerate() {
        let during = format!("during-{}", i + 1);
        let finished = testbed::wait_until(
            &format!("pod {during} finished"),
            LANE_TIMEOUT,
            || pods.get(&during),
            |p| p.status.as_ref().and_then(|s| s.phase.as_deref()).is_some_and(|p| p == "Succeeded" || p == "Failed"),
        )
        .await
        .map_err(|e| e.context(ctx.provisioner_logs()))?;
        ensure!(
            finished.status.and_then(|s| s.phase).as_deref() == Some("Succeeded"),
            "the claim made on {node} during the update works"
        );
        let keep = format!("keep-{}", i + 1);
        let pod = pods.get(&keep).await?;
        let status = pod.status.as_ref().context("status")?;
        ensure!(status.phase.as_deref() == Some("Running"), "{keep} still running");
        let restarts: i32 = status.container_statuses.iter().flatten().map(|c| c.restart_count).sum();
        ensure!(restarts == 0, "{keep} restarted {restarts} times");
        for claim in [&keep, &during] {
            let dir = dir_on(ctx, node, &ns, claim).await?;
            ensure!(std::fs::read_to_string(dir.join(claim))? == format!("{claim}\n"), "{claim}'s data on {node}");
            let pv = ctx.pv_of(&ns, claim).await?;
            let affinity = serde_json::to_string(&pv.spec.as_ref().and_then(|s| s.node_affinity.clone()))?;
            ensure!(affinity.contains(node), "{claim}'s PV pinned to {node}: {affinity}");
        }
    }

    // Each new pod serves new claims, then reclaims every volume of its node.
    for (i, node) in nodes.iter().enumerate() {
        let name = format!("after-{}", i + 1);
        ctx.create_claim(&ns, &name).await?;
        let run = PodRun::new(&ns, &name, &format!("echo {name} > /data/{name}")).claim(&name).on_node(node);
        let outcome = ctx.lane.run_pod(&run).await?;
        ensure!(outcome.exit_code == Some(0), "a claim on {node} after the update: {}", outcome.logs);
    }
    for (i, node) in nodes.iter().enumerate() {
        for name in [format!("keep-{}", i + 1), format!("during-{}", i + 1), format!("after-{}", i + 1)] {
            ctx.lane.delete_pod(&ns, &name).await?;
            let dir = dir_on(ctx, node, &ns, &name).await?;
            reclaim(ctx, &ns, &name, &[dir]).await?;
        }
    }
    Ok(())
}

//! The operator on a real kubelet: a `HostPathProvisioner` whose pool lives on a claim of
//! another class (a local PV this scenario makes), mounted on the node by the operator's
//! mounter, carved into a volume a pod writes into; removing the pool while that volume lives
//! keeps the claim, the mount and the data, and the status says which PV holds it. A plain
//! pool's class and, after the resource is deleted, a legacy `pathConfig` resource's class get
//! their volumes too.

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::DynamicObject;
use serde_json::json;

use super::*;

const OPERATOR_NAMESPACE: &str = "hostpath-provisioner";
const RESOURCE: &str = "lane-operator";

/// The operator process on the host (as in tests/e2e_operator.rs), stopped when dropped.
struct OperatorProcess(std::process::Child);

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn wait_resource(ctx: &Ctx, what: &str, done: impl Fn(&serde_json::Value) -> bool) -> Result<serde_json::Value> {
    let api = resources(ctx);
    testbed::wait_for(what, LANE_TIMEOUT, || async {
        let found = api.get_opt(RESOURCE).await?;
        anyhow::Ok(found.map(|r| r.data["status"].clone()).filter(|s| done(s)))
    })
    .await
    .map_err(|e| {
        let status = std::fs::read_to_string(ctx.lane.dir().join("operator.log")).unwrap_or_default();
        e.context(format!("operator log:\n{status}"))
    })
}

fn degraded(status: &serde_json::Value) -> Option<&serde_json::Value> {
    status["conditions"].as_array()?.iter().find(|c| c["type"] == "Degraded")
}

/// deploy/legacy's DaemonSet aside (one provisioner of the name per node), deploy/operator
/// applied with its Deployment scaled to none, and the operator run on the host instead (its
/// Deployment names a registry placeholder).
async fn operator_up(ctx: &Ctx) -> Result<OperatorProcess> {
    let image = ctx.deployed().await?;
    ctx.lane.cp().run_kubectl(
        &ctx.repo,
        &["delete", "daemonset", "-n", DEPLOY_NAMESPACE, DEPLOY_DAEMONSET, "--wait", "--ignore-not-found"],
    )?;
    ctx.lane.cp().run_kubectl(&ctx.repo, &["apply", "--server-side", "--force-conflicts", "-k", "deploy/operator"])?;
    ctx.lane.cp().run_kubectl(
        &ctx.repo,
        &[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "60s",
            "crd/hostpathprovisioners.hostpathprovisioner.kubevirt.io",
        ],
    )?;
    ctx.lane.cp().run_kubectl(
        &ctx.repo,
        &["scale", "deployment", "-n", OPERATOR_NAMESPACE, "hostpath-provisioner-operator", "--replicas=0"],
    )?;
    let log = std::fs::File::create(ctx.lane.dir().join("operator.log"))?;
    Ok(OperatorProcess(
        std::process::Command::new(env!("CARGO_BIN_EXE_hostpath-provisioner"))
            .args(["operator", "--namespace", OPERATOR_NAMESPACE, "--node-image", &image])
            .arg("--kubeconfig")
            .arg(ctx.lane.cp().kubeconfig_path())
            .env("POD_NAME", "lane-operator")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?,
    ))
}

pub(super) async fn the_operator_mounts_a_pool_on_a_claim_of_a_local_pv_and_keeps_it_while_its_volume_lives(
    ctx: &Ctx,
) -> Result<()> {
    let node = ctx.lane.node_name().to_owned();
    let _operator = operator_up(ctx).await?;

    // The disk: a local PV of a no-provisioner class on the real node.
    let ns = ctx.namespace("operator").await?;
    let disk = ctx.lane.dir().join("operator-disk");
    let pool = ctx.lane.dir().join("operator-pool");
    std::fs::create_dir_all(&disk)?;
    std::fs::write(disk.join("marker"), "on the disk")?;
    std::fs::create_dir_all(&pool)?;
    // containerd refuses Bidirectional and HostToContainer mounts of a private mount.
    testbed::real_nodes::host::make_shared_mount(&pool)?;
    let disk_class = format!("{ns}-disk");
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": disk_class},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "WaitForFirstConsumer",
    }))?;
    Api::<StorageClass>::all(ctx.lane.client()).create(&PostParams::default(), &class).await?;
    let disk_pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": format!("{ns}-disk")},
        "spec": {
            "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": disk_class,
            "local": {"path": disk},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
            ]}]}},
        },
    }))?;
    let pvs: Api<PersistentVolume> = Api::all(ctx.lane.client());
    pvs.create(&PostParams::default(), &disk_pv).await?;

    let resource: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
        "metadata": {"name": RESOURCE},
        "spec": {
            "imagePullPolicy": "IfNotPresent",
            "workload": {"nodeSelector": {"kubernetes.io/hostname": node}},
            "storagePools": [{"name": "claimed", "path": pool, "pvcTemplate": {
                "accessModes": ["ReadWriteOnce"], "storageClassName": disk_class,
                "resources": {"requests": {"storage": "1Gi"}},
            }}],
        },
    }))?;
    resources(ctx).create(&PostParams::default(), &resource).await?;
    let status = wait_resource(ctx, "the pool on a claim Ready", |s| {
        s["storagePoolStatuses"].as_array().is_some_and(|p| p.iter().any(|p| p["phase"] == "Ready"))
    })
    .await?;
    ensure!(status["storagePoolStatuses"][0]["currentReady"] == 1, "{status:#}");
    ensure!(pool.join("marker").exists(), "the claim's disk is mounted at the pool path");

    // A volume carved from the pool, written by a pod.
    let class = ctx.class(&ns, &[("storagePool", "claimed")]).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    claims
        .create(
            &PostParams::default(),
            &fixtures::claim(&ns, "carved", &class, "16Mi").provision_on_node(&node).build(),
        )
        .await?;
    let run = PodRun::new(&ns, "writer", "echo kept > /data/file").claim("carved").on_node(&node);
    let outcome = ctx.lane.run_pod(&run).await?;
    ensure!(outcome.exit_code == Some(0), "pod exited {:?}: {}", outcome.exit_code, outcome.logs);
    let pv = ctx.pv_of(&ns, "carved").await?;
    let pv_name = pv.metadata.name.clone().unwrap_or_default();
    let dir_name = ctx.lane.volume_dir(&ns, "carved").await?.file_name().context("volume dir")?.to_owned();
    ensure!(std::fs::read_to_string(disk.join(&dir_name).join("file"))? == "kept\n", "the data is on the claim's disk");

    // The pool is removed while the volume lives: its claim, mount and data stay, and the
    // status names the PV.
    let plain = ctx.lane.dir().join("operator-plain");
    std::fs::create_dir_all(&plain)?;
    testbed::real_nodes::host::make_shared_mount(&plain)?;
    let patch = json!({"spec": {"storagePools": [{"name": "plain", "path": plain}]}});
    resources(ctx).patch(RESOURCE, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let status =
        wait_resource(ctx, "Degraded PoolHeldBack", |s| degraded(s).is_some_and(|c| c["reason"] == "PoolHeldBack"))
            .await?;
    let message = degraded(&status).map(|c| c["message"].to_string()).unwrap_or_default();
    ensure!(message.contains(&pv_name), "names the PV: {message}");
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.lane.client(), OPERATOR_NAMESPACE);
    let pools_served = |d: &DaemonSet| serde_json::to_string(&d.spec).unwrap_or_default();
    testbed::wait_until(
        "the DaemonSet with the plain pool",
        LANE_TIMEOUT,
        || daemonsets.get(DEPLOY_DAEMONSET),
        |d| pools_served(d).contains("operator-plain") && pools_served(d).contains("operator-pool,mountpoint"),
    )
    .await?;
    ensure!(pool.join("marker").exists(), "the mount stays");
    ensure!(std::fs::read_to_string(pool.join(&dir_name).join("file"))? == "kept\n", "the data stays, reachable");

    // The plain pool (a path on the node, no claim) serves its own class too.
    let plain_class = ctx.class(&format!("{ns}-plain"), &[("storagePool", "plain")]).await?;
    claims
        .create(
            &PostParams::default(),
            &fixtures::claim(&ns, "plain", &plain_class, "16Mi").provision_on_node(&node).build(),
        )
        .await?;
    let run = PodRun::new(&ns, "plain-writer", "echo plain > /data/file").claim("plain").on_node(&node);
    let outcome = ctx.lane.run_pod(&run).await?;
    ensure!(outcome.exit_code == Some(0), "pod exited {:?}: {}", outcome.exit_code, outcome.logs);
    let plain_dir = ctx.lane.volume_dir(&ns, "plain").await?;
    ensure!(plain_dir.starts_with(&plain), "the plain pool's volume is in its path: {}", plain_dir.display());
    ensure!(std::fs::read_to_string(plain_dir.join("file"))? == "plain\n", "written by the pod");
    ctx.lane.delete_pod(&ns, "plain-writer").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "plain").await?;

    // Deleting the resource while the volume lives removes nothing (a Warning Event names the
    // PV); the held pool is still served, so the volume is released as usual, and then
    // everything goes.
    let uid = resources(ctx).get(RESOURCE).await?.metadata.uid.unwrap_or_default();
    resources(ctx).delete(RESOURCE, &DeleteParams::default()).await?;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(ctx.lane.client(), "default");
    let note = testbed::wait_for("the PoolHeldBack Event of the deletion", LANE_TIMEOUT, || async {
        let list = events.list(&ListParams::default()).await?;
        anyhow::Ok(list.items.into_iter().find_map(|e| {
            let ours = e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str());
            let note = e.note.unwrap_or_default();
            (ours && e.reason.as_deref() == Some("PoolHeldBack") && note.contains("deletion")).then_some(note)
        }))
    })
    .await?;
    ensure!(note.contains(&pv_name), "names the PV: {note}");
    ensure!(resources(ctx).get_opt(RESOURCE).await?.is_some(), "the resource waits");
    ensure!(daemonsets.get_opt(DEPLOY_DAEMONSET).await?.is_some(), "the node provisioner stays");
    ctx.lane.delete_pod(&ns, "writer").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "carved").await?;
    testbed::wait_for("the resource gone", LANE_TIMEOUT, || async {
        anyhow::Ok(resources(ctx).get_opt(RESOURCE).await?.is_none().then_some(()))
    })
    .await?;
    ensure!(daemonsets.get_opt(DEPLOY_DAEMONSET).await?.is_none(), "the node provisioner went with it");

    // The legacy form (`pathConfig`, as the kubevirt operator's legacy example has it): the
    // DaemonSet serves PV_DIR, and a claim of a class that names no pool lands there.
    let legacy = ctx.lane.dir().join("operator-legacy");
    std::fs::create_dir_all(&legacy)?;
    testbed::real_nodes::host::make_shared_mount(&legacy)?;
    let resource: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
        "metadata": {"name": RESOURCE},
        "spec": {
            "imagePullPolicy": "IfNotPresent",
            "pathConfig": {"path": legacy, "useNamingPrefix": true},
            "workload": {"nodeSelector": {"kubernetes.io/hostname": node}},
        },
    }))?;
    resources(ctx).create(&PostParams::default(), &resource).await?;
    testbed::wait_until(
        "the legacy DaemonSet ready",
        LANE_TIMEOUT,
        || daemonsets.get(DEPLOY_DAEMONSET),
        |d| d.status.as_ref().is_some_and(|s| s.number_ready == 1 && s.updated_number_scheduled == Some(1)),
    )
    .await?;
    let legacy_class = ctx.class(&format!("{ns}-legacy"), &[]).await?;
    claims
        .create(
            &PostParams::default(),
            &fixtures::claim(&ns, "legacy", &legacy_class, "16Mi").provision_on_node(&node).build(),
        )
        .await?;
    let run = PodRun::new(&ns, "legacy-writer", "echo legacy > /data/file").claim("legacy").on_node(&node);
    let outcome = ctx.lane.run_pod(&run).await?;
    ensure!(outcome.exit_code == Some(0), "pod exited {:?}: {}", outcome.exit_code, outcome.logs);
    let legacy_dir = ctx.lane.volume_dir(&ns, "legacy").await?;
    let legacy_name = legacy_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    ensure!(
        legacy_dir.parent() == Some(legacy.as_path()) && legacy_name.starts_with("legacy-pvc-"),
        "PV_DIR with the naming prefix: {}",
        legacy_dir.display()
    );
    ensure!(std::fs::read_to_string(legacy_dir.join("file"))? == "legacy\n", "written by the pod");
    ctx.lane.delete_pod(&ns, "legacy-writer").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "legacy").await?;
    resources(ctx).delete(RESOURCE, &DeleteParams::default()).await?;
    testbed::wait_for("the legacy resource gone", LANE_TIMEOUT, || async {
        anyhow::Ok(resources(ctx).get_opt(RESOURCE).await?.is_none().then_some(()))
    })
    .await?;

    // Clean up: the disk; deploy/legacy back for the next scenarios.
    pvs.delete(&format!("{ns}-disk"), &DeleteParams::default()).await?;
    ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    Ok(())
}

// --- The node provisioner's features through the resource (spec.config, pool options, several
// disks, quota). ---

/// A resource with one pool over two disks, the first with a reserve larger than the disk, the
/// quota capability and a spec.config setting: the operator's DaemonSet runs on the real kubelet
/// with SYS_ADMIN and the settings; the volume a pod writes lands on the second disk, the only
/// one with room past its reserve, so both disks and the reserve reached the node provisioner.
pub(super) async fn the_operators_resource_turns_on_one_pool_over_two_disks_with_a_reserve_and_the_quota_capability(
    ctx: &Ctx,
) -> Result<()> {
    let node = ctx.lane.node_name().to_owned();
    let _operator = operator_up(ctx).await?;
    let ns = ctx.namespace("features").await?;
    let disks = [ctx.lane.dir().join("features-disk1"), ctx.lane.dir().join("features-disk2")];
    for disk in &disks {
        std::fs::create_dir_all(disk)?;
        testbed::real_nodes::host::make_shared_mount(disk)?;
    }
    let resource: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
        "metadata": {"name": RESOURCE},
        "spec": {
            "imagePullPolicy": "IfNotPresent",
            "workload": {"nodeSelector": {"kubernetes.io/hostname": node}},
            "storagePools": [
                {"name": "data", "path": disks[0], "reserve": "1Pi"},
                {"name": "data", "path": disks[1], "accounting": "requests"},
            ],
            "config": {"logFormat": "json", "maxConcurrency": 4},
            "quota": {"enabled": true},
        },
    }))?;
    resources(ctx).create(&PostParams::default(), &resource).await?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ctx.lane.client(), OPERATOR_NAMESPACE);
    let daemonset = testbed::wait_until(
        "the operator's DaemonSet ready on the real node",
        LANE_TIMEOUT,
        || daemonsets.get(DEPLOY_DAEMONSET),
        |d| d.status.as_ref().is_some_and(|s| s.number_ready == 1 && s.updated_number_scheduled == Some(1)),
    )
    .await
    .map_err(|e| {
        let log = std::fs::read_to_string(ctx.lane.dir().join("operator.log")).unwrap_or_default();
        e.context(format!("operator log:\n{log}"))
    })?;
    let spec = serde_json::to_string(&daemonset.spec)?;
    ensure!(spec.contains("SYS_ADMIN"), "the quota capability: {spec}");
    ensure!(spec.contains(",reserve=1Pi,data="), "the reserve in STORAGE_POOLS: {spec}");
    // The pod runs with it: its logs are JSON (spec.config.logFormat).
    let status = wait_resource(ctx, "Available", |s| {
        s["conditions"].as_array().is_some_and(|c| c.iter().any(|c| c["type"] == "Available" && c["status"] == "True"))
    })
    .await?;
    ensure!(status["storagePoolStatuses"].as_array().map(Vec::len) == Some(1), "one pool: {status:#}");

    let class = ctx.class(&ns, &[("storagePool", "data")]).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.lane.client(), &ns);
    claims
        .create(
            &PostParams::default(),
            &fixtures::claim(&ns, "spread", &class, "16Mi").provision_on_node(&node).build(),
        )
        .await?;
    let run = PodRun::new(&ns, "writer", "echo on-disk-2 > /data/file").claim("spread").on_node(&node);
    let outcome = ctx.lane.run_pod(&run).await?;
    ensure!(outcome.exit_code == Some(0), "pod exited {:?}: {}", outcome.exit_code, outcome.logs);
    let dir = ctx.lane.volume_dir(&ns, "spread").await?;
    ensure!(dir.starts_with(&disks[1]), "the volume is on the disk with room past its reserve: {}", dir.display());
    ensure!(std::fs::read_to_string(dir.join("file"))? == "on-disk-2\n", "written by the pod");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(ctx.lane.client(), OPERATOR_NAMESPACE);
    let node_pod = pods
        .list(&ListParams::default().labels("app.kubernetes.io/name=hostpath-provisioner"))
        .await?
        .items
        .into_iter()
        .find(|p| p.metadata.owner_references.iter().flatten().any(|o| o.kind == "DaemonSet"))
        .context("the node pod")?;
    let logs = pods.logs(&node_pod.metadata.name.unwrap_or_default(), &Default::default()).await?;
    ensure!(
        logs.lines().any(|l| l.starts_with('{') && l.contains("\"level\"")),
        "JSON logs (spec.config.logFormat): {}",
        &logs[..logs.len().min(300)]
    );

    ctx.lane.delete_pod(&ns, "writer").await?;
    ctx.delete_claim_and_wait_reclaimed(&ns, "spread").await?;
    resources(ctx).delete(RESOURCE, &DeleteParams::default()).await?;
    testbed::wait_for("the resource gone", LANE_TIMEOUT, || async {
        anyhow::Ok(resources(ctx).get_opt(RESOURCE).await?.is_none().then_some(()))
    })
    .await?;
    ctx.lane.deploy_legacy(&ctx.repo, &ctx.archive).await?;
    Ok(())
}

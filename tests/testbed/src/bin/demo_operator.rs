//! `make demo-operator`: the operator path in under a minute of reading. A local control plane
//! (API server, scheduler and PV controllers only: no kubelet, no DaemonSet controller),
//! deploy/operator applied, `hostpath-provisioner operator` running under its own RBAC; a bad
//! HostPathProvisioner refused by the API server, a good one turned into the node DaemonSet, an
//! edit rolling it, and the deletion removing what it made. Usage: `demo_operator --provisioner PATH`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;
use testbed::ControlPlane;

const NAMESPACE: &str = "hostpath-provisioner";
const DAEMONSET: &str = "kubevirt-hostpath-provisioner";
const RESOURCE: &str = "hostpath-provisioner";
const WAIT: Duration = Duration::from_secs(60);

/// The operator process, stopped when dropped.
struct Operator(Child);

impl Drop for Operator {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own, not yet reaped, child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        std::thread::sleep(Duration::from_millis(500));
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let binary = match (args.next().as_deref(), args.next()) {
        (Some("--provisioner"), Some(path)) => PathBuf::from(path),
        _ => {
            eprintln!("usage: demo_operator --provisioner PATH");
            return ExitCode::from(2);
        }
    };
    let cp = match ControlPlane::start().await {
        Ok(cp) => cp,
        Err(error) => {
            eprintln!("demo: cannot start the control plane: {error:#}");
            return ExitCode::FAILURE;
        }
    };
    let result = run(&cp, &binary).await;
    println!("\nStopping the operator and the control plane...");
    drop(cp);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("\ndemo FAILED: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn heading(text: &str) {
    println!("\n== {text}");
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn resources(cp: &ControlPlane) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("hostpathprovisioner.kubevirt.io", "v1beta1", "HostPathProvisioner");
    Api::all_with(cp.admin_client(), &ApiResource::from_gvk_with_plural(&gvk, "hostpathprovisioners"))
}

/// The node container's STORAGE_POOLS or PV_DIR, and the DaemonSet's generation.
async fn daemonset_pools(cp: &ControlPlane) -> Result<Option<(String, i64)>> {
    let Some(daemonset) = Api::<DaemonSet>::namespaced(cp.admin_client(), NAMESPACE).get_opt(DAEMONSET).await? else {
        return Ok(None);
    };
    let container = daemonset.spec.as_ref().and_then(|s| s.template.spec.as_ref()).and_then(|p| p.containers.first());
    let pools = container
        .and_then(|c| c.env.as_ref())
        .into_iter()
        .flatten()
        .filter(|e| e.name == "STORAGE_POOLS" || e.name == "PV_DIR")
        .map(|e| format!("{}={}", e.name, e.value.clone().unwrap_or_default()))
        .collect::<Vec<_>>()
        .join(" ");
    Ok(Some((pools, daemonset.metadata.generation.unwrap_or(0))))
}

async fn wait_pools(cp: &ControlPlane, want: &str) -> Result<i64> {
    testbed::wait_for(&format!("DaemonSet with {want}"), WAIT, || async {
        Ok::<_, anyhow::Error>(daemonset_pools(cp).await?.filter(|(pools, _)| pools == want).map(|(_, g)| g))
    })
    .await
}

async fn run(cp: &ControlPlane, binary: &Path) -> Result<()> {
    println!("hostpath-provisioner operator demo: a HostPathProvisioner resource becomes the node provisioner.");
    heading("1. Local control plane and two nodes (no kubelet, no DaemonSet controller: no pod runs)");
    for node in ["node-1", "node-2"] {
        cp.add_node(node, node).await?;
    }
    println!("  ready in {:.1} s", cp.started_in().as_secs_f64());

    heading("2. Install the operator");
    println!("  $ kubectl apply --server-side -k deploy/operator");
    let applied = cp.run_kubectl(&repo(), &["apply", "--server-side", "-k", "deploy/operator"])?;
    applied.lines().for_each(|l| println!("    {l}"));
    cp.run_kubectl(
        &repo(),
        &["wait", "--for", "condition=Established", "crd/hostpathprovisioners.hostpathprovisioner.kubevirt.io"],
    )?;
    let token = Api::<ServiceAccount>::namespaced(cp.admin_client(), NAMESPACE)
        .create_token_request(
            "hostpath-provisioner-operator",
            &PostParams::default(),
            &TokenRequest {
                spec: Some(TokenRequestSpec { expiration_seconds: Some(3600), ..Default::default() }),
                ..Default::default()
            },
        )
        .await?
        .status
        .and_then(|s| s.token)
        .context("no token")?;
    let kubeconfig = cp.temp_dir().join("operator.kubeconfig");
    cp.write_kubeconfig_for_token(&token, &kubeconfig)?;
    let log = cp.temp_dir().join("operator.log");
    let child = Command::new(binary)
        .args(["operator", "--namespace", NAMESPACE, "--node-image", "registry.example/hostpath-provisioner:demo"])
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting the operator")?;
    let _operator = Operator(child);
    println!("  `hostpath-provisioner operator` runs as its ServiceAccount (deploy/operator/rbac.yaml)");

    heading("3. A bad resource is refused by the API server itself (CEL rules, no webhook)");
    let bad: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "hostpathprovisioner.kubevirt.io/v1beta1", "kind": "HostPathProvisioner",
        "metadata": {"name": "bad"},
        "spec": {"storagePools": [{"name": "a", "path": "/var/a"}, {"name": "b", "path": "/var/a/b"}]},
    }))?;
    match resources(cp).create(&PostParams::default(), &bad).await {
        Ok(_) => bail!("the bad resource was accepted"),
        Err(kube::Error::Api(status)) => println!("  pool b inside pool a: {}", status.message),
        Err(error) => return Err(error.into()),
    }

    heading("4. The kubevirt operator's storage pool example");
    println!("  $ kubectl apply -f deploy/operator/examples/storage-pool.yaml");
    cp.run_kubectl(&repo(), &["apply", "-f", "deploy/operator/examples/storage-pool.yaml"])?;
    let generation = wait_pools(cp, "STORAGE_POOLS=local=/var/hpvolumes").await?;
    println!(
        "  DaemonSet {NAMESPACE}/{DAEMONSET}: STORAGE_POOLS=local=/var/hpvolumes (deploy/legacy's, placed by the resource)"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let table = cp.run_kubectl(&repo(), &["get", "hostpathprovisioners"])?;
    table.lines().for_each(|l| println!("    {l}"));
    println!("  (Available False, Deploying: this control plane runs no DaemonSet controller, so no pod is");
    println!("   ever counted; on a cluster it turns True once every selected node runs the provisioner)");

    heading("5. Edit the resource: a second pool rolls the DaemonSet");
    let patch = json!({"spec": {"storagePools": [
        {"name": "local", "path": "/var/hpvolumes"}, {"name": "fast", "path": "/mnt/fast"},
    ]}});
    resources(cp).patch(RESOURCE, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    let rolled = wait_pools(cp, "STORAGE_POOLS=local=/var/hpvolumes,fast=/mnt/fast").await?;
    println!("  STORAGE_POOLS=local=/var/hpvolumes,fast=/mnt/fast, pod template generation {generation} -> {rolled}");

    heading("6. Delete the resource: what it made goes, volumes and their data stay");
    cp.run_kubectl(&repo(), &["delete", "hostpathprovisioner", RESOURCE, "--wait=true"])?;
    let left = daemonset_pools(cp).await?;
    println!("  DaemonSet {}", if left.is_none() { "removed" } else { "STILL THERE" });
    if left.is_some() {
        bail!("the DaemonSet outlived its resource; operator log: {}", log.display());
    }
    Ok(())
}

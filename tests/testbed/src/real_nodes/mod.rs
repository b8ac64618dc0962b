//! The real-node lane: a control plane plus one node with a real kubelet and containerd, so that
//! real pods mount the volumes the provisioner makes, and the project's image runs as a
//! DaemonSet from `deploy/legacy`.
//!
//! One kubelet on the host, a second real node on demand ([`Lane::join_second_node`], see
//! [`second_node`]: its own network and mount namespaces, containerd, kubelet and cgroup root,
//! and its own directories at the local pools' paths, as two machines would have), plus
//! optional simulated nodes (a Node object and a host provisioner process, as elsewhere in the
//! testbed) tainted so that neither the DaemonSet nor ordinary pods land on them.
//!
//! ```no_run
//! # async fn demo() -> testbed::Result<()> {
//! use testbed::real_nodes::{Lane, LaneOptions, PodRun};
//! let lane = Lane::start(LaneOptions::default()).await?;
//! let outcome = lane.run_pod(&PodRun::new("ns", "writer", "echo hi > /data/f").claim("data")).await?;
//! assert_eq!(outcome.exit_code, Some(0));
//! lane.teardown().await?;
//! # Ok(()) }
//! ```
//!
//! Cleanup: [`Lane::teardown`] deletes the pods through the API (the kubelet stops their
//! containers), stops the kubelet and containerd by PID, then undoes every host change the
//! state file records (see [`host`]). `Drop` does the same without the API step. If the test
//! binary dies, the kubelet and containerd die with it (PDEATHSIG) and the next lane start
//! cleans up the rest.

pub mod host;
pub mod images;
pub mod kubevirt;
mod node;
pub mod second_node;
mod workloads;

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::cluster::SimNode;
use crate::control_plane::{ControlPlane, Options, RealNodeAccess};
use crate::process::{ManagedChild, tail_file};
use crate::provisioner::ProvisionerSpec;
use node::NodeLayout;
pub use second_node::NODE2_NAME;
pub use workloads::{PodOutcome, PodRun};

/// The real node's name (and `kubernetes.io/hostname`).
pub const NODE_NAME: &str = "real-node-1";
/// Taint on simulated nodes: nothing runs there unless it tolerates this.
pub const SIMULATED_TAINT: &str = "hpp-testbed/simulated";
/// Namespace and name of the DaemonSet `deploy/legacy` creates.
pub const DEPLOY_NAMESPACE: &str = "kubevirt-hostpath-provisioner";
pub const DEPLOY_DAEMONSET: &str = "kubevirt-hostpath-provisioner";
/// How long pods, rollouts and node registration may take; generous, never asserted.
pub const LANE_TIMEOUT: Duration = Duration::from_secs(120);

/// What [`Lane::start`] builds besides the real node.
#[derive(Clone, Debug, Default)]
pub struct LaneOptions {
    /// Simulated nodes `sim-node-1`, ..., each with a host provisioner process running this
    /// binary (tainted [`SIMULATED_TAINT`]).
    pub simulated_nodes: usize,
    pub simulated_node_binary: Option<PathBuf>,
}

/// Size of the quota pool's btrfs filesystem: far above the volumes' limits, so that a writer
/// stopped at its limit was stopped by the quota, not by a full disk.
pub const QUOTA_POOL_MIB: u64 = 512;

/// Set to `off` to keep the lane from starting (tests skip it, the demo falls back to
/// simulated nodes); under `CI=true` the lane's tests then fail instead, as for any other reason.
pub const DISABLE_ENV: &str = "TESTBED_REAL_NODES";

/// Whether the lane can run here, and if not why (for skip and fallback messages).
pub fn availability() -> Result<()> {
    if std::env::var(DISABLE_ENV).is_ok_and(|v| v == "off" || v == "0") {
        bail!("disabled by {DISABLE_ENV}=off");
    }
    host::preflight()?;
    let bin_dir = crate::binaries::locate_or_build_with_kubelet()?;
    if !bin_dir.join("kubelet").is_file() {
        bail!("no kubelet in {} (hack/build-control-plane.sh builds it)", bin_dir.display());
    }
    Ok(())
}

/// A running lane. Call [`Lane::teardown`] at the end; `Drop` is the fallback.
pub struct Lane {
    // Drop order: the simulated nodes' provisioners, the control plane, then the lock.
    sim_nodes: Vec<SimNode>,
    kubelet: Option<ManagedChild>,
    containerd: Option<ManagedChild>,
    layout: NodeLayout,
    pool: PathBuf,
    /// A pool the DaemonSet declares shared (`nfs`), as a network filesystem would be.
    shared_pool: PathBuf,
    /// A second local pool (`edge`) only the real node serves, for every-node volumes.
    edge_pool: PathBuf,
    /// A local pool (`btrfs`) on a loop-mounted btrfs with quota enabled, for quota volumes.
    quota_pool: PathBuf,
    /// The second real node, once [`Lane::join_second_node`] started it.
    second: Mutex<Option<SecondNode>>,
    /// Every image import and tag so far, replayed on a node that joins later.
    image_steps: Mutex<Vec<ImageStep>>,
    bin_dir: PathBuf,
    started_in: Duration,
    host_cleaned: bool,
    cp: Option<ControlPlane>,
    _lock: host::LaneLock,
}

impl Lane {
    /// Checks the host, cleans up after a dead predecessor, then starts the control plane,
    /// containerd (with the pause and busybox images) and the kubelet, and waits until the
    /// node is Ready.
    pub async fn start(options: LaneOptions) -> Result<Lane> {
        let started = Instant::now();
        host::preflight()?;
        let bin_dir = crate::binaries::locate_or_build_with_kubelet()?;
        let lock = tokio::task::spawn_blocking(|| host::lock(Duration::from_secs(1800))).await??;
        host::clean_stale_lane()?;
        host::ensure_no_foreign_kubelet()?;
        host::write_state()?;
        let dir = host::lane_dir();
        let layout = NodeLayout::host_node(dir.join("node"));
        let mut lane = Lane {
            sim_nodes: Vec::new(),
            kubelet: None,
            containerd: None,
            layout,
            pool: dir.join("pool"),
            shared_pool: dir.join("nfs"),
            edge_pool: dir.join("edge"),
            quota_pool: dir.join("btrfs"),
            second: Mutex::new(None),
            image_steps: Mutex::new(Vec::new()),
            bin_dir: bin_dir.clone(),
            started_in: Duration::ZERO,
            host_cleaned: false,
            cp: None,
            _lock: lock,
        };
        match lane.boot(&bin_dir, &options).await {
            Ok(()) => {
                lane.started_in = started.elapsed();
                Ok(lane)
            }
            Err(err) => {
                let logs = lane.log_tails(40);
                lane.shutdown();
                Err(err.context(format!("the real-node lane did not start; logs:\n{logs}")))
            }
        }
    }

    async fn boot(&mut self, bin_dir: &Path, options: &LaneOptions) -> Result<()> {
        std::fs::create_dir_all(&self.layout.dir)?;
        for pool in [&self.pool, &self.shared_pool, &self.edge_pool] {
            std::fs::create_dir_all(pool)?;
            host::make_shared_mount(pool)?;
        }
        // The admin's steps for a quota pool: a btrfs filesystem (here in a file under the
        // lane directory, so that cleanup unmounts it and detaches its loop device) with quota
        // enabled once.
        host::mount_btrfs_with_quota(&self.quota_pool, QUOTA_POOL_MIB)?;
        host::create_bridge()?;
        let access = RealNodeAccess {
            serving_ips: vec![host::SERVICE_IP.parse()?, host::GATEWAY.parse()?],
            kubelets: vec![NODE_NAME.to_string(), NODE2_NAME.to_string()],
        };
        let options_cp = Options { real_nodes: Some(access), ..Options::default() };
        let cp = self.cp.insert(ControlPlane::start_with(options_cp).await?);
        host::add_service_rule(cp.apiserver_port())?;
        let connection = cp.kubelet_connection(NODE_NAME).context("kubelet token")?;
        let ca_file = cp.ca_cert_file().to_path_buf();

        let images = self.layout.dir.join("images");
        let pause = images::pause_image(&images)?;
        pause.write(&images.join("pause.oci.tar"))?;
        images::busybox_image()?.write(&images.join("busybox.oci.tar"))?;
        self.containerd = Some(node::start_containerd(&self.layout)?);
        for archive in ["pause.oci.tar", "busybox.oci.tar"] {
            self.import_image(&images.join(archive))?;
        }

        let mut kubelet = node::start_kubelet(&self.layout, bin_dir, NODE_NAME, &connection, &ca_file)?;
        let ready = wait_node_ready(self.client(), NODE_NAME, &mut kubelet).await;
        self.kubelet = Some(kubelet);
        ready?;

        for i in 1..=options.simulated_nodes {
            let binary = options.simulated_node_binary.clone().context("simulated nodes need a provisioner binary")?;
            let name = format!("sim-node-{i}");
            let cp = self.cp.as_ref().context("control plane")?;
            let pool = crate::cluster::pool_root_for(cp, &name);
            // Its lease goes where the DaemonSet's pods keep theirs, so that both agree on which
            // node acts for volumes no node owns.
            let spec =
                ProvisionerSpec::new(binary, &name, pool, cp.kubeconfig_path()).env("POD_NAMESPACE", DEPLOY_NAMESPACE);
            let sim = SimNode::start_with(cp, &name, &[], spec).await?;
            let taint =
                json!({"spec": {"taints": [{"key": SIMULATED_TAINT, "value": "true", "effect": "NoSchedule"}]}});
            Api::<Node>::all(cp.admin_client()).patch(&name, &PatchParams::default(), &Patch::Merge(&taint)).await?;
            self.sim_nodes.push(sim);
        }
        Ok(())
    }

    /// The DaemonSet's shared pool `nfs` (see [`Lane::deploy_legacy`]).
    pub fn shared_pool(&self) -> &Path {
        &self.shared_pool
    }

    /// The DaemonSet's second local pool `edge`.
    pub fn edge_pool(&self) -> &Path {
        &self.edge_pool
    }

    /// The DaemonSet's quota pool `btrfs` (btrfs, quota enabled).
    pub fn quota_pool(&self) -> &Path {
        &self.quota_pool
    }

    /// The control plane.
    pub fn cp(&self) -> &ControlPlane {
        self.cp.as_ref().expect("a running lane has a control plane")
    }

    /// A new admin client for the calling runtime.
    pub fn client(&self) -> kube::Client {
        self.cp().admin_client()
    }

    /// The real node's name.
    pub fn node_name(&self) -> &str {
        NODE_NAME
    }

    /// The simulated nodes, if [`LaneOptions::simulated_nodes`] asked for some.
    pub fn simulated_nodes(&self) -> &[SimNode] {
        &self.sim_nodes
    }

    /// A directory on the host that is a shared mount (usable as the DaemonSet's pool root).
    pub fn pool_root(&self) -> &Path {
        &self.pool
    }

    /// The lane's working directory (logs, containerd and kubelet state).
    pub fn dir(&self) -> &Path {
        &self.layout.dir
    }

    /// From the first check to the node being Ready.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// Imports an OCI archive into every node's containerd (namespace `k8s.io`, where CRI
    /// looks), and into a node that joins later.
    pub fn import_image(&self, archive: &Path) -> Result<()> {
        let step = ImageStep::Import(archive.to_path_buf());
        for layout in self.node_layouts() {
            step.apply(&layout)?;
        }
        self.image_steps.lock().expect("image steps lock").push(step);
        Ok(())
    }

    /// Gives the image `source` a second name (both full references), on every node.
    pub fn tag_image(&self, source: &str, target: &str) -> Result<()> {
        let step = ImageStep::Tag(source.into(), target.into());
        for layout in self.node_layouts() {
            step.apply(&layout)?;
        }
        self.image_steps.lock().expect("image steps lock").push(step);
        Ok(())
    }

    /// Node 1's containerd pulls images named `name/...` from `registry`, reached at
    /// 127.0.0.1 and trusted by its CA, as an admin configures a registry mirror
    /// (`hosts.toml`). Node 1 only: the second node's loopback is its own.
    pub fn pull_through(&self, name: &str, registry: &crate::registry::Registry) -> Result<()> {
        let dir = self.layout.dir.join("certs.d").join(name);
        std::fs::create_dir_all(&dir)?;
        let hosts = format!(
            "server = \"https://{name}\"\n\n[host.\"https://127.0.0.1\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{}\"\n",
            registry.ca_file().display()
        );
        std::fs::write(dir.join("hosts.toml"), hosts)?;
        Ok(())
    }

    /// Node 1's layout, and the second node's while it runs.
    fn node_layouts(&self) -> Vec<NodeLayout> {
        let mut layouts = vec![self.layout.clone()];
        layouts.extend(self.second.lock().expect("second node lock").as_ref().map(|n| n.layout.clone()));
        layouts
    }

    /// The layout of the node named `node` (node 1's for any other name).
    fn layout_of(&self, node: Option<&str>) -> NodeLayout {
        if node == Some(NODE2_NAME)
            && let Some(second) = self.second.lock().expect("second node lock").as_ref()
        {
            return second.layout.clone();
        }
        self.layout.clone()
    }

    /// Image references containerd holds.
    pub fn image_names(&self) -> Result<Vec<String>> {
        Ok(node::ctr(&self.layout, &["images", "ls", "-q"])?.lines().map(str::to_string).collect())
    }

    /// PIDs (host view) of the running containers' first processes, by container name, from
    /// containerd's task list.
    pub fn container_pids(&self) -> Result<Vec<(String, u32)>> {
        let tasks = node::ctr(&self.layout, &["tasks", "ls"])?;
        let mut pids = Vec::new();
        for line in tasks.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if let [id, pid, "RUNNING", ..] = fields.as_slice()
                && let Ok(pid) = pid.parse()
            {
                pids.push((id.to_string(), pid));
            }
        }
        Ok(pids)
    }

    /// Starts the second real node ([`NODE2_NAME`], see [`second_node`]) unless it runs:
    /// namespaces, containerd with every image imported so far, the kubelet; waits until the
    /// Node is Ready. DaemonSets then extend to it.
    pub async fn join_second_node(&self) -> Result<()> {
        if self.second.lock().expect("second node lock").is_some() {
            return Ok(());
        }
        let cp = self.cp();
        let mut node1_mounts = host::mounts_under(&self.layout.dir);
        node1_mounts.extend(host::mounts_under(&self.quota_pool));
        let layout = second_node::create(
            &host::lane_dir(),
            &[&self.pool, &self.edge_pool, &self.quota_pool],
            &[&self.shared_pool],
            &node1_mounts,
            cp.apiserver_port(),
        )?;
        // From inside its namespace the node reaches the API server at node 1's bridge
        // gateway (routed through the veth), an address the serving certificate names.
        let gateway: std::net::IpAddr = host::GATEWAY.parse()?;
        let connection = cp
            .kubelet_connection(NODE2_NAME)
            .context("kubelet token")?
            .via(std::net::SocketAddr::new(gateway, cp.apiserver_port()));
        let mut containerd = node::start_containerd(&layout)?;
        let steps = self.image_steps.lock().expect("image steps lock").clone();
        for step in &steps {
            if let Err(err) = step.apply(&layout) {
                containerd.terminate(Duration::from_secs(10));
                return Err(err);
            }
        }
        let mut kubelet = node::start_kubelet(&layout, &self.bin_dir, NODE2_NAME, &connection, cp.ca_cert_file())?;
        let ready = wait_node_ready(self.client(), NODE2_NAME, &mut kubelet).await;
        *self.second.lock().expect("second node lock") = Some(SecondNode { layout, kubelet, containerd });
        ready.map_err(|e| e.context(self.log_tails(30)))
    }

    /// Whether the second node runs.
    pub fn has_second_node(&self) -> bool {
        self.second.lock().expect("second node lock").is_some()
    }

    /// Takes the second node out as an admin would: a `NoExecute` taint makes the DaemonSet
    /// controller remove its pod (the kubelet stops it), then the kubelet and containerd stop,
    /// the Node object is deleted and the namespaces and cgroups go. Other pods must be gone
    /// already (the scenarios delete theirs).
    pub async fn remove_second_node(&self) -> Result<()> {
        if !self.has_second_node() {
            return Ok(());
        }
        let nodes: Api<Node> = Api::all(self.client());
        let taint =
            json!({"spec": {"taints": [{"key": "hpp-testbed/leaving", "value": "true", "effect": "NoExecute"}]}});
        nodes.patch(NODE2_NAME, &PatchParams::default(), &Patch::Merge(&taint)).await?;
        let pods: Api<Pod> = Api::all(self.client());
        let on_node = ListParams::default().fields(&format!("spec.nodeName={NODE2_NAME}"));
        // The DaemonSet's pod goes by the taint; what a failed scenario left is deleted, as
        // a drain would.
        for pod in pods.list(&on_node).await?.items {
            let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else { continue };
            if ns != DEPLOY_NAMESPACE {
                let params = DeleteParams { grace_period_seconds: Some(1), ..DeleteParams::default() };
                let _ = Api::<Pod>::namespaced(self.client(), &ns).delete(&name, &params).await;
            }
        }
        let drained = crate::wait_for(&format!("pods on {NODE2_NAME} gone"), LANE_TIMEOUT, || async {
            anyhow::Ok(pods.list(&on_node).await?.items.is_empty().then_some(()))
        })
        .await;
        if let Some(mut second) = self.second.lock().expect("second node lock").take() {
            second.kubelet.terminate(Duration::from_secs(10));
            second.containerd.terminate(Duration::from_secs(10));
        }
        second_node::remove(&host::lane_dir())?;
        // Pod objects the stopped kubelet can no longer finish go by force.
        for pod in pods.list(&on_node).await?.items {
            let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else { continue };
            let params = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
            let _ = Api::<Pod>::namespaced(self.client(), &ns).delete(&name, &params).await;
        }
        match nodes.delete(NODE2_NAME, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(err) => return Err(err.into()),
        }
        drained
    }

    /// Where the host holds `path` as node `node` sees it: node 2 has its own directories at
    /// the paths of the local pools ([`second_node::own_pool_dir`]); everything else is the
    /// same file on both.
    pub fn host_path_on(&self, node: &str, path: &Path) -> PathBuf {
        if node != NODE2_NAME {
            return path.to_path_buf();
        }
        for pool in [&self.pool, &self.edge_pool, &self.quota_pool] {
            if let Ok(rest) = path.strip_prefix(pool) {
                return second_node::own_pool_dir(&host::lane_dir(), pool).join(rest);
            }
        }
        path.to_path_buf()
    }

    /// `path` as the second node sees it, mounts included, from the host: through the root of
    /// a process in the node's mount namespace ([`second_node::init_stand_in_pid`]). Valid
    /// while the node runs.
    pub fn path_in_second_node(&self, path: &Path) -> Result<PathBuf> {
        let pid = second_node::init_stand_in_pid(&host::lane_dir()).context("the second node does not run")?;
        Ok(PathBuf::from(format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path)))
    }

    /// Runs `command` in the second node's mount namespace, as an admin would on that machine
    /// (`mount`, `umount`); fails with its stderr.
    pub fn run_on_second_node(&self, command: &[&str]) -> Result<()> {
        let layout = self.second.lock().expect("second node lock").as_ref().map(|n| n.layout.clone());
        let ns = layout.and_then(|l| l.namespaces).context("the second node does not run")?;
        host::run(
            std::process::Command::new("nsenter")
                .arg(format!("--mount={}", ns.mount.display()))
                .arg("--")
                .args(command),
        )
    }

    /// Deploys `deploy/legacy` from `repo` with `kubectl apply -k`, through an overlay that
    /// points the image at the local one ([`images::local_image`]), moves the pool root to [`Lane::pool_root`] and adds two pools as the README says an admin
    /// would (`STORAGE_POOLS`, a hostPath volume and a mount each): `nfs` declared shared,
    /// `edge` local and `btrfs` local on btrfs with quota, after importing `image_archive` under
    /// the name the rendered DaemonSet uses. Waits until the DaemonSet is rolled out and
    /// returns that image name.
    pub async fn deploy_legacy(&self, repo: &Path, image_archive: &Path) -> Result<String> {
        let overlay = self.write_overlay(repo)?;
        let rendered = self.cp().run_kubectl(repo, &["kustomize", &overlay.display().to_string()])?;
        let image = rendered
            .lines()
            .filter_map(|l| l.trim().strip_prefix("image:"))
            .map(|v| v.trim().trim_matches('"').to_string())
            .next()
            .context("no image in the rendered DaemonSet")?;
        let wanted = images::normalize_reference(&image);
        self.import_image(image_archive)?;
        if !self.image_names()?.contains(&wanted) {
            let imported = archive_image_name(image_archive)?;
            self.tag_image(&imported, &wanted)?;
        }
        self.cp().run_kubectl(repo, &["apply", "-k", &overlay.display().to_string()])?;
        self.wait_daemonset_rolled_out().await?;
        Ok(image)
    }

    fn write_overlay(&self, repo: &Path) -> Result<PathBuf> {
        let dir = self.layout.dir.join("deploy-overlay");
        std::fs::create_dir_all(&dir)?;
        let base = repo.join("deploy/legacy").canonicalize().context("deploy/legacy")?;
        // kustomize takes bases by relative path only ("new root cannot be absolute").
        let up = "../".repeat(dir.canonicalize()?.components().count() - 1);
        let base = PathBuf::from(up).join(base.strip_prefix("/")?);
        let pool = self.pool.display();
        // The deploy names a registry placeholder (never pulled); point it at the image imported
        // into this node's containerd, as an admin of a cluster without a registry would.
        let placeholder = images::manifest_image(repo)?;
        let (placeholder_name, _) = placeholder.rsplit_once(':').context("a tag in the deploy's image")?;
        let local = images::local_image(repo)?;
        let (local_name, local_tag) = local.rsplit_once(':').context("a tag in the local image")?;
        // Strategic merge for the env entry and the volume (merged by name); a JSON patch for
        // the mount, because volumeMounts merge on mountPath (a merge would add a second one).
        let kustomization = format!(
            r#"# Written by the testbed's real-node lane: deploy/legacy with the pool root moved.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {base}
images:
  - name: {placeholder_name}
    newName: {local_name}
    newTag: "{local_tag}"
patches:
  - target: {{kind: DaemonSet, name: {DEPLOY_DAEMONSET}}}
    patch: |-
      - op: test
        path: /spec/template/spec/containers/0/volumeMounts/0/name
        value: pv-volume
      - op: replace
        path: /spec/template/spec/containers/0/volumeMounts/0/mountPath
        value: {pool}
      - op: add
        path: /spec/template/spec/containers/0/volumeMounts/-
        value: {{name: pool-nfs, mountPath: {nfs}, mountPropagation: HostToContainer}}
      - op: add
        path: /spec/template/spec/containers/0/volumeMounts/-
        value: {{name: pool-edge, mountPath: {edge}, mountPropagation: HostToContainer}}
      - op: add
        path: /spec/template/spec/containers/0/volumeMounts/-
        value: {{name: pool-btrfs, mountPath: {quota}, mountPropagation: HostToContainer}}
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
              - name: kubevirt-hostpath-provisioner
                env:
                  - name: PV_DIR
                    value: {pool}
                  - name: STORAGE_POOLS
                    value: nfs={nfs},shared,edge={edge},btrfs={quota}
            volumes:
              - name: pv-volume
                hostPath:
                  path: {pool}
              - name: pool-nfs
                hostPath:
                  path: {nfs}
                  type: Directory
              - name: pool-edge
                hostPath:
                  path: {edge}
                  type: Directory
              - name: pool-btrfs
                hostPath:
                  path: {quota}
                  type: Directory
"#,
            base = base.display(),
            nfs = self.shared_pool.display(),
            edge = self.edge_pool.display(),
            quota = self.quota_pool.display(),
        );
        std::fs::write(dir.join("kustomization.yaml"), kustomization)?;
        Ok(dir)
    }

    /// Waits until the DaemonSet's pods all run the current template and are ready.
    pub async fn wait_daemonset_rolled_out(&self) -> Result<DaemonSet> {
        let api: Api<DaemonSet> = Api::namespaced(self.client(), DEPLOY_NAMESPACE);
        crate::wait_until(
            "the provisioner DaemonSet rolled out and ready",
            LANE_TIMEOUT,
            || api.get(DEPLOY_DAEMONSET),
            |ds| {
                let generation = ds.metadata.generation.unwrap_or(0);
                ds.status.as_ref().is_some_and(|s| {
                    s.observed_generation.unwrap_or(0) >= generation
                        && s.desired_number_scheduled >= 1
                        && s.updated_number_scheduled == Some(s.desired_number_scheduled)
                        && s.number_ready == s.desired_number_scheduled
                        && s.number_available == Some(s.desired_number_scheduled)
                        && s.number_unavailable.unwrap_or(0) == 0
                })
            },
        )
        .await
    }

    /// The last `lines` lines of the kubelet's, containerd's and each control-plane
    /// component's log.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for (name, path) in self.node_log_paths() {
            out.push_str(&format!("===== {name} ({}) =====\n{}\n", path.display(), tail_file(&path, lines)));
        }
        if let Some(cp) = &self.cp {
            out.push_str(&cp.log_tails(lines));
        }
        out
    }

    /// The kubelet's and containerd's logs of each node that ran (node 2's stay after it left).
    fn node_log_paths(&self) -> Vec<(String, PathBuf)> {
        let mut paths =
            vec![("kubelet".into(), self.layout.kubelet_log()), ("containerd".into(), self.layout.containerd_log())];
        let second = second_node::node_dir(&host::lane_dir());
        for (name, file) in [("kubelet-node2", "kubelet.log"), ("containerd-node2", "containerd.log")] {
            if second.join(file).exists() {
                paths.push((name.into(), second.join(file)));
            }
        }
        paths
    }

    /// Log files of the node and control plane, by name (the demo copies them).
    pub fn log_paths(&self) -> Vec<(String, PathBuf)> {
        let mut paths = self.node_log_paths();
        if let Some(cp) = &self.cp {
            paths.extend(cp.log_paths().into_iter().map(|(n, p)| (n.to_string(), p.to_path_buf())));
        }
        paths
    }

    /// Deletes every DaemonSet and pod through the API and waits (bounded) until the kubelet
    /// has stopped their containers, then stops everything and undoes the host changes.
    pub async fn teardown(mut self) -> Result<()> {
        let client = self.client();
        let has_second = self.has_second_node();
        let graceful = async {
            let daemonsets: Api<DaemonSet> = Api::all(client.clone());
            for ds in daemonsets.list(&ListParams::default()).await?.items {
                let (Some(ns), Some(name)) = (ds.metadata.namespace, ds.metadata.name) else { continue };
                Api::<DaemonSet>::namespaced(client.clone(), &ns).delete(&name, &DeleteParams::default()).await?;
            }
            let pods: Api<Pod> = Api::all(client.clone());
            for pod in pods.list(&ListParams::default()).await?.items {
                let (Some(ns), Some(name)) = (pod.metadata.namespace, pod.metadata.name) else { continue };
                // Not 0: a zero grace period deletes the object at once, before the kubelet
                // stopped anything; with 1 s the object goes only when the containers are gone.
                let params = DeleteParams { grace_period_seconds: Some(1), ..DeleteParams::default() };
                let _ = Api::<Pod>::namespaced(client.clone(), &ns).delete(&name, &params).await;
            }
            crate::wait_for("pods on the real nodes gone", Duration::from_secs(60), || async {
                let mut left = 0;
                // Only nodes whose kubelet runs can stop their pods.
                let nodes = if has_second { vec![NODE_NAME, NODE2_NAME] } else { vec![NODE_NAME] };
                for node in nodes {
                    left +=
                        pods.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))).await?.items.len();
                }
                anyhow::Ok((left == 0).then_some(()))
            })
            .await
        };
        let graceful: Result<()> = graceful.await;
        if let Err(err) = &graceful {
            eprintln!("testbed: pods did not stop through the API ({err:#}); killing them");
        }
        self.shutdown();
        self.host_result()
    }

    fn host_result(&mut self) -> Result<()> {
        if self.host_cleaned { Ok(()) } else { Err(anyhow!("host cleanup incomplete (see above)")) }
    }

    /// Stops the kubelet and containerd and undoes the host changes; idempotent.
    fn shutdown(&mut self) {
        self.sim_nodes.clear();
        if let Some(mut second) = self.second.lock().map(|mut s| s.take()).ok().flatten() {
            second.kubelet.terminate(Duration::from_secs(10));
            second.containerd.terminate(Duration::from_secs(10));
        }
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.terminate(Duration::from_secs(10));
        }
        if let Some(mut containerd) = self.containerd.take() {
            containerd.terminate(Duration::from_secs(10));
        }
        if !self.host_cleaned {
            match host::clean_current_lane() {
                Ok(()) => self.host_cleaned = true,
                Err(err) => eprintln!("testbed: {err:#}"),
            }
        }
        // The control plane goes last: nothing above needs it, and its Drop stops it.
        self.cp = None;
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("testbed: test panicked; real-node lane logs:\n{}", self.log_tails(40));
        }
        self.shutdown();
    }
}

/// The second node's processes and files.
struct SecondNode {
    layout: NodeLayout,
    kubelet: ManagedChild,
    containerd: ManagedChild,
}

/// An image import or tag, kept to bring a later node's containerd to the same images.
#[derive(Clone, Debug)]
enum ImageStep {
    Import(PathBuf),
    Tag(String, String),
}

impl ImageStep {
    fn apply(&self, layout: &NodeLayout) -> Result<()> {
        match self {
            ImageStep::Import(archive) => node::ctr(layout, &["images", "import", &archive.display().to_string()])
                .with_context(|| format!("importing {}", archive.display())),
            ImageStep::Tag(source, target) => node::ctr(layout, &["images", "tag", "--force", source, target]),
        }
        .map(|_| ())
    }
}

/// Waits until Node `name` is Ready, failing early if its kubelet exits.
async fn wait_node_ready(client: kube::Client, name: &str, kubelet: &mut ManagedChild) -> Result<()> {
    let nodes: Api<Node> = Api::all(client);
    let deadline = Instant::now() + LANE_TIMEOUT;
    loop {
        if let Some(status) = kubelet.exit_status() {
            bail!("the kubelet of {name} exited with {status}");
        }
        let node = nodes.get_opt(name).await.ok().flatten();
        let ready = node
            .as_ref()
            .and_then(|n| n.status.as_ref()?.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("node {name} not Ready after {LANE_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The `io.containerd.image.name` an archive written by [`images::OciImage::write`] carries.
fn archive_image_name(archive: &Path) -> Result<String> {
    let file = std::fs::File::open(archive).with_context(|| format!("opening {}", archive.display()))?;
    let mut tar = tar::Archive::new(file);
    for entry in tar.entries()? {
        let mut entry = entry?;
        if entry.path()?.as_os_str() == "index.json" {
            let index: serde_json::Value = serde_json::from_reader(&mut entry)?;
            if let Some(name) = index["manifests"][0]["annotations"]["io.containerd.image.name"].as_str() {
                return Ok(name.to_string());
            }
        }
    }
    bail!("{} names no image", archive.display())
}

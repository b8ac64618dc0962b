//! A control plane plus simulated nodes, each with its own pool root and provisioner process.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use kube::Client;

use crate::control_plane::{ControlPlane, Options};
use crate::provisioner::{Provisioner, ProvisionerSpec};
use crate::report::LogsOnFailure;

/// How long a fresh provisioner may take to answer `/readyz` (its initial lists included).
pub const PROVISIONER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// One simulated node: a Node object, a pool root directory and the provisioner serving it.
pub struct SimNode {
    /// Node object name (`--node-name`).
    pub name: String,
    /// Its `kubernetes.io/hostname` label, which PV node affinity must use.
    pub hostname: String,
    /// The node's pool root (`--pv-dir`), under the control plane's temp dir.
    pub pool_root: PathBuf,
    pub provisioner: Provisioner,
}

impl SimNode {
    /// Creates Node `name` (hostname label = name) and a pool root, starts a provisioner with
    /// the admin kubeconfig and `extra_args`, and waits until it is ready.
    pub async fn start(cp: &ControlPlane, name: &str, binary: &Path, extra_args: &[String]) -> Result<SimNode> {
        let spec = ProvisionerSpec {
            extra_args: extra_args.to_vec(),
            ..ProvisionerSpec::new(binary, name, pool_root_for(cp, name), cp.kubeconfig_path())
        };
        Self::start_with(cp, name, &[], spec).await
    }

    /// Like [`SimNode::start`], with extra Node labels (say, a per-test group for pods to
    /// select on the shared control plane) and full control of the provisioner's spec (its
    /// `node_name` should be `name`; its pool root is created if missing).
    pub async fn start_with(
        cp: &ControlPlane,
        name: &str,
        labels: &[(&str, &str)],
        spec: ProvisionerSpec,
    ) -> Result<SimNode> {
        cp.add_node_labeled(name, name, labels).await?;
        std::fs::create_dir_all(&spec.pool_root)
            .with_context(|| format!("creating pool root {}", spec.pool_root.display()))?;
        let pool_root = spec.pool_root.clone();
        let mut provisioner = Provisioner::spawn(spec, cp.temp_dir())?;
        provisioner.wait_ready(PROVISIONER_READY_TIMEOUT).await?;
        Ok(SimNode { name: name.to_string(), hostname: name.to_string(), pool_root, provisioner })
    }
}

/// `<temp dir>/nodes/<name>/pool`.
pub fn pool_root_for(cp: &ControlPlane, node: &str) -> PathBuf {
    cp.temp_dir().join("nodes").join(node).join("pool")
}

/// What node `node` sees at the path of [`ClusterSpec::per_node_pool`] `pool`.
pub fn per_node_pool_dir(cp: &ControlPlane, node: &str, pool: &str) -> PathBuf {
    cp.temp_dir().join("nodes").join(node).join(pool)
}

/// What [`Cluster::start_with`] builds.
#[derive(Clone, Debug)]
pub struct ClusterSpec {
    /// The provisioner executable.
    pub binary: PathBuf,
    /// Number of nodes, named `node-1`, `node-2`, ...
    pub nodes: usize,
    pub control_plane: Options,
    /// Passed to every provisioner.
    pub provisioner_args: Vec<String>,
    /// A pool `(name, path)` at the same path on every node, each node seeing a directory of its
    /// own there (`<temp dir>/nodes/<node>/<name>`, bind-mounted in the provisioner's private
    /// mount namespace; needs root): the layout of every-node volumes.
    pub per_node_pool: Option<(String, PathBuf)>,
}

impl ClusterSpec {
    pub fn new(binary: impl Into<PathBuf>, nodes: usize) -> ClusterSpec {
        ClusterSpec {
            binary: binary.into(),
            nodes,
            control_plane: Options::default(),
            provisioner_args: Vec::new(),
            per_node_pool: None,
        }
    }
}

/// A control plane of its own with N simulated nodes.
///
/// Dropping it stops the provisioners first, then the control plane (field order).
pub struct Cluster {
    pub nodes: Vec<SimNode>,
    pub cp: ControlPlane,
}

impl Cluster {
    /// `nodes` nodes named `node-1`..`node-N`, default options.
    pub async fn start(nodes: usize, binary: &Path) -> Result<Cluster> {
        Self::start_with(ClusterSpec::new(binary, nodes)).await
    }

    pub async fn start_with(spec: ClusterSpec) -> Result<Cluster> {
        let cp = ControlPlane::start_with(spec.control_plane.clone()).await?;
        let mut nodes = Vec::with_capacity(spec.nodes);
        for i in 1..=spec.nodes {
            let name = format!("node-{i}");
            let mut node_spec = ProvisionerSpec {
                extra_args: spec.provisioner_args.clone(),
                ..ProvisionerSpec::new(&spec.binary, &name, pool_root_for(&cp, &name), cp.kubeconfig_path())
            };
            if let Some((pool, path)) = &spec.per_node_pool {
                node_spec = node_spec
                    .arg("--pool")
                    .arg(format!("{pool}={}", path.display()))
                    .private_mount(per_node_pool_dir(&cp, &name, pool), path.clone());
            }
            nodes.push(SimNode::start_with(&cp, &name, &[], node_spec).await?);
        }
        Ok(Cluster { nodes, cp })
    }

    /// A new admin client for the calling runtime.
    pub fn client(&self) -> Client {
        self.cp.admin_client()
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&SimNode> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// A guard that prints the logs of every provisioner and component unless the test calls
    /// [`LogsOnFailure::passed`] (a test returning `Err` is not a panic, so `Drop` stays silent).
    pub fn logs_on_failure(&self) -> LogsOnFailure {
        let mut logs = self.cp.logs_on_failure();
        for node in &self.nodes {
            logs.watch_provisioner(&node.provisioner);
        }
        logs
    }

    /// The node called `name`, mutably (to kill or restart its provisioner).
    pub fn node_mut(&mut self, name: &str) -> Option<&mut SimNode> {
        self.nodes.iter_mut().find(|n| n.name == name)
    }
}

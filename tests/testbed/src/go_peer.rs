//! The Go provisioner this project replaces (kubevirt/hostpath-provisioner's `cmd/provisioner`,
//! built by `hack/build-go-legacy.sh`) run as a child process that plays one node's DaemonSet
//! pod, for the bench's side-by-side runs.
//!
//! It is run the way its upstream DaemonSet runs it. It only knows in-cluster configuration
//! (`KUBERNETES_SERVICE_HOST`/`_PORT`, and the ServiceAccount token and CA at the fixed path
//! `/var/run/secrets/kubernetes.io/serviceaccount/`), so each process gets a mount namespace of
//! its own in which a per-node directory holding `secrets/kubernetes.io/serviceaccount/` is
//! bind-mounted over `/run` (where `/var/run` points): several processes on one host each see
//! their own token, and nothing is created outside the control plane's temp dir. The rest is its
//! DaemonSet's environment: `NODE_NAME`, `PV_DIR`, `USE_NAMING_PREFIX`. It has no flags of its
//! own, no health endpoint and no metrics; it is ready once it logs that its controller started.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::control_plane::ControlPlane;
use crate::process::{ManagedChild, ProcessSpec, tail_file};

/// What the Go controller logs once its informers have synced and its workers run.
const READY_LINE: &str = "Started provisioner controller";
const TERMINATE_GRACE: Duration = Duration::from_secs(10);

/// The cached Go build (hack/build-go-legacy.sh of the repository at `repo`): the directory
/// holding `kubevirt-legacy-provisioner` and `src/`, the Go tree with its deploy files. Fails
/// with the script's words where the Go source archive is not given.
pub fn go_legacy_build(repo: &Path) -> Result<PathBuf> {
    let output = std::process::Command::new("bash")
        .arg(repo.join("hack/build-go-legacy.sh"))
        .output()
        .context("running hack/build-go-legacy.sh")?;
    let log = String::from_utf8_lossy(&output.stderr);
    ensure!(output.status.success(), "hack/build-go-legacy.sh failed:\n{log}");
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or_default().trim());
    ensure!(dir.join("kubevirt-legacy-provisioner").is_file(), "no Go binary in {}:\n{log}", dir.display());
    Ok(dir)
}

/// How to run one Go provisioner process.
#[derive(Clone, Debug)]
pub struct GoPeerSpec {
    /// The `kubevirt-legacy-provisioner` binary.
    pub binary: PathBuf,
    /// `NODE_NAME`: the Node this process serves.
    pub node_name: String,
    /// `PV_DIR`: where it makes the volumes' directories.
    pub pool_root: PathBuf,
    /// A ServiceAccount token (bound to the Go build's own ClusterRole) and its namespace.
    pub token: String,
    pub namespace: String,
    /// `USE_NAMING_PREFIX`.
    pub naming_prefix: bool,
}

/// A running (or stopped) Go provisioner process. Dropping it kills the process (the
/// [`ManagedChild`]'s `Drop`).
pub struct GoPeer {
    spec: GoPeerSpec,
    process: ProcessSpec,
    child: Option<ManagedChild>,
    last_pid: u32,
}

impl GoPeer {
    /// Writes the node's in-cluster files under `<cp temp dir>/go-peers/<node>/` and starts the
    /// process; its output goes to `<cp temp dir>/go-peer-<node>.log`.
    pub fn spawn(cp: &ControlPlane, spec: GoPeerSpec) -> Result<GoPeer> {
        let run_dir = cp.temp_dir().join("go-peers").join(&spec.node_name).join("run");
        let secrets = run_dir.join("secrets/kubernetes.io/serviceaccount");
        std::fs::create_dir_all(&secrets).with_context(|| format!("creating {}", secrets.display()))?;
        std::fs::write(secrets.join("token"), &spec.token)?;
        std::fs::write(secrets.join("namespace"), &spec.namespace)?;
        std::fs::copy(cp.ca_cert_file(), secrets.join("ca.crt")).context("copying the API server's CA")?;
        std::fs::create_dir_all(&spec.pool_root).with_context(|| format!("creating {}", spec.pool_root.display()))?;
        let run = std::fs::canonicalize("/var/run").unwrap_or_else(|_| PathBuf::from("/run"));
        let script = r#"mount --bind "$1" "$2" && shift 2 && exec "$@""#;
        let args = ["--mount", "--propagation", "private", "sh", "-c", script, "sh"]
            .into_iter()
            .map(String::from)
            .chain([run_dir.display().to_string(), run.display().to_string(), spec.binary.display().to_string()])
            .collect();
        let env = vec![
            ("KUBERNETES_SERVICE_HOST".to_string(), "127.0.0.1".to_string()),
            ("KUBERNETES_SERVICE_PORT".to_string(), cp.apiserver_port().to_string()),
            ("NODE_NAME".to_string(), spec.node_name.clone()),
            ("PV_DIR".to_string(), spec.pool_root.display().to_string()),
            ("USE_NAMING_PREFIX".to_string(), spec.naming_prefix.to_string()),
        ];
        let process = ProcessSpec {
            name: format!("go-peer-{}", spec.node_name),
            program: PathBuf::from("unshare"),
            args,
            env,
            clean_env: true,
            log_path: cp.temp_dir().join(format!("go-peer-{}.log", spec.node_name)),
            cgroup_procs: None,
        };
        let child = ManagedChild::spawn(&process)?;
        Ok(GoPeer { last_pid: child.pid(), spec, process, child: Some(child) })
    }

    /// Waits until the controller has started (its log says so); fails at once if the process
    /// exits, with its log tail.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.as_mut().and_then(ManagedChild::exit_status) {
                bail!(
                    "Go provisioner for {} exited ({status}); last log lines:\n{}",
                    self.spec.node_name,
                    self.log_tail(30)
                );
            }
            if std::fs::read_to_string(&self.process.log_path).is_ok_and(|log| log.contains(READY_LINE)) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "Go provisioner for {} did not log {READY_LINE:?} within {timeout:?}; last log lines:\n{}",
                    self.spec.node_name,
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How the process ended, if it did (a crash shows here).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(ManagedChild::exit_status)
    }

    /// SIGTERM, wait up to 10 s, then SIGKILL; reaps.
    pub fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.terminate(TERMINATE_GRACE);
        }
    }

    /// PID of the process (the Go program itself: the wrapper `exec`s it).
    pub fn pid(&self) -> u32 {
        self.last_pid
    }

    pub fn node_name(&self) -> &str {
        &self.spec.node_name
    }

    pub fn pool_root(&self) -> &Path {
        &self.spec.pool_root
    }

    pub fn log_path(&self) -> &Path {
        &self.process.log_path
    }

    pub fn log_tail(&self, lines: usize) -> String {
        tail_file(&self.process.log_path, lines)
    }
}

//! The provisioner under test, run as a child process that plays one node's DaemonSet pod.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::memory_cgroup::MemoryCgroup;
use crate::process::{ManagedChild, ProcessSpec, free_port, tail_file};

/// Default `RUST_LOG`: enough to follow each decision in a failed test's log tail.
pub const DEFAULT_RUST_LOG: &str = "info,hostpath_provisioner=debug";

/// How to run one provisioner process.
#[derive(Clone, Debug)]
pub struct ProvisionerSpec {
    /// The provisioner executable (`env!("CARGO_BIN_EXE_hostpath-provisioner")` in tests).
    pub binary: PathBuf,
    /// `--node-name`: the Node object this process serves.
    pub node_name: String,
    /// `--pv-dir`: the node's pool root.
    pub pool_root: PathBuf,
    /// `--kubeconfig`: admin's, or one written for a ServiceAccount token.
    pub kubeconfig: PathBuf,
    /// Appended after the standard flags.
    pub extra_args: Vec<String>,
    /// The process's environment besides `PATH`, `HOME`, `TMPDIR`, `RUST_BACKTRACE`,
    /// `NO_COLOR=1` and `RUST_LOG=`[`DEFAULT_RUST_LOG`] (entries here override the last two). Nothing else is
    /// inherited: the provisioner reads its settings from env vars too (`PV_DIR`,
    /// `KUBECONFIG`, ...), and the test runner's must not leak in.
    pub env: Vec<(String, String)>,
    /// Bind mounts `(source, target)` made in a private mount namespace of the process's own
    /// (needs root): how several simulated nodes on one host each see a directory of their own
    /// at the same path, as every-node volumes need. Gone with the process.
    pub private_mounts: Vec<(PathBuf, PathBuf)>,
    /// A memory limit in bytes, as a pod's `resources.limits.memory` sets it: the process runs in
    /// a memory cgroup of its own with that limit (needs root), and OOM kills are counted.
    pub memory_limit: Option<u64>,
}

impl ProvisionerSpec {
    pub fn new(
        binary: impl Into<PathBuf>,
        node_name: &str,
        pool_root: impl Into<PathBuf>,
        kubeconfig: impl Into<PathBuf>,
    ) -> ProvisionerSpec {
        ProvisionerSpec {
            binary: binary.into(),
            node_name: node_name.to_string(),
            pool_root: pool_root.into(),
            kubeconfig: kubeconfig.into(),
            extra_args: Vec::new(),
            env: Vec::new(),
            private_mounts: Vec::new(),
            memory_limit: None,
        }
    }

    /// Runs the process under a memory limit of `bytes` (see [`ProvisionerSpec::memory_limit`]).
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }

    /// Adds a bind mount of `source` on `target` seen only by this process (see
    /// [`ProvisionerSpec::private_mounts`]); `target` is created if missing.
    pub fn private_mount(mut self, source: impl Into<PathBuf>, target: impl Into<PathBuf>) -> Self {
        self.private_mounts.push((source.into(), target.into()));
        self
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }
}

/// A running (or stopped, between `kill` and `restart`) provisioner process.
///
/// Dropping it kills the process; if the test is panicking, its log tail goes to stderr first.
pub struct Provisioner {
    spec: ProvisionerSpec,
    process: ProcessSpec,
    health_addr: SocketAddr,
    metrics_addr: SocketAddr,
    child: Option<ManagedChild>,
    last_pid: u32,
    /// Dropped after the child (fields drop in order): a cgroup is removed once empty.
    cgroup: Option<MemoryCgroup>,
}

const TERMINATE_GRACE: Duration = Duration::from_secs(10);

impl Provisioner {
    /// Starts `<binary> --node-name N --pv-dir ROOT --kubeconfig K --health-addr A
    /// --metrics-addr B [extra]` with its output appended to `<log_dir>/provisioner-<node>.log`.
    pub fn spawn(spec: ProvisionerSpec, log_dir: &Path) -> Result<Provisioner> {
        let health_addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let metrics_addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut args = vec![
            "--node-name".to_string(),
            spec.node_name.clone(),
            "--pv-dir".to_string(),
            spec.pool_root.display().to_string(),
            "--kubeconfig".to_string(),
            spec.kubeconfig.display().to_string(),
            "--health-addr".to_string(),
            health_addr.to_string(),
            "--metrics-addr".to_string(),
            metrics_addr.to_string(),
        ];
        args.extend(spec.extra_args.iter().cloned());
        let mut env = vec![
            ("RUST_LOG".to_string(), DEFAULT_RUST_LOG.to_string()),
            // Logs go to a file that people read in failure reports: no colour codes.
            ("NO_COLOR".to_string(), "1".to_string()),
        ];
        env.extend(spec.env.iter().cloned());
        let (program, args) = with_private_mounts(&spec.binary, args, &spec.private_mounts)?;
        let cgroup = match spec.memory_limit {
            Some(limit) => Some(MemoryCgroup::create(&format!("provisioner-{}", spec.node_name), limit)?),
            None => None,
        };
        let process = ProcessSpec {
            name: format!("provisioner-{}", spec.node_name),
            program,
            args,
            env,
            clean_env: true,
            log_path: log_dir.join(format!("provisioner-{}.log", spec.node_name)),
            cgroup_procs: cgroup.as_ref().map(MemoryCgroup::procs_file),
        };
        let child = ManagedChild::spawn(&process)?;
        Ok(Provisioner { last_pid: child.pid(), spec, process, health_addr, metrics_addr, child: Some(child), cgroup })
    }

    /// SIGKILL (a crash, as far as the provisioner can tell) and reap.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        self.child.take().and_then(|mut child| child.kill())
    }

    /// SIGTERM, wait up to 10 s (then SIGKILL); returns the exit status, e.g. to check that a
    /// graceful shutdown exits 0.
    pub fn terminate(&mut self) -> Option<ExitStatus> {
        self.child.take().and_then(|mut child| child.terminate(TERMINATE_GRACE))
    }

    /// Stops the process if it runs (SIGTERM), then starts it again with the same flags and
    /// addresses; its log continues in the same file.
    pub fn restart(&mut self) -> Result<()> {
        self.terminate();
        let child = ManagedChild::spawn(&self.process)?;
        self.last_pid = child.pid();
        self.child = Some(child);
        Ok(())
    }

    /// Stops the process (SIGTERM) and starts `binary` in its place with the same flags,
    /// addresses and log: a node upgraded (or rolled back) in place.
    pub fn restart_as(&mut self, binary: &Path) -> Result<()> {
        anyhow::ensure!(self.spec.private_mounts.is_empty(), "restart_as: a node with private mounts runs a wrapper");
        self.terminate();
        self.spec.binary = binary.to_path_buf();
        self.process.program = binary.to_path_buf();
        let child = ManagedChild::spawn(&self.process)?;
        self.last_pid = child.pid();
        self.child = Some(child);
        Ok(())
    }

    /// `Some(status)` once the process has exited on its own; `None` while it runs.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut().and_then(ManagedChild::exit_status)
    }

    /// Running: started, not stopped by the test, not exited.
    pub fn is_running(&mut self) -> bool {
        self.child.is_some() && self.exit_status().is_none()
    }

    /// Polls `/readyz` on the health address until it answers 200; fails at once if the process
    /// exits, with its log tail.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if !self.is_running() {
                let status = self.exit_status();
                bail!(
                    "provisioner for {} is not running ({status:?}); last log lines:\n{}",
                    self.spec.node_name,
                    self.log_tail(30)
                );
            }
            let last = match crate::http_get(self.health_addr, "/readyz").await {
                Ok((200, _)) => return Ok(()),
                Ok((status, body)) => format!("{status}: {body}"),
                Err(err) => format!("{err:#}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "provisioner for {} not ready after {timeout:?} (last /readyz: {last}); \
                     last log lines:\n{}",
                    self.spec.node_name,
                    self.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The memory cgroup the process runs in, when it has a limit.
    pub fn memory_cgroup(&self) -> Option<&MemoryCgroup> {
        self.cgroup.as_ref()
    }

    /// The Prometheus text exposition from `/metrics`.
    pub async fn metrics(&self) -> Result<String> {
        match crate::http_get(self.metrics_addr, "/metrics").await? {
            (200, body) => Ok(body),
            (status, body) => bail!("GET /metrics answered {status}: {body}"),
        }
    }

    pub fn health_addr(&self) -> SocketAddr {
        self.health_addr
    }

    pub fn metrics_addr(&self) -> SocketAddr {
        self.metrics_addr
    }

    /// PID of the current process, or of the last one if it has been stopped.
    pub fn pid(&self) -> u32 {
        self.last_pid
    }

    pub fn node_name(&self) -> &str {
        &self.spec.node_name
    }

    pub fn spec(&self) -> &ProvisionerSpec {
        &self.spec
    }

    pub fn log_path(&self) -> &Path {
        &self.process.log_path
    }

    /// The last `lines` lines of this provisioner's log (all its runs).
    pub fn log_tail(&self, lines: usize) -> String {
        tail_file(&self.process.log_path, lines)
    }
}

/// Wraps the command in `unshare --mount` and a shell that makes the bind mounts, then `exec`s
/// the provisioner (same PID, so stopping it by PID works as for a plain start).
fn with_private_mounts(
    binary: &Path,
    args: Vec<String>,
    mounts: &[(PathBuf, PathBuf)],
) -> Result<(PathBuf, Vec<String>)> {
    if mounts.is_empty() {
        return Ok((binary.to_owned(), args));
    }
    let quote = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', "'\\''"));
    let mut script = String::from("set -e; ");
    for (source, target) in mounts {
        std::fs::create_dir_all(source)?;
        std::fs::create_dir_all(target)?;
        script.push_str(&format!("mount --bind {} {}; ", quote(source), quote(target)));
    }
    script.push_str("exec \"$@\"");
    let mut wrapped = vec![
        "--mount".to_string(),
        "--propagation".to_string(),
        "private".to_string(),
        "sh".to_string(),
        "-c".to_string(),
        script,
        "sh".to_string(),
        binary.display().to_string(),
    ];
    wrapped.extend(args);
    Ok((PathBuf::from("unshare"), wrapped))
}

impl Drop for Provisioner {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "testbed: test panicked; {} log ({}):\n{}",
                self.process.name,
                self.process.log_path.display(),
                self.log_tail(60)
            );
        }
        self.kill();
    }
}

//! A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager
//! (PV controllers only) and kube-scheduler, in a fresh temp dir with fresh ports.
//!
//! Recipe and reasons: `docs/testing.md`.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::kubeconfig::Connection;
use crate::pki::{Pki, random_hex};
use crate::process::{ManagedChild, ProcessSpec, TempDir, free_port, tail_file};
use crate::report::LogsOnFailure;

/// Knobs for [`ControlPlane::start_with`]; `Options::default()` suits functional tests.
#[derive(Clone, Debug)]
pub struct Options {
    /// kube-controller-manager client rate (`--kube-api-qps` / `--kube-api-burst`).
    pub controller_manager_qps: u32,
    pub controller_manager_burst: u32,
    /// kube-scheduler client rate (`clientConnection.qps` / `burst`).
    pub scheduler_qps: u32,
    pub scheduler_burst: u32,
    /// How often the PV binder re-syncs everything (`--pvclaimbinder-sync-period`).
    pub pv_resync_period: Duration,
    /// VolumeBinding `bindTimeoutSeconds`: how long the scheduler waits in PreBind for a
    /// provisioner before it gives up on a node.
    pub volume_bind_timeout: Duration,
    /// How long start-up may take, from the first process to a working API.
    pub ready_timeout: Duration,
    /// Appended to kube-apiserver's command line (later flags win).
    pub extra_apiserver_args: Vec<String>,
    /// Appended to kube-controller-manager's command line.
    pub extra_controller_manager_args: Vec<String>,
    /// Appended to etcd's command line (e.g. a larger `--quota-backend-bytes` for big loads).
    pub extra_etcd_args: Vec<String>,
    /// Set for a cluster whose nodes run real kubelets (see [`RealNodeAccess`]); `None` keeps
    /// the API-objects-only control plane every other test uses.
    pub real_nodes: Option<RealNodeAccess>,
}

/// What a control plane needs so that real kubelets and real pods can use it.
///
/// Pods reach the API server as `https://10.0.0.1:443` (the `kubernetes` Service), which the
/// real-node lane forwards to the bridge gateway with one DNAT rule in place of kube-proxy, so
/// the API server listens on all addresses and its certificate names both IPs. Pods get
/// ServiceAccount tokens (admission plugin on, `kube-root-ca.crt` published), kubelets get
/// identities the Node authorizer knows, and the controllers that DaemonSets, namespaces and
/// garbage collection need run as well. Reasons: `docs/testing.md`.
#[derive(Clone, Debug, Default)]
pub struct RealNodeAccess {
    /// Extra IP SANs on the serving certificate (the Service IP and the bridge gateway).
    pub serving_ips: Vec<std::net::IpAddr>,
    /// Node names that get a kubelet token (`system:node:<name>` in `system:nodes`).
    pub kubelets: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            // High enough that the binder and scheduler are never what a test or a benchmark
            // measures; client-go's defaults (20/30) are not.
            controller_manager_qps: 200,
            controller_manager_burst: 400,
            scheduler_qps: 200,
            scheduler_burst: 400,
            pv_resync_period: Duration::from_secs(2),
            volume_bind_timeout: Duration::from_secs(60),
            ready_timeout: Duration::from_secs(120),
            extra_apiserver_args: Vec::new(),
            extra_controller_manager_args: Vec::new(),
            extra_etcd_args: Vec::new(),
            real_nodes: None,
        }
    }
}

/// Ports, chosen afresh for every start attempt.
#[derive(Clone, Copy, Debug)]
struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    apiserver: u16,
    controller_manager: u16,
    scheduler: u16,
}

impl Ports {
    fn pick() -> Result<Ports> {
        Ok(Ports {
            etcd_client: free_port()?,
            etcd_peer: free_port()?,
            apiserver: free_port()?,
            controller_manager: free_port()?,
            scheduler: free_port()?,
        })
    }
}

/// One process of the control plane: how to start it and, while it runs, its handle.
#[derive(Debug)]
struct Component {
    spec: ProcessSpec,
    child: Option<ManagedChild>,
}

impl Component {
    fn new(spec: ProcessSpec) -> Component {
        Component { spec, child: None }
    }

    fn start(&mut self) -> Result<()> {
        if self.child.is_none() {
            self.child = Some(ManagedChild::spawn(&self.spec)?);
        }
        Ok(())
    }

    /// Errors (with the log tail) when the process has exited; [`PortInUse`] when it exited
    /// because a port was taken between choosing and binding it.
    fn ensure_running(&mut self) -> Result<()> {
        let Some(child) = self.child.as_mut() else {
            bail!("{} is not started", self.spec.name);
        };
        let Some(status) = child.exit_status() else {
            return Ok(());
        };
        let tail = tail_file(&self.spec.log_path, 30);
        let err = anyhow!("{} exited with {status} during start-up; last log lines:\n{tail}", self.spec.name);
        if tail.contains("address already in use") {
            return Err(err.context(PortInUse));
        }
        Err(err)
    }

    fn status_line(&mut self) -> String {
        match self.child.as_mut() {
            None => "stopped".to_string(),
            Some(child) => match child.exit_status() {
                None => format!("running, pid {}", child.pid()),
                Some(status) => format!("exited: {status}"),
            },
        }
    }
}

/// Marker for "retry the start with other ports".
#[derive(Debug)]
struct PortInUse;

impl std::fmt::Display for PortInUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a port was taken by another process before it was bound")
    }
}

/// A running control plane. Dropping it stops every process it started and removes its files.
pub struct ControlPlane {
    // Field order matters for Drop: processes are stopped in `Drop::drop`, the directory
    // (last field) is removed afterwards.
    etcd: Component,
    apiserver: Component,
    controller_manager: Component,
    scheduler: Component,
    ports: Ports,
    admin: Connection,
    kubeconfig_path: PathBuf,
    /// Bearer tokens of the kubelets named in [`RealNodeAccess::kubelets`], by node name.
    kubelet_tokens: Vec<(String, String)>,
    ca_cert_file: PathBuf,
    options: Options,
    started_in: Duration,
    bin_dir: PathBuf,
    dir: TempDir,
}

/// How long a component may take to exit on SIGTERM at teardown before it is SIGKILLed.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// The same for the deliberate outages of outage tests, where waiting buys nothing.
const OUTAGE_STOP_GRACE: Duration = Duration::from_secs(3);
const START_ATTEMPTS: usize = 3;

impl ControlPlane {
    /// Starts a control plane with [`Options::default`].
    pub async fn start() -> Result<ControlPlane> {
        Self::start_with(Options::default()).await
    }

    /// Builds missing binaries, then starts etcd, kube-apiserver, kube-controller-manager and
    /// kube-scheduler on free ports and waits until the API answers `/readyz`, the `default`
    /// namespace exists and both controllers report healthy.
    pub async fn start_with(options: Options) -> Result<ControlPlane> {
        let started = Instant::now();
        let bin_dir = crate::binaries::locate_or_build()?;
        let mut last_error = None;
        for attempt in 1..=START_ATTEMPTS {
            let mut cp = Self::prepare(&bin_dir, &options)?;
            match cp.boot().await {
                Ok(()) => {
                    cp.started_in = started.elapsed();
                    return Ok(cp);
                }
                Err(err) if err.downcast_ref::<PortInUse>().is_some() => {
                    // Dropping `cp` stops what did start and removes its directory.
                    eprintln!("testbed: start attempt {attempt} lost a port race; retrying");
                    last_error = Some(err);
                }
                Err(err) => {
                    let tails = cp.log_tails(40);
                    return Err(err.context(format!("control plane did not start; component logs:\n{tails}")));
                }
            }
        }
        Err(last_error
            .unwrap_or_else(|| anyhow!("no start attempt made"))
            .context(format!("control plane did not start in {START_ATTEMPTS} attempts")))
    }

    /// Directory, certificates, tokens, ports and command lines of one start attempt.
    fn prepare(bin_dir: &Path, options: &Options) -> Result<ControlPlane> {
        let dir = TempDir::new("cp")?;
        let real_nodes = options.real_nodes.clone().unwrap_or_default();
        let pki = Pki::generate(&dir.path().join("pki"), &real_nodes.serving_ips)?;
        let admin_token = random_hex(24)?;
        let token_file = dir.path().join("tokens.csv");
        // token,user,uid,group: system:masters bypasses RBAC.
        let mut tokens = format!("{admin_token},admin,admin-uid,system:masters\n");
        let mut kubelet_tokens = Vec::new();
        for node in &real_nodes.kubelets {
            // The Node authorizer recognises kubelets by exactly this user name and group.
            let token = random_hex(24)?;
            let _ = writeln!(tokens, "{token},system:node:{node},kubelet-{node},system:nodes");
            kubelet_tokens.push((node.clone(), token));
        }
        fs::write(&token_file, tokens)?;
        let layout = Layout {
            bin_dir,
            minor: crate::binaries::minor_version(bin_dir)?,
            dir: dir.path(),
            pki: &pki,
            token_file: &token_file,
            options,
            ports: Ports::pick()?,
        };
        let admin = Connection {
            url: format!("https://127.0.0.1:{}", layout.ports.apiserver),
            ca_pem: pki.ca_pem.clone(),
            ca_der: pki.ca_der.clone(),
            token: admin_token,
        };
        let kubeconfig_path = dir.path().join("admin.kubeconfig");
        admin.write_kubeconfig(&kubeconfig_path)?;
        let scheduler_config = layout.write_scheduler_config(&kubeconfig_path)?;
        Ok(ControlPlane {
            etcd: Component::new(layout.etcd()),
            apiserver: Component::new(layout.apiserver()),
            controller_manager: Component::new(layout.controller_manager(&kubeconfig_path)),
            scheduler: Component::new(layout.scheduler(&scheduler_config)),
            ports: layout.ports,
            admin,
            kubeconfig_path,
            kubelet_tokens,
            ca_cert_file: pki.ca_cert_file.clone(),
            options: options.clone(),
            started_in: Duration::ZERO,
            bin_dir: bin_dir.to_path_buf(),
            dir,
        })
    }

    async fn boot(&mut self) -> Result<()> {
        let ports = self.ports;
        let deadline = Instant::now() + self.options.ready_timeout;
        self.start_etcd_and_wait(deadline).await?;
        self.start_apiserver_and_wait(deadline).await?;
        let client = self.admin.client()?;
        let namespaces: Api<Namespace> = Api::all(client);
        wait_while_running(&mut self.apiserver, "the default namespace", deadline, || {
            let namespaces = namespaces.clone();
            async move { Ok(namespaces.get_opt("default").await?.is_some()) }
        })
        .await?;

        self.controller_manager.start()?;
        self.scheduler.start()?;
        let probe = |port: u16, path: &'static str| {
            // Both serve our certificate (signed by our CA) on their secure port; health paths
            // are always allowed, so no credentials are needed.
            let connection =
                Connection { url: format!("https://127.0.0.1:{port}"), token: String::new(), ..self.admin.clone() };
            move || {
                let connection = connection.clone();
                async move { get_ok(&connection.client()?, path).await }
            }
        };
        let controller_manager_healthy = probe(ports.controller_manager, "/healthz");
        // kube-scheduler's /readyz (its informers synced) is newer than 1.25 (the oldest-Kubernetes
        // lane), which answers 404 there and serves only /healthz.
        let scheduler_ready = {
            let connection = Connection {
                url: format!("https://127.0.0.1:{}", ports.scheduler),
                token: String::new(),
                ..self.admin.clone()
            };
            move || {
                let connection = connection.clone();
                async move {
                    let client = connection.client()?;
                    match get_ok(&client, "/readyz").await {
                        Err(err) if is_not_found(&err) => get_ok(&client, "/healthz").await,
                        other => other,
                    }
                }
            }
        };
        wait_while_running(
            &mut self.controller_manager,
            "kube-controller-manager /healthz",
            deadline,
            controller_manager_healthy,
        )
        .await?;
        wait_while_running(&mut self.scheduler, "kube-scheduler /readyz", deadline, scheduler_ready).await?;
        Ok(())
    }

    async fn start_etcd_and_wait(&mut self, deadline: Instant) -> Result<()> {
        self.etcd.start()?;
        let client_addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.ports.etcd_client));
        wait_while_running(&mut self.etcd, "etcd /health", deadline, || async move {
            let (status, body) = crate::http_get(client_addr, "/health").await?;
            Ok(status == 200 && body.contains("\"health\":\"true\""))
        })
        .await
    }

    async fn start_apiserver_and_wait(&mut self, deadline: Instant) -> Result<()> {
        self.apiserver.start()?;
        let client = self.admin.client()?;
        wait_while_running(&mut self.apiserver, "kube-apiserver /readyz", deadline, || {
            let client = client.clone();
            async move { get_ok(&client, "/readyz").await }
        })
        .await
    }

    /// A new admin client (`system:masters`) for the calling tokio runtime.
    pub fn admin_client(&self) -> Client {
        self.admin.client().expect("a client for the testbed's own URL and CA can always be built")
    }

    /// A new client that authenticates with `token` (e.g. from a TokenRequest).
    pub fn client_for_token(&self, token: &str) -> Result<Client> {
        self.admin.with_token(token).client()
    }

    /// The connection a kubelet registered as `node` uses, if [`RealNodeAccess::kubelets`]
    /// named it.
    pub fn kubelet_connection(&self, node: &str) -> Option<Connection> {
        let (_, token) = self.kubelet_tokens.iter().find(|(name, _)| name == node)?;
        Some(self.admin.with_token(token))
    }

    /// PEM file of the CA that signed the API server's certificate.
    pub fn ca_cert_file(&self) -> &Path {
        &self.ca_cert_file
    }

    /// The API server's port (it listens on every address when started for real nodes).
    pub fn apiserver_port(&self) -> u16 {
        self.ports.apiserver
    }

    /// URL, CA and admin token, for building clients in any runtime.
    pub fn connection(&self) -> &Connection {
        &self.admin
    }

    /// Admin kubeconfig, for provisioner processes and for poking around by hand.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// Writes a kubeconfig that authenticates with `token` (e.g. a ServiceAccount's).
    pub fn write_kubeconfig_for_token(&self, token: &str, path: &Path) -> Result<()> {
        self.admin.with_token(token).write_kubeconfig(path)
    }

    /// The directory holding logs, certificates, etcd data and kubeconfigs.
    pub fn temp_dir(&self) -> &Path {
        self.dir.path()
    }

    /// How long [`ControlPlane::start_with`] took, binary lookup included.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The kubectl built with the control plane (same version), for rendering and applying
    /// manifests; pass it `--kubeconfig` [`ControlPlane::kubeconfig_path`].
    pub fn kubectl(&self) -> PathBuf {
        self.bin_dir.join("kubectl")
    }

    /// Runs the bundled kubectl as the admin (`args` plus `--kubeconfig`) in `dir`, and returns
    /// its stdout; a non-zero exit is an error carrying its stderr.
    pub fn run_kubectl(&self, dir: &Path, args: &[&str]) -> Result<String> {
        let output = std::process::Command::new(self.kubectl())
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig_path)
            .arg("--cache-dir")
            .arg(self.dir.path().join("kubectl-cache"))
            .current_dir(dir)
            .output()
            .context("running kubectl")?;
        if !output.status.success() {
            bail!("kubectl {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Creates a Node the scheduler will place pods on (see [`crate::fixtures::node`]).
    pub async fn add_node(&self, name: &str, hostname: &str) -> Result<()> {
        self.add_node_labeled(name, hostname, &[]).await
    }

    /// [`ControlPlane::add_node`] with extra labels, e.g. a per-test group that the test's pods
    /// select with [`crate::fixtures::PodBuilder::node_selector`], so that on the shared control
    /// plane they never land on another test's nodes.
    pub async fn add_node_labeled(&self, name: &str, hostname: &str, labels: &[(&str, &str)]) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.admin_client());
        let mut node = crate::fixtures::node(name, hostname);
        let node_labels = node.metadata.labels.get_or_insert_with(Default::default);
        for (key, value) in labels {
            node_labels.insert(key.to_string(), value.to_string());
        }
        nodes.create(&PostParams::default(), &node).await.with_context(|| format!("creating node {name}"))?;
        // Status on create is kept today, but only the status subresource is a promise.
        let status = json!({ "status": node.status });
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .with_context(|| format!("setting the status of node {name}"))?;
        Ok(())
    }

    /// PIDs of the running components, by name (e.g. to check that they are gone after drop).
    pub fn pids(&self) -> Vec<(&str, u32)> {
        self.components().into_iter().filter_map(|c| Some((c.spec.name.as_str(), c.child.as_ref()?.pid()))).collect()
    }

    /// Stops kube-apiserver: SIGTERM, then SIGKILL after 3 s. It closes its listener at once
    /// but would hold open watches for up to its request timeout (60 s), which is why the
    /// grace is short; clients see connection refused either way.
    pub fn stop_apiserver(&mut self) {
        stop(&mut self.apiserver, OUTAGE_STOP_GRACE);
    }

    /// Crashes kube-apiserver (SIGKILL): open connections are reset, not drained.
    pub fn kill_apiserver(&mut self) {
        if let Some(mut child) = self.apiserver.child.take() {
            child.kill();
        }
    }

    /// Starts kube-apiserver again on the same port and etcd; waits for `/readyz`.
    pub async fn start_apiserver(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.options.ready_timeout;
        self.start_apiserver_and_wait(deadline).await
    }

    /// Stops kube-controller-manager (SIGTERM, SIGKILL after 3 s): nothing binds claims or
    /// annotates them afterwards, and nothing removes their protection finalizer. For loads the
    /// bench builds and never deletes, e.g. many pending claims it would otherwise churn on.
    pub fn stop_controller_manager(&mut self) {
        stop(&mut self.controller_manager, OUTAGE_STOP_GRACE);
    }

    /// Stops etcd (SIGTERM, SIGKILL after 3 s); the API server then fails its requests.
    pub fn stop_etcd(&mut self) {
        stop(&mut self.etcd, OUTAGE_STOP_GRACE);
    }

    /// Starts etcd again on the same ports and data dir; waits for its `/health`.
    pub async fn start_etcd(&mut self) -> Result<()> {
        let deadline = Instant::now() + self.options.ready_timeout;
        self.start_etcd_and_wait(deadline).await
    }

    /// Log files of every component, by component name.
    pub fn log_paths(&self) -> Vec<(&str, &Path)> {
        self.components().into_iter().map(|c| (c.spec.name.as_str(), c.spec.log_path.as_path())).collect()
    }

    /// The last `lines` lines of each component's log, for failure reports.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for component in self.components() {
            let _ = writeln!(
                out,
                "===== {} ({}) =====\n{}",
                component.spec.name,
                component.spec.log_path.display(),
                tail_file(&component.spec.log_path, lines)
            );
        }
        out
    }

    /// A guard that prints every component's log tail to stderr unless the test calls
    /// [`LogsOnFailure::passed`]; for tests on the shared control plane, which is never dropped,
    /// and for failures returned as `Err`, which `Drop` cannot see.
    pub fn logs_on_failure(&self) -> LogsOnFailure {
        LogsOnFailure::new(
            self.log_paths().into_iter().map(|(name, path)| (name.to_string(), path.to_path_buf())).collect(),
        )
    }

    fn components(&self) -> [&Component; 4] {
        [&self.etcd, &self.apiserver, &self.controller_manager, &self.scheduler]
    }

    fn components_mut(&mut self) -> [&mut Component; 4] {
        [&mut self.etcd, &mut self.apiserver, &mut self.controller_manager, &mut self.scheduler]
    }

    /// SIGTERM to everything, etcd last so the others do not spend their shutdown retrying it.
    fn stop_all(&mut self) {
        let deadline = Instant::now() + STOP_GRACE;
        let mut clients = [&mut self.scheduler, &mut self.controller_manager, &mut self.apiserver];
        for component in clients.iter_mut() {
            if let Some(child) = component.child.as_mut() {
                child.signal(libc::SIGTERM);
            }
        }
        for component in clients.iter_mut() {
            if let Some(mut child) = component.child.take() {
                child.wait_or_kill(deadline);
            }
        }
        stop(&mut self.etcd, STOP_GRACE);
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let states: Vec<String> = self
                .components_mut()
                .into_iter()
                .map(|c| {
                    let state = c.status_line();
                    format!("{}: {state}", c.spec.name)
                })
                .collect();
            eprintln!("testbed: test panicked; control plane ({}) logs:\n{}", states.join(", "), self.log_tails(40));
        }
        self.stop_all();
    }
}

fn stop(component: &mut Component, grace: Duration) {
    if let Some(mut child) = component.child.take() {
        child.terminate(grace);
    }
}

/// Polls `probe` until it returns `Ok(true)`, failing at once if `component` exits and with the
/// last probe error at `deadline`.
async fn wait_while_running<F, Fut>(
    component: &mut Component,
    what: &str,
    deadline: Instant,
    mut probe: F,
) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool>>,
{
    loop {
        component.ensure_running()?;
        let last = match tokio::time::timeout(Duration::from_secs(10), probe()).await {
            Ok(Ok(true)) => return Ok(()),
            Ok(Ok(false)) => "not ready yet".to_string(),
            Ok(Err(err)) => format!("{err:#}"),
            Err(_) => "probe timed out after 10 s".to_string(),
        };
        if Instant::now() >= deadline {
            bail!("timed out waiting for {what}; last probe: {last}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn is_not_found(err: &anyhow::Error) -> bool {
    matches!(err.downcast_ref::<kube::Error>(), Some(kube::Error::Api(status)) if status.code == 404)
}

/// `GET path` answered 2xx.
async fn get_ok(client: &Client, path: &str) -> Result<bool> {
    let request = http::Request::get(path).body(Vec::new())?;
    client.request_text(request).await?;
    Ok(true)
}

/// A controller's name before 1.28 (`kube-controller-manager --controllers`), from its name now.
fn old_controller_name(name: &str) -> &str {
    match name {
        "persistentvolume-binder-controller" => "persistentvolume-binder",
        "persistentvolume-expander-controller" => "persistentvolume-expander",
        "persistentvolume-protection-controller" => "pv-protection",
        "persistentvolumeclaim-protection-controller" => "pvc-protection",
        "root-ca-certificate-publisher-controller" => "root-ca-cert-publisher",
        "garbage-collector-controller" => "garbagecollector",
        "endpoints-controller" => "endpoint",
        other => other.strip_suffix("-controller").unwrap_or(other),
    }
}

/// Command lines and files of one start attempt.
struct Layout<'a> {
    bin_dir: &'a Path,
    /// kube-apiserver's minor version (the other components are built with it).
    minor: u32,
    dir: &'a Path,
    pki: &'a Pki,
    token_file: &'a Path,
    options: &'a Options,
    ports: Ports,
}

impl Layout<'_> {
    fn spec(&self, name: &str, args: Vec<String>) -> ProcessSpec {
        ProcessSpec {
            name: name.to_string(),
            program: self.bin_dir.join(name),
            args,
            env: Vec::new(),
            clean_env: false,
            log_path: self.dir.join(format!("{name}.log")),
            cgroup_procs: None,
        }
    }

    fn etcd_data_dir(&self) -> PathBuf {
        self.dir.join("etcd-data")
    }

    fn etcd(&self) -> ProcessSpec {
        let client = format!("http://127.0.0.1:{}", self.ports.etcd_client);
        let peer = format!("http://127.0.0.1:{}", self.ports.etcd_peer);
        self.spec(
            "etcd",
            vec![
                "--name=default".into(),
                format!("--data-dir={}", self.etcd_data_dir().display()),
                format!("--listen-client-urls={client}"),
                format!("--advertise-client-urls={client}"),
                format!("--listen-peer-urls={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                format!("--initial-cluster=default={peer}"),
                // Test data is thrown away; fsync would make every write wait for the disk.
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ]
            .into_iter()
            .chain(self.options.extra_etcd_args.iter().cloned())
            .collect(),
        )
    }

    fn apiserver(&self) -> ProcessSpec {
        let pki = self.pki;
        let issuer = "https://kubernetes.default.svc";
        let real_nodes = self.options.real_nodes.is_some();
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{}", self.ports.etcd_client),
            // Both are required on a machine without a default route. Real pods dial the
            // bridge gateway (through the DNAT rule), hence every address for them.
            format!("--bind-address={}", if real_nodes { "0.0.0.0" } else { "127.0.0.1" }),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={}", self.ports.apiserver),
            format!("--tls-cert-file={}", pki.serving_cert_file.display()),
            format!("--tls-private-key-file={}", pki.serving_key_file.display()),
            format!("--client-ca-file={}", pki.ca_cert_file.display()),
            // How it proves itself to kubelets for nodes/proxy (the lane's kubelets trust the CA).
            format!("--kubelet-client-certificate={}", pki.kubelet_client_cert_file.display()),
            format!("--kubelet-client-key={}", pki.kubelet_client_key_file.display()),
            // Node names do not resolve here; the lane's kubelets report their --node-ip.
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            // Never written to (we pass certificates), but its default lies outside the temp dir.
            format!("--cert-dir={}", self.dir.join("apiserver-certs").display()),
            format!("--token-auth-file={}", self.token_file.display()),
            // Node: kubelets may read the secrets, claims and volumes of their own pods only.
            format!("--authorization-mode={}", if real_nodes { "Node,RBAC" } else { "RBAC" }),
            // TokenRequest needs all four, so tests can act as the DaemonSet's ServiceAccount.
            format!("--service-account-issuer={issuer}"),
            format!("--api-audiences={issuer}"),
            format!("--service-account-key-file={}", pki.sa_public_key_file.display()),
            format!("--service-account-signing-key-file={}", pki.sa_signing_key_file.display()),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            // No kubelets, no endpoints to maintain for the `kubernetes` Service.
            "--endpoint-reconciler-type=none".into(),
            // ServiceAccount would require a `default` SA (nobody creates it without the
            // serviceaccount controller, which only real nodes need, as their pods get tokens);
            // TaintNodesByCondition would taint our nodes not-ready for good (no
            // node-lifecycle controller to lift it).
            if real_nodes {
                "--disable-admission-plugins=TaintNodesByCondition".into()
            } else {
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition".into()
            },
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ];
        if real_nodes {
            // No kube-proxy runs here: an admission webhook's Service (the kubevirt operator's)
            // is reached at its pod's address, which the host routes to, not its cluster IP.
            args.push("--enable-aggregator-routing=true".into());
        }
        args.extend(self.options.extra_apiserver_args.iter().cloned());
        self.spec("kube-apiserver", args)
    }

    fn controller_manager(&self, kubeconfig: &Path) -> ProcessSpec {
        // The PV controllers only. Without the two protection controllers claims and PVs
        // never finish deleting (their finalizers are never removed).
        let mut controllers = vec![
            "persistentvolume-binder-controller",
            "persistentvolume-expander-controller",
            "persistentvolume-protection-controller",
            "persistentvolumeclaim-protection-controller",
        ];
        if self.options.real_nodes.is_some() {
            // Real pods and `kubectl apply -k`: DaemonSets, each namespace's `default`
            // ServiceAccount and `kube-root-ca.crt` (projected token volumes need both),
            // namespace deletion (`kubectl delete -k` hangs without it), owner references, the
            // claims of pods' ephemeral volumes (the Helm chart's test pod has one), and the
            // peers Service's EndpointSlices (the provisioners' liveness).
            controllers.extend([
                "daemonset-controller",
                "serviceaccount-controller",
                "root-ca-certificate-publisher-controller",
                "namespace-controller",
                "garbage-collector-controller",
                "ephemeral-volume-controller",
                "endpointslice-controller",
            ]);
            controllers.extend(["deployment-controller", "replicaset-controller"]); // the operator's pool mounters
            // A StatefulSet that comes back on another node when its node leaves, with a new
            // claim the controller makes for its pending pod.
            controllers.push("statefulset-controller");
            // The Endpoints of a webhook's Service, which the API server dials (below).
            controllers.push("endpoints-controller");
            // The kubevirt operator's cleanup Jobs, which it waits for before it lets a
            // resource with a pool on a claim go.
            controllers.push("job-controller");
        }
        let controllers: Vec<&str> = if self.minor >= 28 {
            controllers
        } else {
            // Before 1.28 the controllers had only their old names (1.28 made these aliases).
            controllers.into_iter().map(old_controller_name).collect()
        };
        let controllers = controllers.join(",");
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".into(),
            format!("--controllers={controllers}"),
            format!("--pvclaimbinder-sync-period={}s", self.options.pv_resync_period.as_secs().max(1)),
            format!("--kube-api-qps={}", self.options.controller_manager_qps),
            format!("--kube-api-burst={}", self.options.controller_manager_burst),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", self.ports.controller_manager),
            format!("--tls-cert-file={}", self.pki.serving_cert_file.display()),
            format!("--tls-private-key-file={}", self.pki.serving_key_file.display()),
            "--profiling=false".into(),
        ];
        if self.options.real_nodes.is_some() {
            args.push(format!("--root-ca-file={}", self.pki.ca_cert_file.display()));
        }
        args.extend(self.options.extra_controller_manager_args.iter().cloned());
        self.spec("kube-controller-manager", args)
    }

    fn write_scheduler_config(&self, kubeconfig: &Path) -> Result<PathBuf> {
        let config = json!({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {
                "kubeconfig": kubeconfig,
                "qps": self.options.scheduler_qps,
                "burst": self.options.scheduler_burst,
            },
            "leaderElection": { "leaderElect": false },
            "profiles": [{
                "schedulerName": "default-scheduler",
                "pluginConfig": [{
                    "name": "VolumeBinding",
                    "args": {
                        "apiVersion": "kubescheduler.config.k8s.io/v1",
                        "kind": "VolumeBindingArgs",
                        "bindTimeoutSeconds": self.options.volume_bind_timeout.as_secs().max(1),
                    },
                }],
            }],
        });
        let path = self.dir.join("scheduler-config.json");
        fs::write(&path, serde_json::to_string_pretty(&config)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    fn scheduler(&self, config: &Path) -> ProcessSpec {
        self.spec(
            "kube-scheduler",
            vec![
                format!("--config={}", config.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", self.ports.scheduler),
                format!("--tls-cert-file={}", self.pki.serving_cert_file.display()),
                format!("--tls-private-key-file={}", self.pki.serving_key_file.display()),
            ],
        )
    }
}

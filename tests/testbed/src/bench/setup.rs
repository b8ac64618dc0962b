//! The bench's cluster: a control plane with an audit log of the provisioners' requests, and N
//! nodes whose provisioners each run as a ServiceAccount of their own under the deploy RBAC.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use testbed::{ControlPlane, Options, Provisioner, ProvisionerSpec, SimNode, fixtures};

use super::api_count::{AuditLog, BenchCalls, audit_policy};
use super::args::Args;
use super::observe::Observer;
use super::peer::{PEER_SA_NAMESPACE, Peer, Side};
use super::reference::{REFERENCE_CLASS, REFERENCE_PROVISIONER};

pub const PROVISIONER: &str = "kubevirt.io/hostpath-provisioner";
/// Namespace of the provisioners' ServiceAccounts (`node-1`, ...).
pub const SA_NAMESPACE: &str = "hpp-bench";
/// ClusterRole, and Role in [`DEPLOY_NAMESPACE`] (node leases), from deploy/legacy/rbac.yaml.
const CLUSTER_ROLE: &str = "kubevirt-hostpath-provisioner";
/// The deploy namespace (deploy/legacy/namespace.yaml), the provisioners' POD_NAMESPACE.
const DEPLOY_NAMESPACE: &str = "kubevirt-hostpath-provisioner";
/// The peers Service of deploy/legacy/peers-service.yaml: the provisioners' liveness comes from
/// the readiness the bench mirrors into its EndpointSlice, as on a cluster.
const PEER_SERVICE: &str = "hostpath-provisioner-peers";
/// How often the bench probes each provisioner's readiness: the shipped readiness probe's period.
const PROBE_PERIOD: Duration = Duration::from_secs(5);
pub const IMMEDIATE_CLASS: &str = "bench-immediate";
pub const WFFC_CLASS: &str = "bench-wffc";

/// Everything a scenario needs. Field order is drop order: watches, provisioners, control plane,
/// and the scratch directory (audit policy and log) last.
pub struct Env {
    pub observer: Observer,
    pub nodes: Vec<SimNode>,
    /// With `--peer`: the Go build, run on the same nodes in turn with ours (`peer.rs`).
    pub peer: Option<Peer>,
    /// Which of the two serves the nodes now.
    pub side: Side,
    pub cp: ControlPlane,
    pub client: Client,
    pub audit: AuditLog,
    pub calls: Arc<BenchCalls>,
    pub args: Args,
    /// Reference instant for rates.
    pub epoch: std::time::Instant,
    /// Held for its `Drop`: removes the audit policy and log.
    pub _scratch: Scratch,
}

/// A directory removed on drop.
pub struct Scratch(pub PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Env {
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// A fresh client per concurrent creator.
    pub fn clients(&self) -> Vec<Client> {
        (0..self.args.clients).map(|_| self.cp.admin_client()).collect()
    }

    /// Audit user name of a node's provisioner.
    pub fn user_of(node: &str) -> String {
        format!("system:serviceaccount:{SA_NAMESPACE}:{node}")
    }
}

/// Control plane, RBAC, nodes and provisioners, classes, the bench's watches.
pub async fn start(args: &Args) -> Result<Env> {
    let scratch =
        Scratch(std::env::temp_dir().join(testbed::unique_name(&format!("hpp-bench-{}", std::process::id()))));
    std::fs::create_dir_all(&scratch.0).with_context(|| format!("creating {}", scratch.0.display()))?;
    let policy = scratch.0.join("audit-policy.json");
    let audit_path = scratch.0.join("audit.log");
    // Ours and, with --peer, the Go build's accounts (`peer.rs`): one runs at a time.
    let groups = [service_account_group(SA_NAMESPACE), service_account_group(PEER_SA_NAMESPACE)];
    std::fs::write(&policy, serde_json::to_string_pretty(&audit_policy(&groups))?)?;
    let options = Options {
        // Never the bottleneck: the binder and the scheduler get far more than client-go's 20/30.
        controller_manager_qps: 2000,
        controller_manager_burst: 4000,
        scheduler_qps: 2000,
        scheduler_burst: 4000,
        // Binding is event driven; a short resync only adds background load with many claims.
        pv_resync_period: Duration::from_secs(15),
        volume_bind_timeout: Duration::from_secs(600),
        extra_apiserver_args: vec![
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_path.display()),
            "--audit-log-format=json".into(),
            "--audit-log-mode=blocking".into(),
            "--audit-log-maxsize=0".into(),
            "--max-requests-inflight=1000".into(),
            "--max-mutating-requests-inflight=500".into(),
        ],
        // The memory scenario's 100,000 claims and their revisions outgrow etcd's default 2 GiB.
        extra_etcd_args: vec![format!("--quota-backend-bytes={}", 8u64 << 30)],
        ..Options::default()
    };
    let cp = ControlPlane::start_with(options).await?;
    eprintln!("bench: control plane up in {:.1} s ({})", cp.started_in().as_secs_f64(), cp.temp_dir().display());
    let client = cp.admin_client();
    // The Role and RoleBinding of rbac.yaml live in the deploy namespace.
    cp.run_kubectl(Path::new("."), &["apply", "-f", &repo_file("deploy/legacy/namespace.yaml").display().to_string()])?;
    cp.run_kubectl(Path::new("."), &["apply", "-f", &repo_file("deploy/legacy/rbac.yaml").display().to_string()])?;
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace(SA_NAMESPACE)).await?;

    bind_service_accounts(&client).await?;
    let mut nodes = Vec::new();
    for i in 1..=args.nodes {
        nodes.push(add_node(&cp, &client, args, &node_name(i)).await?);
    }
    eprintln!("bench: {} provisioners ready", nodes.len());
    let peer = match &args.peer {
        Some(binary) => {
            Some(Peer::prepare(&cp, &client, binary, &nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>()).await?)
        }
        None => None,
    };

    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(client.clone());
    for class in [
        fixtures::storage_class(IMMEDIATE_CLASS, PROVISIONER).immediate().build(),
        fixtures::storage_class(WFFC_CLASS, PROVISIONER).build(),
        fixtures::storage_class(REFERENCE_CLASS, REFERENCE_PROVISIONER).immediate().reclaim_policy("Retain").build(),
    ] {
        classes.create(&PostParams::default(), &class).await?;
    }
    let observer = Observer::start(&client).await?;
    let audit = AuditLog::new(&audit_path);
    audit.mark()?;
    let epoch = std::time::Instant::now();
    Ok(Env {
        observer,
        nodes,
        peer,
        side: Side::Ours,
        cp,
        client,
        audit,
        calls: Arc::default(),
        args: args.clone(),
        epoch,
        _scratch: scratch,
    })
}

/// A file of this repository, whatever the working directory.
pub fn repo_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

/// Name of the `i`th node (from 1).
pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

/// A node and its provisioner, running as ServiceAccount `name` (bound to the deploy ClusterRole
/// through its group, see [`bind_service_accounts`]); waits until the provisioner is ready.
pub async fn add_node(cp: &ControlPlane, client: &Client, args: &Args, name: &str) -> Result<SimNode> {
    add_node_within(cp, client, args, name, testbed::PROVISIONER_READY_TIMEOUT).await
}

/// [`add_node`], waiting up to `ready_timeout` for the provisioner to be ready (it is ready once
/// its watches have listed, which takes longer with many objects in the cluster).
pub async fn add_node_within(
    cp: &ControlPlane,
    client: &Client,
    args: &Args,
    name: &str,
    ready_timeout: Duration,
) -> Result<SimNode> {
    let kubeconfig = cp.temp_dir().join(format!("{name}.kubeconfig"));
    cp.write_kubeconfig_for_token(&account_token(client, SA_NAMESPACE, name).await?, &kubeconfig)?;
    let spec = provisioner_spec(cp, args, name);
    cp.add_node_labeled(name, name, &[]).await?;
    std::fs::create_dir_all(&spec.pool_root).with_context(|| format!("creating {}", spec.pool_root.display()))?;
    let pool_root = spec.pool_root.clone();
    let mut provisioner = Provisioner::spawn(spec, cp.temp_dir())?;
    provisioner.wait_ready(ready_timeout).await?;
    readiness(client).add(name, provisioner.health_addr());
    let node = SimNode { name: name.to_string(), hostname: name.to_string(), pool_root, provisioner };
    raise_pod_capacity(client, name, args.claims * 2 + 100).await?;
    Ok(node)
}

/// Plays the kubelet's readiness probe and the EndpointSlice controller for every provisioner the
/// bench starts, for the life of the bench.
static MIRROR: std::sync::OnceLock<testbed::ReadinessMirror> = std::sync::OnceLock::new();

fn readiness(client: &Client) -> &'static testbed::ReadinessMirror {
    MIRROR.get_or_init(|| {
        testbed::ReadinessMirror::start_with_period(client.clone(), DEPLOY_NAMESPACE, PEER_SERVICE, PROBE_PERIOD)
    })
}

/// How the provisioner of node `name` is run (its kubeconfig written by [`add_node_within`]).
fn provisioner_spec(cp: &ControlPlane, args: &Args, name: &str) -> ProvisionerSpec {
    let kubeconfig = cp.temp_dir().join(format!("{name}.kubeconfig"));
    let mut spec = ProvisionerSpec::new(&args.provisioner, name, testbed::pool_root_for(cp, name), &kubeconfig)
        .env("RUST_LOG", &args.rust_log)
        .env("POD_NAMESPACE", DEPLOY_NAMESPACE)
        .env("PEER_SERVICE", PEER_SERVICE);
    for (key, value) in &args.provisioner_env {
        spec = spec.env(key, value);
    }
    if let Some(limit) = args.memory_limit {
        spec = spec.memory_limit(limit);
    }
    spec
}

/// OOM kills so far in the memory cgroups of the provisioners running now.
pub fn oom_kills(nodes: &[SimNode]) -> u64 {
    nodes.iter().filter_map(|node| node.provisioner.memory_cgroup()).map(|cgroup| cgroup.oom_kills().unwrap_or(0)).sum()
}

/// Starts a new provisioner process for `node` (its previous one stopped), on fresh health
/// and metrics ports: with a thousand processes' connections open, the old ports may have been
/// taken as ephemeral ports meanwhile, so `Provisioner::restart` (same ports) cannot be used.
/// Does not wait for it to be ready.
pub fn respawn(cp: &ControlPlane, args: &Args, node: &mut SimNode) -> Result<()> {
    node.provisioner.terminate();
    node.provisioner = Provisioner::spawn(provisioner_spec(cp, args, &node.name), cp.temp_dir())?;
    if let Some(mirror) = MIRROR.get() {
        mirror.add(&node.name, node.provisioner.health_addr());
    }
    Ok(())
}

/// Binds the deploy ClusterRole, and the deploy Role of the node leases, to the group of all
/// ServiceAccounts in [`SA_NAMESPACE`], so a node added later needs only its ServiceAccount.
async fn bind_service_accounts(client: &Client) -> Result<()> {
    let subjects = Some(vec![accounts_of(SA_NAMESPACE)]);
    let metadata = ObjectMeta { name: Some("hpp-bench-provisioners".into()), ..ObjectMeta::default() };
    let binding = ClusterRoleBinding {
        metadata: metadata.clone(),
        role_ref: role_ref("ClusterRole", CLUSTER_ROLE),
        subjects: subjects.clone(),
    };
    Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await?;
    let binding = RoleBinding { metadata, role_ref: role_ref("Role", CLUSTER_ROLE), subjects };
    Api::<RoleBinding>::namespaced(client.clone(), DEPLOY_NAMESPACE).create(&PostParams::default(), &binding).await?;
    Ok(())
}

/// Creates ServiceAccount `namespace/account` and returns a token of it (valid a day).
pub async fn account_token(client: &Client, namespace: &str, account: &str) -> Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let object = ServiceAccount {
        metadata: ObjectMeta { name: Some(account.to_string()), ..ObjectMeta::default() },
        ..ServiceAccount::default()
    };
    accounts.create(&PostParams::default(), &object).await?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(24 * 3600), ..Default::default() }),
        ..Default::default()
    };
    accounts
        .create_token_request(account, &PostParams::default(), &request)
        .await?
        .status
        .and_then(|s| s.token)
        .context("a TokenRequest answer carries the token")
}

/// A reference to the `kind` (ClusterRole or Role) called `name`.
pub fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef { api_group: Some("rbac.authorization.k8s.io".into()), kind: kind.into(), name: name.into() }
}

/// RBAC subject: every ServiceAccount of `namespace` (its group).
pub fn accounts_of(namespace: &str) -> Subject {
    Subject {
        kind: "Group".into(),
        name: service_account_group(namespace),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Subject::default()
    }
}

pub fn service_account_group(namespace: &str) -> String {
    format!("system:serviceaccounts:{namespace}")
}

/// Simulated nodes accept 110 pods; the WaitForFirstConsumer scenario needs more.
async fn raise_pod_capacity(client: &Client, node: &str, pods: usize) -> Result<()> {
    let pods = pods.to_string();
    let patch = serde_json::json!({ "status": { "capacity": { "pods": pods }, "allocatable": { "pods": pods } } });
    Api::<Node>::all(client.clone()).patch_status(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

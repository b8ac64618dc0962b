//! The bench's cluster: a control plane with an audit log of the provisioners' requests, and N
//! nodes whose provisioners each run as a ServiceAccount of their own under the deploy RBAC.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use testbed::{ControlPlane, Options, ProvisionerSpec, SimNode, fixtures};

use super::api_count::{AuditLog, BenchCalls, audit_policy};
use super::args::Args;
use super::observe::Observer;

pub const PROVISIONER: &str = "kubevirt.io/hostpath-provisioner";
/// Namespace of the provisioners' ServiceAccounts (`node-1`, ...).
pub const SA_NAMESPACE: &str = "hpp-bench";
/// ClusterRole from deploy/legacy/rbac.yaml.
const CLUSTER_ROLE: &str = "kubevirt-hostpath-provisioner";
pub const IMMEDIATE_CLASS: &str = "bench-immediate";
pub const WFFC_CLASS: &str = "bench-wffc";

/// Everything a scenario needs. Field order is drop order: watches, provisioners, control plane,
/// and the scratch directory (audit policy and log) last.
pub struct Env {
    pub observer: Observer,
    pub nodes: Vec<SimNode>,
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
    let group = format!("system:serviceaccounts:{SA_NAMESPACE}");
    std::fs::write(&policy, serde_json::to_string_pretty(&audit_policy(&group))?)?;
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
        ..Options::default()
    };
    let cp = ControlPlane::start_with(options).await?;
    eprintln!("bench: control plane up in {:.1} s ({})", cp.started_in().as_secs_f64(), cp.temp_dir().display());
    let client = cp.admin_client();
    // rbac.yaml holds a Role and RoleBinding (node leases) in the deploy's namespace.
    let deploy_namespace = fixtures::namespace("kubevirt-hostpath-provisioner");
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &deploy_namespace).await?;
    cp.run_kubectl(Path::new("."), &["apply", "-f", &repo_file("deploy/legacy/rbac.yaml").display().to_string()])?;
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace(SA_NAMESPACE)).await?;

    let names: Vec<String> = (1..=args.nodes).map(|i| format!("node-{i}")).collect();
    bind_service_accounts(&client, &names).await?;
    let mut nodes = Vec::new();
    for name in &names {
        let kubeconfig = cp.temp_dir().join(format!("{name}.kubeconfig"));
        cp.write_kubeconfig_for_token(&token_for(&client, name).await?, &kubeconfig)?;
        let mut spec = ProvisionerSpec::new(&args.provisioner, name, testbed::pool_root_for(&cp, name), &kubeconfig)
            .env("RUST_LOG", &args.rust_log);
        for (key, value) in &args.provisioner_env {
            spec = spec.env(key, value);
        }
        nodes.push(SimNode::start_with(&cp, name, &[], spec).await?);
        raise_pod_capacity(&client, name, args.claims * 2 + 100).await?;
    }
    eprintln!("bench: {} provisioners ready", nodes.len());

    let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(client.clone());
    for class in [
        fixtures::storage_class(IMMEDIATE_CLASS, PROVISIONER).immediate().build(),
        fixtures::storage_class(WFFC_CLASS, PROVISIONER).build(),
    ] {
        classes.create(&PostParams::default(), &class).await?;
    }
    let observer = Observer::start(&client).await?;
    let audit = AuditLog::new(&audit_path);
    audit.mark()?;
    let epoch = std::time::Instant::now();
    Ok(Env { observer, nodes, cp, client, audit, calls: Arc::default(), args: args.clone(), epoch, _scratch: scratch })
}

/// A file of this repository, whatever the working directory.
pub fn repo_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative)
}

/// One ServiceAccount per node, all bound to the deploy ClusterRole.
async fn bind_service_accounts(client: &Client, nodes: &[String]) -> Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), SA_NAMESPACE);
    for node in nodes {
        let account = ServiceAccount {
            metadata: ObjectMeta { name: Some(node.clone()), ..ObjectMeta::default() },
            ..ServiceAccount::default()
        };
        accounts.create(&PostParams::default(), &account).await?;
    }
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta { name: Some("hpp-bench-provisioners".into()), ..ObjectMeta::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: CLUSTER_ROLE.into(),
        },
        subjects: Some(
            nodes
                .iter()
                .map(|node| Subject {
                    kind: "ServiceAccount".into(),
                    name: node.clone(),
                    namespace: Some(SA_NAMESPACE.into()),
                    ..Subject::default()
                })
                .collect(),
        ),
    };
    Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await?;
    Ok(())
}

async fn token_for(client: &Client, account: &str) -> Result<String> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), SA_NAMESPACE);
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

/// Simulated nodes accept 110 pods; the WaitForFirstConsumer scenario needs more.
async fn raise_pod_capacity(client: &Client, node: &str, pods: usize) -> Result<()> {
    let pods = pods.to_string();
    let patch = serde_json::json!({ "status": { "capacity": { "pods": pods }, "allocatable": { "pods": pods } } });
    Api::<Node>::all(client.clone()).patch_status(node, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

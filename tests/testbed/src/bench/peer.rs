//! The provisioner under test: ours (the `--provisioner` processes of `setup.rs`) or, with
//! `--peer PATH`, the Go build this project replaces, on the same nodes, one side at a time.
//!
//! The Go processes (`testbed::GoPeer`) run as ServiceAccounts of their own namespace
//! ([`PEER_SA_NAMESPACE`], so the audit log tells them apart and counts them alike), bound to
//! the ClusterRole of the Go build's own deploy file (`src/deploy/kubevirt-hostpath-provisioner.yaml`
//! of hack/build-go-legacy.sh's cache, next to the binary) under a name of the bench's, since
//! ours has the same name. Each node gets a pool root of its own for the Go build.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};
use testbed::{ControlPlane, GoPeer, GoPeerSpec, PROVISIONER_READY_TIMEOUT, fixtures};

use super::setup::{Env, account_token, accounts_of, role_ref};

/// Namespace of the Go processes' ServiceAccounts (`node-1`, ...).
pub const PEER_SA_NAMESPACE: &str = "hpp-bench-go";
/// The Go deploy file's ClusterRole, renamed (ours is also `kubevirt-hostpath-provisioner`).
const PEER_CLUSTER_ROLE: &str = "hpp-bench-go-legacy";
/// Where hack/build-go-legacy.sh's cache keeps the Go deploy file, from the binary's directory.
const PEER_DEPLOY_FILE: &str = "src/deploy/kubevirt-hostpath-provisioner.yaml";

/// Which provisioner serves the nodes now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Ours,
    Peer,
}

impl Side {
    pub fn label(self) -> &'static str {
        match self {
            Side::Ours => "ours",
            Side::Peer => "Go",
        }
    }
}

/// The Go build's accounts and, while it is the side under test, its processes.
pub struct Peer {
    binary: PathBuf,
    /// (node, token of its ServiceAccount, pool root).
    accounts: Vec<(String, String, PathBuf)>,
    running: Vec<GoPeer>,
    /// Every log file its processes wrote (a node's runs append to one).
    logs: std::collections::BTreeSet<PathBuf>,
}

impl Peer {
    /// The Go build's RBAC, as its deploy file has it, and an account per node.
    pub async fn prepare(cp: &ControlPlane, client: &Client, binary: &Path, nodes: &[String]) -> Result<Peer> {
        let deploy = binary.parent().unwrap_or(Path::new(".")).join(PEER_DEPLOY_FILE);
        let role = cluster_role(&std::fs::read_to_string(&deploy).with_context(|| {
            format!("reading {} (--peer wants the binary of hack/build-go-legacy.sh's cache)", deploy.display())
        })?)?;
        let file = cp.temp_dir().join("go-peer-rbac.yaml");
        std::fs::write(&file, role)?;
        cp.run_kubectl(Path::new("."), &["apply", "-f", &file.display().to_string()])?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &fixtures::namespace(PEER_SA_NAMESPACE))
            .await?;
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta { name: Some(PEER_CLUSTER_ROLE.into()), ..ObjectMeta::default() },
            role_ref: role_ref("ClusterRole", PEER_CLUSTER_ROLE),
            subjects: Some(vec![accounts_of(PEER_SA_NAMESPACE)]),
        };
        Api::<ClusterRoleBinding>::all(client.clone()).create(&PostParams::default(), &binding).await?;
        let mut accounts = Vec::new();
        for node in nodes {
            let token = account_token(client, PEER_SA_NAMESPACE, node).await?;
            accounts.push((node.clone(), token, cp.temp_dir().join("go-peers").join(node).join("pool")));
        }
        Ok(Peer { binary: binary.to_owned(), accounts, running: Vec::new(), logs: Default::default() })
    }

    /// Starts a Go process per node and waits until each has started its controller.
    async fn start(&mut self, cp: &ControlPlane) -> Result<()> {
        for (node, token, pool_root) in &self.accounts {
            let spec = GoPeerSpec {
                binary: self.binary.clone(),
                node_name: node.clone(),
                pool_root: pool_root.clone(),
                token: token.clone(),
                namespace: PEER_SA_NAMESPACE.into(),
                naming_prefix: false,
            };
            let process = GoPeer::spawn(cp, spec)?;
            self.logs.insert(process.log_path().to_owned());
            self.running.push(process);
        }
        for process in &mut self.running {
            process.wait_ready(PROVISIONER_READY_TIMEOUT).await?;
        }
        Ok(())
    }

    /// Adds an account for each of `nodes` that has none yet (the scale curve adds nodes as
    /// it grows).
    pub async fn add_accounts(&mut self, cp: &ControlPlane, client: &Client, nodes: &[String]) -> Result<()> {
        for node in nodes {
            if self.accounts.iter().any(|(n, _, _)| n == node) {
                continue;
            }
            let token = account_token(client, PEER_SA_NAMESPACE, node).await?;
            self.accounts.push((node.clone(), token, cp.temp_dir().join("go-peers").join(node).join("pool")));
        }
        Ok(())
    }

    /// Starts a Go process per account and waits until each is ready (`start`), for the scale
    /// curve's Go measurement (`fanout.rs`).
    pub async fn start_all(&mut self, cp: &ControlPlane) -> Result<()> {
        self.start(cp).await
    }

    /// Stops every Go process (SIGTERM).
    pub fn stop_all(&mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.running.iter_mut().for_each(GoPeer::terminate);
        self.running.clear();
    }

    pub fn log_paths(&self) -> Vec<PathBuf> {
        self.logs.iter().cloned().collect()
    }
}

/// The ClusterRole document of the Go deploy file, renamed to [`PEER_CLUSTER_ROLE`], its
/// `rbac.authorization.k8s.io/v1beta1` (not served since Kubernetes 1.22) made `v1`; its rules
/// as they are.
fn cluster_role(deploy_file: &str) -> Result<String> {
    let role = deploy_file
        .split("\n---")
        // A top-level `kind:` (a ClusterRoleBinding's roleRef has an indented one).
        .find(|doc| doc.lines().any(|l| l.trim_end() == "kind: ClusterRole"))
        .context("the Go deploy file has no ClusterRole")?;
    let mut role = role.to_string();
    for (from, to) in [
        ("apiVersion: rbac.authorization.k8s.io/v1beta1", "apiVersion: rbac.authorization.k8s.io/v1"),
        ("name: kubevirt-hostpath-provisioner", &format!("name: {PEER_CLUSTER_ROLE}")),
    ] {
        ensure!(role.contains(from), "the Go deploy file's ClusterRole no longer has {from:?}");
        role = role.replace(from, to);
    }
    Ok(role)
}

impl Env {
    /// Makes `side` the provisioner serving the nodes: stops the other side's processes
    /// (SIGTERM), then starts `side`'s and waits until they are ready. Both never run at once.
    pub async fn switch_to(&mut self, side: Side) -> Result<()> {
        if self.side == side {
            return Ok(());
        }
        match side {
            Side::Peer => {
                self.nodes.iter_mut().for_each(|n| {
                    n.provisioner.terminate();
                });
                self.peer.as_mut().context("no --peer given")?.start(&self.cp).await?;
            }
            Side::Ours => {
                if let Some(peer) = &mut self.peer {
                    peer.stop();
                }
                for node in &mut self.nodes {
                    node.provisioner.restart()?;
                }
                for node in &mut self.nodes {
                    node.provisioner.wait_ready(PROVISIONER_READY_TIMEOUT).await?;
                }
            }
        }
        self.side = side;
        // Both sides' informers have listed; let their first requests settle out of the figures.
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    }

    /// PIDs of the processes of the side under test, in node order.
    pub fn provisioner_pids(&self) -> Vec<u32> {
        match (self.side, &self.peer) {
            (Side::Peer, Some(peer)) => peer.running.iter().map(GoPeer::pid).collect(),
            _ => self.nodes.iter().map(|n| n.provisioner.pid()).collect(),
        }
    }

    /// Pool roots of the side under test, in node order.
    pub fn pool_roots(&self) -> Vec<PathBuf> {
        match (self.side, &self.peer) {
            (Side::Peer, Some(peer)) => peer.accounts.iter().map(|(_, _, root)| root.clone()).collect(),
            _ => self.nodes.iter().map(|n| n.pool_root.clone()).collect(),
        }
    }

    /// The last log lines of the side under test's first processes (for a failure report).
    pub fn log_tails(&self, processes: usize, lines: usize) -> Vec<(String, String)> {
        match (self.side, &self.peer) {
            (Side::Peer, Some(peer)) => peer
                .running
                .iter()
                .take(processes)
                .map(|p| (format!("Go {}", p.node_name()), p.log_tail(lines)))
                .collect(),
            _ => self.nodes.iter().take(processes).map(|n| (n.name.clone(), n.provisioner.log_tail(lines))).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_go_cluster_role_is_renamed_and_served_as_v1() {
        let deploy = "kind: Namespace\n---\nkind: ClusterRoleBinding\nroleRef:\n  kind: ClusterRole\n---\nkind: ClusterRole\napiVersion: rbac.authorization.k8s.io/v1beta1\n\
                      metadata:\n  name: kubevirt-hostpath-provisioner\nrules: []\n---\nkind: ServiceAccount\n";
        let role = super::cluster_role(deploy).unwrap();
        assert!(role.contains("apiVersion: rbac.authorization.k8s.io/v1\n"));
        assert!(role.contains("name: hpp-bench-go-legacy"));
        assert!(!role.contains("ServiceAccount") && !role.contains("Namespace") && !role.contains("Binding"));
        assert!(super::cluster_role("kind: ClusterRole\napiVersion: v1\n").is_err());
    }
}

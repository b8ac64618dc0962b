//! Real pods for real-node tests: run a shell script in busybox with claims mounted, on a
//! given node, as a given user, and read back its exit code, its output and the files it left.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{
    Container, Namespace, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod,
    PodSecurityContext, PodSpec, ServiceAccount, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};

use super::images::BUSYBOX_IMAGE;
use super::{LANE_TIMEOUT, Lane};

/// A busybox pod that runs `script` with `sh -c` (restartPolicy Never).
#[derive(Clone, Debug)]
pub struct PodRun {
    pub namespace: String,
    pub name: String,
    pub script: String,
    /// Claims and where they are mounted.
    pub claims: Vec<(String, String)>,
    /// Containers run before the main one, each as (uid, script).
    pub init: Vec<(i64, String)>,
    /// `runAsUser` (and `runAsGroup`) of the main container; `None` runs as root.
    pub uid: Option<i64>,
    pub gid: Option<i64>,
    /// Node name to pin the pod to (`spec.nodeName` is left to the scheduler, so that
    /// WaitForFirstConsumer claims follow it: this sets a `kubernetes.io/hostname` selector).
    pub node: Option<String>,
    /// Return once the pod runs instead of waiting for it to finish.
    pub keep_running: bool,
    /// The pod's `fsGroup`: the kubelet gives the volumes that support it this group.
    pub fs_group: Option<i64>,
}

impl PodRun {
    /// A pod `name` in `namespace` running `script`.
    pub fn new(namespace: &str, name: &str, script: &str) -> PodRun {
        PodRun {
            namespace: namespace.into(),
            name: name.into(),
            script: script.into(),
            claims: Vec::new(),
            init: Vec::new(),
            uid: None,
            gid: None,
            node: None,
            keep_running: false,
            fs_group: None,
        }
    }
    /// Mounts `claim` at `/data` (the first claim) or `/data<N>`.
    pub fn claim(mut self, claim: &str) -> Self {
        let path = if self.claims.is_empty() { "/data".to_string() } else { format!("/data{}", self.claims.len()) };
        self.claims.push((claim.into(), path));
        self
    }
    pub fn as_user(mut self, uid: i64, gid: i64) -> Self {
        self.uid = Some(uid);
        self.gid = Some(gid);
        self
    }
    pub fn init_as(mut self, uid: i64, script: &str) -> Self {
        self.init.push((uid, script.into()));
        self
    }
    pub fn on_node(mut self, node: &str) -> Self {
        self.node = Some(node.into());
        self
    }
    pub fn keep_running(mut self) -> Self {
        self.keep_running = true;
        self
    }
    pub fn fs_group(mut self, gid: i64) -> Self {
        self.fs_group = Some(gid);
        self
    }

    /// The pod object.
    pub fn build(&self) -> Pod {
        let mounts: Vec<VolumeMount> = self
            .claims
            .iter()
            .enumerate()
            .map(|(i, (_, path))| VolumeMount {
                name: format!("claim-{i}"),
                mount_path: path.clone(),
                ..VolumeMount::default()
            })
            .collect();
        let container = |name: &str, uid: Option<i64>, gid: Option<i64>, script: &str| Container {
            name: name.into(),
            image: Some(BUSYBOX_IMAGE.into()),
            image_pull_policy: Some("Never".into()),
            command: Some(vec!["/bin/sh".into(), "-c".into(), script.into()]),
            volume_mounts: Some(mounts.clone()),
            security_context: Some(k8s_openapi::api::core::v1::SecurityContext {
                run_as_user: uid,
                run_as_group: gid.or(uid),
                ..Default::default()
            }),
            ..Container::default()
        };
        let init: Vec<Container> = self
            .init
            .iter()
            .enumerate()
            .map(|(i, (uid, script))| container(&format!("init-{i}"), Some(*uid), Some(*uid), script))
            .collect();
        Pod {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers: vec![container("main", self.uid, self.gid, &self.script)],
                init_containers: (!init.is_empty()).then_some(init),
                restart_policy: Some("Never".into()),
                automount_service_account_token: Some(false),
                termination_grace_period_seconds: Some(1),
                security_context: Some(PodSecurityContext { fs_group: self.fs_group, ..PodSecurityContext::default() }),
                node_selector: self
                    .node
                    .as_ref()
                    .map(|n| [(crate::fixtures::HOSTNAME_LABEL.to_string(), n.clone())].into_iter().collect()),
                volumes: Some(
                    self.claims
                        .iter()
                        .enumerate()
                        .map(|(i, (claim, _))| Volume {
                            name: format!("claim-{i}"),
                            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                                claim_name: claim.clone(),
                                read_only: None,
                            }),
                            ..Volume::default()
                        })
                        .collect(),
                ),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }
}

/// How a [`PodRun`] ended (or, with `keep_running`, that it runs).
#[derive(Clone, Debug)]
pub struct PodOutcome {
    pub pod: Pod,
    /// The main container's exit code, once it terminated.
    pub exit_code: Option<i32>,
    /// What the main container wrote to stdout and stderr.
    pub logs: String,
}

impl Lane {
    /// Creates namespace `name` and waits for its `default` ServiceAccount (pods are refused
    /// without it) and `kube-root-ca.crt`.
    pub async fn create_namespace(&self, name: &str) -> Result<()> {
        let client = self.client();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &crate::fixtures::namespace(name))
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        let accounts: Api<ServiceAccount> = Api::namespaced(client, name);
        crate::wait_for(&format!("ServiceAccount {name}/default"), LANE_TIMEOUT, || async {
            anyhow::Ok(accounts.get_opt("default").await?.map(|_| ()))
        })
        .await
    }

    /// Creates the pod and waits until it finished (or runs, with `keep_running`).
    pub async fn run_pod(&self, run: &PodRun) -> Result<PodOutcome> {
        let pods: Api<Pod> = Api::namespaced(self.client(), &run.namespace);
        pods.create(&PostParams::default(), &run.build())
            .await
            .with_context(|| format!("creating pod {}/{}", run.namespace, run.name))?;
        self.wait_pod(run).await
    }

    async fn wait_pod(&self, run: &PodRun) -> Result<PodOutcome> {
        let pods: Api<Pod> = Api::namespaced(self.client(), &run.namespace);
        let pod = crate::wait_until(
            &format!("pod {}/{} {}", run.namespace, run.name, if run.keep_running { "running" } else { "finished" }),
            LANE_TIMEOUT,
            || pods.get(&run.name),
            |pod: &Pod| {
                let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
                matches!(phase, "Succeeded" | "Failed") || (run.keep_running && phase == "Running")
            },
        )
        .await
        .map_err(|err| err.context(self.log_tails(30)))?;
        let exit_code = pod
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.iter().find(|c| c.name == "main"))
            .and_then(|c| c.state.as_ref()?.terminated.as_ref())
            .map(|t| t.exit_code);
        let logs = self.container_logs(&pod, "main");
        Ok(PodOutcome { pod, exit_code, logs })
    }

    /// What `container` of `pod` wrote, read from the kubelet's log files on the host (CRI
    /// format: timestamp, stream, tag, then the text).
    pub fn container_logs(&self, pod: &Pod, container: &str) -> String {
        let (Some(ns), Some(name), Some(uid)) =
            (pod.metadata.namespace.as_deref(), pod.metadata.name.as_deref(), pod.metadata.uid.as_deref())
        else {
            return String::new();
        };
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        let dir = self.layout_of(node).pod_logs().join(format!("{ns}_{name}_{uid}")).join(container);
        let mut files: Vec<PathBuf> =
            std::fs::read_dir(&dir).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default();
        files.sort();
        let mut out = String::new();
        for file in files {
            for line in std::fs::read_to_string(&file).unwrap_or_default().lines() {
                let text = line.splitn(4, ' ').nth(3).unwrap_or_default();
                out.push_str(text);
                out.push('\n');
            }
        }
        out
    }

    /// Deletes a pod and waits until it is gone (the kubelet stopped it and unmounted its
    /// volumes).
    pub async fn delete_pod(&self, namespace: &str, name: &str) -> Result<()> {
        let pods: Api<Pod> = Api::namespaced(self.client(), namespace);
        let params = DeleteParams { grace_period_seconds: Some(1), ..DeleteParams::default() };
        match pods.delete(name, &params).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => return Ok(()),
            Err(err) => return Err(err.into()),
        }
        crate::wait_for(&format!("pod {namespace}/{name} gone"), LANE_TIMEOUT, || async {
            anyhow::Ok(pods.get_opt(name).await?.is_none().then_some(()))
        })
        .await
    }

    /// The host directory of the PV bound to `claim` (its `hostPath.path` or `local.path`).
    pub async fn volume_dir(&self, namespace: &str, claim: &str) -> Result<PathBuf> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client(), namespace);
        let pv_name = claims
            .get(claim)
            .await?
            .spec
            .and_then(|s| s.volume_name)
            .with_context(|| format!("claim {namespace}/{claim} is not bound"))?;
        let pv = Api::<PersistentVolume>::all(self.client()).get(&pv_name).await?;
        let spec = pv.spec.unwrap_or_default();
        let Some(path) = spec.host_path.map(|h| h.path).or(spec.local.map(|l| l.path)) else {
            bail!("PV {pv_name} has neither hostPath nor local");
        };
        Ok(PathBuf::from(path))
    }
}

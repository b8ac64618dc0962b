//! Memory with many claims that are not this node's (`--memory-claims`, issue 13 point 4).
//!
//! The cluster is filled with claims that are not the measured node's, in the proportions of a
//! cluster at rest: half of another provisioner's class, a quarter of our WaitForFirstConsumer
//! class with `selected-node` naming another node, a quarter of ours bound on other nodes
//! (`spec.volumeName` and `pv.kubernetes.io/bind-completed`, as the PV controller leaves them),
//! except one in 400 claims of our Immediate class pinned by `kubevirt.io/provisionOnNode` to a
//! node where no provisioner runs. Those last ones every node keeps by design: they wait for a
//! node without a provisioner, which one node explains on each claim and counts in a metric. Each carries the
//! metadata Helm and Argo CD write: the `app.kubernetes.io/*` and `helm.sh/chart` labels, the
//! `meta.helm.sh/release-*` annotations, a `kubectl.kubernetes.io/last-applied-configuration`
//! of 1-2 KiB, and managedFields of two field managers, written by the API server itself: the
//! claim is created by a server-side apply of manager `helm`, then changed by an apply of
//! manager `argocd-controller`.
//!
//! Then a fresh provisioner (node `node-memory`) starts and lists them all; its RSS (VmRSS) and
//! peak (VmHWM) are read from /proc after its watches synced, after it provisioned 100 claims
//! of its own (our WaitForFirstConsumer class, `selected-node` = it), and after 1,000; the
//! difference between the last two, divided by 900, is the cost of one own volume. The bench
//! binds each own claim to its PV as the PV controller would, so the node keeps what it keeps of
//! a volume in a cluster at rest: its PV, not its claim.
//!
//! kube-controller-manager is stopped before the fill: it would annotate and retry every
//! pending claim, and nothing here needs it (the provisioner acts on `selected-node` alone). The
//! other provisioners are stopped too, as they would each decode every claim. The claims are
//! never deleted (without the controller manager nothing removes their protection finalizer),
//! which is why this scenario runs last.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};
use testbed::fixtures;
use testbed::fixtures::annotations::{BIND_COMPLETED, SELECTED_NODE};

use super::api_count::BenchCalls;
use super::procfs::{self, ProcSample, mib};
use super::report::Table;
use super::setup::{self, Env, IMMEDIATE_CLASS, WFFC_CLASS};

/// The goal of issue 13 point 4, MiB.
pub const GOAL_MIB: f64 = 20.0;
/// Issue 21: RSS per own volume, KiB.
pub const PER_OWN_GOAL_KIB: f64 = 4.0;
/// Claims of the measured node, first and second measurement.
pub const OWN: usize = 100;
pub const OWN_LARGE: usize = 1000;
/// Own volumes the node holds at its second restart: the cost per volume held is the slope
/// between the two restarts, free of what any start costs once (code first run, tables).
pub const OWN_DOUBLE: usize = 2 * OWN_LARGE;
/// What every claim of the fill requests (the own ones are bound at this size).
const OWN_SIZE: &str = "8Gi";
/// The measured node.
const NODE: &str = "node-memory";
/// Nodes without a provisioner that the others' claims name.
const ELSEWHERE_NODES: usize = 50;
/// Namespaces the other claims are spread over (one per team, say).
const NAMESPACES: usize = 20;
const OWN_NAMESPACE: &str = "bench-m-own";
/// A class of another provisioner (a cloud CSI driver, say).
const OTHER_CLASS: &str = "bench-other-csi";
const OTHER_PROVISIONER: &str = "ebs.csi.example.com";
/// Concurrent requests while filling (spread over `--clients` clients).
const FILL_REQUESTS_IN_FLIGHT: usize = 16;
const HELM: &str = "helm";
const ARGO: &str = "argocd-controller";
/// Everything to list and provision is waited for this long at most.
const READY_TIMEOUT: Duration = Duration::from_secs(900);
const PROVISION_TIMEOUT: Duration = Duration::from_secs(300);
/// After each step, before reading /proc: lets the last events and frees land, and the
/// provisioner's check for freed heap to give back (every 10 s, src/serving/heap.rs) run once.
const SETTLE: Duration = Duration::from_secs(12);

/// Who a claim of the fill belongs to; never the measured node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A class of another provisioner (half of the claims, as in a cluster where the cloud's
    /// driver holds most volumes).
    OtherProvisioner,
    /// Our WaitForFirstConsumer class, scheduled to another node.
    OursSelectedElsewhere,
    /// Our Immediate class, pinned to another node where no provisioner runs (a stranded claim).
    OursPinnedElsewhere,
    /// Our WaitForFirstConsumer class, bound on another node.
    OursBoundElsewhere,
    /// Our WaitForFirstConsumer class, scheduled to the measured node.
    Own,
}

/// The kind of the `i`th claim of the fill.
pub fn kind_of(i: usize) -> Kind {
    match i % 4 {
        0 | 1 => Kind::OtherProvisioner,
        2 => Kind::OursSelectedElsewhere,
        _ if i % 400 == 3 => Kind::OursPinnedElsewhere,
        _ => Kind::OursBoundElsewhere,
    }
}

/// What the scenario measured.
pub struct Memory {
    /// Claims that are not the measured node's.
    pub others: usize,
    pub fill_time: Duration,
    pub fill_errors: usize,
    pub first_fill_error: Option<String>,
    /// JSON bytes of one claim's metadata, its managedFields (and how many managers), and its
    /// last-applied-configuration annotation.
    pub metadata_bytes: usize,
    pub managed_fields_bytes: usize,
    pub managers: usize,
    pub last_applied_bytes: usize,
    /// From the start of the measured provisioner to its /readyz (its watches listed).
    pub ready_after: Duration,
    pub after_list: ProcSample,
    pub after_own: ProcSample,
    pub own_provisioned_in: Duration,
    pub after_own_large: ProcSample,
    pub own_large_provisioned_in: Duration,
    /// The measured node started again with its [`OWN_LARGE`] volumes.
    pub after_restart: ProcSample,
    /// Started again once more, holding [`OWN_DOUBLE`] volumes.
    pub after_second_restart: ProcSample,
    /// What was stopped for the scenario, for the report.
    pub stopped: Vec<String>,
}

impl Memory {
    /// Own claims beyond the first measurement, and the RSS each of them added (KiB).
    pub fn per_own_claim_kib(&self) -> f64 {
        per_claim_kib(self.after_own.rss_kib, self.after_own_large.rss_kib, OWN_LARGE - OWN)
    }

    /// What each volume a node holds costs it: the RSS of the node started holding
    /// [`OWN_DOUBLE`] volumes less its RSS started holding [`OWN_LARGE`], per volume. The figure
    /// the goal is judged on. Both readings are of a process that started with volumes, so the
    /// code and tables any start with volumes has once cancel out; the burst's growth
    /// ([`Self::per_own_claim_kib`]) also holds what the burst left behind (tables sized for it,
    /// freed memory between kept objects).
    pub fn per_held_volume_kib(&self) -> f64 {
        per_claim_kib(self.after_restart.rss_kib, self.after_second_restart.rss_kib, OWN_DOUBLE - OWN_LARGE)
    }

    /// The same of anonymous memory (heap) alone.
    pub fn per_held_volume_anon_kib(&self) -> f64 {
        per_claim_kib(self.after_restart.rss_anon_kib, self.after_second_restart.rss_anon_kib, OWN_DOUBLE - OWN_LARGE)
    }

    /// The earlier figure: RSS started holding [`OWN_LARGE`] volumes less RSS after the first list
    /// (holding none), per volume. It also holds what a start with volumes costs once (about
    /// 0.6 MiB of code first run), and the first list's reading moves by a MiB from run to run.
    pub fn per_held_volume_from_none_kib(&self) -> f64 {
        per_claim_kib(self.after_list.rss_kib, self.after_restart.rss_kib, OWN_LARGE)
    }

    /// The same, of anonymous memory (heap) and of pages mapped from the binary.
    pub fn per_own_claim_anon_file_kib(&self) -> (f64, f64) {
        let n = OWN_LARGE - OWN;
        (
            per_claim_kib(self.after_own.rss_anon_kib, self.after_own_large.rss_anon_kib, n),
            per_claim_kib(self.after_own.rss_file_kib, self.after_own_large.rss_file_kib, n),
        )
    }

    /// The figure the goal is judged on: the peak (VmHWM) after the 100 own provisions, which
    /// includes the initial list.
    pub fn judged_mib(&self) -> f64 {
        mib(self.after_own.hwm_kib)
    }

    pub fn claims_in_cluster(&self) -> usize {
        self.others + OWN
    }
}

/// RSS added per claim between two readings; negative when the allocator gave memory back.
pub fn per_claim_kib(before_kib: u64, after_kib: u64, claims: usize) -> f64 {
    (after_kib as f64 - before_kib as f64) / claims.max(1) as f64
}

pub async fn run(env: &mut Env) -> Result<Memory> {
    let total = env.args.memory_claims;
    let others = total.saturating_sub(OWN);
    let mut stopped = Vec::new();
    env.cp.stop_controller_manager();
    stopped.push(format!(
        "kube-controller-manager (stopped before the fill: it would annotate and retry {others} pending claims)"
    ));
    let running = env.nodes.len();
    for node in &mut env.nodes {
        node.provisioner.terminate();
    }
    if running > 0 {
        stopped.push(format!("the provisioners of the other scenarios ({running}; each would decode every claim)"));
    }
    for line in &stopped {
        eprintln!("bench: memory: stopped {line}");
    }
    create_namespaces_and_class(env).await?;

    eprintln!("bench: memory: filling the cluster with {others} claims that are not {NODE}'s");
    let started = Instant::now();
    let (_, errors) = apply_claims(env, 0..others, namespace_of, kind_of).await;
    let fill_time = started.elapsed();
    eprintln!(
        "bench: memory: fill took {:.1} s ({:.0} claims/s, 2 applies each, {} errors)",
        fill_time.as_secs_f64(),
        others as f64 / fill_time.as_secs_f64().max(f64::EPSILON),
        errors.len()
    );
    if others > 0 && errors.len() == others {
        bail!("memory: no claim could be created: {:?}", errors.first());
    }
    let (metadata_bytes, managed_fields_bytes, managers, last_applied_bytes) = metadata_size(env).await?;

    eprintln!("bench: memory: starting {NODE}'s provisioner");
    let started = Instant::now();
    let node = setup::add_node_within(&env.cp, &env.client, &env.args, NODE, READY_TIMEOUT).await?;
    let ready_after = started.elapsed();
    let pid = node.provisioner.pid();
    env.nodes.push(node);
    tokio::time::sleep(SETTLE).await;
    let after_list = procfs::sample(pid)?;
    eprintln!(
        "bench: memory: ready after {:.1} s; RSS {:.1} MiB, peak {:.1} MiB",
        ready_after.as_secs_f64(),
        mib(after_list.rss_kib),
        mib(after_list.hwm_kib)
    );

    let own_provisioned_in = provision_own(env, 0..OWN).await?;
    tokio::time::sleep(SETTLE).await;
    let after_own = procfs::sample(pid)?;
    let own_large_provisioned_in = provision_own(env, OWN..OWN_LARGE).await?;
    tokio::time::sleep(SETTLE).await;
    let after_own_large = procfs::sample(pid)?;
    // What a node pays for the volumes it holds, without what the burst that made them left
    // behind: the same node started again, holding them from its first list.
    eprintln!("bench: memory: restarting {NODE}'s provisioner with its {OWN_LARGE} volumes");
    let after_restart = restart_measured_node(env).await?;
    provision_own(env, OWN_LARGE..OWN_DOUBLE).await?;
    eprintln!("bench: memory: restarting {NODE}'s provisioner with its {OWN_DOUBLE} volumes");
    let after_second_restart = restart_measured_node(env).await?;
    Ok(Memory {
        others,
        fill_time,
        fill_errors: errors.len(),
        first_fill_error: errors.into_iter().next(),
        metadata_bytes,
        managed_fields_bytes,
        managers,
        last_applied_bytes,
        ready_after,
        after_list,
        after_own,
        own_provisioned_in,
        after_own_large,
        own_large_provisioned_in,
        after_restart,
        after_second_restart,
        stopped,
    })
}

/// Starts the measured node's provisioner again and reads its memory once it settled.
async fn restart_measured_node(env: &mut Env) -> Result<ProcSample> {
    let node = env.nodes.last_mut().context("the measured node")?;
    node.provisioner.restart()?;
    node.provisioner.wait_ready(READY_TIMEOUT).await?;
    let pid = node.provisioner.pid();
    tokio::time::sleep(SETTLE).await;
    procfs::sample(pid)
}

fn namespace_of(i: usize) -> String {
    format!("bench-m-{:02}", i % NAMESPACES)
}

async fn create_namespaces_and_class(env: &Env) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    for name in (0..NAMESPACES).map(namespace_of).chain([OWN_NAMESPACE.to_string()]) {
        namespaces.create(&PostParams::default(), &fixtures::namespace(&name)).await?;
        env.calls.add("create", "namespaces");
    }
    let class = fixtures::storage_class(OTHER_CLASS, OTHER_PROVISIONER).build();
    Api::<StorageClass>::all(env.client.clone()).create(&PostParams::default(), &class).await?;
    env.calls.add("create", "storageclasses");
    Ok(())
}

/// Creates claims `range` (two applies each) with [`FILL_REQUESTS_IN_FLIGHT`] requests in
/// flight, printing progress every 5 s; returns the index and uid of each claim created, and
/// the errors.
async fn apply_claims(
    env: &Env,
    range: std::ops::Range<usize>,
    namespace: impl Fn(usize) -> String,
    kind: impl Fn(usize) -> Kind,
) -> (Vec<(usize, String)>, Vec<String>) {
    let count = range.len();
    let first = range.start;
    let jobs: Arc<Vec<(String, usize, Kind)>> = Arc::new(range.map(|i| (namespace(i), i, kind(i))).collect());
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let clients = env.clients();
    let workers: Vec<_> = (0..FILL_REQUESTS_IN_FLIGHT.min(count.max(1)))
        .map(|w| {
            let (client, jobs, next, done, calls) =
                (clients[w % clients.len()].clone(), jobs.clone(), next.clone(), done.clone(), env.calls.clone());
            tokio::spawn(async move {
                let (mut uids, mut errors) = (Vec::new(), Vec::new());
                loop {
                    let j = next.fetch_add(1, Ordering::Relaxed);
                    let Some((namespace, i, kind)) = jobs.get(j) else { break };
                    match apply_claim(&client, &calls, namespace, *i, *kind).await {
                        Ok(uid) => uids.push((*i, uid)),
                        Err(err) => errors.push(format!("claim {i}: {err:#}")),
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                (uids, errors)
            })
        })
        .collect();
    let progress = {
        let done = done.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_secs(10)).await;
                let n = done.load(Ordering::Relaxed);
                let rate = n as f64 / started.elapsed().as_secs_f64();
                eprintln!("bench: memory: {n}/{count} claims from {first} ({rate:.0}/s)");
            }
        })
    };
    let (mut uids, mut errors) = (Vec::new(), Vec::new());
    for worker in workers {
        match worker.await {
            Ok((u, e)) => {
                uids.extend(u);
                errors.extend(e);
            }
            Err(err) => errors.push(format!("worker: {err}")),
        }
    }
    progress.abort();
    (uids, errors)
}

/// Helm's apply (creates the claim), then Argo CD's; returns the claim's uid. Retries each a
/// few times, as a loaded API server may answer 429 or time out.
async fn apply_claim(client: &Client, calls: &BenchCalls, namespace: &str, i: usize, kind: Kind) -> Result<String> {
    let name = claim_name(i);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let mut uid = String::new();
    for (manager, body) in [(HELM, helm_apply(namespace, &name, i, kind)), (ARGO, argo_apply(namespace, &name, i))] {
        let mut attempt = 0;
        let applied = loop {
            attempt += 1;
            calls.add("patch", "persistentvolumeclaims");
            match claims.patch(&name, &PatchParams::apply(manager), &Patch::Apply(&body)).await {
                Ok(claim) => break claim,
                Err(err) if attempt < 4 => {
                    eprintln!("bench: memory: {namespace}/{name} ({manager}): {err}; retrying");
                    tokio::time::sleep(Duration::from_secs(attempt)).await;
                }
                Err(err) => return Err(err).with_context(|| format!("{manager} apply of {namespace}/{name}")),
            }
        };
        uid = applied.metadata.uid.unwrap_or_default();
    }
    Ok(uid)
}

fn claim_name(i: usize) -> String {
    format!("data-claim-{i:06}")
}

/// The release the `i`th claim belongs to: (chart, release, app version), eight claims each.
fn release_of(i: usize) -> (&'static str, String, String) {
    const CHARTS: [&str; 8] = ["postgresql", "redis", "kafka", "elasticsearch", "mongodb", "minio", "rabbitmq", "etcd"];
    let release = release_index(i);
    let chart = CHARTS[release % CHARTS.len()];
    (chart, format!("{chart}-{release}"), format!("{}.{}.{}", 2 + release % 14, release % 10, release % 7))
}

fn release_index(i: usize) -> usize {
    i / 8
}

/// What `helm` applies: the whole claim with its Helm labels and annotations and, as `kubectl`
/// would have left it, the last-applied-configuration of the same manifest. The annotation the
/// scheduler or a user adds to place the claim comes on top.
pub fn helm_apply(namespace: &str, name: &str, i: usize, kind: Kind) -> Value {
    let (chart, release, version) = release_of(i);
    let labels = json!({
        "app.kubernetes.io/name": chart,
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/version": version,
        "app.kubernetes.io/component": "primary",
        "app.kubernetes.io/part-of": format!("{release}-platform"),
        "app.kubernetes.io/managed-by": "Helm",
        "helm.sh/chart": format!("{chart}-{version}"),
        "role": "data",
    });
    let annotations = json!({
        "meta.helm.sh/release-name": release,
        "meta.helm.sh/release-namespace": namespace,
        "helm.sh/resource-policy": "keep",
        "backup.velero.io/backup-volumes": "data",
        "example.com/owner-team": format!("team-{}", release_index(i) % 40),
        "example.com/runbook": format!("https://runbooks.example.com/{chart}/persistent-volumes#restore-{release}"),
        "example.com/cost-center": format!("cc-{:05}", release_index(i) * 7919 % 100_000),
        "description": format!(
            "Primary data volume of the {release} {chart} cluster ({namespace}), installed by Helm and synced by \
             Argo CD; keep it when uninstalling and back it up before any change of size or class."
        ),
    });
    let class = match kind {
        Kind::OtherProvisioner => OTHER_CLASS,
        Kind::OursSelectedElsewhere | Kind::OursBoundElsewhere | Kind::Own => WFFC_CLASS,
        Kind::OursPinnedElsewhere => IMMEDIATE_CLASS,
    };
    let mut manifest = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": { "name": name, "namespace": namespace, "labels": labels, "annotations": annotations },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": { "requests": { "storage": OWN_SIZE } },
            "storageClassName": class,
            "volumeMode": "Filesystem",
        },
    });
    let elsewhere = format!("elsewhere-{}", i % ELSEWHERE_NODES);
    if kind == Kind::OursPinnedElsewhere {
        annotations_of(&mut manifest).insert("kubevirt.io/provisionOnNode".into(), json!(elsewhere));
    }
    let last_applied = manifest.to_string();
    let annotations = annotations_of(&mut manifest);
    annotations.insert("kubectl.kubernetes.io/last-applied-configuration".into(), json!(last_applied));
    match kind {
        Kind::OursSelectedElsewhere => {
            annotations.insert(SELECTED_NODE.into(), json!(elsewhere));
        }
        Kind::Own => {
            annotations.insert(SELECTED_NODE.into(), json!(NODE));
        }
        Kind::OursBoundElsewhere => {
            annotations.insert(SELECTED_NODE.into(), json!(elsewhere));
            annotations.insert("pv.kubernetes.io/bind-completed".into(), json!("yes"));
            manifest["spec"]["volumeName"] = json!(format!("pvc-bound-elsewhere-{i}"));
        }
        Kind::OtherProvisioner | Kind::OursPinnedElsewhere => {}
    }
    manifest
}

/// What `argocd-controller` applies on top: its tracking label and annotations only.
pub fn argo_apply(namespace: &str, name: &str, i: usize) -> Value {
    let (_, release, _) = release_of(i);
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": { "argocd.argoproj.io/instance": format!("{release}-{namespace}") },
            "annotations": {
                "argocd.argoproj.io/tracking-id": format!("{release}-{namespace}:/PersistentVolumeClaim:{namespace}/{name}"),
                "argocd.argoproj.io/sync-wave": "1",
                "argocd.argoproj.io/sync-options": "Prune=false,ServerSideApply=true",
            },
        },
    })
}

fn annotations_of(manifest: &mut Value) -> &mut Map<String, Value> {
    manifest["metadata"]["annotations"].as_object_mut().expect("the manifest has annotations")
}

/// Sizes of the first claim of the fill as stored: metadata, managedFields and their managers,
/// last-applied-configuration.
async fn metadata_size(env: &Env) -> Result<(usize, usize, usize, usize)> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), &namespace_of(0));
    env.calls.add("get", "persistentvolumeclaims");
    let meta = claims.get_metadata(&claim_name(0)).await?;
    let managed = meta.metadata.managed_fields.clone().unwrap_or_default();
    let last_applied = meta
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("kubectl.kubernetes.io/last-applied-configuration"))
        .map_or(0, String::len);
    Ok((serde_json::to_vec(&meta)?.len(), serde_json::to_vec(&managed)?.len(), managed.len(), last_applied))
}

/// Creates own claims `range` and waits for their PVs; returns the time from the first apply
/// to the last PV seen.
async fn provision_own(env: &Env, range: std::ops::Range<usize>) -> Result<Duration> {
    let count = range.len();
    eprintln!("bench: memory: {count} claims of {NODE}'s own");
    let started = Instant::now();
    let (uids, errors) = apply_claims(env, range, |_| OWN_NAMESPACE.to_string(), |_| Kind::Own).await;
    if !errors.is_empty() {
        bail!("memory: {} own claims failed, first: {}", errors.len(), errors[0]);
    }
    let names: Vec<String> = uids.iter().map(|(_, uid)| format!("pvc-{uid}")).collect();
    loop {
        let missing =
            env.observer.with(|o| names.iter().filter(|n| o.pvs.get(*n).and_then(|p| p.seen).is_none()).count());
        if missing == 0 {
            break;
        }
        if started.elapsed() > PROVISION_TIMEOUT {
            bail!("memory: {missing} of {count} own claims without a PV after {PROVISION_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let provisioned_in = started.elapsed();
    bind(env, uids.iter().map(|(i, uid)| (claim_name(*i), format!("pvc-{uid}"))).collect()).await?;
    Ok(provisioned_in)
}

/// Binds each own claim to its PV as the PV controller would (it is stopped for the fill): the
/// PV's phase Bound, the claim's `spec.volumeName` and bind-completed annotation, the claim's
/// phase Bound with the PV's size. A node forgets a bound claim of its own, so what its memory
/// keeps per volume afterwards is what a cluster at rest has it keep.
async fn bind(env: &Env, pairs: Vec<(String, String)>) -> Result<()> {
    use futures::StreamExt;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), OWN_NAMESPACE);
    let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
    let results: Vec<Result<()>> = futures::stream::iter(pairs)
        .map(|(claim, pv)| {
            let (claims, pvs, calls) = (claims.clone(), pvs.clone(), env.calls.clone());
            async move {
                let params = PatchParams::default();
                let status = json!({ "status": { "phase": "Bound" } });
                pvs.patch_status(&pv, &params, &Patch::Merge(&status)).await.with_context(|| format!("PV {pv}"))?;
                let binding = json!({
                    "metadata": { "annotations": { BIND_COMPLETED: "yes" } },
                    "spec": { "volumeName": pv },
                });
                claims
                    .patch(&claim, &params, &Patch::Merge(&binding))
                    .await
                    .with_context(|| format!("claim {claim}"))?;
                let bound = json!({ "status": {
                    "phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": { "storage": OWN_SIZE },
                } });
                claims
                    .patch_status(&claim, &params, &Patch::Merge(&bound))
                    .await
                    .with_context(|| format!("claim {claim}"))?;
                calls.add("patch", "persistentvolumes");
                calls.add("patch", "persistentvolumeclaims");
                calls.add("patch", "persistentvolumeclaims");
                Ok(())
            }
        })
        .buffer_unordered(FILL_REQUESTS_IN_FLIGHT)
        .collect()
        .await;
    let failed: Vec<_> = results.into_iter().filter_map(Result::err).collect();
    if let Some(first) = failed.first() {
        bail!("memory: binding {} own claims failed, first: {first:#}", failed.len());
    }
    Ok(())
}

pub fn print(m: &Memory) {
    let mut t = Table::new(
        &format!(
            "Memory: {} claims in the cluster, {OWN} of them {NODE}'s (a fresh provisioner; RSS = VmRSS, peak = VmHWM)",
            m.claims_in_cluster()
        ),
        &["step", "RSS, MiB", "peak, MiB", "goal"],
    );
    let goal = format!("< {GOAL_MIB:.0} MiB");
    let row = |step: String, s: &ProcSample, goal: &str| {
        vec![step, format!("{:.1}", mib(s.rss_kib)), format!("{:.1}", mib(s.hwm_kib)), goal.to_string()]
    };
    t.row(row(format!("watches listed ({:.1} s after start)", m.ready_after.as_secs_f64()), &m.after_list, &goal));
    t.row(row(
        format!("{OWN} own claims provisioned ({:.1} s)", m.own_provisioned_in.as_secs_f64()),
        &m.after_own,
        &goal,
    ));
    t.row(row(
        format!("{OWN_LARGE} own claims provisioned (+{:.1} s)", m.own_large_provisioned_in.as_secs_f64()),
        &m.after_own_large,
        "-",
    ));
    t.row(row(format!("started again holding {OWN_LARGE} own volumes"), &m.after_restart, "-"));
    t.row(row(format!("started again holding {OWN_DOUBLE} own volumes"), &m.after_second_restart, "-"));
    t.print();
    println!(
        "  goal: < {GOAL_MIB:.0} MiB with 100,000 claims, 100 of them the node's, judged on the peak after the {OWN} \
         provisions: {:.1} MiB, {}",
        m.judged_mib(),
        verdict(m)
    );
    let (anon, file) = m.per_own_claim_anon_file_kib();
    println!(
        "  per volume held: {:.1} KiB (RSS started with {OWN_DOUBLE} own volumes - started with {OWN_LARGE}, / {}; \
         goal < {PER_OWN_GOAL_KIB:.0} KiB): {}; of it heap (RssAnon) {:.1} KiB",
        m.per_held_volume_kib(),
        OWN_DOUBLE - OWN_LARGE,
        if m.per_held_volume_kib() < PER_OWN_GOAL_KIB { "yes" } else { "NO" },
        m.per_held_volume_anon_kib()
    );
    println!(
        "  per volume held, counted from none: {:.1} KiB (RSS started with {OWN_LARGE} own volumes - RSS after the \
         first list, / {OWN_LARGE}; also holds what a start with volumes costs once)",
        m.per_held_volume_from_none_kib()
    );
    println!(
        "  per own claim in the burst: {:.1} KiB (RSS with {OWN_LARGE} own claims - with {OWN}, / {}); of it heap \
         (RssAnon) {anon:.1} KiB, code first run in the step (RssFile) {file:.1} KiB",
        m.per_own_claim_kib(),
        OWN_LARGE - OWN,
    );
    println!(
        "  fill: {} claims in {:.1} s ({:.0}/s; 2 server-side applies each, {FILL_REQUESTS_IN_FLIGHT} in flight; {} errors{})",
        m.others,
        m.fill_time.as_secs_f64(),
        m.others as f64 / m.fill_time.as_secs_f64().max(f64::EPSILON),
        m.fill_errors,
        m.first_fill_error.as_deref().map_or(String::new(), |e| format!(", first: {e}"))
    );
    println!(
        "  one claim's metadata: {} bytes of JSON, of which managedFields {} ({} managers) and \
         last-applied-configuration {}",
        m.metadata_bytes, m.managed_fields_bytes, m.managers, m.last_applied_bytes
    );
    for line in &m.stopped {
        println!("  stopped for this scenario: {line}");
    }
}

/// The goals table's row of the RSS per own volume (skipped without the memory scenario).
pub fn per_own_goal(m: Option<&Memory>) -> (String, String, String) {
    let target = format!("RSS per own volume < {PER_OWN_GOAL_KIB:.0} KiB (memory scenario, {OWN_LARGE} own volumes)");
    match m {
        Some(m) => (
            target,
            format!(
                "{:.1} KiB per volume held (restarted with {OWN_LARGE} and {OWN_DOUBLE}); {:.1} KiB per own claim in the burst ({} claims in the cluster)",
                m.per_held_volume_kib(),
                m.per_own_claim_kib(),
                m.claims_in_cluster()
            ),
            (if m.per_held_volume_kib() < PER_OWN_GOAL_KIB { "yes" } else { "NO" }).to_string(),
        ),
        None => (target, "skipped (--memory-claims 0)".to_string(), "-".to_string()),
    }
}

/// "yes", "NO", with "(other load)" when the cluster held fewer than 100,000 claims.
pub fn verdict(m: &Memory) -> String {
    let met = if m.judged_mib() < GOAL_MIB { "yes" } else { "NO" };
    if m.claims_in_cluster() >= 100_000 { met.to_string() } else { format!("{met} (other load)") }
}

pub fn json(m: &Memory) -> Value {
    let sample = |s: &ProcSample| {
        json!({
            "rss_mib": mib(s.rss_kib), "peak_rss_mib": mib(s.hwm_kib),
            "rss_anon_mib": mib(s.rss_anon_kib), "rss_file_mib": mib(s.rss_file_kib),
        })
    };
    json!({
        "claims_in_cluster": m.claims_in_cluster(),
        "claims_not_the_nodes": m.others,
        "own_claims": [OWN, OWN_LARGE],
        "fill_s": m.fill_time.as_secs_f64(),
        "fill_errors": m.fill_errors,
        "first_fill_error": m.first_fill_error,
        "claim_metadata_json_bytes": m.metadata_bytes,
        "claim_managed_fields_json_bytes": m.managed_fields_bytes,
        "claim_field_managers": m.managers,
        "claim_last_applied_configuration_bytes": m.last_applied_bytes,
        "ready_after_s": m.ready_after.as_secs_f64(),
        "after_list": sample(&m.after_list),
        "after_own_claims": sample(&m.after_own),
        "own_claims_provisioned_in_s": m.own_provisioned_in.as_secs_f64(),
        "after_own_claims_large": sample(&m.after_own_large),
        "own_claims_large_provisioned_in_s": m.own_large_provisioned_in.as_secs_f64(),
        "after_restart_with_own_volumes": sample(&m.after_restart),
        "after_second_restart_with_own_volumes": sample(&m.after_second_restart),
        "own_volumes_at_restarts": [OWN_LARGE, OWN_DOUBLE],
        "rss_kib_per_volume_held": m.per_held_volume_kib(),
        "rss_anon_kib_per_volume_held": m.per_held_volume_anon_kib(),
        "rss_kib_per_volume_held_from_none": m.per_held_volume_from_none_kib(),
        "rss_kib_per_own_claim": m.per_own_claim_kib(),
        "rss_anon_kib_per_own_claim": m.per_own_claim_anon_file_kib().0,
        "rss_file_kib_per_own_claim": m.per_own_claim_anon_file_kib().1,
        "goal_kib_per_own_claim": PER_OWN_GOAL_KIB,
        "goal_mib": GOAL_MIB,
        "judged_peak_mib": m.judged_mib(),
        "met": verdict(m),
        "stopped_for_the_scenario": m.stopped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotation<'a>(claim: &'a Value, key: &str) -> Option<&'a str> {
        claim["metadata"]["annotations"][key].as_str()
    }

    #[test]
    fn no_claim_of_the_fill_is_the_measured_nodes() {
        for i in 0..1000 {
            let kind = kind_of(i);
            assert_ne!(kind, Kind::Own);
            let claim = helm_apply("ns", "c", i, kind);
            let class = claim["spec"]["storageClassName"].as_str().unwrap();
            let node = annotation(&claim, SELECTED_NODE).or(annotation(&claim, "kubevirt.io/provisionOnNode"));
            match kind {
                Kind::OtherProvisioner => assert_eq!((class, node), (OTHER_CLASS, None)),
                Kind::OursSelectedElsewhere => assert_eq!(class, WFFC_CLASS),
                Kind::OursPinnedElsewhere => assert_eq!(class, IMMEDIATE_CLASS),
                Kind::OursBoundElsewhere => {
                    assert_eq!(class, WFFC_CLASS);
                    assert_eq!(annotation(&claim, "pv.kubernetes.io/bind-completed"), Some("yes"));
                    assert!(claim["spec"]["volumeName"].is_string());
                }
                Kind::Own => unreachable!(),
            }
            if kind != Kind::OtherProvisioner {
                assert!(node.is_some_and(|n| n.starts_with("elsewhere-")), "claim {i}: {node:?}");
            }
        }
        let own = helm_apply("ns", "c", 7, Kind::Own);
        assert_eq!(annotation(&own, SELECTED_NODE), Some(NODE));
        assert_eq!(own["spec"]["storageClassName"], WFFC_CLASS);
    }

    #[test]
    fn claims_carry_helm_and_argo_metadata_of_realistic_size() {
        for i in [0, 3, 99_999] {
            let claim = helm_apply("bench-m-07", &claim_name(i), i, kind_of(i));
            let last_applied = annotation(&claim, "kubectl.kubernetes.io/last-applied-configuration").unwrap();
            assert!((1024..=2048).contains(&last_applied.len()), "{} bytes: {last_applied}", last_applied.len());
            let parsed: Value = serde_json::from_str(last_applied).unwrap();
            assert_eq!(parsed["metadata"]["name"], claim_name(i), "the manifest of the claim itself");
            assert_eq!(claim["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm");
            assert!(claim["metadata"]["labels"]["helm.sh/chart"].is_string());
            assert_eq!(annotation(&claim, "meta.helm.sh/release-namespace"), Some("bench-m-07"));
            let argo = argo_apply("bench-m-07", &claim_name(i), i);
            let tracking = argo["metadata"]["annotations"]["argocd.argoproj.io/tracking-id"].as_str().unwrap();
            assert!(tracking.ends_with(&format!(":/PersistentVolumeClaim:bench-m-07/{}", claim_name(i))));
            assert!(argo.get("spec").is_none(), "Argo CD's apply owns its metadata only");
        }
    }

    #[test]
    fn per_claim_cost_divides_the_difference() {
        assert_eq!(per_claim_kib(10_000, 19_000, 900), 10.0);
        assert_eq!(per_claim_kib(10_000, 9_100, 900), -1.0);
    }
}

//! The provisioning scenarios: claims arriving at a rate (or as fast as the clients go), each
//! measured from the moment the claim became a node's to its PV, then deleted again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use testbed::fixtures;

use super::api_count::BenchCalls;
use super::reference::{self, REFERENCE_CLASS};
use super::setup::{Env, IMMEDIATE_CLASS, PROVISIONER, WFFC_CLASS};
use super::stats::{self, Summary};
use super::window::{self, Closed};

/// How a claim finds its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Immediate class, `kubevirt.io/provisionOnNode` round-robin over the nodes.
    PinnedImmediate,
    /// WaitForFirstConsumer class and one pod per claim, pinned round-robin with a
    /// `kubernetes.io/hostname` nodeSelector (so scheduling is cheap and the spread is even).
    WaitForFirstConsumer,
}

#[derive(Clone, Debug)]
pub struct Spec {
    /// Short id (`a`, `b`, `c`) used in the tables and the JSON.
    pub id: &'static str,
    pub title: String,
    pub namespace: String,
    pub mode: Mode,
    /// StorageClass of the claims in mode `PinnedImmediate` (ours, or the reference's).
    pub class: &'static str,
    /// Claims per second; `None`: as fast as the clients can create them.
    pub rate: Option<f64>,
}

/// The scenarios of a run, in order (namespace `bench-<id>`; a and b at `rate` claims/s):
/// a. Immediate class, claims pinned with `kubevirt.io/provisionOnNode` round-robin;
/// b. WaitForFirstConsumer, one pod per claim pinned round-robin by nodeSelector;
/// r. as c, provisioned by the reference (`reference.rs`), the limit of this machine's pipeline;
/// c. as a, created as fast as the clients can (throughput), right after r.
pub fn standard(rate: f64) -> Vec<Spec> {
    [
        ("a", "provisionOnNode, Immediate", Mode::PinnedImmediate, IMMEDIATE_CLASS, Some(rate)),
        ("b", "WaitForFirstConsumer, pods pinned", Mode::WaitForFirstConsumer, WFFC_CLASS, Some(rate)),
        ("r", "as c, reference provisioner (the limit)", Mode::PinnedImmediate, REFERENCE_CLASS, None),
        ("c", "provisionOnNode, burst", Mode::PinnedImmediate, IMMEDIATE_CLASS, None),
    ]
    .into_iter()
    .map(|(id, title, mode, class, rate)| Spec {
        id,
        title: title.to_string(),
        namespace: format!("bench-{id}"),
        mode,
        class,
        rate,
    })
    .collect()
}

/// The provisioning half of a scenario.
pub struct Provisioned {
    pub spec: Spec,
    /// Claims created (uid -> when the create request was sent).
    pub sent: HashMap<String, Instant>,
    pub create_errors: Vec<String>,
    /// Achieved creation rate (first to last request).
    pub create_rate: Option<f64>,
    /// From the claim becoming a node's to its PV (see `observe.rs` for the method).
    pub latency: Summary,
    /// The samples behind `latency`, milliseconds, sorted (for the plot).
    pub latency_samples_ms: Vec<f64>,
    /// When each PV was first seen, seconds after the first create request, sorted (for the plot).
    pub pv_seen_secs: Vec<f64>,
    /// Samples where the PV arrived on the bench's watch before the claim event that made it
    /// a node's (the two watches are separate streams); counted as zero.
    pub negative_latencies: usize,
    /// WaitForFirstConsumer only: from selected-node to the PV controller's storage-provisioner
    /// annotation (the provisioner needs both), and from the later of the two to the PV.
    pub binder_delay: Summary,
    pub from_both_annotations: Summary,
    /// From the create request of the claim to its PV.
    pub end_to_end: Summary,
    /// From the claim becoming a node's to the claim Bound.
    pub to_bound: Summary,
    pub pvs_per_sec: Option<f64>,
    /// From the first create request to the last claim Bound.
    pub all_bound_after: Duration,
    /// Claims without a PV at the timeout.
    pub missing: usize,
    /// Provisioner events in the namespace by reason: (objects, occurrences incl. series).
    pub events: BTreeMap<String, (u64, u64)>,
    /// JSON size of one claim's metadata as the provisioners' metadata watch holds it, and the
    /// part of it that is `managedFields`.
    pub claim_metadata_bytes: (usize, usize),
    pub window: Closed,
}

/// The deletion half.
pub struct Deleted {
    pub window: Closed,
    /// From the delete requests to the last PV gone / the last directory gone.
    pub all_pvs_gone_after: Duration,
    pub all_dirs_gone_after: Duration,
    pub pvs_deleted_per_sec: Option<f64>,
    /// Per PV, from phase Released to gone.
    pub released_to_gone: Summary,
    pub remaining: usize,
    /// Per provisioner, its largest resident set sampled during the scenario, with its parts
    /// (peak_split), when the caller sampled.
    pub sampled_peaks: Vec<super::procfs::ProcSample>,
}

pub async fn provision(env: &Env, spec: Spec) -> Result<Provisioned> {
    let namespace = fixtures::namespace(&spec.namespace);
    Api::<Namespace>::all(env.client.clone()).create(&PostParams::default(), &namespace).await?;
    env.calls.add("create", "namespaces");
    let opened = window::open(env).await?;
    let (sent, create_errors) = create_load(env, &spec).await;
    if sent.is_empty() {
        bail!("scenario {}: no claim could be created: {create_errors:?}", spec.id);
    }
    let create_rate = stats::rate(&sent.values().map(|t| secs(env, *t)).collect::<Vec<_>>());
    let expected = sent.len() as f64;
    let timeout = Duration::from_secs_f64(60.0 + 5.0 * expected / spec.rate.unwrap_or(50.0));
    let missing = wait_progress(env, &spec, timeout, |o| {
        sent.keys().filter(|uid| o.claims.get(*uid).and_then(|c| c.bound).is_none()).count()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await; // the last events
    let events = provisioner_events(env, &spec.namespace).await?;
    let window = window::close(env, opened).await?;
    let claim_metadata_bytes = claim_metadata_size(env, &spec.namespace).await?;

    let (mut latency, mut end_to_end, mut to_bound, mut pv_times, mut last_bound) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), None::<Instant>);
    let (mut binder_delay, mut from_both) = (Vec::new(), Vec::new());
    let mut negative_latencies = 0;
    env.observer.with(|o| {
        for (uid, sent_at) in &sent {
            let Some(claim) = o.claims.get(uid) else { continue };
            let start = match spec.mode {
                Mode::PinnedImmediate => claim.seen,
                Mode::WaitForFirstConsumer => claim.selected,
            };
            let pv = o.pvs.get(&format!("pvc-{uid}")).and_then(|p| p.seen);
            if let (Some(start), Some(pv)) = (start, pv) {
                if pv < start {
                    negative_latencies += 1;
                }
                latency.push(pv.saturating_duration_since(start).as_secs_f64());
                end_to_end.push(pv.saturating_duration_since(*sent_at).as_secs_f64());
                pv_times.push(secs(env, pv));
                if let (Mode::WaitForFirstConsumer, Some(annotated)) = (spec.mode, claim.annotated) {
                    binder_delay.push(annotated.saturating_duration_since(start).as_secs_f64());
                    from_both.push(pv.saturating_duration_since(annotated.max(start)).as_secs_f64());
                }
            }
            if let (Some(start), Some(bound)) = (start, claim.bound) {
                to_bound.push(bound.saturating_duration_since(start).as_secs_f64());
                last_bound = last_bound.max(Some(bound));
            }
        }
    });
    let first_sent = sent.values().min().copied().unwrap_or_else(Instant::now);
    let mut latency_samples_ms: Vec<f64> = latency.iter().map(|s| s * 1000.0).collect();
    latency_samples_ms.sort_by(f64::total_cmp);
    let mut pv_seen_secs: Vec<f64> = pv_times.iter().map(|t| t - secs(env, first_sent)).collect();
    pv_seen_secs.sort_by(f64::total_cmp);
    Ok(Provisioned {
        latency_samples_ms,
        pv_seen_secs,
        create_rate,
        latency: Summary::of_seconds(&latency),
        negative_latencies,
        binder_delay: Summary::of_seconds(&binder_delay),
        from_both_annotations: Summary::of_seconds(&from_both),
        end_to_end: Summary::of_seconds(&end_to_end),
        to_bound: Summary::of_seconds(&to_bound),
        pvs_per_sec: stats::rate(&pv_times),
        all_bound_after: last_bound.map_or(Duration::ZERO, |b| b.saturating_duration_since(first_sent)),
        missing,
        events,
        claim_metadata_bytes,
        window,
        sent,
        create_errors,
        spec,
    })
}

/// Deletes the scenario's pods and claims (one deletecollection each) and waits for every PV
/// and directory to go.
pub async fn delete(env: &Env, provisioned: &Provisioned) -> Result<Deleted> {
    let spec = &provisioned.spec;
    let opened = window::open(env).await?;
    let started = Instant::now();
    let everything = ListParams::default();
    if spec.mode == Mode::WaitForFirstConsumer {
        let pods: Api<Pod> = Api::namespaced(env.client.clone(), &spec.namespace);
        pods.delete_collection(&DeleteParams { grace_period_seconds: Some(0), ..Default::default() }, &everything)
            .await?;
        env.calls.add("deletecollection", "pods");
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), &spec.namespace);
    claims.delete_collection(&DeleteParams::default(), &everything).await?;
    env.calls.add("deletecollection", "persistentvolumeclaims");
    if spec.class == REFERENCE_CLASS {
        // The reference provisioner deletes nothing; its PVs (Retain) go here.
        reference::delete_volumes(env).await?;
    }
    let pv_names: Vec<String> = provisioned.sent.keys().map(|uid| format!("pvc-{uid}")).collect();
    let timeout = Duration::from_secs(60 + pv_names.len() as u64 / 5);
    let remaining = wait_progress(env, spec, timeout, |o| {
        pv_names.iter().filter(|n| o.pvs.get(*n).is_some_and(|p| p.seen.is_some() && p.gone.is_none())).count()
    })
    .await;
    let all_pvs_gone_after = started.elapsed();
    let pools = env.pool_roots();
    let dirs_left = || pools.iter().flat_map(|p| pv_names.iter().map(move |n| p.join(n))).any(|d| d.exists());
    while dirs_left() && started.elapsed() < timeout {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all_dirs_gone_after = started.elapsed();
    let window = window::close(env, opened).await?;
    let (mut gone_times, mut released_to_gone) = (Vec::new(), Vec::new());
    env.observer.with(|o| {
        for times in pv_names.iter().filter_map(|n| o.pvs.get(n)) {
            if let Some(gone) = times.gone {
                gone_times.push(secs(env, gone));
                if let Some(released) = times.released {
                    released_to_gone.push(gone.saturating_duration_since(released).as_secs_f64());
                }
            }
        }
    });
    Ok(Deleted {
        window,
        all_pvs_gone_after,
        all_dirs_gone_after,
        pvs_deleted_per_sec: stats::rate(&gone_times),
        released_to_gone: Summary::of_seconds(&released_to_gone),
        remaining,
        sampled_peaks: Vec::new(),
    })
}

/// Seconds since the start of the run (any fixed instant works for rates).
fn secs(env: &Env, at: Instant) -> f64 {
    at.saturating_duration_since(env.epoch).as_secs_f64()
}

/// Creates the scenario's claims (and pods) with `--clients` concurrent clients; returns the
/// uid and send time of each claim created, and the errors.
async fn create_load(env: &Env, spec: &Spec) -> (HashMap<String, Instant>, Vec<String>) {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now() + Duration::from_millis(50);
    let nodes = Arc::new(env.node_names());
    let total = env.args.claims;
    let workers: Vec<_> = env
        .clients()
        .into_iter()
        .map(|client| {
            let (next, nodes, spec, calls) = (next.clone(), nodes.clone(), spec.clone(), env.calls.clone());
            tokio::spawn(async move {
                let mut created = Vec::new();
                let mut errors = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        break;
                    }
                    if let Some(rate) = spec.rate {
                        tokio::time::sleep_until((start + Duration::from_secs_f64(i as f64 / rate)).into()).await;
                    }
                    match create_one(&client, &spec, i, &nodes[i % nodes.len()], &calls).await {
                        Ok(item) => created.push(item),
                        Err(err) => errors.push(format!("claim {i}: {err:#}")),
                    }
                }
                (created, errors)
            })
        })
        .collect();
    let (mut sent, mut errors) = (HashMap::new(), Vec::new());
    for worker in workers {
        match worker.await {
            Ok((created, errs)) => {
                sent.extend(created);
                errors.extend(errs);
            }
            Err(err) => errors.push(format!("creator task: {err}")),
        }
    }
    (sent, errors)
}

async fn create_one(
    client: &Client,
    spec: &Spec,
    i: usize,
    node: &str,
    calls: &BenchCalls,
) -> Result<(String, Instant)> {
    let name = format!("claim-{i:05}");
    let claim = match spec.mode {
        Mode::PinnedImmediate => {
            fixtures::claim(&spec.namespace, &name, spec.class, "1Gi").provision_on_node(node).build()
        }
        Mode::WaitForFirstConsumer => fixtures::claim(&spec.namespace, &name, WFFC_CLASS, "1Gi").build(),
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &spec.namespace);
    let sent = Instant::now();
    calls.add("create", "persistentvolumeclaims");
    let created = claims.create(&PostParams::default(), &claim).await?;
    if spec.mode == Mode::WaitForFirstConsumer {
        let pod = fixtures::pod_using_claim(&spec.namespace, &format!("pod-{i:05}"), &name).on_hostname(node).build();
        calls.add("create", "pods");
        Api::<Pod>::namespaced(client.clone(), &spec.namespace).create(&PostParams::default(), &pod).await?;
    }
    Ok((created.metadata.uid.unwrap_or_default(), sent))
}

/// Polls `pending` (how many are not done yet) until zero, or until it has not gone down for
/// `timeout` (a slow provisioner, such as the Go build under its client's default 5 requests/s,
/// is waited for as long as it makes progress), printing progress every 5 s; returns what is
/// still pending.
async fn wait_progress(
    env: &Env,
    spec: &Spec,
    timeout: Duration,
    pending: impl Fn(&super::observe::Observations) -> usize,
) -> usize {
    let started = Instant::now();
    let mut last_report = Instant::now();
    let (mut fewest, mut last_progress) = (usize::MAX, Instant::now());
    loop {
        let left = env.observer.with(&pending);
        if left == 0 {
            return 0;
        }
        if left < fewest {
            (fewest, last_progress) = (left, Instant::now());
        }
        if last_progress.elapsed() > timeout {
            eprintln!("bench: scenario {}: giving up, {left} pending and none done for {timeout:.0?}", spec.id);
            return left;
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            eprintln!("bench: scenario {}: {left} pending after {:.0?}", spec.id, started.elapsed());
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// JSON size of the metadata of the scenario's first claim, and of its `managedFields`.
async fn claim_metadata_size(env: &Env, namespace: &str) -> Result<(usize, usize)> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), namespace);
    env.calls.add("get", "persistentvolumeclaims");
    let meta = claims.get_metadata("claim-00000").await?;
    let total = serde_json::to_vec(&meta)?.len();
    let managed = serde_json::to_vec(&meta.metadata.managed_fields)?.len();
    Ok((total, managed))
}

/// Events in `namespace` reported by the provisioners, by reason: (objects, occurrences).
async fn provisioner_events(env: &Env, namespace: &str) -> Result<BTreeMap<String, (u64, u64)>> {
    let events: Api<Event> = Api::namespaced(env.client.clone(), namespace);
    env.calls.add("list", "events.events.k8s.io");
    let mut by_reason: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for event in events.list(&ListParams::default()).await?.items {
        if event.reporting_controller.as_deref() != Some(PROVISIONER) {
            continue;
        }
        let entry = by_reason.entry(event.reason.clone().unwrap_or_default()).or_default();
        entry.0 += 1;
        entry.1 += event.series.as_ref().map_or(1, |s| s.count.max(1) as u64);
    }
    Ok(by_reason)
}

impl Provisioned {
    pub fn json(&self) -> Value {
        let events: Value =
            self.events.iter().map(|(r, (o, n))| (r.clone(), json!({"objects": o, "occurrences": n}))).collect();
        json!({
            "id": self.spec.id,
            "title": self.spec.title,
            "mode": format!("{:?}", self.spec.mode),
            "target_rate_per_s": self.spec.rate,
            "claims_created": self.sent.len(),
            "create_errors": self.create_errors,
            "achieved_create_rate_per_s": self.create_rate,
            "provisioner_latency": self.latency.json(),
            "negative_latencies_counted_as_zero": self.negative_latencies,
            "wffc_selected_node_to_storage_provisioner_annotation": self.binder_delay.json(),
            "wffc_latency_from_both_annotations": self.from_both_annotations.json(),
            "create_to_pv": self.end_to_end.json(),
            "to_bound": self.to_bound.json(),
            "pvs_per_s": self.pvs_per_sec,
            "all_bound_after_s": self.all_bound_after.as_secs_f64(),
            "claims_without_pv_at_timeout": self.missing,
            "provisioner_events": events,
            "claim_metadata_json_bytes": self.claim_metadata_bytes.0,
            "claim_managed_fields_json_bytes": self.claim_metadata_bytes.1,
            "window": self.window.json(),
        })
    }
}

impl Deleted {
    pub fn json(&self) -> Value {
        json!({
            "all_pvs_gone_after_s": self.all_pvs_gone_after.as_secs_f64(),
            "all_dirs_gone_after_s": self.all_dirs_gone_after.as_secs_f64(),
            "pvs_deleted_per_s": self.pvs_deleted_per_sec,
            "released_to_pv_gone": self.released_to_gone.json(),
            "pvs_remaining_at_timeout": self.remaining,
            "window": self.window.json(),
        })
    }
}

//! Fan-out of the scale curve (issue #21): what one more node costs the API server per claim
//! change, the Go build's cost per claim change at the same node counts, the projection to
//! 5,000 nodes from the measured per-node slopes, and a DaemonSet rollout (every provisioner
//! restarted at once).
//!
//! - Paced claim changes ([`paced_changes`]): first an idle window of the same length (nothing
//!   sent), then `CHANGE_RATE` label changes per second on the curve's Bound claims; the API
//!   server's CPU over the change window minus the idle window's, divided by the changes, is its
//!   CPU per claim change. The provisioners' requests in the window (audit log) and the claim
//!   watch events the API server sent are divided by the changes too.
//! - Per added node: the least-squares slope of a figure against the node count over the steps
//!   ([`slope`]) and the slope of the last segment ([`segment_slope`]); the projection at 5,000
//!   nodes is the fitted line's value there ([`project`]).
//! - The Go build (`--peer`, at the curve steps of `--peer-at`): ours stopped, one Go process per
//!   node started, the same paced window, then ours restarted.
//! - Rollout: after the last step every provisioner is stopped, then all are started at once;
//!   time until all are ready, the API server's CPU and peak RSS, its peak request rate (its
//!   `apiserver_request_total`, read every second), 429 and 504 answers, and the p99 of claim
//!   and PV LISTs (`apiserver_request_duration_seconds`) during the burst.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use testbed::PROVISIONER_READY_TIMEOUT;

use super::api_count::{self, AuditCounts, metric_sum};
use super::peer::Side;
use super::procfs::{self, mib};
use super::report::Table;
use super::setup::{self, Env};

/// Claim label changes per second in the paced window.
pub const CHANGE_RATE: f64 = 5.0;
/// After the last change, for the watch events to be sent (inside the window).
const DELIVERY: Duration = Duration::from_secs(3);
/// The node count the projection is made for.
pub const PROJECT_TO: f64 = 5000.0;
/// Claim changes per second assumed for the projection's rates (a busy cluster: 10 claims
/// created, resized, relabelled or bound per second).
pub const PROJECTED_CHANGES_PER_S: f64 = 10.0;
/// Goals per added node at 1,000 nodes (issue #21).
pub const GOAL_EVENTS_PER_CHANGE: f64 = 1.0;
pub const GOAL_CPU_MS_PER_CHANGE: f64 = 0.05;
/// Rollout: how long all provisioners may take to be ready.
const ROLLOUT_READY_TIMEOUT: Duration = Duration::from_secs(900);

/// What a paced window of claim changes cost.
#[derive(Clone, Debug, Default)]
pub struct Paced {
    pub changes: usize,
    /// Length of the change window (changes and delivery), and of the idle window before it.
    pub secs: f64,
    pub idle_secs: f64,
    pub apiserver_cpu_s: f64,
    pub idle_apiserver_cpu_s: f64,
    /// Claim watch events the API server sent per change, the idle window's rate (bookmarks,
    /// sent about once a minute on every watch whether anything changed or not) scaled to the
    /// change window's length and taken out.
    pub events_per_change: f64,
    /// Claim watch events sent in the idle window (bookmarks only, at rest).
    pub idle_events: f64,
    /// Claim watch events sent in the change window, nothing taken out.
    pub raw_events: f64,
    /// The provisioners' requests in the change window (audit log).
    pub audit: AuditCounts,
}

impl Paced {
    /// API server CPU ms per change, the idle window's CPU (scaled to the change window's
    /// length) taken out.
    pub fn cpu_ms_per_change(&self) -> f64 {
        net_cpu_ms_per_change(self.apiserver_cpu_s, self.secs, self.idle_apiserver_cpu_s, self.idle_secs, self.changes)
    }

    /// The provisioners' requests per change, by request.
    pub fn requests_per_change(&self) -> BTreeMap<String, f64> {
        let n = self.changes.max(1) as f64;
        self.audit.total().into_iter().map(|(k, v)| (k.label(), v as f64 / n)).collect()
    }

    /// The provisioners' `get` of claims per change.
    pub fn claim_gets_per_change(&self) -> f64 {
        let n = self.changes.max(1) as f64;
        self.audit
            .total()
            .into_iter()
            .filter(|(k, _)| k.verb == "get" && k.resource == "persistentvolumeclaims")
            .map(|(_, v)| v as f64)
            .fold(0.0, |a, b| a + b)
            / n
    }

    pub fn all_requests_per_change(&self) -> f64 {
        self.audit.total().values().sum::<u64>() as f64 / self.changes.max(1) as f64
    }

    pub fn json(&self) -> Value {
        json!({
            "changes": self.changes, "change_window_s": self.secs, "idle_window_s": self.idle_secs,
            "apiserver_cpu_s": self.apiserver_cpu_s, "idle_apiserver_cpu_s": self.idle_apiserver_cpu_s,
            "apiserver_cpu_ms_per_change": self.cpu_ms_per_change(),
            "claim_watch_events_per_change": self.events_per_change,
            "claim_watch_events_idle_window": self.idle_events,
            "claim_watch_events_change_window": self.raw_events,
            "provisioner_requests_per_change": self.requests_per_change(),
        })
    }
}

/// `(cpu - idle_cpu * secs / idle_secs) / changes`, in ms.
pub fn net_cpu_ms_per_change(cpu_s: f64, secs: f64, idle_cpu_s: f64, idle_secs: f64, changes: usize) -> f64 {
    let idle = if idle_secs > 0.0 { idle_cpu_s * secs / idle_secs } else { 0.0 };
    (cpu_s - idle) / changes.max(1) as f64 * 1000.0
}

/// Watch events caused by `changes`: those of the change window minus the idle window's rate
/// over the change window's length. At rest a watch still gets a bookmark now and then, and
/// with hundreds of watches those land in every window; they are no cost of a change.
pub fn net_events_per_change(events: f64, secs: f64, idle_events: f64, idle_secs: f64, changes: usize) -> f64 {
    let idle = if idle_secs > 0.0 { idle_events * secs / idle_secs } else { 0.0 };
    (events - idle) / changes.max(1) as f64
}

/// An idle window, then `CHANGE_RATE` label changes per second on `names` (cycled) for
/// `secs`, then [`DELIVERY`]; the idle window is as long as the change window.
pub async fn paced_changes(
    env: &Env,
    apiserver: u32,
    namespace: &str,
    names: &[String],
    tag: &str,
    secs: f64,
) -> Result<Paced> {
    let changes = ((CHANGE_RATE * secs).round() as usize).max(1);
    let window = Duration::from_secs_f64(changes as f64 / CHANGE_RATE) + DELIVERY;
    let idle_events_before = claim_watch_events(&api_count::apiserver_metrics(&env.client).await?);
    let idle_started = Instant::now();
    let before = procfs::sample(apiserver)?;
    tokio::time::sleep(window).await;
    let after = procfs::sample(apiserver)?;
    let idle_secs = idle_started.elapsed().as_secs_f64();
    let idle_apiserver_cpu_s = after.cpu_secs - before.cpu_secs;
    let idle_events = claim_watch_events(&api_count::apiserver_metrics(&env.client).await?) - idle_events_before;

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(env.client.clone(), namespace);
    let events_before = claim_watch_events(&api_count::apiserver_metrics(&env.client).await?);
    env.audit.mark()?;
    let started = Instant::now();
    let before = procfs::sample(apiserver)?;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / CHANGE_RATE));
    for k in 0..changes {
        tick.tick().await;
        let patch = json!({ "metadata": { "labels": { "hpp-bench.example/change": format!("{tag}-{k}") } } });
        claims.patch(&names[k % names.len()], &PatchParams::default(), &Patch::Merge(&patch)).await?;
        env.calls.add("patch", "persistentvolumeclaims");
    }
    let left = window.saturating_sub(started.elapsed());
    tokio::time::sleep(left).await;
    let after = procfs::sample(apiserver)?;
    let secs = started.elapsed().as_secs_f64();
    let events_after = claim_watch_events(&api_count::apiserver_metrics(&env.client).await?);
    let audit = env.audit.read_new()?;
    Ok(Paced {
        changes,
        secs,
        idle_secs,
        apiserver_cpu_s: after.cpu_secs - before.cpu_secs,
        idle_apiserver_cpu_s,
        events_per_change: net_events_per_change(events_after - events_before, secs, idle_events, idle_secs, changes),
        idle_events,
        raw_events: events_after - events_before,
        audit,
    })
}

/// `apiserver_watch_events_total` for claims (labelled by resource or, in older releases, kind).
pub fn claim_watch_events(metrics: &str) -> f64 {
    metric_sum(metrics, "apiserver_watch_events_total", |l| {
        l.get("resource").is_some_and(|r| r == "persistentvolumeclaims")
            || l.get("kind").is_some_and(|k| k == "PersistentVolumeClaim")
    })
}

/// Least-squares slope of `y` against `x`; NaN with fewer than two distinct `x` or a
/// non-finite value.
pub fn slope(points: &[(f64, f64)]) -> f64 {
    fit(points).map_or(f64::NAN, |(_, b)| b)
}

/// Least-squares line `(intercept, slope)`.
pub fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let points: Vec<(f64, f64)> = points.iter().copied().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let b = sxy / sxx;
    Some((my - b * mx, b))
}

/// Slope of the last two points (the last segment of the curve); NaN with fewer.
pub fn segment_slope(points: &[(f64, f64)]) -> f64 {
    match points {
        [.., (x0, y0), (x1, y1)] if x1 != x0 => (y1 - y0) / (x1 - x0),
        _ => f64::NAN,
    }
}

/// The resolution of the last segment's watch events per change per added node: twice the
/// standard deviation of the bookmarks the two steps' idle windows counted (`idle_events`, a
/// Poisson count), over the changes and the nodes between the steps. The events per change and
/// node are whole by construction (one per watch); a residual within this is bookmarks the idle
/// window did not even out, not a second event.
pub fn events_resolution(idle_events: [f64; 2], changes: usize, added_nodes: f64) -> f64 {
    if added_nodes <= 0.0 || changes == 0 {
        return f64::NAN;
    }
    2.0 * (idle_events[0] + idle_events[1]).max(1.0).sqrt() / changes as f64 / added_nodes
}

/// The fitted line's value at `x`.
pub fn project(points: &[(f64, f64)], x: f64) -> f64 {
    fit(points).map_or(f64::NAN, |(a, b)| a + b * x)
}

/// The `q` quantile's upper bound from cumulative histogram buckets `(le, count)` (the `+Inf`
/// bucket as `f64::INFINITY`), as Prometheus' `histogram_quantile` but without interpolation
/// (an upper bound). None without observations.
pub fn bucket_quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let mut buckets = buckets.to_vec();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    buckets.iter().find(|(_, c)| *c >= q * total).map(|(le, _)| *le)
}

/// Cumulative buckets of `apiserver_request_duration_seconds` for `verb` on `resource`
/// (summed over the other labels).
pub fn duration_buckets(metrics: &str, verb: &str, resource: &str) -> Vec<(f64, f64)> {
    let mut by_le: BTreeMap<String, f64> = BTreeMap::new();
    let prefix = "apiserver_request_duration_seconds_bucket{";
    for line in metrics.lines().filter(|l| l.starts_with(prefix)) {
        let Some((labels, value)) = line[prefix.len()..].rsplit_once("} ") else { continue };
        let has = |k: &str, v: &str| labels.contains(&format!("{k}=\"{v}\""));
        if !has("verb", verb) || !has("resource", resource) || !has("subresource", "") {
            continue;
        }
        let Some(le) = labels.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else { continue };
        *by_le.entry(le.to_string()).or_default() += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    let mut buckets: Vec<(f64, f64)> = by_le
        .into_iter()
        .map(|(le, c)| (if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::INFINITY) }, c))
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// `after - before`, bucket by bucket.
pub fn bucket_delta(before: &[(f64, f64)], after: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after.iter().map(|(le, c)| (*le, c - before.iter().find(|(l, _)| l == le).map_or(0.0, |(_, b)| *b))).collect()
}

/// Answers with `code`, all requests.
fn answers_with(metrics: &str, code: &str) -> f64 {
    metric_sum(metrics, "apiserver_request_total", |l| l.get("code").is_some_and(|c| c == code))
}

/// The Go build at one curve step.
pub struct GoStep {
    pub nodes: usize,
    pub paced: Paced,
}

/// Ours stopped, a Go process per node started, a paced window, the Go processes stopped and
/// ours restarted.
pub async fn go_step(env: &mut Env, apiserver: u32, namespace: &str, names: &[String], tag: &str) -> Result<GoStep> {
    let nodes = env.node_names();
    eprintln!("bench: scale curve: the Go build on {} nodes", nodes.len());
    env.nodes.iter_mut().for_each(|n| {
        n.provisioner.terminate();
    });
    let peer = env.peer.as_mut().context("no --peer given")?;
    peer.add_accounts(&env.cp, &env.client, &nodes).await?;
    peer.start_all(&env.cp).await?;
    env.side = Side::Peer;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let paced = paced_changes(env, apiserver, namespace, names, tag, env.args.idle_secs as f64).await;
    if let Some(peer) = &mut env.peer {
        peer.stop_all();
    }
    env.side = Side::Ours;
    for node in &mut env.nodes {
        node.provisioner.restart()?;
    }
    for node in &mut env.nodes {
        node.provisioner.wait_ready(PROVISIONER_READY_TIMEOUT).await?;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let paced = paced?;
    eprintln!(
        "bench: scale curve: Go on {} nodes: apiserver CPU {:.2} ms/change, {:.2} events/change, {:.3} Go requests/change",
        nodes.len(),
        paced.cpu_ms_per_change(),
        paced.events_per_change,
        paced.all_requests_per_change()
    );
    Ok(GoStep { nodes: nodes.len(), paced })
}

/// What restarting every provisioner at once cost.
#[derive(Clone, Debug, Default)]
pub struct Rollout {
    pub nodes: usize,
    /// From the first start to the last `/readyz` answering 200.
    pub all_ready_s: f64,
    /// Each process's start to its own readiness is not tracked; the median of the order in
    /// which they were found ready is not either: `all_ready_s` is the figure.
    pub apiserver_cpu_s: f64,
    pub apiserver_rss_before_mib: f64,
    pub apiserver_peak_rss_mib: f64,
    /// Highest request rate over a 1 s sample (every request the API server counted).
    pub peak_requests_per_s: f64,
    pub requests: f64,
    pub throttled_429: f64,
    pub timeouts_504: f64,
    /// p99 upper bounds of claim and PV LISTs during the burst, seconds.
    pub claim_list_p99_s: Option<f64>,
    pub pv_list_p99_s: Option<f64>,
    pub claim_lists: f64,
    /// Processes that did not start or become ready (with why); `all_ready_s` is of the others.
    pub failed: Vec<String>,
}

/// Stops every provisioner, then starts all at once and waits until all are ready.
pub async fn rollout(env: &mut Env, apiserver: u32) -> Result<Rollout> {
    let n = env.nodes.len();
    eprintln!("bench: rollout: stopping the {n} provisioners");
    for node in &mut env.nodes {
        node.provisioner.terminate();
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before_metrics = api_count::apiserver_metrics(&env.client).await?;
    let before = procfs::sample(apiserver)?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (client, stop) = (env.client.clone(), stop.clone());
        tokio::spawn(async move {
            let mut samples: Vec<(f64, f64, u64)> = Vec::new();
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(text) = api_count::apiserver_metrics(&client).await {
                    let total = metric_sum(&text, "apiserver_request_total", |_| true);
                    let rss = procfs::sample(apiserver).map_or(0, |s| s.rss_kib);
                    samples.push((started.elapsed().as_secs_f64(), total, rss));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            samples
        })
    };
    eprintln!("bench: rollout: starting {n} provisioners at once");
    let started = Instant::now();
    let mut failed = Vec::new();
    let mut spawned = vec![true; n];
    for (i, node) in env.nodes.iter_mut().enumerate() {
        if let Err(err) = setup::respawn(&env.cp, &env.args, node) {
            failed.push(format!("{}: {err:#}", node.name));
            spawned[i] = false;
        }
    }
    for (node, _) in env.nodes.iter_mut().zip(&spawned).filter(|(_, s)| **s) {
        if let Err(err) = node.provisioner.wait_ready(ROLLOUT_READY_TIMEOUT).await {
            let first = format!("{err:#}").lines().next().unwrap_or_default().to_string();
            failed.push(format!("{}: {first}", node.name));
        }
    }
    let all_ready_s = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let after = procfs::sample(apiserver)?;
    let samples = sampler.await.unwrap_or_default();
    if !failed.is_empty() {
        eprintln!("bench: rollout: {} of {n} did not become ready: {:?}", failed.len(), failed.first());
    }
    let after_metrics = api_count::apiserver_metrics(&env.client).await?;
    let p99 = |resource: &str| {
        let delta = bucket_delta(
            &duration_buckets(&before_metrics, "LIST", resource),
            &duration_buckets(&after_metrics, "LIST", resource),
        );
        bucket_quantile(&delta, 0.99)
    };
    let claim_lists = bucket_delta(
        &duration_buckets(&before_metrics, "LIST", "persistentvolumeclaims"),
        &duration_buckets(&after_metrics, "LIST", "persistentvolumeclaims"),
    )
    .iter()
    .map(|(_, c)| *c)
    .fold(0.0, f64::max);
    Ok(Rollout {
        nodes: n,
        all_ready_s,
        apiserver_cpu_s: after.cpu_secs - before.cpu_secs,
        apiserver_rss_before_mib: mib(before.rss_kib),
        apiserver_peak_rss_mib: mib(samples.iter().map(|s| s.2).max().unwrap_or(0).max(after.rss_kib)),
        peak_requests_per_s: peak_rate(&samples.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>()),
        requests: metric_sum(&after_metrics, "apiserver_request_total", |_| true)
            - metric_sum(&before_metrics, "apiserver_request_total", |_| true),
        throttled_429: answers_with(&after_metrics, "429") - answers_with(&before_metrics, "429"),
        timeouts_504: answers_with(&after_metrics, "504") - answers_with(&before_metrics, "504"),
        claim_list_p99_s: p99("persistentvolumeclaims"),
        pv_list_p99_s: p99("persistentvolumes"),
        claim_lists,
        failed,
    })
}

/// Highest rate between consecutive `(seconds, cumulative count)` samples.
pub fn peak_rate(samples: &[(f64, f64)]) -> f64 {
    samples.windows(2).filter(|w| w[1].0 > w[0].0).map(|w| (w[1].1 - w[0].1) / (w[1].0 - w[0].0)).fold(0.0, f64::max)
}

/// A figure per step, against nodes.
pub type Curve = Vec<(f64, f64)>;

/// The projection at [`PROJECT_TO`] nodes of one side.
#[derive(Clone, Debug)]
pub struct Projection {
    /// Per added node (least-squares slope over the steps).
    pub cpu_ms_per_change_per_node: f64,
    pub events_per_change_per_node: f64,
    pub requests_per_change_per_node: f64,
    /// At PROJECT_TO nodes (the fitted line's value).
    pub cpu_ms_per_change: f64,
    pub events_per_change: f64,
    pub requests_per_change: f64,
    /// Idle requests per second of the provisioners at PROJECT_TO nodes (ours; NaN for Go).
    pub idle_requests_per_s: f64,
}

impl Projection {
    pub fn from_curves(cpu: &Curve, events: &Curve, requests: &Curve, idle_requests: &Curve) -> Projection {
        Projection {
            cpu_ms_per_change_per_node: slope(cpu),
            events_per_change_per_node: slope(events),
            requests_per_change_per_node: slope(requests),
            cpu_ms_per_change: project(cpu, PROJECT_TO),
            events_per_change: project(events, PROJECT_TO),
            requests_per_change: project(requests, PROJECT_TO).max(0.0),
            idle_requests_per_s: project(idle_requests, PROJECT_TO).max(0.0),
        }
    }

    /// API server cores spent on claim changes at [`PROJECTED_CHANGES_PER_S`].
    pub fn cores(&self) -> f64 {
        self.cpu_ms_per_change * PROJECTED_CHANGES_PER_S / 1000.0
    }

    /// Requests per second at [`PROJECTED_CHANGES_PER_S`] (idle requests included when known).
    pub fn requests_per_s(&self) -> f64 {
        self.requests_per_change * PROJECTED_CHANGES_PER_S
            + if self.idle_requests_per_s.is_finite() { self.idle_requests_per_s } else { 0.0 }
    }

    pub fn json(&self) -> Value {
        let finite = |v: f64| v.is_finite().then_some(v);
        json!({
            "nodes": PROJECT_TO, "claim_changes_per_s": PROJECTED_CHANGES_PER_S,
            "per_added_node": {
                "apiserver_cpu_ms_per_change": finite(self.cpu_ms_per_change_per_node),
                "watch_events_per_change": finite(self.events_per_change_per_node),
                "provisioner_requests_per_change": finite(self.requests_per_change_per_node),
            },
            "apiserver_cpu_ms_per_change": finite(self.cpu_ms_per_change),
            "watch_events_per_change": finite(self.events_per_change),
            "provisioner_requests_per_change": finite(self.requests_per_change),
            "idle_requests_per_s": finite(self.idle_requests_per_s),
            "apiserver_cores": finite(self.cores()),
            "requests_per_s": finite(self.requests_per_s()),
        })
    }
}

/// Ours' and the Go build's figures against nodes, and their projections.
pub fn go_curves(go: &[GoStep]) -> (Curve, Curve, Curve) {
    let x = |s: &GoStep| s.nodes as f64;
    (
        go.iter().map(|s| (x(s), s.paced.cpu_ms_per_change())).collect(),
        go.iter().map(|s| (x(s), s.paced.events_per_change)).collect(),
        go.iter().map(|s| (x(s), s.paced.all_requests_per_change())).collect(),
    )
}

pub fn print_go(go: &[GoStep]) {
    if go.is_empty() {
        return;
    }
    let mut t = Table::new(
        "The Go build, same claims and paced changes (ours stopped meanwhile)",
        &["nodes", "apiserver CPU ms/change", "watch events/change", "Go requests/change (claim GETs)", "by request"],
    );
    for s in go {
        let by: Vec<String> = s.paced.requests_per_change().iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
        t.row(vec![
            s.nodes.to_string(),
            format!("{:.2}", s.paced.cpu_ms_per_change()),
            format!("{:.2}", s.paced.events_per_change),
            format!("{:.2} ({:.2})", s.paced.all_requests_per_change(), s.paced.claim_gets_per_change()),
            by.join(", "),
        ]);
    }
    t.print();
}

pub fn print_projection(ours: &Projection, go: Option<&Projection>) {
    let mut t = Table::new(
        &format!(
            "Projection at {PROJECT_TO:.0} nodes from the per-node slopes (least squares over the steps; rates at \
             {PROJECTED_CHANGES_PER_S:.0} claim changes/s)"
        ),
        &["", "ours", "Go build"],
    );
    let cell = |v: Option<f64>, d: usize| v.filter(|v| v.is_finite()).map_or("-".to_string(), |v| format!("{v:.d$}"));
    type Row = (&'static str, fn(&Projection) -> f64, usize);
    let rows: [Row; 8] = [
        ("per added node: apiserver CPU ms per claim change", |p| p.cpu_ms_per_change_per_node, 4),
        ("per added node: watch events per claim change", |p| p.events_per_change_per_node, 3),
        ("per added node: provisioner requests per claim change", |p| p.requests_per_change_per_node, 3),
        ("apiserver CPU ms per claim change", |p| p.cpu_ms_per_change, 1),
        ("watch events per claim change", |p| p.events_per_change, 0),
        ("apiserver cores for the claim changes", Projection::cores, 2),
        ("provisioner requests per claim change", |p| p.requests_per_change, 1),
        ("provisioner requests/s (changes + idle)", Projection::requests_per_s, 1),
    ];
    for (label, of, d) in rows {
        t.row(vec![label.to_string(), cell(Some(of(ours)), d), cell(go.map(of), d)]);
    }
    t.print();
}

pub fn print_rollout(r: &Rollout) {
    let mut t = Table::new(
        &format!("Rollout: {} provisioners stopped, then all started at once", r.nodes),
        &["figure", "value"],
    );
    let s =
        |v: Option<f64>| v.map_or("-".to_string(), |v| if v.is_finite() { format!("{v:.3}") } else { "+Inf".into() });
    t.row(vec!["start of the first -> all ready, s".into(), format!("{:.1}", r.all_ready_s)]);
    t.row(vec!["did not become ready (testbed failures)".into(), r.failed.len().to_string()]);
    t.row(vec!["apiserver CPU s (start -> all ready + 3 s)".into(), format!("{:.1}", r.apiserver_cpu_s)]);
    t.row(vec![
        "apiserver RSS before / peak, MiB".into(),
        format!("{:.0} / {:.0}", r.apiserver_rss_before_mib, r.apiserver_peak_rss_mib),
    ]);
    t.row(vec!["requests (all, apiserver count)".into(), format!("{:.0}", r.requests)]);
    t.row(vec!["peak requests/s (1 s samples)".into(), format!("{:.0}", r.peak_requests_per_s)]);
    t.row(vec!["429 / 504 answers".into(), format!("{:.0} / {:.0}", r.throttled_429, r.timeouts_504)]);
    t.row(vec![
        "claim LISTs; p99 upper bound, s (none: streaming lists)".into(),
        format!("{:.0}; {}", r.claim_lists, s(r.claim_list_p99_s)),
    ]);
    t.row(vec!["PV LIST p99 upper bound, s".into(), s(r.pv_list_p99_s)]);
    t.print();
}

impl Rollout {
    /// Not overloaded: no 429 or 504, and claim LISTs' p99 within 5 s when there were LISTs
    /// (with streaming lists, Kubernetes 1.34 and later, the initial state comes over the watch
    /// and there are none).
    pub fn not_overloaded(&self) -> bool {
        self.throttled_429 == 0.0 && self.timeouts_504 == 0.0 && self.claim_list_p99_s.is_none_or(|p| p <= 5.0)
    }

    pub fn json(&self) -> Value {
        json!({
            "nodes": self.nodes, "all_ready_s": self.all_ready_s, "apiserver_cpu_s": self.apiserver_cpu_s,
            "apiserver_rss_before_mib": self.apiserver_rss_before_mib,
            "apiserver_peak_rss_mib": self.apiserver_peak_rss_mib,
            "peak_requests_per_s": self.peak_requests_per_s, "requests": self.requests,
            "answers_429": self.throttled_429, "answers_504": self.timeouts_504,
            "claim_list_p99_upper_s": self.claim_list_p99_s.filter(|v| v.is_finite()),
            "pv_list_p99_upper_s": self.pv_list_p99_s.filter(|v| v.is_finite()),
            "claim_lists": self.claim_lists,
            "failed": self.failed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slopes_and_projection_follow_the_fitted_line() {
        let line: Curve = vec![(1.0, 1.1), (10.0, 2.0), (100.0, 11.0), (1000.0, 101.0)];
        assert!((slope(&line) - 0.1).abs() < 1e-9);
        assert!((segment_slope(&line) - 0.1).abs() < 1e-9);
        assert!((project(&line, PROJECT_TO) - 501.0).abs() < 1e-6);
        assert!(slope(&[(5.0, 1.0)]).is_nan());
        assert!(slope(&[(5.0, 1.0), (5.0, 2.0)]).is_nan(), "one x only");
        assert!(segment_slope(&[(1.0, 1.0)]).is_nan());
        let with_nan: Curve = vec![(1.0, f64::NAN), (10.0, 1.0), (20.0, 2.0)];
        assert!((slope(&with_nan) - 0.1).abs() < 1e-9, "non-finite points are left out");
    }

    #[test]
    fn cpu_per_change_takes_the_idle_window_out() {
        // 2 s of CPU in 13 s, idle 0.5 s in 13 s: 1.5 s over 50 changes = 30 ms.
        assert!((net_cpu_ms_per_change(2.0, 13.0, 0.5, 13.0, 50) - 30.0).abs() < 1e-9);
        // An idle window half as long counts double.
        assert!((net_cpu_ms_per_change(2.0, 13.0, 0.25, 6.5, 50) - 30.0).abs() < 1e-9);
    }

    #[test]
    fn the_events_resolution_follows_the_bookmark_count() {
        // 81 and 160 bookmarks, 50 changes, 500 nodes added: 2 * sqrt(241) / 50 / 500.
        assert!((events_resolution([81.0, 160.0], 50, 500.0) - 0.001_241_9).abs() < 1e-6);
        // More changes or more nodes: finer.
        assert!(events_resolution([81.0, 160.0], 100, 500.0) < events_resolution([81.0, 160.0], 50, 500.0));
        assert!(events_resolution([0.0, 0.0], 50, 0.0).is_nan());
    }

    #[test]
    fn events_per_change_take_the_idle_windows_bookmarks_out() {
        // 1,000 watches, 200 changes: 200,000 events, plus 500 bookmarks in 13 s; the idle
        // window of 13 s had 500 bookmarks too.
        assert!((net_events_per_change(200_500.0, 13.0, 500.0, 13.0, 200) - 1000.0).abs() < 1e-9);
        // An idle window twice as long counts twice the bookmarks for the same rate.
        assert!((net_events_per_change(200_500.0, 13.0, 1000.0, 26.0, 200) - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn projection_rates_scale_with_the_assumed_change_rate() {
        let nodes = |f: fn(f64) -> f64| -> Curve { [1.0, 10.0, 100.0].iter().map(|&n| (n, f(n))).collect() };
        let p = Projection::from_curves(&nodes(|n| 0.1 * n), &nodes(|n| n), &nodes(|n| 0.5 * n), &nodes(|_| 0.0));
        assert!((p.cpu_ms_per_change - 500.0).abs() < 1e-6);
        assert!((p.cores() - 500.0 * PROJECTED_CHANGES_PER_S / 1000.0).abs() < 1e-6);
        assert!((p.requests_per_s() - 2500.0 * PROJECTED_CHANGES_PER_S).abs() < 1e-6);
        assert!((p.events_per_change_per_node - 1.0).abs() < 1e-9);
    }

    #[test]
    fn quantile_of_bucket_deltas() {
        let text = "apiserver_request_duration_seconds_bucket{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"persistentvolumeclaims\",scope=\"cluster\",subresource=\"\",verb=\"LIST\",version=\"v1\",le=\"0.1\"} 90\n\
            apiserver_request_duration_seconds_bucket{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"persistentvolumeclaims\",scope=\"cluster\",subresource=\"\",verb=\"LIST\",version=\"v1\",le=\"1\"} 99\n\
            apiserver_request_duration_seconds_bucket{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"persistentvolumeclaims\",scope=\"cluster\",subresource=\"\",verb=\"LIST\",version=\"v1\",le=\"+Inf\"} 100\n\
            apiserver_request_duration_seconds_bucket{component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"persistentvolumes\",scope=\"cluster\",subresource=\"\",verb=\"LIST\",version=\"v1\",le=\"+Inf\"} 7\n";
        let after = duration_buckets(text, "LIST", "persistentvolumeclaims");
        assert_eq!(after, vec![(0.1, 90.0), (1.0, 99.0), (f64::INFINITY, 100.0)]);
        assert_eq!(bucket_quantile(&after, 0.99), Some(1.0));
        assert_eq!(bucket_quantile(&after, 0.5), Some(0.1));
        let before = vec![(0.1, 90.0), (1.0, 90.0), (f64::INFINITY, 90.0)];
        let delta = bucket_delta(&before, &after);
        assert_eq!(bucket_quantile(&delta, 0.99), Some(f64::INFINITY), "one of ten above 1 s");
        assert_eq!(bucket_quantile(&bucket_delta(&after, &after), 0.99), None);
    }

    #[test]
    fn peak_rate_of_cumulative_samples() {
        assert_eq!(peak_rate(&[(0.0, 0.0), (1.0, 10.0), (2.0, 40.0), (4.0, 50.0)]), 30.0);
        assert_eq!(peak_rate(&[(0.0, 0.0)]), 0.0);
    }
}

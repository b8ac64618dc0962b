//! Scale curve (`--scale-curve 1,10,50,100`): grows the number of provisioner processes against
//! a fixed set of claims and reports, per step, what each added node costs the API server.
//!
//! Per step: nodes are added until the step's count is reached, each waited for until ready,
//! then the bench lets them settle for a few seconds. Then it measures
//! - kube-apiserver CPU seconds from before the first node of the step was added to the end of
//!   the settling, and its RSS after (both from /proc of the PID the testbed started);
//! - an idle window of `--idle-secs`: every request the API server counted (its
//!   `apiserver_request_total`, the bench's own requests taken out) and the provisioners' own
//!   requests (audit log, exact), per second;
//! - the watches open per resource (`apiserver_longrunning_requests`, verb WATCH);
//! - per claim change, in a paced window (`fanout.rs`): an idle window, then `CHANGE_RATE`
//!   label changes per second on the claims for `--idle-secs`; the API server's CPU over it
//!   minus the idle window's, the claim watch events it sent (`apiserver_watch_events_total`)
//!   and the provisioners' requests (audit log), each divided by the changes;
//! - the same per PV change: each node watches PVs through two label-filtered, disjoint watches
//!   (its own PVs, and unlabelled ones of the Go build), so their count says little; what they
//!   cost is the events they deliver, compared with one unfiltered PV watch per node (1 event
//!   per PV change per node).
//!
//! With `--peer` the Go build is measured the same way at the steps of `--peer-at` (ours
//! stopped meanwhile), and after the last step every provisioner is restarted at once (a
//! rollout, `fanout::rollout`). The projection to 5,000 nodes is made from the slopes.
//!
//! The bench starts without provisioners, so the first step's figures are per node added too.
//! The claims (`--claims`, scenario "s") are created once on the first step's nodes, after its
//! CPU and RSS were taken, Bound, and deleted after the last step.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use super::api_count::{self, metric_sum};
use super::fanout::{self, GoStep, Paced, Projection, Rollout};
use super::procfs::{self, mib};
use super::report::{Table, opt};
use super::scenario::{self, Mode, Spec};
use super::setup::{self, Env, IMMEDIATE_CLASS};
use super::window;

/// Claims whose label the bench changes to count watch events per change.
const CHANGED_CLAIMS: usize = 20;
/// After the last node of a step is ready, before measuring.
const SETTLE: Duration = Duration::from_secs(3);
/// After the label changes, for the watch events to be sent.
const DELIVERY: Duration = Duration::from_secs(3);
/// Resources whose watches are reported.
const WATCHED: [&str; 3] = ["persistentvolumeclaims", "persistentvolumes", "storageclasses"];

/// What one step measured.
pub struct Step {
    pub nodes: usize,
    pub added: usize,
    /// kube-apiserver CPU seconds spent while the step's nodes were added and settled.
    pub apiserver_cpu_adding_s: f64,
    pub apiserver_rss_mib: f64,
    /// Change of the API server's RSS since the previous step (or since before the first node).
    pub apiserver_rss_delta_mib: f64,
    pub idle_secs: f64,
    pub idle_apiserver_cpu_s: f64,
    /// Requests counted by the API server in the idle window, the bench's own taken out.
    pub idle_requests: u64,
    /// The provisioners' requests in the idle window (audit log, exact).
    pub idle_provisioner_requests: u64,
    /// Of those, watches re-opened (each watch ends after its node's length, 5 to 10 minutes, and
    /// is re-opened from where it left off): the one request a watch-based controller makes at
    /// rest, served from the API server's cache.
    pub idle_watch_reopens: u64,
    /// Open watches by resource, at the end of the step.
    pub watches: BTreeMap<String, f64>,
    /// Watches opened while the step's nodes were added, by resource.
    pub watches_added: BTreeMap<String, f64>,
    /// Claim watch events the API server sent per claim change (the paced window's).
    pub watch_events_per_change: f64,
    /// The paced window of claim changes: API server CPU and provisioner requests per change.
    pub paced: Paced,
    /// PV watch events the API server sent per PV change.
    pub pv_watch_events_per_change: f64,
}

/// The curve, the Go build's steps (with `--peer`) and the rollout after the last step.
#[derive(Default)]
pub struct Run {
    pub steps: Vec<Step>,
    pub go: Vec<GoStep>,
    pub rollout: Option<Rollout>,
}

/// Runs the curve; `env` starts without nodes. The Go build is measured at the steps of
/// `peer_at` when `env` has a peer; `rollout`: every provisioner restarted at once at the end.
pub async fn run(env: &mut Env, steps: &[usize], peer_at: &[usize], rollout: bool) -> Result<Run> {
    let apiserver = env
        .cp
        .pids()
        .into_iter()
        .find(|(name, _)| *name == "kube-apiserver")
        .map(|(_, pid)| pid)
        .context("kube-apiserver PID")?;
    let spec = Spec {
        id: "s",
        title: "scale curve claims".into(),
        namespace: "bench-s".into(),
        mode: Mode::PinnedImmediate,
        class: IMMEDIATE_CLASS,
        rate: None,
    };
    let mut provisioned = None;
    let mut previous_rss = procfs::sample(apiserver)?.rss_kib;
    let mut previous_watches = open_watches(&api_count::apiserver_metrics(&env.client).await?);
    let mut result: Vec<Step> = Vec::new();
    let mut go = Vec::new();
    for (index, &target) in steps.iter().enumerate() {
        let before = procfs::sample(apiserver)?;
        let added = target.saturating_sub(env.nodes.len());
        eprintln!("bench: scale curve: {} -> {target} nodes", env.nodes.len());
        while env.nodes.len() < target {
            let name = setup::node_name(env.nodes.len() + 1);
            let node = setup::add_node(&env.cp, &env.client, &env.args, &name).await?;
            env.nodes.push(node);
        }
        tokio::time::sleep(SETTLE).await;
        let after = procfs::sample(apiserver)?;
        let watches_after_adding = open_watches(&api_count::apiserver_metrics(&env.client).await?);
        let provisioned = match &mut provisioned {
            Some(provisioned) => &*provisioned,
            None => {
                eprintln!("bench: scale curve: {} claims on {} nodes", env.args.claims, env.nodes.len());
                &*provisioned.insert(scenario::provision(env, spec.clone()).await?)
            }
        };
        let names: Vec<String> =
            (0..provisioned.sent.len().min(CHANGED_CLAIMS)).map(|i| format!("claim-{i:05}")).collect();
        let mut pv_names: Vec<String> = provisioned.sent.keys().map(|uid| format!("pvc-{uid}")).collect();
        pv_names.sort();
        pv_names.truncate(CHANGED_CLAIMS);

        let opened = window::open(env).await?;
        let idle_started = Instant::now();
        tokio::time::sleep(Duration::from_secs(env.args.idle_secs)).await;
        let idle = window::close(env, opened).await?;
        let idle_secs = idle_started.elapsed().as_secs_f64();
        let idle_requests = api_count::minus(&idle.apiserver, &idle.bench).values().sum();
        let idle_provisioner_requests = idle.audit.total().values().sum();
        let idle_watch_reopens = idle.audit.total().iter().filter(|(k, _)| k.verb == "watch").map(|(_, n)| n).sum();
        let idle_apiserver_cpu_s = idle.others_cpu.iter().find(|(n, _)| n == "kube-apiserver").map_or(0.0, |(_, c)| *c);

        let watches = open_watches(&api_count::apiserver_metrics(&env.client).await?);
        let namespace = provisioned.spec.namespace.clone();
        let secs = env.args.idle_secs as f64;
        let paced = fanout::paced_changes(env, apiserver, &namespace, &names, &format!("ours-{index}"), secs).await?;
        let metrics = api_count::apiserver_metrics(&env.client).await?;
        let pv_events_before = pv_watch_events(&metrics);
        change_pv_labels(env, &pv_names, index).await?;
        tokio::time::sleep(DELIVERY).await;
        let pv_events_after = pv_watch_events(&api_count::apiserver_metrics(&env.client).await?);
        result.push(Step {
            nodes: env.nodes.len(),
            added,
            apiserver_cpu_adding_s: after.cpu_secs - before.cpu_secs,
            apiserver_rss_mib: mib(after.rss_kib),
            apiserver_rss_delta_mib: (after.rss_kib as f64 - previous_rss as f64) / 1024.0,
            watches_added: watches_after_adding
                .iter()
                .map(|(r, w)| (r.clone(), w - previous_watches.get(r).copied().unwrap_or(0.0)))
                .collect(),
            idle_secs,
            idle_apiserver_cpu_s,
            idle_requests,
            idle_provisioner_requests,
            idle_watch_reopens,
            watches,
            watch_events_per_change: paced.events_per_change,
            paced,
            pv_watch_events_per_change: (pv_events_after - pv_events_before) / pv_names.len().max(1) as f64,
        });
        if let Some(step) = result.last() {
            eprintln!(
                "bench: scale curve: {} nodes: apiserver CPU {:.2} ms/claim change, {:.2} watch events/change, RSS {:.0} MiB",
                step.nodes,
                step.paced.cpu_ms_per_change(),
                step.watch_events_per_change,
                step.apiserver_rss_mib
            );
        }
        // The claims' share of the API server's memory stays out of the next step's delta.
        previous_rss = procfs::sample(apiserver)?.rss_kib;
        previous_watches = watches_after_adding;
        if env.peer.is_some() && peer_at.contains(&target) {
            go.push(fanout::go_step(env, apiserver, &namespace, &names, &format!("go-{index}")).await?);
            previous_rss = procfs::sample(apiserver)?.rss_kib;
            previous_watches = open_watches(&api_count::apiserver_metrics(&env.client).await?);
        }
    }
    let rollout = if rollout && !env.nodes.is_empty() {
        // Its failure must not lose the curve.
        match fanout::rollout(env, apiserver).await {
            Ok(rollout) => Some(rollout),
            Err(err) => {
                eprintln!("bench: rollout failed: {err:#}");
                None
            }
        }
    } else {
        None
    };
    eprintln!("bench: scale curve: deleting the claims");
    if let Some(provisioned) = &provisioned {
        // Its failure (a thousand processes reacting at once) must not lose the curve.
        if let Err(err) = scenario::delete(env, provisioned).await {
            eprintln!("bench: scale curve: deleting the claims failed: {err:#}");
        }
    }
    Ok(Run { steps: result, go, rollout })
}

/// Open watches by resource (`apiserver_longrunning_requests`, verb WATCH).
fn open_watches(metrics: &str) -> BTreeMap<String, f64> {
    WATCHED
        .iter()
        .map(|r| (r.to_string(), metric_sum(metrics, "apiserver_longrunning_requests", |l| is_watch_of(l, r))))
        .collect()
}

fn is_watch_of(labels: &BTreeMap<String, String>, resource: &str) -> bool {
    let get = |k: &str| labels.get(k).map(String::as_str);
    matches!(get("verb"), Some("WATCH" | "WATCHLIST")) && get("resource") == Some(resource)
}

/// `apiserver_watch_events_total` for PVs.
fn pv_watch_events(metrics: &str) -> f64 {
    metric_sum(metrics, "apiserver_watch_events_total", |l| {
        l.get("resource").is_some_and(|r| r == "persistentvolumes")
            || l.get("kind").is_some_and(|k| k == "PersistentVolume")
    })
}

/// A label change on each PV of `names` (the node label stays): a PV change no provisioner
/// has to act on.
async fn change_pv_labels(env: &Env, names: &[String], step: usize) -> Result<()> {
    let pvs: Api<PersistentVolume> = Api::all(env.client.clone());
    let patch = json!({ "metadata": { "labels": { "hpp-bench.example/step": step.to_string() } } });
    for name in names {
        pvs.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        env.calls.add("patch", "persistentvolumes");
    }
    Ok(())
}

/// What one added node cost, against the previous step.
struct PerNode {
    apiserver_cpu_s: f64,
    apiserver_rss_mib: f64,
    /// Watches opened, by resource.
    watches: BTreeMap<String, f64>,
    /// Watch events sent per claim change, and per PV change; NaN on the first step (nothing to
    /// compare with).
    claim_events: f64,
    pv_events: f64,
    /// API server CPU ms per claim change (paced window), NaN on the first step.
    cpu_ms_per_change: f64,
}

/// Per added node; `None` for a step that added no node.
fn per_added_node(steps: &[Step], i: usize) -> Option<PerNode> {
    let step = &steps[i];
    if step.added == 0 {
        return None;
    }
    let n = step.added as f64;
    let delta = |of: fn(&Step) -> f64| i.checked_sub(1).map_or(f64::NAN, |p| (of(step) - of(&steps[p])) / n);
    Some(PerNode {
        apiserver_cpu_s: step.apiserver_cpu_adding_s / n,
        apiserver_rss_mib: step.apiserver_rss_delta_mib / n,
        watches: step.watches_added.iter().map(|(r, w)| (r.clone(), w / n)).collect(),
        claim_events: delta(|s| s.watch_events_per_change),
        pv_events: delta(|s| s.pv_watch_events_per_change),
        cpu_ms_per_change: delta(|s| s.paced.cpu_ms_per_change()),
    })
}

pub fn print(steps: &[Step]) {
    let mut header = vec!["nodes", "added", "apiserver CPU s/added node", "apiserver RSS MiB (Δ/added node)"];
    header.extend(["idle req/s all (provisioners; goal 0)", "claim watches (Δ/added node; goal <= 1)"]);
    header.push("PV watches (Δ/added node; label-filtered)");
    header.push("watch events per claim change (Δ/added node; goal <= 1)");
    header.push("apiserver CPU ms per claim change (Δ/added node; goal <= 0.05)");
    header.push("watch events per PV change (Δ/added node; goal <= 1)");
    let mut t = Table::new("Scale curve: kube-apiserver cost per provisioner (node) added", &header);
    for (i, step) in steps.iter().enumerate() {
        let per = per_added_node(steps, i);
        let fmt = |v: f64| if v.is_nan() { "-".to_string() } else { format!("{v:.2}") };
        let watch = |r: &str| {
            let total = step.watches.get(r).copied().unwrap_or(0.0);
            let delta = per.as_ref().and_then(|p| p.watches.get(r).copied()).map_or("-".into(), fmt);
            format!("{total:.0} ({delta})")
        };
        let events = |total: f64, delta: fn(&PerNode) -> f64| {
            format!("{total:.2} ({})", per.as_ref().map_or("-".into(), |p| fmt(delta(p))))
        };
        t.row(vec![
            step.nodes.to_string(),
            step.added.to_string(),
            opt(per.as_ref().map(|p| p.apiserver_cpu_s), 2),
            format!(
                "{:.1} ({})",
                step.apiserver_rss_mib,
                per.as_ref().map_or("-".into(), |p| fmt(p.apiserver_rss_mib))
            ),
            format!(
                "{:.2} ({:.2})",
                step.idle_requests as f64 / step.idle_secs,
                step.idle_provisioner_requests as f64 / step.idle_secs
            ),
            watch("persistentvolumeclaims"),
            watch("persistentvolumes"),
            events(step.watch_events_per_change, |p| p.claim_events),
            format!(
                "{:.2} ({})",
                step.paced.cpu_ms_per_change(),
                per.as_ref().map_or("-".into(), |p| if p.cpu_ms_per_change.is_nan() {
                    "-".into()
                } else {
                    format!("{:.4}", p.cpu_ms_per_change)
                })
            ),
            events(step.pv_watch_events_per_change, |p| p.pv_events),
        ]);
    }
    t.print();
    println!("  goals: provisioners' idle requests/s 0; per added node at most one watch per resource:");
    println!("  claim watches Δ <= 1 and watch events per claim change Δ <= 1. Each node watches PVs through");
    println!("  two label-filtered, disjoint watches (its own PVs; unlabelled PVs of the Go build), so PVs are");
    println!("  judged on the events those deliver per PV change, against one unfiltered PV watch per node");
    println!("  (1 event per change per node): Δ <= 1. Then the API server's CPU and RSS per added node are");
    println!("  those of one watcher per resource.");
    if let Some(last) = steps.iter().enumerate().rev().find_map(|(i, _)| per_added_node(steps, i)) {
        let claim_watches = last.watches.get("persistentvolumeclaims").copied().unwrap_or(f64::NAN);
        println!(
            "  last step, per added node: claim watches {claim_watches:.2} (goal <= 1), claim events/change {:.2} \
             (goal <= 1), PV events/change {:.2} (goal <= 1; an unfiltered PV watch: 1)",
            last.claim_events, last.pv_events
        );
    }
}

/// (goal, measured, met) rows for the goals table of the full run: every step's idle requests,
/// and the worst step's cost per added node; "(other load)" below 100 nodes.
pub fn goal_rows(steps: &[Step]) -> Vec<(String, String, String)> {
    let Some(last) = steps.last() else {
        return vec![("scale curve".to_string(), "skipped (--grow-to 0)".to_string(), "-".to_string())];
    };
    let verdict = |ok: bool| {
        let v = if ok { "yes" } else { "NO" };
        if last.nodes >= 100 { v.to_string() } else { format!("{v} (other load)") }
    };
    let idle: Vec<String> = steps
        .iter()
        .map(|s| {
            format!("{} at {} nodes ({} watch re-opens)", s.idle_provisioner_requests, s.nodes, s.idle_watch_reopens)
        })
        .collect();
    let mut rows = vec![(
        "scale curve: provisioners' idle requests 0 but watch re-opens".to_string(),
        idle.join(", "),
        verdict(steps.iter().all(|s| s.idle_provisioner_requests == s.idle_watch_reopens)),
    )];
    let per: Vec<PerNode> = (0..steps.len()).filter_map(|i| per_added_node(steps, i)).collect();
    let worst = |of: fn(&PerNode) -> f64| per.iter().map(of).filter(|v| v.is_finite()).fold(f64::NAN, f64::max);
    let claim_watches = worst(|p| p.watches.get("persistentvolumeclaims").copied().unwrap_or(f64::NAN));
    let claim_events = worst(|p| p.claim_events);
    let pv_events = worst(|p| p.pv_events);
    let within = |v: f64| v.is_finite() && v <= 1.0;
    rows.push((
        "scale curve, per added node: <= 1 claim watch, <= 1 event per claim change".to_string(),
        format!("worst step: {claim_watches:.2} watches, {claim_events:.2} events per change"),
        verdict(within(claim_watches) && within(claim_events)),
    ));
    rows.push((
        "scale curve, per added node: PV events per PV change <= 1 (one unfiltered PV watch)".to_string(),
        format!("worst step: {pv_events:.2} (2 label-filtered, disjoint PV watches per node)"),
        verdict(within(pv_events)),
    ));
    rows
}

/// Ours' figures against nodes: (CPU ms, watch events, provisioner requests) per claim
/// change, and the provisioners' idle requests per second.
fn our_curves(steps: &[Step]) -> [fanout::Curve; 4] {
    let x = |s: &Step| s.nodes as f64;
    [
        steps.iter().map(|s| (x(s), s.paced.cpu_ms_per_change())).collect(),
        steps.iter().map(|s| (x(s), s.watch_events_per_change)).collect(),
        steps.iter().map(|s| (x(s), s.paced.all_requests_per_change())).collect(),
        steps.iter().map(|s| (x(s), s.idle_provisioner_requests as f64 / s.idle_secs.max(f64::EPSILON))).collect(),
    ]
}

/// The projection at 5,000 nodes of ours and, when measured, of the Go build.
pub fn projections(run: &Run) -> (Projection, Option<Projection>) {
    let [cpu, events, requests, idle] = our_curves(&run.steps);
    let ours = Projection::from_curves(&cpu, &events, &requests, &idle);
    let go = (run.go.len() >= 2).then(|| {
        let (cpu, events, requests) = fanout::go_curves(&run.go);
        Projection::from_curves(&cpu, &events, &requests, &Vec::new())
    });
    (ours, go)
}

/// Prints the curve, the Go build's steps, the projection and the rollout.
pub fn print_run(run: &Run) {
    print(&run.steps);
    fanout::print_go(&run.go);
    if run.steps.len() >= 2 {
        let (ours, go) = projections(run);
        fanout::print_projection(&ours, go.as_ref());
    }
    if let Some(rollout) = &run.rollout {
        fanout::print_rollout(rollout);
    }
}

/// Goal rows of issue #21 (fan-out and rollout) from a curve run.
pub fn fanout_goal_rows(run: &Run) -> Vec<(String, String, String)> {
    let steps = &run.steps;
    let last_nodes = steps.last().map_or(0, |s| s.nodes);
    let verdict = |ok: bool, full: bool| {
        let v = if ok { "yes" } else { "NO" };
        if full { v.to_string() } else { format!("{v} (other load)") }
    };
    let mut rows = Vec::new();
    let [cpu, events, _, _] = our_curves(steps);
    let at = format!("{last_nodes} nodes");
    let (segment_events, segment_cpu) = (fanout::segment_slope(&events), fanout::segment_slope(&cpu));
    let (fit_events, fit_cpu) = (fanout::slope(&events), fanout::slope(&cpu));
    let full = last_nodes >= 1000;
    if steps.len() < 2 {
        rows.push((
            "fan-out per added node at 1,000 nodes".to_string(),
            "not measured (make bench BENCH_ARGS=\"--scale-curve 1,10,100,500,1000\")".to_string(),
            "-".to_string(),
        ));
    } else {
        let resolution = match steps.as_slice() {
            [.., a, b] => fanout::events_resolution(
                [a.paced.idle_events, b.paced.idle_events],
                b.paced.changes,
                b.nodes as f64 - a.nodes as f64,
            ),
            _ => f64::NAN,
        };
        rows.push((
            format!(
                "per added node at 1,000 nodes: <= {} watch event per claim change (within the bookmarks' resolution)",
                fanout::GOAL_EVENTS_PER_CHANGE
            ),
            format!(
                "{segment_events:.4} (last segment, to {at}; resolution ±{resolution:.4}); {fit_events:.4} (fit over the steps)"
            ),
            verdict(
                segment_events.is_finite()
                    && segment_events <= fanout::GOAL_EVENTS_PER_CHANGE + if resolution.is_finite() { resolution.clamp(0.0, 0.01) } else { 0.0 },
                full,
            ),
        ));
        rows.push((
            format!(
                "per added node at 1,000 nodes: <= {} apiserver CPU-ms per claim change",
                fanout::GOAL_CPU_MS_PER_CHANGE
            ),
            format!("{segment_cpu:.4} (last segment, to {at}); {fit_cpu:.4} (fit over the steps)"),
            verdict(segment_cpu.is_finite() && segment_cpu <= fanout::GOAL_CPU_MS_PER_CHANGE, full),
        ));
        let (ours, go) = projections(run);
        let describe = |p: &Projection| {
            format!(
                "{:.0} req/s, {:.2} apiserver cores, {:.0} watch events per change",
                p.requests_per_s(),
                p.cores(),
                p.events_per_change
            )
        };
        rows.push((
            format!(
                "projection at {:.0} nodes, {:.0} claim changes/s (ours vs Go)",
                fanout::PROJECT_TO,
                fanout::PROJECTED_CHANGES_PER_S
            ),
            format!(
                "ours: {}; Go: {}",
                describe(&ours),
                go.as_ref().map_or("not measured (--peer)".to_string(), describe)
            ),
            "-".to_string(),
        ));
    }
    let go: Vec<String> = run
        .go
        .iter()
        .map(|g| {
            format!(
                "{:.3} claim GETs and {:.3} requests per node per change at {} nodes",
                g.paced.claim_gets_per_change() / g.nodes as f64,
                g.paced.all_requests_per_change() / g.nodes as f64,
                g.nodes
            )
        })
        .collect();
    rows.push((
        "Go build: claim GETs per node per claim change (10, 50 nodes)".to_string(),
        if go.is_empty() {
            "not measured (make bench-vs-go BENCH_ARGS=\"--scale-curve ...\")".into()
        } else {
            go.join("; ")
        },
        "-".to_string(),
    ));
    rows.push(match &run.rollout {
        Some(r) => (
            "rollout of 1,000 at once does not overload the API server (no 429/504, claim LIST p99 <= 5 s)".to_string(),
            format!(
                "{} at once ({} not ready): all ready in {:.1} s, {:.0} 429 / {:.0} 504, claim LIST p99 <= {} s, peak \
                 {:.0} req/s, apiserver {:.1} CPU s, peak RSS {:.0} MiB",
                r.nodes,
                r.failed.len(),
                r.all_ready_s,
                r.throttled_429,
                r.timeouts_504,
                r.claim_list_p99_s.map_or("-".to_string(), |p| format!("{p}")),
                r.peak_requests_per_s,
                r.apiserver_cpu_s,
                r.apiserver_peak_rss_mib
            ),
            verdict(r.not_overloaded(), r.nodes >= 1000),
        ),
        None => (
            "rollout of 1,000 at once does not overload the API server".to_string(),
            "not measured (the --scale-curve run ends with it)".to_string(),
            "-".to_string(),
        ),
    });
    rows
}

pub fn run_json(run: &Run) -> Value {
    let (ours, go) = projections(run);
    json!({
        "curve": json(&run.steps),
        "go": run.go.iter().map(|g| json!({ "nodes": g.nodes, "paced_claim_changes": g.paced.json(),
            "claim_gets_per_node_per_change": g.paced.claim_gets_per_change() / g.nodes as f64 })).collect::<Vec<_>>(),
        "projection": { "ours": ours.json(), "go": go.map(|g| g.json()) },
        "rollout": run.rollout.as_ref().map(Rollout::json),
        "goals": fanout_goal_rows(run).into_iter().map(|(t, m, v)| json!({"target": t, "measured": m, "met": v})).collect::<Vec<_>>(),
    })
}

pub fn json(steps: &[Step]) -> Value {
    let rows: Vec<Value> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let per = per_added_node(steps, i);
            let finite = |v: f64| v.is_finite().then_some(v);
            json!({
                "nodes": s.nodes, "added": s.added,
                "apiserver_cpu_s_while_adding": s.apiserver_cpu_adding_s,
                "apiserver_rss_mib": s.apiserver_rss_mib,
                "apiserver_rss_delta_mib": s.apiserver_rss_delta_mib,
                "idle_s": s.idle_secs,
                "idle_apiserver_cpu_s": s.idle_apiserver_cpu_s,
                "idle_requests_all_but_bench": s.idle_requests,
                "idle_requests_provisioners_audit": s.idle_provisioner_requests,
                "idle_watch_reopens_provisioners_audit": s.idle_watch_reopens,
                "open_watches": s.watches,
                "claim_watch_events_per_claim_change": s.watch_events_per_change,
                "paced_claim_changes": s.paced.json(),
                "pv_watch_events_per_pv_change": s.pv_watch_events_per_change,
                "per_added_node": per.map(|p| json!({
                    "apiserver_cpu_s": p.apiserver_cpu_s, "apiserver_rss_mib": p.apiserver_rss_mib,
                    "watches": p.watches.into_iter().map(|(r, w)| (r, json!(finite(w)))).collect::<serde_json::Map<_, _>>(),
                    "claim_watch_events_per_change": finite(p.claim_events),
                    "apiserver_cpu_ms_per_claim_change": finite(p.cpu_ms_per_change),
                    "pv_watch_events_per_change": finite(p.pv_events),
                })),
            })
        })
        .collect();
    json!({
        "steps": rows,
        "goals": { "idle_requests_provisioners_per_s": 0, "watches_per_added_node_per_resource_max": 1,
                   "claim_watch_events_per_change_per_added_node_max": 1,
                   "pv_watch_events_per_change_per_added_node_max": 1,
                   "pv_note": "PV watches are label-filtered and disjoint (2 per node); judged on events delivered" },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(nodes: usize, added: usize, claim_watches: f64, events: f64) -> Step {
        Step {
            nodes,
            added,
            apiserver_cpu_adding_s: 2.0 * added as f64,
            apiserver_rss_mib: 100.0,
            apiserver_rss_delta_mib: 3.0 * added as f64,
            idle_secs: 5.0,
            idle_apiserver_cpu_s: 0.1,
            idle_requests: 0,
            idle_provisioner_requests: 0,
            idle_watch_reopens: 0,
            watches: BTreeMap::from([("persistentvolumeclaims".to_string(), claim_watches)]),
            watches_added: BTreeMap::from([("persistentvolumeclaims".to_string(), 2.0 * added as f64)]),
            watch_events_per_change: events,
            paced: Paced::default(),
            pv_watch_events_per_change: events / 2.0,
        }
    }

    #[test]
    fn costs_are_divided_by_the_nodes_the_step_added() {
        let steps = [step(1, 1, 3.0, 3.0), step(5, 4, 11.0, 7.0), step(5, 0, 11.0, 7.0)];
        let p = per_added_node(&steps, 1).unwrap();
        assert_eq!((p.apiserver_cpu_s, p.apiserver_rss_mib, p.claim_events, p.pv_events), (2.0, 3.0, 1.0, 0.5));
        assert_eq!(p.watches["persistentvolumeclaims"], 2.0);
        assert!(per_added_node(&steps, 0).unwrap().claim_events.is_nan(), "no previous step to compare with");
        assert!(per_added_node(&steps, 2).is_none());
    }

    #[test]
    fn goals_take_the_worst_step_and_every_idle_window() {
        let mut steps = [step(10, 0, 20.0, 12.0), step(50, 40, 60.0, 52.0), step(100, 50, 110.0, 102.0)];
        for s in &mut steps {
            s.watches_added = BTreeMap::from([("persistentvolumeclaims".to_string(), s.added as f64)]);
        }
        let rows = goal_rows(&steps);
        assert_eq!(rows.len(), 3);
        assert!(rows.iter().all(|(_, _, met)| met == "yes"), "{rows:?}");
        let mut over = steps;
        over[2].watch_events_per_change = 252.0; // 4 events per change per added node
        over[1].idle_provisioner_requests = 4;
        let rows = goal_rows(&over);
        assert_eq!(rows[0].2, "NO", "{rows:?}");
        // Watches re-opened at rest are not held against it; anything else is.
        let mut reopened = [step(10, 0, 20.0, 12.0), step(50, 40, 60.0, 52.0), step(100, 50, 110.0, 102.0)];
        for s in &mut reopened {
            s.watches_added = BTreeMap::from([("persistentvolumeclaims".to_string(), s.added as f64)]);
        }
        reopened[1].idle_provisioner_requests = 3;
        reopened[1].idle_watch_reopens = 3;
        assert_eq!(goal_rows(&reopened)[0].2, "yes");
        reopened[1].idle_provisioner_requests = 4;
        assert_eq!(goal_rows(&reopened)[0].2, "NO");
        assert_eq!(rows[1].2, "NO", "{rows:?}");
        assert!(goal_rows(&over[..2])[2].2.ends_with("(other load)"), "below 100 nodes");
        assert_eq!(goal_rows(&[])[0].2, "-");
    }

    #[test]
    fn counts_only_watches_of_the_resource() {
        let text = "apiserver_longrunning_requests{component=\"apiserver\",group=\"\",resource=\"persistentvolumeclaims\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 4\n\
            apiserver_longrunning_requests{component=\"apiserver\",group=\"\",resource=\"persistentvolumes\",scope=\"cluster\",subresource=\"\",verb=\"WATCH\",version=\"v1\"} 2\n\
            apiserver_watch_events_total{group=\"\",resource=\"persistentvolumeclaims\",version=\"v1\"} 17\n";
        assert_eq!(
            metric_sum(text, "apiserver_longrunning_requests", |l| is_watch_of(l, "persistentvolumeclaims")),
            4.0
        );
        assert_eq!(fanout::claim_watch_events(text), 17.0);
    }
}

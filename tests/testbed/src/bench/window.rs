//! A measurement window: API requests (apiserver metrics, audit log, the bench's own count),
//! provisioner CPU and provisioner-side histograms between `open` and `close`.

use std::time::{Duration, Instant};

use anyhow::Result;
use serde_json::{Value, json};

use super::api_count::{self, AuditCounts, Counts};
use super::peer::Side;
use super::procfs::{self, ProcSample};
use super::report::per_volume;
use super::setup::Env;

/// State at the start of a window.
pub struct Opened {
    at: Instant,
    apiserver: Counts,
    bench: Counts,
    procs: Vec<ProcSample>,
    others: Vec<(String, ProcSample)>,
    machine: (f64, f64),
    histograms: Vec<[HistogramTotals; 2]>,
}

/// What happened during a window.
pub struct Closed {
    pub wall: Duration,
    /// Every resource request the API server counted (everyone's).
    pub apiserver: Counts,
    /// The bench's own requests (exact for writes, its watches' relists not included).
    pub bench: Counts,
    /// The provisioners' requests, from the audit log (exact).
    pub audit: AuditCounts,
    /// Per provisioner (node order): CPU seconds used in the window, and the sample at its end.
    pub cpu_secs: Vec<f64>,
    pub procs_end: Vec<ProcSample>,
    /// CPU seconds of the control-plane components and of the bench itself, by name.
    pub others_cpu: Vec<(String, f64)>,
    /// Share of the machine's CPU time that was busy (all processes, the bench's or not).
    pub machine_busy: f64,
    /// Sum over provisioners of their own histograms (count and sum of seconds) in the window.
    pub provision_hist: HistogramTotals,
    pub delete_hist: HistogramTotals,
}

/// `_count` and `_sum` of the provisioner's provision and delete duration histograms.
#[derive(Clone, Copy, Debug, Default)]
pub struct HistogramTotals {
    pub count: f64,
    pub sum: f64,
}

impl HistogramTotals {
    pub fn mean_ms(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count * 1000.0)
    }
}

pub async fn open(env: &Env) -> Result<Opened> {
    env.audit.mark()?;
    Ok(Opened {
        at: Instant::now(),
        apiserver: api_count::scrape_apiserver(&env.client).await?,
        bench: env.calls.snapshot(),
        procs: samples(env)?,
        others: other_samples(env),
        machine: procfs::machine_cpu()?,
        histograms: histograms(env).await,
    })
}

pub async fn close(env: &Env, opened: Opened) -> Result<Closed> {
    let apiserver = api_count::scrape_apiserver(&env.client).await?;
    let audit = env.audit.read_new()?;
    let procs_end = samples(env)?;
    let others = other_samples(env);
    let machine = procfs::machine_cpu()?;
    let after = histograms(env).await;
    let delta = |i: usize| {
        let mut total = HistogramTotals::default();
        for (before, after) in opened.histograms.iter().zip(&after) {
            total.count += after[i].count - before[i].count;
            total.sum += after[i].sum - before[i].sum;
        }
        total
    };
    Ok(Closed {
        wall: opened.at.elapsed(),
        apiserver: api_count::minus(&apiserver, &opened.apiserver),
        bench: api_count::minus(&env.calls.snapshot(), &opened.bench),
        audit,
        cpu_secs: procs_end.iter().zip(&opened.procs).map(|(a, b)| a.cpu_secs - b.cpu_secs).collect(),
        procs_end,
        others_cpu: opened
            .others
            .iter()
            .filter_map(|(name, before)| {
                let after = others.iter().find(|(n, _)| n == name)?;
                Some((name.clone(), after.1.cpu_secs - before.cpu_secs))
            })
            .collect(),
        machine_busy: (machine.0 - opened.machine.0) / (machine.1 - opened.machine.1).max(f64::EPSILON),
        provision_hist: delta(0),
        delete_hist: delta(1),
    })
}

fn samples(env: &Env) -> Result<Vec<ProcSample>> {
    env.provisioner_pids().into_iter().map(procfs::sample).collect()
}

/// The control-plane components and the bench itself.
fn other_samples(env: &Env) -> Vec<(String, ProcSample)> {
    let mut pids: Vec<(String, u32)> = env.cp.pids().into_iter().map(|(n, p)| (n.to_string(), p)).collect();
    pids.push(("bench".to_string(), std::process::id()));
    pids.into_iter().filter_map(|(name, pid)| Some((name, procfs::sample(pid).ok()?))).collect()
}

/// Per provisioner: totals of its [provision, delete] duration histograms.
async fn histograms(env: &Env) -> Vec<[HistogramTotals; 2]> {
    let mut out = Vec::new();
    if env.side != Side::Ours {
        return out; // the Go build exports no metrics
    }
    for node in &env.nodes {
        let text = node.provisioner.metrics().await.unwrap_or_default();
        let totals = |name: &str| {
            let value = |suffix: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("hostpath_provisioner_{name}_duration_seconds_{suffix} ")))
                    .and_then(|v| v.trim().parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            HistogramTotals { count: value("count"), sum: value("sum") }
        };
        out.push([totals("provision"), totals("delete")]);
    }
    out
}

/// Whether the provisioner exports a count of its own API requests (it did not when this
/// bench was written); the name of the first metric that looks like one.
pub async fn provisioner_request_metric(env: &Env) -> Option<String> {
    let text = env.nodes.first()?.provisioner.metrics().await.ok()?;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.contains("request") || l.contains("api_call"))
        .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_string())
}

impl Closed {
    /// All the provisioners' requests in the window (audit) per volume.
    pub fn requests_per_volume(&self, volumes: usize) -> Option<f64> {
        per_volume(self.audit.total().values().sum(), volumes)
    }

    pub fn provisioner_writes(&self, events: bool) -> u64 {
        api_count::sum(&self.audit.total(), |k| k.is_write() && k.is_event() == events)
    }

    /// Rows `request: apiserver total, bench, others, provisioners (audit)` for writes.
    pub fn write_rows(&self) -> Vec<(String, u64, u64, u64)> {
        let audit = self.audit.total();
        let mut keys: Vec<_> = self.apiserver.keys().chain(audit.keys()).filter(|k| k.is_write()).cloned().collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .map(|k| {
                let get = |c: &Counts| c.get(&k).copied().unwrap_or(0);
                (k.label(), get(&self.apiserver), get(&self.bench), get(&audit))
            })
            .collect()
    }

    pub fn json(&self) -> Value {
        let counts = |c: &Counts| -> Value { c.iter().map(|(k, v)| (k.label(), json!(v))).collect() };
        let per_user: Value = self.audit.by_user.iter().map(|(u, c)| (u.clone(), counts(c))).collect();
        let failed: Value = self.audit.failed.iter().map(|(u, c)| (u.clone(), counts(c))).collect();
        json!({
            "wall_s": self.wall.as_secs_f64(),
            "apiserver_request_total_delta": counts(&self.apiserver),
            "bench_requests": counts(&self.bench),
            "provisioner_requests_audit_total": counts(&self.audit.total()),
            "provisioner_requests_audit_by_user": per_user,
            "provisioner_failed_requests_audit": failed,
            "provisioner_cpu_s": self.cpu_secs,
            "other_cpu_s": self.others_cpu.iter().map(|(n, c)| (n.clone(), json!(c))).collect::<serde_json::Map<_, _>>(),
            "machine_busy_fraction": self.machine_busy,
            "provisioner_in_process_provision_mean_ms": self.provision_hist.mean_ms(),
            "provisioner_in_process_delete_mean_ms": self.delete_hist.mean_ms(),
        })
    }
}

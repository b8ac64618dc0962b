//! The goals of `make bench` (issues 13 and 21): each figure beside its target, the verdict
//! noting when the run's load differs from the target's, and the table that gathers them.

use super::Results;
use super::bench::args::Args;
use super::bench::memory;
use super::bench::peak_split;
use super::bench::procfs::{ProcSample, mib};
use super::bench::reference::REFERENCE_CLASS;
use super::bench::report::{Table, opt, per_volume};
use super::bench::scale_curve;
use super::bench::scenario::{Deleted, Mode, Provisioned};
use super::bench::setup::Env;

/// PVs/s of scenario `id`.
pub(super) fn pvs_per_sec(results: &[(Provisioned, Deleted)], id: &str) -> Option<f64> {
    results.iter().find(|(p, _)| p.spec.id == id).and_then(|(p, _)| p.pvs_per_sec)
}

/// Ours (c) as a fraction of the reference (r), the pipeline's limit on this machine, per
/// round (r then c), and their median.
pub(super) fn reference_fractions(all: &Results) -> (Vec<Option<f64>>, Option<f64>) {
    let first = (pvs_per_sec(&all.scenarios, "r"), pvs_per_sec(&all.scenarios, "c"));
    let rounds: Vec<Option<f64>> = std::iter::once(first)
        .chain(all.later_rounds.iter().copied())
        .map(|(r, c)| Some(c? / r.filter(|r| *r > 0.0)?))
        .collect();
    let mut known: Vec<f64> = rounds.iter().flatten().copied().collect();
    known.sort_by(f64::total_cmp);
    let median = (!known.is_empty()).then(|| {
        let mid = known.len() / 2;
        if known.len() % 2 == 1 { known[mid] } else { (known[mid - 1] + known[mid]) / 2.0 }
    });
    (rounds, median)
}

pub(super) fn percent(fraction: Option<f64>) -> String {
    fraction.map_or("-".to_string(), |f| format!("{:.0}%", f * 100.0))
}

/// Issue 13, point 2: every request of the provisioners (reads, writes, events) per volume.
pub(super) const PROVISION_REQUESTS_GOAL: f64 = 2.0;
pub(super) const DELETE_REQUESTS_GOAL: f64 = 1.5;

/// Issue 21: the peak RSS of every provisioner in the burst (c), 10 nodes, 1,000 claims.
pub(super) const BURST_PEAK_GOAL_MIB: f64 = 20.0;

/// The peak of provisioner `i` over the whole run: the peaks are reset before each scenario, so
/// the largest of each scenario's and the last reading's.
pub(super) fn run_peak_kib(all: &Results, i: usize, end: &ProcSample) -> u64 {
    let scenario_peaks = all.scenarios.iter().filter_map(|(_, d)| d.window.procs_end.get(i)).map(|s| s.hwm_kib);
    scenario_peaks.chain([end.hwm_kib]).max().unwrap_or(0)
}

/// Max / mean over the provisioners of their peak (VmHWM), MiB.
pub(super) fn peak_line(samples: &[ProcSample]) -> String {
    let max = samples.iter().map(|s| s.hwm_kib).max().unwrap_or(0);
    let mean = samples.iter().map(|s| s.hwm_kib).sum::<u64>() / samples.len().max(1) as u64;
    format!("{:.1} / {:.1}", mib(max), mib(mean))
}

/// The goal row of c's peak per node (none when c did not run). The peaks were reset before c
/// started, so its deletion window's VmHWM covers its provisioning and its deletion.
pub(super) fn burst_peak_goal(args: &Args, results: &[(Provisioned, Deleted)]) -> Vec<(String, String, String)> {
    let Some((p, d)) = results.iter().find(|(p, _)| p.spec.id == "c") else { return Vec::new() };
    let worst = d.window.procs_end.iter().map(|s| s.hwm_kib).max().unwrap_or(0);
    let met = if mib(worst) < BURST_PEAK_GOAL_MIB { "yes" } else { "NO" };
    let same_load = args.nodes == 10 && args.claims >= 1000;
    vec![
        (
            format!("c: peak RSS per node < {BURST_PEAK_GOAL_MIB:.0} MiB, 1000 claims over 10 nodes"),
            format!(
                "max / mean {} MiB ({} claims, {} nodes; provisioning and deletion); {}",
                peak_line(&d.window.procs_end),
                p.sent.len(),
                args.nodes,
                peak_split::split_line(&d.sampled_peaks)
            ),
            if same_load { met.to_string() } else { format!("{met} (other load)") },
        ),
        {
            // The part of the peak that differs between machines is the binary's pages a kernel maps
            // around each fault; with all of them resident, no kernel can map more.
            let bound = peak_split::worst_case_kib(&d.sampled_peaks);
            let met = if mib(bound) < BURST_PEAK_GOAL_MIB { "yes" } else { "NO" };
            (
                format!(
                    "c: the same peak with all of the binary resident < {BURST_PEAK_GOAL_MIB:.0} MiB (any machine)"
                ),
                format!("{:.1} MiB (the largest heap and stacks + the binary's mappings)", mib(bound)),
                if same_load { met.to_string() } else { format!("{met} (other load)") },
            )
        },
    ]
}

/// The goals table of a run that measures only some goals.
pub(super) fn print_goals(rows: impl IntoIterator<Item = (String, String, String)>) {
    let mut t = Table::new("Goals (issue 21; reported, not asserted)", &["goal", "measured", "met"]);
    for (target, measured, met) in rows {
        t.row(vec![target, measured, met]);
    }
    t.print();
}

pub(super) fn rss_line(samples: &[ProcSample]) -> String {
    let max = samples.iter().map(|s| s.rss_kib).max().unwrap_or(0);
    let mean = samples.iter().map(|s| s.rss_kib).sum::<u64>() / samples.len().max(1) as u64;
    format!("{:.1} / {:.1}", mib(max), mib(mean))
}

/// (target, measured, verdict) rows. A verdict notes when the load differs from the target's.
pub(super) fn targets(env: &Env, all: &Results) -> Vec<(String, String, String)> {
    let (results, many) = (&all.scenarios, &all.many);
    let args = &env.args;
    let verdict = |ok: bool, same_load: bool| {
        let v = if ok { "yes" } else { "NO" };
        if same_load { v.to_string() } else { format!("{v} (other load)") }
    };
    let mut rows = Vec::new();
    let paced: Vec<_> = results.iter().filter(|(p, _)| p.spec.rate.is_some()).collect();
    let worst_p99 = paced.iter().map(|(p, _)| p.latency.p99).fold(0.0, f64::max);
    rows.push((
        "p99 latency < 100 ms at 50 claims/s".to_string(),
        paced
            .iter()
            .map(|(p, _)| match p.spec.mode {
                Mode::PinnedImmediate => format!("{}: {:.1} ms", p.spec.id, p.latency.p99),
                Mode::WaitForFirstConsumer => format!(
                    "{}: {:.1} ms ({:.1} ms after the kcm annotation)",
                    p.spec.id, p.latency.p99, p.from_both_annotations.p99
                ),
            })
            .collect::<Vec<_>>()
            .join(", "),
        verdict(worst_p99 < 100.0, (args.rate - 50.0).abs() < f64::EPSILON),
    ));
    let burst = pvs_per_sec(results, "c");
    rows.push((
        ">= 100 PVs/s sustained, 1000 claims over 10 nodes".to_string(),
        format!("c: {} PVs/s ({} claims, {} nodes)", opt(burst, 1), args.claims, args.nodes),
        verdict(burst.unwrap_or(0.0) >= 100.0, args.claims >= 1000 && args.nodes == 10),
    ));
    rows.extend(burst_peak_goal(args, results));
    let (rounds, fraction) = reference_fractions(all);
    rows.push((
        "ours >= 90% of the reference in c at 10 nodes".to_string(),
        format!(
            "{} (round 1: c {} / r {} PVs/s; median of {} rounds; {} nodes)",
            percent(fraction),
            opt(burst, 1),
            opt(pvs_per_sec(results, "r"), 1),
            rounds.len(),
            args.nodes
        ),
        verdict(fraction.unwrap_or(0.0) >= 0.9, args.nodes == 10),
    ));
    let b = results.iter().find(|(p, _)| p.spec.mode == Mode::WaitForFirstConsumer);
    rows.push((
        "b p99 < 250 ms at 10 nodes, 50 claims/s (selected-node -> PV)".to_string(),
        b.map_or("-".to_string(), |(p, _)| format!("{:.1} ms ({} nodes, {}/s)", p.latency.p99, args.nodes, args.rate)),
        b.map_or("-".to_string(), |(p, _)| {
            verdict(p.latency.p99 < 250.0, args.nodes == 10 && (args.rate - 50.0).abs() < f64::EPSILON)
        }),
    ));
    let ours: Vec<&(Provisioned, Deleted)> = results.iter().filter(|(p, _)| p.spec.class != REFERENCE_CLASS).collect();
    for (what, goal, deletion) in
        [("provision", PROVISION_REQUESTS_GOAL, false), ("delete", DELETE_REQUESTS_GOAL, true)]
    {
        let per: Vec<(&str, f64)> = ours
            .iter()
            .filter_map(|(p, d)| {
                let window = if deletion { &d.window } else { &p.window };
                Some((p.spec.id, window.requests_per_volume(p.sent.len())?))
            })
            .collect();
        let worst = per.iter().map(|(_, v)| *v).fold(0.0, f64::max);
        rows.push((
            format!("API requests per {what} <= {goal} (all kinds, audit, amortised)"),
            per.iter().map(|(id, v)| format!("{id}: {v:.2}")).collect::<Vec<_>>().join(", "),
            verdict(!per.is_empty() && worst <= goal, true),
        ));
    }
    match &all.memory {
        Some(m) => rows.push((
            format!("RSS < {:.0} MiB, 100,000 claims in the cluster, 100 the node's", memory::GOAL_MIB),
            format!(
                "peak {:.1} MiB (RSS {:.1} after the list, {:.1} after {} provisions; {} claims; {:.1} KiB per own claim)",
                m.judged_mib(),
                mib(m.after_list.rss_kib),
                mib(m.after_own.rss_kib),
                memory::OWN,
                m.claims_in_cluster(),
                m.per_own_claim_kib()
            ),
            memory::verdict(m),
        )),
        None => rows.push((
            format!("RSS < {:.0} MiB, 100,000 claims in the cluster, 100 the node's", memory::GOAL_MIB),
            "skipped (--memory-claims 0)".to_string(),
            "-".to_string(),
        )),
    }
    rows.push(memory::per_own_goal(all.memory.as_ref()));
    let created = pvs_per_sec(results, "c");
    let deleted = results.iter().find(|(p, _)| p.spec.id == "c").and_then(|(_, d)| d.pvs_deleted_per_sec);
    rows.push((
        "deletion PVs/s >= creation PVs/s in c".to_string(),
        format!("c: deletion {} vs creation {} PVs/s", opt(deleted, 1), opt(created, 1)),
        verdict(deleted.zip(created).is_some_and(|(d, c)| d >= c), true),
    ));
    let idle_requests: u64 = all.idle.window.audit.total().values().sum();
    rows.push((
        "provisioners' API requests at idle: 0".to_string(),
        format!("{idle_requests} in {:.1} s, {} nodes", all.idle.window.wall.as_secs_f64(), args.nodes),
        verdict(idle_requests == 0, true),
    ));
    rows.extend(scale_curve::goal_rows(&all.curve.steps));
    rows.extend(scale_curve::fanout_goal_rows(&all.curve));
    rows.push((
        "start -> ready with 100,000 claims and 10,000 PVs".to_string(),
        "not measured here (make bench BENCH_ARGS=\"--big-start 100000,10000\")".to_string(),
        "-".to_string(),
    ));
    let gone = many.released_to_pv_gone.map(|d| d.as_secs_f64());
    rows.push((
        "100k-file volume: PV gone < 1 s after Released".to_string(),
        format!("{} s ({} files)", opt(gone, 3), many.files),
        verdict(gone.is_some_and(|g| g < 1.0), many.files >= 100_000),
    ));
    let mut worst = 0.0f64;
    let mut parts = Vec::new();
    for (p, d) in results {
        let prov = per_volume(p.window.provisioner_writes(false), p.sent.len()).unwrap_or(0.0);
        let del = per_volume(d.window.provisioner_writes(false), p.sent.len()).unwrap_or(0.0);
        worst = worst.max(prov).max(del);
        parts.push(format!("{}: {prov:.2} + {del:.2}", p.spec.id));
    }
    rows.push((
        "<= 2 API writes per volume beyond events".to_string(),
        format!("provision + delete: {}", parts.join(", ")),
        verdict(worst <= 2.0, true),
    ));
    rows
}

//! `make bench`: speed and footprint of the provisioner on a local control plane with N
//! simulated nodes. Figures are reported (stdout tables and a JSON file), never asserted.
//!
//! Scenarios, each with `--claims` claims, deleted again before the next:
//! a. Immediate class, claims pinned with `kubevirt.io/provisionOnNode` round-robin, `--rate`/s;
//! b. WaitForFirstConsumer, one pod per claim pinned round-robin by nodeSelector, `--rate`/s;
//! r. as c (below), provisioned by the reference: a minimal provisioner inside the bench that
//!    only creates PVs (`bench/reference.rs`), the limit of this machine's pipeline;
//! c. as a, created as fast as `--clients` clients can (throughput), right after r.
//!
//! Each scenario's peak RSS per provisioner is its own: the peaks are reset before it starts.
//! `--scenarios c` (or `r,c`, ...) runs only those scenarios and prints their figures.
//!
//! Then the scale curve (`bench/scale_curve.rs`): the provisioners are grown from `--nodes` to
//! each count of `--grow-to` (default 50, 100). `--scale-curve 1,10,...` runs only the curve.
//!
//! Then a volume holding `--files` files is deleted, timed from Released to PV gone, directory
//! gone from its path, and data gone from the pool.
//!
//! Last, memory (`bench/memory.rs`): `--memory-claims` claims with Helm/Argo CD metadata in the
//! cluster, 100 of them a fresh provisioner's; it stops kube-controller-manager and the other
//! provisioners, so nothing runs after it. `--memory-only` runs only this.
//!
//! `--peer PATH` (`make bench-vs-go`) runs only a, b and c, each by ours then by the Go build
//! this project replaces on the same nodes, and prints their ratios (`bench/vs_peer.rs`).
//!
//! Every figure is printed with its goal beside it and gathered in a table of goals at the end.
//! Method notes: `bench/report.rs` (printed at the end).

#[path = "../../bench/mod.rs"]
mod bench;
mod goals;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use bench::args::{Args, USAGE};
use bench::block_io::{self, BlockIo};
use bench::clones::{self, Clones};
use bench::many_files::{self, ManyFiles};
use bench::memory::{self, Memory};
use bench::peak_split::PeakSampler;
use bench::plot::{self, Series};
use bench::procfs::{self, ProcSample, mib};
use bench::quota_latency::{self, QuotaLatency};
use bench::reference::{REFERENCE_CLASS, Reference};
use bench::report::{METHOD, Table, opt, per_volume};
use bench::scale_curve;
use bench::scenario::{self, Deleted, Mode, Provisioned, Spec};
use bench::setup::{self, Env, IMMEDIATE_CLASS};
use bench::startup;
use bench::vs_peer;
use bench::window::{self, Closed};
use goals::{
    BURST_PEAK_GOAL_MIB, DELETE_REQUESTS_GOAL, PROVISION_REQUESTS_GOAL, burst_peak_goal, peak_line, percent,
    print_goals, pvs_per_sec, reference_fractions, rss_line, run_peak_kib, targets,
};

#[tokio::main]
async fn main() -> ExitCode {
    let args = match Args::parse() {
        Ok(args) => args,
        Err(err) => {
            eprintln!("bench: {err:#}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut env = None;
    let outcome = tokio::select! {
        result = run(&args, &mut env) => Some(result),
        _ = tokio::signal::ctrl_c() => None,
    };
    let code = match outcome {
        Some(Ok(())) => ExitCode::SUCCESS,
        Some(Err(err)) => {
            eprintln!("bench FAILED: {err:#}");
            if let Some(env) = &env {
                env.log_tails(3, 10).iter().for_each(|(name, tail)| eprintln!("--- {name} ---\n{tail}"));
            }
            ExitCode::FAILURE
        }
        None => {
            eprintln!("bench: interrupted (Ctrl-C)");
            ExitCode::from(130)
        }
    };
    if let (Some(env), Some(limit)) = (&env, args.memory_limit) {
        let kills = setup::oom_kills(&env.nodes) + testbed::memory_cgroup::oom_kills_in_removed_cgroups();
        println!(
            "memory limit: every provisioner ran in a memory cgroup of {:.0} MiB (--memory-limit); OOM kills: {kills}",
            limit as f64 / 1_048_576.0
        );
    }
    if let Some(env) = &env {
        let dir = args.out.parent().unwrap_or(std::path::Path::new(".")).join("bench-logs");
        match save_logs(env, &dir) {
            Ok(()) => eprintln!("bench: provisioner and control-plane logs copied to {}", dir.display()),
            Err(err) => eprintln!("bench: could not copy the logs: {err:#}"),
        }
    }
    eprintln!("bench: stopping the provisioners and the control plane");
    drop(env);
    code
}

/// Everything measured, for the tables and the JSON.
struct Results {
    scenarios: Vec<(Provisioned, Deleted)>,
    idle: Idle,
    many: ManyFiles,
    clones: Clones,
    /// Block volumes' loop device against its backing file, and FICLONE.
    block: BlockIo,
    /// The extra latency of a quota volume.
    quota: QuotaLatency,
    /// Per provisioner, before the first scenario (no claims yet) and at the end.
    at_start: Vec<ProcSample>,
    at_end: Vec<ProcSample>,
    /// A provisioner metric that looks like an API request counter, if any.
    own_metric: Option<String>,
    /// Failed PV creations and watch errors of the reference provisioner.
    reference_errors: Vec<String>,
    /// PVs/s of (r, c) in the rounds after the first (`--reference-rounds`).
    later_rounds: Vec<(Option<f64>, Option<f64>)>,
    /// The scale curve from `--nodes` up to `--grow-to`, unless skipped.
    curve: scale_curve::Run,
    /// The memory scenario (`--memory-claims`, run last), unless skipped.
    memory: Option<Memory>,
}

/// What the idle window measured.
struct Idle {
    window: Closed,
    claims_in_cluster: usize,
}

async fn run(args: &Args, slot: &mut Option<Env>) -> Result<()> {
    eprintln!(
        "bench: {} nodes, {} claims per scenario, {}/s, {} clients{}",
        args.nodes,
        args.claims,
        args.rate,
        args.clients,
        if args.quick { " (quick)" } else { "" }
    );
    if args.block_only {
        let block = tokio::task::spawn_blocking(|| block_io::run(&block_io_dir())).await??;
        block.print();
        write_json(&args.out, &json!({ "config": config_json(args), "block": block.json() }))?;
        return Ok(());
    }
    let env = slot.insert(setup::start(args).await?);
    if !args.scale_curve.is_empty() {
        let run = scale_curve::run(env, &args.scale_curve, &args.peer_at, true).await?;
        scale_curve::print_run(&run);
        print_goals(scale_curve::goal_rows(&run.steps).into_iter().chain(scale_curve::fanout_goal_rows(&run)));
        write_json(&args.out, &json!({ "config": config_json(args), "scale_curve": scale_curve::run_json(&run) }))?;
        return Ok(());
    }
    if let Some((claims, pvs, at_once)) = args.big_start {
        let big = startup::run(env, claims, pvs, at_once).await?;
        startup::print(&big);
        print_goals(startup::goal_rows(&big));
        write_json(&args.out, &json!({ "config": config_json(args), "big_start": startup::json(&big) }))?;
        return Ok(());
    }
    if args.peer.is_some() {
        let runs = vs_peer::run(env).await?;
        vs_peer::print(env, &runs);
        write_json(&args.out, &json!({ "config": config_json(args), "vs_peer": vs_peer::json(env, &runs) }))?;
        let svg = args.out.with_extension("svg");
        std::fs::write(&svg, vs_peer::plot(env, &runs)).with_context(|| format!("writing {}", svg.display()))?;
        println!("SVG: {}", svg.display());
        return Ok(());
    }
    if args.clones_only {
        let clones = clones::run(env).await?;
        print_clones(&clones);
        return Ok(());
    }
    if args.memory_only {
        let memory = memory::run(env).await?;
        memory::print(&memory);
        write_json(&args.out, &json!({ "config": config_json(args), "memory": memory::json(&memory) }))?;
        return Ok(());
    }
    let own_metric = window::provisioner_request_metric(env).await;
    let at_start = samples(env)?;
    let mut scenarios: Vec<(Provisioned, Deleted)> = Vec::new();
    let mut idle = None;
    let mut reference_errors = Vec::new();
    let chosen = |id: &str| args.scenarios.is_empty() || args.scenarios.iter().any(|c| c == id);
    for spec in scenario::standard(args.rate).into_iter().filter(|s| chosen(s.id)) {
        let (id, class) = (spec.id, spec.class);
        // The peak (VmHWM) read after the scenario's deletion is then the scenario's own.
        env.provisioner_pids().into_iter().try_for_each(procfs::reset_peak)?;
        let sampler = PeakSampler::start(env.provisioner_pids());
        eprintln!("bench: scenario {id}: {}", spec.title);
        // Runs only during its own scenario, so it adds no watch to the others; a client of its
        // own, so it shares no connection with the bench's watches.
        let reference = (class == REFERENCE_CLASS).then(|| Reference::start(env.cp.admin_client()));
        let provisioned = scenario::provision(env, spec).await?;
        if idle.is_none() && args.scenarios.is_empty() {
            eprintln!("bench: idle window of {} s", args.idle_secs);
            let opened = window::open(env).await?;
            tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
            idle = Some(Idle { window: window::close(env, opened).await?, claims_in_cluster: provisioned.sent.len() });
        }
        eprintln!("bench: scenario {id}: deleting");
        let mut deleted = scenario::delete(env, &provisioned).await?;
        deleted.sampled_peaks = sampler.finish().await;
        if let Some(reference) = reference {
            reference_errors = reference.errors();
        }
        scenarios.push((provisioned, deleted));
    }
    if !args.scenarios.is_empty() {
        print_provisioning(env, &scenarios);
        let mut t = Table::new("Goals (reported, not asserted)", &["goal", "measured", "met"]);
        for (target, measured, met) in burst_peak_goal(args, &scenarios) {
            t.row(vec![target, measured, met]);
        }
        t.print();
        let json: Vec<Value> = scenarios.iter().map(scenario_json).collect();
        write_json(&args.out, &json!({ "config": config_json(args), "scenarios": json }))?;
        return Ok(());
    }
    let mut later_rounds = Vec::new();
    for round in 2..=args.reference_rounds {
        let mut rates = [None, None];
        for (slot, (id, class)) in [("r", REFERENCE_CLASS), ("c", IMMEDIATE_CLASS)].into_iter().enumerate() {
            eprintln!("bench: reference round {round}: scenario {id}");
            let reference = (class == REFERENCE_CLASS).then(|| Reference::start(env.cp.admin_client()));
            let title = format!("round {round} of {id}");
            let namespace = format!("bench-{id}{round}");
            let spec = Spec { id, title, namespace, mode: Mode::PinnedImmediate, class, rate: None };
            let provisioned = scenario::provision(env, spec).await?;
            scenario::delete(env, &provisioned).await?;
            if let Some(reference) = reference {
                reference_errors.extend(reference.errors());
            }
            rates[slot] = provisioned.pvs_per_sec;
        }
        later_rounds.push((rates[0], rates[1]));
    }
    eprintln!("bench: deleting a volume holding {} files", args.files);
    let many = many_files::run(env).await?;
    eprintln!("bench: cloning a 1 GiB volume (reflink on XFS, bytes on ext4)");
    let clones = clones::run(env).await?;
    eprintln!("bench: Block volume I/O (loop device vs its backing file) and FICLONE of 1 GiB");
    let block = tokio::task::spawn_blocking(|| block_io::run(&block_io_dir())).await??;
    eprintln!("bench: provisioning latency with and without an enforced quota (btrfs)");
    let quota = quota_latency::run(env).await?;
    let at_end = samples(env)?;
    let mut curve_steps = vec![env.nodes.len()];
    curve_steps.extend(args.grow_to.iter().copied().filter(|n| *n > env.nodes.len()));
    let curve = if curve_steps.len() > 1 {
        eprintln!("bench: scale curve: growing the provisioners {curve_steps:?}");
        scale_curve::run(env, &curve_steps, &[], false).await?
    } else {
        scale_curve::Run::default()
    };
    // Last: it stops the other provisioners and kube-controller-manager, and leaves its claims.
    let memory = if args.memory_claims > 0 {
        eprintln!(
            "bench: memory with {} claims in the cluster, {} of them one node's",
            args.memory_claims,
            memory::OWN
        );
        Some(memory::run(env).await?)
    } else {
        None
    };
    let results = Results {
        scenarios,
        idle: idle.context("idle window")?,
        many,
        clones,
        block,
        at_start,
        at_end,
        own_metric,
        reference_errors,
        later_rounds,
        quota,
        curve,
        memory,
    };
    print_results(env, &results);
    write_json(&args.out, &to_json(env, &results))?;
    let svg = args.out.with_extension("svg");
    std::fs::write(&svg, plot_of(args, &results.scenarios)).with_context(|| format!("writing {}", svg.display()))?;
    println!("SVG: {}", svg.display());
    Ok(())
}

fn write_json(out: &std::path::Path, value: &Value) -> Result<()> {
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(out, serde_json::to_string_pretty(value)?).with_context(|| format!("writing {}", out.display()))?;
    println!("\nJSON: {}", out.display());
    Ok(())
}

/// Latency distribution and PVs over time of every scenario.
fn plot_of(args: &Args, scenarios: &[(Provisioned, Deleted)]) -> String {
    let series: Vec<Series> = scenarios
        .iter()
        .map(|(p, _)| Series {
            label: format!(
                "{}: {}{}",
                p.spec.id,
                if p.spec.class == REFERENCE_CLASS { "reference, " } else { "" },
                p.spec.rate.map_or("burst".to_string(), |r| format!("{r}/s"))
            ),
            latency_ms: p.latency_samples_ms.clone(),
            pv_seen_secs: p.pv_seen_secs.clone(),
        })
        .collect();
    let title = format!(
        "hostpath-provisioner bench: {} nodes, {} claims per scenario (a, b: paced; r: reference; c: ours, burst)",
        args.nodes, args.claims
    );
    plot::render(&title, &series)
}

fn samples(env: &Env) -> Result<Vec<ProcSample>> {
    env.nodes.iter().map(|n| procfs::sample(n.provisioner.pid())).collect()
}

/// Copies every log out of the control plane's temp dir, which is removed on exit.
fn save_logs(env: &Env, dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut sources: Vec<PathBuf> = env.nodes.iter().map(|n| n.provisioner.log_path().to_owned()).collect();
    sources.extend(env.peer.iter().flat_map(|p| p.log_paths()));
    sources.extend(env.cp.log_paths().into_iter().map(|(_, p)| p.to_owned()));
    for source in &sources {
        let name = source.file_name().context("log file name")?;
        std::fs::copy(source, dir.join(name)).with_context(|| format!("copying {}", source.display()))?;
    }
    Ok(())
}

/// Where the Block I/O runs: under `target/`, on the disk the project's pools would use here.
fn block_io_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/bench-block")
}

fn print_clones(clones: &Clones) {
    let mut t = Table::new("Cloning a 1 GiB volume (last node)", &["method", "filesystem", "claim created -> Bound"]);
    for c in &clones.times {
        t.row(vec![c.method.into(), c.fstype.into(), format!("{:.2} s", c.create_to_bound.as_secs_f64())]);
    }
    t.print();
}

fn print_results(env: &Env, all: &Results) {
    let (results, idle, many) = (&all.scenarios, &all.idle, &all.many);
    print_provisioning(env, results);
    print_after_provisioning(env, all, results, idle, many);
}

/// The header and the table of the provisioning scenarios.
fn print_provisioning(env: &Env, results: &[(Provisioned, Deleted)]) {
    let args = &env.args;
    println!(
        "\nhostpath-provisioner bench: {} nodes, {} claims per scenario, {} claims/s (a, b), {} clients",
        args.nodes, args.claims, args.rate, args.clients
    );
    for (p, _) in results {
        let rate = p.spec.rate.map_or("as fast as the clients go".to_string(), |r| format!("{r}/s"));
        println!("  {} = {}, {} claims, {rate}", p.spec.id, p.spec.title, p.sent.len());
    }
    let header: Vec<&str> = std::iter::once("").chain(results.iter().map(|(p, _)| p.spec.id)).collect();
    let mut table = Table::new("Provisioning (latency: claim became the node's -> PV, see Method)", &header);
    let mut add = |label: &str, cell: &dyn Fn(&Provisioned, &Deleted) -> String| {
        table.row(std::iter::once(label.to_string()).chain(results.iter().map(|(p, d)| cell(p, d))).collect());
    };
    add("claims created", &|p, _| format!("{} ({} errors)", p.sent.len(), p.create_errors.len()));
    add("creation rate, claims/s", &|p, _| opt(p.create_rate, 1));
    add("latency p50/p95/p99, ms (goal b p99 < 250)", &|p, _| {
        format!("{:.1} / {:.1} / {:.1}", p.latency.p50, p.latency.p95, p.latency.p99)
    });
    add("latency max, ms", &|p, _| format!("{:.1}", p.latency.max));
    add("WFFC: selected-node -> kcm annot. p50/p99, ms", &|p, _| match p.spec.mode {
        Mode::WaitForFirstConsumer => format!("{:.1} / {:.1}", p.binder_delay.p50, p.binder_delay.p99),
        Mode::PinnedImmediate => "-".into(),
    });
    add("WFFC: both annot. -> PV p50/p99, ms", &|p, _| match p.spec.mode {
        Mode::WaitForFirstConsumer => {
            format!("{:.1} / {:.1}", p.from_both_annotations.p50, p.from_both_annotations.p99)
        }
        Mode::PinnedImmediate => "-".into(),
    });
    add("create -> PV p50/p99, ms", &|p, _| format!("{:.1} / {:.1}", p.end_to_end.p50, p.end_to_end.p99));
    add("node's -> Bound p50/p99, ms", &|p, _| format!("{:.1} / {:.1}", p.to_bound.p50, p.to_bound.p99));
    add("in-process provision mean, ms", &|p, _| opt(p.window.provision_hist.mean_ms(), 1));
    add("PVs/s (first to last PV)", &|p, _| opt(p.pvs_per_sec, 1));
    add("all Bound after, s", &|p, _| format!("{:.2}", p.all_bound_after.as_secs_f64()));
    add("claims without PV", &|p, _| p.missing.to_string());
    add("prov. writes/volume (no events)", &|p, _| {
        opt(per_volume(p.window.provisioner_writes(false), p.sent.len()), 2)
    });
    add("prov. event writes/volume", &|p, _| opt(per_volume(p.window.provisioner_writes(true), p.sent.len()), 2));
    add(&format!("prov. requests/volume (all; goal <= {PROVISION_REQUESTS_GOAL})"), &|p, _| {
        opt(p.window.requests_per_volume(p.sent.len()), 2)
    });
    add("prov. failed requests (>=400)", &|p, _| p.window.audit.failed_total().to_string());
    add("events: objects / occurrences", &|p, _| {
        let (o, n) = p.events.values().fold((0, 0), |(a, b), (o, n)| (a + o, b + n));
        format!("{o} / {n}")
    });
    add("prov. CPU s (all nodes)", &|p, _| format!("{:.2}", p.window.cpu_secs.iter().sum::<f64>()));
    for component in ["kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler", "bench"] {
        add(&format!("{component} CPU s"), &|p, _| {
            let cpu = p.window.others_cpu.iter().find(|(n, _)| n == component).map(|(_, c)| *c);
            opt(cpu, 2)
        });
    }
    add(&format!("machine CPU busy, % of {} CPUs", procfs::cpus()), &|p, _| {
        format!("{:.0}", p.window.machine_busy * 100.0)
    });
    add("claim metadata JSON, bytes (managedFields)", &|p, _| {
        format!("{} ({})", p.claim_metadata_bytes.0, p.claim_metadata_bytes.1)
    });
    add("RSS max/mean after, MiB", &|p, _| rss_line(&p.window.procs_end));
    add(&format!("peak RSS max/mean per node, MiB (goal c < {BURST_PEAK_GOAL_MIB:.0})"), &|_, d| {
        peak_line(&d.window.procs_end)
    });
    add("deletion: PVs/s (goal >= creation PVs/s)", &|_, d| opt(d.pvs_deleted_per_sec, 1));
    add("deletion: all PVs gone after, s", &|_, d| format!("{:.2}", d.all_pvs_gone_after.as_secs_f64()));
    add("deletion: all dirs gone after, s", &|_, d| format!("{:.2}", d.all_dirs_gone_after.as_secs_f64()));
    add("deletion: Released->gone p50/p99, ms", &|_, d| {
        format!("{:.1} / {:.1}", d.released_to_gone.p50, d.released_to_gone.p99)
    });
    add("deletion: prov. writes/volume", &|p, d| opt(per_volume(d.window.provisioner_writes(false), p.sent.len()), 2));
    add("deletion: prov. event writes/vol", &|p, d| {
        opt(per_volume(d.window.provisioner_writes(true), p.sent.len()), 2)
    });
    add(&format!("deletion: prov. requests/vol (all; goal <= {DELETE_REQUESTS_GOAL})"), &|p, d| {
        opt(d.window.requests_per_volume(p.sent.len()), 2)
    });
    add("deletion: PVs left at timeout", &|_, d| d.remaining.to_string());
    table.print();
}

fn print_after_provisioning(
    env: &Env,
    all: &Results,
    results: &[(Provisioned, Deleted)],
    idle: &Idle,
    many: &ManyFiles,
) {
    let (rounds, median) = reference_fractions(all);
    println!(
        "\n  Limit: ours (c) = {} of the reference (r), the pipeline's limit on this machine (goal >= 90% at 10 nodes)",
        percent(median)
    );
    if rounds.len() > 1 {
        let each: Vec<String> = rounds.iter().map(|f| percent(*f)).collect();
        println!("  median of {} alternating rounds (r then c): {}", rounds.len(), each.join(", "));
    }
    if !all.reference_errors.is_empty() {
        println!("  reference provisioner errors ({}): {:?}", all.reference_errors.len(), all.reference_errors.first());
    }

    let mut header = vec!["provisioner requests (audit)".to_string()];
    for (p, _) in results {
        header.push(format!("{} provision", p.spec.id));
        header.push(format!("{} delete", p.spec.id));
    }
    let mut requests = Table::new(
        "Provisioner API requests per volume (audit log, exact; all provisioners together)",
        &header.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    let windows: Vec<(&Closed, usize)> =
        results.iter().flat_map(|(p, d)| [(&p.window, p.sent.len()), (&d.window, p.sent.len())]).collect();
    let mut keys: Vec<_> = windows.iter().flat_map(|(w, _)| w.audit.total().into_keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let mut row = vec![key.label()];
        for (w, volumes) in &windows {
            row.push(opt(per_volume(w.audit.total().get(&key).copied().unwrap_or(0), *volumes), 2));
        }
        requests.row(row);
    }
    requests.print();
    println!("  (failed requests are counted too, e.g. the 404 of a PV existence check before creating it)");

    for (p, _) in results {
        let mut writes = Table::new(
            &format!("API writes during provisioning, scenario {} ({} volumes)", p.spec.id, p.sent.len()),
            &["request", "apiserver total", "bench", "total - bench", "provisioners (audit, exact)"],
        );
        for (label, total, bench, provisioners) in p.window.write_rows() {
            let rest = total.saturating_sub(bench);
            writes.row(vec![label, total.to_string(), bench.to_string(), rest.to_string(), provisioners.to_string()]);
        }
        writes.print();
    }

    let mut t = Table::new(&format!("Deleting a volume of {} files (node-1)", many.files), &["step", "time"]);
    let secs = |d: Option<Duration>| opt(d.map(|d| d.as_secs_f64()), 3);
    t.row(vec!["bench writes the files".into(), format!("{:.2} s", many.write_time.as_secs_f64())]);
    t.row(vec!["claim delete -> PV Released".into(), format!("{} s", secs(many.delete_to_released))]);
    t.row(vec!["Released -> PV gone".into(), format!("{} s", secs(many.released_to_pv_gone))]);
    t.row(vec!["Released -> directory gone from its path".into(), format!("{} s", secs(many.released_to_dir_gone))]);
    t.row(vec!["Released -> data gone from the pool".into(), format!("{} s", secs(many.released_to_data_gone))]);
    t.print();
    print_clones(&all.clones);
    all.block.print();

    let q = &all.quota;
    let mut t = Table::new(
        "Quota: claim created -> PV, one at a time on a btrfs pool with quota enabled (last node)",
        &["class", "p50 / p95 / max, ms"],
    );
    for (class, s) in [("plain directory", &q.plain), ("quota: enforce (subvolume + qgroup)", &q.quota)] {
        t.row(vec![class.into(), format!("{:.1} / {:.1} / {:.1}", s.p50, s.p95, s.max)]);
    }
    t.row(vec!["extra latency of a quota volume (p50)".into(), format!("{:.1} ms", q.extra_p50_ms())]);
    t.print();

    let w = &idle.window;
    let wall = w.wall.as_secs_f64();
    let mut t = Table::new(
        &format!("Idle: {:.1} s after scenario a, {} claims and PVs in the cluster", wall, idle.claims_in_cluster),
        &["provisioner", "CPU s", "% of a core", "API requests"],
    );
    for (node, cpu) in env.nodes.iter().zip(&w.cpu_secs) {
        let requests: u64 = w.audit.by_user.get(&Env::user_of(&node.name)).map_or(0, |c| c.values().sum());
        t.row(vec![node.name.clone(), format!("{cpu:.3}"), format!("{:.2}", cpu / wall * 100.0), requests.to_string()]);
    }
    t.print();

    let after_a = results.first().map(|(p, _)| p.window.procs_end.clone()).unwrap_or_default();
    let mut t = Table::new(
        "Per provisioner (RSS = VmRSS; peak = VmHWM)",
        &["node", "pid", "RSS at start, MiB", "RSS after a, MiB", "peak RSS, MiB", "CPU total s"],
    );
    for (i, (node, s)) in env.nodes.iter().zip(&all.at_end).enumerate() {
        let rss = |samples: &[ProcSample]| samples.get(i).map_or("-".into(), |a| format!("{:.1}", mib(a.rss_kib)));
        t.row(vec![
            node.name.clone(),
            node.provisioner.pid().to_string(),
            rss(&all.at_start),
            rss(&after_a),
            format!("{:.1}", mib(run_peak_kib(all, i, s))),
            format!("{:.2}", s.cpu_secs),
        ]);
    }
    t.print();
    println!(
        "  provisioners' own API request counter: {}",
        all.own_metric
            .as_deref()
            .map_or("none exported (the audit log above is the exact figure)".to_string(), |m| m.to_string())
    );

    if !all.curve.steps.is_empty() {
        scale_curve::print_run(&all.curve);
    }
    if let Some(m) = &all.memory {
        memory::print(m);
    }

    let mut t = Table::new("Goals (issues 5 and 13; reported, not asserted)", &["goal", "measured", "met"]);
    for (target, measured, met) in targets(env, all) {
        t.row(vec![target, measured, met]);
    }
    t.print();
    println!("\nMethod");
    METHOD.iter().for_each(|m| println!("  - {m}"));
}

fn scenario_json((p, d): &(Provisioned, Deleted)) -> Value {
    let peaks: Vec<f64> = d.window.procs_end.iter().map(|s| mib(s.hwm_kib)).collect();
    let split: Vec<Value> = d
        .sampled_peaks
        .iter()
        .map(|s| {
            json!({
                "rss_mib": mib(s.rss_kib), "anon_mib": mib(s.rss_anon_kib), "file_mib": mib(s.rss_file_kib),
                "binary_mapped_mib": mib(s.binary_mapped_kib),
            })
        })
        .collect();
    json!({ "provisioning": p.json(), "deletion": d.json(), "peak_rss_mib_per_node": peaks, "sampled_peak_per_node": split })
}

fn to_json(env: &Env, all: &Results) -> Value {
    let (results, idle, many) = (&all.scenarios, &all.idle, &all.many);
    let args = &env.args;
    let provisioners: Vec<Value> = env
        .nodes
        .iter()
        .zip(all.at_end.iter().zip(&all.at_start))
        .enumerate()
        .map(|(i, (n, (s, start)))| {
            json!({ "node": n.name, "pid": n.provisioner.pid(), "peak_rss_mib": mib(run_peak_kib(all, i, s)),
                    "rss_mib_at_start": mib(start.rss_kib),
                    "rss_mib_end": mib(s.rss_kib), "cpu_s_total": s.cpu_secs,
                    "log": n.provisioner.log_path() })
        })
        .collect();
    json!({
        "config": config_json(args),
        "reference": {
            "reference_pvs_per_s": pvs_per_sec(results, "r"),
            "ours_pvs_per_s": pvs_per_sec(results, "c"),
            "ours_fraction_of_reference_median": reference_fractions(all).1,
            "ours_fraction_of_reference_per_round": reference_fractions(all).0,
            "later_rounds_pvs_per_s": all.later_rounds.iter().map(|(r, c)| json!({"reference": r, "ours": c})).collect::<Vec<_>>(),
            "goal_fraction_at_10_nodes": 0.9,
            "reference_errors": all.reference_errors,
        },
        "scenarios": results.iter().map(scenario_json).collect::<Vec<_>>(),
        "many_files_delete": many.json(),
        "clones": all.clones.json(),
        "block": all.block.json(),
        "quota_latency": all.quota.json(),
        "idle": {
            "claims_in_cluster": idle.claims_in_cluster,
            "node_1_cpu_s": idle.window.cpu_secs.first(),
            "window": idle.window.json(),
        },
        "rss_after_scenario_a_mib": results.first().map(|(p, _)| p.window.procs_end.iter().map(|s| mib(s.rss_kib)).collect::<Vec<_>>()),
        "provisioners": provisioners,
        "provisioner_own_api_request_metric": all.own_metric,
        "targets": targets(env, all).into_iter().map(|(t, m, v)| json!({"target": t, "measured": m, "met": v})).collect::<Vec<_>>(),
        "scale_curve": (!all.curve.steps.is_empty()).then(|| scale_curve::run_json(&all.curve)),
        "memory": all.memory.as_ref().map(memory::json),
        "method": METHOD,
    })
}

fn config_json(args: &Args) -> Value {
    json!({
        "nodes": args.nodes, "claims": args.claims, "rate_per_s": args.rate, "clients": args.clients,
        "files": args.files, "idle_s": args.idle_secs, "quick": args.quick, "rust_log": args.rust_log,
        "provisioner_env": args.provisioner_env.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>(),
        "provisioner": args.provisioner,
        "peer": args.peer,
        "scale_curve": args.scale_curve,
        "peer_at": args.peer_at,
        "big_start": args.big_start,
        "memory_claims": args.memory_claims,
        "scenarios": args.scenarios,
        "grow_to": args.grow_to,
        "memory_limit_bytes": args.memory_limit,
    })
}

//! `bench --peer PATH` (`make bench-vs-go`): ours against the Go build this project replaces,
//! in the same sitting, on the same control plane and nodes. Scenarios a, b and c
//! (`scenario::standard`) each run twice in a row, by ours then by the Go build (`peer.rs`
//! switches the processes; both never run at once and each side starts fresh processes), with
//! the same claims, pace and clients, then the ratio of each figure.
//!
//! What the Go build does not do is not run, and the run says so: clones, quota, the memory
//! fill (its 100,000 claims need ours' metadata-only watches to mean anything; `make bench`
//! measures ours alone), the reference r and the scale curve (figures of this machine and of
//! ours, not of a provisioner pair).

use anyhow::Result;
use serde_json::{Value, json};

use super::peer::Side;
use super::plot::{self, Series};
use super::procfs::{self, mib};
use super::reference::REFERENCE_CLASS;
use super::report::{Table, opt};
use super::scenario::{self, Deleted, Mode, Provisioned, Spec};
use super::setup::Env;

/// The Go source hack/build-go-legacy.sh builds: the sha256 of its archive (the name of the
/// cache directory holding the binary) and the upstream commit it is.
const GO_SOURCE_SHA256: &str = "e1d29651a215d38a078f5722aed55265de49888fe045bf772df5ca928a2e9c84";
const GO_COMMIT: &str = "7c1422556950";

/// What is not compared, and why (printed before the first scenario).
const SKIPPED: &[&str] = &[
    "clones: the Go build has no dataSource support (make bench measures ours)",
    "quota: the Go build has no quota (make bench measures ours)",
    "memory fill: skipped for both (100,000 claims; make bench --memory-only measures ours)",
    "r (reference) and the scale curve: figures of this machine and of ours alone (make bench)",
];

/// One side's run of one scenario.
pub struct Run {
    pub side: Side,
    pub provisioned: Provisioned,
    pub deleted: Deleted,
    /// Largest VmHWM among the side's processes after the deletion (each started fresh).
    pub peak_rss_kib: u64,
}

impl Run {
    fn id(&self) -> &str {
        self.provisioned.spec.id
    }

    /// CPU of all the side's processes over provisioning and deletion, per volume.
    fn cpu_ms_per_volume(&self) -> Option<f64> {
        let cpu: f64 = [&self.provisioned.window, &self.deleted.window].iter().flat_map(|w| &w.cpu_secs).sum();
        let volumes = self.provisioned.sent.len();
        (volumes > 0).then(|| cpu * 1000.0 / volumes as f64)
    }
}

pub async fn run(env: &mut Env) -> Result<Vec<Run>> {
    SKIPPED.iter().for_each(|line| println!("skipped: {line}"));
    let mut runs = Vec::new();
    for spec in scenario::standard(env.args.rate).into_iter().filter(|s| s.class != REFERENCE_CLASS) {
        for side in [Side::Ours, Side::Peer] {
            env.switch_to(side).await?;
            let spec =
                Spec { namespace: format!("{}-{}", spec.namespace, side.label().to_lowercase()), ..spec.clone() };
            eprintln!("bench: scenario {} by {}: {}", spec.id, side.label(), spec.title);
            let provisioned = scenario::provision(env, spec).await?;
            eprintln!("bench: scenario {} by {}: deleting", provisioned.spec.id, side.label());
            let deleted = scenario::delete(env, &provisioned).await?;
            let peak_rss_kib = env
                .provisioner_pids()
                .into_iter()
                .map(|pid| procfs::sample(pid).map(|s| s.hwm_kib))
                .collect::<Result<Vec<_>>>()?
                .into_iter()
                .max()
                .unwrap_or(0);
            runs.push(Run { side, provisioned, deleted, peak_rss_kib });
        }
    }
    Ok(runs)
}

/// The Go build's name in the report: its commit when the binary is hack/build-go-legacy.sh's.
pub fn go_build(env: &Env) -> String {
    let binary = env.args.peer.as_deref().unwrap_or(std::path::Path::new("-"));
    let cached = binary.parent().and_then(|d| d.file_name()).is_some_and(|d| d == GO_SOURCE_SHA256);
    if cached {
        format!("kubevirt/hostpath-provisioner {GO_COMMIT} (cmd/provisioner, hack/build-go-legacy.sh)")
    } else {
        format!("{} (not hack/build-go-legacy.sh's build: commit unknown)", binary.display())
    }
}

/// A compared figure: its label, how it is read off a run, whether higher is better, and the
/// least value told apart from zero (a ratio takes smaller values as this).
type Figure = (&'static str, fn(&Run) -> Option<f64>, bool, f64);

/// The bench's latency resolution (see METHOD).
const LATENCY_RESOLUTION_MS: f64 = 1.0;

fn figures(mode: Mode) -> Vec<Figure> {
    let mut rows: Vec<Figure> = vec![
        ("PVs/s (first to last PV)", |r| r.provisioned.pvs_per_sec, true, 0.0),
        ("latency p50, ms", |r| Some(r.provisioned.latency.p50), false, LATENCY_RESOLUTION_MS),
        ("latency p99, ms", |r| Some(r.provisioned.latency.p99), false, LATENCY_RESOLUTION_MS),
    ];
    if mode == Mode::WaitForFirstConsumer {
        rows.extend::<[Figure; 2]>([
            (
                "  after the kcm annotation p50, ms",
                |r| Some(r.provisioned.from_both_annotations.p50),
                false,
                LATENCY_RESOLUTION_MS,
            ),
            (
                "  after the kcm annotation p99, ms",
                |r| Some(r.provisioned.from_both_annotations.p99),
                false,
                LATENCY_RESOLUTION_MS,
            ),
        ]);
    }
    rows.extend::<[Figure; 5]>([
        (
            "API requests/volume, provisioning",
            |r| r.provisioned.window.requests_per_volume(r.provisioned.sent.len()),
            false,
            0.0,
        ),
        (
            "API requests/volume, deletion",
            |r| r.deleted.window.requests_per_volume(r.provisioned.sent.len()),
            false,
            0.0,
        ),
        ("deletion PVs/s", |r| r.deleted.pvs_deleted_per_sec, true, 0.0),
        ("peak RSS, MiB (largest process)", |r| Some(mib(r.peak_rss_kib)), false, 0.0),
        ("CPU ms/volume (all processes)", Run::cpu_ms_per_volume, false, 0.0),
    ]);
    rows
}

/// How much better ours is: ours/Go where higher is better, Go/ours where lower is; values
/// below `floor` count as `floor`.
fn advantage(ours: Option<f64>, go: Option<f64>, higher_is_better: bool, floor: f64) -> Option<f64> {
    let (ours, go) = (ours?.max(floor), go?.max(floor));
    let (better, worse) = if higher_is_better { (ours, go) } else { (go, ours) };
    (worse > 0.0).then(|| better / worse)
}

/// The pairs (ours, Go) in scenario order.
fn pairs(runs: &[Run]) -> Vec<(&Run, &Run)> {
    runs.iter()
        .filter(|r| r.side == Side::Ours)
        .filter_map(|ours| Some((ours, runs.iter().find(|r| r.side == Side::Peer && r.id() == ours.id())?)))
        .collect()
}

pub fn print(env: &Env, runs: &[Run]) {
    let args = &env.args;
    println!(
        "\nOurs vs the Go build: {} nodes, {} claims per scenario, {} claims/s (a, b), {} clients",
        args.nodes, args.claims, args.rate, args.clients
    );
    println!("  Go build: {}", go_build(env));
    let mut table = Table::new(
        "Ours vs the Go build, same sitting, alternating (ours then Go per scenario)",
        &["scenario / figure", "ours", "Go", "ours better by"],
    );
    for (ours, go) in pairs(runs) {
        let spec = &ours.provisioned.spec;
        let rate = spec.rate.map_or("burst".to_string(), |r| format!("{r}/s"));
        table.row(vec![format!("{}: {} ({rate})", spec.id, spec.title), String::new(), String::new(), String::new()]);
        for (label, read, higher_is_better, floor) in figures(spec.mode) {
            let (o, g) = (read(ours), read(go));
            let better = advantage(o, g, higher_is_better, floor).map_or("-".to_string(), |x| format!("{x:.1}x"));
            table.row(vec![format!("  {label}"), opt(o, 1), opt(g, 1), better]);
        }
        let missing = |r: &Run| format!("{} of {}", r.provisioned.missing, r.provisioned.sent.len());
        table.row(vec!["  claims without PV at the end".into(), missing(ours), missing(go), String::new()]);
    }
    table.print();
    println!(
        "  latency: claim became the node's (a, c: first seen; b: selected-node) -> PV seen; \
         requests: the audit log, every request of the side's processes per volume"
    );
}

pub fn json(env: &Env, runs: &[Run]) -> Value {
    let pairs: Vec<Value> = pairs(runs)
        .into_iter()
        .map(|(ours, go)| {
            let figures: serde_json::Map<String, Value> = figures(ours.provisioned.spec.mode)
                .into_iter()
                .map(|(label, read, higher, floor)| {
                    let value = json!({ "ours": read(ours), "go": read(go),
                                        "ours_better_by": advantage(read(ours), read(go), higher, floor) });
                    (label.trim().to_string(), value)
                })
                .collect();
            json!({ "id": ours.id(), "figures": figures })
        })
        .collect();
    let detail: Vec<Value> = runs
        .iter()
        .map(|r| {
            json!({ "side": r.side.label(), "peak_rss_mib": mib(r.peak_rss_kib),
                    "provisioning": r.provisioned.json(), "deletion": r.deleted.json() })
        })
        .collect();
    json!({ "go_build": go_build(env), "skipped": SKIPPED, "compared": pairs, "runs": detail })
}

/// Latency distribution and PVs over time of each scenario, ours and Go.
pub fn plot(env: &Env, runs: &[Run]) -> String {
    let series: Vec<Series> = runs
        .iter()
        .map(|r| Series {
            label: format!("{} {}", r.id(), r.side.label()),
            latency_ms: r.provisioned.latency_samples_ms.clone(),
            pv_seen_secs: r.provisioned.pv_seen_secs.clone(),
        })
        .collect();
    let title = format!(
        "ours vs Go {GO_COMMIT}: {} nodes, {} claims per scenario (a, b: {}/s; c: burst)",
        env.args.nodes, env.args.claims, env.args.rate
    );
    plot::render(&title, &series)
}

#[cfg(test)]
mod tests {
    use super::advantage;

    #[test]
    fn advantage_reads_each_figure_the_right_way_up() {
        assert_eq!(advantage(Some(100.0), Some(10.0), true, 0.0), Some(10.0));
        assert_eq!(advantage(Some(5.0), Some(50.0), false, 0.0), Some(10.0));
        assert_eq!(advantage(Some(50.0), Some(5.0), false, 0.0), Some(0.1));
        assert_eq!(advantage(Some(1.0), Some(0.0), true, 0.0), None);
        assert_eq!(advantage(None, Some(1.0), true, 0.0), None);
        // Below the resolution, a latency counts as the resolution.
        assert_eq!(advantage(Some(0.1), Some(500.0), false, 1.0), Some(500.0));
    }
}

//! Command line of the `bench` binary (plain `std::env::args`).

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

pub const USAGE: &str = "\
usage: bench --provisioner PATH [options]
  --nodes N        simulated nodes, each a provisioner process (default 10; --quick: 3)
  --claims M       claims per scenario (default 1000; --quick: 100)
  --rate R         claims created per second in scenarios a and b (default 50)
  --clients C      concurrent API clients creating claims (default 4)
  --files F        files in the volume of the deletion test (default 100000; --quick: 10000)
  --idle-secs S    idle CPU window (default 10; --quick: 3)
  --reference-rounds K
                   pairs of reference (r) and ours (c) run alternately (default 1); each pair
                   gives a fraction, the report prints each and their median
  --memory-claims N
                   claims in the cluster for the memory scenario, 100 of them the measured
                   node's, run last (default 100000; --quick: 5000; 0 skips it)
  --out FILE       JSON results (default target/bench-results.json); the SVG plot goes next
                   to it (same name, .svg), the logs into bench-logs/ beside it
  --quick          small sanity run
  --clones-only    only the clone measurement (1 GiB, reflink on XFS and bytes on ext4)
  --memory-only    only the memory scenario (use with --nodes 1)
  --block-only     only the Block volume I/O (loop device vs its backing file, O_DIRECT) and
                   the FICLONE of a 1 GiB file on btrfs and XFS (needs root; no control plane)
  --scenarios IDS  only these of the provisioning scenarios, e.g. c or r,c (ids a, b, r, c),
                   each with its provisioners' peak RSS; nothing else runs
  --grow-to N1,N2,...
                   the scale curve of the full run, after the other scenarios: provisioners
                   grown from --nodes to N1, N2, ... (default 50,100; --quick: 5; 0 skips it)
  --scale-curve N1,N2,...
                   only the scale curve: provisioners grown to N1, N2, ... (e.g. 1,10,50,100)
                   against --claims claims (--nodes is ignored)
  --peer-at N1,N2  with --scale-curve and --peer: the curve steps at which the Go build is
                   measured too (default 10,50); the curve ends with a rollout (every
                   provisioner restarted at once)
  --big-start C,P[,N]
                   only the start-up in a big cluster: C claims and P PVs (e.g.
                   100000,10000), then one provisioner started and timed to ready, then N
                   more started at once in that cluster (default 0)
  --peer PATH      also run the Go build this project replaces (the kubevirt-legacy-provisioner
                   binary of hack/build-go-legacy.sh's cache; `make bench-vs-go`): scenarios
                   a, b and c, each run by ours then by the Go build on the same nodes, and
                   their ratios; what the Go build does not do is skipped with a line saying so
  --memory-limit Q each provisioner runs in a memory cgroup with this limit (a quantity, e.g.
                   64Mi), as a pod's resources.limits.memory puts it, and the report counts
                   OOM kills (default: the limit deploy/legacy/daemonset.yaml ships; `none`:
                   no cgroup; needs root)
  --rust-log SPEC  RUST_LOG of the provisioners (default info)
  --provisioner-env NAME=VALUE
                   extra environment of the provisioners (repeatable), e.g. MALLOC_ARENA_MAX=2";

/// Resolved settings.
#[derive(Clone, Debug)]
pub struct Args {
    pub provisioner: PathBuf,
    /// `--peer`: the Go build's binary, run in turn with ours (`bench/vs_peer.rs`).
    pub peer: Option<PathBuf>,
    pub nodes: usize,
    pub claims: usize,
    pub rate: f64,
    pub clients: usize,
    pub files: usize,
    pub idle_secs: u64,
    pub reference_rounds: usize,
    pub out: PathBuf,
    pub quick: bool,
    pub clones_only: bool,
    /// `--block-only`: only `bench/block_io.rs`.
    pub block_only: bool,
    /// Claims in the cluster for the memory scenario (`bench/memory.rs`); 0: skipped.
    pub memory_claims: usize,
    pub memory_only: bool,
    /// `--scenarios`: only these provisioning scenarios (ids of `scenario::standard`); empty: all.
    pub scenarios: Vec<String>,
    /// Node counts of the scale curve, ascending; empty: the usual scenarios.
    pub scale_curve: Vec<usize>,
    /// Curve steps at which the Go build is measured too (`--peer-at`).
    pub peer_at: Vec<usize>,
    /// `--big-start C,P,N`: claims and PVs in the cluster for the start-up measurement, and
    /// how many provisioners then start at once.
    pub big_start: Option<(usize, usize, usize)>,
    /// Node counts the full run grows to after its scenarios (above `nodes`); empty: none.
    pub grow_to: Vec<usize>,
    pub rust_log: String,
    pub provisioner_env: Vec<(String, String)>,
    /// `--memory-limit`: the provisioners' memory cgroup limit in bytes; `None`: no cgroup.
    pub memory_limit: Option<u64>,
}

impl Args {
    pub fn parse() -> Result<Args> {
        let mut values = std::collections::HashMap::new();
        let mut quick = false;
        let mut clones_only = false;
        let mut block_only = false;
        let mut memory_only = false;
        let mut provisioner_env = Vec::new();
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--quick" => quick = true,
                "--clones-only" => clones_only = true,
                "--block-only" => block_only = true,
                "--memory-only" => memory_only = true,
                "-h" | "--help" => bail!("help requested"),
                "--provisioner-env" => {
                    let pair = args.next().context("--provisioner-env needs NAME=VALUE")?;
                    let (name, value) = pair.split_once('=').context("--provisioner-env needs NAME=VALUE")?;
                    provisioner_env.push((name.to_string(), value.to_string()));
                }
                flag @ ("--provisioner" | "--nodes" | "--claims" | "--rate" | "--clients" | "--files"
                | "--idle-secs" | "--reference-rounds" | "--out" | "--rust-log" | "--scale-curve"
                | "--grow-to" | "--memory-claims" | "--peer" | "--scenarios" | "--peer-at" | "--big-start"
                | "--memory-limit") => {
                    let value = args.next().with_context(|| format!("{flag} needs a value"))?;
                    values.insert(flag.trim_start_matches("--").to_string(), value);
                }
                other => bail!("unknown argument {other:?}"),
            }
        }
        let number = |name: &str, default: f64, quick_default: f64| -> Result<f64> {
            match values.get(name) {
                Some(v) => v.parse::<f64>().with_context(|| format!("--{name} {v:?} is not a number")),
                None => Ok(if quick { quick_default } else { default }),
            }
        };
        let provisioner = PathBuf::from(values.get("provisioner").context("--provisioner PATH is required")?);
        let provisioner = provisioner.canonicalize().with_context(|| {
            format!("{} not found (cargo build --release -p hostpath-provisioner)", provisioner.display())
        })?;
        let peer = match values.get("peer") {
            Some(path) => Some(
                PathBuf::from(path)
                    .canonicalize()
                    .with_context(|| format!("--peer {path}: not found (make bench-vs-go builds it)"))?,
            ),
            None => None,
        };
        let scale_curve = match values.get("scale-curve") {
            Some(list) => parse_steps(list)?,
            None => Vec::new(),
        };
        let grow_to = match values.get("grow-to").map(String::as_str) {
            Some("0") => Vec::new(),
            Some(list) => parse_steps(list)?,
            None if quick => vec![5],
            None => vec![50, 100],
        };
        let peer_at = match values.get("peer-at") {
            Some(list) => parse_steps(list)?,
            None => vec![10, 50],
        };
        let big_start = match values.get("big-start") {
            Some(list) => {
                let n: Vec<usize> = list
                    .split(',')
                    .map(|v| v.trim().parse::<usize>().context("--big-start needs CLAIMS,PVS[,N]"))
                    .collect::<Result<_>>()?;
                match n[..] {
                    [c, p] => Some((c, p, 0)),
                    [c, p, n] => Some((c, p, n)),
                    _ => bail!("--big-start needs CLAIMS,PVS[,N]"),
                }
            }
            None => None,
        };
        let parsed = Args {
            provisioner,
            peer,
            // The scale curve adds every node itself, the first step's too.
            nodes: if !scale_curve.is_empty() || big_start.is_some() {
                0
            } else {
                number("nodes", 10.0, 3.0)? as usize
            },
            claims: number("claims", 1000.0, 100.0)? as usize,
            rate: number("rate", 50.0, 50.0)?,
            clients: number("clients", 4.0, 4.0)? as usize,
            files: number("files", 100_000.0, 10_000.0)? as usize,
            idle_secs: number("idle-secs", 10.0, 3.0)? as u64,
            reference_rounds: number("reference-rounds", 1.0, 1.0)? as usize,
            out: values.get("out").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("target/bench-results.json")),
            quick,
            clones_only,
            block_only,
            memory_claims: number("memory-claims", 100_000.0, 5_000.0)? as usize,
            memory_only,
            scenarios: match values.get("scenarios") {
                Some(list) => parse_scenarios(list)?,
                None => Vec::new(),
            },
            scale_curve,
            peer_at,
            big_start,
            grow_to,
            rust_log: values.get("rust-log").cloned().unwrap_or_else(|| "info".to_string()),
            provisioner_env,
            memory_limit: match values.get("memory-limit").map(String::as_str) {
                Some("none") => None,
                Some(quantity) => Some(testbed::memory_cgroup::quantity_bytes(quantity).context("--memory-limit")?),
                None => Some(testbed::memory_cgroup::quantity_bytes(&shipped_memory_limit()?)?),
            },
        };
        if (parsed.nodes == 0 && parsed.scale_curve.is_empty() && parsed.big_start.is_none())
            || parsed.claims == 0
            || parsed.clients == 0
            || parsed.rate <= 0.0
            || parsed.reference_rounds == 0
        {
            bail!("--nodes, --claims, --clients, --rate and --reference-rounds must be positive");
        }
        if parsed.memory_only && parsed.memory_claims == 0 {
            bail!("--memory-only needs --memory-claims above 0");
        }
        Ok(parsed)
    }
}

/// `r,c` as scenario ids, each one of a, b, r, c.
fn parse_scenarios(list: &str) -> Result<Vec<String>> {
    let ids: Vec<String> = list.split(',').map(|s| s.trim().to_string()).collect();
    if let Some(bad) = ids.iter().find(|id| !["a", "b", "r", "c"].contains(&id.as_str())) {
        bail!("--scenarios: {bad:?} is not one of a, b, r, c");
    }
    Ok(ids)
}

/// `1,10,50` as ascending positive node counts.
fn parse_steps(list: &str) -> Result<Vec<usize>> {
    let steps = list
        .split(',')
        .map(|s| s.trim().parse::<usize>().with_context(|| format!("--scale-curve: {s:?} is not a node count")))
        .collect::<Result<Vec<_>>>()?;
    if steps.is_empty() || steps[0] == 0 || steps.windows(2).any(|w| w[0] >= w[1]) {
        bail!("--scale-curve needs ascending positive node counts, e.g. 1,10,50,100");
    }
    Ok(steps)
}

/// The provisioner container's memory limit in deploy/legacy/daemonset.yaml (the one users
/// install): the `memory:` under its `limits:`.
pub fn shipped_memory_limit() -> Result<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/legacy/daemonset.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    memory_limit_of(&text).with_context(|| format!("no resources.limits.memory in {}", path.display()))
}

fn memory_limit_of(manifest: &str) -> Option<String> {
    let mut lines = manifest.lines().map(str::trim).filter(|l| !l.starts_with('#'));
    lines.by_ref().find(|line| *line == "limits:")?;
    let line = lines.next()?;
    Some(line.strip_prefix("memory:")?.trim().to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn scale_curve_steps_ascend() {
        assert_eq!(super::parse_steps("1, 10,50").unwrap(), vec![1, 10, 50]);
        assert!(super::parse_steps("10,1").is_err());
        assert!(super::parse_steps("0,2").is_err());
        assert!(super::parse_steps("1,x").is_err());
    }

    #[test]
    fn the_memory_limit_is_the_one_under_limits() {
        let manifest =
            "resources:\n  requests:\n    memory: 20Mi\n  # a bound\n  limits:\n    # why\n    memory: 64Mi\n";
        assert_eq!(super::memory_limit_of(manifest).as_deref(), Some("64Mi"));
        assert_eq!(super::memory_limit_of("requests:\n  memory: 20Mi\n"), None);
        // The shipped DaemonSet has one, in a form the cgroup takes.
        let shipped = super::shipped_memory_limit().unwrap();
        assert!(testbed::memory_cgroup::quantity_bytes(&shipped).unwrap() > 0, "{shipped}");
    }

    #[test]
    fn scenarios_are_known_ids() {
        assert_eq!(super::parse_scenarios("r, c").unwrap(), vec!["r", "c"]);
        assert!(super::parse_scenarios("c,x").is_err());
    }
}

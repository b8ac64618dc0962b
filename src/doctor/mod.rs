//! `hostpath-provisioner doctor`: is this node's storage healthy, and is every directory on it
//! accounted for? Run on a node or in the provisioner's pod (`kubectl exec <pod> -- /hostpath-provisioner
//! doctor`); it reads the daemon's own configuration (flags and env vars) and changes nothing,
//! except for a reflink probe that makes and removes two small files in a hidden directory
//! ([`capabilities::PROBE_DIR`]) under each writable pool root.
//!
//! For each pool it reports the filesystem type, whether the root is a mount point, whether it
//! is on the node's OS disk, space and reserve, reflink and quota support, the SELinux
//! label where SELinux is on, the trash, and, with API access (`--kubeconfig`/`KUBECONFIG`, or in
//! a pod), directories that match no PV and this node's PVs whose directory is missing; with
//! Block volumes on, each Block volume's loop device and device node, checked by the daemon's
//! rules, and every attached loop with the volume it holds ([`assess_block`]).
//!
//! "On the OS disk" is what the `hostpath_provisioner_pool_shares_os_disk` metric reports, by the
//! same reading and rule ([`crate::filesystem::os_disk`], [`crate::deciding::os_disk`]).
//!
//! Exit codes: [`assess::EXIT_HEALTHY`] (0) nothing wrong, warnings allowed;
//! [`assess::EXIT_PROBLEMS`] (1) a problem found; [`assess::EXIT_CONFIG`] (2) invalid
//! configuration, as the daemon; [`assess::EXIT_INCOMPLETE`] (3) no problem found but the API could
//! not be asked.

pub mod assess;
pub mod assess_block;
pub mod capabilities;
pub mod inspect;
pub mod inspect_block;
pub mod readyz;
pub mod report;
pub mod volume_check;

use std::ffi::OsString;
use std::path::PathBuf;

use clap::Parser;

use crate::config::Args;
use crate::doctor::report::{ApiCheck, Report};

/// The subcommand's name, the first argument.
pub const SUBCOMMAND: &str = "doctor";

/// `hostpath-provisioner doctor` arguments: the daemon's, plus how to report.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "hostpath-provisioner doctor",
    bin_name = "hostpath-provisioner doctor",
    version,
    about = "Checks this node's pools: filesystem, mount, space, capabilities, orphan and missing volume directories, trash; and its Block volumes' loop devices and device nodes",
    after_help = "Exit codes: 0 healthy (warnings allowed), 1 problems found, 2 invalid configuration, 3 a check could not run (API unreachable).",
    // The daemon's other settings are still read (the pod's environment sets them, and a
    // doctor run validates them as the daemon would) but change nothing in the report: kept out
    // of the help so that it lists only what the doctor acts on ([`DOCTOR_READS`]; a test fails
    // when a daemon flag is neither in that list nor hidden here).
    mut_arg("namespace", |a| a.hide(true)),
    mut_arg("peer_service", |a| a.hide(true)),
    mut_arg("reap_volumes_of_removed_nodes", |a| a.hide(true)),
    // Hidden in the daemon's help too; read only to say that it is ignored (assess::setting_findings).
    mut_arg("release_claims_of_removed_nodes", |a| a.hide(true)),
    mut_arg("orphan_snapshot_copy_grace", |a| a.hide(true)),
    mut_arg("node_lease_seconds", |a| a.hide(true)),
    mut_arg("use_naming_prefix", |a| a.hide(true)),
    mut_arg("pv_capacity", |a| a.hide(true)),
    mut_arg("dir_mode", |a| a.hide(true)),
    mut_arg("pv_finalizer", |a| a.hide(true)),
    mut_arg("publish_capacity", |a| a.hide(true)),
    mut_arg("provision_on_node", |a| a.hide(true)),
    mut_arg("max_concurrency", |a| a.hide(true)),
    mut_arg("metrics_addr", |a| a.hide(true)),
    mut_arg("health_addr", |a| a.hide(true)),
    mut_arg("log_format", |a| a.hide(true))
)]
pub struct DoctorArgs {
    /// The daemon's settings (same flags and env vars).
    #[command(flatten)]
    pub daemon: Args,

    /// Output: table (for people) or json (for scripts; field names are stable).
    #[arg(long, short = 'o', default_value = "table")]
    pub output: String,
}

/// The flags the doctor acts on, the only ones its help shows: the daemon's settings that go
/// into the report, and its own.
pub const DOCTOR_READS: [&str; 13] = [
    "--node-name",
    "--pv-dir",
    "--pool",
    "--provisioner-name",
    "--capacity-provisioner-name",
    "--kubeconfig",
    "--require-mountpoint",
    "--reserved-space",
    "--capacity-accounting",
    "--node-affinity-keys",
    "--block-volumes",
    "--block-device-dir",
    "--output",
];

/// Why a fact could not be gathered. The doctor reports it (a pool it cannot examine is a
/// problem; an API it cannot ask makes the run incomplete) rather than retrying.
#[derive(Debug, thiserror::Error)]
pub enum DoctorError {
    /// A filesystem call on a pool failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Filesystem {
        /// What was attempted.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The kernel's answer.
        source: std::io::Error,
    },
    /// The pool root cannot be opened or checked.
    #[error(transparent)]
    Pool(#[from] crate::filesystem::PoolError),
    /// The kubeconfig could not be read.
    #[error(transparent)]
    Kubeconfig(#[from] crate::config::KubeconfigListError),
    /// The client could not be configured from the kubeconfig or the pod's service account.
    #[error("cannot configure the Kubernetes client: {0}")]
    Client(String),
    /// An API call failed.
    #[error("cannot {op}: {source}")]
    Api {
        /// What was asked.
        op: &'static str,
        /// The client's error.
        source: kube::Error,
    },
    /// The API server did not answer in time.
    #[error("no answer from the API server within {0} s")]
    ApiTimeout(u64),
}

impl DoctorError {
    /// A filesystem error from a rustix call.
    pub fn fs(op: &'static str, path: &std::path::Path, errno: rustix::io::Errno) -> DoctorError {
        DoctorError::Filesystem { op, path: path.to_owned(), source: errno.into() }
    }
}

/// How the report is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Table,
    Json,
}

/// Runs the doctor with `argv` (starting at `doctor`) and returns the exit code.
pub async fn main(argv: impl IntoIterator<Item = OsString>) -> i32 {
    let args = DoctorArgs::parse_from(argv);
    let output = match args.output.trim().to_ascii_lowercase().as_str() {
        "table" => Output::Table,
        "json" => Output::Json,
        other => {
            eprintln!(
                "hostpath-provisioner doctor: configuration error: --output: invalid value {other:?}: table or json"
            );
            return assess::EXIT_CONFIG;
        }
    };
    let config = match args.daemon.validate() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("hostpath-provisioner doctor: configuration error: {error}");
            return assess::EXIT_CONFIG;
        }
    };
    let (api, cluster) = match inspect::cluster_facts(&config).await {
        Ok(Some(cluster)) => (ApiCheck::Checked, Some(cluster)),
        Ok(None) => (ApiCheck::Skipped, None),
        Err(why) => (ApiCheck::Failed(with_causes(&why)), None),
    };
    let (node, provisioner, require_mountpoint) =
        (config.node_name.clone(), config.provisioner_name.clone(), config.require_mountpoint);
    let release_claims_setting_ignored = config.release_claims_setting_ignored.clone();
    let shared_affinity = cluster.as_ref().map(|c| c.shared_affinity.clone()).unwrap_or_default();
    let inspected = tokio::task::spawn_blocking(move || {
        let pools: Vec<_> =
            config.pools.iter().map(|pool| inspect::pool_report(pool, &config, cluster.as_ref())).collect();
        let block = cluster.as_ref().and_then(|cluster| inspect_block::block_report(&config, cluster));
        (pools, block)
    });
    let (pools, block) = match inspected.await {
        Ok(pools) => pools,
        Err(error) => {
            eprintln!("hostpath-provisioner doctor: inspecting the pools failed: {error}");
            return assess::EXIT_INCOMPLETE;
        }
    };
    let mut findings = assess::findings(&pools, &api, require_mountpoint);
    let block = block.map(|(block, block_findings)| {
        findings.extend(block_findings);
        block
    });
    findings.extend(assess::setting_findings(release_claims_setting_ignored.as_deref()));
    findings.extend(assess::affinity_findings(&node, &shared_affinity));
    let exit_code = assess::exit_code(&findings, &api);
    let report = Report { node, provisioner, api, pools, block, findings, exit_code };
    match output {
        Output::Table => print!("{}", report::render_table(&report)),
        Output::Json => match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
            Err(error) => {
                eprintln!("hostpath-provisioner doctor: cannot write the report: {error}");
                return assess::EXIT_INCOMPLETE;
            }
        },
    }
    exit_code
}

/// An error and its causes on one line (a connection error's cause says refused, timed out, ...).
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(next) = cause {
        let next_text = next.to_string();
        if !text.contains(&next_text) {
            text = format!("{text}: {next_text}");
        }
        cause = next.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The visible flags are exactly [`DOCTOR_READS`]: a flag added to the daemon shows up in the
    /// doctor's help, and fails this test, until it is hidden there or listed as read.
    #[test]
    fn the_help_lists_only_what_the_doctor_acts_on() {
        use clap::CommandFactory;
        let command = DoctorArgs::command();
        let mut visible: Vec<String> = command
            .get_arguments()
            .filter(|arg| !arg.is_hide_set())
            .filter_map(|arg| arg.get_long().map(|long| format!("--{long}")))
            .filter(|flag| flag != "--help" && flag != "--version")
            .collect();
        visible.sort();
        let mut reads = DOCTOR_READS.map(str::to_owned).to_vec();
        reads.sort();
        assert_eq!(visible, reads, "the doctor's help shows other flags than it reads");
        // And the rendered help agrees: every read flag shown, every daemon-only flag not.
        let help = DoctorArgs::command().render_long_help().to_string();
        for flag in DOCTOR_READS {
            assert!(help.contains(flag), "{flag} missing from:\n{help}");
        }
        let daemon_only = Args::command()
            .get_arguments()
            .filter_map(|arg| arg.get_long().map(|long| format!("--{long} ")))
            .filter(|flag| !DOCTOR_READS.contains(&flag.trim_end()))
            .collect::<Vec<_>>();
        assert!(daemon_only.iter().any(|f| f == "--peer-service "), "the daemon's flags are read: {daemon_only:?}");
        for flag in daemon_only {
            assert!(!help.contains(&flag), "{flag}in the doctor's help:\n{help}");
        }
        // Still accepted: the pod's environment and scripts pass them.
        assert!(DoctorArgs::try_parse_from(["doctor", "--metrics-addr", "0.0.0.0:9"]).is_ok());
        assert!(DoctorArgs::try_parse_from(["doctor", "--peer-service", "peers"]).is_ok());
    }

    #[test]
    fn the_doctor_takes_the_daemons_settings_and_its_own() {
        let args = DoctorArgs::try_parse_from([
            "doctor",
            "--node-name",
            "node-a",
            "--pv-dir",
            "/var/hpvolumes",
            "--pool",
            "ssd=/mnt/ssd,reserve=1Gi",
            "--require-mountpoint",
            "-o",
            "json",
        ])
        .expect("doctor arguments");
        assert_eq!(args.output, "json");
        let config = args.daemon.validate().expect("the daemon's validation");
        assert_eq!(config.node_name, "node-a");
        assert_eq!(config.pools.len(), 2);
        assert!(config.require_mountpoint);
        let defaults = DoctorArgs::try_parse_from(["doctor"]).expect("defaults");
        assert_eq!(defaults.output, "table");
    }

    #[test]
    fn the_daemon_never_accepted_a_first_argument_named_doctor() {
        // So dispatching on it cannot change what an existing daemon command line does.
        let daemon = Args::try_parse_from(["hostpath-provisioner", SUBCOMMAND, "--node-name", "n", "--pv-dir", "/p"]);
        assert!(daemon.is_err());
        assert!(Args::try_parse_from(["hostpath-provisioner", "--node-name", "n", "--pv-dir", "/p"]).is_ok());
    }
}

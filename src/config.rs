//! Command-line and environment configuration (DESIGN.md section 3). Every flag also reads an
//! env var; the Go build's variables (`NODE_NAME`, `PV_DIR`, `USE_NAMING_PREFIX`) work unchanged.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::deciding::claim::ProvisionOnNodePolicy;
use crate::deciding::layout::{self, PoolPath};

/// Name of the pool rooted at `PV_DIR`, as in the kubevirt CSI driver.
pub const LEGACY_POOL: &str = "legacy";

/// What the PV advertises as its capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PvCapacity {
    /// The claim's request (honest, default).
    Request,
    /// The whole filesystem rounded like the Go build, for tooling that depends on it.
    Filesystem,
}

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Raw command line, before validation.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "hostpath-provisioner",
    version,
    about = "Dynamic hostPath PersistentVolume provisioner (drop-in for the kubevirt legacy provisioner)"
)]
pub struct Args {
    /// This pod's node: the Node object name (downward API spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// Root directory of the default pool, mounted at the same path as on the host.
    #[arg(long, env = "PV_DIR")]
    pub pv_dir: Option<PathBuf>,

    /// Name directories <claim>-pvc-<uid> instead of pvc-<uid> ("true", case-insensitive, enables it).
    #[arg(long, env = "USE_NAMING_PREFIX", default_value = "false", value_parser = parse_go_bool, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub use_naming_prefix: bool,

    /// Provisioner name matched against StorageClass.provisioner.
    #[arg(long, env = "PROVISIONER_NAME", default_value = "kubevirt.io/hostpath-provisioner")]
    pub provisioner_name: String,

    /// Kubeconfig for out-of-cluster runs (default: the usual lookup, then the in-cluster service account).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// PV capacity: the claim's request, or the filesystem size rounded as the Go build did.
    #[arg(long, env = "PV_CAPACITY", value_enum, default_value = "request")]
    pub pv_capacity: PvCapacity,

    /// Mode of new volume directories, in octal (applied whatever the umask).
    #[arg(long, env = "DIR_MODE", default_value = "0777")]
    pub dir_mode: String,

    /// Refuse to provision or delete while a pool root is not a mount point.
    #[arg(long, env = "REQUIRE_MOUNTPOINT", default_value = "false", value_parser = parse_go_bool, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub require_mountpoint: bool,

    /// Who may pin claims to nodes with kubevirt.io/provisionOnNode: allow, deny, or a comma-separated list of namespaces.
    #[arg(long, env = "PROVISION_ON_NODE", default_value = "allow")]
    pub provision_on_node: String,

    /// Free space (bytes or a quantity like 1Gi) kept unallocated in each pool.
    #[arg(long, env = "RESERVED_SPACE", default_value = "0")]
    pub reserved_space: String,

    /// Most claims (and, separately, volumes) reconciled at once; there is no client-side QPS throttle.
    #[arg(long, env = "MAX_CONCURRENCY", default_value_t = 16)]
    pub max_concurrency: u16,

    /// Address of the Prometheus /metrics endpoint (empty disables it).
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,

    /// Address of /healthz and /readyz (empty disables it).
    #[arg(long, env = "HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    pub health_addr: String,

    /// Log format; the level comes from RUST_LOG (default info).
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// The Go build's rule: true only when the lower-cased value is "true".
fn parse_go_bool(s: &str) -> Result<bool, String> {
    Ok(s.trim().eq_ignore_ascii_case("true"))
}

/// A setting that is missing or invalid; the message names it and what is accepted.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Required setting absent.
    #[error("{0} is required (flag --{1} or env {0})")]
    Missing(&'static str, &'static str),
    /// Invalid value.
    #[error("{setting}: invalid value {value:?}: {accepted}")]
    Invalid {
        /// Env var name.
        setting: &'static str,
        /// What was given.
        value: String,
        /// What is accepted.
        accepted: String,
    },
}

/// Validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Node object name.
    pub node_name: String,
    /// Pools; the first is the default.
    pub pools: Vec<PoolPath>,
    /// `<claim>-pvc-<uid>` naming.
    pub use_naming_prefix: bool,
    /// Provisioner name.
    pub provisioner_name: String,
    /// Explicit kubeconfig.
    pub kubeconfig: Option<PathBuf>,
    /// PV capacity mode.
    pub pv_capacity: PvCapacity,
    /// Directory mode bits.
    pub dir_mode: u32,
    /// Pool roots must be mount points.
    pub require_mountpoint: bool,
    /// Who may use provisionOnNode.
    pub provision_on_node: ProvisionOnNodePolicy,
    /// Bytes kept free per pool.
    pub reserved_bytes: u64,
    /// Concurrent reconciles.
    pub max_concurrency: u16,
    /// Metrics listen address.
    pub metrics_addr: Option<SocketAddr>,
    /// Health listen address.
    pub health_addr: Option<SocketAddr>,
    /// Log format.
    pub log_format: LogFormat,
}

impl Args {
    /// Validates the raw arguments.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let node_name =
            self.node_name.filter(|n| !n.trim().is_empty()).ok_or(ConfigError::Missing("NODE_NAME", "node-name"))?;
        if !layout::is_dns_subdomain(&node_name) {
            return Err(invalid("NODE_NAME", &node_name, "a Node object name (DNS-1123 subdomain)"));
        }
        let pv_dir =
            self.pv_dir.filter(|p| !p.as_os_str().is_empty()).ok_or(ConfigError::Missing("PV_DIR", "pv-dir"))?;
        let root =
            pv_dir.to_str().and_then(|p| layout::normalise(p).ok()).filter(|p| p.parent().is_some()).ok_or_else(
                || {
                    invalid(
                        "PV_DIR",
                        &pv_dir.display().to_string(),
                        "an absolute directory path other than /, without '..'",
                    )
                },
            )?;
        let dir_mode = u32::from_str_radix(self.dir_mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| invalid("DIR_MODE", &self.dir_mode, "an octal mode such as 0777 or 0750"))?;
        let provision_on_node = match self.provision_on_node.trim() {
            "allow" | "" => ProvisionOnNodePolicy::Allow,
            "deny" => ProvisionOnNodePolicy::Deny,
            list => {
                let namespaces: Vec<String> =
                    list.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect();
                if namespaces.iter().any(|n| !layout::is_dns_subdomain(n)) {
                    return Err(invalid(
                        "PROVISION_ON_NODE",
                        list,
                        "allow, deny, or a comma-separated list of namespaces",
                    ));
                }
                ProvisionOnNodePolicy::Namespaces(namespaces)
            }
        };
        let reserved_bytes = crate::deciding::capacity::parse_bytes(&self.reserved_space).map_err(|e| {
            invalid("RESERVED_SPACE", &self.reserved_space, &format!("a size such as 0, 10Gi or 500M ({e})"))
        })?;
        if self.max_concurrency == 0 {
            return Err(invalid("MAX_CONCURRENCY", "0", "a number from 1 to 65535"));
        }
        if self.provisioner_name.trim().is_empty() {
            return Err(invalid("PROVISIONER_NAME", "", "a non-empty name such as kubevirt.io/hostpath-provisioner"));
        }
        Ok(Config {
            node_name,
            pools: vec![PoolPath { name: LEGACY_POOL.into(), root }],
            use_naming_prefix: self.use_naming_prefix,
            provisioner_name: self.provisioner_name,
            kubeconfig: self.kubeconfig.filter(|p| !p.as_os_str().is_empty()),
            pv_capacity: self.pv_capacity,
            dir_mode,
            require_mountpoint: self.require_mountpoint,
            provision_on_node,
            reserved_bytes,
            max_concurrency: self.max_concurrency,
            metrics_addr: parse_addr("METRICS_ADDR", &self.metrics_addr)?,
            health_addr: parse_addr("HEALTH_ADDR", &self.health_addr)?,
            log_format: self.log_format,
        })
    }
}

fn invalid(setting: &'static str, value: &str, accepted: &str) -> ConfigError {
    ConfigError::Invalid { setting, value: value.to_owned(), accepted: accepted.to_owned() }
}

/// `:8080` means all interfaces, as Go programs accept.
fn parse_addr(setting: &'static str, value: &str) -> Result<Option<SocketAddr>, ConfigError> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let full = if value.starts_with(':') { format!("0.0.0.0{value}") } else { value.to_owned() };
    full.parse()
        .map(Some)
        .map_err(|_| invalid(setting, value, "host:port such as 0.0.0.0:8080 or :8080, or empty to disable"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, ConfigError> {
        let mut argv = vec!["hostpath-provisioner"];
        argv.extend_from_slice(args);
        Args::try_parse_from(argv).expect("clap parse").validate()
    }

    #[test]
    fn minimal_go_style_settings_work() {
        let c = parse(&["--node-name", "node-a", "--pv-dir", "/var/hpvolumes/"]).unwrap();
        assert_eq!(c.node_name, "node-a");
        assert_eq!(c.pools, vec![PoolPath { name: "legacy".into(), root: "/var/hpvolumes".into() }]);
        assert_eq!(c.provisioner_name, "kubevirt.io/hostpath-provisioner");
        assert_eq!(c.dir_mode, 0o777);
        assert_eq!(c.pv_capacity, PvCapacity::Request);
        assert!(!c.use_naming_prefix);
        assert_eq!(c.metrics_addr, Some("0.0.0.0:8080".parse().unwrap()));
    }

    #[test]
    fn naming_prefix_follows_the_go_rule() {
        for (value, want) in [("true", true), ("TRUE", true), ("True", true), ("1", false), ("yes", false), ("", false)]
        {
            let c = parse(&["--node-name", "n", "--pv-dir", "/p", "--use-naming-prefix", value]).unwrap();
            assert_eq!(c.use_naming_prefix, want, "{value:?}");
        }
    }

    #[test]
    fn missing_node_or_dir_names_the_setting() {
        let e = parse(&["--pv-dir", "/p"]).unwrap_err().to_string();
        assert!(e.contains("NODE_NAME"), "{e}");
        let e = parse(&["--node-name", "n"]).unwrap_err().to_string();
        assert!(e.contains("PV_DIR"), "{e}");
    }

    #[test]
    fn invalid_values_name_the_setting_and_accepted_values() {
        let cases: [(&[&str], &str); 6] = [
            (&["--pv-dir", "relative"], "PV_DIR"),
            (&["--pv-dir", "/"], "PV_DIR"),
            (&["--pv-dir", "/a/../b"], "PV_DIR"),
            (&["--pv-dir", "/p", "--dir-mode", "999"], "DIR_MODE"),
            (&["--pv-dir", "/p", "--metrics-addr", "nope"], "METRICS_ADDR"),
            (&["--pv-dir", "/p", "--provision-on-node", "Bad_NS"], "PROVISION_ON_NODE"),
        ];
        for (args, setting) in cases {
            let mut all = vec!["--node-name", "n"];
            all.extend_from_slice(args);
            let e = parse(&all).unwrap_err().to_string();
            assert!(e.starts_with(setting), "{args:?}: {e}");
        }
    }

    #[test]
    fn go_style_listen_addresses_and_policies_parse() {
        let c = parse(&[
            "--node-name",
            "n",
            "--pv-dir",
            "/p",
            "--health-addr",
            ":9000",
            "--metrics-addr",
            "",
            "--provision-on-node",
            "vms, db",
            "--dir-mode",
            "0750",
            "--reserved-space",
            "1Gi",
        ])
        .unwrap();
        assert_eq!(c.health_addr, Some("0.0.0.0:9000".parse().unwrap()));
        assert_eq!(c.metrics_addr, None);
        assert_eq!(c.provision_on_node, ProvisionOnNodePolicy::Namespaces(vec!["vms".into(), "db".into()]));
        assert_eq!(c.dir_mode, 0o750);
        assert_eq!(c.reserved_bytes, 1 << 30);
    }
}

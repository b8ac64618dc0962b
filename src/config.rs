//! Command-line and environment configuration (docs/configuration.md). Every flag also reads an
//! env var; the Go build's variables (`NODE_NAME`, `PV_DIR`, `USE_NAMING_PREFIX`) work unchanged.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;

use crate::deciding::capacity::CapacityAccounting;
use crate::deciding::layout::{self, PoolPath};
use crate::deciding::settings::ProvisionOnNodePolicy;
pub use crate::deciding::settings::PvCapacity;

/// Name of the pool rooted at `PV_DIR`, as in the kubevirt CSI driver.
pub const LEGACY_POOL: &str = "legacy";

/// Log output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands `main` dispatches on, for the daemon's `--help` (a test checks that it
/// names each).
pub const SUBCOMMANDS_HELP: &str = "\
Subcommands (without one, the daemon runs):
  doctor            Check this node's pools with the daemon's settings: filesystem, mount, space, orphan and missing volume directories, trash
  readyz            Print the /readyz answer of the provisioner running here: ok, or why it is not ready (kubectl exec <pod> -- /hostpath-provisioner readyz)
  check-volume DIR  Check that the volume mounted at DIR can be written and read (the Helm chart's test pod)
  operator          Serve HostPathProvisioner resources: deploy and run the node provisioner they describe (docs/operator.md)
  pool-mount        Bind-mount a pool's claim onto the pool path and keep it there (the operator's node pods)
  release-claims-of-removed-nodes
                    Release the claims bound to PVs of nodes gone past a grace period (its own Deployment, the only one that may delete claims)
`hostpath-provisioner <subcommand> --help` describes each, but check-volume.";

/// Raw command line, before validation.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "hostpath-provisioner",
    version = crate::serving::build_info::VERSION_AND_COMMIT,
    about = "Dynamic hostPath PersistentVolume provisioner (drop-in for the kubevirt legacy provisioner)",
    after_help = SUBCOMMANDS_HELP
)]
pub struct Args {
    /// This pod's node: the Node object name (downward API spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// Root directory of the pool named "legacy", the default one; mounted at the same path as on the host.
    #[arg(long, env = "PV_DIR")]
    pub pv_dir: Option<PathBuf>,

    /// More pools: NAME=PATH, then options of that pool: `shared` for a network filesystem mounted at the same path on every node, `reserve=SIZE` for free space kept unallocated in it (instead of --reserved-space), `accounting=free|requests` (instead of --capacity-accounting), `mountpoint` to use the pool only while its path is a mount point (as --require-mountpoint, for this pool alone). Repeatable; STORAGE_POOLS takes a comma-separated list (ssd=/mnt/ssd,reserve=10Gi,nfs=/mnt/nfs,shared).
    #[arg(
        long = "pool",
        env = "STORAGE_POOLS",
        value_name = "NAME=PATH[,shared][,reserve=SIZE][,accounting=requests][,mountpoint]"
    )]
    pub pools: Vec<String>,

    /// Namespace of this node's liveness Lease (default: the pod's own, from its service account).
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,

    /// Seconds a node's liveness Lease lasts; it is renewed every third of that. Other nodes take
    /// over shared and every-node work of a node whose lease expired. Not used for liveness with
    /// --peer-service.
    #[arg(long, env = "NODE_LEASE_SECONDS", default_value = "120")]
    pub node_lease_seconds: String,

    /// Service (in the Lease namespace) selecting the provisioner pods: a node is live while its pod is Ready, as the Service's EndpointSlices say, and no Lease is renewed at rest (what the shipped manifests use). Unset: liveness from renewed Leases (a node run outside a pod).
    #[arg(long, env = "PEER_SERVICE", value_name = "NAME")]
    pub peer_service: Option<String>,

    /// Name directories <claim>-pvc-<uid> instead of pvc-<uid> ("true", case-insensitive, enables it).
    #[arg(long, env = "USE_NAMING_PREFIX", default_value = "false", value_parser = parse_go_bool, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub use_naming_prefix: bool,

    /// Provisioner name matched against StorageClass.provisioner.
    #[arg(long, env = "PROVISIONER_NAME", default_value = "kubevirt.io/hostpath-provisioner")]
    pub provisioner_name: String,

    /// A second provisioner name this node also serves, for classes placed by published capacity: a DNS name such as hostpath.example.org, which names the CSIDriver kube-scheduler reads capacity through. With it, PROVISIONER_NAME may keep its '/' (kubevirt.io/hostpath-provisioner) and its classes and volumes stay as they are.
    #[arg(long, env = "CAPACITY_PROVISIONER_NAME", value_name = "NAME")]
    pub capacity_provisioner_name: Option<String>,

    /// Kubeconfig for out-of-cluster runs (default: the usual lookup, then the in-cluster service
    /// account); several files separated by ':' are merged as kubectl does (the first file wins).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<std::ffi::OsString>,

    /// PV capacity: request (the claim's request) or filesystem (its size rounded as the Go build did).
    #[arg(long, env = "PV_CAPACITY", default_value = "request")]
    pub pv_capacity: String,

    /// Mode of new volume directories, in octal (applied whatever the umask).
    #[arg(long, env = "DIR_MODE", default_value = "0777")]
    pub dir_mode: String,

    /// Refuse to provision or delete while a pool root is not a mount point (true/false, yes/no, on/off, 1/0).
    #[arg(long, env = "REQUIRE_MOUNTPOINT", default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    pub require_mountpoint: String,

    /// Protect the data of node and shared volumes from `kubectl delete pv` with the external provisioner's deletion-protection finalizer (true/false, yes/no, on/off, 1/0). While PVs carry it, rolling back to the Go build leaves them stuck when deleted.
    #[arg(long, env = "PV_FINALIZER", default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    pub pv_finalizer: String,

    /// Publish each node's free space per class as CSIStorageCapacity objects for kube-scheduler (true/false, yes/no, on/off, 1/0). Needs a provisioner name that is a valid object name, and a CSIDriver of that name with storageCapacity: true.
    #[arg(long, env = "PUBLISH_CAPACITY", default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    pub publish_capacity: String,

    /// Serve volumeMode Block claims: a file in the pool on a loop device, exposed as a device node in BLOCK_DEVICE_DIR (true/false, yes/no, on/off, 1/0). Needs the host's /dev and /dev/loop-control.
    #[arg(long, env = "BLOCK_VOLUMES", default_value = "false", num_args = 0..=1, default_missing_value = "true")]
    pub block_volumes: String,

    /// Directory of Block volumes' device nodes, on the host's devtmpfs (gone at reboot, so a device node never outlives the loop it was made for).
    #[arg(long, env = "BLOCK_DEVICE_DIR", default_value = crate::deciding::block::DEVICE_DIR)]
    pub block_device_dir: PathBuf,

    /// Who may pin claims to nodes with kubevirt.io/provisionOnNode: allow, deny, or a comma-separated list of namespaces.
    #[arg(long, env = "PROVISION_ON_NODE", default_value = "allow")]
    pub provision_on_node: String,

    /// Free space (bytes or a quantity like 1Gi) kept unallocated in each pool.
    #[arg(long, env = "RESERVED_SPACE", default_value = "0")]
    pub reserved_space: String,

    /// How a pool's room is counted: free (free space now) or requests (also the pool's size minus the requests of its volumes, so promises never exceed the pool). A pool's accounting=... overrides it.
    #[arg(long, env = "CAPACITY_ACCOUNTING", default_value = "free")]
    pub capacity_accounting: String,

    /// Most claims (and, separately, volumes) reconciled at once; there is no client-side QPS throttle.
    #[arg(long, env = "MAX_CONCURRENCY", default_value = "16")]
    pub max_concurrency: String,

    /// Address of the Prometheus /metrics endpoint (empty disables it).
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: String,

    /// Address of /healthz and /readyz (empty disables it).
    #[arg(long, env = "HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    pub health_addr: String,

    /// Log format: text or json; the level comes from RUST_LOG (default info).
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    pub log_format: String,

    /// Off unless set: delete the Released PV objects (reclaim Delete) of a node whose Node object has been gone this long, e.g. 24h (its data went with it; one node speaks for the cluster).
    #[arg(long, env = "REAP_VOLUMES_OF_REMOVED_NODES", default_value = "", value_name = "DURATION")]
    pub reap_volumes_of_removed_nodes: String,

    /// Not acted upon by the node daemon: the claims of removed nodes are released by the `release-claims-of-removed-nodes` subcommand, run as a Deployment of its own (docs/operating.md). Set here (an install from before), it is reported (log, Event on the Node, metric, doctor) and ignored.
    #[arg(long, env = "RELEASE_CLAIMS_OF_REMOVED_NODES", default_value = "", value_name = "DURATION", hide = true)]
    pub release_claims_of_removed_nodes: String,

    /// How long a snapshot copy whose HostPathSnapshot is gone stays on its node before it is moved to the trash (it is reported at once), e.g. 1h.
    #[arg(long, env = "ORPHAN_SNAPSHOT_COPY_GRACE", default_value = "1h", value_name = "DURATION")]
    pub orphan_snapshot_copy_grace: String,

    /// Node label keys a StorageClass's nodeAffinityKey may name (comma-separated, e.g. example.com/disk-serial): volumes of such a class are pinned to the nodes carrying the label's value instead of to one node name. The Node's values are read at start.
    #[arg(long = "node-affinity-keys", env = "NODE_AFFINITY_KEYS", default_value = "", value_name = "KEY[,KEY...]")]
    pub node_affinity_keys: String,
}

// Settings that may come from env vars are read as plain strings and checked in
// `Args::validate`: clap's own errors name the flag over several lines, while docs/configuration.md
// promises one line naming the env var and the accepted values, whichever way it was set.

/// The Go build's rule: true only when the lower-cased value is "true". Kept for
/// `USE_NAMING_PREFIX` alone, which the Go build defined, so existing manifests keep their meaning.
fn parse_go_bool(s: &str) -> Result<bool, String> {
    Ok(s.trim().eq_ignore_ascii_case("true"))
}

/// What [`parse_switch`] accepts, for error messages.
pub const SWITCH_SPELLINGS: &str = "true/false, yes/no, on/off or 1/0 (any case)";

/// Reads an on/off setting of ours: the usual spellings, case-insensitive, around whitespace.
/// Anything else is refused rather than read as false, so that a safety switch such as
/// `REQUIRE_MOUNTPOINT=enabled` stops the start instead of silently leaving the check off.
pub fn parse_switch(setting: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(invalid(setting, value, SWITCH_SPELLINGS)),
    }
}

/// Splits a kubeconfig path list as kubectl does (`filepath.SplitList`: ':' on Unix), dropping
/// empty entries (`a::b`, a trailing ':').
pub fn split_kubeconfig_paths(value: &std::ffi::OsStr) -> Vec<PathBuf> {
    std::env::split_paths(value).filter(|p| !p.as_os_str().is_empty()).collect()
}

/// Reads `RUST_LOG` (unset or blank means `info`). A value that does not parse is an error:
/// tracing-subscriber would otherwise drop the bad directives and log less than asked without a word.
pub fn log_filter(rust_log: Option<&std::ffi::OsStr>) -> Result<tracing_subscriber::EnvFilter, ConfigError> {
    const ACCEPTED: &str = "tracing directives such as info, debug or info,hostpath_provisioner=debug";
    let Some(raw) = rust_log else { return Ok(tracing_subscriber::EnvFilter::new("info")) };
    let text = raw.to_str().ok_or_else(|| invalid("RUST_LOG", &raw.to_string_lossy(), ACCEPTED))?;
    if text.trim().is_empty() {
        return Ok(tracing_subscriber::EnvFilter::new("info"));
    }
    tracing_subscriber::EnvFilter::try_new(text).map_err(|e| invalid("RUST_LOG", text, &format!("{ACCEPTED} ({e})")))
}

/// Reads and merges the kubeconfig files of a path list the way kubectl does: files that do not
/// exist are skipped, and for a context, cluster or user named in several files, and for
/// `current-context`, the first file that sets it wins.
pub fn read_kubeconfigs(paths: &[PathBuf]) -> Result<kube::config::Kubeconfig, KubeconfigListError> {
    let mut merged: Option<kube::config::Kubeconfig> = None;
    for path in paths {
        if !path.exists() {
            continue;
        }
        let next = kube::config::Kubeconfig::read_from(path)
            .map_err(|source| KubeconfigListError::Read { path: path.clone(), source })?;
        merged = Some(match merged {
            None => next,
            Some(first) => {
                first.merge(next).map_err(|source| KubeconfigListError::Read { path: path.clone(), source })?
            }
        });
    }
    merged.ok_or_else(|| KubeconfigListError::NoneExists(paths.to_vec()))
}

/// Why a kubeconfig path list could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigListError {
    /// A file exists but cannot be read, parsed or merged.
    #[error("KUBECONFIG: {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: kube::config::KubeconfigError,
    },
    /// Not one file of the list exists.
    #[error("KUBECONFIG: none of {0:?} exists")]
    NoneExists(Vec<PathBuf>),
}

/// A setting that is missing or invalid; the message names it and what is accepted.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Required setting absent.
    #[error("{0} is required (flag --{1} or env {0})")]
    Missing(&'static str, &'static str),
    /// Invalid value; the message names the env var, the value, the flag and what is accepted.
    #[error("{setting}: invalid value {value:?}{}: {accepted}", flag_note(setting))]
    Invalid {
        /// Env var name.
        setting: &'static str,
        /// What was given.
        value: String,
        /// What is accepted.
        accepted: String,
    },
    /// `--publish-capacity` with a provisioner name that cannot name a CSIDriver object.
    #[error(
        "PUBLISH_CAPACITY: needs PROVISIONER_NAME to be a valid object name such as {CSIDRIVER_NAME_EXAMPLE} \
         (kube-scheduler reads published capacity only through a CSIDriver object named like the provisioner), \
         not {0:?}; or keep it and set CAPACITY_PROVISIONER_NAME to such a name for the classes to place by capacity"
    )]
    PublishCapacityNeedsObjectName(String),
}

/// A provisioner name kube-scheduler can look up as a CSIDriver object: a DNS subdomain, so the
/// default `kubevirt.io/hostpath-provisioner` (with a slash) cannot be one.
pub const CSIDRIVER_NAME_EXAMPLE: &str = "hostpath.example.org";

/// Validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Node object name.
    pub node_name: String,
    /// Every configured pool.
    pub pools: Vec<PoolPath>,
    /// The pool a class without `storagePool` gets: `legacy` when configured, else the only pool.
    pub default_pool: Option<String>,
    /// Namespace of the liveness Leases.
    pub namespace: String,
    /// Lifetime of this node's liveness Lease.
    pub node_lease: std::time::Duration,
    /// Liveness from the readiness of the pods behind this Service instead of Lease renewals.
    pub peer_service: Option<String>,
    /// `<claim>-pvc-<uid>` naming.
    pub use_naming_prefix: bool,
    /// Provisioner name.
    pub provisioner_name: String,
    /// The second name served, for classes placed by published capacity.
    pub capacity_provisioner_name: Option<String>,
    /// Explicit kubeconfig files, merged in order (empty: in-cluster or the usual lookup).
    pub kubeconfig: Vec<PathBuf>,
    /// PV capacity mode.
    pub pv_capacity: PvCapacity,
    /// Directory mode bits.
    pub dir_mode: u32,
    /// Pool roots must be mount points.
    pub require_mountpoint: bool,
    /// New node and shared PVs get the deletion-protection finalizer.
    pub pv_finalizer: bool,
    /// Who may use provisionOnNode.
    pub provision_on_node: ProvisionOnNodePolicy,
    /// Publish CSIStorageCapacity objects for kube-scheduler.
    pub publish_capacity: bool,
    /// `BLOCK_VOLUMES`: the directory of Block volumes' device nodes (`BLOCK_DEVICE_DIR`) when
    /// they are on; `None` refuses Block claims.
    pub block_device_dir: Option<PathBuf>,
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
    /// How long a Node object must be gone before its Released PVs are deleted (off: `None`).
    pub reap_volumes_of_removed_nodes: Option<std::time::Duration>,
    /// `RELEASE_CLAIMS_OF_REMOVED_NODES` as set on the node daemon (an install from before the
    /// claim releaser ran apart): never acted upon here, only reported. Any value but empty or
    /// `off`, unparsed: a value the releaser would refuse must not stop provisioning either.
    pub release_claims_setting_ignored: Option<String>,
    /// How long a snapshot copy without its snapshot stays before it is trashed.
    pub orphan_snapshot_copy_grace: std::time::Duration,
    /// Node label keys a class's `nodeAffinityKey` may name.
    pub node_affinity_keys: Vec<String>,
}

impl Args {
    /// Validates the raw arguments.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let node_name =
            self.node_name.filter(|n| !n.trim().is_empty()).ok_or(ConfigError::Missing("NODE_NAME", "node-name"))?;
        if !layout::is_dns_subdomain(&node_name) {
            return Err(invalid("NODE_NAME", &node_name, "a Node object name (DNS-1123 subdomain)"));
        }
        let mut pools = Vec::new();
        if let Some(pv_dir) = self.pv_dir.filter(|p| !p.as_os_str().is_empty()) {
            let root = pv_dir.to_str().and_then(layout::pool_root).ok_or_else(|| {
                invalid(
                    "PV_DIR",
                    &pv_dir.display().to_string(),
                    "an absolute directory path other than /, without '..' or ','",
                )
            })?;
            pools.push(PoolPath::local(LEGACY_POOL, root));
        }
        // Blank, as PV_DIR: a manifest may set the variable empty for "no more pools".
        for spec in self.pools.iter().filter(|spec| !spec.trim().is_empty()) {
            pools.extend(parse_pool_specs(spec)?);
        }
        check_pools(&pools)?;
        if pools.is_empty() {
            return Err(ConfigError::Missing("PV_DIR", "pv-dir"));
        }
        let default_pool = match pools.iter().find(|p| p.name == LEGACY_POOL) {
            Some(legacy) => Some(legacy.name.clone()),
            // One pool, perhaps of several roots.
            None if pools.iter().all(|p| p.name == pools[0].name) => pools.first().map(|p| p.name.clone()),
            None => None,
        };
        let namespace = match self.namespace.map(|n| n.trim().to_owned()).filter(|n| !n.is_empty()) {
            Some(ns) if layout::is_dns_label(&ns) => ns,
            Some(ns) => return Err(invalid("POD_NAMESPACE", &ns, "a namespace name (DNS-1123 label)")),
            None => own_namespace(),
        };
        let peer_service = match self.peer_service.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()) {
            Some(name) if layout::is_dns_label(&name) => Some(name),
            Some(name) => return Err(invalid("PEER_SERVICE", &name, "a Service name (DNS label)")),
            None => None,
        };
        // The Lease's leaseDurationSeconds is a 32-bit number: a larger value would be refused by
        // the API server at every renewal, leaving the node never live for the others.
        let node_lease_seconds = self
            .node_lease_seconds
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|s| (3..=MAX_LEASE_SECONDS).contains(s))
            .ok_or_else(|| {
                invalid("NODE_LEASE_SECONDS", &self.node_lease_seconds, "a number of seconds from 3 to 2147483647")
            })?;
        let pv_capacity = match self.pv_capacity.trim().to_ascii_lowercase().as_str() {
            "request" => PvCapacity::Request,
            "filesystem" => PvCapacity::Filesystem,
            _ => return Err(invalid("PV_CAPACITY", &self.pv_capacity, "request or filesystem")),
        };
        let log_format = match self.log_format.trim().to_ascii_lowercase().as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            _ => return Err(invalid("LOG_FORMAT", &self.log_format, "text or json")),
        };
        let require_mountpoint = parse_switch("REQUIRE_MOUNTPOINT", &self.require_mountpoint)?;
        let pv_finalizer = parse_switch("PV_FINALIZER", &self.pv_finalizer)?;
        let publish_capacity = parse_switch("PUBLISH_CAPACITY", &self.publish_capacity)?;
        let block_volumes = parse_switch("BLOCK_VOLUMES", &self.block_volumes)?;
        if block_volumes && !self.block_device_dir.is_absolute() {
            return Err(invalid(
                "BLOCK_DEVICE_DIR",
                &self.block_device_dir.to_string_lossy(),
                "an absolute path such as /dev/hostpath-provisioner",
            ));
        }
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
        let accounting = CapacityAccounting::parse(&self.capacity_accounting)
            .ok_or_else(|| invalid("CAPACITY_ACCOUNTING", &self.capacity_accounting, "free or requests"))?;
        for pool in &mut pools {
            pool.accounting = Some(pool.accounting.unwrap_or(accounting));
        }
        if pv_capacity == PvCapacity::Filesystem
            && let Some(pool) = pools.iter().find(|p| p.accounting == Some(CapacityAccounting::Requests))
        {
            // Requests are summed from the PVs' capacities, which would all be the whole disk.
            return Err(invalid(
                "CAPACITY_ACCOUNTING",
                &format!("requests (pool {})", pool.name),
                "free while PV_CAPACITY=filesystem: the PVs then state the filesystem's size, not their requests",
            ));
        }
        let reserved_bytes = crate::deciding::capacity::parse_bytes(&self.reserved_space).map_err(|e| {
            invalid("RESERVED_SPACE", &self.reserved_space, &format!("a size such as 0, 10Gi or 500M ({e})"))
        })?;
        let max_concurrency = self
            .max_concurrency
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| invalid("MAX_CONCURRENCY", &self.max_concurrency, "a number from 1 to 65535"))?;
        // The API server accepts as StorageClass.provisioner, and as the reporting controller of
        // our events, only a qualified name: any other name would match no class and write no event.
        if !is_qualified_name(&self.provisioner_name) {
            return Err(invalid(
                "PROVISIONER_NAME",
                &self.provisioner_name,
                "a qualified name such as kubevirt.io/hostpath-provisioner (an optional DNS subdomain and '/', then up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)",
            ));
        }
        let capacity_provisioner_name =
            self.capacity_provisioner_name.map(|n| n.trim().to_owned()).filter(|n| !n.is_empty());
        if let Some(name) = &capacity_provisioner_name
            && (!layout::is_dns_subdomain(name) || *name == self.provisioner_name)
        {
            return Err(invalid(
                "CAPACITY_PROVISIONER_NAME",
                name,
                "a DNS name such as hostpath.example.org (it names a CSIDriver object), other than PROVISIONER_NAME",
            ));
        }
        if publish_capacity && capacity_provisioner_name.is_none() && !layout::is_dns_subdomain(&self.provisioner_name)
        {
            return Err(ConfigError::PublishCapacityNeedsObjectName(self.provisioner_name));
        }
        let metrics_addr = parse_addr("METRICS_ADDR", &self.metrics_addr)?;
        let health_addr = parse_addr("HEALTH_ADDR", &self.health_addr)?;
        if let (Some(metrics), Some(health)) = (metrics_addr, health_addr)
            && listeners_collide(metrics, health)
        {
            return Err(invalid(
                "METRICS_ADDR",
                &format!("{} (HEALTH_ADDR {})", self.metrics_addr.trim(), self.health_addr.trim()),
                "a port of its own, or the very address of HEALTH_ADDR (one listener then serves both): the two addresses overlap on one port, so the second could not listen",
            ));
        }
        Ok(Config {
            node_name,
            pools,
            default_pool,
            namespace,
            node_lease: std::time::Duration::from_secs(node_lease_seconds.into()),
            peer_service,
            use_naming_prefix: self.use_naming_prefix,
            provisioner_name: self.provisioner_name,
            capacity_provisioner_name,
            kubeconfig: self.kubeconfig.as_deref().map(split_kubeconfig_paths).unwrap_or_default(),
            pv_capacity,
            dir_mode,
            require_mountpoint,
            pv_finalizer,
            provision_on_node,
            publish_capacity,
            block_device_dir: block_volumes.then_some(self.block_device_dir),
            reserved_bytes,
            max_concurrency,
            metrics_addr,
            health_addr,
            log_format,
            reap_volumes_of_removed_nodes: parse_grace(
                "REAP_VOLUMES_OF_REMOVED_NODES",
                &self.reap_volumes_of_removed_nodes,
            )?,
            release_claims_setting_ignored: Some(self.release_claims_of_removed_nodes.trim().to_owned())
                .filter(|value| !value.is_empty() && value != "off"),
            orphan_snapshot_copy_grace: parse_grace("ORPHAN_SNAPSHOT_COPY_GRACE", &self.orphan_snapshot_copy_grace)?
                .ok_or_else(|| {
                    invalid(
                        "ORPHAN_SNAPSHOT_COPY_GRACE",
                        &self.orphan_snapshot_copy_grace,
                        "a positive duration such as 1h or 30m",
                    )
                })?,
            node_affinity_keys: parse_affinity_keys(&self.node_affinity_keys)?,
        })
    }
}

/// `REAP_VOLUMES_OF_REMOVED_NODES`, `RELEASE_CLAIMS_OF_REMOVED_NODES` (`name`): empty is off; else
/// a positive duration written as `24h`, `90m`, `1h 30m` or ISO 8601 `PT24H` (jiff's parser,
/// already in the build through k8s-openapi). How long is safe is the admin's call
/// (docs/operating.md): a node re-created under the same name within it keeps its volumes.
pub fn parse_grace(name: &'static str, value: &str) -> Result<Option<std::time::Duration>, ConfigError> {
    let value = value.trim();
    if value.is_empty() || value == "off" {
        return Ok(None);
    }
    let accepted = "a positive duration such as 24h, 90m or 1h 30m, or empty (off)";
    let duration: jiff::SignedDuration = value.parse().map_err(|_| invalid(name, value, accepted))?;
    match std::time::Duration::try_from(duration) {
        Ok(d) if !d.is_zero() => Ok(Some(d)),
        _ => Err(invalid(name, value, accepted)),
    }
}

/// Where the service account's namespace is mounted in a pod.
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The pod's namespace from its service account, or `default` outside a pod.
fn own_namespace() -> String {
    std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| layout::is_dns_label(s))
        .unwrap_or_else(|| "default".to_owned())
}

/// Parses one `--pool` value or the whole `STORAGE_POOLS`: comma-separated entries, where
/// `NAME=PATH` starts a pool and `shared`, `mountpoint`, `reserve=SIZE` or `accounting=...` is an
/// option of the pool before it.
/// So `--pool nfs=/mnt/nfs,shared` and `STORAGE_POOLS=ssd=/mnt/ssd,reserve=10Gi,nfs=/mnt/nfs,shared`
/// read the same way (`shared`, `mountpoint`, `reserve` and `accounting` cannot be pool names).
pub fn parse_pool_specs(value: &str) -> Result<Vec<PoolPath>, ConfigError> {
    const ACCEPTED: &str = "NAME=PATH[,shared][,mountpoint][,reserve=SIZE][,accounting=free|requests] entries separated by commas, NAME a DNS-1123 label, PATH an absolute directory other than /";
    let mut pools: Vec<PoolPath> = Vec::new();
    for token in value.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        if let Some(accounting) = token.strip_prefix("accounting=") {
            let (Some(pool), Some(accounting)) = (pools.last_mut(), CapacityAccounting::parse(accounting)) else {
                return Err(invalid("STORAGE_POOLS", value, ACCEPTED));
            };
            pool.accounting = Some(accounting);
            continue;
        }
        if let Some(size) = token.strip_prefix("reserve=") {
            let (Some(pool), Ok(bytes)) = (pools.last_mut(), crate::deciding::capacity::parse_bytes(size)) else {
                return Err(invalid("STORAGE_POOLS", value, ACCEPTED));
            };
            pool.reserve = Some(bytes);
            continue;
        }
        match token.split_once('=') {
            Some((name, path)) => {
                let name = name.trim();
                if !layout::is_dns_label(name) {
                    return Err(invalid("STORAGE_POOLS", value, ACCEPTED));
                }
                let root = layout::pool_root(path.trim()).ok_or_else(|| invalid("STORAGE_POOLS", value, ACCEPTED))?;
                pools.push(PoolPath::local(name, root));
            }
            None => match (token, pools.last_mut()) {
                ("shared", Some(pool)) => pool.shared = true,
                ("mountpoint", Some(pool)) => pool.require_mountpoint = true,
                _ => return Err(invalid("STORAGE_POOLS", value, ACCEPTED)),
            },
        }
    }
    if pools.is_empty() {
        return Err(invalid("STORAGE_POOLS", value, ACCEPTED));
    }
    Ok(pools)
}

/// Roots are unique and none lies inside another (a volume of one pool would otherwise be a
/// directory of the other, and its trash the other's entry). A name given for several roots is
/// one pool over several disks (`deciding::pool_roots`); a shared pool is one filesystem, so it
/// has one root.
fn check_pools(pools: &[PoolPath]) -> Result<(), ConfigError> {
    for (i, a) in pools.iter().enumerate() {
        for b in &pools[i + 1..] {
            if a.name == b.name && (a.shared || b.shared) {
                return Err(invalid(
                    "STORAGE_POOLS",
                    &a.name,
                    "a shared pool with one root (a name given for several roots is a node-local pool over several disks)",
                ));
            }
            if a.root.starts_with(&b.root) || b.root.starts_with(&a.root) {
                return Err(invalid(
                    "STORAGE_POOLS",
                    &format!("{} and {}", a.root.display(), b.root.display()),
                    "pool roots that are distinct and not inside one another",
                ));
            }
        }
    }
    Ok(())
}

/// `NODE_AFFINITY_KEYS`: comma-separated node label keys (blank entries ignored).
fn parse_affinity_keys(value: &str) -> Result<Vec<String>, ConfigError> {
    let mut keys = Vec::new();
    for key in value.split(',').map(str::trim).filter(|key| !key.is_empty()) {
        if !crate::deciding::node_affinity::is_label_key(key) {
            return Err(invalid(
                "NODE_AFFINITY_KEYS",
                key,
                "node label keys such as example.com/disk-serial, comma-separated",
            ));
        }
        if !keys.iter().any(|k: &String| k == key) {
            keys.push(key.to_owned());
        }
    }
    Ok(keys)
}

fn invalid(setting: &'static str, value: &str, accepted: &str) -> ConfigError {
    ConfigError::Invalid { setting, value: value.to_owned(), accepted: accepted.to_owned() }
}

/// ` (flag --x)` for a setting the command line also takes, so that an error names it whichever
/// way it was given.
fn flag_note(setting: &str) -> String {
    use clap::CommandFactory;
    let command = Args::command();
    let flag = command.get_arguments().find(|arg| arg.get_env() == Some(std::ffi::OsStr::new(setting)));
    match flag.and_then(|arg| arg.get_long()) {
        Some(long) => format!(" (flag --{long})"),
        None => String::new(),
    }
}

/// Longest lease the API server stores (`leaseDurationSeconds` is an int32).
const MAX_LEASE_SECONDS: u32 = i32::MAX as u32;

/// A Kubernetes qualified name (`[prefix/]name`): what the API server accepts as a
/// StorageClass's `provisioner` and an event's `reportingController`.
fn is_qualified_name(value: &str) -> bool {
    let (prefix, name) = match value.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric();
    name_ok && prefix.is_none_or(layout::is_dns_subdomain)
}

/// Whether two listeners on these addresses cannot both bind: the same port, different
/// addresses, one of them the wildcard of the other's family (or the IPv6 wildcard, which on
/// Linux also takes the port for IPv4). The same address is served by one listener.
fn listeners_collide(a: SocketAddr, b: SocketAddr) -> bool {
    let covers = |wide: SocketAddr, other: SocketAddr| {
        wide.ip().is_unspecified() && (wide.is_ipv6() || wide.is_ipv4() == other.is_ipv4())
    };
    a != b && a.port() == b.port() && a.port() != 0 && (covers(a, b) || covers(b, a))
}

/// A listen address setting: empty is off; `:8080` means all interfaces, as Go programs accept.
pub fn parse_addr(setting: &'static str, value: &str) -> Result<Option<SocketAddr>, ConfigError> {
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
mod tests;

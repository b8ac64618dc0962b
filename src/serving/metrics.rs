//! Prometheus metrics (prometheus-client), served on `--metrics-addr`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Outcome labels for operation counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Outcome {
    /// `success`, `error` or `refused`.
    pub result: String,
    /// Short reason (`none` on success).
    pub reason: String,
}

/// Pool labels for gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    /// Pool name.
    pub pool: String,
}

/// Watch labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchLabel {
    /// Which watch.
    pub watch: String,
}

/// Labels of bytes stuck in a pool's trash.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StuckLabel {
    /// Pool name.
    pub pool: String,
    /// Why the background removal fails (the error's label, e.g. `permission_denied`).
    pub reason: String,
}

/// Labels of a pool's quota capability (quota: engineer D's block).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaCapabilityLabel {
    /// Pool name.
    pub pool: String,
    /// `btrfs-qgroup`, or `none` when the pool cannot enforce.
    pub mechanism: String,
}

/// Labels of one quota volume.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeLabel {
    /// Pool name.
    pub pool: String,
    /// Volume directory name (`pvc-<uid>` or the naming-prefix form).
    pub volume: String,
}

/// All metrics of one process.
pub struct Metrics {
    registry: Registry,
    /// Provisioning attempts by result and reason.
    pub provisions: Family<Outcome, Counter>,
    /// Deletions by result and reason.
    pub deletions: Family<Outcome, Counter>,
    /// Seconds from a claim becoming ours to its PV's creation.
    pub provision_seconds: Histogram,
    /// Seconds to remove a volume's data and PV.
    pub delete_seconds: Histogram,
    /// PV paths refused for deletion.
    pub refused_paths: Counter,
    /// Pool size in bytes.
    pub pool_capacity_bytes: Family<PoolLabel, Gauge>,
    /// Pool free bytes (available to unprivileged users, as statvfs f_bavail).
    pub pool_free_bytes: Family<PoolLabel, Gauge>,
    /// 1 while a pool can be used, 0 while it cannot (missing, replaced, not a required mount).
    pub pool_usable: Family<PoolLabel, Gauge>,
    /// Watch stream errors (each one restarts the watch with backoff).
    pub watch_restarts: Family<WatchLabel, Counter>,
    /// Deleted volumes whose data still awaits background removal.
    pub background_deletions_pending: Family<PoolLabel, Gauge>,
    /// Bytes in volume directories whose PV is gone (deleted by hand), found since start.
    pub orphaned_volume_bytes: Family<PoolLabel, Gauge>,
    /// Bytes of deleted volumes the background removal cannot remove, by pool and reason.
    pub trash_stuck_bytes: Family<StuckLabel, Gauge>,
    /// Quotas: 1 for the mechanism a pool enforces quotas with (`none` when it cannot).
    pub pool_quota_capability: Family<QuotaCapabilityLabel, Gauge>,
    /// Quotas: bytes each quota volume references, from the filesystem's quota accounting.
    pub volume_used_bytes: Family<VolumeLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric under the `hostpath_provisioner` prefix.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("hostpath_provisioner");
        let provisions = Family::<Outcome, Counter>::default();
        let deletions = Family::<Outcome, Counter>::default();
        let provision_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let delete_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 18));
        let refused_paths = Counter::default();
        let pool_capacity_bytes = Family::<PoolLabel, Gauge>::default();
        let pool_free_bytes = Family::<PoolLabel, Gauge>::default();
        let watch_restarts = Family::<WatchLabel, Counter>::default();
        let pool_usable = Family::<PoolLabel, Gauge>::default();
        let background_deletions_pending = Family::<PoolLabel, Gauge>::default();
        let trash_stuck_bytes = Family::<StuckLabel, Gauge>::default();
        let orphaned_volume_bytes = Family::<PoolLabel, Gauge>::default();
        registry.register("provisions", "Provisioning attempts by result and reason", provisions.clone());
        registry.register("deletions", "Volume deletions by result and reason", deletions.clone());
        registry.register(
            "provision_duration_seconds",
            "Seconds from a claim becoming this node's to its PV being created",
            provision_seconds.clone(),
        );
        registry.register(
            "delete_duration_seconds",
            "Seconds to remove a released volume's data and PV",
            delete_seconds.clone(),
        );
        registry.register("refused_paths", "PV paths refused for deletion by the path rules", refused_paths.clone());
        registry.register(
            "pool_capacity_bytes",
            "Size of each pool's filesystem in bytes",
            pool_capacity_bytes.clone(),
        );
        registry.register("pool_free_bytes", "Free bytes in each pool's filesystem", pool_free_bytes.clone());
        registry.register(
            "pool_usable",
            "1 while the pool can be used, 0 while it cannot (missing, replaced, or not a required mount point)",
            pool_usable.clone(),
        );
        registry.register(
            "watch_restarts",
            "Watch stream errors, each followed by a re-watch with backoff",
            watch_restarts.clone(),
        );
        registry.register(
            "background_deletions_pending",
            "Deleted volumes whose data still awaits background removal",
            background_deletions_pending.clone(),
        );
        registry.register(
            "orphaned_volume_bytes",
            "Bytes in volume directories that hold data but have no PV (deleted by hand), found since start",
            orphaned_volume_bytes.clone(),
        );
        registry.register(
            "trash_stuck_bytes",
            "Bytes of deleted volumes that the background removal cannot remove, by pool and reason",
            trash_stuck_bytes.clone(),
        );
        // Quotas (engineer D): capability per pool and usage per quota volume.
        let pool_quota_capability = Family::<QuotaCapabilityLabel, Gauge>::default();
        let volume_used_bytes = Family::<VolumeLabel, Gauge>::default();
        registry.register(
            "pool_quota_capability",
            "1 for the mechanism each pool enforces quotas with (mechanism=none: it cannot enforce)",
            pool_quota_capability.clone(),
        );
        registry.register(
            "volume_used_bytes",
            "Bytes each quota volume references, from the filesystem's quota accounting (quota volumes only)",
            volume_used_bytes.clone(),
        );
        Self {
            registry,
            pool_quota_capability,
            volume_used_bytes,
            provisions,
            deletions,
            provision_seconds,
            delete_seconds,
            refused_paths,
            pool_capacity_bytes,
            pool_free_bytes,
            pool_usable,
            watch_restarts,
            background_deletions_pending,
            trash_stuck_bytes,
            orphaned_volume_bytes,
        }
    }

    /// Text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Counts one outcome.
    pub fn outcome(family: &Family<Outcome, Counter>, result: &str, reason: &str) {
        family.get_or_create(&Outcome { result: result.into(), reason: reason.into() }).inc();
    }
}

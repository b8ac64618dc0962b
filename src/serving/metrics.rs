//! Prometheus metrics (prometheus-client), served on `--metrics-addr`.
//!
//! Three groups: ours (`hostpath_provisioner_*`); the names the sig-storage provisioner library
//! (sig-storage-lib-external-provisioner, `controller/metrics`) exposes, so that dashboards and
//! alerts made for external provisioners work unchanged; and the standard `process_*` metrics.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::serving::build_info;
use crate::serving::process::ProcessCollector;
use crate::serving::waiting_claims::WaitingClaims;

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
    /// Pool root: a pool of several roots (one per disk) has a series for each.
    pub root: String,
}

impl PoolLabel {
    /// The labels of the pool `name`'s root `root`.
    pub fn new(name: &str, root: &std::path::Path) -> PoolLabel {
        PoolLabel { pool: name.to_owned(), root: root.display().to_string() }
    }
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
    /// Pool root.
    pub root: String,
    /// Why the background removal fails (the error's label, e.g. `permission_denied`).
    pub reason: String,
}

/// Labels of the library's provisioning metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClaimClass {
    /// The claim's `spec.storageClassName` (empty when it names none).
    pub class: String,
    /// The kind of the claim's `spec.dataSource` (empty when it has none).
    pub source: String,
}

/// Labels of the library's deletion metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VolumeClass {
    /// The PV's `spec.storageClassName`.
    pub class: String,
}

/// Labels of the build info gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// Crate version.
    pub version: String,
    /// Git commit, or `unknown`.
    pub commit: String,
}

/// The buckets of the library's duration histograms: client_golang's `DefBuckets`.
const LIBRARY_BUCKETS: [f64; 11] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// A histogram family with [`LIBRARY_BUCKETS`].
pub type LibraryHistograms<L> = Family<L, Histogram, fn() -> Histogram>;

fn library_histogram() -> Histogram {
    Histogram::new(LIBRARY_BUCKETS)
}

/// The sig-storage provisioner library's metrics (`controller_*`), counted where the library
/// counts them: once per provisioning or deletion attempt of a claim or PV this node acts on.
/// Success adds to the total and observes the duration; failure (an error, a refusal, a claim
/// handed back to the scheduler) adds to the failed total.
pub struct LibraryMetrics {
    /// `controller_persistentvolumeclaim_provision_total`.
    pub provision_total: Family<ClaimClass, Counter>,
    /// `controller_persistentvolumeclaim_provision_failed_total`.
    pub provision_failed_total: Family<ClaimClass, Counter>,
    /// `controller_persistentvolumeclaim_provision_duration_seconds`.
    pub provision_duration_seconds: LibraryHistograms<ClaimClass>,
    /// `controller_persistentvolume_delete_total`.
    pub delete_total: Family<VolumeClass, Counter>,
    /// `controller_persistentvolume_delete_failed_total`.
    pub delete_failed_total: Family<VolumeClass, Counter>,
    /// `controller_persistentvolume_delete_duration_seconds`.
    pub delete_duration_seconds: LibraryHistograms<VolumeClass>,
}

impl LibraryMetrics {
    fn register(registry: &mut Registry) -> Self {
        let metrics = LibraryMetrics {
            provision_total: Family::default(),
            provision_failed_total: Family::default(),
            provision_duration_seconds: Family::new_with_constructor(library_histogram),
            delete_total: Family::default(),
            delete_failed_total: Family::default(),
            delete_duration_seconds: Family::new_with_constructor(library_histogram),
        };
        // Counters get their `_total` suffix from the encoder.
        registry.register(
            "controller_persistentvolumeclaim_provision",
            "Total number of persistent volumes provisioned successfully. Broken down by storage class name and source of the claim",
            metrics.provision_total.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_failed",
            "Total number of persistent volume provision failed attempts. Broken down by storage class name and source of the claim",
            metrics.provision_failed_total.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_duration_seconds",
            "Latency in seconds to provision persistent volumes. Failed provisioning attempts are ignored. Broken down by storage class name and source of the claim",
            metrics.provision_duration_seconds.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete",
            "Total number of persistent volumes deleted successfully. Broken down by storage class name",
            metrics.delete_total.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_failed",
            "Total number of persistent volume delete failed attempts. Broken down by storage class name",
            metrics.delete_failed_total.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_duration_seconds",
            "Latency in seconds to delete persistent volumes. Failed deletion attempts are ignored. Broken down by storage class name",
            metrics.delete_duration_seconds.clone(),
        );
        metrics
    }

    /// Counts a provisioning attempt that created the PV, and its duration.
    pub fn provisioned(&self, labels: &ClaimClass, seconds: f64) {
        self.provision_total.get_or_create(labels).inc();
        self.provision_duration_seconds.get_or_create(labels).observe(seconds);
    }

    /// Counts a provisioning attempt that failed, was refused, or handed the claim back.
    pub fn provision_failed(&self, labels: &ClaimClass) {
        self.provision_failed_total.get_or_create(labels).inc();
    }

    /// Counts a deletion that removed the volume, and its duration.
    pub fn deleted(&self, labels: &VolumeClass, seconds: f64) {
        self.delete_total.get_or_create(labels).inc();
        self.delete_duration_seconds.get_or_create(labels).observe(seconds);
    }

    /// Counts a deletion attempt that failed or was refused.
    pub fn delete_failed(&self, labels: &VolumeClass) {
        self.delete_failed_total.get_or_create(labels).inc();
    }
}

/// Labels of a pool's quota capability .
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaCapabilityLabel {
    /// Pool name.
    pub pool: String,
    /// Pool root.
    pub root: String,
    /// `btrfs-qgroup`, `project` (XFS/ext4 project quota), or `none` when the pool cannot enforce.
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

/// Labels of one Block volume of this node (issue #47): as many series as Block volumes served
/// here, like [`VolumeLabel`]'s per quota volume.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BlockVolumeLabel {
    /// Pool name (empty when the PV's backing directory is refused, so unknown).
    pub pool: String,
    /// PV name, which the volume's device node is named after.
    pub pv: String,
}

/// All metrics of one process.
pub struct Metrics {
    registry: Registry,
    /// The sig-storage library's names (`controller_*`).
    pub library: LibraryMetrics,
    /// 1 while `/readyz` answers 200 (set at each scrape), else 0.
    pub ready: Gauge,
    /// 1 when a pool is on the node's OS disk, 0 when it is not; absent when that cannot be told.
    pub pool_shares_os_disk: Family<PoolLabel, Gauge>,
    /// The kubevirt CSI driver's `kubevirt_hpp_pool_path_shared_with_os`: 1 when any pool is on
    /// the OS disk.
    pub kubevirt_pool_path_shared_with_os: Gauge,
    /// Claims waiting for a node where no provisioner runs.
    pub waiting_claims: Arc<WaitingClaims>,
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
    /// Label-pinned PVs kept because other live nodes carry their value (each look counts).
    pub duplicate_affinity_labels: Counter,
    /// This node's affinity labels (`key=value`) that other live nodes carry too, at the last look.
    pub affinity_labels_shared: Gauge,
    /// PV objects of removed nodes deleted (`--reap-volumes-of-removed-nodes`).
    pub reaped_volumes: Counter,
    /// 1 when `RELEASE_CLAIMS_OF_REMOVED_NODES` is set on this node pod and ignored (node pods
    /// never delete claims; the releaser Deployment does).
    pub release_claims_setting_ignored: Gauge,
    /// Pool size in bytes.
    pub pool_capacity_bytes: Family<PoolLabel, Gauge>,
    /// Pool free bytes (available to unprivileged users, as statvfs f_bavail).
    pub pool_free_bytes: Family<PoolLabel, Gauge>,
    /// 1 while a pool can be used, 0 while it cannot (missing, replaced, not a required mount).
    pub pool_usable: Family<PoolLabel, Gauge>,
    /// Watch stream errors (each one restarts the watch with backoff).
    pub watch_restarts: Family<WatchLabel, Counter>,
    /// Objects each watch cache holds (claims: only those this node may act on).
    pub cached_objects: Family<WatchLabel, Gauge>,
    /// Deleted volumes whose data still awaits background removal.
    pub background_deletions_pending: Family<PoolLabel, Gauge>,
    /// Bytes in volume directories whose PV is gone (deleted by hand), found since start.
    pub orphaned_volume_bytes: Family<PoolLabel, Gauge>,
    /// Bytes of deleted volumes the background removal cannot remove, by pool and reason.
    pub trash_stuck_bytes: Family<StuckLabel, Gauge>,
    /// Snapshot copies on this node whose HostPathSnapshot is gone, waiting for the trash.
    pub orphaned_snapshot_copies: Family<PoolLabel, Gauge>,
    /// Volumes this node keeps staged for deletion whose fate is not settled yet: their PV's
    /// answer was lost, or it is gone and the trash cannot take them (stranded).
    pub staged_volumes: Family<PoolLabel, Gauge>,
    /// Bytes of volumes whose PV is gone but which the trash cannot take, so that they wait in
    /// the deletion staging (retried every minute).
    pub stranded_volume_bytes: Family<PoolLabel, Gauge>,
    /// btrfs subvolumes found nested inside volumes (made by workloads, outside the volumes'
    /// quotas) and removed with them.
    pub nested_subvolumes_removed: Counter,
    /// Quotas: 1 for the mechanism a pool enforces quotas with (`none` when it cannot).
    pub pool_quota_capability: Family<QuotaCapabilityLabel, Gauge>,
    /// Quotas: bytes each quota volume references, from the filesystem's quota accounting.
    pub volume_used_bytes: Family<VolumeLabel, Gauge>,
    /// Block volumes: 1 while the volume's loop is attached and its device node made, 0 when
    /// exposing it failed (its pod waits); no series once it is released.
    pub block_volume_exposed: Family<BlockVolumeLabel, Gauge>,
    /// Block volumes: 1 when the exposed volume's loop does direct I/O on its file, 0 when the
    /// filesystem refused it and the loop runs buffered (each write cached twice).
    pub block_volume_direct_io: Family<BlockVolumeLabel, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric: ours under the `hostpath_provisioner` prefix, the library's and
    /// the process's under their own names.
    pub fn new() -> Self {
        let mut root = Registry::default();
        let library = LibraryMetrics::register(&mut root);
        root.register_collector(Box::new(ProcessCollector));
        let kubevirt_pool_path_shared_with_os = Gauge::default();
        root.register(
            "kubevirt_hpp_pool_path_shared_with_os",
            "1 when a pool shares its filesystem with the node's OS disk (the kubevirt CSI driver's name)",
            kubevirt_pool_path_shared_with_os.clone(),
        );
        let waiting_claims = Arc::new(WaitingClaims::default());
        root.register_collector(Box::new(waiting_claims.clone()));
        let registry = root.sub_registry_with_prefix("hostpath_provisioner");
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels { version: build_info::VERSION.into(), commit: build_info::COMMIT.into() })
            .set(1);
        registry.register("build_info", "Version and git commit of this binary (always 1)", build_info);
        let ready = Gauge::default();
        registry.register("ready", "1 while /readyz answers 200, else 0", ready.clone());
        let pool_shares_os_disk = Family::<PoolLabel, Gauge>::default();
        registry.register(
            "pool_shares_os_disk",
            "1 when the pool is on the node's OS disk (the kubelet's filesystem), 0 when not; absent when unknown",
            pool_shares_os_disk.clone(),
        );
        let provisions = Family::<Outcome, Counter>::default();
        let deletions = Family::<Outcome, Counter>::default();
        let provision_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        let delete_seconds = Histogram::new(exponential_buckets(0.001, 2.0, 18));
        let refused_paths = Counter::default();
        let duplicate_affinity_labels = Counter::default();
        let affinity_labels_shared = Gauge::default();
        let reaped_volumes = Counter::default();
        let release_claims_setting_ignored = Gauge::default();
        let pool_capacity_bytes = Family::<PoolLabel, Gauge>::default();
        let pool_free_bytes = Family::<PoolLabel, Gauge>::default();
        let watch_restarts = Family::<WatchLabel, Counter>::default();
        let cached_objects = Family::<WatchLabel, Gauge>::default();
        let pool_usable = Family::<PoolLabel, Gauge>::default();
        let background_deletions_pending = Family::<PoolLabel, Gauge>::default();
        let trash_stuck_bytes = Family::<StuckLabel, Gauge>::default();
        let orphaned_snapshot_copies = Family::<PoolLabel, Gauge>::default();
        let orphaned_volume_bytes = Family::<PoolLabel, Gauge>::default();
        let staged_volumes = Family::<PoolLabel, Gauge>::default();
        let stranded_volume_bytes = Family::<PoolLabel, Gauge>::default();
        registry.register(
            "staged_volumes",
            "Volumes this node holds staged for deletion whose fate is not settled yet (settled every minute)",
            staged_volumes.clone(),
        );
        registry.register(
            "stranded_volume_bytes",
            "Bytes of deleted volumes (their PV gone) that the trash cannot take; they wait in the deletion staging",
            stranded_volume_bytes.clone(),
        );
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
            "duplicate_affinity_labels",
            "Looks at a released label-pinned PV kept because other live nodes carry its value",
            duplicate_affinity_labels.clone(),
        );
        registry.register(
            "affinity_labels_shared",
            "This node's nodeAffinityKey labels (key=value) that other live nodes carry too, at the last look (every 5 minutes)",
            affinity_labels_shared.clone(),
        );
        registry.register(
            "reaped_volumes",
            "Released PVs of nodes whose Node object was gone past --reap-volumes-of-removed-nodes, deleted",
            reaped_volumes.clone(),
        );
        registry.register(
            "release_claims_setting_ignored",
            "1 when RELEASE_CLAIMS_OF_REMOVED_NODES is set on this node pod: ignored, node pods never delete claims (the release-claims-of-removed-nodes Deployment does)",
            release_claims_setting_ignored.clone(),
        );
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
            "cached_objects",
            "Objects held in each watch cache; claims: only those this node may act on",
            cached_objects.clone(),
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
        registry.register(
            "orphaned_snapshot_copies",
            "Snapshot copies on this node whose HostPathSnapshot is gone, by pool root: moved to the trash after ORPHAN_SNAPSHOT_COPY_GRACE",
            orphaned_snapshot_copies.clone(),
        );
        let nested_subvolumes_removed = Counter::default();
        registry.register(
            "nested_subvolumes_removed",
            "btrfs subvolumes a workload made inside a volume (outside its quota), removed with the volume",
            nested_subvolumes_removed.clone(),
        );
        // Quotas: capability per pool and usage per quota volume.
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
        // Block volumes: per volume, as the quota volumes' usage.
        let block_volume_exposed = Family::<BlockVolumeLabel, Gauge>::default();
        let block_volume_direct_io = Family::<BlockVolumeLabel, Gauge>::default();
        registry.register(
            "block_volume_exposed",
            "Block volumes of this node: 1 while its loop is attached and its device node made, 0 when exposing it failed (its pod waits; see BlockVolumeNotExposed)",
            block_volume_exposed.clone(),
        );
        registry.register(
            "block_volume_direct_io",
            "Block volumes exposed on this node: 1 when the loop does direct I/O on its backing file, 0 when the filesystem refused it (buffered: the data is cached twice)",
            block_volume_direct_io.clone(),
        );
        Self {
            registry: root,
            block_volume_exposed,
            block_volume_direct_io,
            library,
            ready,
            pool_shares_os_disk,
            kubevirt_pool_path_shared_with_os,
            waiting_claims,
            pool_quota_capability,
            volume_used_bytes,
            provisions,
            deletions,
            provision_seconds,
            delete_seconds,
            refused_paths,
            duplicate_affinity_labels,
            affinity_labels_shared,
            reaped_volumes,
            release_claims_setting_ignored,
            pool_capacity_bytes,
            pool_free_bytes,
            pool_usable,
            watch_restarts,
            cached_objects,
            background_deletions_pending,
            trash_stuck_bytes,
            orphaned_snapshot_copies,
            staged_volumes,
            stranded_volume_bytes,
            nested_subvolumes_removed,
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

    /// Records Block volume `label` as exposed, its loop doing direct I/O or not.
    pub fn block_volume_exposed(&self, label: &BlockVolumeLabel, direct_io: bool) {
        self.block_volume_exposed.get_or_create(label).set(1);
        self.block_volume_direct_io.get_or_create(label).set(i64::from(direct_io));
    }

    /// Records Block volume `label` as not exposed (no loop, no node: its pod waits).
    pub fn block_volume_not_exposed(&self, label: &BlockVolumeLabel) {
        self.block_volume_exposed.get_or_create(label).set(0);
        self.block_volume_direct_io.remove(label);
    }

    /// Drops the series of Block volume `label`, released (its PV deleted, or its making undone).
    pub fn block_volume_released(&self, label: &BlockVolumeLabel) {
        self.block_volume_exposed.remove(label);
        self.block_volume_direct_io.remove(label);
    }

    /// Counts one outcome.
    pub fn outcome(family: &Family<Outcome, Counter>, result: &str, reason: &str) {
        family.get_or_create(&Outcome { result: result.into(), reason: reason.into() }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines of the exposition that start with `prefix`.
    fn lines_starting<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    #[test]
    fn the_sig_storage_library_names_are_served_with_its_labels_and_buckets() {
        let metrics = Metrics::new();
        let claim = ClaimClass { class: "hostpath".into(), source: String::new() };
        let clone = ClaimClass { class: "hostpath".into(), source: "PersistentVolumeClaim".into() };
        metrics.library.provisioned(&claim, 0.02);
        metrics.library.provision_failed(&clone);
        let volume = VolumeClass { class: "hostpath".into() };
        metrics.library.deleted(&volume, 3.0);
        metrics.library.deleted(&volume, 0.001);
        metrics.library.delete_failed(&volume);
        let text = metrics.encode();
        let expected = [
            "# TYPE controller_persistentvolumeclaim_provision counter",
            r#"controller_persistentvolumeclaim_provision_total{class="hostpath",source=""} 1"#,
            r#"controller_persistentvolumeclaim_provision_failed_total{class="hostpath",source="PersistentVolumeClaim"} 1"#,
            "# TYPE controller_persistentvolumeclaim_provision_duration_seconds histogram",
            r#"controller_persistentvolumeclaim_provision_duration_seconds_count{class="hostpath",source=""} 1"#,
            r#"controller_persistentvolume_delete_total{class="hostpath"} 2"#,
            r#"controller_persistentvolume_delete_failed_total{class="hostpath"} 1"#,
            r#"controller_persistentvolume_delete_duration_seconds_count{class="hostpath"} 2"#,
        ];
        for line in expected {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        // client_golang's DefBuckets: 0.005 .. 10, then +Inf.
        let buckets = lines_starting(&text, "controller_persistentvolume_delete_duration_seconds_bucket");
        let bounds: Vec<&str> = buckets.iter().filter_map(|l| l.split("le=\"").nth(1)?.split('"').next()).collect();
        assert_eq!(
            bounds,
            ["0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0", "+Inf"]
        );
        // 0.001 s falls in every bucket, 3 s from 5 s on.
        assert!(buckets[0].ends_with(" 1") && buckets[9].ends_with(" 2"), "{buckets:#?}");
    }

    #[test]
    fn a_block_volume_has_a_series_while_served_and_none_once_released() {
        let metrics = Metrics::new();
        let disk = BlockVolumeLabel { pool: "ssd".into(), pv: "pvc-1".into() };
        let waiting = BlockVolumeLabel { pool: "ssd".into(), pv: "pvc-2".into() };
        metrics.block_volume_exposed(&disk, true);
        metrics.block_volume_not_exposed(&waiting);
        let text = metrics.encode();
        for line in [
            r#"hostpath_provisioner_block_volume_exposed{pool="ssd",pv="pvc-1"} 1"#,
            r#"hostpath_provisioner_block_volume_direct_io{pool="ssd",pv="pvc-1"} 1"#,
            r#"hostpath_provisioner_block_volume_exposed{pool="ssd",pv="pvc-2"} 0"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains(r#"direct_io{pool="ssd",pv="pvc-2"}"#), "a volume not exposed has no loop: {text}");
        // Exposed again, buffered this time; then released.
        metrics.block_volume_exposed(&waiting, false);
        let text = metrics.encode();
        assert!(text.lines().any(|l| l == r#"hostpath_provisioner_block_volume_exposed{pool="ssd",pv="pvc-2"} 1"#));
        assert!(text.lines().any(|l| l == r#"hostpath_provisioner_block_volume_direct_io{pool="ssd",pv="pvc-2"} 0"#));
        metrics.block_volume_released(&disk);
        metrics.block_volume_released(&waiting);
        let text = metrics.encode();
        assert!(!text.contains("pvc-1") && !text.contains("pvc-2"), "no series after release: {text}");
    }

    #[test]
    fn build_info_process_and_readiness_metrics_are_served() {
        let metrics = Metrics::new();
        metrics.ready.set(1);
        let text = metrics.encode();
        let build_info = format!(
            r#"hostpath_provisioner_build_info{{version="{}",commit="{}"}} 1"#,
            build_info::VERSION,
            build_info::COMMIT
        );
        assert!(text.lines().any(|l| l == build_info), "missing {build_info:?} in\n{text}");
        assert!(!build_info::COMMIT.is_empty());
        assert!(text.lines().any(|l| l == "hostpath_provisioner_ready 1"), "{text}");
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
        ] {
            assert_eq!(lines_starting(&text, name).len(), 1, "{name} in\n{text}");
        }
    }
}

//! The doctor's decisions, pure over plain data: which PVs this node should hold a directory for,
//! which directories are orphans, when the trash is stuck, what counts as a problem, and the exit
//! code. The layout rules are the daemon's own ([`crate::deciding::layout`], [`volume_shape`]).

use std::collections::HashSet;
use std::time::Duration;

use crate::deciding::identity::Identity;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout::{self, AcceptedPath, PoolPath};
use crate::deciding::volume::{VolumeShape, volume_shape};
use crate::doctor::report::{ApiCheck, Finding, PoolReport, Severity};
use crate::keys;

/// Exit code: nothing wrong (warnings may have been printed).
pub const EXIT_HEALTHY: i32 = 0;
/// Exit code: at least one problem found.
pub const EXIT_PROBLEMS: i32 = 1;
/// Exit code: the configuration or the command line is invalid (as the daemon's).
pub const EXIT_CONFIG: i32 = 2;
/// Exit code: no problem found, but a check could not run (the API was unreachable).
pub const EXIT_INCOMPLETE: i32 = 3;

/// A trash entry older than this is stuck: the daemon retries its removal every minute, so
/// anything still there after many attempts will not go without an admin.
pub const TRASH_STUCK_AFTER: Duration = Duration::from_secs(15 * 60);

/// Below this share of its size free (after the reserve), a pool is nearly full.
const NEARLY_FULL_PERCENT: u64 = 10;

/// Below this many usable bytes (after the reserve) a pool is full: no useful volume fits, and
/// a filesystem filled to ENOSPC keeps a few blocks it cannot hand out.
pub const FULL_BELOW_BYTES: u64 = 1 << 20;

/// The SELinux type pods may write to.
const CONTAINER_FILE_TYPE: &str = "container_file_t";

/// Where this node should hold the directory of `pv`, if anywhere: PVs of this provisioner, not
/// on their way out, under one of this node's pools, in a layout of the PV's own name, and either
/// pinned to this node (by annotation, or by hostname affinity for PVs older than it), on a shared
/// pool, or every-node (a copy on each node).
pub fn volume_here(pv: &KeptVolume, me: &Identity, my_hostname: &str, pools: &[PoolPath]) -> Option<AcceptedPath> {
    if !pv.annotations.get(keys::PROVISIONED_BY).is_some_and(|p| me.serves(p)) {
        return None;
    }
    if pv.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let spec = pv.spec.as_ref()?;
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    // Released under Delete: the daemon is removing it; the directory may already be in the trash.
    if phase == Some("Released") && spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete") {
        return None;
    }
    let name = pv.metadata.name.as_deref()?;
    let named_by_pattern = pv.annotations.contains_key(keys::PATH_PATTERN);
    let accepted =
        layout::accept_volume_path(crate::deciding::volume::volume_path(pv)?, name, pools, named_by_pattern).ok()?;
    let mine = match volume_shape(pv, pools) {
        VolumeShape::Node => crate::deciding::volume::is_mine(pv, me, my_hostname),
        VolumeShape::Shared => pools.iter().any(|p| p.root == accepted.root && p.shared),
        VolumeShape::EveryNode => pools.iter().any(|p| p.root == accepted.root && !p.shared),
    };
    mine.then_some(accepted)
}

/// `pathPattern` directories (name, the PV their marker names) whose PV is gone: data kept under
/// `Retain` after an admin deleted the PV, until a claim of that name takes it over again.
pub fn orphan_pattern_directories<'a>(marked: &'a [(String, String)], pv_names: &HashSet<String>) -> Vec<&'a str> {
    marked.iter().filter(|(_, pv)| !pv_names.contains(pv)).map(|(name, _)| name.as_str()).collect()
}

/// The entries of a pool root that may be `pathPattern` directories: no name of the `pvc-<uid>`
/// layouts, and not hidden (the provisioner's own bookkeeping is).
pub fn may_be_pattern_directory(entry: &str) -> bool {
    layout::uid_of_dir(entry).is_none() && !entry.starts_with('.')
}

/// Directories of `entries` named in one of our layouts whose UID has neither a PV (`pvc-<uid>`)
/// nor a claim: the daemon's own orphan rule. A claim without its PV is being provisioned right
/// now (or lost its PV by hand, which the daemon reports itself), so it is not counted here.
pub fn orphan_directories<'a>(
    entries: &'a [String],
    pv_names: &HashSet<String>,
    claim_uids: &HashSet<String>,
) -> Vec<&'a str> {
    entries
        .iter()
        .filter_map(|entry| {
            let uid = layout::uid_of_dir(entry)?;
            (!pv_names.contains(&layout::pv_name(uid)) && !claim_uids.contains(uid)).then_some(entry.as_str())
        })
        .collect()
}

/// How long ago a trash entry was made, from its name (`<nanoseconds since epoch>-<sequence>`,
/// as the daemon names them); `None` for a name of another shape.
pub fn trash_entry_age(name: &str, now_since_epoch: Duration) -> Option<Duration> {
    let (nanos, sequence) = name.split_once('-')?;
    if sequence.is_empty() || !sequence.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let made = Duration::from_nanos(nanos.parse::<u64>().ok()?);
    Some(now_since_epoch.saturating_sub(made))
}

/// Everything wrong or worth a look, pool by pool.
pub fn findings(pools: &[PoolReport], api: &ApiCheck, require_mountpoint: bool) -> Vec<Finding> {
    let mut found = Vec::new();
    if let ApiCheck::Failed(why) = api {
        found.push(Finding {
            severity: Severity::Warning,
            pool: None,
            check: "api_unreachable",
            message: format!("cannot list PVs and claims, so orphans and missing directories were not checked: {why}"),
        });
    }
    for pool in pools {
        pool_findings(pool, require_mountpoint, &mut found);
    }
    found.sort_by_key(|f| f.severity);
    found
}

/// The node's settings that are set and ignored: `RELEASE_CLAIMS_OF_REMOVED_NODES` on a node pod
/// (node pods never delete claims; the release-claims-of-removed-nodes Deployment does).
pub fn setting_findings(release_claims_setting_ignored: Option<&str>) -> Vec<Finding> {
    release_claims_setting_ignored
        .map(|value| Finding {
            severity: Severity::Warning,
            pool: None,
            check: "release_claims_setting_ignored",
            message: format!(
                "RELEASE_CLAIMS_OF_REMOVED_NODES={value} is set on the node pod and ignored: node pods never delete claims. Remove it from the DaemonSet and install the release-claims-of-removed-nodes Deployment (docs/operating.md, \"Claims of removed nodes\")"
            ),
        })
        .into_iter()
        .collect()
}

/// This node's affinity labels that other live nodes carry too (`nodeAffinityKey`).
pub fn affinity_findings(
    node: &str,
    shared: &[crate::deciding::node_affinity::duplicate::SharedLabel],
) -> Vec<Finding> {
    shared
        .iter()
        .map(|label| Finding {
            severity: Severity::Warning,
            pool: None,
            check: "affinity_label_shared",
            message: crate::deciding::node_affinity::duplicate::shared_label_note(node, label),
        })
        .collect()
}

fn pool_findings(pool: &PoolReport, require_mountpoint: bool, found: &mut Vec<Finding>) {
    let mut add = |severity, check, message: String| {
        found.push(Finding { severity, pool: Some(pool.name.clone()), check, message });
    };
    if let Some(error) = &pool.error {
        add(Severity::Problem, "pool_unusable", error.clone());
    }
    if let Some(fs) = &pool.filesystem {
        if fs.read_only {
            add(
                Severity::Problem,
                "read_only",
                format!("{} is mounted read-only: nothing can be provisioned", pool.path),
            );
        }
        if !fs.is_mount_point {
            let message = format!(
                "{} is not a mount point: volumes land on the filesystem of {} (mount a dedicated disk there)",
                pool.path,
                fs.mount_point.as_deref().unwrap_or("its parent")
            );
            let severity =
                if require_mountpoint || pool.require_mountpoint { Severity::Problem } else { Severity::Warning };
            add(severity, "not_mount_point", message);
        }
        if fs.shares_os_disk == Some(true) {
            add(
                Severity::Warning,
                "shares_os_disk",
                format!(
                    "{} is on the node's OS disk: a full pool fills it and the kubelet then evicts pods for \
                     DiskPressure",
                    pool.path
                ),
            );
        }
        let usable = fs.available_bytes.saturating_sub(pool.reserve_bytes);
        if usable < FULL_BELOW_BYTES {
            add(
                Severity::Problem,
                "pool_full",
                format!(
                    "{} available, reserve {}: no new volume fits (free space, or move volumes)",
                    size(fs.available_bytes),
                    size(pool.reserve_bytes)
                ),
            );
        } else if usable.saturating_mul(100) < fs.size_bytes.saturating_mul(NEARLY_FULL_PERCENT) {
            add(Severity::Warning, "pool_nearly_full", format!("{} usable of {}", size(usable), size(fs.size_bytes)));
        }
        if fs.inodes_total > 0 && fs.inodes_available == 0 {
            add(Severity::Problem, "inodes_exhausted", "no inode left: no file or directory can be created".into());
        }
        if let Some(selinux) = &fs.selinux
            && selinux.mode == "enforcing"
        {
            let label = selinux.label.as_deref().unwrap_or_default();
            if crate::doctor::capabilities::selinux_type(label) != Some(CONTAINER_FILE_TYPE) {
                add(
                    Severity::Warning,
                    "selinux_label",
                    format!(
                        "root labelled {label:?}, not {CONTAINER_FILE_TYPE}: pods may be denied access to their volumes \
                         (chcon -t {CONTAINER_FILE_TYPE} {})",
                        pool.path
                    ),
                );
            }
        }
    }
    if let Some(volumes) = &pool.volumes {
        for orphan in &volumes.orphan_directories {
            add(
                Severity::Problem,
                "orphan_directory",
                format!(
                    "{}/{} ({}) matches no PV and no claim: re-create its PV to use the data, or remove it",
                    pool.path,
                    orphan.name,
                    size(orphan.bytes)
                ),
            );
        }
        for copy in &volumes.orphan_snapshot_copies {
            add(
                Severity::Warning,
                "orphan_snapshot_copy",
                format!(
                    "{}/.hpp-snapshots/{} ({}) is a snapshot copy whose HostPathSnapshot is gone: the provisioner moves it to the trash after ORPHAN_SNAPSHOT_COPY_GRACE; copy its data out first if it is still wanted",
                    pool.path,
                    copy.name,
                    size(copy.bytes)
                ),
            );
        }
        for missing in &volumes.missing_directories {
            add(
                Severity::Problem,
                "missing_directory",
                format!("PV {} expects {} on this node but it does not exist", missing.pv, missing.path),
            );
        }
    }
    if let Some(trash) = &pool.trash
        && trash.staged > 0
    {
        add(
            Severity::Warning,
            "staged_volumes",
            format!(
                "{} deleted volume{} ({}) wait in {}/{}: their PV's fate is being settled, or the trash cannot take \
                 them (see the node's StrandedVolumeData events); the provisioner looks again every minute",
                trash.staged,
                if trash.staged == 1 { "" } else { "s" },
                size(trash.staged_bytes),
                pool.path,
                crate::filesystem::STAGING_DIR,
            ),
        );
    }
    if let Some(trash) = &pool.trash
        && trash.stuck > 0
    {
        add(
            Severity::Problem,
            "trash_stuck",
            format!(
                "{} deleted volume{} in {}/{} older than {} minutes: their data cannot be removed (see the node's \
                 TrashPurgeFailed events)",
                trash.stuck,
                if trash.stuck == 1 { "" } else { "s" },
                pool.path,
                crate::filesystem::TRASH_DIR,
                TRASH_STUCK_AFTER.as_secs() / 60
            ),
        );
    }
}

fn size(bytes: u64) -> String {
    crate::doctor::report::size(bytes)
}

/// The exit code: problems first, then whether every check could run.
pub fn exit_code(findings: &[Finding], api: &ApiCheck) -> i32 {
    if findings.iter().any(|f| f.severity == Severity::Problem) {
        EXIT_PROBLEMS
    } else if matches!(api, ApiCheck::Failed(_)) {
        EXIT_INCOMPLETE
    } else {
        EXIT_HEALTHY
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::doctor::report::{FilesystemReport, OrphanDirectory, SelinuxReport, TrashReport, VolumesReport};
    use crate::test_fixtures::{self as fixtures, NODE, OTHER_NODE, UID, me};

    const OTHER_UID: &str = "11111111-2222-4333-8444-555555555555";

    fn pools() -> Vec<PoolPath> {
        vec![PoolPath::local("legacy", "/var/hpvolumes"), PoolPath::shared("nfs", "/mnt/nfs")]
    }

    fn pv(path: &str, owner: Option<&str>) -> KeptVolume {
        let pv = fixtures::pv(path, "Bound");
        match owner {
            Some(node) => pv.owner_annotation(node).build(),
            None => pv.build(),
        }
    }

    fn here(pv: &KeptVolume) -> Option<(String, String)> {
        volume_here(pv, &me(), "host-a", &pools()).map(|a| (a.pool, a.dir_name))
    }

    #[test]
    fn a_node_pv_is_here_only_on_its_own_node() {
        let path = format!("/var/hpvolumes/pvc-{UID}");
        assert_eq!(here(&pv(&path, Some(NODE))), Some(("legacy".into(), format!("pvc-{UID}"))));
        assert_eq!(here(&pv(&path, Some(OTHER_NODE))), None);
        let prefixed = format!("/var/hpvolumes/data-pvc-{UID}");
        assert_eq!(here(&pv(&prefixed, Some(NODE))).map(|h| h.1), Some(format!("data-pvc-{UID}")));
    }

    #[test]
    fn an_old_pv_pinned_by_hostname_affinity_is_here_on_that_hostname() {
        let old = fixtures::pv(&format!("/var/hpvolumes/pvc-{UID}"), "Bound").hostname_affinity("host-a").build();
        assert!(here(&old).is_some());
        assert_eq!(volume_here(&old, &me(), "host-b", &pools()), None);
    }

    #[test]
    fn shared_and_every_node_pvs_are_here_on_every_node() {
        let mut shared = pv(&format!("/mnt/nfs/pvc-{UID}"), None);
        shared.labels = crate::test_fixtures::KeptMap::from([(keys::TOPOLOGY_LABEL, "shared")]);
        assert_eq!(here(&shared).map(|h| h.0), Some("nfs".into()));
        let mut every = pv(&format!("/var/hpvolumes/pvc-{UID}"), None);
        every.labels = crate::test_fixtures::KeptMap::from([(keys::TOPOLOGY_LABEL, "everyNode")]);
        assert_eq!(here(&every).map(|h| h.0), Some("legacy".into()));
    }

    #[test]
    fn pvs_on_their_way_out_or_not_ours_or_outside_the_pools_are_not_expected() {
        let path = format!("/var/hpvolumes/pvc-{UID}");
        let mut released = pv(&path, Some(NODE));
        released.status.as_mut().unwrap().phase = Some("Released".into());
        assert_eq!(here(&released), None, "being reclaimed");
        released.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        assert!(here(&released).is_some(), "retained data must still be there");
        let mut deleting = pv(&path, Some(NODE));
        deleting.metadata.deletion_timestamp = Some(Time(Default::default()));
        assert_eq!(here(&deleting), None);
        let mut foreign = pv(&path, Some(NODE));
        foreign.annotations.insert(keys::PROVISIONED_BY, "other.io/x");
        assert_eq!(here(&foreign), None);
        assert_eq!(here(&pv(&format!("/srv/pvc-{UID}"), Some(NODE))), None);
        assert_eq!(here(&pv(&format!("/var/hpvolumes/pvc-{OTHER_UID}"), Some(NODE))), None, "another PV's layout");
    }

    #[test]
    fn a_pattern_directory_is_an_orphan_once_the_pv_its_marker_names_is_gone() {
        let marked = vec![("ns_db".to_owned(), "pvc-1".to_owned()), ("ns_web".to_owned(), "pvc-2".to_owned())];
        let pvs = HashSet::from(["pvc-2".to_owned()]);
        assert_eq!(orphan_pattern_directories(&marked, &pvs), vec!["ns_db"]);
        assert!(may_be_pattern_directory("ns_db") && may_be_pattern_directory("lost+found"));
        assert!(!may_be_pattern_directory(".hpp-trash") && !may_be_pattern_directory(&format!("pvc-{UID}")));
    }

    #[test]
    fn orphans_are_layout_directories_without_pv_or_claim() {
        let entries: Vec<String> = vec![
            format!("pvc-{UID}"),
            format!("data-pvc-{OTHER_UID}"),
            "lost+found".into(),
            ".hpp-trash".into(),
            "notes".into(),
        ];
        let none = HashSet::new();
        assert_eq!(
            orphan_directories(&entries, &none, &none),
            vec![format!("pvc-{UID}"), format!("data-pvc-{OTHER_UID}")]
        );
        let pvs = HashSet::from([format!("pvc-{UID}")]);
        assert_eq!(orphan_directories(&entries, &pvs, &none), vec![format!("data-pvc-{OTHER_UID}")]);
        let claims = HashSet::from([OTHER_UID.to_owned()]);
        assert!(orphan_directories(&entries, &pvs, &claims).is_empty(), "a claim being provisioned");
    }

    #[test]
    fn trash_age_comes_from_the_entry_name() {
        let now = Duration::from_secs(2_000_000_000);
        let made = now - Duration::from_secs(3600);
        assert_eq!(trash_entry_age(&format!("{}-7", made.as_nanos()), now), Some(Duration::from_secs(3600)));
        assert_eq!(trash_entry_age(&format!("{}-0", now.as_nanos() + 5), now), Some(Duration::ZERO));
        for bad in ["pvc-x", "123", "abc-1", "123-", "123-x"] {
            assert_eq!(trash_entry_age(bad, now), None, "{bad}");
        }
    }

    fn healthy_pool() -> PoolReport {
        PoolReport {
            name: "legacy".into(),
            path: "/var/hpvolumes".into(),
            filesystem: Some(FilesystemReport {
                fs_type: "xfs".into(),
                is_mount_point: true,
                shares_os_disk: Some(false),
                size_bytes: 100 << 30,
                available_bytes: 50 << 30,
                inodes_total: 1000,
                inodes_available: 900,
                ..Default::default()
            }),
            trash: Some(TrashReport::default()),
            volumes: Some(VolumesReport::default()),
            ..Default::default()
        }
    }

    fn checks(pool: PoolReport, require_mountpoint: bool) -> Vec<(Severity, &'static str)> {
        findings(&[pool], &ApiCheck::Checked, require_mountpoint).iter().map(|f| (f.severity, f.check)).collect()
    }

    #[test]
    fn a_healthy_pool_has_no_findings_and_exits_0() {
        let found = findings(&[healthy_pool()], &ApiCheck::Checked, true);
        assert!(found.is_empty(), "{found:?}");
        assert_eq!(exit_code(&found, &ApiCheck::Checked), EXIT_HEALTHY);
    }

    #[test]
    fn each_fault_is_its_own_finding() {
        let mut pool = healthy_pool();
        let fs = pool.filesystem.as_mut().unwrap();
        fs.available_bytes = 3 << 20;
        pool.reserve_bytes = (2 << 20) + 1;
        assert_eq!(checks(pool.clone(), false), vec![(Severity::Problem, "pool_full")], "under 1 MiB usable");
        pool.reserve_bytes = 2 << 20;
        assert_eq!(checks(pool.clone(), false), vec![(Severity::Warning, "pool_nearly_full")], "1 MiB usable");
        pool.reserve_bytes = 0;
        assert_eq!(checks(pool.clone(), false), vec![(Severity::Warning, "pool_nearly_full")]);
        pool.filesystem.as_mut().unwrap().available_bytes = 0;
        assert_eq!(checks(pool.clone(), false), vec![(Severity::Problem, "pool_full")]);
        let mut pool = healthy_pool();
        pool.filesystem.as_mut().unwrap().inodes_available = 0;
        assert_eq!(checks(pool, false), vec![(Severity::Problem, "inodes_exhausted")]);
        let mut pool = healthy_pool();
        pool.filesystem.as_mut().unwrap().is_mount_point = false;
        assert_eq!(checks(pool.clone(), false), vec![(Severity::Warning, "not_mount_point")]);
        assert_eq!(checks(pool.clone(), true), vec![(Severity::Problem, "not_mount_point")], "REQUIRE_MOUNTPOINT");
        pool.require_mountpoint = true;
        assert_eq!(checks(pool, false), vec![(Severity::Problem, "not_mount_point")], "the pool's mountpoint option");
        let mut pool = healthy_pool();
        pool.filesystem.as_mut().unwrap().shares_os_disk = Some(true);
        assert_eq!(checks(pool, false), vec![(Severity::Warning, "shares_os_disk")]);
        let mut pool = healthy_pool();
        pool.filesystem.as_mut().unwrap().read_only = true;
        assert_eq!(checks(pool, false), vec![(Severity::Problem, "read_only")]);
        let mut pool = healthy_pool();
        pool.trash = Some(TrashReport { entries: 3, bytes: 10, stuck: 1, ..Default::default() });
        assert_eq!(checks(pool, false), vec![(Severity::Problem, "trash_stuck")]);
        let mut pool = healthy_pool();
        pool.trash = Some(TrashReport { entries: 3, bytes: 10, stuck: 0, ..Default::default() });
        assert!(checks(pool.clone(), false).is_empty(), "a trash being emptied is normal");
        pool.trash = Some(TrashReport { staged: 1, staged_bytes: 4096, ..Default::default() });
        assert_eq!(checks(pool, false), vec![(Severity::Warning, "staged_volumes")]);
        let mut pool = healthy_pool();
        pool.volumes.as_mut().unwrap().orphan_directories.push(OrphanDirectory { name: "pvc-x".into(), bytes: 1 });
        assert_eq!(checks(pool, false), vec![(Severity::Problem, "orphan_directory")]);
        let mut pool = healthy_pool();
        let copy = OrphanDirectory { name: "3f0e1c2a-0000-4000-8000-00000000c0de".into(), bytes: 1 };
        pool.volumes.as_mut().unwrap().orphan_snapshot_copies.push(copy);
        assert_eq!(checks(pool, false), vec![(Severity::Warning, "orphan_snapshot_copy")]);
        let pool = PoolReport { error: Some("missing".into()), ..PoolReport::default() };
        assert_eq!(checks(pool, false), vec![(Severity::Problem, "pool_unusable")]);
    }

    #[test]
    fn selinux_warns_only_when_enforcing_with_another_type() {
        let with = |mode: &str, label: Option<&str>| {
            let mut pool = healthy_pool();
            pool.filesystem.as_mut().unwrap().selinux =
                Some(SelinuxReport { mode: mode.into(), label: label.map(str::to_owned) });
            checks(pool, false)
        };
        assert!(with("enforcing", Some("system_u:object_r:container_file_t:s0")).is_empty());
        assert!(with("permissive", Some("system_u:object_r:var_t:s0")).is_empty());
        assert_eq!(with("enforcing", Some("system_u:object_r:var_t:s0")), vec![(Severity::Warning, "selinux_label")]);
        assert_eq!(with("enforcing", None), vec![(Severity::Warning, "selinux_label")]);
    }

    #[test]
    fn exit_codes_tell_problems_from_an_incomplete_run() {
        let failed = ApiCheck::Failed("connection refused".into());
        let found = findings(&[healthy_pool()], &failed, false);
        assert_eq!(found.iter().map(|f| f.check).collect::<Vec<_>>(), vec!["api_unreachable"]);
        assert_eq!(exit_code(&found, &failed), EXIT_INCOMPLETE);
        let mut broken = healthy_pool();
        broken.filesystem.as_mut().unwrap().read_only = true;
        let found = findings(&[broken], &failed, false);
        assert_eq!(exit_code(&found, &failed), EXIT_PROBLEMS, "problems come first");
        assert_eq!(found[0].severity, Severity::Problem, "problems are listed first");
    }
}

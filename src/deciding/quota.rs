//! Quota decisions: what a StorageClass asks for (`quota: none|enforce`), what a pool's filesystem
//! and kernel can enforce, and whether a claim is accepted on that pool.
//!
//! Pure functions over the facts `filesystem::quota` gathers; nothing here touches the disk.

use std::fmt;

/// StorageClass parameter naming the quota mode.
pub const PARAMETER: &str = "quota";

/// What a StorageClass asks for its volumes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QuotaMode {
    /// Plain directories, as the Go provisioner makes them: the request is not enforced.
    #[default]
    None,
    /// Each volume is limited to its request by the filesystem; a pool that cannot enforce
    /// refuses the claim.
    Enforce,
}

impl QuotaMode {
    /// Parses the `quota` parameter; absent means [`QuotaMode::None`]. `Err` carries the refused value.
    pub fn parse(value: Option<&str>) -> Result<QuotaMode, String> {
        match value {
            None | Some("none") | Some("") => Ok(QuotaMode::None),
            Some("enforce") => Ok(QuotaMode::Enforce),
            Some(other) => Err(other.to_owned()),
        }
    }
}

/// The filesystem type of a pool, from `statfs(2)`'s `f_type`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FsKind {
    /// btrfs.
    Btrfs,
    /// XFS.
    Xfs,
    /// ext2/3/4 (one magic number).
    Ext4,
    /// Anything else, named by its magic number in hex.
    Other(String),
}

impl fmt::Display for FsKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FsKind::Btrfs => f.write_str("btrfs"),
            FsKind::Xfs => f.write_str("xfs"),
            FsKind::Ext4 => f.write_str("ext4"),
            FsKind::Other(magic) => write!(f, "filesystem type {magic}"),
        }
    }
}

/// What the filesystem edge found out about a pool, enough to decide its quota capability.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaFacts {
    /// The pool's filesystem.
    pub fs: FsKind,
    /// btrfs only: quota (qgroups) is enabled on the filesystem.
    pub btrfs_quota_enabled: bool,
    /// XFS and ext4: the mount options carry `prjquota` (or `pquota`).
    pub project_quota_mounted: bool,
    /// XFS: the kernel was built with XFS quota support (`/proc/fs/xfs/xqmstat` exists).
    pub kernel_xfs_quota: bool,
    /// XFS and ext4: what the kernel's quotactl says about project quota on the pool's
    /// filesystem; [`ProjectQuotaState::NotAsked`] elsewhere.
    pub project_quota: ProjectQuotaState,
    /// This process holds `CAP_SYS_ADMIN` (effective set), which setting quota limits needs
    /// (btrfs qgroups, XFS and ext4 project quota).
    pub cap_sys_admin: bool,
}

/// Project quota on an XFS or ext4 filesystem as `quotactl_fd(2)` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ProjectQuotaState {
    /// Not a filesystem with project quota, or not probed.
    #[default]
    NotAsked,
    /// Project quota is accounted and its limits enforced: volumes can be limited.
    Enforced,
    /// Accounted but not enforced (XFS mounted with `pqnoenforce`).
    AccountingOnly,
    /// Project quota is off on this filesystem.
    Off,
    /// The kernel has no `quotactl_fd(2)` (before Linux 5.14).
    NoQuotactlFd,
    /// The kernel gives this filesystem no quota operations (built without quota support for it).
    NoKernelSupport,
    /// The kernel refused the question; the text names the error.
    Unanswered(String),
}

/// First project id this provisioner gives a volume; ids below are left to the admin's
/// `/etc/projid` and other tools. Volumes get the lowest id at or above it that no directory of
/// the pool (volumes and trash) carries.
pub const PROJECT_ID_BASE: u32 = 1 << 20;

/// The lowest project id at or above [`PROJECT_ID_BASE`] not in `used`; `None` when all are taken.
pub fn free_project_id(used: &std::collections::BTreeSet<u32>) -> Option<u32> {
    let mut candidate = PROJECT_ID_BASE;
    for id in used.range(PROJECT_ID_BASE..) {
        if *id != candidate {
            break;
        }
        candidate = candidate.checked_add(1)?;
    }
    // u32::MAX is the "no id" sentinel of some tools: never given out.
    (candidate != u32::MAX).then_some(candidate)
}

/// Whether a directory's project id is one this provisioner gave out.
pub fn is_volume_project_id(id: u32) -> bool {
    (PROJECT_ID_BASE..u32::MAX).contains(&id)
}

/// A byte limit in XFS "basic blocks" (512 bytes, `fs_disk_quota.d_blk_hardlimit`), rounded up
/// so the volume gets at least its request.
pub fn xfs_basic_blocks(bytes: u64) -> u64 {
    bytes.div_ceil(512)
}

/// A byte limit in the 1 KiB quota blocks of `if_dqblk.dqb_bhardlimit` (`QIF_DQBLKSIZE`),
/// rounded up.
pub fn quota_kib_blocks(bytes: u64) -> u64 {
    bytes.div_ceil(1024)
}

/// Bit of `CAP_SYS_ADMIN` in a capability set (`linux/capability.h`).
const CAP_SYS_ADMIN_BIT: u32 = 21;

/// Whether the `CapEff:` line of a `/proc/<pid>/status` text holds `CAP_SYS_ADMIN`; false when
/// the line is missing or unreadable.
pub fn status_holds_cap_sys_admin(status: &str) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|set| set & (1 << CAP_SYS_ADMIN_BIT) != 0)
}

/// What a pool that could enforce quota lacks when the provisioner runs without `CAP_SYS_ADMIN`.
pub const MISSING_CAP_SYS_ADMIN: &str = "the provisioner lacks CAP_SYS_ADMIN, which setting quota limits needs (btrfs qgroups, XFS and ext4 project quota); \
     add SYS_ADMIN to its container's capabilities (chart value `quota.enabled: true`, or the commented line in \
     deploy/legacy/daemonset.yaml)";

/// How a pool enforces quotas, or exactly what it lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuotaCapability {
    /// Each volume a btrfs subvolume with a qgroup limit on its referenced bytes.
    BtrfsQgroup,
    /// Each volume a directory with a project id of its own (inherited by everything made in
    /// it) and a project quota limit on its blocks (XFS, ext4).
    Project,
    /// Cannot enforce; the text says what is missing and how to get it.
    Unable(String),
}

impl QuotaCapability {
    /// Every label [`QuotaCapability::label`] gives, for metrics that export one series each.
    pub const LABELS: [&'static str; 3] = ["btrfs-qgroup", "project", "none"];

    /// Short label for metrics, logs and `/readyz`: `btrfs-qgroup`, `project` or `none`.
    pub fn label(&self) -> &'static str {
        match self {
            QuotaCapability::BtrfsQgroup => "btrfs-qgroup",
            QuotaCapability::Project => "project",
            QuotaCapability::Unable(_) => "none",
        }
    }
}

/// The quota capability of a pool with these facts: able, or exactly the missing piece.
pub fn capability(facts: &QuotaFacts) -> QuotaCapability {
    let missing = match &facts.fs {
        FsKind::Btrfs if facts.btrfs_quota_enabled && facts.cap_sys_admin => return QuotaCapability::BtrfsQgroup,
        FsKind::Btrfs if facts.btrfs_quota_enabled => MISSING_CAP_SYS_ADMIN.to_owned(),
        FsKind::Btrfs => {
            "btrfs quota is not enabled on it (an admin enables it once with `btrfs quota enable <pool root>`)"
                .to_owned()
        }
        FsKind::Xfs | FsKind::Ext4 if facts.project_quota == ProjectQuotaState::Enforced && facts.cap_sys_admin => {
            return QuotaCapability::Project;
        }
        FsKind::Xfs | FsKind::Ext4 if facts.project_quota == ProjectQuotaState::Enforced => {
            MISSING_CAP_SYS_ADMIN.to_owned()
        }
        FsKind::Xfs if !facts.kernel_xfs_quota => {
            "the kernel has no XFS quota support (CONFIG_XFS_QUOTA); use a kernel with it, or put the pool on btrfs \
             with quota enabled"
                .to_owned()
        }
        FsKind::Xfs | FsKind::Ext4 if facts.project_quota == ProjectQuotaState::NoQuotactlFd => {
            "the kernel has no quotactl_fd(2) (Linux 5.14 or later, with CONFIG_QUOTA, is needed for project quota)"
                .to_owned()
        }
        FsKind::Ext4 if facts.project_quota == ProjectQuotaState::NoKernelSupport => {
            "the kernel has no quota support for ext4 (CONFIG_QUOTA and CONFIG_QFMT_V2); use a kernel with them, or \
             put the pool on btrfs with quota enabled"
                .to_owned()
        }
        FsKind::Xfs if facts.project_quota == ProjectQuotaState::NoKernelSupport => {
            "the kernel has no XFS quota support (CONFIG_XFS_QUOTA); use a kernel with it, or put the pool on btrfs \
             with quota enabled"
                .to_owned()
        }
        FsKind::Xfs if !facts.project_quota_mounted => {
            "it is mounted without prjquota (mount it with the prjquota or pquota option)".to_owned()
        }
        FsKind::Ext4 if !facts.project_quota_mounted => "it is mounted without prjquota (the filesystem needs the \
             `project` and `quota` features, `tune2fs -O project,quota <device>` while unmounted, and the prjquota \
             mount option)"
            .to_owned(),
        FsKind::Xfs | FsKind::Ext4 => match &facts.project_quota {
            ProjectQuotaState::AccountingOnly => {
                "project quota is accounted but not enforced (mounted with pqnoenforce; mount with prjquota)".to_owned()
            }
            ProjectQuotaState::Unanswered(error) if facts.fs == FsKind::Ext4 => format!(
                "it is mounted with prjquota but the kernel cannot report project quota ({error}); ext4 quota needs \
                 the kernel's quota format support (CONFIG_QFMT_V2) and the filesystem's `project` feature"
            ),
            ProjectQuotaState::Unanswered(error) => {
                format!("it is mounted with prjquota but the kernel cannot report project quota ({error})")
            }
            _ => "it is mounted with prjquota but the kernel reports project quota off".to_owned(),
        },
        FsKind::Other(_) => {
            "only btrfs with quota enabled, or XFS and ext4 with project quota, can enforce volume sizes".to_owned()
        }
    };
    QuotaCapability::Unable(missing)
}

/// Why a claim asking for `quota: enforce` cannot be served by a pool.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pool {pool} ({fs} at {root}) cannot enforce quota: {missing}")]
pub struct QuotaRefusal {
    /// Pool name.
    pub pool: String,
    /// Its filesystem.
    pub fs: String,
    /// Its root path.
    pub root: String,
    /// What it lacks.
    pub missing: String,
}

/// How a volume of this class is made on this pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VolumeQuota {
    /// A plain directory.
    Unlimited,
    /// A btrfs subvolume whose qgroup limits referenced bytes to `limit_bytes`.
    BtrfsQgroup {
        /// The limit: the claim's request.
        limit_bytes: u64,
    },
    /// A directory with a project id of its own whose project quota limits its blocks.
    Project {
        /// The limit: the claim's request.
        limit_bytes: u64,
    },
}

impl VolumeQuota {
    /// The limit in bytes, for a volume that has one.
    pub fn limit_bytes(&self) -> Option<u64> {
        match self {
            VolumeQuota::Unlimited => None,
            VolumeQuota::BtrfsQgroup { limit_bytes } | VolumeQuota::Project { limit_bytes } => Some(*limit_bytes),
        }
    }
}

/// Accepts or refuses a volume of `mode` and `request_bytes` on a pool described by `facts`.
pub fn decide(
    mode: QuotaMode,
    request_bytes: u64,
    pool: &str,
    root: &str,
    facts: &QuotaFacts,
) -> Result<VolumeQuota, QuotaRefusal> {
    if mode == QuotaMode::None {
        return Ok(VolumeQuota::Unlimited);
    }
    match capability(facts) {
        QuotaCapability::BtrfsQgroup => Ok(VolumeQuota::BtrfsQgroup { limit_bytes: request_bytes }),
        QuotaCapability::Project => Ok(VolumeQuota::Project { limit_bytes: request_bytes }),
        QuotaCapability::Unable(missing) => {
            Err(QuotaRefusal { pool: pool.to_owned(), fs: facts.fs.to_string(), root: root.to_owned(), missing })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(fs: FsKind) -> QuotaFacts {
        QuotaFacts {
            fs,
            btrfs_quota_enabled: false,
            project_quota_mounted: false,
            kernel_xfs_quota: false,
            project_quota: ProjectQuotaState::NotAsked,
            cap_sys_admin: true,
        }
    }

    #[test]
    fn quota_parameter_defaults_to_none_and_refuses_unknown_values() {
        assert_eq!(QuotaMode::parse(None), Ok(QuotaMode::None));
        assert_eq!(QuotaMode::parse(Some("none")), Ok(QuotaMode::None));
        assert_eq!(QuotaMode::parse(Some("enforce")), Ok(QuotaMode::Enforce));
        assert_eq!(QuotaMode::parse(Some("Enforce")), Err("Enforce".to_owned()));
    }

    #[test]
    fn unenforced_class_is_a_plain_directory_on_any_filesystem() {
        let f = facts(FsKind::Other("0x1234".into()));
        assert_eq!(decide(QuotaMode::None, 10, "p", "/p", &f), Ok(VolumeQuota::Unlimited));
    }

    #[test]
    fn btrfs_with_quota_enabled_limits_the_volume_to_its_request() {
        let f = QuotaFacts { btrfs_quota_enabled: true, ..facts(FsKind::Btrfs) };
        assert_eq!(capability(&f), QuotaCapability::BtrfsQgroup);
        assert_eq!(
            decide(QuotaMode::Enforce, 10 << 20, "p", "/p", &f),
            Ok(VolumeQuota::BtrfsQgroup { limit_bytes: 10 << 20 })
        );
    }

    #[test]
    fn btrfs_without_quota_is_refused_with_the_command_that_enables_it() {
        let refusal = decide(QuotaMode::Enforce, 1, "fast", "/mnt/fast", &facts(FsKind::Btrfs)).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "pool fast (btrfs at /mnt/fast) cannot enforce quota: btrfs quota is not enabled on it \
             (an admin enables it once with `btrfs quota enable <pool root>`)"
        );
    }

    #[test]
    fn xfs_without_kernel_quota_support_names_the_missing_kernel_option() {
        let refusal = decide(QuotaMode::Enforce, 1, "ssd", "/mnt/ssd", &facts(FsKind::Xfs)).unwrap_err();
        assert!(
            refusal.to_string().starts_with(
                "pool ssd (xfs at /mnt/ssd) cannot enforce quota: the kernel has no XFS quota support (CONFIG_XFS_QUOTA)"
            ),
            "{refusal}"
        );
    }

    #[test]
    fn ext4_and_xfs_mounted_without_prjquota_say_so() {
        let xfs = QuotaFacts { kernel_xfs_quota: true, ..facts(FsKind::Xfs) };
        for f in [facts(FsKind::Ext4), xfs] {
            let refusal = decide(QuotaMode::Enforce, 1, "p", "/p", &f).unwrap_err();
            assert!(refusal.missing.starts_with("it is mounted without prjquota"), "{refusal}");
        }
    }

    #[test]
    fn xfs_and_ext4_with_enforced_project_quota_limit_the_volume() {
        for fs in [FsKind::Xfs, FsKind::Ext4] {
            let f = QuotaFacts {
                kernel_xfs_quota: true,
                project_quota_mounted: true,
                project_quota: ProjectQuotaState::Enforced,
                ..facts(fs)
            };
            assert_eq!(capability(&f), QuotaCapability::Project);
            assert_eq!(capability(&f).label(), "project");
            assert_eq!(decide(QuotaMode::Enforce, 7, "p", "/p", &f), Ok(VolumeQuota::Project { limit_bytes: 7 }));
        }
    }

    #[test]
    fn project_quota_without_cap_sys_admin_is_refused_naming_the_capability() {
        for fs in [FsKind::Xfs, FsKind::Ext4] {
            let f = QuotaFacts {
                kernel_xfs_quota: true,
                project_quota_mounted: true,
                project_quota: ProjectQuotaState::Enforced,
                cap_sys_admin: false,
                ..facts(fs)
            };
            assert_eq!(capability(&f), QuotaCapability::Unable(MISSING_CAP_SYS_ADMIN.to_owned()));
        }
    }

    #[test]
    fn ext4_without_prjquota_names_the_features_and_the_mount_option() {
        let f = QuotaFacts { project_quota: ProjectQuotaState::Off, ..facts(FsKind::Ext4) };
        let refusal = decide(QuotaMode::Enforce, 1, "p", "/p", &f).unwrap_err();
        assert!(refusal.missing.contains("`tune2fs -O project,quota <device>`"), "{refusal}");
        assert!(refusal.missing.contains("prjquota mount option"), "{refusal}");
    }

    #[test]
    fn a_kernel_without_quota_support_for_the_filesystem_is_named_before_the_mount() {
        let f = QuotaFacts { project_quota: ProjectQuotaState::NoKernelSupport, ..facts(FsKind::Ext4) };
        assert!(
            matches!(capability(&f), QuotaCapability::Unable(m) if m.starts_with("the kernel has no quota support for ext4 (CONFIG_QUOTA and CONFIG_QFMT_V2)")),
            "{:?}",
            capability(&f)
        );
        let xfs = QuotaFacts { kernel_xfs_quota: true, ..f };
        let xfs = QuotaFacts { fs: FsKind::Xfs, ..xfs };
        assert!(matches!(capability(&xfs), QuotaCapability::Unable(m) if m.contains("CONFIG_XFS_QUOTA")));
    }

    #[test]
    fn a_kernel_without_quotactl_fd_is_named() {
        let f = QuotaFacts {
            project_quota_mounted: true,
            project_quota: ProjectQuotaState::NoQuotactlFd,
            ..facts(FsKind::Ext4)
        };
        assert_eq!(
            capability(&f),
            QuotaCapability::Unable(
                "the kernel has no quotactl_fd(2) (Linux 5.14 or later, with CONFIG_QUOTA, is needed for project quota)".into()
            )
        );
    }

    #[test]
    fn prjquota_mounts_the_kernel_does_not_enforce_say_what_is_missing() {
        let xfs = QuotaFacts {
            kernel_xfs_quota: true,
            project_quota_mounted: true,
            project_quota: ProjectQuotaState::AccountingOnly,
            ..facts(FsKind::Xfs)
        };
        assert!(matches!(capability(&xfs), QuotaCapability::Unable(m) if m.contains("pqnoenforce")));
        let ext4 = QuotaFacts {
            project_quota_mounted: true,
            project_quota: ProjectQuotaState::Unanswered("ESRCH".into()),
            ..facts(FsKind::Ext4)
        };
        assert!(
            matches!(capability(&ext4), QuotaCapability::Unable(m) if m.contains("(ESRCH)") && m.contains("CONFIG_QFMT_V2"))
        );
        let off = QuotaFacts { project_quota: ProjectQuotaState::Off, ..ext4 };
        assert!(matches!(capability(&off), QuotaCapability::Unable(m) if m.ends_with("reports project quota off")));
    }

    #[test]
    fn project_ids_are_the_lowest_free_one_from_the_base() {
        use std::collections::BTreeSet;
        assert_eq!(free_project_id(&BTreeSet::new()), Some(PROJECT_ID_BASE));
        // Ids below the base (the admin's) do not count; a hole is filled first.
        let used = BTreeSet::from([1, 42, PROJECT_ID_BASE, PROJECT_ID_BASE + 1, PROJECT_ID_BASE + 3]);
        assert_eq!(free_project_id(&used), Some(PROJECT_ID_BASE + 2));
        let dense: BTreeSet<u32> = (PROJECT_ID_BASE..PROJECT_ID_BASE + 100).collect();
        assert_eq!(free_project_id(&dense), Some(PROJECT_ID_BASE + 100));
        assert!(is_volume_project_id(PROJECT_ID_BASE) && !is_volume_project_id(0) && !is_volume_project_id(u32::MAX));
    }

    #[test]
    fn limits_round_up_to_whole_quota_blocks() {
        assert_eq!(xfs_basic_blocks(10 << 20), 20480);
        assert_eq!(xfs_basic_blocks(513), 2);
        assert_eq!(quota_kib_blocks(10 << 20), 10240);
        assert_eq!(quota_kib_blocks(1), 1);
        assert_eq!(quota_kib_blocks(0), 0);
    }

    #[test]
    fn other_filesystems_cannot_enforce() {
        let f = facts(FsKind::Other("0x01021994".into()));
        assert_eq!(capability(&f).label(), "none");
        let refusal = decide(QuotaMode::Enforce, 1, "t", "/t", &f).unwrap_err();
        assert_eq!(refusal.fs, "filesystem type 0x01021994");
    }
}

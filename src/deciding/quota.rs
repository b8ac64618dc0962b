//! Quota decisions: what a StorageClass asks for (`quota: none|enforce`), what a pool's filesystem
//! and kernel can enforce, and whether a claim is accepted on that pool.
//!
//! Pure functions over the facts `filesystem::quota` gathers; nothing here touches the disk.

use std::fmt;

use crate::config::PvCapacity;

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
    /// This process holds `CAP_SYS_ADMIN` (effective set), which setting and destroying btrfs
    /// qgroups needs.
    pub cap_sys_admin: bool,
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

/// What a btrfs pool with quota enabled lacks when the provisioner runs without `CAP_SYS_ADMIN`.
pub const MISSING_CAP_SYS_ADMIN: &str = "the provisioner lacks CAP_SYS_ADMIN, which btrfs needs to set qgroup limits; \
     add SYS_ADMIN to its container's capabilities (chart value `quota.enabled: true`, or the commented line in \
     deploy/legacy/daemonset.yaml)";

/// How a pool enforces quotas, or exactly what it lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QuotaCapability {
    /// Each volume a btrfs subvolume with a qgroup limit on its referenced bytes.
    BtrfsQgroup,
    /// Cannot enforce; the text says what is missing and how to get it.
    Unable(String),
}

impl QuotaCapability {
    /// Short label for metrics, logs and `/readyz`: `btrfs-qgroup` or `none`.
    pub fn label(&self) -> &'static str {
        match self {
            QuotaCapability::BtrfsQgroup => "btrfs-qgroup",
            QuotaCapability::Unable(_) => "none",
        }
    }
}

/// The quota capability of a pool with these facts.
///
/// XFS and ext4 project quota is recognised but not implemented yet: the message says so
/// rather than pretending the mount is at fault.
pub fn capability(facts: &QuotaFacts) -> QuotaCapability {
    let missing = match &facts.fs {
        FsKind::Btrfs if facts.btrfs_quota_enabled && facts.cap_sys_admin => return QuotaCapability::BtrfsQgroup,
        FsKind::Btrfs if facts.btrfs_quota_enabled => MISSING_CAP_SYS_ADMIN.to_owned(),
        FsKind::Btrfs => {
            "btrfs quota is not enabled on it (an admin enables it once with `btrfs quota enable <pool root>`)"
                .to_owned()
        }
        FsKind::Xfs if !facts.kernel_xfs_quota => {
            "the kernel has no XFS quota support (CONFIG_XFS_QUOTA); put the pool on btrfs with quota enabled"
                .to_owned()
        }
        FsKind::Xfs | FsKind::Ext4 if !facts.project_quota_mounted => String::from(
            "it is mounted without prjquota, and this provisioner enforces quotas on btrfs only so far; \
             put the pool on btrfs with quota enabled",
        ),
        FsKind::Xfs | FsKind::Ext4 => format!(
            "project quota on {} is not supported by this provisioner yet; put the pool on btrfs with quota enabled",
            facts.fs
        ),
        FsKind::Other(_) => "only btrfs with quota enabled can enforce volume sizes".to_owned(),
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
        QuotaCapability::Unable(missing) => {
            Err(QuotaRefusal { pool: pool.to_owned(), fs: facts.fs.to_string(), root: root.to_owned(), missing })
        }
    }
}

/// Whether a new volume's PV reports the whole filesystem's size as its capacity: only a plain
/// volume under `PV_CAPACITY=filesystem`. A quota volume's size is its limit, the request: were
/// the PV (and so the claim's status) to say the disk size, every expansion below it would be
/// judged already done and silently do nothing.
pub fn pv_reports_filesystem_size(setting: PvCapacity, volume: VolumeQuota) -> bool {
    setting == PvCapacity::Filesystem && volume == VolumeQuota::Unlimited
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
            cap_sys_admin: true,
        }
    }

    #[test]
    fn btrfs_quota_without_cap_sys_admin_is_refused_naming_the_capability_and_the_chart_value() {
        let f = QuotaFacts { btrfs_quota_enabled: true, cap_sys_admin: false, ..facts(FsKind::Btrfs) };
        assert_eq!(capability(&f).label(), "none");
        let refusal = decide(QuotaMode::Enforce, 1, "fast", "/mnt/fast", &f).unwrap_err();
        assert!(refusal.missing.starts_with("the provisioner lacks CAP_SYS_ADMIN"), "{refusal}");
        assert!(refusal.missing.contains("quota.enabled: true"), "{refusal}");
        // A plain class does not need the capability.
        assert_eq!(decide(QuotaMode::None, 1, "fast", "/mnt/fast", &f), Ok(VolumeQuota::Unlimited));
    }

    #[test]
    fn cap_sys_admin_is_read_from_the_effective_set_of_proc_status() {
        let status =
            |eff: &str| format!("Name:\thpp\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t{eff}\n");
        assert!(status_holds_cap_sys_admin(&status("000001ffffffffff")));
        assert!(status_holds_cap_sys_admin(&status("0000000000200000")));
        // DAC_OVERRIDE, FOWNER, CHOWN, FSETID: the default DaemonSet's set.
        assert!(!status_holds_cap_sys_admin(&status("000000000000001b")));
        assert!(!status_holds_cap_sys_admin("Name:\thpp\n"));
    }

    #[test]
    fn a_quota_volume_reports_its_limit_not_the_disk_even_with_pv_capacity_filesystem() {
        let quota = VolumeQuota::BtrfsQgroup { limit_bytes: 10 << 20 };
        assert!(!pv_reports_filesystem_size(PvCapacity::Filesystem, quota));
        assert!(pv_reports_filesystem_size(PvCapacity::Filesystem, VolumeQuota::Unlimited));
        assert!(!pv_reports_filesystem_size(PvCapacity::Request, VolumeQuota::Unlimited));
        assert!(!pv_reports_filesystem_size(PvCapacity::Request, quota));
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
    fn project_quota_mounts_are_refused_as_not_supported_yet() {
        let f = QuotaFacts { project_quota_mounted: true, ..facts(FsKind::Ext4) };
        let refusal = decide(QuotaMode::Enforce, 1, "p", "/p", &f).unwrap_err();
        assert!(refusal.missing.starts_with("project quota on ext4 is not supported"), "{refusal}");
    }

    #[test]
    fn other_filesystems_cannot_enforce() {
        let f = facts(FsKind::Other("0x01021994".into()));
        assert_eq!(capability(&f).label(), "none");
        let refusal = decide(QuotaMode::Enforce, 1, "t", "/t", &f).unwrap_err();
        assert_eq!(refusal.fs, "filesystem type 0x01021994");
    }
}

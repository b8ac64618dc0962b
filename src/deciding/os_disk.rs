//! Does a pool share its filesystem with the node's OS disk? Volumes there can fill the disk the
//! node itself needs, and the kubelet then evicts pods for DiskPressure. Decided from the mount
//! table (`/proc/self/mountinfo` text) and the pool's resolved path alone.
//!
//! Which filesystem is "the OS disk": the one the kubelet watches for DiskPressure (its root
//! directory, normally `/var/lib/kubelet`). The kubevirt CSI driver compares a pool with its
//! socket directory under the kubelet's directory for the same reason. Inside a pod, the
//! container's `/` is an overlay and says nothing; but `/etc/hosts` is a bind mount of a file the
//! kubelet writes into its own directory (`/var/lib/kubelet/pods/<uid>/etc-hosts`), so its mount
//! names that filesystem. Outside a pod (the systemd unit), the filesystem mounted at `/`.
//!
//! Limits: with no `/etc/hosts` mount and an overlay or tmpfs `/` (a container the kubelet did not
//! start), the answer is unknown. Two mounts are the same filesystem when they have the same
//! device number, or the same block device as source (btrfs subvolumes, bind mounts). Separate
//! filesystems that share space underneath (ZFS datasets of one pool, thin LVM volumes of one
//! pool) are not recognised.

/// One line of `/proc/self/mountinfo`, the fields this decision needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    /// `major:minor` of the filesystem (`st_dev` of its files).
    pub device: String,
    /// Where it is mounted (octal escapes undone).
    pub mount_point: String,
    /// Filesystem type (`ext4`, `overlay`, ...).
    pub fs_type: String,
    /// Mount source (`/dev/sda1`, `overlay`, `tmpfs`, ...).
    pub source: String,
}

/// Parses the mount table; malformed lines are skipped.
pub fn parse_mountinfo(table: &str) -> Vec<Mount> {
    table.lines().filter_map(parse_line).collect()
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw`: a variable number of
/// optional fields ends with `-`, then type, source and super options.
fn parse_line(line: &str) -> Option<Mount> {
    let mut fields = line.split(' ');
    let device = fields.nth(2)?;
    let mount_point = fields.nth(1)?;
    let mut after_separator = fields.skip_while(|f| *f != "-").skip(1);
    let fs_type = after_separator.next()?;
    let source = after_separator.next()?;
    Some(Mount {
        device: device.to_owned(),
        mount_point: unescape(mount_point),
        fs_type: unescape(fs_type),
        source: unescape(source),
    })
}

/// Undoes the kernel's octal escapes of spaces, tabs, newlines and backslashes (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(digits) = bytes.get(i + 1..i + 4)
            && digits.iter().all(|d| (b'0'..=b'7').contains(d))
            && let Ok(byte) = u8::try_from(digits.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0')))
        {
            out.push(byte);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Root filesystem types that are not a disk: a container's `/` (or an initramfs).
const NOT_A_DISK: [&str; 6] = ["overlay", "fuse-overlayfs", "aufs", "tmpfs", "ramfs", "rootfs"];

/// The OS disk's mount, per the rule in the module documentation; `None` when unknown.
pub fn os_disk(mounts: &[Mount]) -> Option<&Mount> {
    // The last entry for a mount point is the one on top.
    if let Some(kubelet_file) = mounts.iter().rev().find(|m| m.mount_point == "/etc/hosts") {
        return Some(kubelet_file);
    }
    mounts.iter().rev().find(|m| m.mount_point == "/").filter(|root| !NOT_A_DISK.contains(&root.fs_type.as_str()))
}

/// The mount holding `path` (absolute, symlinks resolved): the longest mount point that is `path`
/// or one of its parent directories, the topmost of equals.
pub fn mount_of<'a>(mounts: &'a [Mount], path: &str) -> Option<&'a Mount> {
    let contains = |mount_point: &str| {
        mount_point == "/"
            || path == mount_point
            || path.strip_prefix(mount_point).is_some_and(|rest| rest.starts_with('/'))
    };
    mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| contains(&m.mount_point))
        .max_by_key(|(index, m)| (m.mount_point.len(), *index))
        .map(|(_, m)| m)
}

/// Whether the pool at `pool_path` (absolute, symlinks resolved) is on the OS disk; `None` when
/// either filesystem cannot be identified from the table.
pub fn shares_os_disk(mounts: &[Mount], pool_path: &str) -> Option<bool> {
    let os = os_disk(mounts)?;
    let pool = mount_of(mounts, pool_path)?;
    let same_block_device = os.source.starts_with("/dev/") && os.source == pool.source;
    Some(pool.device == os.device || same_block_device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DaemonSet pod whose pool `/var/hpvolumes` is a hostPath on the node's root disk.
    const POD_POOL_ON_ROOT_DISK: &str = "\
2100 1900 0:310 / / ro,relatime master:700 - overlay overlay rw,lowerdir=/var/lib/containerd/l1,upperdir=/var/lib/containerd/u1
2101 2100 0:312 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw
2102 2100 0:313 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k,mode=755
2110 2100 8:1 /var/hpvolumes /var/hpvolumes rw,relatime master:1 - ext4 /dev/sda1 rw
2111 2100 8:1 /var/lib/kubelet/pods/5c1d/etc-hosts /etc/hosts rw,relatime - ext4 /dev/sda1 rw
2112 2102 8:1 /var/lib/kubelet/pods/5c1d/containers/p/0a1b /dev/termination-log rw,relatime - ext4 /dev/sda1 rw
2113 2100 8:1 /var/lib/containerd/sandboxes/77/hostname /etc/hostname ro,relatime - ext4 /dev/sda1 rw
2114 2100 0:300 / /run/secrets/kubernetes.io/serviceaccount ro,relatime - tmpfs tmpfs rw,size=63432k
";

    /// The same pod, with a data disk mounted at `/var/hpvolumes` on the node.
    const POD_POOL_ON_DATA_DISK: &str = "\
2100 1900 0:310 / / ro,relatime master:700 - overlay overlay rw,lowerdir=/var/lib/containerd/l1
2110 2100 8:17 / /var/hpvolumes rw,relatime master:2 - xfs /dev/sdb1 rw
2111 2100 8:1 /var/lib/kubelet/pods/5c1d/etc-hosts /etc/hosts rw,relatime - ext4 /dev/sda1 rw
";

    #[test]
    fn a_pool_bind_mounted_from_the_kubelets_disk_shares_the_os_disk() {
        let mounts = parse_mountinfo(POD_POOL_ON_ROOT_DISK);
        assert_eq!(os_disk(&mounts).map(|m| m.mount_point.as_str()), Some("/etc/hosts"));
        assert_eq!(shares_os_disk(&mounts, "/var/hpvolumes"), Some(true));
    }

    #[test]
    fn a_pool_on_its_own_disk_does_not_share_the_os_disk() {
        let mounts = parse_mountinfo(POD_POOL_ON_DATA_DISK);
        assert_eq!(shares_os_disk(&mounts, "/var/hpvolumes"), Some(false));
    }

    #[test]
    fn a_container_without_the_kubelets_hosts_file_cannot_tell() {
        let table = "\
1 0 0:31 / / rw - overlay overlay rw
2 1 8:17 / /var/hpvolumes rw - xfs /dev/sdb1 rw
";
        assert_eq!(shares_os_disk(&parse_mountinfo(table), "/var/hpvolumes"), None);
    }

    #[test]
    fn on_the_host_the_root_filesystem_is_the_os_disk() {
        let table = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
23 22 0:21 / /proc rw - proc proc rw
24 22 259:3 / /srv/pools rw,relatime shared:2 - xfs /dev/nvme0n1p3 rw
";
        let mounts = parse_mountinfo(table);
        // A plain directory under / is on the OS disk; one under the data mount is not.
        assert_eq!(shares_os_disk(&mounts, "/var/hpvolumes"), Some(true));
        assert_eq!(shares_os_disk(&mounts, "/srv/pools/fast"), Some(false));
        assert_eq!(shares_os_disk(&mounts, "/srv/poolsX"), Some(true), "a name prefix is not a parent directory");
    }

    #[test]
    fn btrfs_subvolumes_of_the_root_device_share_it() {
        // Different subvolumes, and an anonymous device number per mount: same block device.
        let table = "\
30 1 0:33 /root / rw,relatime shared:1 - btrfs /dev/vda3 rw,subvol=/root
31 30 0:35 /pools /var/hpvolumes rw,relatime shared:2 - btrfs /dev/vda3 rw,subvol=/pools
";
        assert_eq!(shares_os_disk(&parse_mountinfo(table), "/var/hpvolumes"), Some(true));
    }

    #[test]
    fn the_topmost_of_stacked_mounts_counts() {
        // The data disk was mounted over the directory after the root disk's bind mount.
        let table = "\
1 0 8:1 / / rw - ext4 /dev/sda1 rw
2 1 8:1 /var/hpvolumes /var/hpvolumes rw - ext4 /dev/sda1 rw
3 2 8:17 / /var/hpvolumes rw - xfs /dev/sdb1 rw
";
        assert_eq!(shares_os_disk(&parse_mountinfo(table), "/var/hpvolumes"), Some(false));
    }

    #[test]
    fn escaped_mount_points_and_optional_fields_are_parsed() {
        let table = "5 1 8:17 / /mnt/my\\040disk rw shared:3 master:4 - ext4 /dev/sdb1 rw\nnonsense line\n";
        let mounts = parse_mountinfo(table);
        assert_eq!(
            mounts,
            vec![Mount {
                device: "8:17".into(),
                mount_point: "/mnt/my disk".into(),
                fs_type: "ext4".into(),
                source: "/dev/sdb1".into(),
            }]
        );
    }
}

//! What a pool's filesystem can do, as the doctor probes it: its type, its mount, reflink
//! (`FICLONE`) and quota support, and its SELinux label. Kept in one file so that it can later be
//! unified with the quota and clone code of the daemon; the parsing and naming below are pure and
//! unit-tested, the probes are the few functions that touch the kernel.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::io::Errno;

use crate::doctor::DoctorError;

/// Hidden directory, directly under the pool root, where the reflink probe makes its two files.
/// It starts with a dot so that it never matches a volume layout.
pub const PROBE_DIR: &str = ".hpp-doctor-probe";

/// The mount a path lies on, from `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Which directory of its filesystem is mounted there: `/` for the filesystem's own root,
    /// another path for a bind mount of a subdirectory (how a pod sees a hostPath volume).
    pub fs_root: PathBuf,
    /// Filesystem type (`ext4`, `xfs`, ...).
    pub fs_type: String,
    /// Mount source (`/dev/sda1`, `server:/export`, ...).
    pub source: String,
    /// Per-mount and per-superblock options together (`rw`, `prjquota`, ...).
    pub options: Vec<String>,
}

/// Whether cloning a file (`FICLONE`, as `cp --reflink`) works in the pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reflink {
    /// The probe clone succeeded.
    Supported,
    /// The filesystem refused the clone as unsupported.
    Unsupported,
    /// The probe could not tell (read-only, full, permission): the reason.
    Unknown(String),
}

impl std::fmt::Display for Reflink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reflink::Supported => f.write_str("supported"),
            Reflink::Unsupported => f.write_str("unsupported"),
            Reflink::Unknown(why) => write!(f, "unknown ({why})"),
        }
    }
}

/// The name of a filesystem from its `statfs` magic number (`f_type`), for filesystems a pool is
/// likely to be on; `None` for others.
pub fn fs_type_name(magic: u64) -> Option<&'static str> {
    Some(match magic {
        0xEF53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x2FC1_2FC1 => "zfs",
        0xCA45_1A4E => "bcachefs",
        0x0102_1994 => "tmpfs",
        0x794C_7630 => "overlay",
        0x6969 => "nfs",
        0xFF53_4D42 => "cifs",
        0x00C3_6400 => "ceph",
        0x6573_5546 => "fuse",
        0x5346_544E => "ntfs",
        0x4D44 => "vfat",
        0x7461_636F => "ocfs2",
        0x0116_1970 => "gfs2",
        _ => return None,
    })
}

/// Filesystems that are a container's own root rather than a host disk: when the doctor's
/// "host root" is one of these it runs in a container without the host's `/`, and whether a pool
/// shares the OS disk cannot be told from device numbers.
pub fn is_container_layer(magic: u64) -> bool {
    matches!(fs_type_name(magic), Some("overlay" | "tmpfs"))
}

/// The rule for "shared with `/`". On the node, the pool root and the host's root directory are
/// on the same filesystem (same `st_dev`). In a container (`root_is_container_layer`: the root
/// seen is the container's overlay), the pool is a hostPath bind mount at the same path as on the
/// host, and the mount table names the directory of the host filesystem that is mounted: when
/// that is the pool's own full path, that filesystem is the one mounted at the host's `/`.
/// Unknown in a container when the mount is not listed.
pub fn shares_root_filesystem(
    pool_dev: u64,
    root_dev: u64,
    root_is_container_layer: bool,
    pool_path: &Path,
    pool_mount: Option<&MountEntry>,
) -> Option<bool> {
    if !root_is_container_layer {
        return Some(pool_dev == root_dev);
    }
    let mount = pool_mount?;
    let inside = pool_path.strip_prefix(&mount.mount_point).ok()?;
    let host_path = if inside.as_os_str().is_empty() { mount.fs_root.clone() } else { mount.fs_root.join(inside) };
    Some(host_path == pool_path)
}

/// The entry of `/proc/self/mountinfo` the (canonical) `path` lies on: the longest mount point
/// at or above it, the last one listed when mounts are stacked.
pub fn mount_of(table: &[u8], path: &Path) -> Option<MountEntry> {
    let path = path.as_os_str().as_bytes();
    let mut best: Option<(usize, MountEntry)> = None;
    for line in table.split(|b| *b == b'\n') {
        let fields: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
        let Some(dash) = fields.iter().position(|f| *f == b"-") else { continue };
        let (Some(fs_root), Some(mount_point), Some(mount_options), Some(fs_type), Some(source), Some(super_options)) = (
            fields.get(3),
            fields.get(4),
            fields.get(5),
            fields.get(dash + 1),
            fields.get(dash + 2),
            fields.get(dash + 3),
        ) else {
            continue;
        };
        let mount_point = unescape(mount_point);
        let contains = mount_point == b"/"
            || path == mount_point.as_slice()
            || (path.starts_with(&mount_point) && path.get(mount_point.len()) == Some(&b'/'));
        if !contains || best.as_ref().is_some_and(|(len, _)| *len > mount_point.len()) {
            continue;
        }
        let text = |b: &[u8]| String::from_utf8_lossy(&unescape(b)).into_owned();
        let options = mount_options.split(|b| *b == b',').chain(super_options.split(|b| *b == b',')).map(text);
        let mut options: Vec<String> = options.collect();
        options.dedup();
        let entry = MountEntry {
            mount_point: PathBuf::from(std::ffi::OsStr::from_bytes(&mount_point)),
            fs_root: PathBuf::from(std::ffi::OsStr::from_bytes(&unescape(fs_root))),
            fs_type: text(fs_type),
            source: text(source),
            options,
        };
        best = Some((mount_point.len(), entry));
    }
    best.map(|(_, entry)| entry)
}

/// The quota options among a mount's options (what the kernel reports as enabled).
pub fn quota_options(options: &[String]) -> Vec<String> {
    const QUOTA: [&str; 12] = [
        "quota",
        "usrquota",
        "grpquota",
        "prjquota",
        "uquota",
        "gquota",
        "pquota",
        "uqnoenforce",
        "gqnoenforce",
        "pqnoenforce",
        "usrjquota",
        "grpjquota",
    ];
    options.iter().filter(|o| QUOTA.contains(&o.split('=').next().unwrap_or_default())).cloned().collect()
}

/// Whether the options enable enforced project quotas (one limit per volume directory).
pub fn has_project_quota(quota_options: &[String]) -> bool {
    quota_options.iter().any(|o| o == "prjquota" || o == "pquota")
}

/// An SELinux label as stored in the `security.selinux` xattr (NUL-terminated bytes).
pub fn selinux_label_text(raw: &[u8]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).trim().to_owned()
}

/// The type field of a label `user:role:type:level`.
pub fn selinux_type(label: &str) -> Option<&str> {
    label.split(':').nth(2).filter(|t| !t.is_empty())
}

/// SELinux mode from `/sys/fs/selinux/enforce` (`1` enforcing, `0` permissive).
pub fn selinux_mode(enforce: &str) -> &'static str {
    if enforce.trim() == "1" { "enforcing" } else { "permissive" }
}

/// This process's mount table.
const MOUNT_TABLE: &str = "/proc/self/mountinfo";

/// Where the kernel tells whether SELinux is on.
const SELINUX_ENFORCE: &str = "/sys/fs/selinux/enforce";

/// SELinux mode and the label of `path`, when SELinux is on; `None` when it is off.
pub fn selinux_of(path: &Path) -> Option<(&'static str, Result<String, String>)> {
    let enforce = std::fs::read_to_string(SELINUX_ENFORCE).ok()?;
    let mut buf = vec![0u8; 256];
    let label = match rustix::fs::lgetxattr(path, "security.selinux", &mut buf[..]) {
        Ok(n) => Ok(selinux_label_text(&buf[..n])),
        Err(e) => Err(format!("cannot read the security.selinux attribute: {e}")),
    };
    Some((selinux_mode(&enforce), label))
}

/// The mount `path` lies on, read from this process's mount table.
pub fn read_mount_of(path: &Path) -> Result<Option<MountEntry>, DoctorError> {
    let fs_error = |op, path: PathBuf| move |source| DoctorError::Filesystem { op, path, source };
    let canonical = std::fs::canonicalize(path).map_err(fs_error("resolve", path.to_owned()))?;
    let table = std::fs::read(MOUNT_TABLE).map_err(fs_error("read the mount table", MOUNT_TABLE.into()))?;
    Ok(mount_of(&table, &canonical))
}

/// The `statfs` magic number of the filesystem holding `path`.
pub fn fs_magic(path: &Path) -> Result<u64, DoctorError> {
    let st = rustix::fs::statfs(path).map_err(|e| DoctorError::fs("statfs", path, e))?;
    // f_type is a signed word on some architectures; the magic numbers are 32-bit.
    #[allow(clippy::unnecessary_cast)]
    Ok((st.f_type as u64) & 0xFFFF_FFFF)
}

/// Probes reflink support by cloning one small temp file onto another in [`PROBE_DIR`] under
/// the pool root, then removes both and the directory (also a leftover of an interrupted run).
pub fn probe_reflink(root: &Path) -> Reflink {
    let dir = root.join(PROBE_DIR);
    let result = clone_in(&dir);
    remove_probe_dir(&dir);
    match result {
        Ok(()) => Reflink::Supported,
        // EOPNOTSUPP (ENOTSUP is the same number on Linux): no reflink; EINVAL: the filesystem
        // has no clone operation; EXDEV cannot happen within one directory but means the same.
        Err(Probe::Clone(Errno::OPNOTSUPP | Errno::INVAL | Errno::XDEV | Errno::NOTTY)) => Reflink::Unsupported,
        Err(Probe::Clone(e)) => Reflink::Unknown(format!("clone failed: {e}")),
        Err(Probe::Setup(why)) => Reflink::Unknown(why),
    }
}

enum Probe {
    Setup(String),
    Clone(Errno),
}

fn clone_in(dir: &Path) -> Result<(), Probe> {
    let setup = |what: &str, e: std::io::Error| Probe::Setup(format!("cannot {what} in {}: {e}", dir.display()));
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(Probe::Setup(format!("{} exists and is not a directory", dir.display()))),
        Err(_) => {
            std::fs::create_dir(dir).map_err(|e| setup("create the probe directory", e))?;
        }
    }
    // create_new (O_EXCL) never follows a symlink planted at the name.
    let new_file = |name: &str| {
        let path = dir.join(name);
        let _ = std::fs::remove_file(&path);
        std::fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path)
    };
    let mut source = new_file("source").map_err(|e| setup("create a probe file", e))?;
    source.write_all(&[0x5a; 4096]).and_then(|()| source.flush()).map_err(|e| setup("write a probe file", e))?;
    let clone = new_file("clone").map_err(|e| setup("create a probe file", e))?;
    rustix::fs::ioctl_ficlone(&clone, &source).map_err(Probe::Clone)
}

fn remove_probe_dir(dir: &Path) {
    for name in ["source", "clone"] {
        let _ = std::fs::remove_file(dir.join(name));
    }
    let _ = std::fs::remove_dir(dir);
}

/// Undoes the octal escapes (`\040` for space, ...) of mountinfo fields.
fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\'
            && let Some(digits) = field.get(i + 1..i + 4)
            && digits.iter().all(|d| (b'0'..=b'7').contains(d))
        {
            let value = digits.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
            if let Ok(byte) = u8::try_from(value) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[u8] = b"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n\
        30 22 7:3 / /var/hp\\040volumes rw,noatime shared:5 - xfs /dev/loop3 rw,attr2,inode64,prjquota\n\
        31 22 0:40 / /var/hp rw - tmpfs tmpfs rw,size=16m\n\
        32 30 0:41 / /var/hp\\040volumes/inner rw - tmpfs tmpfs rw\n";

    #[test]
    fn the_longest_mount_at_or_above_the_path_is_found() {
        let pool = mount_of(TABLE, Path::new("/var/hp volumes")).unwrap();
        assert_eq!(pool.mount_point, PathBuf::from("/var/hp volumes"));
        assert_eq!(pool.fs_root, PathBuf::from("/"));
        assert_eq!((pool.fs_type.as_str(), pool.source.as_str()), ("xfs", "/dev/loop3"));
        assert!(pool.options.contains(&"prjquota".to_owned()) && pool.options.contains(&"noatime".to_owned()));
        let below = mount_of(TABLE, Path::new("/var/hp volumes/pvc-x")).unwrap();
        assert_eq!(below.mount_point, PathBuf::from("/var/hp volumes"));
        // "/var/hp" is a prefix of the text but not a parent directory of "/var/hpx".
        let sibling = mount_of(TABLE, Path::new("/var/hpx")).unwrap();
        assert_eq!(sibling.mount_point, PathBuf::from("/"));
        assert_eq!(mount_of(b"", Path::new("/x")), None);
    }

    #[test]
    fn quota_options_are_picked_out_and_project_quota_recognised() {
        let options: Vec<String> =
            ["rw", "attr2", "prjquota", "usrjquota=aquota.user", "noquota"].iter().map(|s| s.to_string()).collect();
        let quota = quota_options(&options);
        assert_eq!(quota, vec!["prjquota".to_owned(), "usrjquota=aquota.user".to_owned()]);
        assert!(has_project_quota(&quota));
        assert!(!has_project_quota(&quota_options(&["usrquota".to_owned()])));
        assert!(quota_options(&["rw".to_owned()]).is_empty());
    }

    #[test]
    fn selinux_labels_are_formatted_without_their_nul() {
        let label = selinux_label_text(b"system_u:object_r:container_file_t:s0\0");
        assert_eq!(label, "system_u:object_r:container_file_t:s0");
        assert_eq!(selinux_type(&label), Some("container_file_t"));
        assert_eq!(selinux_type("unlabeled"), None);
        assert_eq!(selinux_label_text(b"\0"), "");
        assert_eq!((selinux_mode("1\n"), selinux_mode("0")), ("enforcing", "permissive"));
    }

    #[test]
    fn shared_with_root_compares_devices_on_the_node_and_mounted_paths_in_a_pod() {
        let pool = Path::new("/var/hpvolumes");
        assert_eq!(shares_root_filesystem(2049, 2049, false, pool, None), Some(true));
        assert_eq!(shares_root_filesystem(1795, 2049, false, pool, None), Some(false));
        let bind = |fs_root: &str, at: &str| MountEntry {
            mount_point: PathBuf::from(at),
            fs_root: PathBuf::from(fs_root),
            fs_type: "ext4".into(),
            source: "/dev/sda1".into(),
            options: vec![],
        };
        // In a pod: the hostPath of a directory of the host's root filesystem...
        assert_eq!(
            shares_root_filesystem(1, 2, true, pool, Some(&bind("/var/hpvolumes", "/var/hpvolumes"))),
            Some(true)
        );
        // ...of a dedicated disk mounted there on the host, or of a directory of another disk.
        assert_eq!(shares_root_filesystem(1, 2, true, pool, Some(&bind("/", "/var/hpvolumes"))), Some(false));
        assert_eq!(shares_root_filesystem(1, 2, true, pool, Some(&bind("/hpvolumes", "/var/hpvolumes"))), Some(false));
        // A pool below the mount point: its path inside the filesystem is the mount's root + the rest.
        assert_eq!(shares_root_filesystem(1, 2, true, pool, Some(&bind("/var", "/var"))), Some(true));
        assert_eq!(shares_root_filesystem(1, 77, true, pool, None), None);
        assert!(is_container_layer(0x794C_7630) && !is_container_layer(0xEF53));
        assert_eq!(fs_type_name(0x5846_5342), Some("xfs"));
        assert_eq!(fs_type_name(1), None);
    }

    #[test]
    fn the_reflink_probe_answers_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let answer = probe_reflink(dir.path());
        // Whatever this machine's filesystem can do, the probe gives a definite answer here
        // (a writable directory), never a setup failure, and cleans up.
        assert!(matches!(answer, Reflink::Supported | Reflink::Unsupported), "{answer}");
        assert!(!dir.path().join(PROBE_DIR).exists());
        let magic = fs_magic(dir.path()).unwrap();
        let expect_clone = matches!(fs_type_name(magic), Some("xfs" | "btrfs"));
        if !expect_clone {
            assert_eq!(answer, Reflink::Unsupported, "{:?}", fs_type_name(magic));
        }
    }
}

//! What a pool's filesystem can do, as the doctor probes it: its type, its mount (parsed by
//! [`crate::deciding::mount_table`]), reflink (`FICLONE`) and quota support, and its SELinux
//! label. Kept in one file so that it can later be unified with the quota and clone code of the
//! daemon; the naming below is pure and unit-tested, the probes are the few functions that touch
//! the kernel.

use std::io::Write;
use std::path::{Path, PathBuf};

use rustix::io::Errno;

use crate::deciding::mount_table::{Mount, mount_of};
use crate::doctor::DoctorError;
use crate::filesystem::mount_table;

/// Hidden directory, directly under the pool root, where the reflink probe makes its two files.
/// It starts with a dot so that it never matches a volume layout.
pub const PROBE_DIR: &str = ".hpp-doctor-probe";

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
pub fn read_mount_of(path: &Path) -> Result<Option<Mount>, DoctorError> {
    let fs_error = |op, path: PathBuf| move |source| DoctorError::Filesystem { op, path, source };
    let canonical = std::fs::canonicalize(path).map_err(fs_error("resolve", path.to_owned()))?;
    let mounts = mount_table::read().map_err(fs_error("read the mount table", mount_table::MOUNT_TABLE.into()))?;
    Ok(mount_of(&mounts, &canonical).cloned())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_options_are_picked_out() {
        let options: Vec<String> =
            ["rw", "attr2", "prjquota", "usrjquota=aquota.user", "noquota"].iter().map(|s| s.to_string()).collect();
        let quota = quota_options(&options);
        assert_eq!(quota, vec!["prjquota".to_owned(), "usrjquota=aquota.user".to_owned()]);
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
    fn filesystems_are_named_from_their_magic_number() {
        assert_eq!(fs_type_name(0x5846_5342), Some("xfs"));
        assert_eq!(fs_type_name(0xEF53), Some("ext2/3/4"));
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

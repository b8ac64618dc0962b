//! The mount table (`/proc/self/mountinfo` text) as plain data, and which mount holds a path.
//! Parsed here once for every reader: the pool root checks, the trash, the OS disk rule and the
//! doctor. Reading the file is the caller's edge ([`crate::filesystem::mount_table`]).
//!
//! A line is `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`:
//! mount id, parent id, `major:minor`, the directory of the filesystem mounted (its root for a
//! bind mount of a subdirectory), the mount point, per-mount options, a variable number of
//! optional fields ended by `-`, then type, source and per-superblock options. Paths are resolved
//! (no symlinks) and the kernel escapes space, tab, newline and backslash in octal (`\040`).
//!
//! Hand-written, not `procfs`'s `MountInfo`: that one reads lines as UTF-8 and keeps the octal
//! escapes, so a pool under a path with a space or non-UTF-8 bytes would match no mount.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of the mount table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mount {
    /// `major:minor` of the filesystem (`st_dev` of its files).
    pub device: String,
    /// Which directory of the filesystem is mounted: `/` for its own root, another path for a
    /// bind mount of a subdirectory (how a pod sees a hostPath volume).
    pub fs_root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Filesystem type (`ext4`, `overlay`, ...).
    pub fs_type: String,
    /// Mount source (`/dev/sda1`, `overlay`, `server:/export`, ...).
    pub source: String,
    /// Per-mount then per-superblock options (`rw`, `noatime`, `prjquota`, ...).
    pub options: Vec<String>,
}

/// Parses the mount table, in its order (a later mount at the same point is on top); malformed
/// lines are skipped.
pub fn parse_mountinfo(table: &[u8]) -> Vec<Mount> {
    table.split(|b| *b == b'\n').filter_map(parse_line).collect()
}

fn parse_line(line: &[u8]) -> Option<Mount> {
    let fields: Vec<&[u8]> = line.split(|b| *b == b' ').collect();
    let separator = fields.iter().skip(6).position(|f| *f == b"-")? + 6;
    let (device, fs_root, mount_point, mount_options) =
        (fields.get(2)?, fields.get(3)?, fields.get(4)?, fields.get(5)?);
    let (fs_type, source) = (fields.get(separator + 1)?, fields.get(separator + 2)?);
    let super_options = fields.get(separator + 3).copied().unwrap_or_default();
    let mut options: Vec<String> = Vec::new();
    for option in mount_options.split(|b| *b == b',').chain(super_options.split(|b| *b == b',')) {
        let option = text(option);
        // Both lists start with `rw` or `ro`: each option once.
        if !option.is_empty() && !options.contains(&option) {
            options.push(option);
        }
    }
    Some(Mount {
        device: text(device),
        fs_root: path(fs_root),
        mount_point: path(mount_point),
        fs_type: text(fs_type),
        source: text(source),
        options,
    })
}

fn path(field: &[u8]) -> PathBuf {
    PathBuf::from(OsStr::from_bytes(&unescape(field)))
}

fn text(field: &[u8]) -> String {
    String::from_utf8_lossy(&unescape(field)).into_owned()
}

/// Undoes the kernel's octal escapes (`\040` for space, `\011`, `\012`, `\134`); anything else
/// is kept as written.
pub fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\'
            && let Some(digits) = field.get(i + 1..i + 4)
            && digits.iter().all(|d| (b'0'..=b'7').contains(d))
            && let Ok(byte) = u8::try_from(digits.iter().fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0')))
        {
            out.push(byte);
            i += 4;
            continue;
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

/// The mount holding `path` (absolute, symlinks resolved): the longest mount point that is `path`
/// or one of its parent directories, the topmost of equals.
pub fn mount_of<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    mounts
        .iter()
        .enumerate()
        // Path::starts_with compares whole components: /var/hp is not a parent of /var/hpx.
        .filter(|(_, m)| path.starts_with(&m.mount_point))
        .max_by_key(|(index, m)| (m.mount_point.as_os_str().len(), *index))
        .map(|(_, m)| m)
}

/// Whether something is mounted exactly at `path` (resolved).
pub fn is_mount_point(mounts: &[Mount], path: &Path) -> bool {
    mounts.iter().any(|m| m.mount_point == path)
}

/// Whether a filesystem, or a directory other than `path` itself, is mounted at `path`
/// (resolved): the topmost mount there counts unless it is a bind mount of that very directory
/// onto itself, which is how a container sees its hostPath volume of `path` whether or not the
/// host has a disk mounted there (only a mount over it, propagated from the host, is one). The
/// bind's root is the directory's path within its filesystem: `path` itself, or a tail of it
/// when that filesystem is mounted below `/` (a separate `/var`).
pub fn is_mounted_over(mounts: &[Mount], path: &Path) -> bool {
    let Some(top) = mounts.iter().rev().find(|m| m.mount_point == path) else { return false };
    let within = top.fs_root.strip_prefix("/").unwrap_or(&top.fs_root);
    within.as_os_str().is_empty() || !path.ends_with(within)
}

/// The first mount, in table order, at `path` or below it (resolved).
pub fn first_mount_at_or_below<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    mounts.iter().find(|m| m.mount_point.starts_with(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &[u8] = b"22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n\
        30 22 7:3 / /var/hp\\040volumes rw,noatime shared:5 master:2 - xfs /dev/loop3 rw,attr2,inode64,prjquota\n\
        31 22 0:40 / /var/hp rw - tmpfs tmpfs rw,size=16m\n\
        32 30 0:41 /sub\\134dir /var/hp\\040volumes/inner rw - tmpfs tmpfs rw\n\
        nonsense line\n\
        33 22 0:42 / /short rw - tmpfs\n";

    #[test]
    fn every_field_is_read_and_unescaped_and_malformed_lines_are_skipped() {
        let mounts = parse_mountinfo(TABLE);
        assert_eq!(mounts.len(), 4, "{mounts:?}");
        assert_eq!(
            mounts[1],
            Mount {
                device: "7:3".into(),
                fs_root: "/".into(),
                mount_point: "/var/hp volumes".into(),
                fs_type: "xfs".into(),
                source: "/dev/loop3".into(),
                options: ["rw", "noatime", "attr2", "inode64", "prjquota"].map(String::from).to_vec(),
            }
        );
        assert_eq!(mounts[3].fs_root, PathBuf::from("/sub\\dir"));
        assert_eq!(unescape(b"a\\04"), b"a\\04", "an incomplete escape is kept");
        assert_eq!(unescape(b"\\777x"), b"\\777x", "an escape above a byte is kept");
        assert_eq!(unescape(b"tab\\011nl\\012"), b"tab\tnl\n");
    }

    #[test]
    fn the_longest_mount_at_or_above_the_path_holds_it() {
        let mounts = parse_mountinfo(TABLE);
        let mount_point = |path: &str| mount_of(&mounts, Path::new(path)).map(|m| m.mount_point.clone());
        assert_eq!(mount_point("/var/hp volumes"), Some("/var/hp volumes".into()));
        assert_eq!(mount_point("/var/hp volumes/pvc-x"), Some("/var/hp volumes".into()));
        assert_eq!(mount_point("/var/hp volumes/inner/x"), Some("/var/hp volumes/inner".into()));
        assert_eq!(mount_point("/var/hpx"), Some("/".into()), "a name prefix is not a parent directory");
        assert_eq!(mount_of(&[], Path::new("/x")), None);
    }

    #[test]
    fn the_topmost_of_stacked_mounts_holds_the_path() {
        let table = b"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n\
            2 1 8:1 /var/hpvolumes /var/hpvolumes rw - ext4 /dev/sda1 rw\n\
            3 2 8:17 / /var/hpvolumes rw - xfs /dev/sdb1 rw\n";
        let mounts = parse_mountinfo(table);
        assert_eq!(mount_of(&mounts, Path::new("/var/hpvolumes/a")).map(|m| m.device.as_str()), Some("8:17"));
    }

    #[test]
    fn a_bind_of_the_directory_onto_itself_is_not_something_mounted_over_it() {
        // A pod's hostPath volume of the pool path: the host's root filesystem, or its /var.
        let bare = b"1 0 0:50 / / rw - overlay overlay rw\n\
            2 1 254:0 /var/lib/pool /var/lib/pool rw master:9 - ext4 /dev/vda rw\n\
            3 1 8:2 /lib/other /var/lib/other rw master:3 - xfs /dev/sdb1 rw\n";
        let mounts = parse_mountinfo(bare);
        assert!(!is_mounted_over(&mounts, Path::new("/var/lib/pool")), "the volume itself");
        assert!(!is_mounted_over(&mounts, Path::new("/var/lib/other")), "its filesystem mounted at /var on the host");
        assert!(!is_mounted_over(&mounts, Path::new("/var/lib")), "nothing mounted there");
        // The host mounted a disk there (propagated over the volume), or a claim's directory.
        let disk = [&bare[..], b"4 2 7:1 / /var/lib/pool rw master:12 - ext4 /dev/loop1 rw\n"].concat();
        assert!(is_mounted_over(&parse_mountinfo(&disk), Path::new("/var/lib/pool")));
        let claim = [&bare[..], b"4 2 254:0 /var/lib/disks/a /var/lib/pool rw - ext4 /dev/vda rw\n"].concat();
        assert!(is_mounted_over(&parse_mountinfo(&claim), Path::new("/var/lib/pool")));
        // The same on the host: a disk mounted at the path, a bind of another directory.
        let host = b"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 8:17 / /srv/pool rw - xfs /dev/sdb1 rw\n";
        assert!(is_mounted_over(&parse_mountinfo(host), Path::new("/srv/pool")));
        assert!(!is_mounted_over(&parse_mountinfo(host), Path::new("/srv")));
    }

    #[test]
    fn mount_points_are_matched_exactly_and_below() {
        let mounts = parse_mountinfo(TABLE);
        assert!(is_mount_point(&mounts, Path::new("/var/hp volumes")));
        assert!(!is_mount_point(&mounts, Path::new("/var/hp\\040volumes")), "compared unescaped");
        assert!(!is_mount_point(&mounts, Path::new("/var")));
        let below = |path: &str| first_mount_at_or_below(&mounts, Path::new(path)).map(|m| m.mount_point.clone());
        assert_eq!(below("/var/hp volumes"), Some("/var/hp volumes".into()));
        assert_eq!(below("/var/hp volumes/inner"), Some("/var/hp volumes/inner".into()));
        assert_eq!(below("/var/hp vol"), None);
        assert_eq!(below("/srv"), None);
    }
}

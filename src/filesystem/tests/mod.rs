use super::walker::*;
use super::*;
use rustix::fs::{Dir, Mode, OFlags};
use std::ffi::{CStr, CString, OsStr};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use rustix::mount::{MountFlags, UnmountFlags};
use tempfile::TempDir;

/// A temporary directory holding a pool root `pool/` and an `outside/` directory beside it.
struct Fixture {
    tmp: TempDir,
    pool: PoolRoot,
}

impl Fixture {
    fn new() -> Self {
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::create_dir(tmp.path().join("pool")).expect("mkdir pool");
        fs::create_dir(tmp.path().join("outside")).expect("mkdir outside");
        let pool = PoolRoot::open("test", &tmp.path().join("pool")).expect("open pool");
        Fixture { tmp, pool }
    }

    fn root(&self) -> PathBuf {
        self.tmp.path().join("pool")
    }

    fn outside(&self) -> PathBuf {
        self.tmp.path().join("outside")
    }

    fn vol(&self, name: &str) -> PathBuf {
        self.root().join(name)
    }

    fn remove(&self, name: &str) -> Result<Removal, PoolError> {
        self.pool.remove_volume_dir(&dir_name(name))
    }
}

fn dir_name(s: &str) -> VolumeDirName {
    VolumeDirName::new(s).expect("valid name")
}

fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).expect("stat").permissions().mode() & 0o7777
}

fn exists(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

/// Unmounts (lazily, so a failing test cannot leave it behind busy) when dropped.
struct MountGuard(PathBuf);

impl MountGuard {
    fn tmpfs(at: &Path, size: &CStr) -> Self {
        rustix::mount::mount("tmpfs", at, "tmpfs", MountFlags::empty(), size)
            .expect("mount tmpfs (tests must run as root)");
        MountGuard(at.to_owned())
    }

    fn bind(source: &Path, at: &Path) -> Self {
        rustix::mount::mount_bind(source, at).expect("bind mount (tests must run as root)");
        MountGuard(at.to_owned())
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.0, UnmountFlags::DETACH);
    }
}

/// Builds `depth` nested directories named `d` by descriptor (paths would exceed PATH_MAX),
/// with a file `f` at every level; returns the number of names created.
fn make_deep_tree(top: &Path, depth: usize) -> u64 {
    let mut fd = rustix::fs::open(top, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).expect("open top");
    for _ in 0..depth {
        rustix::fs::mknodat(&fd, "f", FileType::RegularFile, Mode::from_raw_mode(0o644), 0).expect("mknod f");
        rustix::fs::mkdirat(&fd, "d", Mode::from_raw_mode(0o755)).expect("mkdir d");
        fd = rustix::fs::openat(&fd, "d", OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).expect("open d");
    }
    2 * depth as u64
}

// ---- VolumeDirName ----

#[test]
fn dir_name_accepts_layout_names_up_to_255_bytes() {
    for ok in ["pvc-0b4c3c2e-1b2a-4d53-9a3f-3f2d4c5b6a7e", "db-pvc-1", "a", "...", ".x"] {
        assert_eq!(dir_name(ok).as_str(), ok);
    }
    let longest = "x".repeat(255);
    assert_eq!(dir_name(&longest).as_str(), longest);
}

#[test]
fn dir_name_refuses_empty_dots_slash_nul_and_256_bytes() {
    for bad in ["", ".", "..", "a/b", "/", "../x", "a\0b", &"x".repeat(256)] {
        let err = VolumeDirName::new(bad).expect_err(bad);
        assert!(err.to_string().contains("single path component"), "{err}");
    }
}

// ---- PoolRoot::open ----

#[test]
fn open_refuses_relative_and_dotted_paths() {
    for bad in ["pool", "./pool", "/tmp/../etc", "/tmp/./x"] {
        let err = PoolRoot::open("p", Path::new(bad)).expect_err(bad);
        assert!(matches!(err, PoolError::InvalidRootPath { .. }), "{bad}: {err}");
    }
}

#[test]
fn open_refuses_missing_directory_and_regular_file() {
    let fx = Fixture::new();
    let err = PoolRoot::open("p", &fx.tmp.path().join("nope")).expect_err("missing");
    assert!(matches!(err, PoolError::RootMissing { .. }), "{err}");
    fs::write(fx.tmp.path().join("file"), b"x").expect("write");
    let err = PoolRoot::open("p", &fx.tmp.path().join("file")).expect_err("file");
    assert!(matches!(err, PoolError::RootNotDirectory { .. }), "{err}");
    let err = PoolRoot::open("p", &fx.tmp.path().join("file/sub")).expect_err("file/sub");
    assert!(matches!(err, PoolError::RootNotDirectory { .. }), "{err}");
}

#[test]
fn open_refuses_symlink_as_last_component_even_with_trailing_slash() {
    let fx = Fixture::new();
    let link = fx.tmp.path().join("link");
    symlink(fx.root(), &link).expect("symlink");
    for path in [link.clone(), PathBuf::from(format!("{}/", link.display()))] {
        let err = PoolRoot::open("p", &path).expect_err("symlink root");
        assert!(matches!(err, PoolError::RootIsSymlink { .. }), "{err}");
    }
}

#[test]
fn open_follows_symlinked_intermediate_component_and_pins_the_directory() {
    let fx = Fixture::new();
    let link = fx.tmp.path().join("link");
    symlink(fx.tmp.path(), &link).expect("symlink");
    let pool = PoolRoot::open("p", &link.join("pool")).expect("open through link");
    assert_eq!(pool.path(), link.join("pool"));
    pool.check(false).expect("same directory");
    pool.create_volume_dir(&dir_name("v"), 0o777).expect("create");
    assert!(fx.vol("v").is_dir());
    // Re-pointing the intermediate link makes the path name another directory: refused.
    fs::remove_file(&link).expect("rm link");
    symlink(fx.outside(), &link).expect("relink");
    fs::create_dir(fx.outside().join("pool")).expect("mkdir");
    let err = pool.check(false).expect_err("moved");
    assert!(matches!(err, PoolError::RootChanged { .. }), "{err}");
}

// ---- check / is_mountpoint ----

#[test]
fn check_detects_a_replaced_or_removed_root() {
    let fx = Fixture::new();
    fx.pool.check(false).expect("unchanged");
    fs::rename(fx.root(), fx.tmp.path().join("old")).expect("rename");
    let err = fx.pool.check(false).expect_err("removed");
    assert!(matches!(err, PoolError::RootMissing { .. }), "{err}");
    assert!(!err.is_retryable());
    fs::create_dir(fx.root()).expect("mkdir");
    let err = fx.pool.check(false).expect_err("replaced");
    assert!(matches!(err, PoolError::RootChanged { .. }), "{err}");
    assert!(!err.is_retryable());
}

#[test]
fn require_mountpoint_refuses_plain_directory_and_an_unmounted_disk() {
    let fx = Fixture::new();
    assert!(!fx.pool.is_mountpoint().expect("plain"));
    let err = fx.pool.check(true).expect_err("plain dir");
    assert!(matches!(err, PoolError::RootNotMountpoint { .. }), "{err}");
    assert!(err.is_retryable());

    let disk = fx.tmp.path().join("disk");
    fs::create_dir(&disk).expect("mkdir");
    let mount = MountGuard::tmpfs(&disk, c"size=1m");
    let pool = PoolRoot::open("disk", &disk).expect("open");
    assert!(pool.is_mountpoint().expect("mounted"));
    pool.check(true).expect("mounted pool passes");
    drop(mount);
    // The disk went away: the path now names the empty mount point directory.
    let err = pool.check(true).expect_err("unmounted");
    assert!(matches!(err, PoolError::RootChanged { .. }), "{err}");
}

#[test]
fn a_read_only_pool_is_refused_until_it_is_writable_again() {
    let fx = Fixture::new();
    let disk = fx.tmp.path().join("ro-disk");
    fs::create_dir(&disk).expect("mkdir");
    let _mount = MountGuard::tmpfs(&disk, c"size=1m");
    let pool = PoolRoot::open("ro", &disk).expect("open");
    pool.check(false).expect("writable");
    let remount = |flags: MountFlags| {
        rustix::mount::mount_remount(&disk, flags, c"size=1m").expect("remount (tests must run as root)")
    };
    remount(MountFlags::RDONLY);
    let err = pool.check(false).expect_err("read-only");
    assert!(matches!(err, PoolError::ReadOnly { .. }), "{err}");
    assert!(err.is_retryable(), "an admin's remount fixes it without a restart");
    assert!(err.to_string().contains("read-only"), "{err}");
    remount(MountFlags::empty());
    pool.check(false).expect("writable again");
}

#[test]
fn bind_mount_of_a_same_filesystem_subdirectory_is_a_mountpoint() {
    let fx = Fixture::new();
    assert!(!fx.pool.is_mountpoint_without_statx_attr().expect("plain"));
    let src = fx.outside().join("src");
    fs::create_dir(&src).expect("mkdir");
    let _mount = MountGuard::bind(&src, &fx.root());
    let pool = PoolRoot::open("bind", &fx.root()).expect("open");
    assert_eq!(pool.dev, fx.pool.dev, "same filesystem");
    assert!(pool.is_mountpoint().expect("statx"));
    assert!(pool.is_mountpoint_without_statx_attr().expect("fallback"));
    pool.check(true).expect("bind mount counts");
}

#[test]
fn a_bind_mount_of_the_root_onto_itself_is_not_a_disk_mounted_there() {
    // What a pod sees of its hostPath volume of the pool path while the host has nothing
    // mounted there: the `mountpoint` option must refuse the pool.
    let fx = Fixture::new();
    let itself = MountGuard::bind(&fx.root(), &fx.root());
    let pool = PoolRoot::open("volume", &fx.root()).expect("open");
    assert!(!pool.is_mountpoint().expect("statx"));
    assert!(!pool.is_mountpoint_without_statx_attr().expect("fallback"));
    let err = pool.check(true).expect_err("nothing mounted over it");
    assert!(matches!(err, PoolError::RootNotMountpoint { .. }), "{err}");
    // The host mounts the disk: it shows over the volume.
    let disk = MountGuard::tmpfs(&fx.root(), c"size=1m");
    let pool = PoolRoot::open("volume", &fx.root()).expect("open");
    assert!(pool.is_mountpoint().expect("statx"));
    pool.check(true).expect("the disk is there");
    drop(disk);
    drop(itself);
}

#[test]
fn stats_report_the_pool_filesystem_sizes() {
    let fx = Fixture::new();
    let _mount = MountGuard::tmpfs(&fx.root(), c"size=4m");
    let pool = PoolRoot::open("disk", &fx.root()).expect("open");
    let stats = pool.stats().expect("stats");
    assert_eq!(stats.total_bytes, 4 << 20);
    assert_eq!(stats.go_total_bytes, 4 << 20);
    assert!(stats.available_bytes <= stats.free_bytes);
    assert!(stats.free_bytes <= stats.total_bytes && stats.free_bytes > 0);
}

// ---- create_volume_dir ----

/// Sets the process umask and restores it; umask is process-wide, so such tests serialise.
struct UmaskGuard {
    old: Mode,
    _lock: std::sync::MutexGuard<'static, ()>,
}

static UMASK_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl UmaskGuard {
    fn set(mask: u32) -> Self {
        let lock = UMASK_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let old = rustix::process::umask(Mode::from_raw_mode(mask));
        UmaskGuard { old, _lock: lock }
    }
}

impl Drop for UmaskGuard {
    fn drop(&mut self) {
        rustix::process::umask(self.old);
    }
}

#[test]
fn create_applies_mode_0777_despite_umask_022() {
    let fx = Fixture::new();
    let created = {
        let _umask = UmaskGuard::set(0o022);
        fx.pool.create_volume_dir(&dir_name("pvc-1"), 0o777)
    };
    assert_eq!(created.expect("create"), Created::New);
    assert_eq!(mode_of(&fx.vol("pvc-1")), 0o777);
    fx.pool.create_volume_dir(&dir_name("pvc-2"), 0o2750).expect("create");
    assert_eq!(mode_of(&fx.vol("pvc-2")), 0o2750);
}

#[test]
fn create_accepts_an_existing_directory_and_resets_its_mode() {
    let fx = Fixture::new();
    fs::create_dir(fx.vol("pvc-1")).expect("mkdir");
    fs::set_permissions(fx.vol("pvc-1"), fs::Permissions::from_mode(0o700)).expect("chmod");
    fs::write(fx.vol("pvc-1").join("data"), b"kept").expect("write");
    let created = fx.pool.create_volume_dir(&dir_name("pvc-1"), 0o777).expect("create");
    assert_eq!(created, Created::Existing);
    assert_eq!(mode_of(&fx.vol("pvc-1")), 0o777);
    assert_eq!(fs::read(fx.vol("pvc-1").join("data")).expect("read"), b"kept");
}

#[test]
fn create_refuses_an_existing_regular_file() {
    let fx = Fixture::new();
    fs::write(fx.vol("pvc-1"), b"not a dir").expect("write");
    fs::set_permissions(fx.vol("pvc-1"), fs::Permissions::from_mode(0o600)).expect("chmod");
    let err = fx.pool.create_volume_dir(&dir_name("pvc-1"), 0o777).expect_err("file");
    assert!(matches!(err, PoolError::VolumeNotDirectory { .. }), "{err}");
    assert!(!err.is_retryable());
    assert_eq!(mode_of(&fx.vol("pvc-1")), 0o600);
    assert_eq!(fs::read(fx.vol("pvc-1")).expect("read"), b"not a dir");
}

#[test]
fn create_refuses_a_symlink_named_like_the_volume_and_leaves_its_target_alone() {
    let fx = Fixture::new();
    let target = fx.outside().join("secret");
    fs::create_dir(&target).expect("mkdir");
    fs::set_permissions(&target, fs::Permissions::from_mode(0o700)).expect("chmod");
    symlink(&target, fx.vol("pvc-1")).expect("symlink");
    let err = fx.pool.create_volume_dir(&dir_name("pvc-1"), 0o777).expect_err("symlink");
    assert!(matches!(err, PoolError::VolumeIsSymlink { .. }), "{err}");
    assert!(err.to_string().contains(&*fx.vol("pvc-1").to_string_lossy()), "{err}");
    assert_eq!(mode_of(&target), 0o700, "target mode must not change");
    assert!(fs::symlink_metadata(fx.vol("pvc-1")).expect("link").is_symlink());
}

#[test]
fn create_refuses_modes_beyond_0o7777() {
    let fx = Fixture::new();
    let err = fx.pool.create_volume_dir(&dir_name("pvc-1"), 0o10777).expect_err("mode");
    assert!(matches!(err, PoolError::InvalidMode { .. }), "{err}");
    assert!(!exists(&fx.vol("pvc-1")));
}

#[test]
fn set_ownership_gives_the_directory_alone_its_owner_group_and_mode() {
    use std::os::unix::fs::MetadataExt;
    let fx = Fixture::new();
    fx.pool.create_volume_dir(&dir_name("pvc-1"), 0o777).expect("create");
    fs::write(fx.vol("pvc-1/data"), b"x").expect("write");
    let file_owner = fs::metadata(fx.vol("pvc-1/data")).expect("stat").uid();
    // chown to another user needs root (CAP_CHOWN), as the provisioner has; as another user only
    // the mode is checked.
    let root = rustix::process::geteuid().is_root();
    let (uid, gid) = if root { (Some(1000), Some(2000)) } else { (None, None) };
    fx.pool.set_ownership(&dir_name("pvc-1"), uid, gid, 0o2770).expect("set ownership");
    let meta = fs::metadata(fx.vol("pvc-1")).expect("stat");
    assert_eq!(mode_of(&fx.vol("pvc-1")), 0o2770, "the set-group-ID bit survives the chown");
    if root {
        assert_eq!((meta.uid(), meta.gid()), (1000, 2000));
    }
    assert_eq!(fs::metadata(fx.vol("pvc-1/data")).expect("stat").uid(), file_owner, "nothing inside changes");

    // A symlink named like the volume is refused and its target left alone.
    let target = fx.outside().join("secret");
    fs::create_dir(&target).expect("mkdir");
    fs::set_permissions(&target, fs::Permissions::from_mode(0o700)).expect("chmod");
    symlink(&target, fx.vol("pvc-2")).expect("symlink");
    assert!(fx.pool.set_ownership(&dir_name("pvc-2"), uid, gid, 0o777).is_err());
    assert_eq!(mode_of(&target), 0o700);
    let err = fx.pool.set_ownership(&dir_name("pvc-1"), None, None, 0o10777).expect_err("mode");
    assert!(matches!(err, PoolError::InvalidMode { .. }), "{err}");
}

#[test]
fn volume_dir_exists_does_not_follow_symlinks() {
    let fx = Fixture::new();
    assert!(!fx.pool.volume_dir_exists(&dir_name("pvc-1")).expect("missing"));
    symlink("/nonexistent/target", fx.vol("pvc-1")).expect("dangling symlink");
    assert!(fx.pool.volume_dir_exists(&dir_name("pvc-1")).expect("dangling"));
    fx.pool.create_volume_dir(&dir_name("pvc-2"), 0o777).expect("create");
    assert!(fx.pool.volume_dir_exists(&dir_name("pvc-2")).expect("dir"));
}

#[test]
fn remove_empty_volume_dir_keeps_data_symlinks_and_files() {
    let fx = Fixture::new();
    fx.pool.create_volume_dir(&dir_name("empty"), 0o777).expect("create");
    fx.pool.remove_empty_volume_dir(&dir_name("empty")).expect("empty");
    assert!(!exists(&fx.vol("empty")));
    fx.pool.remove_empty_volume_dir(&dir_name("empty")).expect("missing is fine");

    fs::create_dir(fx.vol("used")).expect("mkdir");
    fs::write(fx.vol("used/data"), b"x").expect("write");
    let err = fx.pool.remove_empty_volume_dir(&dir_name("used")).expect_err("not empty");
    assert!(matches!(err, PoolError::VolumeNotEmpty { .. }), "{err}");
    assert!(exists(&fx.vol("used/data")));

    fs::create_dir(fx.outside().join("empty")).expect("mkdir");
    symlink(fx.outside().join("empty"), fx.vol("link")).expect("symlink");
    let err = fx.pool.remove_empty_volume_dir(&dir_name("link")).expect_err("symlink");
    assert!(matches!(err, PoolError::VolumeIsSymlink { .. }), "{err}");
    assert!(fx.outside().join("empty").is_dir());

    fs::write(fx.vol("file"), b"").expect("write");
    let err = fx.pool.remove_empty_volume_dir(&dir_name("file")).expect_err("file");
    assert!(matches!(err, PoolError::VolumeNotDirectory { .. }), "{err}");
}

#[test]
fn list_entries_names_everything_under_the_root_that_is_utf8() {
    let fx = Fixture::new();
    fs::create_dir(fx.vol("pvc-1")).expect("mkdir");
    fs::write(fx.vol("file"), b"").expect("write");
    symlink("/nowhere", fx.vol("link")).expect("symlink");
    let odd = OsStr::from_bytes(b"bad-\xff");
    fs::create_dir(fx.root().join(odd)).expect("mkdir");
    let mut names = fx.pool.list_entries().expect("list");
    names.sort();
    assert_eq!(names, ["file", "link", "pvc-1"]);
}

#[test]
fn invalid_names_convert_into_pool_errors() {
    let err: PoolError = VolumeDirName::new("..").expect_err("dots").into();
    assert!(!err.is_retryable());
    assert_eq!(err.label(), "invalid_name");
}

// ---- errors ----

#[test]
fn retry_classes_follow_who_must_act() {
    let p = PathBuf::from("/pool/pvc-1");
    let admin = [
        PoolError::MountInsideVolume { path: p.clone() },
        PoolError::VolumeIsSymlink { path: p.clone() },
        PoolError::VolumeNotDirectory { path: p.clone() },
        PoolError::PermissionDenied { op: "unlink", path: p.clone(), source: Errno::PERM },
        PoolError::Io { op: "unlink", path: p.clone(), source: Errno::ROFS },
    ];
    for e in admin {
        assert!(!e.is_retryable(), "{e}");
        assert!(e.to_string().contains("/pool/pvc-1"), "{e}");
    }
    for errno in [Errno::BUSY, Errno::IO, Errno::NOSPC, Errno::MFILE] {
        let e = PoolError::Io { op: "unlink", path: p.clone(), source: errno };
        assert!(e.is_retryable(), "{e}");
        assert!(e.to_string().contains("retried automatically"), "{e}");
    }
    assert!(PoolError::TreeChanged { path: p }.is_retryable());
}

#[test]
fn permission_errors_name_the_file_and_the_immutable_attribute() {
    let e = fs_error("unlink", PathBuf::from("/pool/pvc-1/locked"), Errno::PERM);
    let msg = e.to_string();
    assert!(msg.contains("/pool/pvc-1/locked") && msg.contains("chattr -i"), "{msg}");
    assert_eq!(e.label(), "permission_denied");
}

#[test]
fn very_deep_paths_in_messages_keep_head_and_tail() {
    let fx = Fixture::new();
    let mut walker = Walker::new(&fx.pool, 4, 3);
    for i in 0..100 {
        walker.stack.push(Frame {
            name: CString::new(format!("n{i}")).expect("name"),
            dev: 0,
            ino: 0,
            dir: None,
            rescans: 0,
            subvolume_id: None,
        });
    }
    let path = walker.path_of(Some(99), Some(c"leaf")).display().to_string();
    assert!(path.starts_with(&format!("{}/n0/n1/", fx.root().display())), "{path}");
    assert!(path.contains("more levels") && path.ends_with("/n99/leaf"), "{path}");
}

mod bookkeeping;
mod marker;
mod removal;
mod snapshots;

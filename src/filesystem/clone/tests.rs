//! Clones on real filesystems: ext4 (bytes), XFS and btrfs (reflinks), a btrfs subvolume
//! (snapshot), each on a loop device of its own.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A filesystem of type `fstype` on a loop device, mounted at `<tmp>/pool` with `<tmp>/outside`
/// beside it; unmounted (and the loop device released) when dropped.
struct LoopPool {
    tmp: tempfile::TempDir,
    pool: Option<PoolRoot>,
}

/// Installs the mkfs of `fstype` when missing (Debian packages; CI installs them in `.ci/run`).
fn ensure_mkfs(fstype: &str) {
    let tool = format!("mkfs.{fstype}");
    let found =
        Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|o| o.status.success());
    if !found {
        let package = match fstype {
            "btrfs" => "btrfs-progs",
            "xfs" => "xfsprogs",
            _ => "e2fsprogs",
        };
        run(Command::new("apt-get").args(["install", "-y", "-qq", "--no-install-recommends", package]));
    }
}

impl LoopPool {
    fn new(fstype: &str) -> LoopPool {
        ensure_mkfs(fstype);
        let tmp = tempfile::tempdir().expect("tempdir");
        let image = tmp.path().join("image");
        // 320 MiB: XFS refuses smaller filesystems; the image is sparse.
        fs::File::create(&image).expect("image").set_len(320 << 20).expect("size");
        let mut mkfs = Command::new(format!("mkfs.{fstype}"));
        match fstype {
            "ext4" => mkfs.args(["-q", "-F"]),
            "xfs" => mkfs.args(["-q", "-f", "-m", "reflink=1"]),
            _ => mkfs.args(["-q", "-f"]),
        };
        run(mkfs.arg(&image));
        let root = tmp.path().join("pool");
        fs::create_dir_all(&root).expect("mount point");
        fs::create_dir_all(tmp.path().join("outside")).expect("outside");
        run(Command::new("mount").arg("-o").arg("loop").arg(&image).arg(&root));
        let pool = PoolRoot::open("test", &root).expect("open pool");
        LoopPool { tmp, pool: Some(pool) }
    }

    fn pool(&self) -> &PoolRoot {
        self.pool.as_ref().expect("pool")
    }

    fn root(&self) -> PathBuf {
        self.tmp.path().join("pool")
    }

    fn outside(&self) -> PathBuf {
        self.tmp.path().join("outside")
    }
}

impl Drop for LoopPool {
    fn drop(&mut self) {
        self.pool.take();
        // Detaching the mount also frees the loop device (mount -o loop sets autoclear).
        let _ = Command::new("umount").arg("-l").arg(self.root()).status();
    }
}

fn name(s: &str) -> VolumeDirName {
    VolumeDirName::new(s).expect("valid name")
}

const NODE: &str = "node-a";
const SPARSE_SIZE: u64 = 64 << 20;

/// A volume with the shapes a clone must keep: files with owners, modes and old times, a
/// symlink pointing outside the pool, a hard-link pair, a sparse file, a FIFO, nested dirs.
fn fill_source(lp: &LoopPool, volume: &Path) {
    fs::create_dir_all(volume.join("nested/deeper")).expect("dirs");
    fs::write(volume.join("file"), b"hello clone").expect("file");
    fs::write(volume.join("nested/deeper/data"), vec![7u8; 300_000]).expect("data");
    fs::write(volume.join("nested/link-a"), b"linked").expect("link-a");
    fs::hard_link(volume.join("nested/link-a"), volume.join("link-b")).expect("hard link");
    fs::write(lp.outside().join("target"), b"outside, untouched").expect("outside");
    symlink(lp.outside().join("target"), volume.join("escape")).expect("symlink");
    symlink("nested/deeper/data", volume.join("relative")).expect("relative symlink");
    run(Command::new("mkfifo").arg(volume.join("fifo")));
    let sparse = fs::File::create(volume.join("sparse")).expect("sparse");
    sparse.set_len(SPARSE_SIZE).expect("sparse size");
    rustix::io::pwrite(&sparse, &[1u8; 4096], 0).expect("head");
    rustix::io::pwrite(&sparse, &[2u8; 4096], 32 << 20).expect("middle");
    drop(sparse);
    fs::set_permissions(volume.join("file"), fs::Permissions::from_mode(0o4751)).expect("chmod");
    fs::set_permissions(volume.join("nested/deeper"), fs::Permissions::from_mode(0o555)).expect("chmod");
    rustix::fs::chown(
        volume.join("file").as_path(),
        Some(rustix::fs::Uid::from_raw(1234)),
        Some(rustix::fs::Gid::from_raw(5678)),
    )
    .expect("chown");
    // `touch -h` sets times without following symlinks; old times prove they were copied.
    for entry in ["file", "escape", "nested/deeper/data", "sparse", "fifo", "nested/deeper", "nested", ""] {
        run(Command::new("touch").args(["-h", "-d", "2001-02-03 04:05:06.789"]).arg(volume.join(entry)));
    }
}

/// Every entry of `a` and `b` agrees in type, content, mode, owner, mtime, link count and,
/// for symlinks, target.
fn assert_identical(a: &Path, b: &Path) {
    let (ma, mb) = (fs::symlink_metadata(a).expect("a"), fs::symlink_metadata(b).expect("b"));
    let what = b.display();
    assert_eq!(ma.file_type(), mb.file_type(), "{what}: type");
    assert_eq!(ma.mode(), mb.mode(), "{what}: mode");
    assert_eq!((ma.uid(), ma.gid()), (mb.uid(), mb.gid()), "{what}: owner");
    assert_eq!((ma.mtime(), ma.mtime_nsec()), (mb.mtime(), mb.mtime_nsec()), "{what}: mtime");
    if ma.file_type().is_dir() {
        let mut names: Vec<_> = fs::read_dir(a).expect("list").map(|e| e.expect("entry").file_name()).collect();
        let mut other: Vec<_> = fs::read_dir(b).expect("list").map(|e| e.expect("entry").file_name()).collect();
        names.sort();
        other.sort();
        assert_eq!(names, other, "{what}: entries");
        for n in names {
            assert_identical(&a.join(&n), &b.join(&n));
        }
        return;
    }
    assert_eq!(ma.nlink(), mb.nlink(), "{what}: link count");
    if ma.file_type().is_symlink() {
        assert_eq!(fs::read_link(a).expect("a"), fs::read_link(b).expect("b"), "{what}: target");
    } else if ma.file_type().is_file() {
        assert_eq!(ma.len(), mb.len(), "{what}: size");
        assert!(fs::read(a).expect("a") == fs::read(b).expect("b"), "{what}: content");
    }
}

/// Whether `filefrag -v` reports a shared extent in `path`.
fn has_shared_extent(path: &Path) -> bool {
    run(Command::new("filefrag").arg("-v").arg(path)).contains("shared")
}

/// Clones `src` into `dst` on `fstype` and checks the copy; returns the report.
fn clone_and_check(lp: &LoopPool, source_dir: &Path) -> CloneReport {
    let report = lp.pool().clone_volume(&name("pvc-src"), &name("pvc-dst"), &name(NODE)).expect("clone");
    let copy = lp.root().join("pvc-dst");
    assert_identical(source_dir, &copy);
    assert_eq!(report.created, Created::New);
    // Hard links stay one inode; the symlink was copied, not followed.
    assert_eq!(
        fs::metadata(copy.join("link-b")).expect("b").ino(),
        fs::metadata(copy.join("nested/link-a")).expect("a").ino()
    );
    assert_eq!(fs::read(lp.outside().join("target")).expect("outside"), b"outside, untouched");
    assert_eq!(fs::read_dir(lp.outside()).expect("outside").count(), 1, "nothing written outside");
    // Holes stay holes.
    let sparse = fs::metadata(copy.join("sparse")).expect("sparse");
    assert_eq!(sparse.len(), SPARSE_SIZE);
    assert!(sparse.blocks() * 512 < 1 << 20, "sparse file allocates {} bytes", sparse.blocks() * 512);
    // Nothing stays in staging.
    let staging = lp.root().join(CLONE_STAGING_DIR).join(NODE);
    assert!(!staging.exists() || fs::read_dir(&staging).expect("staging").count() == 0, "staging left behind");
    report
}

#[test]
fn ext4_clone_copies_bytes_and_keeps_every_shape() {
    let lp = LoopPool::new("ext4");
    let source = lp.root().join("pvc-src");
    fill_source(&lp, &source);
    let report = clone_and_check(&lp, &source);
    assert_eq!(report.method, CopyMethod::Bytes);
    assert_eq!(report.reflinked, 0);
    assert!(report.byte_copied >= 4, "{report:?}");
}

#[test]
fn xfs_clone_shares_extents() {
    let lp = LoopPool::new("xfs");
    let source = lp.root().join("pvc-src");
    fill_source(&lp, &source);
    let report = clone_and_check(&lp, &source);
    assert_eq!(report.method, CopyMethod::Reflink);
    assert_eq!(report.byte_copied, 0, "{report:?}");
    assert!(has_shared_extent(&lp.root().join("pvc-dst/nested/deeper/data")));
}

#[test]
fn btrfs_clone_of_a_directory_shares_extents() {
    let lp = LoopPool::new("btrfs");
    let source = lp.root().join("pvc-src");
    fill_source(&lp, &source);
    run(&mut Command::new("sync"));
    let report = clone_and_check(&lp, &source);
    assert_eq!(report.method, CopyMethod::Reflink);
    assert_eq!(report.byte_copied, 0, "{report:?}");
    run(&mut Command::new("sync"));
    assert!(has_shared_extent(&lp.root().join("pvc-dst/nested/deeper/data")));
}

#[test]
fn btrfs_clone_of_a_subvolume_is_a_snapshot() {
    let lp = LoopPool::new("btrfs");
    let source = lp.root().join("pvc-src");
    run(Command::new("btrfs").args(["-q", "subvolume", "create"]).arg(&source));
    fill_source(&lp, &source);
    let report = clone_and_check(&lp, &source);
    assert_eq!(report.method, CopyMethod::Snapshot);
    assert_eq!(fs::metadata(lp.root().join("pvc-dst")).expect("dst").ino(), BTRFS_SUBVOLUME_ROOT_INO);
    run(&mut Command::new("sync"));
    assert!(has_shared_extent(&lp.root().join("pvc-dst/nested/deeper/data")));
}

#[test]
fn a_mount_inside_the_source_stops_the_clone_and_leaves_no_volume() {
    let lp = LoopPool::new("ext4");
    let source = lp.root().join("pvc-src");
    fs::create_dir_all(source.join("a/mnt")).expect("dirs");
    fs::write(source.join("a/file"), b"x").expect("file");
    rustix::mount::mount("tmpfs", source.join("a/mnt"), "tmpfs", rustix::mount::MountFlags::empty(), None)
        .expect("mount");
    fs::write(source.join("a/mnt/secret"), b"other filesystem").expect("secret");
    let result = lp.pool().clone_volume(&name("pvc-src"), &name("pvc-dst"), &name(NODE));
    rustix::mount::unmount(source.join("a/mnt"), rustix::mount::UnmountFlags::DETACH).expect("umount");
    assert!(matches!(result, Err(PoolError::MountInsideVolume { .. })), "{result:?}");
    assert!(!lp.root().join("pvc-dst").exists(), "no volume for an incomplete copy");
    // The failed copy removed its partial copy at once: nothing waits for a sweep.
    assert_eq!(fs::read_dir(lp.root().join(CLONE_STAGING_DIR).join(NODE)).expect("staging").count(), 0);
    assert_eq!(lp.pool().sweep_clone_staging(&name(NODE)).expect("sweep"), 0);
}

#[test]
fn an_interrupted_copy_is_started_afresh_and_a_finished_one_is_kept() {
    let lp = LoopPool::new("ext4");
    let source = lp.root().join("pvc-src");
    fs::create_dir_all(&source).expect("source");
    fs::write(source.join("file"), b"complete").expect("file");
    // What a kill mid-copy leaves: a half-filled staging directory.
    let leftover = lp.root().join(CLONE_STAGING_DIR).join(NODE).join("pvc-dst");
    fs::create_dir_all(leftover.join("junk")).expect("leftover");
    fs::write(leftover.join("file"), b"comp").expect("partial");
    let report = lp.pool().clone_volume(&name("pvc-src"), &name("pvc-dst"), &name(NODE)).expect("clone");
    assert_eq!(report.created, Created::New);
    assert_identical(&source, &lp.root().join("pvc-dst"));
    assert!(!leftover.exists());
    // A retry after the rename (a crash before the PV) finds the copy complete.
    let again = lp.pool().clone_volume(&name("pvc-src"), &name("pvc-dst"), &name(NODE)).expect("again");
    assert_eq!(again.created, Created::Existing);
    assert_eq!(fs::read(lp.root().join("pvc-dst/file")).expect("file"), b"complete");
}

#[test]
fn a_symlink_in_place_of_the_source_is_refused() {
    let lp = LoopPool::new("ext4");
    fs::write(lp.outside().join("x"), b"x").expect("outside");
    symlink(lp.outside(), lp.root().join("pvc-src")).expect("symlink");
    let result = lp.pool().clone_volume(&name("pvc-src"), &name("pvc-dst"), &name(NODE));
    assert!(matches!(result, Err(PoolError::VolumeNotDirectory { .. })), "{result:?}");
    assert!(!lp.root().join("pvc-dst").exists());
}

#[test]
fn a_device_node_in_the_source_is_refused_with_the_reason() {
    let lp = LoopPool::new("ext4");
    let source = lp.root().join("pvc-src");
    fs::create_dir_all(&source).expect("source");
    // The null device's numbers (1, 3).
    rustix::fs::mknodat(
        rustix::fs::CWD,
        source.join("null").as_path(),
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .expect("mknod");
    let result = lp.pool().clone_volume(&name("pvc-src"), &name("pvc-dst"), &name(NODE));
    assert!(matches!(&result, Err(PoolError::DeviceInVolume { path }) if path.ends_with("null")), "{result:?}");
    assert!(!lp.root().join("pvc-dst").exists());
    assert_eq!(fs::read_dir(lp.root().join(CLONE_STAGING_DIR).join(NODE)).expect("staging").count(), 0);
    assert_eq!(lp.pool().sweep_clone_staging(&name(NODE)).expect("sweep"), 0);
}

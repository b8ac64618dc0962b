//! Removal of a volume's tree: symlinks, mounts, permissions, depth, concurrent changes.

use super::*;

// ---- remove_volume_dir ----

#[test]
fn remove_of_a_missing_volume_is_already_gone() {
    let fx = Fixture::new();
    assert_eq!(fx.remove("pvc-1").expect("remove"), Removal::AlreadyGone);
}

#[test]
fn remove_deletes_a_nested_tree_and_counts_names() {
    let fx = Fixture::new();
    let v = fx.vol("pvc-1");
    fs::create_dir_all(v.join("a/b/c")).expect("mkdir");
    fs::write(v.join("a/b/c/f"), b"x").expect("write");
    fs::write(v.join("top"), b"x").expect("write");
    fs::create_dir(fx.vol("pvc-2")).expect("neighbour");
    // pvc-1, a, b, c, f, top
    assert_eq!(fx.remove("pvc-1").expect("remove"), Removal::Removed { entries: 6 });
    assert!(!exists(&v));
    assert!(fx.vol("pvc-2").is_dir(), "neighbour volume untouched");
    assert_eq!(fx.remove("pvc-1").expect("again"), Removal::AlreadyGone);
}

#[test]
fn remove_unlinks_a_symlinked_volume_dir_and_keeps_its_target() {
    for openat2 in [true, false] {
        let fx = Fixture::new();
        fx.pool.openat2.store(openat2, Ordering::Relaxed);
        let target = fx.outside().join("data");
        fs::create_dir(&target).expect("mkdir");
        fs::write(target.join("precious"), b"keep").expect("write");
        symlink(&target, fx.vol("pvc-1")).expect("symlink");
        let removal = fx.remove("pvc-1").expect("remove");
        assert_eq!(removal, Removal::Removed { entries: 1 }, "openat2={openat2}");
        assert!(!exists(&fx.vol("pvc-1")), "the link itself is removed");
        assert_eq!(fs::read(target.join("precious")).expect("read"), b"keep");
    }
}

#[test]
fn remove_keeps_the_target_of_a_symlink_to_a_file_outside_the_pool() {
    let fx = Fixture::new();
    let target = fx.outside().join("passwd");
    fs::write(&target, b"root:x:0:0").expect("write");
    fs::create_dir(fx.vol("pvc-1")).expect("mkdir");
    symlink(&target, fx.vol("pvc-1").join("link")).expect("symlink");
    fx.remove("pvc-1").expect("remove");
    assert_eq!(fs::read(&target).expect("read"), b"root:x:0:0");
}

#[test]
fn remove_keeps_the_contents_of_symlinked_directories_outside_the_volume() {
    for openat2 in [true, false] {
        let fx = Fixture::new();
        fx.pool.openat2.store(openat2, Ordering::Relaxed);
        let target = fx.outside().join("dir");
        fs::create_dir_all(target.join("sub")).expect("mkdir");
        fs::write(target.join("sub/f"), b"keep").expect("write");
        fs::create_dir(fx.vol("other")).expect("neighbour");
        fs::write(fx.vol("other/f"), b"keep").expect("write");
        fs::create_dir_all(fx.vol("pvc-1/a")).expect("mkdir");
        symlink(&target, fx.vol("pvc-1/a/abs")).expect("absolute link");
        symlink("../../other", fx.vol("pvc-1/a/rel")).expect("relative link");
        symlink("../../../outside/dir/sub", fx.vol("pvc-1/a/up")).expect("climbing link");
        let removal = fx.remove("pvc-1").expect("remove");
        assert_eq!(removal, Removal::Removed { entries: 5 }, "openat2={openat2}");
        assert_eq!(fs::read(target.join("sub/f")).expect("read"), b"keep");
        assert_eq!(fs::read(fx.vol("other/f")).expect("read"), b"keep");
    }
}

#[test]
fn remove_unlinks_special_and_read_only_files_without_opening_them() {
    let fx = Fixture::new();
    let v = fx.vol("pvc-1");
    fs::create_dir(&v).expect("mkdir");
    let dirfd = rustix::fs::open(&v, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).expect("open");
    // A FIFO without a reader: opening it in either direction would block forever.
    rustix::fs::mknodat(&dirfd, "fifo", FileType::Fifo, Mode::from_raw_mode(0o666), 0).expect("mkfifo");
    rustix::fs::mknodat(
        &dirfd,
        "null",
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .expect("mknod");
    let _listener = std::os::unix::net::UnixListener::bind(v.join("sock")).expect("socket");
    fs::write(v.join("ro"), b"x").expect("write");
    fs::set_permissions(v.join("ro"), fs::Permissions::from_mode(0o000)).expect("chmod");
    // A hard link to a file outside the tree: the outside name and content must survive.
    let outside = fx.outside().join("shared");
    fs::write(&outside, b"shared content").expect("write");
    fs::set_permissions(&outside, fs::Permissions::from_mode(0o444)).expect("chmod");
    fs::hard_link(&outside, v.join("hardlink")).expect("link");
    drop(dirfd);

    let (tx, rx) = mpsc::channel();
    let root = fx.root();
    std::thread::spawn(move || {
        let pool = PoolRoot::open("test", &root).expect("open");
        let _ = tx.send(pool.remove_volume_dir(&dir_name("pvc-1")).map_err(|e| e.to_string()));
    });
    let removal = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("removal blocked: a FIFO or device was opened")
        .expect("remove");
    assert_eq!(removal, Removal::Removed { entries: 6 });
    assert_eq!(fs::read(&outside).expect("read"), b"shared content");
    let meta = fs::metadata(&outside).expect("stat");
    assert_eq!((meta.nlink(), meta.mode() & 0o7777), (1, 0o444));
}

#[test]
fn remove_handles_directories_without_write_or_search_permission() {
    let fx = Fixture::new();
    let v = fx.vol("pvc-1");
    for d in ["r-x", "none", "wx", "r-x/inner"] {
        fs::create_dir_all(v.join(d)).expect("mkdir");
        fs::write(v.join(d).join("f"), b"x").expect("write");
    }
    for (d, mode) in [("r-x/inner", 0o000), ("r-x", 0o500), ("none", 0o000), ("wx", 0o300)] {
        fs::set_permissions(v.join(d), fs::Permissions::from_mode(mode)).expect("chmod");
    }
    fs::set_permissions(&v, fs::Permissions::from_mode(0o500)).expect("chmod");
    fx.remove("pvc-1").expect("remove");
    assert!(!exists(&v));
}

const UNPRIVILEGED_ROOT_ENV: &str = "HOSTPATH_POOL_TEST_UNPRIVILEGED_ROOT";
const UNPRIVILEGED_OK: &str = "UNPRIVILEGED-REMOVAL-OK";
const NOBODY: u32 = 65534;

/// Root's CAP_DAC_OVERRIDE hides missing permissions, so the permission rule is proven by
/// re-running this test binary as `nobody` (owner of the tree, no capabilities).
#[test]
fn remove_fixes_directory_permissions_when_running_without_capabilities() {
    let fx = Fixture::new();
    fs::set_permissions(fx.tmp.path(), fs::Permissions::from_mode(0o755)).expect("chmod");
    let v = fx.vol("vol");
    for d in ["r-x", "r-x/inner", "none", "wx", "r--"] {
        fs::create_dir_all(v.join(d)).expect("mkdir");
        fs::write(v.join(d).join("f"), b"x").expect("write");
    }
    let mut all = vec![fx.root(), v.clone()];
    for d in ["r-x", "r-x/inner", "none", "wx", "r--"] {
        all.push(v.join(d));
        all.push(v.join(d).join("f"));
    }
    for path in &all {
        std::os::unix::fs::lchown(path, Some(NOBODY), Some(NOBODY)).expect("chown");
    }
    let modes = [("r-x/inner", 0o000), ("r-x", 0o500), ("none", 0o000), ("wx", 0o300), ("r--", 0o400), ("", 0o500)];
    for (d, mode) in modes {
        fs::set_permissions(v.join(d), fs::Permissions::from_mode(mode)).expect("chmod");
    }
    // A copy of this binary that nobody may execute, wherever the target directory lives;
    // the original if the temporary directory is mounted noexec.
    let original = std::env::current_exe().expect("current exe");
    let copy = fx.tmp.path().join("pool-tests");
    fs::copy(&original, &copy).expect("copy exe");
    fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).expect("chmod");
    let test_name = format!(
        "{}::unprivileged_removal_child",
        module_path!().split_once("::").map_or(module_path!(), |(_, rest)| rest)
    );
    let run_as_nobody = |exe: &Path| {
        Command::new(exe)
            .args([test_name.as_str(), "--exact", "--ignored", "--nocapture"])
            .env(UNPRIVILEGED_ROOT_ENV, fx.root())
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
    };
    let out = match run_as_nobody(&copy) {
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => run_as_nobody(&original),
        other => other,
    }
    .expect("run the test binary as nobody");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && stdout.contains(UNPRIVILEGED_OK), "child failed:\n{stdout}\n{stderr}");
    assert!(!exists(&v));
}

#[test]
#[ignore = "run as nobody by remove_fixes_directory_permissions_when_running_without_capabilities"]
fn unprivileged_removal_child() {
    let Some(root) = std::env::var_os(UNPRIVILEGED_ROOT_ENV) else {
        return;
    };
    assert_ne!(rustix::process::getuid().as_raw(), 0, "must not run as root");
    let pool = PoolRoot::open("test", Path::new(&root)).expect("open");
    let removal = pool.remove_volume_dir(&dir_name("vol")).expect("remove");
    assert_eq!(removal, Removal::Removed { entries: 11 });
    println!("{UNPRIVILEGED_OK}");
}

/// Clears the immutable attribute again so the temporary directory can be cleaned up.
struct ImmutableGuard(PathBuf);

impl Drop for ImmutableGuard {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

#[test]
fn remove_reports_an_immutable_file_by_name() {
    let fx = Fixture::new();
    let locked = fx.vol("pvc-1/sub/locked");
    fs::create_dir_all(fx.vol("pvc-1/sub")).expect("mkdir");
    fs::write(&locked, b"x").expect("write");
    let Ok(status) = Command::new("chattr").arg("+i").arg(&locked).status() else {
        eprintln!("chattr is not installed; skipping");
        return;
    };
    let _guard = ImmutableGuard(locked.clone());
    if !status.success() {
        eprintln!("this filesystem has no immutable attribute; skipping");
        return;
    }
    let err = fx.remove("pvc-1").expect_err("immutable file");
    assert!(matches!(err, PoolError::PermissionDenied { ref path, .. } if *path == locked), "{err}");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("chattr -i"), "{err}");
}

#[test]
fn remove_stops_at_a_tmpfs_mounted_inside_the_volume() {
    for openat2 in [true, false] {
        let fx = Fixture::new();
        fx.pool.openat2.store(openat2, Ordering::Relaxed);
        let mnt = fx.vol("pvc-1/a/mnt");
        fs::create_dir_all(&mnt).expect("mkdir");
        let mount = MountGuard::tmpfs(&mnt, c"size=1m");
        fs::write(mnt.join("keep"), b"other filesystem").expect("write");
        let err = fx.remove("pvc-1").expect_err("mount inside");
        assert!(matches!(err, PoolError::MountInsideVolume { ref path } if *path == mnt), "{err}");
        assert!(!err.is_retryable());
        assert!(err.to_string().contains(&format!("umount {}", mnt.display())), "{err}");
        assert_eq!(fs::read(mnt.join("keep")).expect("read"), b"other filesystem");
        drop(mount);
        fx.remove("pvc-1").expect("remove after unmount");
        assert!(!exists(&fx.vol("pvc-1")));
    }
}

#[test]
fn remove_stops_at_a_bind_mount_from_the_same_filesystem() {
    for openat2 in [true, false] {
        let fx = Fixture::new();
        fx.pool.openat2.store(openat2, Ordering::Relaxed);
        fs::create_dir(fx.vol("pvc-other")).expect("mkdir");
        fs::write(fx.vol("pvc-other/data"), b"neighbour").expect("write");
        let at = fx.vol("pvc-1/bind");
        fs::create_dir_all(&at).expect("mkdir");
        let _mount = MountGuard::bind(&fx.vol("pvc-other"), &at);
        let err = fx.remove("pvc-1").expect_err("bind mount inside");
        assert!(matches!(err, PoolError::MountInsideVolume { .. }), "openat2={openat2}: {err}");
        assert_eq!(fs::read(fx.vol("pvc-other/data")).expect("read"), b"neighbour");
    }
}

#[test]
fn remove_stops_at_a_file_bind_mounted_inside_the_volume() {
    let fx = Fixture::new();
    let outside = fx.outside().join("file");
    fs::write(&outside, b"keep").expect("write");
    fs::create_dir(fx.vol("pvc-1")).expect("mkdir");
    fs::write(fx.vol("pvc-1/f"), b"").expect("write");
    let _mount = MountGuard::bind(&outside, &fx.vol("pvc-1/f"));
    let err = fx.remove("pvc-1").expect_err("file mount");
    assert!(matches!(err, PoolError::MountInsideVolume { .. }), "{err}");
    assert_eq!(fs::read(&outside).expect("read"), b"keep");
}

#[test]
fn remove_refuses_a_volume_dir_that_is_itself_a_mount_point() {
    for openat2 in [true, false] {
        let fx = Fixture::new();
        fx.pool.openat2.store(openat2, Ordering::Relaxed);
        fs::create_dir(fx.vol("pvc-1")).expect("mkdir");
        let _mount = MountGuard::tmpfs(&fx.vol("pvc-1"), c"size=1m");
        fs::write(fx.vol("pvc-1/keep"), b"x").expect("write");
        let err = fx.remove("pvc-1").expect_err("mounted volume");
        assert!(matches!(err, PoolError::MountInsideVolume { .. }), "{err}");
        assert!(exists(&fx.vol("pvc-1/keep")));
    }
}

#[test]
fn remove_handles_a_tree_10000_levels_deep() {
    let fx = Fixture::new();
    fs::create_dir(fx.vol("pvc-1")).expect("mkdir");
    let names = make_deep_tree(&fx.vol("pvc-1"), 10_000);
    // 20,000 bytes of path: beyond PATH_MAX, so only descriptor-relative calls reach the bottom.
    let mut walker = Walker::new(&fx.pool, OPEN_DIR_WINDOW, MAX_ANCHORS);
    let removal = walker.remove(&dir_name("pvc-1")).expect("remove");
    assert_eq!(removal, Removal::Removed { entries: names + 1 });
    assert!(!exists(&fx.vol("pvc-1")));
    assert!(walker.max_open_dirs <= 1 + OPEN_DIR_WINDOW + MAX_ANCHORS);
    assert!(walker.reopened < 50_000, "{} re-opens", walker.reopened);
}

#[test]
fn remove_keeps_open_descriptors_bounded_and_reopens_ancestors_by_name() {
    let fx = Fixture::new();
    fs::create_dir(fx.vol("pvc-1")).expect("mkdir");
    let names = make_deep_tree(&fx.vol("pvc-1"), 300);
    let mut walker = Walker::new(&fx.pool, 4, 16);
    let removal = walker.remove(&dir_name("pvc-1")).expect("remove");
    assert_eq!(removal, Removal::Removed { entries: names + 1 });
    assert!(walker.max_open_dirs <= 1 + 4 + 16, "{} open", walker.max_open_dirs);
    assert!(walker.reopened > 0, "the deep levels must have been evicted");
    // Anchors keep re-opening linear-ish: without them it would be about 300^2 / 8 = 11,250 (75 re-open walks of 150 levels on average).
    assert!(walker.reopened < 3_000, "{} re-opens", walker.reopened);
    assert!(!exists(&fx.vol("pvc-1")));
}

#[test]
fn remove_handles_100000_entries_in_one_directory() {
    let fx = Fixture::new();
    fs::create_dir(fx.vol("pvc-1")).expect("mkdir");
    let dirfd = rustix::fs::open(fx.vol("pvc-1"), OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).expect("open");
    for i in 0..100_000 {
        rustix::fs::mknodat(&dirfd, format!("file-{i}"), FileType::RegularFile, Mode::from_raw_mode(0o644), 0)
            .expect("mknod");
    }
    drop(dirfd);
    let removal = fx.remove("pvc-1").expect("remove");
    assert_eq!(removal, Removal::Removed { entries: 100_001 });
    assert!(!exists(&fx.vol("pvc-1")));
}

#[test]
fn entries_that_vanish_before_removal_are_ignored() {
    let fx = Fixture::new();
    let mut walker = Walker::new(&fx.pool, 4, 3);
    for hint in [FileType::RegularFile, FileType::Directory, FileType::Unknown, FileType::Symlink] {
        let step = walker.remove_entry(None, c"vanished", hint, 0).expect("vanished");
        assert_eq!(step, Step::Gone, "{hint:?}");
    }
}

#[test]
fn wrong_type_hints_from_getdents_are_corrected() {
    let fx = Fixture::new();
    fs::create_dir_all(fx.vol("dir/sub")).expect("mkdir");
    fs::write(fx.vol("file"), b"x").expect("write");
    let mut walker = Walker::new(&fx.pool, 4, 3);
    assert_eq!(walker.remove_entry(None, c"file", FileType::Directory, 0).expect("file"), Step::Unlinked);
    assert_eq!(walker.remove_entry(None, c"dir", FileType::RegularFile, 0).expect("dir"), Step::Descended);
    assert!(!exists(&fx.vol("file")));
}

/// getdents said "directory" but a symlink was swapped in before the open: the open must
/// refuse to follow it and the name must be unlinked, whatever the link points to.
#[test]
fn a_symlink_swapped_in_for_a_directory_is_unlinked_not_followed() {
    for openat2 in [true, false] {
        let fx = Fixture::new();
        fx.pool.openat2.store(openat2, Ordering::Relaxed);
        let target = fx.outside().join("dir");
        fs::create_dir(&target).expect("mkdir");
        fs::write(target.join("keep"), b"keep").expect("write");
        fs::set_permissions(&target, fs::Permissions::from_mode(0o500)).expect("chmod");
        symlink(&target, fx.vol("abs")).expect("symlink");
        symlink("../outside/dir", fx.vol("rel")).expect("symlink");
        let mut walker = Walker::new(&fx.pool, 4, 3);
        for link in [c"abs", c"rel"] {
            let step = walker.remove_entry(None, link, FileType::Directory, 0);
            assert_eq!(step.expect("unlink"), Step::Unlinked, "openat2={openat2}");
        }
        // The same race with a FIFO: O_DIRECTORY refuses it before a FIFO open could block.
        rustix::fs::mknodat(&fx.pool.fd, "fifo", FileType::Fifo, Mode::from_raw_mode(0o600), 0).expect("mkfifo");
        let step = walker.remove_entry(None, c"fifo", FileType::Directory, 0);
        assert_eq!(step.expect("unlink fifo"), Step::Unlinked);
        assert!(walker.stack.is_empty(), "nothing was entered");
        assert_eq!(fs::read(target.join("keep")).expect("read"), b"keep");
        assert_eq!(mode_of(&target), 0o500, "the target was not chmodded");
        assert!(!exists(&fx.vol("abs")) && !exists(&fx.vol("rel")));
    }
}

#[test]
fn an_evicted_directory_replaced_meanwhile_is_not_reopened() {
    let fx = Fixture::new();
    fs::create_dir_all(fx.vol("pvc-1/a/b/c")).expect("mkdir");
    let mut walker = Walker::new(&fx.pool, 64, 64);
    for (parent, name) in [(None, c"pvc-1"), (Some(0), c"a"), (Some(1), c"b")] {
        let step = walker.remove_entry(parent, name, FileType::Unknown, 0).expect("descend");
        assert_eq!(step, Step::Descended);
    }
    walker.close(1);
    walker.close(2);
    fs::rename(fx.vol("pvc-1/a"), fx.outside().join("moved")).expect("rename");
    fs::create_dir_all(fx.vol("pvc-1/a/b")).expect("mkdir");
    let err = walker.ensure_open(2).expect_err("another directory");
    assert!(matches!(err, PoolError::TreeChanged { .. }), "{err}");
    assert!(err.is_retryable());
    assert!(exists(&fx.outside().join("moved/b/c")));
}

#[test]
fn a_directory_refilled_after_listing_is_listed_again() {
    let fx = Fixture::new();
    fs::create_dir(fx.vol("pvc-1")).expect("mkdir");
    let mut walker = Walker::new(&fx.pool, 64, 64);
    let step = walker.remove_entry(None, c"pvc-1", FileType::Unknown, 0).expect("descend");
    assert_eq!(step, Step::Descended);
    while let Some(entry) = walker.stack[0].dir.as_mut().and_then(Dir::read) {
        entry.expect("read");
    }
    fs::write(fx.vol("pvc-1/late"), b"x").expect("write");
    walker.finish_top().expect("rmdir fails, the directory is listed again");
    assert_eq!(walker.stack.len(), 1);
    assert_eq!(walker.stack[0].rescans, 1);
    walker.drain().expect("drain");
    assert!(!exists(&fx.vol("pvc-1")));
    assert_eq!(walker.entries, 2);
}

#[test]
fn concurrent_removals_of_the_same_volume_all_succeed() {
    let fx = Fixture::new();
    for d in 0..50 {
        let dir = fx.vol("pvc-1").join(format!("d{d}"));
        fs::create_dir_all(&dir).expect("mkdir");
        for f in 0..200 {
            fs::write(dir.join(format!("f{f}")), b"").expect("write");
        }
    }
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..4).map(|_| s.spawn(|| fx.remove("pvc-1"))).collect();
        for w in workers {
            w.join().expect("thread").expect("concurrent removal");
        }
    });
    assert!(!exists(&fx.vol("pvc-1")));
}

//! The directories the provisioner keeps its own work in (`.hpp-trash`, `.hpp-deleting` and its
//! per-node and per-PV levels, `.hpp-clones/<node>`), when someone who can write the pool root
//! puts a symlink, a file, a bind mount or another directory in their place: nothing outside
//! them is ever removed or moved, and only entries of the forms the provisioner gives are.

use super::*;
use crate::filesystem::{CLONE_STAGING_DIR, STAGING_DIR, Staged, TRASH_DIR, Trashed};

const UID: &str = "0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182";

fn pv() -> String {
    format!("pvc-{UID}")
}

/// `outside/precious` with a file in it: what an attack would like removed (or copied).
pub(super) fn precious(f: &Fixture) -> PathBuf {
    let dir = f.outside().join("precious");
    fs::create_dir_all(dir.join("sub")).expect("mkdir precious");
    fs::write(dir.join("sub/file"), b"keep").expect("write precious");
    dir
}

pub(super) fn intact(dir: &Path) -> bool {
    fs::read(dir.join("sub/file")).is_ok_and(|d| d == b"keep")
}

#[test]
fn a_trash_replaced_by_a_symlink_or_a_file_is_refused_and_its_target_kept() {
    let f = Fixture::new();
    let target = precious(&f);
    symlink(&target, f.root().join(TRASH_DIR)).expect("symlink");
    let error = f.pool.purge_trash().expect_err("a symlinked trash must be refused");
    assert!(matches!(error, PoolError::BookkeepingReplaced { .. }), "{error}");
    assert!(f.pool.move_to_trash(&dir_name("pvc-x")).is_ok(), "nothing to move yet");
    fs::create_dir(f.vol("pvc-x")).expect("mkdir");
    assert!(f.pool.move_to_trash(&dir_name("pvc-x")).is_err(), "nothing goes through the symlink");
    assert!(exists(&f.vol("pvc-x")), "the volume stays in place");
    assert_eq!(f.pool.trash_bytes().expect("bytes"), 0, "not measured through the symlink");
    assert!(intact(&target));
    fs::remove_file(f.root().join(TRASH_DIR)).expect("rm symlink");
    fs::write(f.root().join(TRASH_DIR), b"a file").expect("file");
    assert!(matches!(f.pool.purge_trash(), Err(PoolError::BookkeepingReplaced { .. })));
}

#[test]
fn a_trash_replaced_by_a_bind_mount_of_the_same_filesystem_is_refused() {
    let f = Fixture::new();
    let target = precious(&f);
    // Same device as the pool: only the mount (id, mount root) tells it apart.
    fs::create_dir(f.root().join(TRASH_DIR)).expect("mkdir trash");
    let _mount = MountGuard::bind(&f.outside(), &f.root().join(TRASH_DIR));
    assert!(exists(&f.root().join(TRASH_DIR).join("precious/sub/file")), "the bind mount shows the outside");
    let error = f.pool.purge_trash().expect_err("a mount in place of the trash must be refused");
    assert!(matches!(error, PoolError::BookkeepingReplaced { what: "a mount", .. }), "{error}");
    assert!(intact(&target), "nothing outside the pool is removed");
}

#[test]
fn only_entries_of_the_trash_s_own_form_are_purged() {
    let f = Fixture::new();
    fs::create_dir_all(f.vol("pvc-a").join("data")).expect("mkdir");
    let Trashed::Moved(entry) = f.pool.move_to_trash(&dir_name("pvc-a")).expect("trash") else { panic!("not moved") };
    // Someone renamed a directory of theirs into the trash.
    let foreign = f.root().join(TRASH_DIR).join("not-ours");
    fs::create_dir_all(foreign.join("sub")).expect("mkdir foreign");
    fs::write(foreign.join("sub/file"), b"keep").expect("write");
    assert_eq!(f.pool.purge_trash().expect("purge"), 1);
    assert!(!exists(&f.root().join(TRASH_DIR).join(entry)));
    assert!(intact(&foreign), "a name the provisioner never gives is left alone");
}

#[test]
fn a_staging_level_replaced_by_a_symlink_or_a_mount_is_refused_and_the_volume_kept() {
    let f = Fixture::new();
    let target = precious(&f);
    fs::create_dir_all(f.vol(&pv()).join("data")).expect("mkdir volume");
    fs::write(f.vol(&pv()).join("data/x"), b"volume").expect("write");
    let staging = f.root().join(STAGING_DIR);
    fs::create_dir(&staging).expect("mkdir staging");
    symlink(&target, staging.join("node-a")).expect("symlink node level");
    let staged = f.pool.stage_deletion(&dir_name("node-a"), &dir_name(&pv()), &dir_name(&pv()));
    assert!(matches!(staged, Err(PoolError::BookkeepingReplaced { .. })), "{staged:?}");
    assert!(exists(&f.vol(&pv()).join("data/x")), "the volume stays in place");
    assert!(matches!(f.pool.staged_deletions(&dir_name("node-a")), Err(PoolError::BookkeepingReplaced { .. })));
    fs::remove_file(staging.join("node-a")).expect("rm symlink");
    fs::create_dir(staging.join("node-a")).expect("mkdir node level");
    let _mount = MountGuard::bind(&f.outside(), &staging.join("node-a"));
    let staged = f.pool.stage_deletion(&dir_name("node-a"), &dir_name(&pv()), &dir_name(&pv()));
    assert!(matches!(staged, Err(PoolError::BookkeepingReplaced { what: "a mount", .. })), "{staged:?}");
    assert!(exists(&f.vol(&pv()).join("data/x")));
    assert!(intact(&target));
}

#[test]
fn staged_entries_of_foreign_forms_are_left_where_they_are() {
    let f = Fixture::new();
    let level = f.root().join(STAGING_DIR).join("node-a");
    fs::create_dir_all(level.join("not-a-pv/whatever")).expect("mkdir");
    fs::create_dir_all(level.join(pv()).join("not-its-dir")).expect("mkdir");
    assert_eq!(f.pool.staged_deletions(&dir_name("node-a")).expect("list"), Vec::new());
    assert!(exists(&level.join("not-a-pv/whatever")) && exists(&level.join(pv()).join("not-its-dir")));
}

#[test]
fn a_volume_staged_elsewhere_is_seen_by_every_node_of_a_shared_pool() {
    let f = Fixture::new();
    fs::create_dir(f.vol(&pv())).expect("mkdir");
    assert!(!f.pool.staged_by_any_node(&dir_name(&pv())).expect("look"));
    let Staged::Moved(staged) =
        f.pool.stage_deletion(&dir_name("node-b"), &dir_name(&pv()), &dir_name(&pv())).expect("stage")
    else {
        panic!("not staged")
    };
    assert!(f.pool.staged_by_any_node(&dir_name(&pv())).expect("look"));
    f.pool.restore_staged(&staged).expect("restore");
    assert!(!f.pool.staged_by_any_node(&dir_name(&pv())).expect("look"));
}

#[test]
fn a_clone_staging_level_replaced_by_a_symlink_or_a_mount_is_neither_swept_nor_used() {
    let f = Fixture::new();
    let target = precious(&f);
    let clones = f.root().join(CLONE_STAGING_DIR);
    symlink(&target, &clones).expect("symlink");
    assert!(matches!(f.pool.sweep_clone_staging(&dir_name("node-a")), Err(PoolError::BookkeepingReplaced { .. })));
    fs::remove_file(&clones).expect("rm");
    fs::create_dir_all(clones.join("node-a")).expect("mkdir");
    let _mount = MountGuard::bind(&f.outside(), &clones.join("node-a"));
    let swept = f.pool.sweep_clone_staging(&dir_name("node-a"));
    assert!(matches!(swept, Err(PoolError::BookkeepingReplaced { what: "a mount", .. })), "{swept:?}");
    fs::create_dir(f.vol("pvc-src")).expect("mkdir source");
    let target_name = dir_name(&pv());
    assert!(f.pool.clone_volume(&dir_name("pvc-src"), &target_name, &dir_name("node-a")).is_err());
    assert!(intact(&target));
}

#[test]
fn the_clone_sweep_removes_only_copies_of_volume_names() {
    let f = Fixture::new();
    let level = f.root().join(CLONE_STAGING_DIR).join("node-a");
    fs::create_dir_all(level.join(pv()).join("partial")).expect("mkdir copy");
    fs::create_dir_all(level.join("someone-elses")).expect("mkdir foreign");
    assert_eq!(f.pool.sweep_clone_staging(&dir_name("node-a")).expect("sweep"), 1);
    assert!(!exists(&level.join(pv())) && exists(&level.join("someone-elses")));
}

#[test]
fn sizes_are_measured_without_following_a_symlink_or_entering_a_mount() {
    let f = Fixture::new();
    let target = precious(&f);
    fs::write(target.join("big"), vec![1u8; 1 << 20]).expect("write big");
    fs::create_dir_all(f.vol("pvc-a")).expect("mkdir");
    fs::write(f.vol("pvc-a").join("small"), vec![1u8; 4096]).expect("write");
    symlink(&target, f.vol("pvc-a").join("link")).expect("symlink");
    fs::create_dir(f.vol("pvc-a").join("mnt")).expect("mkdir mnt");
    let mount = MountGuard::bind(&f.outside(), &f.vol("pvc-a").join("mnt"));
    assert!(f.pool.move_to_trash(&dir_name("pvc-a")).is_err(), "a mount inside blocks the move");
    drop(mount);
    let Trashed::Moved(_) = f.pool.move_to_trash(&dir_name("pvc-a")).expect("trash") else { panic!("not moved") };
    let bytes = f.pool.trash_bytes().expect("bytes");
    assert!((4096..1 << 20).contains(&bytes), "{bytes} bytes: the symlink's target is not counted");
}

//! Snapshots in the pool's `.hpp-snapshots` directory: taken and restored as complete copies,
//! and never a way out of the pool: a symlink, a file or a mount planted in place of the
//! snapshots directory or of a copy moves, removes or copies nothing outside.

use super::*;
use crate::filesystem::tests::bookkeeping::{intact, precious};
use crate::filesystem::{SNAPSHOTS_DIR, TRASH_DIR, Trashed};

const SNAPSHOT: &str = "5a5a5a5a-1111-2222-3333-444444444444";

/// A volume `pvc-src` holding a file.
fn source(f: &Fixture) {
    fs::create_dir(f.vol("pvc-src")).expect("mkdir");
    fs::write(f.vol("pvc-src/data"), b"before").expect("write");
}

#[test]
fn a_snapshot_is_a_point_in_time_copy_that_restores_and_leaves_by_the_trash() {
    let f = Fixture::new();
    source(&f);
    let node = dir_name("node-a");
    f.pool.take_snapshot(&dir_name("pvc-src"), &dir_name(SNAPSHOT), &node).expect("take");
    assert!(f.pool.has_snapshot(&dir_name(SNAPSHOT)).expect("has"));
    fs::write(f.vol("pvc-src/data"), b"after").expect("change the source");
    // Taken again (a retry after a crash): the complete copy stands as it was.
    f.pool.take_snapshot(&dir_name("pvc-src"), &dir_name(SNAPSHOT), &node).expect("again");
    f.pool.restore_snapshot(&dir_name(SNAPSHOT), &dir_name("pvc-restored"), &node).expect("restore");
    assert_eq!(fs::read(f.vol("pvc-restored/data")).expect("read"), b"before");
    // A plain copy (not on btrfs here) is no subvolume, whatever a status says of it.
    assert!(!f.pool.snapshot_is_subvolume(&dir_name(SNAPSHOT)).expect("read the disk"));
    assert!(!f.pool.snapshot_is_subvolume(&dir_name("5a5a5a5a-0000-0000-0000-000000000000")).expect("missing"));
    assert!(matches!(f.pool.trash_snapshot(&dir_name(SNAPSHOT)).expect("trash"), Trashed::Moved(_)));
    assert!(!f.pool.has_snapshot(&dir_name(SNAPSHOT)).expect("has"));
    assert_eq!(f.pool.trash_snapshot(&dir_name(SNAPSHOT)).expect("again"), Trashed::AlreadyGone);
    f.pool.purge_trash().expect("purge");
    assert!(fs::read_dir(f.root().join(TRASH_DIR)).expect("trash").next().is_none());
    assert_eq!(fs::read(f.vol("pvc-restored/data")).expect("read"), b"before", "the restore is its own copy");
}

#[test]
fn a_snapshots_directory_replaced_by_a_symlink_or_a_file_stops_snapshots_and_touches_nothing() {
    let f = Fixture::new();
    source(&f);
    let target = precious(&f);
    let node = dir_name("node-a");
    symlink(&target, f.root().join(SNAPSHOTS_DIR)).expect("symlink");
    let error = f.pool.take_snapshot(&dir_name("pvc-src"), &dir_name(SNAPSHOT), &node).expect_err("refused");
    assert!(matches!(error, PoolError::BookkeepingReplaced { .. }), "{error}");
    assert!(!exists(&target.join(SNAPSHOT)), "nothing copied through the symlink");
    // `precious` as if it were a snapshot, reached through the symlink: neither restored nor moved.
    fs::create_dir_all(target.join(SNAPSHOT)).expect("plant");
    assert!(f.pool.restore_snapshot(&dir_name(SNAPSHOT), &dir_name("pvc-new"), &node).is_err());
    assert!(!exists(&f.vol("pvc-new")));
    assert!(f.pool.trash_snapshot(&dir_name(SNAPSHOT)).is_err());
    assert!(exists(&target.join(SNAPSHOT)) && intact(&target));
    fs::remove_file(f.root().join(SNAPSHOTS_DIR)).expect("rm symlink");
    fs::write(f.root().join(SNAPSHOTS_DIR), b"a file").expect("plant a file");
    assert!(f.pool.take_snapshot(&dir_name("pvc-src"), &dir_name(SNAPSHOT), &node).is_err());
}

#[test]
fn a_copy_replaced_by_a_symlink_is_unlinked_never_followed() {
    let f = Fixture::new();
    source(&f);
    let target = precious(&f);
    let node = dir_name("node-a");
    f.pool.take_snapshot(&dir_name("pvc-src"), &dir_name(SNAPSHOT), &node).expect("take");
    let copy = f.root().join(SNAPSHOTS_DIR).join(SNAPSHOT);
    fs::remove_dir_all(&copy).expect("rm copy");
    symlink(&target, &copy).expect("symlink");
    assert!(f.pool.restore_snapshot(&dir_name(SNAPSHOT), &dir_name("pvc-new"), &node).is_err(), "not followed");
    assert!(!exists(&f.vol("pvc-new")));
    assert_eq!(f.pool.trash_snapshot(&dir_name(SNAPSHOT)).expect("trash"), Trashed::Unlinked);
    assert!(!exists(&copy) && intact(&target));
}

#[test]
fn a_mount_inside_the_source_or_on_the_snapshots_directory_stops_the_copy() {
    let f = Fixture::new();
    source(&f);
    let node = dir_name("node-a");
    fs::create_dir(f.vol("pvc-src/mnt")).expect("mkdir");
    let inside = MountGuard::tmpfs(&f.vol("pvc-src/mnt"), c"size=1m");
    let error = f.pool.take_snapshot(&dir_name("pvc-src"), &dir_name(SNAPSHOT), &node).expect_err("refused");
    assert!(matches!(error, PoolError::MountInsideVolume { .. }), "{error}");
    assert!(!f.pool.has_snapshot(&dir_name(SNAPSHOT)).expect("has"), "no copy, not even a partial one");
    drop(inside);
    // A filesystem mounted on the snapshots directory: another filesystem, refused.
    fs::create_dir_all(f.root().join(SNAPSHOTS_DIR)).expect("mkdir");
    let _on_snapshots = MountGuard::tmpfs(&f.root().join(SNAPSHOTS_DIR), c"size=1m");
    assert!(f.pool.take_snapshot(&dir_name("pvc-src"), &dir_name(SNAPSHOT), &node).is_err());
}

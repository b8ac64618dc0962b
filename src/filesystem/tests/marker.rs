//! The marker of `pathPattern` directories (`filesystem::marker`): read without following a
//! symlink or entering a mount, written only through a descriptor of the directory itself, and
//! never letting a volume be moved aside, settled or placed for a PV it does not name.

use super::*;
use crate::filesystem::{MAKING_PREFIX, MARKER_XATTR, Marker, STAGING_DIR, Staged};

const PV: &str = "pvc-0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182";
const OTHER_PV: &str = "pvc-11111111-2222-4333-8444-555555555555";

fn mark(path: &Path, pv: &str) {
    rustix::fs::setxattr(path, MARKER_XATTR, pv.as_bytes(), rustix::fs::XattrFlags::empty()).expect("setxattr");
}

fn marker_of(path: &Path) -> Option<String> {
    let mut buf = [0u8; 300];
    let len = rustix::fs::lgetxattr(path, MARKER_XATTR, &mut buf[..]).ok()?;
    Some(String::from_utf8_lossy(&buf[..len]).into_owned())
}

/// Makes the volume of `pv` aside, as provisioning does, and places it at `name`.
fn make(f: &Fixture, name: &str, pv: &str) -> Result<(), PoolError> {
    let making = f.pool.clear_making_entry(pv)?;
    f.pool.create_volume_dir(&making, 0o777)?;
    f.pool.place_marked(&making, &dir_name(name), pv, &owner_of_pv(pv))
}

/// An owner record naming `pv` (its text only matters to `deciding::path_pattern`).
fn owner_of_pv(pv: &str) -> String {
    format!("pv={pv} namespace-uid=0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182 namespace=ns claim=data class=c")
}

#[test]
fn a_volume_is_made_aside_marked_and_placed_only_where_nothing_is() {
    let f = Fixture::new();
    assert_eq!(f.pool.volume_marker(&dir_name("ns_data")).unwrap(), Marker::Absent);
    make(&f, "ns_data", PV).expect("made");
    assert_eq!(f.pool.volume_marker(&dir_name("ns_data")).unwrap(), Marker::MarkedFor(PV.into()));
    // The marker stays the bare PV name (the earlier version reads it); the owner is beside it.
    assert_eq!(marker_of(&f.vol("ns_data")).as_deref(), Some(PV));
    assert_eq!(f.pool.volume_owner_record(&dir_name("ns_data")).unwrap(), Some(owner_of_pv(PV)));
    assert_eq!(f.pool.volume_owner_record(&dir_name("ns_absent")).unwrap(), None);
    assert_eq!(mode_of(&f.vol("ns_data")), 0o777);
    assert!(!exists(&f.vol(&format!("{MAKING_PREFIX}{PV}"))), "nothing left aside");
    // Something at the place meanwhile is never replaced; what was made aside goes to the trash.
    fs::create_dir(f.vol("ns_taken")).expect("mkdir");
    fs::write(f.vol("ns_taken/file"), b"keep").expect("write");
    let error = make(&f, "ns_taken", OTHER_PV).expect_err("the place is taken");
    assert!(matches!(error, PoolError::PatternPlaceTaken { .. }), "{error}");
    assert_eq!(fs::read(f.vol("ns_taken/file")).unwrap(), b"keep");
    assert_eq!(marker_of(&f.vol("ns_taken")), None, "the occupant was not marked");
    assert!(!exists(&f.vol(&format!("{MAKING_PREFIX}{OTHER_PV}"))));
    // A half-made leftover of a crashed attempt goes to the trash first.
    fs::create_dir(f.vol(&format!("{MAKING_PREFIX}{OTHER_PV}"))).expect("mkdir leftover");
    make(&f, "ns_other", OTHER_PV).expect("made after the leftover");
    assert_eq!(marker_of(&f.vol("ns_other")).as_deref(), Some(OTHER_PV));
}

#[test]
fn a_marker_is_never_read_through_a_symlink_a_file_or_a_mount() {
    let f = Fixture::new();
    let target = f.outside().join("marked");
    fs::create_dir(&target).expect("mkdir");
    mark(&target, PV);
    symlink(&target, f.vol("ns_link")).expect("symlink");
    assert_eq!(f.pool.volume_marker(&dir_name("ns_link")).unwrap(), Marker::Unmarked);
    fs::write(f.vol("ns_file"), b"x").expect("file");
    assert_eq!(f.pool.volume_marker(&dir_name("ns_file")).unwrap(), Marker::Unmarked);
    fs::create_dir(f.vol("ns_plain")).expect("mkdir");
    assert_eq!(f.pool.volume_marker(&dir_name("ns_plain")).unwrap(), Marker::Unmarked);
    fs::create_dir(f.vol("ns_mount")).expect("mkdir");
    let _mount = MountGuard::bind(&target, &f.vol("ns_mount"));
    let error = f.pool.volume_marker(&dir_name("ns_mount")).expect_err("a mount is no volume");
    assert!(matches!(error, PoolError::MountInsideVolume { .. }), "{error}");
    let error = f.pool.check_marked_for(&dir_name("ns_link"), PV).expect_err("not through the symlink");
    assert!(matches!(error, PoolError::NotMarkedFor { found: None, .. }), "{error}");
}

#[test]
fn a_forged_path_or_a_directory_taken_over_is_not_acted_on_for_the_pv() {
    let f = Fixture::new();
    make(&f, "ns_data", OTHER_PV).expect("made");
    let error = f.pool.check_marked_for(&dir_name("ns_data"), PV).expect_err("another PV's directory");
    assert!(matches!(error, PoolError::NotMarkedFor { found: Some(ref other), .. } if other == OTHER_PV), "{error}");
    assert!(error.to_string().contains("nothing was removed"), "{error}");
    f.pool.check_marked_for(&dir_name("ns_data"), OTHER_PV).expect("its own PV");
    f.pool.check_marked_for(&dir_name("ns_gone"), PV).expect("nothing there: nothing to act on");
}

#[test]
fn taking_over_rewrites_the_marker_of_the_directory_in_place_and_keeps_its_data() {
    let f = Fixture::new();
    make(&f, "ns_data", OTHER_PV).expect("made");
    fs::write(f.vol("ns_data/file"), b"keep").expect("write");
    // Not while the marker names another PV than the one the decision saw.
    let error = f.pool.take_over_marked(&dir_name("ns_data"), PV, PV, &owner_of_pv(PV)).expect_err("changed");
    assert!(matches!(error, PoolError::TreeChanged { .. }), "{error}");
    assert_eq!(marker_of(&f.vol("ns_data")).as_deref(), Some(OTHER_PV));
    f.pool.take_over_marked(&dir_name("ns_data"), OTHER_PV, PV, &owner_of_pv(PV)).expect("taken over");
    assert_eq!(marker_of(&f.vol("ns_data")).as_deref(), Some(PV));
    assert_eq!(f.pool.volume_owner_record(&dir_name("ns_data")).unwrap(), Some(owner_of_pv(PV)));
    assert_eq!(fs::read(f.vol("ns_data/file")).unwrap(), b"keep");
    // A directory of the earlier version (a marker, no record) is given one.
    fs::create_dir(f.vol("ns_old")).expect("mkdir");
    mark(&f.vol("ns_old"), OTHER_PV);
    assert_eq!(f.pool.volume_owner_record(&dir_name("ns_old")).unwrap(), None);
    f.pool.take_over_marked(&dir_name("ns_old"), OTHER_PV, PV, &owner_of_pv(PV)).expect("taken over");
    assert_eq!(f.pool.volume_owner_record(&dir_name("ns_old")).unwrap(), Some(owner_of_pv(PV)));
    // Only a marked directory is taken over.
    fs::create_dir(f.vol("ns_plain")).expect("mkdir");
    assert!(f.pool.take_over_marked(&dir_name("ns_plain"), PV, PV, &owner_of_pv(PV)).is_err());
    assert_eq!(marker_of(&f.vol("ns_plain")), None);
}

#[test]
fn a_staged_directory_marked_for_another_pv_goes_back_instead_of_being_settled() {
    let f = Fixture::new();
    make(&f, "ns_data", PV).expect("made");
    fs::write(f.vol("ns_data/file"), b"keep").expect("write");
    let node = dir_name("node-a");
    let Staged::Moved(staged) = f.pool.stage_deletion(&node, &dir_name(PV), &dir_name("ns_data")).expect("stage")
    else {
        panic!("not moved");
    };
    f.pool.check_staged_marker(&staged).expect("still its PV's");
    // A claim takes it over while it is aside (the marker rewritten through its descriptor).
    mark(&f.pool.staged_path(&staged), OTHER_PV);
    let error = f.pool.check_staged_marker(&staged).expect_err("taken over");
    assert!(matches!(error, PoolError::NotMarkedFor { .. }), "{error}");
    // Settling after a crash lists nothing to commit for PV and puts the directory back.
    assert_eq!(f.pool.staged_deletions(&node).expect("list"), Vec::new());
    assert_eq!(fs::read(f.vol("ns_data/file")).unwrap(), b"keep");
    assert_eq!(marker_of(&f.vol("ns_data")).as_deref(), Some(OTHER_PV));
    assert!(!exists(&f.root().join(STAGING_DIR).join("node-a").join(PV).join("ns_data")));
}

use super::*;

const DISK: (u32, u32) = (253, 1);
const OURS: FileId = FileId { dev_major: DISK.0, dev_minor: DISK.1, ino: 4242 };
/// Another file of the same filesystem (the replacement, or another volume's file).
const OTHER: FileId = FileId { ino: 777, ..OURS };
/// Our inode number, on another filesystem.
const SAME_INO_ELSEWHERE: FileId = FileId { dev_major: 8, dev_minor: 3, ..OURS };

fn made() -> Volume {
    Volume { recorded_inode: Some(OURS.ino) }
}

fn attached(number: u32, backing: FileId) -> LoopFacts {
    LoopFacts { number, device: (7, number), backing, offset: 0, size_limit: 0 }
}

#[test]
fn a_file_with_no_loop_is_attached_and_its_one_loop_is_used() {
    let file = BackingFile::Regular(OURS);
    assert_eq!(decide_attachment(made(), file, &[]), Ok(Attachment::Attach));
    let loops = [attached(0, OTHER), attached(3, OURS), attached(5, SAME_INO_ELSEWHERE)];
    assert_eq!(decide_attachment(made(), file, &loops), Ok(Attachment::Use { number: 3, device: (7, 3) }));
    // While provisioning, no inode is recorded yet: the file just made is taken as it is.
    let provisioning = Volume { recorded_inode: None };
    assert_eq!(decide_attachment(provisioning, file, &loops), Ok(Attachment::Use { number: 3, device: (7, 3) }));
}

#[test]
fn a_symlink_or_other_file_at_the_backing_path_is_neither_attached_nor_detached() {
    // Whatever a symlink points to (a host disk, another volume's file) is never reached, even
    // when a loop is attached to the file the volume had.
    let loops = [attached(3, OURS)];
    for (file, refusal) in [
        (BackingFile::Symlink, LoopRefusal::Symlink),
        (BackingFile::Other, LoopRefusal::NotRegular),
        (BackingFile::Missing, LoopRefusal::Missing),
    ] {
        assert_eq!(decide_attachment(made(), file, &loops), Err(refusal.clone()), "{file:?}");
    }
    assert_eq!(decide_detach(made(), BackingFile::Symlink, &loops), Err(LoopRefusal::Symlink));
    assert_eq!(decide_detach(made(), BackingFile::Other, &loops), Err(LoopRefusal::NotRegular));
}

#[test]
fn a_file_replaced_under_the_same_name_is_neither_attached_nor_detached() {
    let replaced = BackingFile::Regular(OTHER);
    let refusal = LoopRefusal::Replaced { recorded: OURS.ino, found: OTHER.ino };
    // Not attached, whether the old loop is still there or not, nor its loop used.
    assert_eq!(decide_attachment(made(), replaced, &[]), Err(refusal.clone()));
    assert_eq!(decide_attachment(made(), replaced, &[attached(3, OURS), attached(4, OTHER)]), Err(refusal.clone()));
    // The replacement's own loop (someone attached it) is not detached.
    assert_eq!(decide_detach(made(), replaced, &[attached(4, OTHER)]), Err(refusal));
    assert!(LoopRefusal::Replaced { recorded: 1, found: 2 }.to_string().contains("replaced"));
}

#[test]
fn a_loop_someone_else_attached_to_our_file_name_is_not_ours() {
    // Loop 6 names our path (the kernel's backing_file) but holds another inode: it is a
    // stranger, reported, and neither used nor detached.
    let file = BackingFile::Regular(OURS);
    let loops = [attached(6, OTHER), attached(3, OURS)];
    let names_our_path = |n: u32| n == 6 || n == 3;
    assert_eq!(strangers(made(), file, &loops, names_our_path), vec![6]);
    assert_eq!(decide_attachment(made(), file, &loops), Ok(Attachment::Use { number: 3, device: (7, 3) }));
    assert_eq!(decide_detach(made(), file, &loops), Ok(vec![3]));
    // With no loop of its own, the volume gets a new loop, never the stranger.
    assert_eq!(decide_attachment(made(), file, &[attached(6, OTHER)]), Ok(Attachment::Attach));
    assert_eq!(decide_detach(made(), file, &[attached(6, OTHER)]), Ok(vec![]));
}

#[test]
fn a_second_loop_or_a_partial_loop_on_our_file_is_refused_for_use() {
    let file = BackingFile::Regular(OURS);
    let twice = [attached(3, OURS), attached(9, OURS)];
    assert_eq!(decide_attachment(made(), file, &twice), Err(LoopRefusal::AttachedMoreThanOnce(vec![3, 9])));
    // Deleting the volume detaches both: each is a loop on its own file.
    assert_eq!(decide_detach(made(), file, &twice), Ok(vec![3, 9]));
    let offset = [LoopFacts { offset: 4096, ..attached(3, OURS) }];
    assert_eq!(
        decide_attachment(made(), file, &offset),
        Err(LoopRefusal::Partial { number: 3, offset: 4096, size_limit: 0 })
    );
    let limited = [LoopFacts { size_limit: 1 << 20, ..attached(3, OURS) }];
    assert!(matches!(decide_attachment(made(), file, &limited), Err(LoopRefusal::Partial { .. })));
}

#[test]
fn the_same_inode_number_on_another_filesystem_is_not_ours() {
    let file = BackingFile::Regular(OURS);
    let loops = [attached(5, SAME_INO_ELSEWHERE)];
    assert_eq!(decide_attachment(made(), file, &loops), Ok(Attachment::Attach));
    assert_eq!(decide_detach(made(), file, &loops), Ok(vec![]));
}

#[test]
fn a_missing_file_detaches_nothing_and_names_loops_holding_its_inode_number() {
    assert_eq!(decide_detach(made(), BackingFile::Missing, &[attached(0, OTHER)]), Ok(vec![]));
    assert_eq!(
        decide_detach(made(), BackingFile::Missing, &[attached(2, OURS), attached(5, SAME_INO_ELSEWHERE)]),
        Err(LoopRefusal::GoneWhileAttached(vec![2, 5]))
    );
}

/// Every combination of what stands at the path, which inode is recorded, and which loops are
/// attached (none, ours, a stranger, ours twice, ours partial, our number elsewhere): a loop is
/// used or detached only when its backing is the regular file at the path with the recorded
/// inode, and never more than one is used.
#[test]
fn no_combination_uses_or_detaches_a_loop_that_is_not_the_volumes() {
    let files = [
        BackingFile::Regular(OURS),
        BackingFile::Regular(OTHER),
        BackingFile::Regular(SAME_INO_ELSEWHERE),
        BackingFile::Symlink,
        BackingFile::Other,
        BackingFile::Missing,
    ];
    let volumes = [made(), Volume { recorded_inode: None }, Volume { recorded_inode: Some(OTHER.ino) }];
    let candidates = [
        attached(1, OURS),
        attached(2, OTHER),
        attached(3, SAME_INO_ELSEWHERE),
        attached(4, OURS),
        LoopFacts { offset: 512, ..attached(5, OURS) },
    ];
    let mut used = 0;
    for volume in volumes {
        for file in files {
            for subset in 0..(1u32 << candidates.len()) {
                let loops: Vec<LoopFacts> = candidates
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| subset & (1 << i) != 0)
                    .map(|(_, l)| l.clone())
                    .collect();
                let genuine = |number: u32| {
                    let l = loops.iter().find(|l| l.number == number).unwrap();
                    matches!(file, BackingFile::Regular(id) if l.backing == id
                        && volume.recorded_inode.is_none_or(|r| r == id.ino))
                };
                if let Ok(Attachment::Use { number, device }) = decide_attachment(volume, file, &loops) {
                    used += 1;
                    assert!(genuine(number), "{volume:?} {file:?} {loops:?}: used loop{number}");
                    assert_eq!(device, (7, number));
                    let l = loops.iter().find(|l| l.number == number).unwrap();
                    assert_eq!((l.offset, l.size_limit), (0, 0));
                    assert_eq!(loops.iter().filter(|l| genuine(l.number)).count(), 1);
                }
                if let Ok(detached) = decide_detach(volume, file, &loops) {
                    for number in detached {
                        assert!(genuine(number), "{volume:?} {file:?} {loops:?}: detached loop{number}");
                    }
                }
            }
        }
    }
    assert!(used > 0, "the enumeration reaches the cases where a loop is used");
}

#[test]
fn the_node_is_kept_made_or_replaced_and_a_directory_is_never_removed() {
    let device = (7, 3);
    assert_eq!(decide_node(NodeEntry::Absent, device), Ok(NodeAction::Make));
    assert_eq!(decide_node(NodeEntry::BlockDevice(device), device), Ok(NodeAction::Keep));
    // A node of the loop number the volume had before a restart now names another loop.
    assert_eq!(decide_node(NodeEntry::BlockDevice((7, 9)), device), Ok(NodeAction::Replace));
    // A symlink planted at the name is unlinked, not followed.
    assert_eq!(decide_node(NodeEntry::Other, device), Ok(NodeAction::Replace));
    assert_eq!(decide_node(NodeEntry::Directory, device), Err(LoopRefusal::DirectoryAtNode));
    assert_eq!(remove_node(NodeEntry::Absent), Ok(false));
    assert_eq!(remove_node(NodeEntry::BlockDevice((7, 9))), Ok(true));
    assert_eq!(remove_node(NodeEntry::Other), Ok(true));
    assert_eq!(remove_node(NodeEntry::Directory), Err(LoopRefusal::DirectoryAtNode));
}

#[test]
fn nodes_named_for_no_served_volume_are_stale_and_other_names_are_not_ours() {
    let served = "pvc-0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182";
    let gone = "pvc-11111111-2222-3333-4444-555555555555";
    let entries = [served.to_owned(), gone.to_owned(), "sda".to_owned(), "pvc-x".to_owned()];
    assert_eq!(stale_nodes(&entries, &[served]), vec![gone]);
    assert_eq!(stale_nodes(&entries, &[]), vec![served, gone]);
}

use std::path::PathBuf;

use super::*;
use crate::deciding::layout::AcceptedPath;

const PV: &str = "pvc-0a000000-0000-4000-8000-000000000001";
const DEVICES: &str = "/dev/hostpath-provisioner";
const RECORDED_INODE: u64 = 42;
const BIRTH: Birth = Birth { seconds: 1_700_000_000, nanoseconds: 5 };

fn file_id(ino: u64) -> FileId {
    FileId { dev_major: 253, dev_minor: 1, ino }
}

fn seen(number: u32, backing: FileId, name: &str) -> SeenLoop {
    SeenLoop {
        facts: LoopFacts { number, device: (7, number), backing, offset: 0, size_limit: 0 },
        backing_name: name.to_owned(),
    }
}

fn found() -> BlockVolumeRef {
    BlockVolumeRef {
        pv_name: PV.to_owned(),
        node_path: PathBuf::from(DEVICES).join(PV),
        backing_dir: AcceptedPath {
            pool: "legacy".into(),
            root: "/var/hpvolumes".into(),
            dir_name: PV.into(),
            marked: false,
        },
        volume: Volume { recorded_inode: Some(RECORDED_INODE) },
        recorded_birth: Some(BIRTH),
    }
}

/// A volume whose file is the recorded one, born when recorded, with `node` at its node path.
fn volume(node: NodeEntry) -> VolumeFacts {
    VolumeFacts {
        pv: PV.to_owned(),
        found: Ok(found()),
        file: Ok((BackingFile::Regular(file_id(RECORDED_INODE)), Some(BIRTH))),
        node: Ok(node),
    }
}

/// Loop 3 on the volume's file, loop 8 on another file.
fn host_loops() -> Result<Vec<SeenLoop>, String> {
    Ok(vec![
        seen(3, file_id(RECORDED_INODE), "/var/hpvolumes/pvc-0a000000-0000-4000-8000-000000000001/block.img"),
        seen(8, file_id(99), "/srv/images/other.img"),
    ])
}

fn checks(findings: &[Finding]) -> Vec<(Severity, &'static str)> {
    findings.iter().map(|f| (f.severity, f.check)).collect()
}

#[test]
fn a_volume_whose_node_names_the_loop_on_its_file_is_ok_and_each_loop_names_its_volume() {
    let (report, findings) = assess(DEVICES, &[volume(NodeEntry::BlockDevice((7, 3)))], &host_loops(), &[PV.into()]);
    assert_eq!(findings, []);
    assert_eq!(report.volumes[0].state, "ok");
    assert_eq!(report.volumes[0].loop_number, Some(3));
    assert_eq!(report.volumes[0].node, format!("{DEVICES}/{PV}"));
    let owners: Vec<(u32, Option<&str>)> = report.loops.iter().map(|l| (l.number, l.volume.as_deref())).collect();
    assert_eq!(owners, [(3, Some(PV)), (8, None)]);
}

#[test]
fn a_node_naming_another_loop_or_missing_or_no_device_is_a_problem_naming_what_is_there() {
    for (node, check, says) in [
        (NodeEntry::BlockDevice((7, 8)), "block_node_mismatch", "names loop8, whose backing file is not the volume's"),
        (NodeEntry::BlockDevice((8, 1)), "block_node_mismatch", "names device 8:1"),
        (NodeEntry::Other, "block_node_mismatch", "is not a block device"),
        (NodeEntry::Directory, "block_node_mismatch", "a directory stands"),
        (NodeEntry::Absent, "block_node_missing", "loop3 holds its backing file"),
    ] {
        let (report, findings) = assess(DEVICES, &[volume(node)], &host_loops(), &[]);
        assert_eq!(checks(&findings), [(Severity::Problem, check)], "{node:?}");
        assert!(findings[0].message.contains(says) && findings[0].message.contains(PV), "{node:?}: {findings:?}");
        assert_eq!((report.volumes[0].state, report.volumes[0].loop_number), (check, Some(3)));
        // The loop on the file is still the volume's.
        assert_eq!(report.loops[0].volume.as_deref(), Some(PV));
    }
}

#[test]
fn a_volume_without_a_loop_is_a_problem_and_a_node_of_it_naming_another_loop_is_said() {
    let loops = Ok(vec![seen(8, file_id(99), "/srv/images/other.img")]);
    let (report, findings) = assess(DEVICES, &[volume(NodeEntry::BlockDevice((7, 8)))], &loops, &[]);
    assert_eq!(checks(&findings), [(Severity::Problem, "block_volume_without_loop")]);
    assert!(findings[0].message.contains("names loop8"), "{findings:?}");
    assert_eq!(report.volumes[0].loop_number, None);
    assert_eq!(report.loops[0].volume, None);
    let (_, findings) = assess(DEVICES, &[volume(NodeEntry::Absent)], &Ok(Vec::new()), &[]);
    assert_eq!(checks(&findings), [(Severity::Problem, "block_volume_without_loop")]);
    assert!(!findings[0].message.contains("names"), "{findings:?}");
}

#[test]
fn a_replaced_or_reborn_file_is_a_mismatch_and_its_loop_names_no_volume() {
    let mut replaced = volume(NodeEntry::BlockDevice((7, 3)));
    replaced.file = Ok((BackingFile::Regular(file_id(43)), Some(BIRTH)));
    let loops = Ok(vec![seen(3, file_id(43), "/var/hpvolumes/x/block.img")]);
    let (report, findings) = assess(DEVICES, &[replaced], &loops, &[]);
    assert_eq!(checks(&findings), [(Severity::Problem, "block_volume_mismatch")]);
    assert!(findings[0].message.contains("inode 43"), "{findings:?}");
    assert_eq!(report.loops[0].volume, None, "a loop on another file is not the volume's");

    let mut reborn = volume(NodeEntry::BlockDevice((7, 3)));
    reborn.file =
        Ok((BackingFile::Regular(file_id(RECORDED_INODE)), Some(Birth { seconds: 1_800_000_000, nanoseconds: 0 })));
    let (_, findings) = assess(DEVICES, &[reborn], &host_loops(), &[]);
    assert_eq!(checks(&findings), [(Severity::Problem, "block_volume_mismatch")]);
    assert!(findings[0].message.contains("replaced"), "{findings:?}");

    // Two loops on the volume's file: neither is handed to a pod.
    let twice = Ok(vec![seen(3, file_id(RECORDED_INODE), "a"), seen(4, file_id(RECORDED_INODE), "a")]);
    let (_, findings) = assess(DEVICES, &[volume(NodeEntry::BlockDevice((7, 3)))], &twice, &[]);
    assert_eq!(checks(&findings), [(Severity::Problem, "block_volume_mismatch")]);
}

#[test]
fn a_refused_pv_an_unreadable_file_and_unreadable_loops_are_said() {
    let mut refused = volume(NodeEntry::Absent);
    refused.found = Err(BlockPvRefusal::NotLocal(PV.into()));
    let mut unreadable = volume(NodeEntry::Absent);
    unreadable.pv = "pvc-0a000000-0000-4000-8000-000000000002".into();
    unreadable.file = Err("permission denied".into());
    let (report, findings) = assess(DEVICES, &[refused, unreadable], &host_loops(), &[]);
    assert_eq!(
        checks(&findings),
        [(Severity::Problem, "block_pv_refused"), (Severity::Problem, "block_volume_unreadable")]
    );
    assert!(findings[0].message.contains("no spec.local path"), "{findings:?}");

    let (report_without_loops, findings) =
        assess(DEVICES, &[volume(NodeEntry::BlockDevice((7, 3)))], &Err("EACCES".into()), &[]);
    assert_eq!(checks(&findings), [(Severity::Warning, "block_loops_unreadable")]);
    assert_eq!(report_without_loops.volumes[0].state, "not_checked");
    assert!(report_without_loops.loops.is_empty());
    assert_eq!(report.volumes.len(), 2);
}

#[test]
fn device_nodes_naming_no_volume_of_this_node_are_warned_of_and_other_names_left_alone() {
    let entries = vec![PV.to_owned(), "pvc-0a000000-0000-4000-8000-0000000000ff".to_owned(), "README".to_owned()];
    let (_, findings) = assess(DEVICES, &[volume(NodeEntry::BlockDevice((7, 3)))], &host_loops(), &entries);
    assert_eq!(checks(&findings), [(Severity::Warning, "block_node_stale")]);
    assert!(findings[0].message.contains("pvc-0a000000-0000-4000-8000-0000000000ff"), "{findings:?}");
}

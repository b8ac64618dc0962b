//! The doctor's decisions on this node's Block volumes, pure over the facts read: which loop
//! holds each volume's file, whether its device node names that loop, and what does not fit.
//! The rules are the daemon's own ([`loop_safety`], [`kept`]): a loop is a volume's only when its
//! backing file is, by device and inode, the volume's file with the recorded inode and birth.

use crate::deciding::block::Birth;
use crate::deciding::block::kept::{self, BlockPvRefusal, BlockVolumeRef};
use crate::deciding::block::loop_safety::{
    self, Attachment, BackingFile, FileId, LoopFacts, NodeAction, NodeEntry, Volume,
};
use crate::doctor::report::{BlockReport, BlockVolumeLine, Finding, LoopLine, Severity};

/// An attached loop as read: its facts and the kernel's name for its backing file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenLoop {
    pub facts: LoopFacts,
    pub backing_name: String,
}

/// What was read for one Block PV of this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeFacts {
    /// The PV name.
    pub pv: String,
    /// Its paths, checked as the daemon checks them, or why they are refused.
    pub found: Result<BlockVolumeRef, BlockPvRefusal>,
    /// The backing file and its birth time, or why they could not be read.
    pub file: Result<(BackingFile, Option<Birth>), String>,
    /// What stands at its device node path, or why it could not be read.
    pub node: Result<NodeEntry, String>,
}

/// The Block report and its findings: each volume's state, every loop with the volume it holds,
/// and the device nodes that name no volume of this node.
pub fn assess(
    device_dir: &str,
    volumes: &[VolumeFacts],
    loops: &Result<Vec<SeenLoop>, String>,
    device_entries: &[String],
) -> (BlockReport, Vec<Finding>) {
    let mut findings = Vec::new();
    let mut report = BlockReport { device_dir: device_dir.to_owned(), ..BlockReport::default() };
    let facts: Vec<LoopFacts> = loops.as_ref().map(|l| l.iter().map(|l| l.facts.clone()).collect()).unwrap_or_default();
    if let Err(why) = loops {
        findings.push(finding(
            Severity::Warning,
            "block_loops_unreadable",
            format!("the loop devices could not be read, so Block volumes are not checked against them: {why}"),
        ));
    }
    // The file each volume's loop must hold, to name the volume of each loop.
    let mut owners: Vec<(FileId, &str)> = Vec::new();
    for volume in volumes {
        let (line, found, owner) = assess_volume(volume, &facts, loops.is_ok());
        if let Some((severity, check, message)) = found {
            findings.push(finding(severity, check, message));
        }
        if let Some(id) = owner {
            owners.push((id, volume.pv.as_str()));
        }
        report.volumes.push(line);
    }
    for seen in loops.as_deref().unwrap_or_default() {
        let volume = owners.iter().find(|(id, _)| *id == seen.facts.backing).map(|(_, pv)| (*pv).to_owned());
        report.loops.push(LoopLine { number: seen.facts.number, backing_file: seen.backing_name.clone(), volume });
    }
    let served: Vec<&str> = volumes.iter().map(|v| v.pv.as_str()).collect();
    for stale in loop_safety::stale_nodes(device_entries, &served) {
        findings.push(finding(
            Severity::Warning,
            "block_node_stale",
            format!(
                "{device_dir}/{stale} names no Block volume of this node: left, it names whatever loop later takes \
                 its number; the provisioner removes it at its next start"
            ),
        ));
    }
    (report, findings)
}

/// The file's identity when it is the volume's by the recorded inode (as the daemon checks it).
fn own_file(volume: Volume, file: BackingFile) -> Option<FileId> {
    match (file, volume.recorded_inode) {
        (BackingFile::Regular(id), Some(recorded)) if id.ino == recorded => Some(id),
        _ => None,
    }
}

fn finding(severity: Severity, check: &'static str, message: String) -> Finding {
    Finding { severity, pool: None, check, message }
}

type Found = Option<(Severity, &'static str, String)>;

/// One volume's line, its finding if any, and the identity of its file when checked to be its own.
fn assess_volume(
    volume: &VolumeFacts,
    loops: &[LoopFacts],
    loops_read: bool,
) -> (BlockVolumeLine, Found, Option<FileId>) {
    let node_path = volume.found.as_ref().map(|f| f.node_path.display().to_string()).unwrap_or_default();
    let line = |loop_number: Option<u32>, state: &'static str| BlockVolumeLine {
        pv: volume.pv.clone(),
        node: node_path.clone(),
        loop_number,
        state,
    };
    let problem = |loop_number, check: &'static str, message: String| {
        (line(loop_number, check), Some((Severity::Problem, check, message)), None)
    };
    let found = match &volume.found {
        Ok(found) => found,
        Err(refusal) => {
            return problem(None, "block_pv_refused", format!("{refusal}: the provisioner does not act on it"));
        }
    };
    let (file, birth) = match &volume.file {
        Ok(read) => *read,
        Err(why) => return problem(None, "block_volume_unreadable", format!("{}: {why}", volume.pv)),
    };
    if let Err(refusal) = kept::check_birth(found, birth) {
        return problem(None, "block_volume_mismatch", refusal.to_string());
    }
    let own_file = own_file(found.volume, file);
    if !loops_read {
        return (line(None, "not_checked"), None, own_file);
    }
    let attachment = match loop_safety::decide_attachment(found.volume, file, loops) {
        Ok(attachment) => attachment,
        Err(refusal) => return problem(None, "block_volume_mismatch", format!("{}: {refusal}", volume.pv)),
    };
    let node = match &volume.node {
        Ok(node) => *node,
        Err(why) => return problem(None, "block_volume_unreadable", format!("{}: {why}", volume.pv)),
    };
    let (number, device) = match attachment {
        Attachment::Use { number, device } => (number, device),
        Attachment::Attach => {
            let named = match node {
                NodeEntry::BlockDevice((major, minor)) => {
                    let other = loops.iter().find(|l| l.device == (major, minor)).map(|l| l.number);
                    match other {
                        Some(n) => format!(", and {node_path} names loop{n}, whose backing file is not the volume's"),
                        None => format!(", and {node_path} names device {major}:{minor}, not the volume's"),
                    }
                }
                _ => String::new(),
            };
            let message = format!(
                "{}: no loop device holds its backing file{named}: a pod of it cannot start; the provisioner \
                 attaches it at its next start (restart its pod on this node)",
                volume.pv
            );
            let mut answer = problem(None, "block_volume_without_loop", message);
            answer.2 = own_file;
            return answer;
        }
    };
    let answer = |state, found| (line(Some(number), state), found, own_file);
    match loop_safety::decide_node(node, device) {
        Ok(NodeAction::Keep) => answer("ok", None),
        Ok(NodeAction::Make) => answer(
            "block_node_missing",
            Some((
                Severity::Problem,
                "block_node_missing",
                format!(
                    "{}: loop{number} holds its backing file but {node_path} is missing: a pod of it waits; the \
                     provisioner makes it at its next start",
                    volume.pv
                ),
            )),
        ),
        Ok(NodeAction::Replace) => {
            let what = match node {
                NodeEntry::BlockDevice((major, minor)) => match loops.iter().find(|l| l.device == (major, minor)) {
                    Some(other) => format!("names loop{}, whose backing file is not the volume's", other.number),
                    None => format!("names device {major}:{minor}"),
                },
                _ => "is not a block device".to_owned(),
            };
            answer(
                "block_node_mismatch",
                Some((
                    Severity::Problem,
                    "block_node_mismatch",
                    format!(
                        "{}: {node_path} {what}, while loop{number} holds the volume's file: a pod of it would open \
                         another device; the provisioner replaces the node at its next start",
                        volume.pv
                    ),
                )),
            )
        }
        Err(refusal) => answer(
            "block_node_mismatch",
            Some((Severity::Problem, "block_node_mismatch", format!("{}: {node_path}: {refusal}", volume.pv))),
        ),
    }
}

#[cfg(test)]
#[path = "assess_block_tests.rs"]
mod tests;

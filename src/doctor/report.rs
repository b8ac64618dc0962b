//! What the doctor found, as plain data: serialised as is for `--output json` (the field names
//! are the stable interface, documented in docs/operating.md), and rendered as a table for people.

use std::fmt::Write;

use serde::Serialize;

use crate::deciding::capacity::format_size;

/// The whole report.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// `NODE_NAME`.
    pub node: String,
    /// `PROVISIONER_NAME`.
    pub provisioner: String,
    /// Whether the API was asked about PVs and claims.
    pub api: ApiCheck,
    /// One entry per configured pool, in configuration order.
    pub pools: Vec<PoolReport>,
    /// This node's Block volumes and the host's loop devices: null unless Block volumes are on
    /// and the API was asked.
    pub block: Option<BlockReport>,
    /// Problems and warnings, pool by pool.
    pub findings: Vec<Finding>,
    /// The process's exit code (see the module documentation).
    pub exit_code: i32,
}

/// One attached loop device of the host, and the Block volume of this node it holds, if any.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoopLine {
    /// N of `/dev/loopN`.
    pub number: u32,
    /// Its backing file as the kernel names it (may end in " (deleted)"): never trusted.
    pub backing_file: String,
    /// The PV whose file it holds, by device and inode; null for a loop of no Block volume of
    /// this node (another program's, or a volume's whose file was replaced).
    pub volume: Option<String>,
}

/// One Block volume of this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockVolumeLine {
    /// The PV.
    pub pv: String,
    /// Its device node.
    pub node: String,
    /// The loop holding its file; null when none does (or it cannot be told).
    pub loop_number: Option<u32>,
    /// `ok`, or the check of the finding about it.
    pub state: &'static str,
}

/// The Block part of the report: this node's Block volumes and the host's loops.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlockReport {
    /// `BLOCK_DEVICE_DIR`.
    pub device_dir: String,
    /// This node's Block PVs.
    pub volumes: Vec<BlockVolumeLine>,
    /// Every attached loop device; empty when they could not be read (a finding says why).
    pub loops: Vec<LoopLine>,
}

/// Whether the API-backed checks (orphans, missing directories) ran.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status", content = "detail")]
pub enum ApiCheck {
    /// PVs and claims were listed.
    Checked,
    /// No `--kubeconfig` and not in a pod: those checks were skipped, on purpose.
    Skipped,
    /// Asked for but failed (unreachable, forbidden): the reason.
    Failed(String),
}

/// One pool.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PoolReport {
    /// Pool name.
    pub name: String,
    /// Pool root.
    pub path: String,
    /// Declared `shared` (a network filesystem mounted on every node).
    pub shared_pool: bool,
    /// Declared `mountpoint`: usable only while a filesystem is mounted at the root.
    pub require_mountpoint: bool,
    /// Bytes kept free (`reserve=` of the pool, else `RESERVED_SPACE`).
    pub reserve_bytes: u64,
    /// How room is counted: `free` or `requests` (`--capacity-accounting`, `accounting=`).
    pub accounting: &'static str,
    /// The requests of the PVs whose directories are in this pool (from the API; absent when it
    /// was not asked), what `requests` accounting counts against the pool's size.
    pub promised_bytes: Option<u64>,
    /// Why the root could not be opened or examined; the other fields are then absent.
    pub error: Option<String>,
    /// The filesystem under the root.
    pub filesystem: Option<FilesystemReport>,
    /// The trash of deleted volumes awaiting removal.
    pub trash: Option<TrashReport>,
    /// Volume directories against PVs; absent when the API was not asked.
    pub volumes: Option<VolumesReport>,
}

/// Filesystem facts of a pool root.
#[derive(Clone, Debug, Default, Serialize)]
pub struct FilesystemReport {
    /// Filesystem type, from the mount table (from the `statfs` magic number when not listed).
    #[serde(rename = "type")]
    pub fs_type: String,
    /// Mount source (device or export).
    pub source: Option<String>,
    /// The mount the root lies on.
    pub mount_point: Option<String>,
    /// Which directory of the filesystem is mounted there (`/`: the filesystem's own root; a
    /// path: a bind mount of that directory, as a hostPath volume is in a pod).
    pub mount_root: Option<String>,
    /// The root itself is a mount point (a bind mount included, as the daemon's check counts it).
    pub is_mount_point: bool,
    /// On the node's OS disk, as the `pool_shares_os_disk` metric says (null: the mount table
    /// does not tell).
    pub shares_os_disk: Option<bool>,
    /// Mounted read-only.
    pub read_only: bool,
    /// Size of the filesystem.
    pub size_bytes: u64,
    /// Space available to new volumes before the reserve is taken off.
    pub available_bytes: u64,
    /// Inodes of the filesystem (0 when it does not count them).
    pub inodes_total: u64,
    /// Inodes available.
    pub inodes_available: u64,
    /// `supported`, `unsupported` or `unknown (why)`.
    pub reflink: String,
    /// Quota mount options the kernel reports (`prjquota`, `usrquota`, ...).
    pub quota_options: Vec<String>,
    /// Whether `quota: enforce` classes can be served here, by the daemon's own rule
    /// (`deciding::quota::capability`): `btrfs-qgroup`, `project` or `none`.
    pub quota: String,
    /// With `quota` = `none`: exactly what is missing.
    pub quota_missing: Option<String>,
    /// Present only where SELinux is on.
    pub selinux: Option<SelinuxReport>,
}

/// SELinux mode and the pool root's label.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SelinuxReport {
    /// `enforcing` or `permissive`.
    pub mode: String,
    /// The label, or null when it could not be read.
    pub label: Option<String>,
}

/// The trash directory.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TrashReport {
    /// Entries (deleted volumes) waiting.
    pub entries: usize,
    /// Bytes they hold.
    pub bytes: u64,
    /// Entries older than the doctor's stuck threshold.
    pub stuck: usize,
    /// Volumes (of any node) waiting in the deletion staging.
    pub staged: usize,
    /// Bytes they hold.
    pub staged_bytes: u64,
}

/// Volume directories against this node's PVs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VolumesReport {
    /// PVs whose directory this node should hold in this pool.
    pub expected: usize,
    /// Directories in our layout that match no PV and no claim.
    pub orphan_directories: Vec<OrphanDirectory>,
    /// PVs of this node and pool whose directory is not there.
    pub missing_directories: Vec<MissingDirectory>,
    /// Snapshot copies (`.hpp-snapshots/<uid>`) whose HostPathSnapshot is gone: `name` is the
    /// snapshot's UID.
    pub orphan_snapshot_copies: Vec<OrphanDirectory>,
}

/// A directory that matches no PV.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OrphanDirectory {
    /// Directory name under the pool root.
    pub name: String,
    /// Bytes it holds.
    pub bytes: u64,
}

/// A PV whose directory is missing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MissingDirectory {
    /// PV name.
    pub pv: String,
    /// Its `hostPath.path`.
    pub path: String,
}

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Something is wrong: the exit code is 1.
    Problem,
    /// Worth a look; the exit code stays 0.
    Warning,
}

/// One thing found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Problem or warning.
    pub severity: Severity,
    /// The pool, or null for the node as a whole.
    pub pool: Option<String>,
    /// Stable identifier of the check (`pool_full`, `orphan_directory`, ...).
    pub check: &'static str,
    /// What was found and what to do.
    pub message: String,
}

/// The report as a table, one block per pool, then the findings.
pub fn render_table(report: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "hostpath-provisioner doctor: node {}, provisioner {}", report.node, report.provisioner);
    let api = match &report.api {
        ApiCheck::Checked => "checked".to_owned(),
        ApiCheck::Skipped => {
            "not asked (no --kubeconfig and not in a pod): orphans and missing directories not checked".to_owned()
        }
        ApiCheck::Failed(why) => format!("FAILED: {why}"),
    };
    let _ = writeln!(out, "API: {api}");
    for pool in &report.pools {
        out.push('\n');
        let mut rows: Vec<(&str, String)> = Vec::new();
        let shared = if pool.shared_pool { " (shared pool)" } else { "" };
        rows.push(("pool", format!("{} {}{shared}", pool.name, pool.path)));
        if let Some(error) = &pool.error {
            rows.push(("error", error.clone()));
        }
        if let Some(fs) = &pool.filesystem {
            let source = fs.source.as_deref().map(|s| format!(" on {s}")).unwrap_or_default();
            let ro = if fs.read_only { ", read-only" } else { "" };
            rows.push(("filesystem", format!("{}{source}{ro}", fs.fs_type)));
            let mount = match (&fs.mount_point, fs.is_mount_point) {
                (_, true) => match fs.mount_root.as_deref() {
                    Some(root) if root != "/" => {
                        format!("yes (a bind mount of {root} of {})", fs.source.as_deref().unwrap_or("its filesystem"))
                    }
                    _ => "yes".to_owned(),
                },
                (Some(on), false) => format!("no (a directory of the mount at {on})"),
                (None, false) => "no".to_owned(),
            };
            rows.push(("mount point", mount));
            let shared = match fs.shares_os_disk {
                Some(true) => "yes (a full pool fills the disk the node needs)",
                Some(false) => "no",
                None => "unknown (no /etc/hosts mount from the kubelet, and / is not a disk)",
            };
            rows.push(("is on OS disk", shared.to_owned()));
            rows.push((
                "space",
                format!(
                    "{} available of {}, reserve {}",
                    size(fs.available_bytes),
                    size(fs.size_bytes),
                    size(pool.reserve_bytes)
                ),
            ));
            if let Some(promised) = pool.promised_bytes {
                let room = fs.size_bytes.saturating_sub(pool.reserve_bytes).saturating_sub(promised);
                rows.push((
                    "promised",
                    format!(
                        "{} requested by volumes, {} not promised (accounting: {})",
                        size(promised),
                        size(room),
                        pool.accounting
                    ),
                ));
            }
            if fs.inodes_total > 0 {
                rows.push(("inodes", format!("{} available of {}", fs.inodes_available, fs.inodes_total)));
            }
            rows.push(("reflink", fs.reflink.clone()));
            let options = if fs.quota_options.is_empty() { "none".to_owned() } else { fs.quota_options.join(",") };
            let verdict = match &fs.quota_missing {
                Some(missing) => format!("{} (quota: enforce refused: {missing})", fs.quota),
                None => format!("{} (quota: enforce served)", fs.quota),
            };
            rows.push(("quota", format!("{verdict}; mount options: {options}")));
            let selinux = match &fs.selinux {
                None => "off".to_owned(),
                Some(s) => format!("{}, root labelled {}", s.mode, s.label.as_deref().unwrap_or("(unreadable)")),
            };
            rows.push(("selinux", selinux));
        }
        match &pool.volumes {
            Some(v) => {
                rows.push(("volumes", format!("{} of this node's PVs here", v.expected)));
                rows.push((
                    "missing",
                    list_or_none(v.missing_directories.iter().map(|m| format!("{} ({})", m.pv, m.path))),
                ));
                rows.push((
                    "orphans",
                    list_or_none(v.orphan_directories.iter().map(|o| format!("{} ({})", o.name, size(o.bytes)))),
                ));
                if !v.orphan_snapshot_copies.is_empty() {
                    rows.push((
                        "orphan copies",
                        list_or_none(
                            v.orphan_snapshot_copies.iter().map(|o| format!("{} ({})", o.name, size(o.bytes))),
                        ),
                    ));
                }
            }
            None if pool.error.is_none() => rows.push(("volumes", "not checked (no API access)".to_owned())),
            None => {}
        }
        if let Some(t) = &pool.trash {
            let entries = if t.entries == 1 { "entry" } else { "entries" };
            rows.push(("trash", format!("{} {entries}, {}, {} stuck", t.entries, size(t.bytes), t.stuck)));
            if t.staged > 0 {
                rows.push(("staged", format!("{} waiting for deletion, {}", t.staged, size(t.staged_bytes))));
            }
        }
        let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
        for (key, value) in rows {
            let _ = writeln!(out, "  {key:<width$}  {value}");
        }
    }
    if let Some(block) = &report.block {
        render_block(block, &mut out);
    }
    out.push('\n');
    if report.findings.is_empty() {
        out.push_str("No problems found.\n");
    }
    for finding in &report.findings {
        let tag = match finding.severity {
            Severity::Problem => "PROBLEM",
            Severity::Warning => "warning",
        };
        let pool = finding.pool.as_deref().map(|p| format!(" [{p}]")).unwrap_or_default();
        let _ = writeln!(out, "{tag}{pool} {}: {}", finding.check, finding.message);
    }
    let _ = writeln!(out, "exit code {}", report.exit_code);
    out
}

/// The Block section: each volume with its loop, then every loop with the volume it holds.
fn render_block(block: &BlockReport, out: &mut String) {
    out.push('\n');
    let _ = writeln!(out, "Block volumes (device nodes in {}):", block.device_dir);
    if block.volumes.is_empty() {
        let _ = writeln!(out, "  none on this node");
    }
    for volume in &block.volumes {
        let held = volume.loop_number.map(|n| format!("loop{n}")).unwrap_or_else(|| "no loop".to_owned());
        let _ = writeln!(out, "  {}  {}  {held}  {}", volume.pv, volume.node, volume.state);
    }
    let _ = writeln!(out, "Loop devices:");
    if block.loops.is_empty() {
        let _ = writeln!(out, "  none read");
    }
    for seen in &block.loops {
        let volume = seen.volume.as_deref().unwrap_or("(no Block volume of this node)");
        let _ = writeln!(out, "  loop{}  {}  {volume}", seen.number, seen.backing_file);
    }
}

/// A byte count for people, `0 B` included.
pub fn size(bytes: u64) -> String {
    if bytes == 0 { "0 B".to_owned() } else { format_size(bytes) }
}

fn list_or_none(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.collect();
    if items.is_empty() { "none".to_owned() } else { items.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            node: "node-a".into(),
            provisioner: "kubevirt.io/hostpath-provisioner".into(),
            api: ApiCheck::Checked,
            pools: vec![PoolReport {
                name: "legacy".into(),
                path: "/var/hpvolumes".into(),
                reserve_bytes: 1 << 30,
                accounting: "requests",
                promised_bytes: Some(70 << 30),
                filesystem: Some(FilesystemReport {
                    fs_type: "xfs".into(),
                    source: Some("/dev/sdb".into()),
                    mount_point: Some("/var/hpvolumes".into()),
                    is_mount_point: true,
                    shares_os_disk: Some(false),
                    size_bytes: 100 << 30,
                    available_bytes: 40 << 30,
                    reflink: "supported".into(),
                    quota_options: vec!["prjquota".into()],
                    quota: "project".into(),
                    selinux: Some(SelinuxReport {
                        mode: "enforcing".into(),
                        label: Some("system_u:object_r:container_file_t:s0".into()),
                    }),
                    ..Default::default()
                }),
                trash: Some(TrashReport { entries: 2, bytes: 4096, stuck: 1, ..Default::default() }),
                volumes: Some(VolumesReport {
                    expected: 3,
                    orphan_directories: vec![OrphanDirectory { name: "pvc-1".into(), bytes: 8192 }],
                    missing_directories: vec![],
                    orphan_snapshot_copies: vec![],
                }),
                ..Default::default()
            }],
            block: Some(BlockReport {
                device_dir: "/dev/hostpath-provisioner".into(),
                volumes: vec![BlockVolumeLine {
                    pv: "pvc-2".into(),
                    node: "/dev/hostpath-provisioner/pvc-2".into(),
                    loop_number: Some(3),
                    state: "ok",
                }],
                loops: vec![LoopLine {
                    number: 3,
                    backing_file: "/var/hpvolumes/pvc-2/block.img".into(),
                    volume: Some("pvc-2".into()),
                }],
            }),
            findings: vec![Finding {
                severity: Severity::Problem,
                pool: Some("legacy".into()),
                check: "orphan_directory",
                message: "pvc-1 holds 8 KiB".into(),
            }],
            exit_code: 1,
        }
    }

    #[test]
    fn the_table_shows_every_fact_and_finding() {
        let table = render_table(&report());
        for expected in [
            "node node-a",
            "API: checked",
            "pool           legacy /var/hpvolumes",
            "filesystem     xfs on /dev/sdb",
            "mount point    yes",
            "is on OS disk  no",
            "space          40 GiB available of 100 GiB, reserve 1 GiB",
            "promised       70 GiB requested by volumes, 29 GiB not promised (accounting: requests)",
            "reflink        supported",
            "quota          project (quota: enforce served); mount options: prjquota",
            "selinux        enforcing, root labelled system_u:object_r:container_file_t:s0",
            "orphans        pvc-1 (8 KiB)",
            "missing        none",
            "trash          2 entries, 4 KiB, 1 stuck",
            "volumes        3 of this node's PVs here",
            "Block volumes (device nodes in /dev/hostpath-provisioner):",
            "  pvc-2  /dev/hostpath-provisioner/pvc-2  loop3  ok",
            "  loop3  /var/hpvolumes/pvc-2/block.img  pvc-2",
            "PROBLEM [legacy] orphan_directory: pvc-1 holds 8 KiB",
            "exit code 1",
        ] {
            assert!(table.contains(expected), "{expected:?} missing from:\n{table}");
        }
    }

    #[test]
    fn a_bind_mounted_pool_says_which_directory_of_which_disk_it_is() {
        let mut report = report();
        let fs = report.pools[0].filesystem.as_mut().unwrap();
        fs.mount_root = Some("/var/hpvolumes".into());
        fs.source = Some("/dev/sda1".into());
        fs.shares_os_disk = None;
        let table = render_table(&report);
        assert!(table.contains("mount point    yes (a bind mount of /var/hpvolumes of /dev/sda1)"), "{table}");
        assert!(table.contains("is on OS disk  unknown (no /etc/hosts mount"), "{table}");
    }

    #[test]
    fn json_field_names_are_the_documented_ones() {
        let json = serde_json::to_value(report()).unwrap();
        assert_eq!(json["api"]["status"], "checked");
        let pool = &json["pools"][0];
        assert_eq!(pool["filesystem"]["type"], "xfs");
        assert_eq!(pool["filesystem"]["shares_os_disk"], false);
        assert_eq!(pool["filesystem"]["mount_root"], serde_json::Value::Null);
        assert_eq!(pool["filesystem"]["selinux"]["mode"], "enforcing");
        assert_eq!(pool["volumes"]["orphan_directories"][0]["name"], "pvc-1");
        assert_eq!(pool["trash"]["stuck"], 1);
        assert_eq!(json["findings"][0]["severity"], "problem");
        assert_eq!(json["findings"][0]["check"], "orphan_directory");
        assert_eq!(json["exit_code"], 1);
        assert_eq!(json["block"]["device_dir"], "/dev/hostpath-provisioner");
        assert_eq!(json["block"]["volumes"][0]["loop_number"], 3);
        assert_eq!(json["block"]["volumes"][0]["state"], "ok");
        assert_eq!(json["block"]["loops"][0]["backing_file"], "/var/hpvolumes/pvc-2/block.img");
        assert_eq!(json["block"]["loops"][0]["volume"], "pvc-2");
        let failed = serde_json::to_value(ApiCheck::Failed("forbidden".into())).unwrap();
        assert_eq!(failed, serde_json::json!({"status": "failed", "detail": "forbidden"}));
    }
}

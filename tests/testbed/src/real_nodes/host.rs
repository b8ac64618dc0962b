//! What the real-node lane changes on the host, and how it is undone.
//!
//! Only one lane can run on a machine at a time: the kubelet hard-codes a few paths
//! (`/var/lib/kubelet/device-plugins`, `/var/log/containers`), libcni keeps results in
//! `/var/lib/cni/results`, and the `kubepods` cgroups have one name. So every lane takes an
//! exclusive `flock` on [`LANE_ROOT`]`/lock` (released by the kernel when its process dies),
//! works in the fixed directory [`LANE_ROOT`]`/lane`, and writes a state file before touching
//! anything. Cleanup reads only that state: the bridge and the iptables rule carry the lane's
//! own names, shims are found by the lane's socket path, pod processes by the `kubepods`
//! cgroups (which a lane refuses to start next to, see [`preflight`]), mounts by their path
//! under the lane directory. A lane that finds a state file (its predecessor died, e.g.
//! SIGKILLed by a CI timeout) runs the same cleanup before it starts.
//!
//! The lane directory is deliberately not a [`crate::process::TempDir`]: those are swept with
//! `remove_dir_all`, which would descend into a pod's bind mounts. Here everything below the
//! directory is unmounted first, and it is removed only when no mount is left under it.

use std::fs::{self, File};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;

/// Parent of the lock, the state file and the lane directory.
pub const LANE_ROOT: &str = "/var/lib/hpp-testbed-lane";
/// The pod bridge. Created by the lane (not by the CNI plugin), so that the API server and the
/// kubelet have its gateway address before the first pod exists.
pub const BRIDGE: &str = "hpplane0";
/// Pod network; the bridge holds [`GATEWAY`].
pub const POD_SUBNET: &str = "10.213.0.0/24";
pub const GATEWAY: &str = "10.213.0.1";
/// The `kubernetes` Service's ClusterIP (first address of `--service-cluster-ip-range`).
pub const SERVICE_IP: &str = "10.0.0.1";
/// Comment on the lane's DNAT rule; teardown deletes exactly the rules carrying it.
pub const RULE_COMMENT: &str = "hpp-testbed-lane";
/// CNI network name; libcni names its cache files after it.
pub const CNI_NETWORK: &str = "hpp-testbed-lane";

/// Paths outside the lane directory that the kubelet, containerd or libcni create whatever
/// they are configured with. Removed at cleanup only if they did not exist before the lane.
const HOST_PATHS: [&str; 6] = [
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/containerd",
    "/var/run/netns",
    "/usr/libexec/kubernetes",
];

/// Debian packages the lane needs, by the file that shows each is installed.
const PACKAGES: [(&str, &str); 9] = [
    ("/usr/bin/containerd", "containerd"),
    ("/usr/sbin/runc", "runc"),
    ("/bin/busybox", "busybox-static"),
    ("/usr/lib/cni/bridge", "containernetworking-plugins"),
    ("/usr/sbin/iptables", "iptables"),
    ("/usr/bin/gcc", "gcc"),
    ("/sbin/ip", "iproute2"),
    ("/usr/bin/file", "file"),
    ("/usr/bin/btrfs", "btrfs-progs"),
];

/// Why the lane cannot run here, or `Ok` (after installing missing packages when root).
pub fn preflight() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the real-node lane needs root (containerd, kubelet, mounts, iptables, cgroups)");
    }
    let missing: Vec<&str> =
        PACKAGES.iter().filter(|(file, _)| !Path::new(file).exists()).map(|(_, package)| *package).collect();
    if !missing.is_empty() {
        eprintln!("testbed: installing {} for the real-node lane", missing.join(" "));
        let update = Command::new("apt-get").args(["update", "-qq"]).status();
        let install = Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status();
        match (update, install) {
            (Ok(_), Ok(status)) if status.success() => {}
            other => bail!("apt-get install {} failed: {other:?}", missing.join(" ")),
        }
    }
    if !Path::new("/sys/fs/cgroup").is_dir() || cgroup_hierarchies().is_empty() {
        bail!("no cgroup file system mounted under /sys/fs/cgroup");
    }
    Ok(())
}

/// The lane's exclusive hold on the host; dropping it releases the lock.
pub struct LaneLock {
    _file: File,
}

/// Waits (up to `timeout`) for the machine-wide lane lock.
pub fn lock(timeout: Duration) -> Result<LaneLock> {
    fs::create_dir_all(LANE_ROOT).with_context(|| format!("creating {LANE_ROOT}"))?;
    let path = Path::new(LANE_ROOT).join("lock");
    let file = File::create(&path).with_context(|| format!("opening {}", path.display()))?;
    let started = Instant::now();
    let mut told = false;
    loop {
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(LaneLock { _file: file });
        }
        if started.elapsed() > timeout {
            bail!("another real-node lane held {} for {timeout:?}", path.display());
        }
        if !told {
            eprintln!("testbed: another test binary runs a real-node lane; waiting for {}", path.display());
            told = true;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The lane's working directory (fixed: one lane per machine).
pub fn lane_dir() -> PathBuf {
    Path::new(LANE_ROOT).join("lane")
}

fn state_path() -> PathBuf {
    Path::new(LANE_ROOT).join("state.json")
}

/// Records, before anything is created, which [`HOST_PATHS`] the lane will own.
pub fn write_state() -> Result<()> {
    let owned: Vec<&str> = HOST_PATHS.iter().copied().filter(|p| !Path::new(p).exists()).collect();
    let state = json!({
        "pid": std::process::id(),
        "dir": lane_dir(),
        "bridge": BRIDGE,
        "rule_comment": RULE_COMMENT,
        "owned_host_paths": owned,
    });
    fs::write(state_path(), serde_json::to_vec_pretty(&state)?).context("writing the lane state file")
}

/// If a previous lane left a state file (its process died before its teardown), undoes what
/// it made. Call with the lock held.
pub fn clean_stale_lane() -> Result<()> {
    let Ok(text) = fs::read_to_string(state_path()) else {
        return Ok(());
    };
    let state: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    eprintln!(
        "testbed: a previous real-node lane (pid {}) did not tear down; cleaning up after it",
        state["pid"].as_u64().unwrap_or(0)
    );
    cleanup(&state)
}

/// Undoes everything of the current lane (its processes must already be stopped or dead).
pub fn clean_current_lane() -> Result<()> {
    let text = fs::read_to_string(state_path()).context("reading the lane state file")?;
    let state: serde_json::Value = serde_json::from_str(&text).context("parsing the lane state file")?;
    cleanup(&state)
}

/// Refuses to start next to a kubelet that is not ours: its pods live in the same `kubepods`
/// cgroups that cleanup kills and removes.
pub fn ensure_no_foreign_kubelet() -> Result<()> {
    for hierarchy in cgroup_hierarchies() {
        if hierarchy.join("kubepods").exists() {
            bail!(
                "{} exists: another kubelet runs on this machine (or an unknown one died); \
                 the real-node lane would kill its pods, so it does not start",
                hierarchy.join("kubepods").display()
            );
        }
    }
    Ok(())
}

fn cleanup(state: &serde_json::Value) -> Result<()> {
    let dir = state["dir"].as_str().map(PathBuf::from).unwrap_or_else(lane_dir);
    let mut problems = Vec::new();

    // 1. Processes: pods (every task in the kubepods cgroups) and the shims that watched them
    // (found by our containerd socket on their command line), then a kubelet or containerd
    // that outlived a dead test binary (PDEATHSIG normally took them).
    for _ in 0..20 {
        let mut pids = kubepods_pids();
        pids.extend(pids_with_arg_under(&dir));
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() {
            break;
        }
        for pid in &pids {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe {
                libc::kill(*pid, libc::SIGKILL);
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }

    // The second node, if one ran: its processes, namespaces (with its veth pair) and cgroups.
    if let Err(err) = super::second_node::remove(&dir) {
        problems.push(format!("{err:#}"));
    }

    // 2. Mounts under the lane directory, deepest first: container root file systems, pod
    // volumes and tokens, the kubelet's own root dir bind, network namespaces, the pool.
    if let Err(err) = unmount_all_under(&dir) {
        problems.push(format!("{err:#}"));
    }

    // Loop devices of filesystem images in the lane directory (the quota pool): `mount -o
    // loop` asks the kernel to free them at unmount, but a lazy unmount of a busy mount frees
    // them only later, and a lane killed between losetup and mount never unmounts.
    if let Err(err) = detach_loop_devices_under(&dir) {
        problems.push(format!("{err:#}"));
    }

    // 3. The kubelet's cgroups, in every v1 hierarchy (or the v2 tree).
    for hierarchy in cgroup_hierarchies() {
        let root = hierarchy.join("kubepods");
        if root.exists()
            && let Err(err) = remove_cgroup_tree(&root)
        {
            problems.push(format!("{err:#}"));
        }
    }

    // 4. Network: our DNAT rule(s), our bridge (the veths went with their namespaces).
    let comment = state["rule_comment"].as_str().unwrap_or(RULE_COMMENT);
    if let Err(err) = delete_rules_with_comment(comment) {
        problems.push(format!("{err:#}"));
    }
    let bridge = state["bridge"].as_str().unwrap_or(BRIDGE);
    if Path::new("/sys/class/net").join(bridge).exists() {
        let _ = Command::new("ip").args(["link", "delete", bridge]).status();
    }

    // 5. Files the components put outside the lane directory.
    let owned: Vec<String> = state["owned_host_paths"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    for path in HOST_PATHS {
        let path = Path::new(path);
        if owned.iter().any(|o| Path::new(o) == path) {
            if mounts_under(path).is_empty() {
                let _ = fs::remove_dir_all(path);
            } else {
                problems.push(format!("{} still has mounts; left in place", path.display()));
            }
        }
    }
    // Where those directories existed before, only our own entries go.
    remove_matching(Path::new("/var/lib/cni/results"), |name| name.starts_with(CNI_NETWORK));
    remove_dangling_links(Path::new("/var/log/containers"), &dir);

    // 6. The lane directory itself, once nothing is mounted below it.
    if dir.exists() {
        if mounts_under(&dir).is_empty() {
            if let Err(err) = fs::remove_dir_all(&dir) {
                problems.push(format!("removing {}: {err}", dir.display()));
            }
        } else {
            problems.push(format!("{} still has mounts; left in place", dir.display()));
        }
    }
    let _ = fs::remove_file(state_path());
    if problems.is_empty() { Ok(()) } else { Err(anyhow!("lane cleanup incomplete: {}", problems.join("; "))) }
}

/// Mount points (as the kernel lists them) at or below `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut mounts: Vec<PathBuf> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount_path(p)))
        .filter(|p| p.starts_with(dir))
        .collect();
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    mounts.dedup();
    mounts
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mount_path(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(octal) = raw.get(i + 1..i + 4)
            && let Ok(value) = u8::from_str_radix(octal, 8)
        {
            out.push(value);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn unmount_all_under(dir: &Path) -> Result<()> {
    // A mount can hide others below it and a lazy unmount detaches whole subtrees, so repeat.
    for _ in 0..10 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return Ok(());
        }
        for mount in mounts {
            let Ok(c_path) = std::ffi::CString::new(mount.as_os_str().as_encoded_bytes()) else {
                continue;
            };
            // SAFETY: a valid NUL-terminated path. MNT_DETACH: a busy mount is still detached.
            unsafe {
                libc::umount2(c_path.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
    let left = mounts_under(dir);
    if left.is_empty() { Ok(()) } else { bail!("mounts left under {}: {left:?}", dir.display()) }
}

/// Loop-mounts a new `size_mib` MiB btrfs (in the file `<dir>.img`) on `dir`, shared, and
/// enables quota on it, as an admin does once for a quota pool. Under the lane directory, so that cleanup
/// unmounts it, detaches its loop device and removes the file.
pub fn mount_btrfs_with_quota(dir: &Path, size_mib: u64) -> Result<()> {
    let image = dir.with_extension("img");
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    File::create(&image)
        .and_then(|f| f.set_len(size_mib << 20))
        .with_context(|| format!("creating {}", image.display()))?;
    run(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&image))?;
    run(Command::new("mount").arg("-o").arg("loop").arg(&image).arg(dir))?;
    // Shared itself (not a bind of itself, as the other pools: containerd checks the lowest
    // mount on the path, which would stay private).
    run(Command::new("mount").arg("--make-shared").arg(dir))?;
    run(Command::new("btrfs").args(["quota", "enable"]).arg(dir))
}

/// Detaches every loop device whose backing file is under `dir`.
fn detach_loop_devices_under(dir: &Path) -> Result<()> {
    let mut left = Vec::new();
    for entry in fs::read_dir("/sys/block").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(backing) = fs::read_to_string(entry.path().join("loop/backing_file")) else { continue };
        // The kernel appends " (deleted)" once the file is gone.
        let backing = backing.trim().trim_end_matches(" (deleted)");
        if Path::new(backing).starts_with(dir) {
            let device = format!("/dev/{name}");
            if let Err(err) = run(Command::new("losetup").args(["-d", &device])) {
                left.push(format!("{device} ({backing}): {err:#}"));
            }
        }
    }
    if left.is_empty() { Ok(()) } else { bail!("loop devices left: {}", left.join("; ")) }
}

/// Mount points of every cgroup hierarchy (v1 controllers, named ones, the v2 tree).
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let (_, after) = line.split_once(" - ")?;
            let fstype = after.split(' ').next()?;
            let mount_point = line.split(' ').nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .collect()
}

fn kubepods_pids() -> Vec<libc::pid_t> {
    pids_in_cgroup("kubepods")
}

/// Every task in cgroup `name` (relative to each hierarchy's root) and below it.
pub(crate) fn pids_in_cgroup(name: &str) -> Vec<libc::pid_t> {
    let mut pids = Vec::new();
    for hierarchy in cgroup_hierarchies() {
        collect_procs(&hierarchy.join(name), &mut pids);
    }
    pids
}

fn collect_procs(dir: &Path, pids: &mut Vec<libc::pid_t>) {
    if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<libc::pid_t>().ok()));
    }
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_procs(&entry.path(), pids);
            }
        }
    }
}

/// Processes with an argument naming a path under `dir` (our kubelet, containerd and shims;
/// shims get `-address <dir>/containerd.sock`), except this process.
pub(crate) fn pids_with_arg_under(dir: &Path) -> Vec<libc::pid_t> {
    let me = std::process::id();
    let needle = dir.to_string_lossy().into_owned();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != me)
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmd| cmd.split(|b| *b == 0).any(|arg| String::from_utf8_lossy(arg).contains(&needle)))
        })
        .filter_map(|pid| libc::pid_t::try_from(pid).ok())
        .collect()
}

pub(crate) fn remove_cgroup_tree(dir: &Path) -> Result<()> {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&entry.path())?;
            }
        }
    }
    // A cgroup whose last task just died can report EBUSY for a moment.
    for _ in 0..20 {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    fs::remove_dir(dir).with_context(|| format!("removing cgroup {}", dir.display()))
}

/// Appends the DNAT rule that stands in for kube-proxy: the `kubernetes` Service to the API
/// server on the bridge gateway.
pub fn add_service_rule(apiserver_port: u16) -> Result<()> {
    run(Command::new("iptables").args(service_rule(apiserver_port)))
}

/// The arguments of `iptables` for the Service rule, here and in a second node's network
/// namespace (tagged with the lane's comment, which cleanup looks for on the host).
pub fn service_rule(apiserver_port: u16) -> Vec<String> {
    let destination = format!("{GATEWAY}:{apiserver_port}");
    [
        "-w",
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-d",
        &format!("{SERVICE_IP}/32"),
        "-p",
        "tcp",
        "--dport",
        "443",
        "-m",
        "comment",
        "--comment",
        RULE_COMMENT,
        "-j",
        "DNAT",
        "--to-destination",
        &destination,
    ]
    .into_iter()
    .map(str::to_owned)
    .collect()
}

fn delete_rules_with_comment(comment: &str) -> Result<()> {
    if !Path::new("/usr/sbin/iptables").exists() {
        return Ok(());
    }
    for chain in ["PREROUTING", "OUTPUT"] {
        let output = Command::new("iptables").args(["-w", "-t", "nat", "-S", chain]).output()?;
        for rule in String::from_utf8_lossy(&output.stdout).lines() {
            if !rule.contains(&format!("--comment {comment}")) && !rule.contains(&format!("--comment \"{comment}\"")) {
                continue;
            }
            let Some(spec) = rule.strip_prefix("-A ") else { continue };
            let mut args = vec!["-w".to_string(), "-t".into(), "nat".into(), "-D".into()];
            args.extend(spec.split_whitespace().map(|s| s.trim_matches('"').to_string()));
            run(Command::new("iptables").args(&args))?;
        }
    }
    Ok(())
}

/// Creates the pod bridge with the gateway address, up.
pub fn create_bridge() -> Result<()> {
    if Path::new("/sys/class/net").join(BRIDGE).exists() {
        bail!("network interface {BRIDGE} already exists (a lane that was not cleaned up?)");
    }
    run(Command::new("ip").args(["link", "add", BRIDGE, "type", "bridge"]))?;
    run(Command::new("ip").args(["addr", "add", &format!("{GATEWAY}/24"), "dev", BRIDGE]))?;
    run(Command::new("ip").args(["link", "set", BRIDGE, "up"]))
}

/// Makes `dir` a shared mount of itself: containerd refuses `mountPropagation:
/// HostToContainer` (the DaemonSet's pool volume) from a private mount, and `/` is private
/// on a machine without systemd.
pub fn make_shared_mount(dir: &Path) -> Result<()> {
    let c_path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: valid NUL-terminated paths; null fs type and data are allowed for these flags.
    unsafe {
        if libc::mount(c_path.as_ptr(), c_path.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("bind-mounting {}", dir.display()));
        }
        if libc::mount(std::ptr::null(), c_path.as_ptr(), std::ptr::null(), libc::MS_SHARED, std::ptr::null()) != 0 {
            return Err(std::io::Error::last_os_error()).with_context(|| format!("making {} shared", dir.display()));
        }
    }
    Ok(())
}

fn remove_matching(dir: &Path, matches: impl Fn(&str) -> bool) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_name().to_str().is_some_and(&matches) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

/// The kubelet links each container log into `/var/log/containers`; ours point into `dir`.
fn remove_dangling_links(links: &Path, dir: &Path) {
    if let Ok(entries) = fs::read_dir(links) {
        for entry in entries.flatten() {
            if fs::read_link(entry.path()).is_ok_and(|target| target.starts_with(dir)) {
                let _ = fs::remove_file(entry.path());
            }
        }
    }
}

pub(crate) fn run(command: &mut Command) -> Result<()> {
    let output = command.output().with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mount_path(r"/a\040b"), "/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
    }
}

//! A second real node on the same machine, made the way kind makes its nodes, with plain
//! Linux instead of a container: its own network namespace, its own mount namespace, its own
//! containerd and kubelet, and its own cgroup subtree.
//!
//! - **Network.** A network namespace held open by a file under the node's directory, joined to
//!   the host by a veth pair ([`HOST_VETH`] `10.214.0.1/30` on the host, [`NODE_VETH`]
//!   [`NODE_IP`] in the node, which is the Node's InternalIP). The node has a pod bridge of its
//!   own with [`POD_SUBNET`] (the host routes that subnet to the node), and its own DNAT rule
//!   for the `kubernetes` Service, to the API server on the host. The kubelet reaches the API
//!   server at the host's bridge gateway, which its certificate names.
//! - **Files.** A mount namespace (private propagation, so nothing the node mounts reaches the
//!   host and nothing node 1 mounts later reaches the node) in which the paths the kubelet,
//!   containerd and libcni use whatever they are told ([`PRIVATE_HOST_PATHS`]) are the node's
//!   own directories, and so are the DaemonSet's local pools: the node sees its own disk at the
//!   pool paths node 1 uses, as two machines would. The shared pool (`nfs`) is the same
//!   directory on both nodes, standing in for a network filesystem. Node 1's mounts copied into
//!   the namespace when it was made are detached there, so that they do not stay pinned.
//!   Every mount there is shared (among the node's own), and `/proc/1/mountinfo` shows the
//!   node's mounts, as on a machine of its own ([`stand_in_for_init`] says why).
//! - **Processes.** containerd and the kubelet run through `nsenter` (which execs them, so the
//!   PID and the spawner's death signal are theirs); the kubelet's `cgroupRoot` is
//!   [`CGROUP_ROOT`], so its pods are under `/hpp-node2/kubepods`, apart from node 1's.
//!
//! Everything is removed by [`remove`] (the node leaving) and by the lane's cleanup, which
//! calls the same function: the processes are killed, the namespace files unmounted (which
//! ends both namespaces, their mounts, the veth pair and the route), and the cgroups removed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::host::{self, run};
use super::node::{Namespaces, NodeLayout};

/// The second node's name.
pub const NODE2_NAME: &str = "real-node-2";
/// The host end of the veth pair.
pub const HOST_VETH: &str = "hpp2host";
/// The node's end of the veth pair (inside its namespace).
pub const NODE_VETH: &str = "hpp2node";
const HOST_LINK_IP: &str = "10.214.0.1";
/// The second node's address (its InternalIP).
pub const NODE_IP: &str = "10.214.0.2";
/// The second node's pod network and its bridge's address.
pub const POD_SUBNET: &str = "10.213.1.0/24";
pub const POD_GATEWAY: &str = "10.213.1.1";
/// The second kubelet's cgroup root, in every hierarchy.
pub const CGROUP_ROOT: &str = "hpp-node2";
/// Paths that the kubelet, containerd or libcni use whatever they are configured with; the
/// second node gets its own directory at each (node 1 uses the host's).
pub const PRIVATE_HOST_PATHS: [&str; 4] =
    ["/var/lib/kubelet", "/var/log/containers", "/var/lib/cni", "/run/containerd"];

/// The second node's directory under the lane directory.
pub fn node_dir(lane_dir: &Path) -> PathBuf {
    lane_dir.join("node2")
}

/// The host directory that the second node sees at `pool` (one of its local pools).
pub fn own_pool_dir(lane_dir: &Path, pool: &Path) -> PathBuf {
    let name = pool.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    node_dir(lane_dir).join("disk").join(name)
}

fn namespaces(dir: &Path) -> Namespaces {
    Namespaces { net: dir.join("ns/net"), mount: dir.join("ns/mnt") }
}

/// Makes the second node's namespaces, network and cgroups. `local_pools` get directories of
/// the node's own, `shared_pools` stay the host's; `node1_mounts` are detached in the node.
/// The DNAT rule sends the Service IP to the API server's `apiserver_port`.
pub fn create(
    lane_dir: &Path,
    local_pools: &[&Path],
    shared_pools: &[&Path],
    node1_mounts: &[PathBuf],
    apiserver_port: u16,
) -> Result<NodeLayout> {
    let dir = node_dir(lane_dir);
    let ns = namespaces(&dir);
    let ns_dir = dir.join("ns");
    fs::create_dir_all(&ns_dir)?;
    // Namespace files can be bind-mounted only on a private mount (a shared one could
    // propagate the namespace into itself).
    run(Command::new("mount").arg("--bind").arg(&ns_dir).arg(&ns_dir))?;
    run(Command::new("mount").arg("--make-private").arg(&ns_dir))?;
    fs::write(&ns.net, "")?;
    fs::write(&ns.mount, "")?;

    // The mount namespace's contents, set up by a shell inside it before anything runs there.
    let quote = |p: &Path| format!("'{}'", p.display().to_string().replace('\'', r"'\''"));
    let mut script = String::from("set -e\n");
    for mount in node1_mounts {
        script.push_str(&format!("umount -l {} 2>/dev/null || true\n", quote(mount)));
    }
    for path in PRIVATE_HOST_PATHS {
        let own = dir.join("host").join(path.trim_start_matches('/').replace('/', "-"));
        fs::create_dir_all(&own)?;
        fs::create_dir_all(path).with_context(|| format!("creating {path}"))?;
        script.push_str(&format!("mount --bind {} {}\n", quote(&own), quote(Path::new(path))));
    }
    for pool in local_pools {
        let own = own_pool_dir(lane_dir, pool);
        fs::create_dir_all(&own)?;
        // Node 1's mount there (the pool a shared bind of itself) goes first: containerd
        // judges a path by the lowest of the mounts stacked on it.
        script.push_str(&format!("umount -l {} 2>/dev/null || true\n", quote(pool)));
        script.push_str(&format!("mount --bind {} {}\n", quote(&own), quote(pool)));
        // Shared, for the DaemonSet's HostToContainer mount (as on the host).
        script.push_str(&format!("mount --make-shared {}\n", quote(pool)));
    }
    for pool in shared_pools {
        script.push_str(&format!("mount --make-shared {}\n", quote(pool)));
    }
    // Every mount of the node shared among the node's own mounts, as systemd makes a host's:
    // a CSI driver's containers mount the kubelet's pod directory Bidirectional, and the
    // kubevirt pool mounter the node's `/`, which containerd refuses on a private mount. The
    // peers are new ones, inside the node: nothing reaches the host.
    script.push_str("mount --make-rshared /\n");
    run(Command::new("unshare")
        .arg(format!("--net={}", ns.net.display()))
        .arg(format!("--mount={}", ns.mount.display()))
        .args(["--propagation", "private", "--", "sh", "-c", &script]))
    .context("making the second node's namespaces")?;
    stand_in_for_init(&dir, &ns)?;

    // The veth pair, made inside the node with its peer sent to this process's namespace.
    let in_node = |args: &[&str]| -> Result<()> {
        run(Command::new("nsenter").arg(format!("--net={}", ns.net.display())).arg("--").args(args))
    };
    let me = std::process::id().to_string();
    in_node(&["ip", "link", "add", NODE_VETH, "type", "veth", "peer", "name", HOST_VETH, "netns", &me])?;
    run(Command::new("ip").args(["addr", "add", &format!("{HOST_LINK_IP}/30"), "dev", HOST_VETH]))?;
    run(Command::new("ip").args(["link", "set", HOST_VETH, "up"]))?;
    in_node(&["ip", "link", "set", "lo", "up"])?;
    in_node(&["ip", "addr", "add", &format!("{NODE_IP}/30"), "dev", NODE_VETH])?;
    in_node(&["ip", "link", "set", NODE_VETH, "up"])?;
    in_node(&["ip", "route", "add", "default", "via", HOST_LINK_IP])?;
    // The node's pod bridge (same name as node 1's: it is another namespace).
    in_node(&["ip", "link", "add", host::BRIDGE, "type", "bridge"])?;
    in_node(&["ip", "addr", "add", &format!("{POD_GATEWAY}/24"), "dev", host::BRIDGE])?;
    in_node(&["ip", "link", "set", host::BRIDGE, "up"])?;
    in_node(&["sysctl", "-qw", "net.ipv4.ip_forward=1"])?;
    // Answers to the node's pods (the API server's replies) go back through the veth.
    run(Command::new("ip").args(["route", "add", POD_SUBNET, "via", NODE_IP, "dev", HOST_VETH]))?;
    let rule = host::service_rule(apiserver_port);
    in_node(&std::iter::once("iptables").chain(rule.iter().map(String::as_str)).collect::<Vec<_>>())?;

    // The cgroup root must exist before the kubelet starts (it checks); cpuset needs its
    // CPUs and memory nodes before children can hold tasks.
    for hierarchy in host::cgroup_hierarchies() {
        let root = hierarchy.join(CGROUP_ROOT);
        fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = fs::read_to_string(hierarchy.join(file)) {
                let _ = fs::write(root.join(file), value.trim());
            }
        }
    }

    Ok(NodeLayout {
        dir,
        bridge: host::BRIDGE.into(),
        pod_subnet: POD_SUBNET.into(),
        gateway: POD_GATEWAY.into(),
        node_ip: NODE_IP.into(),
        namespaces: Some(ns),
        cgroup_root: Some(format!("/{CGROUP_ROOT}")),
    })
}

/// A process that lives in the node's mount namespace for as long as the node, whose mount
/// table the node sees at `/proc/1/mountinfo`: on a machine of its own, PID 1 (init) is in the
/// node's mount namespace and programs read the node's mounts there (the kubevirt pool
/// mounter looks for the kubelet's pod mounts in it after a chroot to the node's `/`). The node
/// shares the machine's PID namespace, whose PID 1 is the machine's init with the machine's
/// mounts; the node's own is bound over that file in the node's namespace only (live: reading
/// it reads the process's table). The process, `tail -f` on a file under the node's
/// directory, is found and killed by [`remove`] with the node's others; its mountinfo then
/// reads as an error, never as another node's table.
fn stand_in_for_init(dir: &Path, ns: &Namespaces) -> Result<()> {
    let marker = dir.join("init-stand-in");
    fs::write(&marker, "")?;
    let mut process = Command::new("nsenter")
        .arg(format!("--mount={}", ns.mount.display()))
        .args(["--", "tail", "-f"])
        .arg(&marker)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("starting the node's stand-in for init")?;
    // nsenter execs tail: the PID is the process in the node's namespace once it has entered.
    let pid = process.id();
    std::thread::spawn(move || process.wait());
    let entered = || {
        fs::read_link(format!("/proc/{pid}/ns/mnt")).ok() != fs::read_link("/proc/self/ns/mnt").ok()
            && fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe.ends_with("tail"))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !entered() {
        anyhow::ensure!(std::time::Instant::now() < deadline, "the node's stand-in for init did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    run(Command::new("nsenter").arg(format!("--mount={}", ns.mount.display())).args([
        "--",
        "mount",
        "--bind",
        &format!("/proc/{pid}/mountinfo"),
        "/proc/1/mountinfo",
    ]))
    .context("binding the node's mount table at /proc/1/mountinfo")
}

/// The PID (host view) of the process whose mount namespace is the second node's (see
/// [`stand_in_for_init`]): `/proc/<pid>/root` is the node's `/`, with the node's mounts.
pub fn init_stand_in_pid(lane_dir: &Path) -> Option<u32> {
    let marker = node_dir(lane_dir).join("init-stand-in");
    let pid = host::pids_with_arg_under(&marker).into_iter().next()?;
    u32::try_from(pid).ok()
}

/// Removes what [`create`] made and what ran there: the processes (pods in the node's cgroups,
/// shims, containerd and the kubelet, found by the node directory on their command line), the
/// namespaces (unmounting their files ends them, and with the network namespace go the veth
/// pair and the route), and the cgroups. Idempotent; the node's files stay for the lane's
/// cleanup (they may hold logs).
pub fn remove(lane_dir: &Path) -> Result<()> {
    let dir = node_dir(lane_dir);
    for _ in 0..20 {
        let mut pids = host::pids_in_cgroup(CGROUP_ROOT);
        pids.extend(host::pids_with_arg_under(&dir));
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
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    let mut problems = Vec::new();
    // Deleting one end deletes the pair, and the route with it (the namespace's own teardown
    // would too, but later, from a kernel work queue).
    if Path::new("/sys/class/net").join(HOST_VETH).exists()
        && let Err(err) = run(Command::new("ip").args(["link", "delete", HOST_VETH]))
    {
        problems.push(format!("{err:#}"));
    }
    let ns = namespaces(&dir);
    for file in [&ns.net, &ns.mount, &dir.join("ns")] {
        if host::mounts_under(file).iter().any(|m| m == file)
            && let Ok(c_path) = std::ffi::CString::new(file.as_os_str().as_encoded_bytes())
        {
            // SAFETY: a valid NUL-terminated path.
            unsafe {
                libc::umount2(c_path.as_ptr(), libc::MNT_DETACH);
            }
        }
    }
    for hierarchy in host::cgroup_hierarchies() {
        let root = hierarchy.join(CGROUP_ROOT);
        if root.exists()
            && let Err(err) = host::remove_cgroup_tree(&root)
        {
            problems.push(format!("{err:#}"));
        }
    }
    if problems.is_empty() { Ok(()) } else { anyhow::bail!("second node not fully removed: {}", problems.join("; ")) }
}

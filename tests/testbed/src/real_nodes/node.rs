//! One real node: containerd and a kubelet, configured to keep their files in the lane
//! directory. Settings and the reason for each: `docs/testing.md`, the real-node lane.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;

use super::host::{BRIDGE, CNI_NETWORK, GATEWAY, POD_SUBNET};
use super::images::PAUSE_IMAGE;
use crate::kubeconfig::Connection;
use crate::process::{ManagedChild, ProcessSpec, free_port, tail_file};

/// Files, network and cgroups of one node.
#[derive(Clone, Debug)]
pub struct NodeLayout {
    /// Under the lane directory: configs, logs, containerd's and the kubelet's state.
    pub dir: PathBuf,
    /// The pod bridge (made by the lane before the node starts), its subnet and gateway.
    pub bridge: String,
    pub pod_subnet: String,
    pub gateway: String,
    /// The node's InternalIP: where the API server reaches its kubelet.
    pub node_ip: String,
    /// Network and mount namespaces the node's processes run in (`None`: the host's).
    pub namespaces: Option<Namespaces>,
    /// The kubelet's `cgroupRoot` (`None`: `/`, so its pods are under `/kubepods`).
    pub cgroup_root: Option<String>,
}

/// Files that hold a node's own namespaces open (`nsenter --net= --mount=` takes them).
#[derive(Clone, Debug)]
pub struct Namespaces {
    pub net: PathBuf,
    pub mount: PathBuf,
}

impl NodeLayout {
    /// The node that runs on the host itself: the lane's bridge, the host's namespaces.
    pub fn host_node(dir: PathBuf) -> NodeLayout {
        NodeLayout {
            dir,
            bridge: BRIDGE.into(),
            pod_subnet: POD_SUBNET.into(),
            gateway: GATEWAY.into(),
            node_ip: GATEWAY.into(),
            namespaces: None,
            cgroup_root: None,
        }
    }

    /// `program` with `args`, run inside the node's namespaces (through `nsenter`, which
    /// execs it: the PID, and the death signal the spawner sets, stay the program's).
    fn command(&self, program: PathBuf, args: Vec<String>) -> (PathBuf, Vec<String>) {
        match &self.namespaces {
            None => (program, args),
            Some(ns) => {
                let mut wrapped = vec![
                    format!("--net={}", ns.net.display()),
                    format!("--mount={}", ns.mount.display()),
                    "--".into(),
                    program.display().to_string(),
                ];
                wrapped.extend(args);
                (PathBuf::from("nsenter"), wrapped)
            }
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }
    pub fn pod_logs(&self) -> PathBuf {
        self.dir.join("pod-logs")
    }
    /// The kubelet's `--root-dir`. A node in namespaces of its own (the second node) has a
    /// private `/var/lib/kubelet` and uses it, as kubelets do by default: CSI drivers deployed
    /// from their upstream manifests (the kubevirt one) find the kubelet's sockets and pod
    /// directories only there. The host node keeps a directory of the lane's own, so the lane
    /// never writes into the host's `/var/lib/kubelet`.
    pub fn kubelet_root(&self) -> PathBuf {
        match self.namespaces {
            Some(_) => PathBuf::from("/var/lib/kubelet"),
            None => self.dir.join("kubelet"),
        }
    }
    pub fn containerd_log(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }
    pub fn kubelet_log(&self) -> PathBuf {
        self.dir.join("kubelet.log")
    }
}

/// containerd for one node.
pub fn start_containerd(layout: &NodeLayout) -> Result<ManagedChild> {
    let dir = &layout.dir;
    let cni_conf = dir.join("cni/net.d");
    fs::create_dir_all(&cni_conf)?;
    // The bridge exists already (the lane made it); the plugin attaches veths to it. No
    // loopback entry: containerd's CRI brings up `lo` with its own config.
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [{
            "type": "bridge",
            "bridge": layout.bridge,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{ "subnet": layout.pod_subnet, "gateway": layout.gateway }]],
                "routes": [{ "dst": "0.0.0.0/0" }],
                "dataDir": dir.join("cni/ipam"),
            },
        }],
    });
    fs::write(cni_conf.join("10-hpp-testbed.conflist"), serde_json::to_vec_pretty(&conflist)?)?;
    let d = dir.display();
    let config = format!(
        r#"version = 2
root = "{d}/containerd/root"
state = "{d}/containerd/state"
# Plugins with nothing to do here; btrfs, zfs and devmapper would only log errors.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{d}/containerd.sock"

[ttrpc]
  address = "{d}/containerd.sock.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  # The kubelet no longer takes --pod-infra-container-image: the sandbox image is set here.
  sandbox_image = "{PAUSE_IMAGE}"
  # CRI asks for oom_score_adj -998 on sandboxes; root without CAP_SYS_RESOURCE (as here)
  # cannot lower it, and runc then fails with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  # Network namespaces under the lane directory, not /var/run/netns: cleanup finds them there.
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # No systemd here: cgroupfs, as the kubelet's cgroupDriver.
        SystemdCgroup = false
        Root = "{d}/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d}/cni/net.d"
  # Where to pull from and whom to trust, per registry (`hosts.toml` files, read at each pull):
  # empty unless a scenario names a registry (`Lane::pull_through`).
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{d}/certs.d"
"#
    );
    let config_path = dir.join("containerd.toml");
    fs::write(&config_path, config)?;
    fs::create_dir_all(dir.join("certs.d"))?;
    let (program, args) =
        layout.command(PathBuf::from("containerd"), vec!["--config".into(), config_path.display().to_string()]);
    let spec = ProcessSpec {
        name: "containerd".into(),
        program,
        args,
        env: Vec::new(),
        clean_env: false,
        log_path: layout.containerd_log(),
        cgroup_procs: None,
    };
    let mut child = ManagedChild::spawn(&spec)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.exit_status() {
            bail!("containerd exited with {status}:\n{}", tail_file(&layout.containerd_log(), 30));
        }
        if ctr(layout, &["version"]).is_ok() {
            return Ok(child);
        }
        if Instant::now() > deadline {
            bail!("containerd did not answer within 30 s:\n{}", tail_file(&layout.containerd_log(), 30));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `ctr` against this node's containerd in the `k8s.io` namespace (the one CRI uses).
pub fn ctr(layout: &NodeLayout, args: &[&str]) -> Result<String> {
    let output = Command::new("ctr")
        .arg("--address")
        .arg(layout.socket())
        .args(["--namespace", "k8s.io"])
        .args(args)
        .output()
        .context("running ctr")?;
    if !output.status.success() {
        bail!("ctr {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The kubelet for `node`, registering itself with the API server through `connection`.
pub fn start_kubelet(
    layout: &NodeLayout,
    bin_dir: &Path,
    node: &str,
    connection: &Connection,
    ca_file: &Path,
) -> Result<ManagedChild> {
    let dir = &layout.dir;
    let kubeconfig = dir.join("kubelet.kubeconfig");
    connection.write_kubeconfig(&kubeconfig)?;
    let config = json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        // This machine may be cgroup v1 (hybrid), which kubelet 1.36 refuses by default.
        "failCgroupV1": false,
        "failSwapOn": false,
        "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": format!("unix://{}", layout.socket().display()),
        "authentication": {
            "x509": { "clientCAFile": ca_file },
            "webhook": { "enabled": false },
            "anonymous": { "enabled": false },
        },
        "authorization": { "mode": "AlwaysAllow" },
        "port": free_port()?,
        "readOnlyPort": 0,
        "healthzPort": free_port()?,
        "healthzBindAddress": "127.0.0.1",
        "podLogsDir": layout.pod_logs(),
        "volumePluginDir": dir.join("volume-plugins"),
        // Images come from `ctr import`, never from a registry: never garbage-collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        // A test machine's disk may be fuller than the defaults allow; never evict test pods.
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "resolvConf": "",
        "serializeImagePulls": false,
        "registerNode": true,
        // A second node's pods go under a cgroup of their own, apart from the first node's.
        "cgroupRoot": layout.cgroup_root.as_deref().unwrap_or("/"),
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "5s",
    });
    let config_path = dir.join("kubelet-config.json");
    fs::write(&config_path, serde_json::to_vec_pretty(&config)?)?;
    let (program, args) = layout.command(
        bin_dir.join("kubelet"),
        vec![
            format!("--config={}", config_path.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--root-dir={}", layout.kubelet_root().display()),
            format!("--cert-dir={}", dir.join("kubelet-pki").display()),
            format!("--hostname-override={node}"),
            // The API server reaches the kubelet there (node 1: the bridge gateway).
            format!("--node-ip={}", layout.node_ip),
            "--v=1".into(),
        ],
    );
    let spec = ProcessSpec {
        name: format!("kubelet-{node}"),
        program,
        args,
        env: Vec::new(),
        clean_env: false,
        log_path: layout.kubelet_log(),
        cgroup_procs: None,
    };
    ManagedChild::spawn(&spec)
}

//! Shared setup for the end-to-end tests: one real control plane per test binary, and per test a
//! namespace, StorageClasses and simulated nodes of its own, so tests run in parallel without
//! seeing each other's claims land on their nodes.

#![allow(dead_code)] // each test binary uses a different subset

pub mod block;
pub mod capacity;
pub mod snapshots;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use testbed::fixtures;
use testbed::{ControlPlane, ProvisionerSpec, SimNode};

pub const PROVISIONER: &str = "kubevirt.io/hostpath-provisioner";
/// Label on a test's nodes; its pods select it so they never land on another test's nodes.
pub const GROUP_LABEL: &str = "hpp-test/group";
/// Node lease duration in the tests (the default is 120 s).
pub const LEASE_SECONDS: u32 = 15;
/// Generous: the machine may be busy with parallel tests; timings are not what is tested here.
pub const TIMEOUT: Duration = Duration::from_secs(90);

/// Who reported an event: its reporting controller, or for an event written through the core
/// API by an older recorder, the component of its source.
pub fn reporting_controller(event: &Event) -> &str {
    match event.reporting_controller.as_deref() {
        Some(controller) if !controller.is_empty() => controller,
        _ => event.deprecated_source.as_ref().and_then(|s| s.component.as_deref()).unwrap_or_default(),
    }
}

/// The provisioner under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hostpath-provisioner"))
}

/// One test's slice of the shared cluster.
pub struct TestEnv {
    pub cp: &'static ControlPlane,
    pub client: Client,
    pub ns: String,
    pub group: String,
    pub nodes: Vec<SimNode>,
    /// The provisioner name this test's nodes and classes use ([`PROVISIONER`] unless the test
    /// isolates itself with [`TestEnv::own_provisioner`]).
    pub provisioner: String,
}

impl TestEnv {
    /// A namespace and `nodes` simulated nodes (`<group>-1`, ...) each running a provisioner.
    pub async fn start(test: &str, nodes: usize) -> TestEnv {
        Self::start_with(test, nodes, |spec| spec).await
    }

    /// Like [`TestEnv::start`], adjusting each node's provisioner spec.
    pub async fn start_with(test: &str, nodes: usize, adjust: impl Fn(ProvisionerSpec) -> ProvisionerSpec) -> TestEnv {
        let cp = testbed::shared_control_plane().await.expect("control plane");
        let client = cp.admin_client();
        let group = testbed::unique_name(test);
        let ns = group.clone();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &fixtures::namespace(&ns))
            .await
            .expect("create namespace");
        let mut env = TestEnv { cp, client, ns, group, nodes: Vec::new(), provisioner: PROVISIONER.to_owned() };
        for i in 1..=nodes {
            env.add_node(&format!("{}-{i}", env.group), &adjust).await;
        }
        env
    }

    /// Gives this test a provisioner name of its own (call before adding nodes). Claims that no
    /// annotation places (Immediate shared and every-node classes) are otherwise seen by every
    /// test's nodes on the shared control plane, whose pools of the same name are other
    /// directories; on a real cluster all nodes serve the same pools.
    pub fn own_provisioner(&mut self) {
        self.provisioner = format!("test.hostpath-provisioner/{}", self.group);
    }

    /// Adds a node of this test's group with its own pool root and provisioner, and waits
    /// until the provisioner is ready.
    pub async fn add_node(&mut self, name: &str, adjust: &impl Fn(ProvisionerSpec) -> ProvisionerSpec) {
        self.add_node_no_wait(name, adjust).await;
        let node = self.nodes.last_mut().expect("node just added");
        node.provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("provisioner ready");
    }

    /// Like [`TestEnv::add_node`] without waiting for readiness (for tests of unready states).
    pub async fn add_node_no_wait(&mut self, name: &str, adjust: &impl Fn(ProvisionerSpec) -> ProvisionerSpec) {
        self.cp.add_node_labeled(name, name, &[(GROUP_LABEL, &self.group)]).await.expect("add node");
        let pool = testbed::pool_root_for(self.cp, name);
        std::fs::create_dir_all(&pool).expect("pool root");
        // Every test's nodes keep their leases in one namespace (`default`), as on a cluster, so
        // each node knows which nodes of its provisioner name are alive; short leases, so that a
        // killed node's work moves on within seconds.
        let spec = adjust(
            ProvisionerSpec::new(binary(), name, pool.clone(), self.cp.kubeconfig_path())
                .env("PROVISIONER_NAME", &self.provisioner)
                .env("NODE_LEASE_SECONDS", &LEASE_SECONDS.to_string()),
        );
        let provisioner = testbed::Provisioner::spawn(spec, self.cp.temp_dir()).expect("spawn provisioner");
        // add_node_labeled already created the Node; SimNode only bundles what we started.
        self.nodes.push(SimNode { name: name.to_owned(), hostname: name.to_owned(), pool_root: pool, provisioner });
    }

    /// Marks a node (un)schedulable, as `kubectl cordon` does.
    pub async fn set_unschedulable(&self, node: &str, unschedulable: bool) {
        let patch = serde_json::json!({"spec": {"unschedulable": unschedulable}});
        Api::<k8s_openapi::api::core::v1::Node>::all(self.client.clone())
            .patch(node, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .expect("cordon");
    }

    pub fn node(&self, name: &str) -> &SimNode {
        self.nodes.iter().find(|n| n.name == name).expect("node of this test")
    }

    pub fn node_mut(&mut self, name: &str) -> &mut SimNode {
        self.nodes.iter_mut().find(|n| n.name == name).expect("node of this test")
    }

    /// A StorageClass of our provisioner named after this test.
    pub async fn class(
        &self,
        suffix: &str,
        build: impl FnOnce(fixtures::StorageClassBuilder) -> fixtures::StorageClassBuilder,
    ) -> String {
        let name = format!("{}-{suffix}", self.group);
        let class = build(fixtures::storage_class(&name, &self.provisioner)).build();
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), &class)
            .await
            .expect("create class");
        name
    }

    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn create_claim(&self, claim: fixtures::ClaimBuilder) -> PersistentVolumeClaim {
        self.claims().create(&PostParams::default(), &claim.build()).await.expect("create claim")
    }

    /// A pod using `claim`, restricted to this test's nodes.
    pub async fn create_pod(&self, name: &str, claim: &str) -> Pod {
        let pod = fixtures::pod_using_claim(&self.ns, name, claim).node_selector(GROUP_LABEL, &self.group).build();
        self.pods().create(&PostParams::default(), &pod).await.expect("create pod")
    }

    /// Waits until the claim is Bound and returns its PV.
    pub async fn wait_bound(&self, claim: &str) -> PersistentVolume {
        let claims = self.claims();
        let pv_name = testbed::wait_until(
            &format!("claim {}/{claim} Bound", self.ns),
            TIMEOUT,
            || async { claims.get(claim).await },
            |c: &PersistentVolumeClaim| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", self.log_tails()))
        .spec
        .and_then(|s| s.volume_name)
        .expect("bound claim names its volume");
        self.pvs().get(&pv_name).await.expect("get PV")
    }

    /// Deletes a claim (and nothing else).
    pub async fn delete_claim(&self, claim: &str) {
        self.claims().delete(claim, &DeleteParams::default()).await.expect("delete claim");
    }

    pub async fn delete_pod(&self, pod: &str) {
        self.pods()
            .delete(pod, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
            .await
            .expect("delete pod");
    }

    /// Waits until the PV no longer exists.
    pub async fn wait_pv_gone(&self, pv: &str) {
        let pvs = self.pvs();
        testbed::wait_for(&format!("PV {pv} deleted"), TIMEOUT, || async {
            anyhow::Ok(pvs.get_opt(pv).await?.is_none().then_some(()))
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", self.log_tails()));
    }

    /// Waits until the PV reaches `phase`.
    pub async fn wait_pv_phase(&self, pv: &str, phase: &str) -> PersistentVolume {
        let pvs = self.pvs();
        testbed::wait_until(
            &format!("PV {pv} {phase}"),
            TIMEOUT,
            || async { pvs.get(pv).await },
            |p: &PersistentVolume| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase),
        )
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", self.log_tails()))
    }

    /// Events (events.k8s.io) regarding the object with `uid`, in `namespace`, whoever reported
    /// them (the scheduler, kube-controller-manager, any provisioner).
    pub async fn all_events_for(&self, namespace: &str, uid: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let list = events.list(&ListParams::default()).await.expect("list events");
        list.items.into_iter().filter(|e| e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid)).collect()
    }

    /// The events this test's provisioner reported about the object with `uid`. Others report
    /// the same reasons (kube-controller-manager's `ProvisioningFailed` for a conflict while it
    /// saves a claim): a test reading events means ours unless it names another reporter.
    pub async fn events_for(&self, namespace: &str, uid: &str) -> Vec<Event> {
        let mut events = self.all_events_for(namespace, uid).await;
        events.retain(|e| reporting_controller(e) == self.provisioner);
        events
    }

    /// The note of an event with `reason` this test's provisioner reported about `uid`, if any.
    pub async fn our_event(&self, namespace: &str, uid: &str, reason: &str) -> Option<String> {
        let events = self.events_for(namespace, uid).await;
        events.into_iter().find(|e| e.reason.as_deref() == Some(reason)).map(|e| e.note.unwrap_or_default())
    }

    /// Waits for an event with `reason` that this test's provisioner reported about the object
    /// `uid` and returns its note.
    pub async fn wait_event(&self, namespace: &str, uid: &str, reason: &str) -> String {
        testbed::wait_for(&format!("event {reason} on {uid}"), TIMEOUT, || async {
            anyhow::Ok(self.our_event(namespace, uid, reason).await)
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", self.log_tails()))
    }

    /// Waits for an event with `reason` that `controller` (for example `default-scheduler`)
    /// reported about the object `uid` and returns its note.
    pub async fn wait_event_from(&self, namespace: &str, uid: &str, controller: &str, reason: &str) -> String {
        testbed::wait_for(&format!("event {reason} from {controller} on {uid}"), TIMEOUT, || async {
            let events = self.all_events_for(namespace, uid).await;
            anyhow::Ok(
                events
                    .into_iter()
                    .find(|e| reporting_controller(e) == controller && e.reason.as_deref() == Some(reason))
                    .map(|e| e.note.unwrap_or_default()),
            )
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", self.log_tails()))
    }

    pub fn log_tails(&self) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            out.push_str(&format!("--- provisioner {} ---\n{}\n", node.name, node.provisioner.log_tail(40)));
        }
        out
    }
}

/// The provisioner's trash directory under a pool root (fast reclaim).
pub const TRASH: &str = ".hpp-trash";

/// Names of the entries directly under `dir`, the trash directory left out.
pub fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect::<Vec<String>>()
        })
        .unwrap_or_default()
        .into_iter()
        .filter(|name| name != TRASH)
        .collect()
}

/// Waits until the background removal has emptied the pool's trash (the data is really gone).
pub async fn wait_trash_empty(pool: &Path) {
    let trash = pool.join(TRASH);
    testbed::wait_for(&format!("{} empty", trash.display()), TIMEOUT, || async {
        let left = std::fs::read_dir(&trash).map(|rd| rd.count()).unwrap_or(0);
        anyhow::Ok((left == 0).then_some(()))
    })
    .await
    .expect("trash emptied");
}

/// `doctor --output json` for the test's node `index` with its settings (`PV_DIR` its pool
/// root), and `extra` settings.
pub async fn doctor_report(env: &TestEnv, index: usize, extra: &[(&str, &str)]) -> serde_json::Value {
    let node = &env.nodes[index];
    let mut command = std::process::Command::new(binary());
    command.args(["doctor", "--output", "json"]).env_clear().env("PATH", std::env::var_os("PATH").unwrap_or_default());
    for (name, value) in [
        ("NODE_NAME", node.name.clone()),
        ("PV_DIR", node.pool_root.display().to_string()),
        ("KUBECONFIG", env.cp.kubeconfig_path().display().to_string()),
        ("PROVISIONER_NAME", env.provisioner.clone()),
    ] {
        command.env(name, value);
    }
    command.envs(extra.iter().copied());
    let output = tokio::task::spawn_blocking(move || command.output()).await.unwrap().expect("run the doctor");
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&output.stderr)))
}

/// The claim UID.
pub fn uid(claim: &PersistentVolumeClaim) -> String {
    claim.metadata.uid.clone().expect("uid")
}

/// A small ext4 filesystem in a file, loop-mounted on `dir` (a pool that can fill up).
/// Unmounted when dropped.
pub struct LoopFs {
    pub dir: PathBuf,
    image: PathBuf,
}

impl LoopFs {
    /// `size_mib` MiB with at most `inodes` inodes (mkfs.ext4 rounds up a little).
    pub fn mount(dir: &Path, size_mib: u64, inodes: Option<u32>) -> LoopFs {
        let image = dir.with_extension("img");
        std::fs::create_dir_all(dir).expect("mount point");
        let file = std::fs::File::create(&image).expect("image file");
        file.set_len(size_mib << 20).expect("size image");
        let mut mkfs = std::process::Command::new("mkfs.ext4");
        mkfs.args(["-q", "-F", "-m", "0"]);
        if let Some(n) = inodes {
            mkfs.args(["-N", &n.to_string()]);
        }
        run(mkfs.arg(&image));
        std::fs::create_dir_all(dir).expect("mount point");
        run(std::process::Command::new("mount").arg("-o").arg("loop").arg(&image).arg(dir));
        LoopFs { dir: dir.to_owned(), image }
    }

    /// A `size_mib` MiB btrfs (at least 128 MiB: mkfs.btrfs's minimum with default profiles).
    pub fn mount_btrfs(dir: &Path, size_mib: u64) -> LoopFs {
        let image = dir.with_extension("img");
        std::fs::create_dir_all(dir).expect("mount point");
        let file = std::fs::File::create(&image).expect("image file");
        file.set_len(size_mib.max(128) << 20).expect("size image");
        run(std::process::Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&image));
        run(std::process::Command::new("mount").arg("-o").arg("loop").arg(&image).arg(dir));
        LoopFs { dir: dir.to_owned(), image }
    }

    /// A 300 MiB XFS (mkfs.xfs's minimum), mounted without quota options.
    pub fn mount_xfs(dir: &Path) -> LoopFs {
        let image = dir.with_extension("img");
        std::fs::create_dir_all(dir).expect("mount point");
        let file = std::fs::File::create(&image).expect("image file");
        file.set_len(300 << 20).expect("size image");
        run(std::process::Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&image));
        run(std::process::Command::new("mount").arg("-o").arg("loop").arg(&image).arg(dir));
        LoopFs { dir: dir.to_owned(), image }
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.dir).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

/// A tmpfs mounted on `dir`, unmounted when dropped.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path) -> Tmpfs {
        std::fs::create_dir_all(dir).expect("mount point");
        run(std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"]).arg(dir));
        Tmpfs(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn run(cmd: &mut std::process::Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// Waits until `path` no longer exists.
pub async fn wait_path_gone(path: &Path) {
    testbed::wait_for(&format!("{} removed", path.display()), TIMEOUT, || async {
        anyhow::Ok((!path.exists()).then_some(()))
    })
    .await
    .expect("path removed");
}

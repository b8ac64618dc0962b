//! End-to-end test harness for hostpath-provisioner: a real Kubernetes control plane (etcd,
//! kube-apiserver, kube-controller-manager with the PV controllers, kube-scheduler) on
//! 127.0.0.1, and provisioner processes that each play one node's DaemonSet pod.
//!
//! Two ways to use it:
//!
//! - [`Cluster::start`]: a control plane of the test's own plus N nodes (`node-1`, ...), each
//!   with a pool root and a running, ready provisioner. Costs a control-plane start (about 5 s).
//!   Needed for anything that stops or restarts components.
//! - [`shared_control_plane`]: one control plane per test binary, started by the first test
//!   that asks. Add nodes and provisioners with [`SimNode::start`] under names from
//!   [`unique_name`], use a namespace and StorageClass of the test's own, and keep the test's
//!   pods on the test's nodes (see [`ControlPlane::add_node_labeled`] and
//!   [`fixtures::PodBuilder::node_selector`]): otherwise the scheduler may pick another test's
//!   node, whose provisioner rightly ignores the claim.
//!
//! ```no_run
//! use kube::api::{Api, PostParams};
//! use testbed::fixtures;
//!
//! # async fn demo(provisioner_binary: &std::path::Path) -> testbed::Result<()> {
//! let cluster = testbed::Cluster::start(2, provisioner_binary).await?;
//! let client = cluster.client();
//! let classes: Api<k8s_openapi::api::storage::v1::StorageClass> = Api::all(client);
//! let class = fixtures::storage_class("local", "kubevirt.io/hostpath-provisioner").build();
//! classes.create(&PostParams::default(), &class).await?;
//! # Ok(()) }
//! ```
//!
//! Binaries come from `hack/build-control-plane.sh`, run automatically when they are missing
//! from its cache (15-30 min cold); set `TESTBED_K8S_BIN_DIR` to use others. Component logs,
//! certificates, kubeconfigs and pool roots live in [`ControlPlane::temp_dir`].
//!
//! # Cleanup
//!
//! Only processes this crate started are ever signalled, by PID (each leads its own process
//! group, which is what gets signalled, so nothing they might fork survives either).
//! - `Drop` of [`ControlPlane`] and [`Provisioner`] sends SIGTERM, waits up to 10 s, SIGKILLs and
//!   reaps, then removes the temp dir; while a test is panicking it first prints the log tails
//!   of the components (and of each provisioner) to stderr. A test that fails by returning
//!   `Err` is not a panic, and the shared control plane is never dropped: for both, hold a
//!   [`LogsOnFailure`] guard ([`ControlPlane::logs_on_failure`], [`Cluster::logs_on_failure`])
//!   and call [`LogsOnFailure::passed`] as the test's last step.
//! - The shared control plane lives in a `static` and is never dropped. Its processes are still
//!   stopped when the test binary exits: every child is forked by one long-lived thread with
//!   `PR_SET_PDEATHSIG=SIGKILL` (the signal fires when the forking *thread* exits, and libtest's
//!   per-test threads do exit), and an `atexit` handler SIGKILLs whatever is still registered
//!   and removes the temp dirs. If the test binary itself is SIGKILLed the processes still die
//!   (PDEATHSIG) and its temp dirs (named after its PID) are swept by the next test binary that
//!   starts a control plane. `TESTBED_KEEP_TEMP=1` keeps them deliberately (and unswept).

mod binaries;
mod cluster;
mod control_plane;
mod deploy_tools;
pub mod docker_context;
pub mod documented_commands;
pub mod fixtures;
mod go_peer;
mod kubeconfig;
pub mod memory_cgroup;
mod pki;
mod process;
mod provisioner;
mod proxy;
mod readiness_mirror;
pub mod real_nodes;
pub mod registry;
mod report;
mod shared;
mod wait;

pub use anyhow::Result;
pub use binaries::BIN_DIR_ENV;
pub use cluster::{Cluster, ClusterSpec, PROVISIONER_READY_TIMEOUT, SimNode, per_node_pool_dir, pool_root_for};
pub use control_plane::{ControlPlane, Options, RealNodeAccess};
pub use deploy_tools::{DeployTool, deploy_tool};
pub use go_peer::{GoPeer, GoPeerSpec, go_legacy_build};
pub use kubeconfig::Connection;
pub use process::free_port;
pub use provisioner::{DEFAULT_RUST_LOG, Provisioner, ProvisionerSpec};
pub use proxy::CutProxy;
pub use readiness_mirror::ReadinessMirror;
pub use report::LogsOnFailure;
pub use shared::shared_control_plane;
pub use wait::{http_get, unique_name, wait_for, wait_until};

/// Whether this run is CI's (`CI=true`, as `.ci/run` sets it): there a fixture that is missing
/// fails the test, where a developer's machine may say SKIPPED and why.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

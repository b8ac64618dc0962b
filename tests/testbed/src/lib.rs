//! End-to-end test harness for hostpath-provisioner: a real Kubernetes control plane (etcd,
//! kube-apiserver, kube-controller-manager with the PV controllers, kube-scheduler) on
//! 127.0.0.1, and provisioner processes that each play one node's DaemonSet pod.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let cluster = testbed::Cluster::start(2, env!("CARGO_MANIFEST_DIR").as_ref()).await?;
//! let client = cluster.client();
//! # Ok(()) }
//! ```
//!
//! Binaries come from `hack/build-control-plane.sh` (run automatically when missing, 15-30 min
//! cold; set `TESTBED_K8S_BIN_DIR` to use others).
//!
//! # Cleanup
//!
//! Only processes this crate started are ever signalled, by PID (each leads its own process
//! group, which is what gets signalled, so nothing they might fork survives either).
//! - `Drop` of [`ControlPlane`] and [`Provisioner`] sends SIGTERM, waits up to 10 s, SIGKILLs and
//!   reaps; while a test is panicking it first prints the components' log tails to stderr.
//! - The shared control plane lives in a `static` and is never dropped. Its processes are still
//!   stopped when the test binary exits: every child is forked by one long-lived thread with
//!   `PR_SET_PDEATHSIG=SIGKILL` (the signal fires when the forking *thread* exits, and libtest's
//!   per-test threads do exit), and an `atexit` handler SIGKILLs whatever is still registered
//!   and removes the temp dirs. `TESTBED_KEEP_TEMP=1` keeps the temp dirs for inspection.

mod binaries;
mod cluster;
mod control_plane;
pub mod fixtures;
mod kubeconfig;
mod pki;
mod process;
mod provisioner;
mod shared;
mod wait;

pub use anyhow::Result;
pub use binaries::BIN_DIR_ENV;
pub use cluster::{Cluster, ClusterSpec, PROVISIONER_READY_TIMEOUT, SimNode, pool_root_for};
pub use control_plane::{ControlPlane, LogsOnPanic, Options};
pub use kubeconfig::Connection;
pub use process::free_port;
pub use provisioner::{DEFAULT_RUST_LOG, Provisioner, ProvisionerSpec};
pub use shared::shared_control_plane;
pub use wait::{http_get, unique_name, wait_for, wait_until};

//! hostpath-provisioner: dynamic hostPath PersistentVolumes, a drop-in replacement for the
//! kubevirt legacy provisioner. `docs/architecture.md` explains the contract this crate implements.
//!
//! Where to look, by role:
//! - [`deciding`]: pure decisions over plain data (is a claim ours, which node acts for a shared
//!   or every-node volume, what PV to write, may a path be deleted).
//! - [`reconciling`]: the reconcilers that fetch, decide and act, and the wiring around them.
//! - [`filesystem`]: every filesystem call, behind pool-root handles and validated names.
//! - [`serving`]: health and metrics over HTTP.
//! - [`doctor`]: the `doctor` subcommand, a health report of this node's pools.
//! - [`operating`]: the `operator` subcommand, which serves `HostPathProvisioner` resources.
//! - [`config`], [`error`], [`keys`]: settings, error types with their event reasons, and the
//!   annotation and label keys shared with Kubernetes and the Go build.

pub mod config;
pub mod deciding;
pub mod doctor;
pub mod error;
pub mod filesystem;
pub mod keys;
pub mod operating;
pub mod reconciling;
pub mod serving;

#[cfg(test)]
mod test_fixtures;

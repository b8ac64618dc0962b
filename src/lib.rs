//! hostpath-provisioner: dynamic hostPath PersistentVolumes, a drop-in replacement for the
//! kubevirt legacy provisioner. See DESIGN.md for the contract this crate implements.
//!
//! Where to look: `claim_decision` (is a claim ours), `volume_spec` (the PV we write),
//! `volume_decision` and `layout` (may a path be deleted), `pool` (every filesystem call),
//! `claims` and `volumes` (the two reconcilers), `controller` (wiring).

pub mod capacity;
pub mod claim_decision;
pub mod claims;
pub mod config;
pub mod context;
pub mod controller;
pub mod error;
pub mod health;
pub mod keys;
pub mod layout;
pub mod metrics;
pub mod orphans;
pub mod pool;
pub mod pools;
pub mod volume_decision;
pub mod volume_spec;
pub mod volumes;

#[cfg(test)]
mod test_fixtures;

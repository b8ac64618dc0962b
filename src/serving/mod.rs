//! What the process serves (`/healthz`, `/readyz` and `/metrics`), how it keeps its own
//! footprint small (`heap`), and how a subcommand's process starts its logs and stops
//! (`lifecycle`).

pub mod build_info;
pub mod health;
pub mod heap;
pub mod lifecycle;
pub mod metrics;
#[cfg(test)]
mod monitoring_files;
pub mod operator;
pub mod process;
pub mod registry;
pub mod releaser;
pub mod waiting_claims;

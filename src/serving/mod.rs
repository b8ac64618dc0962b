//! What the process serves (`/healthz`, `/readyz` and `/metrics`), and how it keeps its own
//! footprint small (`heap`).

pub mod build_info;
pub mod health;
pub mod heap;
pub mod metrics;
#[cfg(test)]
mod monitoring_files;
pub mod process;
pub mod waiting_claims;

//! What the process serves: `/healthz`, `/readyz` and `/metrics`.

pub mod build_info;
pub mod health;
pub mod metrics;
#[cfg(test)]
mod monitoring_files;
pub mod process;
pub mod waiting_claims;

//! What the process serves: `/healthz`, `/readyz` and `/metrics`.

pub mod health;
pub mod metrics;

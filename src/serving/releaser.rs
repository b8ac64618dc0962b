//! What the claim releaser (`release-claims-of-removed-nodes`) answers on its port, served by
//! [`crate::serving::health::serve_answers`] as the node daemon's: `/healthz` (the process
//! runs), `/readyz` (its last pass succeeded; else why not, the last error), `/metrics` (claims
//! released, failed passes and when the last failed, with the process's and build's metrics).

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::serving::health::Answers;

/// The releaser's metrics and the outcome of its last pass.
pub struct ReleaserAnswers {
    registry: Registry,
    /// Claims of removed nodes' PVs deleted.
    pub claims_released: Counter,
    /// Passes that failed (an API error, a right missing), each retried at the next pass.
    pub failed_passes: Counter,
    /// When the last pass failed, seconds since the Unix epoch; 0 while none has.
    last_error_timestamp: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// 1 while the last pass succeeded, else 0.
    ready: Gauge,
    /// `None` before the first pass ends; then the last pass's error, if it failed.
    last_pass: Mutex<Option<Result<(), String>>>,
}

impl Default for ReleaserAnswers {
    fn default() -> Self {
        Self::new()
    }
}

impl ReleaserAnswers {
    /// Registers the releaser's metrics under the `hostpath_provisioner` prefix, and the
    /// process's under their own names.
    pub fn new() -> Self {
        let mut root = crate::serving::registry::with_process_and_build();
        let registry = root.sub_registry_with_prefix("hostpath_provisioner");
        let claims_released = Counter::default();
        registry.register(
            "claims_released",
            "Claims bound to PVs of removed nodes deleted by the claim releaser (each PV set to Retain first)",
            claims_released.clone(),
        );
        let failed_passes = Counter::default();
        registry.register(
            "claim_release_failed_passes",
            "Passes of the claim releaser that failed (retried at the next pass; /readyz says the last error)",
            failed_passes.clone(),
        );
        let last_error_timestamp = Gauge::<f64, std::sync::atomic::AtomicU64>::default();
        registry.register(
            "claim_release_last_error_timestamp_seconds",
            "When the claim releaser's last failed pass ended, seconds since the Unix epoch (0: none failed)",
            last_error_timestamp.clone(),
        );
        let ready = Gauge::default();
        registry.register("ready", "1 while /readyz answers 200 (the last pass succeeded), else 0", ready.clone());
        ReleaserAnswers {
            registry: root,
            claims_released,
            failed_passes,
            last_error_timestamp,
            ready,
            last_pass: Mutex::new(None),
        }
    }

    /// Records the outcome of a pass.
    pub fn pass_ended(&self, outcome: Result<(), String>) {
        if outcome.is_err() {
            self.failed_passes.inc();
            let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or_default();
            self.last_error_timestamp.set(now);
        }
        self.ready.set(i64::from(outcome.is_ok()));
        *self.last_pass.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
    }
}

impl Answers for ReleaserAnswers {
    fn not_ready_reason(&self) -> Option<String> {
        match &*self.last_pass.lock().unwrap_or_else(|e| e.into_inner()) {
            None => Some("no pass has ended yet".into()),
            Some(Ok(())) => None,
            Some(Err(error)) => Some(format!("the last pass failed: {error}")),
        }
    }

    fn metrics_text(&self) -> String {
        crate::serving::registry::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_after_a_pass_succeeds_and_the_last_error_is_said_and_counted() {
        let answers = ReleaserAnswers::new();
        assert_eq!(answers.not_ready_reason().as_deref(), Some("no pass has ended yet"));
        answers.pass_ended(Ok(()));
        answers.claims_released.inc();
        assert_eq!(answers.not_ready_reason(), None);
        let text = answers.metrics_text();
        assert!(text.contains("hostpath_provisioner_claims_released_total 1"), "{text}");
        assert!(text.contains("hostpath_provisioner_claim_release_last_error_timestamp_seconds 0"), "{text}");
        assert!(text.contains("hostpath_provisioner_ready 1"), "{text}");
        answers.pass_ended(Err("persistentvolumes is forbidden".into()));
        let why = answers.not_ready_reason().unwrap();
        assert!(why.contains("the last pass failed: persistentvolumes is forbidden"), "{why}");
        let text = answers.metrics_text();
        assert!(text.contains("hostpath_provisioner_claim_release_failed_passes_total 1"), "{text}");
        assert!(!text.contains("hostpath_provisioner_claim_release_last_error_timestamp_seconds 0\n"), "{text}");
        assert!(text.contains("hostpath_provisioner_ready 0") && text.contains("process_"), "{text}");
    }
}

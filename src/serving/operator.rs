//! What the operator (`hostpath-provisioner operator`) answers on its port, served by
//! [`crate::serving::health::serve_answers`] as the node daemon's: `/healthz` and `/readyz` (the
//! process runs: a standby replica waiting for the Lease is as healthy as the one acting), and
//! `/metrics` (whether this replica holds the Lease, reconciles and their failures, with the
//! process's and build's metrics). Prometheus scraping it is what lets the alert
//! `HostpathProvisionerOperatorDown` tell "no operator runs" from "the operator runs".

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::serving::health::Answers;

/// The operator's metrics.
pub struct OperatorAnswers {
    registry: Registry,
    /// 1 while this replica holds the operator Lease and acts, 0 while it stands by.
    pub leader: Gauge,
    /// Reconciles of HostPathProvisioner resources that ended.
    pub reconciles: Counter,
    /// Reconciles that failed (retried with backoff; the resource's status and Events say why).
    pub reconcile_failures: Counter,
}

impl Default for OperatorAnswers {
    fn default() -> Self {
        Self::new()
    }
}

impl OperatorAnswers {
    /// Registers the operator's metrics under the `hostpath_provisioner_operator` prefix, the
    /// build's under `hostpath_provisioner`, and the process's under their own names.
    pub fn new() -> Self {
        let mut root = crate::serving::registry::with_process_and_build();
        let registry = root.sub_registry_with_prefix("hostpath_provisioner_operator");
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the operator Lease and acts, 0 while it stands by",
            leader.clone(),
        );
        let reconciles = Counter::default();
        registry.register("reconciles", "Reconciles of HostPathProvisioner resources that ended", reconciles.clone());
        let reconcile_failures = Counter::default();
        registry.register(
            "reconcile_failures",
            "Reconciles that failed (retried with backoff; the resource's status and Events say why)",
            reconcile_failures.clone(),
        );
        OperatorAnswers { registry: root, leader, reconciles, reconcile_failures }
    }
}

impl Answers for OperatorAnswers {
    /// Always ready once serving: no Service routes to the operator, and a standby replica is as
    /// ready as the leader (the Lease, not readiness, decides which acts). A process that cannot
    /// reach the API server exits (Lease lost) and is restarted, which `up` shows.
    fn not_ready_reason(&self) -> Option<String> {
        None
    }

    fn detail(&self) -> String {
        if self.leader.get() == 1 {
            "holds the operator Lease\n".into()
        } else {
            "stands by for the operator Lease\n".into()
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
    fn the_metrics_say_the_lease_and_the_reconciles() {
        let answers = OperatorAnswers::new();
        let standing_by = answers.metrics_text();
        assert!(standing_by.contains("hostpath_provisioner_operator_leader 0\n"), "{standing_by}");
        assert!(standing_by.contains("hostpath_provisioner_build_info{"), "{standing_by}");
        assert_eq!(answers.detail(), "stands by for the operator Lease\n");
        answers.leader.set(1);
        answers.reconciles.inc();
        answers.reconciles.inc();
        answers.reconcile_failures.inc();
        let acting = answers.metrics_text();
        assert!(acting.contains("hostpath_provisioner_operator_leader 1\n"), "{acting}");
        assert!(acting.contains("hostpath_provisioner_operator_reconciles_total 2\n"), "{acting}");
        assert!(acting.contains("hostpath_provisioner_operator_reconcile_failures_total 1\n"), "{acting}");
        assert_eq!(answers.detail(), "holds the operator Lease\n");
        assert_eq!(answers.not_ready_reason(), None);
    }
}

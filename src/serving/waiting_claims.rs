//! `hostpath_provisioner_claims_waiting_for_absent_node{node}`: claims of our classes that stay
//! Pending because they are placed on a node where no provisioner runs (the `NoProvisionerOnNode`
//! event). Only the node that speaks for such a claim reports it, and repeats the report each time
//! it looks again; a report that is not renewed expires, so a claim that was deleted, bound, or
//! handed to another speaker leaves the gauge without any event having to say so.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;

/// The metric's name.
pub const NAME: &str = "hostpath_provisioner_claims_waiting_for_absent_node";

/// Label of the gauge: the node the claims wait for.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

/// Claims reported as waiting, by uid: the node they wait for and until when the report holds.
#[derive(Debug, Default)]
pub struct WaitingClaims {
    reports: Mutex<HashMap<String, (String, Instant)>>,
}

impl WaitingClaims {
    /// Reports claim `uid` waiting for `node`, valid for `valid_for` unless renewed.
    pub fn report(&self, uid: &str, node: &str, valid_for: Duration) {
        let until = Instant::now() + valid_for;
        self.lock().insert(uid.to_owned(), (node.to_owned(), until));
    }

    /// Withdraws the report of claim `uid` (its node has a provisioner now, or it is bound).
    pub fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }

    /// Current reports per node (expired ones dropped).
    pub fn per_node(&self) -> HashMap<String, u64> {
        let now = Instant::now();
        let mut reports = self.lock();
        reports.retain(|_, (_, until)| *until > now);
        let mut counts = HashMap::new();
        for (node, _) in reports.values() {
            *counts.entry(node.clone()).or_insert(0) += 1;
        }
        counts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.reports.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Collector for WaitingClaims {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut metric = encoder.encode_descriptor(
            NAME,
            "Pending claims of this provisioner's classes placed on a node where no provisioner runs \
             (reported by the one node that speaks for each claim)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        let mut counts: Vec<_> = self.per_node().into_iter().collect();
        counts.sort();
        for (node, count) in counts {
            ConstGauge::new(count as i64).encode(metric.encode_family(&NodeLabel { node })?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_count_per_node_until_forgotten_or_expired() {
        let waiting = WaitingClaims::default();
        waiting.report("a", "node-1", Duration::from_secs(600));
        waiting.report("b", "node-1", Duration::from_secs(600));
        waiting.report("c", "node-2", Duration::ZERO);
        // Renewing a report does not count the claim twice.
        waiting.report("a", "node-1", Duration::from_secs(600));
        assert_eq!(waiting.per_node(), HashMap::from([("node-1".to_owned(), 2)]));
        waiting.forget("b");
        assert_eq!(waiting.per_node(), HashMap::from([("node-1".to_owned(), 1)]));
    }
}

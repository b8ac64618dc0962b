//! Each node looks, at start and every few minutes, for other live nodes carrying its own value
//! of a served `nodeAffinityKey` (`deciding::node_affinity::duplicate::shared_labels`), and
//! reports each: a Warning `DuplicateAffinityLabel` on its Node, a log line, and the gauge
//! `hostpath_provisioner_affinity_labels_shared`; `doctor` says it too. Two live nodes with one
//! value both take the pinned volumes as their own and draw their pods; found here, it is seen
//! before any volume is reclaimed (where the node without the directory keeps the PV). Reporting
//! only: nothing is changed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use crate::deciding::node_affinity::duplicate::{SharedLabel, shared_label_note, shared_labels};
use crate::error::reason;
use crate::reconciling::context::Context;

/// How often a node looks again.
const INTERVAL: Duration = Duration::from_secs(300);
/// The first look, once this node's own lease is up and the peers had a moment to renew theirs.
const FIRST_LOOK: Duration = Duration::from_secs(3);

/// Runs the looks for as long as the provisioner runs; nothing when the node serves no label.
pub async fn run(ctx: Arc<Context>) {
    if ctx.me.affinity.is_empty() {
        return;
    }
    tokio::time::sleep(FIRST_LOOK).await;
    loop {
        match look(&ctx).await {
            Ok(shared) => report(&ctx, &shared).await,
            Err(error) => {
                tracing::warn!(%error, "cannot look for other live nodes carrying this node's affinity labels; looking again later")
            }
        }
        tokio::time::sleep(INTERVAL).await;
    }
}

/// The live nodes' labels (one GET per live node: the provisioner may get Nodes, not list them),
/// and what this node shares with them.
pub async fn look(ctx: &Context) -> Result<Vec<SharedLabel>, kube::Error> {
    ctx.membership.invalidate().await;
    let live = ctx.live_nodes().await?;
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let mut labels: Vec<(String, BTreeMap<String, String>)> = Vec::new();
    for node in live {
        if let Some(found) = nodes.get_opt(&node.node).await? {
            labels.push((node.node, found.metadata.labels.unwrap_or_default()));
        }
    }
    Ok(shared_labels(&ctx.me.node, &ctx.me.affinity, labels.iter().map(|(node, labels)| (node.as_str(), labels))))
}

async fn report(ctx: &Context, shared: &[SharedLabel]) {
    ctx.metrics.affinity_labels_shared.set(i64::try_from(shared.len()).unwrap_or(i64::MAX));
    if shared.is_empty() {
        tracing::debug!("no other live node carries this node's affinity labels");
        return;
    }
    let node = match ctx.node_ref().await {
        Ok(node) => Some(node),
        Err(error) => {
            tracing::warn!(%error, "cannot read this node's Node object to report a shared affinity label");
            None
        }
    };
    for label in shared {
        let note = shared_label_note(&ctx.me.node, label);
        tracing::warn!(label = %label.label.annotation(), others = ?label.others, "{note}");
        if let Some(node) = &node {
            ctx.warn(node, reason::DUPLICATE_AFFINITY_LABEL, "Check", note).await;
        }
    }
}

//! Which nodes have a live provisioner, and which pools each can use: one Lease per node in the
//! provisioner's namespace, renewed every third of its duration (1.5 writes a minute per node at
//! the default 120 s), released on shutdown. Nothing watches the leases: a node lists them only
//! when a shared or every-node decision needs them, at most every few seconds, so an idle
//! cluster pays the renewals and nothing else.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use sha2::{Digest, Sha256};

use crate::deciding::layout;
use crate::deciding::topology::{LiveNode, PoolKey};
use crate::keys;

/// Longest the release of the lease may hold up a shutdown.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a listed view of the leases is reused.
const MAX_VIEW_AGE: Duration = Duration::from_secs(5);
/// Clock difference tolerated between nodes before a lease whose renewal is that old is taken
/// as expired at first sight.
const CLOCK_SKEW: Duration = Duration::from_secs(30);

/// This node's lease and the view of the others'.
pub struct Membership {
    api: Api<Lease>,
    lease_name: String,
    selector: String,
    provisioner_hash: String,
    node: String,
    duration: Duration,
    /// Wakes the renewal loop (the usable pools changed).
    pub renew_now: tokio::sync::Notify,
    my_pools: Mutex<Vec<PoolKey>>,
    /// When this node's lease was last written: it counts itself alive only as long as the
    /// others can see it alive, so that a node whose renewals fail (cut off, starved) stops
    /// acting for volumes no node owns when the others start to.
    renewed_at: Mutex<Option<Instant>>,
    view: tokio::sync::Mutex<Option<View>>,
    /// When each node's renewTime was first seen with its current value: expiry is measured on
    /// this node's clock, so other nodes' clocks do not matter.
    first_seen: Mutex<HashMap<String, (String, Instant)>>,
}

struct View {
    at: Instant,
    others: Vec<LiveNode>,
}

impl Membership {
    /// Lease `hpp-<provisioner hash>-<node>` in `namespace`, lasting `duration`.
    pub fn new(client: Client, namespace: &str, provisioner: &str, node: &str, duration: Duration) -> Membership {
        let provisioner_hash = short_hash(provisioner);
        Membership {
            api: Api::namespaced(client, namespace),
            lease_name: format!("hpp-{provisioner_hash}-{}", layout::node_label_value(node)),
            selector: format!("{}={provisioner_hash}", keys::LEASE_PROVISIONER_LABEL),
            provisioner_hash,
            node: node.to_owned(),
            duration,
            renew_now: tokio::sync::Notify::new(),
            my_pools: Mutex::new(Vec::new()),
            renewed_at: Mutex::new(None),
            view: tokio::sync::Mutex::new(None),
            first_seen: Mutex::new(HashMap::new()),
        }
    }

    /// The hash of the provisioner name that labels this provisioner's objects in the namespace.
    pub fn provisioner_hash(&self) -> &str {
        &self.provisioner_hash
    }

    /// How often the lease is renewed.
    pub fn renew_interval(&self) -> Duration {
        self.duration / 3
    }

    /// Records the pools this node can use now; true when that changed (renew at once).
    pub fn set_pools(&self, mut pools: Vec<PoolKey>) -> bool {
        pools.sort();
        let mut mine = self.my_pools.lock().unwrap_or_else(|e| e.into_inner());
        let changed = *mine != pools;
        *mine = pools;
        changed
    }

    /// Writes this node's lease (created on first use) with the pools it can use now.
    pub async fn renew(&self) -> Result<(), kube::Error> {
        let pools = self.my_pools.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let advertised: Vec<String> = pools.iter().map(|p| format!("{}={}", p.name, p.root)).collect();
        let lease = serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": self.lease_name,
                "labels": {
                    keys::LEASE_PROVISIONER_LABEL: self.provisioner_hash,
                    "app.kubernetes.io/name": "hostpath-provisioner",
                },
                "annotations": { keys::LEASE_POOLS: advertised.join(",") },
            },
            "spec": {
                "holderIdentity": self.node,
                "leaseDurationSeconds": self.duration.as_secs(),
                "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
            },
        });
        let params = PatchParams::apply("hostpath-provisioner").force();
        // Measured from before the request: the lease may have been written any time after.
        let started = Instant::now();
        self.api.patch(&self.lease_name, &params, &Patch::Apply(&lease)).await?;
        *self.renewed_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(started);
        Ok(())
    }

    /// Deletes this node's lease, so other nodes take over its work at once rather than after
    /// the lease would have expired.
    /// Bounded in time: during an API outage the lease simply expires instead.
    pub async fn release(&self) {
        let params = DeleteParams::default();
        let delete = self.api.delete(&self.lease_name, &params);
        match tokio::time::timeout(RELEASE_TIMEOUT, delete).await {
            Ok(Ok(_)) => {}
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => {}
            Ok(Err(error)) => tracing::warn!(%error, "could not release this node's lease; it expires by itself"),
            Err(_) => tracing::warn!("the API server did not answer; this node's lease expires by itself"),
        }
    }

    /// The live nodes: this one (with the pools it can use now) while its own lease is current,
    /// and the others whose leases are.
    pub async fn live(&self) -> Result<Vec<LiveNode>, kube::Error> {
        let mut view = self.view.lock().await;
        let fresh = view.as_ref().is_some_and(|v| v.at.elapsed() < MAX_VIEW_AGE.min(self.duration / 4));
        if !fresh {
            let leases = self.api.list(&ListParams::default().labels(&self.selector)).await?.items;
            *view = Some(View { at: Instant::now(), others: self.read(&leases) });
        }
        let view = view.as_ref().map(|v| (v.at, v.others.clone()));
        let (at, mut nodes) = view.unwrap_or((Instant::now(), Vec::new()));
        let age = at.elapsed();
        nodes.retain(|n| n.expires_in > age);
        for n in &mut nodes {
            n.expires_in -= age;
        }
        let renewed = self.renewed_at.lock().unwrap_or_else(|e| e.into_inner()).map(|at| at.elapsed());
        if let Some(expires_in) = renewed.and_then(|age| self.duration.checked_sub(age)) {
            let pools = self.my_pools.lock().unwrap_or_else(|e| e.into_inner()).clone();
            nodes.push(LiveNode { node: self.node.clone(), pools, expires_in });
        }
        Ok(nodes)
    }

    /// Forgets the cached view (after an acting node was seen to fail, say).
    pub async fn invalidate(&self) {
        *self.view.lock().await = None;
    }

    fn read(&self, leases: &[Lease]) -> Vec<LiveNode> {
        let now_wall = k8s_openapi::jiff::Timestamp::now();
        let mut first_seen = self.first_seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut live = Vec::new();
        for lease in leases {
            let Some(spec) = lease.spec.as_ref() else { continue };
            let Some(node) = spec.holder_identity.clone().filter(|n| *n != self.node) else { continue };
            let (Some(renewed), Some(seconds)) = (spec.renew_time.as_ref(), spec.lease_duration_seconds) else {
                continue;
            };
            let duration = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
            // A renewal older than the lease plus any plausible skew is expired at first sight.
            let wall_age = now_wall.duration_since(renewed.0);
            if wall_age.as_secs_f64() > (duration + CLOCK_SKEW).as_secs_f64() {
                continue;
            }
            let stamp = renewed.0.to_string();
            let seen = first_seen.entry(node.clone()).or_insert_with(|| (stamp.clone(), Instant::now()));
            if seen.0 != stamp {
                *seen = (stamp, Instant::now());
            }
            let Some(expires_in) = duration.checked_sub(seen.1.elapsed()) else { continue };
            let pools = lease
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(keys::LEASE_POOLS))
                .map(|list| parse_advertised(list))
                .unwrap_or_default();
            live.push(LiveNode { node, pools, expires_in });
        }
        live
    }
}

/// Reads `name=root,name=root` as a lease advertises it (malformed entries are skipped).
pub fn parse_advertised(list: &str) -> Vec<PoolKey> {
    list.split(',')
        .filter_map(|entry| entry.split_once('='))
        .filter(|(name, root)| !name.is_empty() && root.starts_with('/'))
        .map(|(name, root)| PoolKey::new(name, root))
        .collect()
}

fn short_hash(s: &str) -> String {
    Sha256::digest(s.as_bytes())[..4].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_pools_round_trip_and_garbage_is_skipped() {
        assert_eq!(
            parse_advertised("legacy=/var/hpvolumes,nfs=/mnt/nfs"),
            vec![PoolKey::new("legacy", "/var/hpvolumes"), PoolKey::new("nfs", "/mnt/nfs")]
        );
        assert_eq!(parse_advertised(""), vec![]);
        assert_eq!(parse_advertised("junk,=/x,a=relative,b=/ok"), vec![PoolKey::new("b", "/ok")]);
    }
}

//! Which nodes have a live provisioner, and which pools each can use. One Lease per node in the
//! provisioner's namespace says which pools the node can use now; whether the node is alive comes
//! from one of two sources:
//! - the readiness of the provisioner pods, as the EndpointSlices of a Service selecting them
//!   publish it (`--peer-service`, what the shipped manifests use; deciding::liveness): the Lease
//!   is written only when the node's pools change, so a cluster at rest pays nothing;
//! - else the Lease itself, renewed every third of its duration (1.5 writes a minute per node at
//!   the default 120 s): for nodes that run outside a pod (deploy/systemd).
//!
//! Either way the Lease is deleted on shutdown, and nothing is watched: a node lists the Leases
//! (and the EndpointSlices) only when a shared or every-node decision needs them, at most every
//! few seconds.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use sha2::{Digest, Sha256};

use crate::deciding::layout;
use crate::deciding::liveness;
use crate::deciding::topology::{LiveNode, PoolKey};
use crate::keys;

/// Longest the release of the lease may hold up a shutdown.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest a listed view of the leases is reused.
const MAX_VIEW_AGE: Duration = Duration::from_secs(5);
/// Clock difference tolerated between nodes before a lease whose renewal is that old is taken
/// as expired at first sight.
const CLOCK_SKEW: Duration = Duration::from_secs(30);

/// How soon a decision that another node acts looks again, when liveness comes from readiness:
/// there is no lease expiry to wait for, a pod's readiness changes within seconds of its death,
/// and a look lists at most once per [`MAX_VIEW_AGE`] however many claims wait.
const READINESS_RECHECK: Duration = MAX_VIEW_AGE;

/// Where liveness comes from.
enum Source {
    /// The Leases' renewals.
    Leases,
    /// The readiness of the provisioner pods behind a Service (its EndpointSlices).
    Readiness { slices: Box<Api<EndpointSlice>>, selector: String },
}

/// This node's lease and the view of the others'.
pub struct Membership {
    api: Api<Lease>,
    namespace: String,
    source: Source,
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
    /// Counts the changes of the set of other live nodes seen by successive views.
    changes: std::sync::atomic::AtomicU64,
    /// When each node's renewTime was first seen with its current value: expiry is measured on
    /// this node's clock, so other nodes' clocks do not matter.
    first_seen: Mutex<HashMap<String, (String, Instant)>>,
}

struct View {
    at: Instant,
    others: Vec<LiveNode>,
    /// This node's own endpoint is ready (liveness from readiness only).
    me_ready: bool,
}

impl Membership {
    /// Lease `hpp-<provisioner hash>-<node>` in `namespace`, lasting `duration`; liveness from
    /// the readiness of the pods behind `peer_service` (in `namespace`) when given, else from the
    /// Leases' renewals.
    pub fn new(
        client: Client,
        namespace: &str,
        provisioner: &str,
        node: &str,
        duration: Duration,
        peer_service: Option<&str>,
    ) -> Membership {
        let provisioner_hash = short_hash(provisioner);
        let source = match peer_service {
            Some(service) => Source::Readiness {
                slices: Box::new(Api::namespaced(client.clone(), namespace)),
                selector: format!("{}={service}", liveness::SERVICE_NAME_LABEL),
            },
            None => Source::Leases,
        };
        Membership {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            source,
            lease_name: format!("hpp-{provisioner_hash}-{}", layout::node_label_value(node)),
            selector: format!("{}={provisioner_hash}", keys::LEASE_PROVISIONER_LABEL),
            provisioner_hash,
            node: node.to_owned(),
            duration,
            renew_now: tokio::sync::Notify::new(),
            my_pools: Mutex::new(Vec::new()),
            renewed_at: Mutex::new(None),
            view: tokio::sync::Mutex::new(None),
            changes: std::sync::atomic::AtomicU64::new(0),
            first_seen: Mutex::new(HashMap::new()),
        }
    }

    /// The hash of the provisioner name that labels this provisioner's objects in the namespace.
    pub fn provisioner_hash(&self) -> &str {
        &self.provisioner_hash
    }

    /// How often the lease is renewed: never (only when the pools change) when liveness comes
    /// from readiness.
    pub fn renew_interval(&self) -> Option<Duration> {
        match self.source {
            Source::Leases => Some(self.duration / 3),
            Source::Readiness { .. } => None,
        }
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

    /// The live nodes: this one (with the pools it can use now) while the others can see it
    /// alive, and the others that are.
    pub async fn live(&self) -> Result<Vec<LiveNode>, kube::Error> {
        match &self.source {
            Source::Leases => self.live_by_leases().await,
            Source::Readiness { slices, selector } => self.live_by_readiness(slices, selector).await,
        }
    }

    /// Whether the cached view may be used.
    fn fresh(view: &Option<View>, duration: Duration) -> bool {
        view.as_ref().is_some_and(|v| v.at.elapsed() < MAX_VIEW_AGE.min(duration / 4))
    }

    async fn live_by_readiness(
        &self,
        slices: &Api<EndpointSlice>,
        selector: &str,
    ) -> Result<Vec<LiveNode>, kube::Error> {
        let mut view = self.view.lock().await;
        if !Self::fresh(&view, self.duration) {
            // Served from the API server's cache (resourceVersion 0): liveness is a few seconds
            // stale anyway, and etcd is not read.
            let params = ListParams::default().labels(selector).match_any();
            let listed = slices.list(&params).await?.items;
            let service = selector.rsplit('=').next().unwrap_or_default();
            if let Some(reason) = liveness::unusable_view(&listed, service, &self.namespace) {
                tracing::warn!(%reason, "cannot tell which nodes are live; shared and every-node work waits");
                // An error, so that callers wait and retry instead of deciding on nothing.
                return Err(kube::Error::Api(
                    kube::core::Status::failure(&reason, "ServiceUnavailable").with_code(503).boxed(),
                ));
            }
            let ready = liveness::ready_nodes(&listed);
            let leases = self.api.list(&ListParams::default().labels(&self.selector).match_any()).await?.items;
            let my_pools = self.my_pools.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let mut all = liveness::live_nodes(
                &ready,
                &liveness::advertised_pools(&leases),
                &self.node,
                &my_pools,
                READINESS_RECHECK,
            );
            // This node's own entry is added on every call, with the pools it can use then.
            all.retain(|n| n.node != self.node);
            self.count_change(view.as_ref(), &all);
            *view = Some(View { at: Instant::now(), others: all, me_ready: ready.contains(&self.node) });
        }
        let Some(view) = view.as_ref() else { return Ok(Vec::new()) };
        let mut nodes = view.others.clone();
        if view.me_ready {
            let pools = self.my_pools.lock().unwrap_or_else(|e| e.into_inner()).clone();
            nodes.push(LiveNode { node: self.node.clone(), pools, expires_in: READINESS_RECHECK });
        }
        Ok(nodes)
    }

    async fn live_by_leases(&self) -> Result<Vec<LiveNode>, kube::Error> {
        let mut view = self.view.lock().await;
        if !Self::fresh(&view, self.duration) {
            let leases = self.api.list(&ListParams::default().labels(&self.selector)).await?.items;
            let others = self.read(&leases);
            self.count_change(view.as_ref(), &others);
            *view = Some(View { at: Instant::now(), others, me_ready: false });
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

    /// Whether liveness comes from the readiness of the provisioner pods.
    pub fn from_readiness(&self) -> bool {
        matches!(self.source, Source::Readiness { .. })
    }

    /// How many times the set of other live nodes has changed between successive views (a
    /// node's work to clean up after may have appeared).
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn count_change(&self, previous: Option<&View>, now: &[LiveNode]) {
        let names =
            |nodes: &[LiveNode]| nodes.iter().map(|n| n.node.clone()).collect::<std::collections::BTreeSet<_>>();
        if previous.is_none_or(|p| names(&p.others) != names(now)) {
            self.changes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
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
                .map(|list| liveness::parse_advertised(list))
                .unwrap_or_default();
            live.push(LiveNode { node, pools, expires_in });
        }
        live
    }
}

fn short_hash(s: &str) -> String {
    Sha256::digest(s.as_bytes())[..4].iter().map(|b| format!("{b:02x}")).collect()
}

//! State shared by both reconcilers: client, configuration, pools, stores, events, backoff.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;

use crate::config::Config;
use crate::deciding::copy_room::{CopyLedger, VolumePromises};
use crate::deciding::event;
use crate::deciding::identity::Identity;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::reservations::Reservations;
use crate::deciding::settings::DecisionConfig;
use crate::deciding::volume_spec::NodeFacts;
use crate::deciding::waiting::WaitingRecord;
use crate::filesystem::pools::Pools;
use crate::keys;
use crate::reconciling::membership::Membership;
use crate::serving::health::Health;
use crate::serving::metrics::Metrics;

/// Shortest and longest retry delay (docs/architecture.md, retries and events: about 1 s to 5 min, forever).
pub const MIN_RETRY: Duration = Duration::from_secs(1);
/// See [`MIN_RETRY`].
pub const MAX_RETRY: Duration = Duration::from_secs(300);
/// The same warning on the same object is repeated at most this often.
const EVENT_REPEAT: Duration = Duration::from_secs(300);

/// Everything a reconcile needs.
pub struct Context {
    /// API client (no client-side throttle).
    pub client: Client,
    /// Validated configuration.
    pub config: Config,
    /// Provisioner name and node.
    pub me: Identity,
    /// Inputs of the claim decision.
    pub decision: DecisionConfig,
    /// This node's pools.
    pub pools: Pools,
    /// StorageClasses (all; a handful of objects).
    pub classes: Store<StorageClass>,
    /// The claims this node may act on (deciding::claim_retention), trimmed.
    pub claims: Store<PersistentVolumeClaim>,
    /// This node's PVs and the unlabelled (Go-made) ones.
    pub volumes: Vec<Store<KeptVolume>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Readiness.
    pub health: Arc<Health>,
    /// Wakes the background removal of trashed volumes.
    pub purge: tokio::sync::Notify,
    /// Volumes staged for deletion whose fate is not settled yet.
    pub settling: crate::reconciling::staging_memory::Settling,
    /// Which nodes are alive and what pools they serve (for shared and every-node volumes).
    pub membership: Membership,
    /// Volumes being made in pools with requests accounting, and the lock their plans take.
    pub reservations: Mutex<Reservations>,
    /// Byte copies in flight and kept (snapshots, restores), by root: what they take beyond the
    /// requests (deciding::copy_room).
    pub copies: Mutex<CopyLedger>,
    /// UIDs of the Block PVs this process released for their deletion (node removed, loop
    /// detached): exposed again if the deletion fails and the PV is kept
    /// (`deciding::block::released`).
    pub block_released: Mutex<std::collections::HashSet<String>>,
    recorder: Recorder,
    node: tokio::sync::Mutex<Option<NodeFacts>>,
    backoffs: Mutex<HashMap<String, ExponentialBackoff>>,
    /// Claims placed on another node, as a compact record (deciding::waiting).
    waiting: Mutex<WaitingRecord>,
    last_warnings: Mutex<HashMap<String, (String, Instant)>>,
}

impl Context {
    /// Builds the context.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        config: Config,
        pools: Pools,
        classes: Store<StorageClass>,
        claims: Store<PersistentVolumeClaim>,
        volumes: Vec<Store<KeptVolume>>,
        metrics: Arc<Metrics>,
        health: Arc<Health>,
        affinity: Vec<crate::deciding::node_affinity::AffinityLabel>,
    ) -> Self {
        let me = Identity {
            provisioner: config.provisioner_name.clone(),
            capacity_provisioner: config.capacity_provisioner_name.clone(),
            node: config.node_name.clone(),
            affinity,
        };
        let decision = DecisionConfig {
            use_naming_prefix: config.use_naming_prefix,
            pools: config.pools.clone(),
            default_pool: config.default_pool.clone(),
            pv_finalizer: config.pv_finalizer,
            provision_on_node: config.provision_on_node.clone(),
            reserved_bytes: config.reserved_bytes,
            pv_capacity: config.pv_capacity,
            affinity_keys: config.node_affinity_keys.clone(),
            block_device_dir: config.block_device_dir.clone(),
        };
        let membership = Membership::new(
            client.clone(),
            &config.namespace,
            &config.provisioner_name,
            &config.node_name,
            config.node_lease,
            config.peer_service.as_deref(),
        );
        let reporter =
            Reporter { controller: config.provisioner_name.clone(), instance: Some(config.node_name.clone()) };
        let recorder = Recorder::new(client.clone(), reporter);
        Self {
            client,
            config,
            me,
            decision,
            pools,
            classes,
            claims,
            volumes,
            metrics,
            health,
            purge: tokio::sync::Notify::new(),
            settling: Default::default(),
            membership,
            reservations: Mutex::new(Reservations::default()),
            copies: Mutex::new(CopyLedger::default()),
            block_released: Mutex::new(Default::default()),
            recorder,
            node: tokio::sync::Mutex::new(None),
            backoffs: Mutex::new(HashMap::new()),
            waiting: Mutex::new(WaitingRecord::default()),
            last_warnings: Mutex::new(HashMap::new()),
        }
    }

    /// This node's name and `kubernetes.io/hostname` label, read once from the Node object.
    pub async fn node_facts(&self) -> Result<NodeFacts, kube::Error> {
        let mut cached = self.node.lock().await;
        if let Some(facts) = cached.as_ref() {
            return Ok(facts.clone());
        }
        let node = Api::<Node>::all(self.client.clone()).get(&self.me.node).await?;
        let hostname = node
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(keys::HOSTNAME_LABEL))
            .filter(|v| !v.is_empty())
            .cloned()
            .unwrap_or_else(|| self.me.node.clone());
        let facts = NodeFacts { name: self.me.node.clone(), hostname };
        *cached = Some(facts.clone());
        Ok(facts)
    }

    /// A reference to this node's Node object, for events about the node itself.
    pub async fn node_ref(&self) -> Result<ObjectReference, kube::Error> {
        let node = Api::<Node>::all(self.client.clone()).get(&self.me.node).await?;
        Ok(ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: node.metadata.name,
            uid: node.metadata.uid,
            ..Default::default()
        })
    }

    /// A PV of this node (or unlabelled) by name, from the watch caches. Only meaningful once
    /// the watches have synced; callers fall back to a GET before that.
    pub fn known_volume(&self, name: &str) -> Option<Arc<KeptVolume>> {
        let key = kube::runtime::reflector::ObjectRef::new(name);
        self.volumes.iter().find_map(|store| store.get(&key))
    }

    /// The live nodes (this one with the pools it can use now), for deciding who acts on a
    /// shared or every-node volume.
    pub async fn live_nodes(&self) -> Result<Vec<crate::deciding::topology::LiveNode>, kube::Error> {
        self.membership.live().await
    }

    /// The cached hostname label, or the node name before the Node was read.
    pub async fn my_hostname(&self) -> String {
        match self.node_facts().await {
            Ok(facts) => facts.hostname,
            Err(_) => self.me.node.clone(),
        }
    }

    /// Next retry delay for `key` (exponential with jitter, capped, never giving up).
    pub fn next_retry(&self, key: &str) -> Duration {
        let mut backoffs = self.backoffs.lock().unwrap_or_else(|e| e.into_inner());
        let backoff = backoffs.entry(key.to_owned()).or_insert_with(new_backoff);
        backoff.next().unwrap_or(MAX_RETRY)
    }

    /// The record of claims placed on another node.
    pub fn waiting(&self) -> std::sync::MutexGuard<'_, WaitingRecord> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets everything remembered about a claim this node no longer keeps (bound, moved away,
    /// deleted): its retry backoff, warnings, its record as waiting for another node and reports
    /// of it.
    pub fn forget_claim(&self, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) {
        let key =
            format!("{}/{}", meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default());
        self.reset_retry(&key);
        if let Some(uid) = meta.uid.as_deref() {
            self.waiting().forget(uid);
            self.forget_warnings(uid);
            self.metrics.waiting_claims.forget(uid);
        }
    }

    /// The reserve of the pool root `root` (its own `reserve=`, else `RESERVED_SPACE`).
    pub fn reserve_of(&self, root: &std::path::Path) -> u64 {
        self.config.pools.iter().find(|p| p.root == root).and_then(|p| p.reserve).unwrap_or(self.config.reserved_bytes)
    }

    /// Starts byte copy `id` (a snapshot's, a restore's) of `needed` bytes on `root` when it
    /// fits, given the root's statvfs `available` and `total` bytes: beside the reserve, the
    /// other copies in flight and, with requests accounting, what is promised to the pool's
    /// volumes (those the watch caches show and those being made, `own_pv` left out: a restore's
    /// copy fills its own volume) and to kept copies (deciding::copy_room). Decided under the
    /// provisioning ledger's lock, as a volume's plan is, so that a copy and a volume decided at
    /// the same time see each other. `Err((room, in_flight))` when it does not fit: the room
    /// beyond the reserve and promises, and what the other copies in flight take of it.
    pub fn start_copy(
        &self,
        id: &str,
        root: &std::path::Path,
        needed: u64,
        own_pv: &str,
        available: u64,
        total: u64,
    ) -> Result<(), (u64, u64)> {
        let requests = self
            .config
            .pools
            .iter()
            .find(|p| p.root == root)
            .is_some_and(|p| p.accounting == Some(crate::deciding::capacity::CapacityAccounting::Requests));
        let reservations = self.reservations.lock().unwrap_or_else(|e| e.into_inner());
        let volumes = requests.then(|| {
            let volumes: Vec<_> = self.volumes.iter().flat_map(|store| store.state()).collect();
            // "Counted from the cache" means this snapshot of it (as claim_facts::count_promised).
            let snapshot: std::collections::HashSet<&str> =
                volumes.iter().filter_map(|pv| pv.metadata.name.as_deref()).collect();
            VolumePromises {
                cached: crate::deciding::volume::promised_bytes(volumes.iter().map(|pv| pv.as_ref()), root),
                being_made: reservations.outstanding(
                    &root.to_string_lossy(),
                    own_pv,
                    |name| snapshot.contains(name),
                    Instant::now(),
                ),
            }
        });
        let mut copies = self.copies.lock().unwrap_or_else(|e| e.into_inner());
        let room = copies.room_for_copy(root, available, total, self.reserve_of(root), volumes);
        copies.start(id, root, needed, room).map_err(|in_flight| (room, in_flight))
    }

    /// Forgets the backoff of `key` after a success.
    pub fn reset_retry(&self, key: &str) {
        self.backoffs.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }

    /// Publishes a Normal event.
    pub async fn normal(&self, regarding: &ObjectReference, reason: &str, action: &str, note: String) {
        self.publish(regarding, EventType::Normal, reason, action, note).await;
    }

    /// Publishes a Normal event that cannot recur for the same version of its object (a volume
    /// provisioned: its PV is created once), as the recorder would publish it the first time. The
    /// recorder keeps every event it sends for six minutes, to count a repeat into a series: about
    /// 2 KiB per volume in a burst, for a repeat that never comes. This one is not kept.
    pub async fn normal_once(&self, regarding: &ObjectReference, reason: &str, action: &str, note: String) {
        self.publish_unkept(regarding, EventType::Normal, reason, action, note).await;
    }

    /// Publishes a Warning event, unless the same warning went out on the object recently.
    pub async fn warn(&self, regarding: &ObjectReference, reason: &str, action: &str, note: String) {
        let key = regarding.uid.clone().or_else(|| regarding.name.clone()).unwrap_or_default();
        {
            let mut last = self.last_warnings.lock().unwrap_or_else(|e| e.into_inner());
            let text = format!("{reason}: {note}");
            if let Some((previous, at)) = last.get(&key)
                && *previous == text
                && at.elapsed() < EVENT_REPEAT
            {
                return;
            }
            last.insert(key, (text, Instant::now()));
        }
        self.publish(regarding, EventType::Warning, reason, action, note).await;
    }

    /// Forgets warnings about an object that was dealt with or is gone.
    pub fn forget_warnings(&self, uid: &str) {
        self.last_warnings.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }

    async fn publish(&self, regarding: &ObjectReference, type_: EventType, reason: &str, action: &str, note: String) {
        // The recorder names an Event after its object: for a name too long for that, the Event
        // is written as a first occurrence under a shortened name (deciding::event), or the
        // user would never see it.
        if !event::recorder_can_name(regarding.name.as_deref().unwrap_or_default()) {
            return self.publish_unkept(regarding, type_, reason, action, note).await;
        }
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(truncate_utf8(note, 1024)),
            action: action.into(),
            secondary: None,
        };
        // An event that cannot be written must not fail the operation it reports on.
        if let Err(error) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(%error, reason, object = ?regarding.name, "could not publish event");
        }
    }
}

impl Context {
    /// Writes an Event as a first occurrence, outside the recorder (which would keep it to count
    /// repeats): named by [`event::event_name`], reported by the provisioner on this node.
    async fn publish_unkept(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let type_ = match type_ {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        };
        let note = truncate_utf8(note, 1024);
        let text = event::EventText { type_, reason, action, note: &note };
        let event = event::new_event(&self.me.provisioner, &self.me.node, regarding, text, Timestamp::now());
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        if let Err(error) = events.create(&PostParams::default(), &event).await {
            tracing::warn!(%error, reason, object = ?regarding.name, "could not publish event");
        }
    }
}

fn new_backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(MIN_RETRY)
        .with_max_delay(MAX_RETRY)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// Cuts `s` to at most `max` bytes on a character boundary (event notes are limited to 1 KiB).
pub fn truncate_utf8(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_from_about_a_second_to_five_minutes_and_never_ends() {
        let mut b = new_backoff();
        let first = b.next().unwrap();
        assert!(first >= MIN_RETRY && first <= MIN_RETRY * 2, "{first:?}");
        let later: Vec<Duration> = b.take(40).collect();
        assert_eq!(later.len(), 40, "never gives up");
        // backon adds up to 100% jitter on top of the capped delay.
        assert!(later.iter().all(|d| *d <= MAX_RETRY * 2), "{later:?}");
        assert!(*later.last().unwrap() >= MAX_RETRY, "{later:?}");
    }

    #[test]
    fn an_unkept_event_is_the_recorders_first_occurrence() {
        let me = Identity {
            provisioner: "kubevirt.io/hostpath-provisioner".into(),
            node: "node-a".into(),
            affinity: Vec::new(),
            capacity_provisioner: None,
        };
        let regarding = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            name: Some("data".into()),
            namespace: Some("apps".into()),
            uid: Some("u-1".into()),
            ..Default::default()
        };
        let text =
            event::EventText { type_: "Normal", reason: "ProvisioningSucceeded", action: "Provision", note: "made" };
        let event = event::new_event(&me.provisioner, &me.node, &regarding, text, Timestamp::now());
        let name = event.metadata.name.as_deref().unwrap();
        assert!(name.starts_with("data.") && u128::from_str_radix(&name[5..], 16).is_ok(), "{name}");
        assert_eq!(event.metadata.namespace.as_deref(), Some("apps"));
        assert_eq!(event.regarding.as_ref(), Some(&regarding));
        assert_eq!(
            (event.type_.as_deref(), event.reason.as_deref(), event.action.as_deref(), event.note.as_deref()),
            (Some("Normal"), Some("ProvisioningSucceeded"), Some("Provision"), Some("made"))
        );
        // The recorder's Reporter: the provisioner, on this node.
        assert_eq!(event.reporting_controller.as_deref(), Some("kubevirt.io/hostpath-provisioner"));
        assert_eq!(event.reporting_instance.as_deref(), Some("node-a"));
        assert!(event.series.is_none() && event.related.is_none() && event.event_time.is_some());
    }

    #[test]
    fn truncation_keeps_utf8_valid() {
        assert_eq!(truncate_utf8("héllo".into(), 2), "h");
        assert_eq!(truncate_utf8("abc".into(), 10), "abc");
    }
}

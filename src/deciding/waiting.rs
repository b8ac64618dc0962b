//! Claims placed on another node, as every node remembers them: a compact record, not the claim.
//!
//! A claim whose metadata places it on another node (`kubevirt.io/provisionOnNode`, or the
//! scheduler's `selected-node` for our provisioner) is that node's to provision. Every other node
//! remembers it for one reason: when that node runs no provisioner (a taint the DaemonSet does
//! not tolerate, its nodeSelector, a typo in the annotation), one live node must say so on the
//! claim, or it waits without a word (reconciling::stranded). A cluster can hold many such
//! claims, all on one dead node's name, and every node remembers every one of them: kept whole in
//! the watch cache and the controller's queue they cost kilobytes each on every node (204 MiB for
//! 50,000), where this record keeps the few fields the explanation reads.
//!
//! The record follows the claim watch: an event placing a claim elsewhere records it (whole
//! objects come with every event, so nothing is ever read back), any other event or a deletion
//! drops it, and a re-list drops what the new list no longer holds. When to look at each entry
//! and what to do then are decided here; reconciling::stranded carries it out.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::deciding::class::claim_class_name;
use crate::deciding::topology::{self, Acting, LiveNode};

/// How often a claim still waiting is looked at again.
pub const RECHECK: Duration = Duration::from_secs(300);

/// What the explanation needs of a claim placed on another node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingClaim {
    /// The claim's uid (the key; also the event's name).
    pub uid: Box<str>,
    /// Its namespace.
    pub namespace: Arc<str>,
    /// Its name.
    pub name: Box<str>,
    /// The node it is placed on.
    pub node: Arc<str>,
    /// Its class (`spec.storageClassName`, or the beta annotation), if any.
    pub class: Option<Arc<str>>,
    /// No volume named yet: only such a claim is explained.
    pub unbound: bool,
}

impl WaitingClaim {
    /// The record of `claim`, placed on `node`; `None` without a uid, namespace or name (the API
    /// server always sets them).
    pub fn of(claim: &PersistentVolumeClaim, node: &str) -> Option<Self> {
        let meta = &claim.metadata;
        Some(Self {
            uid: meta.uid.as_deref()?.into(),
            namespace: meta.namespace.as_deref()?.into(),
            name: meta.name.as_deref()?.into(),
            node: node.into(),
            class: claim_class_name(claim).map(Into::into),
            unbound: claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_none_or(str::is_empty),
        })
    }
}

/// One entry: the claim, since when it waits, when to look next, and the list it was last seen in.
#[derive(Debug)]
struct Entry {
    claim: WaitingClaim,
    since: Instant,
    next_look: Instant,
    listing: u64,
}

/// Every claim this node knows to be placed on another node, by uid.
#[derive(Debug, Default)]
pub struct WaitingRecord {
    entries: HashMap<Box<str>, Entry>,
    /// Namespaces, node and class names are shared by many claims: each is stored once.
    names: HashSet<Arc<str>>,
    /// Counts the watch's lists; an entry remembers the one it was last seen in.
    listing: u64,
}

impl WaitingRecord {
    /// Records `claim` as seen now. A claim already recorded for the same node keeps its waiting
    /// time and its next look; one placed on a different node waits anew. The first look comes
    /// `grace` after the claim was first seen: a claim whose node is alive is provisioned there
    /// within that time, and is then dropped from the record by its next event.
    pub fn record(&mut self, claim: WaitingClaim, now: Instant, grace: Duration) {
        let claim = WaitingClaim {
            namespace: self.intern(&claim.namespace),
            node: self.intern(&claim.node),
            class: claim.class.as_deref().map(|class| self.intern(class)),
            ..claim
        };
        let listing = self.listing;
        match self.entries.get_mut(&claim.uid) {
            Some(entry) if entry.claim.node == claim.node => {
                entry.claim = claim;
                entry.listing = listing;
            }
            _ => {
                let first_look = now + grace + Duration::from_secs(1);
                self.entries.insert(claim.uid.clone(), Entry { claim, since: now, next_look: first_look, listing });
            }
        }
    }

    /// Drops claim `uid`; whether it was recorded.
    pub fn forget(&mut self, uid: &str) -> bool {
        self.entries.remove(uid).is_some()
    }

    /// The watch starts listing again: what the list does not hold is dropped at [`Self::listed`].
    pub fn listing(&mut self) {
        self.listing += 1;
    }

    /// The list is complete: drops and returns the uids of entries it did not hold.
    pub fn listed(&mut self) -> Vec<Box<str>> {
        let current = self.listing;
        let gone: Vec<Box<str>> =
            self.entries.iter().filter(|(_, entry)| entry.listing != current).map(|(uid, _)| uid.clone()).collect();
        for uid in &gone {
            self.entries.remove(uid);
        }
        self.drop_unused_names();
        gone
    }

    /// The claims due for a look at `now`, with how long each has waited.
    pub fn due(&mut self, now: Instant) -> Vec<(WaitingClaim, Duration)> {
        self.drop_unused_names();
        self.entries
            .values()
            .filter(|entry| entry.next_look <= now)
            .map(|entry| (entry.claim.clone(), now.saturating_duration_since(entry.since)))
            .collect()
    }

    /// Sets when claim `uid` is looked at next (nothing if it was dropped meanwhile).
    pub fn look_again(&mut self, uid: &str, at: Instant) {
        if let Some(entry) = self.entries.get_mut(uid) {
            entry.next_look = at;
        }
    }

    /// Whether claim `uid` is recorded.
    pub fn contains(&self, uid: &str) -> bool {
        self.entries.contains_key(uid)
    }

    /// The recorded claims' uids.
    pub fn uids(&self) -> impl Iterator<Item = String> + '_ {
        self.entries.keys().map(|uid| uid.to_string())
    }

    /// How many claims are recorded.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn intern(&mut self, name: &str) -> Arc<str> {
        if let Some(shared) = self.names.get(name) {
            return shared.clone();
        }
        let shared: Arc<str> = name.into();
        self.names.insert(shared.clone());
        shared
    }

    /// Forgets names no entry uses any more (a deleted namespace, a node's name that was a typo).
    fn drop_unused_names(&mut self) {
        self.names.retain(|name| Arc::strong_count(name) > 1);
    }
}

/// What to do about a claim due for a look.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Look {
    /// Its node has a live provisioner: it waits for something else there, and that node says
    /// what. Withdraw any report of it.
    NodeAlive,
    /// Another live node speaks for it. Withdraw any report of it.
    OtherSpeaks,
    /// This node speaks: one event on the claim for the cluster, and the report renewed.
    Explain,
    /// Not ours to explain (another provisioner's class, or a volume already named).
    Quiet,
}

/// The look at `claim` by node `me`, given the live nodes and whether its class is ours; and how
/// long until the next look. The node speaking for a claim is the same for every node (its uid
/// ranks the live nodes), so one event is written for the cluster.
pub fn look(claim: &WaitingClaim, me: &str, live: &[LiveNode], class_is_ours: bool) -> (Look, Duration) {
    if live.iter().any(|n| *n.node == *claim.node) {
        return (Look::NodeAlive, RECHECK);
    }
    match topology::spokesman(&claim.uid, me, live) {
        // Look again when the speaker's lease would have expired, in case it died.
        Acting::Other { recheck_after, .. } => (Look::OtherSpeaks, recheck_after.min(RECHECK)),
        Acting::Me | Acting::Nobody if class_is_ours && claim.unbound => (Look::Explain, RECHECK),
        Acting::Me | Acting::Nobody => (Look::Quiet, RECHECK),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deciding::topology::PoolKey;

    const GRACE: Duration = Duration::from_secs(30);

    fn waiting(uid: &str, node: &str) -> WaitingClaim {
        WaitingClaim {
            uid: uid.into(),
            namespace: "default".into(),
            name: format!("claim-{uid}").into(),
            node: node.into(),
            class: Some("hpp".into()),
            unbound: true,
        }
    }

    fn live(nodes: &[&str]) -> Vec<LiveNode> {
        nodes
            .iter()
            .map(|n| LiveNode {
                node: (*n).into(),
                pools: vec![PoolKey::new("local", "/var/hpvolumes")],
                expires_in: Duration::from_secs(40),
            })
            .collect()
    }

    #[test]
    fn a_claim_is_first_looked_at_after_the_grace_and_keeps_its_wait_across_updates() {
        let mut record = WaitingRecord::default();
        let start = Instant::now();
        record.record(waiting("a", "gone"), start, GRACE);
        assert!(record.due(start + GRACE).is_empty(), "the node may still provision it");
        // An update of the same claim (a new resourceVersion) changes nothing of the wait.
        record.record(waiting("a", "gone"), start + Duration::from_secs(20), GRACE);
        let due = record.due(start + GRACE + Duration::from_secs(1));
        assert_eq!(due, vec![(waiting("a", "gone"), GRACE + Duration::from_secs(1))]);
        record.look_again("a", start + GRACE + RECHECK);
        assert!(record.due(start + GRACE + Duration::from_secs(2)).is_empty());
        // Placed on another node: it waits anew.
        record.record(waiting("a", "elsewhere"), start + Duration::from_secs(100), GRACE);
        assert!(record.due(start + Duration::from_secs(100) + GRACE).is_empty());
        assert_eq!(record.due(start + Duration::from_secs(101) + GRACE).len(), 1);
    }

    #[test]
    fn a_list_drops_what_it_no_longer_holds() {
        let mut record = WaitingRecord::default();
        let now = Instant::now();
        record.record(waiting("a", "gone"), now, GRACE);
        record.record(waiting("b", "gone"), now, GRACE);
        record.listing();
        record.record(waiting("b", "gone"), now, GRACE);
        let mut gone = record.listed();
        gone.sort();
        assert_eq!(gone, vec![Box::<str>::from("a")]);
        assert!(record.contains("b") && !record.contains("a") && record.len() == 1);
        // A claim recorded after the list, before the next one, stays through that next list
        // only if that list holds it.
        record.listing();
        assert_eq!(record.listed().len(), 1);
        assert!(record.is_empty());
    }

    #[test]
    fn shared_names_are_stored_once_and_forgotten_with_their_last_claim() {
        let mut record = WaitingRecord::default();
        let now = Instant::now();
        for uid in ["a", "b", "c"] {
            record.record(waiting(uid, "gone"), now, GRACE);
        }
        let due = record.due(now + GRACE + Duration::from_secs(1));
        assert!(due.windows(2).all(|pair| Arc::ptr_eq(&pair[0].0.node, &pair[1].0.node)));
        assert!(due.windows(2).all(|pair| Arc::ptr_eq(&pair[0].0.namespace, &pair[1].0.namespace)));
        drop(due);
        // default, gone, hpp
        assert_eq!(record.names.len(), 3);
        for uid in ["a", "b", "c"] {
            assert!(record.forget(uid));
        }
        assert!(!record.forget("a"));
        record.due(now);
        assert!(record.names.is_empty());
    }

    #[test]
    fn exactly_one_live_node_explains_a_claim_of_ours_whose_node_is_absent() {
        let nodes = ["n1", "n2", "n3"];
        for uid in ["a", "b", "c", "d", "e", "f"] {
            let claim = waiting(uid, "gone");
            let looks: Vec<Look> = nodes.iter().map(|me| look(&claim, me, &live(&nodes), true).0).collect();
            assert_eq!(looks.iter().filter(|l| **l == Look::Explain).count(), 1, "{uid}: {looks:?}");
            assert_eq!(looks.iter().filter(|l| **l == Look::OtherSpeaks).count(), 2, "{uid}: {looks:?}");
        }
    }

    #[test]
    fn a_live_node_or_a_claim_not_ours_to_explain_gets_no_word() {
        let nodes = ["n1", "n2"];
        let alive = waiting("a", "n2");
        assert_eq!(look(&alive, "n1", &live(&nodes), true), (Look::NodeAlive, RECHECK));
        // Whichever node would speak for it, a bound claim or another provisioner's is not explained.
        for me in nodes {
            let bound = WaitingClaim { unbound: false, ..waiting("a", "gone") };
            let (look_bound, _) = look(&bound, me, &live(&nodes), true);
            let (look_foreign, _) = look(&waiting("a", "gone"), me, &live(&nodes), false);
            for seen in [look_bound, look_foreign] {
                assert!(matches!(seen, Look::Quiet | Look::OtherSpeaks), "{seen:?}");
            }
        }
        // The speaker is looked at again once its lease would have expired, not only every RECHECK.
        let (seen, next) = look(&waiting("a", "gone"), "n9", &live(&nodes), true);
        assert_eq!(seen, Look::OtherSpeaks);
        assert!(next < RECHECK, "{next:?}");
    }
}

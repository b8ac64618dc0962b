//! Volumes of nodes that are gone (opt-in, `--reap-volumes-of-removed-nodes`): a node-shaped PV
//! whose owner's Node object was deleted and stayed deleted past a grace period can never be
//! reclaimed by its owner, and stays `Released` forever. When the admin asks for it, one node
//! speaking for the cluster deletes such PV objects (the data went with the node). Pure: the
//! reconciler gathers the PVs, the Node names and when each missing node was first seen missing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::volume::owner_node;
use crate::keys;

/// What the reconciler knows in one pass.
pub struct ReapFacts<'a> {
    /// Every PV (the pass lists them).
    pub pvs: &'a [KeptVolume],
    /// Which of the owners named by [`owners_to_check`] still have a Node object.
    pub nodes: &'a BTreeSet<String>,
    /// When this node first saw each owner missing (kept between passes, empty after a restart:
    /// the grace period then starts again, which only delays).
    pub absent_since: &'a BTreeMap<String, Instant>,
    /// Now.
    pub now: Instant,
    /// How long a node must stay missing.
    pub grace: Duration,
    /// Our provisioner name: only PVs it made are considered.
    pub provisioner: &'a str,
}

/// One PV to delete.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reap {
    /// PV name.
    pub pv: String,
    /// Its uid and resourceVersion, the preconditions of the delete (a PV changed since, for
    /// example switched to Retain, is not deleted).
    pub uid: String,
    pub resource_version: String,
    /// The node that is gone.
    pub node: String,
    /// The PV carries our deletion-protection finalizer, which only its owner would remove.
    pub remove_finalizer: bool,
    /// It is already being deleted (only the finalizer holds it).
    pub already_deleted: bool,
}

/// The outcome of one pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReapPlan {
    /// PVs to delete now.
    pub reap: Vec<Reap>,
    /// Missing owners still within the grace period, with the time left.
    pub waiting: BTreeMap<String, Duration>,
    /// `absent_since` for the next pass: owners still missing keep their first sighting; owners
    /// back (or without a PV left) are forgotten.
    pub absent_since: BTreeMap<String, Instant>,
}

/// Decides which PVs of removed nodes to delete now.
pub fn plan_reaping(facts: &ReapFacts<'_>) -> ReapPlan {
    let mut plan = ReapPlan::default();
    for pv in facts.pvs {
        let Some(owner) = reapable_owner(pv, facts.provisioner) else { continue };
        if facts.nodes.contains(owner) {
            continue;
        }
        let since = *plan
            .absent_since
            .entry(owner.to_owned())
            .or_insert_with(|| facts.absent_since.get(owner).copied().unwrap_or(facts.now));
        let missing_for = facts.now.saturating_duration_since(since);
        if missing_for < facts.grace {
            plan.waiting.insert(owner.to_owned(), facts.grace - missing_for);
            continue;
        }
        let finalizers = pv.metadata.finalizers.as_deref().unwrap_or_default();
        plan.reap.push(Reap {
            pv: pv.metadata.name.clone().unwrap_or_default(),
            uid: pv.metadata.uid.clone().unwrap_or_default(),
            resource_version: pv.metadata.resource_version.clone().unwrap_or_default(),
            node: owner.to_owned(),
            remove_finalizer: finalizers.iter().any(|f| f == keys::PROTECTION_FINALIZER),
            already_deleted: pv.metadata.deletion_timestamp.is_some(),
        });
    }
    plan
}

/// The owners whose Node objects the reconciler must look up (one GET each) for this pass.
pub fn owners_to_check<'a>(pvs: &'a [KeptVolume], provisioner: &str) -> BTreeSet<&'a str> {
    pvs.iter().filter_map(|pv| reapable_owner(pv, provisioner)).collect()
}

/// The owner of a PV this provisioner made for one node, Released under reclaim policy Delete:
/// the only PVs whose owner would delete them, were it alive. Retain keeps everything. Only PVs
/// that name their node in `kubevirt.io/provisionOnNode` (every PV since 2019): older ones name
/// a hostname label value, which is not a Node name that a lookup could disprove.
fn reapable_owner<'a>(pv: &'a KeptVolume, provisioner: &str) -> Option<&'a str> {
    let annotations = pv.metadata.annotations.as_ref()?;
    if annotations.get(keys::PROVISIONED_BY).map(String::as_str) != Some(provisioner) {
        return None;
    }
    let spec = pv.spec.as_ref()?;
    if spec.persistent_volume_reclaim_policy.as_deref() != Some("Delete") {
        return None;
    }
    if pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Released") {
        return None;
    }
    annotations.get(keys::PROVISION_ON_NODE)?;
    owner_node(pv)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const GONE: &str = "node-gone";

    fn pv_of(node: &str, name: &str, phase: &str, policy: &str) -> KeptVolume {
        let mut pv = crate::test_fixtures::pv(&format!("/var/hpvolumes/{name}"), phase).owner_annotation(node).build();
        pv.metadata.name = Some(name.into());
        pv.metadata.uid = Some(format!("uid-{name}"));
        pv.metadata.resource_version = Some("7".into());
        pv.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some(policy.into());
        pv
    }

    fn plan(pvs: &[KeptVolume], absent: &BTreeMap<String, Instant>, now: Instant) -> ReapPlan {
        let nodes: BTreeSet<String> = [NODE.to_owned()].into();
        plan_reaping(&ReapFacts {
            pvs,
            nodes: &nodes,
            absent_since: absent,
            now,
            grace: Duration::from_secs(600),
            provisioner: PROVISIONER,
        })
    }

    #[test]
    fn a_released_delete_pv_of_a_node_gone_past_the_grace_period_is_reaped_and_nothing_else() {
        let pvs = [
            pv_of(GONE, "pvc-a", "Released", "Delete"),
            pv_of(GONE, "pvc-retained", "Released", "Retain"),
            pv_of(GONE, "pvc-bound", "Bound", "Delete"),
            pv_of(NODE, "pvc-alive", "Released", "Delete"),
        ];
        let start = Instant::now();
        // First sighting: the grace period starts, nothing is deleted.
        let first = plan(&pvs, &BTreeMap::new(), start);
        assert!(first.reap.is_empty());
        assert_eq!(first.waiting.get(GONE), Some(&Duration::from_secs(600)));
        assert_eq!(first.absent_since.get(GONE), Some(&start));
        // Within the grace period: still nothing.
        let later = plan(&pvs, &first.absent_since, start + Duration::from_secs(599));
        assert!(later.reap.is_empty());
        // Past it: only the Released, Delete PV of the missing node.
        let past = plan(&pvs, &first.absent_since, start + Duration::from_secs(600));
        let names: Vec<_> = past.reap.iter().map(|r| r.pv.as_str()).collect();
        assert_eq!(names, ["pvc-a"]);
        assert_eq!(past.reap[0].node, GONE);
        assert_eq!((past.reap[0].uid.as_str(), past.reap[0].resource_version.as_str()), ("uid-pvc-a", "7"));
    }

    #[test]
    fn a_node_that_comes_back_is_forgotten_and_its_clock_starts_again() {
        let pvs = [pv_of(GONE, "pvc-a", "Released", "Delete")];
        let start = Instant::now();
        let first = plan(&pvs, &BTreeMap::new(), start);
        let nodes: BTreeSet<String> = [NODE.to_owned(), GONE.to_owned()].into();
        let back = plan_reaping(&ReapFacts {
            pvs: &pvs,
            nodes: &nodes,
            absent_since: &first.absent_since,
            now: start + Duration::from_secs(700),
            grace: Duration::from_secs(600),
            provisioner: PROVISIONER,
        });
        assert!(back.reap.is_empty() && back.absent_since.is_empty(), "{back:?}");
        let gone_again = plan(&pvs, &back.absent_since, start + Duration::from_secs(800));
        assert!(gone_again.reap.is_empty(), "a new grace period");
    }

    #[test]
    fn a_pv_naming_its_node_only_by_hostname_affinity_is_never_reaped() {
        let mut legacy = crate::test_fixtures::pv("/var/hpvolumes/pvc-old", "Released").hostname_affinity(GONE).build();
        legacy.metadata.name = Some("pvc-old".into());
        assert!(owners_to_check(std::slice::from_ref(&legacy), PROVISIONER).is_empty());
        let start = Instant::now();
        let absent = BTreeMap::from([(GONE.to_owned(), start)]);
        assert!(plan(&[legacy], &absent, start + Duration::from_secs(601)).reap.is_empty());
    }

    #[test]
    fn other_provisioners_pvs_are_never_touched_and_a_finalizer_of_ours_is_noted() {
        let mut other = pv_of(GONE, "pvc-other", "Released", "Delete");
        other.metadata.annotations.as_mut().unwrap().insert(keys::PROVISIONED_BY.into(), "example.com/other".into());
        let mut protected = pv_of(GONE, "pvc-protected", "Released", "Delete");
        protected.metadata.finalizers = Some(vec![keys::PROTECTION_FINALIZER.into()]);
        protected.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        let start = Instant::now();
        let absent = BTreeMap::from([(GONE.to_owned(), start)]);
        let past = plan(&[other, protected], &absent, start + Duration::from_secs(601));
        assert_eq!(past.reap.len(), 1);
        assert_eq!(past.reap[0].pv, "pvc-protected");
        assert!(past.reap[0].remove_finalizer && past.reap[0].already_deleted);
    }
}

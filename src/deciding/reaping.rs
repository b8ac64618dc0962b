//! Volumes of nodes that are gone. A node-shaped PV whose owner's Node object was deleted and
//! stayed deleted past a grace period can never be reclaimed by its owner. Two opt-in answers:
//!
//! - `--reap-volumes-of-removed-nodes`, one node speaking for the cluster: a `Released` PV stays
//!   so forever; its PV object is deleted (the data went with the node).
//! - `release-claims-of-removed-nodes`, the subcommand run as a Deployment of its own (the only
//!   holder of `delete` on claims; node pods never delete claims): a `Bound` PV keeps its claim, and the claim's workload
//!   (a StatefulSet's pod) waits for a node that is gone. The PV is set to `Retain` first, so that
//!   nothing deletes the data, not even the node's own provisioner if the node comes back; then
//!   the claim is deleted, and the workload's controller makes a new one, provisioned where its
//!   pod can run now.
//!
//! Pure: the reconciler gathers the PVs, the Node names and when each missing node was first
//! seen missing.

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
    /// Which answers are on, after how long.
    pub graces: Graces,
    /// Our provisioner names: only PVs made under one of them are considered.
    pub provisioners: &'a [&'a str],
}

/// How long a node must stay missing before each answer; `None`: that answer is off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Graces {
    /// Before its Released PVs are deleted (`--reap-volumes-of-removed-nodes`).
    pub reap: Option<Duration>,
    /// Before the claims bound to its PVs are released (`--release-claims-of-removed-nodes`).
    pub release: Option<Duration>,
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

/// One claim to release from a gone node's PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The PV, with its uid and resourceVersion: the preconditions of the change to `Retain`.
    pub pv: String,
    pub pv_uid: String,
    pub pv_resource_version: String,
    /// The node that is gone.
    pub node: String,
    /// The claim the PV is bound to, by its `claimRef`; its uid is the precondition of the
    /// delete (a claim of the same name made since is not deleted).
    pub claim_namespace: String,
    pub claim_name: String,
    pub claim_uid: String,
    /// The PV's reclaim policy is not `Retain` yet: set it first, and delete the claim only
    /// once that write succeeded.
    pub retain_first: bool,
}

/// The outcome of one pass.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReapPlan {
    /// PVs to delete now.
    pub reap: Vec<Reap>,
    /// Claims to release now.
    pub release: Vec<Release>,
    /// Missing owners still within a grace period, with the least time left.
    pub waiting: BTreeMap<String, Duration>,
    /// `absent_since` for the next pass: owners still missing keep their first sighting; owners
    /// back (or without a PV left) are forgotten.
    pub absent_since: BTreeMap<String, Instant>,
}

/// What a gone node's PV may get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    Reap,
    Release,
}

/// Decides which PVs of removed nodes to delete and which of their claims to release now.
pub fn plan_reaping(facts: &ReapFacts<'_>) -> ReapPlan {
    let mut plan = ReapPlan::default();
    for pv in facts.pvs {
        let Some((owner, answer)) = candidate(pv, facts.provisioners, facts.graces) else { continue };
        if facts.nodes.contains(owner) {
            continue;
        }
        let grace = match answer {
            Answer::Reap => facts.graces.reap,
            Answer::Release => facts.graces.release,
        };
        let Some(grace) = grace else { continue };
        let since = *plan
            .absent_since
            .entry(owner.to_owned())
            .or_insert_with(|| facts.absent_since.get(owner).copied().unwrap_or(facts.now));
        let missing_for = facts.now.saturating_duration_since(since);
        if missing_for < grace {
            let left = grace - missing_for;
            plan.waiting.entry(owner.to_owned()).and_modify(|l| *l = (*l).min(left)).or_insert(left);
            continue;
        }
        let name = pv.metadata.name.clone().unwrap_or_default();
        let uid = pv.metadata.uid.clone().unwrap_or_default();
        let resource_version = pv.metadata.resource_version.clone().unwrap_or_default();
        match answer {
            Answer::Reap => {
                let finalizers = pv.metadata.finalizers.as_deref().unwrap_or_default();
                plan.reap.push(Reap {
                    pv: name,
                    uid,
                    resource_version,
                    node: owner.to_owned(),
                    remove_finalizer: finalizers.iter().any(|f| f == keys::PROTECTION_FINALIZER),
                    already_deleted: pv.metadata.deletion_timestamp.is_some(),
                });
            }
            Answer::Release => {
                let spec = pv.spec.as_ref();
                let claim = spec.and_then(|s| s.claim_ref.as_ref());
                let field = |f: fn(&crate::deciding::kept_volume::KeptClaimRef) -> &Option<String>| {
                    claim.and_then(|c| f(c).clone()).unwrap_or_default()
                };
                plan.release.push(Release {
                    pv: name,
                    pv_uid: uid,
                    pv_resource_version: resource_version,
                    node: owner.to_owned(),
                    claim_namespace: field(|c| &c.namespace),
                    claim_name: field(|c| &c.name),
                    claim_uid: field(|c| &c.uid),
                    retain_first: spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) != Some("Retain"),
                });
            }
        }
    }
    plan
}

/// The owners whose Node objects the reconciler must look up (one GET each) for this pass.
pub fn owners_to_check<'a>(pvs: &'a [KeptVolume], provisioners: &[&str], graces: Graces) -> BTreeSet<&'a str> {
    pvs.iter().filter_map(|pv| candidate(pv, provisioners, graces)).map(|(owner, _)| owner).collect()
}

/// The owner of a PV this provisioner made for one node, and what its absence may lead to
/// (only the answers turned on):
/// - `Released` under reclaim policy Delete: the only PVs whose owner would delete them, were it
///   alive; Retain keeps everything.
/// - `Bound` to a claim named by uid (not being deleted): its claim may be released.
///
/// Only PVs that name their node in `kubevirt.io/provisionOnNode` (every PV since 2019): older
/// ones name a hostname label value, which is not a Node name that a lookup could disprove.
fn candidate<'a>(pv: &'a KeptVolume, provisioners: &[&str], graces: Graces) -> Option<(&'a str, Answer)> {
    let provisioned_by = pv.annotations.get(keys::PROVISIONED_BY)?;
    if !provisioners.contains(&provisioned_by) {
        return None;
    }
    pv.annotations.get(keys::PROVISION_ON_NODE)?;
    // Pinned to a label (nodeAffinityKey): the node that made it is not its owner; a node of
    // another name with the label (a reinstalled node, the same disk) takes it over. Its node
    // being gone says nothing: left alone.
    if crate::deciding::node_affinity::pinned_label(pv).is_some() {
        return None;
    }
    let spec = pv.spec.as_ref()?;
    let answer = match pv.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Released") if graces.reap.is_some() => {
            (spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete")).then_some(Answer::Reap)?
        }
        Some("Bound") if graces.release.is_some() => {
            let claim = spec.claim_ref.as_ref()?;
            let named =
                [&claim.namespace, &claim.name, &claim.uid].iter().all(|f| f.as_deref().is_some_and(|v| !v.is_empty()));
            (named && pv.metadata.deletion_timestamp.is_none()).then_some(Answer::Release)?
        }
        _ => return None,
    };
    Some((owner_node(pv)?, answer))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_fixtures::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    const GONE: &str = "node-gone";
    const REAP_ONLY: Graces = Graces { reap: Some(Duration::from_secs(600)), release: None };
    const BOTH: Graces = Graces { reap: Some(Duration::from_secs(600)), release: Some(Duration::from_secs(60)) };

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
            graces: REAP_ONLY,
            provisioners: &[PROVISIONER],
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
            graces: REAP_ONLY,
            provisioners: &[PROVISIONER],
        });
        assert!(back.reap.is_empty() && back.absent_since.is_empty(), "{back:?}");
        let gone_again = plan(&pvs, &back.absent_since, start + Duration::from_secs(800));
        assert!(gone_again.reap.is_empty(), "a new grace period");
    }

    #[test]
    fn a_pv_naming_its_node_only_by_hostname_affinity_is_never_reaped() {
        let mut legacy = crate::test_fixtures::pv("/var/hpvolumes/pvc-old", "Released").hostname_affinity(GONE).build();
        legacy.metadata.name = Some("pvc-old".into());
        assert!(owners_to_check(std::slice::from_ref(&legacy), &[PROVISIONER], BOTH).is_empty());
        let start = Instant::now();
        let absent = BTreeMap::from([(GONE.to_owned(), start)]);
        assert!(plan(&[legacy], &absent, start + Duration::from_secs(601)).reap.is_empty());
    }

    #[test]
    fn other_provisioners_pvs_are_never_touched_and_a_finalizer_of_ours_is_noted() {
        let mut other = pv_of(GONE, "pvc-other", "Released", "Delete");
        other.annotations.insert(keys::PROVISIONED_BY, "example.com/other");
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

    fn bound_of(node: &str, name: &str, policy: &str) -> KeptVolume {
        let mut pv = pv_of(node, name, "Bound", policy);
        pv.spec.as_mut().unwrap().claim_ref = Some(KeptClaimRef {
            namespace: Some("apps".into()),
            name: Some(format!("data-{name}")),
            uid: Some(format!("claim-uid-{name}")),
        });
        pv
    }

    fn plan_with(pvs: &[KeptVolume], graces: Graces, absent: &BTreeMap<String, Instant>, now: Instant) -> ReapPlan {
        let nodes: BTreeSet<String> = [NODE.to_owned()].into();
        plan_reaping(&ReapFacts { pvs, nodes: &nodes, absent_since: absent, now, graces, provisioners: &[PROVISIONER] })
    }

    #[test]
    fn the_bound_claims_of_a_node_gone_past_the_release_grace_are_released_and_a_delete_pv_kept_first() {
        let pvs = [
            bound_of(GONE, "pvc-delete", "Delete"),
            bound_of(GONE, "pvc-retain", "Retain"),
            bound_of(NODE, "pvc-alive", "Delete"),
            pv_of(GONE, "pvc-released", "Released", "Delete"),
        ];
        let start = Instant::now();
        let first = plan_with(&pvs, BOTH, &BTreeMap::new(), start);
        assert!(first.release.is_empty() && first.reap.is_empty());
        assert_eq!(first.waiting.get(GONE), Some(&Duration::from_secs(60)), "the shorter grace is what is left");
        let past = plan_with(&pvs, BOTH, &first.absent_since, start + Duration::from_secs(60));
        let released: Vec<_> = past.release.iter().map(|r| (r.pv.as_str(), r.retain_first)).collect();
        assert_eq!(released, [("pvc-delete", true), ("pvc-retain", false)]);
        let first_release = &past.release[0];
        assert_eq!(
            (
                first_release.claim_namespace.as_str(),
                first_release.claim_name.as_str(),
                first_release.claim_uid.as_str()
            ),
            ("apps", "data-pvc-delete", "claim-uid-pvc-delete")
        );
        assert_eq!(
            (first_release.pv_uid.as_str(), first_release.pv_resource_version.as_str()),
            ("uid-pvc-delete", "7")
        );
        assert_eq!(first_release.node, GONE);
        assert!(past.reap.is_empty(), "the Released PV waits for its own, longer grace");
        assert_eq!(past.waiting.get(GONE), Some(&Duration::from_secs(540)));
    }

    #[test]
    fn each_answer_acts_only_when_turned_on() {
        let pvs = [bound_of(GONE, "pvc-bound", "Delete"), pv_of(GONE, "pvc-released", "Released", "Delete")];
        let start = Instant::now();
        let absent = BTreeMap::from([(GONE.to_owned(), start)]);
        let later = start + Duration::from_secs(3_600);
        let reap_only = plan_with(&pvs, REAP_ONLY, &absent, later);
        assert!(reap_only.release.is_empty());
        assert_eq!(reap_only.reap.len(), 1);
        let release_only = Graces { reap: None, release: Some(Duration::from_secs(60)) };
        let releasing = plan_with(&pvs, release_only, &absent, later);
        assert!(releasing.reap.is_empty());
        assert_eq!(releasing.release.len(), 1);
        assert!(plan_with(&pvs, Graces::default(), &absent, later) == ReapPlan::default());
        assert!(owners_to_check(&pvs, &[PROVISIONER], Graces::default()).is_empty());
        assert_eq!(owners_to_check(&pvs, &[PROVISIONER], release_only), [GONE].into());
    }

    /// PVs made under the nodes' second name (`CAPACITY_PROVISIONER_NAME`) count when that name
    /// is given, and only then; another provisioner's never.
    #[test]
    fn pvs_of_the_second_name_count_when_it_is_given() {
        let mut pv = bound_of(GONE, "pvc-bound", "Delete");
        pv.annotations.insert(keys::PROVISIONED_BY, "hostpath.example.org");
        let pvs = [pv];
        let release_only = Graces { reap: None, release: Some(Duration::from_secs(60)) };
        assert!(owners_to_check(&pvs, &[PROVISIONER], release_only).is_empty());
        assert_eq!(owners_to_check(&pvs, &[PROVISIONER, "hostpath.example.org"], release_only), [GONE].into());
        assert!(owners_to_check(&pvs, &[PROVISIONER, "example.com/other"], release_only).is_empty());
    }

    #[test]
    fn a_claim_is_released_only_from_a_node_shaped_pv_of_ours_that_names_it_fully() {
        let start = Instant::now();
        let absent = BTreeMap::from([(GONE.to_owned(), start)]);
        let later = start + Duration::from_secs(3_600);
        let mut foreign = bound_of(GONE, "pvc-foreign", "Delete");
        foreign.annotations.insert(keys::PROVISIONED_BY, "example.com/other");
        let mut no_uid = bound_of(GONE, "pvc-no-uid", "Delete");
        no_uid.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = None;
        let mut deleting = bound_of(GONE, "pvc-deleting", "Delete");
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        let mut shared = bound_of(GONE, "pvc-shared", "Delete");
        shared.annotations.remove(keys::PROVISION_ON_NODE);
        shared.labels = KeptMap::from([(keys::TOPOLOGY_LABEL, "shared")]);
        let pending = pv_of(GONE, "pvc-available", "Available", "Delete");
        let plan = plan_with(&[foreign, no_uid, deleting, shared, pending], BOTH, &absent, later);
        assert_eq!(plan, ReapPlan::default());
    }

    /// The steps of releasing one claim from a gone node's PV (Delete policy), against the
    /// cluster as it may change between them: the node coming back, an admin deleting the PV
    /// or re-creating the claim, the speaking node crashing after any step and a pass running
    /// again. In every order the data stays: the claim is deleted only while the PV is Retain,
    /// and nothing in the plan deletes a PV or a directory.
    #[test]
    fn in_every_interleaving_with_a_node_coming_back_and_a_crash_the_claim_goes_only_once_the_pv_is_retain() {
        #[derive(Clone, Debug)]
        struct World {
            policy: &'static str,
            rv: u32,
            claim_uid: Option<&'static str>,
            node_back: bool,
        }
        #[derive(Clone, Copy, Debug)]
        enum Step {
            Pass,
            NodeBack,
            ClaimRecreated,
            Crash,
        }
        let grace = Graces { reap: None, release: Some(Duration::from_secs(1)) };
        let start = Instant::now();
        let absent = BTreeMap::from([(GONE.to_owned(), start)]);
        let steps = [Step::Pass, Step::NodeBack, Step::ClaimRecreated, Step::Crash];
        let mut orders = 0;
        // Every sequence of up to five steps (a pass may run several times).
        let mut sequences: Vec<Vec<Step>> = vec![vec![]];
        let mut last: Vec<Vec<Step>> = vec![vec![]];
        for _ in 0..5 {
            last = last.iter().flat_map(|seq| steps.iter().map(move |s| [seq.as_slice(), &[*s]].concat())).collect();
            sequences.extend(last.iter().cloned());
        }
        for sequence in sequences {
            orders += 1;
            let mut world = World { policy: "Delete", rv: 7, claim_uid: Some("claim-uid-pvc-x"), node_back: false };
            let mut claim_deleted_under = Vec::new();
            for step in &sequence {
                match step {
                    Step::NodeBack => world.node_back = true,
                    Step::ClaimRecreated => world.claim_uid = world.claim_uid.or(Some("a-new-claim")),
                    // A crash between the two writes: the first happened, the second did not.
                    Step::Crash | Step::Pass => {
                        let mut pv = bound_of(GONE, "pvc-x", world.policy);
                        pv.metadata.resource_version = Some(world.rv.to_string());
                        pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("claim-uid-pvc-x".into());
                        let mut nodes: BTreeSet<String> = [NODE.to_owned()].into();
                        if world.node_back {
                            nodes.insert(GONE.to_owned());
                        }
                        let plan = plan_reaping(&ReapFacts {
                            pvs: std::slice::from_ref(&pv),
                            nodes: &nodes,
                            absent_since: &absent,
                            now: start + Duration::from_secs(10),
                            graces: grace,
                            provisioners: &[PROVISIONER],
                        });
                        assert!(plan.reap.is_empty());
                        for release in plan.release {
                            if release.retain_first {
                                assert_eq!(release.pv_resource_version, world.rv.to_string());
                                world.policy = "Retain";
                                world.rv += 1;
                                if matches!(step, Step::Crash) {
                                    continue;
                                }
                            }
                            // The delete's precondition: the claim's uid.
                            if world.claim_uid == Some(release.claim_uid.as_str()) {
                                claim_deleted_under.push(world.policy);
                                world.claim_uid = None;
                            }
                        }
                    }
                }
            }
            assert!(claim_deleted_under.iter().all(|p| *p == "Retain"), "{sequence:?}: {claim_deleted_under:?}");
            assert!(claim_deleted_under.len() <= 1, "{sequence:?}: the claim goes once");
            let node_back_first = sequence.iter().position(|s| matches!(s, Step::NodeBack));
            let first_pass = sequence.iter().position(|s| matches!(s, Step::Pass | Step::Crash));
            if let (Some(back), Some(pass)) = (node_back_first, first_pass)
                && back < pass
            {
                assert!(
                    claim_deleted_under.is_empty() && world.policy == "Delete",
                    "{sequence:?}: the node came back first"
                );
            }
        }
        assert!(orders > 1_000, "{orders}");
    }
}

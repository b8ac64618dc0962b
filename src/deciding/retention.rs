//! Which objects a node keeps in memory, and how much of each (docs/architecture.md, decisions).
//!
//! Every node watches every claim of the cluster, because any claim may become its own: the
//! scheduler picks its node, an admin annotates it. Likewise every PV without a node label (the Go
//! build's, shared and every-node ones, but also every other provisioner's). A node keeps such an
//! object only while its next event could ask something of this node; all others (bound claims,
//! other provisioners' claims and PVs) are forgotten as soon as their event is seen. A claim
//! placed on another node asks one thing of every node, to notice when that node runs no
//! provisioner: it is kept as a compact record (deciding::waiting), not as a claim. A forgotten
//! object that becomes relevant is seen whole again: every watch event carries the entire object.
//! So memory grows with what this node has to act on, not with the cluster.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::deciding::capacity::parse_bytes;
use crate::deciding::claim::{Interest, claim_interest};
use crate::deciding::identity::Identity;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::waiting::WaitingClaim;
use crate::keys;

/// What a node does with a claim it receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Retention {
    /// Keep it in the watch cache, trimmed by [`trim_claim`]: a claim this node may provision or
    /// must explain, the source of a clone in progress (its cloning protection finalizer is
    /// removed by this node), or a bound claim asking for a new size (the node holding its volume
    /// expands it).
    Keep,
    /// Placed on another node: only its compact record is kept, for the absent-node explanation
    /// (deciding::waiting).
    Waiting(WaitingClaim),
    /// Nothing for this node to do: forgotten.
    Forget,
}

/// Which of the three `claim` is for this node.
pub fn claim_retention(claim: &PersistentVolumeClaim, me: &Identity) -> Retention {
    match claim_interest(&claim.metadata, me) {
        Interest::Elsewhere(node) => WaitingClaim::of(claim, &node).map_or(Retention::Forget, Retention::Waiting),
        Interest::Candidate => Retention::Keep,
        Interest::Ignore
            if claim.metadata.finalizers.iter().flatten().any(|f| f == keys::CLONE_PROTECTION_FINALIZER)
                || size_change_pending(claim) =>
        {
            Retention::Keep
        }
        Interest::Ignore => Retention::Forget,
    }
}

/// A bound claim whose requested size differs from the size it was given: an expansion to make,
/// or a refused one that stays until the request changes again.
pub fn size_change_pending(claim: &PersistentVolumeClaim) -> bool {
    let bytes = |quantity: Option<&str>| quantity.and_then(|q| parse_bytes(q).ok());
    let bound = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).is_some_and(|v| !v.is_empty());
    let requested = bytes(
        claim
            .spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.as_str()),
    );
    let given = bytes(
        claim.status.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage")).map(|q| q.0.as_str()),
    );
    // A request the API server accepted but no disk can hold (`1e30`) differs too: the node
    // holding the volume must see it to refuse it with a word.
    let request_unreadable = claim
        .spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .is_some_and(|q| parse_bytes(&q.0).is_err());
    bound && given.is_some() && (request_unreadable || matches!((requested, given), (Some(r), Some(g)) if r != g))
}

/// What a kept claim keeps: metadata only as far as the decisions read it (keys::trim_claim_metadata);
/// spec and status whole (the decisions read them: expansion reads the status conditions too,
/// and such claims are few).
pub fn trim_claim(claim: &mut PersistentVolumeClaim) {
    keys::trim_claim_metadata(&mut claim.metadata);
}

/// Whether this node keeps a PV without a node label: one of this provisioner's (made by the Go
/// build, or shared or every-node: the volume reconciler decides on those), or one still unbound
/// that names a claim (deciding::static_binding looks for such PVs before provisioning).
pub fn keep_unlabelled_volume(pv: &KeptVolume, me: &Identity) -> bool {
    let ours = pv.annotations.get(keys::PROVISIONED_BY).is_some_and(|p| me.serves(p))
        || pv.annotations.contains_key(keys::PROVISIONER_IDENTITY);
    let pre_bound = pv.spec.as_ref().is_some_and(|s| s.claim_ref.is_some())
        && pv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound");
    ours || pre_bound
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::PersistentVolumeClaimStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;
    use crate::test_fixtures::*;

    fn bound(request: &str, capacity: &str) -> PersistentVolumeClaim {
        let mut claim = claim("hpp")
            .on_node(NODE)
            .annotation(keys::BIND_COMPLETED, "yes")
            .spec(|s| {
                s.volume_name = Some("pvc-x".into());
                s.resources.get_or_insert_default().requests =
                    Some(BTreeMap::from([("storage".to_owned(), Quantity(request.into()))]));
            })
            .build();
        claim.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            capacity: Some(BTreeMap::from([("storage".to_owned(), Quantity(capacity.into()))])),
            ..Default::default()
        });
        claim
    }

    fn keep_claim(claim: &PersistentVolumeClaim, me: &Identity) -> bool {
        claim_retention(claim, me) == Retention::Keep
    }

    #[test]
    fn claims_a_node_may_act_on_are_kept() {
        for claim in [
            claim("hpp").selected(NODE).build(),
            claim("hpp").on_node(NODE).build(),
            claim("hpp").provisioner_annotations().build(),
        ] {
            assert!(keep_claim(&claim, &me()), "{:?}", claim.metadata.annotations);
        }
    }

    #[test]
    fn claims_placed_on_another_node_are_only_recorded() {
        for claim in [
            claim("hpp").selected(OTHER_NODE).provisioner_annotations().build(),
            claim("hpp").on_node(OTHER_NODE).build(),
        ] {
            match claim_retention(&claim, &me()) {
                Retention::Waiting(record) => assert_eq!(&*record.node, OTHER_NODE),
                other => panic!("{other:?}"),
            }
        }
        // Without a uid (never from the API server) there is nothing to record it by.
        let mut nameless = claim("hpp").on_node(OTHER_NODE).build();
        nameless.metadata.uid = None;
        assert_eq!(claim_retention(&nameless, &me()), Retention::Forget);
    }

    #[test]
    fn bound_and_foreign_claims_are_forgotten() {
        let bound_same_size = bound("1Gi", "1Gi");
        let other_class = claim("other").build();
        let mut other_provisioner = claim("other").build();
        other_provisioner
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::STORAGE_PROVISIONER.into(), "example.org/other".into());
        let mut deleting = claim("hpp").selected(NODE).build();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
        for claim in [bound_same_size, other_class, other_provisioner, deleting] {
            assert!(!keep_claim(&claim, &me()), "{:?}", claim.metadata);
        }
    }

    #[test]
    fn a_bound_claim_asking_for_another_size_is_kept_until_it_has_it() {
        assert!(keep_claim(&bound("2Gi", "1Gi"), &me()));
        assert!(size_change_pending(&bound("2Gi", "1Gi")));
        // 1Gi and 1024Mi are the same size.
        assert!(!keep_claim(&bound("1Gi", "1024Mi"), &me()));
        // Not bound yet: nothing to resize.
        let mut pending = bound("2Gi", "1Gi");
        pending.spec.as_mut().unwrap().volume_name = None;
        assert!(!size_change_pending(&pending));
    }

    #[test]
    fn a_clone_source_being_copied_is_kept_even_when_bound() {
        let mut source = bound("1Gi", "1Gi");
        source.metadata.finalizers = Some(vec![keys::CLONE_PROTECTION_FINALIZER.into()]);
        assert!(keep_claim(&source, &me()));
    }

    #[test]
    fn unlabelled_volumes_are_kept_when_ours_or_waiting_for_their_claim() {
        let mut ours = pv("/var/hpvolumes/pvc-x", "Bound").build();
        ours.spec.as_mut().unwrap().claim_ref =
            Some(crate::deciding::kept_volume::KeptClaimRef { name: Some("data".into()), ..Default::default() });
        assert!(keep_unlabelled_volume(&ours, &me()));
        let mut go_identity_only = ours.clone();
        go_identity_only.annotations.remove(keys::PROVISIONED_BY);
        assert!(keep_unlabelled_volume(&go_identity_only, &me()));
        let mut foreign = ours.clone();
        foreign.annotations = KeptMap::from([(keys::PROVISIONED_BY, "ebs.csi.aws.com")]);
        assert!(!keep_unlabelled_volume(&foreign, &me()), "another provisioner's bound PV");
        let mut waiting = foreign.clone();
        waiting.status.as_mut().unwrap().phase = Some("Available".into());
        assert!(keep_unlabelled_volume(&waiting, &me()), "unbound and naming a claim");
        waiting.spec.as_mut().unwrap().claim_ref = None;
        assert!(!keep_unlabelled_volume(&waiting, &me()), "unbound, naming no claim: the scheduler's to match");
    }

    #[test]
    fn trimming_keeps_what_the_decision_reads() {
        use crate::deciding::claim::decide_claim;
        let mut full = claim("hpp")
            .selected(NODE)
            .annotation("kubectl.kubernetes.io/last-applied-configuration", &"x".repeat(2048))
            .annotation("meta.helm.sh/release-name", "r")
            .build();
        full.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "db".to_owned())]));
        let mut trimmed = full.clone();
        trim_claim(&mut trimmed);
        let class = class("hpp", "WaitForFirstConsumer");
        assert_eq!(
            decide_claim(&trimmed, Some(&class), &me(), &config(), &[]),
            decide_claim(&full, Some(&class), &me(), &config(), &[])
        );
        assert_eq!(trimmed.spec, full.spec);
        assert!(trimmed.metadata.labels.is_none());
        assert!(!trimmed.metadata.annotations.unwrap().contains_key("meta.helm.sh/release-name"));
    }

    /// Everything the absent-node explanation (reconciling::stranded) reads of a claim placed on
    /// another node, from the whole claim.
    type Reads = (Interest, Option<String>, Option<String>, bool, (Option<String>, Option<String>, Option<String>));

    fn explanation_reads(claim: &PersistentVolumeClaim) -> Reads {
        use kube::Resource;
        let reference = claim.object_ref(&());
        (
            claim_interest(&claim.metadata, &me()),
            claim.metadata.uid.clone(),
            crate::deciding::class::claim_class_name(claim).map(str::to_owned),
            claim.spec.as_ref().and_then(|s| s.volume_name.clone()).is_none_or(|v| v.is_empty()),
            // The event: its name, namespace and the reference to the claim.
            (reference.namespace, reference.name, reference.uid),
        )
    }

    /// The same, from the record.
    fn recorded_reads(record: &WaitingClaim) -> Reads {
        (
            Interest::Elsewhere(record.node.to_string()),
            Some(record.uid.to_string()),
            record.class.as_deref().map(str::to_owned),
            record.unbound,
            (Some(record.namespace.to_string()), Some(record.name.to_string()), Some(record.uid.to_string())),
        )
    }

    fn record_of(claim: &PersistentVolumeClaim) -> WaitingClaim {
        match claim_retention(claim, &me()) {
            Retention::Waiting(record) => record,
            other => panic!("{other:?}"),
        }
    }

    fn placed_elsewhere(by_annotation: bool) -> PersistentVolumeClaim {
        let builder = claim("hpp").annotation("kubectl.kubernetes.io/last-applied-configuration", &"x".repeat(1024));
        let mut full = if by_annotation {
            builder.on_node(OTHER_NODE).build()
        } else {
            builder.selected(OTHER_NODE).provisioner_annotations().build()
        };
        full.metadata.labels = Some(BTreeMap::from([("app".to_owned(), "db".to_owned())]));
        full.metadata.resource_version = Some("4711".into());
        full.status = Some(PersistentVolumeClaimStatus { phase: Some("Pending".into()), ..Default::default() });
        full
    }

    #[test]
    fn the_record_of_a_claim_placed_elsewhere_holds_what_the_absent_node_explanation_reads() {
        let mut with_beta_class = placed_elsewhere(true);
        with_beta_class.metadata.annotations.as_mut().unwrap().insert(keys::STORAGE_CLASS_BETA.into(), "beta".into());
        let mut bound_meanwhile = placed_elsewhere(false);
        bound_meanwhile.spec.as_mut().unwrap().volume_name = Some("pvc-x".into());
        let mut clone_source = placed_elsewhere(true);
        clone_source.metadata.finalizers = Some(vec![keys::CLONE_PROTECTION_FINALIZER.into()]);
        for full in [placed_elsewhere(true), placed_elsewhere(false), with_beta_class, bound_meanwhile, clone_source] {
            assert_eq!(recorded_reads(&record_of(&full)), explanation_reads(&full));
        }
    }

    #[test]
    fn the_record_changes_with_each_field_the_explanation_reads() {
        // Guards the test above: each field the explanation reads, changed, changes the record.
        let full = placed_elsewhere(false);
        let changes: [fn(&mut PersistentVolumeClaim); 6] = [
            |c| c.metadata.uid = Some("another-uid".into()),
            |c| c.metadata.namespace = Some("elsewhere".into()),
            |c| c.metadata.name = Some("renamed".into()),
            |c| c.spec.as_mut().unwrap().storage_class_name = None,
            |c| c.spec.as_mut().unwrap().volume_name = Some("pvc-x".into()),
            |c| {
                c.metadata.annotations.as_mut().unwrap().insert(keys::SELECTED_NODE.into(), "third-node".into());
            },
        ];
        for (i, change) in changes.iter().enumerate() {
            let mut changed = full.clone();
            change(&mut changed);
            assert_ne!(record_of(&changed), record_of(&full), "field {i}");
            assert_eq!(recorded_reads(&record_of(&changed)), explanation_reads(&changed), "field {i}");
        }
    }

    #[test]
    fn claims_this_node_may_act_on_keep_spec_and_status_whole() {
        for mut full in [bound("2Gi", "1Gi"), claim("hpp").selected(NODE).build(), claim("hpp").on_node(NODE).build()] {
            full.status.get_or_insert_default().phase = Some("Pending".into());
            let mut trimmed = full.clone();
            trim_claim(&mut trimmed);
            assert_eq!((&trimmed.spec, &trimmed.status), (&full.spec, &full.status));
        }
    }
}

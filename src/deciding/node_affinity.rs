//! A node-affinity key other than the hostname (`nodeAffinityKey`, docs/volumes.md): a class
//! pins its volumes to the nodes carrying a label's value (a data disk's serial, a rack slot)
//! instead of to one node name, so a node reinstalled under a new name, with the label and the
//! disk, keeps its volumes: its pods schedule there, and its provisioner reclaims, grows and
//! clones them as its own.
//!
//! Which keys a node serves is its own setting (`NODE_AFFINITY_KEYS`), read with the Node's
//! values at start: the node then also watches the PVs labelled with a token of each of its
//! key=value pairs (a label value holding `_`, which no node name holds, so a token never names a
//! node). Pure functions.

use sha2::{Digest, Sha256};

use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout;
use crate::keys;

pub mod duplicate;

/// StorageClass parameter.
pub const PARAMETER: &str = "nodeAffinityKey";

/// PV annotation: `<key>=<value>`, the label the volume is pinned to.
pub const ANNOTATION: &str = "hostpath-provisioner.kubevirt.io/node-affinity";

/// A label a node carries, which volumes can be pinned to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AffinityLabel {
    /// The label key.
    pub key: String,
    /// This node's value.
    pub value: String,
}

impl AffinityLabel {
    /// `key=value`, as the PV annotation holds it.
    pub fn annotation(&self) -> String {
        format!("{}={}", self.key, self.value)
    }

    /// The value of the node label the PVs pinned to this label carry (so that every node with
    /// the label watches them): `key_` and 32 hex digits of its hash. `_` is in no node name, so
    /// no token equals [`layout::node_label_value`] of any node.
    pub fn token(&self) -> String {
        let digest = Sha256::digest(self.annotation().as_bytes());
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("key_{hex}")
    }

    /// Reads a PV's annotation back.
    pub fn parse(annotation: &str) -> Option<AffinityLabel> {
        let (key, value) = annotation.split_once('=')?;
        (is_label_key(key) && is_label_value(value))
            .then(|| AffinityLabel { key: key.to_owned(), value: value.to_owned() })
    }
}

/// A label key as Kubernetes accepts it: an optional DNS-subdomain prefix and `/`, then a name of
/// at most 63 letters, digits, `-`, `_`, `.`, starting and ending alphanumeric.
pub fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    prefix.is_none_or(layout::is_dns_subdomain) && is_label_value(name) && !name.is_empty()
}

/// A label value: empty, or at most 63 letters, digits, `-`, `_`, `.`, alphanumeric at both ends.
pub fn is_label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && value.as_bytes()[0].is_ascii_alphanumeric()
            && value.as_bytes()[value.len() - 1].is_ascii_alphanumeric())
}

/// The labels this node serves: each key of `NODE_AFFINITY_KEYS` the Node carries with a
/// non-empty value.
pub fn served_labels<'a>(
    keys: &[String],
    node_labels: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Vec<AffinityLabel> {
    let mut served: Vec<AffinityLabel> = node_labels
        .into_iter()
        .filter(|(key, value)| keys.contains(key) && !value.is_empty())
        .map(|(key, value)| AffinityLabel { key: key.clone(), value: value.clone() })
        .collect();
    served.sort();
    served
}

/// The label selector of this node's own PVs: those of its name, and those pinned to a label it
/// carries.
pub fn own_volumes_selector(node: &str, served: &[AffinityLabel]) -> String {
    let own = layout::node_label_value(node);
    if served.is_empty() {
        return format!("{}={own}", keys::NODE_LABEL);
    }
    let values: Vec<String> = std::iter::once(own).chain(served.iter().map(AffinityLabel::token)).collect();
    format!("{} in ({})", keys::NODE_LABEL, values.join(","))
}

/// The label a PV is pinned to, when a class with `nodeAffinityKey` made it.
pub fn pinned_label(pv: &KeptVolume) -> Option<AffinityLabel> {
    pv.annotations.get(ANNOTATION).and_then(AffinityLabel::parse)
}

/// Whether this node, carrying `mine` (its served labels, `Identity::affinity`), holds a PV
/// pinned to a label: it carries that label with that value, and serves its key. `None` for a
/// PV pinned to a node name.
pub fn holds(pv: &KeptVolume, mine: &[AffinityLabel]) -> Option<bool> {
    pinned_label(pv).map(|label| mine.contains(&label))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deciding::identity::Identity;
    use crate::test_fixtures::{me, pv};

    fn label(key: &str, value: &str) -> AffinityLabel {
        AffinityLabel { key: key.into(), value: value.into() }
    }

    #[test]
    fn label_keys_and_values_are_checked_as_kubernetes_does() {
        for key in ["disk", "example.com/disk-serial", "a.b/c_d.e", "topology.kubernetes.io/zone"] {
            assert!(is_label_key(key), "{key}");
        }
        for key in ["", "/disk", "Example.com/disk", "a/b/c", "-disk", "disk-", &"d".repeat(64), "a b"] {
            assert!(!is_label_key(key), "{key:?}");
        }
        assert!(is_label_value("") && is_label_value("SN-123_x.y"));
        assert!(!is_label_value("-x") && !is_label_value(&"v".repeat(64)) && !is_label_value("a=b"));
    }

    #[test]
    fn a_token_is_stable_per_label_and_never_a_node_name() {
        let disk = label("example.com/disk", "sn-1");
        assert_eq!(disk.token(), label("example.com/disk", "sn-1").token());
        assert_ne!(disk.token(), label("example.com/disk", "sn-2").token());
        assert_ne!(disk.token(), label("example.com/disk2", "sn-1").token());
        assert!(is_label_value(&disk.token()) && disk.token().len() <= 63);
        assert!(!layout::is_dns_subdomain(&disk.token()), "no node can be named like a token");
        assert_eq!(AffinityLabel::parse(&disk.annotation()), Some(disk));
        assert_eq!(AffinityLabel::parse("no-equals"), None);
        assert_eq!(AffinityLabel::parse("bad key=v"), None);
    }

    #[test]
    fn a_node_serves_the_configured_keys_it_carries_and_watches_their_volumes() {
        let keys = vec!["example.com/disk".to_owned(), "example.com/rack".to_owned()];
        let node_labels = std::collections::BTreeMap::from([
            ("example.com/disk".to_owned(), "sn-1".to_owned()),
            ("example.com/rack".to_owned(), String::new()),
            ("other".to_owned(), "x".to_owned()),
        ]);
        let served = served_labels(&keys, &node_labels);
        assert_eq!(served, vec![label("example.com/disk", "sn-1")]);
        assert_eq!(own_volumes_selector("node-a", &[]), format!("{}=node-a", keys::NODE_LABEL));
        assert_eq!(
            own_volumes_selector("node-a", &served),
            format!("{} in (node-a,{})", keys::NODE_LABEL, served[0].token())
        );
    }

    fn disk_class(binding: &str) -> k8s_openapi::api::storage::v1::StorageClass {
        let mut class = crate::test_fixtures::class("hpp", binding);
        class.parameters = Some([(PARAMETER.to_owned(), "example.com/disk".to_owned())].into());
        class
    }

    fn serving(keys: &[&str]) -> crate::deciding::settings::DecisionConfig {
        crate::deciding::settings::DecisionConfig {
            affinity_keys: keys.iter().map(|k| (*k).to_owned()).collect(),
            ..crate::test_fixtures::config()
        }
    }

    fn with_disk(value: &str) -> Identity {
        Identity { affinity: vec![label("example.com/disk", value)], ..me() }
    }

    #[test]
    fn a_class_pins_volumes_to_this_nodes_value_or_says_what_is_missing() {
        use crate::deciding::claim::{Decision, decide_claim};
        use crate::deciding::refusal::Refusal;
        use crate::test_fixtures::{NODE, claim};
        let pinned = claim("hpp").on_node(NODE).build();
        let immediate = disk_class("Immediate");
        match decide_claim(&pinned, Some(&immediate), &with_disk("sn-1"), &crate::test_fixtures::config(), &[]) {
            Decision::Refuse(refusal @ Refusal::AffinityKeyNotServed { .. }) => {
                assert!(refusal.to_string().contains("add example.com/disk to the provisioner's NODE_AFFINITY_KEYS"));
            }
            other => panic!("{other:?}"),
        }
        let config = serving(&["example.com/disk"]);
        match decide_claim(&pinned, Some(&immediate), &me(), &config, &[]) {
            Decision::Refuse(refusal @ Refusal::NoAffinityLabel { .. }) => {
                assert!(refusal.to_string().contains("has no label example.com/disk"), "{refusal}");
            }
            other => panic!("{other:?}"),
        }
        // Placed by the scheduler: another node may carry the label.
        let scheduled = claim("hpp").selected(NODE).build();
        assert!(matches!(
            decide_claim(&scheduled, Some(&disk_class("WaitForFirstConsumer")), &me(), &config, &[]),
            Decision::HandBack(Refusal::NoAffinityLabel { .. })
        ));
        let Decision::Provision(plan) = decide_claim(&pinned, Some(&immediate), &with_disk("sn-1"), &config, &[])
        else {
            panic!("not provisioned");
        };
        assert_eq!(plan.affinity, Some(label("example.com/disk", "sn-1")));
        // Written into the PV: affinity on the label, the label's token, the annotation.
        let node = crate::deciding::volume_spec::NodeFacts { name: NODE.into(), hostname: "node-a.example.com".into() };
        let pv = crate::deciding::volume_spec::build_pv(
            &plan,
            &pinned,
            &node,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("1Gi".into()),
        );
        let term =
            &pv.spec.as_ref().unwrap().node_affinity.as_ref().unwrap().required.as_ref().unwrap().node_selector_terms
                [0];
        let expression = &term.match_expressions.as_ref().unwrap()[0];
        assert_eq!((expression.key.as_str(), expression.operator.as_str()), ("example.com/disk", "In"));
        assert_eq!(expression.values.as_deref(), Some(&["sn-1".to_owned()][..]));
        let labels = pv.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[keys::NODE_LABEL], label("example.com/disk", "sn-1").token());
        let annotations = pv.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[ANNOTATION], "example.com/disk=sn-1");
        assert_eq!(annotations[keys::PROVISION_ON_NODE], NODE, "the node that made it stays named");
        // Classes of other shapes refuse the key.
        let mut shared = disk_class("Immediate");
        shared.parameters.as_mut().unwrap().insert("topology".into(), "shared".into());
        let refusal = crate::deciding::class::class_request(&shared, "hpp", &config).unwrap_err();
        assert!(refusal.to_string().contains("no nodeAffinityKey for topology shared"), "{refusal}");
    }

    #[test]
    fn a_pinned_volume_is_reclaimed_by_whichever_node_carries_the_label_and_never_reaped() {
        use crate::deciding::volume::{VolumeDecision, decide_volume};
        let mut released = pv("/var/hpvolumes/pvc-0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182", "Released")
            .owner_annotation("old-node")
            .hostname_affinity("old-node")
            .build();
        released.annotations.insert(ANNOTATION, "example.com/disk=sn-1");
        let pools = crate::test_fixtures::config().pools;
        let renamed = Identity { node: "new-node".into(), ..with_disk("sn-1") };
        assert!(matches!(decide_volume(&released, &renamed, "new-node", &pools, &[]), VolumeDecision::Delete(_)));
        // The node of the old name, without the label (another disk now), leaves it alone.
        let old = Identity { node: "old-node".into(), ..with_disk("sn-2") };
        assert!(matches!(decide_volume(&released, &old, "old-node", &pools, &[]), VolumeDecision::Ignore(_)));
        assert!(crate::deciding::volume::is_mine(&released, &renamed, "new-node"));
        assert!(!crate::deciding::volume::is_mine(&released, &old, "old-node"));
        // The reaper never takes it for its old node's, gone or not.
        use crate::deciding::reaping::{Graces, owners_to_check};
        let on =
            Graces { reap: Some(std::time::Duration::from_secs(1)), release: Some(std::time::Duration::from_secs(1)) };
        let provisioner = crate::test_fixtures::PROVISIONER;
        let mut plain = released.clone();
        plain.annotations = [(keys::PROVISION_ON_NODE, "old-node"), (keys::PROVISIONED_BY, provisioner)].into();
        released.annotations.insert(keys::PROVISIONED_BY, provisioner);
        released.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Delete".into());
        plain.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Delete".into());
        assert_eq!(owners_to_check(std::slice::from_ref(&plain), &[provisioner], on).len(), 1, "the control case");
        assert!(owners_to_check(std::slice::from_ref(&released), &[provisioner], on).is_empty());
    }

    #[test]
    fn a_pv_pinned_to_a_label_is_held_by_the_nodes_carrying_it() {
        let mut pinned = pv("/var/hpvolumes/pvc-x", "Released").owner_annotation("old-node").build();
        pinned.annotations = [(ANNOTATION, "example.com/disk=sn-1")].into();
        let mut with_disk = me();
        with_disk.affinity = vec![label("example.com/disk", "sn-1")];
        assert_eq!(holds(&pinned, &with_disk.affinity), Some(true));
        assert_eq!(holds(&pinned, &me().affinity), Some(false));
        let mut other_disk = me();
        other_disk.affinity = vec![label("example.com/disk", "sn-2")];
        assert_eq!(holds(&pinned, &other_disk.affinity), Some(false));
        let by_name = pv("/var/hpvolumes/pvc-x", "Released").owner_annotation("old-node").build();
        assert_eq!(holds(&by_name, &with_disk.affinity), None);
    }
}

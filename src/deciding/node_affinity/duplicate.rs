//! A label-pinned volume whose directory a node does not find, when other nodes may carry the
//! same value (docs/volumes.md, "Pinned to a node label").
//!
//! Every node carrying the value treats the volume as its own, and a kubelet may set any label
//! outside `node-restriction.kubernetes.io/` on its own Node: a copied label, or a compromised
//! node, makes a second holder. Such a node finds no directory at the volume's place on its own
//! disk, which the deletion protocol alone reads as "already deleted" and lets the PV go,
//! stranding the real holder's data. So a node that finds no directory lets the PV go only when no
//! other live node carries the value: any of those could be the one with the disk. Pure; the
//! exhaustive check over which nodes carry, are live and hold the directory is below.

/// What a node of a label-pinned PV that found no directory at its place does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WhenPinnedMissing {
    /// No other live node carries the value: the directory is gone (the deletion protocol's
    /// own checks of staged and restored directories go on).
    NoOtherHolder,
    /// Other live nodes carry the value, any of which may hold the directory: let nothing go,
    /// report them (two live nodes with one value is a labelling fault), and look again.
    Wait {
        /// The other live nodes carrying the value, sorted.
        others: Vec<String>,
    },
}

/// Decides for node `me`, given the live nodes whose Node carries the PV's pinned value
/// (`me` may be among them).
pub fn when_pinned_missing<'a>(me: &str, live_carriers: impl IntoIterator<Item = &'a str>) -> WhenPinnedMissing {
    let mut others: Vec<String> = live_carriers.into_iter().filter(|n| *n != me).map(str::to_owned).collect();
    others.sort_unstable();
    others.dedup();
    if others.is_empty() { WhenPinnedMissing::NoOtherHolder } else { WhenPinnedMissing::Wait { others } }
}

/// The Warning note on the PV when other live nodes carry its value.
pub fn duplicate_note(me: &str, annotation: &str, others: &[String]) -> String {
    format!(
        "node {me} carries {annotation} but holds no directory for this volume, and live node(s) {} carry it too: \
         the PV is kept until only one live node carries the value (the one with the data deletes it). \
         Two nodes with one value both draw the volume's pods: give each disk its own value, and use a key under \
         node-restriction.kubernetes.io/ that a kubelet cannot set on itself",
        others.join(", ")
    )
}

/// One of this node's own labels that other live nodes carry too.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedLabel {
    /// The label (`key=value`), as this node carries it.
    pub label: super::AffinityLabel,
    /// The other live nodes carrying it, sorted.
    pub others: Vec<String>,
}

/// The labels of `mine` (this node's, of the served keys) that other live nodes carry, checked
/// at start and periodically, not only when a volume is reclaimed: two live nodes with one value
/// both draw the pinned volumes' pods, and on reclaim the one without the directory must keep the
/// PV. `live` holds each live node with its Node's labels (`me` may be among them; a node listed
/// twice counts once). Sorted by label.
pub fn shared_labels<'a>(
    me: &str,
    mine: &[super::AffinityLabel],
    live: impl IntoIterator<Item = (&'a str, &'a std::collections::BTreeMap<String, String>)> + Clone,
) -> Vec<SharedLabel> {
    let mut shared: Vec<SharedLabel> = mine
        .iter()
        .filter(|label| !label.value.is_empty())
        .filter_map(|label| {
            let carriers = live
                .clone()
                .into_iter()
                .filter(|(_, labels)| labels.get(&label.key) == Some(&label.value))
                .map(|(node, _)| node);
            match when_pinned_missing(me, carriers) {
                WhenPinnedMissing::NoOtherHolder => None,
                WhenPinnedMissing::Wait { others } => Some(SharedLabel { label: label.clone(), others }),
            }
        })
        .collect();
    shared.sort_by(|a, b| a.label.cmp(&b.label));
    shared
}

/// The Warning note on this node's Node when others carry one of its labels.
pub fn shared_label_note(me: &str, shared: &SharedLabel) -> String {
    format!(
        "node {me} carries {} and so do live node(s) {}: each takes the volumes pinned to that value as its own and \
         draws their pods, though only one holds the disk (on reclaim, the others keep the PV). Give each disk its own \
         value, remove the label from the nodes without that disk, and use a key under node-restriction.kubernetes.io/ \
         that a kubelet cannot set on itself",
        shared.label.annotation(),
        shared.others.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn a_value_of_this_node_that_another_live_node_carries_is_reported_with_those_nodes() {
        use super::super::AffinityLabel;
        let disk = AffinityLabel { key: "example.com/disk".into(), value: "sn-1".into() };
        let rack = AffinityLabel { key: "example.com/rack".into(), value: "r7".into() };
        let mine = [disk.clone(), rack.clone()];
        let a = labels(&[("example.com/disk", "sn-1"), ("example.com/rack", "r7")]);
        let b = labels(&[("example.com/disk", "sn-1"), ("example.com/rack", "r8")]);
        let c = labels(&[("example.com/disk", "sn-2"), ("example.com/rack", "r7"), ("other", "sn-1")]);
        let d = labels(&[("example.com/disk", "sn-1")]);
        // Alone, or only unlike values and other keys: nothing.
        assert_eq!(shared_labels("a", &mine, [("a", &a)]), []);
        assert_eq!(shared_labels("a", std::slice::from_ref(&disk), [("a", &a), ("c", &c)]), []);
        // The disk value on b and d, the rack value on c; a listed twice and itself never counted.
        let shared = shared_labels("a", &mine, [("d", &d), ("a", &a), ("b", &b), ("c", &c), ("a", &a), ("b", &b)]);
        assert_eq!(
            shared,
            [
                SharedLabel { label: disk, others: vec!["b".into(), "d".into()] },
                SharedLabel { label: rack, others: vec!["c".into()] },
            ]
        );
        let note = shared_label_note("a", &shared[0]);
        assert!(note.contains("example.com/disk=sn-1") && note.contains("live node(s) b, d"), "{note}");
        // A node serving no label never reports.
        assert_eq!(shared_labels("a", &[], [("a", &a), ("b", &b)]), []);
    }

    #[test]
    fn a_node_without_the_directory_waits_while_another_live_node_carries_the_value() {
        assert_eq!(when_pinned_missing("a", []), WhenPinnedMissing::NoOtherHolder);
        assert_eq!(when_pinned_missing("a", ["a"]), WhenPinnedMissing::NoOtherHolder);
        assert_eq!(
            when_pinned_missing("a", ["c", "a", "b", "c"]),
            WhenPinnedMissing::Wait { others: vec!["b".into(), "c".into()] }
        );
        let note = duplicate_note("a", "example.com/disk=sn-1", &["b".into()]);
        assert!(note.contains("live node(s) b carry it too") && note.contains("node-restriction.kubernetes.io/"));
    }

    /// One node, as the model sees it.
    #[derive(Clone, Copy, Debug)]
    struct Node {
        /// Its Node carries the PV's value (so its provisioner takes the PV as its own).
        carries: bool,
        /// Its provisioner runs (and every other node sees it so).
        live: bool,
        /// The volume's directory is on its disk.
        holds: bool,
    }

    /// How one ordering of the acting nodes ends.
    #[derive(Debug, Default)]
    struct Outcome {
        /// The PV was let go.
        pv_gone: bool,
        /// Let go by a node that held no directory.
        let_go_by_non_holder: bool,
        /// The nodes that removed data, in order.
        deleted_by: Vec<usize>,
        /// Some node reported other live carriers.
        reported: bool,
    }

    /// Runs the acting nodes (live carriers) in `order`, each as the volume reconciler does once
    /// the PV is Released: a node with the directory stages it and lets the PV go (a node coming
    /// after that finds the PV gone: a 404 commits its own copy, so it removes only its own data);
    /// a node without asks [`when_pinned_missing`].
    fn run(nodes: &[Node], order: &[usize]) -> Outcome {
        let live_carriers: Vec<String> =
            nodes.iter().enumerate().filter(|(_, n)| n.carries && n.live).map(|(i, _)| i.to_string()).collect();
        let mut outcome = Outcome::default();
        for &i in order {
            if nodes[i].holds {
                // Its own copy goes whether it or another node let the PV go first.
                outcome.deleted_by.push(i);
                outcome.pv_gone = true;
                continue;
            }
            if outcome.pv_gone {
                continue;
            }
            match when_pinned_missing(&i.to_string(), live_carriers.iter().map(String::as_str)) {
                WhenPinnedMissing::NoOtherHolder => {
                    outcome.pv_gone = true;
                    outcome.let_go_by_non_holder = true;
                }
                WhenPinnedMissing::Wait { .. } => outcome.reported = true,
            }
        }
        outcome
    }

    fn permutations(items: &[usize]) -> Vec<Vec<usize>> {
        if items.len() <= 1 {
            return vec![items.to_vec()];
        }
        let mut all = Vec::new();
        for (k, &first) in items.iter().enumerate() {
            let mut rest = items.to_vec();
            rest.remove(k);
            for mut tail in permutations(&rest) {
                tail.insert(0, first);
                all.push(tail);
            }
        }
        all
    }

    #[test]
    fn a_pinned_pv_is_let_go_only_when_no_live_carrier_could_hold_it_over_every_labelling_and_order() {
        const NODES: usize = 3;
        let mut cases = 0;
        for bits in 0u32..(1 << (3 * NODES)) {
            let nodes: Vec<Node> = (0..NODES)
                .map(|i| Node {
                    carries: bits >> (3 * i) & 1 == 1,
                    live: bits >> (3 * i + 1) & 1 == 1,
                    holds: bits >> (3 * i + 2) & 1 == 1,
                })
                .collect();
            // Only a live node carrying the value acts on the PV.
            let actors: Vec<usize> = (0..NODES).filter(|&i| nodes[i].carries && nodes[i].live).collect();
            let live_carriers = actors.len();
            let live_holders: Vec<usize> = actors.iter().copied().filter(|&i| nodes[i].holds).collect();
            for order in permutations(&actors) {
                cases += 1;
                let outcome = run(&nodes, &order);
                let case = format!("{nodes:?} in order {order:?}: {outcome:?}");
                if !live_holders.is_empty() {
                    // The data of a live holder is never stranded by a node without it: the PV
                    // goes with that holder's deletion, and each holder removes only its own.
                    assert!(!outcome.let_go_by_non_holder, "{case}");
                    assert!(outcome.pv_gone, "{case}");
                    let mut deleted = outcome.deleted_by.clone();
                    deleted.sort_unstable();
                    assert_eq!(deleted, live_holders, "{case}");
                } else if live_carriers == 1 {
                    // The only live carrier has no directory: gone (by hand, or with a dead
                    // node's disk), and nobody else could hold it.
                    assert!(outcome.pv_gone && outcome.deleted_by.is_empty(), "{case}");
                } else if live_carriers > 1 {
                    // Several live carriers, none with the directory: kept, and reported.
                    assert!(!outcome.pv_gone && outcome.reported, "{case}");
                } else {
                    assert!(!outcome.pv_gone, "nobody acts: {case}");
                }
                if live_holders.len() == 1 {
                    assert_eq!(outcome.deleted_by.len(), 1, "exactly one node removes the data: {case}");
                }
                if live_carriers > 1 && live_holders.len() < live_carriers {
                    // A carrier without the directory acted: it saw the others and said so
                    // unless the PV was already gone by a holder before its turn.
                    let first_non_holder = order.iter().position(|&i| !nodes[i].holds);
                    let first_holder = order.iter().position(|&i| nodes[i].holds);
                    if first_non_holder < first_holder || first_holder.is_none() {
                        assert!(outcome.reported, "{case}");
                    }
                }
            }
        }
        assert_eq!(cases, 624, "every labelling of three nodes, every order of the acting ones");
    }
}

//! The rollout's mixed window, enumerated: nodes of the earlier release and of this one act on
//! the same PV at once, in every order.
//!
//! What differs in the decisions between the pinned earlier commit (0b9952b) and this one, read
//! from `git diff 0b9952b -- src/deciding src/reconciling`: the deletion protocol
//! (`deciding::deletion`), the choice of the acting node for shared and every-node volumes
//! (`deciding::claim`, `deciding::liveness`, `deciding::topology`) and the PV annotations are
//! unchanged, so an old and a new node decide those alike and the existing models cover them
//! (`deciding::deletion::model`, `deciding::liveness::mixed_model` for the earlier move from Lease
//! renewals to readiness). Changed: a node of a `nodeAffinityKey` PV that finds no directory at
//! its place used to let the PV go at once; now it waits while another live node carries the
//! label ([`when_pinned_missing`]). Pattern directories (owner records) are node-local, so an
//! old and a new node never act on one; snapshot copies are swept only by their own node, from
//! a list of snapshot UIDs read after its disk, which no version changes.
//!
//! So the model here: three nodes, each carrying the pinned label or not, live or not, holding
//! the directory or not, and on either release; the live carriers act on the Released PV in
//! every order. Whatever the mix, no node removes data it does not hold, each live holder removes
//! its own copy at most once, and the PV is let go by a node without the data only when a node of
//! the earlier release acted before every holder: the earlier rule, which the upgrade finishes.

use hostpath_provisioner::deciding::node_affinity::duplicate::{WhenPinnedMissing, when_pinned_missing};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Release {
    /// The pinned earlier commit: no directory means the volume is gone.
    Earlier,
    /// This one.
    Current,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    carries: bool,
    live: bool,
    holds: bool,
    release: Release,
}

#[derive(Debug, Default)]
struct Outcome {
    pv_gone: bool,
    /// The node without the data that let the PV go, if one did.
    let_go_by_non_holder: Option<usize>,
    /// The nodes that removed data, in order (each its own copy).
    deleted_by: Vec<usize>,
}

/// The earlier release's decision for a node that finds no directory.
fn earlier_when_pinned_missing() -> WhenPinnedMissing {
    WhenPinnedMissing::NoOtherHolder
}

/// The acting nodes in `order`, each as its release's volume reconciler does with the Released
/// PV: a holder stages its directory and lets the PV go (after another let it go, the 404
/// commits its own copy: it removes only its own data); a node without asks its release.
fn run(nodes: &[Node], order: &[usize]) -> Outcome {
    let live_carriers: Vec<String> =
        nodes.iter().enumerate().filter(|(_, n)| n.carries && n.live).map(|(i, _)| i.to_string()).collect();
    let mut outcome = Outcome::default();
    for &i in order {
        if nodes[i].holds {
            outcome.deleted_by.push(i);
            outcome.pv_gone = true;
            continue;
        }
        if outcome.pv_gone {
            continue;
        }
        let decision = match nodes[i].release {
            Release::Earlier => earlier_when_pinned_missing(),
            Release::Current => when_pinned_missing(&i.to_string(), live_carriers.iter().map(String::as_str)),
        };
        if decision == WhenPinnedMissing::NoOtherHolder {
            outcome.pv_gone = true;
            outcome.let_go_by_non_holder = Some(i);
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
fn a_pinned_pv_in_the_mixed_window_never_loses_a_holders_data_and_is_stranded_only_by_the_earlier_rule() {
    const NODES: usize = 3;
    let (mut cases, mut mixed_cases, mut stranded_in_mixed) = (0, 0, 0);
    for bits in 0u32..(1 << (4 * NODES)) {
        let nodes: Vec<Node> = (0..NODES)
            .map(|i| Node {
                carries: bits >> (4 * i) & 1 == 1,
                live: bits >> (4 * i + 1) & 1 == 1,
                holds: bits >> (4 * i + 2) & 1 == 1,
                release: if bits >> (4 * i + 3) & 1 == 1 { Release::Current } else { Release::Earlier },
            })
            .collect();
        let actors: Vec<usize> = (0..NODES).filter(|&i| nodes[i].carries && nodes[i].live).collect();
        let live_holders: Vec<usize> = actors.iter().copied().filter(|&i| nodes[i].holds).collect();
        let mixed = actors.iter().any(|&i| nodes[i].release == Release::Earlier)
            && actors.iter().any(|&i| nodes[i].release == Release::Current);
        for order in permutations(&actors) {
            cases += 1;
            mixed_cases += usize::from(mixed);
            let outcome = run(&nodes, &order);
            let case = format!("{nodes:?} in order {order:?}: {outcome:?}");
            // Nobody's data is removed by another node: only holders remove, each its own once.
            let mut deleted = outcome.deleted_by.clone();
            deleted.sort_unstable();
            deleted.dedup();
            assert_eq!(deleted.len(), outcome.deleted_by.len(), "a copy removed twice: {case}");
            assert!(outcome.deleted_by.iter().all(|&i| nodes[i].holds), "{case}");
            assert_eq!(deleted, live_holders, "every live holder removes its own copy: {case}");
            if let Some(by) = outcome.let_go_by_non_holder
                && !live_holders.is_empty()
            {
                // A holder's PV let go by a node without the data: only by the earlier rule, and
                // only when that node came before every holder.
                assert_eq!(nodes[by].release, Release::Earlier, "the current rule stranded it: {case}");
                let first_holder = order.iter().position(|&i| nodes[i].holds).expect("a holder acts");
                assert!(order.iter().position(|&i| i == by).expect("acted") < first_holder, "{case}");
                stranded_in_mixed += usize::from(mixed);
            }
            if actors.iter().all(|&i| nodes[i].release == Release::Current) && !live_holders.is_empty() {
                assert_eq!(outcome.let_go_by_non_holder, None, "after the rollout: {case}");
            }
        }
    }
    assert_eq!(cases, 4992, "every labelling and mix of three nodes, every order of the acting ones");
    assert!(mixed_cases > 0 && stranded_in_mixed > 0, "the mixed window is reached and its earlier rule shown");
}

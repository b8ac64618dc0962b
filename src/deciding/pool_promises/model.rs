//! An exhaustive model of requests accounting on a `shared` pool that two or three nodes
//! provision in at once: every interleaving of their steps, watch lag (each node's cache learns
//! of each PV at any later point), a create that fails and, for the record protocol, a node that
//! dies between its promise and its create. Two protocols, each made of the real decisions:
//!
//! - per node (today's): each node plans its claims against its watch cache and its own ledger
//!   ([`crate::deciding::reservations::Reservations`], checked by [`PoolRoom::room`]);
//! - the record ([`super`]): read the record, list the PVs, check against [`super::promised`]
//!   and write [`super::with_promise`] on condition of the version read, create,
//!   [`super::settle`].
//!
//! The model must find the over-promise in the first, and finds none in the second; in the
//! second, runs without failures or deaths give as many volumes as fit (it does not get safety
//! by refusing).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Instant;

use super::*;
use crate::deciding::capacity::PoolRoom;
use crate::deciding::reservations::Reservations;

const GIB: u64 = 1 << 30;
/// Each claim asks 4 GiB of a pool with room for 10 GiB: two fit, a third does not.
const REQUEST: u64 = 4 * GIB;
const ROOM: u64 = 10 * GIB;
const FIT: usize = (ROOM / REQUEST) as usize;

fn pv(claim: usize) -> String {
    format!("pvc-{claim}")
}

/// Where a claim is in its node's work.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Pc {
    Start,
    /// Record protocol: read the record (version and content).
    ReadRecord {
        version: u32,
        record: PoolPromises,
    },
    /// Record protocol: also listed the PVs.
    Listed {
        version: u32,
        record: PoolPromises,
        listed: BTreeSet<usize>,
    },
    /// Promised (record) or reserved (ledger); the create is next.
    Promised,
    /// The create returned (made or failed); the record protocol settles next.
    Returned,
    Refused,
    Done,
    /// Died after its promise, before its create (record protocol).
    Dead,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct World {
    claims: Vec<Pc>,
    /// PVs that exist, by claim.
    pvs: BTreeSet<usize>,
    /// Per node: the PVs its watch cache shows, and the volumes its ledger holds.
    caches: Vec<BTreeSet<usize>>,
    ledgers: Vec<BTreeSet<usize>>,
    /// The shared record and its version (resourceVersion).
    record: PoolPromises,
    version: u32,
    /// Seconds since the start, for promise expiry.
    now: u64,
    failures: u8,
    deaths: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Protocol {
    PerNode,
    Record,
    /// The record written without the version condition (to show the condition matters).
    RecordUnconditional,
}

impl Protocol {
    fn uses_record(self) -> bool {
        self != Protocol::PerNode
    }
}

struct Model {
    protocol: Protocol,
    /// The node acting for each claim.
    node_of: Vec<usize>,
    nodes: usize,
    max_failures: u8,
    max_deaths: u8,
}

/// What the exploration found.
#[derive(Debug, Default)]
struct Found {
    states: usize,
    /// The first state with more promised to existing volumes than the pool holds.
    over_promise: Option<String>,
    /// Terminal states without failures or deaths that made fewer volumes than fit.
    short_runs: usize,
    terminal: usize,
}

impl Model {
    fn initial(&self) -> World {
        World {
            claims: vec![Pc::Start; self.node_of.len()],
            pvs: BTreeSet::new(),
            caches: vec![BTreeSet::new(); self.nodes],
            ledgers: vec![BTreeSet::new(); self.nodes],
            record: PoolPromises::default(),
            version: 0,
            now: 0,
            failures: 0,
            deaths: 0,
        }
    }

    fn explore(&self) -> Found {
        let mut found = Found::default();
        let mut seen = HashSet::new();
        let mut stack = vec![self.initial()];
        while let Some(world) = stack.pop() {
            if !seen.insert(world.clone()) {
                continue;
            }
            found.states += 1;
            if world.pvs.len() as u64 * REQUEST > ROOM && found.over_promise.is_none() {
                found.over_promise = Some(format!("{world:?}"));
            }
            let next = self.successors(&world);
            if next.is_empty() {
                found.terminal += 1;
                if world.failures == 0 && world.deaths == 0 && world.pvs.len() < FIT.min(world.claims.len()) {
                    found.short_runs += 1;
                }
            }
            stack.extend(next);
        }
        found
    }

    fn successors(&self, world: &World) -> Vec<World> {
        let mut out = Vec::new();
        for claim in 0..world.claims.len() {
            out.extend(self.claim_steps(world, claim));
        }
        // Watch lag: any node's cache may learn of any existing PV at any point.
        if self.protocol == Protocol::PerNode {
            for node in 0..self.nodes {
                for &made in world.pvs.difference(&world.caches[node]) {
                    let mut w = world.clone();
                    w.caches[node].insert(made);
                    out.push(w);
                }
            }
        }
        // Time passes beyond the TTL, on the protocol's assumption that a live node's create
        // returns well within it: only while every unsettled promise is a dead node's.
        let dead_only = world
            .record
            .by_pv
            .keys()
            .all(|name| (0..world.claims.len()).any(|c| pv(c) == *name && world.claims[c] == Pc::Dead));
        if self.protocol.uses_record() && !world.record.by_pv.is_empty() && dead_only && world.now == 0 {
            let mut w = world.clone();
            w.now = PROMISE_TTL_SECS;
            out.push(w);
        }
        out
    }

    fn claim_steps(&self, world: &World, claim: usize) -> Vec<World> {
        let node = self.node_of[claim];
        let name = pv(claim);
        let with = |pc: Pc| {
            let mut w = world.clone();
            w.claims[claim] = pc;
            w
        };
        match (&world.claims[claim], self.protocol) {
            (Pc::Start, Protocol::PerNode) => {
                // Plan and reserve, one step under the node's planning lock.
                let instant = Instant::now();
                let cached = |n: &str| world.caches[node].iter().any(|&c| pv(c) == n);
                let mut ledger = Reservations::default();
                for &c in &world.ledgers[node] {
                    ledger.reserve("pool", &pv(c), REQUEST, |_| false, instant);
                }
                let from_cache = world.caches[node].iter().filter(|&&c| c != claim).count() as u64 * REQUEST;
                let in_flight = ledger.outstanding("pool", &name, cached, instant);
                let room =
                    PoolRoom { available: u64::MAX, total: ROOM, reserved: 0, promised: Some(from_cache + in_flight) };
                if REQUEST <= room.room() {
                    let mut w = with(Pc::Promised);
                    w.ledgers[node].insert(claim);
                    vec![w]
                } else {
                    vec![with(Pc::Refused)]
                }
            }
            (Pc::Start, _) => {
                vec![with(Pc::ReadRecord { version: world.version, record: world.record.clone() })]
            }
            (Pc::ReadRecord { version, record }, _) => {
                vec![with(Pc::Listed { version: *version, record: record.clone(), listed: world.pvs.clone() })]
            }
            (Pc::Listed { version, record, listed }, _) => {
                if *version != world.version && self.protocol == Protocol::Record {
                    // The conditional write is refused: start again.
                    return vec![with(Pc::Start)];
                }
                // The plan's check, as for one node, beside what the record and the list promise.
                let listed: BTreeMap<String, u64> = listed.iter().map(|&c| (pv(c), REQUEST)).collect();
                let held = promised(&listed, record, &name, world.now);
                let room = PoolRoom { available: u64::MAX, total: ROOM, reserved: 0, promised: Some(held) };
                if REQUEST <= room.room() {
                    let mut w = with(Pc::Promised);
                    w.record = with_promise(&listed, record, &name, REQUEST, world.now);
                    w.version += 1;
                    vec![w]
                } else {
                    vec![with(Pc::Refused)]
                }
            }
            (Pc::Promised, protocol) => {
                let returned = if protocol.uses_record() { Pc::Returned } else { Pc::Done };
                let mut made = with(returned.clone());
                made.pvs.insert(claim);
                let mut steps = vec![made];
                if world.failures < self.max_failures {
                    let mut failed = with(returned);
                    failed.failures += 1;
                    failed.ledgers[node].remove(&claim);
                    steps.push(failed);
                }
                if protocol.uses_record() && world.deaths < self.max_deaths {
                    let mut dead = with(Pc::Dead);
                    dead.deaths += 1;
                    steps.push(dead);
                }
                steps
            }
            (Pc::Returned, _) => {
                let mut w = with(Pc::Done);
                w.record = settle(&world.record, &name);
                w.version += 1;
                vec![w]
            }
            (Pc::Refused | Pc::Done | Pc::Dead, _) => Vec::new(),
        }
    }
}

/// Claims 0, 1, 2 on nodes 0, 1, 0 (two nodes) or 0, 1, 2 (three nodes).
fn placements() -> [(usize, Vec<usize>); 2] {
    [(2, vec![0, 1, 0]), (3, vec![0, 1, 2])]
}

#[test]
fn the_per_node_ledger_over_promises_a_shared_pool_when_two_nodes_plan_at_once() {
    for (nodes, node_of) in placements() {
        let model = Model { protocol: Protocol::PerNode, node_of, nodes, max_failures: 1, max_deaths: 0 };
        let found = model.explore();
        assert!(
            found.over_promise.is_some(),
            "{nodes} nodes: the model must find today's race ({} states)",
            found.states
        );
    }
    // One node alone never does: its ledger is the whole truth.
    let alone = Model { protocol: Protocol::PerNode, node_of: vec![0, 0, 0], nodes: 1, max_failures: 1, max_deaths: 0 };
    let found = alone.explore();
    assert!(found.over_promise.is_none(), "{:?}", found.over_promise);
}

#[test]
fn the_promise_record_never_over_promises_with_two_or_three_nodes_lag_failures_and_deaths() {
    for (nodes, node_of) in placements() {
        let model = Model { protocol: Protocol::Record, node_of, nodes, max_failures: 1, max_deaths: 1 };
        let found = model.explore();
        assert!(found.over_promise.is_none(), "{nodes} nodes over-promise: {:?}", found.over_promise);
        assert_eq!(found.short_runs, 0, "{nodes} nodes: a run without faults made fewer volumes than fit");
        assert!(found.states > 1_000 && found.terminal > 10, "{nodes} nodes: explored {found:?}");
    }
}

#[test]
fn without_the_version_condition_the_record_over_promises() {
    // The same protocol writing the record unconditionally: the model finds the race again, so
    // the condition is what makes the record safe.
    let model = Model {
        protocol: Protocol::RecordUnconditional,
        node_of: vec![0, 1, 2],
        nodes: 3,
        max_failures: 0,
        max_deaths: 0,
    };
    assert!(model.explore().over_promise.is_some());
}

//! An exhaustive model of byte copies and volumes being made on one root with requests
//! accounting: every order of their steps, each decision made of the real functions
//! ([`CopyLedger::room_for_copy`] and [`CopyLedger::start`] for a copy,
//! [`CopyLedger::promised_for_volume`] and [`PoolRoom::room`] for a volume, the provisioning
//! ledger [`Reservations`] for volumes whose PV the watch cache does not show yet). Each decision
//! is one step, as under the provisioning ledger's lock.
//!
//! The worst case is played: a copy writes all it needs at once, and a volume's pod writes its
//! whole request, as soon as it may (before the watch shows its PV, in one of the scripts). The
//! disk may never fill past the reserve, whatever the order. With either half of the rule off (a
//! copy blind to volumes being made, or a volume blind to copies in flight) the same enumeration
//! finds an order that does.

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use super::*;
use crate::deciding::capacity::PoolRoom;
use crate::deciding::reservations::Reservations;

const MIB: u64 = 1 << 20;
/// The root's filesystem, what its own metadata takes (never free, but counted in its size, which
/// the promises are measured against) and its reserve: 76 MiB may be written beyond the reserve.
const TOTAL: u64 = 100 * MIB;
const OVERHEAD: u64 = 8 * MIB;
const RESERVE: u64 = 16 * MIB;
/// Most that may be written without taking the free space below the reserve.
const WRITABLE: u64 = TOTAL - OVERHEAD - RESERVE;
const ROOT: &str = "/var/hpvolumes";

/// One step of one actor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// A snapshot's byte copy asks for room (and starts when it fits).
    CopyStart,
    /// The copy writes what it needs.
    CopyWrite,
    /// The copy ends; a snapshot's is kept, a restore's becomes its volume's data.
    CopyEnd,
    /// A claim is planned and its volume reserved when it fits.
    Plan,
    /// The watch cache shows the volume's PV.
    Cached,
    /// The volume's pod writes its request (less what a restore copied in).
    PodWrites,
}

/// Which halves of the rule are on.
#[derive(Clone, Copy, Debug)]
struct Rules {
    copies_see_volumes_being_made: bool,
    volumes_see_copies_in_flight: bool,
}

const FULL: Rules = Rules { copies_see_volumes_being_made: true, volumes_see_copies_in_flight: true };

/// An actor: a snapshot's copy (`restore: false`, no plan), a plain volume (no copy), or a
/// restore (a plan, then a copy of `copy_bytes` into its volume of `request`).
#[derive(Clone, Debug)]
struct Actor {
    steps: Vec<Step>,
    request: u64,
    copy_bytes: u64,
}

fn snapshot(bytes: u64) -> Actor {
    Actor { steps: vec![Step::CopyStart, Step::CopyWrite, Step::CopyEnd], request: 0, copy_bytes: bytes }
}

fn volume(request: u64, pod_first: bool) -> Actor {
    let steps = if pod_first {
        vec![Step::Plan, Step::PodWrites, Step::Cached]
    } else {
        vec![Step::Plan, Step::Cached, Step::PodWrites]
    };
    Actor { steps, request, copy_bytes: 0 }
}

fn restore(request: u64, bytes: u64) -> Actor {
    let steps = vec![Step::Plan, Step::CopyStart, Step::CopyWrite, Step::CopyEnd, Step::Cached, Step::PodWrites];
    Actor { steps, request, copy_bytes: bytes }
}

/// What one order did: the most ever written beyond what the reserve allows, and how many
/// actors were let through.
struct Outcome {
    most_used: u64,
    admitted: usize,
}

fn run(actors: &[Actor], order: &[usize], rules: Rules) -> Outcome {
    let root = Path::new(ROOT);
    let now = Instant::now();
    let mut copies = CopyLedger::default();
    let mut reservations = Reservations::default();
    let mut cached: HashSet<String> = HashSet::new();
    let mut cached_requests = 0u64;
    let mut progress = vec![0usize; actors.len()];
    let mut refused = vec![false; actors.len()];
    let mut admitted = 0;
    let mut used = 0u64;
    let mut most_used = 0u64;
    for &i in order {
        let actor = &actors[i];
        let step = actor.steps[progress[i]];
        progress[i] += 1;
        if refused[i] {
            continue;
        }
        let (pv, copy_id, uid) = (format!("pvc-{i}"), format!("copy-{i}"), format!("snap-{i}"));
        let is_restore = actor.steps.contains(&Step::Plan);
        let being_made = |except: &str, reservations: &Reservations| {
            reservations.outstanding(ROOT, except, |name| cached.contains(name), now)
        };
        match step {
            Step::Plan => {
                let volumes = VolumePromises { cached: cached_requests, being_made: being_made(&pv, &reservations) };
                let free = TOTAL - OVERHEAD - used;
                let (available, promised) = if rules.volumes_see_copies_in_flight {
                    (copies.available_for_volume(root, free), copies.promised_for_volume(root, volumes))
                } else {
                    (free, volumes.cached + volumes.being_made + copies.kept_bytes(root))
                };
                let room = PoolRoom { available, total: TOTAL, reserved: RESERVE, promised: Some(promised) }.room();
                if actor.request <= room {
                    reservations.reserve(ROOT, &pv, actor.request, |name| cached.contains(name), now);
                    admitted += 1;
                } else {
                    refused[i] = true;
                }
            }
            Step::CopyStart => {
                let being_made = if rules.copies_see_volumes_being_made {
                    // A restore's own volume is not counted against its copy: the copy fills it.
                    being_made(if is_restore { &pv } else { "" }, &reservations)
                } else {
                    0
                };
                let volumes = VolumePromises { cached: cached_requests, being_made };
                let room = copies.room_for_copy(root, TOTAL - OVERHEAD - used, TOTAL, RESERVE, Some(volumes));
                if copies.start(&copy_id, root, actor.copy_bytes, room).is_ok() {
                    admitted += usize::from(!is_restore);
                } else {
                    refused[i] = true;
                    if is_restore {
                        // The restore fails: nothing was made, nothing is promised.
                        reservations.release(&pv);
                        admitted -= 1;
                    }
                }
            }
            Step::CopyWrite => used += actor.copy_bytes,
            Step::CopyEnd => {
                if is_restore {
                    copies.end(&copy_id);
                } else {
                    copies.end_and_keep(&copy_id, &uid, root, actor.copy_bytes);
                }
            }
            Step::Cached => {
                cached.insert(pv);
                cached_requests += actor.request;
            }
            Step::PodWrites => used += actor.request.saturating_sub(actor.copy_bytes),
        }
        most_used = most_used.max(used);
    }
    Outcome { most_used, admitted }
}

/// All merges of the actors' scripts, as the index of the actor each step belongs to.
fn interleavings(lengths: &[usize], visit: &mut impl FnMut(&[usize])) {
    fn extend(remaining: &mut [usize], current: &mut Vec<usize>, visit: &mut impl FnMut(&[usize])) {
        if remaining.iter().all(|&n| n == 0) {
            visit(current);
            return;
        }
        for i in 0..remaining.len() {
            if remaining[i] > 0 {
                remaining[i] -= 1;
                current.push(i);
                extend(remaining, current, visit);
                current.pop();
                remaining[i] += 1;
            }
        }
    }
    extend(&mut lengths.to_vec(), &mut Vec::new(), visit);
}

/// Enumerates every order under `rules`: how many orders there were, how many filled the disk
/// past the reserve, and the fewest actors any order let through.
fn enumerate(actors: &[Actor], rules: Rules) -> (usize, usize, usize) {
    let lengths: Vec<usize> = actors.iter().map(|a| a.steps.len()).collect();
    let (mut orders, mut past_reserve, mut fewest) = (0, 0, usize::MAX);
    interleavings(&lengths, &mut |order| {
        orders += 1;
        let outcome = run(actors, order, rules);
        if outcome.most_used > WRITABLE {
            past_reserve += 1;
        }
        fewest = fewest.min(outcome.admitted);
    });
    (orders, past_reserve, fewest)
}

/// Two snapshots and two volumes of 30 MiB each, 76 MiB writable beyond the reserve: two fit. No
/// order fills the disk past its reserve, and safety is not had by refusing all. Each half of the
/// rule is needed: without it, some order does.
#[test]
fn no_order_of_copies_and_volumes_being_made_fills_a_pool_past_its_reserve() {
    let actors = [snapshot(30 * MIB), snapshot(30 * MIB), volume(30 * MIB, true), volume(30 * MIB, false)];
    let (orders, past_reserve, fewest) = enumerate(&actors, FULL);
    assert_eq!(orders, 369_600, "12! / (3!)^4 orders");
    assert_eq!(past_reserve, 0, "an order filled the pool past its reserve");
    // A copy in flight counts in full until it ends, whatever it wrote already: a decision
    // made while one is half done may refuse what would fit (it is retried), never the other way
    // round. One after another, as many go through as fit.
    assert_eq!(fewest, 1, "every order lets one through");
    let one_after_another: Vec<usize> = (0..4).flat_map(|i| [i; 3]).collect();
    assert_eq!(run(&actors, &one_after_another, FULL).admitted, 2, "two fit");
    for half in
        [Rules { copies_see_volumes_being_made: false, ..FULL }, Rules { volumes_see_copies_in_flight: false, ..FULL }]
    {
        let (_, past_reserve, _) = enumerate(&actors, half);
        assert!(past_reserve > 0, "with {half:?} the enumeration must find the pool filled past its reserve");
    }
}

/// A restore (a 40 MiB claim, a 25 MiB snapshot copied into it) beside a snapshot's copy of
/// 30 MiB and a volume of 30 MiB: the restore's copy is counted against the room its own volume
/// was promised only once (or a restore that fits alone would be refused), and nothing fills the
/// pool past its reserve.
#[test]
fn no_order_of_a_restore_a_copy_and_a_volume_fills_a_pool_past_its_reserve() {
    let actors = [restore(40 * MIB, 25 * MIB), snapshot(30 * MIB), volume(30 * MIB, true)];
    let (orders, past_reserve, fewest) = enumerate(&actors, FULL);
    assert_eq!(orders, 18_480, "12! / (6! 3! 3!) orders");
    assert_eq!(past_reserve, 0, "an order filled the pool past its reserve");
    assert!(fewest >= 1, "some actor is always let through");
    // Alone, the restore fits (its copy is within its own promise).
    let alone = run(&[restore(WRITABLE, WRITABLE)], &[0; 6], FULL);
    assert_eq!((alone.admitted, alone.most_used), (1, WRITABLE));
    let (_, past_reserve, _) = enumerate(&actors, Rules { copies_see_volumes_being_made: false, ..FULL });
    assert!(past_reserve > 0, "a copy blind to the restore's volume being made must be caught");
}

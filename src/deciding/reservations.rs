//! Space promised to volumes that are being made, for pools with requests accounting.
//!
//! The promise check reads the pool's live volumes from the watch cache. Two claims of one pool
//! planned at the same time would each see the other's volume missing, and so would a claim
//! planned right after another's PV was created but before the watch delivered it: both fit on
//! their own and together overcommit the pool. The reconciler therefore plans such claims one at
//! a time per process, and records what each planned volume will hold here until the cache shows
//! its PV (or the attempt fails). Pure bookkeeping over plain data: the caller passes the clock
//! and which PV names the cache holds.
//!
//! Entries are kept by pool root (`pool` below is the root's path): each root of a pool of
//! several (`deciding::pool_roots`) has its own space and its own promises.
//!
//! Nodes do not share this ledger, so it serves the pools one node decides alone; a `shared`
//! pool's promises go through a record every node reads instead ([`crate::deciding::pool_promises`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a reservation counts without its PV appearing in the cache. Far longer than a watch
/// lags behind a create; it bounds the damage of a PV that was created and removed again before
/// the cache showed it (that space would otherwise stay promised until the process restarts).
pub const RESERVATION_TTL: Duration = Duration::from_secs(300);

/// One volume being made: its pool, its size, since when.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Reservation {
    pool: String,
    bytes: u64,
    since: Instant,
}

/// The volumes being made, by PV name.
#[derive(Debug, Default)]
pub struct Reservations {
    by_pv: HashMap<String, Reservation>,
}

impl Reservations {
    /// Bytes promised in `pool` to volumes being made, not counting `except_pv` (the claim being
    /// planned) nor any PV the cache already holds (counted from the cache), nor expired ones.
    pub fn outstanding(&self, pool: &str, except_pv: &str, cached: impl Fn(&str) -> bool, now: Instant) -> u64 {
        self.by_pv
            .iter()
            .filter(|(pv, r)| r.pool == pool && pv.as_str() != except_pv && !cached(pv) && !expired(r, now))
            .map(|(_, r)| r.bytes)
            .fold(0u64, u64::saturating_add)
    }

    /// Records that `pv` of `pool` is being made with `bytes`; drops the entries that no longer
    /// count (their PV is cached, or they expired) so the ledger stays as small as the work in flight.
    pub fn reserve(&mut self, pool: &str, pv: &str, bytes: u64, cached: impl Fn(&str) -> bool, now: Instant) {
        self.by_pv.retain(|name, r| !cached(name) && !expired(r, now));
        self.by_pv.insert(pv.to_owned(), Reservation { pool: pool.to_owned(), bytes, since: now });
    }

    /// Forgets `pv`: its attempt failed, so nothing was promised; or the watch cache shows its PV,
    /// which counts from there (an entry kept would count again once that PV is deleted).
    pub fn release(&mut self, pv: &str) {
        self.by_pv.remove(pv);
    }

    /// How many entries the ledger holds (for tests and metrics).
    pub fn len(&self) -> usize {
        self.by_pv.len()
    }

    /// Whether the ledger is empty.
    pub fn is_empty(&self) -> bool {
        self.by_pv.is_empty()
    }
}

fn expired(reservation: &Reservation, now: Instant) -> bool {
    now.saturating_duration_since(reservation.since) >= RESERVATION_TTL
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deciding::capacity::PoolRoom;
    use std::collections::HashSet;

    const GIB: u64 = 1 << 30;

    #[test]
    fn a_volume_being_made_counts_until_its_pv_is_cached_and_then_only_once() {
        let now = Instant::now();
        let mut ledger = Reservations::default();
        ledger.reserve("ssd", "pvc-a", 3 * GIB, |_| false, now);
        assert_eq!(ledger.outstanding("ssd", "pvc-b", |_| false, now), 3 * GIB);
        assert_eq!(ledger.outstanding("other", "pvc-b", |_| false, now), 0, "another pool's volume");
        assert_eq!(ledger.outstanding("ssd", "pvc-a", |_| false, now), 0, "the claim being planned itself");
        assert_eq!(ledger.outstanding("ssd", "pvc-b", |pv| pv == "pvc-a", now), 0, "counted from the cache");
    }

    #[test]
    fn a_failed_attempt_promises_nothing_and_old_entries_expire() {
        let now = Instant::now();
        let mut ledger = Reservations::default();
        ledger.reserve("ssd", "pvc-a", GIB, |_| false, now);
        ledger.release("pvc-a");
        assert_eq!(ledger.outstanding("ssd", "pvc-b", |_| false, now), 0);
        ledger.reserve("ssd", "pvc-c", GIB, |_| false, now);
        let later = now + RESERVATION_TTL;
        assert_eq!(ledger.outstanding("ssd", "pvc-b", |_| false, later), 0);
        ledger.reserve("ssd", "pvc-d", GIB, |_| false, later);
        assert_eq!(ledger.len(), 1, "the expired entry was dropped");
    }

    /// What one claim does, in the order the reconciler does it for a requests-accounted pool:
    /// plan and reserve (under the per-process planning lock, so atomically), then the create
    /// returns, then the watch delivers the PV. A create may fail instead.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Step {
        PlanAndReserve,
        Created,
        Cached,
        Failed,
    }

    /// Every interleaving of the claims' steps (each claim's own steps stay in order), run
    /// against the ledger and the promise check: the promises of the volumes that exist or are
    /// being made never exceed the pool, whatever the order. Without the ledger (outstanding
    /// taken as 0) the same enumeration finds an overcommit, which is the race this fixes.
    #[test]
    fn no_interleaving_of_claims_and_watch_lag_overcommits_a_pool() {
        let scripts: Vec<Vec<Step>> = vec![
            vec![Step::PlanAndReserve, Step::Created, Step::Cached],
            vec![Step::PlanAndReserve, Step::Created, Step::Cached],
            vec![Step::PlanAndReserve, Step::Failed],
        ];
        let mut overcommits_without_ledger = 0;
        for use_ledger in [true, false] {
            for order in interleavings(&scripts.iter().map(Vec::len).collect::<Vec<_>>()) {
                let worst = run(&scripts, &order, use_ledger);
                if use_ledger {
                    assert!(worst <= POOL_ROOM, "order {order:?} overcommits: {worst} promised of {POOL_ROOM}");
                } else if worst > POOL_ROOM {
                    overcommits_without_ledger += 1;
                }
            }
        }
        assert!(overcommits_without_ledger > 0, "the enumeration must be able to see the race");
    }

    /// Each claim asks 4 GiB of a pool with room for 10 GiB: two fit, three do not.
    const REQUEST: u64 = 4 * GIB;
    const POOL_ROOM: u64 = 10 * GIB;

    /// Runs one interleaving; returns the most space ever promised to volumes that exist or are
    /// being made (planned, not failed).
    fn run(scripts: &[Vec<Step>], order: &[usize], use_ledger: bool) -> u64 {
        let now = Instant::now();
        let mut ledger = Reservations::default();
        let mut cached: HashSet<String> = HashSet::new();
        let mut progress = vec![0usize; scripts.len()];
        let mut admitted = vec![false; scripts.len()];
        let mut live: HashSet<usize> = HashSet::new();
        let mut worst = 0;
        for &claim in order {
            let step = scripts[claim][progress[claim]];
            progress[claim] += 1;
            let pv = format!("pvc-{claim}");
            match step {
                Step::PlanAndReserve => {
                    let from_cache = cached.len() as u64 * REQUEST;
                    let in_flight =
                        if use_ledger { ledger.outstanding("pool", &pv, |name| cached.contains(name), now) } else { 0 };
                    let room = PoolRoom {
                        available: u64::MAX,
                        total: POOL_ROOM,
                        reserved: 0,
                        promised: Some(from_cache + in_flight),
                    };
                    if REQUEST <= room.room() {
                        admitted[claim] = true;
                        live.insert(claim);
                        ledger.reserve("pool", &pv, REQUEST, |name| cached.contains(name), now);
                    }
                }
                Step::Created => {}
                Step::Cached => {
                    if admitted[claim] {
                        cached.insert(pv);
                    }
                }
                Step::Failed => {
                    if admitted[claim] {
                        live.remove(&claim);
                        ledger.release(&pv);
                    }
                }
            }
            worst = worst.max(live.len() as u64 * REQUEST);
        }
        worst
    }

    /// A pool of two roots of 6 GiB each (`deciding::pool_roots`), three claims of 4 GiB: each
    /// root takes one. Every interleaving, with the root chosen by the room each root has after
    /// its own cached and in-flight promises (the ledger is kept by root): no root is ever
    /// promised more than its room, and no claim is refused while a root had room for it.
    /// Choosing by free space alone (promises ignored) refuses claims a root had room for.
    #[test]
    fn no_interleaving_overcommits_a_root_of_a_pool_of_several() {
        let scripts: Vec<Vec<Step>> = vec![
            vec![Step::PlanAndReserve, Step::Created, Step::Cached],
            vec![Step::PlanAndReserve, Step::Created, Step::Cached],
            vec![Step::PlanAndReserve, Step::Failed],
        ];
        let mut wrongly_refused_by_free_space = 0;
        for weigh_promises in [true, false] {
            for order in interleavings(&scripts.iter().map(Vec::len).collect::<Vec<_>>()) {
                let (worst, wrongly_refused) = run_on_two_roots(&scripts, &order, weigh_promises);
                assert!(worst <= ROOT_ROOM, "order {order:?} overcommits a root: {worst} of {ROOT_ROOM}");
                if weigh_promises {
                    assert_eq!(wrongly_refused, 0, "order {order:?} refused a claim a root had room for");
                }
                wrongly_refused_by_free_space += wrongly_refused;
            }
        }
        assert!(wrongly_refused_by_free_space > 0, "the enumeration must see what ignoring promises does");
    }

    const ROOT_ROOM: u64 = 6 * GIB;

    /// Runs one interleaving over two roots; returns the most ever promised on one root, and how
    /// many claims were refused while a root had room for them.
    fn run_on_two_roots(scripts: &[Vec<Step>], order: &[usize], weigh_promises: bool) -> (u64, usize) {
        use crate::deciding::pool_roots::{RootCandidate, choose};
        const ROOTS: [&str; 2] = ["/mnt/disk1", "/mnt/disk2"];
        let now = Instant::now();
        let mut ledger = Reservations::default();
        let mut cached: HashSet<String> = HashSet::new();
        let mut progress = vec![0usize; scripts.len()];
        let mut placed: Vec<Option<usize>> = vec![None; scripts.len()];
        let mut live: HashSet<usize> = HashSet::new();
        let (mut worst, mut wrongly_refused) = (0, 0);
        for &claim in order {
            let step = scripts[claim][progress[claim]];
            progress[claim] += 1;
            let pv = format!("pvc-{claim}");
            match step {
                Step::PlanAndReserve => {
                    let rooms: Vec<u64> = (0..ROOTS.len())
                        .map(|root| {
                            let on_root = |c: &usize| placed[*c] == Some(root);
                            let from_cache = (0..scripts.len())
                                .filter(|c| on_root(c) && cached.contains(&format!("pvc-{c}")))
                                .count();
                            let in_flight = ledger.outstanding(ROOTS[root], &pv, |name| cached.contains(name), now);
                            PoolRoom {
                                available: u64::MAX,
                                total: ROOT_ROOM,
                                reserved: 0,
                                promised: Some(from_cache as u64 * REQUEST + in_flight),
                            }
                            .room()
                        })
                        .collect();
                    let candidates: Vec<_> = rooms
                        .iter()
                        .map(|&room| RootCandidate {
                            usable: true,
                            holds_claim: false,
                            can_make: true,
                            room: if weigh_promises { room } else { ROOT_ROOM },
                        })
                        .collect();
                    let root = choose(&candidates).expect("a usable root");
                    if REQUEST <= rooms[root] {
                        placed[claim] = Some(root);
                        live.insert(claim);
                        ledger.reserve(ROOTS[root], &pv, REQUEST, |name| cached.contains(name), now);
                    } else if rooms.iter().any(|&room| REQUEST <= room) {
                        wrongly_refused += 1;
                    }
                }
                Step::Created => {}
                Step::Cached => {
                    if placed[claim].is_some() {
                        cached.insert(pv);
                    }
                }
                Step::Failed => {
                    if live.remove(&claim) {
                        ledger.release(&pv);
                        placed[claim] = None;
                    }
                }
            }
            for root in 0..ROOTS.len() {
                let promised = live.iter().filter(|c| placed[**c] == Some(root)).count() as u64 * REQUEST;
                worst = worst.max(promised);
            }
        }
        (worst, wrongly_refused)
    }

    /// All merges of sequences of the given lengths, as the index of the sequence each step takes.
    fn interleavings(lengths: &[usize]) -> Vec<Vec<usize>> {
        fn extend(remaining: &mut Vec<usize>, current: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
            if remaining.iter().all(|&n| n == 0) {
                out.push(current.clone());
                return;
            }
            for i in 0..remaining.len() {
                if remaining[i] > 0 {
                    remaining[i] -= 1;
                    current.push(i);
                    extend(remaining, current, out);
                    current.pop();
                    remaining[i] += 1;
                }
            }
        }
        let mut out = Vec::new();
        extend(&mut lengths.to_vec(), &mut Vec::new(), &mut out);
        out
    }

    #[test]
    fn the_enumeration_covers_every_merge() {
        // 3 + 3 + 2 steps: 8! / (3! 3! 2!) = 560 orders.
        assert_eq!(interleavings(&[3, 3, 2]).len(), 560);
    }
}

//! Every interleaving of the two actors that can meet at one pattern directory, with either
//! stopping (a crash) after any step: a node deleting PV 1 (Released, reclaim Delete) and a
//! claim of the same namespace and name, made again, whose PV will be PV 2. Its data may be
//! taken over only while PV 1 has not let it go; whatever the order, a directory is never put
//! into the trash for PV 1 once it carries PV 2's marker, and PV 2 is created only on the
//! directory at its place that carries its marker.
//!
//! The steps are those of `reconciling::provisioning` and `reconciling::volumes`, each one
//! system call or API request, deciding through [`place`] and [`marker_allows_deletion`].

use super::super::*;

const PV1: &str = "pvc-1";
const PV2: &str = "pvc-2";

/// The claim both PVs are for.
fn claim() -> ClaimIdentity {
    super::identity("9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d", "ns", "data", "retain")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Dir {
    /// Whose data: the first volume's (1) or a new one (2).
    data: u8,
    marker: Option<&'static str>,
}

#[derive(Clone, Debug, Default)]
struct World {
    dirs: Vec<Dir>,
    place: Option<usize>,
    staged: Option<usize>,
    trash: Vec<usize>,
    pv1: bool,
    /// PV 2, once created: the directory the claim made, reused or took over.
    pv2: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Deleter {
    ReadMarker,
    Stage,
    Recheck,
    LetGo,
    Commit,
    /// After a crash: the node settles what it left staged (`reconciling::settling`).
    Settle,
    Stopped,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Provisioner {
    ReadApi,
    ReadDisk { pv1_exists: bool },
    Act { facts: Box<DirectoryFacts> },
    Mark { fd: usize },
    Verify { fd: usize },
    CreatePv { dir: usize },
    Stopped,
}

#[derive(Clone, Debug)]
struct State {
    world: World,
    deleter: Deleter,
    provisioner: Provisioner,
}

fn marker_at(world: &World, at: Option<usize>) -> Option<&'static str> {
    at.and_then(|i| world.dirs[i].marker)
}

fn step_deleter(s: &mut State) {
    let w = &mut s.world;
    s.deleter = match s.deleter {
        // The check before moving (it spares a needless move); the recheck decides.
        Deleter::ReadMarker => match w.place {
            Some(_) if marker_allows_deletion(PV1, marker_at(w, w.place)) => Deleter::Stage,
            _ => Deleter::Stopped,
        },
        // rename(place -> .hpp-deleting/...): whatever is there now.
        Deleter::Stage => match w.place.take() {
            Some(i) => {
                w.staged = Some(i);
                Deleter::Recheck
            }
            None => Deleter::Stopped,
        },
        // The marker of what was moved: not PV 1's any more, it goes back (never replacing).
        Deleter::Recheck => {
            if marker_allows_deletion(PV1, marker_at(w, w.staged)) {
                Deleter::LetGo
            } else {
                if w.place.is_none() {
                    w.place = w.staged.take();
                }
                Deleter::Stopped
            }
        }
        Deleter::LetGo => {
            w.pv1 = false;
            Deleter::Commit
        }
        Deleter::Commit => {
            w.trash.extend(w.staged.take());
            Deleter::Stopped
        }
        // A staged directory whose marker is not PV 1's goes back, as one whose PV stays.
        Deleter::Settle => {
            match w.staged {
                Some(i) if marker_allows_deletion(PV1, w.dirs[i].marker) && !w.pv1 => {
                    w.trash.extend(w.staged.take());
                }
                Some(_) if w.place.is_none() => w.place = w.staged.take(),
                _ => {}
            }
            Deleter::Stopped
        }
        Deleter::Stopped => Deleter::Stopped,
    }
}

fn step_provisioner(s: &mut State) {
    let w = &mut s.world;
    s.provisioner = match std::mem::replace(&mut s.provisioner, Provisioner::Stopped) {
        Provisioner::ReadApi => Provisioner::ReadDisk { pv1_exists: w.pv1 },
        Provisioner::ReadDisk { pv1_exists } => {
            let found = match w.place {
                None => Found::Absent,
                Some(i) => match w.dirs[i].marker {
                    None => Found::Unmarked,
                    Some(pv) => Found::MarkedFor(pv.to_owned()),
                },
            };
            let marked_pv_exists = matches!(&found, Found::MarkedFor(pv) if pv == PV1 && pv1_exists);
            // PV 1 names the directory's path while it exists.
            let held_by = pv1_exists.then(|| PV1.to_owned());
            // Both PVs are the same claim's (made again): its owner record is on the directory.
            let recorded = match &found {
                Found::MarkedFor(pv) => Some(OwnerRecord { pv: pv.clone(), owner: claim() }),
                Found::Absent | Found::Unmarked => None,
            };
            let facts =
                DirectoryFacts { found, marked_pv_exists, held_by, recorded, asker: claim(), handed_over: false };
            Provisioner::Act { facts: Box::new(facts) }
        }
        Provisioner::Act { facts } => match place(PV2, "/pool/ns_data", &facts) {
            // Made aside with its marker, renamed into place only if the place is free.
            Placing::Make { .. } => {
                w.dirs.push(Dir { data: 2, marker: Some(PV2) });
                if w.place.is_none() {
                    w.place = Some(w.dirs.len() - 1);
                    Provisioner::CreatePv { dir: w.dirs.len() - 1 }
                } else {
                    Provisioner::Stopped
                }
            }
            Placing::Reuse { .. } => match w.place {
                Some(dir) => Provisioner::CreatePv { dir },
                None => Provisioner::Stopped,
            },
            // Opened at its place, then marked through that descriptor.
            Placing::Adopt { .. } => match w.place {
                Some(fd) => Provisioner::Mark { fd },
                None => Provisioner::Stopped,
            },
            Placing::Refuse(_) => Provisioner::Stopped,
        },
        Provisioner::Mark { fd } => {
            w.dirs[fd].marker = Some(PV2);
            Provisioner::Verify { fd }
        }
        // Still the directory at the place, or the attempt fails (and a later one decides again).
        Provisioner::Verify { fd } => {
            if w.place == Some(fd) {
                Provisioner::CreatePv { dir: fd }
            } else {
                Provisioner::Stopped
            }
        }
        Provisioner::CreatePv { dir } => {
            w.pv2 = Some(dir);
            Provisioner::Stopped
        }
        Provisioner::Stopped => Provisioner::Stopped,
    }
}

/// At every state: no data of an existing PV is in the trash. Once both have stopped: PV 2, if
/// created, has its directory at its place, carrying its marker (a move aside is undone).
fn check(s: &State, trace: &[&str], stopped: bool) {
    let w = &s.world;
    for &i in &w.trash {
        assert!(!(w.dirs[i].data == 1 && w.pv1), "PV 1's data reached the trash while PV 1 exists: {trace:?}");
        assert_ne!(w.pv2, Some(i), "PV 2's directory reached the trash: {trace:?}");
    }
    if let (true, Some(dir)) = (stopped, w.pv2) {
        assert_eq!(w.place, Some(dir), "PV 2's directory is not at its place: {trace:?}");
        assert_eq!(w.dirs[dir].marker, Some(PV2), "PV 2's directory lost its marker: {trace:?}");
    }
}

fn explore(s: State, trace: &mut Vec<&'static str>, runs: &mut u64, adopted: &mut bool) {
    let deleter_can = s.deleter != Deleter::Stopped;
    let provisioner_can = s.provisioner != Provisioner::Stopped;
    check(&s, trace, !deleter_can && !provisioner_can);
    if !deleter_can && !provisioner_can {
        *runs += 1;
        if s.world.pv2.is_some_and(|i| s.world.dirs[i].data == 1) {
            *adopted = true;
        }
        return;
    }
    if deleter_can {
        let mut next = s.clone();
        step_deleter(&mut next);
        trace.push("delete");
        explore(next, trace, runs, adopted);
        trace.pop();
        // Settling is retried every minute until it is done: a crash there only repeats it.
        if s.deleter != Deleter::Settle {
            let mut crashed = s.clone();
            crashed.deleter = Deleter::Settle;
            trace.push("deleter crashes");
            explore(crashed, trace, runs, adopted);
            trace.pop();
        }
    }
    if provisioner_can {
        let mut next = s.clone();
        step_provisioner(&mut next);
        trace.push("provision");
        explore(next, trace, runs, adopted);
        trace.pop();
        // A watch cache behind the API may not show PV 1 any more than it shows it: the same
        // step with PV 1 read as gone, whatever is true.
        if s.provisioner == Provisioner::ReadApi {
            let mut stale = s.clone();
            stale.provisioner = Provisioner::ReadDisk { pv1_exists: false };
            trace.push("provision (PV 1 read as gone)");
            explore(stale, trace, runs, adopted);
            trace.pop();
        }
        let mut crashed = s;
        crashed.provisioner = Provisioner::Stopped;
        trace.push("provisioner stops");
        explore(crashed, trace, runs, adopted);
        trace.pop();
    }
}

#[test]
fn no_interleaving_of_a_deletion_and_a_take_over_trashes_the_new_claims_data() {
    // PV 1 being deleted as the claim comes back; or deleted already (by an admin, under Retain).
    for (pv1, deleter) in [(true, Deleter::ReadMarker), (false, Deleter::Stopped)] {
        let world = World { dirs: vec![Dir { data: 1, marker: Some(PV1) }], place: Some(0), pv1, ..World::default() };
        let start = State { world, deleter, provisioner: Provisioner::ReadApi };
        let (mut runs, mut adopted) = (0, false);
        explore(start, &mut Vec::new(), &mut runs, &mut adopted);
        assert!(runs > if pv1 { 1000 } else { 5 }, "{runs} runs");
        // Some order hands the old directory, data and all, to the new claim.
        assert!(adopted, "pv1={pv1}: no order takes the directory over");
    }
}

/// The recheck after moving is what makes it safe: without it, some order puts the new claim's
/// data into the trash.
#[test]
fn without_the_recheck_after_moving_some_order_trashes_the_new_claims_data() {
    let world = World { dirs: vec![Dir { data: 1, marker: Some(PV1) }], place: Some(0), pv1: true, ..World::default() };
    let start = State { world, deleter: Deleter::ReadMarker, provisioner: Provisioner::ReadApi };
    // Deleter reads the marker, the claim (having read PV 1 as gone, a stale view) marks it...
    let mut s = start;
    s.provisioner = Provisioner::Act {
        facts: Box::new(DirectoryFacts {
            found: Found::MarkedFor(PV1.into()),
            marked_pv_exists: false,
            held_by: None,
            recorded: Some(OwnerRecord { pv: PV1.into(), owner: claim() }),
            asker: claim(),
            handed_over: false,
        }),
    };
    step_deleter(&mut s); // read marker: PV 1's
    step_provisioner(&mut s); // open at place
    step_provisioner(&mut s); // mark for PV 2
    step_deleter(&mut s); // stage
    assert_eq!(s.deleter, Deleter::Recheck);
    let mut skipped = s.clone();
    skipped.deleter = Deleter::LetGo; // no recheck
    step_deleter(&mut skipped);
    step_deleter(&mut skipped);
    assert!(skipped.world.trash.iter().any(|&i| skipped.world.dirs[i].marker == Some(PV2)), "the race is real");
    // ...and the claim, its directory still in place when it looked, would create PV 2 on it.
    // With it, the directory goes back and the claim's verify passes.
    step_deleter(&mut s);
    assert_eq!(s.deleter, Deleter::Stopped);
    step_provisioner(&mut s);
    assert_eq!(s.provisioner, Provisioner::CreatePv { dir: 0 });
    step_provisioner(&mut s);
    assert_eq!(s.world.pv2, Some(0));
    check(&s, &["hand-made"], true);
}

//! Room for byte copies: a snapshot taken, or a volume restored, by copying bytes (a filesystem
//! that shares no extents: ext4, say) takes as much room again as its source. Checked one by
//! one against the free space, N copies started together would each fit and together fill the
//! pool past its reserve, to ENOSPC, for every tenant of that disk; a restore checked against
//! its claim's request (not what the snapshot holds) would do the same alone.
//!
//! So each node keeps a ledger per pool root: the copies in flight (what each will still write,
//! counted in full until it ends) and the byte copies kept (snapshots, which requests
//! accounting counts as promised space). A copy starts only when it fits beside the reserve and
//! the copies in flight, under the ledger's lock, so that copies started at once see each
//! other. Pure bookkeeping; the caller passes the room: the free space beyond the reserve and,
//! with requests accounting, no more than the space not promised (`capacity::PoolRoom::room`).
//! Free space alone would let a copy take room promised to a volume its pod has not written
//! yet; that pod's writes, within its request, would then take the pool below its reserve.
//!
//! Copies and volumes being made see each other, both ways: with requests accounting a copy's
//! room leaves out what the volumes being made will hold (`deciding::reservations`: planned, their
//! PV not in the watch cache yet), and a volume's check counts the copies in flight as promised and takes
//! them off the free space ([`CopyLedger::promised_for_volume`],
//! [`CopyLedger::available_for_volume`]). Both checks run under the provisioning ledger's lock,
//! so that a copy and a volume decided at the same time see each other; `copy_room/model.rs`
//! enumerates the orders of copies and provisions against a pool and its reserve.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::deciding::capacity::Size;

/// A copy that does not fit now (it waits; nothing of it is written).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} needs {} and pool {pool} at {} on node {node} has {} free beyond its reserve of {} (with requests accounting, and not promised to its volumes){}: it waits until there is room",
    Size(*.needed),
    .root.display(),
    Size(*.free_beyond_reserve),
    Size(*.reserve),
    if *.in_flight > 0 { format!(", of which {} is taken by copies being made", Size(*.in_flight)) } else { String::new() }
)]
pub struct NoRoomForCopy {
    /// What is copied, for the message ("a copy of claim \"data\"", "the restore of snapshot ...").
    pub what: String,
    pub pool: String,
    pub root: PathBuf,
    pub node: String,
    /// Bytes the copy will write.
    pub needed: u64,
    /// Free bytes beyond the reserve, as statvfs tells them now, and with requests accounting no
    /// more than what is not promised to the pool's volumes and kept copies
    /// (`capacity::PoolRoom::room`): a copy must not take room a volume's pod may still write.
    pub free_beyond_reserve: u64,
    pub reserve: u64,
    /// Bytes the other copies in flight on the root will still write.
    pub in_flight: u64,
}

/// What a root with requests accounting has promised to volumes, as the caller reads it: the
/// requests of the volumes its watch cache shows, and of the volumes being made that the cache
/// does not show yet (`deciding::reservations`), the volume being decided (a restore's own) left
/// out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VolumePromises {
    pub cached: u64,
    pub being_made: u64,
}

/// The byte copies of a node, by root.
#[derive(Debug, Default)]
pub struct CopyLedger {
    /// In flight, by copy (a snapshot's UID, a restored volume's PV name).
    in_flight: HashMap<String, (PathBuf, u64)>,
    /// Kept byte copies (snapshots), by snapshot UID.
    kept: HashMap<String, (PathBuf, u64)>,
}

impl CopyLedger {
    /// Bytes the copies in flight on `root` will write, `except` one.
    pub fn in_flight_bytes(&self, root: &Path, except: &str) -> u64 {
        self.in_flight
            .iter()
            .filter(|(id, (r, _))| r == root && id.as_str() != except)
            .map(|(_, (_, bytes))| *bytes)
            .fold(0, u64::saturating_add)
    }

    /// Starts copy `id` of `needed` bytes on `root` when it fits in `free_beyond_reserve` beside
    /// the copies in flight there; `Err` with the bytes those take when it does not. A copy
    /// already started (a retry) is counted once.
    pub fn start(&mut self, id: &str, root: &Path, needed: u64, free_beyond_reserve: u64) -> Result<(), u64> {
        let in_flight = self.in_flight_bytes(root, id);
        if needed.saturating_add(in_flight) > free_beyond_reserve {
            return Err(in_flight);
        }
        self.in_flight.insert(id.to_owned(), (root.to_owned(), needed));
        Ok(())
    }

    /// Copy `id` ended (made or failed): what it wrote is in the free space from now on.
    pub fn end(&mut self, id: &str) {
        self.in_flight.remove(id);
    }

    /// Room a byte copy may take on `root`, given its statvfs `available` and `total` bytes and
    /// its `reserve`: the free space beyond the reserve and, with requests accounting
    /// (`volumes`), no more than what is promised neither to volumes (cached or being made) nor
    /// to kept copies. [`CopyLedger::start`] then checks it beside the copies in flight.
    pub fn room_for_copy(
        &self,
        root: &Path,
        available: u64,
        total: u64,
        reserve: u64,
        volumes: Option<VolumePromises>,
    ) -> u64 {
        let promised = volumes.map(|v| v.cached.saturating_add(v.being_made).saturating_add(self.kept_bytes(root)));
        crate::deciding::capacity::PoolRoom { available, total, reserved: reserve, promised }.room()
    }

    /// What a new volume's check counts as promised on `root` (requests accounting): the
    /// volumes', the kept copies', and what the copies in flight will write. Free space alone
    /// would not show a copy that has written little yet; the volume would be promised room the
    /// copy then fills.
    pub fn promised_for_volume(&self, root: &Path, volumes: VolumePromises) -> u64 {
        volumes
            .cached
            .saturating_add(volumes.being_made)
            .saturating_add(self.kept_bytes(root))
            .saturating_add(self.in_flight_bytes(root, ""))
    }

    /// The free space a new volume's check sees on `root` (requests accounting): `available`
    /// less what the copies in flight will write, counted in full until they end (as a copy's
    /// own check counts them). The promise term alone is measured against the filesystem's size,
    /// which its own metadata makes larger than what can be written: a copy that has written
    /// little yet must take its room from the free space too.
    pub fn available_for_volume(&self, root: &Path, available: u64) -> u64 {
        available.saturating_sub(self.in_flight_bytes(root, ""))
    }

    /// Copy `id` ended and made snapshot `uid`'s byte copy of `bytes` on `root`: kept from the
    /// same instant it stops being in flight, so that no check in between counts it nowhere.
    pub fn end_and_keep(&mut self, id: &str, uid: &str, root: &Path, bytes: u64) {
        self.keep(uid, root, bytes);
        self.end(id);
    }

    /// Snapshot `uid` keeps a byte copy of `bytes` on `root`.
    pub fn keep(&mut self, uid: &str, root: &Path, bytes: u64) {
        self.kept.insert(uid.to_owned(), (root.to_owned(), bytes));
    }

    /// Snapshot `uid`'s copy is gone.
    pub fn forget(&mut self, uid: &str) {
        self.kept.remove(uid);
    }

    /// Bytes of the byte copies kept on `root`: space no volume's request counts.
    pub fn kept_bytes(&self, root: &Path) -> u64 {
        self.kept.values().filter(|(r, _)| r == root).map(|(_, bytes)| *bytes).fold(0, u64::saturating_add)
    }
}

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// Under requests accounting, room promised to volumes not written yet is no room for a
    /// copy: a 64 MiB pool, 8 MiB reserve, 40 MiB promised to a volume that wrote nothing (so
    /// 56 MiB free beyond the reserve): a 20 MiB copy would leave the volume's pod 36 MiB for its
    /// 40 MiB, and its writes would take the pool 4 MiB into the reserve. It waits; 16 MiB fits.
    #[test]
    fn a_copy_never_takes_room_promised_to_volumes_not_written_yet() {
        use crate::deciding::capacity::PoolRoom;
        let root = Path::new("/var/hpvolumes");
        let pool = |promised| PoolRoom { available: 64 * MIB, total: 64 * MIB, reserved: 8 * MIB, promised };
        let free_only = pool(None).room();
        let requests = pool(Some(40 * MIB)).room();
        assert_eq!((free_only, requests), (56 * MIB, 16 * MIB));
        let mut ledger = CopyLedger::default();
        assert!(ledger.start("big", root, 20 * MIB, free_only).is_ok(), "free space alone lets it through");
        ledger.end("big");
        assert_eq!(ledger.start("big", root, 20 * MIB, requests), Err(0), "the unpromised room does not");
        assert!(ledger.start("fits", root, 16 * MIB, requests).is_ok());
        // Once kept, the copy is promised too: the next copy's room shrinks by it.
        ledger.end("fits");
        ledger.keep("fits", root, 16 * MIB);
        let next = pool(Some(40 * MIB + ledger.kept_bytes(root))).room();
        assert_eq!(ledger.start("next", root, MIB, next), Err(0));
    }

    #[test]
    fn copies_started_together_see_each_other_and_never_pass_the_free_space() {
        let root = Path::new("/var/hpvolumes");
        let mut ledger = CopyLedger::default();
        // 16 MiB free beyond the reserve, four copies of 6 MiB asked at once: two fit.
        let started: Vec<bool> =
            ["a", "b", "c", "d"].iter().map(|id| ledger.start(id, root, 6 * MIB, 16 * MIB).is_ok()).collect();
        assert_eq!(started, [true, true, false, false]);
        assert_eq!(ledger.in_flight_bytes(root, ""), 12 * MIB);
        assert_eq!(ledger.start("c", root, 6 * MIB, 16 * MIB), Err(12 * MIB), "says what the others take");
        // One ends: its bytes are now in the free space the caller reads again (10 MiB), and
        // the other is still counted in full until it ends too.
        ledger.end("a");
        assert_eq!(ledger.start("c", root, 6 * MIB, 10 * MIB), Err(6 * MIB));
        ledger.end("b");
        assert_eq!(ledger.start("c", root, 6 * MIB, 4 * MIB), Err(0), "then the free space alone decides");
        assert!(ledger.start("c", root, 6 * MIB, 6 * MIB).is_ok());
    }

    #[test]
    fn every_order_of_starts_and_ends_keeps_the_copies_in_flight_within_the_room() {
        // Three copies of 5 MiB on a root with 12 MiB free beyond the reserve: for every order
        // of their start and end events (each starts before it ends), the bytes in flight never
        // exceed the room, and every copy refused could not have fit.
        let root = Path::new("/r");
        let ids = ["x", "y", "z"];
        let events: Vec<(usize, bool)> = (0..3).flat_map(|i| [(i, true), (i, false)]).collect();
        let mut orders = 0;
        permute(&mut events.clone(), 0, &mut |order| {
            let valid = (0..3)
                .all(|i| order.iter().position(|e| *e == (i, true)) < order.iter().position(|e| *e == (i, false)));
            if !valid {
                return;
            }
            orders += 1;
            let mut ledger = CopyLedger::default();
            for &(i, is_start) in order {
                if is_start {
                    let before = ledger.in_flight_bytes(root, "");
                    match ledger.start(ids[i], root, 5 * MIB, 12 * MIB) {
                        Ok(()) => assert!(before + 5 * MIB <= 12 * MIB),
                        Err(taken) => assert!(taken + 5 * MIB > 12 * MIB),
                    }
                } else {
                    ledger.end(ids[i]);
                }
                assert!(ledger.in_flight_bytes(root, "") <= 12 * MIB, "{order:?}");
            }
            assert_eq!(ledger.in_flight_bytes(root, ""), 0, "every copy ended");
        });
        assert_eq!(orders, 90, "6! / 2^3 orders where each copy starts before it ends");
    }

    fn permute(items: &mut Vec<(usize, bool)>, k: usize, visit: &mut impl FnMut(&[(usize, bool)])) {
        if k == items.len() {
            visit(items);
            return;
        }
        for i in k..items.len() {
            items.swap(k, i);
            permute(items, k + 1, visit);
            items.swap(k, i);
        }
    }

    #[test]
    fn roots_are_counted_apart_and_a_retry_is_counted_once() {
        let (a, b) = (Path::new("/disk-a"), Path::new("/disk-b"));
        let mut ledger = CopyLedger::default();
        assert!(ledger.start("s1", a, 8 * MIB, 10 * MIB).is_ok());
        assert!(ledger.start("s2", b, 8 * MIB, 10 * MIB).is_ok(), "another disk's copy does not count");
        assert!(ledger.start("s1", a, 8 * MIB, 10 * MIB).is_ok(), "the same copy again is not two");
        assert_eq!(ledger.in_flight_bytes(a, ""), 8 * MIB);
    }

    #[test]
    fn kept_byte_copies_are_counted_per_root_until_forgotten() {
        let (a, b) = (Path::new("/disk-a"), Path::new("/disk-b"));
        let mut ledger = CopyLedger::default();
        ledger.keep("u1", a, 3 * MIB);
        ledger.keep("u2", a, 4 * MIB);
        ledger.keep("u3", b, 5 * MIB);
        ledger.keep("u1", a, 3 * MIB);
        assert_eq!(ledger.kept_bytes(a), 7 * MIB);
        ledger.forget("u2");
        assert_eq!(ledger.kept_bytes(a), 3 * MIB);
        assert_eq!(ledger.kept_bytes(b), 5 * MIB);
    }

    #[test]
    fn the_refusal_says_what_is_needed_what_is_free_and_what_copies_take() {
        let why = NoRoomForCopy {
            what: "the restore of snapshot \"s\"".into(),
            pool: "legacy".into(),
            root: PathBuf::from("/var/hpvolumes"),
            node: "worker-1".into(),
            needed: 30 * MIB,
            free_beyond_reserve: 20 * MIB,
            reserve: 16 * MIB,
            in_flight: 6 * MIB,
        }
        .to_string();
        assert!(
            why.contains("30 MiB") && why.contains("20 MiB") && why.contains("16 MiB") && why.contains("6 MiB"),
            "{why}"
        );
        assert!(why.contains("worker-1") && why.contains("waits"), "{why}");
    }
}

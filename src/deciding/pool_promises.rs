//! Requests accounting for a `shared` pool that several nodes provision in at once. Pure.
//!
//! A node's own ledger ([`crate::deciding::reservations`]) makes the claims one process plans
//! see each other. Different nodes act for different claims of one shared pool (each claim's
//! acting node is ranked by its uid), so two nodes can each plan a volume before either sees the
//! other's: each fits on its own, together they over-promise the pool. The model in
//! `pool_promises/model.rs` finds exactly that in the per-node protocol.
//!
//! The protocol here records the promise where every node reads it and makes the decision a
//! compare-and-swap on that record:
//!
//! 1. read the pool's record of promises (volumes being made) and its version;
//! 2. list the pool's PersistentVolumes with a consistent read (not from a watch cache, which
//!    lags);
//! 3. [`promised`]: what the listed volumes hold plus the record's promises of volumes the list
//!    does not show yet; the plan checks the new volume fits beside that (as for one node); if it
//!    does, write [`with_promise`], on condition that the record's version is still the one read
//!    (a patch carrying that resourceVersion). A conflict means another node promised or settled
//!    meanwhile: start again at 1;
//! 4. create the volume; then [`settle`]: drop the promise (whether the create succeeded, in
//!    which case the PV now counts from the list, or failed, in which case nothing is promised).
//!
//! Every successful write of the record is ordered, and every decision reads the volumes after
//! reading the record it writes over, so a decision sees every volume whose promise was settled
//! before its write and every promise not settled yet: no two decisions can both take the last
//! room. A node that dies between 3 and 4 leaves its promise until it expires
//! ([`PROMISE_TTL`]): the pool under-promises for that long, never over-promises (unless a
//! create takes longer than the TTL, which is far longer than any create).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::deciding::topology::PoolKey;

/// How long a promise counts without being settled: far longer than creating a directory and a
/// PV takes; it bounds how long a node that died mid-way holds room it never used.
pub const PROMISE_TTL_SECS: u64 = 300;

/// The same as a duration, for messages and docs.
pub const PROMISE_TTL: std::time::Duration = std::time::Duration::from_secs(PROMISE_TTL_SECS);

/// One volume being made: its size and since when (seconds since the Unix epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Promise {
    pub bytes: u64,
    pub since: u64,
}

/// The pool's volumes being made, by PV name, as every node reads and writes them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PoolPromises {
    pub by_pv: BTreeMap<String, Promise>,
}

/// What is promised in the pool besides volume `pv`: the listed volumes' capacities (`listed`:
/// PV name to bytes, from a consistent list) and the record's promises of volumes the list does
/// not show yet, unexpired. The claim's own PV and promise (an earlier attempt) do not count.
pub fn promised(listed: &BTreeMap<String, u64>, record: &PoolPromises, pv: &str, now: u64) -> u64 {
    let from_list = listed.iter().filter(|(name, _)| name.as_str() != pv).map(|(_, bytes)| *bytes);
    let pending = pending(listed, record, pv, now).map(|(_, p)| p.bytes);
    from_list.chain(pending).fold(0u64, u64::saturating_add)
}

/// The record to write once the plan decided to make `pv` with `bytes` (the plan checked that it
/// fits beside [`promised`]): its promise added; the promises of listed volumes (they count from
/// the list now) and expired ones dropped, so the record stays as small as the work in flight.
pub fn with_promise(
    listed: &BTreeMap<String, u64>,
    record: &PoolPromises,
    pv: &str,
    bytes: u64,
    now: u64,
) -> PoolPromises {
    let mut by_pv: BTreeMap<String, Promise> = pending(listed, record, pv, now).map(|(n, p)| (n.clone(), *p)).collect();
    by_pv.insert(pv.to_owned(), Promise { bytes, since: now });
    PoolPromises { by_pv }
}

/// The record once `pv`'s create returned, made or failed: its promise dropped.
pub fn settle(record: &PoolPromises, pv: &str) -> PoolPromises {
    let mut by_pv = record.by_pv.clone();
    by_pv.remove(pv);
    PoolPromises { by_pv }
}

fn pending<'a>(
    listed: &'a BTreeMap<String, u64>,
    record: &'a PoolPromises,
    pv: &'a str,
    now: u64,
) -> impl Iterator<Item = (&'a String, &'a Promise)> {
    record.by_pv.iter().filter(move |(name, p)| !listed.contains_key(*name) && name.as_str() != pv && !expired(p, now))
}

fn expired(promise: &Promise, now: u64) -> bool {
    now.saturating_sub(promise.since) >= PROMISE_TTL_SECS
}

/// The Lease that holds a pool's record, in the provisioners' namespace: one per provisioner name
/// and pool (name and root, as nodes advertise pools), a DNS label whatever the names.
pub fn lease_name(provisioner: &str, pool: &PoolKey) -> String {
    let digest = Sha256::digest(format!("{provisioner}\0{}\0{}", pool.name, pool.root).as_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("hpp-promises-{hex}")
}

/// The annotation of that Lease holding the record, as JSON: `{"pvc-...": {"bytes": N, "since": S}}`.
pub const RECORD_ANNOTATION: &str = "hostpath-provisioner.kubevirt.io/promises";

/// Reads the record from the annotation's value (`None`: no record yet, nothing promised).
pub fn decode(value: Option<&str>) -> Result<PoolPromises, String> {
    let Some(value) = value else { return Ok(PoolPromises::default()) };
    let by_pv: BTreeMap<String, Promise> = serde_json::from_str(value).map_err(|e| e.to_string())?;
    Ok(PoolPromises { by_pv })
}

/// The annotation's value for `record`.
pub fn encode(record: &PoolPromises) -> String {
    serde_json::to_string(&record.by_pv).unwrap_or_else(|_| String::from("{}"))
}

#[cfg(test)]
mod model;

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn listed(volumes: &[(&str, u64)]) -> BTreeMap<String, u64> {
        volumes.iter().map(|(n, b)| (n.to_string(), *b)).collect()
    }

    fn record(promises: &[(&str, u64, u64)]) -> PoolPromises {
        let by_pv = promises.iter().map(|(n, bytes, since)| (n.to_string(), Promise { bytes: *bytes, since: *since }));
        PoolPromises { by_pv: by_pv.collect() }
    }

    #[test]
    fn listed_volumes_and_unsettled_promises_are_promised_and_a_new_promise_joins_them() {
        let (list, held) = (listed(&[("pvc-a", 4 * GIB)]), record(&[("pvc-b", 3 * GIB, 100)]));
        assert_eq!(promised(&list, &held, "pvc-c", 100), 7 * GIB);
        assert_eq!(
            with_promise(&list, &held, "pvc-c", GIB, 100),
            record(&[("pvc-b", 3 * GIB, 100), ("pvc-c", GIB, 100)])
        );
    }

    #[test]
    fn a_promise_whose_volume_is_listed_counts_once_and_leaves_the_record() {
        let (list, held) = (listed(&[("pvc-a", 4 * GIB)]), record(&[("pvc-a", 4 * GIB, 100)]));
        assert_eq!(promised(&list, &held, "pvc-c", 100), 4 * GIB);
        assert_eq!(with_promise(&list, &held, "pvc-c", 6 * GIB, 100), record(&[("pvc-c", 6 * GIB, 100)]));
    }

    #[test]
    fn an_expired_promise_no_longer_holds_room_and_leaves_the_record() {
        let old = record(&[("pvc-dead", 8 * GIB, 100)]);
        assert_eq!(promised(&listed(&[]), &old, "pvc-c", 100 + PROMISE_TTL_SECS - 1), 8 * GIB);
        assert_eq!(promised(&listed(&[]), &old, "pvc-c", 100 + PROMISE_TTL_SECS), 0);
        let later = 100 + PROMISE_TTL_SECS;
        assert_eq!(with_promise(&listed(&[]), &old, "pvc-c", GIB, later), record(&[("pvc-c", GIB, later)]));
    }

    #[test]
    fn the_claims_own_volume_and_promise_are_not_counted_against_it_on_a_retry() {
        let (list, held) = (listed(&[("pvc-c", 4 * GIB)]), record(&[("pvc-c", 4 * GIB, 1)]));
        assert_eq!(promised(&list, &held, "pvc-c", 2), 0);
    }

    #[test]
    fn settling_drops_only_that_promise() {
        let both = record(&[("pvc-a", GIB, 1), ("pvc-b", GIB, 1)]);
        assert_eq!(settle(&both, "pvc-a"), record(&[("pvc-b", GIB, 1)]));
        assert_eq!(settle(&both, "pvc-x"), both);
    }

    #[test]
    fn the_record_round_trips_through_its_annotation_and_a_bad_one_is_an_error() {
        let held = record(&[("pvc-a", GIB, 7)]);
        assert_eq!(encode(&held), r#"{"pvc-a":{"bytes":1073741824,"since":7}}"#);
        assert_eq!(decode(Some(&encode(&held))), Ok(held));
        assert_eq!(decode(None), Ok(PoolPromises::default()));
        assert!(decode(Some("not json")).is_err());
    }

    #[test]
    fn each_provisioner_and_pool_has_its_own_lease_a_dns_label() {
        let nfs = PoolKey::new("nfs", "/mnt/nfs");
        let name = lease_name("kubevirt.io/hostpath-provisioner", &nfs);
        assert!(crate::deciding::layout::is_dns_label(&name), "{name}");
        assert_ne!(name, lease_name("other.example/provisioner", &nfs));
        assert_ne!(name, lease_name("kubevirt.io/hostpath-provisioner", &PoolKey::new("nfs", "/mnt/other")));
        assert_eq!(name, lease_name("kubevirt.io/hostpath-provisioner", &nfs), "stable");
    }
}

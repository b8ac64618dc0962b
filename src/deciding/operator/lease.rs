//! Which operator replica acts: the holder of one Lease (coordination.k8s.io/v1) in the
//! operator's namespace. The holder renews it every few seconds; another replica takes it over
//! only once it has gone unrenewed for its whole duration, so at most one replica acts at a
//! time as long as clocks agree within that duration (the same bargain as Kubernetes' own
//! controller managers).

use jiff::{SignedDuration, Timestamp};

/// The Lease's fields that matter to the decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    pub holder: Option<String>,
    pub renewed: Option<Timestamp>,
    pub duration_seconds: Option<i32>,
}

/// What a replica does with the Lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseDecision {
    /// It holds the Lease: renew it and act.
    Renew,
    /// Nobody holds it (none yet, released, or expired): take it, then act.
    TakeOver,
    /// Another replica holds it: do nothing until it expires.
    Wait,
}

/// The decision for replica `me` given the Lease as read (None: not created yet) at `now`.
/// A Lease without a duration or renew time counts as expired: a holder that never wrote them
/// cannot be told apart from a dead one.
pub fn may_act(lease: Option<&LeaseView>, now: Timestamp, me: &str) -> LeaseDecision {
    let Some(lease) = lease else { return LeaseDecision::TakeOver };
    match lease.holder.as_deref().filter(|h| !h.is_empty()) {
        None => LeaseDecision::TakeOver,
        Some(holder) if holder == me => LeaseDecision::Renew,
        Some(_) => {
            let expired = match (lease.renewed, lease.duration_seconds) {
                (Some(renewed), Some(seconds)) if seconds > 0 => {
                    renewed.saturating_add(SignedDuration::from_secs(i64::from(seconds))).is_ok_and(|end| end <= now)
                }
                _ => true,
            };
            if expired { LeaseDecision::TakeOver } else { LeaseDecision::Wait }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).expect("timestamp")
    }

    fn held_by(holder: &str, renewed: i64) -> LeaseView {
        LeaseView { holder: Some(holder.into()), renewed: Some(at(renewed)), duration_seconds: Some(15) }
    }

    #[test]
    fn no_lease_yet_means_take_it() {
        assert_eq!(may_act(None, at(0), "a"), LeaseDecision::TakeOver);
    }

    #[test]
    fn the_holder_renews_even_late() {
        assert_eq!(may_act(Some(&held_by("a", 0)), at(5), "a"), LeaseDecision::Renew);
        assert_eq!(may_act(Some(&held_by("a", 0)), at(60), "a"), LeaseDecision::Renew);
    }

    #[test]
    fn another_replica_waits_while_the_lease_is_fresh_and_takes_it_once_expired() {
        let lease = held_by("a", 0);
        assert_eq!(may_act(Some(&lease), at(14), "b"), LeaseDecision::Wait);
        assert_eq!(may_act(Some(&lease), at(15), "b"), LeaseDecision::TakeOver);
        assert_eq!(may_act(Some(&lease), at(100), "b"), LeaseDecision::TakeOver);
    }

    #[test]
    fn a_released_or_incomplete_lease_is_free() {
        let released = LeaseView { holder: Some(String::new()), ..held_by("a", 0) };
        assert_eq!(may_act(Some(&released), at(1), "b"), LeaseDecision::TakeOver);
        let no_duration = LeaseView { duration_seconds: None, ..held_by("a", 0) };
        assert_eq!(may_act(Some(&no_duration), at(1), "b"), LeaseDecision::TakeOver);
        let no_renewal = LeaseView { renewed: None, ..held_by("a", 0) };
        assert_eq!(may_act(Some(&no_renewal), at(1), "b"), LeaseDecision::TakeOver);
    }

    #[test]
    fn a_clock_behind_the_holders_waits() {
        assert_eq!(may_act(Some(&held_by("a", 10)), at(0), "b"), LeaseDecision::Wait);
    }
}

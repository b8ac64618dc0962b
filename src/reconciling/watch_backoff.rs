//! Backoff for the watches across an API outage.
//!
//! kube-runtime's stream backoff resets on every successful item, and a watcher retrying a
//! failed list emits `Init` first, which counts as one: the delay never grows and every node polls
//! the API server about once a second for as long as it is down. Here the delay is reset only once
//! the watch really works again (its initial list completed, or an object arrived).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher;

/// First retry delay.
pub const FIRST_DELAY: Duration = Duration::from_millis(800);
/// Longest delay between attempts during an outage (jitter may add up to as much again).
pub const MAX_DELAY: Duration = Duration::from_secs(30);

/// Whether a watch is working: set by what the watch delivers, read by the backoff.
#[derive(Clone, Default)]
pub struct WatchHealth(Arc<AtomicBool>);

impl WatchHealth {
    /// Records what the watch just delivered.
    pub fn observe<K>(&self, item: &Result<watcher::Event<K>, watcher::Error>) {
        match item {
            // A retry after a failure starts with these: not yet a sign of health.
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Ok(_) => self.0.store(true, Ordering::Relaxed),
            Err(_) => self.0.store(false, Ordering::Relaxed),
        }
    }

    fn is_healthy(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Exponential backoff with jitter, capped at [`MAX_DELAY`], reset only while the watch works.
pub struct OutageBackoff {
    health: WatchHealth,
    current: ExponentialBackoff,
}

impl OutageBackoff {
    /// A backoff that consults `health` before each reset.
    pub fn new(health: WatchHealth) -> OutageBackoff {
        OutageBackoff { health, current: builder().build() }
    }
}

fn builder() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(FIRST_DELAY)
        .with_max_delay(MAX_DELAY)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
}

impl Iterator for OutageBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.current.next().unwrap_or(MAX_DELAY))
    }
}

impl Backoff for OutageBackoff {
    fn reset(&mut self) {
        if self.health.is_healthy() {
            self.current = builder().build();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Item = Result<watcher::Event<()>, watcher::Error>;

    fn failure() -> Item {
        Err(watcher::Error::NoResourceVersion)
    }

    /// What the stream backoff does with an item: observe, then reset on success or step on error.
    fn deliver(health: &WatchHealth, backoff: &mut OutageBackoff, item: Item) -> Option<Duration> {
        health.observe(&item);
        match item {
            Ok(_) => {
                backoff.reset();
                None
            }
            Err(_) => backoff.next(),
        }
    }

    #[test]
    fn an_outage_grows_the_delay_to_the_cap_although_each_retry_starts_with_init() {
        let health = WatchHealth::default();
        let mut backoff = OutageBackoff::new(health.clone());
        let mut delays = Vec::new();
        for _ in 0..12 {
            // Each retry: Init (a success to the stream backoff), then the list fails.
            deliver(&health, &mut backoff, Ok(watcher::Event::Init));
            delays.extend(deliver(&health, &mut backoff, failure()));
        }
        assert!(delays[0] < Duration::from_secs(2), "{delays:?}");
        assert!(delays[6] >= Duration::from_secs(20), "grows across the outage: {delays:?}");
        assert!(delays.iter().all(|d| *d <= MAX_DELAY * 2), "bounded: {delays:?}");
        assert!(delays[11] >= MAX_DELAY, "reaches the cap: {delays:?}");
    }

    #[test]
    fn a_working_watch_starts_over_after_the_next_failure() {
        let health = WatchHealth::default();
        let mut backoff = OutageBackoff::new(health.clone());
        for _ in 0..8 {
            deliver(&health, &mut backoff, failure());
        }
        deliver(&health, &mut backoff, Ok(watcher::Event::Init));
        deliver(&health, &mut backoff, Ok(watcher::Event::InitDone));
        let after = deliver(&health, &mut backoff, failure()).unwrap();
        assert!(after < Duration::from_secs(2), "{after:?}");
    }
}

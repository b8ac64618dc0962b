//! The reconcilers (fetch, decide, act) and the wiring that feeds them: watches, stores, the
//! shared context, background tasks.

pub mod affinity_duplicates;
pub mod block_volumes;
pub mod claim_actions;
pub mod claim_facts;
pub mod claim_release;
pub mod claims;
pub mod clones;
pub mod context;
pub mod controller;
pub mod membership;
pub mod orphans;
pub mod pattern_records;
pub mod pool_promises;
pub mod provisioning;
pub mod published_capacity;
pub mod reaping;
pub mod resize;
pub mod settling;
pub mod snapshot_copies;
pub mod snapshots;
pub mod staging_memory;
pub mod stranded;
pub mod upkeep;
pub mod volumes;
pub mod watch_backoff;
pub mod watches;

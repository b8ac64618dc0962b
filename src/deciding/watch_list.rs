//! Whether the watches list their initial state as a stream (docs/architecture.md, memory).
//!
//! A paginated list hands the provisioner hundreds of whole objects at once, and with 100,000
//! claims in a cluster the pages, not the few claims kept, set the process's peak memory. A
//! streaming list (the WatchList feature: `sendInitialEvents` on a watch) delivers the same state
//! one object at a time, each forgotten or kept as it passes. kube-apiserver serves it by default
//! from Kubernetes 1.34 (beta, on); 1.32 had it on and 1.33 off again, so older servers get
//! paginated lists of small pages.

/// Objects per page when the server cannot stream the initial list.
pub const PAGE_SIZE: u32 = 100;

/// The shortest server-side length of a watch, seconds; each node's lies in
/// `[MIN_WATCH_SECONDS, 2 * MIN_WATCH_SECONDS)`, as client-go's informers pick theirs.
pub const MIN_WATCH_SECONDS: u32 = 300;

/// How long the API server keeps each watch of `node` open before the node re-opens it (from
/// where it left off: no list). A watch is re-opened when it ends, and these re-opens are the
/// only requests a node makes at rest; kube-rs's fixed 290 s would have every node of a
/// DaemonSet started at once re-open its watches in the same second, every 290 s, for good. A
/// length of its own per node, spread over five minutes, spreads those waves out after the
/// first one. The same node always gets the same length (no state, no randomness to test).
pub fn watch_seconds(node: &str) -> u32 {
    // FNV-1a: stable across builds and platforms, unlike the standard library's hasher.
    let hash = node.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    MIN_WATCH_SECONDS + (hash % u64::from(MIN_WATCH_SECONDS)) as u32
}

/// Whether kube-apiserver `major.minor` (as `/version` reports them; distributions append `+`
/// to the minor) serves streaming lists by default.
pub fn streaming_lists_by_default(major: &str, minor: &str) -> bool {
    let number = |s: &str| s.trim_end_matches('+').parse::<u32>().ok();
    match (number(major), number(minor)) {
        (Some(major), Some(minor)) => major > 1 || (major == 1 && minor >= 34),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_watches_for_a_length_of_its_own_between_five_and_ten_minutes() {
        let lengths: Vec<u32> = (0..1000).map(|i| watch_seconds(&format!("node-{i:04}"))).collect();
        assert!(lengths.iter().all(|s| (MIN_WATCH_SECONDS..2 * MIN_WATCH_SECONDS).contains(s)));
        // Spread over the whole range: every minute of it has nodes, none most of them.
        let mut per_minute = [0usize; 5];
        for s in &lengths {
            per_minute[((s - MIN_WATCH_SECONDS) / 60) as usize] += 1;
        }
        assert!(per_minute.iter().all(|n| (100..=300).contains(n)), "{per_minute:?}");
        assert_eq!(watch_seconds("node-0001"), watch_seconds("node-0001"), "stable for a node");
        assert_ne!(watch_seconds("node-0001"), watch_seconds("node-0002"));
    }

    #[test]
    fn streaming_from_1_34_and_paginated_before_or_when_unknown() {
        assert!(streaming_lists_by_default("1", "36"));
        assert!(streaming_lists_by_default("1", "34+"));
        assert!(streaming_lists_by_default("2", "0"));
        assert!(!streaming_lists_by_default("1", "33"));
        assert!(!streaming_lists_by_default("1", "32"), "1.32 had it on, but 1.33 turned it off again");
        assert!(!streaming_lists_by_default("1", ""));
        assert!(!streaming_lists_by_default("", "36"));
    }
}

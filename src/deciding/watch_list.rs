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

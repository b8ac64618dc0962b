//! How the process keeps its memory small on a node: few threads, few malloc arenas, and freed
//! heap given back to the kernel once a burst is over.
//!
//! The work is I/O-bound (a handful of watches, requests at the API server's pace, filesystem
//! calls on blocking threads), so two runtime threads carry it on any node; the runtime's default
//! of one per core would start 128 on a large node, and glibc one malloc arena per thread up to
//! eight per core, each keeping the memory its thread freed. After a burst (a thousand claims
//! placed at once, a big initial list) glibc keeps freed memory inside its heap, where the
//! kernel still counts it against the pod; `malloc_trim` hands the free pages back. Every image
//! (the Dockerfile's and `make image`'s, hack/build-static.sh) links glibc statically; on other C
//! libraries, which have none of these calls, only the thread count applies.

use std::time::Duration;

/// Runtime worker threads unless `TOKIO_WORKER_THREADS` says otherwise.
pub const WORKER_THREADS: usize = 2;
/// glibc malloc arenas (its `MALLOC_ARENA_MAX`, unless that is set).
const ARENAS: i32 = 2;
/// How often the heap is looked at for memory freed since the last look.
pub const TRIM_CHECK: Duration = Duration::from_secs(10);
/// Freed since the peak in use: below this, nothing is worth a trim.
pub const TRIM_AFTER_FREED_BYTES: u64 = 1 << 20;

/// The runtime's worker threads: `TOKIO_WORKER_THREADS` when it is a positive number, else
/// [`WORKER_THREADS`].
pub fn worker_threads(env: Option<&str>) -> usize {
    env.and_then(|v| v.trim().parse::<usize>().ok()).filter(|n| *n > 0).unwrap_or(WORKER_THREADS)
}

/// Whether to trim now: in use has fallen at least [`TRIM_AFTER_FREED_BYTES`] below its peak
/// since the last trim (a burst ended). At rest in use stays level and nothing is done.
pub fn trim_due(peak_in_use: u64, in_use: u64) -> bool {
    peak_in_use.saturating_sub(in_use) >= TRIM_AFTER_FREED_BYTES
}

/// Caps glibc's malloc arenas at [`ARENAS`] unless `MALLOC_ARENA_MAX` is set. Call before the
/// runtime starts its threads.
pub fn limit_arenas() {
    #[cfg(target_env = "gnu")]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets an allocator parameter; it is called before other threads exist.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        }
    }
}

/// Bytes the program has in use on the heap, where the C library says (glibc).
fn in_use_bytes() -> Option<u64> {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 reads the allocator's statistics; it has no preconditions.
        let info = unsafe { libc::mallinfo2() };
        Some(info.uordblks as u64 + info.hblkhd as u64)
    }
    #[cfg(not(target_env = "gnu"))]
    None
}

fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim releases free pages of the heap; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Every [`TRIM_CHECK`], gives the heap freed since the last peak back to the kernel
/// ([`trim_due`]). Returns at once where the C library offers no statistics.
pub async fn return_freed_memory() {
    let Some(mut peak) = in_use_bytes() else { return };
    let mut tick = tokio::time::interval(TRIM_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(now) = in_use_bytes() else { return };
        peak = peak.max(now);
        if trim_due(peak, now) {
            trim();
            tracing::debug!(freed_since_peak = peak - now, in_use = now, "returned freed heap to the kernel");
            peak = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_runtime_threads_unless_told_otherwise() {
        assert_eq!(worker_threads(None), WORKER_THREADS);
        assert_eq!(worker_threads(Some("8")), 8);
        assert_eq!(worker_threads(Some(" 4 ")), 4);
        for unusable in ["0", "", "many", "-1"] {
            assert_eq!(worker_threads(Some(unusable)), WORKER_THREADS, "{unusable:?}");
        }
    }

    #[test]
    fn a_trim_follows_a_burst_not_a_level_heap() {
        let mib = 1 << 20;
        // Level or growing: nothing to give back.
        assert!(!trim_due(10 * mib, 10 * mib));
        assert!(!trim_due(10 * mib, 11 * mib));
        // A little freed: not worth the walk over the heap.
        assert!(!trim_due(10 * mib, 10 * mib - TRIM_AFTER_FREED_BYTES + 1));
        // A burst's worth freed.
        assert!(trim_due(10 * mib, 10 * mib - TRIM_AFTER_FREED_BYTES));
        assert!(trim_due(40 * mib, 12 * mib));
    }

    #[cfg(target_env = "gnu")]
    #[test]
    fn the_heap_statistics_see_an_allocation() {
        // 64 MiB in use, of which other tests running meanwhile could not free half.
        let before = in_use_bytes().unwrap();
        let block = std::hint::black_box(vec![1u8; 64 << 20]);
        let during = in_use_bytes().unwrap();
        assert!(during >= before + (32 << 20), "{before} -> {during}");
        drop(block);
    }
}

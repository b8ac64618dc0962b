//! Where a provisioner's peak goes: its resident set sampled every 50 ms during a scenario, and
//! the largest sample's split into anonymous memory (heap and stacks, RssAnon) and pages mapped
//! from files (the binary's code, RssFile). VmHWM gives the peak but not its parts; a sample can
//! miss a spike of under 50 ms, so the sampled peak may sit a little under VmHWM.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::procfs::{ProcSample, mib, sample};

const EVERY: Duration = Duration::from_millis(50);

/// Samples running in the background until [`PeakSampler::finish`].
pub struct PeakSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<ProcSample>>,
}

impl PeakSampler {
    /// Starts sampling `pids`.
    pub fn start(pids: Vec<u32>) -> PeakSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut peaks = vec![ProcSample::default(); pids.len()];
                while !stop.load(Ordering::Relaxed) {
                    for (pid, peak) in pids.iter().zip(peaks.iter_mut()) {
                        if let Ok(now) = sample(*pid)
                            && now.rss_kib > peak.rss_kib
                        {
                            *peak = now;
                        }
                    }
                    tokio::time::sleep(EVERY).await;
                }
                peaks
            }
        });
        PeakSampler { stop, task }
    }

    /// Stops and returns, per process, its sample with the largest resident set.
    pub async fn finish(self) -> Vec<ProcSample> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// "X MiB: Y heap and stacks + Z mapped from the binary" for the largest of `peaks`, and the
/// bound on any machine: how much of the binary a kernel maps around each fault varies (this
/// part moved by MiBs between machines), the heap does not, and no kernel maps more of it than
/// its whole mappings.
pub fn split_line(peaks: &[ProcSample]) -> String {
    match peaks.iter().max_by_key(|s| s.rss_kib) {
        Some(peak) if peak.rss_kib > 0 => format!(
            "largest sampled peak {:.1} MiB = {:.1} heap and stacks (RssAnon) + {:.1} mapped from the binary \
             (RssFile); with all of the binary resident ({:.1} MiB mapped): {:.1} MiB",
            mib(peak.rss_kib),
            mib(peak.rss_anon_kib),
            mib(peak.rss_file_kib),
            mib(peak.binary_mapped_kib),
            mib(worst_case_kib(peaks))
        ),
        _ => "no sample".to_string(),
    }
}

/// The largest heap of `peaks` plus the largest mapping of the binary: the peak no kernel can
/// exceed with the same heap.
pub fn worst_case_kib(peaks: &[ProcSample]) -> u64 {
    let heap = peaks.iter().map(|s| s.rss_anon_kib).max().unwrap_or(0);
    let binary = peaks.iter().map(|s| s.binary_mapped_kib.max(s.rss_file_kib)).max().unwrap_or(0);
    heap + binary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_largest_sample_of_this_process_is_split_into_its_parts() {
        let sampler = PeakSampler::start(vec![std::process::id()]);
        // 32 MiB touched while the sampler runs.
        let block = std::hint::black_box(vec![1u8; 32 << 20]);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let peaks = sampler.finish().await;
        drop(block);
        let peak = peaks[0];
        assert!(peak.rss_anon_kib >= 32 << 10, "{peak:?}");
        assert!(peak.rss_file_kib > 0, "{peak:?}");
        assert!(peak.rss_kib >= peak.rss_anon_kib, "{peak:?}");
        assert!(split_line(&peaks).contains("heap and stacks"));
        assert!(peak.binary_mapped_kib >= peak.rss_file_kib / 2, "the test binary is mapped: {peak:?}");
        assert!(worst_case_kib(&peaks) >= peak.rss_anon_kib + peak.binary_mapped_kib, "{peak:?}");
    }
}

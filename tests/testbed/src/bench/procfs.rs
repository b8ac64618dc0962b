//! Memory and CPU of a process, from /proc (Linux).

use anyhow::{Context, Result};

/// One reading of a process's footprint.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcSample {
    /// Resident set now (VmRSS), KiB.
    pub rss_kib: u64,
    /// Peak resident set since start (VmHWM), KiB.
    pub hwm_kib: u64,
    /// User + system CPU time since start, seconds (all threads).
    pub cpu_secs: f64,
    /// Of the resident set: anonymous memory (heap, stacks; RssAnon) and pages mapped from files
    /// (the binary's code and libraries; RssFile), KiB.
    pub rss_anon_kib: u64,
    pub rss_file_kib: u64,
}

pub fn sample(pid: u32) -> Result<ProcSample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let stat =
        std::fs::read_to_string(format!("/proc/{pid}/stat")).with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start with field 3, `state`;
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, rest)| rest).context("malformed /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> f64 { fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) };
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Ok(ProcSample {
        rss_kib: kib("VmRSS:"),
        hwm_kib: kib("VmHWM:"),
        cpu_secs: (ticks(11) + ticks(12)) / per_second,
        rss_anon_kib: kib("RssAnon:"),
        rss_file_kib: kib("RssFile:"),
    })
}

/// Resets the peak (VmHWM) of a process to its RSS now (`5` to /proc/<pid>/clear_refs, Linux
/// 4.0+), so that a later VmHWM is the peak since this call.
pub fn reset_peak(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").with_context(|| format!("writing /proc/{pid}/clear_refs"))
}

/// Busy and total CPU time of the whole machine so far, seconds summed over CPUs (first line of
/// /proc/stat; idle and iowait count as not busy). Includes work that is not the bench's.
pub fn machine_cpu() -> Result<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").context("reading /proc/stat")?;
    let line = stat.lines().next().context("empty /proc/stat")?;
    let ticks: Vec<f64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    // SAFETY: sysconf has no preconditions.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let total: f64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3).copied().unwrap_or(0.0) + ticks.get(4).copied().unwrap_or(0.0);
    Ok(((total - idle) / per_second, total / per_second))
}

/// Online CPUs.
pub fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_this_process() {
        let s = super::sample(std::process::id()).unwrap();
        assert!(s.rss_kib > 0 && s.hwm_kib >= s.rss_kib, "{s:?}");
    }

    #[test]
    fn the_peak_can_be_reset() {
        let pid = std::process::id();
        let block = vec![1u8; 64 << 20];
        assert!(super::sample(pid).unwrap().hwm_kib >= 64 << 10, "{}", block.len());
        drop(std::hint::black_box(block));
        super::reset_peak(pid).unwrap();
        let after = super::sample(pid).unwrap();
        assert!(after.hwm_kib < after.rss_kib + (32 << 10), "{after:?}");
    }
}

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
    /// The size of the process's mappings of its own executable, KiB: what `rss_file_kib` of a
    /// static binary reaches when every page of it is resident, whatever the machine's kernel
    /// maps around a fault (fault-around, large folios, huge pages for text).
    pub binary_mapped_kib: u64,
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
        binary_mapped_kib: binary_mapped_kib(pid).unwrap_or(0),
    })
}

/// The size of `pid`'s mappings of its executable (/proc/<pid>/maps lines naming
/// /proc/<pid>/exe's target), KiB.
fn binary_mapped_kib(pid: u32) -> Result<u64> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).with_context(|| format!("reading /proc/{pid}/exe"))?;
    let maps =
        std::fs::read_to_string(format!("/proc/{pid}/maps")).with_context(|| format!("reading /proc/{pid}/maps"))?;
    Ok(mapped_kib_of(&maps, &exe.to_string_lossy()))
}

/// The summed size of the lines of a maps file whose path is `path`, KiB.
fn mapped_kib_of(maps: &str, path: &str) -> u64 {
    maps.lines()
        .filter_map(|line| {
            // address perms offset dev inode path: the path is the sixth field and may hold spaces.
            let mut fields = line.splitn(6, ' ');
            let range = fields.next()?;
            let named = fields.nth(4)?.trim_start();
            (named == path).then_some(())?;
            let (start, end) = range.split_once('-')?;
            let size = u64::from_str_radix(end, 16).ok()?.checked_sub(u64::from_str_radix(start, 16).ok()?)?;
            Some(size / 1024)
        })
        .sum()
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
    fn the_binary_s_mappings_are_summed_and_nothing_else() {
        let maps = "\
5555a000-5555b000 r--p 00000000 fd:00 42                         /usr/bin/hpp dir/x
5555b000-5555e000 r-xp 00001000 fd:00 42                         /usr/bin/hpp dir/x
5555e000-5555f000 rw-p 00000000 00:00 0                          [heap]
7ffd0000-7ffd2000 rw-p 00000000 00:00 0                          [stack]
7f000000-7f001000 r--p 00000000 fd:00 43                         /usr/bin/hpp dir/x (deleted)
7f001000-7f002000 rw-p 00000000 00:00 0 ";
        assert_eq!(super::mapped_kib_of(maps, "/usr/bin/hpp dir/x"), 16);
    }

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

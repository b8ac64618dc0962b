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
    Ok(ProcSample { rss_kib: kib("VmRSS:"), hwm_kib: kib("VmHWM:"), cpu_secs: (ticks(11) + ticks(12)) / per_second })
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
}

//! The standard `process_*` metrics (the names every Prometheus client library exports and every
//! dashboard knows), read from `/proc/self` at each scrape. Written here rather than taken from a
//! crate: the crates that do this target the `prometheus` crate's registry, not prometheus-client,
//! and the whole job is four small files in `/proc`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Clock ticks per second of the times in `/proc/<pid>/stat`: the kernel's USER_HZ, 100 on every
/// architecture Linux exposes to user space (Prometheus's Go procfs library assumes it too).
const USER_HZ: f64 = 100.0;

/// Collects the process metrics on each scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

/// One reading of the process's figures; `None` where `/proc` did not say.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessFigures {
    /// User plus system CPU seconds.
    pub cpu_seconds: Option<f64>,
    /// Resident set size in bytes.
    pub resident_bytes: Option<u64>,
    /// Virtual memory size in bytes.
    pub virtual_bytes: Option<u64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit of open file descriptors.
    pub max_fds: Option<u64>,
    /// Start time, seconds since the Unix epoch.
    pub start_time_seconds: Option<f64>,
    /// Threads.
    pub threads: Option<u64>,
}

impl ProcessFigures {
    /// Reads this process's figures from `/proc`.
    pub fn read() -> Self {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let stat = stat.as_deref().and_then(parse_stat);
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let boot_time = std::fs::read_to_string("/proc/stat").ok().and_then(|s| parse_boot_time(&s));
        let open_fds = std::fs::read_dir("/proc/self/fd").ok().map(|dir| dir.count() as u64);
        let max_fds = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        ProcessFigures {
            cpu_seconds: stat.as_ref().map(|s| (s.utime_ticks + s.stime_ticks) as f64 / USER_HZ),
            resident_bytes: status_kib(&status, "VmRSS").map(|kib| kib * 1024),
            virtual_bytes: status_kib(&status, "VmSize").map(|kib| kib * 1024),
            open_fds,
            max_fds,
            start_time_seconds: stat
                .as_ref()
                .zip(boot_time)
                .map(|(s, boot)| boot as f64 + s.start_ticks as f64 / USER_HZ),
            threads: stat.as_ref().map(|s| s.threads),
        }
    }
}

/// The fields of `/proc/<pid>/stat` used here.
#[derive(Debug, PartialEq)]
pub struct Stat {
    /// Field 14.
    pub utime_ticks: u64,
    /// Field 15.
    pub stime_ticks: u64,
    /// Field 20.
    pub threads: u64,
    /// Field 22: clock ticks after boot.
    pub start_ticks: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may itself hold
/// spaces and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let after_name = &text[text.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name.
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    Some(Stat { utime_ticks: field(14)?, stime_ticks: field(15)?, threads: field(20)?, start_ticks: field(22)? })
}

/// A `Key:   123 kB` line of `/proc/<pid>/status`.
pub fn status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// The `btime` line of `/proc/stat`: boot time, seconds since the Unix epoch.
pub fn parse_boot_time(stat: &str) -> Option<u64> {
    stat.lines().find_map(|line| line.strip_prefix("btime ")?.trim().parse().ok())
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let figures = ProcessFigures::read();
        if let Some(seconds) = figures.cpu_seconds {
            let counter = ConstCounter::new(seconds);
            counter.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                counter.metric_type(),
            )?)?;
        }
        let gauges: [(&str, &str, Option<f64>); 6] = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                figures.resident_bytes.map(|b| b as f64),
            ),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes", figures.virtual_bytes.map(|b| b as f64)),
            ("process_open_fds", "Number of open file descriptors", figures.open_fds.map(|n| n as f64)),
            ("process_max_fds", "Maximum number of open file descriptors", figures.max_fds.map(|n| n as f64)),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                figures.start_time_seconds,
            ),
            ("process_threads", "Number of OS threads in the process", figures.threads.map(|n| n as f64)),
        ];
        for (name, help, value) in gauges {
            if let Some(value) = value {
                let gauge = ConstGauge::new(value);
                gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        // A command name with a space and a parenthesis must not shift the fields.
        let stat = "4242 (hostpath (pro) 1) S 1 4242 4242 0 -1 4194560 1200 0 0 0 250 75 0 0 20 0 9 0 123456 \
                    52428800 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        assert_eq!(parse_stat(stat), Some(Stat { utime_ticks: 250, stime_ticks: 75, threads: 9, start_ticks: 123456 }));
        assert_eq!(parse_stat("truncated (x) S 1"), None);
    }

    #[test]
    fn status_and_boot_time_lines_are_read() {
        let status = "Name:\thostpath\nVmSize:\t  123456 kB\nVmRSS:\t    8000 kB\nThreads:\t9\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(8000));
        assert_eq!(status_kib(status, "VmSize"), Some(123456));
        assert_eq!(status_kib(status, "VmSwap"), None);
        assert_eq!(parse_boot_time("cpu  1 2 3\nbtime 1763900000\nprocesses 5\n"), Some(1_763_900_000));
    }

    #[test]
    fn this_process_reads_plausible_figures() {
        let figures = ProcessFigures::read();
        assert!(figures.resident_bytes.is_some_and(|b| b > 1024 * 1024), "{figures:?}");
        assert!(figures.open_fds.is_some_and(|n| n >= 3), "{figures:?}");
        assert!(figures.max_fds.is_some_and(|n| n >= figures.open_fds.unwrap_or(0)), "{figures:?}");
        assert!(figures.threads.is_some_and(|n| n >= 1), "{figures:?}");
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        // Started within the last day, and not in the future (one tick of rounding allowed).
        assert!(figures.start_time_seconds.is_some_and(|t| t <= now + 1.0 && t > now - 86_400.0), "{figures:?}");
        assert!(figures.cpu_seconds.is_some_and(|s| s >= 0.0), "{figures:?}");
    }
}

//! The standard `process_*` metrics (the names every Prometheus client library exports and every
//! dashboard knows), read from `/proc/self` at each scrape through the `procfs` crate (the one the
//! `prometheus` crate's own process collector uses); only the collector is written here, since
//! those crates register with the `prometheus` crate's registry, not prometheus-client's.

use procfs::process::{LimitValue, Process};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

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
        let Ok(me) = Process::myself() else { return ProcessFigures::default() };
        let stat = me.stat().ok();
        let ticks = procfs::ticks_per_second() as f64;
        let page_size = procfs::page_size();
        let boot_time = procfs::boot_time_secs().ok();
        let max_fds = me.limits().ok().and_then(|l| match l.max_open_files.soft_limit {
            LimitValue::Value(n) => Some(n),
            LimitValue::Unlimited => None,
        });
        ProcessFigures {
            cpu_seconds: stat.as_ref().map(|s| (s.utime + s.stime) as f64 / ticks),
            resident_bytes: stat.as_ref().map(|s| s.rss * page_size),
            virtual_bytes: stat.as_ref().map(|s| s.vsize),
            open_fds: me.fd_count().ok().map(|n| n as u64),
            max_fds,
            start_time_seconds: stat.as_ref().zip(boot_time).map(|(s, boot)| boot as f64 + s.starttime as f64 / ticks),
            threads: stat.as_ref().and_then(|s| u64::try_from(s.num_threads).ok()),
        }
    }
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
    fn this_process_reads_plausible_figures() {
        let figures = ProcessFigures::read();
        // The same figures as /proc/self/status states them.
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let threads: u64 = status.lines().find_map(|l| l.strip_prefix("Threads:")).unwrap().trim().parse().unwrap();
        assert!(figures.threads.is_some_and(|n| n.abs_diff(threads) <= 2), "{figures:?} vs {threads}");
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

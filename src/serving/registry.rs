//! The metrics registry every subcommand that serves `/metrics` starts from (the claim releaser,
//! the operator): the process's metrics under their own names and
//! `hostpath_provisioner_build_info`, so that each process says what runs, as the node daemon's
//! does; and its text encoding.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::serving::build_info;
use crate::serving::metrics::BuildLabels;
use crate::serving::process::ProcessCollector;

/// A registry holding the process collector and `hostpath_provisioner_build_info`.
pub fn with_process_and_build() -> Registry {
    let mut root = Registry::default();
    root.register_collector(Box::new(ProcessCollector));
    let build = Family::<BuildLabels, Gauge>::default();
    build.get_or_create(&BuildLabels { version: build_info::VERSION.into(), commit: build_info::COMMIT.into() }).set(1);
    root.sub_registry_with_prefix("hostpath_provisioner").register(
        "build_info",
        "Version and git commit of this binary (always 1)",
        build,
    );
    root
}

/// `registry` in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

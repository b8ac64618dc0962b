//! The pieces of `make bench` (the `bench` binary includes this directory with `#[path]`, so
//! the library API of the testbed crate stays as it is). One module per measurement.

pub mod api_count;
pub mod args;
pub mod block_io;
pub mod clones;
pub mod fanout;
pub mod many_files;
pub mod memory;
pub mod observe;
pub mod peak_split;
pub mod peer;
pub mod plot;
pub mod procfs;
pub mod quota_latency;
pub mod reference;
pub mod report;
pub mod scale_curve;
pub mod scenario;
pub mod setup;
pub mod startup;
pub mod stats;
pub mod vs_peer;
pub mod window;

//! One control plane per test binary, started by whichever test asks first.

use anyhow::{Result, anyhow};
use tokio::sync::OnceCell;

use crate::control_plane::ControlPlane;

static SHARED: OnceCell<std::result::Result<ControlPlane, String>> = OnceCell::const_new();

/// The test binary's shared control plane, started on first use with default options.
///
/// Never dropped: its processes die with the test binary (see the crate docs). Tests must not
/// keep a `kube::Client` beyond their own runtime; use [`ControlPlane::admin_client`] in each
/// test. Isolate tests by namespace and class names ([`crate::unique_name`]) and do not stop or
/// restart its components (build a [`ControlPlane`] of your own for outage tests). A failed
/// start is remembered, so later tests fail fast with the same message instead of retrying.
pub async fn shared_control_plane() -> Result<&'static ControlPlane> {
    let started = SHARED
        .get_or_init(|| async {
            let cp = ControlPlane::start().await.map_err(|err| format!("{err:#}"))?;
            eprintln!(
                "testbed: shared control plane up in {:.1?} at {} (files in {})",
                cp.started_in(),
                cp.connection().url,
                cp.temp_dir().display()
            );
            Ok(cp)
        })
        .await;
    started.as_ref().map_err(|message| anyhow!("the shared control plane did not start: {message}"))
}

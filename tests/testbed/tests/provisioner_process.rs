//! Provisioner process plumbing, with a shell script standing in for the real binary (which
//! lives in the main crate): command line, environment, logs, signals, restart.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use testbed::{Provisioner, ProvisionerSpec, Result, wait_for};

/// Prints its command line and environment, then idles; exits 0 on SIGTERM.
const FAKE_PROVISIONER: &str = r#"#!/bin/sh
echo "args: $*"
echo "env: RUST_LOG=$RUST_LOG NO_COLOR=$NO_COLOR PV_DIR=${PV_DIR:-unset} EXTRA=${EXTRA:-unset}"
trap 'echo "got SIGTERM"; exit 0' TERM
echo "handling SIGTERM"
while :; do sleep 0.1; done
"#;

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(testbed::unique_name(name));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

fn write_fake(dir: &Path) -> PathBuf {
    let path = dir.join("fake-provisioner.sh");
    std::fs::write(&path, FAKE_PROVISIONER).expect("write fake provisioner");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// Waits until `needle` occurs `times` times in the provisioner's log (all runs).
async fn wait_for_log(provisioner: &Provisioner, needle: &str, times: usize) -> Result<()> {
    wait_for(&format!("{times} × {needle:?} in the log"), Duration::from_secs(10), || async {
        let count = provisioner.log_tail(200).matches(needle).count();
        anyhow::Ok((count >= times).then_some(()))
    })
    .await
}

#[tokio::test]
async fn provisioner_gets_its_flags_environment_log_and_signals() -> Result<()> {
    let dir = scratch_dir("fake-prov");
    let spec = ProvisionerSpec::new(write_fake(&dir), "node-x", dir.join("pool"), dir.join("kc"))
        .arg("--use-naming-prefix")
        .env("EXTRA", "yes");
    // The harness must keep the runner's provisioner settings away from the process.
    // SAFETY: the only test in this binary; no other thread reads the environment meanwhile.
    unsafe { std::env::set_var("PV_DIR", "/leaked/from/the/runner") };
    let mut provisioner = Provisioner::spawn(spec, &dir)?;
    assert_eq!(provisioner.log_path(), dir.join("provisioner-node-x.log").as_path());

    let health = provisioner.health_addr().to_string();
    let metrics = provisioner.metrics_addr().to_string();
    assert_ne!(health, metrics);
    let expected_args = format!(
        "args: --node-name node-x --pv-dir {pool} --kubeconfig {kc} --health-addr {health} \
         --metrics-addr {metrics} --use-naming-prefix",
        pool = dir.join("pool").display(),
        kc = dir.join("kc").display(),
    );
    wait_for_log(&provisioner, &expected_args, 1).await?;
    wait_for_log(&provisioner, "env: RUST_LOG=info,hostpath_provisioner=debug NO_COLOR=1 PV_DIR=unset EXTRA=yes", 1)
        .await?;
    assert!(provisioner.is_running());

    let first_pid = provisioner.pid();
    wait_for_log(&provisioner, "handling SIGTERM", 1).await?;
    provisioner.restart()?;
    assert_ne!(provisioner.pid(), first_pid, "restart starts a new process");
    wait_for_log(&provisioner, "got SIGTERM", 1).await?;
    let log = std::fs::read_to_string(provisioner.log_path())?;
    assert_eq!(log.matches("==== testbed: starting").count(), 2, "one log, one header per run:\n{log}");

    wait_for_log(&provisioner, "handling SIGTERM", 2).await?;
    let status = provisioner.terminate().expect("it was running");
    assert!(status.success(), "SIGTERM handled gracefully: {status}");
    assert!(!provisioner.is_running());

    provisioner.restart()?;
    let status = provisioner.kill().expect("it was running");
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");

    // A process that dies is reported at once by wait_ready, with its log.
    let mut broken =
        Provisioner::spawn(ProvisionerSpec::new("/bin/false", "node-y", dir.join("pool"), dir.join("kc")), &dir)?;
    let err = broken.wait_ready(Duration::from_secs(30)).await.expect_err("/bin/false never gets ready");
    assert!(format!("{err:#}").contains("not running"), "unexpected error: {err:#}");

    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

//! helm on the chart, for the test binaries that render or install it (e2e_install, e2e_chart):
//! the binary from the deploy-tools cache, its caches and settings under the target directory.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;

use testbed::{DeployTool, deploy_tool};

pub const CHART: &str = "deploy/helm/hostpath-provisioner";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// helm with its caches and settings under the target directory, not the user's home.
pub fn helm_command(args: &[&str]) -> Command {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("helm-home");
    let bin = deploy_tool(DeployTool::Helm).unwrap_or_else(|e| panic!("{e:#}"));
    let mut command = Command::new(bin);
    command
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .current_dir(repo());
    command
}

/// Runs helm and returns its stdout; panics with its output on failure.
pub fn helm(args: &[&str]) -> String {
    let output = helm_command(args).output().expect("running helm");
    assert!(
        output.status.success(),
        "helm {} failed ({}):\n{}\n{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs helm expecting it to fail and returns its error output.
pub fn helm_refusal(args: &[&str]) -> String {
    let output = helm_command(args).output().expect("running helm");
    assert!(!output.status.success(), "helm {} succeeded", args.join(" "));
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The chart rendered as release `hostpath-provisioner` in `namespace`, with extra arguments.
pub fn chart_template(namespace: &str, extra: &[&str]) -> String {
    let mut args = vec!["template", "hostpath-provisioner", CHART, "--namespace", namespace];
    args.extend_from_slice(extra);
    helm(&args)
}

//! End-to-end: the linux/arm64 provisioner of `make image`, cross-compiled (Debian sid's Rust,
//! `hack/fetch-cross-rust.sh`; `aarch64-linux-gnu-gcc`) and run under qemu-user
//! (`qemu-aarch64-static`) on this amd64 host: `--help`, `doctor` against the control plane,
//! and one claim provisioned by it as a simulated node's provisioner.
//!
//! Without the cross tools (apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross
//! qemu-user-static) it is skipped, unless CI=true: then it fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use testbed::fixtures;
use testbed::real_nodes::images;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

/// The arm64 binary (cargo rebuilds it only when the source changed), or `None` when the tools
/// are missing outside CI.
fn arm64_binary() -> Option<PathBuf> {
    let missing = images::arm64_missing_tools();
    if !missing.is_empty() {
        let reason =
            format!("the arm64 lane needs {} (apt-get install {})", missing.join(", "), images::ARM64_APT_PACKAGES);
        assert!(!in_ci(), "CI=true and {reason}");
        println!("SKIPPED: {reason}");
        return None;
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let started = Instant::now();
    let binary = images::build_arm64_provisioner(&repo).expect("cross-compile the arm64 provisioner");
    println!("arm64 provisioner built or checked in {:.1} s: {}", started.elapsed().as_secs_f64(), binary.display());
    Some(binary)
}

/// `qemu-aarch64-static <arm64 binary> args...` with only `settings` in its environment.
fn under_qemu(binary: &Path, args: &[&str], settings: &[(&str, String)]) -> (i32, String, String) {
    let mut command = Command::new(images::QEMU_ARM64);
    command.arg(binary).args(args).env_clear();
    for (name, value) in settings {
        command.env(name, value);
    }
    let output = command.output().expect("run qemu-aarch64-static");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned());
    println!("--- {command:?}\n{stdout}\n(stderr: {stderr})");
    (output.status.code().expect("exit code"), stdout, stderr)
}

#[tokio::test(flavor = "multi_thread")]
async fn the_arm64_binary_answers_help_runs_the_doctor_and_provisions_a_claim_under_qemu() {
    let Some(binary) = arm64_binary() else { return };
    let file = Command::new("file").arg(&binary).output().expect("file");
    let description = String::from_utf8_lossy(&file.stdout);
    assert!(description.contains("ARM aarch64"), "{description}");

    let (code, help, _) = under_qemu(&binary, &["--help"], &[]);
    assert_eq!(code, 0);
    assert!(help.contains("doctor"), "--help lists the doctor:\n{help}");

    // A simulated node whose provisioner is the arm64 binary, started through qemu by a wrapper
    // (the spec runs one program with the provisioner's flags).
    let mut env = TestEnv::start("arm64", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    let wrapper = env.cp.temp_dir().join(format!("{node}-qemu.sh"));
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec {} {} \"$@\"\n", images::QEMU_ARM64, binary.display()))
        .expect("write the qemu wrapper");
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    env.add_node_no_wait(&node, &|mut spec: testbed::ProvisionerSpec| {
        spec.binary = wrapper.clone();
        spec
    })
    .await;
    // Emulated, it starts slower than natively.
    env.nodes[0].provisioner.wait_ready(Duration::from_secs(120)).await.expect("the arm64 provisioner is ready");
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "arm", &class, "1Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("arm").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    assert!(disk.dir.join(&pv_name).is_dir(), "the arm64 provisioner made the PV's directory");
    let log = std::fs::read_to_string(env.cp.temp_dir().join(format!("provisioner-{node}.log"))).unwrap_or_default();
    assert!(log.contains(&pv_name), "the PV is this provisioner's work:\n{log}");

    let settings = [
        ("NODE_NAME", node.clone()),
        ("PV_DIR", disk.dir.display().to_string()),
        ("KUBECONFIG", env.cp.kubeconfig_path().display().to_string()),
        ("PROVISIONER_NAME", env.provisioner.clone()),
        ("REQUIRE_MOUNTPOINT", "true".to_owned()),
    ];
    let (code, json, _) = under_qemu(&binary, &["doctor", "--output", "json"], &settings);
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    assert_eq!(code, 0, "no problem found");
    assert_eq!(report["node"], node.as_str());
    assert_eq!(report["api"]["status"], "checked");
    assert_eq!(report["pools"][0]["volumes"]["expected"], 1);
    assert_eq!(report["pools"][0]["volumes"]["missing_directories"], serde_json::json!([]));
    assert_eq!(report["pools"][0]["filesystem"]["type"], "ext4");

    env.nodes[0].provisioner.terminate();
}

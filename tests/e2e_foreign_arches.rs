//! End-to-end: the provisioner of `make image` for each foreign platform, cross-compiled (Debian
//! sid's Rust and that arch's std, `hack/fetch-cross-rust.sh`; Debian's cross gcc and glibc) and
//! run under qemu-user on this amd64 host: `--help`, `doctor` against the control plane, and one
//! claim provisioned by it as a simulated node's provisioner. One test per platform:
//!
//! | test | platform | emulator | runs in |
//! |---|---|---|---|
//! | `arm64_...` | linux/arm64 | `qemu-aarch64-static` | `make test` |
//! | `ppc64le_...` | linux/ppc64le | `qemu-ppc64le-static` | `make test-more-arches` |
//! | `s390x_...` | linux/s390x (big-endian) | `qemu-s390x-static` | `make test-more-arches` |
//!
//! linux/ppc64le and linux/s390x run only when `HPP_MORE_ARCHES=1` (the target sets it): their
//! cross builds would push a cold `make test` on 2 cores past its hour (Makefile,
//! `test-more-arches`). Otherwise they say "not here" and where they run, and pass, CI or not.
//!
//! Without a platform's cross tools (e.g. `apt-get install gcc-powerpc64le-linux-gnu
//! libc6-dev-ppc64el-cross qemu-user-static`) its test prints SKIPPED with the apt command,
//! unless CI=true: then it fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use testbed::fixtures;
use testbed::real_nodes::images::{self, Arch};

/// Set by `make test-more-arches`: run the linux/ppc64le and linux/s390x tests.
const MORE_ARCHES: &str = "HPP_MORE_ARCHES";

#[tokio::test(flavor = "multi_thread")]
async fn arm64_binary_answers_help_runs_the_doctor_and_provisions_a_claim_under_qemu() {
    help_doctor_and_a_claim_under_qemu(Arch::Arm64).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn ppc64le_binary_answers_help_runs_the_doctor_and_provisions_a_claim_under_qemu() {
    help_doctor_and_a_claim_under_qemu(Arch::Ppc64le).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn s390x_binary_answers_help_runs_the_doctor_and_provisions_a_claim_under_qemu() {
    help_doctor_and_a_claim_under_qemu(Arch::S390x).await;
}

/// The platform's binary (cargo rebuilds it only when the source changed), or `None` when its
/// test is not asked for, or its tools are missing outside CI.
fn foreign_binary(arch: Arch) -> Option<PathBuf> {
    let platform = format!("linux/{}", arch.oci_name());
    if arch != Arch::Arm64 && !std::env::var(MORE_ARCHES).is_ok_and(|v| v == "1") {
        println!(
            "not here: the {platform} binary under qemu runs in `make test-more-arches` ({MORE_ARCHES}=1), not in `make test`"
        );
        return None;
    }
    let missing = images::cross_missing_tools(arch);
    if !missing.is_empty() {
        let reason =
            format!("the {platform} test needs {} (apt-get install {})", missing.join(", "), arch.apt_packages());
        assert!(!testbed::in_ci(), "CI=true and {reason}");
        println!("SKIPPED: {reason}");
        return None;
    }
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let started = Instant::now();
    let binary = images::build_cross_provisioner(&repo, arch).expect("cross-compile the provisioner");
    println!(
        "{platform} provisioner built or checked in {:.1} s: {}",
        started.elapsed().as_secs_f64(),
        binary.display()
    );
    Some(binary)
}

/// `qemu-<arch>-static <binary> args...` with only `settings` in its environment.
fn under_qemu(arch: Arch, binary: &Path, args: &[&str], settings: &[(&str, String)]) -> (i32, String, String) {
    let mut command = Command::new(arch.qemu());
    command.arg(binary).args(args).env_clear();
    for (name, value) in settings {
        command.env(name, value);
    }
    let output = command.output().expect("run qemu-user");
    let (stdout, stderr) =
        (String::from_utf8_lossy(&output.stdout).into_owned(), String::from_utf8_lossy(&output.stderr).into_owned());
    println!("--- {command:?}\n{stdout}\n(stderr: {stderr})");
    (output.status.code().expect("exit code"), stdout, stderr)
}

/// What each platform's test proves: `file` says the binary is a static executable for that
/// machine; under qemu it answers `--help`; as the provisioner of a simulated node (a wrapper
/// runs it through qemu) it becomes ready and provisions a claim (PV bound, its directory made
/// on the node's ext4 pool, the PV named in its own log); and its `doctor` reads that pool
/// (statfs, the volume's directory) and the API server and reports the volume, no problem.
async fn help_doctor_and_a_claim_under_qemu(arch: Arch) {
    let Some(binary) = foreign_binary(arch) else { return };
    let name = arch.oci_name();
    let file = Command::new("file").arg(&binary).output().expect("file");
    let description = String::from_utf8_lossy(&file.stdout);
    assert!(description.contains(arch.file_machine()), "{description}");

    let (code, help, _) = under_qemu(arch, &binary, &["--help"], &[]);
    assert_eq!(code, 0);
    assert!(help.contains("doctor"), "--help lists the doctor:\n{help}");

    // A simulated node whose provisioner is the foreign binary, started through qemu by a
    // wrapper (the spec runs one program with the provisioner's flags).
    let mut env = TestEnv::start(name, 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    let wrapper = env.cp.temp_dir().join(format!("{node}-qemu.sh"));
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec {} {} \"$@\"\n", arch.qemu(), binary.display()))
        .expect("write the qemu wrapper");
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    env.add_node_no_wait(&node, &|mut spec: testbed::ProvisionerSpec| {
        spec.binary = wrapper.clone();
        spec
    })
    .await;
    // Emulated, it starts slower than natively.
    env.nodes[0].provisioner.wait_ready(Duration::from_secs(180)).await.expect("the emulated provisioner is ready");
    let class = env.class("imm", |c| c.immediate()).await;
    let claim = format!("claim-{name}");
    env.create_claim(fixtures::claim(&env.ns, &claim, &class, "1Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound(&claim).await;
    let pv_name = pv.metadata.name.clone().unwrap();
    assert!(disk.dir.join(&pv_name).is_dir(), "the linux/{name} provisioner made the PV's directory");
    let log = std::fs::read_to_string(env.cp.temp_dir().join(format!("provisioner-{node}.log"))).unwrap_or_default();
    assert!(log.contains(&pv_name), "the PV is this provisioner's work:\n{log}");

    let settings = [
        ("NODE_NAME", node.clone()),
        ("PV_DIR", disk.dir.display().to_string()),
        ("KUBECONFIG", env.cp.kubeconfig_path().display().to_string()),
        ("PROVISIONER_NAME", env.provisioner.clone()),
        ("REQUIRE_MOUNTPOINT", "true".to_owned()),
    ];
    let (code, json, _) = under_qemu(arch, &binary, &["doctor", "--output", "json"], &settings);
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    assert_eq!(code, 0, "no problem found");
    assert_eq!(report["node"], node.as_str());
    assert_eq!(report["api"]["status"], "checked");
    assert_eq!(report["pools"][0]["volumes"]["expected"], 1);
    assert_eq!(report["pools"][0]["volumes"]["missing_directories"], serde_json::json!([]));
    assert_eq!(report["pools"][0]["filesystem"]["type"], "ext4");

    env.nodes[0].provisioner.terminate();
}

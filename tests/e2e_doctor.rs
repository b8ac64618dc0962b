//! End-to-end: `hostpath-provisioner doctor` on a real control plane, against a broken node (an
//! orphan directory, a PV whose directory is gone, a full disk) and a healthy one.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;
use testbed::fixtures;

/// A UID no claim of the shared control plane has: the orphan's.
const ORPHAN_UID: &str = "d0c70000-0000-4000-8000-00000000beef";

/// Runs the doctor as an admin would on the node, with only the settings given (nothing inherited).
async fn doctor(settings: &[(&str, String)], args: &[&str]) -> (i32, String) {
    let mut command = std::process::Command::new(binary());
    command.arg("doctor").args(args);
    run_doctor(command, settings).await
}

/// Runs the doctor as in the provisioner's pod, for a JSON report: in a mount namespace of its own
/// where a tmpfs covers `/` (the mount table then says what a container's overlay says: `/` is no
/// disk), each pool root is bind-mounted onto itself (as a hostPath volume is) and, when given,
/// `kubelet_hosts_file` is bind-mounted on `/etc/hosts` (as the kubelet does from its own
/// directory). The namespace and its mounts end with the doctor.
async fn doctor_in_a_pod(
    settings: &[(&str, String)],
    pools: &[&Path],
    kubelet_hosts_file: Option<&Path>,
) -> (i32, String) {
    const POD_MOUNTS: &str = r#"set -e
hosts=$1 binary=$2
shift 2
for pool in "$@"; do mount --bind "$pool" "$pool"; done
mount -t tmpfs container-root /
if [ -n "$hosts" ]; then mount --bind "$hosts" /etc/hosts; fi
exec "$binary" doctor --output json"#;
    let mut command = std::process::Command::new("unshare");
    command.args(["--mount", "--propagation", "private", "sh", "-c", POD_MOUNTS, "sh"]);
    command.arg(kubelet_hosts_file.map(Path::as_os_str).unwrap_or_default()).arg(binary()).args(pools);
    let mut settings = settings.to_vec();
    settings.push(("PATH", std::env::var("PATH").unwrap_or_default()));
    run_doctor(command, &settings).await
}

async fn run_doctor(mut command: std::process::Command, settings: &[(&str, String)]) -> (i32, String) {
    command.env_clear();
    for (name, value) in settings {
        command.env(name, value);
    }
    let shown = format!("{command:?}");
    let output = tokio::task::spawn_blocking(move || command.output()).await.unwrap().expect("run doctor");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    println!("--- {shown} (stderr: {})\n{stdout}", String::from_utf8_lossy(&output.stderr));
    (output.status.code().expect("exit code"), stdout)
}

fn same_filesystem_as_root(path: &Path) -> bool {
    std::fs::metadata(path).unwrap().dev() == std::fs::metadata("/").unwrap().dev()
}

fn checks(report: &serde_json::Value) -> Vec<(String, String, String)> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let text = |k: &str| f[k].as_str().unwrap_or_default().to_owned();
            (text("severity"), text("pool"), text("check"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_broken_node_shows_its_orphan_its_missing_directory_and_its_full_disk_and_exits_1() {
    let mut env = TestEnv::start("doctor-bad", 0).await;
    let node = format!("{}-1", env.group);
    let legacy = testbed::pool_root_for(env.cp, &node);
    let disk = LoopFs::mount(&env.cp.temp_dir().join("nodes").join(&node).join("small"), 16, None);
    let small = format!("small={}", disk.dir.display());
    let pool_arg = small.clone();
    env.add_node(&node, &move |spec: testbed::ProvisionerSpec| spec.arg("--pool").arg(pool_arg.clone())).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "lost", &class, "1Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("lost").await;
    let pv_name = pv.metadata.name.clone().unwrap();
    // The admin's view of a broken node; the daemon is stopped so it repairs nothing meanwhile.
    env.nodes[0].provisioner.terminate();
    std::fs::remove_dir_all(legacy.join(&pv_name)).expect("remove the PV's directory");
    let orphan = format!("data-pvc-{ORPHAN_UID}");
    std::fs::create_dir(legacy.join(&orphan)).unwrap();
    std::fs::write(legacy.join(&orphan).join("db"), vec![7u8; 64 << 10]).unwrap();
    // A deleted volume whose data the daemon could not remove for an hour (its trash entries
    // are named by the time they were made).
    let hour_ago =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() - 3_600_000_000_000;
    let stuck = legacy.join(".hpp-trash").join(format!("{hour_ago}-0"));
    std::fs::create_dir_all(&stuck).unwrap();
    std::fs::write(stuck.join("undeletable"), vec![1u8; 8192]).unwrap();
    let filler = disk.dir.join("filler");
    let mut file = std::fs::File::create(&filler).unwrap();
    for chunk in [1 << 20, 4096] {
        while std::io::Write::write_all(&mut file, &vec![0u8; chunk]).is_ok() {}
    }
    let _ = file.sync_all();
    drop(file);

    let settings = [
        ("NODE_NAME", node.clone()),
        ("PV_DIR", legacy.display().to_string()),
        ("STORAGE_POOLS", small.clone()),
        ("KUBECONFIG", env.cp.kubeconfig_path().display().to_string()),
        ("PROVISIONER_NAME", env.provisioner.clone()),
    ];
    let (code, json) = doctor(&settings, &["--output", "json"]).await;
    assert_eq!(code, 1, "problems found");
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    assert_eq!(report["node"], node.as_str());
    assert_eq!(report["api"]["status"], "checked");
    let (legacy_pool, small_pool) = (&report["pools"][0], &report["pools"][1]);
    assert_eq!(legacy_pool["name"], "legacy");
    assert_eq!(legacy_pool["volumes"]["expected"], 1);
    assert_eq!(legacy_pool["volumes"]["missing_directories"][0]["pv"], pv_name.as_str());
    let missing_path = legacy.join(&pv_name).display().to_string();
    assert_eq!(legacy_pool["volumes"]["missing_directories"][0]["path"], missing_path.as_str());
    let orphans = legacy_pool["volumes"]["orphan_directories"].as_array().unwrap();
    assert_eq!(orphans.len(), 1, "{orphans:?}");
    assert_eq!(orphans[0]["name"], orphan.as_str());
    assert!(orphans[0]["bytes"].as_u64().unwrap() >= 64 << 10, "{orphans:?}");
    assert_eq!(legacy_pool["trash"]["entries"], 1);
    assert_eq!(legacy_pool["trash"]["stuck"], 1);
    assert!(legacy_pool["trash"]["bytes"].as_u64().unwrap() >= 8192);
    assert_eq!(legacy_pool["filesystem"]["is_mount_point"], false);
    // Run on the node, the OS disk is the filesystem at `/` (as for the metric).
    assert_eq!(legacy_pool["filesystem"]["shares_os_disk"], same_filesystem_as_root(&legacy));
    assert_eq!(small_pool["name"], "small");
    assert_eq!(small_pool["filesystem"]["type"], "ext4");
    assert_eq!(small_pool["filesystem"]["is_mount_point"], true);
    assert_eq!(small_pool["filesystem"]["shares_os_disk"], false);
    assert!(small_pool["filesystem"]["available_bytes"].as_u64().unwrap() < 1 << 20, "filled up");
    assert_eq!(small_pool["volumes"]["expected"], 0);
    let found = checks(&report);
    let expected_problems = [
        ("legacy", "orphan_directory"),
        ("legacy", "missing_directory"),
        ("legacy", "trash_stuck"),
        ("small", "pool_full"),
    ];
    for expected in expected_problems {
        let problem = ("problem".to_owned(), expected.0.to_owned(), expected.1.to_owned());
        assert!(found.contains(&problem), "{expected:?} not in {found:?}");
    }
    assert!(!found.iter().any(|(_, pool, check)| pool == "small" && check != "pool_full"), "{found:?}");
    assert!(!legacy.join(".hpp-doctor-probe").exists() && !disk.dir.join(".hpp-doctor-probe").exists());

    let (code, table) = doctor(&settings, &[]).await;
    assert_eq!(code, 1);
    for expected in [
        format!("PROBLEM [legacy] orphan_directory: {}/{orphan} (64 KiB)", legacy.display()),
        format!("PROBLEM [legacy] missing_directory: PV {pv_name} expects {missing_path}"),
        "PROBLEM [small] pool_full: ".to_owned(),
        format!("orphans        {orphan} (64 KiB)"),
        format!("missing        {pv_name} ({missing_path})"),
        "filesystem     ext4 on /dev/loop".to_owned(),
        "exit code 1".to_owned(),
    ] {
        assert!(table.contains(&expected), "{expected:?} not in:\n{table}");
    }
    std::fs::remove_dir_all(legacy.join(&orphan)).unwrap();
    std::fs::remove_dir_all(&stuck).unwrap();
    std::fs::remove_file(&filler).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_healthy_node_with_its_volume_in_place_exits_0() {
    let mut env = TestEnv::start("doctor-ok", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    env.add_node(&node, &|spec| spec).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "fine", &class, "1Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound("fine").await;
    let settings = [
        ("NODE_NAME", node.clone()),
        ("PV_DIR", disk.dir.display().to_string()),
        ("KUBECONFIG", env.cp.kubeconfig_path().display().to_string()),
        ("PROVISIONER_NAME", env.provisioner.clone()),
        ("REQUIRE_MOUNTPOINT", "true".to_owned()),
    ];

    let (code, json) = doctor(&settings, &["--output", "json"]).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    assert_eq!(checks(&report), vec![], "no finding");
    assert_eq!(code, 0);
    let pool = &report["pools"][0];
    assert_eq!(pool["volumes"]["expected"], 1);
    assert_eq!(pool["volumes"]["orphan_directories"], serde_json::json!([]));
    assert_eq!(pool["volumes"]["missing_directories"], serde_json::json!([]));
    assert_eq!(pool["filesystem"]["is_mount_point"], true);
    assert_eq!(pool["filesystem"]["shares_os_disk"], false);
    assert!(pool["filesystem"]["available_bytes"].as_u64().unwrap() > 0);
    assert_eq!(pool["trash"]["stuck"], 0);
    assert!(disk.dir.join(pv.metadata.name.unwrap()).is_dir(), "the doctor changed nothing");

    let (code, table) = doctor(&settings, &[]).await;
    assert_eq!(code, 0);
    for expected in [
        "mount point    yes",
        "is on OS disk  no",
        "volumes        1 of this node's PVs here",
        "No problems found.",
        "exit code 0",
    ] {
        assert!(table.contains(expected), "{expected:?} not in:\n{table}");
    }
    env.nodes[0].provisioner.terminate();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invalid_setting_exits_2_and_an_unreachable_api_exits_3() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("pool");
    std::fs::create_dir(&pool).unwrap();
    let settings = |extra: (&'static str, String)| {
        vec![("NODE_NAME", "node-a".to_owned()), ("PV_DIR", pool.display().to_string()), extra]
    };

    let (code, out) = doctor(&settings(("REQUIRE_MOUNTPOINT", "enabled".into())), &[]).await;
    assert_eq!((code, out.as_str()), (2, ""), "configuration error, nothing on stdout");

    // An API server that refuses connections: the pool is examined, the API checks are reported
    // as not run, and the exit code says so (no problem found, but the run is incomplete).
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:1\n\
         users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n",
    )
    .unwrap();
    let (code, json) = doctor(&settings(("KUBECONFIG", kubeconfig.display().to_string())), &["-o", "json"]).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    assert_eq!(report["api"]["status"], "failed", "{report}");
    assert!(report["api"]["detail"].as_str().unwrap().contains("refused"), "the cause is told: {report}");
    assert!(report["pools"][0]["volumes"].is_null());
    assert_eq!(report["pools"][0]["error"], serde_json::Value::Null);
    let problems: Vec<_> = checks(&report).into_iter().filter(|(severity, ..)| severity == "problem").collect();
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(code, 3);

    // Without any API access the API checks are skipped on purpose: a healthy exit.
    let (code, json) = doctor(&settings(("RESERVED_SPACE", "0".into())), &["--output", "json"]).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    assert_eq!(report["api"]["status"], "skipped");
    assert_eq!(code, 0, "{report}");
}

/// An XFS filesystem (reflink on, as mkfs.xfs makes it by default) in a sparse file,
/// loop-mounted on `dir`; unmounted and removed when dropped.
struct XfsLoop {
    dir: std::path::PathBuf,
    image: std::path::PathBuf,
}

impl XfsLoop {
    fn mount(dir: &Path) -> XfsLoop {
        let image = dir.with_extension("xfs.img");
        // 300 MiB is the smallest XFS filesystem current mkfs.xfs makes.
        std::fs::File::create(&image).unwrap().set_len(320 << 20).unwrap();
        std::fs::create_dir_all(dir).unwrap();
        let mounted = XfsLoop { dir: dir.to_owned(), image };
        run(std::process::Command::new("mkfs.xfs").args(["-q", "-f", "-m", "reflink=1"]).arg(&mounted.image));
        run(std::process::Command::new("mount").args(["-o", "loop"]).arg(&mounted.image).arg(dir));
        mounted
    }
}

impl Drop for XfsLoop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

fn run(command: &mut std::process::Command) {
    let out = command.output().unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(out.status.success(), "{command:?}: {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread")]
async fn reflink_is_seen_on_xfs_and_a_read_only_pool_is_a_problem() {
    let dir = tempfile::tempdir().unwrap();
    let disk = XfsLoop::mount(&dir.path().join("pool"));
    let settings = [("NODE_NAME", "node-a".to_owned()), ("PV_DIR", disk.dir.display().to_string())];

    let (code, json) = doctor(&settings, &["--output", "json"]).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    let fs = &report["pools"][0]["filesystem"];
    assert_eq!(fs["type"], "xfs");
    assert_eq!(fs["reflink"], "supported", "{fs}");
    assert_eq!(fs["is_mount_point"], true);
    assert_eq!(fs["shares_os_disk"], false);
    assert_eq!(code, 0, "{report}");
    let left: Vec<String> = entries(&disk.dir).into_iter().collect();
    assert!(left.is_empty(), "the probe left {left:?}");

    run(std::process::Command::new("mount").args(["-o", "remount,ro"]).arg(&disk.dir));
    let (code, json) = doctor(&settings, &["--output", "json"]).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    assert_eq!(report["pools"][0]["filesystem"]["read_only"], true);
    assert!(report["pools"][0]["filesystem"]["reflink"].as_str().unwrap().starts_with("unknown"));
    assert!(checks(&report).contains(&("problem".into(), "legacy".into(), "read_only".into())), "{report}");
    assert_eq!(code, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn in_a_pod_a_pool_is_on_the_os_disk_when_it_shares_the_filesystem_of_the_kubelets_etc_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let disk = XfsLoop::mount(&dir.path().join("disk"));
    let settings = [
        ("NODE_NAME", "node-a".to_owned()),
        ("STORAGE_POOLS", format!("plain={},disk={}", plain.display(), disk.dir.display())),
    ];
    let pools = [plain.as_path(), disk.dir.as_path()];
    let on_os_disk = |report: &serde_json::Value| {
        let pools = report["pools"].as_array().unwrap();
        pools.iter().map(|p| p["filesystem"]["shares_os_disk"].clone()).collect::<Vec<_>>()
    };

    // The kubelet's directory on the filesystem `plain` is a directory of.
    let hosts_beside_plain = dir.path().join("etc-hosts");
    std::fs::write(&hosts_beside_plain, "127.0.0.1 localhost\n").unwrap();
    let (code, json) = doctor_in_a_pod(&settings, &pools, Some(&hosts_beside_plain)).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    assert_eq!(on_os_disk(&report), [true, false], "{report}");
    assert_eq!(report["pools"][0]["filesystem"]["mount_root"], plain.display().to_string(), "a hostPath bind mount");
    assert!(checks(&report).contains(&("warning".into(), "plain".into(), "shares_os_disk".into())), "{report}");
    assert_eq!(code, 0, "{report}");

    // The kubelet's directory on the XFS disk: the answers swap, whatever `/` is.
    let hosts_on_disk = disk.dir.join(".kubelet-etc-hosts");
    std::fs::write(&hosts_on_disk, "127.0.0.1 localhost\n").unwrap();
    let (_, json) = doctor_in_a_pod(&settings, &pools, Some(&hosts_on_disk)).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    assert_eq!(on_os_disk(&report), [false, true], "{report}");
    std::fs::remove_file(&hosts_on_disk).unwrap();

    // A container the kubelet did not start: no /etc/hosts mount, and `/` is no disk.
    let (code, json) = doctor_in_a_pod(&settings, &pools, None).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    assert_eq!(on_os_disk(&report), [serde_json::Value::Null, serde_json::Value::Null], "{report}");
    assert_eq!(code, 0, "unknown is not a problem: {report}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_quota_line_is_the_daemons_verdict_btrfs_serves_enforce_once_quota_is_enabled() {
    let dir = tempfile::tempdir().unwrap();
    let disk = LoopFs::mount_btrfs(&dir.path().join("pool"), 128);
    let settings = [("NODE_NAME", "node-a".to_owned()), ("PV_DIR", disk.dir.display().to_string())];
    let quota = |json: &str| {
        let report: serde_json::Value = serde_json::from_str(json).expect("JSON report");
        report["pools"][0]["filesystem"].clone()
    };

    let (_, json) = doctor(&settings, &["--output", "json"]).await;
    let fs = quota(&json);
    assert_eq!(fs["type"], "btrfs", "{fs}");
    assert_eq!(fs["quota"], "none", "{fs}");
    let missing = fs["quota_missing"].as_str().unwrap_or_default();
    assert!(missing.contains("btrfs quota enable"), "says what is missing: {fs}");

    // The admin's one-time step; the doctor then says what the daemon would do.
    let enabled = std::process::Command::new("btrfs").args(["quota", "enable"]).arg(&disk.dir).status().unwrap();
    assert!(enabled.success());
    let (_, json) = doctor(&settings, &["--output", "json"]).await;
    let fs = quota(&json);
    assert_eq!(fs["quota"], "btrfs-qgroup", "{fs}");
    assert!(fs["quota_missing"].is_null(), "{fs}");
    let (_, table) = doctor(&settings, &[]).await;
    assert!(table.contains("btrfs-qgroup (quota: enforce served)"), "{table}");
}

/// The attached loops whose backing file (as sysfs names it) lies under `dir`.
fn loops_under(dir: &Path) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/block").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(number) = name.strip_prefix("loop").and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file"))
            && backing.starts_with(&*dir.to_string_lossy())
        {
            found.push(number);
        }
    }
    found
}

/// Detaches, on drop, every loop on a file of `pool`, and removes the device directory.
struct BlockCleanup {
    pool: std::path::PathBuf,
    devices: std::path::PathBuf,
}

impl Drop for BlockCleanup {
    fn drop(&mut self) {
        for number in loops_under(&self.pool) {
            let _ = std::process::Command::new("losetup").arg("-d").arg(format!("/dev/loop{number}")).status();
        }
        let _ = std::fs::remove_dir_all(&self.devices);
    }
}

/// The block_* findings of a JSON report, as (severity, check, message).
fn block_findings(report: &serde_json::Value) -> Vec<(String, String, String)> {
    let text = |f: &serde_json::Value, k: &str| f[k].as_str().unwrap_or_default().to_owned();
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| text(f, "check").starts_with("block_"))
        .map(|f| (text(f, "severity"), text(f, "check"), text(f, "message")))
        .collect()
}

/// Block volumes (issue #47): the doctor lists each with the loop holding its file and the
/// loops with their volume; a device node gone, or its loop detached, is a problem naming it.
#[tokio::test(flavor = "multi_thread")]
async fn block_volumes_are_listed_with_their_loops_and_a_missing_node_or_loop_is_a_problem() {
    let devices = std::path::PathBuf::from("/dev").join(testbed::unique_name("hpp-e2e-doctor-block"));
    let devices_env = devices.display().to_string();
    let mut env = TestEnv::start_with("doctor-block", 1, |spec| {
        spec.env("BLOCK_VOLUMES", "true").env("BLOCK_DEVICE_DIR", &devices_env)
    })
    .await;
    let node = env.nodes[0].name.clone();
    let pool = env.nodes[0].pool_root.clone();
    let _cleanup = BlockCleanup { pool: pool.clone(), devices: devices.clone() };
    let class = env.class("block", |c| c).await;
    env.create_claim(fixtures::claim(&env.ns, "disk", &class, "8Mi").provision_on_node(&node).block()).await;
    let pv = env.wait_bound("disk").await.metadata.name.expect("name");
    let settings = [
        ("NODE_NAME", node.clone()),
        ("PV_DIR", pool.display().to_string()),
        ("KUBECONFIG", env.cp.kubeconfig_path().display().to_string()),
        ("PROVISIONER_NAME", env.provisioner.clone()),
        ("BLOCK_VOLUMES", "true".to_owned()),
        ("BLOCK_DEVICE_DIR", devices_env.clone()),
    ];
    let node_path = devices.join(&pv);
    let (_, json) = doctor(&settings, &["--output", "json"]).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    assert_eq!(block_findings(&report), vec![], "a healthy Block volume");
    let volume = &report["block"]["volumes"][0];
    assert_eq!((volume["pv"].as_str(), volume["state"].as_str()), (Some(pv.as_str()), Some("ok")), "{report}");
    assert_eq!(volume["node"], node_path.display().to_string());
    let number = volume["loop_number"].as_u64().expect("the loop holding its file");
    assert_eq!(loops_under(&pool), [number as u32]);
    let listed = report["block"]["loops"].as_array().expect("loops").iter().find(|l| l["number"] == number);
    assert_eq!(listed.expect("its loop is listed")["volume"], pv.as_str());
    let (_, table) = doctor(&settings, &[]).await;
    assert!(table.contains(&format!("  {pv}  {}  loop{number}  ok", node_path.display())), "{table}");

    // The device node removed by hand: the doctor names it, and changes nothing.
    std::fs::remove_file(&node_path).expect("remove the node");
    let (code, json) = doctor(&settings, &["--output", "json"]).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    let found = block_findings(&report);
    assert_eq!(code, 1, "{found:?}");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].0.as_str(), found[0].1.as_str()), ("problem", "block_node_missing"));
    assert!(found[0].2.contains(&pv) && found[0].2.contains(&format!("loop{number}")), "{found:?}");
    assert!(!node_path.exists(), "the doctor makes no node");

    // Its loop detached too (a reboot, with the provisioner not started again).
    env.nodes[0].provisioner.terminate();
    let status = std::process::Command::new("losetup").arg("-d").arg(format!("/dev/loop{number}")).status();
    assert!(status.expect("losetup").success());
    testbed::wait_for("loop detached", TIMEOUT, || async { anyhow::Ok(loops_under(&pool).is_empty().then_some(())) })
        .await
        .expect("detached");
    let (code, json) = doctor(&settings, &["--output", "json"]).await;
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON report");
    let found = block_findings(&report);
    assert_eq!(code, 1);
    assert_eq!(found.iter().map(|f| f.1.as_str()).collect::<Vec<_>>(), ["block_volume_without_loop"], "{found:?}");
    assert_eq!(report["block"]["volumes"][0]["loop_number"], serde_json::Value::Null);
    assert!(loops_under(&pool).is_empty(), "the doctor attaches nothing");
}

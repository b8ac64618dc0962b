//! End-to-end: the HTTP listener survives a flood of half-sent requests with bounded memory and
//! file descriptors, and bad settings stop the real binary with exit code 2 and one line naming
//! the env var.

mod common;

use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Connections opened by the flood; well above the provisioner's cap and the default 1024 fd limit.
const FLOOD_CONNECTIONS: usize = 3_000;
/// Opened this many at a time, so the flood is bounded in time as well as in count.
const FLOOD_BATCH: usize = 250;
/// A connection that cannot be opened or written within this is simply not part of the flood.
const FLOOD_STEP_TIMEOUT: Duration = Duration::from_secs(2);

/// Generous bounds: a baseline provisioner has ~20 fds and ~11 MiB RSS (release) or a little
/// more (debug); without limits the flood took it to thousands of fds and ~85 MiB.
const MAX_FDS_UNDER_FLOOD: usize = 1_200;
const MAX_RSS_KIB_UNDER_FLOOD: u64 = 40 * 1024;

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|entries| entries.count()).unwrap_or(0)
}

/// `VmRSS` and `VmHWM` (peak) of a process, in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Lets this test process hold the flood's sockets where the soft fd limit is the usual 1024.
fn raise_fd_limit(wanted: u64) {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    let target = limit.maximum.map_or(wanted, |hard| hard.min(wanted));
    if limit.current.is_some_and(|soft| soft < target) {
        limit.current = Some(target);
        let _ = setrlimit(Resource::Nofile, limit);
    }
}

/// Opens up to `count` connections to `addr`, each sending a request line and one header but
/// never the blank line that ends the headers (a slowloris client), and keeps them open.
async fn half_requests(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(count);
    for batch in 0..count.div_ceil(FLOOD_BATCH) {
        let size = FLOOD_BATCH.min(count - batch * FLOOD_BATCH);
        let opened = futures::future::join_all((0..size).map(|_| async move {
            let mut stream = tokio::time::timeout(FLOOD_STEP_TIMEOUT, TcpStream::connect(addr)).await.ok()?.ok()?;
            let half = format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n");
            tokio::time::timeout(FLOOD_STEP_TIMEOUT, stream.write_all(half.as_bytes())).await.ok()?.ok()?;
            Some(stream)
        }))
        .await;
        held.extend(opened.into_iter().flatten());
    }
    held
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_half_sent_requests_neither_exhausts_the_listener_nor_grows_the_process() {
    let env = TestEnv::start("flood", 1).await;
    let provisioner = &env.nodes[0].provisioner;
    let (pid, health) = (provisioner.pid(), provisioner.health_addr());
    assert!(health.ip().is_loopback(), "the flood only ever targets 127.0.0.1: {health}");
    let baseline = (open_fds(pid), rss_kib(pid).0);
    raise_fd_limit(FLOOD_CONNECTIONS as u64 + 1_000);

    let held = half_requests(health, FLOOD_CONNECTIONS).await;
    // Let the server accept (and, past its cap, close) whatever is still in its backlog.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fds = open_fds(pid);
    let (rss, peak) = rss_kib(pid);
    eprintln!(
        "flood: {} of {FLOOD_CONNECTIONS} connections opened by the client; provisioner fds {} -> {fds}, \
         RSS {} KiB -> {rss} KiB (peak {peak} KiB)",
        held.len(),
        baseline.0,
        baseline.1
    );
    assert!(fds < MAX_FDS_UNDER_FLOOD, "{fds} open fds under the flood (baseline {})", baseline.0);
    assert!(rss < MAX_RSS_KIB_UNDER_FLOOD, "RSS {rss} KiB under the flood (baseline {} KiB)", baseline.1);
    assert!(peak < MAX_RSS_KIB_UNDER_FLOOD, "peak RSS {peak} KiB under the flood");

    // Probes get through again while the flood's connections are still held by the client.
    testbed::wait_for("/healthz answers under the flood", TIMEOUT, || async {
        anyhow::Ok((testbed::http_get(health, "/healthz").await?.0 == 200).then_some(()))
    })
    .await
    .expect("/healthz answers");
    assert!(open_fds(pid) < MAX_FDS_UNDER_FLOOD);
    drop(held);
}

/// Runs the binary with only `env` (no cluster needed: configuration is checked first) and
/// returns its exit code and stderr.
fn run_with_env(env: &[(&str, &str)]) -> (Option<i32>, String) {
    let output = Command::new(binary())
        .env_clear()
        .envs([("NODE_NAME", "node-a"), ("PV_DIR", "/var/hpvolumes")])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run the provisioner");
    (output.status.code(), String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn invalid_env_settings_exit_2_with_one_line_naming_the_variable() {
    let cases = [
        ("REQUIRE_MOUNTPOINT", "enabled"),
        ("REQUIRE_MOUNTPOINT", "y"),
        ("LOG_FORMAT", "xml"),
        ("PV_CAPACITY", "everything"),
        ("MAX_CONCURRENCY", "lots"),
        ("NODE_LEASE_SECONDS", "soon"),
        ("RUST_LOG", "info,hostpath_provisioner=loud"),
    ];
    for (name, value) in cases {
        let (code, stderr) = run_with_env(&[(name, value)]);
        assert_eq!(code, Some(2), "{name}={value}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{name}={value}: one line, got {stderr:?}");
        assert!(lines[0].contains(&format!("{name}: invalid value")), "{name}={value}: {stderr:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kubeconfig_path_list_is_merged_like_kubectl() {
    // A file that does not exist, then the real one: kubectl skips the first and uses the second.
    let env = TestEnv::start_with("kcfglist", 1, |mut spec| {
        let missing = spec.kubeconfig.with_file_name("no-such-kubeconfig");
        spec.kubeconfig = format!("{}:{}", missing.display(), spec.kubeconfig.display()).into();
        spec
    })
    .await;
    assert!(env.nodes[0].provisioner.spec().kubeconfig.to_string_lossy().contains(':'));
    // TestEnv::start waited for /readyz: the client reached the API server with the merged config.
}

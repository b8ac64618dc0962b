//! End-to-end: the commands docs/operating.md gives for inside the provisioner's container run with
//! what its image holds (the binary alone: no shell, no wget or curl), and the NotReady runbook's
//! command prints why a real provisioner is not ready. The API server's pod proxy form the doc
//! mentions is checked against the real API server too: routed to the pod, it shows a ready pod's
//! `ok`, and kubectl drops the body of a 503, which is why the runbook does not rely on it.

mod common;

use std::net::{IpAddr, SocketAddr};
use std::process::{Command, Stdio};

use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams, PostParams};

const OPERATING: &str = include_str!("../docs/operating.md");

/// The subcommands the binary has (its `--help` lists them).
const SUBCOMMANDS: [&str; 5] = ["doctor", "readyz", "check-volume", "operator", "pool-mount"];

/// The commands of a Markdown text: each inline code span (a paragraph's lines joined) and each
/// line of a fenced block.
fn commands(markdown: &str) -> Vec<String> {
    fn spans(paragraph: &mut String, found: &mut Vec<String>) {
        found.extend(paragraph.split('`').skip(1).step_by(2).map(str::to_owned));
        paragraph.clear();
    }
    let mut found = Vec::new();
    let mut paragraph = String::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            spans(&mut paragraph, &mut found);
            fenced = !fenced;
        } else if fenced {
            found.push(line.trim().to_owned());
        } else if line.trim().is_empty() {
            spans(&mut paragraph, &mut found);
        } else {
            paragraph.push_str(line);
            paragraph.push(' ');
        }
    }
    spans(&mut paragraph, &mut found);
    found
}

/// The argv a `kubectl ... exec <pod> -- ARGV` command runs in a pod.
fn in_pod(command: &str) -> Option<Vec<String>> {
    let (kubectl, argv) = command.split_once(" -- ")?;
    (kubectl.starts_with("kubectl ") && kubectl.split_whitespace().any(|w| w == "exec"))
        .then(|| argv.split_whitespace().map(str::to_owned).collect())
}

/// The argv run in the provisioner's container: a `kubectl exec` in its namespace (as the docs
/// write it: `-n <namespace>` or the shipped namespaces), not in a workload's pod.
fn in_container(command: &str) -> Option<Vec<String>> {
    let namespace = command.split_whitespace().skip_while(|w| *w != "-n").nth(1)?;
    ["<namespace>", "kubevirt-hostpath-provisioner", "hostpath-provisioner"]
        .contains(&namespace)
        .then(|| in_pod(command))?
}

/// A runbook section of docs/operating.md, up to the next heading.
fn section(title: &str) -> &'static str {
    let start = OPERATING.find(&format!("### {title}\n")).unwrap_or_else(|| panic!("no section {title}"));
    let rest = &OPERATING[start + 4..];
    &rest[..rest.find("\n#").unwrap_or(rest.len())]
}

#[test]
fn every_command_run_in_the_container_is_the_binary_and_one_of_its_subcommands() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<_> =
        std::fs::read_dir(root.join("docs")).expect("docs").map(|e| e.expect("entry").path()).collect();
    docs.push(root.join("README.md"));
    let mut seen = 0;
    for path in docs.iter().filter(|p| p.extension().is_some_and(|e| e == "md")) {
        let text = std::fs::read_to_string(path).expect("read doc");
        let path = path.display();
        for argv in commands(&text).iter().filter_map(|c| in_container(c)) {
            assert_eq!(argv[0], "/hostpath-provisioner", "{path}: the image holds nothing else: {argv:?}");
            assert!(SUBCOMMANDS.contains(&argv.get(1).map(String::as_str).unwrap_or("")), "{path}: {argv:?}");
            seen += 1;
        }
    }
    assert!(seen >= 3, "the doctor's and the NotReady runbook's commands were found ({seen})");
}

/// Runs the in-container part of the NotReady runbook's command with the test's binary, in an
/// environment holding only `HEALTH_ADDR` (as the pod's does); returns exit code and stdout.
fn run_not_ready_runbook(health_addr: &str) -> (Option<i32>, String, String) {
    let argv = commands(section("HostpathProvisionerNotReady"))
        .iter()
        .find_map(|c| in_container(c))
        .expect("the NotReady runbook runs a command in the pod");
    let output = Command::new(binary())
        .args(&argv[1..])
        .env_clear()
        .env("HEALTH_ADDR", health_addr)
        .stdin(Stdio::null())
        .output()
        .expect("run the runbook's command");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_not_ready_runbook_prints_why_from_inside_the_pod() {
    // A node whose pool is not a mount point while it must be: up, answering, not ready.
    let mut env = TestEnv::start("runbook", 0).await;
    env.add_node_no_wait(&format!("{}-1", env.group), &|spec| spec.env("REQUIRE_MOUNTPOINT", "true")).await;
    let unready = env.nodes[0].provisioner.health_addr();
    testbed::wait_for("the provisioner answers 503", TIMEOUT, || async {
        anyhow::Ok(testbed::http_get(unready, "/readyz").await.ok().filter(|(status, _)| *status == 503))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let (code, out, err) = run_not_ready_runbook(&unready.to_string());
    assert_eq!(code, Some(1), "not ready: {out} {err}");
    let root = env.nodes[0].pool_root.display().to_string();
    assert!(out.starts_with("not ready: unusable pool(s): pool legacy at") && out.contains(&root), "says why: {out}");
    // A ready node; the wildcard address, as the shipped manifests set it, is asked on loopback.
    env.add_node(&format!("{}-2", env.group), &|spec| spec).await;
    let ready = env.nodes[1].provisioner.health_addr();
    let (code, out, _) = run_not_ready_runbook(&format!("0.0.0.0:{}", ready.port()));
    assert_eq!((code, out.lines().next()), (Some(0), Some("ok")), "{out}");
    // Nothing listening: says so, with its own exit code.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (code, _, err) = run_not_ready_runbook(&closed.to_string());
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("no answer") && err.contains(&closed.to_string()), "{err}");
    let (code, _, err) = run_not_ready_runbook("nowhere");
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("HEALTH_ADDR: invalid value \"nowhere\""), "{err}");
}

/// This host's first global unicast IPv4 address: the API server proxies only to such pod IPs.
fn host_ip() -> IpAddr {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list that is read and then freed here, and nothing else.
    assert_eq!(unsafe { libc::getifaddrs(&mut addrs) }, 0, "getifaddrs");
    let mut found = None;
    let mut next = addrs;
    while let Some(entry) = unsafe { next.as_ref() } {
        let addr = unsafe { entry.ifa_addr.as_ref() };
        if let Some(addr) = addr.filter(|a| i32::from(a.sa_family) == libc::AF_INET) {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let v4 = unsafe { *(addr as *const libc::sockaddr as *const libc::sockaddr_in) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr));
            if !ip.is_loopback() && !ip.is_link_local() && !ip.is_unspecified() && found.is_none() {
                found = Some(IpAddr::V4(ip));
            }
        }
        next = entry.ifa_next;
    }
    unsafe { libc::freeifaddrs(addrs) };
    found.expect("a non-loopback IPv4 address on this host")
}

/// Forwards connections to `listen` (an address the API server may proxy to) to `target`.
async fn forward(listen: IpAddr, target: SocketAddr) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind((listen, 0)).await.expect("bind forwarder");
    let addr = listener.local_addr().expect("forwarder address");
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    addr
}

/// A Pod object standing for a provisioner pod at `ip` (no kubelet runs it: its status is set
/// as the kubelet would).
async fn pod_at(env: &TestEnv, name: &str, node: &str, ip: IpAddr) {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "namespace": env.ns },
        "spec": { "nodeName": node, "containers": [{ "name": "hostpath-provisioner", "image": "hostpath-provisioner" }] },
    }))
    .expect("pod");
    env.pods().create(&PostParams::default(), &pod).await.expect("create pod");
    let status = serde_json::json!({ "status": { "phase": "Running", "podIP": ip.to_string(), "podIPs": [{ "ip": ip.to_string() }] } });
    env.pods().patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("pod status");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_pod_proxy_form_is_routed_and_shows_ok_but_not_why_a_pod_is_not_ready() {
    let mut env = TestEnv::start("podproxy", 1).await;
    env.add_node_no_wait(&format!("{}-2", env.group), &|spec| spec.env("REQUIRE_MOUNTPOINT", "true")).await;
    let ip = host_ip();
    let ready_at = forward(ip, env.nodes[0].provisioner.health_addr()).await;
    let unready_at = forward(ip, env.nodes[1].provisioner.health_addr()).await;
    pod_at(&env, "ready", &env.nodes[0].name, ip).await;
    pod_at(&env, "unready", &env.nodes[1].name, ip).await;
    let template = commands(OPERATING)
        .into_iter()
        .find(|c| c.starts_with("kubectl get --raw "))
        .expect("docs/operating.md names the pod proxy form");
    let raw = |pod: &str, port: u16| {
        let command =
            template.replace("<namespace>", &env.ns).replace("<pod>", pod).replace(":8081/", &format!(":{port}/"));
        let path = command.trim_start_matches("kubectl get --raw ").trim_matches('"').to_owned();
        env.cp.run_kubectl(env.cp.temp_dir(), &["get", "--raw", &path])
    };
    let ok = testbed::wait_for("the ready pod through the proxy", TIMEOUT, || async {
        anyhow::Ok(raw("ready", ready_at.port()).ok().filter(|out| out.starts_with("ok")))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    assert!(ok.starts_with("ok\n"), "{ok}");
    // The unready pod's 503 reaches kubectl, which keeps its status but not the body saying why.
    let error = testbed::wait_for("the unready pod through the proxy", TIMEOUT, || async {
        // Not "error trying to reach service", the proxy's own 503 when it cannot connect.
        let error = raw("unready", unready_at.port()).err().map(|e| e.to_string());
        anyhow::Ok(
            error.filter(|e| e.contains("(ServiceUnavailable): the server is currently unable to handle the request")),
        )
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let direct = testbed::http_get(env.nodes[1].provisioner.health_addr(), "/readyz").await.expect("readyz");
    assert_eq!(direct.0, 503);
    assert!(!error.contains("unusable pool"), "kubectl shows the body after all, the runbook could use it: {error}");
    // A pod that does not exist is the pods resource's NotFound, not a path the API server lacks.
    let missing = raw("no-such-pod", ready_at.port()).unwrap_err().to_string();
    assert!(missing.contains("NotFound") && missing.contains("no-such-pod"), "{missing}");
}

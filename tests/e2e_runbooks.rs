//! End-to-end: the commands docs/operating.md gives for inside the provisioner's container run with
//! what its image holds (the binary alone: no shell, no wget or curl), and the NotReady runbook's
//! command prints why a real provisioner is not ready. (The API server's pod proxy is not used:
//! it proxies only to pod addresses, and the tests here send traffic to loopback alone.)

mod common;

use std::process::{Command, Stdio};

use common::*;

const OPERATING: &str = include_str!("../docs/operating.md");

/// The subcommands the binary has (its `--help` lists them).
const SUBCOMMANDS: [&str; 6] =
    ["doctor", "readyz", "check-volume", "operator", "pool-mount", "release-claims-of-removed-nodes"];
/// Flags that stand alone instead of a subcommand (docs/upgrading.md reads the version so).
const ALONE: [&str; 1] = ["--version"];

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
            let first = argv.get(1).map(String::as_str).unwrap_or("");
            assert!(SUBCOMMANDS.contains(&first) || (ALONE.contains(&first) && argv.len() == 2), "{path}: {argv:?}");
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
    // Until its initial lists arrive it is not ready for that reason; the pool's comes after.
    testbed::wait_for("the provisioner answers 503 for its pool", TIMEOUT, || async {
        anyhow::Ok(
            testbed::http_get(unready, "/readyz")
                .await
                .ok()
                .filter(|(status, body)| *status == 503 && body.contains("unusable pool")),
        )
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

/// The `const NAME: &str = "Reason";` lines of a piece of source: their values.
fn string_constants(source: &str) -> Vec<String> {
    source
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let line = line.strip_prefix("pub ").unwrap_or(line);
            line.strip_prefix("const ")?.split_once(": &str = \"").map(|(_, rest)| rest)
        })
        .filter_map(|rest| rest.strip_suffix("\";").map(str::to_owned))
        .collect()
}

/// The event reasons the provisioner posts, read from the source so that a reason added there
/// is checked without a list to keep: `error::reason` (src/error.rs), and the external
/// resizer's, which the expansion reconciler keeps apart (src/reconciling/resize.rs).
fn event_reasons_in_the_code() -> Vec<String> {
    let source = include_str!("../src/error.rs");
    let start = source.find("pub mod reason {").expect("src/error.rs has the reason module");
    let module = &source[start..start + source[start..].find("\n}").expect("end of the reason module")];
    let resize = include_str!("../src/reconciling/resize.rs");
    let resize = &resize[..resize.find("#[cfg(test)]").unwrap_or(resize.len())];
    let mut reasons = string_constants(module);
    reasons.extend(string_constants(resize));
    reasons
}

/// docs/operating.md's events table lists every reason the provisioner posts, and only those.
#[test]
fn the_events_table_lists_every_event_reason_the_code_posts() {
    let reasons = event_reasons_in_the_code();
    for expected in ["ProvisioningFailed", "SnapshotReady", "SnapshotFailed", "SnapshotDeleteWaiting", "Resizing"] {
        assert!(reasons.iter().any(|r| r == expected), "read from src/error.rs: {reasons:?}");
    }
    let events = &OPERATING[OPERATING.find("## Events\n").expect("an Events section")..];
    let events = &events[..events[3..].find("\n## ").map_or(events.len(), |end| end + 3)];
    let rows: Vec<&str> = events
        .lines()
        .filter_map(|line| line.strip_prefix("| `")?.split_once("` |").map(|(reason, _)| reason))
        .collect();
    let missing: Vec<&String> = reasons.iter().filter(|r| !rows.contains(&r.as_str())).collect();
    let unknown: Vec<&&str> = rows.iter().filter(|row| !reasons.iter().any(|r| r == *row)).collect();
    assert!(missing.is_empty(), "docs/operating.md, \"Events\", lacks {missing:?}");
    assert!(unknown.is_empty(), "docs/operating.md, \"Events\", lists reasons the code never posts: {unknown:?}");
}

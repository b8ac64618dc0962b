//! End-to-end: what `/metrics` serves for admins' existing dashboards and alerts. The
//! sig-storage library's `controller_*` names counted by class at the library's count points,
//! build info and process metrics, the OS-disk gauge on a pool that is and one that is not on the
//! root filesystem, and claims waiting for a node without a provisioner.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::*;
use testbed::fixtures;

/// The value of the sample whose name and labels are exactly `series`.
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Scrapes `node` until `series` has a value `accept` takes (counts land just after the API
/// change the test waits for), then returns the whole scrape.
async fn wait_sample(env: &TestEnv, node: usize, series: &str, accept: impl Fn(f64) -> bool) -> String {
    let provisioner = &env.nodes[node].provisioner;
    testbed::wait_for(&format!("{series} on node {node}"), TIMEOUT, || async {
        let metrics = provisioner.metrics().await?;
        anyhow::Ok(sample(&metrics, series).filter(|v| accept(*v)).map(|_| metrics))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()))
}

#[tokio::test(flavor = "multi_thread")]
async fn library_metrics_count_provisions_refusals_and_deletions_by_class() {
    let env = TestEnv::start("libmetrics", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();

    let pv = {
        env.create_claim(fixtures::claim(&env.ns, "ok", &class, "1Mi").provision_on_node(&node)).await;
        env.wait_bound("ok").await
    };
    // Refused (block volumes are off on this node): a failed attempt for the library.
    let block = env.create_claim(fixtures::claim(&env.ns, "blk", &class, "1Mi").provision_on_node(&node).block()).await;
    env.wait_event(&env.ns, &uid(&block), "ProvisioningFailed").await;
    env.delete_claim("ok").await;
    env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;

    let claim_labels = format!(r#"{{class="{class}",source=""}}"#);
    let volume_labels = format!(r#"{{class="{class}"}}"#);
    let metrics =
        wait_sample(&env, 0, &format!("controller_persistentvolume_delete_total{volume_labels}"), |v| v >= 1.0).await;
    for (name, labels) in [
        ("controller_persistentvolumeclaim_provision_total", &claim_labels),
        ("controller_persistentvolumeclaim_provision_duration_seconds_count", &claim_labels),
        ("controller_persistentvolume_delete_total", &volume_labels),
        ("controller_persistentvolume_delete_duration_seconds_count", &volume_labels),
    ] {
        assert_eq!(sample(&metrics, &format!("{name}{labels}")), Some(1.0), "{name}{labels} in\n{metrics}");
    }
    assert_eq!(sample(&metrics, &format!("controller_persistentvolume_delete_failed_total{volume_labels}")), None);
    // The refusal counts once per look at the claim (each change of it), as in the library, and
    // our own counter says the same in its terms.
    let failed = sample(&metrics, &format!("controller_persistentvolumeclaim_provision_failed_total{claim_labels}"));
    assert!(failed.is_some_and(|n| n >= 1.0), "{metrics}");
    assert_eq!(sample(&metrics, r#"hostpath_provisioner_provisions_total{result="refused",reason="block"}"#), failed);

    // What this binary is, and the process's standard figures.
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    let commit = std::env::var("HPP_GIT_COMMIT").ok().filter(|c| !c.is_empty()).or(commit);
    let commit = commit.unwrap_or_else(|| "unknown".into());
    let build_info =
        format!(r#"hostpath_provisioner_build_info{{version="{}",commit="{commit}"}}"#, env!("CARGO_PKG_VERSION"));
    assert_eq!(sample(&metrics, &build_info), Some(1.0), "{build_info} in\n{metrics}");
    // `--version` says the same (docs/upgrading.md reads it from a running pod).
    let said = std::process::Command::new(binary()).arg("--version").output().expect("--version");
    assert_eq!(
        String::from_utf8_lossy(&said.stdout).trim(),
        format!("hostpath-provisioner {} (commit {commit})", env!("CARGO_PKG_VERSION"))
    );
    let log = std::fs::read_to_string(env.nodes[0].provisioner.log_path()).expect("provisioner log");
    assert!(
        log.lines().any(|l| l.contains("hostpath-provisioner starting") && l.contains(&commit)),
        "no start line with the version in\n{log}"
    );
    for name in ["process_resident_memory_bytes", "process_open_fds", "process_max_fds", "process_cpu_seconds_total"] {
        assert!(sample(&metrics, name).is_some_and(|v| v > 0.0), "{name} in\n{metrics}");
    }
    let started = sample(&metrics, "process_start_time_seconds").expect("start time");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    assert!(started <= now + 1.0 && started > now - 3600.0, "start time {started}, now {now}");
    assert_eq!(sample(&metrics, "hostpath_provisioner_ready"), Some(1.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_on_the_root_filesystem_is_reported_on_the_os_disk_and_one_on_its_own_disk_is_not() {
    let mut env = TestEnv::start("osdisk", 0).await;
    let (plain, own) = (format!("{}-plain", env.group), format!("{}-own", env.group));
    let _own_disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &own), 16, None);
    env.add_node(&plain, &|spec| spec).await;
    env.add_node(&own, &|spec| spec).await;
    // Run as a host process, the provisioner's OS disk is the filesystem at `/`.
    let plain_root = testbed::pool_root_for(env.cp, &plain);
    let on_root = std::fs::metadata(&plain_root).unwrap().dev() == std::fs::metadata(Path::new("/")).unwrap().dev();
    let expected = if on_root { 1.0 } else { 0.0 };
    // A series per pool root: a pool over several disks has one for each.
    let gauge =
        |root: &Path| format!(r#"hostpath_provisioner_pool_shares_os_disk{{pool="legacy",root="{}"}}"#, root.display());
    let metrics = wait_sample(&env, 0, &gauge(&plain_root), |v| v == expected).await;
    assert_eq!(sample(&metrics, "kubevirt_hpp_pool_path_shared_with_os"), Some(expected), "{metrics}");
    let metrics = wait_sample(&env, 1, &gauge(&testbed::pool_root_for(env.cp, &own)), |v| v == 0.0).await;
    assert_eq!(sample(&metrics, "kubevirt_hpp_pool_path_shared_with_os"), Some(0.0), "{metrics}");
    for node in &mut env.nodes {
        node.provisioner.terminate();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_placed_on_a_node_without_a_provisioner_is_counted_once_for_that_node() {
    let mut env = TestEnv::start("absentmetric", 0).await;
    env.own_provisioner();
    for i in 1..=2 {
        env.add_node(&format!("{}-{i}", env.group), &|spec| spec).await;
    }
    let class = env.class("imm", |c| c.immediate()).await;
    let absent = format!("{}-absent", env.group);
    let claim = env.create_claim(fixtures::claim(&env.ns, "typo", &class, "1Mi").provision_on_node(&absent)).await;
    env.wait_event(&env.ns, &uid(&claim), "NoProvisionerOnNode").await;
    let series = format!(r#"hostpath_provisioner_claims_waiting_for_absent_node{{node="{absent}"}}"#);
    // The node that speaks for the claim reports it; the other one does not.
    let total = testbed::wait_for("the waiting claim reported", TIMEOUT, || async {
        let mut total = 0.0;
        for node in &env.nodes {
            total += sample(&node.provisioner.metrics().await?, &series).unwrap_or(0.0);
        }
        anyhow::Ok((total > 0.0).then_some(total))
    })
    .await
    .expect("reported");
    assert_eq!(total, 1.0, "one report for one claim");

    // What Prometheus stores is what a scrape through the shipped ServiceMonitor makes of this:
    // a target label of the same name as a metric's own takes its place (the metric's is renamed
    // exported_<name>), and the alert would then name the scraped node, not the absent one.
    let mut scraped = BTreeSet::new();
    for node in &env.nodes {
        scraped.extend(label_names(&node.provisioner.metrics().await.expect("metrics")));
    }
    assert!(scraped.contains("node"), "the absent node's label is served: {scraped:?}");
    let monitor = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(SERVICE_MONITOR)).unwrap();
    let mut target_labels: BTreeSet<String> = monitor
        .lines()
        .filter_map(|l| l.trim().strip_prefix("targetLabel:"))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .collect();
    target_labels.extend(OPERATOR_TARGET_LABELS.iter().map(|l| l.to_string()));
    let collisions: Vec<_> = scraped.intersection(&target_labels).collect();
    assert!(collisions.is_empty(), "labels the scrape would rename to exported_*: {collisions:?}");
}

/// The ServiceMonitor as shipped (rendered from the chart).
const SERVICE_MONITOR: &str = "deploy/monitoring/servicemonitor.yaml";
/// Target labels the Prometheus Operator gives every target of a ServiceMonitor endpoint.
const OPERATOR_TARGET_LABELS: [&str; 7] = ["job", "instance", "namespace", "service", "pod", "container", "endpoint"];

/// The label names of every sample in a text exposition.
fn label_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines().filter(|l| !l.starts_with('#')) {
        let Some(labels) = line.split_once('{').and_then(|(_, rest)| rest.rsplit_once('}')).map(|(l, _)| l) else {
            continue;
        };
        // Values are quoted and ours hold no `",` sequence: split on it.
        for pair in labels.split("\",") {
            if let Some((name, _)) = pair.split_once('=') {
                names.insert(name.trim().to_owned());
            }
        }
    }
    names
}

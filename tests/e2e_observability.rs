//! End-to-end: metrics after a provisioning, `/readyz` through an API outage, and a clean exit
//! on SIGTERM. Uses a control plane of its own because it stops the API server.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use testbed::{Cluster, fixtures};

const TIMEOUT: Duration = Duration::from_secs(90);

/// The value of a sample line `name{labels} value` in Prometheus text output.
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_provisions_and_readyz_follows_the_api_server() {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_hostpath-provisioner"));
    let mut cluster = Cluster::start(1, &binary).await.expect("cluster");
    let client = cluster.client();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace("obs")).await.unwrap();
    let class = fixtures::storage_class("obs", "kubevirt.io/hostpath-provisioner").immediate().build();
    Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await.unwrap();
    let node = cluster.nodes[0].name.clone();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "obs");
    claims
        .create(&PostParams::default(), &fixtures::claim("obs", "m", "obs", "1Mi").provision_on_node(&node).build())
        .await
        .unwrap();
    testbed::wait_for("claim Bound", TIMEOUT, || async {
        let c = claims.get("m").await?;
        anyhow::Ok((c.status.and_then(|s| s.phase).as_deref() == Some("Bound")).then_some(()))
    })
    .await
    .expect("bound");

    // Metrics: the provisioning is counted, timed, and the pool is measured.
    let provisioner = &cluster.nodes[0].provisioner;
    let metrics = provisioner.metrics().await.expect("scrape /metrics");
    let provisions = sample(&metrics, "hostpath_provisioner_provisions_total{result=\"success\",reason=\"none\"}");
    assert_eq!(provisions, Some(1.0), "{metrics}");
    let timed = sample(&metrics, "hostpath_provisioner_provision_duration_seconds_count");
    assert_eq!(timed, Some(1.0), "{metrics}");

    // /readyz turns unready while the API server is down and ready again after it returns.
    let health = provisioner.health_addr();
    assert_eq!(testbed::http_get(health, "/readyz").await.unwrap().0, 200);
    cluster.cp.stop_apiserver();
    let reason = testbed::wait_for("readyz unready during the outage", TIMEOUT, || async {
        let (status, body) = testbed::http_get(health, "/readyz").await?;
        anyhow::Ok((status == 503).then_some(body))
    })
    .await
    .expect("unready");
    assert!(reason.contains("not reachable"), "{reason}");
    assert_eq!(testbed::http_get(health, "/healthz").await.unwrap().0, 200, "alive all the same");
    cluster.cp.start_apiserver().await.expect("apiserver back");
    testbed::wait_for("readyz ready after the outage", TIMEOUT, || async {
        anyhow::Ok((testbed::http_get(health, "/readyz").await?.0 == 200).then_some(()))
    })
    .await
    .expect("ready again");
    let metrics = cluster.nodes[0].provisioner.metrics().await.unwrap();
    assert!(sample(&metrics, "hostpath_provisioner_watch_restarts_total").unwrap_or(0.0) >= 1.0, "{metrics}");

    // SIGTERM: a clean exit.
    let status = cluster.nodes[0].provisioner.terminate().expect("exit status");
    assert!(status.success(), "exit status on SIGTERM: {status:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_an_api_outage_exits_on_its_own() {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_hostpath-provisioner"));
    let mut cluster = Cluster::start(1, &binary).await.expect("cluster");
    let health = cluster.nodes[0].provisioner.health_addr();
    cluster.cp.stop_apiserver();
    testbed::wait_for("readyz unready during the outage", TIMEOUT, || async {
        anyhow::Ok((testbed::http_get(health, "/readyz").await?.0 == 503).then_some(()))
    })
    .await
    .expect("unready");
    // Nothing is in flight: the process exits by itself (the harness would SIGKILL it after
    // 10 s, which is not a success), without waiting for the API server or its 20 s deadline.
    let asked = std::time::Instant::now();
    let status = cluster.nodes[0].provisioner.terminate().expect("exit status");
    eprintln!("exited {:?} after SIGTERM during the outage", asked.elapsed());
    assert!(status.success(), "exit status on SIGTERM during the outage: {status:?}");
    cluster.cp.start_apiserver().await.expect("apiserver back");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_while_etcd_is_down_exits_on_its_own() {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_hostpath-provisioner"));
    let mut cluster = Cluster::start(1, &binary).await.expect("cluster");
    // The API server answers connections but its requests hang: the harder outage.
    cluster.cp.stop_etcd();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let asked = std::time::Instant::now();
    let status = cluster.nodes[0].provisioner.terminate().expect("exit status");
    eprintln!("exited {:?} after SIGTERM while etcd was down", asked.elapsed());
    assert!(status.success(), "exit status on SIGTERM while etcd is down: {status:?}");
    cluster.cp.start_etcd().await.expect("etcd back");
}

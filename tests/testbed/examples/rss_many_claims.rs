//! Memory of one provisioner with many claims in the cluster (issue 5's "RSS with 10,000 claims").
//!
//! `cargo run --release -p testbed --example rss_many_claims -- 10000 target/release/hostpath-provisioner`
//!
//! Starts a local control plane and one provisioner, creates N claims of another provisioner's
//! class (every node caches every claim's metadata, whoever provisions it), waits for the watch
//! to settle and prints the provisioner's VmRSS and VmHWM before and after.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use testbed::{ControlPlane, SimNode, fixtures};

fn memory(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM")).collect::<Vec<_>>().join(", ")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let claims_wanted: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let binary = PathBuf::from(args.next().unwrap_or_else(|| "target/release/hostpath-provisioner".into()));
    let cp = ControlPlane::start().await?;
    let node = SimNode::start(&cp, "node-1", &binary, &[]).await?;
    let pid = node.provisioner.pid();
    println!("provisioner at start: {}", memory(pid));
    let client = cp.admin_client();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace("many")).await?;
    let class = fixtures::storage_class("other", "example.com/other").immediate().build();
    Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client, "many");
    let started = Instant::now();
    let failures = stream::iter(0..claims_wanted)
        .map(|i| {
            let claims = claims.clone();
            async move {
                let claim = fixtures::claim("many", &format!("c{i}"), "other", "1Gi").build();
                claims.create(&PostParams::default(), &claim).await.is_err()
            }
        })
        .buffer_unordered(16)
        .filter(|failed| std::future::ready(*failed))
        .count()
        .await;
    println!("created {} claims in {:.1?} ({failures} failed)", claims_wanted - failures, started.elapsed());
    tokio::time::sleep(Duration::from_secs(15)).await;
    println!("provisioner with {claims_wanted} claims in the cluster: {}", memory(pid));
    Ok(())
}

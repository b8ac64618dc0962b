//! What an enforced quota adds to a provisioning: claims pinned to one node, one at a time,
//! alternating a plain class and a `quota: enforce` class on the same btrfs pool (quota enabled),
//! timed from the claim's creation to its PV appearing in the watch. The difference of the two
//! is the cost of a subvolume and its qgroup limit over a `mkdir`.
//!
//! The btrfs loop filesystem is mounted over the last node's pool root (its provisioner re-opens
//! a root that was replaced by a mount) and unmounted at the end, even on failure.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use testbed::fixtures;

use super::setup::{Env, IMMEDIATE_CLASS};
use super::stats::Summary;

const NAMESPACE: &str = "bench-quota";
const QUOTA_CLASS: &str = "bench-quota";
/// Volumes per class.
const VOLUMES: usize = 25;
const TIMEOUT: Duration = Duration::from_secs(120);

pub struct QuotaLatency {
    /// Claim created -> PV seen, plain directories.
    pub plain: Summary,
    /// Claim created -> PV seen, quota volumes (btrfs subvolume + qgroup limit).
    pub quota: Summary,
}

/// The btrfs pool: unmounted (lazily, the provisioner holds it open) and its image removed on drop.
struct BtrfsPool {
    mount: PathBuf,
    image: PathBuf,
}

impl Drop for BtrfsPool {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
        let _ = std::fs::remove_file(&self.image);
    }
}

fn run_cmd(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

pub async fn run(env: &Env) -> Result<QuotaLatency> {
    let node = env.nodes.last().context("no nodes")?;
    let image = std::env::temp_dir().join(format!("bench-quota-{}.img", std::process::id()));
    std::fs::File::create(&image)?.set_len(512 << 20)?;
    run_cmd(Command::new("mkfs.btrfs").args(["-q", "-f"]).arg(&image))?;
    run_cmd(Command::new("mount").arg("-o").arg("loop").arg(&image).arg(&node.pool_root))?;
    let _pool = BtrfsPool { mount: node.pool_root.clone(), image };
    // The bench may use btrfs-progs; the provisioner never enables quota itself.
    run_cmd(Command::new("btrfs").args(["quota", "enable"]).arg(&node.pool_root))?;

    let client = env.client.clone();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace(NAMESPACE)).await?;
    let class = fixtures::storage_class(QUOTA_CLASS, "kubevirt.io/hostpath-provisioner")
        .immediate()
        .parameter("quota", "enforce")
        .build();
    Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let (mut plain, mut quota) = (Vec::new(), Vec::new());
    let mut names = Vec::new();
    for i in 0..2 * VOLUMES {
        // Alternating, so that drift in the machine's load hits both alike.
        let (class, times) = if i % 2 == 0 { (IMMEDIATE_CLASS, &mut plain) } else { (QUOTA_CLASS, &mut quota) };
        let name = format!("q-{i}");
        let claim = fixtures::claim(NAMESPACE, &name, class, "10Mi").provision_on_node(&node.name).build();
        let created = Instant::now();
        let uid = claims.create(&PostParams::default(), &claim).await?.metadata.uid.unwrap_or_default();
        let pv = format!("pvc-{uid}");
        let seen = loop {
            if let Some(seen) = env.observer.with(|o| o.pvs.get(&pv).and_then(|p| p.seen)) {
                break seen;
            }
            if created.elapsed() > TIMEOUT {
                bail!("no PV for claim {NAMESPACE}/{name} ({class}) after {TIMEOUT:?}");
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        times.push(seen.saturating_duration_since(created).as_secs_f64());
        names.push((name, pv));
    }
    for (name, _) in &names {
        claims.delete(name, &DeleteParams::default()).await?;
    }
    let deleted = Instant::now();
    for (_, pv) in &names {
        while env.observer.with(|o| o.pvs.get(pv).and_then(|p| p.gone).is_none()) {
            if deleted.elapsed() > TIMEOUT {
                bail!("PV {pv} not deleted {TIMEOUT:?} after its claim");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(QuotaLatency { plain: Summary::of_seconds(&plain), quota: Summary::of_seconds(&quota) })
}

impl QuotaLatency {
    /// Median extra milliseconds a quota volume costs.
    pub fn extra_p50_ms(&self) -> f64 {
        self.quota.p50 - self.plain.p50
    }

    pub fn json(&self) -> Value {
        json!({
            "volumes_per_class": VOLUMES,
            "plain_claim_to_pv": self.plain.json(),
            "quota_claim_to_pv": self.quota.json(),
            "extra_p50_ms": self.extra_p50_ms(),
        })
    }
}

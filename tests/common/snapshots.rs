//! `HostPathSnapshot` in the tests (docs/snapshots.md): the CRD installed, snapshots taken and
//! waited for, restores asked for, data written for byte copies.

use std::path::{Path, PathBuf};

use hostpath_provisioner::deciding::snapshot::{GROUP, HostPathSnapshot, KIND};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, PostParams};
use testbed::fixtures;

use super::{TIMEOUT, TestEnv};

pub const CRD: &str = "hostpathsnapshots.hostpath-provisioner.kubevirt.io";

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Installs the CRD as the manifests do (idempotent: the tests of this binary share the control
/// plane).
pub fn install_crd(env: &TestEnv) {
    let run = |args: &[&str]| env.cp.run_kubectl(&repo(), args).unwrap_or_else(|e| panic!("{e:#}"));
    run(&["apply", "--server-side", "-f", "deploy/snapshots/crd.yaml"]);
    run(&["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{CRD}")]);
}

pub fn host_path(pv: &PersistentVolume) -> PathBuf {
    PathBuf::from(pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone()).expect("hostPath"))
}

pub fn snapshots(env: &TestEnv) -> Api<HostPathSnapshot> {
    Api::namespaced(env.client.clone(), &env.ns)
}

pub async fn take(env: &TestEnv, name: &str, source: &str) -> HostPathSnapshot {
    snapshots(env).create(&PostParams::default(), &HostPathSnapshot::new(name, source)).await.expect("create snapshot")
}

pub async fn wait_ready(env: &TestEnv, name: &str) -> HostPathSnapshot {
    testbed::wait_for(&format!("snapshot {name} ready"), TIMEOUT, || async {
        let snapshot = snapshots(env).get(name).await?;
        anyhow::Ok(snapshot.status.as_ref().is_some_and(|s| s.ready_to_use).then_some(snapshot))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()))
}

pub fn restoring(
    env: &TestEnv,
    name: &str,
    class: &str,
    size: &str,
    snapshot: &str,
    node: &str,
) -> fixtures::ClaimBuilder {
    fixtures::claim(&env.ns, name, class, size).provision_on_node(node).data_source_ref(GROUP, KIND, snapshot)
}

/// Writes `mib` MiB of data that is neither sparse nor zeros (a byte copy copies every block).
pub fn write_mib(path: &Path, mib: usize) {
    let block: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    let mut file = std::fs::File::create(path).unwrap();
    for _ in 0..mib {
        std::io::Write::write_all(&mut file, &block).unwrap();
    }
    file.sync_all().unwrap();
}

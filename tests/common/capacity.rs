//! Published capacity (`--publish-capacity`) in the tests: the CSIDriver that makes
//! kube-scheduler read it, and the objects a node published.

use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, ListParams};

use super::{TIMEOUT, TestEnv};

/// Free space of `dir`'s filesystem as an unprivileged writer sees it (what the provisioner publishes).
pub fn available_bytes(dir: &std::path::Path) -> u64 {
    let st = rustix::fs::statvfs(dir).expect("statvfs");
    st.f_bavail * st.f_frsize
}

/// Gives the test a provisioner name that is a valid object name, and the CSIDriver object of
/// that name with `storageCapacity: true` that makes kube-scheduler read the published objects.
pub async fn publishing_provisioner(env: &mut TestEnv) -> CsiDriver {
    env.provisioner = format!("{}.hostpath.test", env.group);
    CsiDriver::create(env, &env.provisioner).await
}

/// The CSIDriver of a test (named `name`, as the chart, the component and the operator make it),
/// deleted when dropped.
pub struct CsiDriver {
    api: Api<k8s_openapi::api::storage::v1::CSIDriver>,
    name: String,
}

impl CsiDriver {
    pub async fn create(env: &TestEnv, name: &str) -> CsiDriver {
        let driver: k8s_openapi::api::storage::v1::CSIDriver = serde_json::from_value(serde_json::json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "CSIDriver",
            "metadata": { "name": name },
            "spec": { "storageCapacity": true, "attachRequired": false, "podInfoOnMount": false },
        }))
        .expect("CSIDriver");
        let api = Api::all(env.client.clone());
        api.create(&kube::api::PostParams::default(), &driver).await.expect("create CSIDriver");
        CsiDriver { api, name: name.to_owned() }
    }
}

impl Drop for CsiDriver {
    fn drop(&mut self) {
        let (api, name) = (self.api.clone(), self.name.clone());
        // Drop cannot await: delete from a thread of its own with its own runtime.
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let _ = runtime.block_on(api.delete(&name, &Default::default()));
        })
        .join();
    }
}

/// The CSIStorageCapacity objects published for `class`, by the hostname their node topology selects.
pub async fn published(env: &TestEnv, class: &str) -> std::collections::BTreeMap<String, CSIStorageCapacity> {
    // The provisioners of the tests keep their leases, hence their objects, in `default`.
    let api: Api<CSIStorageCapacity> = Api::namespaced(env.client.clone(), "default");
    let list = api.list(&ListParams::default()).await.expect("list CSIStorageCapacity");
    list.items
        .into_iter()
        .filter(|c| c.storage_class_name == class)
        .filter_map(|c| {
            let host = c.node_topology.as_ref()?.match_labels.as_ref()?.get("kubernetes.io/hostname")?.clone();
            Some((host, c))
        })
        .collect()
}

/// Waits until the objects of `class` are published for exactly `nodes`.
pub async fn wait_published(
    env: &TestEnv,
    class: &str,
    nodes: &[&str],
) -> std::collections::BTreeMap<String, CSIStorageCapacity> {
    let want: std::collections::BTreeSet<String> = nodes.iter().map(|n| n.to_string()).collect();
    testbed::wait_for(&format!("capacity of {class} published for {want:?}"), TIMEOUT, || async {
        let objects = published(env, class).await;
        let hosts: std::collections::BTreeSet<String> = objects.keys().cloned().collect();
        anyhow::Ok((hosts == want).then_some(objects))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()))
}

pub fn bytes_of(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> u64 {
    hostpath_provisioner::deciding::capacity::parse_bytes(&q.expect("quantity set").0).expect("quantity")
}

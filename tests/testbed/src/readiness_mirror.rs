//! Plays, for provisioner processes standing in for nodes, the two parts of a cluster that make
//! pod readiness visible: the kubelet's readiness probe (`GET /readyz` on each process's health
//! address, every half second, a probe that fails or does not answer within a second is not
//! ready) and the EndpointSlice controller (one EndpointSlice labelled with the Service name,
//! one endpoint per process with its node name and ready condition, written only when a
//! condition changes). Provisioners started with `--peer-service NAME` read their liveness from
//! it, as they do from the real controller's slices on a real cluster.
//!
//! The slice is not managed by the EndpointSlice controller (its `managed-by` label names this
//! mirror), so a controller-manager running that controller leaves it alone. Each endpoint gets
//! a made-up address (10.250.x.y) because the API requires one.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;

/// How often each process is probed by default (a test wants changes seen at once).
const PERIOD: Duration = Duration::from_millis(500);
/// A probe that takes longer fails.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Mirrors the readiness of the processes added to it until dropped (the slice is deleted then).
pub struct ReadinessMirror {
    members: Arc<Mutex<BTreeMap<String, SocketAddr>>>,
    task: tokio::task::JoinHandle<()>,
    api: Api<EndpointSlice>,
    name: String,
}

impl ReadinessMirror {
    /// Starts mirroring into the EndpointSlice of Service `service` in `namespace`, probing every
    /// half second.
    pub fn start(client: Client, namespace: &str, service: &str) -> ReadinessMirror {
        Self::start_with_period(client, namespace, service, PERIOD)
    }

    /// [`ReadinessMirror::start`] probing every `period` (the shipped readiness probe's is 5 s).
    pub fn start_with_period(client: Client, namespace: &str, service: &str, period: Duration) -> ReadinessMirror {
        let members = Arc::new(Mutex::new(BTreeMap::new()));
        let api: Api<EndpointSlice> = Api::namespaced(client, namespace);
        let name = format!("{service}-mirror");
        let task = tokio::spawn(mirror(api.clone(), name.clone(), service.to_owned(), members.clone(), period));
        ReadinessMirror { members, task, api, name }
    }

    /// Probes the process of `node` at `health` from now on.
    pub fn add(&self, node: &str, health: SocketAddr) {
        self.members.lock().unwrap_or_else(|e| e.into_inner()).insert(node.to_owned(), health);
    }

    /// Stops probing `node` and drops its endpoint (its pod was deleted).
    pub fn remove(&self, node: &str) {
        self.members.lock().unwrap_or_else(|e| e.into_inner()).remove(node);
    }
}

impl Drop for ReadinessMirror {
    fn drop(&mut self) {
        self.task.abort();
        let (api, name) = (self.api.clone(), self.name.clone());
        // Best effort; the control plane of a test goes away with it anyway.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { api.delete(&name, &DeleteParams::default()).await });
        }
    }
}

async fn mirror(
    api: Api<EndpointSlice>,
    name: String,
    service: String,
    members: Arc<Mutex<BTreeMap<String, SocketAddr>>>,
    period: Duration,
) {
    let mut written: Option<BTreeMap<String, bool>> = None;
    loop {
        let targets: Vec<(String, SocketAddr)> = members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(node, addr)| (node.clone(), *addr))
            .collect();
        let probes = targets.into_iter().map(|(node, addr)| async move {
            let probe = tokio::time::timeout(PROBE_TIMEOUT, crate::http_get(addr, "/readyz")).await;
            (node, matches!(probe, Ok(Ok((200, _)))))
        });
        let ready: BTreeMap<String, bool> = futures::future::join_all(probes).await.into_iter().collect();
        if written.as_ref() != Some(&ready) {
            let endpoints: Vec<_> = ready
                .iter()
                .enumerate()
                .map(|(i, (node, ready))| {
                    json!({
                        "addresses": [format!("10.250.{}.{}", i / 250, i % 250 + 1)],
                        "nodeName": node,
                        "conditions": { "ready": ready, "serving": ready, "terminating": false },
                    })
                })
                .collect();
            let slice = json!({
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": name,
                    "labels": {
                        "kubernetes.io/service-name": service,
                        "endpointslice.kubernetes.io/managed-by": "testbed-readiness-mirror",
                    },
                },
                "addressType": "IPv4",
                "endpoints": endpoints,
            });
            let params = PatchParams::apply("testbed-readiness-mirror").force();
            match api.patch(&name, &params, &Patch::Apply(&slice)).await {
                Ok(_) => written = Some(ready),
                Err(error) => eprintln!("testbed: readiness mirror: cannot write EndpointSlice {name}: {error}"),
            }
        }
        tokio::time::sleep(period).await;
    }
}

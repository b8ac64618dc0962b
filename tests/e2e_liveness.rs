//! End-to-end: liveness from the readiness of the provisioner pods (`--peer-service`), what the
//! shipped manifests use. The test plays the kubelet's readiness probe and the EndpointSlice
//! controller for the provisioner processes (testbed::ReadinessMirror); the real-node lane runs
//! the real ones.
//!
//! Proves, on a control plane of its own with an audit log:
//! - a cluster at rest costs nothing: over an idle window the provisioners make no request (no
//!   Lease renewal, no list), counted exactly from the audit log by their user agent;
//! - a dead node's shared work moves on as soon as its pod is no longer ready, with Leases that
//!   would keep it "alive" for an hour: liveness does not come from them.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use testbed::{Cluster, ClusterSpec, ReadinessMirror, fixtures};

const PROVISIONER: &str = "kubevirt.io/hostpath-provisioner";
const SERVICE: &str = "hpp-peers";
const NS: &str = "liveness";
const CLASS: &str = "liveness-shared";
const TIMEOUT: Duration = Duration::from_secs(90);
/// The idle window: long enough that a renewal or a periodic list would show.
const IDLE: Duration = Duration::from_secs(20);

/// What the audit log recorded of the provisioners' requests after `offset`: requests other than
/// watches (method and resource of each), and the watches started.
fn provisioner_requests(log: &Path, offset: u64) -> (Vec<String>, usize) {
    let mut file = std::fs::File::open(log).expect("audit log");
    file.seek(SeekFrom::Start(offset)).expect("seek");
    let mut text = String::new();
    file.read_to_string(&mut text).expect("read audit log");
    let (mut requests, mut watches) = (Vec::new(), 0);
    for line in text.lines() {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let agent = event["userAgent"].as_str().unwrap_or_default();
        if !agent.starts_with("hostpath-provisioner/") {
            continue;
        }
        let (verb, stage) = (event["verb"].as_str().unwrap_or_default(), event["stage"].as_str().unwrap_or_default());
        match (verb, stage) {
            ("watch", "ResponseStarted") => watches += 1,
            ("watch", _) => {}
            (_, "ResponseComplete") => {
                requests.push(format!("{verb} {} ({agent})", event["objectRef"]["resource"].as_str().unwrap_or("?")))
            }
            _ => {}
        }
    }
    (requests, watches)
}

#[tokio::test(flavor = "multi_thread")]
async fn liveness_from_readiness_costs_nothing_at_rest_and_moves_a_dead_nodes_shared_work_on_at_once() {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_hostpath-provisioner"));
    let scratch = std::env::temp_dir().join(testbed::unique_name("hpp-liveness"));
    let shared = scratch.join("nfs");
    std::fs::create_dir_all(&shared).unwrap();
    let (policy, audit) = (scratch.join("audit-policy.json"), scratch.join("audit.log"));
    let rules = serde_json::json!({
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy",
        "omitStages": ["RequestReceived"], "rules": [{ "level": "Metadata" }],
    });
    std::fs::write(&policy, rules.to_string()).unwrap();
    let mut spec = ClusterSpec::new(binary, 3);
    spec.control_plane.extra_apiserver_args = vec![
        format!("--audit-policy-file={}", policy.display()),
        format!("--audit-log-path={}", audit.display()),
        "--audit-log-format=json".into(),
        "--audit-log-mode=blocking".into(),
    ];
    spec.provisioner_args = [
        "--pool",
        &format!("nfs={},shared", shared.display()),
        "--peer-service",
        SERVICE,
        // Leases that would keep a dead node "alive" for an hour.
        "--node-lease-seconds",
        "3600",
    ]
    .map(String::from)
    .to_vec();
    let mut cluster = Cluster::start_with(spec).await.expect("cluster");
    let _logs = cluster.logs_on_failure();
    let client = cluster.client();
    let mirror = ReadinessMirror::start(client.clone(), "default", SERVICE);
    for node in &cluster.nodes {
        mirror.add(&node.name, node.provisioner.health_addr());
    }
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace(NS)).await.unwrap();
    let class = fixtures::storage_class(CLASS, PROVISIONER)
        .immediate()
        .parameter("storagePool", "nfs")
        .parameter("topology", "shared")
        .build();
    Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await.unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let bound = |name: String| {
        let claims = claims.clone();
        async move {
            testbed::wait_for(&format!("claim {name} bound"), TIMEOUT, || async {
                let claim = claims.get(&name).await?;
                Ok::<_, kube::Error>(claim.spec.and_then(|s| s.volume_name).filter(|v| !v.is_empty()))
            })
            .await
            .expect("bound")
        }
    };

    // Work first, so that the idle window follows a cluster that did something.
    claims.create(&PostParams::default(), &fixtures::claim(NS, "first", CLASS, "1Mi").build()).await.unwrap();
    bound("first".into()).await;

    // At rest: no request at all from any provisioner.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let offset = std::fs::metadata(&audit).expect("audit log").len();
    tokio::time::sleep(IDLE).await;
    let (requests, watches) = provisioner_requests(&audit, offset);
    eprintln!(
        "liveness: {} requests and {watches} watch starts by 3 provisioners in {} s at rest",
        requests.len(),
        IDLE.as_secs()
    );
    assert!(requests.is_empty(), "requests at rest:\n{}", requests.join("\n"));
    // The window is shorter than a watch's lifetime (about five minutes): none is renewed.
    assert!(watches <= 3, "{watches} watch starts at rest");

    // Two nodes die; their pods stop being ready. Every new shared claim is provisioned by the
    // one left, whichever node the ranking would have picked, though the dead nodes' Leases say
    // they are alive for an hour.
    for node in &mut cluster.nodes[..2] {
        node.provisioner.kill();
    }
    let names: Vec<String> = (1..=6).map(|i| format!("after-{i}")).collect();
    for name in &names {
        claims.create(&PostParams::default(), &fixtures::claim(NS, name, CLASS, "1Mi").build()).await.unwrap();
    }
    let started = std::time::Instant::now();
    for name in &names {
        bound(name.clone()).await;
    }
    eprintln!(
        "liveness: 6 shared claims bound by the one live node {:.1} s after two died",
        started.elapsed().as_secs_f64()
    );
    let survivor = cluster.nodes[2].provisioner.log_tail(400);
    assert!(survivor.contains("after-"), "the survivor provisioned them:\n{survivor}");
    drop(mirror);
    drop(cluster);
    let _ = std::fs::remove_dir_all(&scratch);
}

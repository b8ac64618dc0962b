//! Chaos: 200 node claims, 40 shared and 20 every-node claims created and deleted while
//! provisioners are SIGKILLed at random moments, kube-apiserver and etcd are each restarted once,
//! and one node is cut off from the API server for 60 s (a proxy in front of it, closed and
//! reopened); that node also keeps its liveness apart, so it and the others disagree about who
//! is alive and both act on the shared and every-node volumes. Every claim
//! must end bound exactly once, every released volume must be gone from disk and API, with no
//! orphan directory (on any node, in the shared pool, or of any every-node copy) and no
//! duplicate PV.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use testbed::{Cluster, ClusterSpec, fixtures};

const CLAIMS: usize = 200;
const NODES: usize = 3;
const BATCH: usize = 10;
const NS: &str = "chaos";
const CLASS: &str = "chaos-immediate";
const SHARED_CLAIMS: usize = 40;
const SHARED_CLASS: &str = "chaos-shared";
const EVERY_CLAIMS: usize = 20;
const EVERY_CLASS: &str = "chaos-every-node";
/// The per-node pool of the every-node claims.
const EVERY_POOL: &str = "edge";
const TOTAL: usize = CLAIMS + SHARED_CLAIMS + EVERY_CLAIMS;
/// When (after which batch of node claims) and how long one node is cut off from the API.
const PARTITION_AT: usize = 3;
const PARTITION: Duration = Duration::from_secs(60);
/// After which batch etcd is restarted.
const ETCD_RESTART_AT: usize = 15;
const DEADLINE: Duration = Duration::from_secs(300);
/// Where the partitioned node keeps its liveness, apart from the others.
const APART: &str = "chaos-lease-apart";

/// xorshift64*: a reproducible random sequence from a printed seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Retries an API call through the outage (the apiserver is down for a few seconds).
async fn persist<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let start = Instant::now();
    loop {
        match call().await {
            Ok(value) => return value,
            Err(error) if start.elapsed() < DEADLINE => {
                tracing_free_log(what, &error);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(error) => panic!("{what}: {error}"),
        }
    }
}

fn tracing_free_log(what: &str, error: &kube::Error) {
    if !matches!(error, kube::Error::Api(s) if s.code == 409) {
        eprintln!("chaos: {what} failed ({error}); retrying");
    }
}

/// Creates the claims concurrently, each retried through outages (AlreadyExists counts as done).
fn create_all(
    claims: &Api<PersistentVolumeClaim>,
    batch: impl Iterator<Item = PersistentVolumeClaim>,
) -> impl std::future::Future<Output = Vec<()>> {
    join_all(batch.map(|claim| {
        let claims = claims.clone();
        async move {
            persist("create claim", || async {
                match claims.create(&PostParams::default(), &claim).await {
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    other => other.map(|_| ()),
                }
            })
            .await
        }
    }))
}

/// Kills a random provisioner (SIGKILL) and starts it again.
fn kill_one(cluster: &mut Cluster, rng: &mut Rng) -> String {
    let index = rng.below(NODES as u64) as usize;
    let node = &mut cluster.nodes[index];
    node.provisioner.kill();
    node.provisioner.restart().expect("restart provisioner");
    node.name.clone()
}

fn claim_name(i: usize) -> String {
    format!("c{i:03}")
}

#[tokio::test(flavor = "multi_thread")]
async fn chaos_run_with_random_kills_and_an_apiserver_restart_converges() {
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_hostpath-provisioner"));
    // The shared pool: one directory every node's provisioner gets (the network filesystem).
    let scratch = std::env::temp_dir().join(format!("hpp-chaos-{}", std::process::id()));
    let shared = scratch.join("nfs");
    let every_path = scratch.join("edge");
    std::fs::create_dir_all(&shared).unwrap();
    let mut spec = ClusterSpec::new(binary, NODES);
    spec.provisioner_args =
        vec!["--pool".into(), format!("nfs={},shared", shared.display()), "--node-lease-seconds".into(), "6".into()];
    spec.per_node_pool = Some((EVERY_POOL.into(), every_path.clone()));
    let mut cluster = Cluster::start_with(spec).await.expect("cluster");
    let every_dirs: Vec<PathBuf> =
        cluster.nodes.iter().map(|n| testbed::per_node_pool_dir(&cluster.cp, &n.name, EVERY_POOL)).collect();

    // The last node talks to the API server through a proxy the test can cut, and keeps its
    // liveness apart from the others' (a namespace of its own): it believes it is alone and acts
    // on every shared and every-node volume, while the others never count it alive.
    let proxy = std::sync::Arc::new(
        testbed::CutProxy::start(([127, 0, 0, 1], cluster.cp.apiserver_port()).into()).await.expect("proxy"),
    );
    let partitioned = cluster.nodes[NODES - 1].name.clone();
    {
        let through_proxy = cluster.cp.temp_dir().join("partitioned.kubeconfig");
        let connection = cluster.cp.connection().via(proxy.addr());
        connection.write_kubeconfig(&through_proxy).expect("kubeconfig");
        Api::<Namespace>::all(cluster.client())
            .create(&PostParams::default(), &fixtures::namespace(APART))
            .await
            .expect("namespace of the disagreeing node's liveness");
        let node = &mut cluster.nodes[NODES - 1];
        let mut spec = node.provisioner.spec().clone();
        spec.kubeconfig = through_proxy;
        spec.extra_args.extend(["--namespace".to_owned(), APART.to_owned()]);
        node.provisioner.kill();
        node.provisioner = testbed::Provisioner::spawn(spec, cluster.cp.temp_dir()).expect("respawn behind the proxy");
        node.provisioner.wait_ready(Duration::from_secs(60)).await.expect("ready behind the proxy");
    }
    let seed = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    let mut rng = Rng(seed);
    eprintln!("chaos: seed {seed}");
    let client = cluster.client();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &fixtures::namespace(NS)).await.unwrap();
    let class = fixtures::storage_class(CLASS, "kubevirt.io/hostpath-provisioner").immediate().build();
    Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await.unwrap();
    for class in [
        fixtures::storage_class(SHARED_CLASS, "kubevirt.io/hostpath-provisioner")
            .immediate()
            .parameter("storagePool", "nfs")
            .parameter("topology", "shared")
            .build(),
        fixtures::storage_class(EVERY_CLASS, "kubevirt.io/hostpath-provisioner")
            .immediate()
            .parameter("storagePool", EVERY_POOL)
            .parameter("topology", "everyNode")
            .build(),
    ] {
        Api::<StorageClass>::all(client.clone()).create(&PostParams::default(), &class).await.unwrap();
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());

    // Create, in batches, with kills between and during batches and one apiserver restart.
    let mut kills = 0;
    let mut owner_of: BTreeMap<String, String> = BTreeMap::new(); // claim name -> node
    let restart_at = CLAIMS / BATCH / 2;
    let mut partition_over = None;
    for batch in 0..CLAIMS / BATCH {
        let names: Vec<(String, String)> = (batch * BATCH..(batch + 1) * BATCH)
            .map(|i| (claim_name(i), cluster.nodes[i % NODES].name.clone()))
            .collect();
        let creates = create_all(
            &claims,
            names.iter().map(|(name, node)| fixtures::claim(NS, name, CLASS, "1Mi").provision_on_node(node).build()),
        );
        if rng.below(2) == 0 {
            // Kill a provisioner while this batch is being created and provisioned.
            let delay = Duration::from_millis(rng.below(300));
            let cluster = &mut cluster;
            let rng = &mut rng;
            tokio::join!(creates, async move {
                tokio::time::sleep(delay).await;
                kill_one(cluster, rng);
            });
            kills += 1;
        } else {
            creates.await;
        }
        owner_of.extend(names);
        if batch == restart_at {
            eprintln!("chaos: restarting kube-apiserver after {} claims", (batch + 1) * BATCH);
            cluster.cp.stop_apiserver();
            tokio::time::sleep(Duration::from_secs(2)).await;
            cluster.cp.start_apiserver().await.expect("apiserver back");
        }
        if batch == PARTITION_AT {
            eprintln!("chaos: cutting {partitioned} off the API server for {PARTITION:?}");
            proxy.cut();
            let proxy = proxy.clone();
            partition_over = Some(tokio::spawn(async move {
                tokio::time::sleep(PARTITION).await;
                proxy.restore();
            }));
        }
        if batch == ETCD_RESTART_AT {
            eprintln!("chaos: restarting etcd after {} claims", (batch + 1) * BATCH);
            cluster.cp.stop_etcd();
            tokio::time::sleep(Duration::from_secs(2)).await;
            cluster.cp.start_etcd().await.expect("etcd back");
        }
    }

    // Shared and every-node claims: no node named, one live node acts; a node is killed
    // during each batch.
    let shaped: Vec<(String, &str)> = (0..SHARED_CLAIMS)
        .map(|i| (format!("s{i:03}"), SHARED_CLASS))
        .chain((0..EVERY_CLAIMS).map(|i| (format!("e{i:03}"), EVERY_CLASS)))
        .collect();
    for batch in shaped.chunks(BATCH) {
        let creates = create_all(
            &claims,
            batch
                .iter()
                .map(|(name, class)| fixtures::claim(NS, name, class, "1Mi").access_modes(&["ReadWriteMany"]).build()),
        );
        let delay = Duration::from_millis(rng.below(300));
        let (cluster_ref, rng_ref) = (&mut cluster, &mut rng);
        tokio::join!(creates, async move {
            tokio::time::sleep(delay).await;
            kill_one(cluster_ref, rng_ref);
        });
        kills += 1;
    }

    if let Some(over) = partition_over {
        over.await.expect("partition ended");
        eprintln!("chaos: {partitioned} reconnected");
    }

    // Every claim bound exactly once.
    let bound = testbed::wait_for("all claims Bound", DEADLINE, || async {
        let list = claims.list(&ListParams::default()).await?;
        let bound =
            list.items.iter().filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")).count();
        anyhow::Ok((bound == TOTAL).then_some(bound))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", tails(&cluster)));
    let all_pvs = persist("list PVs", || async { pvs.list(&ListParams::default()).await }).await.items;
    let ours: Vec<&PersistentVolume> = all_pvs.iter().filter(|pv| is_chaos_pv(pv)).collect();
    let mut per_claim: BTreeMap<String, usize> = BTreeMap::new();
    for pv in &ours {
        let uid = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.uid.clone()).unwrap_or_default();
        *per_claim.entry(uid).or_default() += 1;
    }
    let duplicates = per_claim.values().filter(|n| **n > 1).count() + ours.len().saturating_sub(per_claim.len());
    let claim_list = claims.list(&ListParams::default()).await.unwrap().items;
    let dirs_of = |prefix: char| -> BTreeSet<String> {
        claim_list
            .iter()
            .filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with(prefix)))
            .map(|c| format!("pvc-{}", c.metadata.uid.as_ref().unwrap()))
            .collect()
    };
    let (shared_expected, every_expected) = (dirs_of('s'), dirs_of('e'));
    let stray_shared = dir_entries(&shared).difference(&shared_expected).count();
    assert_eq!(dir_entries(&shared), shared_expected, "one directory per shared claim, in the shared pool");
    // Every node makes its copy when it sees the PV: wait for all of them.
    testbed::wait_for("every-node copies on every node", DEADLINE, || async {
        anyhow::Ok(every_dirs.iter().all(|d| dir_entries(d) == every_expected).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", tails(&cluster)));
    let expected_dirs: BTreeMap<String, BTreeSet<String>> = {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for c in claim_list.iter().filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.starts_with('c'))) {
            let node = owner_of[c.metadata.name.as_ref().unwrap()].clone();
            m.entry(node).or_default().insert(format!("pvc-{}", c.metadata.uid.as_ref().unwrap()));
        }
        m
    };
    let mut stray_after_create = 0;
    for node in &cluster.nodes {
        let on_disk = dir_entries(&node.pool_root);
        let expected = expected_dirs.get(&node.name).cloned().unwrap_or_default();
        let missing: Vec<&String> = expected.difference(&on_disk).collect();
        assert!(missing.is_empty(), "node {} lacks directories {missing:?}\n{}", node.name, tails(&cluster));
        stray_after_create += on_disk.difference(&expected).count();
    }
    stray_after_create += stray_shared;

    // Delete everything, killing provisioners along the way.
    for (i, c) in claim_list.iter().enumerate() {
        let name = c.metadata.name.clone().unwrap();
        persist("delete claim", || async {
            match claims.delete(&name, &DeleteParams::default()).await {
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                other => other.map(|_| ()),
            }
        })
        .await;
        if i % 40 == 17 {
            kill_one(&mut cluster, &mut rng);
            kills += 1;
        }
    }
    testbed::wait_for("all PVs deleted", DEADLINE, || async {
        let left = pvs.list(&ListParams::default()).await?.items.iter().filter(|pv| is_chaos_pv(pv)).count();
        anyhow::Ok((left == 0).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", tails(&cluster)));
    let left_on_disk = || -> usize {
        let mut roots: Vec<PathBuf> = cluster.nodes.iter().map(|n| n.pool_root.clone()).collect();
        roots.extend(every_dirs.iter().cloned());
        roots.push(shared.clone());
        roots.iter().map(|r| dir_entries(r).len()).sum()
    };
    let orphans = testbed::wait_for("pools empty", Duration::from_secs(60), || async {
        let left = left_on_disk();
        anyhow::Ok((left == 0).then_some(0))
    })
    .await
    .unwrap_or_else(|_| left_on_disk());
    let _ = std::fs::remove_dir_all(&scratch);

    println!(
        "chaos: seed {seed}, claims {TOTAL} ({CLAIMS} node, {SHARED_CLAIMS} shared, {EVERY_CLAIMS} every-node), \
         bound {bound}, PVs {}, duplicates {duplicates}, \
         stray directories after create {stray_after_create}, deleted {}, orphans {orphans}, \
         provisioner kills {kills}, apiserver restarts 1, etcd restarts 1, partitions 1 ({}s)",
        ours.len(),
        ours.len(),
        PARTITION.as_secs()
    );
    assert_eq!(ours.len(), TOTAL, "one PV per claim");
    assert_eq!(duplicates, 0);
    assert_eq!(stray_after_create, 0, "no orphan directory after creation");
    assert_eq!(orphans, 0, "no directory left after deletion");
}

fn is_chaos_pv(pv: &PersistentVolume) -> bool {
    let class = pv.spec.as_ref().and_then(|s| s.storage_class_name.as_deref());
    matches!(class, Some(CLASS | SHARED_CLASS | EVERY_CLASS))
}

/// Entries of a pool root plus those still in its trash (data not yet removed in the background).
fn dir_entries(dir: &std::path::Path) -> BTreeSet<String> {
    let list = |d: &std::path::Path| -> BTreeSet<String> {
        std::fs::read_dir(d)
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    };
    let mut all: BTreeSet<String> = list(dir).into_iter().filter(|n| n != ".hpp-trash").collect();
    all.extend(list(&dir.join(".hpp-trash")).into_iter().map(|n| format!(".hpp-trash/{n}")));
    all
}

fn tails(cluster: &Cluster) -> String {
    cluster.nodes.iter().map(|n| format!("--- {} ---\n{}\n", n.name, n.provisioner.log_tail(30))).collect()
}

//! End-to-end: one pool over two disks of a node (docs/volumes.md, "One class over several
//! disks") against a real control plane, on two loop-mounted filesystems of different sizes:
//! each volume goes to the disk with the most room when it is made, a clone goes beside its
//! source, deletion removes from the right disk, the published capacity is the largest single
//! fit (not the sum), an every-node class is refused with the reason, and the doctor checks each
//! disk's volumes against its own directory.

mod common;

use std::path::{Path, PathBuf};

use common::capacity::*;
use common::*;
use k8s_openapi::api::core::v1::PersistentVolume;
use testbed::fixtures;

fn host_path(pv: &PersistentVolume) -> PathBuf {
    PathBuf::from(pv.spec.as_ref().and_then(|s| s.host_path.as_ref()).map(|h| h.path.clone()).expect("hostPath"))
}

/// Writes `mib` MiB of data into `dir/name` and flushes it, so that statfs sees it gone.
fn fill(dir: &Path, name: &str, mib: usize) {
    use std::io::Write;
    let mut file = std::fs::File::create(dir.join(name)).expect("create file");
    let chunk = vec![0x5au8; 1 << 20];
    for _ in 0..mib {
        file.write_all(&chunk).expect("write");
    }
    file.sync_all().expect("sync");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_over_two_disks_places_each_volume_on_the_roomier_one_and_offers_the_largest_fit() {
    let mut env = TestEnv::start("disks", 0).await;
    let _driver = publishing_provisioner(&mut env).await;
    let node = format!("{}-n", env.group);
    let base = testbed::pool_root_for(env.cp, &format!("{}-disks", env.group));
    let small = LoopFs::mount(&base.join("disk1"), 24, None);
    let large = LoopFs::mount(&base.join("disk2"), 48, None);
    let storage_pools = format!("data={},data={}", small.dir.display(), large.dir.display());
    let pools = storage_pools.clone();
    env.add_node(&node, &move |spec: testbed::ProvisionerSpec| {
        spec.env("STORAGE_POOLS", &pools).env("PUBLISH_CAPACITY", "true")
    })
    .await;
    let class = env.class("spread", |c| c.immediate().parameter("storagePool", "data")).await;

    // The larger disk has more room: the first volume goes there, and a filler claim too.
    env.create_claim(fixtures::claim(&env.ns, "a", &class, "1Mi").provision_on_node(&node)).await;
    let a = host_path(&env.wait_bound("a").await);
    assert_eq!(a.parent(), Some(large.dir.as_path()), "the roomier disk");
    std::fs::write(a.join("note"), b"on disk 2").unwrap();
    env.create_claim(fixtures::claim(&env.ns, "filler", &class, "1Mi").provision_on_node(&node)).await;
    let filler = host_path(&env.wait_bound("filler").await);
    assert_eq!(filler.parent(), Some(large.dir.as_path()));
    // Filled, the larger disk has less room left than the smaller one: the next volume goes to
    // the smaller disk.
    fill(&filler, "data", 32);
    assert!(available_bytes(&large.dir) < available_bytes(&small.dir), "the fill made disk 2 the tighter one");
    env.create_claim(fixtures::claim(&env.ns, "b", &class, "1Mi").provision_on_node(&node)).await;
    let b_pv = env.wait_bound("b").await;
    let b = host_path(&b_pv);
    assert_eq!(b.parent(), Some(small.dir.as_path()), "the roomier disk now");

    // A clone is made beside its source, though the other disk has more room.
    let mut clone = fixtures::claim(&env.ns, "a-copy", &class, "1Mi").provision_on_node(&node).build();
    clone.spec.as_mut().unwrap().data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: "a".into(),
    });
    env.claims().create(&Default::default(), &clone).await.expect("create clone");
    let copy = host_path(&env.wait_bound("a-copy").await);
    assert_eq!(copy.parent(), Some(large.dir.as_path()), "beside its source");
    assert_eq!(std::fs::read(copy.join("note")).unwrap(), b"on disk 2");

    // The pool offers the largest volume one disk can take: the smaller disk's room now, not
    // the sum of both.
    let published_bytes = testbed::wait_for("capacity of the smaller disk published", TIMEOUT, || async {
        let objects = published(&env, &class).await;
        let bytes = objects.get(&node).map(|object| bytes_of(object.capacity.as_ref()));
        let fits = bytes.filter(|bytes| bytes.abs_diff(available_bytes(&small.dir)) <= 1 << 20);
        anyhow::Ok(fits)
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let sum = available_bytes(&small.dir) + available_bytes(&large.dir);
    assert!(published_bytes + (2 << 20) < sum, "published {published_bytes}, not the sum {sum}");

    // The doctor checks each disk's volumes against that disk.
    let report = doctor_report(&env, 0, &[("STORAGE_POOLS", &storage_pools)]).await;
    let data_pools: Vec<&serde_json::Value> =
        report["pools"].as_array().expect("pools").iter().filter(|p| p["name"] == "data").collect();
    let expected: Vec<(String, u64)> = data_pools
        .iter()
        .map(|p| (p["path"].as_str().unwrap_or_default().to_owned(), p["volumes"]["expected"].as_u64().unwrap_or(99)))
        .collect();
    assert_eq!(expected, [(small.dir.display().to_string(), 1), (large.dir.display().to_string(), 3)], "{report:#}");
    for pool in &data_pools {
        assert_eq!(pool["volumes"]["missing_directories"].as_array().map(Vec::len), Some(0), "{pool:#}");
    }

    // Deleting a claim removes its directory from its own disk.
    env.delete_claim("b").await;
    env.wait_pv_gone(b_pv.metadata.name.as_deref().unwrap()).await;
    wait_path_gone(&b).await;
    assert!(a.join("note").is_file() && copy.is_dir(), "the other disk's volumes stay");

    // An every-node class cannot use a pool whose roots differ from node to node.
    let everywhere = env
        .class("everywhere", |c| c.immediate().parameter("storagePool", "data").parameter("topology", "everyNode"))
        .await;
    let refused = env.create_claim(fixtures::claim(&env.ns, "everywhere", &everywhere, "1Mi")).await;
    let note = env.wait_event(&env.ns, &uid(&refused), "ProvisioningFailed").await;
    assert!(note.contains("a pool of one root") && note.contains(&large.dir.display().to_string()), "{note}");

    for node in &mut env.nodes {
        node.provisioner.terminate();
    }
}

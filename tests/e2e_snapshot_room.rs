//! End-to-end: room for the byte copies of `HostPathSnapshot` (docs/snapshots.md) on loop-mounted
//! ext4 pools: copies asked at once wait for room beside the reserve and each other, a restore is
//! checked against what its snapshot holds, and with requests accounting copies count as promised
//! space, leave out what volumes are promised (made or being made), and volumes planned during a
//! copy count it; the free space, sampled throughout, never falls below the reserve.

mod common;

use std::path::PathBuf;

use common::snapshots::*;
use common::*;
use kube::api::{DeleteParams, Patch, PatchParams};
use testbed::fixtures;

/// The pool's reserve for the room tests below.
const RESERVE_MIB: u64 = 16;

/// Samples the free space of `dir` every few milliseconds until told to stop; returns the least
/// seen.
fn sample_free_space(
    dir: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut least = u64::MAX;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            least = least.min(common::capacity::available_bytes(&dir));
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        least
    })
}

/// Byte copies never take a pool below its reserve: four snapshots of a 12 MiB volume asked at
/// once on a 64 MiB ext4 pool with a 16 MiB reserve are copied only as far as they fit beside
/// each other (the others wait, saying why), and a restore into a 1Mi claim of a snapshot that
/// holds 12 MiB checks those 12 MiB, not the claim's request: it waits with an event, then
/// proceeds once snapshots are deleted. The free space is sampled throughout.
#[tokio::test(flavor = "multi_thread")]
async fn byte_copies_wait_for_room_and_never_take_the_pool_below_its_reserve() {
    let mut env = TestEnv::start("snap-room", 0).await;
    // A provisioner name of its own: the cluster-wide answers (a snapshot of nothing) come
    // from this test's node, not from a node of another test whose lease outlives it.
    env.own_provisioner();
    install_crd(&env);
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    let reserve = format!("{RESERVE_MIB}Mi");
    env.add_node(&node, &|spec| spec.env("RESERVED_SPACE", &reserve)).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    // 12 MiB of data a pod wrote (past its 1Mi request: no quota), not sparse.
    write_mib(&source.join("data"), 12);
    let reserve_bytes = RESERVE_MIB << 20;
    let free_before = common::capacity::available_bytes(&disk.dir);
    let fits = (free_before - reserve_bytes) / (12 << 20);
    assert!((1..4).contains(&fits), "the disk holds some of the four copies, not all: {fits}");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_free_space(disk.dir.clone(), stop.clone());
    let names = ["s1", "s2", "s3", "s4"];
    futures::future::join_all(names.iter().map(|name| take(&env, name, "data"))).await;
    // Each either completes or waits for room, saying so.
    let outcomes = testbed::wait_for("every snapshot copied or waiting for room", TIMEOUT, || async {
        let mut outcomes = Vec::new();
        for name in names {
            let status = snapshots(&env).get(name).await?.status.unwrap_or_default();
            match (status.ready_to_use, status.message) {
                (true, _) => outcomes.push((name, true)),
                (false, Some(m)) if m.contains("waits until there is room") => outcomes.push((name, false)),
                _ => return anyhow::Ok(None),
            }
        }
        Ok(Some(outcomes))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let ready: Vec<&str> = outcomes.iter().filter(|(_, ready)| *ready).map(|(name, _)| *name).collect();
    // A copy in flight counts in full until it ends, whatever it wrote already: one started
    // while another is half done may wait although it would fit, never the other way round.
    assert!(
        (1..=fits).contains(&(ready.len() as u64)),
        "at least one copy and no more than fit beside the reserve ({fits}): {outcomes:?}"
    );
    let waiting = outcomes.iter().find(|(_, ready)| !ready).map(|(name, _)| *name).unwrap();
    let waiting_uid = snapshots(&env).get(waiting).await.unwrap().metadata.uid.unwrap();
    let note = env.wait_event(&env.ns, &waiting_uid, "SnapshotFailed").await;
    assert!(note.contains("12 MiB") && note.contains("reserve"), "says what it needs and why it waits: {note}");

    // A restore of 12 MiB into a 1Mi claim: checked against what the snapshot holds.
    let restore = env.create_claim(restoring(&env, "restored", &class, "1Mi", ready[0], &node)).await;
    let note = env.wait_event(&env.ns, &uid(&restore), "ProvisioningFailed").await;
    assert!(note.contains("the restore of snapshot") && note.contains("waits until there is room"), "{note}");
    let least = {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.join().unwrap()
    };
    // A little slack for the filesystem's own metadata of the directories made.
    assert!(least + (1 << 20) >= reserve_bytes, "free space fell to {least} bytes, below the reserve {reserve_bytes}");
    assert!(
        !source.parent().unwrap().join(format!("pvc-{}", uid(&restore))).exists(),
        "nothing of the restore written"
    );

    // Room made: the waiting snapshots go, and the restore proceeds.
    for (name, _) in &outcomes {
        if *name != ready[0] {
            snapshots(&env).delete(name, &DeleteParams::default()).await.expect("delete");
        }
    }
    // Once the copies' data has left the trash, the room is there; the claim retries with a
    // backoff grown meanwhile, so a change to it looks again now.
    testbed::wait_for("the deleted snapshots' room given back", TIMEOUT, || async {
        let free = common::capacity::available_bytes(&disk.dir);
        anyhow::Ok((free > reserve_bytes + (13 << 20)).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let nudge = serde_json::json!({"metadata": {"annotations": {"hpp-test/nudge": "room"}}});
    env.claims().patch("restored", &PatchParams::default(), &Patch::Merge(&nudge)).await.expect("nudge");
    let restored = host_path(&env.wait_bound("restored").await);
    assert_eq!(std::fs::metadata(restored.join("data")).unwrap().len(), 12 << 20, "the snapshot's data");
}

/// With requests accounting, a snapshot's byte copy is space promised too: no claim's request
/// counts it, and a pool whose volumes' requests and copies already fill it refuses a claim it
/// would have taken had the copy not been counted; the claim is made once the snapshot goes.
#[tokio::test(flavor = "multi_thread")]
async fn requests_accounting_counts_a_snapshots_byte_copy_as_promised() {
    let mut env = TestEnv::start("snap-requests", 0).await;
    // A provisioner name of its own: the cluster-wide answers (a snapshot of nothing) come
    // from this test's node, not from a node of another test whose lease outlives it.
    env.own_provisioner();
    install_crd(&env);
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    env.add_node(&node, &|spec| spec.env("CAPACITY_ACCOUNTING", "requests").env("RESERVED_SPACE", "0")).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    write_mib(&source.join("data"), 12);
    // A volume that promises all but 4 MiB of the pool once the 1Mi volume and the 12 MiB copy
    // are counted (its directory is empty: the free space does not see its promise), then the
    // copy (it fits in the free space).
    let st = rustix::fs::statvfs(&disk.dir).unwrap();
    let total_mib = (st.f_blocks * st.f_bsize) >> 20;
    let big = total_mib - 1 - 12 - 4;
    env.create_claim(fixtures::claim(&env.ns, "big", &class, &format!("{big}Mi")).provision_on_node(&node)).await;
    env.wait_bound("big").await;
    take(&env, "copy", "data").await;
    let status = wait_ready(&env, "copy").await.status.unwrap();
    assert_eq!(status.method.as_deref(), Some("bytes"));
    // 10Mi: room for it if the copy were not counted (16 MiB unpromised), not with it (4 MiB).
    let claim = env.create_claim(fixtures::claim(&env.ns, "more", &class, "10Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("unpromised space") && note.contains("promised to the pool's volumes"), "{note}");
    // The snapshot goes: its copy's room is given back.
    snapshots(&env).delete("copy", &DeleteParams::default()).await.expect("delete");
    env.wait_bound("more").await;
}

/// With requests accounting, a byte copy may not take room promised to a volume its pod has not
/// written yet: free space alone would let it, and that pod's writes, within its request, would
/// then take the pool below its reserve. The copy waits, saying why, and is made once the
/// promise goes.
#[tokio::test(flavor = "multi_thread")]
async fn requests_accounting_keeps_a_byte_copy_out_of_room_promised_to_unwritten_volumes() {
    let mut env = TestEnv::start("snap-promised", 0).await;
    // A provisioner name of its own: the cluster-wide answers (a snapshot of nothing) come
    // from this test's node, not from a node of another test whose lease outlives it.
    env.own_provisioner();
    install_crd(&env);
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    env.add_node(&node, &|spec| spec.env("CAPACITY_ACCOUNTING", "requests").env("RESERVED_SPACE", "0")).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    // A volume that leaves 8 MiB unpromised and writes nothing, then 12 MiB in the source: the
    // free space still holds a 12 MiB copy, the unpromised room does not.
    let st = rustix::fs::statvfs(&disk.dir).unwrap();
    let total_mib = (st.f_blocks * st.f_bsize) >> 20;
    let big = total_mib - 1 - 8;
    env.create_claim(fixtures::claim(&env.ns, "big", &class, &format!("{big}Mi")).provision_on_node(&node)).await;
    env.wait_bound("big").await;
    write_mib(&source.join("data"), 12);
    let free = common::capacity::available_bytes(&disk.dir);
    assert!(free > 14 << 20, "the free space alone would hold the copy: {free}");
    take(&env, "copy", "data").await;
    let waiting = testbed::wait_for("the copy waiting for room", TIMEOUT, || async {
        let status = snapshots(&env).get("copy").await?.status.unwrap_or_default();
        assert!(!status.ready_to_use, "copied into room promised to volume big");
        anyhow::Ok(status.message.filter(|m| m.contains("waits until there is room")))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    assert!(waiting.contains("12 MiB") && waiting.contains("not promised"), "{waiting}");
    // The promise goes: the copy is made.
    env.delete_claim("big").await;
    wait_ready(&env, "copy").await;
}

/// Published capacity offers what a claim can get: with requests accounting a snapshot's byte
/// copy is promised space there too, as in the provisioning check, so kube-scheduler is not
/// offered room the node would refuse.
#[tokio::test(flavor = "multi_thread")]
async fn published_capacity_counts_a_snapshots_byte_copy_as_promised() {
    let mut env = TestEnv::start("snap-pubcap", 0).await;
    install_crd(&env);
    let _driver = common::capacity::publishing_provisioner(&mut env).await;
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    env.add_node(&node, &|spec| {
        spec.env("CAPACITY_ACCOUNTING", "requests").env("RESERVED_SPACE", "0").env("PUBLISH_CAPACITY", "true")
    })
    .await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "1Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    write_mib(&source.join("data"), 12);
    // A volume that leaves 16 MiB unpromised, then a byte copy of the 12 MiB.
    let st = rustix::fs::statvfs(&disk.dir).unwrap();
    let total_mib = (st.f_blocks * st.f_bsize) >> 20;
    let big = total_mib - 1 - 16;
    env.create_claim(fixtures::claim(&env.ns, "big", &class, &format!("{big}Mi")).provision_on_node(&node)).await;
    env.wait_bound("big").await;
    let offered = |want_mib: u64| {
        let (env, class) = (&env, &class);
        async move {
            testbed::wait_for(&format!("about {want_mib} MiB offered"), TIMEOUT, || async {
                let objects = common::capacity::published(env, class).await;
                let bytes = objects.values().next().map(|c| common::capacity::bytes_of(c.capacity.as_ref()));
                anyhow::Ok(bytes.filter(|b| b.abs_diff(want_mib << 20) <= 1 << 20))
            })
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()))
        }
    };
    offered(16).await;
    take(&env, "copy", "data").await;
    assert_eq!(wait_ready(&env, "copy").await.status.unwrap().method.as_deref(), Some("bytes"));
    offered(4).await;
    snapshots(&env).delete("copy", &DeleteParams::default()).await.expect("delete");
    offered(16).await;
}

/// With requests accounting, a volume counts the byte copies in flight as promised (and a copy
/// the volumes being made: deciding::copy_room, whose model enumerates the orders of both). A
/// snapshot of 39 MiB in 10,000 small files (a copy that lasts), then, while it is being copied,
/// three 24Mi claims, on a 128 MiB pool with a 16 MiB reserve: the copy fits and the claims do
/// not beside it. Each claim let through is written to its request, as its pod may; the free
/// space, sampled throughout, never falls below the reserve. Volumes blind to the copy in flight
/// are let through and take the pool below its reserve.
#[tokio::test(flavor = "multi_thread")]
async fn volumes_planned_during_a_byte_copy_never_take_the_pool_below_its_reserve() {
    let mut env = TestEnv::start("snap-inflight", 0).await;
    env.own_provisioner();
    install_crd(&env);
    let node = format!("{}-n", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 128, None);
    let reserve = format!("{RESERVE_MIB}Mi");
    env.add_node(&node, &|spec| spec.env("CAPACITY_ACCOUNTING", "requests").env("RESERVED_SPACE", &reserve)).await;
    let class = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "data", &class, "40Mi").provision_on_node(&node)).await;
    let source = host_path(&env.wait_bound("data").await);
    // 10,000 files of 4 KiB (39 MiB, within the claim's request): a byte copy of them takes a
    // while, long enough for the claims below to be planned while it is in flight.
    let files = source.join("files");
    std::fs::create_dir(&files).unwrap();
    for i in 0..10_000 {
        std::fs::write(files.join(format!("f{i}")), [b'x'; 4096]).unwrap();
    }
    // On disk now, so that the free space read below is what the node reads.
    assert!(std::process::Command::new("sync").status().unwrap().success());
    let reserve_bytes = RESERVE_MIB << 20;
    let free = common::capacity::available_bytes(&disk.dir);
    assert!(free > reserve_bytes + (40 << 20), "the copy fits: {free}");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = sample_free_space(disk.dir.clone(), stop.clone());
    take(&env, "copy", "data").await;
    testbed::wait_for("the copy in flight", TIMEOUT, || async {
        let status = snapshots(&env).get("copy").await?.status.unwrap_or_default();
        assert!(!status.ready_to_use, "the copy ended before the claims were asked: make it last longer");
        anyhow::Ok((status.message.as_deref() == Some("being copied")).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    let claims = ["v1", "v2", "v3"];
    let made = futures::future::join_all(
        claims
            .iter()
            .map(|name| env.create_claim(fixtures::claim(&env.ns, name, &class, "24Mi").provision_on_node(&node))),
    )
    .await;
    let claim_uids: Vec<String> = made.iter().map(uid).collect();
    wait_ready(&env, "copy").await;
    // Each claim is bound or refused for room.
    let bound = testbed::wait_for("every claim bound or refused", TIMEOUT, || async {
        let mut bound = Vec::new();
        for (name, claim_uid) in claims.iter().zip(&claim_uids) {
            let claim = env.claims().get(name).await?;
            if claim.status.and_then(|s| s.phase).as_deref() == Some("Bound") {
                bound.push(*name);
            } else if env.our_event(&env.ns, claim_uid, "ProvisioningFailed").await.is_none() {
                return anyhow::Ok(None);
            }
        }
        Ok(Some(bound))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    // Every volume let through is written to its request, as its pod may.
    for name in &bound {
        let written = std::fs::write(host_path(&env.wait_bound(name).await).join("data"), vec![0x5a; 24 << 20]);
        assert!(written.is_ok(), "volume {name} could not be written to its request: {written:?} (bound: {bound:?})");
    }
    let least = {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        sampler.join().unwrap()
    };
    // A little slack for the filesystem's own metadata of the directories made.
    assert!(
        least + (1 << 20) >= reserve_bytes,
        "free space fell to {least} bytes, below the reserve {reserve_bytes}: claims bound {bound:?}"
    );
    let refused = env.wait_event(&env.ns, &claim_uids[0], "ProvisioningFailed").await;
    assert!(refused.contains("unpromised space"), "{refused}");
}

//! End-to-end: capacity-aware placement on real (loop-mounted) filesystems that fill up.

mod common;

use common::capacity::*;
use common::*;
use kube::api::{Api, ListParams};
use testbed::fixtures;

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_too_big_for_the_chosen_node_goes_back_to_the_scheduler_and_lands_where_there_is_room() {
    let mut env = TestEnv::start("resched", 0).await;
    let (small, big) = (format!("{}-small", env.group), format!("{}-big", env.group));
    let small_disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &small), 32, None);
    env.add_node(&small, &|spec| spec).await;
    env.add_node(&big, &|spec| spec).await;
    let class = env.class("wffc", |c| c).await;

    // Only the small node is schedulable at first, so the scheduler must pick it.
    env.set_unschedulable(&big, true).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "large", &class, "100Mi")).await;
    env.create_pod("app", "large").await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("not enough free space") && note.contains("selected-node"), "{note}");

    // The claim was handed back; once the big node is available it lands there.
    env.set_unschedulable(&small, true).await;
    env.set_unschedulable(&big, false).await;
    let pv = env.wait_bound("large").await;
    let owner = pv.metadata.annotations.unwrap()["kubevirt.io/provisionOnNode"].clone();
    assert_eq!(owner, big);
    let left: Vec<String> = entries(&small_disk.dir).into_iter().filter(|e| e != "lost+found").collect();
    assert!(left.is_empty(), "nothing left on the small node: {left:?}");
    env.nodes[0].provisioner.terminate();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_while_creating_leaves_nothing_behind_and_recovers() {
    let mut env = TestEnv::start("full", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 16, Some(64));
    // Use up every inode: plenty of bytes free, but no directory can be created.
    let mut fillers = Vec::new();
    for i in 0.. {
        let path = disk.dir.join(format!("filler-{i}"));
        if std::fs::write(&path, b"").is_err() {
            break;
        }
        fillers.push(path);
    }
    assert!(!fillers.is_empty());
    env.add_node(&node, &|spec| spec).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "nospace", &class, "1Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.to_lowercase().contains("no space"), "{note}");
    let pvs = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(env.client.clone());
    let name = format!("pvc-{}", uid(&claim));
    assert!(pvs.get_opt(&name).await.unwrap().is_none(), "no PV without a directory");
    assert!(!disk.dir.join(&name).exists(), "no partial directory");

    // Space comes back: the retry (with backoff) provisions the claim.
    for path in fillers.iter().take(4) {
        std::fs::remove_file(path).unwrap();
    }
    env.wait_bound("nospace").await;
    assert!(disk.dir.join(&name).is_dir());
    let _ = pvs.list(&ListParams::default()).await;
    env.nodes[0].provisioner.terminate();
}

// Published capacity (`--publish-capacity`): kube-scheduler itself avoids nodes without room.

#[tokio::test(flavor = "multi_thread")]
async fn with_published_capacity_the_scheduler_places_a_claim_too_big_for_one_node_on_the_other_without_a_hand_back() {
    let mut env = TestEnv::start("pubcap", 0).await;
    let _driver = publishing_provisioner(&mut env).await;
    let (small, big) = (format!("{}-small", env.group), format!("{}-big", env.group));
    let small_disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &small), 32, None);
    let publish = |spec: testbed::ProvisionerSpec| spec.env("PUBLISH_CAPACITY", "true");
    env.add_node(&small, &publish).await;
    env.add_node(&big, &publish).await;
    let class = env.class("wffc", |c| c).await;

    // One object per node for the class, with the pool's free space and a selector on the
    // node's hostname label, as the PVs' node affinity uses.
    let objects = wait_published(&env, &class, &[&small, &big]).await;
    let small_object = &objects[&small];
    let small_bytes = bytes_of(small_object.capacity.as_ref());
    assert_eq!(bytes_of(small_object.maximum_volume_size.as_ref()), small_bytes, "the largest volume is all there is");
    let measured = available_bytes(&small_disk.dir);
    assert!(small_bytes.abs_diff(measured) <= 1 << 20, "published {small_bytes}, statvfs says {measured}");
    assert!(small_bytes > 0 && small_bytes < 32 << 20, "{small_bytes}");
    assert!(bytes_of(objects[&big].capacity.as_ref()) > 100 << 20, "the big node has room");

    // A claim too big for every node: the scheduler itself refuses to place it, saying why.
    let huge = env.create_claim(fixtures::claim(&env.ns, "huge", &class, "1Ei")).await;
    let huge_pod = env.create_pod("huge-app", "huge").await;
    let pod_uid = huge_pod.metadata.uid.clone().expect("pod uid");
    let note = env.wait_event_from(&env.ns, &pod_uid, "default-scheduler", "FailedScheduling").await;
    assert!(note.contains("did not have enough free storage"), "{note}");

    // Claims too big for the small node only: placed on the big one, every time, without any
    // node handing one back.
    let mut placed = Vec::new();
    for i in 0..3 {
        let claim = env.create_claim(fixtures::claim(&env.ns, &format!("large-{i}"), &class, "100Mi")).await;
        env.create_pod(&format!("app-{i}"), &format!("large-{i}")).await;
        placed.push(claim);
    }
    for (i, claim) in placed.iter().enumerate() {
        let pv = env.wait_bound(&format!("large-{i}")).await;
        assert_eq!(pv.metadata.annotations.unwrap()["kubevirt.io/provisionOnNode"], big);
        let warnings: Vec<String> = env
            .events_for(&env.ns, &uid(claim))
            .await
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning") || e.reason.as_deref() == Some("ProvisioningFailed"))
            .map(|e| format!("{:?}: {:?}", e.reason, e.note))
            .collect();
        assert!(warnings.is_empty(), "no hand-back, no failure: {warnings:?}");
    }
    let left: Vec<String> = entries(&small_disk.dir).into_iter().filter(|e| e != "lost+found").collect();
    assert!(left.is_empty(), "nothing was ever made on the small node: {left:?}");
    let huge_now = env.claims().get("huge").await.expect("huge claim");
    let huge_annotations = huge_now.metadata.annotations.unwrap_or_default();
    assert!(!huge_annotations.contains_key("volume.kubernetes.io/selected-node"), "never placed: {huge_annotations:?}");
    assert!(
        env.events_for(&env.ns, &uid(&huge)).await.iter().all(|e| e.reason.as_deref() != Some("ProvisioningFailed"))
    );
    for node in &mut env.nodes {
        node.provisioner.terminate();
    }
}

/// `CAPACITY_PROVISIONER_NAME`: one DaemonSet keeps its first name with a '/' (as
/// `kubevirt.io/hostpath-provisioner`, which no CSIDriver can be named, and which a migrated
/// kubevirt install keeps) and also serves a DNS name for the classes to place by capacity:
/// those get published capacity, kube-scheduler places their pods on the node with room, and
/// their volumes are made and reclaimed under that name. The first name's classes work as
/// before, with nothing published for them.
#[tokio::test(flavor = "multi_thread")]
async fn a_second_provisioner_name_places_its_classes_by_capacity_while_the_first_keeps_its_slash() {
    let mut env = TestEnv::start("capname", 0).await;
    env.own_provisioner();
    assert!(env.provisioner.contains('/'), "{}", env.provisioner);
    let capacity_name = format!("{}.hostpath.test", env.group);
    let _driver = CsiDriver::create(&env, &capacity_name).await;
    let (small, big) = (format!("{}-small", env.group), format!("{}-big", env.group));
    let small_disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &small), 32, None);
    let second = capacity_name.clone();
    let settings = move |spec: testbed::ProvisionerSpec| {
        spec.env("PUBLISH_CAPACITY", "true").env("CAPACITY_PROVISIONER_NAME", &second)
    };
    env.add_node(&small, &settings).await;
    env.add_node(&big, &settings).await;
    let placed = format!("{}-placed", env.group);
    Api::<k8s_openapi::api::storage::v1::StorageClass>::all(env.client.clone())
        .create(&Default::default(), &fixtures::storage_class(&placed, &capacity_name).build())
        .await
        .expect("create the class of the second name");
    let plain = env.class("plain", |c| c).await;

    let objects = wait_published(&env, &placed, &[&small, &big]).await;
    assert!(bytes_of(objects[&small].capacity.as_ref()) < 32 << 20);
    assert!(published(&env, &plain).await.is_empty(), "no CSIDriver can read the first name's objects");

    // Too big for the small node: placed on the big one by the scheduler, made under the second
    // name, with no hand-back.
    let large = env.create_claim(fixtures::claim(&env.ns, "large", &placed, "100Mi")).await;
    env.create_pod("large-app", "large").await;
    let pv = env.wait_bound("large").await;
    let annotations = pv.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["kubevirt.io/provisionOnNode"], big);
    assert_eq!(annotations["pv.kubernetes.io/provisioned-by"], capacity_name);
    assert!(
        env.events_for(&env.ns, &uid(&large)).await.iter().all(|e| e.reason.as_deref() != Some("ProvisioningFailed")),
        "no hand-back"
    );
    assert!(entries(&small_disk.dir).iter().all(|e| e == "lost+found"), "nothing made on the small node");

    // The first name serves its classes as before.
    env.create_claim(fixtures::claim(&env.ns, "small-one", &plain, "1Mi")).await;
    env.create_pod("small-app", "small-one").await;
    let first = env.wait_bound("small-one").await;
    assert_eq!(first.metadata.annotations.unwrap()["pv.kubernetes.io/provisioned-by"], env.provisioner);

    // The second name's volume is reclaimed: its PV and its directory go.
    let dir = std::path::PathBuf::from(pv.spec.as_ref().unwrap().host_path.as_ref().unwrap().path.clone());
    assert!(dir.is_dir());
    env.delete_pod("large-app").await;
    env.delete_claim("large").await;
    env.wait_pv_gone(pv.metadata.name.as_deref().unwrap()).await;
    wait_path_gone(&dir).await;
    for node in &mut env.nodes {
        node.provisioner.terminate();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn published_capacity_is_quiet_at_idle_and_removed_on_clean_shutdown_after_a_kill_and_when_turned_off() {
    let mut env = TestEnv::start("pubgone", 0).await;
    let _driver = publishing_provisioner(&mut env).await;
    let names: Vec<String> = ["stops", "dies", "stays"].iter().map(|n| format!("{}-{n}", env.group)).collect();
    // Loop-mounted pools nothing else writes to, so the figures stay put.
    let _disks: Vec<LoopFs> =
        names.iter().map(|n| LoopFs::mount(&testbed::pool_root_for(env.cp, n), 16, None)).collect();
    let publish = |spec: testbed::ProvisionerSpec| spec.env("PUBLISH_CAPACITY", "on");
    for name in &names {
        env.add_node(name, &publish).await;
    }
    let class = env.class("wffc", |c| c).await;
    let (stops, dies, stays) = (&names[0], &names[1], &names[2]);
    let before = wait_published(&env, &class, &[stops, dies, stays]).await;

    // Idle: several measuring rounds later (every 5 s), not one object was rewritten.
    tokio::time::sleep(std::time::Duration::from_secs(12)).await;
    let after = published(&env, &class).await;
    for (host, object) in &before {
        assert_eq!(
            after.get(host).and_then(|o| o.metadata.resource_version.clone()),
            object.metadata.resource_version,
            "{host}: no write while nothing changed"
        );
    }

    // A clean shutdown takes the node's objects with it.
    let status = env.node_mut(stops).provisioner.terminate();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    wait_published(&env, &class, &[dies, stays]).await;

    // A killed node cannot: a live node removes its objects once its lease has expired.
    env.node_mut(dies).provisioner.kill();
    let left = wait_published(&env, &class, &[stays]).await;
    assert_eq!(left[stays].metadata.resource_version, before[stays].metadata.resource_version);

    // The last node killed leaves its objects (no live node remains to remove them); started
    // again with publishing turned off, it removes them itself.
    env.node_mut(stays).provisioner.kill();
    let spec = env.node(stays).provisioner.spec().clone().arg("--publish-capacity=off");
    let mut restarted = testbed::Provisioner::spawn(spec, env.cp.temp_dir()).expect("restart");
    restarted.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("ready");
    wait_published(&env, &class, &[]).await;
    restarted.terminate();
}

#[test]
fn publish_capacity_with_the_default_provisioner_name_is_refused_with_one_line() {
    let pool = tempfile::tempdir().expect("temp dir");
    let out = std::process::Command::new(binary())
        .env_clear()
        .env("NODE_NAME", "node-a")
        .env("PV_DIR", pool.path())
        .env("PUBLISH_CAPACITY", "true")
        .output()
        .expect("run the provisioner");
    assert_eq!(out.status.code(), Some(2), "configuration error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(lines[0].contains("PUBLISH_CAPACITY") && lines[0].contains("CSIDriver"), "{stderr}");
    assert!(lines[0].contains("kubevirt.io/hostpath-provisioner"), "names the offending value: {stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_requests_accounting_the_promises_never_exceed_the_pool_though_space_is_free() {
    let mut env = TestEnv::start("promised", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    env.add_node(&node, &|spec| spec.env("CAPACITY_ACCOUNTING", "requests")).await;
    let class = env.class("imm", |c| c.immediate()).await;
    // Two volumes of 24 MiB promise 48 of the disk's about 60 MiB; nothing is written in them.
    for name in ["first", "second"] {
        env.create_claim(fixtures::claim(&env.ns, name, &class, "24Mi").provision_on_node(&node)).await;
        env.wait_bound(name).await;
    }
    let free = disk_free(&disk.dir);
    assert!(free > 24 << 20, "the disk still has {free} bytes free");
    let third = env.create_claim(fixtures::claim(&env.ns, "third", &class, "24Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&third), "ProvisioningFailed").await;
    assert!(note.contains("not enough unpromised space") && note.contains("48 MiB promised"), "{note}");
    assert!(env.pvs().get_opt(&format!("pvc-{}", uid(&third))).await.unwrap().is_none());
    // A promise released makes room: the claim is provisioned on its next attempt.
    env.delete_claim("first").await;
    env.wait_bound("third").await;
}

/// Claims of one pool planned at the same time, or before the watch shows the last one's PV, each
/// counted the others out and together promised more than the pool holds. They now reserve their
/// size under one lock (src/deciding/reservations.rs enumerates the interleavings); here a burst
/// of claims, created at once, never gets more promised than the disk's size.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_claims_under_requests_accounting_never_promises_more_than_the_pool() {
    let mut env = TestEnv::start("promised-burst", 0).await;
    let node = format!("{}-1", env.group);
    let disk = LoopFs::mount(&testbed::pool_root_for(env.cp, &node), 64, None);
    env.add_node(&node, &|spec| spec.env("CAPACITY_ACCOUNTING", "requests").env("RESERVED_SPACE", "0")).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let size = disk_size(&disk.dir);
    // Ten claims of 10 MiB, 100 MiB in all, on a disk of 64 MiB: at most six fit.
    let names: Vec<String> = (0..10).map(|i| format!("burst-{i}")).collect();
    let created = futures::future::join_all(
        names
            .iter()
            .map(|name| env.create_claim(fixtures::claim(&env.ns, name, &class, "10Mi").provision_on_node(&node))),
    )
    .await;
    // Every claim ends bound or refused by this provisioner (nothing waits silently).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let (bound, refused) = loop {
        let mut bound = 0u64;
        let mut refused = 0u64;
        for claim in &created {
            let name = claim.metadata.name.as_deref().unwrap();
            let phase = env.claims().get(name).await.unwrap().status.and_then(|s| s.phase).unwrap_or_default();
            if phase == "Bound" {
                bound += 1;
            } else if env.our_event(&env.ns, &uid(claim), "ProvisioningFailed").await.is_some() {
                refused += 1;
            }
        }
        if bound + refused == created.len() as u64 {
            break (bound, refused);
        }
        assert!(std::time::Instant::now() < deadline, "{bound} bound, {refused} refused\n{}", env.log_tails());
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert!(bound * (10 << 20) <= size, "{bound} volumes of 10 MiB promised on a disk of {size} bytes");
    assert!(refused > 0 && bound > 0, "the burst must reach the limit: {bound} bound, {refused} refused");
}

/// Three nodes sharing one pool (a network filesystem, here one loop filesystem every node
/// mounts at the same path) with requests accounting: each claim's acting node is ranked by its
/// uid, so the claims of a burst are planned by different nodes at the same instant, none of
/// which sees the others' volumes in its watch yet. Their promises go through the pool's shared
/// record (src/deciding/pool_promises.rs enumerates the interleavings of two and three nodes),
/// so together they never promise more than the disk holds.
#[tokio::test(flavor = "multi_thread")]
async fn a_burst_on_a_shared_pool_planned_by_three_nodes_at_once_never_promises_more_than_the_pool() {
    let mut env = TestEnv::start("shared-promises", 0).await;
    // Immediate shared claims are seen by every node of this provisioner name: a name of its own.
    env.own_provisioner();
    let shared = env.cp.temp_dir().join(format!("{}-nfs", env.group));
    std::fs::create_dir_all(&shared).expect("shared pool dir");
    let disk = LoopFs::mount(&shared, 64, None);
    let pool = format!("nfs={},shared,accounting=requests", disk.dir.display());
    for i in 1..=3 {
        let pool = pool.clone();
        env.add_node(&format!("{}-{i}", env.group), &move |spec| {
            spec.arg("--pool").arg(pool.clone()).env("RESERVED_SPACE", "0")
        })
        .await;
    }
    // Every node's view of the live nodes includes the others (a view lives a quarter lease).
    tokio::time::sleep(std::time::Duration::from_secs(u64::from(LEASE_SECONDS) / 4 + 1)).await;
    let class = env
        .class("shared-imm", |c| c.immediate().parameter("storagePool", "nfs").parameter("topology", "shared"))
        .await;
    let size = disk_size(&disk.dir);
    // Twelve claims of 10 MiB, 120 MiB in all, on a disk of 64 MiB: at most six fit.
    let names: Vec<String> = (0..12).map(|i| format!("shared-burst-{i}")).collect();
    let created =
        futures::future::join_all(names.iter().map(|name| {
            env.create_claim(fixtures::claim(&env.ns, name, &class, "10Mi").access_modes(&["ReadWriteMany"]))
        }))
        .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let (bound, refused) = loop {
        let (mut bound, mut refused) = (Vec::new(), 0u64);
        for claim in &created {
            let name = claim.metadata.name.as_deref().unwrap();
            let phase = env.claims().get(name).await.unwrap().status.and_then(|s| s.phase).unwrap_or_default();
            if phase == "Bound" {
                bound.push(claim);
            } else if env.our_event(&env.ns, &uid(claim), "ProvisioningFailed").await.is_some() {
                refused += 1;
            }
        }
        if bound.len() as u64 + refused == created.len() as u64 {
            break (bound, refused);
        }
        assert!(std::time::Instant::now() < deadline, "{} bound, {refused} refused\n{}", bound.len(), env.log_tails());
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    let promised = bound.len() as u64 * (10 << 20);
    println!("{} bound, {refused} refused, {promised} bytes promised of {size}", bound.len());
    assert!(promised <= size, "{} volumes of 10 MiB promised on a shared disk of {size} bytes", bound.len());
    assert!(
        refused > 0 && !bound.is_empty(),
        "the burst must reach the limit: {} bound, {refused} refused",
        bound.len()
    );
    // More than one node planned: the burst was planned across nodes, not by one. Which nodes
    // won the room is a race (one node may make every volume that fits), so a node's refusal
    // counts as well as its volume.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(env.client.clone(), &env.ns);
    let planners: std::collections::BTreeSet<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| matches!(e.reason.as_deref(), Some("ProvisioningSucceeded" | "ProvisioningFailed")))
        .filter_map(|e| e.reporting_instance)
        .collect();
    assert!(planners.len() > 1, "claims planned by {planners:?} only");
    // Every promise was settled once its volume was made or refused: the record is empty.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(env.client.clone(), "default");
    let pool_key = hostpath_provisioner::deciding::topology::PoolKey::new("nfs", &disk.dir.to_string_lossy());
    let lease = hostpath_provisioner::deciding::pool_promises::lease_name(&env.provisioner, &pool_key);
    let record = leases.get(&lease).await.unwrap().metadata.annotations.unwrap_or_default();
    let records: Vec<_> =
        record.get(hostpath_provisioner::deciding::pool_promises::RECORD_ANNOTATION).into_iter().collect();
    assert_eq!(records, ["{}"], "one record for the pool, nothing left promised");
}

/// The size of the filesystem holding `dir`, in bytes.
fn disk_size(dir: &std::path::Path) -> u64 {
    let out = std::process::Command::new("df").args(["-B1", "--output=size"]).arg(dir).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().nth(1).unwrap().trim().parse().unwrap()
}

/// Bytes free for unprivileged writers on the filesystem holding `dir`.
fn disk_free(dir: &std::path::Path) -> u64 {
    let out = std::process::Command::new("df").args(["-B1", "--output=avail"]).arg(dir).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().nth(1).unwrap().trim().parse().unwrap()
}

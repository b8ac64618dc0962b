//! End-to-end: deletion never escapes the volume (symlinks, hard links, mounts), the
//! provisionOnNode restriction, and the pool-root mount-point guard (docs/architecture.md, deletion rules).

mod common;

use std::os::unix::fs::symlink;

use common::*;
use testbed::fixtures;

/// Provisions a pinned claim on the test's first node and returns (claim uid, volume dir).
async fn provisioned(env: &TestEnv, class: &str, name: &str) -> (String, std::path::PathBuf) {
    let node = &env.nodes[0];
    let claim = env.create_claim(fixtures::claim(&env.ns, name, class, "1Mi").provision_on_node(&node.name)).await;
    env.wait_bound(name).await;
    let uid = uid(&claim);
    let dir = node.pool_root.join(format!("pvc-{uid}"));
    assert!(dir.is_dir());
    (uid, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn links_planted_in_a_volume_never_lead_deletion_outside_the_pool() {
    let env = TestEnv::start("links", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let outside = env.cp.temp_dir().join(format!("{}-outside", env.group));
    std::fs::create_dir_all(outside.join("dir")).unwrap();
    std::fs::write(outside.join("secret"), b"outside file").unwrap();
    std::fs::write(outside.join("dir/inner"), b"outside dir").unwrap();

    let (uid, dir) = provisioned(&env, &class, "links").await;
    symlink(outside.join("secret"), dir.join("file-link")).unwrap();
    symlink(outside.join("dir"), dir.join("dir-link")).unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    symlink(&outside, dir.join("sub/up")).unwrap();
    std::fs::hard_link(outside.join("secret"), dir.join("hard")).unwrap();

    env.delete_claim("links").await;
    env.wait_pv_gone(&format!("pvc-{uid}")).await;
    wait_path_gone(&dir).await;
    assert_eq!(std::fs::read(outside.join("secret")).unwrap(), b"outside file");
    assert_eq!(std::fs::read(outside.join("dir/inner")).unwrap(), b"outside dir");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_directory_swapped_for_a_symlink_is_unlinked_not_followed() {
    let env = TestEnv::start("swap", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let target = env.cp.temp_dir().join(format!("{}-target", env.group));
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("data"), b"must survive").unwrap();

    let (uid, dir) = provisioned(&env, &class, "swap").await;
    std::fs::remove_dir(&dir).unwrap();
    symlink(&target, &dir).unwrap();

    env.delete_claim("swap").await;
    env.wait_pv_gone(&format!("pvc-{uid}")).await;
    assert!(std::fs::symlink_metadata(&dir).is_err(), "the symlink itself is removed");
    assert_eq!(std::fs::read(target.join("data")).unwrap(), b"must survive");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_filesystem_mounted_inside_a_volume_stops_deletion_with_an_event() {
    let env = TestEnv::start("mountin", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let (uid, dir) = provisioned(&env, &class, "mountin").await;
    let mount = Tmpfs::mount(&dir.join("mnt"));
    std::fs::write(mount.0.join("other-fs-data"), b"not ours").unwrap();
    let pv_name = format!("pvc-{uid}");
    let pv_uid = env.pvs().get(&pv_name).await.unwrap().metadata.uid.unwrap();

    env.delete_claim("mountin").await;
    let note = env.wait_event("default", &pv_uid, "VolumeFailedDelete").await;
    assert!(note.contains("mount"), "{note}");
    assert_eq!(std::fs::read(mount.0.join("other-fs-data")).unwrap(), b"not ours");
    let pv = env.pvs().get(&pv_name).await.expect("PV kept while the mount is there");
    assert_eq!(pv.status.and_then(|s| s.phase).as_deref(), Some("Released"));
    drop(mount);
}

#[tokio::test(flavor = "multi_thread")]
async fn provision_on_node_can_be_restricted_to_namespaces() {
    let env = TestEnv::start_with("deny", 1, |spec| spec.env("PROVISION_ON_NODE", "some-other-namespace")).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let claim =
        env.create_claim(fixtures::claim(&env.ns, "pinned", &class, "1Mi").provision_on_node(&env.nodes[0].name)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("not allowed in namespace"), "{note}");
    assert!(entries(&env.nodes[0].pool_root).is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unmounted_pool_keeps_the_node_unready_and_refusing_until_a_disk_is_mounted() {
    let mut env = TestEnv::start("mountpoint", 0).await;
    let node = format!("{}-1", env.group);
    env.add_node_no_wait(&node, &|spec| spec.env("REQUIRE_MOUNTPOINT", "true")).await;
    let health = env.nodes[0].provisioner.health_addr();
    testbed::wait_for("readyz names the pool", TIMEOUT, || async {
        let (status, body) = testbed::http_get(health, "/readyz").await?;
        // It names the pool and why.
        anyhow::Ok((status == 503 && body.contains("pool legacy") && body.contains("nothing is mounted")).then_some(()))
    })
    .await
    .expect("unready while the pool root is not a mount point");

    let class = env.class("imm", |c| c.immediate()).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "waits", &class, "1Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("nothing is mounted"), "{note}");
    let pool = env.nodes[0].pool_root.clone();
    assert!(entries(&pool).is_empty(), "nothing written to the unmounted root");

    // The disk arrives: the pool is re-opened, the node turns ready and the claim is served.
    let disk = Tmpfs::mount(&pool);
    env.nodes[0].provisioner.wait_ready(TIMEOUT).await.expect("ready once mounted");
    env.wait_bound("waits").await;
    assert!(disk.0.join(format!("pvc-{}", uid(&claim))).is_dir(), "the volume is on the mounted disk");
    env.delete_claim("waits").await;
    wait_path_gone(&disk.0.join(format!("pvc-{}", uid(&claim)))).await;
    // Stop the provisioner before unmounting its pool.
    env.nodes[0].provisioner.terminate();
    drop(disk);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_flagged_mountpoint_is_refused_alone_until_its_disk_is_mounted() {
    let mut env = TestEnv::start("pool-mountpoint", 0).await;
    let node = format!("{}-1", env.group);
    let claimed = env.cp.temp_dir().join(format!("{}-claimed", env.group));
    std::fs::create_dir_all(&claimed).unwrap();
    let pool_arg = format!("claimed={},mountpoint", claimed.display());
    env.add_node_no_wait(&node, &move |spec| spec.arg("--pool").arg(pool_arg.clone())).await;
    let health = env.nodes[0].provisioner.health_addr();
    testbed::wait_for("readyz names the unmounted pool", TIMEOUT, || async {
        let (status, body) = testbed::http_get(health, "/readyz").await?;
        anyhow::Ok(
            (status == 503 && body.contains("pool claimed") && body.contains("nothing is mounted")).then_some(()),
        )
    })
    .await
    .expect("unready while the flagged pool is not a mount point");

    // The pool without the option (legacy, a plain directory) keeps serving.
    let legacy = env.class("legacy", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "plain", &legacy, "1Mi").provision_on_node(&node)).await;
    env.wait_bound("plain").await;

    let on_claim = env.class("claimed", |c| c.immediate().parameter("storagePool", "claimed")).await;
    let claim = env.create_claim(fixtures::claim(&env.ns, "waits", &on_claim, "1Mi").provision_on_node(&node)).await;
    let note = env.wait_event(&env.ns, &uid(&claim), "ProvisioningFailed").await;
    assert!(note.contains("nothing is mounted") && note.contains("claimed"), "{note}");
    assert!(entries(&claimed).is_empty(), "nothing written under the unmounted pool path");

    let disk = Tmpfs::mount(&claimed);
    env.nodes[0].provisioner.wait_ready(TIMEOUT).await.expect("ready once mounted");
    env.wait_bound("waits").await;
    assert!(disk.0.join(format!("pvc-{}", uid(&claim))).is_dir(), "the volume is on the mounted disk");
    env.delete_claim("waits").await;
    wait_path_gone(&disk.0.join(format!("pvc-{}", uid(&claim)))).await;
    env.nodes[0].provisioner.terminate();
    drop(disk);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pool_reached_through_a_replaced_parent_is_refused_until_restored() {
    let env = TestEnv::start("redirect", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let (uid, dir) = provisioned(&env, &class, "redirect").await;
    std::fs::write(dir.join("data"), b"the real volume").unwrap();
    let pv_name = format!("pvc-{uid}");
    let pv_uid = env.pvs().get(&pv_name).await.unwrap().metadata.uid.unwrap();

    // The directory above the pool root is moved away and a symlink to another tree, with a
    // directory of the same volume name, put in its place.
    let parent = env.nodes[0].pool_root.parent().unwrap().to_owned();
    let moved = parent.with_extension("moved");
    let decoy = env.cp.temp_dir().join(format!("{}-decoy", env.group));
    std::fs::create_dir_all(decoy.join("pool").join(format!("pvc-{uid}"))).unwrap();
    std::fs::write(decoy.join("pool").join(format!("pvc-{uid}/other")), b"someone else's").unwrap();
    std::fs::rename(&parent, &moved).unwrap();
    symlink(&decoy, &parent).unwrap();

    env.delete_claim("redirect").await;
    let note = env.wait_event("default", &pv_uid, "VolumeFailedDelete").await;
    assert!(note.contains("now leads to"), "{note}");
    let health = env.nodes[0].provisioner.health_addr();
    testbed::wait_for("readyz names the redirected pool", TIMEOUT, || async {
        let (status, body) = testbed::http_get(health, "/readyz").await?;
        anyhow::Ok((status == 503 && body.contains("now leads to")).then_some(()))
    })
    .await
    .expect("unready while redirected");
    assert_eq!(std::fs::read(decoy.join("pool").join(format!("pvc-{uid}/other"))).unwrap(), b"someone else's");
    assert!(!decoy.join("pool/.hpp-trash").exists(), "nothing moved into the other tree's trash");
    assert!(env.pvs().get_opt(&pv_name).await.unwrap().is_some(), "the PV waits");

    // Restored: the deletion goes through, on the real volume.
    std::fs::remove_file(&parent).unwrap();
    std::fs::rename(&moved, &parent).unwrap();
    env.wait_pv_gone(&pv_name).await;
    wait_path_gone(&dir).await;
    assert!(decoy.join("pool").join(format!("pvc-{uid}/other")).exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn data_the_background_removal_cannot_remove_is_reported_on_the_node_with_its_size() {
    let env = TestEnv::start("stuck", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let (uid, dir) = provisioned(&env, &class, "stuck").await;
    std::fs::write(dir.join("pinned"), vec![7u8; 256 << 10]).unwrap();
    let chattr = |flag: &str, path: &std::path::Path| {
        let status = std::process::Command::new("chattr").arg(flag).arg(path).status().expect("chattr");
        assert!(status.success(), "chattr {flag} {}", path.display());
    };
    chattr("+i", &dir.join("pinned"));

    // Fast reclaim: the PV goes at once, the data waits in the trash and cannot be removed.
    env.delete_claim("stuck").await;
    env.wait_pv_gone(&format!("pvc-{uid}")).await;
    let node = env.nodes[0].name.clone();
    let node_uid = env.cp.admin_client();
    let node_uid =
        kube::Api::<k8s_openapi::api::core::v1::Node>::all(node_uid).get(&node).await.unwrap().metadata.uid.unwrap();
    let note = env.wait_event("default", &node_uid, "TrashPurgeFailed").await;
    assert!(note.contains("chattr -R -i -a") && note.contains(".hpp-trash"), "{note}");
    let provisioner = &env.nodes[0].provisioner;
    let stuck = testbed::wait_for("stuck bytes reported", TIMEOUT, || async {
        let metrics = provisioner.metrics().await?;
        let line = metrics
            .lines()
            .find(|l| l.starts_with("hostpath_provisioner_trash_stuck_bytes{") && l.contains("permission_denied"))
            .map(str::to_owned);
        anyhow::Ok(line.filter(|l| !l.ends_with(" 0")))
    })
    .await
    .expect("metric");
    let bytes: u64 = stuck.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(bytes >= 256 << 10, "{stuck}");

    // The admin lifts the attribute: the next pass empties the trash and clears the figure.
    let trash = env.nodes[0].pool_root.join(TRASH);
    for entry in std::fs::read_dir(&trash).unwrap() {
        chattr("-i", &entry.unwrap().path().join("pinned"));
    }
    wait_trash_empty(&env.nodes[0].pool_root).await;
    testbed::wait_for("stuck bytes cleared", TIMEOUT, || async {
        let metrics = provisioner.metrics().await?;
        anyhow::Ok(
            metrics
                .lines()
                .any(|l| l.starts_with("hostpath_provisioner_trash_stuck_bytes{") && l.ends_with(" 0"))
                .then_some(()),
        )
    })
    .await
    .expect("cleared");
}

#[tokio::test(flavor = "multi_thread")]
async fn data_of_a_pv_deleted_by_hand_is_kept_and_reported() {
    let mut env = TestEnv::start("byhand", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let (uid, dir) = provisioned(&env, &class, "byhand").await;
    std::fs::write(dir.join("precious"), vec![1u8; 64 << 10]).unwrap();

    // `kubectl delete pv` on a bound volume: it waits (pv-protection) until the claim goes.
    env.pvs().delete(&format!("pvc-{uid}"), &Default::default()).await.expect("delete PV");
    env.delete_claim("byhand").await;
    env.wait_pv_gone(&format!("pvc-{uid}")).await;
    let node = env.nodes[0].name.clone();
    let node_uid = kube::Api::<k8s_openapi::api::core::v1::Node>::all(env.client.clone())
        .get(&node)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let note = env.wait_event("default", &node_uid, "OrphanedVolumeData").await;
    assert!(note.contains(&format!("pvc-{uid}")) && note.contains("Nothing was removed"), "{note}");
    assert_eq!(std::fs::read(dir.join("precious")).unwrap().len(), 64 << 10, "the data is kept");

    // Found again at start-up, with its size.
    env.node_mut(&node).provisioner.restart().expect("restart");
    env.node_mut(&node).provisioner.wait_ready(TIMEOUT).await.expect("ready");
    let provisioner = &env.nodes[0].provisioner;
    testbed::wait_for("orphaned bytes reported after a restart", TIMEOUT, || async {
        let metrics = provisioner.metrics().await?;
        let bytes = metrics
            .lines()
            .find(|l| l.starts_with("hostpath_provisioner_orphaned_volume_bytes{"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
        anyhow::Ok(bytes.filter(|b| *b >= 64 << 10))
    })
    .await
    .expect("metric");
    assert!(dir.join("precious").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn with_pv_finalizer_a_pv_deleted_by_hand_waits_for_its_data_to_be_dealt_with() {
    let env = TestEnv::start_with("pvfinal", 1, |spec| spec.env("PV_FINALIZER", "true")).await;
    let delete = env.class("imm", |c| c.immediate()).await;
    let retain = env.class("keep", |c| c.immediate().reclaim_policy("Retain")).await;
    let (uid, dir) = provisioned(&env, &delete, "gone").await;
    let (kept_uid, kept_dir) = provisioned(&env, &retain, "kept").await;
    for (uid, dir) in [(&uid, &dir), (&kept_uid, &kept_dir)] {
        std::fs::write(dir.join("data"), b"payload").unwrap();
        let pv = env.pvs().get(&format!("pvc-{uid}")).await.unwrap();
        let finalizers = pv.metadata.finalizers.unwrap_or_default();
        assert!(
            finalizers.iter().any(|f| f == "external-provisioner.volume.kubernetes.io/finalizer"),
            "{finalizers:?}"
        );
        // kubectl delete pv while the claim still uses it.
        env.pvs().delete(&format!("pvc-{uid}"), &Default::default()).await.expect("delete PV");
    }
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(env.pvs().get_opt(&format!("pvc-{uid}")).await.unwrap().is_some(), "held while in use");
    assert!(dir.join("data").exists());

    // The claims go: the Delete volume's data is removed and its PV goes; the Retain volume's PV
    // goes and its data stays.
    env.delete_claim("gone").await;
    env.delete_claim("kept").await;
    env.wait_pv_gone(&format!("pvc-{uid}")).await;
    env.wait_pv_gone(&format!("pvc-{kept_uid}")).await;
    wait_path_gone(&dir).await;
    assert_eq!(std::fs::read(kept_dir.join("data")).unwrap(), b"payload", "Retain keeps the data");
}

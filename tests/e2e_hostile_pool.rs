//! End-to-end: a pool root that someone else writes. The directories the provisioner keeps its
//! own work in are swapped for symlinks, files, bind mounts and other directories while the node
//! restarts again and again; a trash that cannot take a volume is refused before a PV goes, and
//! data stranded after its PV went is reported and moved on without a restart.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use k8s_openapi::api::core::v1::Node;
use testbed::fixtures;

const TRASH: &str = ".hpp-trash";
const STAGING: &str = ".hpp-deleting";
const CLONES: &str = ".hpp-clones";

/// `dir/sub/file` holding `keep`: what an attack would like removed.
fn make_precious(dir: &Path) {
    std::fs::create_dir_all(dir.join("sub")).expect("mkdir precious");
    std::fs::write(dir.join("sub/file"), b"keep").expect("write precious");
}

fn precious_intact(dir: &Path) -> bool {
    std::fs::read(dir.join("sub/file")).is_ok_and(|d| d == b"keep")
}

async fn provisioned(env: &TestEnv, class: &str, name: &str) -> (String, PathBuf) {
    let node = env.nodes[0].name.clone();
    let claim = env.create_claim(fixtures::claim(&env.ns, name, class, "1Mi").provision_on_node(&node)).await;
    let pv = env.wait_bound(name).await;
    let path = PathBuf::from(pv.spec.unwrap().host_path.unwrap().path);
    std::fs::write(path.join("data"), name.as_bytes()).expect("write data");
    (uid(&claim), path)
}

async fn node_uid(env: &TestEnv) -> String {
    kube::Api::<Node>::all(env.client.clone()).get(&env.nodes[0].name).await.expect("node").metadata.uid.expect("uid")
}

async fn gauge(env: &TestEnv, metric: &str) -> Option<u64> {
    let metrics = env.nodes[0].provisioner.metrics().await.ok()?;
    metrics.lines().find(|l| l.starts_with(metric)).and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok())
}

fn chattr(flag: &str, path: &Path) {
    let status = std::process::Command::new("chattr").arg(flag).arg(path).status().expect("chattr");
    assert!(status.success(), "chattr {flag} {}", path.display());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deletion_is_refused_while_the_trash_is_not_a_directory_and_goes_through_once_it_is() {
    let env = TestEnv::start("trashfile", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let (uid, dir) = provisioned(&env, &class, "kept").await;
    let pool = env.nodes[0].pool_root.clone();
    let _ = std::fs::remove_dir(pool.join(TRASH));
    std::fs::write(pool.join(TRASH), b"not a trash").expect("a file in place of the trash");
    env.delete_claim("kept").await;
    let pv = format!("pvc-{uid}");
    let pv_uid = env.wait_pv_phase(&pv, "Released").await.metadata.uid.expect("uid");
    let note = env.wait_event("default", &pv_uid, "VolumeFailedDelete").await;
    assert!(note.contains(".hpp-trash") && note.contains("a symlink or a file"), "{note}");
    assert!(env.pvs().get_opt(&pv).await.expect("get").is_some(), "the PV stays while its data cannot go");
    assert!(dir.join("data").exists(), "the data stays in place");
    std::fs::remove_file(pool.join(TRASH)).expect("the admin moves the file away");
    env.wait_pv_gone(&pv).await;
    wait_path_gone(&dir).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn data_stranded_after_its_pv_went_is_reported_and_moved_to_the_trash_once_it_can_be() {
    let env = TestEnv::start("stranded", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let (uid, dir) = provisioned(&env, &class, "gone").await;
    std::fs::write(dir.join("big"), vec![7u8; 256 << 10]).expect("write");
    let pool = env.nodes[0].pool_root.clone();
    std::fs::create_dir_all(pool.join(TRASH)).expect("mkdir trash");
    // The trash opens as a directory, but nothing can be renamed into it.
    chattr("+i", &pool.join(TRASH));
    env.delete_claim("gone").await;
    env.wait_pv_gone(&format!("pvc-{uid}")).await;
    let note = env.wait_event("default", &node_uid(&env).await, "StrandedVolumeData").await;
    assert!(note.contains(STAGING) && note.contains(&format!("pvc-{uid}")) && note.contains("KiB"), "{note}");
    let stranded = testbed::wait_for("stranded bytes reported", TIMEOUT, || async {
        anyhow::Ok(gauge(&env, "hostpath_provisioner_stranded_volume_bytes{").await.filter(|b| *b > 0))
    })
    .await
    .expect("gauge");
    assert!(stranded >= 256 << 10, "{stranded} bytes");
    assert!(std::fs::read_dir(pool.join(STAGING)).is_ok(), "the data waits staged");
    // The doctor shows it too.
    let doctor = std::process::Command::new(binary())
        .arg("doctor")
        .env_clear()
        .env("NODE_NAME", &env.nodes[0].name)
        .env("PV_DIR", &pool)
        .output()
        .expect("run the doctor");
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(report.contains("staged_volumes") && report.contains(".hpp-deleting"), "{report}");
    // The admin lifts the attribute: within the next settling pass (a minute) it goes, without
    // a restart.
    chattr("-i", &pool.join(TRASH));
    testbed::wait_for("stranded data moved on", Duration::from_secs(150), || async {
        let staged = entries(&pool.join(STAGING));
        let gauge = gauge(&env, "hostpath_provisioner_stranded_volume_bytes{").await;
        anyhow::Ok((staged.is_empty() && gauge == Some(0)).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    wait_trash_empty(&pool).await;
}

/// Swaps the provisioner's bookkeeping directories under the pool, round after round, until
/// told to stop: each real one is moved aside and replaced in turn by a symlink to `precious`,
/// a file, and a bind mount of `precious`, then put back when nothing took its place meanwhile.
struct Swapper {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicUsize>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Swapper {
    fn start(pool: PathBuf, node: String, precious: PathBuf) -> Swapper {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicUsize::new(0));
        let (stop2, rounds2) = (stop.clone(), rounds.clone());
        let thread = std::thread::spawn(move || {
            let targets = [
                pool.join(TRASH),
                pool.join(STAGING),
                pool.join(STAGING).join(&node),
                pool.join(CLONES),
                pool.join(CLONES).join(&node),
            ];
            while !stop2.load(Ordering::Relaxed) {
                for target in &targets {
                    swap_once(target, &precious);
                }
                rounds2.fetch_add(1, Ordering::Relaxed);
            }
        });
        Swapper { stop, rounds, thread: Some(thread) }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("swapper thread");
        }
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.stop();
    }
}

fn swap_once(target: &Path, precious: &Path) {
    let aside = target.with_extension("aside");
    let moved = std::fs::symlink_metadata(target).is_ok_and(|m| m.is_dir()) && std::fs::rename(target, &aside).is_ok();
    let pause = || std::thread::sleep(Duration::from_millis(3));
    if std::os::unix::fs::symlink(precious, target).is_ok() {
        pause();
        let _ = std::fs::remove_file(target);
    }
    if std::fs::write(target, b"not yours").is_ok() {
        pause();
        let _ = std::fs::remove_file(target);
    }
    if std::fs::create_dir(target).is_ok() {
        if rustix::mount::mount_bind(precious, target).is_ok() {
            pause();
            let _ = rustix::mount::unmount(target, rustix::mount::UnmountFlags::DETACH);
        }
        let _ = std::fs::remove_dir(target);
    }
    if moved {
        // Put back unless the provisioner made the directory again meanwhile.
        let _ = rustix::fs::renameat_with(
            rustix::fs::CWD,
            &aside,
            rustix::fs::CWD,
            target,
            rustix::fs::RenameFlags::NOREPLACE,
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bookkeeping_directories_swapped_while_the_node_restarts_never_lead_outside_the_pool() {
    let mut env = TestEnv::start("swapped", 1).await;
    let class = env.class("imm", |c| c.immediate()).await;
    let node = env.nodes[0].name.clone();
    let pool = env.nodes[0].pool_root.clone();
    // Outside the pool, on the same filesystem: what a swapped directory points at.
    let precious = pool.parent().expect("pool parent").join("precious");
    make_precious(&precious);
    let mut live: Vec<(String, PathBuf)> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    let mut swapper = Swapper::start(pool.clone(), node.clone(), precious.clone());
    for round in 0..12 {
        let name = format!("v{round}");
        live.push((name.clone(), provisioned(&env, &class, &name).await.1));
        if round % 2 == 1 {
            let (gone, _) = live.remove(0);
            let pv = env.wait_bound(&gone).await.metadata.name.expect("pv");
            env.delete_claim(&gone).await;
            deleted.push(pv);
        }
        env.node_mut(&node).provisioner.restart().expect("restart");
        env.node_mut(&node).provisioner.wait_ready(testbed::PROVISIONER_READY_TIMEOUT).await.expect("ready");
        assert!(precious_intact(&precious), "round {round}: data outside the pool was touched");
    }
    swapper.stop();
    assert!(swapper.rounds.load(Ordering::Relaxed) > 10, "the swapper ran");
    assert!(precious_intact(&precious), "nothing outside the pool is removed");
    // The swapper gone, everything converges: the deleted volumes' PVs go (their data with them
    // or into the trash), the live volumes keep their data.
    for pv in &deleted {
        env.wait_pv_gone(pv).await;
    }
    for (name, dir) in &live {
        assert_eq!(std::fs::read(dir.join("data")).expect("data of a live volume"), name.as_bytes());
    }
    assert!(precious_intact(&precious));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(!mounts.contains(&pool.display().to_string()), "no mount left under the pool");
}

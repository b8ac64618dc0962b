//! End-to-end: `hostpath-provisioner pool-mount`, the per-node mounter the operator runs for each
//! pool on a claim (docs/operator.md, "Pools on a claim"), as a process on this host: it
//! bind-mounts a claim's directory onto the pool path, answers its probe, never mounts over a
//! non-empty directory, and leaves the mount in place while volumes live there. Needs root (it
//! mounts), as the other mount tests.

mod common;

use std::path::PathBuf;

use common::*;

const WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Unmounts (lazily) what a pool-mount test left mounted, whatever happened.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let umount = || {
            std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        while umount() {}
    }
}

fn pool_mount(source: &std::path::Path, target: &std::path::Path, extra: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(binary());
    command.arg("pool-mount").arg("--source").arg(source).arg("--target").arg(target).args(extra);
    command
}

/// `pool-mount` bind-mounts the claim onto the pool path, answers its probe, never mounts over a
/// non-empty directory, and on SIGTERM unmounts only a pool that holds no volume.
#[tokio::test(flavor = "multi_thread")]
async fn pool_mount_mounts_the_claim_and_keeps_it_while_volumes_live_there() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(testbed::unique_name("pool-mount"));
    let (claim, pool) = (dir.join("claim"), dir.join("pool"));
    // Dropped last, after both mounts are gone.
    let _remove = RemoveDir(dir.clone());
    let _claim_fs = Tmpfs::mount(&claim);
    let _cleanup = Unmount(pool.clone());
    std::fs::write(claim.join(".marker"), "on the claim").expect("marker");
    let probe = |pool: &std::path::Path| pool_mount(&claim, pool, &["--check"]).status().expect("probe").success();

    // Mounted, probed, then unmounted on SIGTERM since no volume lives there.
    let mut mounter = pool_mount(&claim, &pool, &[]).spawn().expect("pool-mount");
    testbed::wait_for("the claim on the pool path", WAIT, || async {
        Ok::<_, std::convert::Infallible>(pool.join(".marker").exists().then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(probe(&pool));
    // SAFETY: kill(2) on our own child, not reaped yet.
    unsafe { libc::kill(mounter.id() as i32, libc::SIGTERM) };
    assert!(mounter.wait().expect("wait").success());
    assert!(!pool.join(".marker").exists(), "an empty pool is unmounted on SIGTERM");
    assert!(!probe(&pool));

    // With a volume in it, the mount outlives the mounter, and the next one adopts it.
    let mut mounter = pool_mount(&claim, &pool, &[]).spawn().expect("pool-mount");
    testbed::wait_for("the claim on the pool path", WAIT, || async {
        Ok::<_, std::convert::Infallible>(probe(&pool).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    std::fs::create_dir(pool.join("pvc-0b5c4a1e")).expect("a volume");
    // SAFETY: as above.
    unsafe { libc::kill(mounter.id() as i32, libc::SIGTERM) };
    assert!(mounter.wait().expect("wait").success());
    assert!(probe(&pool), "the mount stays while a volume lives there");
    let log = dir.join("adopter.log");
    let adopter =
        pool_mount(&claim, &pool, &[]).stderr(std::fs::File::create(&log).expect("log")).spawn().expect("pool-mount");
    let mut adopted = KillOnDrop(adopter);
    testbed::wait_for("the next mounter to adopt the mount", WAIT, || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        Ok::<_, std::convert::Infallible>(text.contains("adopted").then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(adopted.0.try_wait().expect("try_wait").is_none(), "the adopter keeps running");
    drop(adopted);
    let unmounted = std::process::Command::new("umount").arg(&pool).status().expect("umount");
    assert!(unmounted.success(), "the adopted mount was in place");

    // A non-empty pool path is never mounted over.
    std::fs::create_dir_all(pool.join("pvc-old")).expect("old data");
    let output = pool_mount(&claim, &pool, &[]).output().expect("pool-mount");
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("is not empty"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(!probe(&pool));
}

/// Removes a test's directory when dropped.
struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A child killed (SIGKILL) and reaped when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

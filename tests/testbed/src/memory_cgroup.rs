//! A memory cgroup for one provisioner process: the limit a pod's `resources.limits.memory` puts
//! on it in a cluster, and the OOM kills under that limit. cgroup v2 (`memory.max`,
//! `memory.events`) or v1 (`memory.limit_in_bytes`, `memory.oom_control`), whichever this host
//! mounts. Needs root; the cgroup is removed when dropped (after its process has exited).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context, Result, bail};

/// OOM kills counted in cgroups already removed (their process was replaced or stopped).
static KILLS_IN_REMOVED: AtomicU64 = AtomicU64::new(0);

/// OOM kills in the cgroups this harness made and removed so far.
pub fn oom_kills_in_removed_cgroups() -> u64 {
    KILLS_IN_REMOVED.load(Ordering::Relaxed)
}

const V2_ROOT: &str = "/sys/fs/cgroup";
const V1_ROOT: &str = "/sys/fs/cgroup/memory";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// A cgroup of this harness with a memory limit.
#[derive(Debug)]
pub struct MemoryCgroup {
    dir: PathBuf,
    version: Version,
    limit_bytes: u64,
}

impl MemoryCgroup {
    /// Creates cgroup `name` (unique to this harness process) limited to `limit_bytes`.
    pub fn create(name: &str, limit_bytes: u64) -> Result<MemoryCgroup> {
        let name = format!("testbed-{}-{name}", std::process::id());
        let v2_controllers = Path::new(V2_ROOT).join("cgroup.controllers");
        let (dir, version) = if v2_controllers.exists() {
            let controllers = fs::read_to_string(&v2_controllers)?;
            if !controllers.split_whitespace().any(|c| c == "memory") {
                bail!("cgroup v2 has no memory controller here ({controllers:?})");
            }
            // The root's children get the memory controller only once the root hands it down.
            fs::write(Path::new(V2_ROOT).join("cgroup.subtree_control"), "+memory")
                .context("enabling the memory controller for the root's children")?;
            (Path::new(V2_ROOT).join(&name), Version::V2)
        } else if Path::new(V1_ROOT).join("memory.limit_in_bytes").exists() {
            (Path::new(V1_ROOT).join(&name), Version::V1)
        } else {
            bail!("no memory cgroup controller mounted at {V2_ROOT} (v2) or {V1_ROOT} (v1)");
        };
        fs::create_dir(&dir).with_context(|| format!("creating cgroup {}", dir.display()))?;
        let cgroup = MemoryCgroup { dir, version, limit_bytes };
        let limit_file = match version {
            Version::V2 => "memory.max",
            Version::V1 => "memory.limit_in_bytes",
        };
        fs::write(cgroup.dir.join(limit_file), limit_bytes.to_string())
            .with_context(|| format!("setting {limit_file} of {}", cgroup.dir.display()))?;
        Ok(cgroup)
    }

    /// The file a process writes `0` to in order to join (before its exec).
    pub fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    /// The limit, in bytes.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// How many processes the kernel's OOM killer killed in this cgroup.
    pub fn oom_kills(&self) -> Result<u64> {
        let file = match self.version {
            Version::V2 => "memory.events",
            Version::V1 => "memory.oom_control",
        };
        let text = fs::read_to_string(self.dir.join(file))?;
        parse_counter(&text, "oom_kill").with_context(|| format!("no oom_kill in {file}: {text:?}"))
    }

    /// The most memory the cgroup was charged, in bytes (v2 `memory.peak`, from kernel 5.19;
    /// v1 `memory.max_usage_in_bytes`).
    pub fn peak_bytes(&self) -> Option<u64> {
        let file = match self.version {
            Version::V2 => "memory.peak",
            Version::V1 => "memory.max_usage_in_bytes",
        };
        fs::read_to_string(self.dir.join(file)).ok()?.trim().parse().ok()
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        KILLS_IN_REMOVED.fetch_add(self.oom_kills().unwrap_or(0), Ordering::Relaxed);
        // Its process was killed and reaped just before; the kernel may take a moment to empty it.
        for _ in 0..50 {
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        eprintln!("testbed: could not remove cgroup {}", self.dir.display());
    }
}

/// The value of `key` in a `key value` per line file (memory.events, memory.oom_control).
fn parse_counter(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// Bytes of a Kubernetes memory quantity as the manifests write limits (`64Mi`, `128M`, `1Gi`,
/// plain bytes).
pub fn quantity_bytes(quantity: &str) -> Result<u64> {
    let quantity = quantity.trim();
    let split = quantity.find(|c: char| !c.is_ascii_digit()).unwrap_or(quantity.len());
    let (number, unit) = quantity.split_at(split);
    let number: u64 = number.parse().with_context(|| format!("memory quantity {quantity:?}"))?;
    let factor: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        other => bail!("memory quantity {quantity:?}: unit {other:?} not handled"),
    };
    Ok(number * factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kills_are_read_from_either_version() {
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(parse_counter(v2, "oom_kill"), Some(1));
        assert_eq!(parse_counter(v1, "oom_kill"), Some(3));
        assert_eq!(parse_counter("oom 2\n", "oom_kill"), None);
    }

    #[test]
    fn limits_are_read_as_the_manifests_write_them() {
        assert_eq!(quantity_bytes("64Mi").unwrap(), 64 << 20);
        assert_eq!(quantity_bytes("1Gi").unwrap(), 1 << 30);
        assert_eq!(quantity_bytes("500M").unwrap(), 500_000_000);
        assert_eq!(quantity_bytes("1048576").unwrap(), 1 << 20);
        assert!(quantity_bytes("64Xi").is_err());
    }
}

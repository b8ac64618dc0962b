//! Where the control-plane binaries are, building them with `hack/build-control-plane.sh` when
//! they are missing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use anyhow::{Context, Result, anyhow, bail};

/// The binaries a control plane runs, plus kubectl (tests render and apply `deploy/` with it),
/// all in one directory.
pub(crate) const REQUIRED: [&str; 5] =
    ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl"];

/// Overrides the directory (skips the build script entirely).
pub const BIN_DIR_ENV: &str = "TESTBED_K8S_BIN_DIR";

/// Returns the directory holding [`REQUIRED`], running the build script if one is missing.
///
/// The cache path is computed the way the script computes it (its version defaults are read
/// from the script itself, so the two never drift); the script only runs when a binary is
/// missing there, because even a no-op run costs a `go` invocation and, more importantly, a run
/// while another build is in progress would start a second multi-GB compile.
pub(crate) fn locate_or_build() -> Result<PathBuf> {
    locate_or_build_with(&[])
}

/// [`locate_or_build`] for the real-node lane, which also needs the kubelet: a cache made
/// before the script built the kubelet gets it added (the script builds only what is missing).
pub(crate) fn locate_or_build_with_kubelet() -> Result<PathBuf> {
    locate_or_build_with(&["kubelet"])
}

fn locate_or_build_with(extra: &[&'static str]) -> Result<PathBuf> {
    // One build at a time per test binary; tests that start control planes concurrently queue here.
    static BUILD: Mutex<()> = Mutex::new(());
    let _one_at_a_time = BUILD.lock().unwrap_or_else(|poisoned| poisoned.into_inner());

    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        let dir = PathBuf::from(dir);
        return match missing(&dir, extra) {
            None => Ok(dir),
            Some(name) => bail!("{BIN_DIR_ENV}={} lacks {name}", dir.display()),
        };
    }
    let script = build_script();
    let script_text = std::fs::read_to_string(&script).with_context(|| format!("reading {}", script.display()))?;
    if let Some(dir) = cached_bin_dir(&script_text)
        && missing(&dir, extra).is_none()
    {
        return Ok(dir);
    }
    run_build_script(&script, extra)
}

/// The minor version of the kube-apiserver in `dir` (`Kubernetes v1.25.4` gives 25), asked once
/// per directory: a control plane older than the pinned one (the oldest-Kubernetes lane) takes
/// some flags under older names.
pub(crate) fn minor_version(dir: &Path) -> Result<u32> {
    static KNOWN: Mutex<Vec<(PathBuf, u32)>> = Mutex::new(Vec::new());
    let mut known = KNOWN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, minor)) = known.iter().find(|(known, _)| known == dir) {
        return Ok(*minor);
    }
    let program = dir.join("kube-apiserver");
    let output = Command::new(&program)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {} --version", program.display()))?;
    let text = String::from_utf8_lossy(&output.stdout);
    let minor = parse_minor(&text).ok_or_else(|| anyhow!("{} --version printed {text:?}", program.display()))?;
    known.push((dir.to_path_buf(), minor));
    Ok(minor)
}

/// `Kubernetes v1.25.4` (or `v1.36.3-rc.0`) gives 25 (36).
fn parse_minor(version_line: &str) -> Option<u32> {
    let version = version_line.split_whitespace().find_map(|word| word.strip_prefix("v1."))?;
    version.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
}

fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/build-control-plane.sh")
}

fn missing(dir: &Path, extra: &[&'static str]) -> Option<&'static str> {
    REQUIRED.iter().chain(extra).copied().find(|name| !is_executable(&dir.join(name)))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `$CACHE_ROOT/k8s/$K8S_VERSION-etcd-$ETCD_VERSION/bin`, as the script defines it.
fn cached_bin_dir(script_text: &str) -> Option<PathBuf> {
    let k8s = setting(script_text, "K8S_VERSION")?;
    let etcd = setting(script_text, "ETCD_VERSION")?;
    let root = match std::env::var_os("HPP_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let cache = match std::env::var_os("XDG_CACHE_HOME") {
                Some(dir) => PathBuf::from(dir),
                None => PathBuf::from(std::env::var_os("HOME")?).join(".cache"),
            };
            cache.join("hostpath-provisioner")
        }
    };
    Some(root.join("k8s").join(format!("{k8s}-etcd-{etcd}")).join("bin"))
}

/// The value of `NAME` as the script sees it: the environment, else the default in its
/// `NAME="${NAME:-default}"` line.
fn setting(script_text: &str, name: &str) -> Option<String> {
    if let Ok(value) = std::env::var(name) {
        return Some(value);
    }
    let marker = format!("{name}=\"${{{name}:-");
    let start = script_text.find(&marker)? + marker.len();
    let rest = &script_text[start..];
    Some(rest[..rest.find('}')?].to_string())
}

fn run_build_script(script: &Path, extra: &[&'static str]) -> Result<PathBuf> {
    eprintln!("testbed: control-plane binaries missing; running {} (a cold build takes 15-30 min)", script.display());
    let output = Command::new("bash")
        .arg(script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!("{} failed with {}", script.display(), output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let dir = stdout
        .lines()
        .last()
        .map(|line| PathBuf::from(line.trim()))
        .ok_or_else(|| anyhow!("{} printed no bin directory", script.display()))?;
    match missing(&dir, extra) {
        None => Ok(dir),
        Some(name) => bail!("{} reported {} but {name} is not there", script.display(), dir.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_version_defaults_from_the_script() {
        let script = "K8S_VERSION=\"${K8S_VERSION:-v1.2.3}\"\nETCD_VERSION=\"${ETCD_VERSION:-v9.8.7}\"\n";
        // The environment wins, as in the script; only check the default when it is unset.
        if std::env::var_os("K8S_VERSION").is_none() {
            assert_eq!(setting(script, "K8S_VERSION").as_deref(), Some("v1.2.3"));
        }
        if std::env::var_os("ETCD_VERSION").is_none() {
            assert_eq!(setting(script, "ETCD_VERSION").as_deref(), Some("v9.8.7"));
        }
        assert_eq!(setting(script, "NOT_THERE"), None);
    }

    #[test]
    fn minor_version_comes_from_the_version_line() {
        assert_eq!(parse_minor("Kubernetes v1.25.4\n"), Some(25));
        assert_eq!(parse_minor("Kubernetes v1.36.3-rc.0"), Some(36));
        assert_eq!(parse_minor("Kubernetes v2.0.0"), None);
        assert_eq!(parse_minor(""), None);
    }

    #[test]
    fn the_real_script_still_has_parsable_defaults() {
        let text = std::fs::read_to_string(build_script()).expect("build script readable");
        let dir = cached_bin_dir(&text).expect("versions found in the build script");
        assert!(dir.ends_with("bin"), "{}", dir.display());
    }
}

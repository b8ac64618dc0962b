//! The tools the deploy tests use besides kubectl: `helm`, `kube-score`, and the CRDs of the
//! chart's optional objects, built or fetched by `hack/build-deploy-tools.sh` from the Go module
//! proxy and cached by version next to the control plane.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use anyhow::{Context, Result, bail};

/// One of the items the script provides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeployTool {
    /// The `helm` binary.
    Helm,
    /// The `kube-score` binary.
    KubeScore,
    /// A directory of CRD manifests: ServiceMonitor, PrometheusRule, SecurityContextConstraints.
    Crds,
}

impl DeployTool {
    fn argument(self) -> &'static str {
        match self {
            DeployTool::Helm => "helm",
            DeployTool::KubeScore => "kube-score",
            DeployTool::Crds => "crds",
        }
    }
}

/// The path of `tool`, building it on first use (a cold helm build takes several minutes).
///
/// The script is run once per test binary and tool; it answers from its cache without invoking
/// Go when the tool is there, and concurrent runs from parallel test binaries wait on its lock
/// instead of compiling twice.
pub fn deploy_tool(tool: DeployTool) -> Result<PathBuf> {
    static FOUND: Mutex<Option<HashMap<DeployTool, PathBuf>>> = Mutex::new(None);
    let mut found = FOUND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(path) = found.get_or_insert_with(HashMap::new).get(&tool) {
        return Ok(path.clone());
    }
    let path = run_script(tool)?;
    found.get_or_insert_with(HashMap::new).insert(tool, path.clone());
    Ok(path)
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/build-deploy-tools.sh")
}

fn run_script(tool: DeployTool) -> Result<PathBuf> {
    let script = script();
    let output = Command::new("bash")
        .arg(&script)
        .arg(tool.argument())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!("{} {} failed with {}", script.display(), tool.argument(), output.status);
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = stdout
        .lines()
        .last()
        .map(|line| PathBuf::from(line.trim()))
        .with_context(|| format!("{} printed no path for {}", script.display(), tool.argument()))?;
    if !path.exists() {
        bail!("{} reported {} for {}, which does not exist", script.display(), path.display(), tool.argument());
    }
    Ok(path)
}

//! Records the git commit the binary is built from, for the `hostpath_provisioner_build_info`
//! metric and the start-up log line. `HPP_GIT_COMMIT` overrides it (image builds copy the sources
//! without `.git`); without either, the commit is `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=HPP_GIT_COMMIT");
    let commit = std::env::var("HPP_GIT_COMMIT")
        .ok()
        .map(|c| c.trim().to_owned())
        .filter(|c| !c.is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=HPP_GIT_COMMIT={commit}");
}

/// `git rev-parse HEAD`, and rebuild triggers for a new commit or checkout.
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "HEAD"])?;
    // HEAD names the branch; the branch's ref (loose or packed) names the commit. Paths that do
    // not exist are left out: cargo would otherwise rerun this script on every build.
    let mut watched =
        vec![git(&["rev-parse", "--git-path", "HEAD"])?, git(&["rev-parse", "--git-path", "packed-refs"])?];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.extend(git(&["rev-parse", "--git-path", &branch]));
    }
    for path in watched.iter().filter(|p| Path::new(p).exists()) {
        println!("cargo:rerun-if-changed={path}");
    }
    Some(commit)
}

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?.trim().to_owned();
    (output.status.success() && !text.is_empty()).then_some(text)
}

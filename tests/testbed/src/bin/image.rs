//! `make image`: the provisioner's container image as an OCI archive, built without any
//! registry. Usage: `image [--platform linux/amd64,linux/arm64,linux/ppc64le,linux/s390x]
//! [--binary PATH] [--arm64-binary PATH] [--ppc64le-binary PATH] [--s390x-binary PATH]
//! [--name IMAGE] [--out FILE]`.
//!
//! By default it builds the static binary for linux/amd64 and linux/arm64 (see
//! `testbed::real_nodes::images::build_static_provisioner` and `build_cross_provisioner`: the
//! foreign ones are cross-compiled with Debian sid's Rust, `hack/fetch-cross-rust.sh`);
//! linux/ppc64le and linux/s390x when `--platform` names them. It names the image
//! `hostpath-provisioner:<tag of deploy/legacy>`, and writes
//! `target/image/hostpath-provisioner.oci.tar`: an OCI layout whose index names one image index
//! with a manifest per platform. Load it with `ctr -n k8s.io images import` (the host's platform),
//! `podman load` or `docker load`; `--platform linux/amd64` skips the cross builds.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use testbed::real_nodes::images::{self, Arch};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("image: {err:#}");
            ExitCode::FAILURE
        }
    }
}

const USAGE: &str = "usage: image [--platform linux/amd64,linux/arm64,linux/ppc64le,linux/s390x] [--binary PATH] \
                     [--arm64-binary PATH] [--ppc64le-binary PATH] [--s390x-binary PATH] [--name IMAGE] [--out FILE]";

fn run() -> Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize()?;
    // A prebuilt binary per platform (`--binary` is amd64's), instead of building it.
    let mut given: Vec<(Arch, PathBuf)> = Vec::new();
    let mut name = None;
    let mut out = images::image_dir(&repo).join("hostpath-provisioner.oci.tar");
    let mut platforms = vec![Arch::Amd64, Arch::Arm64];
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--platform" => {
                let list = args
                    .next()
                    .context("--platform needs a list of linux/amd64, linux/arm64, linux/ppc64le, linux/s390x")?;
                platforms = list.split(',').map(Arch::parse_platform).collect::<Result<_>>()?;
                platforms.dedup();
            }
            "--binary" => given.push((Arch::Amd64, PathBuf::from(args.next().context("--binary needs a path")?))),
            flag if flag.starts_with("--") && flag.ends_with("-binary") => {
                let arch = Arch::parse_platform(&flag["--".len()..flag.len() - "-binary".len()])
                    .with_context(|| format!("unknown argument {flag:?}; {USAGE}"))?;
                given.push((arch, PathBuf::from(args.next().with_context(|| format!("{flag} needs a path"))?)));
            }
            "--name" => name = Some(args.next().context("--name needs an image reference")?),
            "--out" => out = PathBuf::from(args.next().context("--out needs a file")?),
            other => bail!("unknown argument {other:?}; {USAGE}"),
        }
    }
    let name = match name {
        Some(name) => name,
        None => images::local_image(&repo)?,
    };
    let mut built = Vec::new();
    for arch in platforms {
        let started = Instant::now();
        let binary = match given.iter().rev().find(|(given, _)| *given == arch) {
            Some((_, binary)) => binary.clone(),
            None if arch == Arch::Amd64 => images::build_static_provisioner(&repo)?,
            None => images::build_cross_provisioner(&repo, arch).with_context(|| {
                format!(
                    "building the linux/{} binary (`make image IMAGE_PLATFORMS=linux/amd64` builds amd64 only)",
                    arch.oci_name()
                )
            })?,
        };
        built.push((arch, binary, started.elapsed()));
    }
    let platform_images: Vec<_> =
        built.iter().map(|(arch, binary, _)| (*arch, images::provisioner_image(binary, &name))).collect();
    let digest = images::write_multi_platform(&platform_images, &out)?;
    let size = std::fs::metadata(&out)?.len();
    println!("image {} (index {digest})", platform_images[0].1.name);
    println!("  archive {} ({:.1} MiB)", out.display(), size as f64 / 1048576.0);
    for (arch, binary, took) in &built {
        println!(
            "  linux/{:<7} {} (static; built or checked in {:.1} s)",
            arch.oci_name(),
            binary.display(),
            took.as_secs_f64()
        );
    }
    println!("  load it with: ctr -n k8s.io images import {}", out.display());
    Ok(())
}

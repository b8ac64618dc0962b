//! `make image`: the provisioner's container image as an OCI archive, built without any
//! registry. Usage: `image [--binary PATH] [--name IMAGE] [--out FILE]`.
//!
//! By default it builds the static binary (see `testbed::real_nodes::images::
//! build_static_provisioner`), names it `hostpath-provisioner:<tag of deploy/legacy>`, and writes
//! `target/image/hostpath-provisioner.oci.tar`; load it with `ctr -n k8s.io images import`,
//! `podman load` or `docker load` (OCI layout archives).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use testbed::real_nodes::images;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("image: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize()?;
    let (mut binary, mut name, mut out) = (None, None, images::image_dir(&repo).join("hostpath-provisioner.oci.tar"));
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--binary" => binary = Some(PathBuf::from(args.next().context("--binary needs a path")?)),
            "--name" => name = Some(args.next().context("--name needs an image reference")?),
            "--out" => out = PathBuf::from(args.next().context("--out needs a file")?),
            other => bail!("unknown argument {other:?}; usage: image [--binary PATH] [--name IMAGE] [--out FILE]"),
        }
    }
    let started = Instant::now();
    let binary = match binary {
        Some(binary) => binary,
        None => images::build_static_provisioner(&repo)?,
    };
    let built_in = started.elapsed();
    let name = match name {
        Some(name) => name,
        None => images::local_image(&repo)?,
    };
    let image = images::provisioner_image(&binary, &name);
    let digest = image.write(&out)?;
    let size = std::fs::metadata(&out)?.len();
    println!("image {} ({digest})", image.name);
    println!("  archive {} ({:.1} MiB)", out.display(), size as f64 / 1048576.0);
    println!("  binary  {} (static; built or checked in {:.1} s)", binary.display(), built_in.as_secs_f64());
    println!("  load it with: ctr -n k8s.io images import {}", out.display());
    Ok(())
}

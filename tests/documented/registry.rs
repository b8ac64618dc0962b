//! The publish path through a real registry, as docs/install.md and docs/development.md write
//! it: the image archive `make image` wrote is pushed with every platform it holds by the
//! documented skopeo command; the registry's index is read back and must list exactly the
//! archive's platforms, each manifest fetchable; the chart is packaged, pushed as an OCI
//! artefact and installed from `oci://` on the control plane, its DaemonSet naming the pushed
//! image. The commands name `registry.example.com`: they run in a mount namespace whose
//! `/etc/hosts` points that name at the test's registry (`testbed::registry`).
//!
//! Which archive: `make test` builds linux/amd64 and linux/arm64; with `HPP_MORE_ARCHES=1`
//! (`make test-more-arches`, which writes all four platforms to
//! `hostpath-provisioner-all-platforms.oci.tar`), that archive stands in the place the command
//! names, as `make image IMAGE_PLATFORMS=<all four>` would have left it, and all four must
//! arrive.

use std::collections::BTreeSet;

use super::*;

const IMAGE: &str = "registry.example.com/hostpath-provisioner:0.1.0";
/// The platforms each lane's archive must hold.
const TWO: &[&str] = &["linux/amd64", "linux/arm64"];
const FOUR: &[&str] = &["linux/amd64", "linux/arm64", "linux/ppc64le", "linux/s390x"];

/// The platforms an index names, as `os/architecture`.
fn platforms(index: &Value) -> BTreeSet<String> {
    index["manifests"]
        .as_array()
        .map(|manifests| {
            manifests
                .iter()
                .map(|m| {
                    format!(
                        "{}/{}",
                        m["platform"]["os"].as_str().unwrap_or("?"),
                        m["platform"]["architecture"].as_str().unwrap_or("?")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn json(shell: &Shell, command: &str) -> Value {
    let ran = shell.bash(command);
    assert!(ran.success, "`{command}` failed:\n{}", ran.stderr);
    serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("`{command}`: {e}\n{}", ran.stdout))
}

pub async fn push_and_install_through_a_registry(shell: &mut Shell, docs: &Docs) {
    let images = repo().join("target/image");
    let more_arches = std::env::var("HPP_MORE_ARCHES").is_ok_and(|v| v == "1");
    let (archive, wanted) = if more_arches {
        (images.join("hostpath-provisioner-all-platforms.oci.tar"), FOUR)
    } else {
        (images.join("hostpath-provisioner.oci.tar"), TWO)
    };
    assert!(archive.is_file(), "{} is missing: run `make image` (make test does) first", archive.display());
    let in_checkout = shell.dir().join("target/image");
    std::fs::create_dir_all(&in_checkout).expect("target/image");
    std::os::unix::fs::symlink(&archive, in_checkout.join("hostpath-provisioner.oci.tar")).expect("link the archive");

    let registry = testbed::registry::Registry::start(&repo()).unwrap_or_else(|e| panic!("{e:#}"));
    shell.through_registry(&registry);

    // The archive's own index: what must arrive.
    let local = json(shell, "skopeo inspect --raw oci-archive:target/image/hostpath-provisioner.oci.tar");
    let expected = platforms(&local);
    assert_eq!(expected, wanted.iter().map(|p| p.to_string()).collect(), "the archive's platforms: {local}");

    shell.run(&docs.command("docs/install.md", "1. Build and push the image", "skopeo copy --all"));
    let pushed = json(shell, &format!("skopeo inspect --raw docker://{IMAGE}"));
    assert_eq!(platforms(&pushed), expected, "the registry's index lists every platform: {pushed}\n{}", registry.log());
    for manifest in pushed["manifests"].as_array().expect("manifests") {
        let digest = manifest["digest"].as_str().expect("digest");
        let one =
            json(shell, &format!("skopeo inspect --raw docker://registry.example.com/hostpath-provisioner@{digest}"));
        assert!(one["layers"].as_array().is_some_and(|l| !l.is_empty()), "{digest}: {one}");
    }

    // The chart, as the release steps write it, then installed by its oci:// reference.
    let section = "Releasing: the image and the chart";
    shell.run(&docs.command("docs/development.md", section, "helm package"));
    shell.run(&docs.command("docs/development.md", section, "helm push"));
    shell.run(&docs.command("docs/development.md", section, "helm install hostpath-provisioner oci://"));
    let daemonset = shell.must_get(&["daemonset", "hostpath-provisioner", "-n", "default"]);
    let image = &daemonset["spec"]["template"]["spec"]["containers"][0]["image"];
    assert_eq!(image, IMAGE, "{daemonset}");
    drop(registry);
}

//! The image pulled by reference from a real registry (docs/testing.md, "The publish path"): the
//! lane's image is pushed with skopeo to the CNCF distribution registry under a tag no archive
//! was ever imported under, node 1's containerd is told where `registry.example.com` is and whom
//! to trust (a `hosts.toml`, as an admin configures a mirror), and a pod naming
//! `registry.example.com/hostpath-provisioner:<tag>` with `imagePullPolicy: Always` runs the
//! binary: only a pull by reference can have given the kubelet that image.

use super::*;
use testbed::registry::{DOCS_REGISTRY, Registry};

pub async fn the_provisioner_image_is_pulled_by_reference_from_a_registry(ctx: &Ctx) -> Result<()> {
    let registry = Registry::start(&ctx.repo)?;
    let tag = format!("pulled-{}", std::process::id());
    let pushed = std::process::Command::new("skopeo")
        .args(["copy", "--all", &format!("oci-archive:{}", ctx.archive.display())])
        .arg(format!("docker://127.0.0.1/hostpath-provisioner:{tag}"))
        .env("SSL_CERT_FILE", registry.trust_bundle())
        .output()
        .context("running skopeo (Debian's skopeo package)")?;
    ensure!(pushed.status.success(), "skopeo copy: {}", String::from_utf8_lossy(&pushed.stderr));
    ctx.lane.pull_through(DOCS_REGISTRY, &registry)?;

    let reference = format!("{DOCS_REGISTRY}/hostpath-provisioner:{tag}");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pulled-by-reference", "namespace": "default"},
        "spec": {
            "nodeName": ctx.lane.node_name(),
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": reference, "imagePullPolicy": "Always", "args": ["--version"]}],
        },
    }))?;
    let pods: Api<Pod> = Api::namespaced(ctx.lane.client(), "default");
    pods.create(&PostParams::default(), &pod).await?;
    let done = testbed::wait_until(
        "the pulled image's pod finished",
        LANE_TIMEOUT,
        || pods.get("pulled-by-reference"),
        |pod: &Pod| matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")),
    )
    .await
    .map_err(|err| err.context(format!("{}\nregistry log:\n{}", ctx.lane.log_tails(30), registry.log())))?;
    let phase = done.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let logs = ctx.lane.container_logs(&done, "main");
    ensure!(phase == "Succeeded" && logs.contains("hostpath-provisioner"), "{phase}: {logs}");
    let image_id = done
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map(|c| c.image_id.clone())
        .unwrap_or_default();
    ensure!(
        image_id.starts_with(&format!("{DOCS_REGISTRY}/hostpath-provisioner@sha256:")),
        "the image came from the registry by reference: imageID {image_id:?}"
    );
    ctx.lane.delete_pod("default", "pulled-by-reference").await?;
    drop(registry);
    Ok(())
}

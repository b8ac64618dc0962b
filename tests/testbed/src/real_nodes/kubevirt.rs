//! The kubevirt hostpath-provisioner-operator as a cluster runs it, on the lane: its operator,
//! its legacy provisioner, its CSI driver and the CSI sidecars, built from source by
//! `hack/build-kubevirt-csi.sh` (cached; the source archives are not served by any registry, so
//! a machine without them cannot have this), packed into images named here, and installed
//! from the operator's own deploy files as its README says.
//!
//! What the lane must change in that install, and why (each edit is checked to apply, so an
//! upstream file that moved fails loudly rather than installing something else):
//!
//! - **Images.** Every image the operator's Deployment names (its `image:` and the env vars
//!   that name its operands' images) is one built here and imported, never pulled
//!   (`imagePullPolicy: IfNotPresent`). Each holds the upstream image's binaries at the
//!   upstream paths, on no base image. The CSI driver's image adds busybox for `mount` and
//!   `umount` (the upstream one is Fedora's); its `findmnt` is missing, which only turns off
//!   the driver's check of whether a pool shares the node's root filesystem.
//! - **Sidecars.** `csi-node-driver-registrar` and `livenessprobe` are the stand-ins of
//!   `tests/kubevirt-sidecars` unless their source archives were given to the build script
//!   (the Go module proxy serves no version of either).
//! - **The webhook's certificate.** The operator's README installs cert-manager first, which
//!   this lane cannot fetch; what cert-manager would do for `webhook.yaml` is done here: its
//!   self-signed `Issuer` and `Certificate` are replaced by the Secret they would produce, and
//!   the CA it would inject (`cert-manager.io/inject-ca-from`) is written into the
//!   ValidatingWebhookConfiguration. The API server reaches the webhook at its pod's address
//!   (`--enable-aggregator-routing`: no kube-proxy on the lane).
//! - **The resource** names `imagePullPolicy: IfNotPresent` instead of the examples' `Always`.
//! - **`/version.txt`** in the operator's image holds `v0.0.1`, what its `hack/version.sh` writes
//!   without a `TAG` (the operator reads its version there).
//!
//! The operator's DaemonSets hard-code the kubelet's default root `/var/lib/kubelet`; only the
//! second real node has one (see `NodeLayout::kubelet_root`), so CSI volumes mount there only.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use rcgen::{CertificateParams, DnType, KeyPair};

use super::images::{Entry, OciImage, busybox_image};

/// The namespace the operator's deploy files install into.
pub const NAMESPACE: &str = "hostpath-provisioner";
/// The operator's Deployment and the webhook Secret its pod mounts.
pub const OPERATOR_DEPLOYMENT: &str = "hostpath-provisioner-operator";
const WEBHOOK_SECRET: &str = "hostpath-provisioner-operator-webhook-service-cert";
const WEBHOOK_SERVICE: &str = "hostpath-provisioner-operator-webhook-service";
/// The DaemonSets the operator makes for a `pathConfig` resource: the legacy provisioner and
/// the CSI driver with its sidecars.
pub const LEGACY_DAEMONSET: &str = "hostpath-provisioner";
pub const CSI_DAEMONSET: &str = "hostpath-provisioner-csi";
/// The CSI driver's name (provisioner of its StorageClasses).
pub const CSI_DRIVER: &str = "kubevirt.io.hostpath-provisioner";

/// The built programs and the operator's deploy files.
#[derive(Clone, Debug)]
pub struct KubevirtBuild {
    /// `hack/build-kubevirt-csi.sh`'s `bin/`.
    bin: PathBuf,
    /// The sidecar stand-ins' program.
    standin: PathBuf,
    /// The operator image's `/version.txt`.
    version: PathBuf,
    /// The operator's source tree (its `deploy/`).
    pub source: PathBuf,
}

/// One image of the install: the operator Deployment's env var that names it, the name it has
/// upstream (what the deploy file says), and the image built here.
#[derive(Clone, Debug)]
pub struct KubevirtImage {
    pub env: &'static str,
    pub upstream: &'static str,
    pub image: OciImage,
}

/// Builds (or finds cached) everything, or says why it cannot be had here: the kubevirt source
/// archives are found through `HPP_KUBEVIRT_OPERATOR_ARCHIVE` and `HPP_GO_LEGACY_ARCHIVE`.
pub fn build(repo: &Path) -> Result<KubevirtBuild> {
    let out = run_script(repo, "hack/build-kubevirt-csi.sh")?;
    let source = run_script(repo, "hack/kubevirt-operator-source.sh")?;
    let standins = out.join("sidecar-standins");
    let standin = std::fs::read_dir(&standins)
        .with_context(|| format!("reading {}", standins.display()))?
        .filter_map(|e| e.ok().map(|e| e.path().join("kubevirt-sidecars")))
        .find(|p| p.is_file() && stands_in_for_this_source(repo, p))
        .with_context(|| format!("no sidecar stand-in of this source under {}", standins.display()))?;
    // The operator reads its version from `version.txt` in its working directory (`/`): what
    // its hack/version.sh writes when no TAG is set.
    let version = out.join("version.txt");
    std::fs::write(&version, "v0.0.1\n").with_context(|| format!("writing {}", version.display()))?;
    let build = KubevirtBuild { bin: out.join("bin"), standin, version, source };
    ensure!(
        build.source.join("deploy/operator.yaml").is_file(),
        "no deploy/operator.yaml in {}",
        build.source.display()
    );
    Ok(build)
}

/// Runs a build script and returns the directory its last line names.
fn run_script(repo: &Path, script: &str) -> Result<PathBuf> {
    let output = Command::new("bash").arg(repo.join(script)).output().with_context(|| format!("running {script}"))?;
    let log = String::from_utf8_lossy(&output.stderr);
    ensure!(output.status.success(), "{script} failed:\n{log}");
    let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).lines().last().unwrap_or_default().trim());
    ensure!(dir.is_dir(), "{script} named no directory:\n{log}");
    Ok(dir)
}

/// The stand-in's directory is named after its source's hash (`hack/build-kubevirt-csi.sh`):
/// an older build of a changed source must not be used.
fn stands_in_for_this_source(repo: &Path, program: &Path) -> bool {
    let dir = repo.join("tests/kubevirt-sidecars");
    let Ok(output) = Command::new("sh")
        .arg("-c")
        .arg("cat go.mod go.sum main.go | sha256sum | cut -c1-16")
        .current_dir(&dir)
        .output()
    else {
        return false;
    };
    let key = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    program.parent().and_then(Path::file_name).is_some_and(|name| name.to_string_lossy() == key)
}

impl KubevirtBuild {
    fn binary(&self, name: &str) -> PathBuf {
        self.bin.join(name)
    }

    /// A sidecar's program: the real one when the build had its archive, else the stand-in.
    fn sidecar(&self, name: &str) -> (PathBuf, &'static str) {
        let real = self.binary(name);
        if real.is_file() { (real, "upstream") } else { (self.standin.clone(), "stand-in") }
    }

    /// The install's images, in the order the operator's Deployment names them.
    pub fn images(&self) -> Result<Vec<KubevirtImage>> {
        let single = |name: String, path: &str, source: PathBuf| OciImage {
            name,
            entrypoint: vec![path.to_owned()],
            entries: vec![Entry::File { path: path.to_owned(), source, mode: 0o755 }],
            user: None,
        };
        // The operator and its pool mounter share an image (its Dockerfile: /usr/bin, USER 1000;
        // the Deployment runs it with runAsNonRoot).
        let operator = OciImage {
            name: "localhost/kubevirt/hostpath-provisioner-operator:03d4d671".into(),
            entrypoint: vec!["hostpath-provisioner-operator".into()],
            entries: vec![
                Entry::Dir { path: "/usr".into(), mode: 0o755 },
                Entry::Dir { path: "/usr/bin".into(), mode: 0o755 },
                Entry::File {
                    path: "/usr/bin/hostpath-provisioner-operator".into(),
                    source: self.binary("hostpath-provisioner-operator"),
                    mode: 0o755,
                },
                Entry::File { path: "/usr/bin/mounter".into(), source: self.binary("mounter"), mode: 0o755 },
                Entry::File { path: "/version.txt".into(), source: self.version.clone(), mode: 0o644 },
                Entry::Dir { path: "/tmp".into(), mode: 0o1777 },
            ],
            user: Some("1000".into()),
        };
        // The CSI driver bind-mounts volumes with `mount` (k8s.io/mount-utils): busybox's.
        let mut driver = busybox_image()?;
        driver.name = "localhost/kubevirt/hostpath-csi-driver:7c142255".into();
        driver.entrypoint = vec!["/hostpath-csi-driver".into()];
        driver.entries.push(Entry::File {
            path: "/hostpath-csi-driver".into(),
            source: self.binary("hostpath-csi-driver"),
            mode: 0o755,
        });
        let (registrar, registrar_kind) = self.sidecar("csi-node-driver-registrar");
        let (liveness, liveness_kind) = self.sidecar("livenessprobe");
        let images = vec![
            KubevirtImage {
                env: "OPERATOR_IMAGE",
                upstream: "quay.io/kubevirt/hostpath-provisioner-operator:latest",
                image: operator,
            },
            KubevirtImage {
                env: "PROVISIONER_IMAGE",
                upstream: "quay.io/kubevirt/hostpath-provisioner:latest",
                image: single(
                    "localhost/kubevirt/hostpath-provisioner:7c142255".into(),
                    "/hostpath-provisioner",
                    self.binary("hostpath-provisioner"),
                ),
            },
            KubevirtImage {
                env: "CSI_PROVISIONER_IMAGE",
                upstream: "quay.io/kubevirt/hostpath-csi-driver:latest",
                image: driver,
            },
            KubevirtImage {
                env: "NODE_DRIVER_REG_IMAGE",
                upstream: "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.2.0",
                image: single(
                    format!("localhost/sig-storage/csi-node-driver-registrar:{registrar_kind}"),
                    "/csi-node-driver-registrar",
                    registrar,
                ),
            },
            KubevirtImage {
                env: "LIVENESS_PROBE_IMAGE",
                upstream: "registry.k8s.io/sig-storage/livenessprobe:v2.3.0",
                image: single(
                    format!("localhost/sig-storage/livenessprobe:{liveness_kind}"),
                    "/livenessprobe",
                    liveness,
                ),
            },
            KubevirtImage {
                env: "CSI_SIG_STORAGE_PROVISIONER_IMAGE",
                upstream: "registry.k8s.io/sig-storage/csi-provisioner:v3.4.1",
                image: single(
                    "localhost/sig-storage/csi-provisioner:v5.1.0".into(),
                    "/csi-provisioner",
                    self.binary("csi-provisioner"),
                ),
            },
        ];
        for image in &images {
            for entry in &image.image.entries {
                if let Entry::File { source, .. } = entry {
                    ensure!(source.is_file(), "{}: {} was not built", image.image.name, source.display());
                }
            }
        }
        Ok(images)
    }

    /// The operator's `deploy/operator.yaml` (CRD, RBAC, Deployment) with the images built here.
    pub fn operator_manifest(&self, images: &[KubevirtImage]) -> Result<String> {
        let upstream = self.read("operator.yaml")?;
        let operator = &images[0];
        let mut edits = vec![
            (format!("image: {}", operator.upstream), format!("image: {}", operator.image.name)),
            ("imagePullPolicy: Always".to_owned(), "imagePullPolicy: IfNotPresent".to_owned()),
        ];
        for image in images {
            edits.push((format!("value: \"{}\"", image.upstream), format!("value: \"{}\"", image.image.name)));
        }
        edit(upstream, &edits)
    }

    /// `deploy/webhook.yaml` without its cert-manager objects, with the CA cert-manager would
    /// inject, and the Secret its `Certificate` would produce (`ca_pem`: that certificate).
    pub fn webhook_manifest(&self) -> Result<String> {
        self.webhook_manifest_in(NAMESPACE)
    }

    /// [`Self::webhook_manifest`] for an install in `namespace`: its objects, the webhook's
    /// service reference and the certificate's name moved there, as a user installing the
    /// operator in another namespace edits them.
    pub fn webhook_manifest_in(&self, namespace: &str) -> Result<String> {
        let upstream = in_namespace(self.read("webhook.yaml")?, namespace)?;
        let (cert, key) = self_signed_webhook_certificate(&format!("{WEBHOOK_SERVICE}.{namespace}.svc"))?;
        let kept: Vec<&str> = upstream.split("\n---\n").filter(|doc| !doc.contains("cert-manager.io/v1")).collect();
        ensure!(
            kept.len() == 2,
            "webhook.yaml: expected a Service and a ValidatingWebhookConfiguration beside cert-manager's objects"
        );
        let ca_bundle = base64(cert.as_bytes())?;
        let with_ca = edit(
            kept.join("\n---\n"),
            &[("  clientConfig:\n".to_owned(), format!("  clientConfig:\n    caBundle: {ca_bundle}\n"))],
        )?;
        let secret = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": WEBHOOK_SECRET, "namespace": namespace},
            "stringData": {"tls.crt": cert, "tls.key": key, "ca.crt": cert},
        });
        Ok(format!("{}\n---\n{with_ca}", serde_json::to_string(&secret)?))
    }

    /// One of the operator's example resources (`deploy/<file>`), pulling nothing and with its
    /// `/var/hpvolumes` at `pool`.
    pub fn resource(&self, file: &str, pool: &Path) -> Result<String> {
        edit(
            self.read(file)?,
            &[
                ("imagePullPolicy: Always".to_owned(), "imagePullPolicy: IfNotPresent".to_owned()),
                ("\"/var/hpvolumes\"".to_owned(), format!("\"{}\"", pool.display())),
            ],
        )
    }

    /// A file of the operator's `deploy/`, unchanged.
    pub fn read(&self, file: &str) -> Result<String> {
        let path = self.source.join("deploy").join(file);
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))
    }
}

/// A file of the operator's `deploy/` (its Namespace, operator or webhook manifest) moved from
/// its namespace to `namespace`: every `namespace:` field, the Namespace's name, the webhook
/// Service's DNS name and cert-manager's reference to the certificate. Unchanged for its own.
pub fn in_namespace(text: String, namespace: &str) -> Result<String> {
    if namespace == NAMESPACE {
        return Ok(text);
    }
    let mut moved = text
        .replace(&format!("namespace: {NAMESPACE}\n"), &format!("namespace: {namespace}\n"))
        .replace(&format!("{WEBHOOK_SERVICE}.{NAMESPACE}.svc"), &format!("{WEBHOOK_SERVICE}.{namespace}.svc"))
        .replace(&format!("inject-ca-from: {NAMESPACE}/"), &format!("inject-ca-from: {namespace}/"));
    if moved.contains("kind: Namespace") {
        moved = moved.replace(&format!("name: {NAMESPACE}\n"), &format!("name: {namespace}\n"));
    }
    ensure!(!moved.contains(&format!("namespace: {NAMESPACE}\n")), "a namespace left unmoved");
    ensure!(moved != text, "nothing named the namespace {NAMESPACE}");
    Ok(moved)
}

/// Replaces each `from` (which must occur) by its `to`.
fn edit(mut text: String, edits: &[(String, String)]) -> Result<String> {
    for (from, to) in edits {
        ensure!(text.contains(from.as_str()), "the upstream file no longer has {from:?}");
        text = text.replace(from.as_str(), to);
    }
    Ok(text)
}

/// What cert-manager's self-signed `Issuer` makes for the webhook's `Certificate`: a
/// certificate for the Service's DNS name, signed by its own key (PEM certificate and key).
fn self_signed_webhook_certificate(dns: &str) -> Result<(String, String)> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec![dns.to_owned()])?;
    params.distinguished_name.push(DnType::CommonName, dns);
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn base64(bytes: &[u8]) -> Result<String> {
    use std::io::Write as _;
    let mut child = Command::new("base64")
        .arg("-w0")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .context("running base64")?;
    child.stdin.take().context("base64's stdin")?.write_all(bytes)?;
    let output = child.wait_with_output()?;
    ensure!(output.status.success(), "base64 failed");
    Ok(String::from_utf8(output.stdout)?)
}

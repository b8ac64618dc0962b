//! Container images without a registry: OCI image archives written here, one uncompressed layer
//! each, imported with `ctr images import`.
//!
//! - pause: the sandbox process, a few lines of C built with `gcc -static`;
//! - busybox: Debian's `busybox-static` plus its applet links, for test workloads;
//! - the provisioner: the static binary from [`build_static_provisioner`], under the name the
//!   deploy manifests use.
//!
//! Layers are deterministic (mtime 0, root-owned), so the same inputs give the same digests and
//! re-importing an unchanged image is a no-op for containerd.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::json;
use sha2::{Digest, Sha256};

/// The sandbox image every pod starts with (containerd's `sandbox_image`).
pub const PAUSE_IMAGE: &str = "localhost/testbed/pause:1";
/// The workload image of real-pod tests: busybox's `sh` and applets in `/bin`.
pub const BUSYBOX_IMAGE: &str = "localhost/testbed/busybox:1";

/// One file system entry of a layer.
#[derive(Clone, Debug)]
pub enum Entry {
    /// A copy of a host file, with this mode.
    File {
        path: String,
        source: PathBuf,
        mode: u32,
    },
    Dir {
        path: String,
        mode: u32,
    },
    Symlink {
        path: String,
        target: String,
    },
}

/// What an image archive holds; [`OciImage::write`] turns it into a `.tar`.
#[derive(Clone, Debug)]
pub struct OciImage {
    /// Full reference containerd will list it under, e.g. `docker.io/library/x:1`.
    pub name: String,
    pub entrypoint: Vec<String>,
    pub entries: Vec<Entry>,
    /// The image's `USER` (`None`: root), for images whose pods say `runAsNonRoot`.
    pub user: Option<String>,
}

/// A platform of the provisioner's image: Linux on this CPU architecture (OCI names).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Amd64,
    Arm64,
    Ppc64le,
    S390x,
}

impl Arch {
    /// Every platform `make image` can build, in the order it builds them.
    pub const ALL: [Arch; 4] = [Arch::Amd64, Arch::Arm64, Arch::Ppc64le, Arch::S390x];

    /// `amd64`, `arm64`, `ppc64le` or `s390x`, as OCI image configs and platforms name them.
    pub fn oci_name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
            Arch::Ppc64le => "ppc64le",
            Arch::S390x => "s390x",
        }
    }

    /// `linux/amd64`, `linux/arm64`, `linux/ppc64le` or `linux/s390x` (`--platform`).
    pub fn parse_platform(platform: &str) -> Result<Arch> {
        match platform.trim().trim_start_matches("linux/") {
            "amd64" => Ok(Arch::Amd64),
            "arm64" | "arm64/v8" => Ok(Arch::Arm64),
            "ppc64le" => Ok(Arch::Ppc64le),
            "s390x" => Ok(Arch::S390x),
            other => bail!("unsupported platform {other:?}: linux/amd64, linux/arm64, linux/ppc64le or linux/s390x"),
        }
    }

    /// The Rust target: glibc, linked in statically (`hack/build-static.sh`). For the foreign
    /// ones, the targets Debian ships a standard library for (`libstd-rust-dev:<debian_arch>`).
    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
            Arch::Ppc64le => "powerpc64le-unknown-linux-gnu",
            Arch::S390x => "s390x-unknown-linux-gnu",
        }
    }

    /// Debian's name of the architecture (`hack/fetch-cross-rust.sh ARCH`, `libc6-dev-<it>-cross`).
    pub fn debian_arch(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
            Arch::Ppc64le => "ppc64el",
            Arch::S390x => "s390x",
        }
    }

    /// The GNU triple of Debian's cross tools: `<it>-gcc`, `<it>-ar`, `/usr/<it>/lib/libc.a`.
    pub fn gnu_triple(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-linux-gnu",
            Arch::Arm64 => "aarch64-linux-gnu",
            Arch::Ppc64le => "powerpc64le-linux-gnu",
            Arch::S390x => "s390x-linux-gnu",
        }
    }

    /// What `file` prints for an executable of this machine (file 5.44: `ELF 64-bit LSB
    /// executable, 64-bit PowerPC or cisco 7500, OpenPOWER ELF V2 ABI`; `ELF 64-bit MSB
    /// executable, IBM S/390`).
    pub fn file_machine(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86-64",
            Arch::Arm64 => "ARM aarch64",
            Arch::Ppc64le => "64-bit PowerPC or cisco 7500",
            Arch::S390x => "IBM S/390",
        }
    }

    /// The qemu-user emulator (Debian's qemu-user-static) that runs this arch's binaries here.
    pub fn qemu(self) -> &'static str {
        match self {
            Arch::Amd64 => "qemu-x86_64-static",
            Arch::Arm64 => "qemu-aarch64-static",
            Arch::Ppc64le => "qemu-ppc64le-static",
            Arch::S390x => "qemu-s390x-static",
        }
    }

    /// What building and running this arch's provisioner on an amd64 host needs from apt.
    pub fn apt_packages(self) -> String {
        format!("gcc-{} libc6-dev-{}-cross qemu-user-static", self.gnu_triple(), self.debian_arch())
    }

    /// `HPP_ARM64_PROFILE`, `HPP_PPC64LE_PROFILE`, `HPP_S390X_PROFILE`: see [`cross_profile`].
    pub fn profile_variable(self) -> String {
        format!("HPP_{}_PROFILE", self.oci_name().to_uppercase())
    }
}

/// One platform's image manifest and the blobs it references.
struct PlatformManifest {
    manifest: Vec<u8>,
    digest: String,
    /// `(digest, bytes)`: config and layer.
    blobs: Vec<(String, Vec<u8>)>,
}

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";

impl OciImage {
    /// Writes an OCI image layout archive (linux/amd64) to `out` and returns the manifest digest.
    pub fn write(&self, out: &Path) -> Result<String> {
        let platform = self.platform_manifest(Arch::Amd64)?;
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": MANIFEST_TYPE,
                "digest": platform.digest,
                "size": platform.manifest.len(),
                // ctr names the imported image after this annotation.
                "annotations": self.name_annotations(),
            }],
        }))?;
        let mut blobs = platform.blobs;
        blobs.push((platform.digest.clone(), platform.manifest));
        write_layout(out, &index, &blobs)?;
        Ok(platform.digest)
    }

    fn name_annotations(&self) -> serde_json::Value {
        let tag = self.name.rsplit_once(':').map(|(_, tag)| tag).unwrap_or("latest");
        json!({
            "io.containerd.image.name": self.name,
            "org.opencontainers.image.ref.name": tag,
        })
    }

    fn platform_manifest(&self, arch: Arch) -> Result<PlatformManifest> {
        let layer = self.layer()?;
        let layer_digest = sha256(&layer);
        let mut config = json!({
            "architecture": arch.oci_name(),
            "os": "linux",
            "config": {
                "Entrypoint": self.entrypoint,
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            },
            "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        });
        if let Some(user) = &self.user {
            config["config"]["User"] = json!(user);
        }
        let config = serde_json::to_vec(&config)?;
        let config_digest = sha256(&config);
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": config_digest,
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer.len(),
            }],
        }))?;
        let digest = sha256(&manifest);
        Ok(PlatformManifest { manifest, digest, blobs: vec![(config_digest, config), (layer_digest, layer)] })
    }
}

/// Writes one image for several platforms as an OCI layout archive: `index.json` names the image
/// (the annotations `ctr images import` and `podman load` read) and points at an image index
/// blob listing one manifest per platform, each with its `platform` (what a registry push of a
/// multi-platform image carries; `docker buildx --output type=oci` writes the same shape).
/// The images must share a name. Returns the image index's digest.
pub fn write_multi_platform(images: &[(Arch, OciImage)], out: &Path) -> Result<String> {
    let Some((_, first)) = images.first() else { bail!("no platform to write") };
    if let Some((_, other)) = images.iter().find(|(_, image)| image.name != first.name) {
        bail!("one archive, one name: {} and {}", first.name, other.name);
    }
    let mut blobs = Vec::new();
    let mut manifests = Vec::new();
    for (arch, image) in images {
        let platform = image.platform_manifest(*arch)?;
        manifests.push(json!({
            "mediaType": MANIFEST_TYPE,
            "digest": platform.digest,
            "size": platform.manifest.len(),
            "platform": { "architecture": arch.oci_name(), "os": "linux" },
        }));
        blobs.extend(platform.blobs);
        blobs.push((platform.digest, platform.manifest));
    }
    let image_index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": manifests,
    }))?;
    let index_digest = sha256(&image_index);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": INDEX_TYPE,
            "digest": index_digest,
            "size": image_index.len(),
            "annotations": first.name_annotations(),
        }],
    }))?;
    blobs.push((index_digest.clone(), image_index));
    write_layout(out, &index, &blobs)?;
    Ok(index_digest)
}

/// The archive: `oci-layout`, `index.json`, then each blob once under `blobs/sha256/`.
fn write_layout(out: &Path, index: &[u8], blobs: &[(String, Vec<u8>)]) -> Result<()> {
    if let Some(parent) = out.parent() {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let partial = out.with_extension("partial");
    let file = fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    let mut archive = tar::Builder::new(std::io::BufWriter::new(file));
    append_bytes(&mut archive, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    append_bytes(&mut archive, "index.json", index)?;
    let mut written = std::collections::BTreeSet::new();
    for (digest, bytes) in blobs {
        if written.insert(digest.clone()) {
            let hex = digest.trim_start_matches("sha256:");
            append_bytes(&mut archive, &format!("blobs/sha256/{hex}"), bytes)?;
        }
    }
    archive.into_inner()?.flush()?;
    fs::rename(&partial, out).with_context(|| format!("writing {}", out.display()))?;
    Ok(())
}

impl OciImage {
    fn layer(&self) -> Result<Vec<u8>> {
        let mut layer = tar::Builder::new(Vec::new());
        for entry in &self.entries {
            let mut header = tar::Header::new_gnu();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(0);
            match entry {
                Entry::File { path, source, mode } => {
                    let bytes = fs::read(source).with_context(|| format!("reading {}", source.display()))?;
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(bytes.len() as u64);
                    layer.append_data(&mut header, path.trim_start_matches('/'), bytes.as_slice())?;
                }
                Entry::Dir { path, mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_size(0);
                    layer.append_data(&mut header, path.trim_start_matches('/'), std::io::empty())?;
                }
                Entry::Symlink { path, target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    layer.append_link(&mut header, path.trim_start_matches('/'), target)?;
                }
            }
        }
        Ok(layer.into_inner()?)
    }
}

fn append_bytes<W: std::io::Write>(archive: &mut tar::Builder<W>, path: &str, bytes: &[u8]) -> Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_size(bytes.len() as u64);
    archive.append_data(&mut header, path, bytes)?;
    Ok(())
}

fn sha256(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// The reference containerd stores for `image` as a pod spec names it: Docker's shorthand
/// (`name:tag` means `docker.io/library/name:tag`, `org/name` means `docker.io/org/name`)
/// expanded, anything naming a registry (a first part with `.` or `:`, or `localhost`) kept.
pub fn normalize_reference(image: &str) -> String {
    let (first, rest) = image.split_once('/').unwrap_or(("", image));
    let with_registry = if first.is_empty() {
        format!("docker.io/library/{rest}")
    } else if first.contains('.') || first.contains(':') || first == "localhost" {
        image.to_string()
    } else {
        format!("docker.io/{image}")
    };
    let last = with_registry.rsplit('/').next().unwrap_or_default();
    if last.contains(':') || last.contains('@') { with_registry } else { format!("{with_registry}:latest") }
}

/// The pause image: a static binary that sleeps until a signal ends it.
pub fn pause_image(work: &Path) -> Result<OciImage> {
    const SOURCE: &str = r#"#include <signal.h>
#include <unistd.h>
static void done(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, done);
    signal(SIGINT, done);
    for (;;) pause();
}
"#;
    fs::create_dir_all(work)?;
    let source = work.join("pause.c");
    let binary = work.join("pause");
    fs::write(&source, SOURCE)?;
    let output = Command::new("gcc")
        .args(["-Os", "-static", "-s", "-o"])
        .arg(&binary)
        .arg(&source)
        .output()
        .context("running gcc (apt-get install gcc) for the pause image")?;
    if !output.status.success() {
        bail!("gcc -static pause.c failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(OciImage {
        name: PAUSE_IMAGE.to_string(),
        entrypoint: vec!["/pause".to_string()],
        entries: vec![Entry::File { path: "/pause".into(), source: binary, mode: 0o755 }],
        user: None,
    })
}

/// Busybox from Debian's `busybox-static`, every applet linked in `/bin`, a sticky `/tmp`.
pub fn busybox_image() -> Result<OciImage> {
    let busybox = Path::new("/bin/busybox");
    let output = Command::new(busybox).arg("--list").output().context("running /bin/busybox --list")?;
    if !output.status.success() {
        bail!("/bin/busybox --list failed");
    }
    // The static build is what runs in an image with no libc.
    let file = Command::new("file").arg("-L").arg(busybox).output();
    if let Ok(file) = file
        && String::from_utf8_lossy(&file.stdout).contains("dynamically linked")
    {
        bail!("/bin/busybox is dynamically linked: install busybox-static");
    }
    let mut entries = vec![
        Entry::Dir { path: "/bin".into(), mode: 0o755 },
        Entry::File { path: "/bin/busybox".into(), source: busybox.to_path_buf(), mode: 0o755 },
    ];
    for applet in String::from_utf8_lossy(&output.stdout).lines().map(str::trim).filter(|a| !a.is_empty()) {
        if applet != "busybox" && !applet.contains('/') {
            entries.push(Entry::Symlink { path: format!("/bin/{applet}"), target: "busybox".into() });
        }
    }
    for (dir, mode) in [("/tmp", 0o1777), ("/etc", 0o755), ("/proc", 0o755), ("/sys", 0o755), ("/dev", 0o755)] {
        entries.push(Entry::Dir { path: dir.into(), mode });
    }
    Ok(OciImage { name: BUSYBOX_IMAGE.to_string(), entrypoint: vec!["/bin/sh".into()], entries, user: None })
}

/// The provisioner's image: its static binary as `/hostpath-provisioner`, nothing else (it
/// needs no CA bundle, passwd or time zones: the API's CA comes with the ServiceAccount token
/// and it runs as uid 0 by number), under `name` (normalized with [`normalize_reference`]).
pub fn provisioner_image(binary: &Path, name: &str) -> OciImage {
    OciImage {
        name: normalize_reference(name),
        entrypoint: vec!["/hostpath-provisioner".into()],
        entries: vec![Entry::File { path: "/hostpath-provisioner".into(), source: binary.to_path_buf(), mode: 0o755 }],
        user: None,
    }
}

/// Where `make image` and the lane put the static binary and the archive.
pub fn image_dir(repo: &Path) -> PathBuf {
    repo.join("target/image")
}

/// Builds the provisioner as a static executable without any extra rustup target: the
/// installed x86_64-unknown-linux-gnu toolchain with `+crt-static` (glibc linked in), in a
/// target dir of its own so the normal debug build is never invalidated. It compiles what the
/// Dockerfile compiles: a copy of the Docker build context ([`build_context`]) with the
/// Dockerfile's script, `hack/build-static.sh`. Profile `image` (see Cargo.toml): release
/// without LTO, faster to build on 2 cores; the Dockerfile uses `release`.
pub fn build_static_provisioner(repo: &Path) -> Result<PathBuf> {
    let target_dir = image_dir(repo);
    let context = build_context(repo)?;
    let binary = static_build(repo, &context, "x86_64-unknown-linux-gnu", "image", &target_dir, |_| {})
        .context("building the static provisioner")?;
    check_static(&binary, Arch::Amd64.file_machine())?;
    Ok(binary)
}

/// The Docker build context of `repo` (`.dockerignore` applied), copied to
/// `target/image/context`: what `make image` compiles, so a file the build needs that the context
/// leaves out fails here as it would in `docker build`.
pub fn build_context(repo: &Path) -> Result<PathBuf> {
    crate::docker_context::sync_context(repo, &image_dir(repo).join("context"))
}

/// `bash hack/build-static.sh TARGET PROFILE TARGET_DIR` in `context`, without the caller's cargo
/// variables. Called from `cargo run` (make image) and from a test binary under `cargo test`,
/// which export different CARGO_* variables; left in, they make cargo rebuild the top crates each
/// time one caller follows the other. The context has no `.git`, so the commit comes from
/// `repo`'s (build.rs reads `HPP_GIT_COMMIT`).
fn static_build(
    repo: &Path,
    context: &Path,
    target: &str,
    profile: &str,
    target_dir: &Path,
    cross: impl FnOnce(&mut Command),
) -> Result<PathBuf> {
    let mut build = Command::new("bash");
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if (name.starts_with("CARGO_") && name != "CARGO_HOME" && !name.starts_with("CARGO_TERM_"))
            || name == "OUT_DIR"
            || name == "RUSTFLAGS"
            || name == "RUSTDOCFLAGS"
            || name == "RUSTC"
        {
            build.env_remove(name.as_ref());
        }
    }
    if std::env::var_os("HPP_GIT_COMMIT").is_none()
        && let Some(commit) = git_commit(repo)
    {
        build.env("HPP_GIT_COMMIT", commit);
    }
    cross(&mut build);
    build.current_dir(context).arg("hack/build-static.sh").arg(target).arg(profile).arg(target_dir);
    build.stderr(std::process::Stdio::inherit());
    let output = build.output().context("running hack/build-static.sh")?;
    if !output.status.success() {
        bail!("hack/build-static.sh {target} failed ({})", output.status);
    }
    let printed = String::from_utf8_lossy(&output.stdout);
    let binary = printed.lines().last().map(PathBuf::from).context("hack/build-static.sh printed no path")?;
    Ok(binary)
}

fn git_commit(repo: &Path) -> Option<String> {
    let output = Command::new("git").arg("-C").arg(repo).args(["rev-parse", "HEAD"]).output().ok()?;
    let commit = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (output.status.success() && !commit.is_empty()).then_some(commit)
}

/// `file` says `binary` is a static executable for `machine` ([`Arch::file_machine`]).
fn check_static(binary: &Path, machine: &str) -> Result<()> {
    let file = Command::new("file").arg(binary).output().context("running file")?;
    let description = String::from_utf8_lossy(&file.stdout);
    if !description.contains("statically linked") && !description.contains("static-pie linked") {
        bail!("{} is not static: {description}", binary.display());
    }
    if !description.contains(machine) {
        bail!("{} is not built for {machine}: {description}", binary.display());
    }
    Ok(())
}

/// Which of the host tools a foreign arch's build and its qemu test need are missing (empty:
/// none): the cross gcc and glibc, its qemu-user, `file`. The Rust toolchain itself comes from
/// `hack/fetch-cross-rust.sh`, which needs curl, xz, gpgv and dpkg-deb.
pub fn cross_missing_tools(arch: Arch) -> Vec<String> {
    let gcc = format!("{}-gcc", arch.gnu_triple());
    let mut missing: Vec<String> = [gcc.as_str(), arch.qemu(), "curl", "xz", "gpgv", "dpkg-deb", "file"]
        .into_iter()
        .filter(|tool| !on_path(tool))
        .map(str::to_string)
        .collect();
    let libc = format!("/usr/{}/lib/libc.a", arch.gnu_triple());
    if !Path::new(&libc).exists() {
        missing.push(format!("{libc} (libc6-dev-{}-cross)", arch.debian_arch()));
    }
    missing
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
}

/// Cross-compiles the provisioner for a foreign arch (linux/arm64, linux/ppc64le, linux/s390x)
/// as a static executable: Debian sid's rustc with that arch's std (fetched and cached by
/// `hack/fetch-cross-rust.sh <debian arch>`: the only Rust >= 1.88 with these standard libraries
/// reachable from here) driven by the installed cargo, [`Arch::rust_target`] with `+crt-static`
/// (glibc from `libc6-dev-<arch>-cross` linked in), ring's C and the link by `<gnu triple>-gcc`.
/// Its target dir is in the toolchain's cache, one for every arch (the host side, build scripts
/// and proc macros, is built once); the Cargo profile is [`cross_profile`].
pub fn build_cross_provisioner(repo: &Path, arch: Arch) -> Result<PathBuf> {
    if arch == Arch::Amd64 {
        return build_static_provisioner(repo);
    }
    let missing = cross_missing_tools(arch);
    if !missing.is_empty() {
        bail!(
            "the linux/{} build needs {} (apt-get install {})",
            arch.oci_name(),
            missing.join(", "),
            arch.apt_packages()
        );
    }
    let fetched = Command::new("bash")
        .arg(repo.join("hack/fetch-cross-rust.sh"))
        .arg(arch.debian_arch())
        .stderr(std::process::Stdio::inherit())
        .output()
        .context("running hack/fetch-cross-rust.sh")?;
    if !fetched.status.success() {
        bail!("hack/fetch-cross-rust.sh {} failed ({})", arch.debian_arch(), fetched.status);
    }
    let rustc = String::from_utf8_lossy(&fetched.stdout).trim().to_string();
    // Beside the cached toolchain, outside the checkout: the dependencies' cross build (the
    // long part, 10-25 min cold on 2 cores) is then done once per toolchain, not once per clone
    // (every CI run starts from a fresh one); cargo's fingerprints rebuild what changed.
    let target_dir = Path::new(&rustc)
        .parent()
        .and_then(Path::parent)
        .map(|toolchain| toolchain.join("target"))
        .context("hack/fetch-cross-rust.sh printed no rustc path")?;
    let target = arch.rust_target();
    let env_target = target.replace('-', "_");
    let (gcc, ar) = (format!("{}-gcc", arch.gnu_triple()), format!("{}-ar", arch.gnu_triple()));
    let context = build_context(repo)?;
    let binary = static_build(repo, &context, target, &cross_profile(arch), &target_dir, |build| {
        // sccache would cache by the wrapper script, not by the compiler behind it.
        build
            .env_remove("RUSTC_WRAPPER")
            .env("RUSTC", &rustc)
            .env(format!("CARGO_TARGET_{}_LINKER", env_target.to_uppercase()), &gcc)
            .env(format!("CC_{env_target}"), &gcc)
            .env(format!("AR_{env_target}"), &ar);
    })
    .with_context(|| format!("cross-compiling the linux/{} provisioner", arch.oci_name()))?;
    check_static(&binary, arch.file_machine())?;
    Ok(binary)
}

/// The Cargo profile of a foreign arch's build: `HPP_<ARCH>_PROFILE` ([`Arch::profile_variable`]:
/// `HPP_ARM64_PROFILE`, `HPP_PPC64LE_PROFILE`, `HPP_S390X_PROFILE`), else `image` (as amd64's).
/// `make test` and `make test-more-arches` set `dev`: on an amd64 machine these binaries only run
/// under qemu, in one test each of e2e_foreign_arches, which needs code that compiles and runs on
/// that arch, not optimized code; unoptimized, the cross build costs a cold run on 2 cores about
/// half as much CPU. The images users run come from the Dockerfile, with the `release` profile.
pub fn cross_profile(arch: Arch) -> String {
    std::env::var(arch.profile_variable()).ok().filter(|p| !p.is_empty()).unwrap_or_else(|| "image".to_string())
}

/// The image the deploy manifests run, as `deploy/legacy` renders it: the DaemonSet's `image:`
/// with the kustomization's `images:` override (`newName`, `newTag`) applied. That is the
/// registry placeholder an admin replaces (README, "Install"), so nothing pulls it here.
pub fn manifest_image(repo: &Path) -> Result<String> {
    let image = read_manifest_image(repo)?;
    Ok(with_tag(image.new_name.as_deref().unwrap_or(&image.written), image.tag.as_deref()))
}

/// The image `make image` writes and the real-node lane deploys: the DaemonSet's own unqualified
/// name with the manifests' tag (`hostpath-provisioner:0.1.0`). It is imported into the node's
/// containerd, never pulled, and the lane points the deploy at it explicitly with an `images:`
/// override of the placeholder [`manifest_image`].
pub fn local_image(repo: &Path) -> Result<String> {
    let image = read_manifest_image(repo)?;
    Ok(with_tag(&image.written, image.tag.as_deref()))
}

/// What `deploy/legacy` says about its image; a small reader for these fields only (the lane
/// itself asks kubectl for the rendered name).
struct ManifestImage {
    /// The DaemonSet's `image:`, without tag.
    written: String,
    /// The kustomization's `newName` for it.
    new_name: Option<String>,
    /// The kustomization's `newTag`, else the DaemonSet's tag.
    tag: Option<String>,
}

fn read_manifest_image(repo: &Path) -> Result<ManifestImage> {
    let daemonset = fs::read_to_string(repo.join("deploy/legacy/daemonset.yaml"))?;
    let image = daemonset
        .lines()
        .filter_map(|line| line.trim().strip_prefix("image:"))
        .map(|value| value.trim().trim_matches('"').to_string())
        .next()
        .context("no image: line in deploy/legacy/daemonset.yaml")?;
    let (written, mut tag) = split_tag(&image);
    let mut new_name = None;
    let kustomization = fs::read_to_string(repo.join("deploy/legacy/kustomization.yaml"))?;
    let mut in_images = false;
    let mut matches = false;
    for line in kustomization.lines() {
        let trimmed = line.trim();
        if !line.starts_with(' ') && !line.starts_with('-') {
            in_images = trimmed == "images:";
            continue;
        }
        if !in_images || trimmed.starts_with('#') {
            continue;
        }
        let field = trimmed.trim_start_matches("- ");
        let Some((key, value)) = field.split_once(':') else { continue };
        let value = value.trim().trim_matches('"').to_string();
        match key.trim() {
            "name" => matches = value == written,
            "newName" if matches => new_name = Some(value),
            "newTag" if matches => tag = Some(value),
            _ => {}
        }
    }
    Ok(ManifestImage { written, new_name, tag })
}

fn with_tag(name: &str, tag: Option<&str>) -> String {
    match tag {
        Some(tag) => format!("{name}:{tag}"),
        None => name.to_string(),
    }
}

fn split_tag(image: &str) -> (String, Option<String>) {
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name.to_string(), Some(tag.to_string())),
        _ => (image.to_string(), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_expand_like_containerd_does() {
        assert_eq!(normalize_reference("hostpath-provisioner:0.1.0"), "docker.io/library/hostpath-provisioner:0.1.0");
        assert_eq!(normalize_reference("org/hpp:1"), "docker.io/org/hpp:1");
        assert_eq!(normalize_reference("registry.example.invalid/x/hpp:2"), "registry.example.invalid/x/hpp:2");
        assert_eq!(normalize_reference("localhost/testbed/busybox:1"), "localhost/testbed/busybox:1");
        assert_eq!(normalize_reference("localhost:5000/hpp"), "localhost:5000/hpp:latest");
    }

    #[test]
    fn the_manifest_image_reads_the_deploy_files() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let image = manifest_image(&repo).expect("image");
        assert!(image.contains("hostpath-provisioner"), "{image}");
        assert!(image.contains(':'), "{image}");
        // The deploy names a fully qualified placeholder; the local image is the unqualified
        // name with the same tag.
        let (registry, _) = image.split_once('/').expect("a registry host in the deploy's image");
        assert!(registry.ends_with(".invalid"), "{image}");
        let local = local_image(&repo).expect("local image");
        assert!(!local.contains('/'), "{local}");
        assert_eq!(local.rsplit_once(':').map(|(_, tag)| tag), image.rsplit_once(':').map(|(_, tag)| tag));
    }

    #[test]
    fn a_multi_platform_archive_names_one_index_with_a_manifest_per_platform() {
        let dir = std::env::temp_dir().join(crate::unique_name("oci-test"));
        fs::create_dir_all(&dir).unwrap();
        let image = |content: &[u8]| {
            let file = dir.join(format!("f{}", content.len()));
            fs::write(&file, content).unwrap();
            provisioner_image(&file, "hostpath-provisioner:1.2.3")
        };
        let out = dir.join("multi.tar");
        let images: Vec<_> = Arch::ALL.iter().zip(1..).map(|(arch, n)| (*arch, image(&b"x".repeat(n)))).collect();
        let digest = write_multi_platform(&images, &out).unwrap();
        let mut blobs = std::collections::BTreeMap::new();
        for entry in tar::Archive::new(fs::File::open(&out).unwrap()).entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().display().to_string();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
            blobs.insert(path, bytes);
        }
        let json = |path: &str| -> serde_json::Value { serde_json::from_slice(&blobs[path]).unwrap() };
        let blob = |digest: &serde_json::Value| {
            let path = format!("blobs/sha256/{}", digest.as_str().unwrap().trim_start_matches("sha256:"));
            assert_eq!(sha256(&blobs[&path]), digest.as_str().unwrap(), "{path} matches its digest");
            json(&path)
        };
        let index = json("index.json");
        assert_eq!(index["manifests"].as_array().unwrap().len(), 1);
        let top = &index["manifests"][0];
        assert_eq!(top["mediaType"], INDEX_TYPE);
        assert_eq!(top["digest"], digest.as_str());
        assert_eq!(top["annotations"]["io.containerd.image.name"], "docker.io/library/hostpath-provisioner:1.2.3");
        assert_eq!(top["annotations"]["org.opencontainers.image.ref.name"], "1.2.3");
        let image_index = blob(&top["digest"]);
        let platforms: Vec<_> = image_index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                assert_eq!(m["mediaType"], MANIFEST_TYPE);
                let manifest = blob(&m["digest"]);
                let config = blob(&manifest["config"]["digest"]);
                assert_eq!(config["architecture"], m["platform"]["architecture"], "config and platform agree");
                assert_eq!(config["config"]["Entrypoint"][0], "/hostpath-provisioner");
                let layer = &manifest["layers"][0]["digest"];
                let path = format!("blobs/sha256/{}", layer.as_str().unwrap().trim_start_matches("sha256:"));
                assert_eq!(&sha256(&blobs[&path]), layer);
                format!("{}/{}", m["platform"]["os"].as_str().unwrap(), m["platform"]["architecture"].as_str().unwrap())
            })
            .collect();
        assert_eq!(platforms, ["linux/amd64", "linux/arm64", "linux/ppc64le", "linux/s390x"]);
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn platforms_parse_as_docker_names_them() {
        for arch in Arch::ALL {
            assert_eq!(Arch::parse_platform(&format!("linux/{}", arch.oci_name())).unwrap(), arch);
        }
        assert_eq!(Arch::parse_platform("linux/arm64/v8").unwrap(), Arch::Arm64);
        assert!(Arch::parse_platform("linux/ppc64el").is_err(), "Debian's name is not a platform");
        assert_eq!(Arch::Ppc64le.apt_packages(), "gcc-powerpc64le-linux-gnu libc6-dev-ppc64el-cross qemu-user-static");
        assert_eq!(Arch::S390x.apt_packages(), "gcc-s390x-linux-gnu libc6-dev-s390x-cross qemu-user-static");
        assert_eq!(Arch::Arm64.apt_packages(), "gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static");
        assert_eq!(Arch::Ppc64le.profile_variable(), "HPP_PPC64LE_PROFILE");
    }

    #[test]
    fn archives_are_deterministic() {
        let dir = std::env::temp_dir().join(crate::unique_name("oci-test"));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f");
        fs::write(&file, b"x").unwrap();
        let image = OciImage {
            name: "localhost/t:1".into(),
            entrypoint: vec!["/f".into()],
            entries: vec![Entry::File { path: "/f".into(), source: file, mode: 0o755 }],
            user: None,
        };
        let a = image.write(&dir.join("a.tar")).unwrap();
        let b = image.write(&dir.join("b.tar")).unwrap();
        assert_eq!(a, b);
        assert_eq!(fs::read(dir.join("a.tar")).unwrap(), fs::read(dir.join("b.tar")).unwrap());
        fs::remove_dir_all(dir).unwrap();
    }
}

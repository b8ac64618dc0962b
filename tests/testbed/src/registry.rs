//! A real OCI registry for the publish path: the CNCF distribution registry
//! (`hack/build-registry.sh`, built from the Go module proxy and cached), serving TLS with a
//! certificate of its own CA for `registry.example.com` (the docs' example registry), `localhost`
//! and 127.0.0.1, storing under a temp dir, stopped by its PID when dropped.
//!
//! The docs' commands name `registry.example.com` without a port, so [`Registry::start`] listens
//! on 127.0.0.1:443, and [`Registry::hosts_file`] is an `/etc/hosts` that resolves that name to
//! it, for a command run in a mount namespace of its own with the file bound over `/etc/hosts`
//! (nothing of the host changes). Go clients (skopeo, helm) trust the CA through
//! `SSL_CERT_FILE` ([`Registry::trust_bundle`]: the system's bundle and the CA).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

use crate::process::{ManagedChild, ProcessSpec, TempDir};

/// The name the docs push to and install from.
pub const DOCS_REGISTRY: &str = "registry.example.com";
/// Where it listens: the name has no port in the docs.
const ADDRESS: &str = "127.0.0.1:443";
/// The system's CA bundle (Debian's `ca-certificates`), when there is one.
const SYSTEM_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// A running registry.
pub struct Registry {
    child: ManagedChild,
    dir: TempDir,
}

/// Builds (or finds cached) the registry binary.
pub fn registry_binary(repo: &Path) -> Result<PathBuf> {
    let script = repo.join("hack/build-registry.sh");
    let out = Command::new("bash").arg(&script).output().with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed:\n{}", script.display(), String::from_utf8_lossy(&out.stderr));
    }
    let path = String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or_default().trim().to_owned();
    Ok(PathBuf::from(path))
}

impl Registry {
    /// Starts it and waits until it answers `/v2/`.
    pub fn start(repo: &Path) -> Result<Registry> {
        let binary = registry_binary(repo)?;
        // Port 443 must be free: say so plainly rather than let the registry fail in its log.
        drop(TcpListener::bind(ADDRESS).with_context(|| format!("{ADDRESS} is taken; the publish test needs it"))?);
        let dir = TempDir::new("registry")?;
        let (ca, cert, key) = (dir.path().join("ca.crt"), dir.path().join("tls.crt"), dir.path().join("tls.key"));
        write_certificates(&ca, &cert, &key)?;
        let mut bundle = std::fs::read_to_string(SYSTEM_BUNDLE).unwrap_or_default();
        bundle.push_str(&std::fs::read_to_string(&ca)?);
        std::fs::write(dir.path().join("trust.pem"), bundle)?;
        let hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        std::fs::write(dir.path().join("hosts"), format!("{hosts}\n127.0.0.1 {DOCS_REGISTRY}\n"))?;
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n\
             http:\n  addr: {ADDRESS}\n  tls:\n    certificate: {}\n    key: {}\n",
            dir.path().join("storage").display(),
            cert.display(),
            key.display()
        );
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config)?;
        let spec = ProcessSpec {
            name: "registry".into(),
            program: binary,
            args: vec!["serve".into(), config_path.display().to_string()],
            env: vec![("OTEL_TRACES_EXPORTER".into(), "none".into())],
            clean_env: true,
            log_path: dir.path().join("registry.log"),
            cgroup_procs: None,
        };
        let child = ManagedChild::spawn(&spec)?;
        let registry = Registry { child, dir };
        registry.wait_serving()?;
        Ok(registry)
    }

    fn wait_serving(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if std::net::TcpStream::connect(ADDRESS).is_ok() {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "the registry did not listen on {ADDRESS}:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The system's CA bundle and the registry's CA, for `SSL_CERT_FILE`.
    pub fn trust_bundle(&self) -> PathBuf {
        self.dir.path().join("trust.pem")
    }

    /// The registry's CA alone (for containerd's `hosts.toml`).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// An `/etc/hosts` resolving [`DOCS_REGISTRY`] to the registry.
    pub fn hosts_file(&self) -> PathBuf {
        self.dir.path().join("hosts")
    }

    /// Its log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// Its PID.
    pub fn pid(&self) -> u32 {
        self.child.pid()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.child.terminate(Duration::from_secs(5));
    }
}

/// A CA and a serving certificate for the docs' registry name, `localhost` and 127.0.0.1.
fn write_certificates(ca_file: &Path, cert_file: &Path, key_file: &Path) -> Result<()> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name.push(DnType::CommonName, "testbed registry CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let ca = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate()?;
    let names = vec![DOCS_REGISTRY.to_owned(), "localhost".to_owned(), "127.0.0.1".to_owned()];
    let mut params = CertificateParams::new(names)?;
    params.distinguished_name.push(DnType::CommonName, DOCS_REGISTRY);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &ca)?;
    std::fs::write(ca_file, ca_cert.pem())?;
    std::fs::write(cert_file, cert.pem())?;
    std::fs::write(key_file, key.serialize_pem())?;
    Ok(())
}

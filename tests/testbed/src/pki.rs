//! Certificates and keys for one control plane, generated in memory with rcgen.
//!
//! We do not let kube-apiserver self-sign: its generated bundle is a self-signed leaf, which
//! rustls (webpki) refuses as a trust anchor for itself. A real CA plus a leaf for 127.0.0.1 is
//! what kube-rs, Go clients and the components' own serving endpoints all accept.

use std::fs;
use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// PEM files of one control plane, written under its temp dir.
#[derive(Clone, Debug)]
pub(crate) struct Pki {
    pub ca_pem: String,
    pub ca_der: Vec<u8>,
    pub ca_cert_file: PathBuf,
    pub serving_cert_file: PathBuf,
    pub serving_key_file: PathBuf,
    /// The API server's client certificate towards kubelets (for `nodes/proxy`: a kubelet's
    /// stats summary, logs), signed by the CA the lane's kubelets trust.
    pub kubelet_client_cert_file: PathBuf,
    pub kubelet_client_key_file: PathBuf,
    /// ECDSA P-256 private key (PKCS#8) signing ServiceAccount tokens.
    pub sa_signing_key_file: PathBuf,
    /// Its public half, for verifying them.
    pub sa_public_key_file: PathBuf,
}

impl Pki {
    /// A CA, a serving certificate for 127.0.0.1 plus `extra_ips` (the real-node lane adds the
    /// `kubernetes` Service IP and the pod bridge's gateway, the addresses pods dial) and a
    /// ServiceAccount signing key.
    pub fn generate(dir: &Path, extra_ips: &[IpAddr]) -> Result<Pki> {
        fs::create_dir_all(dir)?;

        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::default();
        ca_params.distinguished_name.push(DnType::CommonName, "testbed CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let ca = Issuer::new(ca_params, ca_key);

        let serving_key = KeyPair::generate()?;
        let mut names = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        names.extend(extra_ips.iter().map(IpAddr::to_string));
        let mut serving_params = CertificateParams::new(names)?;
        serving_params.distinguished_name.push(DnType::CommonName, "kube-apiserver");
        serving_params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        serving_params.use_authority_key_identifier_extension = true;
        let serving_cert = serving_params.signed_by(&serving_key, &ca)?;

        let kubelet_client_key = KeyPair::generate()?;
        let mut kubelet_client_params = CertificateParams::new(Vec::<String>::new())?;
        kubelet_client_params.distinguished_name.push(DnType::CommonName, "kube-apiserver-kubelet-client");
        kubelet_client_params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        kubelet_client_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        kubelet_client_params.use_authority_key_identifier_extension = true;
        let kubelet_client_cert = kubelet_client_params.signed_by(&kubelet_client_key, &ca)?;

        let sa_key = KeyPair::generate()?;

        let pki = Pki {
            ca_pem: ca_cert.pem(),
            ca_der: ca_cert.der().to_vec(),
            ca_cert_file: dir.join("ca.crt"),
            serving_cert_file: dir.join("serving.crt"),
            serving_key_file: dir.join("serving.key"),
            kubelet_client_cert_file: dir.join("kubelet-client.crt"),
            kubelet_client_key_file: dir.join("kubelet-client.key"),
            sa_signing_key_file: dir.join("sa.key"),
            sa_public_key_file: dir.join("sa.pub"),
        };
        write(&pki.ca_cert_file, &pki.ca_pem)?;
        write(&pki.serving_cert_file, &serving_cert.pem())?;
        write(&pki.serving_key_file, &serving_key.serialize_pem())?;
        write(&pki.kubelet_client_cert_file, &kubelet_client_cert.pem())?;
        write(&pki.kubelet_client_key_file, &kubelet_client_key.serialize_pem())?;
        write(&pki.sa_signing_key_file, &sa_key.serialize_pem())?;
        write(&pki.sa_public_key_file, &sa_key.public_key_pem())?;
        Ok(pki)
    }
}

fn write(path: &Path, contents: &str) -> Result<()> {
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

/// A random lowercase hex string of `bytes` random bytes, from the kernel's CSPRNG.
pub(crate) fn random_hex(bytes: usize) -> Result<String> {
    let mut buf = vec![0u8; bytes];
    fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf)).context("reading /dev/urandom")?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

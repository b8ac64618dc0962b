//! How to reach an API server: kubeconfig files for processes, `kube::Client`s for tests.

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use kube::Client;
use serde_json::json;

/// Everything needed to talk to the API server; plain data, so it can cross tokio runtimes.
///
/// Each `#[tokio::test]` has its own runtime and a `kube::Client` must stay in the runtime that
/// created it, so the shared control plane hands out this and tests build their own clients.
#[derive(Clone, Debug)]
pub struct Connection {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// PEM of the CA that signed the API server's certificate.
    pub ca_pem: String,
    pub(crate) ca_der: Vec<u8>,
    /// Bearer token.
    pub token: String,
}

impl Connection {
    /// Same server and CA, another bearer token (for example a ServiceAccount's).
    pub fn with_token(&self, token: &str) -> Connection {
        Connection { token: token.to_string(), ..self.clone() }
    }

    /// Same CA and token, another server address (say, a proxy in front of the API server).
    pub fn via(&self, addr: std::net::SocketAddr) -> Connection {
        Connection { url: format!("https://{addr}"), ..self.clone() }
    }

    /// A fresh client; call it from inside the tokio runtime that will use the client.
    pub fn client(&self) -> Result<Client> {
        let mut config = kube::Config::new(self.url.parse().with_context(|| format!("parsing {}", self.url))?);
        config.root_cert = Some(vec![self.ca_der.clone()]);
        // Empty means anonymous (health endpoints), not an empty bearer header.
        if !self.token.is_empty() {
            config.auth_info.token = Some(self.token.clone().into());
        }
        Client::try_from(config).context("building a kube client")
    }

    /// Writes a kubeconfig (JSON, which every YAML reader accepts) for this connection.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        let kubeconfig = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{
                "name": "testbed",
                "cluster": {
                    "server": self.url,
                    "certificate-authority-data": base64(self.ca_pem.as_bytes()),
                },
            }],
            "users": [{ "name": "testbed", "user": { "token": self.token } }],
            "contexts": [{
                "name": "testbed",
                "context": { "cluster": "testbed", "user": "testbed", "namespace": "default" },
            }],
            "current-context": "testbed",
        });
        let text = serde_json::to_string_pretty(&kubeconfig)?;
        fs::write(path, text).with_context(|| format!("writing kubeconfig {}", path.display()))
    }
}

/// Standard base64 with padding (kubeconfig `*-data` fields); small enough not to need a crate.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        let vectors = [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (input, expected) in vectors {
            assert_eq!(base64(input.as_bytes()), expected, "input {input:?}");
        }
    }
}

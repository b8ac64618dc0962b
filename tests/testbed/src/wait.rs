//! Polling helpers: everything in an end-to-end test happens "eventually".

use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Polls `probe` every 200 ms until it returns `Ok(Some(value))`, then returns the value.
///
/// `Ok(None)` means "not yet"; an `Err` is remembered as the last observation and polling goes
/// on (API servers blip, objects are not created yet). On timeout the error names `what`, how
/// long it waited and the last error seen, if any.
pub async fn wait_for<T, E, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    E: Into<anyhow::Error>,
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<Option<T>, E>>,
{
    let started = Instant::now();
    loop {
        let last_error = match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => None,
            Err(err) => Some(err.into()),
        };
        if started.elapsed() >= timeout {
            return Err(match last_error {
                Some(err) => err.context(format!(
                    "timed out after {:.1?} waiting for {what}; last probe failed",
                    started.elapsed()
                )),
                None => anyhow!("timed out after {:.1?} waiting for {what}", started.elapsed()),
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Like [`wait_for`], for probes that return the latest observation and a verdict on it: the
/// timeout error then shows what was last observed (say, the claim's phase and annotations).
pub async fn wait_until<T, E, F, Fut, P>(what: &str, timeout: Duration, mut observe: F, mut done: P) -> Result<T>
where
    T: Debug,
    E: Into<anyhow::Error>,
    F: FnMut() -> Fut,
    Fut: Future<Output = std::result::Result<T, E>>,
    P: FnMut(&T) -> bool,
{
    let started = Instant::now();
    loop {
        let observed = observe().await.map_err(Into::into);
        if let Ok(value) = &observed
            && done(value)
        {
            return observed;
        }
        if started.elapsed() >= timeout {
            let last = match observed {
                Ok(value) => format!("last observed: {value:#?}"),
                Err(err) => format!("last observation failed: {err:#}"),
            };
            bail!("timed out after {:.1?} waiting for {what}; {last}", started.elapsed());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// `<prefix>-<random>`: a DNS-1123 label unique across tests and test runs, for namespaces,
/// classes and nodes so that tests sharing one control plane never see each other's objects.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let random = crate::pki::random_hex(3).unwrap_or_else(|_| {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        format!("{:06x}", nanos & 0xff_ffff)
    });
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let prefix: String =
        prefix.to_ascii_lowercase().chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '-' }).take(48).collect();
    format!("{prefix}-{random}{count:x}")
}

/// Plain-HTTP GET returning status code and body; for health and metrics endpoints.
///
/// Speaks HTTP/1.0 so that the server delimits the body by closing the connection and no
/// chunked decoding is needed.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| anyhow!("GET http://{addr}{path}: no answer within 10 s"))?
        .with_context(|| format!("GET http://{addr}{path}"))?;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| anyhow!("GET http://{addr}{path}: malformed response {head:?}"))?;
    Ok((status, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_are_dns_labels_and_differ() {
        let a = unique_name("My_Test");
        let b = unique_name("My_Test");
        assert_ne!(a, b);
        for name in [a, b] {
            assert!(name.len() <= 63, "{name}");
            assert!(name.starts_with("my-test-"), "{name}");
            assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{name}");
        }
    }

    #[tokio::test]
    async fn wait_for_reports_what_and_last_error_on_timeout() {
        let err = wait_for::<(), anyhow::Error, _, _>("the impossible", Duration::from_millis(300), || async {
            Err(anyhow!("still broken"))
        })
        .await
        .unwrap_err();
        let message = format!("{err:#}");
        assert!(message.contains("the impossible"), "{message}");
        assert!(message.contains("still broken"), "{message}");
    }

    #[tokio::test]
    async fn wait_for_returns_the_first_ready_value() {
        let mut calls = 0;
        let value = wait_for("third call", Duration::from_secs(5), || {
            calls += 1;
            let ready = calls >= 3;
            async move { anyhow::Ok(ready.then_some(calls)) }
        })
        .await
        .unwrap();
        assert_eq!(value, 3);
    }
}

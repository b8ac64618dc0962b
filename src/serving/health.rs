//! Liveness, readiness and metrics over HTTP: `/healthz`, `/readyz`, `/metrics`, for every
//! process of ours: the node daemon ([`serve`]) and a subcommand that answers for itself
//! ([`serve_answers`] with its own [`Answers`], as the claim releaser's `serving::releaser`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::serving::metrics::Metrics;

/// Readiness state: ready once every watch delivered its first list, and while the API answers.
#[derive(Default)]
pub struct Health {
    claims_synced: AtomicBool,
    classes_synced: AtomicBool,
    volumes_synced: AtomicBool,
    legacy_volumes_synced: AtomicBool,
    api_reachable: AtomicBool,
    /// One line per unusable pool: which and why (empty when all are usable).
    pool_problems: Mutex<Vec<String>>,
    /// One line per pool saying how it enforces quotas (`pool <name>: quota <mechanism>`).
    quota_capabilities: Mutex<Vec<String>>,
}

/// Which initial list arrived.
#[derive(Clone, Copy, Debug)]
pub enum Watch {
    /// Claim metadata.
    Claims,
    /// StorageClasses.
    Classes,
    /// PersistentVolumes labelled for this node.
    Volumes,
    /// PersistentVolumes without our node label (made by the Go build).
    LegacyVolumes,
}

impl Health {
    /// Records that a watch delivered its initial list.
    pub fn synced(&self, watch: Watch) {
        let flag = match watch {
            Watch::Claims => &self.claims_synced,
            Watch::Classes => &self.classes_synced,
            Watch::Volumes => &self.volumes_synced,
            Watch::LegacyVolumes => &self.legacy_volumes_synced,
        };
        flag.store(true, Ordering::Relaxed);
    }

    /// Records whether the last API interaction of a watch succeeded.
    pub fn set_api_reachable(&self, reachable: bool) {
        self.api_reachable.store(reachable, Ordering::Relaxed);
    }

    /// Records which pools are unusable and why (`pool <name> at <path>: <reason>`).
    pub fn set_pool_problems(&self, problems: Vec<String>) {
        *self.pool_problems.lock().unwrap_or_else(|e| e.into_inner()) = problems;
    }

    /// Records each pool's quota capability line, shown in the `/readyz` body.
    pub fn set_quota_capabilities(&self, lines: Vec<String>) {
        *self.quota_capabilities.lock().unwrap_or_else(|e| e.into_inner()) = lines;
    }

    /// The `/readyz` detail lines after the verdict: each pool's quota capability.
    pub fn detail(&self) -> String {
        let lines = self.quota_capabilities.lock().unwrap_or_else(|e| e.into_inner());
        lines.iter().map(|line| format!("{line}\n")).collect()
    }

    /// Whether every watch delivered its initial list.
    pub fn all_synced(&self) -> bool {
        [&self.claims_synced, &self.classes_synced, &self.volumes_synced, &self.legacy_volumes_synced]
            .iter()
            .all(|flag| flag.load(Ordering::Relaxed))
    }

    /// Why not ready, or None when ready.
    pub fn not_ready_reason(&self) -> Option<String> {
        let problems = self.pool_problems.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if !self.claims_synced.load(Ordering::Relaxed) {
            Some("claim watch has not delivered its initial list".into())
        } else if !self.classes_synced.load(Ordering::Relaxed) {
            Some("StorageClass watch has not delivered its initial list".into())
        } else if !self.all_synced() {
            Some("PersistentVolume watch has not delivered its initial list".into())
        } else if !self.api_reachable.load(Ordering::Relaxed) {
            Some("Kubernetes API is not reachable".into())
        } else if !problems.is_empty() {
            Some(format!("unusable pool(s): {}", problems.join("; ")))
        } else {
            None
        }
    }
}

/// Binds the listener up front, so that a taken port fails the start instead of leaving a pod
/// whose probes can never pass.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Most connections served at once per listener. Kubelet probes and a Prometheus scrape need a
/// handful; more are closed as soon as they are accepted, so that a flood from any pod can hold
/// neither memory nor file descriptors beyond this (the DaemonSet's limit is 64Mi).
pub const MAX_CONNECTIONS: usize = 64;
/// Time a client has to send a request's headers, from the moment the server waits for them
/// (a new connection, or an idle kept-alive one); then the connection is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Age after which a connection is closed once its current request is answered: bounds
/// kept-alive connections that a scraper, or an attacker trickling requests, holds open.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(60);
/// How long a connection past its age may take to finish the request in flight.
const CLOSE_GRACE: Duration = Duration::from_secs(5);
/// Largest buffered request; ours are bare GETs (hyper's default lets each connection buffer ~400 KiB).
const MAX_REQUEST_BUFFER: usize = 16 * 1024;
/// Pause after a failed accept (out of file descriptors, say), so the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// What a process answers on its port, read at each request.
pub trait Answers: Send + Sync + 'static {
    /// Why the process is not ready, or `None` when it is (`/readyz`).
    fn not_ready_reason(&self) -> Option<String>;
    /// Lines after the verdict in `/readyz`'s body.
    fn detail(&self) -> String {
        String::new()
    }
    /// The `/metrics` body, in the OpenMetrics text format.
    fn metrics_text(&self) -> String;
}

/// The node daemon's answers: its watches' and pools' readiness, its metrics.
struct NodeAnswers {
    health: Arc<Health>,
    metrics: Arc<Metrics>,
}

impl Answers for NodeAnswers {
    fn not_ready_reason(&self) -> Option<String> {
        self.health.not_ready_reason()
    }

    fn detail(&self) -> String {
        self.health.detail()
    }

    fn metrics_text(&self) -> String {
        self.metrics.ready.set(i64::from(self.health.not_ready_reason().is_none()));
        self.metrics.encode()
    }
}

/// Serves the node daemon's `/healthz`, `/readyz` and `/metrics` on `listener` until the
/// process exits, with the limits above.
pub async fn serve(listener: TcpListener, health: Arc<Health>, metrics: Arc<Metrics>) {
    serve_answers(listener, Arc::new(NodeAnswers { health, metrics })).await
}

/// Serves `/healthz`, `/readyz` and `/metrics` with `answers` on `listener` until the process
/// exits, with the limits above.
pub async fn serve_answers(listener: TcpListener, answers: Arc<dyn Answers>) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, max_connections = MAX_CONNECTIONS, "serving /healthz, /readyz and /metrics");
    }
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut refused: u64 = 0;
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Closed at once rather than queued: a queue would only move the unbounded growth.
            drop(stream);
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(%peer, refused, "too many HTTP connections; closing new ones");
            }
            continue;
        };
        let answers = answers.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req: Request<Incoming>| {
                let response = respond(req.uri().path(), answers.as_ref());
                async move { Ok::<_, Infallible>(response) }
            });
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .max_buf_size(MAX_REQUEST_BUFFER)
                .keep_alive(true)
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                () = tokio::time::sleep(MAX_CONNECTION_AGE) => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(CLOSE_GRACE, connection).await;
        });
    }
}

fn respond(path: &str, answers: &dyn Answers) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/healthz" | "/livez" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" => match answers.not_ready_reason() {
            None => (StatusCode::OK, "text/plain", format!("ok\n{}", answers.detail())),
            Some(reason) => {
                (StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("not ready: {reason}\n{}", answers.detail()))
            }
        },
        "/metrics" => {
            (StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", answers.metrics_text())
        }
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".to_owned()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = hyper::header::HeaderValue::from_str(content_type) {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_watch_synced_the_api_answers_and_pools_are_usable() {
        let h = Health::default();
        assert!(h.not_ready_reason().is_some());
        h.synced(Watch::Claims);
        h.synced(Watch::Classes);
        h.synced(Watch::Volumes);
        assert!(h.not_ready_reason().is_some(), "legacy PV watch not synced yet");
        h.synced(Watch::LegacyVolumes);
        assert_eq!(h.not_ready_reason().as_deref(), Some("Kubernetes API is not reachable"));
        h.set_api_reachable(true);
        assert_eq!(h.not_ready_reason(), None);
        h.set_pool_problems(vec!["pool ssd at /mnt/ssd: not a mount point".into()]);
        let reason = h.not_ready_reason().unwrap();
        assert!(reason.contains("pool ssd at /mnt/ssd: not a mount point"), "names the pool and why: {reason}");
    }

    #[test]
    fn readyz_lists_each_pools_quota_capability_after_the_verdict() {
        let h = Health::default();
        [Watch::Claims, Watch::Classes, Watch::Volumes, Watch::LegacyVolumes].into_iter().for_each(|w| h.synced(w));
        h.set_api_reachable(true);
        h.set_quota_capabilities(vec![
            "pool fast (btrfs at /mnt/fast): quota btrfs-qgroup".into(),
            "pool ssd (xfs at /mnt/ssd): quota none (it is mounted without prjquota)".into(),
        ]);
        let h = Arc::new(h);
        let answers = NodeAnswers { health: h.clone(), metrics: Arc::new(Metrics::new()) };
        let response = respond("/readyz", &answers);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            h.detail(),
            "pool fast (btrfs at /mnt/fast): quota btrfs-qgroup\n\
             pool ssd (xfs at /mnt/ssd): quota none (it is mounted without prjquota)\n"
        );
    }
}

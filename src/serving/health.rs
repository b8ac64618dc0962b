//! Liveness, readiness and metrics over HTTP: `/healthz`, `/readyz`, `/metrics`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

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

/// Serves `/healthz`, `/readyz` and `/metrics` on `listener` until the process exits.
pub async fn serve(listener: TcpListener, health: Arc<Health>, metrics: Arc<Metrics>) {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving /healthz, /readyz and /metrics");
    }
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                continue;
            }
        };
        let health = health.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let response = respond(req.uri().path(), &health, &metrics);
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

fn respond(path: &str, health: &Health, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/healthz" | "/livez" => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
        "/readyz" => match health.not_ready_reason() {
            None => (StatusCode::OK, "text/plain", "ok\n".to_owned()),
            Some(reason) => (StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("not ready: {reason}\n")),
        },
        "/metrics" => (StatusCode::OK, "application/openmetrics-text; version=1.0.0; charset=utf-8", metrics.encode()),
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
}

//! How a subcommand's process (`operator`, `release-claims-of-removed-nodes`) starts its logs and
//! learns it should stop: one way for every subcommand, so that their pods log alike and stop
//! alike when the kubelet asks.

/// Logs to stderr, without colours (a pod's log is a file): `json` (any case) for one JSON
/// object a line, anything else for text; `RUST_LOG` sets the level, `info` by default.
pub fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(false);
    if format.eq_ignore_ascii_case("json") {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}

/// Resolves on SIGTERM (the kubelet stopping the pod) or Ctrl-C.
pub async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}

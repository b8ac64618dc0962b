//! Entry point: parse configuration, set up logging and the client, run until SIGTERM.

use clap::Parser;
use futures::FutureExt;
use hostpath_provisioner::config::{self, Args, Config, LogFormat};
use hostpath_provisioner::reconciling::controller;
use hostpath_provisioner::serving::{build_info, heap};
use kube::config::KubeConfigOptions;

fn main() -> anyhow::Result<()> {
    // Before any thread exists (serving::heap: why two threads and two arenas).
    heap::limit_arenas();
    let workers = heap::worker_threads(std::env::var("TOKIO_WORKER_THREADS").ok().as_deref());
    tokio::runtime::Builder::new_multi_thread().worker_threads(workers).enable_all().build()?.block_on(run())
}

async fn run() -> anyhow::Result<()> {
    // Subcommands: `doctor` (this node's storage health), `readyz` (the daemon's /readyz answer,
    // for kubectl exec), `check-volume DIR` (the Helm chart's test pod), `operator` (the operator
    // of HostPathProvisioner resources, src/operating), `pool-mount` (its per-node mounter) and
    // `release-claims-of-removed-nodes` (the one Deployment that may delete claims),
    // listed in the daemon's --help (config::SUBCOMMANDS_HELP). Anything else is the daemon,
    // whose command line takes no positional argument.
    use hostpath_provisioner::reconciling::claim_release;
    use hostpath_provisioner::{doctor, operating};
    let subcommand = std::env::args_os().nth(1);
    let exit_code = match subcommand.as_ref().and_then(|arg| arg.to_str()) {
        Some(doctor::SUBCOMMAND) => Some(doctor::main(std::env::args_os().skip(1)).await),
        Some(doctor::readyz::SUBCOMMAND) => Some(doctor::readyz::main(std::env::args_os().skip(1))),
        Some(doctor::volume_check::SUBCOMMAND) => Some(doctor::volume_check::main(std::env::args_os().skip(2))),
        Some(operating::SUBCOMMAND) => Some(operating::main(std::env::args_os().skip(1)).await),
        Some(operating::pool_mount::SUBCOMMAND) => Some(operating::pool_mount::main(std::env::args_os().skip(1)).await),
        Some(claim_release::SUBCOMMAND) => Some(claim_release::main(std::env::args_os().skip(1)).await),
        _ => None,
    };
    if let Some(code) = exit_code {
        std::process::exit(code);
    }
    let configured = Args::parse()
        .validate()
        .and_then(|config| Ok((config::log_filter(std::env::var_os("RUST_LOG").as_deref())?, config)));
    let (log_filter, config) = match configured {
        Ok(configured) => configured,
        Err(error) => {
            eprintln!("hostpath-provisioner: configuration error: {error}");
            std::process::exit(2);
        }
    };
    init_logging(log_filter, config.log_format);
    tracing::info!(version = build_info::VERSION, commit = build_info::COMMIT, "hostpath-provisioner starting");
    let client = match client(&config).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("hostpath-provisioner: cannot configure the Kubernetes client: {error:#}");
            std::process::exit(1);
        }
    };
    let shutdown = shutdown_signal().shared();
    let deadline = async {
        shutdown.clone().await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        result = controller::run(client, config, shutdown.clone()) => {
            if let Err(error) = result {
                tracing::error!(%error, "cannot start");
                eprintln!("hostpath-provisioner: {error}");
                std::process::exit(1);
            }
        }
        () = deadline => {
            // An operation stuck on an unreachable API server must not hold the pod until the
            // kubelet's SIGKILL; whatever was cut short is redone idempotently after restart.
            tracing::warn!(grace = ?SHUTDOWN_GRACE, "in-flight operations did not finish in time; exiting");
        }
    }
    Ok(())
}

/// How long in-flight operations may take to finish after SIGTERM (the DaemonSet's
/// terminationGracePeriodSeconds is 30).
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

async fn client(config: &Config) -> anyhow::Result<kube::Client> {
    let mut kube_config = if config.kubeconfig.is_empty() {
        kube::Config::infer().await?
    } else {
        let kubeconfig = config::read_kubeconfigs(&config.kubeconfig)?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?
    };
    // Names this program and its node in the API server's audit log and request metrics.
    let agent = format!("hostpath-provisioner/{} (node {})", env!("CARGO_PKG_VERSION"), config.node_name);
    kube_config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_str(&agent)
            .unwrap_or_else(|_| hyper::header::HeaderValue::from_static("hostpath-provisioner")),
    ));
    Ok(kube::Client::try_from(kube_config)?)
}

fn init_logging(filter: tracing_subscriber::EnvFilter, format: LogFormat) {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Resolves on SIGTERM (the kubelet stopping the pod) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested; finishing in-flight operations (a second signal exits at once)");
    // An admin who asks twice means it: whatever is cut short is redone idempotently at start.
    tokio::spawn(async {
        let second = async {
            #[cfg(unix)]
            if let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {},
                    _ = term.recv() => {},
                }
                return;
            }
            let _ = tokio::signal::ctrl_c().await;
        };
        second.await;
        tracing::warn!("second shutdown signal; exiting now");
        std::process::exit(130);
    });
}

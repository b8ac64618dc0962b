//! `hostpath-provisioner operator`: the counterpart of the kubevirt hostpath-provisioner
//! operator. Run as a Deployment (deploy/operator), it serves `HostPathProvisioner` resources:
//! for each it applies the node provisioner (deploy/legacy's objects, rendered by
//! [`crate::deciding::operator::render`]), reports the status, and removes what it made when the
//! resource is deleted. Several replicas are safe: only the holder of a Lease in the operator's
//! namespace acts ([`leader`]); the node provisioner itself keeps having no leader election.

pub mod error;
pub mod leader;
pub mod node_settings;
pub mod pool_claims;
pub mod pool_mount;
pub mod reconcile;
pub mod takeover;

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::config::KubeConfigOptions;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};

use crate::deciding::operator::render::{NODE_CONTAINER, OWNER_LABEL};
use crate::deciding::operator::resource::{self, HostPathProvisioner};
use crate::serving::lifecycle::{init_logging, shutdown_signal};
use crate::serving::operator::OperatorAnswers;
use error::OperatorError;

/// The subcommand's name, the first argument.
pub const SUBCOMMAND: &str = "operator";
/// The operator container's name in deploy/operator/deployment.yaml, whose image the node pods
/// get.
pub const OPERATOR_CONTAINER: &str = "operator";

/// `hostpath-provisioner operator` arguments.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "hostpath-provisioner operator",
    bin_name = "hostpath-provisioner operator",
    version,
    about = "Serves HostPathProvisioner resources (hostpathprovisioner.kubevirt.io/v1beta1): deploys and runs the node provisioner they describe"
)]
pub struct OperatorArgs {
    /// The operator's namespace: the node provisioner's objects and the Lease go there.
    #[arg(long, env = "POD_NAMESPACE")]
    pub namespace: Option<String>,
    /// This pod's name (downward API): its image and pull secrets become the node pods' and the
    /// pool mounters', and it names this replica in the Lease.
    #[arg(long, env = "POD_NAME")]
    pub pod_name: Option<String>,
    /// The node pods' image, instead of the operator pod's own.
    #[arg(long, env = "NODE_IMAGE")]
    pub node_image: Option<String>,
    /// Seconds the Lease lasts unrenewed before a standby replica takes over (renewed every third).
    #[arg(long, env = "OPERATOR_LEASE_SECONDS", default_value_t = 15)]
    pub lease_seconds: u64,
    /// Kubeconfig for out-of-cluster runs (default: in-cluster, then the usual lookup).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<OsString>,
    /// Where `/healthz`, `/readyz` and `/metrics` are served, host:port (`:8080` in the
    /// Deployment, which Prometheus scrapes); empty serves nothing.
    #[arg(long = "listen", env = "LISTEN_ADDR", default_value = "")]
    pub listen: String,
    /// Logs: text or json; RUST_LOG sets the level.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    pub log_format: String,
}

/// Exit code of a configuration error, as the daemon's.
const EXIT_CONFIG: i32 = 2;

/// Runs the subcommand; returns the process exit code.
pub async fn main(argv: impl IntoIterator<Item = OsString>) -> i32 {
    let args = OperatorArgs::parse_from(argv);
    init_logging(&args.log_format);
    if args.lease_seconds < 3 {
        eprintln!("hostpath-provisioner operator: configuration error: --lease-seconds must be at least 3");
        return EXIT_CONFIG;
    }
    let listen = match crate::config::parse_addr("LISTEN_ADDR", &args.listen) {
        Ok(listen) => listen,
        Err(error) => {
            eprintln!("hostpath-provisioner operator: configuration error: {error} (flag --listen)");
            return EXIT_CONFIG;
        }
    };
    let answers = Arc::new(OperatorAnswers::new());
    if let Some(listen) = listen {
        // Bound before anything else, so that a taken port fails the start and a standby
        // replica is scraped (and counted as up) while it waits for the Lease.
        match crate::serving::health::bind(listen).await {
            Ok(listener) => {
                tokio::spawn(crate::serving::health::serve_answers(listener, answers.clone()));
            }
            Err(error) => {
                eprintln!("hostpath-provisioner operator: cannot listen on {listen}: {error}");
                return 1;
            }
        }
    }
    let client = match client(&args).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("hostpath-provisioner operator: cannot configure the Kubernetes client: {error}");
            return 1;
        }
    };
    let namespace = args
        .namespace
        .clone()
        .filter(|n| !n.trim().is_empty())
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let (image, image_pull_secrets) = match node_image(&client, &namespace, &args).await {
        Ok(found) => found,
        Err(error) => {
            eprintln!("hostpath-provisioner operator: {error}");
            return EXIT_CONFIG;
        }
    };
    let identity = args.pod_name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    tracing::info!(
        version = crate::serving::build_info::VERSION,
        %namespace,
        %image,
        image_pull_secrets = %image_pull_secrets.join(","),
        %identity,
        "hostpath-provisioner operator starting"
    );
    let leader =
        leader::Leader::new(client.clone(), &namespace, identity.clone(), Duration::from_secs(args.lease_seconds));
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    tokio::select! {
        result = leader.acquire() => if let Err(error) = result {
            tracing::error!(%error, "cannot acquire the operator Lease");
            return 1;
        },
        () = &mut shutdown => return 0,
    }
    answers.leader.set(1);
    let reporter = Reporter { controller: reconcile::FIELD_MANAGER.to_owned(), instance: Some(identity.clone()) };
    let ctx = Arc::new(reconcile::Context {
        client: client.clone(),
        namespace: namespace.clone(),
        image,
        image_pull_secrets,
        recorder: Recorder::new(client.clone(), reporter),
        identity,
    });
    let resources: Api<HostPathProvisioner> = Api::all(client.clone());
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &namespace);
    let controller = Controller::new(resources, watcher::Config::default())
        // A change of the node DaemonSet (its rollout) wakes its resource. Not `owns`: that
        // looks the owner up in the child's namespace, and this owner is cluster-scoped.
        .watches(daemonsets, watcher::Config::default().labels(OWNER_LABEL), |daemonset| {
            daemonset
                .metadata
                .owner_references
                .unwrap_or_default()
                .into_iter()
                .filter(|owner| owner.kind == resource::KIND && owner.api_version == resource::API_VERSION)
                .map(|owner| ObjectRef::new(&owner.name))
        })
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|result| {
            let answers = answers.clone();
            async move {
                match result {
                    // A watch that cannot run (the CRD missing, RBAC): said loudly, retried by
                    // the watcher with backoff.
                    Err(kube::runtime::controller::Error::QueueError(error)) => tracing::warn!(
                        %error,
                        "cannot watch HostPathProvisioners or their DaemonSets (is the CRD of deploy/operator installed?); retrying"
                    ),
                    // Reconcile failures are logged by the error policy, with their resource.
                    Err(kube::runtime::controller::Error::ReconcilerFailed(error, _)) => {
                        answers.reconciles.inc();
                        answers.reconcile_failures.inc();
                        tracing::debug!(%error, "reconcile failed");
                    }
                    Err(error) => tracing::debug!(%error, "controller step"),
                    Ok(_) => {
                        answers.reconciles.inc();
                    }
                }
            }
        });
    let code = tokio::select! {
        () = controller => 0,
        lost = leader.keep() => {
            tracing::error!(error = %lost, "stopping");
            1
        }
        () = &mut shutdown => {
            tracing::info!("shutdown requested; releasing the operator Lease");
            0
        }
    };
    answers.leader.set(0);
    leader.release().await;
    code
}

/// The node pods' and pool mounters' image and pull secrets: the operator pod's own, read
/// through the downward API's POD_NAME, so that one image tag rolls both and a private registry
/// that serves the operator serves them too. The pod's `imagePullSecrets` hold the Deployment's
/// and those of its ServiceAccount (the ServiceAccount admission plugin copies them in).
/// `--node-image` replaces the image; without a readable pod it also means no pull secrets.
async fn node_image(
    client: &kube::Client,
    namespace: &str,
    args: &OperatorArgs,
) -> Result<(String, Vec<String>), OperatorError> {
    let node_image = args.node_image.clone().filter(|i| !i.trim().is_empty());
    let Some(pod_name) = args.pod_name.as_deref().filter(|p| !p.is_empty()) else {
        return node_image.map(|image| (image, Vec::new())).ok_or_else(|| {
            OperatorError::Config(
                "no node image: set --node-image (NODE_IMAGE), or run in a pod with POD_NAME from the downward API"
                    .into(),
            )
        });
    };
    let pod = match Api::<Pod>::namespaced(client.clone(), namespace).get(pod_name).await {
        Ok(pod) => pod,
        // Run outside a pod with a node image of its own (a test, a host process): nothing to
        // copy, which the log says.
        Err(error) if node_image.is_some() => {
            tracing::warn!(%error, pod = pod_name, "cannot read the operator's own pod: the node pods and pool mounters get no imagePullSecrets");
            return Ok((node_image.unwrap_or_default(), Vec::new()));
        }
        Err(error) => {
            return Err(OperatorError::api(
                format!("read the operator's own pod {namespace}/{pod_name} for its image"),
                error,
            ));
        }
    };
    let spec = pod.spec.unwrap_or_default();
    let pull_secrets = spec.image_pull_secrets.unwrap_or_default().into_iter().map(|s| s.name).collect();
    if let Some(image) = node_image {
        return Ok((image, pull_secrets));
    }
    let containers = spec.containers;
    let image = containers
        .iter()
        .find(|c| c.name == OPERATOR_CONTAINER || c.name == NODE_CONTAINER)
        .or(containers.first())
        .and_then(|c| c.image.clone())
        .ok_or_else(|| {
            OperatorError::Config(format!("pod {pod_name} has no container image to reuse; set --node-image"))
        })?;
    Ok((image, pull_secrets))
}

async fn client(args: &OperatorArgs) -> Result<kube::Client, String> {
    let paths = args.kubeconfig.as_deref().map(crate::config::split_kubeconfig_paths).unwrap_or_default();
    let config = if paths.is_empty() {
        kube::Config::infer().await.map_err(|e| e.to_string())?
    } else {
        let kubeconfig = crate::config::read_kubeconfigs(&paths).map_err(|e| e.to_string())?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?
    };
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

//! `hostpath-provisioner release-claims-of-removed-nodes`: releases the claims bound to PVs of
//! nodes whose Node object has been gone past a grace period (`deciding::reaping` decides). Each
//! such PV is set to `Retain` first, so that nothing deletes its data, then its claim is deleted,
//! and the workload's controller makes a new one, provisioned where its pod can run now.
//!
//! Run as one small Deployment of its own (deploy/components/release-claims-of-removed-nodes,
//! the chart's `config.releaseClaimsOfRemovedNodes`, the operator's
//! `spec.releaseClaimsOfRemovedNodes`), under a ServiceAccount that alone holds `delete` on
//! claims: no node pod does, so that one node's token cannot delete every claim of the cluster.
//! The node daemon ignores the setting and says so (`reconciling::reaping`).
//!
//! One replica (strategy Recreate); two overlapping anyway (a node partitioned during a rollout)
//! are harmless: the change to `Retain` tests the resourceVersion the plan saw, and the delete
//! has the claim's uid as precondition, so a second actor's write is refused and its next pass
//! decides again on what it finds.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::{Node, ObjectReference, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::config::KubeConfigOptions;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

use crate::deciding::event;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::reaping::{Graces, ReapFacts, Release, owners_to_check, plan_reaping};
use crate::error::reason;
use crate::reconciling::claim_actions::claim_ref_of;
use crate::reconciling::context::truncate_utf8;
use crate::serving::lifecycle::{init_logging, shutdown_signal};
use crate::serving::releaser::ReleaserAnswers;

/// The subcommand's name, the first argument.
pub const SUBCOMMAND: &str = "release-claims-of-removed-nodes";
/// Passes are at most this far apart (and a quarter of the grace period when that is shorter).
const MAX_PASS_INTERVAL: Duration = Duration::from_secs(60);
/// Exit code of a configuration error, as the daemon's.
const EXIT_CONFIG: i32 = 2;

/// `hostpath-provisioner release-claims-of-removed-nodes` arguments.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "hostpath-provisioner release-claims-of-removed-nodes",
    bin_name = "hostpath-provisioner release-claims-of-removed-nodes",
    version,
    about = "Releases the claims bound to PVs of nodes whose Node object has been gone past a grace period: each PV is set to Retain (its data stays), then its claim is deleted. Run as one Deployment whose ServiceAccount alone may delete claims (docs/operating.md)"
)]
pub struct ReleaseArgs {
    /// How long a node's Node object must be gone before the claims of its PVs are released, e.g. 24h.
    #[arg(long = "after", env = "RELEASE_CLAIMS_OF_REMOVED_NODES", value_name = "DURATION")]
    pub after: String,
    /// The provisioner name whose PVs are considered (the node pods' PROVISIONER_NAME).
    #[arg(long, env = "PROVISIONER_NAME", default_value = "kubevirt.io/hostpath-provisioner")]
    pub provisioner_name: String,
    /// The node pods' second name (their CAPACITY_PROVISIONER_NAME), whose PVs are considered too.
    #[arg(long, env = "CAPACITY_PROVISIONER_NAME", value_name = "NAME")]
    pub capacity_provisioner_name: Option<String>,
    /// This pod's name (downward API), naming this replica in its Events.
    #[arg(long, env = "POD_NAME", default_value = "claim-releaser")]
    pub pod_name: String,
    /// Kubeconfig for out-of-cluster runs (default: in-cluster, then the usual lookup).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<OsString>,
    /// Logs: text or json; RUST_LOG sets the level.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    /// Address serving /healthz, /readyz and /metrics (host:port, or :port).
    #[arg(long = "listen", env = "LISTEN_ADDR", default_value = "0.0.0.0:8080")]
    pub listen: String,
}

/// Runs the subcommand; returns the process exit code.
pub async fn main(argv: impl IntoIterator<Item = OsString>) -> i32 {
    let args = ReleaseArgs::parse_from(argv);
    init_logging(&args.log_format);
    // The daemon's grammar (config::parse_grace), but never off: this Deployment runs to release.
    let grace = match crate::config::parse_grace("RELEASE_CLAIMS_OF_REMOVED_NODES", &args.after) {
        Ok(Some(grace)) => grace,
        Ok(None) | Err(_) => {
            eprintln!(
                "hostpath-provisioner {SUBCOMMAND}: configuration error: RELEASE_CLAIMS_OF_REMOVED_NODES (flag --after): invalid value {:?}: a positive duration such as 24h, 90m or 1h 30m (to release no claim, do not run this Deployment)",
                args.after
            );
            return EXIT_CONFIG;
        }
    };
    let listen = match crate::config::parse_addr("LISTEN_ADDR", &args.listen) {
        Ok(Some(addr)) => addr,
        Ok(None) | Err(_) => {
            eprintln!(
                "hostpath-provisioner {SUBCOMMAND}: configuration error: LISTEN_ADDR (flag --listen): invalid value {:?}: host:port such as 0.0.0.0:8080 or :8080 (its probes and metrics are served there)",
                args.listen
            );
            return EXIT_CONFIG;
        }
    };
    // Bound before anything else: a taken port fails the start rather than leaving a pod whose
    // probes can never pass.
    let listener = match crate::serving::health::bind(listen).await {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("hostpath-provisioner {SUBCOMMAND}: cannot listen on {listen}: {error}");
            return 1;
        }
    };
    let answers = Arc::new(ReleaserAnswers::new());
    tokio::spawn(crate::serving::health::serve_answers(listener, answers.clone()));
    let client = match client(&args).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("hostpath-provisioner {SUBCOMMAND}: cannot configure the Kubernetes client: {error}");
            return 1;
        }
    };
    let releaser = Releaser {
        recorder: Recorder::new(
            client.clone(),
            Reporter { controller: args.provisioner_name.clone(), instance: Some(args.pod_name.clone()) },
        ),
        client,
        // Empty is unset, as in the node daemon (the chart writes the variable either way).
        capacity_provisioner: args.capacity_provisioner_name.filter(|n| !n.trim().is_empty()),
        provisioner: args.provisioner_name,
        instance: args.pod_name,
        grace,
        answers,
    };
    tracing::info!(
        version = crate::serving::build_info::VERSION,
        grace = ?grace,
        provisioner = %releaser.provisioner,
        capacity_provisioner = ?releaser.capacity_provisioner,
        "releasing the bound claims of nodes gone for longer than the grace period"
    );
    tokio::select! {
        () = releaser.run() => 0,
        () = shutdown_signal() => {
            tracing::info!("shutdown requested");
            0
        }
    }
}

/// What the passes share.
struct Releaser {
    client: kube::Client,
    recorder: Recorder,
    provisioner: String,
    /// The node pods' second name, if they have one.
    capacity_provisioner: Option<String>,
    /// This replica's name in Events written outside the recorder.
    instance: String,
    grace: Duration,
    /// What it serves: the outcome of its passes, its metrics.
    answers: Arc<ReleaserAnswers>,
}

impl Releaser {
    /// The names whose PVs are considered: the node pods' first name and their second.
    fn provisioners(&self) -> Vec<&str> {
        [Some(self.provisioner.as_str()), self.capacity_provisioner.as_deref()].into_iter().flatten().collect()
    }

    async fn run(&self) {
        let interval = (self.grace / 4).clamp(Duration::from_secs(1), MAX_PASS_INTERVAL);
        // Kept between passes; empty after a restart: the grace period then starts again, which
        // only delays.
        let mut absent_since = BTreeMap::new();
        loop {
            let passed = self.pass(&absent_since).await;
            self.answers.pass_ended(passed.as_ref().map(|_| ()).map_err(ToString::to_string));
            match passed {
                Ok(next) => absent_since = next,
                Err(error) => {
                    let why = if matches!(&error, kube::Error::Api(e) if e.code == 403) {
                        " (the releaser's ClusterRole grants get on nodes, list and patch on persistentvolumes, delete on persistentvolumeclaims)"
                    } else {
                        ""
                    };
                    tracing::warn!(%error, "releasing the claims of removed nodes failed{why}; next pass retries")
                }
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// One pass: returns the first sightings of missing nodes, for the next.
    async fn pass(&self, absent_since: &BTreeMap<String, Instant>) -> Result<BTreeMap<String, Instant>, kube::Error> {
        let graces = Graces { reap: None, release: Some(self.grace) };
        let pvs: Api<KeptVolume> = Api::all(self.client.clone());
        let listed = pvs.list(&ListParams::default()).await?.items;
        // One GET per owner of a bound PV of ours (few), rather than a list of every Node.
        let mut existing = BTreeSet::new();
        let provisioners = self.provisioners();
        for owner in owners_to_check(&listed, &provisioners, graces) {
            if Api::<Node>::all(self.client.clone()).get_metadata_opt(owner).await?.is_some() {
                existing.insert(owner.to_owned());
            }
        }
        let plan = plan_reaping(&ReapFacts {
            pvs: &listed,
            nodes: &existing,
            absent_since,
            now: Instant::now(),
            graces,
            provisioners: &provisioners,
        });
        for (node, left) in &plan.waiting {
            tracing::info!(%node, left = ?left, "a node with bound volumes is gone; waiting out the grace period");
        }
        for release in &plan.release {
            self.release_claim(&pvs, release).await?;
        }
        Ok(plan.absent_since)
    }

    /// Releases one claim from a gone node's PV: the PV to Retain first (a JSON patch that tests
    /// the resourceVersion the plan saw), then the claim deleted with its uid as precondition. A
    /// write refused because the object changed or went (409, 404, 422) leaves the rest to the
    /// next pass, which decides again on what it finds.
    async fn release_claim(&self, pvs: &Api<KeptVolume>, release: &Release) -> Result<(), kube::Error> {
        let pv_ref = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolume".into()),
            name: Some(release.pv.clone()),
            uid: Some(release.pv_uid.clone()),
            ..Default::default()
        };
        let claim_ref = claim_ref_of(&release.claim_namespace, &release.claim_name, &release.claim_uid);
        let claim = format!("{}/{}", release.claim_namespace, release.claim_name);
        if release.retain_first {
            let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
                { "op": "test", "path": "/metadata/resourceVersion", "value": release.pv_resource_version },
                { "op": "replace", "path": "/spec/persistentVolumeReclaimPolicy", "value": "Retain" },
            ]))
            .expect("a valid JSON patch");
            match pvs.patch(&release.pv, &PatchParams::default(), &Patch::Json::<()>(patch)).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 || e.code == 422 => return Ok(()),
                Err(error) => return Err(error),
            }
            tracing::info!(pv = %release.pv, node = %release.node, %claim, "set the PV of a removed node to Retain before releasing its claim");
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &release.claim_namespace);
        let preconditions = Preconditions { uid: Some(release.claim_uid.clone()), resource_version: None };
        match claims
            .delete(&release.claim_name, &DeleteParams { preconditions: Some(preconditions), ..Default::default() })
            .await
        {
            Ok(_) => {}
            // Gone already, or a new claim of the same name: nothing of ours to release.
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => return Ok(()),
            Err(error) => {
                let why = if matches!(&error, kube::Error::Api(e) if e.code == 403) {
                    " (the releaser's ClusterRole needs `delete` on persistentvolumeclaims; docs/operating.md, \"Claims of removed nodes\")"
                } else {
                    ""
                };
                let note = format!(
                    "claim {claim} not released: {error}{why}; PV {} is Retain, its data stays, and the next pass tries again",
                    release.pv
                );
                self.warn(&pv_ref, reason::REMOVED_NODE_CLAIM_NOT_RELEASED, note).await;
                return Err(error);
            }
        }
        let note = format!(
            "claim {claim} released: node {} has had no Node object for longer than {:?} \
             (--release-claims-of-removed-nodes); PV {} is Retain and its data stays on that node, \
             for the node's return or an admin; a new claim of the workload is provisioned where its pod runs now",
            release.node, self.grace, release.pv
        );
        tracing::warn!(pv = %release.pv, node = %release.node, %claim, "released the claim of a removed node's volume");
        self.answers.claims_released.inc();
        self.warn(&claim_ref, reason::REMOVED_NODE_CLAIM_RELEASED, note.clone()).await;
        self.warn(&pv_ref, reason::REMOVED_NODE_CLAIM_RELEASED, note).await;
        Ok(())
    }

    /// A Warning on `regarding`; one that cannot be written is logged, never fails the release.
    async fn warn(&self, regarding: &ObjectReference, reason: &str, note: String) {
        let note = truncate_utf8(note, 1024);
        let result = if event::recorder_can_name(regarding.name.as_deref().unwrap_or_default()) {
            let event = Event {
                type_: EventType::Warning,
                reason: reason.into(),
                note: Some(note),
                action: "Release".into(),
                secondary: None,
            };
            self.recorder.publish(&event, regarding).await
        } else {
            // A name too long for the recorder's Event name (deciding::event).
            let text = event::EventText { type_: "Warning", reason, action: "Release", note: &note };
            let event = event::new_event(&self.provisioner, &self.instance, regarding, text, Timestamp::now());
            let namespace = event.metadata.namespace.clone().unwrap_or_default();
            Api::<K8sEvent>::namespaced(self.client.clone(), &namespace)
                .create(&PostParams::default(), &event)
                .await
                .map(|_| ())
        };
        if let Err(error) = result {
            tracing::warn!(%error, reason, object = ?regarding.name, "could not publish event");
        }
    }
}

async fn client(args: &ReleaseArgs) -> Result<kube::Client, String> {
    let paths = args.kubeconfig.as_deref().map(crate::config::split_kubeconfig_paths).unwrap_or_default();
    let mut config = if paths.is_empty() {
        kube::Config::infer().await.map_err(|e| e.to_string())?
    } else {
        let kubeconfig = crate::config::read_kubeconfigs(&paths).map_err(|e| e.to_string())?;
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| e.to_string())?
    };
    // Names this program in the API server's audit log.
    let agent = format!("hostpath-provisioner/{} ({SUBCOMMAND})", env!("CARGO_PKG_VERSION"));
    if let Ok(value) = hyper::header::HeaderValue::from_str(&agent) {
        config.headers.push((hyper::header::USER_AGENT, value));
    }
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Deployments (component, chart, operator) probe and scrape port 8080 without setting
    /// LISTEN_ADDR: the subcommand's default must be that port.
    #[test]
    fn the_default_listen_address_is_the_deployments_port() {
        let args = ReleaseArgs::try_parse_from(["release", "--after", "1h"]).expect("args");
        let listen = crate::config::parse_addr("LISTEN_ADDR", &args.listen).unwrap().unwrap();
        let component = include_str!("../../deploy/components/release-claims-of-removed-nodes/claim-releaser.yaml");
        assert!(component.contains(&format!("containerPort: {}", listen.port())), "{listen}");
        assert!(!component.contains("name: LISTEN_ADDR"), "the Deployment relies on the default");
    }
}

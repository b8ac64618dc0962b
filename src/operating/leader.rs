//! The operator's Lease: acquire it before acting, renew it while acting, release it on
//! shutdown. The decision is [`crate::deciding::operator::lease::may_act`]; this file only reads
//! and writes the Lease, with its resourceVersion, so two replicas racing for it cannot both win
//! (the second write is refused with a conflict).

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

use super::error::OperatorError;
use crate::deciding::operator::lease::{LeaseDecision, LeaseView, may_act};

/// The Lease's name in the operator's namespace.
pub const LEASE_NAME: &str = "hostpath-provisioner-operator";

/// One replica's hold on the Lease.
#[derive(Clone)]
pub struct Leader {
    api: Api<Lease>,
    identity: String,
    duration: Duration,
}

impl Leader {
    pub fn new(client: kube::Client, namespace: &str, identity: String, duration: Duration) -> Leader {
        Leader { api: Api::namespaced(client, namespace), identity, duration }
    }

    /// Waits until this replica holds the Lease.
    pub async fn acquire(&self) -> Result<(), OperatorError> {
        let mut announced = false;
        loop {
            match self.try_hold().await {
                Ok(true) => {
                    tracing::info!(identity = %self.identity, lease = LEASE_NAME, "holding the operator Lease; acting");
                    return Ok(());
                }
                Ok(false) if !announced => {
                    tracing::info!(identity = %self.identity, "another replica holds the operator Lease; standing by");
                    announced = true;
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(%error, "cannot read or write the operator Lease; retrying"),
            }
            tokio::time::sleep(self.duration / 3).await;
        }
    }

    /// Renews the Lease every third of its duration; returns when it is lost (another replica
    /// holds it) or cannot be renewed before it would expire.
    pub async fn keep(&self) -> OperatorError {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.duration / 3).await;
            match self.try_hold().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => return OperatorError::LeaseLost(self.holder().await.unwrap_or_default()),
                Err(error) => {
                    tracing::warn!(%error, "cannot renew the operator Lease; retrying");
                    // Stop acting before another replica may take the Lease over.
                    if last_renewal.elapsed() >= self.duration.mul_f32(0.8) {
                        return OperatorError::LeaseLost(String::from("(unknown: renewal kept failing)"));
                    }
                }
            }
        }
    }

    /// Gives the Lease up so that a standby replica acts at once instead of after expiry.
    pub async fn release(&self) {
        if let Ok(Some(mut lease)) = self.api.get_opt(LEASE_NAME).await
            && lease.spec.as_ref().and_then(|s| s.holder_identity.as_deref()) == Some(self.identity.as_str())
        {
            if let Some(spec) = lease.spec.as_mut() {
                spec.holder_identity = None;
            }
            if let Err(error) = self.api.replace(LEASE_NAME, &PostParams::default(), &lease).await {
                tracing::warn!(%error, "cannot release the operator Lease; it expires by itself");
            }
        }
    }

    async fn holder(&self) -> Option<String> {
        self.api.get_opt(LEASE_NAME).await.ok().flatten().and_then(|l| l.spec).and_then(|s| s.holder_identity)
    }

    /// One read-decide-write round: Ok(true) when this replica holds the Lease afterwards.
    async fn try_hold(&self) -> Result<bool, OperatorError> {
        let current =
            self.api.get_opt(LEASE_NAME).await.map_err(|e| OperatorError::api("read the operator Lease", e))?;
        let view = current.as_ref().map(|lease| {
            let spec = lease.spec.clone().unwrap_or_default();
            LeaseView {
                holder: spec.holder_identity,
                renewed: spec.renew_time.map(|t| t.0),
                duration_seconds: spec.lease_duration_seconds,
            }
        });
        let now = Timestamp::now();
        let decision = may_act(view.as_ref(), now, &self.identity);
        if decision == LeaseDecision::Wait {
            return Ok(false);
        }
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let written = match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta { name: Some(LEASE_NAME.to_owned()), ..ObjectMeta::default() },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(seconds),
                        acquire_time: Some(MicroTime(now)),
                        renew_time: Some(MicroTime(now)),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_default();
                if decision == LeaseDecision::TakeOver {
                    spec.acquire_time = Some(MicroTime(now));
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
                }
                spec.holder_identity = Some(self.identity.clone());
                spec.lease_duration_seconds = Some(seconds);
                spec.renew_time = Some(MicroTime(now));
                // The resourceVersion read above makes this a compare-and-swap.
                self.api.replace(LEASE_NAME, &PostParams::default(), &lease).await
            }
        };
        match written {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(error) => Err(OperatorError::api("write the operator Lease", error)),
        }
    }
}

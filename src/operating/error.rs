//! Errors of the operator. Each knows the Event reason it is reported under on the resource.

/// Event reasons the operator writes on a `HostPathProvisioner`.
pub mod reason {
    /// Warning: an object the resource makes could not be applied.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// Warning: the status could not be written.
    pub const STATUS_FAILED: &str = "StatusUpdateFailed";
    /// Warning: the objects made for a deleted resource could not be removed.
    pub const CLEANUP_FAILED: &str = "CleanupFailed";
    /// Warning: a pool's claim or mounter is kept because PVs of ours live there.
    pub const POOL_HELD_BACK: &str = "PoolHeldBack";
    /// Normal: what the kubevirt operator left was taken over (deleted, kept without owner,
    /// its finalizer removed).
    pub const TOOK_OVER: &str = "TookOver";
    /// Warning: the API server refuses the operator's writes to the resource (it breaks the
    /// current CRD's rules, stored under an earlier schema, before Kubernetes 1.30).
    pub const INVALID_RESOURCE: &str = "InvalidResource";
    /// Normal: every object of the resource applied.
    pub const APPLIED: &str = "Applied";
}

/// What went wrong in one step of the operator.
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// An API call failed; `step` says which one, in words an admin can act on.
    #[error("{step}: {source}")]
    Api {
        step: String,
        #[source]
        source: kube::Error,
    },
    /// The operator's own settings are unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The resource's deletion waits: PVs of ours live in pools on a claim.
    #[error("{0}")]
    PoolHeldBack(String),
    /// Another replica took the Lease over: this one must stop acting at once.
    #[error("lost the operator Lease to {0:?}; exiting so that only one replica acts")]
    LeaseLost(String),
}

impl OperatorError {
    pub fn api(step: impl Into<String>, source: kube::Error) -> OperatorError {
        OperatorError::Api { step: step.into(), source }
    }

    /// The Event reason of this error when it ends a reconcile.
    pub fn reason(&self) -> &'static str {
        match self {
            OperatorError::Api { .. } | OperatorError::Config(_) | OperatorError::LeaseLost(_) => reason::APPLY_FAILED,
            OperatorError::PoolHeldBack(_) => reason::POOL_HELD_BACK,
        }
    }
}

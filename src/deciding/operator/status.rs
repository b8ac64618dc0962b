//! The status a resource reports: conditions Available, Progressing and Degraded (plus
//! NotActedUpon for the kubevirt CSI driver's fields), the versions, and one status per pool,
//! from what rendering found and what the node DaemonSet reports.
//!
//! A condition keeps its transition and heartbeat times while its status, reason and message
//! stay the same, so that an unchanged cluster gives an unchanged status, and the operator
//! writes nothing (a write would wake it again).

use super::render::Rendered;
use super::resource::{ClaimStatus, Condition, HostPathProvisioner, Status, StoragePoolStatus};
use super::takeover::KUBEVIRT_FINALIZER;

pub const AVAILABLE: &str = "Available";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
pub const NOT_ACTED_UPON: &str = "NotActedUpon";

/// Pool phases, as the kubevirt operator names them.
pub const PREPARING: &str = "Preparing";
pub const MOUNTING: &str = "Mounting";
pub const READY: &str = "Ready";

/// The node DaemonSet's rollout, as its status tells it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rollout {
    /// Nodes the placement selects (desiredNumberScheduled).
    pub desired: i32,
    /// Nodes running the current template (updatedNumberScheduled).
    pub updated: i32,
    /// Nodes whose pod is available (numberAvailable).
    pub available: i32,
    /// The DaemonSet controller has seen the latest template (observedGeneration).
    pub current: bool,
}

impl Rollout {
    /// Every selected node runs the current template, available.
    pub fn complete(&self) -> bool {
        self.current && self.updated >= self.desired && self.available >= self.desired
    }
}

/// A pool on a claim as the cluster shows it: its claims and per-node mounters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolOnClaimState {
    pub name: String,
    /// Nodes that get a mounter.
    pub desired: i32,
    /// Mounters whose pod is Ready (the claim mounted at the pool path on that node).
    pub ready: i32,
    /// Every claim of the pool exists.
    pub claims_made: bool,
    pub claim_statuses: Vec<ClaimStatus>,
}

/// Everything the status is made from.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    pub resource: &'a HostPathProvisioner,
    pub rendered: &'a Rendered,
    /// Why applying the rendered objects failed, if it did.
    pub apply_failure: Option<String>,
    /// The node DaemonSet's rollout; None when there is no DaemonSet.
    pub rollout: Option<Rollout>,
    /// Another resource is the one acting for this cluster (its name).
    pub superseded_by: Option<String>,
    /// The pools on a claim, as the cluster shows them.
    pub pools_on_claim: &'a [PoolOnClaimState],
    /// Why pool claims or mounters are kept against the spec (the PVs that hold them).
    pub held_back: &'a [String],
    /// This operator's version: the node pods run the operator's own image.
    pub version: &'a str,
    /// RFC 3339, for the times of changed conditions.
    pub now: &'a str,
}

/// The status to write.
pub fn status(observed: &Observed) -> Status {
    let previous = observed.resource.status.clone().unwrap_or_default();
    let generation = observed.resource.metadata.generation;
    let rendered = observed.rendered;
    let rollout = observed.rollout;
    let complete = rollout.is_some_and(|r| r.complete()) && observed.apply_failure.is_none() && !rendered.blocked();

    let (available, available_reason, available_message) = match (&observed.superseded_by, rollout) {
        (Some(other), _) => (false, "Superseded", superseded_message(other)),
        (None, None) => (false, "NotDeployed", "the node DaemonSet does not exist yet (see Degraded)".to_owned()),
        (None, Some(r)) if !r.current => {
            (false, "Deploying", "the DaemonSet controller has not acted on the current pod template yet".to_owned())
        }
        (None, Some(r)) if r.desired == 0 => (
            false,
            "NoNodeSelected",
            "spec.workload selects no node: no provisioner runs, so no claim of ours can be served".to_owned(),
        ),
        (None, Some(r)) if r.available >= r.desired => {
            (true, "AsExpected", format!("the provisioner is available on all {} selected nodes", r.desired))
        }
        (None, Some(r)) => (
            false,
            "NodesNotReady",
            format!("the provisioner is available on {} of {} selected nodes", r.available, r.desired),
        ),
    };
    let (progressing, progressing_reason, progressing_message) = match rollout {
        Some(r) if observed.superseded_by.is_none() && !r.complete() => (
            true,
            "RollingOut",
            format!("{} of {} nodes run the current pod template, {} available", r.updated, r.desired, r.available),
        ),
        _ => (false, "AsExpected", "nothing is being rolled out".to_owned()),
    };
    let mut problems: Vec<(&str, String)> = rendered.problems.iter().map(|p| (p.reason, p.message.clone())).collect();
    problems.extend(observed.held_back.iter().map(|message| ("PoolHeldBack", message.clone())));
    if let Some(failure) = &observed.apply_failure {
        problems.insert(0, ("ApplyFailed", failure.clone()));
    }
    if let Some(other) = &observed.superseded_by {
        problems.insert(0, ("Superseded", superseded_message(other)));
    }
    let (degraded, degraded_reason, degraded_message) = match problems.first() {
        Some((reason, _)) => {
            (true, *reason, problems.iter().map(|(_, message)| message.as_str()).collect::<Vec<_>>().join("; "))
        }
        None => (false, "AsExpected", "no problem found".to_owned()),
    };
    let (ignored, ignored_reason, ignored_message) = if rendered.not_acted_upon.is_empty() {
        (false, "AllFieldsActedUpon", "every field set is acted upon".to_owned())
    } else {
        (
            true,
            "CsiDriverFields",
            format!(
                "accepted but not acted upon, as they concern the kubevirt CSI driver, which this provisioner does not run: {}",
                rendered.not_acted_upon.join(", ")
            ),
        )
    };
    let make = |type_: &str, status: bool, reason: &str, message: String| {
        condition(&previous.conditions, type_, status, reason, message, generation, observed.now)
    };
    let conditions = vec![
        make(AVAILABLE, available, available_reason, available_message),
        make(PROGRESSING, progressing, progressing_reason, progressing_message),
        make(DEGRADED, degraded, degraded_reason, degraded_message),
        make(NOT_ACTED_UPON, ignored, ignored_reason, ignored_message),
    ];
    Status {
        conditions,
        operator_version: Some(observed.version.to_owned()),
        target_version: Some(observed.version.to_owned()),
        observed_version: if complete { Some(observed.version.to_owned()) } else { previous.observed_version },
        storage_pool_statuses: pool_statuses(observed),
    }
}

/// Degraded's reason while a newer operator's work is left alone.
pub const NEWER_VERSION_OBSERVED: &str = "NewerVersionObserved";

/// A resource a newer operator of this project brought to its version: `status.observedVersion`
/// names a release above this operator's own. An older operator (a rollback of the operator)
/// leaves it and what it made as they are: it would roll the node pods back to an image that
/// may not understand the volumes, markers or fields the newer one made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewerVersion {
    pub observed: String,
    pub own: String,
}

impl NewerVersion {
    pub fn message(&self, resource: &str) -> String {
        format!(
            "status.observedVersion is {observed}, written by a newer operator of this project, and this operator is {own}: it leaves the resource and the objects it made as they are, so that a rollback of the operator does not downgrade what it does not know. Run the operator of version {observed} or later again; or, to hand the resource to {own} on purpose (docs/upgrading.md, \"Rolling back\"): kubectl patch hostpathprovisioner {resource} --subresource=status --type merge -p '{{\"status\":{{\"observedVersion\":null}}}}'",
            observed = self.observed,
            own = self.own,
        )
    }
}

/// Whether this operator (version `own`) must leave `resource` alone. Only a rollout a newer
/// operator of ours completed counts: observedVersion and targetVersion both name it (that
/// operator writes its own targetVersion at every reconcile, observedVersion once every node
/// runs it). A targetVersion above an older observedVersion is an upgrade that never finished,
/// which rolling the operator back is meant to undo.
///
/// The kubevirt operator's versions never count, so a take-over is never blocked: a resource
/// still carrying its finalizer is its own; only this project's releases are compared (Cargo's
/// form, `0.2.0`, never with a `v`: the kubevirt operator writes its release tags, `v0.20.0`, or
/// `latest`); and after a take-over its version stays in observedVersion until our first rollout
/// completes, while our first status write already put ours in targetVersion.
pub fn newer_version_observed(resource: &HostPathProvisioner, own: &str) -> Option<NewerVersion> {
    let finalizers = resource.metadata.finalizers.as_deref().unwrap_or_default();
    if finalizers.iter().any(|f| f == KUBEVIRT_FINALIZER) {
        return None;
    }
    let status = resource.status.as_ref()?;
    let observed = status.observed_version.as_deref()?;
    if status.target_version.as_deref() != Some(observed) {
        return None;
    }
    let newer = release_precedence(observed, own)? == std::cmp::Ordering::Greater;
    newer.then(|| NewerVersion { observed: observed.to_owned(), own: own.to_owned() })
}

/// Orders two releases of this project by semantic-versioning precedence; None when either is
/// not one of ours (`MAJOR.MINOR.PATCH`, optional `-pre-release` and `+build`, no `v`).
pub fn release_precedence(a: &str, b: &str) -> Option<std::cmp::Ordering> {
    Some(compare_releases(&parse_release(a)?, &parse_release(b)?))
}

struct Release<'a> {
    core: [u64; 3],
    pre_release: Vec<&'a str>,
}

fn parse_release(text: &str) -> Option<Release<'_>> {
    let without_build = text.split_once('+').map_or(text, |(v, _)| v);
    let (core, pre_release) = match without_build.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (without_build, None),
    };
    let numbers: Vec<u64> = core
        .split('.')
        .map(|n| {
            let digits = !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && (n == "0" || !n.starts_with('0'));
            digits.then(|| n.parse().ok()).flatten()
        })
        .collect::<Option<_>>()?;
    let core: [u64; 3] = numbers.try_into().ok()?;
    let pre_release: Vec<&str> = pre_release.map(|p| p.split('.').collect()).unwrap_or_default();
    let valid = |id: &&str| !id.is_empty() && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    pre_release.iter().all(valid).then_some(Release { core, pre_release })
}

fn compare_releases(a: &Release, b: &Release) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    a.core.cmp(&b.core).then_with(|| match (a.pre_release.is_empty(), b.pre_release.is_empty()) {
        (true, true) => Ordering::Equal,
        // A pre-release comes before its release.
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => {
            for (x, y) in a.pre_release.iter().zip(&b.pre_release) {
                let order = match (x.parse::<u64>(), y.parse::<u64>()) {
                    (Ok(x), Ok(y)) => x.cmp(&y),
                    (Ok(_), Err(_)) => Ordering::Less,
                    (Err(_), Ok(_)) => Ordering::Greater,
                    (Err(_), Err(_)) => x.cmp(y),
                };
                if order != Ordering::Equal {
                    return order;
                }
            }
            a.pre_release.len().cmp(&b.pre_release.len())
        }
    })
}

/// The status while a newer version is observed: Degraded says why nothing is done; the other
/// conditions, the versions a newer operator wrote and the pool statuses stay as they were
/// (this operator does not know what they mean now); operatorVersion says which operator runs.
pub fn refused_status(resource: &HostPathProvisioner, newer: &NewerVersion, now: &str) -> Status {
    let previous = resource.status.clone().unwrap_or_default();
    let message = newer.message(resource.metadata.name.as_deref().unwrap_or_default());
    let degraded = condition(
        &previous.conditions,
        DEGRADED,
        true,
        NEWER_VERSION_OBSERVED,
        message,
        resource.metadata.generation,
        now,
    );
    let mut conditions: Vec<Condition> = previous.conditions.iter().filter(|c| c.type_ != DEGRADED).cloned().collect();
    let at = previous.conditions.iter().position(|c| c.type_ == DEGRADED).unwrap_or(conditions.len().min(2));
    conditions.insert(at, degraded);
    Status { conditions, operator_version: Some(newer.own.clone()), ..previous }
}

fn superseded_message(other: &str) -> String {
    format!(
        "HostPathProvisioner {other:?} is older and already manages the node provisioner; one resource per cluster is acted upon: delete this one or merge its pools into {other:?}"
    )
}

/// One status per pool of `spec.storagePools` (the legacy pathConfig has none, as with the
/// kubevirt operator): served pools count the nodes whose pod is available, pools on a claim
/// the nodes whose mounter is Ready (Preparing until their claims exist); a pool left out
/// stays Preparing, and Degraded says why.
fn pool_statuses(observed: &Observed) -> Vec<StoragePoolStatus> {
    let rollout = observed.rollout.unwrap_or_default();
    observed
        .resource
        .spec
        .storage_pools
        .iter()
        .enumerate()
        // A name listed again is the same pool on another disk: one status.
        .filter(|(i, pool)| !observed.resource.spec.storage_pools[..*i].iter().any(|p| p.name == pool.name))
        .map(|(_, pool)| {
            let served = observed.superseded_by.is_none() && observed.rendered.served_pools.contains(&pool.name);
            if let Some(state) = observed.pools_on_claim.iter().find(|p| p.name == pool.name).filter(|_| served) {
                let phase = if !state.claims_made {
                    PREPARING
                } else if state.desired > 0 && state.ready >= state.desired && rollout.complete() {
                    READY
                } else {
                    MOUNTING
                };
                return StoragePoolStatus {
                    name: pool.name.clone(),
                    phase: phase.to_owned(),
                    desired_ready: state.desired,
                    current_ready: state.ready,
                    claim_statuses: state.claim_statuses.clone(),
                };
            }
            let current = if served { rollout.available.min(rollout.desired) } else { 0 };
            let phase = if !served {
                PREPARING
            } else if rollout.desired > 0 && current >= rollout.desired && rollout.complete() {
                READY
            } else {
                MOUNTING
            };
            StoragePoolStatus {
                name: pool.name.clone(),
                phase: phase.to_owned(),
                desired_ready: rollout.desired,
                current_ready: current,
                claim_statuses: Vec::new(),
            }
        })
        .collect()
}

fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &str,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_owned();
    let before = previous.iter().find(|c| c.type_ == type_);
    let transition = match before {
        Some(b) if b.status == status => b.last_transition_time.clone(),
        _ => None,
    }
    .or_else(|| Some(now.to_owned()));
    let heartbeat = match before {
        Some(b) if b.status == status && b.reason == reason && b.message == message => b.last_heartbeat_time.clone(),
        _ => None,
    }
    .or_else(|| Some(now.to_owned()));
    Condition {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        observed_generation: generation,
        last_transition_time: transition,
        last_heartbeat_time: heartbeat,
    }
}

/// The resource acted upon when several exist: the oldest (then the first by name), since the
/// node provisioner is one per cluster. The others report Superseded.
pub fn acting_resource(resources: &[HostPathProvisioner]) -> Option<String> {
    resources
        .iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .min_by(|a, b| {
            let key = |r: &HostPathProvisioner| {
                (r.metadata.creation_timestamp.as_ref().map(|t| t.0), r.metadata.name.clone())
            };
            key(a).cmp(&key(b))
        })
        .and_then(|r| r.metadata.name.clone())
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;

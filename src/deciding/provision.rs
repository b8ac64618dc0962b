//! The plan for a claim that may be this node's to provision: the claim reconciler gathers the
//! facts [`facts_needed`] names, and [`plan_claim`] decides everything from them at once: whose
//! claim it is ([`decide_claim`]), whether and where a clone copies its source, whether a PV is
//! already there or pre-bound, whether the pool has room and can enforce the class's quota, how
//! the volume is made and what its PV advertises.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::deciding::capacity::{CapacityAccounting, PoolRoom, ShortOfSpace, format_binary_si, round_down_pretty};
use crate::deciding::claim::{Decision, ProvisionPlan, SkipReason, annotated_for_provisioning, decide_claim};
use crate::deciding::class::{BindingMode, claim_class_name, class_request};
use crate::deciding::clone::{self, CloneActor, CloneRequest, Placement, SourceVerdict};
use crate::deciding::identity::Identity;
use crate::deciding::kept_volume::KeptVolume;
use crate::deciding::layout;
use crate::deciding::path_pattern::{self, DirectoryFacts, Found, Placing};
use crate::deciding::pool_roots::{self, RootCandidate};
use crate::deciding::quota::{self, QuotaFacts, QuotaMode, QuotaRefusal, VolumeQuota};
use crate::deciding::refusal::Refusal;
use crate::deciding::settings::{DecisionConfig, ProvisionOnNodePolicy};
use crate::deciding::topology::{self, Acting, LiveNode, Topology};
use crate::deciding::volume;
use crate::deciding::volume_spec::pv_reports_filesystem_size;
use crate::keys;

/// How soon a claim whose class does not exist yet is looked at again.
pub const CLASS_RECHECK: Duration = Duration::from_secs(30);
/// How often a claim left to the PV controller (a PV is pre-bound to it) is looked at again, in
/// case the PV goes or the PV controller is down.
pub const STATIC_RECHECK: Duration = Duration::from_secs(30);
/// How soon a shared or every-node class whose pool no live node serves is looked at again (a
/// node serving it may start later; nothing on the claim would change).
pub const NO_NODE_RECHECK: Duration = Duration::from_secs(60);
/// How often a clone waiting for its source looks again (the source changing does not wake the
/// clone's reconciler).
pub const SOURCE_RECHECK: Duration = Duration::from_secs(10);

/// How soon a claim whose `pathPattern` directory is held (by a PV being deleted, or kept
/// under Retain until an admin deletes it) is looked at again: the claim itself does not change.
pub const PATTERN_RECHECK: Duration = Duration::from_secs(60);

/// How often an Immediate clone whose source's node runs no provisioner is looked at again.
pub const SOURCE_NODE_RECHECK: Duration = Duration::from_secs(300);

/// Which facts the plan for a claim reads; the reconciler gathers only these.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FactsNeeded {
    /// The live nodes and their pools (shared and every-node classes choose who acts).
    pub live_nodes: bool,
    /// The source claim of a clone, and the PV it is bound to.
    pub clone_source: Option<String>,
    /// The PV named `pvc-<uid>` (a claim of our class).
    pub existing_pv: bool,
    /// The PVs pre-bound to the claim: a WaitForFirstConsumer claim the PV controller has not
    /// handed to a provisioner yet may be bound to one of them instead.
    pub pre_bound_pvs: bool,
    /// This node's pool the class names: its free space, and whether the directory exists.
    pub pool: Option<String>,
    /// The directory the claim's volume gets in that pool.
    pub dir_name: Option<String>,
    /// The pool's quota facts (a quotactl and two reads of /proc: only enforce classes).
    pub quota_facts: bool,
    /// The requests of the pool's live volumes (a pool with `requests` capacity accounting).
    pub promised: bool,
    /// What is at the claim's `pathPattern` directory: its marker, and which PVs hold it.
    pub pattern_dir: bool,
    /// The `HostPathSnapshot` the claim restores (`deciding::snapshot`).
    pub snapshot: Option<String>,
    /// Counted through the pool's shared record of promises (`deciding::pool_promises`), not
    /// this node's caches and ledger: a `shared` pool, where other nodes make volumes at the
    /// same time.
    pub shared_promises: bool,
}

/// Names the facts the plan for `claim` (a candidate of this node, `Interest::Candidate`) reads.
pub fn facts_needed(
    claim: &PersistentVolumeClaim,
    class: Option<&StorageClass>,
    me: &Identity,
    config: &DecisionConfig,
) -> FactsNeeded {
    let Some(class) = class.filter(|class| me.serves(&class.provisioner)) else {
        return FactsNeeded::default();
    };
    let request = class_request(class, "", config).ok();
    let pool =
        request.as_ref().and_then(|r| r.pool.clone()).filter(|name| config.pools.iter().any(|p| p.name == *name));
    let meta = &claim.metadata;
    let dir_name = request.as_ref().and_then(|r| crate::deciding::claim::claim_dir_name(claim, r, config).ok());
    let clone_source = clone::claim_source(claim).ok().flatten();
    FactsNeeded {
        // A clone also reads them: its source's node may have no running provisioner to make it.
        live_nodes: request.as_ref().is_some_and(|r| r.topology != Topology::Node) || clone_source.is_some(),
        clone_source,
        existing_pv: true,
        pre_bound_pvs: BindingMode::of(class) == BindingMode::WaitForFirstConsumer
            && keys::annotation(meta, keys::PROVISION_ON_NODE).is_none()
            && !annotated_for_provisioning(meta),
        quota_facts: pool.is_some() && request.as_ref().is_some_and(|r| r.quota == QuotaMode::Enforce),
        promised: pool.as_ref().is_some_and(|name| {
            config.pools.iter().any(|p| p.name == *name && p.accounting == Some(CapacityAccounting::Requests))
        }),
        shared_promises: pool.as_ref().is_some_and(|name| {
            config
                .pools
                .iter()
                .any(|p| p.name == *name && p.shared && p.accounting == Some(CapacityAccounting::Requests))
        }),
        pattern_dir: pool.is_some() && request.as_ref().is_some_and(|r| r.path_pattern.is_some()),
        snapshot: crate::deciding::snapshot::requested_snapshot(claim).map(str::to_owned),
        pool,
        dir_name,
    }
}

/// What the disk says about the pool a claim goes to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolFacts {
    /// Bytes free for unprivileged writers.
    pub available_bytes: u64,
    /// The filesystem's size as the Go build computed it (`f_blocks * f_bsize`).
    pub total_bytes: u64,
    /// The claim's directory exists already (an earlier attempt made it).
    pub dir_exists: bool,
    /// Quota facts, when [`FactsNeeded::quota_facts`].
    pub quota: Option<QuotaFacts>,
    /// The requests of the pool's live volumes, when [`FactsNeeded::promised`].
    pub promised_bytes: Option<u64>,
    /// What is at the claim's `pathPattern` directory, when [`FactsNeeded::pattern_dir`].
    pub pattern: Option<DirectoryFacts>,
    /// This root holds the copy of the snapshot the claim restores ([`FactsNeeded::snapshot`]).
    pub snapshot_here: bool,
    /// That snapshot is a btrfs subvolume, read from the disk (a quota limit can hold a volume
    /// restored from it; the status's `method` is writable by whoever may write the status).
    pub snapshot_subvolume: bool,
}

/// What the disk says about one root of the pool a claim goes to (a pool has one root, or one
/// per disk: `deciding::pool_roots`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RootFacts {
    /// The root.
    pub root: std::path::PathBuf,
    /// What was read there; `None` when it could not be read (not mounted under
    /// `--require-mountpoint`, an I/O error: the reconciler holds the error).
    pub read: Option<PoolFacts>,
}

/// The pool's state as gathered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolState<'a> {
    /// This node has no pool of that name (or the class names none).
    Missing,
    /// No root of the pool could be read: the reconciler holds the error.
    Unusable,
    /// Each root of the pool in declared order, at least one of them read.
    Ready(&'a [RootFacts]),
}

/// A clone's source as gathered.
#[derive(Clone, Copy, Debug)]
pub struct SourceFacts<'a> {
    /// The source claim's name.
    pub name: &'a str,
    /// The source claim, if it exists.
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The PV it is bound to, if any and visible.
    pub pv: Option<&'a KeptVolume>,
    /// Whether the directory the PV names is a quota volume of the pool (asked only for enforce
    /// classes; `None` when not asked or not a directory of the pool).
    pub is_quota_volume: Option<bool>,
}

/// Everything the plan reads.
#[derive(Clone, Copy, Debug)]
pub struct ClaimFacts<'a> {
    /// The claim (a candidate of this node).
    pub claim: &'a PersistentVolumeClaim,
    /// Its class, if it exists.
    pub class: Option<&'a StorageClass>,
    /// Who we are.
    pub me: &'a Identity,
    /// Settings.
    pub config: &'a DecisionConfig,
    /// The live nodes (empty unless [`FactsNeeded::live_nodes`]).
    pub live: &'a [LiveNode],
    /// The clone's source (when the claim names one).
    pub source: Option<SourceFacts<'a>>,
    /// The PV named `pvc-<uid>`, if it exists.
    pub existing_pv: Option<&'a KeptVolume>,
    /// A PV other than `pvc-<uid>` pre-bound to the claim (`deciding::static_binding`).
    pub pre_bound_pv: Option<&'a str>,
    /// The pool the class names.
    pub pool: PoolState<'a>,
    /// The snapshot a restore names (when the claim names one).
    pub restore: Option<RestoreFacts<'a>>,
}

/// A restore's snapshot as gathered.
#[derive(Clone, Copy, Debug)]
pub struct RestoreFacts<'a> {
    /// The snapshot's name.
    pub name: &'a str,
    /// The snapshot, if it exists.
    pub snapshot: Option<&'a crate::deciding::snapshot::HostPathSnapshot>,
}

/// Why a claim is looked at again later without anything being done now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Later {
    /// The class does not exist yet.
    ClassNotFound(String),
    /// Another live node acts on this shared or every-node claim.
    ActedOnBy(String),
    /// A PV is pre-bound to the claim: the PV controller binds it instead.
    PreBound(String),
}

/// A single cluster-wide explanation of why a claim stays Pending: every node that would write it
/// computes the same event, and the first one wins.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Explanation {
    /// An Immediate node-shaped claim names no node.
    NodeSelectionRequired {
        /// The class.
        class: String,
    },
    /// An Immediate clone whose source has no PV yet.
    CloneSourceNotReady(String),
    /// An Immediate clone whose source lives on a node where no provisioner runs.
    CloneSourceNodeAbsent {
        /// The source claim.
        source: String,
        /// Its node.
        node: String,
    },
}

/// A failure that retrying (after a backoff, or once something changes) may cure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Failure {
    /// Not enough room, and the claim cannot go to another node.
    ShortOfSpace(ShortOfSpace),
    /// The pool cannot enforce the class's quota.
    QuotaUnsupported(QuotaRefusal),
    /// A clone into a project-quota pool: a copy cannot take a project of its own.
    ProjectQuotaClone {
        /// The clone's directory.
        path: std::path::PathBuf,
    },
    /// The pool the plan needs is not configured on this node.
    UnknownPool(String),
    /// The pool cannot be used now; the reconciler reports the error it read.
    PoolUnusable,
    /// A PV of our name exists and is bound to another claim.
    PvConflict {
        /// PV name.
        pv: String,
        /// The claimRef UID found.
        other_uid: String,
    },
}

/// How the volume's directory is made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MakeVolume {
    /// A plain directory.
    Plain,
    /// A btrfs subvolume limited by its qgroup.
    BtrfsQuota {
        /// The limit.
        limit_bytes: u64,
    },
    /// A directory with a project quota of its own.
    ProjectQuota {
        /// The limit.
        limit_bytes: u64,
    },
    /// A copy of the source volume's directory (this node's pool), limited if the class says so.
    Clone {
        /// The source's directory under the pool root.
        source_dir: String,
        /// A `pathPattern` source: copied only while its marker names this PV.
        source_marked_for: Option<String>,
        /// The source claim (whose cloning-protection finalizer guards the copy).
        source_claim: String,
        /// The clone's limit, for a quota class.
        limit_bytes: Option<u64>,
    },
    /// A copy of a `HostPathSnapshot` (on this root), limited if the class says so.
    Restore {
        /// The snapshot's directory in the root's snapshots directory.
        snapshot_dir: String,
        /// The snapshot's name.
        snapshot: String,
        /// The volume's limit, for a quota class.
        limit_bytes: Option<u64>,
    },
}

impl MakeVolume {
    /// The quota limit the volume gets, if any.
    pub fn limit_bytes(&self) -> Option<u64> {
        match self {
            MakeVolume::Plain => None,
            MakeVolume::BtrfsQuota { limit_bytes } | MakeVolume::ProjectQuota { limit_bytes } => Some(*limit_bytes),
            MakeVolume::Clone { limit_bytes, .. } | MakeVolume::Restore { limit_bytes, .. } => *limit_bytes,
        }
    }

    /// The volume is a copy (of a claim's volume, or of a snapshot).
    pub fn is_copy(&self) -> bool {
        matches!(self, MakeVolume::Clone { .. } | MakeVolume::Restore { .. })
    }
}

/// A volume to make, and its PV.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Provision {
    /// Names, pool, shape.
    pub plan: ProvisionPlan,
    /// How the directory is made.
    pub make: MakeVolume,
    /// For a `pathPattern` directory: made aside and placed, reused, or taken over (never
    /// [`Placing::Refuse`]).
    pub pattern: Option<Placing>,
    /// What the PV advertises as its capacity.
    pub capacity: String,
}

/// What to do about a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimPlan {
    /// Nothing, until the claim changes.
    Idle(SkipReason),
    /// Nothing now; look again after `after`.
    LookAgain {
        /// Why.
        why: Later,
        /// When.
        after: Duration,
    },
    /// Refuse the claim (`ProvisioningFailed`); look again after `recheck` if set, else only
    /// once the claim changes.
    Refuse {
        /// What to change.
        refusal: Refusal,
        /// When to look again regardless.
        recheck: Option<Duration>,
    },
    /// Give the claim back to the scheduler (remove `selected-node`), saying why.
    HandBack {
        /// Why, for the event.
        why: String,
        /// Metric label.
        label: &'static str,
    },
    /// Write the cluster-wide explanation; look again after `recheck` if set.
    Explain {
        /// What to say.
        explanation: Explanation,
        /// When to look again regardless.
        recheck: Option<Duration>,
    },
    /// A clone waits for its source: say why on the claim and look again.
    WaitForSource(String),
    /// The claim's PV exists already (made before a restart, or by the Go build).
    AlreadyProvisioned,
    /// Fail, to be retried.
    Fail(Failure),
    /// Make the volume and its PV.
    Provision(Box<Provision>),
}

/// Decides what to do about a candidate claim from its gathered facts.
pub fn plan_claim(facts: &ClaimFacts<'_>) -> ClaimPlan {
    let decision = decide_claim(facts.claim, facts.class, facts.me, facts.config, facts.live);
    let step = match (facts.source, facts.restore) {
        (Some(source), _) => clone_step(facts, source, decision),
        (None, Some(restore)) => restore::restore_step(facts, restore, decision),
        (None, None) => CloneStep::Go(decision, None),
    };
    let (decision, copy_from) = match step {
        CloneStep::Go(decision, copy_from) => (decision, copy_from),
        CloneStep::Done(plan) => return plan,
    };
    match decision {
        Decision::Skip(SkipReason::ClassNotFound(class)) => {
            ClaimPlan::LookAgain { why: Later::ClassNotFound(class), after: CLASS_RECHECK }
        }
        Decision::Skip(SkipReason::ActedOnBy { node, recheck_after }) => {
            // Look again once that node's liveness would have run out, in case it died.
            ClaimPlan::LookAgain { why: Later::ActedOnBy(node), after: recheck_after }
        }
        Decision::Skip(skip) => ClaimPlan::Idle(skip),
        Decision::HandBack(refusal) => ClaimPlan::HandBack { why: refusal.to_string(), label: refusal.label() },
        Decision::ExplainImmediate => ClaimPlan::Explain {
            explanation: Explanation::NodeSelectionRequired {
                class: claim_class_name(facts.claim).unwrap_or_default().to_owned(),
            },
            recheck: None,
        },
        Decision::Refuse(refusal) => {
            let recheck = matches!(refusal, Refusal::NoNodeServesPool { .. }).then_some(NO_NODE_RECHECK);
            ClaimPlan::Refuse { refusal, recheck }
        }
        Decision::Provision(plan) => provision_plan(facts, *plan, copy_from),
    }
}

/// The source to copy from, once the clone or restore step chose this node.
enum CopyFrom {
    /// Another claim's volume (a clone).
    Volume {
        /// The pool root holding the source: the copy is made beside it.
        root: std::path::PathBuf,
        dir: String,
        marked_for: Option<String>,
        claim: String,
    },
    /// A `HostPathSnapshot`'s copy (a restore): made on the root of the claim's pool that
    /// holds it.
    Snapshot {
        /// The snapshot's directory (its UID).
        dir: String,
        /// The snapshot's name.
        name: String,
    },
}

enum CloneStep {
    /// Go on with this decision (and, for a clone to make here, this source).
    Go(Decision, Option<CopyFrom>),
    /// The clone step settled the claim.
    Done(ClaimPlan),
}

/// Lets the node that holds a clone's source make the copy, and explains every wait.
fn clone_step(facts: &ClaimFacts<'_>, source: SourceFacts<'_>, decision: Decision) -> CloneStep {
    match decision {
        Decision::ExplainImmediate => unplaced_clone(facts, source),
        Decision::Provision(plan) => {
            let placement = if plan.binding_mode == BindingMode::WaitForFirstConsumer && !plan.pinned_by_annotation {
                Placement::Scheduled
            } else {
                Placement::Pinned
            };
            placed_clone(facts, source, *plan, placement)
        }
        other => CloneStep::Go(other, None),
    }
}

/// An Immediate node-shaped clone names no node: the node that holds the source provisions it,
/// as if the claim were pinned there (a clone cannot be anywhere else, so this is no placement
/// by the user and the provisionOnNode policy does not apply).
fn unplaced_clone(facts: &ClaimFacts<'_>, source: SourceFacts<'_>) -> CloneStep {
    let uid = facts.claim.metadata.uid.as_deref().unwrap_or_default();
    match source.pv.and_then(volume::owner_node) {
        Some(owner) if owner == facts.me.node => {}
        // Nobody can copy the source while its node runs no provisioner: one node says so.
        Some(owner)
            if !facts.live.is_empty()
                && !facts.live.iter().any(|n| n.node == owner)
                && topology::spokesman(uid, &facts.me.node, facts.live) == Acting::Me =>
        {
            return CloneStep::Done(ClaimPlan::Explain {
                explanation: Explanation::CloneSourceNodeAbsent {
                    source: source.name.to_owned(),
                    node: owner.to_owned(),
                },
                recheck: Some(SOURCE_NODE_RECHECK),
            });
        }
        // The owner speaks for this clone: it has the data and the pool.
        Some(_) => return CloneStep::Done(ClaimPlan::Idle(SkipReason::OtherNode)),
        None => {
            // No PV yet, so no owner to speak: one event for the whole cluster.
            let why = unplaced_source_wait(facts, source);
            return CloneStep::Done(ClaimPlan::Explain {
                explanation: Explanation::CloneSourceNotReady(why),
                recheck: Some(SOURCE_RECHECK),
            });
        }
    }
    match decide_pinned_here(facts) {
        Decision::Provision(plan) => placed_clone(facts, source, *plan, Placement::Unplaced),
        other => CloneStep::Go(other, None),
    }
}

/// The claim decision for an Immediate claim as if it were pinned to this node: a copy (a clone,
/// a restore) is made where its source is, so this is no placement by the user and the
/// provisionOnNode policy does not apply.
fn decide_pinned_here(facts: &ClaimFacts<'_>) -> Decision {
    let mut pinned = facts.claim.clone();
    pinned
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(keys::PROVISION_ON_NODE.into(), facts.me.node.clone());
    let config = DecisionConfig { provision_on_node: ProvisionOnNodePolicy::Allow, ..facts.config.clone() };
    decide_claim(&pinned, facts.class, facts.me, &config, facts.live)
}

/// Why an Immediate clone without a source PV waits.
fn unplaced_source_wait(facts: &ClaimFacts<'_>, source: SourceFacts<'_>) -> String {
    let class_name = claim_class_name(facts.claim).unwrap_or_default();
    let pool = layout::PoolPath::local("", "/");
    let request = CloneRequest {
        source_name: source.name,
        class_name,
        request: "",
        request_bytes: u64::MAX,
        pools: std::slice::from_ref(&pool),
        block: facts.claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block"),
    };
    match clone::check_source(request, source.claim, None, facts.me) {
        SourceVerdict::Wait(why) => why,
        SourceVerdict::Refuse(refusal) => refusal.to_string(),
        SourceVerdict::Ready { .. } | SourceVerdict::Elsewhere(_) => {
            format!("waiting for source claim {:?}", source.name)
        }
    }
}

fn placed_clone(
    facts: &ClaimFacts<'_>,
    source: SourceFacts<'_>,
    plan: ProvisionPlan,
    placement: Placement,
) -> CloneStep {
    let roots: Vec<_> = pool_roots::roots_of(&facts.config.pools, &plan.pool.name).into_iter().cloned().collect();
    let request = CloneRequest {
        source_name: source.name,
        class_name: &plan.class_name,
        request: &plan.request,
        request_bytes: plan.request_bytes,
        pools: &roots,
        block: plan.block.is_some(),
    };
    let refuse = |refusal| CloneStep::Go(Decision::Refuse(Refusal::DataSource(refusal)), None);
    let (dir, owner) = match clone::check_source(request, source.claim, source.pv, facts.me) {
        SourceVerdict::Wait(why) => return CloneStep::Done(ClaimPlan::WaitForSource(why)),
        SourceVerdict::Refuse(refusal) => return refuse(refusal),
        SourceVerdict::Ready { root, dir_name, marked_for } => ((root, dir_name, marked_for), None),
        SourceVerdict::Elsewhere(node) => ((Default::default(), String::new(), None), Some(node)),
    };
    match clone::clone_actor(owner.as_deref(), placement, facts.me) {
        CloneActor::Me => {
            // Unknown (not asked, or unreadable) counts as a quota volume: an unusable pool fails
            // later, in provisioning, with its own reason.
            let is_quota_volume = source.is_quota_volume.unwrap_or(true);
            if let Err(refusal) = clone::check_quota_source(plan.quota, source.name, is_quota_volume) {
                return refuse(refusal);
            }
            let (root, dir, marked_for) = dir;
            let copy_from = CopyFrom::Volume { root, dir, marked_for, claim: source.name.to_owned() };
            CloneStep::Go(Decision::Provision(Box::new(plan)), Some(copy_from))
        }
        CloneActor::Other(_) => CloneStep::Done(ClaimPlan::Idle(SkipReason::OtherNode)),
        CloneActor::Refuse(refusal) => refuse(refusal),
        CloneActor::WrongNode { source_node } => {
            // Keeping selected-node would strand the claim here for good; without it the
            // scheduler places the pod again, and a pod the user pins to the source's node
            // (recreated with a nodeSelector) can use this very claim.
            let why = format!(
                "this claim clones claim {:?}, whose volume lives on node {source_node}; a clone is made on the \
                 node that holds its source, but the pod was scheduled to node {}. Run the pod on node {source_node} \
                 (nodeSelector kubernetes.io/hostname of that node, or a matching nodeAffinity; recreate the pod)",
                source.name, facts.me.node
            );
            CloneStep::Done(ClaimPlan::HandBack { why, label: "clone_wrong_node" })
        }
    }
}

/// The claim is this node's: unless a PV is there or pre-bound already, check the pool and say
/// how to make the volume.
fn provision_plan(facts: &ClaimFacts<'_>, plan: ProvisionPlan, copy_from: Option<CopyFrom>) -> ClaimPlan {
    let scheduled = plan.binding_mode == BindingMode::WaitForFirstConsumer && !plan.pinned_by_annotation;
    // A PV pre-bound to this claim, which the PV controller binds instead of having one
    // provisioned (deciding::static_binding), for a claim the scheduler placed here before the
    // PV controller handed it to a provisioner.
    if scheduled
        && !annotated_for_provisioning(&facts.claim.metadata)
        && let Some(pv) = facts.pre_bound_pv
    {
        return ClaimPlan::LookAgain { why: Later::PreBound(pv.to_owned()), after: STATIC_RECHECK };
    }
    if let Some(existing) = facts.existing_pv {
        let claim_uid = facts.claim.metadata.uid.as_deref().unwrap_or_default();
        return match bound_claim_uid(existing) {
            uid if uid == claim_uid => ClaimPlan::AlreadyProvisioned,
            other => ClaimPlan::Fail(Failure::PvConflict { pv: plan.pv_name, other_uid: other.to_owned() }),
        };
    }
    let roots = match facts.pool {
        PoolState::Ready(roots) => roots,
        PoolState::Missing => return ClaimPlan::Fail(Failure::UnknownPool(plan.pool.name)),
        PoolState::Unusable => return ClaimPlan::Fail(Failure::PoolUnusable),
    };
    let mut plan = plan;
    let pool = match choose_root(facts, &plan, roots, copy_from.as_ref()) {
        Some((root, pool)) => {
            plan.pool = root;
            pool
        }
        None => return ClaimPlan::Fail(Failure::PoolUnusable),
    };
    let volume_quota = match (plan.quota, &pool.quota) {
        (QuotaMode::None, _) => VolumeQuota::Unlimited,
        (mode, Some(quota_facts)) => {
            let root = plan.pool.root.display().to_string();
            match quota::decide(mode, plan.request_bytes, &plan.pool.name, &root, quota_facts) {
                Ok(volume_quota) => volume_quota,
                Err(refusal) => return ClaimPlan::Fail(Failure::QuotaUnsupported(refusal)),
            }
        }
        // The reconciler gathers quota facts for every enforce class it can read the pool of.
        (_, None) => return ClaimPlan::Fail(Failure::PoolUnusable),
    };
    let room = root_room(facts.config, &plan.pool, pool);
    let reserved = room.reserved;
    let pattern = match (&plan.path_pattern, &pool.pattern) {
        (None, _) => None,
        (Some(_), None) => return ClaimPlan::Fail(Failure::PoolUnusable),
        (Some(_), Some(found)) => {
            let path = plan.pool.root.join(&plan.dir_name).display().to_string();
            match path_pattern::place(&plan.pv_name, &path, found) {
                Placing::Refuse(occupied) => {
                    return ClaimPlan::Refuse { refusal: occupied.into(), recheck: Some(PATTERN_RECHECK) };
                }
                Placing::Adopt { from, .. } if copy_from.is_some() => {
                    let refusal = path_pattern::Occupied::CloneIntoExisting { path, pv: from };
                    return ClaimPlan::Refuse { refusal: refusal.into(), recheck: Some(PATTERN_RECHECK) };
                }
                placing => Some(placing),
            }
        }
    };
    let dir_exists = pool.dir_exists || matches!(pattern, Some(Placing::Reuse { .. } | Placing::Adopt { .. }));
    let available = room.room();
    if plan.request_bytes > available && !dir_exists {
        let short = ShortOfSpace {
            pool: plan.pool.name.clone(),
            node: facts.me.node.clone(),
            requested: plan.request_bytes,
            available,
            reserved,
            promised: room.promised,
        };
        // Another node has room of its own; a shared pool is the same filesystem everywhere.
        if scheduled && plan.topology != Topology::Shared {
            return ClaimPlan::HandBack { why: short.to_string(), label: "insufficient_space" };
        }
        return ClaimPlan::Fail(Failure::ShortOfSpace(short));
    }
    let make = match (copy_from, volume_quota) {
        // A Block volume's size is its backing file's: the directory needs no quota of its own.
        (None, _) if plan.block.is_some() => MakeVolume::Plain,
        (None, VolumeQuota::Unlimited) => MakeVolume::Plain,
        (None, VolumeQuota::BtrfsQgroup { limit_bytes }) => MakeVolume::BtrfsQuota { limit_bytes },
        (None, VolumeQuota::Project { limit_bytes }) => MakeVolume::ProjectQuota { limit_bytes },
        (Some(_), VolumeQuota::Project { .. }) => {
            return ClaimPlan::Fail(Failure::ProjectQuotaClone { path: plan.pool.root.join(&plan.dir_name) });
        }
        // A clone of a quota volume is a snapshot of its subvolume, which starts without a limit
        // of its own: it gets the clone's request before any pod can write to it.
        (Some(CopyFrom::Volume { dir, marked_for, claim, .. }), quota) => MakeVolume::Clone {
            source_dir: dir,
            source_marked_for: marked_for,
            source_claim: claim,
            limit_bytes: quota.limit_bytes(),
        },
        (Some(CopyFrom::Snapshot { dir, name }), quota) => {
            MakeVolume::Restore { snapshot_dir: dir, snapshot: name, limit_bytes: quota.limit_bytes() }
        }
    };
    // A Block volume's device is the size of its file, the request, whatever PV_CAPACITY says.
    let capacity = if plan.block.is_none() && pv_reports_filesystem_size(facts.config.pv_capacity, volume_quota) {
        format_binary_si(round_down_pretty(pool.total_bytes))
    } else {
        plan.request.clone()
    };
    ClaimPlan::Provision(Box::new(Provision { plan, make, pattern, capacity }))
}

/// The root of the claim's pool the volume goes to, with what was read there: beside its
/// source for a clone, else as `pool_roots::choose` says. `None` when that root could not be read.
fn choose_root<'a>(
    facts: &ClaimFacts<'_>,
    plan: &ProvisionPlan,
    roots: &'a [RootFacts],
    copy_from: Option<&CopyFrom>,
) -> Option<(layout::PoolPath, &'a PoolFacts)> {
    let declared = |root: &std::path::Path| {
        pool_roots::roots_of(&facts.config.pools, &plan.pool.name).into_iter().find(|p| p.root == root)
    };
    let chosen = match copy_from {
        Some(CopyFrom::Volume { root, .. }) => roots.iter().find(|r| r.root == *root)?,
        Some(CopyFrom::Snapshot { .. }) => roots.iter().find(|r| r.read.as_ref().is_some_and(|f| f.snapshot_here))?,
        None => {
            let candidates: Vec<_> = roots.iter().map(|r| root_candidate(facts, plan, declared(&r.root), r)).collect();
            &roots[pool_roots::choose(&candidates)?]
        }
    };
    Some((declared(&chosen.root)?.clone(), chosen.read.as_ref()?))
}

/// One root as `pool_roots::choose` weighs it.
fn root_candidate(
    facts: &ClaimFacts<'_>,
    plan: &ProvisionPlan,
    pool: Option<&layout::PoolPath>,
    root: &RootFacts,
) -> RootCandidate {
    let (Some(pool), Some(read)) = (pool, &root.read) else {
        return RootCandidate { usable: false, holds_claim: false, can_make: false, room: 0 };
    };
    let can_make = match (plan.quota, &read.quota) {
        (QuotaMode::None, _) => true,
        (mode, Some(quota_facts)) => {
            let root = pool.root.display().to_string();
            quota::decide(mode, plan.request_bytes, &pool.name, &root, quota_facts).is_ok()
        }
        (_, None) => false,
    };
    let holds_claim = read.dir_exists || read.pattern.as_ref().is_some_and(|found| found.found != Found::Absent);
    RootCandidate { usable: true, holds_claim, can_make, room: root_room(facts.config, pool, read).room() }
}

/// The room of one pool root: its free space, its reserve, and what it promised when it counts
/// requests.
fn root_room(config: &DecisionConfig, pool: &layout::PoolPath, read: &PoolFacts) -> PoolRoom {
    PoolRoom {
        available: read.available_bytes,
        total: read.total_bytes,
        reserved: pool.reserve.unwrap_or(config.reserved_bytes),
        promised: read.promised_bytes.filter(|_| pool.accounting == Some(CapacityAccounting::Requests)),
    }
}

/// The uid of the claim a PV is bound to (empty when none).
pub fn bound_claim_uid(pv: &KeptVolume) -> &str {
    pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| r.uid.as_deref()).unwrap_or_default()
}

/// Whether a volume directory this attempt made may be removed again after its PV could not be
/// created: only when the API server said it did not create the PV (a request cut off on the
/// way back may well have created it: removing the directory then would leave a bound PV
/// without one; the retry reuses it, and if the claim goes meanwhile the start-up sweep removes
/// it), and never on a shared pool, where another node may be creating the PV for this
/// directory right now (a failover race); an empty directory there costs nothing until the retry.
pub fn may_undo_directory(made_now: bool, api_refused_create: bool, topology: Topology) -> bool {
    made_now && api_refused_create && topology != Topology::Shared
}

mod restore;

#[cfg(test)]
mod tests;
